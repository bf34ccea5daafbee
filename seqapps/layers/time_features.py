"""Keras layers for forecasting models: calendar features and the seasonal-naive base."""
from __future__ import annotations

import math
from typing import Any

import keras
import numpy as np
from keras import ops

SECONDS_PER_DAY = 86_400
_THURSDAY = 3  # 1970-01-01, with Monday = 0


@keras.saving.register_keras_serializable(package="seqapps")
class CalendarFeatures(keras.layers.Layer):
    """Time-of-day and day-of-week as sine/cosine pairs, for past and future steps.

    There is no day-of-year feature on purpose: with chronological splits of less
    than a few years of data, test days of the year never occur in training, and
    the model would extrapolate from them.

    From the Unix time of a window's last observed step it computes the times of
    the ``lookback`` observed steps and the ``horizon`` forecast steps, so that a
    served model needs only one timestamp per request. With ``utc_offsets`` the
    features are those of local time (daylight saving included), looked up in the
    offset table inside the graph.

    Args:
        step_seconds: the series' sampling interval in seconds.
        lookback: observed steps in a window (the last is at ``end_time``).
        horizon: forecast steps after ``end_time``.
        utc_offsets: ``[[start, offset], ...]`` in seconds, sorted by start (see
            ``seqapps.data.tables.zone_offsets``); None: ``end_time`` is a wall-clock
            time read as UTC.

    Call arguments:
        end_time: int64 tensor [batch], Unix seconds of the last observed step
            (a UTC instant with ``utc_offsets``, else the data's wall-clock time read as UTC).

    Returns:
        ``(past, future)``: tensors [batch, lookback, 4] and [batch, horizon, 4] of the compute dtype:
        sin and cos of the time of day, then of the day of the week.

    Example:
        >>> past, future = CalendarFeatures(3600, 48, 24)(np.array([0], "int64"))
    """

    def __init__(self, step_seconds: int, lookback: int, horizon: int,
                 utc_offsets: list[list[int]] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.step_seconds = int(step_seconds)
        self.lookback = int(lookback)
        self.horizon = int(horizon)
        self.utc_offsets = None if utc_offsets is None else [[int(a), int(b)] for a, b in utc_offsets]

    def _local(self, times: Any) -> Any:
        if not self.utc_offsets:
            return times
        starts = np.array([start for start, _ in self.utc_offsets], "int64")
        offsets = np.array([offset for _, offset in self.utc_offsets], "int64")
        flat = ops.reshape(times, (-1,))
        index = ops.searchsorted(starts, flat, side="right") - 1
        return times + ops.reshape(ops.take(offsets, index), ops.shape(times))

    def _features(self, times: Any) -> Any:
        times = self._local(times)
        day_seconds = ops.cast(ops.mod(times, SECONDS_PER_DAY), "float32")
        days = ops.floor_divide(times, SECONDS_PER_DAY)
        weekday = ops.cast(ops.mod(days + _THURSDAY, 7), "float32")
        angles = ops.stack([day_seconds * (2 * math.pi / SECONDS_PER_DAY), weekday * (2 * math.pi / 7)], axis=-1)
        # float32 above (a day's seconds overflow float16), the layer's compute dtype out
        return ops.cast(ops.concatenate([ops.sin(angles), ops.cos(angles)], axis=-1), self.compute_dtype)

    def call(self, end_time: Any) -> tuple[Any, Any]:
        end_time = ops.cast(end_time, "int64")
        past = np.arange(-(self.lookback - 1), 1, dtype="int64") * self.step_seconds
        future = np.arange(1, self.horizon + 1, dtype="int64") * self.step_seconds
        return (self._features(end_time[:, None] + past[None, :]),
                self._features(end_time[:, None] + future[None, :]))

    def compute_output_shape(self, input_shape: tuple) -> tuple[tuple, tuple]:
        return (input_shape[0], self.lookback, 4), (input_shape[0], self.horizon, 4)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "step_seconds": self.step_seconds, "lookback": self.lookback,
                "horizon": self.horizon, "utc_offsets": self.utc_offsets}


