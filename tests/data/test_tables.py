import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

from seqapps.data.tables import (cut_windows, fold_bounds, format_duration, numeric_columns, parse_duration, read_csv,
                                 read_recent, to_time_series, window_origins)
from seqapps.errors import ConfigError, DataError

GOOD = "timestamp,load,temp\n2024-01-01 00:00,1,10\n2024-01-01 00:30,2,11\n2024-01-01 01:00,3,12\n"


def series_from(tmp_path, text, fill_gaps="none", columns=("load", "temp")):
    path = tmp_path / "data.csv"
    path.write_text(text)
    return to_time_series(read_csv(path), "timestamp", list(columns), fill_gaps)


def test_reads_a_regular_series_and_infers_its_step(tmp_path):
    series = series_from(tmp_path, GOOD)
    assert series.step == pd.Timedelta("30min")
    assert series.frame.columns.tolist() == ["load", "temp"]
    np.testing.assert_array_equal(series.frame["load"].to_numpy(), [1, 2, 3])


@pytest.mark.parametrize("text, message", [
    (GOOD.replace("temp", "tmp"), r"missing column 'temp' \(columns are: timestamp, load, tmp\)"),
    (GOOD.replace(",2,11", ",two,11"), r"line 3: column 'load' value 'two' is not a number"),
    (GOOD.replace(",2,11", ",,11"), r"line 3: column 'load' is empty or NaN"),
    (GOOD.replace(",2,11", ",NaN,11"), r"line 3: column 'load' is empty or NaN"),
    (GOOD.replace("01:00,3", "02:00,3"), r"line 4: gap in timestamps, 2 step\(s\) of 30 min missing"),
    (GOOD.replace("00:30,2", "00:00,2"), r"line 3: duplicate timestamp"),
    (GOOD.replace("2024-01-01 00:30,2,11\n", "") + "2024-01-01 00:30,2,11\n", r"line 4: timestamp .* is earlier"),
    (GOOD.replace("2024-01-01 00:30", "yesterday"), r"line 3: column 'timestamp' value 'yesterday' is not a date"),
    ("", r"the file is empty"),
    ("timestamp,load,temp\n", r"has a header but no data rows"),
])
def test_bad_tables_name_file_line_and_column(tmp_path, text, message):
    with pytest.raises(DataError, match=message) as caught:
        series_from(tmp_path, text)
    assert "data.csv" in str(caught.value) and "\n" not in str(caught.value)


def test_binary_and_non_utf8_files_are_rejected(tmp_path):
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00")
    with pytest.raises(DataError, match="binary file"):
        read_csv(binary)
    latin = tmp_path / "latin.csv"
    latin.write_bytes("timestamp,caf\xe9\n".encode("latin-1"))
    with pytest.raises(DataError, match="not UTF-8"):
        read_csv(latin)
    with pytest.raises(DataError, match="file not found"):
        read_csv(tmp_path / "nope.csv")


def test_fill_gaps_interpolates_and_counts(tmp_path):
    text = GOOD.replace("01:00,3,12", "01:30,4,14").replace(",2,11", ",,11")
    series = series_from(tmp_path, text, fill_gaps="interpolate")
    # One empty cell plus one missing row (two values) were filled.
    assert series.filled == 3
    np.testing.assert_allclose(series.frame["load"].to_numpy(), [1, 2, 3, 4])
    np.testing.assert_allclose(series.frame["temp"].to_numpy(), [10, 11, 12.5, 14])


def test_daily_series_and_durations():
    day = pd.Timedelta("1D")
    assert parse_duration("7D", day, "lookback") == 7
    assert parse_duration("1D", pd.Timedelta("30min"), "horizon") == 48
    assert parse_duration(24, pd.Timedelta("1h"), "horizon") == 24
    with pytest.raises(DataError, match="'horizon': 90min is not a whole number of 1 h steps$"):
        parse_duration("90min", pd.Timedelta("1h"), "horizon")
    with pytest.raises(DataError, match="is not a duration"):
        parse_duration("soon", day, "horizon")


@pytest.mark.parametrize("duration, written", [
    ("15min", "15 min"), ("90min", "90 min"), ("1h", "1 h"), ("36h", "36 h"), ("1D", "1 day"), ("7D", "7 days"),
    ("30s", "30 s"), ("250ms", "0.25 s"), (np.timedelta64(900, "s"), "15 min"),
])
def test_durations_are_written_as_people_write_them(duration, written):
    assert format_duration(pd.Timedelta(duration) if isinstance(duration, str) else duration) == written


