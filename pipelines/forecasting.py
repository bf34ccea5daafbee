"""Multi-step time-series forecasting: weather (air temperature) and electricity load.

The model reads a window per input column and the Unix time of its last step, scales it in the
graph, adds calendar features and emits the whole horizon at once from stacked GRU/LSTM layers:
a correction on top of a base, the seasonal-naive forecast (``residual_period``) and a ridge
regression fitted in closed form and frozen in the graph (``ridge_lags``), optionally shrunk
(``shrinkage``). Splits are chronological (70/10/20); a window belongs to the split its targets
fall in. The test metrics stand beside the baselines: same time yesterday, same time last week,
the ridge and additive Holt-Winters (``seasonal_baseline``). The ``interval`` (80%) is locally
weighted split conformal, served as ``<target>_p10`` and ``<target>_p90`` (see ``calibrate``).
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
from pathlib import Path
from typing import Any, Iterator, Sequence

import keras
import numpy as np
import pandas as pd
import tensorflow as tf

from seqapps import baselines, compat, intervals
from seqapps import metrics as forecast_metrics_lib
from seqapps.config import TrainingConfig, require
from seqapps.data import datasets, samples
from seqapps.data import splits as split_rule
from seqapps.data.tables import (DECIMAL_MARKS, FILL_METHODS, check_timezone, cut_windows, fold_bounds,
                                 format_duration, local_times, numeric_columns, parse_duration, read_csv,
                                 read_recent, to_time_series, window_origins)
from seqapps.errors import DataError
from seqapps.export import ServingModule, Signature
from seqapps.losses import ScaledMeanAbsoluteError
from seqapps.layers.time_features import CalendarFeatures, SeasonalDifference, SeasonalNaive, Shrinkage
from seqapps.pipeline import SPLIT_COUNTS, Headline, Pipeline, Splits, row_inputs

END_TIME = "end_time"
FORECAST_TIME = "forecast_time"
SHRINKAGE = ("none", "global", "step")


def cross_fit_blocks(config: "ForecastingConfig", windows: int, horizon: int) -> int:
    """How many cross-fitting blocks the ridge is fitted with (0: none).

    ``ridge_cross_fit`` if set; else ``interval_cross_fit`` when the interval is calibrated on
    out-of-fold residuals and each block's fit keeps at least half of the ``windows`` training
    and validation windows (a block and its gaps of a ``horizon`` either side are left out).
    """
    if config.ridge_cross_fit > 1:
        return config.ridge_cross_fit
    blocks = config.interval_cross_fit
    return blocks if blocks > 1 and windows / blocks + 2 * horizon <= windows / 2 else 0


def csv_columns(state: dict[str, Any]) -> tuple[str, list[str]]:
    """The CSV names of an export's timestamp and input columns: the model's own names, or the ones a
    fine-tune mapped them to (``finetune_csv_names``), which ``predict`` and the next fine-tune read.

    Returns:
        ``(timestamp column, input columns in the model's order)``.
    """
    names = state.get("csv_names", {})
    return names.get(state["timestamp_col"], state["timestamp_col"]), [names.get(c, c) for c in state["input_cols"]]


def finetune_csv_names(config: "ForecastingConfig", state: dict[str, Any]) -> dict[str, str]:
    """The fine-tuning CSV's name of each of the export's columns, mapped by position.

    ``timestamp_col`` names the CSV's timestamp column, ``target_cols`` one CSV column for each of the
    export's targets in order, and ``feature_cols`` (when set) one for each of its other inputs in order;
    settings left alone keep the names the export read (they come from its saved config).

    Args:
        config: the fine-tuning config (the export's, with the user's ``--set`` on top).
        state: the export's state.

    Returns:
        ``{export column: CSV column}`` for the timestamp and every input column.

    Raises:
        ConfigError: a list of another length than the export's, or a CSV column named twice.
    """
    _, read_before = csv_columns(state)
    targets = state["target_cols"]
    features = [c for c in state["input_cols"] if c not in targets]
    require(len(config.target_cols) == len(targets), "target_cols", config.target_cols,
            f"{len(targets)} column name(s), one for each target of the export ({', '.join(targets)})")
    feature_cols = (list(config.feature_cols) if config.feature_cols is not None
                    else [read_before[state["input_cols"].index(c)] for c in features])
    require(len(feature_cols) == len(features), "feature_cols", config.feature_cols,
            f"{len(features)} column name(s), one for each feature of the export ({', '.join(features) or 'none'})")
    names = {state["timestamp_col"]: config.timestamp_col, **dict(zip(targets, config.target_cols)),
             **dict(zip(features, feature_cols))}
    require(len(set(names.values())) == len(names), "timestamp_col/target_cols/feature_cols",
            list(names.values()), "each CSV column named once")
    return names


def quantile_name(target: str, level: float) -> str:
    """The serving output name of a target's quantile: ``temp_air_p10``."""
    return f"{target}_p{100 * level:g}"


@dataclasses.dataclass
class ForecastingConfig(TrainingConfig):
    """Forecasting settings. Durations ("1D", "7D", "24h") or step counts are accepted.

    Attributes:
        timestamp_col: the CSV column of timestamps.
        target_cols: columns to forecast.
        feature_cols: input covariates besides the targets (None: every other numeric column).
            At ``finetune``, these three name your CSV's columns for the export's, by position
            (``finetune_csv_names``); the new export reads those names in ``predict`` too.
        horizon: how far ahead to forecast.
        lookback: how much history the model reads.
        residual_period: forecast a correction to the seasonal-naive forecast of this
            period (None: forecast directly). The encoder then reads the last
            ``lookback - residual_period`` steps and their change over one period.
        cell: "gru" or "lstm".
        units: units per recurrent layer.
        layers: stacked recurrent layers.
        members: independently initialised corrections (RNN and head each), trained side by
            side, each on its own loss, and averaged: a deep ensemble in one graph.
        dropout: input dropout of each recurrent layer.
        l2: L2 penalty on the recurrent layers' kernels.
        calendar_features: add time-of-day/week features.
        ridge_lags: how many recent steps the ridge baseline reads (None: no ridge, and
            the model forecasts on top of the seasonal-naive forecast or directly).
        ridge_cross_fit: with K > 1, the RNN learns to correct the ridge's out-of-sample errors:
            its training and validation targets are shifted by the full ridge fit's forecast
            minus the forecast of a fit that left the window's block out (K contiguous
            blocks of the training and validation windows), so that it sees residuals like
            those on the test split rather than the ridge's smaller in-sample ones.
        ridge_trainable: let training adjust the ridge weights (a linear highway, as in
            LSTNet) instead of keeping the closed-form fit frozen.
        seasonal_baseline: the season of the Holt-Winters baseline (None: skip it; it
            takes seconds on the default data).
        interval: the central coverage of the reported prediction interval.
        interval_cross_fit: with K > 1 (and a ridge part), the interval is calibrated on
            out-of-fold residuals: each training and validation window's forecast takes its ridge
            part from a fit that left the window's block out (the ``ridge_cross_fit`` blocks if
            set, else K; see ``cross_fit_blocks``). Else, and for a series too short for K blocks,
            on the full ridge's training residuals and the training-only ridge's validation ones.
        fit_on_val: train the RNN on the training and validation windows (the
            validation loss, then in-sample, still drives early stopping).
        shrinkage: "global" or "step": the forecast is the base plus w times the correction,
            w in [0, 1] (one per target, or per horizon step and target) chosen by validation
            MAE on forecasts the correction did not train on: with ``fit_on_val`` those of a
            first fit on the training windows alone (the ridge part then fitted on the
            training split alone too), else the final fit's. "none": w = 1.
        refit_epochs: with ``fit_on_val``, train the final fit for as many epochs as the fit
            on the training windows alone (early-stopped on validation) found best.
        fill_gaps: "none" (gaps and empty cells are errors), "interpolate" or "ffill".
        val_fraction, test_fraction: chronological split sizes.
        backtest_folds: with N > 1, ``seqapps run`` also trains and scores on N - 1 earlier
            cut points (see ``fold_bounds``) and reports each metric's mean and spread
            over the N folds; the export is the last fold's model.
        timezone: the series' IANA time zone (e.g. Europe/London) for calendar features
            and printed forecasts; None: the file's UTC offsets, or wall-clock time.
        decimal: the CSV's decimal mark, "." or "," (the separator is detected).
    """

    timestamp_col: str = "timestamp"
    target_cols: list[str] = dataclasses.field(default_factory=list)
    feature_cols: list[str] | None = None
    horizon: int | str = "1D"
    lookback: int | str = "7D"
    residual_period: int | str | None = None
    cell: str = "gru"
    units: int = 64
    layers: int = 2
    members: int = 1
    dropout: float = 0.0
    l2: float = 0.0
    calendar_features: bool = True
    ridge_lags: int | str | None = None
    ridge_cross_fit: int = 0
    ridge_trainable: bool = False
    seasonal_baseline: int | str | None = None
    interval: float = 0.8
    interval_cross_fit: int = 5
    fit_on_val: bool = False
    shrinkage: str = "none"
    refit_epochs: bool = False
    fill_gaps: str = "none"
    val_fraction: float = 0.1
    test_fraction: float = 0.2
    backtest_folds: int = 1
    timezone: str | None = None
    decimal: str = "."

    def validate(self) -> None:
        super().validate()
        check_timezone(self.timezone)
        require(self.decimal in DECIMAL_MARKS, "decimal", self.decimal, f"one of {' '.join(DECIMAL_MARKS)}")
        require(bool(self.target_cols), "target_cols", self.target_cols, "at least one column name")
        require(self.cell in ("gru", "lstm"), "cell", self.cell, "gru or lstm")
        require(self.units >= 1 and self.layers >= 1 and self.members >= 1, "units/layers/members",
                (self.units, self.layers, self.members), "integers >= 1")
        require(0 <= self.dropout < 1, "dropout", self.dropout, "a number in [0, 1)")
        require(self.l2 >= 0, "l2", self.l2, "a number >= 0")
        require(0 < self.interval < 1, "interval", self.interval, "a coverage in (0, 1), such as 0.8")
        require(self.interval_cross_fit >= 0, "interval_cross_fit", self.interval_cross_fit, "an integer >= 0")
        require(self.shrinkage in SHRINKAGE, "shrinkage", self.shrinkage, f"one of {', '.join(SHRINKAGE)}")
        require(self.backtest_folds >= 1, "backtest_folds", self.backtest_folds, "an integer >= 1")
        require(self.fill_gaps in FILL_METHODS, "fill_gaps", self.fill_gaps, f"one of {', '.join(FILL_METHODS)}")
        require(0 < self.val_fraction < 0.5 and 0 < self.test_fraction < 0.5
                 and self.val_fraction + self.test_fraction < 0.8,
                 "val_fraction/test_fraction", (self.val_fraction, self.test_fraction), "fractions summing below 0.8")


@dataclasses.dataclass
class WeatherConfig(ForecastingConfig):
    target_cols: list[str] = dataclasses.field(default_factory=lambda: ["temp_air"])
    # Measured (seeds 42 and 7): 3 days 2.85/2.86 degC MAE in ~60 s, 5 days 2.90/2.85 in ~90 s, 7 days 3.06;
    # a residual on the daily naive forecast 3.11-3.26.
    lookback: int | str = "3D"
    residual_period: int | str | None = None
    ridge_lags: int | str | None = "3D"
    seasonal_baseline: int | str | None = "1D"
    # On the ridge base (measured, docs/results.md): 64 units at 1e-3 2.641 degC (ridge 2.639);
    # 32 units, dropout 0.2, 3e-4: 2.629 (seed 42), 2.622 (seed 7).
    units: int = 32
    dropout: float = 0.2
    learning_rate: float = 3e-4
    # Backtest (3 folds, docs/results.md; ridge 2.049 degC): w = 1 2.053, one w 2.047, a w per step 2.044 (seed 42),
    # 2.049 (seed 7); the weights fall from 1 to 0 over the day.
    shrinkage: str = "step"
    PRESETS = {
        "tiny": {"lookback": "2D", "ridge_lags": "1D", "seasonal_baseline": None, "units": 8, "layers": 1,
                 "epochs": 1, "steps_per_epoch": 4, "batch_size": 32},
        "default": {},
        "full": {"units": 128, "epochs": 60, "early_stopping_patience": 8},
    }


@dataclasses.dataclass
class LoadConfig(ForecastingConfig):
    target_cols: list[str] = dataclasses.field(default_factory=lambda: ["demand"])
    lookback: int | str = "8D"
    residual_period: int | str | None = "7D"
    ridge_lags: int | str | None = "1D"
    seasonal_baseline: int | str | None = "7D"
    # On the ridge base (measured, docs/results.md; ridge 336.8 MW): one correction 335.6-337.5 MW,
    # 5 members 336.8; 3 members on cross-fitted ridge residuals 334.8 / 335.1 (seeds 42 / 7).
    units: int = 32
    dropout: float = 0.2
    learning_rate: float = 3e-4
    fit_on_val: bool = True
    members: int = 3
    ridge_cross_fit: int = 5
    PRESETS = {
        "tiny": {"lookback": "8D", "seasonal_baseline": None, "units": 8, "layers": 1, "members": 1, "epochs": 1,
                 "steps_per_epoch": 4, "batch_size": 32},
        "default": {},
        "full": {"units": 128, "epochs": 60, "early_stopping_patience": 8},
    }



def window_scale(interval: dict[str, Any], targets: Sequence[str], inputs: dict[str, Any]) -> Any:
    """Each window's local scale per target, [batch, 1, targets], as ``interval`` (the saved state's) sets it."""
    return intervals.local_scales([inputs[name] for name in targets], interval["scale_lag"], interval["scale_floor"])

class Forecasting(Pipeline):
    """Shared implementation; subclasses name the default data and defaults."""

    Config = ForecastingConfig
    predict_input = "a CSV file holding the last lookback rows (or more) of the training columns"

    def default_data(self) -> pd.DataFrame:
        """Returns the embedded default table."""
        raise NotImplementedError

    # --- data ---------------------------------------------------------------------------

    def load_data(self, config: ForecastingConfig, data_path: str | None,
                  state: dict[str, Any] | None = None) -> Splits:
        return self._fold_splits(config, self._frame(config, data_path), state, config.backtest_folds - 1)

    def backtest_splits(self, config: ForecastingConfig, data_path: str | None) -> Iterator[Splits]:
        frame = self._frame(config, data_path)
        for fold in range(config.backtest_folds - 1):
            yield self._fold_splits(config, frame, None, fold)

    def _frame(self, config: ForecastingConfig, data_path: str | None) -> pd.DataFrame:
        return read_csv(data_path, decimal=config.decimal) if data_path else self.default_data()

    def _fold_splits(self, config: ForecastingConfig, frame: pd.DataFrame, state: dict[str, Any] | None,
                     fold: int) -> Splits:
        """The splits of backtest fold ``fold`` (see ``fold_bounds``; the last fold is the whole series).

        With ``ridge_lags`` the ridge baseline is fitted here, on the fold's training and validation
        windows (``_fit_ridge``): the model starts from it and the later stages read it.
        """
        source = frame.attrs.get("source", "data")
        if state is not None:
            input_cols, targets = state["input_cols"], state["target_cols"]
            csv_names = finetune_csv_names(config, state)
            read_cols = [csv_names[c] for c in input_cols]
            state = {**state, "csv_names": csv_names}
        else:
            targets = list(config.target_cols)
            features = (list(config.feature_cols) if config.feature_cols is not None
                        else numeric_columns(frame, [config.timestamp_col, *targets]))
            input_cols = read_cols = targets + [c for c in features if c not in targets]
        series = to_time_series(frame, config.timestamp_col, read_cols, config.fill_gaps, config.timezone)
        series.frame.columns = input_cols  # the model's names
        step_seconds = int(series.step.total_seconds())
        if state is not None and step_seconds != state["step_seconds"]:
            raise DataError(f"{source}: sampling interval is {format_duration(series.step)}, but the model was "
                            f"trained on {format_duration(pd.Timedelta(seconds=state['step_seconds']))} data")
        steps = self._steps(config, series.step) if state is None else {
            k: state.get(k) for k in ("horizon", "lookback", "residual_period", "ridge_lags", "daily_lag",
                                      "weekly_lag")}
        seasonal = None if config.seasonal_baseline is None else parse_duration(
            config.seasonal_baseline, series.step, "seasonal_baseline")
        folds, rows = config.backtest_folds, len(series.frame)
        bounds = fold_bounds(rows, config.val_fraction, config.test_fraction, folds)[fold]
        n = bounds["test"][1]  # this fold sees the first n rows
        values = series.frame.to_numpy(dtype="float64")[:n]
        where = f" (backtest fold {fold + 1} of {folds}: its first {n} rows)" if folds > 1 else ""
        lookback, horizon = steps["lookback"], steps["horizon"]
        origins = {name: window_origins(start, stop, lookback, horizon) for name, (start, stop) in bounds.items()}
        for name, found in origins.items():
            if len(found) == 0 or (name == "test" and found[0] < max(lookback, steps["weekly_lag"]) - 1):
                raise DataError(
                    f"{source}: series of {rows} rows{where} is too short: the {name} split "
                    f"({bounds[name][1] - bounds[name][0]} rows) must hold a {horizon}-step horizon after "
                    f"{lookback} steps of lookback and a week of history for the baselines")
        train_values = values[: bounds["train"][1]]
        if state is None:
            state = {
                "timestamp_col": config.timestamp_col, "target_cols": targets, "input_cols": input_cols,
                "step_seconds": step_seconds, **steps,
                "mean": train_values.mean(axis=0).tolist(),
                "std": np.maximum(train_values.std(axis=0), 1e-6).tolist(),
                "timezone": series.timezone, "utc_offsets": series.utc_offsets, "decimal": config.decimal,
            }
        target_index = [input_cols.index(c) for c in targets]
        report = {"source": source, "rows": n, "step": format_duration(series.step), "input_cols": input_cols,
                  "target_cols": targets, "filled_values": series.filled, "timezone": series.timezone,
                  **({"csv": frame.attrs["csv"]} if "csv" in frame.attrs else {}),
                  "windows": {name: int(len(found)) for name, found in origins.items()},
                  "test_period": [str(series.frame.index[i]) for i in (bounds["test"][0], n - 1)]}
        report[SPLIT_COUNTS] = split_rule.split_counts("windows", report["windows"])
        # Windows are never materialised: training, the ridge fit, the calibration and evaluation
        # cut them from the series as they read them (see docs/results.md, memory).
        arrays = {"values": values[:, target_index], "series": values.astype("float32"), "origins": origins,
                  "times": series.frame.index.to_numpy().astype("datetime64[s]").astype("int64")[:n],
                  "fit_end": bounds["val"][1], "seasonal_baseline": seasonal,
                  "mase_scale": forecast_metrics_lib.mase_scale(train_values[:, target_index], steps["daily_lag"])}
        data = Splits(None, None, None, state=state, report=report, arrays=arrays)
        fitted = len(origins["train"]) + len(origins["val"])
        if state["ridge_lags"]:
            self._fit_ridge(data, cross_fit_blocks(config, fitted, horizon))
        # With ridge_cross_fit, the training and validation targets are shifted to the ridge's out-of-fold
        # residuals, batch by batch from each window's features and cross-fitting block.
        blocks = (arrays["ridge"].blocks(np.arange(fitted)) if state["ridge_lags"] and config.ridge_cross_fit > 1
                  else None)
        n_train = len(origins["train"])
        train = (origins["train"], None if blocks is None else blocks[:n_train])
        val = (origins["val"], None if blocks is None else blocks[n_train:])
        if config.fit_on_val:  # the protocol's final fit on train + val; validation then only paces training
            if self._holdout_fit(config):  # a first fit on train alone, scored on validation (see ``fit``)
                arrays["train_alone"] = self._windows(data, *train).map(lambda inputs, y: (inputs, y[None]))
            train = (np.concatenate([origins["train"], origins["val"]]), blocks)
        # Targets get a members axis of 1, against which every member's forecast is scored.
        data.train, data.val, data.test = (self._windows(data, *split).map(lambda inputs, y: (inputs, y[None]))
                                           for split in (train, val, (origins["test"], None)))
        return data

    @staticmethod
    def _steps(config: ForecastingConfig, step: pd.Timedelta) -> dict[str, int | None]:
        horizon = parse_duration(config.horizon, step, "horizon")
        lookback = parse_duration(config.lookback, step, "lookback")
        day = max(1, int(pd.Timedelta("1D") // step))
        residual = None if config.residual_period is None else parse_duration(config.residual_period, step,
                                                                               "residual_period")
        if residual is not None and residual >= lookback:
            raise DataError(f"config field 'residual_period': {config.residual_period} must be shorter than the "
                            f"lookback ({config.lookback}): the model reads the last season's change")
        ridge = None if config.ridge_lags is None else parse_duration(config.ridge_lags, step, "ridge_lags")
        if ridge is not None and ridge > lookback - (residual or 0):
            raise DataError(f"config field 'ridge_lags': {config.ridge_lags} is longer than the lookback "
                            f"({config.lookback}) minus the residual_period ({config.residual_period})")
        return {"horizon": horizon, "lookback": lookback, "residual_period": residual, "ridge_lags": ridge,
                "daily_lag": day, "weekly_lag": 7 * day}

    @staticmethod
    def _windows(data: Splits, origins: np.ndarray, blocks: np.ndarray | None = None,
                 batch_size: int | None = None) -> tf.data.Dataset:
        """The windows at ``origins`` (``seqapps.data.tables.cut_windows``); with each window's cross-fitting
        block, the targets are shifted to the ridge's out-of-fold residuals (``ridge_target_shift``)."""
        state, arrays = data.state, data.arrays
        return cut_windows(arrays["series"], arrays["times"], origins, state["input_cols"],
                           [state["input_cols"].index(c) for c in state["target_cols"]], state["lookback"],
                           state["horizon"], batch_size, None if blocks is None else
                           (blocks, arrays["ridge_target_shift"]), time_key=END_TIME)

    def _split_windows(self, data: Splits, split: str, batch_size: int) -> tf.data.Dataset:
        """A split's window inputs (without targets), in batches of ``batch_size``, for ``predict``."""
        return self._windows(data, data.arrays["origins"][split], batch_size=batch_size).map(lambda x, y: x)

    def _forecast_batches(self, model: keras.Model, data: Splits, origins: np.ndarray, interval: dict[str, Any],
                          blocks: np.ndarray | None = None
                          ) -> Iterator[tuple[slice, np.ndarray, np.ndarray, np.ndarray]]:
        """The model's forecasts of the windows at ``origins``, batch by batch, with what scores them.

        Args:
            interval: the interval's state (its local scale).
            blocks: as in ``_windows``: the true values are shifted.

        Yields:
            ``(rows, forecast, scale, targets)``: the batch's rows in ``origins``, the ensemble's
            forecast (the mean of its members) [batch, horizon, targets], each window's local
            scale [batch, 1, targets] and the true values [batch, horizon, targets].
        """
        start, predict = 0, compat.batch_predictor(model)
        for inputs, targets in self._windows(data, origins, blocks, batch_size=256):
            forecast = predict(inputs).numpy().mean(axis=1)  # over the members axis
            scale = keras.ops.convert_to_numpy(window_scale(interval, data.state["target_cols"], inputs))
            yield slice(start, start + len(forecast)), forecast, scale, targets.numpy()
            start += len(forecast)

    # --- model ----------------------------------------------------------------------------

    @staticmethod
    def _inputs(state: dict[str, Any]) -> dict[str, keras.KerasTensor]:
        inputs = {name: keras.Input((state["lookback"],), name=name) for name in state["input_cols"]}
        inputs[END_TIME] = keras.Input((), dtype="int64", name=END_TIME)
        return inputs

    @staticmethod
    def _scaled_window(state: dict[str, Any], inputs: dict[str, Any]) -> Any:
        """The window [batch, lookback, columns], scaled by the training mean and deviation."""
        lookback = state["lookback"]
        stacked = [keras.layers.Reshape((lookback, 1))(inputs[name]) for name in state["input_cols"]]
        window = keras.layers.Concatenate(name="window")(stacked) if len(stacked) > 1 else stacked[0]
        return keras.layers.Normalization(axis=-1, mean=state["mean"], variance=np.square(state["std"]),
                                          name="scale_inputs")(window)

    @staticmethod
    def _base(state: dict[str, Any], scaled: Any) -> Any | None:
        """The seasonal-naive forecast in scaled units, or None without a residual period."""
        if not state["residual_period"]:
            return None
        target_index = [state["input_cols"].index(c) for c in state["target_cols"]]
        return SeasonalNaive(state["residual_period"], state["horizon"], target_index, name="seasonal_naive")(scaled)

    @staticmethod
    def _ridge_features(state: dict[str, Any], inputs: dict[str, Any], scaled: Any) -> Any:
        """The ridge regression's inputs: recent scaled values (and their seasonal change) and the calendar."""
        lags, period = state["ridge_lags"], state["residual_period"]
        recent = SeasonalDifference(period, name="ridge_seasonal_difference")(scaled) if period else scaled
        recent = keras.layers.Cropping1D((recent.shape[1] - lags, 0), name="ridge_lags")(recent)
        calendar, _ = CalendarFeatures(state["step_seconds"], 1, 1, name="ridge_calendar")(inputs[END_TIME])
        return keras.layers.Concatenate(name="ridge_features")(
            [keras.layers.Flatten()(recent), keras.layers.Flatten()(calendar)])

    def _fit_ridge(self, data: Splits, folds: int) -> None:
        """Fits the ridge baseline on the residual to the seasonal-naive base (``baselines.BaseRidge``).

        It stores in ``data.arrays``: ``ridge`` (the fit), ``ridge_forecast`` (the test windows'
        forecasts), ``ridge_val_shift`` (what the training-only fit adds on the validation windows)
        and, with ``folds`` > 1 cross-fitting blocks, ``ridge_target_shift``: a function of a batch's
        inputs and blocks that gives the full fit's forecast minus the block's fit's (user units).
        """
        state, arrays = data.state, data.arrays
        inputs = self._inputs(state)
        scaled = self._scaled_window(state, inputs)
        base = self._base(state, scaled)
        extractor = keras.Model(inputs, [self._ridge_features(state, inputs, scaled)]
                                + ([] if base is None else [keras.layers.Flatten()(base)]))
        predict = compat.batch_predictor(extractor)

        def extract(batch: dict[str, tf.Tensor]) -> tuple[np.ndarray, np.ndarray | float]:
            features, *base_values = [part.numpy() for part in tf.nest.flatten(predict(batch))]
            return features, base_values[0] if base_values else 0.0

        def windows(origins: np.ndarray) -> Iterator[tuple[dict[str, tf.Tensor], np.ndarray]]:
            return ((batch, truth.numpy()) for batch, truth in self._windows(data, origins, batch_size=1024))

        target_index = [state["input_cols"].index(c) for c in state["target_cols"]]
        mean, std = np.array(state["mean"])[target_index], np.array(state["std"])[target_index]
        origins = arrays["origins"]
        ridge = baselines.BaseRidge.fitted(extract, windows, np.concatenate([origins["train"], origins["val"]]),
                                           len(origins["train"]), mean, std, folds=folds, gap=state["horizon"])
        arrays.update(ridge=ridge.fit, ridge_forecast=ridge.forecast(origins["test"]),
                      ridge_val_shift=ridge.train_only_shift(origins["val"]))
        if folds > 1:
            shape = (-1, state["horizon"], len(target_index))
            arrays["ridge_target_shift"] = lambda batch, blocks: tf.reshape(ridge.fit.out_of_fold_shift(
                tf.nest.flatten(extractor(batch, training=False))[0], blocks), shape) * std

    def build_model(self, config: ForecastingConfig, data: Splits) -> keras.Model:
        state = data.state
        horizon, targets = state["horizon"], state["target_cols"]
        inputs = self._inputs(state)
        scaled = self._scaled_window(state, inputs)
        period = state["residual_period"]
        sequence, future = scaled, None
        if period:
            sequence = SeasonalDifference(period, name="seasonal_difference")(scaled)
        if config.calendar_features:
            past_calendar, future_calendar = CalendarFeatures(state["step_seconds"], sequence.shape[1], horizon,
                                                              state.get("utc_offsets"),
                                                              name="calendar")(inputs[END_TIME])
            sequence = keras.layers.Concatenate()([sequence, past_calendar])
            future = keras.layers.Flatten()(future_calendar)
        base = self._base(state, scaled)
        # The head reads the target hours' calendar and, with a residual period, the seasonal-naive
        # forecast itself (last week's values at the target hours): a seasonal lookback.
        extra = ([future] if future is not None else []) + ([keras.layers.Flatten()(base)] if base is not None else [])
        members = [self._correction(config, sequence, extra, horizon, len(targets), f"member{m + 1}_")
                   for m in range(config.members)]
        corrections = keras.layers.Concatenate(axis=1, name="members")(members) if len(members) > 1 else members[0]
        parts = [Shrinkage(name="shrinkage")(corrections)]
        if base is not None:
            parts.append(keras.layers.Reshape((1, horizon, len(targets)))(base))
        if state["ridge_lags"]:
            ridge = keras.layers.Dense(horizon * len(targets), trainable=config.ridge_trainable, name="ridge")(
                self._ridge_features(state, inputs, scaled))
            parts.append(keras.layers.Reshape((1, horizon, len(targets)))(ridge))
        scaled_forecast = keras.layers.Add()(parts) if len(parts) > 1 else parts[0]
        target_index = [state["input_cols"].index(c) for c in targets]
        mean, std = np.array(state["mean"])[target_index], np.array(state["std"])[target_index]
        forecast = keras.layers.Normalization(axis=-1, mean=mean, variance=np.square(std), invert=True,
                                              name="unscale_forecast")(scaled_forecast)
        model = keras.Model(inputs, forecast, name=self.name)  # [batch, members, horizon, targets]
        if state["ridge_lags"]:
            fit = data.arrays["ridge"]
            model.get_layer("ridge").set_weights([fit.coef.astype("float32"), fit.intercept.astype("float32")])
        return model

    @staticmethod
    def _correction(config: ForecastingConfig, sequence: Any, extra: list[Any], horizon: int, targets: int,
                    prefix: str) -> Any:
        """One ensemble member's correction, [batch, 1, horizon, targets]: its own RNN and head.

        The last layer starts at zero, so that every member starts at the base forecast.
        """
        recurrent = {"gru": keras.layers.GRU, "lstm": keras.layers.LSTM}[config.cell]
        regularizer = keras.regularizers.L2(config.l2) if config.l2 else None
        for i in range(config.layers):
            sequence = recurrent(config.units, return_sequences=i < config.layers - 1, dropout=config.dropout,
                                 kernel_regularizer=regularizer, name=f"{prefix}{config.cell}_{i + 1}")(sequence)
        summary = keras.layers.Concatenate()([sequence, *extra]) if extra else sequence
        summary = keras.layers.Dense(config.units, activation="relu", name=f"{prefix}head")(summary)
        correction = keras.layers.Dense(horizon * targets, kernel_initializer="zeros", name=f"{prefix}forecast")(
            summary)
        return keras.layers.Reshape((1, horizon, targets))(correction)

    def compile_args(self, config: ForecastingConfig, data: Splits) -> dict[str, Any]:
        target_index = [data.state["input_cols"].index(c) for c in data.state["target_cols"]]
        std = np.array(data.state["std"], dtype="float32")[target_index]
        return {"loss": ScaledMeanAbsoluteError(std.tolist()), "metrics": ["mae"]}

    # --- training -------------------------------------------------------------------------

    @staticmethod
    def _holdout_fit(config: ForecastingConfig) -> bool:
        """Whether ``fit`` first trains on the training windows alone (they exclude validation)."""
        return config.fit_on_val and (config.shrinkage != "none" or config.refit_epochs)

    def fit(self, model: keras.Model, config: ForecastingConfig, data: Splits, checkpoint_dir: Any,
            progress: str = "none") -> dict[str, Any]:
        """Trains the correction, then sets its shrinkage weights (``shrinkage``) from validation forecasts.

        With ``fit_on_val`` the final fit trains on the validation windows, so the weights (and,
        with ``refit_epochs``, the number of epochs) come from a first fit of a copy of the model
        on the training windows alone, backed up in ``checkpoint_dir/holdout``.

        Returns:
            The final fit's training report, with ``shrinkage``: the weights and the validation
            MAE of the base, of the whole correction and of the shrunk one, and ``holdout``: the
            first fit's report.
        """
        from seqapps import training

        if config.shrinkage != "none":  # training sees the whole correction (a fine-tuned model's too)
            layer = model.get_layer("shrinkage")
            layer.set_weights([np.ones(layer.weight.shape, "float32")])
        holdout, weights, scores = None, None, None
        if self._holdout_fit(config):
            alone = dataclasses.replace(data, train=data.arrays["train_alone"])
            first = training.build_and_compile(self, config, alone, model.distribute_strategy)
            first.set_weights(model.get_weights())  # the same start (a fresh or a fine-tuned model)
            holdout = training.fit(first, alone, config, Path(checkpoint_dir) / "holdout", progress=progress)
            if config.shrinkage != "none":
                weights, scores = self._shrinkage(first, data, config.shrinkage == "step")
            if config.refit_epochs:
                losses = holdout["val_loss_history"]
                config = dataclasses.replace(config, epochs=int(np.argmin(losses)) + 1)
        report = training.fit(model, data, config, checkpoint_dir, progress=progress)
        if config.shrinkage != "none" and weights is None:  # the validation windows were not trained on
            weights, scores = self._shrinkage(model, data, config.shrinkage == "step")
        if weights is not None:
            model.get_layer("shrinkage").set_weights([weights.astype("float32")])
            report["shrinkage"] = {"weights": weights.tolist(), "val_mae": scores}
        if holdout is not None:
            report["holdout"] = holdout
        return report


    def _shrinkage(self, model: keras.Model, data: Splits, per_step: bool) -> tuple[np.ndarray, dict[str, float]]:
        """The shrinkage weights chosen on the validation windows, and the validation MAE with each choice.

        The base forecast is the model's with the weights at zero and, with a ridge part, the
        ridge fitted on the training split alone (``ridge_val_shift``), so that both are out of sample.
        """
        layer, predict = model.get_layer("shrinkage"), compat.batch_predictor(model)
        ones = np.ones(layer.weight.shape, "float32")
        whole, base, truth = [], [], []
        for inputs, targets in self._windows(data, data.arrays["origins"]["val"], batch_size=256):
            for weights, found in ((ones, whole), (0 * ones, base)):
                layer.set_weights([weights])
                found.append(predict(inputs).numpy().mean(axis=1))  # over the members axis
            truth.append(targets.numpy())
        layer.set_weights([ones])
        whole, base, truth = (np.concatenate(found).astype("float64") for found in (whole, base, truth))
        correction = whole - base
        if data.state["ridge_lags"]:
            base = base + data.arrays["ridge_val_shift"]
        weights = intervals.shrinkage_weights(truth, base, correction, per_step)
        scores = {"base": float(np.abs(truth - base).mean()),
                  "correction": float(np.abs(truth - base - correction).mean()),
                  "shrunk": float(np.abs(truth - base - weights * correction).mean())}
        return weights, scores

    # --- calibration and evaluation -------------------------------------------------------

    def calibrate(self, model: keras.Model, config: ForecastingConfig, data: Splits) -> dict[str, Any]:
        """The interval's state: per-step offsets of locally weighted split conformal, never from the test split.

        The residuals of the training and validation windows, each divided by its window's local
        scale, give per-step quantiles. With ``interval_cross_fit`` and cross-fitting blocks the
        ridge part of each forecast is the fit that left the window's block out; else the
        validation forecasts use the ridge fitted on the training split alone. Either way the
        ridge part is out of sample where it can be, as on the test split.

        Returns:
            ``{"interval": {"levels", "scale_lag", "scale_floor", "offsets"}}``: the quantile levels,
            the local scale's lag and floor per target, and the offsets [levels, horizon, targets].
        """
        arrays, state = data.arrays, data.state
        shift = arrays["ridge_val_shift"] if state["ridge_lags"] else None
        levels = intervals.interval_levels(config.interval)
        interval = {"levels": list(levels), "scale_lag": min(state["daily_lag"], state["lookback"] - 1),
                    "scale_floor": [1e-3 * state["std"][state["input_cols"].index(c)] for c in state["target_cols"]]}
        origins, n_train = arrays["origins"], len(arrays["origins"]["train"])
        shape = (n_train + len(origins["val"]), state["horizon"], len(state["target_cols"]))
        if config.interval_cross_fit > 1 and "ridge_target_shift" in arrays:
            # Out of fold: the truth plus the full fit's forecast minus the fit's that left the block out.
            batches = self._forecast_batches(model, data, np.concatenate([origins["train"], origins["val"]]),
                                             interval, arrays["ridge"].blocks(np.arange(shape[0])))
        else:  # the validation windows' ridge part from the ridge fitted on the training split alone
            val = self._forecast_batches(model, data, origins["val"], interval)
            batches = itertools.chain(self._forecast_batches(model, data, origins["train"], interval), (
                (slice(n_train + rows.start, n_train + rows.stop), forecast + (0 if shift is None else shift[rows]),
                 scale, truth) for rows, forecast, scale, truth in val))
        dtype = "float32" if shift is None else np.result_type("float32", shift)
        offsets = intervals.scaled_conformal_offsets(batches, shape, levels, dtype)
        return {"interval": {**interval, "offsets": offsets.tolist()}}

    def evaluate(self, model: keras.Model, config: ForecastingConfig,
                 data: Splits) -> tuple[dict[str, float], dict[str, Any]]:
        """Scores the model, its interval as calibrated (``data.state``) and the baselines on the test split."""
        arrays, state = data.arrays, data.state
        interval = state["interval"]
        offsets = np.array(interval["offsets"], "float32")  # as the export serves them
        batches = list(self._forecast_batches(model, data, arrays["origins"]["test"], interval))
        predicted, scale, truth = (np.concatenate([batch[i] for batch in batches]) for i in (1, 2, 3))
        del batches
        origins, horizon = arrays["origins"]["test"], state["horizon"]
        # Each forecast is made when it is scored: a long series' test split holds millions of values.
        forecasts = {"model": lambda: predicted}
        for label, lag in {"naive_daily": state["daily_lag"], "naive_weekly": state["weekly_lag"]}.items():
            forecasts[label] = functools.partial(forecast_metrics_lib.seasonal_naive, arrays["values"], origins,
                                                 horizon, lag)
        if state["ridge_lags"]:
            forecasts["ridge"] = lambda: arrays["ridge_forecast"]
        if arrays["seasonal_baseline"]:
            forecasts["holt_winters"] = lambda: np.stack(
                [baselines.holt_winters(arrays["values"][:, i], arrays["fit_end"], origins, horizon,
                                        arrays["seasonal_baseline"]) for i in range(truth.shape[-1])], axis=-1)
        score = {name: self._score(truth, forecast(), arrays["mase_scale"], state["target_cols"])
                 for name, forecast in forecasts.items()}
        metrics = score.pop("model")
        lower, upper = (predicted + offset * scale for offset in offsets)
        levels = interval["levels"]
        metrics["interval_coverage"] = intervals.coverage(truth, lower, upper)
        metrics["pinball"] = intervals.pinball_loss(truth, (lower, predicted, upper), (levels[0], 0.5, levels[1]))
        return metrics, score

    @staticmethod
    def _score(truth: np.ndarray, forecast: np.ndarray, scale: np.ndarray, targets: list[str]) -> dict[str, float]:
        per_target = [forecast_metrics_lib.forecast_metrics(truth[..., i], forecast[..., i], scale[i])
                      for i in range(len(targets))]
        result = {key: float(np.mean([m[key] for m in per_target])) for key in per_target[0]}
        if len(targets) > 1:
            result.update({f"{t}/{k}": v for t, m in zip(targets, per_target) for k, v in m.items()})
        return result


    # --- serving --------------------------------------------------------------------------

    def serving_module(self, model: keras.Model, config: ForecastingConfig, data: Splits) -> ServingModule:
        """``serving_default``: the forecast in user units, its interval's quantiles and the forecast times."""
        state = data.state
        interval = state["interval"]
        future_offsets = tf.constant(np.arange(1, state["horizon"] + 1) * state["step_seconds"], tf.int64)
        offsets = tf.constant(np.array(interval["offsets"], "float32"))  # [levels, horizon, targets]
        inputs = {name: tf.TensorSpec([None, state["lookback"]], tf.float32) for name in state["input_cols"]}
        inputs[END_TIME] = tf.TensorSpec([None], tf.int64)

        def readable(forecast: tf.Tensor, raw: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
            spread = window_scale(interval, state["target_cols"], raw)  # [batch, 1, targets]
            outputs = {}
            for i, name in enumerate(state["target_cols"]):
                outputs[name] = forecast[:, :, i]
                for j, level in enumerate(interval["levels"]):
                    outputs[quantile_name(name, level)] = forecast[:, :, i] + offsets[j, :, i] * spread[:, :, i]
            outputs[FORECAST_TIME] = raw[END_TIME][:, None] + future_offsets[None, :]
            return outputs

        example = {name: value.numpy() for name, value in next(iter(self._split_windows(data, "test", 2))).items()}
        return ServingModule(model, {"serving_default": Signature(
            inputs, example, postprocess=readable, run=lambda x: tf.reduce_mean(model(x, training=False), axis=1))})

    def predict_inputs(self, state: dict[str, Any], inputs: list[str], signature: Any) -> dict[str, np.ndarray]:
        timestamp_col, read_cols = csv_columns(state)
        if len(inputs) != 1:
            raise DataError(f"expected one INPUT, a CSV file with the last {state['lookback']} rows or more "
                            f"of columns {', '.join([timestamp_col, *read_cols])}")
        zone = state.get("timezone")
        window = read_recent(inputs[0], timestamp_col, read_cols, state["lookback"], state["step_seconds"],
                             timezone=None if zone in (None, "file offsets") else zone,
                             with_offsets=state.get("utc_offsets") is not None, decimal=state.get("decimal", "."))
        features = {name: window[column].to_numpy("float32")[None, :] for name, column in zip(state["input_cols"],
                                                                                                read_cols)}
        features[END_TIME] = window.index.to_numpy().astype("datetime64[s]").astype("int64")[-1:]
        return features

    def format_prediction(self, state: dict[str, Any], inputs: dict[str, np.ndarray],
                          outputs: dict[str, np.ndarray], signature: str = "serving_default",
                          given: Sequence[str] = ()) -> tuple[str, Any]:
        """Each row's forecast as a table headed by its input; the JSON holds the first row's (``seqapps
        predict`` sends one CSV, one row)."""
        low, high = state["interval"]["levels"]
        columns = [name for target in state["target_cols"]
                   for name in (quantile_name(target, low), target, quantile_name(target, high))]
        sources = row_inputs(given, inputs, len(outputs[FORECAST_TIME]))
        blocks, tables = [], []
        for row, source in enumerate(sources):
            seconds = outputs[FORECAST_TIME][row]
            times = (local_times(seconds, state["utc_offsets"]) if state.get("utc_offsets")
                     else pd.to_datetime(seconds, unit="s"))  # in the input's offsets, or wall-clock time
            tables.append([{state["timestamp_col"]: time.isoformat(),
                            **{name: round(float(outputs[name][row, i]), 4) for name in columns}}
                           for i, time in enumerate(times)])
            blocks.append(f"{source}: forecast of the next {len(times)} steps\n"
                          + pd.DataFrame(tables[-1]).to_string(index=False))
        return "\n".join(blocks), {"forecast": tables[0]}


class WeatherForecasting(Forecasting):
    """Next 24 hours of air temperature from past hourly weather (pvlib TMY3, BSD-3)."""

    Config = WeatherConfig
    headline_metrics = (Headline("mae", "MAE", "°C", higher_is_better=False),
                        Headline("rmse", "RMSE", "°C", higher_is_better=False),
                        Headline("interval_coverage", "80% interval covers", "%", 100.0),
                        Headline("pinball", "pinball", "°C", higher_is_better=False))

    def write_sample_data(self, folder: Path, seed: int = 0) -> tuple[str | None, list[str]]:
        """Ten weeks of hourly weather in the TMY3 columns the export reads."""
        columns = {"temp_air": (12.0, 5.0, 0.8), "temp_dew": (6.0, 2.0, 0.8), "relative_humidity": (70.0, -15.0, 4.0),
                   "pressure": (1010.0, 1.0, 2.0), "wind_speed": (4.0, 1.5, 0.8)}
        path = samples.write_series(folder / "my_weather.csv", "2024-03-01", "1h", 24 * 70, columns, seed)
        return str(path), [str(path)]

    def default_data(self) -> pd.DataFrame:
        return datasets.tmy3_weather()


class LoadForecasting(Forecasting):
    """Next day of half-hourly electricity demand (pmdarima Taylor series, MIT)."""

    Config = LoadConfig
    headline_metrics = (Headline("mae", "MAE", "MW", higher_is_better=False),
                        Headline("rmse", "RMSE", "MW", higher_is_better=False),
                        Headline("smape", "sMAPE", "%", higher_is_better=False),
                        Headline("interval_coverage", "80% interval covers", "%", 100.0),
                        Headline("pinball", "pinball", "MW", higher_is_better=False))

    def write_sample_data(self, folder: Path, seed: int = 0) -> tuple[str | None, list[str]]:
        """Ten weeks of half-hourly demand in the export's column."""
        path = samples.write_series(folder / "my_load.csv", "2024-03-01", "30min", 48 * 70,
                                    {"demand": (30000.0, 6000.0, 400.0)}, seed)
        return str(path), [str(path)]

    def default_data(self) -> pd.DataFrame:
        return datasets.taylor_load()
