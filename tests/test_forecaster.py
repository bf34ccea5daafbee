import numpy as np

from seqapps.baselines import LinearFit
from seqapps.data.series import END_TIME
from seqapps.forecaster import (encoder_inputs, forecast_batches, forecast_model, recurrent_correction,
                                ridge_extractor, scaled_window, target_scale, window_inputs)
from seqapps.intervals import window_scale
from seqapps.layers.time_features import CalendarFeatures

HOUR = 3600
# A series of 2 columns, "load" the target; windows of 8 hourly steps, a residual period of 4, ridge lags of 3.
STATE = {"input_cols": ["load", "temp"], "target_cols": ["load"], "lookback": 8, "horizon": 3, "residual_period": 4,
         "ridge_lags": 3, "step_seconds": HOUR, "mean": [100.0, 10.0], "std": [5.0, 2.0], "utc_offsets": None}


def batch(rng, size=5):
    """Random windows and end times on the hour."""
    return {"load": rng.normal(100, 5, (size, 8)).astype("float32"), "temp": rng.normal(10, 2, (size, 8)).astype(
        "float32"), END_TIME: (1_700_000_000 // HOUR + rng.integers(0, 1000, size)).astype("int64") * HOUR}


def untrained(state, ridge, members=1):
    inputs = window_inputs(state)
    scaled = scaled_window(state, inputs)
    sequence, base, extra = encoder_inputs(state, inputs, scaled, calendar_features=True)
    corrections = [recurrent_correction(sequence, extra, state["horizon"], 1, f"m{m}_", cell="gru", units=4,
                                        layers=1, dropout=0.0, l2=0.0) for m in range(members)]
    return forecast_model(state, inputs, scaled, base, corrections, ridge, False, "forecaster")


def test_an_untrained_forecaster_is_the_seasonal_naive_forecast_plus_the_frozen_ridge():
    rng = np.random.default_rng(0)
    x = batch(rng)
    calendar, _ = CalendarFeatures(HOUR, 1, 1)(x[END_TIME])
    calendar = np.asarray(calendar).reshape(5, -1)
    # The ridge reads the last 3 values and seasonal changes of both columns and the calendar of the window's end.
    ridge = LinearFit(rng.normal(0, 0.1, (3 * 4 + calendar.shape[1], 3)), rng.normal(0, 0.1, 3))
    model = untrained(STATE, ridge, members=2)
    found = model.predict(x, verbose=0)
    assert found.shape == (5, 2, 3, 1)  # [batch, members, horizon, targets]
    # Brute force in NumPy, float64: scale, take the seasonal change and the last season's values.
    scaled = np.stack([(x["load"] - 100.0) / 5.0, (x["temp"] - 10.0) / 2.0], axis=-1)  # [batch, 8, 2]
    change = np.concatenate([scaled[:, 4:], scaled[:, 4:] - scaled[:, :-4]], axis=-1)  # values, then changes
    inputs = np.concatenate([change[:, -3:].reshape(5, -1), calendar], axis=1)
    naive = scaled[:, [4, 5, 6], 0]  # step h repeats the value 4 steps before it
    expected = (inputs @ ridge.coef + ridge.intercept + naive) * 5.0 + 100.0
    # float32 graph vs float64 NumPy on values near 100.
    for member in range(2):
        np.testing.assert_allclose(found[:, member, :, 0], expected, rtol=1e-5)
    # The extractor gives the ridge's features and the flattened base the ridge is fitted on.
    extracted_features, extracted_base = ridge_extractor(STATE).predict(x, verbose=0)
    np.testing.assert_allclose(extracted_features, inputs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(extracted_base, naive, rtol=1e-5, atol=1e-5)
    mean, std = target_scale(STATE)
    assert mean.tolist() == [100.0] and std.tolist() == [5.0]


def test_without_a_residual_period_or_ridge_the_forecast_is_the_correction_alone():
    state = {**STATE, "residual_period": None, "ridge_lags": None}
    model = untrained(state, None)
    found = model.predict(batch(np.random.default_rng(1)), verbose=0)
    np.testing.assert_allclose(found, 100.0)  # a zero correction of the scaled target: its training mean
    assert "ridge" not in [layer.name for layer in model.layers]


def test_forecast_batches_give_the_members_mean_the_local_scale_and_the_truth_of_each_batch():
    rng = np.random.default_rng(2)
    features = ridge_extractor(STATE).outputs[0].shape[1]
    model = untrained(STATE, LinearFit(rng.normal(0, 0.1, (features, 3)), np.zeros(3)), members=2)
    for weight in model.trainable_weights:  # members that differ
        weight.assign(rng.normal(0, 0.1, weight.shape).astype("float32"))
    series = np.stack([rng.normal(100, 5, 700), rng.normal(10, 2, 700)], axis=1).astype("float32")
    arrays = {"series": series, "times": np.arange(700, dtype="int64") * HOUR}
    origins = np.arange(7, 697)
    interval = {"scale_lag": 2, "scale_floor": [0.01]}
    found = list(forecast_batches(model, STATE, arrays, origins, interval))
    assert [rows for rows, *_ in found] == [slice(0, 256), slice(256, 512), slice(512, 690)]
    windows = {"load": np.stack([series[t - 7: t + 1, 0] for t in origins]),
               "temp": np.stack([series[t - 7: t + 1, 1] for t in origins]), END_TIME: arrays["times"][origins]}
    forecast, scale, truth = (np.concatenate([b[i] for b in found]) for i in (1, 2, 3))
    np.testing.assert_allclose(forecast, model.predict(windows, verbose=0).mean(axis=1), rtol=1e-6)
    np.testing.assert_allclose(scale, np.asarray(window_scale(interval, ["load"], windows)), rtol=1e-6)
    np.testing.assert_array_equal(truth, np.stack([series[t + 1: t + 4, :1] for t in origins]))
