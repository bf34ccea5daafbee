import collections
import random

import numpy as np
import pytest
import tensorflow as tf
from sklearn.linear_model import Ridge
from statsmodels.tsa.holtwinters import ExponentialSmoothing

from seqapps.baselines import (NULL, RIDGE_ALPHAS, BaseRidge, LexicalTranslator, Moments, fit_ridge, fit_window_ridge,
                               holt_winters)
from seqapps.data.text import Vocabulary

# The moments path (float64 x'x, an eigendecomposition) and scikit-learn's (float64 Cholesky on the
# centred rows) solve the same equations in a different order: on these well-conditioned problems
# (condition number < 1e3) they agree to ~1e-13; 1e-9 leaves room for other BLAS builds.
TOLERANCE = {"rtol": 1e-9, "atol": 1e-9}


def batches_of(x, y, size):
    """``fit_ridge``'s batches over NumPy rows, ``size`` rows at a time (the last batch shorter)."""
    return lambda first: ((x[i: i + size], y[i: i + size]) for i in range(first, len(x), size))


def problem(rng, rows, features, outputs):
    """Features off-centre (so the intercept matters) and noisy linear targets."""
    x = rng.normal(size=(rows, features)) + rng.normal(scale=3.0, size=features)
    y = x @ rng.normal(scale=0.3, size=(features, outputs)) + 10.0 + rng.normal(scale=2.0, size=(rows, outputs))
    return x, y


def test_fit_ridge_picks_the_best_validation_alpha_then_refits_on_train_and_val():
    x, y = problem(np.random.default_rng(1), 120, 5, 3)
    train_x, val_x, train_y, val_y = x[:80], x[80:], y[:80], y[80:]
    alphas = (0.01, 1.0, 100.0, 10_000.0)
    fit = fit_ridge(batches_of(x, y, 7), 80, 40, alphas)  # batches straddle the train/val boundary
    # Brute force with scikit-learn: the validation MAE of each alpha fitted on train alone.
    val_maes = {a: np.mean(np.abs(Ridge(alpha=a).fit(train_x, train_y).predict(val_x) - val_y)) for a in alphas}
    assert fit.alpha == min(val_maes, key=val_maes.get) and fit.alpha not in (alphas[0], alphas[-1])
    assert fit.val_mae == pytest.approx(val_maes[fit.alpha], rel=1e-9)
    for rows, mine in ((slice(0, 80), fit.train), (slice(None), fit)):
        reference = Ridge(alpha=fit.alpha).fit(x[rows], y[rows])
        np.testing.assert_allclose(mine.coef, reference.coef_.T, **TOLERANCE)
        np.testing.assert_allclose(mine.intercept, reference.intercept_, **TOLERANCE)
    new = np.random.default_rng(1).normal(size=(7, 5))
    np.testing.assert_allclose(fit.predict(new), Ridge(alpha=fit.alpha).fit(x, y).predict(new), **TOLERANCE)
    assert fit.folds == [] and len(fit.edges) == 0


def test_moments_of_a_union_or_a_difference_are_those_of_its_rows():
    x, y = problem(np.random.default_rng(3), 60, 4, 2)
    whole, head, tail = Moments.of(x, y), Moments.of(x[:25], y[:25]), Moments.of(x[25:], y[25:])
    for found, rows in ((head + tail, slice(None)), (whole - head, slice(25, None)), (whole - tail, slice(0, 25))):
        expected = Moments.of(x[rows], y[rows])
        assert found.count == expected.count
        for name in ("mean_x", "mean_y", "xx", "xy"):
            np.testing.assert_allclose(getattr(found, name), getattr(expected, name), **TOLERANCE)


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
    targets = np.zeros((len(origins), horizon, 2))  # written in place into one target of a [N, horizon, 2] array
    holt_winters(series, fit_end, origins, horizon, 24, out=targets[..., 1])
    np.testing.assert_array_equal(targets, np.stack([np.zeros_like(forecast), forecast], axis=-1))


def test_fit_ridge_keeps_the_shape_of_a_single_output():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(40, 3)), rng.normal(size=(40, 1))
    fit = fit_ridge(batches_of(x, y, 16), 30, 10)
    assert fit.coef.shape == (3, 1) and fit.train.predict(x).shape == (40, 1) and fit.predict(x).shape == (40, 1)


