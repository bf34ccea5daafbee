"""A table's time series cut into the windows of a direct multi-horizon forecaster.

The split is chronological: a window belongs to the split its targets fall in (``window_origins``),
and backtest folds cut the series earlier (``fold_bounds``). Windows are never materialised: the
datasets cut them from the series as they are read (``cut_windows``).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from seqapps.config import require
from seqapps.data import splits as split_rule
from seqapps.data.tables import (cut_windows, fold_bounds, format_duration, numeric_columns, parse_duration,
                                 read_recent, to_time_series, window_origins)
from seqapps.errors import DataError
from seqapps.metrics import mase_scale
from seqapps.pipeline import SPLIT_COUNTS, Splits

END_TIME = "end_time"
#: the state's window lengths in steps, which a fine-tune keeps
STEP_KEYS = ("horizon", "lookback", "residual_period", "ridge_lags", "daily_lag", "weekly_lag")


def forecast_steps(step: pd.Timedelta, horizon: int | str, lookback: int | str, residual_period: int | str | None,
                   ridge_lags: int | str | None) -> dict[str, int | None]:
    """The window lengths in steps of the series' sampling interval.

    Args:
        step: the series' sampling interval.
        horizon, lookback, residual_period, ridge_lags: the config's durations or step counts.

    Returns:
        ``{key: steps}`` for each of ``STEP_KEYS`` (the daily and weekly lags are a day and a week).

    Raises:
        DataError: a residual period not shorter than the lookback, or ridge lags longer than the
            lookback minus the residual period.
    """
    horizon_steps = parse_duration(horizon, step, "horizon")
    lookback_steps = parse_duration(lookback, step, "lookback")
    day = max(1, int(pd.Timedelta("1D") // step))
    residual = None if residual_period is None else parse_duration(residual_period, step, "residual_period")
    if residual is not None and residual >= lookback_steps:
        raise DataError(f"config field 'residual_period': {residual_period} must be shorter than the "
                        f"lookback ({lookback}): the model reads the last season's change")
    ridge = None if ridge_lags is None else parse_duration(ridge_lags, step, "ridge_lags")
    if ridge is not None and ridge > lookback_steps - (residual or 0):
        raise DataError(f"config field 'ridge_lags': {ridge_lags} is longer than the lookback "
                        f"({lookback}) minus the residual_period ({residual_period})")
    return {"horizon": horizon_steps, "lookback": lookback_steps, "residual_period": residual, "ridge_lags": ridge,
            "daily_lag": day, "weekly_lag": 7 * day}


def cross_fit_blocks(ridge_cross_fit: int, interval_cross_fit: int, windows: int, horizon: int) -> int:
    """How many cross-fitting blocks the ridge is fitted with (0: none).

    Args:
        ridge_cross_fit: the blocks the user asked for the RNN's targets (> 1: these, whatever the length).
        interval_cross_fit: the blocks the interval asks for, used when each block's fit keeps at least
            half of the ``windows`` training and validation windows (a block and its gaps of a
            ``horizon`` either side are left out).
        windows, horizon: the training and validation windows and the forecast's steps.

    Returns:
        The number of blocks.
    """
    if ridge_cross_fit > 1:
        return ridge_cross_fit
    blocks = interval_cross_fit
    return blocks if blocks > 1 and windows / blocks + 2 * horizon <= windows / 2 else 0


def csv_columns(state: dict[str, Any]) -> tuple[str, list[str]]:
    """The CSV names of an export's timestamp and input columns: the model's own names, or the ones a
    fine-tune mapped them to (``finetune_csv_names``), which ``predict`` and the next fine-tune read.

    Returns:
        ``(timestamp column, input columns in the model's order)``.
    """
    names = state.get("csv_names", {})
    return names.get(state["timestamp_col"], state["timestamp_col"]), [names.get(c, c) for c in state["input_cols"]]


def finetune_csv_names(state: dict[str, Any], timestamp_col: str, target_cols: Sequence[str],
                       feature_cols: Sequence[str] | None) -> dict[str, str]:
    """The fine-tuning CSV's name of each of the export's columns, mapped by position.

    The names are the fine-tuning config's (the export's, with the user's ``--set`` on top): settings
    left alone keep the names the export read (they come from its saved config).

    Args:
        state: the export's state.
        timestamp_col: the CSV's timestamp column.
        target_cols: one CSV column for each of the export's targets, in order.
        feature_cols: one CSV column for each of its other inputs, in order; None: the names the export read.

    Returns:
        ``{export column: CSV column}`` for the timestamp and every input column.

    Raises:
        ConfigError: a list of another length than the export's, or a CSV column named twice.
    """
    _, read_before = csv_columns(state)
    targets = state["target_cols"]
    features = [c for c in state["input_cols"] if c not in targets]
    require(len(target_cols) == len(targets), "target_cols", target_cols,
            f"{len(targets)} column name(s), one for each target of the export ({', '.join(targets)})")
    feature_names = (list(feature_cols) if feature_cols is not None
                     else [read_before[state["input_cols"].index(c)] for c in features])
    require(len(feature_names) == len(features), "feature_cols", feature_cols,
            f"{len(features)} column name(s), one for each feature of the export ({', '.join(features) or 'none'})")
    names = {state["timestamp_col"]: timestamp_col, **dict(zip(targets, target_cols)),
             **dict(zip(features, feature_names))}
    require(len(set(names.values())) == len(names), "timestamp_col/target_cols/feature_cols",
            list(names.values()), "each CSV column named once")
    return names


def recent_window(path: str, state: dict[str, Any]) -> dict[str, np.ndarray]:
    """The window of a CSV's last rows that an export forecasts from (``seqapps predict``).

    Args:
        path: the CSV, in the export's columns (``csv_columns``), time zone, sampling interval and decimal mark.
        state: the export's state.

    Returns:
        A batch of one window: ``{input column: [1, lookback] float32, END_TIME: [1] int64}``.

    Raises:
        DataError: as in ``read_recent``.
    """
    timestamp_col, read_cols = csv_columns(state)
    zone = state.get("timezone")
    window = read_recent(path, timestamp_col, read_cols, state["lookback"], state["step_seconds"],
                         timezone=None if zone in (None, "file offsets") else zone,
                         with_offsets=state.get("utc_offsets") is not None, decimal=state.get("decimal", "."))
    features = {name: window[column].to_numpy("float32")[None, :] for name, column in zip(state["input_cols"],
                                                                                            read_cols)}
    features[END_TIME] = window.index.to_numpy().astype("datetime64[s]").astype("int64")[-1:]
    return features


def series_splits(frame: pd.DataFrame, fold: int, state: dict[str, Any] | None, *, timestamp_col: str,
                  target_cols: Sequence[str], feature_cols: Sequence[str] | None, fill_gaps: str,
                  timezone: str | None, durations: dict[str, int | str | None], seasonal_baseline: int | str | None,
                  folds: int, val_fraction: float, test_fraction: float, decimal: str) -> Splits:
    """The state, report and arrays of backtest fold ``fold`` of a table's series (datasets: ``window_datasets``).

    Args:
        frame: the table (``read_csv``).
        fold: the fold (see ``fold_bounds``; the last fold, ``folds - 1``, is the whole series).
        state: a fine-tuned export's state (its columns, mapped by ``finetune_csv_names``, and window
            lengths), or None for a new model.
        timestamp_col, target_cols, feature_cols: the table's columns (None features: every other numeric one).
        fill_gaps, timezone: as in ``to_time_series``.
        durations: the config's ``horizon``, ``lookback``, ``residual_period`` and ``ridge_lags``
            (``forecast_steps``).
        seasonal_baseline: the Holt-Winters baseline's season (None: none).
        folds, val_fraction, test_fraction: the backtest folds and split sizes.
        decimal: the table's decimal mark, kept in the state for ``predict``.

    Returns:
        ``Splits`` without datasets: its arrays hold the fold's ``values`` (targets, float64),
        ``series`` (every input, float32), ``times``, each split's window ``origins``, ``fit_end``,
        ``seasonal_baseline`` and ``mase_scale``.

    Raises:
        DataError: a bad table, another sampling interval than the export's, or a split too short.
    """
    source = frame.attrs.get("source", "data")
    if state is not None:
        input_cols, targets = state["input_cols"], state["target_cols"]
        csv_names = finetune_csv_names(state, timestamp_col, target_cols, feature_cols)
        read_cols = [csv_names[c] for c in input_cols]
        state = {**state, "csv_names": csv_names}
    else:
        targets = list(target_cols)
        features = (list(feature_cols) if feature_cols is not None
                    else numeric_columns(frame, [timestamp_col, *targets]))
        input_cols = read_cols = targets + [c for c in features if c not in targets]
    series = to_time_series(frame, timestamp_col, read_cols, fill_gaps, timezone)
    series.frame.columns = input_cols  # the model's names
    step_seconds = int(series.step.total_seconds())
    if state is not None and step_seconds != state["step_seconds"]:
        raise DataError(f"{source}: sampling interval is {format_duration(series.step)}, but the model was "
                        f"trained on {format_duration(pd.Timedelta(seconds=state['step_seconds']))} data")
    steps = (forecast_steps(series.step, **durations) if state is None
             else {k: state.get(k) for k in STEP_KEYS})
    seasonal = None if seasonal_baseline is None else parse_duration(seasonal_baseline, series.step,
                                                                     "seasonal_baseline")
    rows = len(series.frame)
    bounds = fold_bounds(rows, val_fraction, test_fraction, folds)[fold]
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
            "timestamp_col": timestamp_col, "target_cols": targets, "input_cols": input_cols,
            "step_seconds": step_seconds, **steps,
            "mean": train_values.mean(axis=0).tolist(),
            "std": np.maximum(train_values.std(axis=0), 1e-6).tolist(),
            "timezone": series.timezone, "utc_offsets": series.utc_offsets, "decimal": decimal,
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
              "mase_scale": mase_scale(train_values[:, target_index], steps["daily_lag"])}
    return Splits(None, None, None, state=state, report=report, arrays=arrays)


def series_windows(state: dict[str, Any], arrays: dict[str, Any], origins: np.ndarray,
                   blocks: np.ndarray | None = None, batch_size: int | None = None) -> Any:
    """The windows at ``origins`` of ``series_splits``' arrays (``cut_windows``), a ``tf.data.Dataset``.

    Args:
        state, arrays: the splits' (with ``blocks``, ``arrays["ridge_target_shift"]``, see
            ``seqapps.baselines.fit_window_ridge``).
        origins: the windows' last observed steps.
        blocks: each window's cross-fitting block: the targets are then shifted to the ridge's
            out-of-fold residuals; None: the series' values.
        batch_size: as in ``cut_windows``.

    Returns:
        ``({input column: [lookback], END_TIME: []}, [horizon, targets])``, batched if asked.
    """
    return cut_windows(arrays["series"], arrays["times"], origins, state["input_cols"],
                       [state["input_cols"].index(c) for c in state["target_cols"]], state["lookback"],
                       state["horizon"], batch_size, None if blocks is None else
                       (blocks, arrays["ridge_target_shift"]), time_key=END_TIME)


def split_inputs(data: Splits, split: str, batch_size: int) -> Any:
    """A split's window inputs (without targets), in batches of ``batch_size``, for ``predict``."""
    return series_windows(data.state, data.arrays, data.arrays["origins"][split],
                          batch_size=batch_size).map(lambda x, y: x)


