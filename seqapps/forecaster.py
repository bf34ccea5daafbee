"""The graph of a direct multi-horizon forecaster over a table's windows, as plain builder functions.

It reads a window per input column (``seqapps.data.series``) and the Unix time of its last step
(``END_TIME``), scales the window in the graph and forecasts the whole horizon at once as the
sum of a correction (the task's, ``forecast_model``'s ``corrections``), optionally shrunk
(``Shrinkage``), and its bases: the seasonal-naive forecast (``residual_period``) and a ridge
regression frozen in the graph (``ridge_lags``). ``state`` is the splits' (``series_splits``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Sequence

import keras
import numpy as np

from seqapps import compat, intervals
from seqapps.data.series import END_TIME, series_windows
from seqapps.layers.time_features import CalendarFeatures, SeasonalDifference, SeasonalNaive, Shrinkage

if TYPE_CHECKING:
    from seqapps.baselines import LinearFit


def target_scale(state: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """The targets' training mean and deviation, [targets] each."""
    target_index = [state["input_cols"].index(c) for c in state["target_cols"]]
    return np.array(state["mean"])[target_index], np.array(state["std"])[target_index]


def window_inputs(state: dict[str, Any]) -> dict[str, keras.KerasTensor]:
    """The model's inputs: a [lookback] window per input column and the window's last time, int64."""
    inputs = {name: keras.Input((state["lookback"],), name=name) for name in state["input_cols"]}
    inputs[END_TIME] = keras.Input((), dtype="int64", name=END_TIME)
    return inputs


def scaled_window(state: dict[str, Any], inputs: dict[str, Any]) -> Any:
    """The window [batch, lookback, columns], scaled by the training mean and deviation."""
    lookback = state["lookback"]
    stacked = [keras.layers.Reshape((lookback, 1))(inputs[name]) for name in state["input_cols"]]
    window = keras.layers.Concatenate(name="window")(stacked) if len(stacked) > 1 else stacked[0]
    return keras.layers.Normalization(axis=-1, mean=state["mean"], variance=np.square(state["std"]),
                                      name="scale_inputs")(window)


def seasonal_base(state: dict[str, Any], scaled: Any) -> Any | None:
    """The seasonal-naive forecast in scaled units, [batch, horizon, targets], or None without a residual period."""
    if not state["residual_period"]:
        return None
    target_index = [state["input_cols"].index(c) for c in state["target_cols"]]
    return SeasonalNaive(state["residual_period"], state["horizon"], target_index, name="seasonal_naive")(scaled)


def ridge_features(state: dict[str, Any], inputs: dict[str, Any], scaled: Any) -> Any:
    """The ridge regression's inputs: recent scaled values (and their seasonal change) and the calendar."""
    lags, period = state["ridge_lags"], state["residual_period"]
    recent = SeasonalDifference(period, name="ridge_seasonal_difference")(scaled) if period else scaled
    recent = keras.layers.Cropping1D((recent.shape[1] - lags, 0), name="ridge_lags")(recent)
    calendar, _ = CalendarFeatures(state["step_seconds"], 1, 1, name="ridge_calendar")(inputs[END_TIME])
    return keras.layers.Concatenate(name="ridge_features")(
        [keras.layers.Flatten()(recent), keras.layers.Flatten()(calendar)])


def ridge_extractor(state: dict[str, Any]) -> keras.Model:
    """A model of the window inputs to the ridge's features [batch, F] and, with a residual period, the
    seasonal-naive base [batch, horizon x targets]: what ``seqapps.baselines.fit_window_ridge`` fits on."""
    inputs = window_inputs(state)
    scaled = scaled_window(state, inputs)
    base = seasonal_base(state, scaled)
    return keras.Model(inputs, [ridge_features(state, inputs, scaled)]
                       + ([] if base is None else [keras.layers.Flatten()(base)]))


def encoder_inputs(state: dict[str, Any], inputs: dict[str, Any], scaled: Any,
                   calendar_features: bool) -> tuple[Any, Any | None, list[Any]]:
    """What a correction reads.

    Args:
        state, inputs: as in ``window_inputs``.
        scaled: ``scaled_window``'s output.
        calendar_features: add the time of day and week to the sequence and the head.

    Returns:
        ``(sequence, base, extra)``: the sequence [batch, steps, features] for the recurrent layers (with a
        residual period, the window's change over one period), ``seasonal_base`` (or None) and the flat
        inputs of the head: the target steps' calendar and, with a residual period, the seasonal-naive
        forecast itself (last season's values at the target steps: a seasonal lookback).
    """
    period, sequence, future = state["residual_period"], scaled, None
    if period:
        sequence = SeasonalDifference(period, name="seasonal_difference")(scaled)
    if calendar_features:
        past_calendar, future_calendar = CalendarFeatures(state["step_seconds"], sequence.shape[1], state["horizon"],
                                                          state.get("utc_offsets"), name="calendar")(inputs[END_TIME])
        sequence = keras.layers.Concatenate()([sequence, past_calendar])
        future = keras.layers.Flatten()(future_calendar)
    base = seasonal_base(state, scaled)
    extra = ([future] if future is not None else []) + ([keras.layers.Flatten()(base)] if base is not None else [])
    return sequence, base, extra


