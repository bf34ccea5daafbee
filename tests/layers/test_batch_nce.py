"""Tests of the B-NCE output layer against a NumPy version of Oualil & Klakow (2017).

Tolerances: the layer computes in float32 and the references in float64. The
scores are kept within a few units of 0 (biases near log Z), so every
intermediate is O(1) and float32 round-off (eps 1.2e-7) accumulated over H=8
products and B+K=10 columns stays below 1e-5 relative; we use rtol=1e-4 and an
atol of 1e-6 for entries that are exactly or nearly 0.
"""
from __future__ import annotations

import os
import tempfile

import keras
import numpy as np
import pytest
import tensorflow as tf

from seqapps import serializable
from seqapps.layers.batch_nce import (
    BatchNCE,
    batch_nce_loss,
    batch_nce_loss_from_scores,
    distinct_batch_nce_loss,
    noise_ids_from_uniform,
    sampled_nce_loss,
    unigram_distribution,
)
from seqapps.layers.lexicon import lexical_mixture
from seqapps.metrics import perplexity
from tests.layers.harness import run_layer_test

V, H, LOG_Z = 12, 8, 9.0
RTOL, ATOL = 1e-4, 1e-6


@keras.saving.register_keras_serializable(package="seqapps_tests")
def identity_loss(y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
    """The layer's output is already the per-example loss."""
    del y_true
    return y_pred


def make_problem(seed: int = 0) -> dict[str, np.ndarray]:
    """Random hidden states, weights near log Z, and a strictly positive unigram."""
    rng = np.random.RandomState(seed)
    return {
        "hidden": rng.normal(0.0, 0.5, (6, H)).astype("float32"),
        "kernel": rng.normal(0.0, 0.5, (V, H)).astype("float32"),
        "bias": rng.normal(LOG_Z - 1.0, 1.0, V).astype("float32"),
        "noise_probs": unigram_distribution(rng.randint(0, 50, V), smoothing=1.0).astype("float32"),
    }


def numpy_bnce(hidden, kernel, bias, targets, noise_probs, extra=None, remove_hits=False):
    """The paper's equations in float64: loss per row, G, E(L) = dL/dL, dW and dC."""
    hidden, kernel, bias, noise_probs = (np.asarray(a, "float64") for a in (hidden, kernel, bias, noise_probs))
    columns = np.asarray(targets) if extra is None else np.concatenate([targets, extra])
    w_t, c_t, n = kernel[columns], bias[columns], noise_probs[columns]
    scores = hidden @ w_t.T + c_t - LOG_Z
    batch, width = scores.shape
    k = width - 1
    o = np.exp(scores)
    y = o + k * n[None, :]
    eye = np.eye(batch, width, dtype=bool)
    g = o / y
    g[eye] = -k * n[:batch] / np.diagonal(y)
    keep = ~eye
    if remove_hits:
        keep &= np.asarray(targets)[:, None] != columns[None, :]
    g[~eye & ~keep] = 0.0
    loss = -np.log(np.diagonal(o) / np.diagonal(y)) - np.sum(np.where(keep, np.log(k * n[None, :] / y), 0.0), axis=1)
    d_kernel = np.zeros_like(kernel)
    np.add.at(d_kernel, columns, g.T @ hidden)
    d_bias = np.zeros_like(bias)
    np.add.at(d_bias, columns, g.sum(axis=0))
    return {"loss": loss, "G": g, "scores": scores, "d_hidden": g @ w_t, "d_kernel": d_kernel, "d_bias": d_bias}


def tf_grads(loss_fn, problem):
    """Per-row loss and the gradients of its sum w.r.t. hidden, kernel and bias."""
    hidden = tf.Variable(problem["hidden"])
    kernel = tf.Variable(problem["kernel"])
    bias = tf.Variable(problem["bias"])
    with tf.GradientTape() as tape:
        loss = loss_fn(hidden, kernel, bias)
        total = tf.reduce_sum(loss)
    d_hidden, d_kernel, d_bias = tape.gradient(total, [hidden, kernel, bias])
    return loss, d_hidden, d_kernel, d_bias


@pytest.mark.parametrize(
    "targets, extra",
    [
        pytest.param([0, 3, 5, 7, 9, 11], None, id="plain"),
        pytest.param([2, 4, 2, 6, 4, 2], None, id="duplicates"),
        pytest.param([1, 3, 5, 3, 8, 10], [3, 0, 0, 11], id="extra-noise-with-hits"),
    ],
)
@pytest.mark.parametrize("remove_hits", [False, True])
@pytest.mark.parametrize("loss_fn", [batch_nce_loss, distinct_batch_nce_loss], ids=["columns", "distinct-words"])
def test_batch_nce_loss_matches_paper_equations(targets, extra, remove_hits, loss_fn):
    """Both forms, the batch's columns (N x M) and its distinct words (R x U), against the paper's equations."""
    problem = make_problem()
    targets = np.asarray(targets, "int32")
    extra_ids = None if extra is None else np.asarray(extra, "int32")
    ref = numpy_bnce(
        problem["hidden"], problem["kernel"], problem["bias"], targets, problem["noise_probs"], extra_ids, remove_hits
    )
    noise = problem["noise_probs"]
    options = {"remove_accidental_hits": True} if remove_hits else {}  # default: the paper's, duplicates are noise
    loss, d_hidden, d_kernel, d_bias = tf_grads(
        lambda h, w, c: loss_fn(h, w, c, targets, noise, log_z=LOG_Z, extra_noise_ids=extra_ids, **options),
        problem,
    )
    assert isinstance(d_kernel, tf.IndexedSlices) and isinstance(d_bias, tf.IndexedSlices)
    np.testing.assert_allclose(loss.numpy(), ref["loss"], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(d_hidden.numpy(), ref["d_hidden"], rtol=RTOL, atol=ATOL)
    # Converting IndexedSlices to dense sums the rows of duplicated words.
    np.testing.assert_allclose(tf.convert_to_tensor(d_kernel).numpy(), ref["d_kernel"], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(tf.convert_to_tensor(d_bias).numpy(), ref["d_bias"], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("remove_hits", [True, False])
def test_gradient_wrt_scores_is_matrix_g(remove_hits):
    problem = make_problem(1)
    targets = np.array([2, 4, 2, 6, 4, 2], "int32")
    extra = np.array([2, 9], "int32")
    ref = numpy_bnce(
        problem["hidden"], problem["kernel"], problem["bias"], targets, problem["noise_probs"], extra, remove_hits
    )
    columns = np.concatenate([targets, extra])
    hits = (targets[:, None] == columns[None, :]) & ~np.eye(6, 8, dtype=bool)
    scores = tf.Variable(ref["scores"].astype("float32"))
    with tf.GradientTape() as tape:
        loss = batch_nce_loss_from_scores(
            scores, problem["noise_probs"][columns], tf.constant(hits) if remove_hits else None
        )
        total = tf.reduce_sum(loss)
    np.testing.assert_allclose(loss.numpy(), ref["loss"], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(tape.gradient(total, scores).numpy(), ref["G"], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("remove_hits", [False, True])
def test_sampled_nce_loss_matches_numpy(remove_hits):
    problem = make_problem(2)
    targets = np.array([0, 3, 5, 3, 8, 10], "int32")
    noise = np.array([3, 1, 1, 7], "int32")
    options = {"remove_accidental_hits": True} if remove_hits else {}
    loss, _, d_kernel, _ = tf_grads(
        lambda h, w, c: sampled_nce_loss(h, w, c, targets, problem["noise_probs"], noise, log_z=LOG_Z, **options),
        problem,
    )
    assert isinstance(d_kernel, tf.IndexedSlices)
    hidden, kernel, bias, probs = (problem[k].astype("float64") for k in ("hidden", "kernel", "bias", "noise_probs"))

    def logit(ids):
        return hidden @ kernel[ids].T + bias[ids] - LOG_Z - np.log(len(noise) * probs[ids])

    softplus = lambda x: np.log1p(np.exp(x))  # noqa: E731
    hits = (targets[:, None] == noise[None, :]) & remove_hits
    negative = np.where(hits, 0.0, softplus(logit(noise)))
    expected = softplus(-np.diagonal(logit(targets))) + negative.sum(axis=1)
    np.testing.assert_allclose(loss.numpy(), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("loss", ["bnce", "snce"])
def test_kernel_gradient_is_indexed_slices_under_xla(loss):
    layer = BatchNCE(V, loss=loss, num_noise=5, seed=3)
    problem = make_problem(3)
    targets = np.array([0, 3, 5, 3, 8, 10], "int32")
    layer([problem["hidden"], targets])
    gradient_types = []

    @tf.function(jit_compile=True)
    def step(hidden, ids):
        with tf.GradientTape() as tape:
            total = tf.reduce_sum(layer([hidden, ids], training=True))
        gradients = tape.gradient(total, layer.trainable_variables)
        gradient_types.extend(type(g) for g in gradients)
        return total, tf.convert_to_tensor(gradients[0])

    total, d_kernel = step(problem["hidden"], targets)
    assert gradient_types == [tf.IndexedSlices, tf.IndexedSlices]
    assert np.isfinite(total.numpy()) and np.any(d_kernel.numpy() != 0)


def test_jit_compile_gives_the_same_loss():
    problem = make_problem(4)
    targets = np.array([2, 4, 2, 6, 4, 2], "int32")
    extra = np.array([2, 9, 11], "int32")
    args = (problem["hidden"], problem["kernel"], problem["bias"], targets, problem["noise_probs"])
    eager = batch_nce_loss(*args, extra_noise_ids=extra)
    compiled = tf.function(lambda *a: batch_nce_loss(*a, extra_noise_ids=extra), jit_compile=True)(*args)
    # Same float32 ops, only fused differently by XLA.
    np.testing.assert_allclose(compiled.numpy(), eager.numpy(), rtol=1e-5, atol=ATOL)


@pytest.mark.parametrize(
    "init_kwargs",
    [
        pytest.param({"loss": "bnce"}, id="bnce"),
        pytest.param({"loss": "bnce", "extra_noise": 4}, id="adaptive-bnce"),
        pytest.param({"loss": "bnce", "extra_noise": 4, "compact_batch": True}, id="adaptive-bnce-distinct"),
        pytest.param({"loss": "snce", "num_noise": 5}, id="snce"),
        pytest.param({"loss": "softmax"}, id="softmax"),
    ],
)
def test_layer_harness(init_kwargs):
    problem = make_problem(5)
    noise = [float(p) for p in problem["noise_probs"].astype("float64") / problem["noise_probs"].sum()]
    targets = np.array([0, 3, 5, 3, 8, 10], "int32")
    run_layer_test(
        BatchNCE,
        {"vocab_size": V, "noise_distribution": noise, "seed": 7, **init_kwargs},
        [problem["hidden"], targets],
        expected_output_shape=(6,),
        expected_num_trainable_weights=2,  # the output embedding and the bias
        expected_num_non_trainable_weights=2,  # the noise distribution and its CDF
        other_input_data=[problem["hidden"][:4], targets[:4]],
        training_loss=identity_loss,
        atol=1e-5,
    )


def test_sequence_inputs_and_noise_distribution_survive_save():
    probs = unigram_distribution(np.arange(V), smoothing=1.0)
    hidden_in = keras.Input((4, H))
    targets_in = keras.Input((4,), dtype="int32")
    layer = BatchNCE(V, extra_noise=3, seed=1)
    model = keras.Model([hidden_in, targets_in], layer([hidden_in, targets_in]))
    layer.set_noise_distribution(probs)
    hidden = np.random.RandomState(6).normal(size=(2, 4, H)).astype("float32")
    targets = np.random.RandomState(6).randint(0, V, (2, 4)).astype("int32")
    assert tuple(layer([hidden, targets], training=True).shape) == (2, 4)
    assert tuple(layer(hidden).shape) == (2, 4, V)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.keras")
        model.save(path)
        reloaded = serializable.load_model(path)
    np.testing.assert_allclose(reloaded.layers[-1].noise_probs.numpy(), probs, rtol=1e-6)
    np.testing.assert_allclose(reloaded.predict([hidden, targets], verbose=0), model([hidden, targets]), atol=1e-5)


def test_full_and_self_normalized_log_probs_and_perplexity():
    problem = make_problem(7)
    layer = BatchNCE(V, log_z=LOG_Z)
    hidden, targets = problem["hidden"], np.array([1, 2, 3, 4, 5, 6], "int32")
    layer([hidden, targets])
    layer.set_weights([problem["kernel"], problem["bias"], *layer.get_weights()[2:]])
    logits = hidden.astype("float64") @ problem["kernel"].T.astype("float64") + problem["bias"]
    full = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    self_norm = logits - LOG_Z
    rows = np.arange(6)

    log_probs = layer.target_log_probs(hidden, targets)
    np.testing.assert_allclose(log_probs["full"].numpy(), full[rows, targets], rtol=RTOL, atol=1e-5)
    np.testing.assert_allclose(log_probs["self_normalized"].numpy(), self_norm[rows, targets], rtol=RTOL, atol=1e-5)
    np.testing.assert_allclose(layer(hidden).numpy(), full, rtol=RTOL, atol=1e-5)
    np.testing.assert_allclose(layer(hidden, self_normalized=True).numpy(), self_norm, rtol=RTOL, atol=1e-5)
    np.testing.assert_allclose(layer([hidden, targets]).numpy(), -full[rows, targets], rtol=RTOL, atol=1e-5)
    np.testing.assert_allclose(perplexity(log_probs["full"]), np.exp(-full[rows, targets].mean()), rtol=RTOL)
    mask = np.array([1, 1, 1, 0, 0, 1], "float32")
    expected_n = np.exp(-(self_norm[rows, targets] * mask).sum() / mask.sum())
    np.testing.assert_allclose(perplexity(log_probs["self_normalized"], mask), expected_n, rtol=RTOL)


def test_noise_sampler_follows_the_distribution():
    probs = np.array([0.5, 0.25, 0.125, 0.125])
    uniform = tf.random.stateless_uniform([20_000], seed=[1, 2])
    ids = noise_ids_from_uniform(np.cumsum(probs).astype("float32"), uniform).numpy()
    # 20k draws: the standard error of each frequency is below 0.004, so 0.02 is > 5 sigma.
    np.testing.assert_allclose(np.bincount(ids, minlength=4) / ids.size, probs, atol=0.02)
    # The unrolled binary search equals NumPy's search, for any V (here not a power of 2).
    cdf = np.cumsum(make_problem(9)["noise_probs"]).astype("float32")
    draws = tf.random.stateless_uniform([500], seed=[3, 4])
    expected = np.minimum(np.searchsorted(cdf, draws.numpy() * cdf[-1], side="right"), V - 1)
    np.testing.assert_array_equal(noise_ids_from_uniform(cdf, draws).numpy(), expected)


def test_bad_inputs_raise_clear_errors():
    problem = make_problem(8)
    hidden = problem["hidden"]
    with pytest.raises(ValueError, match="`loss`.*'nce'"):
        BatchNCE(V, loss="nce")
    with pytest.raises(ValueError, match="`noise_probs` must sum to 1"):
        BatchNCE(V, noise_distribution=[0.5 / V] * V)
    layer = BatchNCE(V)
    layer([hidden, np.zeros(6, "int32")])
    with pytest.raises(ValueError, match="`noise_probs` must be finite and > 0"):
        layer.set_noise_distribution([0.0] + [1.0 / (V - 1)] * (V - 1))
    with pytest.raises(tf.errors.InvalidArgumentError, match="`targets` must be < vocab_size"):
        layer([hidden, np.array([0, 1, 2, 3, 4, V], "int32")], training=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match="`targets` must be >= 0"):
        batch_nce_loss(hidden, problem["kernel"], problem["bias"], [0, 1, -1, 3, 4, 5], problem["noise_probs"])
    with pytest.raises(ValueError, match="extra_noise"):
        layer([hidden[:1], np.array([3], "int32")], training=True)
    bad_probs = problem["noise_probs"] * 2
    with pytest.raises(ValueError, match="`noise_probs` must sum to 1"):
        batch_nce_loss(hidden, problem["kernel"], problem["bias"], [0, 1, 2, 3, 4, 5], bad_probs)
    adaptive = BatchNCE(V, extra_noise=4, seed=0)
    assert np.isfinite(adaptive([hidden[:1], np.array([3], "int32")], training=True).numpy()).all()


@pytest.mark.parametrize("scope", ["time_step", "batch"])
def test_noise_scope_of_sequences(scope):
    """time_step: each step's B targets are one B-NCE batch (the paper's); batch: all B x T pooled."""
    problem = make_problem(3)
    rng = np.random.RandomState(3)
    hidden = rng.normal(0.0, 0.5, (3, 4, H)).astype("float32")  # B=3 sequences, T=4 steps
    targets = rng.randint(0, V, (3, 4)).astype("int32")
    layer = BatchNCE(V, log_z=LOG_Z, noise_scope=scope)
    layer([hidden, targets])
    layer.set_weights([problem["kernel"], problem["bias"], *layer.get_weights()[2:]])
    noise = layer.noise_probs.numpy()
    loss = layer([hidden, targets], training=True).numpy()
    assert loss.shape == (3, 4)
    if scope == "time_step":
        steps = [numpy_bnce(hidden[:, t], problem["kernel"], problem["bias"], targets[:, t], noise) for t in range(4)]
        expected = np.stack([step["loss"] for step in steps], axis=1)
    else:
        flat = numpy_bnce(hidden.reshape(12, H), problem["kernel"], problem["bias"], targets.reshape(12), noise)
        expected = flat["loss"].reshape(3, 4)
    np.testing.assert_allclose(loss, expected, rtol=RTOL, atol=ATOL)
    adaptive = BatchNCE(V, log_z=LOG_Z, noise_scope=scope, extra_noise=2, seed=0)
    assert adaptive([hidden, targets], training=True).shape == (3, 4)
    with pytest.raises(ValueError, match="noise_scope='window'"):
        BatchNCE(V, noise_scope="window")


@pytest.mark.parametrize("extra_noise", [0, 2])
@pytest.mark.parametrize("scope, distinct", [("time_step", False), ("batch", False), ("batch", True)],
                         ids=["time_step", "batch", "batch-distinct-words"])
def test_padding_is_never_noise(scope, distinct, extra_noise):
    """A padded [B, T] batch gives each real token the paper's loss over the batch with the padding removed.

    The reference drops the padded tokens before it forms the batch (each step's real targets, or all the
    real targets pooled), so K counts only real targets; a row's own word among the others' targets stays
    noise (the duplicates below). Padded tokens have loss 0 and the scores of padded columns get no gradient.
    """
    problem = make_problem(4)
    rng = np.random.RandomState(4)
    batch, steps = 4, 5
    hidden = rng.normal(0.0, 0.5, (batch, steps, H)).astype("float32")
    targets = rng.randint(0, V, (batch, steps)).astype("int32")
    targets[0, :3] = targets[1, :3] = 5  # duplicated words: each is still the other's noise
    lengths = np.array([5, 3, 1, 4])  # the last step has 1 real token
    mask = np.arange(steps)[None, :] < lengths[:, None]
    targets[~mask] = 1  # padded with a word id, as the translation data pads with END_ID
    layer = BatchNCE(V, log_z=LOG_Z, noise_scope=scope, extra_noise=extra_noise, compact_batch=distinct, seed=0)
    layer([hidden, targets])
    layer.set_weights([problem["kernel"], problem["bias"], *layer.get_weights()[2:]])
    noise = layer.noise_probs.numpy()
    if extra_noise:  # the same draws as the layer's: its seed generator's state put back after drawing
        state = layer.seed_generator.state.numpy()
        draws = layer.sample_noise((steps, extra_noise) if scope == "time_step" else extra_noise).numpy()
        layer.seed_generator.state.assign(state)
    hidden_var = tf.Variable(hidden)
    with tf.GradientTape() as tape:
        loss = layer([hidden_var, targets], training=True, target_mask=mask)
    d_hidden = tape.gradient(loss, hidden_var).numpy()
    expected = np.zeros((batch, steps))
    if scope == "time_step":
        for t in range(steps):
            real = mask[:, t]
            extra = draws[t] if extra_noise else None
            if real.sum() + extra_noise > 1:
                ref = numpy_bnce(hidden[real, t], problem["kernel"], problem["bias"], targets[real, t], noise, extra)
                expected[real, t] = ref["loss"]
    else:
        ref = numpy_bnce(hidden[mask], problem["kernel"], problem["bias"], targets[mask], noise,
                         draws if extra_noise else None)
        expected[mask] = ref["loss"]
    np.testing.assert_allclose(loss.numpy(), expected, rtol=RTOL, atol=ATOL)
    assert np.all(d_hidden[~mask] == 0.0), "a padded token was trained, as a positive or as noise"
    if scope == "time_step" and not extra_noise:
        assert loss.numpy()[0, 4] == 0.0  # the last step's one real token has no noise: nothing to learn
    # padding that becomes real changes the real tokens' losses: it was not noise before
    unmasked = layer([hidden, targets], training=True, target_mask=np.ones_like(mask)).numpy()
    assert not np.allclose(unmasked[mask], expected[mask])


def test_masked_columns_get_no_gradient_from_the_scores():
    """``batch_nce_loss_from_scores`` with a column mask: G is the unmasked batch's G, and 0 elsewhere."""
    problem = make_problem(5)
    targets = np.array([2, 4, 2, 6, 4, 2], "int32")
    keep = np.array([True, True, False, True, True, False])
    ref = numpy_bnce(problem["hidden"][keep], problem["kernel"], problem["bias"], targets[keep],
                     problem["noise_probs"])
    full = numpy_bnce(problem["hidden"], problem["kernel"], problem["bias"], targets, problem["noise_probs"])
    scores = tf.Variable(full["scores"].astype("float32"))
    with tf.GradientTape() as tape:
        loss = batch_nce_loss_from_scores(scores, problem["noise_probs"][targets], column_mask=keep)
        total = tf.reduce_sum(loss)
    g = tape.gradient(total, scores).numpy()
    np.testing.assert_allclose(loss.numpy()[keep], ref["loss"], rtol=RTOL, atol=ATOL)
    assert np.all(loss.numpy()[~keep] == 0.0)
    np.testing.assert_allclose(g[np.ix_(keep, keep)], ref["G"], rtol=RTOL, atol=ATOL)
    assert np.all(g[~keep, :] == 0.0) and np.all(g[:, ~keep] == 0.0)


@pytest.mark.parametrize("bias_kind", [None, "dense", "lexicon"])
@pytest.mark.parametrize("loss", ["softmax", "bnce"])
def test_compact_batch_gives_the_same_losses_and_gradients(loss, bias_kind):
    """``compact_batch`` drops the padded rows (and B-NCE's repeated columns) and changes no number.

    A padded [B, T] batch with duplicated words, under a dense per-row bias or a lexical mixture: the
    per-token losses and the gradients w.r.t. the hidden states, the output weights and the bias's
    input match the layer without it (float32 sums in another order: atol 1e-5).
    """
    rng = np.random.RandomState(6)
    batch, steps, source_steps = 3, 5, 4
    hidden = tf.Variable(rng.normal(0.0, 0.5, (batch, steps, H)).astype("float32"))
    targets = rng.randint(0, V, (batch, steps)).astype("int32")
    targets[0, :2] = targets[2, :2] = 4
    mask = np.arange(steps)[None, :] < np.array([[5], [2], [4]])
    bias_input = tf.Variable(rng.normal(0.0, 1.0, (batch, steps, V) if bias_kind == "dense"
                                        else (batch, steps, source_steps)).astype("float32"))
    table_ids = tf.constant(rng.randint(0, V, (6, 3)), tf.int32)
    table_probs = tf.constant(rng.dirichlet(np.ones(4), 6)[:, :3].astype("float32"))
    source_ids = tf.constant(rng.randint(0, 6, (batch, source_steps)), tf.int32)
    results = []
    for compact in (False, True):
        layer = BatchNCE(V, loss=loss, log_z=LOG_Z, noise_scope="batch", compact_batch=compact, seed=0)
        layer([hidden, targets])
        problem = make_problem(6)
        layer.set_weights([problem["kernel"], problem["bias"], problem["noise_probs"], np.cumsum(problem["noise_probs"])])
        with tf.GradientTape() as tape:
            if bias_kind == "dense":
                logit_bias = bias_input
            elif bias_kind == "lexicon":
                logit_bias = lexical_mixture(tf.nn.softmax(bias_input), source_ids, table_ids, table_probs, 1e-3)
            else:
                logit_bias = None
            per_token = layer([hidden, targets], training=True, target_mask=mask, logit_bias=logit_bias)
            total = tf.reduce_sum(per_token)
        grads = tape.gradient(total, [hidden, layer.kernel, layer.bias, bias_input])
        results.append([per_token.numpy()] + [None if g is None else tf.convert_to_tensor(g).numpy() for g in grads])
    assert np.all(results[1][0][~mask] == 0.0)
    for name, plain, compact in zip(("loss", "hidden", "kernel", "bias", "bias input"), *results):
        if plain is None:
            assert compact is None and (name == "bias input" and bias_kind is None), name
            continue
        np.testing.assert_allclose(compact, plain, rtol=RTOL, atol=1e-5, err_msg=name)