def _with_members_axis(inputs: dict[str, Any], targets: Any) -> tuple[dict[str, Any], Any]:
    """A window with its targets given a members axis of 1: [1, horizon, targets]."""
    return inputs, targets[None]


def fitted_windows(state: dict[str, Any], arrays: dict[str, Any], origins: np.ndarray,
                   blocks: np.ndarray | None) -> Any:
    """Windows to train or validate on (``series_windows``, unbatched), their targets with a members axis of 1.

    Args:
        state, arrays, origins, blocks: as in ``series_windows``.
    """
    return series_windows(state, arrays, origins, blocks).map(_with_members_axis)


def window_datasets(data: Splits, cross_fitted_targets: bool, fit_on_val: bool, holdout: bool) -> None:
    """Sets the splits' datasets of windows, with targets of a members axis of 1 (every member is scored on them).

    Args:
        data: ``series_splits``' (with ``cross_fitted_targets``, and the ridge fitted on it).
        cross_fitted_targets: shift the training and validation targets to the ridge's out-of-fold
            residuals, batch by batch from each window's features and cross-fitting block.
        fit_on_val: train on the training and validation windows (validation then only paces training).
        holdout: also keep the training windows alone as ``data.arrays["train_alone"]``, for a first
            fit scored on validation.
    """
    state, arrays = data.state, data.arrays
    origins = arrays["origins"]
    fitted, n_train = len(origins["train"]) + len(origins["val"]), len(origins["train"])
    blocks = arrays["ridge"].blocks(np.arange(fitted)) if cross_fitted_targets else None
    train = (origins["train"], None if blocks is None else blocks[:n_train])
    val = (origins["val"], None if blocks is None else blocks[n_train:])
    if fit_on_val:
        if holdout:
            arrays["train_alone"] = fitted_windows(state, arrays, *train)
        train = (np.concatenate([origins["train"], origins["val"]]), blocks)
    data.train, data.val, data.test = (fitted_windows(state, arrays, *split)
                                       for split in (train, val, (origins["test"], None)))
