import numpy as np
import pytest
from sklearn.metrics import mean_pinball_loss

from seqapps.intervals import (CHUNK_ROWS, SHRINKAGE_GRID, choose_shrinkage, conformal_offsets, coverage,
                               interval_levels, local_scale, local_scales, pinball_loss, scaled_conformal_offsets,
                               shrinkage_weights, window_scale)


def test_conformal_offsets_take_the_split_conformal_ranks_per_step():
    rng = np.random.default_rng(0)
    residuals = np.stack([rng.permutation(99) + 1.0, 10 * (rng.permutation(99) + 1.0)], axis=1)  # [99, 2 steps]
    offsets = conformal_offsets(residuals, (0.1, 0.9))
    # n = 99: the upper rank is ceil(100 * 0.9) = 90, the lower floor(100 * 0.1) = 10 (1-based).
    np.testing.assert_array_equal(offsets, [[10, 100], [90, 900]])


def test_scaled_conformal_offsets_gather_the_batches_residuals_divided_by_their_scale():
    rng = np.random.default_rng(4)
    truth, forecast = rng.normal(size=(50, 3, 2)), rng.normal(size=(50, 3, 2))
    scale = rng.uniform(0.5, 2.0, size=(50, 1, 2))
    # Batches in any order, each filling its own rows.
    batches = [(rows, forecast[rows], scale[rows], truth[rows]) for rows in (slice(20, 50), slice(0, 7), slice(7, 20))]
    found = scaled_conformal_offsets(iter(batches), truth.shape, (0.1, 0.9), "float64")
    np.testing.assert_array_equal(found, conformal_offsets(truth / scale - forecast / scale, (0.1, 0.9)))


def test_pinball_loss_matches_scikit_learn_and_is_half_the_mae_at_the_median():
    rng = np.random.default_rng(1)
    truth = rng.normal(size=(50, 4))
    forecasts = np.stack([truth + rng.normal(size=truth.shape) for _ in range(3)])
    levels = (0.1, 0.5, 0.9)
    expected = np.mean([mean_pinball_loss(truth.ravel(), f.ravel(), alpha=q) for f, q in zip(forecasts, levels)])
    assert pinball_loss(truth, forecasts, levels) == pytest.approx(expected)
    assert pinball_loss(truth, forecasts[1:2], (0.5,)) == pytest.approx(0.5 * np.mean(np.abs(truth - forecasts[1])))
    long_truth = rng.normal(size=(3 * CHUNK_ROWS + 7, 2, 1))  # chunks of rows, the last short
    long_forecast = long_truth + rng.normal(size=long_truth.shape)
    # Chunk sums against scikit-learn's mean: round-off of ~1e-15 relative.
    assert pinball_loss(long_truth, [long_forecast], (0.9,)) == pytest.approx(
        mean_pinball_loss(long_truth.ravel(), long_forecast.ravel(), alpha=0.9), rel=1e-12)


def test_coverage_and_local_scale_against_hand_computed_values():
    assert coverage(np.array([0.0, 1.0, 2.0, 3.0]), np.full(4, 0.5), np.full(4, 2.0)) == 0.5
    window = np.array([[1.0, 2.0, 4.0, 8.0], [5.0, 5.0, 5.0, 5.0]])
    # Changes over 2 steps: |4-1|, |8-2| -> 4.5; a constant window gives the floor alone.
    np.testing.assert_allclose(np.asarray(local_scale(window, 2, 0.01)), [4.51, 0.01], rtol=1e-6)


def test_local_scales_stack_each_column_s_scale_to_broadcast_over_the_horizon():
    rng = np.random.default_rng(2)
    windows = [rng.normal(size=(3, 6)), rng.normal(size=(3, 6))]
    found = np.asarray(local_scales(windows, 2, [0.1, 0.2]))
    assert found.shape == (3, 1, 2)
    for column, (window, floor) in enumerate(zip(windows, (0.1, 0.2))):
        # Brute force: the mean |x[t] - x[t-2]| of each row, plus the floor.
        expected = [np.mean([abs(row[t] - row[t - 2]) for t in range(2, 6)]) + floor for row in window]
        np.testing.assert_allclose(found[:, 0, column], expected, rtol=1e-6)  # float32 in the graph


