"""Prediction intervals from calibration residuals (split conformal), and their scores.

Forecast errors are larger in volatile weeks (winter weather, holidays) than in calm
ones, so the intervals are locally weighted: the calibration residuals are divided
by a scale read from each input window (``local_scale``), and the served interval
is the forecast plus the calibrated offsets times the window's own scale.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

CHUNK_ROWS = 8192  # rows per work array of the pinball loss: a long test split holds millions of values


def conformal_offsets(residuals: np.ndarray, quantiles: tuple[float, ...]) -> np.ndarray:
    """Per-step residual quantiles on a calibration split: forecast + offset is that quantile.

    Each forecast step (and target) gets its own offsets, since errors grow with the
    horizon. With n calibration windows, quantile q is the ceil((n + 1) q)-th smallest
    residual (the split-conformal rank) for q above one half, and the mirror rank below.

    Args:
        residuals: calibration truth minus forecast, shape [N, ...]; sorted in place (along the first axis),
            so that a large calibration set is not copied.
        quantiles: levels in (0, 1).

    Returns:
        Offsets of shape [len(quantiles), ...].
    """
    residuals.sort(axis=0)
    n = len(residuals)
    ranks = [min(n, int(np.ceil((n + 1) * q))) - 1 if q >= 0.5 else max(0, int(np.floor((n + 1) * q)) - 1)
             for q in quantiles]
    return residuals[ranks]


def local_scale(window: Any, lag: int, floor: float) -> Any:
    """The mean absolute change over ``lag`` steps within each window, plus a floor.

    Works on NumPy arrays and on tensors inside a served graph (Keras ops).

    Args:
        window: values of one column, shape [batch, lookback] with lookback > lag.
        lag: the change is ``x[t] - x[t - lag]`` (a day, for hourly weather).
        floor: added so that a constant window does not give a zero-width interval.

    Returns:
        Shape [batch].
    """
    from keras import ops

    window = ops.convert_to_tensor(window, "float32")
    return ops.mean(ops.abs(window[:, lag:] - window[:, :-lag]), axis=1) + floor


def pinball_loss(truth: np.ndarray, quantile_forecasts: Sequence[np.ndarray], quantiles: tuple[float, ...]) -> float:
    """The mean pinball (quantile) loss over quantile levels and values.

    Args:
        truth: shape [N, ...].
        quantile_forecasts: one forecast per level, each shaped like ``truth`` (or an array [levels, N, ...]).
        quantiles: levels in (0, 1).

    Returns:
        The mean over levels of mean(max(q (y - f), (q - 1) (y - f))); at q = 0.5 it is half the MAE.
    """
    losses = []
    truth = truth.reshape(len(truth), -1)
    for forecast, level in zip(quantile_forecasts, quantiles):  # one level at a time, in chunks of rows
        forecast, total = forecast.reshape(truth.shape), 0.0
        for first in range(0, len(truth), CHUNK_ROWS):
            error = np.subtract(truth[first: first + CHUNK_ROWS], forecast[first: first + CHUNK_ROWS],
                                dtype=np.float64)
            below = error * (level - 1)
            error *= level
            total += float(np.maximum(error, below, out=error).sum())
        losses.append(total / truth.size)
    return float(np.mean(losses))


def coverage(truth: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> float:
    """The fraction of values inside [lower, upper]."""
    return float(np.mean((truth >= lower) & (truth <= upper)))
