import numpy as np
import pytest
from sklearn.metrics import mean_pinball_loss

from seqapps.intervals import (CHUNK_ROWS, SHRINKAGE_GRID, choose_shrinkage, conformal_offsets, coverage,
                               describe_shrinkage, rolling_origin_rows, rolling_shrinkage,
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


def test_rolling_origin_shrinkage_matches_a_brute_force_search_on_a_small_series():
    """w per lead minimises the pooled MAE among the w that lose to w = 0 on no origin's block."""
    # A small series, forecast 3 steps ahead from each of 100 windows in 5 blocks. The base is a least-squares
    # fit of the targets on the last value that left the held-out block out; the "correction" is the mean residual
    # per lead of the rows it trains on, plus a slope in the window's last value that helps at lead 1 only, plus
    # a step at lead 3 from row 40 on that the truth takes only from row 60: it helps the last two origins'
    # blocks and the three pooled, and hurts the first.
    rng = np.random.default_rng(8)
    horizon, rows = 3, 100
    series = np.cumsum(rng.normal(size=rows + horizon + 1))
    last = series[:rows]
    truth = np.stack([series[1 + h: rows + 1 + h] for h in range(horizon)], axis=1)[..., None]  # [rows, h, 1]
    truth[:, 0, 0] += 2.0 * np.sin(last)  # what the correction can learn, at lead 1
    truth[60:, 2, 0] += 1.5
    edges = np.array([0, 20, 40, 60, 80, 100])
    seen = []

    def fit_base(use: np.ndarray) -> np.ndarray:
        design = np.stack([last, np.ones(rows)], axis=1)
        coef = np.linalg.lstsq(design[use], truth[use, :, 0], rcond=None)[0]
        return (design @ coef)[..., None]

    def correction(train: np.ndarray, base: np.ndarray) -> np.ndarray:
        level = (truth - base)[train].mean(axis=0)
        step = np.where(np.arange(horizon) == 2, 1.5, 0.0)[:, None] * (np.arange(rows) >= 40)[:, None, None]
        return level + np.where(np.arange(horizon) == 0, 2.0, 0.0)[:, None] * np.sin(last)[:, None, None] + step

    def parts(train, pace, held):
        train, pace, held = (np.asarray(part) for part in (train, pace, held))
        seen.append((train, pace, held))
        block = np.ones(rows, bool)
        block[held] = False
        base = fit_base(block)
        return truth[held], base[held], correction(train, fit_base(np.ones(rows, bool)))[held]

    weights, scores = rolling_shrinkage(rolling_origin_rows(edges, 3, horizon), parts)
    # Brute force: the last three blocks, each scored on a correction trained on the rows whose targets end
    # `horizon` rows before the pacing block, the block before it (less the same gap) pacing it.
    row = np.arange(rows)
    truth_all, base_all, correction_all, per_origin = [], [], [], []
    for k, (start, stop) in enumerate([(40, 60), (60, 80), (80, 100)]):
        previous = start - 20
        train, pace, held = row[row < previous - horizon], row[(row >= previous) & (row < start - horizon)], \
            row[(row >= start) & (row < stop)]
        np.testing.assert_array_equal(seen[k][0], train)
        np.testing.assert_array_equal(seen[k][1], pace)
        np.testing.assert_array_equal(seen[k][2], held)
        outside = (row < start) | (row >= stop)
        truth_all.append(truth[held])
        base_all.append(fit_base(outside)[held])
        correction_all.append(correction(train, fit_base(np.ones(rows, bool)))[held])
        per_origin.append((truth_all[-1], base_all[-1], correction_all[-1]))
    truth_all, base_all, correction_all = (np.concatenate(found) for found in (truth_all, base_all, correction_all))
    pooled_only = []
    for h in range(horizon):
        def mae(w, truth, base, correction):
            return np.abs(truth[:, h, 0] - base[:, h, 0] - w * correction[:, h, 0]).mean()

        errors = [mae(w, truth_all, base_all, correction_all) for w in SHRINKAGE_GRID]
        allowed = [w for w in SHRINKAGE_GRID if all(mae(w, *part) <= mae(0.0, *part) for part in per_origin)]
        assert weights[h, 0] == min(allowed, key=lambda w: (mae(w, truth_all, base_all, correction_all), w))
        pooled_only.append(SHRINKAGE_GRID[int(np.argmin(errors))])
    assert weights[0, 0] > 0.5  # the correction helps at lead 1, on every block
    assert weights[2, 0] == 0.0 and pooled_only[2] > 0.5  # at lead 3 it wins pooled but loses on the first block
    np.testing.assert_allclose(scores["shrunk"], np.abs(truth_all - base_all - weights * correction_all).mean())
    np.testing.assert_allclose(scores["base"], np.abs(truth_all - base_all).mean())


def test_rolling_origin_rows_are_none_when_a_block_cannot_hold_its_gap():
    assert rolling_origin_rows(np.array([0, 4, 8, 12, 16]), 2, 5) == []
    assert rolling_origin_rows(np.zeros(0, int), 3, 2) == []  # no cross-fitting blocks
    assert len(rolling_origin_rows(np.array([0, 10, 20, 30, 40]), 5, 2)) == 2  # at most blocks - 2 origins


def test_describe_shrinkage_names_the_leads_the_correction_kept_shrank_and_dropped():
    weights = np.array([1.0, 1.0, 0.5, 0.25, 0.0, 0.0, 1.0])[:, None]
    assert describe_shrinkage(weights, ["demand"]) == (
        "correction kept at leads 1-2, shrunk at leads 3-4 (w 0.25-0.5), dropped at leads 5-6, kept at lead 7")
    two = np.stack([np.ones(3), [0.0, 0.3, 0.0]], axis=1)
    assert describe_shrinkage(two, ["a", "b"]) == ("a: correction kept at leads 1-3; "
                                                   "b: correction dropped at lead 1, shrunk at lead 2 (w 0.3), "
                                                   "dropped at lead 3")