def test_cross_fitting_blocks_come_from_fits_that_left_the_block_and_its_neighbours_out():
    x, y = problem(np.random.default_rng(2), 50, 4, 2)
    fit = fit_ridge(batches_of(x, y, 8), 40, 10, alphas=(0.5,), folds=3, gap=2)
    np.testing.assert_array_equal(fit.edges, [0, 17, 33, 50])
    np.testing.assert_array_equal(fit.blocks(np.array([0, 16, 17, 49])), [0, 0, 1, 2])
    # Brute force: blocks [0, 17), [17, 33), [33, 50); each fit skips the block and 2 rows either side.
    forecast = np.empty_like(y)
    for fold, (start, stop) in zip(fit.folds, [(0, 17), (17, 33), (33, 50)]):
        kept = [i for i in range(50) if i < start - 2 or i >= stop + 2]
        reference = Ridge(alpha=0.5).fit(x[kept], y[kept])
        np.testing.assert_allclose(fold.coef, reference.coef_.T, **TOLERANCE)
        np.testing.assert_allclose(fold.intercept, reference.intercept_, **TOLERANCE)
        forecast[start:stop] = fold.predict(x[start:stop])
        np.testing.assert_allclose(forecast[start:stop], reference.predict(x[start:stop]), **TOLERANCE)
    changed = y.copy()
    changed[18] += 1e3  # a target inside the second block (and within the gap of the first) moves neither
    moved = fit_ridge(batches_of(x, changed, 8), 40, 10, alphas=(0.5,), folds=3, gap=2)
    for k in (0, 1):
        np.testing.assert_allclose(moved.folds[k].predict(x), fit.folds[k].predict(x), **TOLERANCE)


def test_fit_ridge_rejects_batches_of_the_wrong_length_and_blocks_that_leave_nothing_to_fit():
    x, y = problem(np.random.default_rng(4), 30, 2, 1)
    with pytest.raises(ValueError, match="the batches hold 30 rows, expected 31"):
        fit_ridge(batches_of(x, y, 8), 20, 11)
    with pytest.raises(ValueError, match="cross-fitting block 1 of 2 and its gaps of 15 rows cover all 30 rows"):
        fit_ridge(batches_of(x, y, 8), 20, 10, folds=2, gap=15)


def _ibm1_reference(sources, targets, iterations):
    """IBM Model 1 EM written as the textbook's nested loops (Koehn 2010, fig. 4.3), with a NULL word."""
    target_vocab = {word for sentence in targets for word in sentence}
    t = collections.defaultdict(lambda: 1.0 / len(target_vocab))
    for _ in range(iterations):
        count, total = collections.defaultdict(float), collections.defaultdict(float)
        for source, target in zip(sources, targets):
            source = [NULL, *source]
            for f in target:
                norm = sum(t[(f, e)] for e in source)
                for e in source:
                    count[(f, e)] += t[(f, e)] / norm
                    total[e] += t[(f, e)] / norm
        t = collections.defaultdict(float, {(f, e): c / total[e] for (f, e), c in count.items()})
    best = {}
    for (f, e), p in sorted(t.items()):
        if e != NULL and p > best.get(e, ("", -1.0))[1]:
            best[e] = (f, p)
    return {e: f for e, (f, _) in best.items()}


def test_ibm1_learns_the_textbook_example():
    # Koehn (2010) section 4.2: "das Haus", "das Buch", "ein Buch"; EM links each word to its translation.
    translator = LexicalTranslator.fit([["the", "house"], ["the", "book"], ["a", "book"]],
                                       [["das", "haus"], ["das", "buch"], ["ein", "buch"]], iterations=10)
    assert translator.table == {"the": "das", "house": "haus", "book": "buch", "a": "ein"}
    assert translator.translate(["a", "house", "moses"]) == ["ein", "haus", "moses"]  # unseen words are copied


def test_ibm1_lexicon_table_gives_vocabulary_ids_with_unknown_targets_merged():
    translator = LexicalTranslator.fit([["the", "house"], ["the", "book"], ["a", "book"]],
                                       [["das", "haus"], ["das", "buch"], ["ein", "buch"]], iterations=10, top_k=3)
    t = {word: dict(found) for word, found in translator.translations.items()}
    source_vocab = Vocabulary(["<unk>", "</s>", "<s>", "the", "house", "book"], [0] * 6)  # "a" is unknown
    target_vocab = Vocabulary(["<unk>", "</s>", "<s>", "das", "buch"], [0] * 5)  # "haus", "ein" are unknown
    ids, probs = translator.lexicon(source_vocab, target_vocab, top_k=2)
    assert ids.shape == probs.shape == (6, 2) and not probs[:3].any()  # no translations of the special tokens
    assert ids[4].tolist() == [0, 3]  # house: haus (as <unk>), then das; it never met "buch"
    np.testing.assert_allclose(probs[4], [t["house"]["haus"], t["house"]["das"]], rtol=1e-6)
    assert ids[5, 0] == 4 and probs[5, 0] == pytest.approx(t["book"]["buch"], rel=1e-6)
    assert probs[5, 1] == pytest.approx(max(t["book"]["ein"], t["book"]["das"]), rel=1e-6)


