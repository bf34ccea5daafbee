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
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import keras
import numpy as np
import pandas as pd
import tensorflow as tf

from seqapps import baselines, intervals
from seqapps import metrics as forecast_metrics_lib
from seqapps.config import TrainingConfig, require
from seqapps.data import datasets, samples
from seqapps.data.series import (END_TIME, cross_fit_blocks, csv_columns, fitted_windows, recent_window,
                                 series_splits, series_windows, split_inputs, window_datasets)
from seqapps.data.tables import DECIMAL_MARKS, FILL_METHODS, check_timezone, local_times, read_csv
from seqapps.errors import DataError
from seqapps.export import ExportCalls, ServingModule, Signature, examples_signature
from seqapps.export_format import REGRESS_METHOD
from seqapps.forecaster import (encoder_inputs, forecast_batches, forecast_model, recurrent_correction,
                                ridge_extractor, scaled_window, set_ridge, target_scale, window_inputs)
from seqapps.losses import ScaledMeanAbsoluteError
from seqapps.pipeline import Headline, Pipeline, Splits, row_inputs
from seqapps.report import plots
from seqapps.report.document import Figure, Section, Table, Text
from seqapps.summary import number

FORECAST_TIME = "forecast_time"
SHRINKAGE = ("none", "global", "step", "rolling")
#: test forecasts the report draws, spread evenly over the test period
REPORT_ORIGINS = 4
#: history the report draws before each forecast, in horizons (at most the window the model read)
REPORT_HISTORY_HORIZONS = 3
#: lead times the report's table of MAE per lead time shows, as fractions of the horizon
REPORT_LEADS = (0.25, 0.5, 0.75, 1.0)


def quantile_name(target: str, level: float) -> str:
    """The serving output name of a target's quantile: ``temp_air_p10``."""
    return f"{target}_p{100 * level:g}"


def user_times(seconds: np.ndarray, state: dict[str, Any]) -> list[pd.Timestamp]:
    """The user's times of instants as the export takes and gives them (``END_TIME``, ``FORECAST_TIME``).

    Args:
        seconds: [N] Unix seconds.
        state: the export's state.

    Returns:
        Offset-aware Timestamps in the input's UTC offsets where it had them, else wall-clock times.
    """
    return (local_times(seconds, state["utc_offsets"]) if state.get("utc_offsets")
            else list(pd.to_datetime(seconds, unit="s")))


def wall_clock(seconds: np.ndarray, state: dict[str, Any]) -> np.ndarray:
    """``user_times`` as the clock on the wall reads them, an array of ``seconds``' shape in datetime64[s] (plots)."""
    times = user_times(np.ravel(seconds), state)
    return np.array([time.tz_localize(None) for time in times], "datetime64[s]").reshape(np.shape(seconds))


def _time_zone(result: dict[str, Any]) -> str:
    """How a run's times are told: its time zone, or what the data's timestamps were."""
    zone = (result.get("data") or {}).get("timezone")
    return {None: "wall-clock time, as in the data", "file offsets": "local time, in the data's UTC offsets"}.get(
        zone, f"local time in {zone}")


