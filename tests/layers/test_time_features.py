import numpy as np
import pandas as pd

from seqapps.layers.time_features import CalendarFeatures, SeasonalNaive, Shrinkage
from tests.layers.harness import run_layer_test

NO_WEIGHTS = {"fit": "the layer has no weights to train"}


def test_calendar_features_match_pandas_calendar():
    end = pd.Timestamp("2024-03-06 18:00")  # a Wednesday
    end_time = np.array([end.value // 10**9], "int64")
    past, future = CalendarFeatures(step_seconds=3600, lookback=3, horizon=2)(end_time)
    assert past.shape == (1, 3, 4) and future.shape == (1, 2, 4)
    times = pd.date_range(end + pd.Timedelta("1h"), periods=2, freq="1h")
    hour_angle = 2 * np.pi * (times.hour * 3600) / 86400
    weekday_angle = 2 * np.pi * times.weekday / 7
    # float32 sin/cos of angles below 2*pi: 1e-5 absolute is well above their rounding.
    np.testing.assert_allclose(np.asarray(future)[0, :, 0], np.sin(hour_angle), atol=1e-5)
    np.testing.assert_allclose(np.asarray(future)[0, :, 1], np.sin(weekday_angle), atol=1e-5)
    np.testing.assert_allclose(np.asarray(future)[0, :, 3], np.cos(weekday_angle), atol=1e-5)


def test_calendar_features_follow_local_time_across_both_daylight_saving_changes():
    from seqapps.data.tables import zone_offsets

    offsets = [list(row) for row in zone_offsets("Europe/London")]
    layer = CalendarFeatures(step_seconds=3600, lookback=1, horizon=6, utc_offsets=offsets)
    for end in ("2024-03-31 00:00", "2024-10-27 00:00"):  # UTC; the clocks change at 01:00 UTC
        end = pd.Timestamp(end, tz="UTC")
        _, future = layer(np.array([end.value // 10**9], "int64"))
        local = pd.date_range(end + pd.Timedelta("1h"), periods=6, freq="1h").tz_convert("Europe/London")
        hour_angle = 2 * np.pi * (local.hour * 3600 + local.minute * 60) / 86400
        # float32 sin of angles below 2*pi: 1e-5 absolute is well above their rounding.
        np.testing.assert_allclose(np.asarray(future)[0, :, 0], np.sin(hour_angle), atol=1e-5)
    run_layer_test(CalendarFeatures, {"step_seconds": 3600, "lookback": 2, "horizon": 2, "utc_offsets": offsets[-3:]},
                   np.array([0, 4_090_000_000], "int64"), expected_output_shape=[(2, 2, 4), (2, 2, 4)],
                   expected_num_trainable_weights=0, expected_num_non_trainable_weights=0,
                   other_input_data=np.array([86_400], "int64"), not_applicable=NO_WEIGHTS)


def test_calendar_features_layer_harness():
    run_layer_test(CalendarFeatures, {"step_seconds": 1800, "lookback": 4, "horizon": 2},
                   np.array([0, 86_400], "int64"), expected_output_shape=[(2, 4, 4), (2, 2, 4)],
                   expected_num_trainable_weights=0, expected_num_non_trainable_weights=0,
                   other_input_data=np.array([3_600], "int64"), not_applicable=NO_WEIGHTS)


def test_seasonal_naive_takes_the_value_one_period_back():
    window = np.arange(2 * 6 * 2, dtype="float32").reshape(2, 6, 2)
    output = np.asarray(SeasonalNaive(period=4, horizon=5, feature_indices=[1])(window))
    # Window positions 2,3,4,5 then 2 again (5 steps, period 4), feature 1.
    np.testing.assert_array_equal(output[0, :, 0], window[0, [2, 3, 4, 5, 2], 1])
    run_layer_test(SeasonalNaive, {"period": 4, "horizon": 5, "feature_indices": [1]}, window,
                   expected_output_shape=(2, 5, 1), expected_num_trainable_weights=0,
                   expected_num_non_trainable_weights=0, other_input_data=window[:1], not_applicable=NO_WEIGHTS)


def test_shrinkage_scales_the_correction_by_its_fixed_weights():
    correction = np.random.default_rng(1).normal(size=(2, 3, 4, 1)).astype("float32")
    layer = run_layer_test(Shrinkage, {}, correction, expected_output_shape=(2, 3, 4, 1),
                           expected_num_trainable_weights=0, expected_num_non_trainable_weights=1,
                           other_input_data=correction[:1, :2],
                           not_applicable={"fit": "its weights are chosen after training, not trained"})
    np.testing.assert_array_equal(np.asarray(layer(correction)), correction)  # ones until set
    layer.set_weights([np.linspace(0, 1, 4, dtype="float32")[:, None]])
    np.testing.assert_allclose(np.asarray(layer(correction)), correction * np.linspace(0, 1, 4)[:, None], atol=1e-7)