def test_an_off_grid_timestamp_names_the_step_in_minutes(tmp_path):
    with pytest.raises(DataError, match=r"line 3: timestamp 2024-01-01 00:40:00 is off the 30 min sampling grid$"):
        series_from(tmp_path, GOOD.replace("00:30,2", "00:40,2").replace("01:00,3", "01:30,3")
                    + "2024-01-01 02:00,4,13\n2024-01-01 02:30,5,14\n")


def london_csv(tmp_path, start, rows=6, offsets=True):
    """Hourly local times in Europe/London from ``start`` (UTC), with or without their UTC offsets."""
    local = pd.date_range(start, periods=rows, freq="h", tz="UTC").tz_convert("Europe/London")
    stamps = [t.isoformat() if offsets else t.strftime("%Y-%m-%d %H:%M") for t in local]
    path = tmp_path / "local.csv"
    path.write_text("timestamp,load\n" + "".join(f"{t},{i}\n" for i, t in enumerate(stamps)))
    return path


@pytest.mark.parametrize("start, changes_to", [("2024-03-30 22:00", 3600), ("2024-10-26 22:00", 0)])
def test_offsets_across_daylight_saving_changes_are_read_on_the_utc_axis(tmp_path, start, changes_to):
    path = london_csv(tmp_path, start)  # spring: ...00:00+00:00, 02:00+01:00; autumn: 01:00+01:00, 01:00+00:00
    series = to_time_series(read_csv(path), "timestamp", ["load"])
    assert series.step == pd.Timedelta("1h")  # hourly on the UTC axis, no gap, no duplicate
    assert series.frame.index[0] == pd.Timestamp(start) and series.timezone == "file offsets"
    assert series.utc_offsets[-1] == [pd.Timestamp(start).value // 10**9 + 3 * 3600, changes_to]
    with_zone = to_time_series(read_csv(path), "timestamp", ["load"], timezone="Europe/London")
    assert with_zone.frame.index.equals(series.frame.index) and len(with_zone.utc_offsets) > 200


def test_naive_local_times_are_placed_by_the_timezone_or_rejected_at_the_missing_hour(tmp_path):
    autumn = london_csv(tmp_path, "2024-10-26 22:00", offsets=False)  # 01:00 twice
    with pytest.raises(DataError, match=r"line 5: duplicate timestamp .* --set timezone=NAME"):
        to_time_series(read_csv(autumn), "timestamp", ["load"])
    series = to_time_series(read_csv(autumn), "timestamp", ["load"], timezone="Europe/London")
    assert series.step == pd.Timedelta("1h") and series.frame.index[0] == pd.Timestamp("2024-10-26 22:00")
    spring = tmp_path / "spring.csv"  # 01:30 does not exist on 31 March 2024 in London
    spring.write_text("timestamp,load\n2024-03-31 00:30,1\n2024-03-31 01:30,2\n2024-03-31 02:30,3\n")
    with pytest.raises(DataError, match=r"line 3: .* does not exist in Europe/London"):
        to_time_series(read_csv(spring), "timestamp", ["load"], timezone="Europe/London")
    mixed = tmp_path / "mixed.csv"
    mixed.write_text("timestamp,load\n2024-03-31T00:00:00+00:00,1\n2024-03-31 02:00,2\n")
    with pytest.raises(DataError, match=r"line 3: .* has no UTC offset, unlike line 2"):
        to_time_series(read_csv(mixed), "timestamp", ["load"])
    with pytest.raises(ConfigError, match="not a time zone name"):
        to_time_series(read_csv(spring), "timestamp", ["load"], timezone="Europe/Londres")


def test_european_csv_semicolons_are_detected_and_decimal_commas_read_when_asked(tmp_path):
    path = tmp_path / "eu.csv"
    path.write_text("time;mw\n2024-01-01 00:00;12,5\n2024-01-01 01:00;13\n2024-01-01 02:00;-1,25e3\n")
    frame = read_csv(path, decimal=",")
    assert frame.attrs["csv"] == {"separator": ";", "decimal": ","}
    np.testing.assert_array_equal(to_time_series(frame, "time", ["mw"]).frame["mw"], [12.5, 13, -1250])
    with pytest.raises(DataError, match=r"line 2: column 'mw' value '12,5' is not a number \(for decimal commas pass "
                                        r"--set decimal=,\)"):
        to_time_series(read_csv(path), "time", ["mw"])
    comma = tmp_path / "comma.csv"
    comma.write_text("time,mw\n2024-01-01 00:00,12\n")
    with pytest.raises(DataError, match="separator and the decimal mark are both ','"):
        read_csv(comma, decimal=",")


@pytest.mark.parametrize("rows, folds", [(4032, 1), (4032, 3), (1001, 4), (17, 2)])
def test_backtest_folds_tile_the_series_end_with_the_default_split_last(rows, folds):
    n_val, n_test = round(rows * 0.1), round(rows * 0.2)
    for k, bounds in enumerate(fold_bounds(rows, 0.1, 0.2, folds)):
        # Brute force: fold k keeps all but the last (folds - 1 - k) test blocks, then splits it as usual.
        kept = rows - (folds - 1 - k) * n_test
        expected = ["train"] * (kept - n_val - n_test) + ["val"] * n_val + ["test"] * n_test
        labels = [next((name for name, (start, stop) in bounds.items() if start <= i < stop), None)
                  for i in range(rows)]
        assert labels == expected + [None] * (rows - kept)
    default = fold_bounds(rows, 0.1, 0.2, 1)[0]
    assert fold_bounds(rows, 0.1, 0.2, folds)[-1] == default == {
        "train": (0, rows - n_val - n_test), "val": (rows - n_val - n_test, rows - n_test),
        "test": (rows - n_test, rows)}


def test_window_origins_are_the_windows_whose_whole_horizon_lies_in_the_split():
    # Brute force: origin t reads rows t-3..t and forecasts t+1, t+2; every row it forecasts is in [start, stop).
    for start, stop in ((0, 20), (5, 20), (12, 15), (12, 13)):
        expected = [t for t in range(30) if t >= 3 and all(start <= t + h < stop for h in (1, 2))]
        assert window_origins(start, stop, lookback=4, horizon=2).tolist() == expected


def test_cut_windows_match_windows_sliced_from_the_series_and_shift_targets_by_their_key():
    series = np.arange(40, dtype="float32").reshape(20, 2) * [1, 10]  # columns a (0, 1, ...) and b (0, 10, ...)
    times = np.arange(20, dtype="int64") * 3600
    origins = np.array([3, 4, 9, 17])
    for batch_size in (None, 3):
        windows = cut_windows(series, times, origins, ["a", "b"], [1], lookback=4, horizon=2, batch_size=batch_size)
        found = list(windows.as_numpy_iterator()) if batch_size else list(windows.batch(4).as_numpy_iterator())
        inputs = {key: np.concatenate([batch[0][key] for batch in found]) for key in ("a", "b", "end_time")}
        targets = np.concatenate([batch[1] for batch in found])
        for row, t in enumerate(origins):
            np.testing.assert_array_equal(inputs["a"][row], series[t - 3: t + 1, 0])
            np.testing.assert_array_equal(inputs["b"][row], series[t - 3: t + 1, 1])
            np.testing.assert_array_equal(targets[row], series[t + 1: t + 3, 1:])
        np.testing.assert_array_equal(inputs["end_time"], times[origins])
    keys = np.array([0, 1, 1, 2])
    shifted = cut_windows(series, times, origins, ["a", "b"], [1], 4, 2, batch_size=4,
                          shift=(keys, lambda inputs, key: 1000.0 * tf.cast(key, tf.float64)[:, None, None]
                                 + tf.zeros((1, 2, 1), tf.float64)))
    (_, targets), = list(shifted.as_numpy_iterator())
    assert targets.dtype == np.float64
    np.testing.assert_array_equal(targets[:, :, 0], series[origins[:, None] + [1, 2], 1] + 1000.0 * keys[:, None])


def test_numeric_columns_are_those_mostly_holding_numbers():
    frame = pd.DataFrame({"timestamp": ["2024-01-01", "2024-01-02", "2024-01-03"], "load": ["1", "2", "x"],
                          "label": ["a", "b", "3"], "empty": [None, None, None], "temp": ["1.5", None, "2"]})
    assert numeric_columns(frame, ["timestamp"]) == ["load", "temp"]
    assert numeric_columns(frame, ["timestamp", "load"]) == ["temp"]


def test_read_recent_returns_the_last_rows_or_names_what_does_not_match(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text(GOOD)
    window = read_recent(str(path), "timestamp", ["temp"], 2, 1800)
    assert window["temp"].tolist() == [11, 12] and str(window.index[-1]) == "2024-01-01 01:00:00"
    for kwargs, message in (({"rows": 4}, r"has 3 rows, expected the last 4 rows or more \(2 h\)"),
                            ({"step_seconds": 3600}, r"sampling interval is 30 min, expected 1 h"),
                            ({"with_offsets": True}, r"timestamps lack UTC offsets; expected timestamps with them")):
        with pytest.raises(DataError, match=message):
            read_recent(str(path), "timestamp", ["temp"], **{"rows": 2, "step_seconds": 1800, **kwargs})