def test_ibm1_matches_the_nested_loop_reference_on_random_pairs():
    rng = random.Random(0)
    sources = [[f"s{rng.randrange(12)}" for _ in range(rng.randint(1, 6))] for _ in range(60)]
    targets = [[f"t{rng.randrange(15)}" for _ in range(rng.randint(1, 6))] for _ in range(60)]
    assert LexicalTranslator.fit(sources, targets, iterations=4).table == _ibm1_reference(sources, targets, 4)


def test_the_out_of_fold_shift_is_the_full_fit_minus_the_fit_that_left_each_row_s_block_out():
    x, y = problem(np.random.default_rng(5), 50, 4, 2)
    fit = fit_ridge(batches_of(x, y, 8), 40, 10, alphas=(0.5,), folds=3, gap=2)
    blocks = fit.blocks(np.arange(50))
    expected = np.stack([fit.predict(x[i: i + 1])[0] - fit.folds[k].predict(x[i: i + 1])[0]
                         for i, k in enumerate(blocks)])
    np.testing.assert_allclose(fit.out_of_fold_shift(x, blocks), expected, **TOLERANCE)
    graph = tf.function(lambda features, keys: fit.out_of_fold_shift(features, keys))  # as a tf.data map runs it
    np.testing.assert_allclose(graph(tf.constant(x, tf.float32), tf.constant(blocks)).numpy(),
                               fit.out_of_fold_shift(x.astype("float32"), blocks), **TOLERANCE)


def test_the_per_block_shift_equals_every_block_s_fit_then_the_row_s_one_gathered():
    # The previous formula: all K block fits for every row, then the row's own block picked out.
    x, y = problem(np.random.default_rng(8), 120, 6, 4)
    fit = fit_ridge(batches_of(x, y, 16), 90, 30, alphas=(0.5,), folds=5, gap=3)
    coef = np.stack([fit.coef - fold.coef for fold in fit.folds], axis=1)  # [F, folds, outputs]
    intercept = np.stack([fit.intercept - fold.intercept for fold in fit.folds])
    every = (x @ coef.reshape(len(coef), -1)).reshape(len(x), *intercept.shape) + intercept
    # Rows out of order, as a shuffled batch may hold them, and block 0 absent, as in most batches.
    rows = np.random.default_rng(9).permutation(np.flatnonzero(fit.blocks(np.arange(120)) > 0))
    blocks = fit.blocks(rows)
    expected = every[rows][np.arange(len(rows)), blocks]
    # Both sum the same 6 float64 products per value, perhaps in another order: round-off of a few
    # ulps of the products' magnitude (about 10 here), far below 1e-12 relative.
    found = fit.out_of_fold_shift(x[rows], blocks)
    np.testing.assert_allclose(np.asarray(found), expected, rtol=1e-12, atol=1e-12)
    graph = tf.function(lambda features, keys: fit.out_of_fold_shift(features, keys))  # as a tf.data map runs it
    np.testing.assert_allclose(graph(tf.constant(x[rows]), tf.constant(blocks)).numpy(), expected,
                               rtol=1e-12, atol=1e-12)


