import numpy as np
import pandas as pd
import pytest

from seqapps.data.series import (END_TIME, cross_fit_blocks, finetune_csv_names, forecast_steps, recent_window,
                                 series_splits, series_windows, split_inputs, window_datasets)
from seqapps.data.tables import fold_bounds, read_csv, window_origins
from seqapps.errors import ConfigError, DataError

HOUR = pd.Timedelta("1h")
DURATIONS = {"horizon": 3, "lookback": "6h", "residual_period": None, "ridge_lags": None}


def hourly_frame(rows=24 * 10, seed=0):
    """Ten days of an hourly load and temperature, as ``read_csv`` gives them (text cells)."""
    rng = np.random.default_rng(seed)
    times = pd.date_range("2024-03-01", periods=rows, freq="h")
    return pd.DataFrame({"timestamp": times.strftime("%Y-%m-%d %H:%M"),
                         "load": [f"{v:.3f}" for v in 100 + rng.normal(size=rows).cumsum()],
                         "temp": [f"{v:.3f}" for v in rng.normal(10, 3, rows)]})


def splits_of(frame, state=None, fold=0, folds=1, **overrides):
    settings = {"timestamp_col": "timestamp", "target_cols": ["load"], "feature_cols": None, "fill_gaps": "none",
                "timezone": None, "durations": DURATIONS, "seasonal_baseline": None, "folds": folds,
                "val_fraction": 0.1, "test_fraction": 0.2, "decimal": ".", **overrides}
    return series_splits(frame, fold, state, **settings)


def test_forecast_steps_count_the_durations_in_steps_and_reject_windows_that_do_not_fit():
    steps = forecast_steps(pd.Timedelta("30min"), "1D", "8D", "7D", "1D")
    assert steps == {"horizon": 48, "lookback": 384, "residual_period": 336, "ridge_lags": 48, "daily_lag": 48,
                     "weekly_lag": 336}
    assert forecast_steps(pd.Timedelta("1D"), 7, 28, None, None)["daily_lag"] == 1  # at least one step
    with pytest.raises(DataError, match="'residual_period': 7D must be shorter than the lookback"):
        forecast_steps(HOUR, "1D", "7D", "7D", None)
    with pytest.raises(DataError, match="'ridge_lags': 2D is longer than the lookback"):
        forecast_steps(HOUR, "1D", "8D", "7D", "2D")


@pytest.mark.parametrize("ridge_cross_fit, interval_cross_fit, windows, expected", [
    (0, 5, 2000, 5),    # the interval's blocks: 400 windows and 2 x 24 of gaps leave 1,552 of 2,000 to fit on
    (0, 5, 150, 0),     # 30 + 48 windows left out of 150 would keep fewer than half: no cross-fitting
    (0, 0, 2000, 0),    # the interval calibrated in sample
    (3, 5, 2000, 3),    # ridge_cross_fit's blocks serve both
    (3, 0, 150, 3),     # as the user set them, however short the series
])
def test_the_ridge_is_cross_fitted_when_the_rnn_or_the_interval_asks_and_the_series_allows(
        ridge_cross_fit, interval_cross_fit, windows, expected):
    assert cross_fit_blocks(ridge_cross_fit, interval_cross_fit, windows, horizon=24) == expected


