"""Tests of the lexicon bias (seqapps.layers.lexicon) and of BatchNCE's ``logit_bias``, against NumPy."""
import numpy as np
import pytest
import tensorflow as tf

from seqapps.layers.batch_nce import BatchNCE, unigram_distribution
from seqapps.layers.lexicon import (LexiconBias, lexical_distribution, lexical_log_bias_at_columns,
                                    lexical_log_noise_mass, lexical_mixture)
from tests.layers.harness import run_layer_test

BATCH, STEPS, SOURCE, SOURCE_VOCAB, VOCAB, TOP_K, HIDDEN = 3, 4, 5, 7, 11, 3, 6
# float32 sums of at most SOURCE * TOP_K products of numbers in [0, 1]: round-off stays below 1e-6.
ATOL = 1e-6


def _problem(seed: int = 0) -> dict:
    """Attention rows summing to 1 (masked positions 0), source ids and a top-k table with rows summing to <= 1."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(BATCH, STEPS, SOURCE))
    logits[1, :, 3:] = -np.inf  # a shorter source
    attention = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    ids = np.stack([rng.choice(VOCAB, TOP_K, replace=False) for _ in range(SOURCE_VOCAB)]).astype("int32")
    probs = rng.dirichlet(np.ones(TOP_K + 1), SOURCE_VOCAB)[:, :TOP_K]  # a little mass left off the table
    probs[0] = 0.0  # a word without translations (like <unk>)
    return {"attention": attention.astype("float32"),
            "source_ids": rng.integers(0, SOURCE_VOCAB, (BATCH, SOURCE)).astype("int32"),
            "ids": ids, "probs": probs.astype("float32")}


def _numpy_lexical(problem: dict) -> np.ndarray:
    """sum_j attention[b, t, j] * p_lex(. | x_bj) with a dense [source vocabulary, V] table, in float64."""
    dense = np.zeros((SOURCE_VOCAB, VOCAB))
    for row in range(SOURCE_VOCAB):
        dense[row, problem["ids"][row]] += problem["probs"][row]
    return np.einsum("bts,bsv->btv", problem["attention"].astype("float64"), dense[problem["source_ids"]])


def test_lexical_distribution_matches_the_dense_mixture_and_its_gradient():
    problem = _problem()
    attention = tf.Variable(problem["attention"])
    upstream = np.random.default_rng(1).normal(size=(BATCH, STEPS, VOCAB))
    with tf.GradientTape() as tape:
        mixed = lexical_distribution(lexical_mixture(attention, problem["source_ids"], problem["ids"],
                                                     problem["probs"], 1e-3), VOCAB)
        total = tf.reduce_sum(mixed * upstream)
    np.testing.assert_allclose(mixed.numpy(), _numpy_lexical(problem), atol=ATOL)
    dense = np.zeros((SOURCE_VOCAB, VOCAB))
    for row in range(SOURCE_VOCAB):
        dense[row, problem["ids"][row]] += problem["probs"][row]
    wanted = np.einsum("btv,bsv->bts", upstream, dense[problem["source_ids"]])  # d total / d attention
    np.testing.assert_allclose(tape.gradient(total, attention).numpy(), wanted, atol=1e-5)


def test_lexicon_bias_is_the_log_of_the_mixture_plus_epsilon_and_survives_save():
    problem = _problem(2)
    layer = LexiconBias(SOURCE_VOCAB, VOCAB, TOP_K, epsilon=1e-3)
    layer.build(None)
    layer.set_table(problem["ids"], problem["probs"])
    inputs = {"attention": problem["attention"], "source_ids": problem["source_ids"]}
    np.testing.assert_allclose(layer(inputs).numpy(), np.log(_numpy_lexical(problem) + 1e-3), atol=1e-5)
    run_layer_test(LexiconBias, {"source_vocab_size": SOURCE_VOCAB, "target_vocab_size": VOCAB, "top_k": TOP_K,
                                 "epsilon": 0.01}, inputs, expected_output_shape=(BATCH, STEPS, VOCAB),
                   expected_num_trainable_weights=0, expected_num_non_trainable_weights=2,  # the table's ids, probs
                   other_input_data={"attention": inputs["attention"][:1, :2, :3],
                                     "source_ids": inputs["source_ids"][:1, :3]},
                   not_applicable={"fit": "the lexicon is set from data (set_table), not trained"})


def _mixture(problem: dict, epsilon: float = 1e-3) -> dict:
    return lexical_mixture(problem["attention"], problem["source_ids"], problem["ids"], problem["probs"], epsilon)


def test_the_bias_at_columns_is_the_dense_bias_of_those_words():
    """Shared columns ([M]) and one set per step ([T, M]), with duplicates and words no entry proposes."""
    problem = _problem(6)
    dense = np.log(_numpy_lexical(problem) + 1e-3)  # [B, T, V]
    proposed = set(problem["ids"][problem["source_ids"]].ravel().tolist())
    shared = np.array([4, 0, 4, 10, 2, 0, 7], "int32")
    assert not set(range(VOCAB)) <= proposed and {4, 0} <= set(shared.tolist())
    # float32 log of a sum of at most SOURCE * TOP_K products in [0, 1], plus epsilon >= 1e-3: relative
    # round-off 1e-6 of a value >= 1e-3 moves its log by about 1e-6; 1e-5 leaves room for the order of the sum.
    np.testing.assert_allclose(lexical_log_bias_at_columns(_mixture(problem), shared).numpy(), dense[..., shared],
                               atol=1e-5)
    per_step = np.random.default_rng(7).integers(0, VOCAB, (STEPS, 6)).astype("int32")
    per_step[:, 1] = per_step[:, 0]
    wanted = np.stack([dense[:, t, per_step[t]] for t in range(STEPS)], axis=1)
    np.testing.assert_allclose(lexical_log_bias_at_columns(_mixture(problem), per_step).numpy(), wanted, atol=1e-5)


def test_the_noise_mass_is_the_log_sum_over_the_vocabulary():
    """log sum_v p_n(v) (p_lex(v | t) + epsilon), brute force over V in float64."""
    problem = _problem(8)
    noise = unigram_distribution(np.random.default_rng(8).integers(0, 50, VOCAB))
    for epsilon in (1e-3, 0.5):
        wanted = np.log((noise * (_numpy_lexical(problem) + epsilon)).sum(-1))
        found = lexical_log_noise_mass(_mixture(problem, epsilon), noise.astype("float32")).numpy()
        # float32 sums of SOURCE * TOP_K terms below 1 and p_n rounded to float32 (its sum off 1 by ~1e-7)
        np.testing.assert_allclose(found, wanted, atol=1e-6)


def test_bad_tables_and_arguments_are_value_errors():
    layer = LexiconBias(SOURCE_VOCAB, VOCAB, TOP_K)
    layer.build(None)
    problem = _problem()
    with pytest.raises(ValueError, match="must have shape"):
        layer.set_table(problem["ids"][:, :1], problem["probs"][:, :1])
    with pytest.raises(ValueError, match=r"must lie in \[0, 11\)"):
        layer.set_table(problem["ids"] + VOCAB, problem["probs"])
    with pytest.raises(ValueError, match="summing to at most 1"):
        layer.set_table(problem["ids"], problem["probs"] * 3)
    with pytest.raises(ValueError, match="`epsilon` must be > 0"):
        LexiconBias(SOURCE_VOCAB, VOCAB, TOP_K, epsilon=0)


def _output_problem(seed: int = 3) -> dict:
    rng = np.random.default_rng(seed)
    return {"hidden": rng.normal(0, 0.5, (BATCH, STEPS, HIDDEN)).astype("float32"),
            "targets": rng.integers(0, VOCAB, (BATCH, STEPS)).astype("int32"),
            "bias": np.log(rng.dirichlet(np.ones(VOCAB), (BATCH, STEPS)) + 1e-3).astype("float32")}


def _layer(loss: str) -> BatchNCE:
    layer = BatchNCE(VOCAB, loss=loss, log_z=0.0, seed=0)
    layer.build((None, None, HIDDEN))
    layer.set_noise_distribution(unigram_distribution(np.arange(VOCAB) + 1.0))
    return layer


def _numpy_logits(layer: BatchNCE, problem: dict) -> np.ndarray:
    return problem["hidden"] @ layer.kernel.numpy().T + layer.bias.numpy() + problem["bias"]


def test_logit_bias_enters_the_softmax_loss_and_the_inference_log_probabilities():
    problem = _output_problem()
    layer = _layer("softmax")
    logits = _numpy_logits(layer, problem).astype("float64")
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    wanted = -np.take_along_axis(log_probs, problem["targets"][..., None], -1)[..., 0]
    # float32 logits of magnitude < 10 through a log-sum-exp of 11 terms: 1e-5 is round-off.
    for training in (True, False):
        loss = layer([problem["hidden"], problem["targets"]], training=training, logit_bias=problem["bias"])
        np.testing.assert_allclose(loss.numpy(), wanted, atol=1e-5)
    np.testing.assert_allclose(layer(problem["hidden"], logit_bias=problem["bias"]).numpy(), log_probs, atol=1e-5)


def _numpy_centred(bias: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """The bias minus log sum_v p_n(v) exp(bias_v), per row, in float64."""
    bias = bias.astype("float64")
    return bias - np.log((noise * np.exp(bias)).sum(-1, keepdims=True))


def test_a_centred_bias_keeps_the_noise_model_self_normalised_in_every_row():
    """A layer that scores the noise distribution (kernel 0, bias log p_n + log Z) sums to 1 per row under
    the self-normalised scores whatever the bias, while the full softmax is the bias's own."""
    problem = _output_problem(5)
    layer = BatchNCE(VOCAB, loss="bnce", log_z=9.0, seed=0)
    layer.build((None, None, HIDDEN))
    noise = unigram_distribution(np.arange(VOCAB) + 1.0)
    layer.set_noise_distribution(noise)
    layer.kernel.assign(np.zeros((VOCAB, HIDDEN), "float32"))
    layer.bias.assign((np.log(noise) + 9.0).astype("float32"))
    self_normalised = layer(problem["hidden"], logit_bias=problem["bias"], self_normalized=True).numpy()
    # float32 log-probabilities of magnitude < 10 summed over 11 words: 1e-5 is round-off
    np.testing.assert_allclose(np.exp(self_normalised.astype("float64")).sum(-1), 1.0, atol=1e-5)
    wanted = np.log(noise) + _numpy_centred(problem["bias"], noise)
    np.testing.assert_allclose(self_normalised, wanted, atol=1e-5)
    full = layer(problem["hidden"], logit_bias=problem["bias"]).numpy()
    logits = np.log(noise) + problem["bias"].astype("float64")
    np.testing.assert_allclose(full, logits - np.log(np.exp(logits).sum(-1, keepdims=True)), atol=1e-5)
    targets = problem["targets"]
    found = layer.target_log_probs(problem["hidden"], targets, problem["bias"])["self_normalized"].numpy()
    np.testing.assert_allclose(found, np.take_along_axis(wanted, targets[..., None], -1)[..., 0], atol=1e-5)