def test_base_ridge_fits_the_standardised_truth_minus_the_base_and_forecasts_in_user_units():
    rng = np.random.default_rng(6)
    rows, horizon, targets = 90, 3, 2
    features, base = rng.normal(size=(rows, 4)), rng.normal(size=(rows, horizon * targets))
    mean, std = np.array([100.0, 90.0]), np.array([5.0, 4.0])
    scaled = features @ rng.normal(size=(4, horizon * targets)) + rng.normal(scale=0.5, size=base.shape)
    truth = (scaled + base).reshape(rows, horizon, targets) * std + mean  # what the ridge should find again

    def windows(origins):  # batches of 16 windows; a window's "inputs" are its index
        return ((origins[i: i + 16], truth[origins[i: i + 16]]) for i in range(0, len(origins), 16))

    ridge = BaseRidge.fitted(lambda index: (features[index], base[index]), windows, np.arange(80), 60, mean, std)
    # Brute force with scikit-learn: the penalty by validation MAE of fits on the 60 training windows, then
    # the fit on all 80 of the standardised truth minus the base.
    residual = ((truth - mean) / std).reshape(rows, -1) - base
    val_mae = {a: np.abs(Ridge(alpha=a).fit(features[:60], residual[:60]).predict(features[60:80])
                         - residual[60:80]).mean() for a in RIDGE_ALPHAS}
    assert ridge.fit.alpha == min(val_mae, key=val_mae.get)
    full, train_only = (Ridge(alpha=ridge.fit.alpha).fit(features[:n], residual[:n]) for n in (80, 60))
    test = np.arange(80, 90)
    expected = (full.predict(features[test]) + base[test]).reshape(-1, horizon, targets) * std + mean
    # float32 results (a long test split holds millions of values): 1e-6 relative of values near 100.
    np.testing.assert_allclose(ridge.forecast(test), expected, rtol=1e-6)
    shift = (train_only.predict(features[test]) - full.predict(features[test])).reshape(-1, horizon, targets) * std
    np.testing.assert_allclose(ridge.train_only_shift(test), shift, rtol=1e-6, atol=1e-6)


def test_fit_window_ridge_fits_the_extractor_s_features_and_shifts_targets_to_out_of_fold_residuals():
    import keras

    rng = np.random.default_rng(7)
    rows, horizon, targets, blocks = 100, 2, 1, 3
    # float32 inputs, as the extractor's graph gives them: the brute force reads the same values in float64.
    x = rng.normal(size=(rows, 3)).astype("float32")
    base = rng.normal(size=(rows, horizon * targets)).astype("float32")
    mean, std = np.array([50.0]), np.array([2.0])
    scaled = x @ rng.normal(size=(3, horizon * targets)) + rng.normal(scale=0.3, size=base.shape)
    truth = (scaled + base).reshape(rows, horizon, targets) * std + mean
    inputs = {"x": keras.Input((3,), name="x"), "base": keras.Input((horizon * targets,), name="base")}
    extractor = keras.Model(inputs, [keras.layers.Identity()(inputs["x"]), keras.layers.Identity()(inputs["base"])])

    def windows(origins):
        return (({"x": x[origins[i: i + 16]], "base": base[origins[i: i + 16]]}, truth[origins[i: i + 16]])
                for i in range(0, len(origins), 16))

    origins = {"train": np.arange(60), "val": np.arange(60, 80), "test": np.arange(80, 100)}
    found = fit_window_ridge(extractor, windows, origins, mean, std, folds=blocks, horizon=horizon)
    features, residual = x.astype("float64"), ((truth - mean) / std).reshape(rows, -1) - base
    alpha = found["ridge"].alpha
    full, train_only = (Ridge(alpha=alpha).fit(features[:n], residual[:n]) for n in (80, 60))
    shape = (-1, horizon, targets)
    test = origins["test"]
    # float32 outputs (a long test split holds millions of values): 1e-6 relative of values near 50.
    np.testing.assert_allclose(found["ridge_forecast"],
                               (full.predict(features[test]) + base[test]).reshape(shape) * std + mean, rtol=1e-6)
    val = origins["val"]
    np.testing.assert_allclose(found["ridge_val_shift"],
                               (train_only.predict(features[val]) - full.predict(features[val])).reshape(shape) * std,
                               rtol=1e-6, atol=1e-6)
    # Brute force: each block's fit leaves the block and `horizon` windows either side out.
    out_of_fold = np.empty((80, horizon * targets))
    edges = np.linspace(0, 80, blocks + 1).round().astype(int)
    for start, stop in zip(edges[:-1], edges[1:]):
        kept = np.r_[0:max(start - horizon, 0), min(stop + horizon, 80):80]
        out_of_fold[start:stop] = Ridge(alpha=alpha).fit(features[kept], residual[kept]).predict(features[start:stop])
    batch = {"x": x[:80], "base": base[:80]}
    shift = found["ridge_target_shift"](batch, found["ridge"].blocks(np.arange(80)))
    np.testing.assert_allclose(np.asarray(shift), (full.predict(features[:80]) - out_of_fold).reshape(shape) * std,
                               **TOLERANCE)
    assert "ridge_target_shift" not in fit_window_ridge(extractor, windows, origins, mean, std, folds=0,
                                                        horizon=horizon)
