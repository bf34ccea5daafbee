"""Tests of the CTC loss, decoders, word spans and speech model (seqapps.layers.ctc) against brute force."""
import itertools

import numpy as np
import pytest
import tensorflow as tf

from seqapps.layers import augment, ctc
from tests.layers.harness import run_layer_test


def collapse(path):
    """The CTC labelling of a frame path: repeats merged, blanks (0) removed."""
    return tuple(c for c, _ in itertools.groupby(path) if c != ctc.BLANK)


def labelling_probabilities(log_probs):
    """Sums the probability of every frame path of a [T, C] array by labelling (brute force)."""
    totals = {}
    for path in itertools.product(range(log_probs.shape[1]), repeat=log_probs.shape[0]):
        p = np.exp(sum(log_probs[t, c] for t, c in enumerate(path)))
        totals[collapse(path)] = totals.get(collapse(path), 0.0) + p
    return totals


@pytest.fixture
def logits():
    return np.random.default_rng(0).normal(size=(3, 5, 3)).astype(np.float32) * 2.0


def log_softmax(x):
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_ctc_loss_is_minus_log_of_the_summed_path_probabilities(logits):
    labels = np.array([[1, 2], [1, 1], [2, 0]], np.int32)
    lengths = np.array([5, 5, 3], np.int32)
    loss = ctc.ctc_loss(labels, logits, lengths).numpy()
    for row, (label, length) in enumerate(zip(labels, lengths)):
        totals = labelling_probabilities(log_softmax(logits[row, :length].astype(np.float64)))
        expected = -np.log(totals[tuple(int(c) for c in label if c)])
        np.testing.assert_allclose(loss[row], expected, rtol=1e-4)  # float32 forward-backward sums


def test_greedy_decode_is_the_collapsed_best_path(logits):
    lengths = np.array([5, 4, 2], np.int32)
    ids, scores = ctc.ctc_greedy_decode(logits, lengths)
    for row, length in enumerate(lengths):
        log_probs = log_softmax(logits[row, :length].astype(np.float64))
        assert tuple(ids[row].numpy()) == collapse(log_probs.argmax(-1))
        np.testing.assert_allclose(scores[row], log_probs.max(-1).sum(), rtol=1e-5)


def test_transcripts_have_the_form_of_the_training_transcripts():
    chars = tf.constant(["", " ", "a", "b"])
    ids = tf.ragged.constant([[1, 2, 1, 1, 3, 1], [2, 3], [1], []])  # " a  b ", "ab", " ", ""
    assert ctc.ids_to_text(ids, chars).numpy().tolist() == [b"a b", b"ab", b"", b""]


def test_beam_search_finds_the_most_probable_labelling_where_greedy_does_not():
    # two frames: the best path is blank-blank (""), but "1" collects more probability over its paths
    probs = np.array([[[0.4, 0.35, 0.25], [0.4, 0.35, 0.25]]])
    logits = np.log(probs).astype(np.float32)
    totals = labelling_probabilities(np.log(probs[0]))
    best = max(totals, key=totals.get)
    greedy, _ = ctc.ctc_greedy_decode(logits, [2])
    beam, score = ctc.ctc_beam_decode(logits, [2], beam_width=8)
    assert tuple(greedy[0].numpy()) == () and best == (1,) and tuple(beam[0].numpy()) == best
    np.testing.assert_allclose(np.exp(score[0]), totals[best], rtol=1e-4)


def test_word_spans_recover_known_word_boundaries():
    # "ab cd e" spoken with words at frames [2, 6), [8, 13), [15, 17); classes: 0 blank, 1 space, 2.. letters
    chars = ["", " ", "a", "b", "c", "d", "e"]
    path = [0, 0, 2, 2, 0, 3, 1, 1, 4, 0, 0, 5, 5, 1, 1, 6, 6, 0, 0, 0]
    frames = np.full((2, len(path), len(chars)), -4.0, np.float32)
    frames[0, np.arange(len(path)), path] = 4.0
    frames[1] = frames[0]
    spans = ctc.ctc_word_spans(frames, np.array([20, 13], np.int32), tf.constant(chars), space_id=1,
                               seconds_per_frame=0.02)
    assert spans["words"].numpy().tolist() == [[b"ab", b"cd", b"e"], [b"ab", b"cd", b""]]
    np.testing.assert_allclose(spans["start"].numpy()[0], [0.04, 0.16, 0.30], atol=1e-6)
    np.testing.assert_allclose(spans["end"].numpy()[0], [0.12, 0.26, 0.34], atol=1e-6)
    assert spans["num_words"].numpy().tolist() == [3, 2]
    top = np.exp(4.0) / (np.exp(4.0) + 6 * np.exp(-4.0))  # every frame's best-class posterior
    np.testing.assert_allclose(spans["confidence"].numpy()[0], [top] * 3, rtol=1e-5)


def test_word_spans_of_an_empty_transcript_are_empty():
    frames = np.zeros((1, 6, 3), np.float32)
    frames[..., 0] = 5.0  # blank everywhere
    spans = ctc.ctc_word_spans(frames, np.array([6]), tf.constant(["", " ", "a"]), 1, 0.02)
    assert spans["words"].shape == (1, 0) and spans["num_words"].numpy().tolist() == [0]