def test_logit_bias_enters_the_bnce_scores_of_each_rows_batch_columns():
    problem = _output_problem(4)
    layer = _layer("bnce")
    loss = layer([problem["hidden"], problem["targets"]], training=True, logit_bias=problem["bias"]).numpy()
    noise = layer.noise_probs.numpy().astype("float64")
    logits = _numpy_logits(layer, {**problem, "bias": _numpy_centred(problem["bias"], noise)})
    for t in range(STEPS):  # the paper's batch is one time step's targets: K = BATCH - 1 noise words per row
        columns = problem["targets"][:, t]
        scores = logits[:, t][:, columns]  # row i's score of column j includes row i's bias for word j
        log_noise = np.log((BATCH - 1) * noise[columns])
        positive = np.diagonal(scores) - log_noise
        negative = scores - log_noise[None, :]
        wanted = np.log1p(np.exp(-positive)) + np.where(np.eye(BATCH, dtype=bool), 0.0,
                                                         np.log1p(np.exp(negative))).sum(1)
        np.testing.assert_allclose(loss[:, t], wanted, rtol=1e-4, atol=1e-5)  # float32 scores and softplus


def test_snce_rejects_a_logit_bias():
    problem = _output_problem()
    with pytest.raises(ValueError, match="not 'snce'"):
        _layer("snce")([problem["hidden"], problem["targets"]], training=True, logit_bias=problem["bias"])