def forecast_model(state: dict[str, Any], inputs: dict[str, Any], scaled: Any, base: Any | None,
                   corrections: Sequence[Any], ridge: LinearFit | None, ridge_trainable: bool,
                   name: str) -> keras.Model:
    """The forecaster: the members' corrections, shrunk, plus the bases, in user units.

    Args:
        state, inputs, scaled, base: as in ``encoder_inputs``.
        corrections: each member's correction in scaled units, [batch, 1, horizon, targets].
        ridge: the ridge fit (``seqapps.baselines.fit_window_ridge``'s) set in a ``Dense`` layer "ridge", or
            None without ``ridge_lags``.
        ridge_trainable: let training adjust the ridge weights (a linear highway, as in LSTNet).
        name: the model's name.

    Returns:
        A model of the inputs to the forecast [batch, members, horizon, targets], with a ``Shrinkage``
        layer "shrinkage" whose weights start at 1.
    """
    horizon, targets = state["horizon"], len(state["target_cols"])
    members = keras.layers.Concatenate(axis=1, name="members")(corrections) if len(corrections) > 1 else corrections[0]
    parts = [Shrinkage(name="shrinkage")(members)]
    if base is not None:
        parts.append(keras.layers.Reshape((1, horizon, targets))(base))
    if state["ridge_lags"]:
        ridge_layer = keras.layers.Dense(horizon * targets, trainable=ridge_trainable, name="ridge")
        parts.append(keras.layers.Reshape((1, horizon, targets))(ridge_layer(ridge_features(state, inputs, scaled))))
    scaled_forecast = keras.layers.Add()(parts) if len(parts) > 1 else parts[0]
    mean, std = target_scale(state)
    forecast = keras.layers.Normalization(axis=-1, mean=mean, variance=np.square(std), invert=True,
                                          name="unscale_forecast")(scaled_forecast)
    model = keras.Model(inputs, forecast, name=name)
    if state["ridge_lags"]:
        set_ridge(model, ridge)
    return model


def set_ridge(model: keras.Model, ridge: LinearFit) -> None:
    """Puts a ridge fit into a forecaster's ``Dense`` layer "ridge" (the base the correction is added to).

    Args:
        model: a model of ``forecast_model`` with a ridge part.
        ridge: the fit (``seqapps.baselines.fit_window_ridge``'s), on features of the model's state.
    """
    model.get_layer("ridge").set_weights([ridge.coef.astype("float32"), ridge.intercept.astype("float32")])


def recurrent_correction(sequence: Any, extra: list[Any], horizon: int, targets: int, prefix: str, *, cell: str,
                         units: int, layers: int, dropout: float, l2: float) -> Any:
    """One ensemble member's correction, [batch, 1, horizon, targets]: its own stacked RNN and head.

    The last layer starts at zero, so that every member starts at the base forecast.

    Args:
        sequence, extra: ``encoder_inputs``' sequence and the head's flat inputs.
        horizon, targets: the forecast's steps and target columns.
        prefix: the member's layer names' prefix.
        cell, units, layers, dropout, l2: "gru" or "lstm", units per layer, stacked layers, input
            dropout and the L2 penalty on their kernels.
    """
    recurrent = {"gru": keras.layers.GRU, "lstm": keras.layers.LSTM}[cell]
    regularizer = keras.regularizers.L2(l2) if l2 else None
    for i in range(layers):
        sequence = recurrent(units, return_sequences=i < layers - 1, dropout=dropout,
                             kernel_regularizer=regularizer, name=f"{prefix}{cell}_{i + 1}")(sequence)
    summary = keras.layers.Concatenate()([sequence, *extra]) if extra else sequence
    summary = keras.layers.Dense(units, activation="relu", name=f"{prefix}head")(summary)
    correction = keras.layers.Dense(horizon * targets, kernel_initializer="zeros", name=f"{prefix}forecast")(summary)
    return keras.layers.Reshape((1, horizon, targets))(correction)


def forecast_batches(model: keras.Model, state: dict[str, Any], arrays: dict[str, Any], origins: np.ndarray,
                     interval: dict[str, Any], blocks: np.ndarray | None = None
                     ) -> Iterator[tuple[slice, np.ndarray, np.ndarray, np.ndarray]]:
    """The model's forecasts of the windows at ``origins``, batch by batch, with what scores them.

    Args:
        model: a forecaster of [batch, members, horizon, targets] (``forecast_model``).
        state, arrays: the splits' (``seqapps.data.series.series_splits``).
        origins: the windows' last observed steps.
        interval: the interval's state (its local scale, ``intervals.window_scale``).
        blocks: as in ``series_windows``: the true values are shifted.

    Yields:
        ``(rows, forecast, scale, targets)``: the batch's rows in ``origins``, the ensemble's
        forecast (the mean of its members) [batch, horizon, targets], each window's local
        scale [batch, 1, targets] and the true values [batch, horizon, targets].
    """
    start, predict = 0, compat.batch_predictor(model)
    for inputs, targets in series_windows(state, arrays, origins, blocks, batch_size=256):
        forecast = predict(inputs).numpy().mean(axis=1)  # over the members axis
        scale = keras.ops.convert_to_numpy(intervals.window_scale(interval, state["target_cols"], inputs))
        yield slice(start, start + len(forecast)), forecast, scale, targets.numpy()
        start += len(forecast)
