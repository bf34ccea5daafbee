"""Tests of the attending RNN decoder and its in-graph word generator (seqapps.layers.attention_decoder)."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from seqapps.layers.attention_decoder import AdditiveAttention, AttentionDecoder, PaddingMask
from tests.layers.harness import run_layer_test

BATCH, STEPS, SOURCE, UNITS, VOCAB = 3, 5, 4, 8, 11


def _inputs(cell: str, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    mask = np.ones((BATCH, SOURCE), bool)
    mask[1, 2:] = False  # a shorter memory
    return {"ids": rng.integers(0, VOCAB, (BATCH, STEPS)).astype("int32"),
            "memory": rng.normal(size=(BATCH, SOURCE, UNITS)).astype("float32"), "memory_mask": mask,
            "state": [rng.normal(size=(BATCH, UNITS)).astype("float32") for _ in range(2 if cell == "lstm" else 1)]}


def _fewer(inputs: dict, batch: int = 2, steps: int = 3, source: int = 3) -> dict:
    """``inputs`` cut to another batch size, target length and memory length."""
    return {"ids": inputs["ids"][:batch, :steps], "memory": inputs["memory"][:batch, :source],
            "memory_mask": inputs["memory_mask"][:batch, :source], "state": [s[:batch] for s in inputs["state"]]}


@pytest.mark.parametrize("use_scale", [True, False])
def test_additive_attention_equals_keras_in_outputs_and_gradients(use_scale):
    """The matrix-product scores give Keras' AdditiveAttention's outputs, scores and gradients (float32 sums in
    another order: 1e-5), masks included, for a teacher-forced query sequence and a one-step query."""
    rng = np.random.default_rng(3)
    memory = tf.constant(rng.normal(size=(BATCH, SOURCE, UNITS)), tf.float32)
    mask = tf.constant(_inputs("gru")["memory_mask"])
    ours, theirs = AdditiveAttention(use_scale=use_scale), keras.layers.AdditiveAttention(use_scale=use_scale)
    for layer in (ours, theirs):
        layer.build([(None, None, UNITS), memory.shape])
    if use_scale:
        ours.scale.assign(rng.normal(size=UNITS).astype("float32"))
        theirs.scale.assign(ours.scale)
    for steps in (STEPS, 1):
        query = tf.constant(rng.normal(size=(BATCH, steps, UNITS)), tf.float32)
        results = []
        for layer in (ours, theirs):
            with tf.GradientTape() as tape:
                tape.watch([query, memory])
                context, scores = layer([query, memory], mask=[None, mask], return_attention_scores=True)
                loss = tf.reduce_sum(tf.sin(context)) + tf.reduce_sum(tf.cos(scores))
            results.append([context, scores, *tape.gradient(loss, [query, memory, *layer.trainable_weights])])
        assert len(results[0]) == len(results[1]) == (5 if use_scale else 4)
        for got, want in zip(*results):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# Weights: the embedding 1, the LSTM/GRU 3 (kernel, recurrent kernel, bias), the attention's scale 1, the Dense 2.
@pytest.mark.parametrize("cell, attention, weights",
                         [("lstm", "bahdanau", 7), ("gru", "luong", 7), ("lstm", "none", 6)])
def test_attention_decoder_passes_the_layer_harness(cell, attention, weights):
    inputs = _inputs(cell)
    run_layer_test(AttentionDecoder, {"vocab_size": VOCAB, "embedding_dim": 6, "units": UNITS, "cell": cell,
                                      "attention": attention, "dropout": 0.1},
                   inputs, expected_output_shape=(BATCH, STEPS, UNITS), expected_num_trainable_weights=weights,
                   expected_num_non_trainable_weights=0, other_input_data=_fewer(inputs), atol=1e-5)


@pytest.mark.parametrize("cell, attention", [("lstm", "bahdanau"), ("gru", "luong"), ("gru", "none")])
def test_steps_equal_the_teacher_forced_call(cell, attention):
    decoder = AttentionDecoder(VOCAB, 6, UNITS, cell=cell, attention=attention, dropout=0.5)
    inputs = _inputs(cell, seed=1)
    whole, weights = decoder(inputs, return_attention=True)
    state = {"rnn": [tf.constant(s) for s in inputs["state"]], "memory": tf.constant(inputs["memory"]),
             "memory_mask": tf.constant(inputs["memory_mask"])}
    weights = weights.numpy()
    for t in range(STEPS):
        if attention == "none":
            hidden, state = decoder.step(tf.constant(inputs["ids"][:, t]), state)
        else:
            hidden, state, step_weights = decoder.step(tf.constant(inputs["ids"][:, t]), state, return_attention=True)
            np.testing.assert_allclose(step_weights.numpy(), weights[:, t], atol=1e-5)
        # float32 through up to five recurrent steps of one graph or another: 1e-5 is round-off.
        np.testing.assert_allclose(hidden.numpy(), whole.numpy()[:, t], atol=1e-5)
    assert weights.shape == (BATCH, STEPS, SOURCE)
    if attention == "none":
        assert not weights.any()
    else:
        np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
        assert not weights[1, :, 2:].any()  # masked memory positions get no weight


def test_bad_cell_or_attention_is_a_value_error():
    with pytest.raises(ValueError, match="`cell` must be one of"):
        AttentionDecoder(VOCAB, 6, UNITS, cell="rnn")
    with pytest.raises(ValueError, match="`attention` must be one of"):
        AttentionDecoder(VOCAB, 6, UNITS, attention="general")


def test_padding_mask_marks_real_ids():
    ids = np.array([[5, 7, 1, 1], [1, 2, 3, 1]], "int32")
    layer = run_layer_test(PaddingMask, {"pad_id": 1}, ids, expected_output_shape=(2, 4),
                           expected_num_trainable_weights=0, expected_num_non_trainable_weights=0,
                           other_input_data=ids[:1, :3], not_applicable={"fit": "the layer has no weights"})
    np.testing.assert_array_equal(np.asarray(layer(ids)), ids != 1)


def test_memory_mask_is_optional():
    decoder = AttentionDecoder(VOCAB, 6, UNITS, cell="gru")
    inputs = _inputs("gru", seed=2)
    full = {**inputs, "memory_mask": np.ones((BATCH, SOURCE), bool)}
    del inputs["memory_mask"]
    np.testing.assert_allclose(decoder(inputs).numpy(), decoder(full).numpy(), atol=1e-6)


SHARED = [0, 1, 2, 2, 4, 5, 6, 2, 8, 9, 4]  # words 3 and 7 read word 2's embedding, word 10 reads word 4's


def test_shared_input_ids_pass_the_harness_and_read_one_embedding_in_calls_and_steps():
    inputs = _inputs("lstm", seed=3)
    run_layer_test(AttentionDecoder, {"vocab_size": VOCAB, "embedding_dim": 6, "units": UNITS, "input_ids": SHARED},
                   inputs, expected_output_shape=(BATCH, STEPS, UNITS), expected_num_trainable_weights=7,
                   expected_num_non_trainable_weights=0, other_input_data=_fewer(inputs), atol=1e-5)
    decoder = AttentionDecoder(VOCAB, 6, UNITS, input_ids=SHARED)
    plain = AttentionDecoder(VOCAB, 6, UNITS)
    plain(inputs)
    mapped = np.array(SHARED)[inputs["ids"]]
    decoder(inputs)
    decoder.set_weights(plain.get_weights())
    # The shared decoder on any ids equals the plain one on the ids they are read as.
    np.testing.assert_allclose(decoder(inputs).numpy(), plain({**inputs, "ids": mapped}).numpy(), atol=1e-6)
    state = {"rnn": [tf.constant(s) for s in inputs["state"]], "memory": tf.constant(inputs["memory"]),
             "memory_mask": tf.constant(inputs["memory_mask"])}
    hidden, _ = decoder.step(tf.constant([3, 7, 10]), state)
    expected, _ = plain.step(tf.constant([2, 2, 4]), state)
    np.testing.assert_allclose(hidden.numpy(), expected.numpy(), atol=1e-6)
    assert not np.allclose(plain.step(tf.constant([3, 7, 10]), state)[0].numpy(), expected.numpy())


@pytest.mark.parametrize("input_ids", [[0] * (VOCAB - 1), [0] * (VOCAB - 1) + [VOCAB]])
def test_input_ids_must_name_one_word_per_word(input_ids):
    with pytest.raises(ValueError, match="`input_ids` must hold one id"):
        AttentionDecoder(VOCAB, 6, UNITS, input_ids=input_ids)
