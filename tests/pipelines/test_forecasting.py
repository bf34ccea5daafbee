"""End-to-end checks of the forecasting pipelines on their tiny presets, through the CLI."""
import dataclasses
import io
import json
import re
from pathlib import Path

import keras
import numpy as np
import pandas as pd
import pytest
import tensorflow as tf
from PIL import Image
from sklearn.linear_model import Ridge

from seqapps import baselines, cli, intervals, runner, serializable, training
from seqapps.data import datasets
from seqapps.data.series import series_windows, split_inputs
from seqapps.pipeline import REGISTRY
from seqapps.report import run_folder
from seqapps.report.document import Figure, Table, figures_of

from tests.export_harness import call_in_tensorflow_only_process
from tests.pipelines.cli_runner import run_cli

pytestmark = pytest.mark.large


@pytest.fixture(scope="module")
def weather_export(tiny_run):
    """The weather pipeline's tiny run of the session (a private copy), for the tests that read its export."""
    result = tiny_run("weather_forecasting")
    return Path(result["export"]).parents[1], result


POINT_METRICS = {"mae", "rmse", "smape", "mase"}
# The ridge parts against scikit-learn in float64 (test_windows_cut_...): the pipeline solves from float64
# moments, scikit-learn by Cholesky on the centred rows, so they agree to float64 round-off amplified by
# x'x's conditioning (alpha 1e-4 on load): measured at most 3e-12 on coefficients of O(1) and 5e-9 MW on
# targets of 4e4 MW. The float32 fit used before differed by 1e-4 relative, which this would catch.
TOLERANCE = {"rtol": 1e-7, "atol": 1e-8}
# For the runs that check reading and serving, not the correction's shrinkage: one fit instead of the rolling
# origins' refits (a tiny load_forecasting run: 16 s against 29 s). The rolling choice has tests of its own.
ONE_FIT = ("--set", "shrinkage=none")


def test_list_names_both_pipelines(capsys):
    code, listing, _ = run_cli(capsys, "list", "--json")
    names = [p["name"] for p in listing["pipelines"]]
    assert code == 0 and {"weather_forecasting", "load_forecasting"} <= set(names)


def test_weather_tiny_run_exports_versions_1_then_2(capsys, weather_export):
    out, _ = weather_export  # a copy of the session's tiny run: test_user_paths checks that it printed version 1
    code, result, _ = run_cli(capsys, "run", "weather_forecasting", "--preset", "tiny", "--json", "--out", str(out),
                                *ONE_FIT)
    assert code == 0 and result["export"] == str(out / "weather_forecasting" / "2")
    assert set(result) >= {"pipeline", "preset", "metrics", "baseline", "export", "seconds"}
    # The tiny preset skips Holt-Winters (seasonal_baseline: null) to stay fast.
    assert set(result["baseline"]) == {"naive_daily", "naive_weekly", "ridge"}
    assert set(result["metrics"]) == POINT_METRICS | {"mae_by_lead", "interval_coverage", "pinball"}
    assert 0 <= result["metrics"]["interval_coverage"] <= 1


