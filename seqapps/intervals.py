"""Prediction intervals from calibration residuals (split conformal), and their scores."""
from __future__ import annotations

import numpy as np


def conformal_offsets(truth: np.ndarray, forecast: np.ndarray, quantiles: tuple[float, ...]) -> np.ndarray:
    """Per-step residual quantiles on a calibration split: forecast + offset is that quantile.

    Each forecast step (and target) gets its own offsets, since errors grow with the
    horizon. With n calibration windows, quantile q is the ceil((n + 1) q)-th smallest
    residual (the split-conformal rank) for q above one half, and the mirror rank below.

    Args:
        truth, forecast: calibration values, shape [N, ...].
        quantiles: levels in (0, 1).

    Returns:
        Offsets of shape [len(quantiles), ...].
    """
    residuals = np.sort(truth - forecast, axis=0)
    n = len(residuals)
    ranks = [min(n, int(np.ceil((n + 1) * q))) - 1 if q >= 0.5 else max(0, int(np.floor((n + 1) * q)) - 1)
             for q in quantiles]
    return residuals[ranks]


def pinball_loss(truth: np.ndarray, quantile_forecasts: np.ndarray, quantiles: tuple[float, ...]) -> float:
    """The mean pinball (quantile) loss over quantile levels and values.

    Args:
        truth: shape [N, ...].
        quantile_forecasts: shape [len(quantiles), N, ...].
        quantiles: levels in (0, 1).

    Returns:
        The mean over levels of mean(max(q (y - f), (q - 1) (y - f))); at q = 0.5 it is half the MAE.
    """
    errors = truth[None] - quantile_forecasts
    levels = np.asarray(quantiles).reshape((-1,) + (1,) * truth.ndim)
    return float(np.mean(np.maximum(levels * errors, (levels - 1) * errors)))


def coverage(truth: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> float:
    """The fraction of values inside [lower, upper]."""
    return float(np.mean((truth >= lower) & (truth <= upper)))