def test_interval_levels_are_the_central_interval_s_quantiles():
    assert interval_levels(0.8) == (0.1, 0.9) and interval_levels(0.95) == (0.025, 0.975)


def test_shrinkage_weights_minimise_the_mae_of_each_step_as_a_brute_force_search_does():
    rng = np.random.default_rng(3)
    truth, base = rng.normal(size=(200, 6, 2)), rng.normal(size=(200, 6, 2))
    # Step h of target t: a correction that closes a share h/5 of the base's error, plus noise; at step 0 it
    # points the wrong way.
    share = np.arange(6)[:, None] / 5 * np.ones(2)
    correction = np.where(share > 0, (truth - base) / np.maximum(share, 1e-9) + rng.normal(0, 0.01, truth.shape),
                          base - truth)
    found = shrinkage_weights(truth, base, correction, per_step=True)
    for h in range(6):
        for t in range(2):
            errors = [np.abs(truth[:, h, t] - base[:, h, t] - w * correction[:, h, t]).mean() for w in SHRINKAGE_GRID]
            assert found[h, t] == SHRINKAGE_GRID[int(np.argmin(errors))]
    np.testing.assert_allclose(found[1:], share[1:], atol=0.05)  # on the grid: w = share closes the error
    assert found[0].tolist() == [0.0, 0.0]  # the base alone
    overall = shrinkage_weights(truth, base, correction, per_step=False)
    for t in range(2):
        errors = [np.abs(truth[..., t] - base[..., t] - w * correction[..., t]).mean() for w in SHRINKAGE_GRID]
        assert (overall[:, t] == SHRINKAGE_GRID[int(np.argmin(errors))]).all()


def test_window_scale_reads_each_target_s_window_with_the_interval_s_lag_and_floors():
    rng = np.random.default_rng(4)
    inputs = {"load": rng.normal(size=(3, 6)), "temp": rng.normal(size=(3, 6)), "end_time": np.zeros(3, "int64")}
    interval = {"scale_lag": 2, "scale_floor": [0.1, 0.2], "levels": [0.1, 0.9]}
    found = np.asarray(window_scale(interval, ["temp", "load"], inputs))
    np.testing.assert_array_equal(found, np.asarray(local_scales([inputs["temp"], inputs["load"]], 2, [0.1, 0.2])))


def test_choose_shrinkage_scores_the_model_s_base_and_correction_and_restores_the_whole_correction():
    import keras
    import tensorflow as tf

    from seqapps.layers.time_features import Shrinkage

    rng = np.random.default_rng(5)
    windows, horizon, targets = 90, 4, 2
    inputs = {"base": keras.Input((horizon, targets), name="base"),
              "correction": keras.Input((horizon, targets), name="correction")}
    members = keras.layers.Reshape((1, horizon, targets))(inputs["correction"])  # one member
    model = keras.Model(inputs, keras.layers.Add()([Shrinkage(name="shrinkage")(members),
                                                    keras.layers.Reshape((1, horizon, targets))(inputs["base"])]))
    base, correction = (rng.normal(size=(windows, horizon, targets)).astype("float32") for _ in range(2))
    truth = base + np.linspace(0, 1, horizon)[:, None] * correction + rng.normal(0, 0.1, base.shape)
    shift = rng.normal(0, 0.05, base.shape)
    batches = [({"base": base[i: i + 32], "correction": correction[i: i + 32]}, tf.constant(truth[i: i + 32]))
               for i in range(0, windows, 32)]
    weights, scores = choose_shrinkage(model, batches, shift, per_step=True)
    shifted = base.astype("float64") + shift
    np.testing.assert_array_equal(weights, shrinkage_weights(truth, shifted, correction.astype("float64"), True))
    # float32 model outputs of values of O(1), averaged in float64.
    np.testing.assert_allclose(scores["base"], np.abs(truth - shifted).mean(), rtol=1e-6)
    np.testing.assert_allclose(scores["correction"], np.abs(truth - shifted - correction).mean(), rtol=1e-6)
    np.testing.assert_allclose(scores["shrunk"], np.abs(truth - shifted - weights * correction).mean(), rtol=1e-6)
    assert scores["shrunk"] <= min(scores["base"], scores["correction"])
    np.testing.assert_array_equal(model.get_layer("shrinkage").get_weights()[0], np.ones((horizon, targets)))