@keras.saving.register_keras_serializable(package="seqapps")
class SeasonalNaive(keras.layers.Layer):
    """The seasonal-naive forecast taken from a window: step h repeats the value one season before.

    A model that adds its output to this base learns a correction to the naive
    forecast (residual learning), which starts exactly at the baseline.

    Args:
        period: season length in steps; it must not exceed the window length.
        horizon: forecast steps.
        feature_indices: which input features are forecast, in output order.

    Call arguments:
        window: float tensor [batch, lookback, features].

    Returns:
        Float tensor [batch, horizon, len(feature_indices)].
    """

    def __init__(self, period: int, horizon: int, feature_indices: list[int], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.period = int(period)
        self.horizon = int(horizon)
        self.feature_indices = [int(i) for i in feature_indices]

    def call(self, window: Any) -> Any:
        lookback = window.shape[1]
        steps = np.arange(1, self.horizon + 1)
        positions = lookback - 1 + steps - self.period * np.ceil(steps / self.period).astype(int)
        if positions.min() < 0:
            raise ValueError(f"SeasonalNaive: period {self.period} is longer than the window ({lookback} steps)")
        chosen = ops.take(window, positions.astype("int32"), axis=1)
        return ops.take(chosen, np.array(self.feature_indices, "int32"), axis=2)

    def compute_output_shape(self, input_shape: tuple) -> tuple:
        return input_shape[0], self.horizon, len(self.feature_indices)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "period": self.period, "horizon": self.horizon,
                "feature_indices": self.feature_indices}


@keras.saving.register_keras_serializable(package="seqapps")
class SeasonalDifference(keras.layers.Layer):
    """The last ``lookback - period`` steps of a window, beside their change over one season.

    Feeding an encoder ``x[t]`` and ``x[t] - x[t - period]`` lets a residual model see
    how this season departs from the last one (a level shift in this week's demand,
    a warmer day) without reading the whole season step by step.

    Args:
        period: season length in steps; shorter than the window.

    Call arguments:
        window: float tensor [batch, lookback, features].

    Returns:
        Float tensor [batch, lookback - period, 2 * features]: values, then differences.
    """

    def __init__(self, period: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.period = int(period)

    def call(self, window: Any) -> Any:
        if window.shape[1] is not None and window.shape[1] <= self.period:
            raise ValueError(f"SeasonalDifference: period {self.period} must be shorter than the window "
                             f"({window.shape[1]} steps)")
        recent = window[:, self.period:, :]
        return ops.concatenate([recent, recent - window[:, : -self.period, :]], axis=-1)

    def compute_output_shape(self, input_shape: tuple) -> tuple:
        steps = None if input_shape[1] is None else input_shape[1] - self.period
        return input_shape[0], steps, 2 * input_shape[2]

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "period": self.period}


@keras.saving.register_keras_serializable(package="seqapps")
class Shrinkage(keras.layers.Layer):
    """Scales a correction by fixed per-step weights: ``w * correction``, with ``w`` set after training.

    A model that adds a learned correction to a baseline forecast can use the correction
    only as much as it helps out of sample: the weights (one per horizon step and target,
    in [0, 1]) are chosen on forecasts of windows the correction did not train on and
    stored here, so that the export applies them. They are not trainable and start at
    one, so training sees the whole correction; zero gives the baseline exactly.

    Call arguments:
        correction: float tensor [batch, ..., horizon, targets].

    Returns:
        ``correction`` times the weights (broadcast over the leading axes).

    Example:
        >>> layer = Shrinkage()
        >>> out = layer(np.ones((2, 3, 24, 1), "float32"))  # the weights are ones until set
        >>> layer.set_weights([np.full((24, 1), 0.5, "float32")])
    """

    def build(self, input_shape: tuple) -> None:
        self.weight = self.add_weight(name="weight", shape=tuple(input_shape[-2:]), initializer="ones",
                                      trainable=False)

    def call(self, correction: Any) -> Any:
        return correction * ops.cast(self.weight, correction.dtype)

    def compute_output_shape(self, input_shape: tuple) -> tuple:
        return input_shape
