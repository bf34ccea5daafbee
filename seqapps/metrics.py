"""Task metrics. Forecasting: MAE, RMSE, sMAPE and MASE, and seasonal-naive forecasts."""
from __future__ import annotations

import numpy as np


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
    # In float64 with two work arrays reused in place: the test split of a long series holds
    # millions of values, and sklearn's MAE/RMSE would copy both inputs several times over.
    truth, forecast = y_true.reshape(-1), y_pred.reshape(-1)
    error = np.subtract(truth, forecast, dtype=np.float64)
    np.abs(error, out=error)
    scale_sum = np.abs(truth, dtype=np.float64)
    scale_sum += np.abs(forecast)
    mae = float(error.mean())
    smape = float(200 * np.divide(error, scale_sum, out=scale_sum, where=scale_sum > 0).mean())  # 0 where both are 0
    rmse = float(np.sqrt(np.square(error, out=error).mean()))
    return {"mae": mae, "rmse": rmse, "smape": smape, "mase": mae / float(scale) if scale > 0 else float("nan")}