def test_series_splits_hold_the_training_scale_and_the_origins_of_each_split():
    data = splits_of(hourly_frame())
    state, arrays = data.state, data.arrays
    values = hourly_frame()[["load", "temp"]].to_numpy(float)
    bounds = fold_bounds(240, 0.1, 0.2, 1)[0]
    assert state["input_cols"] == ["load", "temp"] and state["lookback"] == 6 and state["horizon"] == 3
    np.testing.assert_allclose(state["mean"], values[: bounds["train"][1]].mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(state["std"], values[: bounds["train"][1]].std(axis=0), rtol=1e-12)
    for name, (start, stop) in bounds.items():
        np.testing.assert_array_equal(arrays["origins"][name], window_origins(start, stop, 6, 3))
    np.testing.assert_array_equal(arrays["values"], values[:, :1])
    assert data.report["windows"] == {name: len(found) for name, found in arrays["origins"].items()}
    assert data.train is None  # the datasets come from window_datasets


def test_an_earlier_backtest_fold_sees_only_its_rows_and_a_short_fold_is_named():
    frame = hourly_frame(rows=24 * 14)  # test splits of 67 rows, each after a week of history
    data = splits_of(frame, fold=0, folds=2)
    assert len(data.arrays["values"]) == data.report["rows"] == 336 - 67
    message = r"series of 336 rows \(backtest fold 1 of 4: its first 135 rows\) is too short"
    with pytest.raises(DataError, match=message):
        splits_of(frame, fold=0, folds=4)


def test_a_fine_tune_reads_its_csv_names_by_position_and_must_have_the_export_s_step():
    state = splits_of(hourly_frame()).state
    frame = hourly_frame(seed=1).rename(columns={"timestamp": "time", "load": "mw", "temp": "t"})
    names = finetune_csv_names(state, "time", ["mw"], None)
    assert names == {"timestamp": "time", "load": "mw", "temp": "temp"}  # the feature keeps the name it had
    tuned = splits_of(frame, state, timestamp_col="time", target_cols=["mw"], feature_cols=["t"])
    assert tuned.state["csv_names"] == {"timestamp": "time", "load": "mw", "temp": "t"}
    np.testing.assert_array_equal(tuned.arrays["values"][:, 0], frame["mw"].astype(float))
    assert tuned.state["mean"] == state["mean"]  # the export's scale
    with pytest.raises(ConfigError, match="target_cols"):
        finetune_csv_names(state, "time", ["mw", "x"], None)
    with pytest.raises(ConfigError, match="each CSV column named once"):
        finetune_csv_names(state, "time", ["mw"], ["mw"])
    half_hourly = hourly_frame()
    half_hourly["timestamp"] = pd.date_range("2024-03-01", periods=240, freq="30min").strftime("%Y-%m-%d %H:%M")
    with pytest.raises(DataError, match="sampling interval is 30 min, but the model was trained on 1 h data"):
        splits_of(half_hourly, state)


def test_window_datasets_add_a_members_axis_and_train_on_validation_when_asked():
    data = splits_of(hourly_frame())
    window_datasets(data, cross_fitted_targets=False, fit_on_val=True, holdout=True)
    origins, series = data.arrays["origins"], data.arrays["series"]
    train = list(data.train.as_numpy_iterator())
    assert len(train) == len(origins["train"]) + len(origins["val"])
    assert data.arrays["train_alone"].cardinality() == len(origins["train"])
    inputs, targets = train[-1]
    last = origins["val"][-1]
    np.testing.assert_array_equal(inputs["temp"], series[last - 5: last + 1, 1])
    np.testing.assert_array_equal(targets, series[None, last + 1: last + 4, :1])  # [members, horizon, targets]
    assert inputs[END_TIME] == data.arrays["times"][last]
    batch = next(iter(split_inputs(data, "test", 4)))
    assert set(batch) == {"load", "temp", END_TIME} and batch["load"].shape == (4, 6)
    np.testing.assert_array_equal(next(iter(series_windows(data.state, data.arrays, origins["test"], batch_size=4)))[0]
                                  ["load"], batch["load"])


def test_the_recent_window_is_the_csv_s_last_lookback_rows(tmp_path):
    data = splits_of(hourly_frame())
    hourly_frame(rows=10, seed=3).to_csv(tmp_path / "recent.csv", index=False)
    window = recent_window(str(tmp_path / "recent.csv"), data.state)
    table = read_csv(tmp_path / "recent.csv")
    np.testing.assert_allclose(window["temp"], table["temp"].astype("float32").to_numpy()[None, -6:])
    assert window[END_TIME].tolist() == [int(pd.Timestamp("2024-03-01 09:00").timestamp())]
    hourly_frame(rows=5).to_csv(tmp_path / "short.csv", index=False)
    with pytest.raises(DataError, match="has 5 rows, expected the last 6 rows or more"):
        recent_window(str(tmp_path / "short.csv"), data.state)