def _inputs():
    rng = np.random.default_rng(1)
    return ({"waveform": rng.normal(size=(2, 4000)).astype(np.float32) * 0.1,
             "length": np.array([4000, 2500], np.int32)}, np.array([[1, 2, 3], [2, 2, 0]], np.int32))


# Trainable weights: birnn, the conv 2, two bidirectional GRUs 12, the head 2; hrnn, the conv 2, two GRU cells 6,
# the decoder's two Dense 4, the head 2; bihrnn the conv and twice the rest. The mel filterbank is the one
# non-trainable weight.
@pytest.mark.parametrize("encoder, weights", [("birnn", 16), ("hrnn", 14), ("bihrnn", 26)])
def test_speech_model_passes_the_layer_harness(encoder, weights):
    inputs, labels = _inputs()
    shorter = {"waveform": inputs["waveform"][:1, :3000], "length": inputs["length"][:1] - 1000}
    model = run_layer_test(ctc.CTCSpeechModel, {"num_classes": 4, "n_mels": 8, "units": [8, 8], "conv_filters": 6,
                                                "encoder": encoder, "stride": 2}, inputs,
                           expected_output_shape=(2, 13, 4),  # 1 + 4000 // 160 = 26 centred frames, halved
                           expected_num_trainable_weights=weights, expected_num_non_trainable_weights=1,
                           other_input_data=shorter, training_target=labels, atol=1e-5)
    assert model.output_lengths(inputs["length"]).numpy().tolist() == [13, 8]


@pytest.mark.parametrize("encoder, conv_filters", [("hrnn", 0), ("hrnn", 5), ("bihrnn", 0), ("bihrnn", 5)])
def test_hrnn_lean_ctc_gradients_equal_plain_autodiff(encoder, conv_filters):
    """The lean path's gradients of every weight, the convolution before the HRNN included, against autodiff."""
    model = ctc.CTCSpeechModel(num_classes=4, n_mels=8, units=[8, 6], encoder=encoder, hrnn_mode="gr_hrnn",
                               hrnn_periods=3, stride=2, conv_filters=conv_filters)
    model.build()
    inputs, labels = _inputs()
    _, lean = model._lean_hrnn_gradients(inputs, labels)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(ctc.ctc_loss(labels, model(inputs), model.output_lengths(inputs["length"])))
    plain = tape.gradient(loss, model.trainable_variables)
    assert len(lean) == len(plain) == len(model.hrnn.trainable_variables) + 2 * bool(conv_filters)
    for a, b, variable in zip(lean, plain, model.trainable_variables):
        assert np.abs(b.numpy()).max() > 0, variable.path
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=variable.path)  # summation order differs


def test_augmentation_runs_in_train_step_only():
    """The augmenter's generator advances in a training step, never in a call (which is what exports hold)."""
    import keras

    model = ctc.CTCSpeechModel(num_classes=5, n_mels=8, units=[4], augment=["speed", "noise", "telephone"], seed=0)
    model.build()
    model.compile(optimizer="adam")
    rng = np.random.default_rng(0)
    waveform = (0.1 * rng.standard_normal((2, 8000))).astype(np.float32)
    inputs = {"waveform": waveform, "length": np.array([8000, 6000], np.int32)}
    labels = np.array([[1, 2, 3], [4, 4, 0]], np.int32)
    state = lambda: keras.ops.convert_to_numpy(model.augmenter.seed_generator.state).copy()  # noqa: E731
    before = state()
    first = model(inputs, training=False).numpy()
    np.testing.assert_array_equal(state(), before)
    np.testing.assert_array_equal(model(inputs, training=True).numpy(), first)  # no dropout: the call is plain
    history = model.fit(tf.data.Dataset.from_tensors((inputs, labels)), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0]) and not np.array_equal(state(), before)
    assert ctc.CTCSpeechModel.from_config(model.get_config()).augment == ["speed", "noise", "telephone"]


def test_feature_augmentation_changes_training_calls_only():
    """VTLP and SpecAugment act on a training call's log-mel; an inference call (what exports hold) is plain."""
    model = ctc.CTCSpeechModel(num_classes=5, n_mels=20, units=[4], augment=["vtlp", "specaugment", "noise"],
                               seed=0)
    model.build()
    assert model.augmenter.augmentations == ["noise"]
    assert model.feature_augmenter.augmentations == ["vtlp", "specaugment"]
    waveform = (0.1 * np.random.default_rng(1).standard_normal((2, 8000))).astype(np.float32)
    inputs = {"waveform": waveform, "length": np.array([8000, 6000], np.int32)}
    plain = model(inputs, training=False).numpy()
    np.testing.assert_array_equal(model(inputs, training=False).numpy(), plain)
    assert not np.allclose(model(inputs, training=True).numpy(), plain)
    assert ctc.CTCSpeechModel.from_config(model.get_config()).augment == ["vtlp", "specaugment", "noise"]
    assert model.feature_augmenter.warp == augment.VTLP_WARP
    wider = ctc.CTCSpeechModel(num_classes=5, n_mels=20, units=[4], augment=["vtlp"], vtlp_warp=(0.8, 1.25))
    assert ctc.CTCSpeechModel.from_config(wider.get_config()).feature_augmenter.warp == (0.8, 1.25)
    with pytest.raises(ValueError, match="unknown augmentations"):
        ctc.CTCSpeechModel(num_classes=5, augment=["echo"])
