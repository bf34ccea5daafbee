import numpy as np
import pandas as pd
import pytest

from seqapps.data.tables import parse_duration, read_csv, to_time_series
from seqapps.errors import DataError

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
    (GOOD.replace("01:00,3", "02:00,3"), r"line 4: gap in timestamps, 2 step\(s\) of 0 days 00:30:00 missing"),
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
    with pytest.raises(DataError, match="not a whole number"):
        parse_duration("90min", pd.Timedelta("1h"), "horizon")
    with pytest.raises(DataError, match="is not a duration"):
        parse_duration("soon", day, "horizon")