@dataclasses.dataclass
class ForecastingConfig(TrainingConfig):
    """Forecasting settings. Durations ("1D", "7D", "24h") or step counts are accepted.

    Attributes:
        timestamp_col: the CSV column of timestamps.
        target_cols: columns to forecast.
        feature_cols: input covariates besides the targets (None: every other numeric column).
            At ``finetune``, these three name your CSV's columns for the export's, by position
            (``seqapps.data.series.finetune_csv_names``); the new export reads those names in ``predict`` too.
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
            set, else K; see ``seqapps.data.series.cross_fit_blocks``). Else, and for a series too short for K blocks,
            on the full ridge's training residuals and the training-only ridge's validation ones.
        fit_on_val: train the RNN on the training and validation windows (the
            validation loss, then in-sample, still drives early stopping).
        shrinkage: "global" or "step": the forecast is the base plus w times the correction,
            w in [0, 1] (one per target, or per horizon step and target) chosen by validation
            MAE on forecasts the correction did not train on: with ``fit_on_val`` those of a
            first fit on the training windows alone (the ridge part then fitted on the
            training split alone too), else the final fit's. "rolling": a w per horizon step and
            target chosen on a rolling-origin validation: each of the last ``rolling_origins`` ridge
            cross-fitting blocks of the training and validation windows is forecast by a correction
            trained on the windows before it (at most ``rolling_epochs`` epochs, paced by the block
            before) on top of the ridge fit that left it out, and w minimises the MAE of all of
            them together among the w that lose to w = 0 on no block (``intervals.rolling_shrinkage``);
            without cross-fitting blocks (no ridge,
            or a series too short), as "step". "none": w = 1.
        rolling_origins: with ``shrinkage`` "rolling", how many origins (at most the blocks - 2).
        rolling_epochs: with ``shrinkage`` "rolling", the most epochs of each origin's fit.
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
    # Backtest (3 folds, seeds 42 and 7, docs/results.md): the ridge on every fold of both pipelines, to 0.0002 (the
    # old `step` lost weather's fold 1 by 0.014 degC, the old `none` load's fold 0 by 66-74 MW).
    shrinkage: str = "rolling"
    rolling_origins: int = 3
    rolling_epochs: int = 5
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
        require(self.rolling_origins >= 1 and self.rolling_epochs >= 1, "rolling_origins/rolling_epochs",
                (self.rolling_origins, self.rolling_epochs), "integers >= 1")
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
        """The splits of backtest fold ``fold`` (``series_splits``; the last fold is the whole series).

        With ``ridge_lags`` the ridge baseline is fitted here, on the fold's training and validation
        windows (``baselines.fit_window_ridge``): the model starts from it and the later stages read it.
        """
        durations = {key: getattr(config, key) for key in ("horizon", "lookback", "residual_period", "ridge_lags")}
        data = series_splits(frame, fold, state, timestamp_col=config.timestamp_col, target_cols=config.target_cols,
                             feature_cols=config.feature_cols, fill_gaps=config.fill_gaps, timezone=config.timezone,
                             durations=durations, seasonal_baseline=config.seasonal_baseline,
                             folds=config.backtest_folds, val_fraction=config.val_fraction,
                             test_fraction=config.test_fraction, decimal=config.decimal)
        state, origins = data.state, data.arrays["origins"]
        if state["ridge_lags"]:
            fitted = len(origins["train"]) + len(origins["val"])
            blocks = cross_fit_blocks(config.ridge_cross_fit, config.interval_cross_fit, fitted, state["horizon"])

            def windows(at: np.ndarray) -> Iterator[tuple[dict[str, tf.Tensor], np.ndarray]]:
                return ((batch, truth.numpy()) for batch, truth in
                        series_windows(state, data.arrays, at, batch_size=1024))

            data.arrays.update(baselines.fit_window_ridge(ridge_extractor(state), windows, origins,
                                                          *target_scale(state), blocks, state["horizon"]))
        ridge = data.arrays.get("ridge")
        rows = (intervals.rolling_origin_rows(ridge.edges, config.rolling_origins, state["horizon"])
                if config.shrinkage == "rolling" and ridge is not None else [])
        data.arrays["shrinkage"] = {"rolling": "rolling" if rows else "step"}.get(config.shrinkage, config.shrinkage)
        data.arrays["rolling_rows"] = rows
        window_datasets(data, bool(state["ridge_lags"]) and config.ridge_cross_fit > 1, config.fit_on_val,
                        self._holdout_fit(config, data.arrays["shrinkage"]))
        return data

    # --- model ----------------------------------------------------------------------------

    def build_model(self, config: ForecastingConfig, data: Splits) -> keras.Model:
        """The forecaster (``seqapps.forecaster.forecast_model``) whose correction is ``members`` stacked RNNs."""
        state = data.state
        inputs = window_inputs(state)
        scaled = scaled_window(state, inputs)
        sequence, base, extra = encoder_inputs(state, inputs, scaled, config.calendar_features)
        members = [recurrent_correction(sequence, extra, state["horizon"], len(state["target_cols"]),
                                        f"member{m + 1}_", cell=config.cell, units=config.units,
                                        layers=config.layers, dropout=config.dropout, l2=config.l2)
                   for m in range(config.members)]
        return forecast_model(state, inputs, scaled, base, members, data.arrays.get("ridge"),
                              config.ridge_trainable, self.name)

    def adapt_model(self, model: keras.Model, config: ForecastingConfig, data: Splits) -> keras.Model:
        """Puts the ridge fitted on the fine-tuning series (in ``load_data``) into the export's ridge part.

        The correction learns the errors of that ridge (its cross-fitted residuals), and the evaluation's
        ridge baseline is that fit, so the export's ridge, fitted on another series, would leave the
        correction correcting the wrong base.
        """
        if data.state["ridge_lags"]:
            set_ridge(model, data.arrays["ridge"])
        return model

    def compile_args(self, config: ForecastingConfig, data: Splits) -> dict[str, Any]:
        _, std = target_scale(data.state)
        return {"loss": ScaledMeanAbsoluteError(std.astype("float32").tolist()), "metrics": ["mae"]}

    # --- training -------------------------------------------------------------------------

    @staticmethod
    def _holdout_fit(config: ForecastingConfig, shrinkage: str) -> bool:
        """Whether ``fit`` first trains on the training windows alone (they exclude validation), given the
        shrinkage that ``load_data`` found possible (``data.arrays["shrinkage"]``)."""
        return config.fit_on_val and (shrinkage in ("global", "step") or config.refit_epochs)

    def fit(self, model: keras.Model, config: ForecastingConfig, data: Splits, checkpoint_dir: Any,
            progress: str = "none", log_dir: Path | None = None) -> dict[str, Any]:
        """Trains the correction and sets its shrinkage weights (``shrinkage``) from forecasts it did not train on.

        "rolling" chooses them first, on corrections trained from the same start on the windows
        before each origin (``_rolling_shrinkage``). Otherwise, with ``fit_on_val`` the final fit trains
        on the validation windows, so the weights (and, with ``refit_epochs``, the number of epochs)
        come from a first fit of a copy of the model on the training windows alone, backed up in
        ``checkpoint_dir/holdout`` (and logged in ``log_dir/holdout``).

        Returns:
            The final fit's training report, with ``shrinkage``: the kind, the weights, the MAE of the
            base, of the whole correction and of the shrunk one on the forecasts they were chosen on
            (``val_mae``) and, for "rolling", each origin's epochs and the seconds the origins took;
            ``holdout``: the first fit's report; ``note``: which leads the correction changed.
        """
        from seqapps import training

        kind = data.arrays["shrinkage"]
        # Training sees the whole correction, and "none" keeps it: a fine-tuned model's exported weights go too.
        layer = model.get_layer("shrinkage")
        layer.set_weights([np.ones(layer.weight.shape, "float32")])
        holdout, weights, scores, rolling = None, None, None, {}
        if kind == "rolling":
            weights, scores, rolling = self._rolling_shrinkage(model, config, data, checkpoint_dir, progress, log_dir)
        if self._holdout_fit(config, kind):
            alone = dataclasses.replace(data, train=data.arrays["train_alone"])
            first = training.build_and_compile(self, config, alone, model.distribute_strategy)
            first.set_weights(model.get_weights())  # the same start (a fresh or a fine-tuned model)
            holdout = training.fit(first, alone, config, Path(checkpoint_dir) / "holdout", progress=progress,
                                   log_dir=log_dir and log_dir / "holdout",
                                   label="held-out fit")
            if kind in ("global", "step"):
                weights, scores = self._shrinkage(first, data, kind == "step")
            if config.refit_epochs:
                losses = holdout["val_loss_history"]
                config = dataclasses.replace(config, epochs=int(np.argmin(losses)) + 1)
        report = training.fit(model, data, config, checkpoint_dir, progress=progress, log_dir=log_dir,
                              epoch_metrics=lambda trained: self.epoch_metrics(trained, config, data),
                              label="final fit" if rolling or holdout is not None else None)
        if kind in ("global", "step") and weights is None:  # the validation windows were not trained on
            weights, scores = self._shrinkage(model, data, kind == "step")
        if weights is not None:
            model.get_layer("shrinkage").set_weights([weights.astype("float32")])
            report["shrinkage"] = {"kind": kind, "weights": weights.tolist(), "val_mae": scores, **rolling}
        served = model.get_layer("shrinkage").get_weights()[0]
        report["note"] = f"{intervals.describe_shrinkage(served, data.state['target_cols'])} (shrinkage {kind})"
        if holdout is not None:
            report["holdout"] = holdout
        return report

    def _rolling_shrinkage(self, model: keras.Model, config: ForecastingConfig, data: Splits, checkpoint_dir: Any,
                           progress: str, log_dir: Path | None) -> tuple[np.ndarray, dict[str, float], dict[str, Any]]:
        """``intervals.rolling_shrinkage`` over ``data.arrays["rolling_rows"]`` of the training and validation windows.

        At each origin a copy of ``model`` (from its weights now) trains for at most ``rolling_epochs``
        on the windows before the block, early-stopped on the block before it, as the final fit trains
        (on the ridge's out-of-fold residuals with ``ridge_cross_fit``); it forecasts the block on top
        of the ridge fit that left the block out (the block's targets shifted, ``ridge_target_shift``).
        Backups go to ``checkpoint_dir/rollingK``, logs to ``log_dir/rollingK``.

        Returns:
            The weights, the pooled MAE of the base, the correction and the shrunk one, and
            ``{"origins", "epochs", "seconds"}``: the origins, each one's epochs and their seconds in all.
        """
        from seqapps import training

        state, arrays = data.state, data.arrays
        fitted = np.concatenate([arrays["origins"]["train"], arrays["origins"]["val"]])
        blocks = arrays["ridge"].blocks(np.arange(len(fitted)))
        cross = config.ridge_cross_fit > 1
        short = dataclasses.replace(config, epochs=min(config.epochs, config.rolling_epochs))
        start, epochs, started = model.get_weights(), [], time.perf_counter()
        origins = len(arrays["rolling_rows"])

        def windows(rows: range, shifted: bool) -> tf.data.Dataset:
            rows = np.asarray(rows)
            return fitted_windows(state, arrays, fitted[rows], blocks[rows] if shifted else None)

        def parts(train: range, pace: range, held: range) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            split = dataclasses.replace(data, train=windows(train, cross), val=windows(pace, cross))
            refit = training.build_and_compile(self, short, split, model.distribute_strategy)
            refit.set_weights(start)
            name = f"rolling{len(epochs) + 1}"
            label = f"shrinkage origin {len(epochs) + 1}/{origins}"  # a short fit that chooses the weights
            epochs.append(training.fit(refit, split, short, Path(checkpoint_dir) / name, progress=progress,
                                       log_dir=log_dir and log_dir / name, label=label)["epochs_run"])
            held = np.asarray(held)
            return intervals.shrinkage_parts(refit, series_windows(state, arrays, fitted[held], blocks[held],
                                                                   batch_size=256))

        weights, scores = intervals.rolling_shrinkage(arrays["rolling_rows"], parts)
        return weights, scores, {"origins": len(epochs), "epochs": epochs,
                                 "seconds": round(time.perf_counter() - started, 1)}

    @staticmethod
    def _shrinkage(model: keras.Model, data: Splits, per_step: bool) -> tuple[np.ndarray, dict[str, float]]:
        """``intervals.choose_shrinkage`` on the validation windows, the base's ridge part (with one) fitted
        on the training split alone (``ridge_val_shift``), so that the base is out of sample too."""
        windows = series_windows(data.state, data.arrays, data.arrays["origins"]["val"], batch_size=256)
        shift = data.arrays["ridge_val_shift"] if data.state["ridge_lags"] else None
        return intervals.choose_shrinkage(model, windows, shift, per_step)

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
            batches = forecast_batches(model, state, arrays, np.concatenate([origins["train"], origins["val"]]),
                                       interval, arrays["ridge"].blocks(np.arange(shape[0])))
        else:  # the validation windows' ridge part from the ridge fitted on the training split alone
            val = forecast_batches(model, state, arrays, origins["val"], interval)
            batches = itertools.chain(forecast_batches(model, state, arrays, origins["train"], interval), (
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
        batches = list(forecast_batches(model, state, arrays, arrays["origins"]["test"], interval))
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
            def holt_winters() -> np.ndarray:  # each target's forecasts written in place, not stacked from copies
                found = np.empty(truth.shape)
                for i in range(truth.shape[-1]):
                    baselines.holt_winters(arrays["values"][:, i], arrays["fit_end"], origins, horizon,
                                           arrays["seasonal_baseline"], out=found[..., i])
                return found

            forecasts["holt_winters"] = holt_winters
        score = {name: self._score(truth, forecast(), arrays["mase_scale"], state["target_cols"])
                 for name, forecast in forecasts.items()}
        metrics = score.pop("model")
        lower, upper = (predicted + offset * scale for offset in offsets)
        levels = interval["levels"]
        metrics["interval_coverage"] = intervals.coverage(truth, lower, upper)
        metrics["pinball"] = intervals.pinball_loss(truth, (lower, predicted, upper), (levels[0], 0.5, levels[1]))
        return metrics, score

    @staticmethod
    def _score(truth: np.ndarray, forecast: np.ndarray, scale: np.ndarray,
               targets: list[str]) -> dict[str, float | list[float]]:
        """The point metrics of a forecast [N, horizon, targets], averaged over the targets (and per target
        when there are several): ``forecast_metrics``' and ``mae_by_lead``, a list of one MAE per step."""
        per_target = [{**forecast_metrics_lib.forecast_metrics(truth[..., i], forecast[..., i], scale[i]),
                       "mae_by_lead": forecast_metrics_lib.mae_by_lead(truth[..., i], forecast[..., i]).tolist()}
                      for i in range(len(targets))]
        result = {key: np.mean([m[key] for m in per_target], axis=0).tolist() for key in per_target[0]}
        if len(targets) > 1:
            result.update({f"{t}/{k}": v for t, m in zip(targets, per_target) for k, v in m.items()})
        return result

    # --- serving --------------------------------------------------------------------------

    def serving_module(self, model: keras.Model, config: ForecastingConfig, data: Splits) -> ServingModule:
        """``serving_default``: the forecast in user units, its interval's quantiles and the forecast times.

        ``regress``: TF Serving's regression API over the same graph: serialized ``tf.train.Example``s
        (``inputs``) whose features are ``serving_default``'s inputs (a float list of ``lookback`` values per
        column, ``end_time`` an integer), in; ``outputs``, the first target's forecast one step ahead, out.
        """
        state = data.state
        interval = state["interval"]
        future_offsets = tf.constant(np.arange(1, state["horizon"] + 1) * state["step_seconds"], tf.int64)
        offsets = tf.constant(np.array(interval["offsets"], "float32"))  # [levels, horizon, targets]
        inputs = {name: tf.TensorSpec([None, state["lookback"]], tf.float32) for name in state["input_cols"]}
        inputs[END_TIME] = tf.TensorSpec([None], tf.int64)

        def readable(forecast: tf.Tensor, raw: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
            spread = intervals.window_scale(interval, state["target_cols"], raw)  # [batch, 1, targets]
            outputs = {}
            for i, name in enumerate(state["target_cols"]):
                outputs[name] = forecast[:, :, i]
                for j, level in enumerate(interval["levels"]):
                    outputs[quantile_name(name, level)] = forecast[:, :, i] + offsets[j, :, i] * spread[:, :, i]
            outputs[FORECAST_TIME] = raw[END_TIME][:, None] + future_offsets[None, :]
            return outputs

        example = {name: value.numpy() for name, value in next(iter(split_inputs(data, "test", 2))).items()}
        default = Signature(inputs, example, postprocess=readable,
                            run=lambda x: tf.reduce_mean(model(x, training=False), axis=1))
        first = state["target_cols"][0]
        regress = examples_signature(default, REGRESS_METHOD, lambda outputs: {"outputs": outputs[first][:, 0]})
        return ServingModule(model, {"serving_default": default, "regress": regress})

    # --- report ---------------------------------------------------------------------------

    def report_data(self, model: keras.Model, config: ForecastingConfig, data: Splits,
                    export: ExportCalls) -> dict[str, np.ndarray]:
        """``REPORT_ORIGINS`` test forecasts as the export serves them, spread over the test period.

        The windows go through the written export's ``serving_default``, which returns the forecast
        and its interval's quantiles in the user's units.

        Returns:
            ``history_time`` [origins, lookback] and ``forecast_time`` [origins, horizon], the user's
            times (``wall_clock``); per target T, ``history/T`` (the window the export read),
            ``actual/T`` (the true values) and ``forecast/NAME`` for each served output NAME of T (T,
            ``T_p10``, ``T_p90``), [origins, horizon]; ``interval_levels``, the quantile levels.
        """
        state, arrays = data.state, data.arrays
        test = arrays["origins"]["test"]
        origins = test[np.unique(np.linspace(0, len(test) - 1, REPORT_ORIGINS).round().astype(int))]
        inputs, truth = next(iter(series_windows(state, arrays, origins, batch_size=len(origins))))
        inputs, truth = {name: value.numpy() for name, value in inputs.items()}, truth.numpy()
        served = export("serving_default", inputs)
        read = inputs[END_TIME][:, None] + np.arange(1 - state["lookback"], 1) * state["step_seconds"]
        levels = state["interval"]["levels"]
        found = {"history_time": wall_clock(read, state), "forecast_time": wall_clock(served[FORECAST_TIME], state),
                 "interval_levels": np.array(levels)}
        for i, target in enumerate(state["target_cols"]):
            found[f"history/{target}"], found[f"actual/{target}"] = inputs[target], truth[..., i]
            for name in [target, *(quantile_name(target, level) for level in levels)]:
                found[f"forecast/{name}"] = served[name]
        return found

    def report_sections(self, result: dict[str, Any], arrays: dict[str, np.ndarray]) -> list[Section]:
        """The test forecasts with their interval (``forecast``), the MAE per lead time of the model and
        each baseline (``mae-by-lead``) and, after a backtest, the headline metric per fold (``backtest``)."""
        unit = next((h.unit for h in self.headline_metrics if h.key == "mae"), "")
        sections = [self._forecast_section(result, arrays, unit), self._lead_section(result, unit)]
        if result.get("backtest"):
            sections.append(self._backtest_section(result["backtest"]))
        return sections

    @staticmethod
    def _forecast_section(result: dict[str, Any], arrays: dict[str, np.ndarray], unit: str) -> Section:
        targets = [name.partition("/")[2] for name in arrays if name.startswith("actual/")]
        if not targets:
            return Section("Test forecasts", [Text("(no forecasts: the run folder holds no report data)")],
                           anchor="forecast")
        return Section("Test forecasts", [_forecast_figure(arrays, target, unit, _time_zone(result))
                                          for target in targets], anchor="forecast")

    @staticmethod
    def _lead_section(result: dict[str, Any], unit: str) -> Section:
        found = {name: values["mae_by_lead"] for name, values in
                 {"model": result["metrics"], **(result.get("baseline") or {})}.items() if values.get("mae_by_lead")}
        if "model" not in found:
            return Section("MAE per lead time", [Text("(not measured by this run)")], anchor="mae-by-lead")
        horizon = len(found["model"])
        step = (result.get("data") or {}).get("step")
        leads = np.arange(1, horizon + 1) * (pd.Timedelta(step) / pd.Timedelta("1h") if step else 1)
        xlabel = "lead time (hours ahead)" if step else "lead time (steps ahead)"
        ylabel = f"MAE ({unit})" if unit else "MAE"
        figure = plots.line_chart("mae_by_lead", "test MAE per lead time",  # the model in C0, as in the forecasts
                                  {name: (leads, values) for name, values in found.items()}, xlabel, ylabel,
                                  caption="the mean absolute error of the test forecasts at each step ahead, for the "
                                          "model and each baseline")
        columns = sorted({max(1, round(fraction * horizon)) for fraction in REPORT_LEADS})
        table = Table(["", *(f"{leads[c - 1]:g} h" if step else f"{c} steps" for c in columns)],
                      [[name, *(values[c - 1] for c in columns)] for name, values in found.items()],
                      caption=f"{ylabel} at a few lead times")
        return Section("MAE per lead time", [figure, table], anchor="mae-by-lead")

    def _backtest_section(self, backtest: dict[str, Any]) -> Section:
        headline = self.headline_metrics[0]
        spreads = {"model": backtest["metrics"].get(headline.key),
                   **{name: values.get(headline.baseline_key or headline.key)
                      for name, values in backtest["baseline"].items()}}
        spreads = {name: spread for name, spread in spreads.items() if spread}
        folds = [f"fold {index + 1}" for index in range(backtest["folds"])]
        periods = [" to ".join(period) if period else "" for period in backtest["periods"]]
        rows = [[fold, period, *(headline.scale * spread["values"][index] for spread in spreads.values())]
                for index, (fold, period) in enumerate(zip(folds, periods))]
        rows.append(["mean ± sd", "", *(f"{number(headline.scale * spread['mean'])} ± "
                                       f"{number(headline.scale * spread['std'])}" for spread in spreads.values())])
        figure = plots.bar_chart("backtest", f"test {headline.title()} per backtest fold",
                                 {name: dict(zip(folds, np.multiply(headline.scale, spread["values"])))
                                  for name, spread in spreads.items()}, headline.title(),
                                 caption="each fold trains a fresh model on the series up to its test period; "
                                         "the last fold is the run's own split (its model is the export)")
        table = Table(["fold", "test period", *spreads], rows,
                      caption=f"{headline.title()} of the model and each baseline per fold (sd: sample standard "
                              "deviation over the folds)")
        return Section("Backtest", [figure, table], anchor="backtest")

    def predict_inputs(self, state: dict[str, Any], inputs: list[str], signature: Any) -> dict[str, np.ndarray]:
        timestamp_col, read_cols = csv_columns(state)
        if len(inputs) != 1:
            raise DataError(f"expected one INPUT, a CSV file with the last {state['lookback']} rows or more "
                            f"of columns {', '.join([timestamp_col, *read_cols])}")
        return recent_window(inputs[0], state)

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
            times = user_times(seconds, state)
            tables.append([{state["timestamp_col"]: time.isoformat(),
                            **{name: round(float(outputs[name][row, i]), 4) for name in columns}}
                           for i, time in enumerate(times)])
            blocks.append(f"{source}: forecast of the next {len(times)} steps\n"
                          + pd.DataFrame(tables[-1]).to_string(index=False))
        return "\n".join(blocks), {"forecast": tables[0]}


def _forecast_figure(arrays: dict[str, np.ndarray], target: str, unit: str, zone: str) -> Figure:
    """One target's test forecasts, a row per origin: the actual values through the history drawn and the
    forecast period, the forecast and its interval, the origin dashed.

    Args:
        arrays: ``Forecasting.report_data``'s.
        target: the target column.
        unit: the target's unit, for the y axis.
        zone: how the times are told (``_time_zone``).
    """
    from matplotlib import dates

    levels = arrays["interval_levels"]
    bounds = [quantile_name(target, level) for level in levels]
    low, high = (arrays[f"forecast/{name}"] for name in bounds)
    history, actual, forecast = (arrays[f"{kind}/{target}"] for kind in ("history", "actual", "forecast"))
    lookback, horizon = history.shape[1], forecast.shape[1]
    shown = min(lookback, REPORT_HISTORY_HORIZONS * horizon)
    coverage = f"{100 * (levels[1] - levels[0]):g}%"
    figure, axes = plots.canvas(len(forecast), 1, height=2.4, squeeze=False)
    for row, cell in enumerate(axes[:, 0]):
        past, future = arrays["history_time"][row, -shown:], arrays["forecast_time"][row]
        cell.fill_between(future, low[row], high[row], color="C0", alpha=0.25, linewidth=0,
                          label=f"{coverage} interval")
        cell.plot(np.concatenate([past, future]), np.concatenate([history[row, -shown:], actual[row]]),
                  color="black", linewidth=1, label="actual")
        cell.plot(future, forecast[row], color="C0", linewidth=1.6, label="forecast")
        cell.axvline(past[-1], color="0.5", linestyle="--", linewidth=0.8, label="forecast origin")
        cell.set_title(f"forecast from {pd.Timestamp(past[-1]):%Y-%m-%d %H:%M}", fontsize="small")
        cell.set_ylabel(f"{target} ({unit})" if unit else target, fontsize="small")
        locator = dates.AutoDateLocator()
        cell.xaxis.set_major_locator(locator)
        cell.xaxis.set_major_formatter(dates.ConciseDateFormatter(locator, show_offset=False))  # the title dates it
        cell.tick_params(labelsize="small")
        cell.grid(alpha=0.3)
    axes[0, 0].legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside, off the lines
    caption = (f"{target}: {len(forecast)} test forecasts spread over the test period, as the export's "
               f"serving_default serves them: the forecast and its {coverage} interval ({bounds[0]} to {bounds[1]}) "
               f"against the actual values, after the last {shown} steps of the {lookback}-step window the model "
               f"read; {zone}")
    return plots.to_figure(f"forecast_{target}", figure, caption)


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
