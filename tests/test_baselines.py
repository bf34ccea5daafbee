import numpy as np
import pytest
from sklearn.linear_model import Ridge
from statsmodels.tsa.holtwinters import ExponentialSmoothing

from seqapps.baselines import fit_ridge, holt_winters, out_of_fold_forecasts


def test_fit_ridge_picks_the_best_validation_alpha_then_refits_on_train_and_val():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 5))
    y = x @ rng.normal(size=(5, 3)) + rng.normal(scale=2.0, size=(120, 3))
    train_x, val_x, train_y, val_y = x[:80], x[80:], y[:80], y[80:]
    alphas = (0.01, 1.0, 100.0, 10_000.0)
    fit = fit_ridge(x.copy(), y, 80, alphas)
    # Brute force with scikit-learn: the validation MAE of each alpha fitted on train alone.
    val_maes = {a: np.mean(np.abs(Ridge(alpha=a).fit(train_x, train_y).predict(val_x) - val_y)) for a in alphas}
    assert fit.alpha == min(val_maes, key=val_maes.get)
    assert fit.val_mae == pytest.approx(val_maes[fit.alpha])
    np.testing.assert_allclose(fit.val_forecast, Ridge(alpha=fit.alpha).fit(train_x, train_y).predict(val_x))
    final = Ridge(alpha=fit.alpha).fit(x, y)
    new = rng.normal(size=(7, 5))
    np.testing.assert_allclose(fit.predict(new), final.predict(new), rtol=1e-10, atol=1e-10)


def test_holt_winters_matches_statsmodels_forecast_and_reads_no_future():
    steps = np.arange(24 * 30)
    series = 10 + 3 * np.sin(2 * np.pi * steps / 24) + np.random.default_rng(1).normal(scale=0.3, size=len(steps))
    fit_end, horizon = 24 * 20, 30
    origins = np.array([fit_end - 1, fit_end + 50])
    forecast = holt_winters(series, fit_end, origins, horizon, period=24)
    reference = ExponentialSmoothing(series[:fit_end], seasonal="add", seasonal_periods=24,
                                     initialization_method="estimated").fit().forecast(horizon)
    # Re-running the filter with "known" initial states reproduces the fit to float round-off.
    np.testing.assert_allclose(forecast[0], reference, atol=1e-6)
    changed = series.copy()
    changed[fit_end + 51:] += 100.0  # values after the second origin must not move its forecast
    np.testing.assert_allclose(holt_winters(changed, fit_end, origins, horizon, 24), forecast)


def test_fit_ridge_keeps_the_shape_of_a_single_output():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(40, 3)), rng.normal(size=(40, 1))
    fit = fit_ridge(x, y, 30)
    assert fit.coef.shape == (3, 1) and fit.val_forecast.shape == (10, 1) and fit.predict(x).shape == (40, 1)


def test_out_of_fold_forecasts_come_from_fits_that_left_the_block_and_its_neighbours_out():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(50, 4))
    y = x @ rng.normal(size=(4, 2)) + rng.normal(size=(50, 2))
    forecast = out_of_fold_forecasts(x, y, alpha=0.5, folds=3, gap=2)
    # Brute force: blocks [0, 17), [17, 33), [33, 50); each fit skips the block and 2 rows either side.
    for start, stop in [(0, 17), (17, 33), (33, 50)]:
        kept = [i for i in range(50) if i < start - 2 or i >= stop + 2]
        expected = Ridge(alpha=0.5).fit(x[kept], y[kept]).predict(x[start:stop])
        np.testing.assert_allclose(forecast[start:stop], expected, rtol=1e-10, atol=1e-10)
    changed = y.copy()
    changed[18] += 1e3  # a target inside the second block (and within the gap of the first) moves neither
    moved = out_of_fold_forecasts(x, changed, alpha=0.5, folds=3, gap=2)
    np.testing.assert_allclose(moved[:33], forecast[:33], rtol=1e-10, atol=1e-10)
