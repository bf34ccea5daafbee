"""Task metrics. Forecasting: MAE, RMSE, sMAPE and MASE, and seasonal-naive forecasts."""
from __future__ import annotations

import numpy as np
from sklearn.metrics import mean_absolute_error, root_mean_squared_error


def seasonal_naive(series: np.ndarray, origins: np.ndarray, horizon: int, period: int) -> np.ndarray:
    """Forecasts each step as the value one (or more) whole seasons before it.

    For origin t (the last observed index) and step h = 1..horizon the forecast is
    ``series[t + h - period * ceil(h / period)]``, so only observed values are used.

    Args:
        series: values, shape [T] or [T, C].
        origins: indices of the last observed step of each window, shape [N].
        horizon: steps ahead.
        period: the season length in steps (48 for "same time yesterday" at 30 min).

    Returns:
        Forecasts of shape [N, horizon] (+ [C] if ``series`` has columns).
    """
    steps = np.arange(1, horizon + 1)
    lags = period * np.ceil(steps / period).astype(int) - steps
    index = origins[:, None] - lags[None, :]
    if index.min() < 0:
        raise ValueError(f"seasonal naive with period {period} needs {-index.min()} more steps of history")
    return series[index]


def mase_scale(train_series: np.ndarray, period: int) -> np.ndarray:
    """Mean absolute error of the in-sample seasonal-naive forecast: the MASE denominator.

    Args:
        train_series: training values, shape [T] or [T, C].
        period: the season length in steps (1 for the plain naive forecast).

    Returns:
        One scale per column (a scalar for a 1-D series).
    """
    return np.mean(np.abs(train_series[period:] - train_series[:-period]), axis=0)


def forecast_metrics(y_true: np.ndarray, y_pred: np.ndarray, scale: float) -> dict[str, float]:
    """MAE, RMSE, sMAPE (percent, 0-200) and MASE of one target.

    Args:
        y_true, y_pred: arrays of the same shape ([N, horizon]), in the user's units.
        scale: the MASE denominator from ``mase_scale``.

    Returns:
        ``{"mae", "rmse", "smape", "mase"}`` as floats.
    """
    truth, forecast = y_true.reshape(-1), y_pred.reshape(-1)
    denominator = np.abs(truth) + np.abs(forecast)
    ratio = np.divide(2 * np.abs(truth - forecast), denominator, out=np.zeros_like(denominator),
                      where=denominator > 0)
    mae = float(mean_absolute_error(truth, forecast))
    return {"mae": mae, "rmse": float(root_mean_squared_error(truth, forecast)),
            "smape": float(100 * ratio.mean()), "mase": mae / float(scale) if scale > 0 else float("nan")}


# --- Language-model metrics: perplexity, bits per character, the unigram baseline -------------
# (one section of its own: other metric families are added above and below it)


def _mean_negative_log_prob(log_probs: np.ndarray, mask: np.ndarray | None = None) -> float:
    log_probs = np.asarray(log_probs, dtype="float64")
    weights = np.ones_like(log_probs) if mask is None else np.asarray(mask, dtype="float64")
    if weights.shape != log_probs.shape or weights.sum() <= 0:
        raise ValueError(f"mask must have the shape of log_probs {log_probs.shape} and weigh at least one token")
    return float(-np.sum(log_probs * weights) / np.sum(weights))


def perplexity(log_probs: np.ndarray, mask: np.ndarray | None = None) -> float:
    """Perplexity ``exp(-mean(log p))`` over the (masked) tokens.

    Args:
        log_probs: per-token natural-log probabilities, any shape (NumPy or eager tensors).
        mask: optional weights of the same shape (1 for real tokens).

    Returns:
        The perplexity as a Python float.
    """
    return float(np.exp(_mean_negative_log_prob(log_probs, mask)))


def bits_per_char(log_probs: np.ndarray, mask: np.ndarray | None = None) -> float:
    """Mean cost in bits, ``-mean(log2 p)``, of the (masked) tokens: bits per character for
    a character model (per token in general); ``log2(perplexity)``.

    Args:
        log_probs: per-token natural-log probabilities, any shape.
        mask: optional weights of the same shape.

    Returns:
        Bits per token as a Python float.
    """
    return _mean_negative_log_prob(log_probs, mask) / np.log(2)


def unigram_log_probs(train_counts: np.ndarray, targets: np.ndarray, smoothing: float = 1.0) -> np.ndarray:
    """Natural-log probabilities of ``targets`` under the add-``smoothing`` unigram model of the
    training counts: the baseline of every language model.

    Args:
        train_counts: ``[V]`` token counts of the training data (id 0: unknown tokens).
        targets: int ids of the scored tokens, any shape.
        smoothing: added to every count (> 0), so unseen ids have a finite cost.

    Returns:
        float64 log-probabilities of the shape of ``targets``.
    """
    counts = np.asarray(train_counts, dtype="float64") + smoothing
    if counts.ndim != 1 or np.any(counts <= 0):
        raise ValueError("train_counts must be 1-D and non-negative, with smoothing > 0")
    return np.log(counts / counts.sum())[np.asarray(targets, dtype="int64")]