def test_export_serves_celsius_forecasts_in_a_tensorflow_only_process(weather_export, tmp_path):
    out, result = weather_export
    frame = datasets.tmy3_weather()
    window = frame.iloc[-120:-72]  # two days of raw hourly weather (the tiny preset's lookback)
    request = {column: [window[column].tolist()] * 3 for column in datasets.WEATHER_COLUMNS}
    end_time = int(pd.Timestamp(window["timestamp"].iloc[-1]).value // 10**9)
    inputs = {key: np.array(value, "float32") for key, value in request.items()}
    inputs["end_time"] = np.full(3, end_time, "int64")
    (out,) = call_in_tensorflow_only_process(result["export"], [("serving_default", inputs)])["outputs"]
    answer = {"shape": list(out["temp_air"].shape), "first": out["temp_air"][0].tolist(),
              "p10": out["temp_air_p10"][0].tolist(), "p90": out["temp_air_p90"][0].tolist(),
              "times": out["forecast_time"][0].tolist()}
    assert answer["shape"] == [3, 24]
    # Degrees Celsius, not scaled units: the next day's temperature is near the last observed ones.
    last = window["temp_air"].to_numpy()
    assert last.min() - 15 < min(answer["first"]) and max(answer["first"]) < last.max() + 15
    assert answer["times"][0] == end_time + 3600 and answer["times"][-1] == end_time + 24 * 3600
    # The 80% interval brackets the point forecast at every step (offsets from residual quantiles).
    assert all(low < mid < high for low, mid, high in zip(answer["p10"], answer["first"], answer["p90"]))


def test_predict_prints_the_forecast_with_timestamps(weather_export, tmp_path, capsys):
    _, result = weather_export
    recent = tmp_path / "recent.csv"
    datasets.tmy3_weather().iloc[-100:].to_csv(recent, index=False)
    code, answer, _ = run_cli(capsys, "predict", result["export"], str(recent), "--json")
    assert code == 0 and len(answer["forecast"]) == 24
    assert answer["forecast"][0]["timestamp"] == "1991-01-01T01:00:00"
    assert list(answer["forecast"][0]) == ["timestamp", "temp_air_p10", "temp_air", "temp_air_p90"]
    assert cli.main(["predict", result["export"], str(recent)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"{recent}: forecast of the next 24 steps" and "temp_air_p10" in printed[1]  # the header


def write_load_csv(path, rows=2000, freq="30min", column="demand"):
    values = datasets.taylor_load()["demand"].to_numpy()[:rows]
    frame = pd.DataFrame({"time": pd.date_range("2021-03-01", periods=rows, freq=freq), column: values})
    frame.to_csv(path, index=False)
    return path


def test_load_backtest_then_finetune_on_a_user_csv_exports_the_next_version(capsys, tmp_path):
    """shrinkage=none: the folds and the fine-tune fit once each (the rolling choice has tests of its own)."""
    code, first, _ = run_cli(capsys, "run", "load_forecasting", "--preset", "tiny", "--json", "--out", str(tmp_path),
                             "--set", "backtest_folds=2", "--set", "members=2", "--set", "shrinkage=none")
    assert code == 0
    backtest = first["backtest"]
    assert backtest["folds"] == 2 and set(backtest["baseline"]) == set(first["baseline"])
    # The last fold is the run's own split; the earlier one tests on the test-length block just before it.
    for name, score in [("model", first["metrics"]), *first["baseline"].items()]:
        spread = backtest["metrics"] if name == "model" else backtest["baseline"][name]
        assert set(spread) == set(score)
        for key, value in score.items():
            assert spread[key]["values"][-1] == pytest.approx(value)
            assert spread[key]["mean"] == pytest.approx(np.mean(spread[key]["values"], axis=0))  # per lead: mae_by_lead
            assert spread[key]["std"] == pytest.approx(np.std(spread[key]["values"], axis=0, ddof=1))
    earlier, last = backtest["periods"]
    assert last == first["data"]["test_period"] and pd.Timestamp(earlier[1]) < pd.Timestamp(last[0])
    # The user's CSV names its columns its own way (time, load_mw); --set maps them to the export's, by position.
    user_csv = write_load_csv(tmp_path / "my_load.csv", column="load_mw")
    code, result, err = run_cli(capsys, "finetune", "load_forecasting", "--from", first["export"], "--data",
                                str(user_csv), "--set", "timestamp_col=time", "--set", "target_cols=load_mw", "--json")
    assert code == 0, err
    assert result["export"] == str(tmp_path / "load_forecasting" / "2")
    assert set(result["metrics_before"]) == set(result["metrics"]) == POINT_METRICS | {"mae_by_lead", "interval_coverage",
                                                                                        "pinball"}
    assert result["data"]["split_counts"]["unit"] == "windows" and result["data"]["split_counts"]["test"] > 0
    recent = tmp_path / "recent.csv"  # the fine-tuned export reads the user's names
    pd.read_csv(user_csv).iloc[-400:].to_csv(recent, index=False)
    code, answer, err = run_cli(capsys, "predict", result["export"], str(recent), "--json")
    assert code == 0 and len(answer["forecast"]) == 48, err

    quarter_hours = write_load_csv(tmp_path / "quarter_hours.csv", freq="15min", column="load_mw")
    mapped = ["timestamp_col=time", "target_cols=load_mw"]
    for data, sets, message in [
        (user_csv, [], "my_load.csv: missing column 'timestamp' (columns are: time, load_mw)"),  # the export's names
        (user_csv, ["timestamp_col=time", "target_cols=load_mw,time"], "config field 'target_cols': got "
         "['load_mw', 'time'], expected 1 column name(s), one for each target of the export (demand)"),
        (user_csv, [*mapped, "feature_cols=load_mw"], "config field 'feature_cols'"),
        (user_csv, ["timestamp_col=load_mw", "target_cols=load_mw"], "each CSV column named once"),
        (quarter_hours, mapped, "sampling interval is 15 min, but the model was trained on 30 min data"),
    ]:
        code, _, err = run_cli(capsys, "finetune", "load_forecasting", "--from", first["export"], "--data",
                               str(data), *[arg for setting in sets for arg in ("--set", setting)])
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in (tmp_path / "load_forecasting").iterdir() if p.name.isdigit()) == ["1", "2"]


def test_user_csv_of_any_frequency_runs_without_other_settings(capsys, tmp_path):
    """Daily data: a day ahead is one step (half-hourly data: the European CSV's run, further down)."""
    data = write_load_csv(tmp_path / "series.csv", rows=400, freq="1D", column="y")
    code, result, err = run_cli(capsys, "run", "load_forecasting", "--preset", "tiny", "--json", "--out",
                                str(tmp_path), "--data", str(data), "--set", "timestamp_col=time",
                                "--set", "target_cols=y", *ONE_FIT)
    assert code == 0, err
    state = json.loads((tmp_path / "load_forecasting" / "1" / "assets.extra" / "state.json").read_text())
    assert state["horizon"] == 1 and result["data"]["rows"] == 400


BAD_CASES = {
    "missing column": (lambda t: t.drop(columns=["demand"]), "missing column 'demand'"),
    "non-numeric cell": (lambda t: t.assign(demand=t["demand"].astype(object).where(t.index != 5, "12kW")),
                         "line 7: column 'demand' value '12kW' is not a number"),
    "empty cell": (lambda t: t.assign(demand=t["demand"].where(t.index != 5)), "line 7: column 'demand' is empty"),
    "gap": (lambda t: t.drop(index=[10, 11]), "line 12: gap in timestamps"),
    "duplicate": (lambda t: t.assign(timestamp=t["timestamp"].where(t.index != 3, t["timestamp"][2])),
                  "line 5: duplicate timestamp"),
    "non-monotonic": (lambda t: t.iloc[[0, 1, 3, 2, *range(4, len(t))]], "line 5: timestamp .* is earlier"),
    "bad timestamp": (lambda t: t.assign(timestamp=t["timestamp"].astype(str).where(t.index != 4, "31/31/2000")),
                      "line 6: column 'timestamp' value '31/31/2000' is not a date/time"),
    "too short": (lambda t: t.iloc[:300], "series of 300 rows is too short"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_csv_exits_2_with_one_line_and_writes_nothing(capsys, tmp_path, case):
    change, message = BAD_CASES[case]
    table = datasets.taylor_load().iloc[:2000].reset_index(drop=True)
    change(table).to_csv(tmp_path / "bad.csv", index=False)
    out = tmp_path / "saved_models"
    code, _, err = run_cli(capsys, "run", "load_forecasting", "--preset", "tiny", "--data",
                           str(tmp_path / "bad.csv"), "--out", str(out))
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "bad.csv" in err
    assert re.search(message, err), err
    assert not out.exists()


@pytest.mark.parametrize("content, message", [
    (b"", "the file is empty"),
    (b"timestamp,demand\n", "has a header but no data rows"),
    (b"\x7fELF\x02\x01\x01\x00\x00\x00", "binary file"),
])
def test_unreadable_files_exit_2(capsys, tmp_path, content, message):
    (tmp_path / "bad.csv").write_bytes(content)
    code, _, err = run_cli(capsys, "run", "load_forecasting", "--preset", "tiny", "--data", str(tmp_path / "bad.csv"),
                           "--out", str(tmp_path / "out"))
    assert code == 2 and message in err and not (tmp_path / "out").exists()


def test_wrong_from_folder_exits_2(capsys, tmp_path, weather_export):
    _, result = weather_export
    (tmp_path / "x.csv").write_text("timestamp,demand\n")  # --data is checked first: it must exist
    for folder, message in [(tmp_path / "nope", "no such export folder"), (tmp_path, "not a SavedModel export"),
                            (result["export"], "is an export of 'weather_forecasting'")]:
        code, _, err = run_cli(capsys, "finetune", "load_forecasting", "--from", str(folder), "--data",
                               str(tmp_path / "x.csv"))
        assert code == 2 and message in err, err


def test_gaps_are_filled_when_asked_and_counted(capsys, tmp_path):
    table = datasets.taylor_load().iloc[:2000].drop(index=[100, 101, 102]).reset_index(drop=True)
    table.loc[500, "demand"] = np.nan
    table.to_csv(tmp_path / "gappy.csv", index=False)
    code, result, err = run_cli(capsys, "run", "load_forecasting", "--preset", "tiny", "--json", "--data",
                                str(tmp_path / "gappy.csv"), "--set", "fill_gaps=interpolate", "--out", str(tmp_path), *ONE_FIT)
    assert code == 0, err
    assert result["data"]["filled_values"] == 4


class _InterruptAfterEpoch(keras.callbacks.Callback):
    def __init__(self, epoch: int) -> None:
        super().__init__()
        self.stop_epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == self.stop_epoch:
            raise KeyboardInterrupt  # as if the process were killed after this epoch's backup


def test_killed_training_resumes_from_its_checkpoint(tmp_path):
    from seqapps.config import resolve_config

    pipeline = REGISTRY.get("load_forecasting")()
    config = resolve_config(pipeline.Config, "tiny", overrides=["epochs=3", "early_stopping_patience=5"])
    data = pipeline.load_data(config, None)
    backup = tmp_path / ".checkpoints" / "run"
    strategy = training.make_strategy("auto")
    model = training.build_and_compile(pipeline, config, data, strategy)
    with pytest.raises(KeyboardInterrupt):
        training.fit(model, data, config, backup, extra_callbacks=[_InterruptAfterEpoch(2)])
    assert backup.is_dir()
    restarted = training.build_and_compile(pipeline, config, data, strategy)
    report = training.fit(restarted, data, config, backup)
    assert report["resumed_from_epoch"] == 2
    assert report["epochs_run"] == 3 and len(report["loss_history"]) == 3  # epochs 1-2 come from the backup
    assert backup.is_dir()  # kept until the export is in place
    training.remove_backup(backup, strategy)
    assert list(tmp_path.iterdir()) == []  # the backup and its empty parent are gone


def test_a_backtest_with_too_many_folds_names_the_fold_that_is_too_short():
    from seqapps.config import resolve_config
    from seqapps.errors import DataError

    pipeline = REGISTRY.get("load_forecasting")()
    config = resolve_config(pipeline.Config, "tiny", overrides=["backtest_folds=5"])
    message = r"series of 4032 rows \(backtest fold 1 of 5: its first 808 rows\) is too short"
    with pytest.raises(DataError, match=message):
        next(pipeline.backtest_splits(config, None))


@pytest.mark.parametrize("name", ["weather_forecasting", "load_forecasting"])
def test_untrained_model_is_the_ridge_baseline(name):
    from seqapps.config import resolve_config

    pipeline = REGISTRY.get(name)()
    config = resolve_config(pipeline.Config, "tiny")
    data = pipeline.load_data(config, None)
    model = pipeline.build_model(config, data)  # the RNN's correction starts at zero
    forecast = model.predict(split_inputs(data, "test", 256), verbose=0).mean(axis=1)  # of the members
    # The frozen layer holds the closed-form fit: float32 graph vs float64 NumPy, on values of O(10)-O(10^4).
    np.testing.assert_allclose(forecast, data.arrays["ridge_forecast"], rtol=1e-4, atol=1e-3)
    assert data.arrays["ridge"].alpha in baselines.RIDGE_ALPHAS


def test_a_fine_tuned_model_starts_from_the_ridge_of_the_fine_tuning_series(tmp_path):
    """The export's ridge part was fitted on another series; ``adapt_model`` puts the new series' fit there.

    With the correction dropped (w = 0) the fine-tuned model is then the fine-tuning series' ridge baseline,
    the forecast its correction learns to correct and the evaluation compares it with.
    """
    from seqapps.config import resolve_config

    pipeline = REGISTRY.get("weather_forecasting")()
    config = resolve_config(pipeline.Config, "tiny")
    exported = pipeline.load_data(config, None)  # the default series (TMY3)
    model = pipeline.build_model(config, exported)
    user_csv, _ = pipeline.write_sample_data(tmp_path)  # ten weeks of another climate
    data = pipeline.load_data(config, user_csv, state=exported.state)
    test = split_inputs(data, "test", 256)
    zero = np.zeros(model.get_layer("shrinkage").get_weights()[0].shape, "float32")
    model.get_layer("shrinkage").set_weights([zero])
    export_ridge = model.predict(test, verbose=0).mean(axis=1)
    assert np.abs(export_ridge - data.arrays["ridge_forecast"]).max() > 0.5  # degC: the two fits differ
    adapted = pipeline.adapt_model(model, config, data)
    # As in test_untrained_model_is_the_ridge_baseline: float32 graph vs float64 NumPy.
    np.testing.assert_allclose(adapted.predict(test, verbose=0).mean(axis=1), data.arrays["ridge_forecast"],
                               rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("name", ["weather_forecasting", "load_forecasting"])
def test_windows_cut_from_the_series_give_the_numbers_of_materialised_windows(name):
    """The reference is the implementation that held every window as NumPy arrays (before issue 16, item 6)."""
    from numpy.lib.stride_tricks import sliding_window_view

    from seqapps.config import resolve_config
    from seqapps.intervals import window_scale

    pipeline = REGISTRY.get(name)()
    config = resolve_config(pipeline.Config, "tiny", overrides=["members=2", "ridge_cross_fit=3"])
    data = pipeline.load_data(config, None)
    state, series = data.state, data.arrays["series"]
    lookback, horizon = state["lookback"], state["horizon"]
    target_index = [state["input_cols"].index(c) for c in state["target_cols"]]

    def materialised(split):
        origins = data.arrays["origins"][split]
        past = sliding_window_view(series, lookback, axis=0)[origins - lookback + 1]  # [N, columns, lookback]
        inputs = {column: past[:, i] for i, column in enumerate(state["input_cols"])}
        inputs["end_time"] = data.arrays["times"][origins]
        return inputs, series[origins[:, None] + np.arange(1, horizon + 1)][:, :, target_index]

    reference = {split: materialised(split) for split in ("train", "val", "test")}
    for split, (inputs, targets) in reference.items():
        windows = series_windows(data.state, data.arrays, data.arrays["origins"][split], batch_size=500)
        batches = list(windows.as_numpy_iterator())
        for column, expected in inputs.items():
            np.testing.assert_array_equal(np.concatenate([b[0][column] for b in batches]), expected)
        np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), targets)

    model = pipeline.build_model(config, data)
    rng = np.random.default_rng(1)
    for weight in model.trainable_weights:  # a non-zero correction on the frozen ridge
        weight.assign(rng.normal(0, 0.05, weight.shape).astype("float32"))
    calibrated = pipeline.calibrate(model, config, data)["interval"]
    # The ridge, fitted by scikit-learn on features of the materialised windows, as before issue 16 (item 6)
    # but in float64 (scikit-learn fitted the float32 features in float32). The pipeline solves the same
    # equations from float64 moments; TOLERANCE says how closely the two agree.
    outputs = [model.get_layer("ridge_features").output]
    if state["residual_period"]:
        outputs.append(model.get_layer("seasonal_naive").output)
    extractor = keras.Model(model.inputs, outputs)
    mean, std = np.array(state["mean"])[target_index], np.array(state["std"])[target_index]
    features, residuals, base = {}, {}, {}
    for split in ("train", "val", "test"):
        found = extractor.predict(reference[split][0], batch_size=1024, verbose=0)
        found, base[split] = (found, 0.0) if len(outputs) == 1 else (found[0], found[1].reshape(len(found[1]), -1))
        features[split] = found.astype("float64")
        residuals[split] = ((reference[split][1] - mean) / std).reshape(len(found), -1) - base[split]
    fit = data.arrays["ridge"]
    val_mae = {alpha: np.mean(np.abs(Ridge(alpha=alpha).fit(features["train"], residuals["train"]).predict(
        features["val"]) - residuals["val"])) for alpha in baselines.RIDGE_ALPHAS}
    assert fit.alpha == min(val_mae, key=val_mae.get)
    np.testing.assert_allclose(fit.val_mae, val_mae[fit.alpha], **TOLERANCE)
    x, y = (np.concatenate([d["train"], d["val"]]) for d in (features, residuals))
    ridge = Ridge(alpha=fit.alpha).fit(x, y)
    np.testing.assert_allclose(fit.coef, ridge.coef_.T, **TOLERANCE)
    np.testing.assert_allclose(fit.intercept, ridge.intercept_, **TOLERANCE)
    shape = (-1, horizon, len(std))
    np.testing.assert_allclose(data.arrays["ridge_forecast"],
                               (ridge.predict(features["test"]) + base["test"]).reshape(shape) * std + mean,
                               **TOLERANCE)
    train_only = Ridge(alpha=fit.alpha).fit(features["train"], residuals["train"])
    np.testing.assert_allclose(data.arrays["ridge_val_shift"],
                               (train_only.predict(features["val"]) - ridge.predict(features["val"])).reshape(shape)
                               * std, **TOLERANCE)
    # The RNN's targets, shifted by the full fit's forecast minus the out-of-fold one (ridge_cross_fit=3):
    # brute force, each block's fit leaves the block and `horizon` windows either side out.
    out_of_fold = np.empty_like(y)
    edges = np.linspace(0, len(x), 4).round().astype(int)
    for start, stop in zip(edges[:-1], edges[1:]):
        kept = np.r_[0:max(start - horizon, 0), min(stop + horizon, len(x)):len(x)]
        out_of_fold[start:stop] = Ridge(alpha=fit.alpha).fit(x[kept], y[kept]).predict(x[start:stop])
    shift = (ridge.predict(x) - out_of_fold).reshape(shape) * std
    shifted = np.concatenate([reference[s][1] for s in ("train", "val")]) + shift
    n_train = len(reference["train"][1])
    expected = {"train": shifted if config.fit_on_val else shifted[:n_train], "val": shifted[n_train:]}
    for split, dataset in (("train", data.train), ("val", data.val)):
        found = np.concatenate([targets for _, targets in dataset.batch(4096).as_numpy_iterator()])
        np.testing.assert_allclose(found, expected[split][:, None], **TOLERANCE)  # a members axis of 1
    # The interval's offsets, from the residuals of the materialised windows (the members' mean). By default
    # (interval_cross_fit) the ridge part is out of fold: the residual is the shifted target minus the forecast.
    forecast = {split: model.predict(reference[split][0], batch_size=256, verbose=0).mean(axis=1)
                for split in ("train", "val")}
    scale = {split: keras.ops.convert_to_numpy(window_scale(calibrated, state["target_cols"], reference[split][0]))
             for split in ("train", "val")}
    scales = np.concatenate([scale[s] for s in ("train", "val")])
    forecasts = np.concatenate([forecast[s] for s in ("train", "val")])
    offsets = intervals.conformal_offsets(shifted / scales - forecasts / scales, calibrated["levels"])
    # The pipeline keeps the residuals in float32 (a long series has millions): a relative 1e-6.
    np.testing.assert_allclose(np.array(calibrated["offsets"]), offsets, rtol=1e-6, atol=1e-6)
    # With interval_cross_fit=0: the training residuals in sample, the validation ones of the training-only ridge.
    calibrated = pipeline.calibrate(model, dataclasses.replace(config, interval_cross_fit=0), data)["interval"]
    forecast["val"] = forecast["val"] + data.arrays["ridge_val_shift"]
    offsets = intervals.conformal_offsets(
        np.concatenate([reference[s][1] / scale[s] for s in ("train", "val")])
        - np.concatenate([forecast[s] / scale[s] for s in ("train", "val")]), calibrated["levels"])
    np.testing.assert_array_equal(np.array(calibrated["offsets"]), offsets)
    np.testing.assert_array_equal(model.predict(split_inputs(data, "test", 256), verbose=0),
                                  model.predict(reference["test"][0], batch_size=256, verbose=0))


def test_a_local_series_across_a_daylight_saving_change_trains_and_forecasts_in_its_offsets(capsys, tmp_path):
    rows = 1500  # hourly from 1 March 2024: the clocks go forward on 31 March at 01:00 UTC
    utc = pd.date_range("2024-03-01", periods=rows, freq="h", tz="UTC")
    local = pd.Series(utc.tz_convert("Europe/London")).map(lambda t: t.isoformat())
    table = pd.DataFrame({"timestamp": local, "temp_air": datasets.tmy3_weather()["temp_air"].to_numpy()[:rows]})
    table.to_csv(tmp_path / "london.csv", index=False)
    code, result, err = run_cli(capsys, "run", "weather_forecasting", "--preset", "tiny", "--json", "--data",
                                str(tmp_path / "london.csv"), "--out", str(tmp_path), *ONE_FIT)
    assert code == 0, err
    assert result["data"]["step"] == "1 h" and result["data"]["timezone"] == "file offsets"
    table.iloc[-60:].to_csv(tmp_path / "recent.csv", index=False)
    code, answer, err = run_cli(capsys, "predict", result["export"], str(tmp_path / "recent.csv"), "--json")
    assert code == 0, err
    last = pd.Timestamp(table["timestamp"].iloc[-1])
    expected = [(last + pd.Timedelta(hours=h)).isoformat() for h in (1, 24)]
    assert [answer["forecast"][0]["timestamp"], answer["forecast"][-1]["timestamp"]] == expected
    assert expected[0].endswith("+01:00")
    # The report draws the same local times: the last test forecast ends at the table's last row, in summer time.
    drawn = run_folder.load_report_data(result["run_folder"])["forecast_time"]
    assert drawn[-1, -1] == np.datetime64(last.tz_localize(None)) == np.datetime64(last.tz_convert("UTC").tz_localize(
        None) + pd.Timedelta(hours=1))


def test_a_european_csv_with_semicolons_and_decimal_commas_runs_with_decimal_set(capsys, tmp_path):
    table = pd.read_csv(write_load_csv(tmp_path / "load.csv", rows=1500, column="mw"))
    table["mw"] = table["mw"].map(lambda v: f"{v:.1f}".replace(".", ","))
    table.to_csv(tmp_path / "eu.csv", sep=";", index=False)
    sets = ["--set", "timestamp_col=time", "--set", "target_cols=mw", "--out", str(tmp_path / "out"), *ONE_FIT]
    code, result, err = run_cli(capsys, "run", "load_forecasting", "--preset", "tiny", "--json", "--data",
                                str(tmp_path / "eu.csv"), "--set", "decimal=,", *sets)
    assert code == 0, err
    assert result["data"]["csv"] == {"separator": ";", "decimal": ","}
    # half-hourly data of any column names needs no other settings: a day ahead is 48 steps
    state = json.loads((tmp_path / "out" / "load_forecasting" / "1" / "assets.extra" / "state.json").read_text())
    assert state["horizon"] == 48 and result["data"]["rows"] == 1500
    code, _, err = run_cli(capsys, "run", "load_forecasting", "--preset", "tiny", "--data", str(tmp_path / "eu.csv"),
                           *sets)
    assert code == 2 and "pass --set decimal=," in err


def test_a_zero_shrinkage_weight_gives_the_ridge_forecast_exactly():
    from seqapps.config import resolve_config

    pipeline = REGISTRY.get("load_forecasting")()
    config = resolve_config(pipeline.Config, "tiny", overrides=["members=2"])
    data = pipeline.load_data(config, None)
    model = pipeline.build_model(config, data)
    test = split_inputs(data, "test", 256)
    untrained = model.predict(test, verbose=0)  # the ridge (test_untrained_model_is_the_ridge_baseline)
    rng = np.random.default_rng(1)
    for weight in model.trainable_weights:
        weight.assign(rng.normal(0, 0.05, weight.shape).astype("float32"))
    assert np.abs(model.predict(test, verbose=0) - untrained).max() > 1.0  # MW: the correction is not zero
    model.get_layer("shrinkage").set_weights([np.zeros((data.state["horizon"], 1), "float32")])
    np.testing.assert_array_equal(model.predict(test, verbose=0), untrained)


def test_shrinkage_is_chosen_on_a_first_fit_that_did_not_train_on_validation_and_served_by_the_export(
        tmp_path, monkeypatch):
    from seqapps.export_format import read_export

    fits = []
    shared_fit = training.fit

    def recorded(model, data, config, *args, **kwargs):
        fits.append((model, int(data.train.cardinality()), config.epochs))
        return shared_fit(model, data, config, *args, **kwargs)

    monkeypatch.setattr(training, "fit", recorded)
    result = runner.run("load_forecasting", "tiny", out=tmp_path,
                        overrides=["shrinkage=step", "refit_epochs=true", "epochs=2", "steps_per_epoch=8"])
    windows = result["data"]["windows"]
    (first, first_rows, _), (final, final_rows, final_epochs) = fits
    assert first_rows == windows["train"] and final_rows == windows["train"] + windows["val"]  # fit_on_val
    holdout = result["training"]["holdout"]
    assert final_epochs == int(np.argmin(holdout["val_loss_history"])) + 1 <= 2
    # The weights are the brute-force choice on the first fit's validation forecasts, with the ridge of train alone.
    pipeline = REGISTRY.get("load_forecasting")()
    from seqapps.config import resolve_config

    config = resolve_config(pipeline.Config, "tiny", overrides=["shrinkage=step"])
    data = pipeline.load_data(config, None)
    val = split_inputs(data, "val", 256)
    whole = first.predict(val, verbose=0).mean(axis=1).astype("float64")
    layer = first.get_layer("shrinkage")
    layer.set_weights([np.zeros_like(layer.get_weights()[0])])
    base = first.predict(val, verbose=0).mean(axis=1).astype("float64")
    truth = np.concatenate([t for _, t in series_windows(data.state, data.arrays, data.arrays["origins"]["val"],
                                                         batch_size=256).as_numpy_iterator()])

    expected = intervals.shrinkage_weights(truth, base + data.arrays["ridge_val_shift"], whole - base, per_step=True)
    weights = np.array(result["training"]["shrinkage"]["weights"])
    np.testing.assert_array_equal(weights, expected)
    np.testing.assert_array_equal(final.get_layer("shrinkage").get_weights()[0], weights.astype("float32"))
    # The export (plain TensorFlow) serves base + w x the final fit's correction.
    saved = serializable.load_model(read_export(result["export"]).keras_model_path)
    inputs = next(iter(val))
    shrunk = saved(inputs).numpy().mean(axis=1)
    saved.get_layer("shrinkage").set_weights([np.ones_like(weights, "float32")])
    whole = saved(inputs).numpy().mean(axis=1)
    saved.get_layer("shrinkage").set_weights([np.zeros_like(weights, "float32")])
    base = saved(inputs).numpy().mean(axis=1)
    # float32 sums of values of O(10^4) MW.
    np.testing.assert_allclose(shrunk, base + weights * (whole - base), rtol=1e-5, atol=0.05)
    assert np.abs(shrunk - whole).max() > 0 or (weights == 1).all()
    (served,) = call_in_tensorflow_only_process(
        result["export"], [("serving_default", {k: v.numpy() for k, v in inputs.items()})])["outputs"]
    np.testing.assert_allclose(served["demand"], shrunk[..., 0], rtol=1e-6, atol=1e-3)


def saved_report(tiny_report, tiny_exports, name):
    """A forecasting pipeline's tiny run as its run folder keeps it: ``(pipeline, result, report data, export state)``."""
    from seqapps.export_format import read_export

    _, result, arrays = tiny_report(name)
    return REGISTRY.get(name)(), result, arrays, read_export(tiny_exports[name]["export"]).state


@pytest.mark.parametrize("name", ["weather_forecasting", "load_forecasting"])
def test_report_data_holds_test_forecasts_and_the_80_percent_band_the_export_serves(tiny_exports, name, tiny_report):
    import tensorflow as tf

    from seqapps.export import call_signature

    pipeline, result, arrays, state = saved_report(tiny_report, tiny_exports, name)
    (target,), lookback, horizon = state["target_cols"], state["lookback"], state["horizon"]
    # The windows cut again from the raw table, by the times the report data names.
    frame = pipeline.default_data()
    rows = pd.Index(frame["timestamp"]).get_indexer(pd.to_datetime(arrays["history_time"][:, -1]))
    assert len(rows) == 4 and (rows >= lookback - 1).all()
    window = [frame.iloc[row - lookback + 1: row + 1] for row in rows]
    ahead = [frame.iloc[row + 1: row + 1 + horizon] for row in rows]
    np.testing.assert_array_equal(arrays["history_time"], [w["timestamp"].to_numpy("datetime64[s]") for w in window])
    np.testing.assert_array_equal(arrays["forecast_time"], [a["timestamp"].to_numpy("datetime64[s]") for a in ahead])
    np.testing.assert_array_equal(arrays[f"history/{target}"], [w[target].to_numpy("float32") for w in window])
    np.testing.assert_array_equal(arrays[f"actual/{target}"], [a[target].to_numpy("float32") for a in ahead])
    # Spread over the whole test period: the first forecast starts it, the last one ends it.
    start, end = pd.to_datetime(result["data"]["test_period"])
    assert arrays["forecast_time"][0, 0] == start and arrays["forecast_time"][-1, -1] == end
    # The band is the export's own 80% interval: a direct call of serving_default on the raw windows.
    assert arrays["interval_levels"].tolist() == [0.1, 0.9] and result["config"]["interval"] == 0.8
    inputs = {column: np.stack([w[column].to_numpy("float32") for w in window]) for column in state["input_cols"]}
    inputs["end_time"] = np.array([pd.Timestamp(w["timestamp"].iloc[-1]).value // 10**9 for w in window], "int64")
    served = call_signature(tf.saved_model.load(tiny_exports[name]["export"]).signatures["serving_default"], inputs)
    for output in (target, f"{target}_p10", f"{target}_p90"):
        np.testing.assert_array_equal(arrays[f"forecast/{output}"], served[output])
    low, point, high = (arrays[f"forecast/{target}{suffix}"] for suffix in ("_p10", "", "_p90"))
    assert (low < point).all() and (point < high).all()


@pytest.mark.parametrize("name", ["weather_forecasting", "load_forecasting"])
def test_mae_by_lead_of_the_model_and_baselines_is_the_brute_force_per_step_error(tiny_exports, name, tiny_report):
    pipeline, result, _, state = saved_report(tiny_report, tiny_exports, name)
    (target,), horizon, day = state["target_cols"], state["horizon"], state["daily_lag"]
    scores = {"model": result["metrics"], **result["baseline"]}
    for score in scores.values():  # equal weights per step: the mean over leads is the MAE
        assert len(score["mae_by_lead"]) == horizon
        assert np.mean(score["mae_by_lead"]) == pytest.approx(score["mae"], rel=1e-12)
    # Same time yesterday, by hand over every test window (a day is the horizon in both pipelines).
    assert day == horizon
    frame = pipeline.default_data()
    values = frame[target].to_numpy("float64")
    first, last = pd.Index(frame["timestamp"]).get_indexer(pd.to_datetime(result["data"]["test_period"]))
    origins = np.arange(first - 1, last - horizon + 1)
    leads = np.arange(1, horizon + 1)
    errors = np.abs(values[origins[:, None] + leads] - values[origins[:, None] + leads - day])
    assert len(origins) == result["data"]["windows"]["test"]
    # The pipeline reads the true values from the float32 series: each error moves by half a float32 step at most.
    np.testing.assert_allclose(scores["naive_daily"]["mae_by_lead"], errors.mean(axis=0), rtol=0,
                               atol=float(np.spacing(np.float32(np.abs(values).max()))))


def decoded_sizes(sections):
    return [Image.open(io.BytesIO(figure.png)).size for figure in figures_of(sections)]


@pytest.mark.parametrize("name", ["weather_forecasting", "load_forecasting"])
def test_report_sections_draw_the_forecasts_and_the_mae_per_lead_and_build_without_report_data(tiny_exports, name, tiny_report):
    pipeline, result, arrays, state = saved_report(tiny_report, tiny_exports, name)
    sections = {section.id(): section for section in pipeline.report_sections(result, arrays)}
    assert list(sections) == ["forecast", "mae-by-lead"]  # no backtest in a one-fold run
    assert [block.name for block in sections["forecast"].blocks] == [f"forecast_{state['target_cols'][0]}"]
    assert all(width > 0 and height > 0 for width, height in decoded_sizes(sections.values()))
    (table,) = [block for block in sections["mae-by-lead"].blocks if isinstance(block, Table)]
    scores = {"model": result["metrics"], **result["baseline"]}
    assert [row[0] for row in table.rows] == list(scores)
    assert table.rows[0][-1] == result["metrics"]["mae_by_lead"][-1]  # the last column: the whole horizon ahead
    # seqapps report on an export without its run folder: no forecasts, the rest from the result alone.
    bare = {section.id(): section for section in pipeline.report_sections(result, {})}
    assert list(bare) == ["forecast", "mae-by-lead"]
    assert not any(isinstance(block, Figure) for block in bare["forecast"].blocks)
    assert [figure.name for figure in figures_of(bare.values())] == ["mae_by_lead"]


def test_report_backtest_section_shows_each_folds_headline_metric_from_the_result(tiny_exports, tiny_report):
    pipeline, result, _, _ = saved_report(tiny_report, tiny_exports, "load_forecasting")
    earlier = ({key: np.add(value, 100).tolist() for key, value in result["metrics"].items()},
               {name: {"mae": score["mae"] + 50} for name, score in result["baseline"].items()})
    backtest = runner.backtest_summary([earlier, (result["metrics"], result["baseline"])],
                                       [["2000-07-01 00:00:00", "2000-07-31 23:30:00"], result["data"]["test_period"]])
    # A list metric is summarised per element: the mean MAE over the folds at each lead time.
    lead = backtest["metrics"]["mae_by_lead"]
    assert lead["mean"] == pytest.approx(np.add(result["metrics"]["mae_by_lead"], 50))
    assert lead["std"] == pytest.approx(np.full(len(lead["mean"]), np.std([100, 0], ddof=1)))
    sections = {s.id(): s for s in pipeline.report_sections({**result, "backtest": backtest}, {})}
    (figure,) = [block for block in sections["backtest"].blocks if isinstance(block, Figure)]
    (table,) = [block for block in sections["backtest"].blocks if isinstance(block, Table)]
    assert figure.name == "backtest" and decoded_sizes([sections["backtest"]])[0][0] > 0
    assert table.columns == ["fold", "test period", "model", *result["baseline"]]
    mae = [result["metrics"]["mae"], *(score["mae"] for score in result["baseline"].values())]
    assert table.rows[0] == ["fold 1", "2000-07-01 00:00:00 to 2000-07-31 23:30:00", mae[0] + 100,
                             *(value + 50 for value in mae[1:])]
    assert table.rows[1] == ["fold 2", " to ".join(result["data"]["test_period"]), *mae]
    assert table.rows[2][2] == f"{mae[0] + 50:.4g} ± {np.std([mae[0] + 100, mae[0]], ddof=1):.4g}"


def test_shrinkage_none_serves_the_whole_correction_even_from_a_model_that_came_with_other_weights(tmp_path):
    """A fine-tuned export arrives with its own shrinkage weights; ``shrinkage=none`` means w = 1."""
    from seqapps.config import resolve_config

    pipeline = REGISTRY.get("weather_forecasting")()
    config = resolve_config(pipeline.Config, "tiny", overrides=["shrinkage=none", "steps_per_epoch=1"])
    data = pipeline.load_data(config, None)
    model = training.build_and_compile(pipeline, config, data, tf.distribute.get_strategy())
    layer = model.get_layer("shrinkage")
    layer.set_weights([np.zeros_like(layer.get_weights()[0])])  # as an export whose correction was dropped
    report = pipeline.fit(model, config, data, tmp_path / "checkpoints")
    np.testing.assert_array_equal(layer.get_weights()[0], 1.0)
    assert report["note"].startswith("correction kept at leads 1-")
