"""Forecasting baselines a forecaster would use instead of an RNN: ridge regression and Holt-Winters.

Both follow the protocol of the forecasting pipelines: hyperparameters are chosen on
the validation split, the final fit sees the training and validation splits only, and
forecasts are made from every test origin for the whole horizon.
"""
from __future__ import annotations

import dataclasses
import warnings

import numpy as np

RIDGE_ALPHAS = tuple(np.logspace(-4, 3, 15))


@dataclasses.dataclass
class RidgeFit:
    """A ridge regression fitted by ``fit_ridge``.

    Attributes:
        alpha: the penalty chosen on the validation split.
        coef: weights, shape [features, outputs].
        intercept: shape [outputs].
        val_mae: the validation MAE of the fit on the training split with ``alpha``.
        val_forecast: that fit's forecasts of the validation split, shape [N_val, outputs]:
            out-of-sample, unlike ``predict(val_x)`` (for calibrating intervals).
    """

    alpha: float
    coef: np.ndarray
    intercept: np.ndarray
    val_mae: float
    val_forecast: np.ndarray

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Returns ``features @ coef + intercept``, shape [N, outputs]."""
        return features @ self.coef + self.intercept


def fit_ridge(x: np.ndarray, y: np.ndarray, n_train: int, alphas: tuple[float, ...] = RIDGE_ALPHAS) -> RidgeFit:
    """Chooses the ridge penalty by validation MAE, then refits on train + validation.

    The training and validation rows come in one array each, and the final fit
    centres ``x`` in place instead of copying it: long series give millions of rows.
    (Scikit-learn fits in the features' precision and casts the targets to it, so
    targets in that precision save another copy.)

    Args:
        x: features, shape [N, F] (already on comparable scales): the training rows, then the validation
            rows. Overwritten: the final fit leaves them centred.
        y: targets, shape [N, outputs], in the same order.
        n_train: how many leading rows are the training split.
        alphas: the penalties to try.

    Returns:
        The fit on all rows with the best penalty.
    """
    from sklearn.linear_model import Ridge

    train_x, train_y, val_x, val_y = x[:n_train], y[:n_train], x[n_train:], y[n_train:]
    best = None
    for alpha in alphas:
        val_forecast = Ridge(alpha=alpha).fit(train_x, train_y).predict(val_x)
        val_mae = float(np.mean(np.abs(val_forecast - val_y)))
        if best is None or val_mae < best[0]:
            best = val_mae, alpha, val_forecast
    val_mae, alpha, val_forecast = best
    final = Ridge(alpha=alpha, copy_X=False).fit(x, y)
    coef = np.asarray(final.coef_, "float64").reshape(y.shape[1], -1).T
    return RidgeFit(float(alpha), coef, np.asarray(final.intercept_, "float64").reshape(-1), val_mae,
                    np.asarray(val_forecast, "float64").reshape(val_y.shape))


def out_of_fold_forecasts(features: np.ndarray, targets: np.ndarray, alpha: float, folds: int,
                          gap: int) -> np.ndarray:
    """Ridge forecasts of each of ``folds`` contiguous blocks by a fit on the other rows (cross-fitting).

    Rows are forecast windows in time order; a window's targets overlap its neighbours',
    so the ``gap`` rows on each side of a block are left out of its fit too.

    Args:
        features: shape [N, F].
        targets: shape [N, outputs].
        alpha: the ridge penalty.
        folds: the number of blocks.
        gap: rows left out on each side of the held-out block.

    Returns:
        Out-of-fold forecasts, shape [N, outputs].
    """
    from sklearn.linear_model import Ridge

    forecasts = np.empty(targets.shape, "float64")
    edges = np.linspace(0, len(features), folds + 1).round().astype(int)
    rows = np.arange(len(features))
    for start, stop in zip(edges[:-1], edges[1:]):
        fit_rows = (rows < start - gap) | (rows >= stop + gap)
        # features[fit_rows] is a copy already, which the fit may centre in place.
        model = Ridge(alpha=alpha, copy_X=False).fit(features[fit_rows], targets[fit_rows])
        forecasts[start:stop] = np.asarray(model.predict(features[start:stop])).reshape(stop - start, -1)
    return forecasts


def holt_winters(series: np.ndarray, fit_end: int, origins: np.ndarray, horizon: int, period: int) -> np.ndarray:
    """Additive Holt-Winters (ETS(A,N,A)) forecasts from many origins, with statsmodels.

    The parameters and initial states are fitted on ``series[:fit_end]``. The model is
    then run with them over the whole series, which only filters forward, so the
    forecast from origin t uses the values up to t alone.

    Args:
        series: values, shape [T].
        fit_end: the number of leading values the parameters are fitted on.
        origins: indices of the last observed step of each forecast, shape [N].
        horizon: steps ahead.
        period: the season length in steps.

    Returns:
        Forecasts of shape [N, horizon].
    """
    from statsmodels.tsa.holtwinters import ExponentialSmoothing

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence chatter; the fit is judged by its test error
        fitted = ExponentialSmoothing(series[:fit_end], seasonal="add", seasonal_periods=period,
                                      initialization_method="estimated").fit()
        params = fitted.params
        states = ExponentialSmoothing(series, seasonal="add", seasonal_periods=period,
                                      initialization_method="known", initial_level=params["initial_level"],
                                      initial_seasonal=params["initial_seasons"]).fit(
            smoothing_level=params["smoothing_level"], smoothing_seasonal=params["smoothing_seasonal"],
            optimized=False)
    level, season = np.asarray(states.level), np.asarray(states.season)
    steps = np.arange(1, horizon + 1)
    season_index = origins[:, None] + steps[None, :] - period * ((steps[None, :] - 1) // period + 1)
    return level[origins][:, None] + season[season_index]