@pytest.mark.parametrize("extra_noise", [0, 3])
@pytest.mark.parametrize("scope", ["time_step", "batch"])
def test_bnce_on_the_mixture_equals_the_dense_bias_in_loss_and_gradients(scope, extra_noise):
    """B-NCE's column path (the lexicon's mixture at the batch's columns, centred without V) against the dense
    path (the [B, T, V] bias, centred over V, gathered at the columns), on a padded batch with duplicated
    targets: the loss and its gradients w.r.t. the hidden states, the kernel, the bias and the attention."""
    problem = _problem(9)
    rng = np.random.default_rng(9)
    lexicon = LexiconBias(SOURCE_VOCAB, VOCAB, TOP_K)
    lexicon.build(None)
    lexicon.set_table(problem["ids"], problem["probs"])
    layer = BatchNCE(VOCAB, loss="bnce", log_z=2.0, noise_scope=scope, extra_noise=extra_noise, seed=0)
    layer.build((None, None, HIDDEN))
    layer.set_noise_distribution(unigram_distribution(rng.integers(0, 20, VOCAB)))
    layer.kernel.assign(rng.normal(0, 0.5, (VOCAB, HIDDEN)).astype("float32"))
    layer.bias.assign(rng.normal(0, 0.5, VOCAB).astype("float32"))
    hidden = tf.Variable(rng.normal(0, 0.5, (BATCH, STEPS, HIDDEN)).astype("float32"))
    attention = tf.Variable(problem["attention"])
    targets = rng.integers(0, VOCAB, (BATCH, STEPS)).astype("int32")
    targets[0, :2] = targets[2, :2] = 5  # duplicated columns
    mask = np.arange(STEPS)[None, :] < np.array([[4], [2], [3]])
    state = layer.seed_generator.state.numpy()
    found = []
    for mixture in (False, True):
        layer.seed_generator.state.assign(state)  # the same extra noise draws
        with tf.GradientTape() as tape:
            bias = lexicon({"attention": attention, "source_ids": problem["source_ids"]}, mixture=mixture)
            loss = layer([hidden, targets], training=True, logit_bias=bias, target_mask=mask)
            total = tf.reduce_sum(loss)
        gradients = tape.gradient(total, [hidden, layer.kernel, layer.bias, attention])
        found.append([loss.numpy(), *(tf.convert_to_tensor(gradient).numpy() for gradient in gradients)])
    assert np.any(found[0][0] > 0) and np.all(found[0][0][~mask] == 0.0)
    # float32 both: the centring is a log of a sum against a log-sum-exp over V, and the column values come
    # from the same products summed in another order; losses below 30 agree to a few ulps (2e-6 seen).
    for name, dense, columns in zip(("loss", "hidden", "kernel", "bias", "attention"), *found):
        np.testing.assert_allclose(columns, dense, atol=1e-5, err_msg=name)
