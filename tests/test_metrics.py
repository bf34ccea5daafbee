import numpy as np
import pytest

from seqapps.metrics import forecast_metrics, mase_scale, seasonal_naive


def test_seasonal_naive_repeats_the_last_whole_season():
    series = np.arange(20.0)
    # Origin 9, period 4, horizon 6: steps 1..4 repeat indices 6..9, steps 5..6 repeat 6..7.
    np.testing.assert_array_equal(seasonal_naive(series, np.array([9]), 6, 4), [[6, 7, 8, 9, 6, 7]])
    with pytest.raises(ValueError, match="more steps of history"):
        seasonal_naive(series, np.array([2]), 2, 4)


def test_forecast_metrics_against_hand_computed_values():
    truth = np.array([[1.0, 2.0], [3.0, 4.0]])
    forecast = np.array([[2.0, 2.0], [1.0, 4.0]])
    result = forecast_metrics(truth, forecast, scale=2.0)
    assert result["mae"] == pytest.approx(0.75)
    assert result["rmse"] == pytest.approx(np.sqrt(5 / 4))
    assert result["smape"] == pytest.approx(100 * np.mean([2 / 3, 0, 1, 0]))
    assert result["mase"] == pytest.approx(0.375)
    assert mase_scale(np.array([1.0, 3.0, 2.0, 6.0]), 1) == pytest.approx(np.mean([2, 1, 4]))
