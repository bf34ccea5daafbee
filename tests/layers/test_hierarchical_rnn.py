"""Tests of the decoupled hierarchical RNN layer."""
from __future__ import annotations

import os
import shutil
import tempfile

import keras
import numpy as np
import pytest
import tensorflow as tf

from seqapps.layers.hierarchical_rnn import BidirectionalHRNN, DecoupledHRNN
from tests.layers.harness import run_layer_test

BATCH, FEATURES, CLASSES, K = 3, 5, 4, 4
# float32 sums over a few dozen steps in a different order (segment-wise versus
# whole-sequence accumulation): relative round-off stays far below 1e-4.
RTOL, ATOL = 1e-4, 1e-6


def _layer(mode: str = "decoupled", **kwargs) -> DecoupledHRNN:
    keras.utils.set_random_seed(1)
    kwargs.setdefault("cells", [keras.layers.GRUCell(8), keras.layers.LSTMCell(6)])
    kwargs.setdefault("periods", K)
    kwargs.setdefault("beta", 0.5 if mode == "decoupled" else None)
    return DecoupledHRNN(mode=mode, output_units=CLASSES, aux_hidden_units=7, **kwargs)


def _data(length: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(size=(BATCH, length, FEATURES)).astype("float32")
    y = rng.integers(0, CLASSES, size=(BATCH, length))
    return x, y


def _grads(layer: DecoupledHRNN, lean: bool, *args, **kwargs) -> tuple[float, list[np.ndarray]]:
    loss, grads = tf.function(lambda: layer.loss_and_gradients(*args, lean=lean, **kwargs))()
    return float(loss), [g.numpy() for g in grads]


def _reference_loss(layer: DecoupledHRNN, x: np.ndarray, y: np.ndarray, seed: int) -> tf.Tensor:
    """The restricted decoupled loss written as a plain Python loop over steps."""
    batch, length, _ = x.shape
    lower, upper = layer.cells
    uniforms = tf.random.stateless_uniform((batch, length, 1), seed=[seed, 0])
    h = [tf.zeros((batch, s)) for s in tf.nest.flatten(lower.state_size)]
    g = [tf.zeros((batch, s)) for s in tf.nest.flatten(upper.state_size)]
    task, aux, ticks = 0.0, 0.0, 0
    for t in range(length):
        out, h = lower(tf.concat([x[:, t], g[0]], -1), h)
        h = tf.nest.flatten(h)
        logits = layer.head(out)
        task += tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y[:, t], logits=logits))
        if (t + 1) % K == 0:
            index = 1 + tf.cast(tf.floor(uniforms[:, t, 0] * K), tf.int32)
            # x[b, t + 1 - index[b]], a constant target: x reaches the loss through the cells only
            target = tf.stop_gradient(tf.gather_nd(x, tf.stack([tf.range(batch), t + 1 - index], 1)))
            decoded = layer.decoder_output[0](
                layer.decoder_hidden[0](tf.concat([h[0], tf.one_hot(index - 1, K)], -1))
            )
            aux += tf.reduce_sum(tf.reduce_mean(tf.square(target - decoded), -1))
            ticks += batch
            _, g = upper(tf.stop_gradient(h[0]), g)
            g = tf.nest.flatten(g)
            h = [tf.zeros_like(s) for s in h]
    return task / (batch * length) + 0.5 * aux / ticks


@pytest.mark.parametrize("length", [24, 23])
def test_lean_gradients_equal_restricted_autodiff(length):
    layer = _layer()
    x, y = _data(length)
    lean_loss, lean = _grads(layer, True, x, y, "sparse_categorical_crossentropy", seed=3)
    plain_loss, plain = _grads(layer, False, x, y, "sparse_categorical_crossentropy", seed=3)
    with tf.GradientTape() as tape:
        ref_loss = _reference_loss(layer, x, y, seed=3)
    reference = tape.gradient(ref_loss, layer.trainable_variables)
    np.testing.assert_allclose(lean_loss, float(ref_loss), rtol=RTOL)
    np.testing.assert_allclose(plain_loss, float(ref_loss), rtol=RTOL)
    for a, b, r, v in zip(lean, plain, reference, layer.trainable_variables):
        assert r is not None and np.abs(r.numpy()).max() > 0, v.path
        np.testing.assert_allclose(a, r.numpy(), rtol=RTOL, atol=ATOL, err_msg=v.path)
        np.testing.assert_allclose(b, r.numpy(), rtol=RTOL, atol=ATOL, err_msg=v.path)


@pytest.mark.parametrize("length", [24, 23])
def test_lean_input_gradients_equal_the_reference(length):
    """The gradient with respect to x (what trains a front end before the layer), padding and all, against
    autodiff of the plain-loop reference; the plain path's too. A mask cuts one row short."""
    layer = _layer()
    x, y = _data(length)
    mask = np.arange(length)[None, :] < np.array([length, length, length - 7])[:, None]
    run = tf.function(lambda lean: layer.loss_and_gradients(x, y, "sparse_categorical_crossentropy", seed=3,
                                                            lean=lean, return_input_gradients=True))
    (_, _, lean), (_, _, plain) = run(True), run(False)
    masked = tf.function(lambda: layer.loss_and_gradients(x, y, "sparse_categorical_crossentropy", mask=mask,
                                                          seed=3, return_input_gradients=True))()[2]
    x_tensor = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x_tensor)
        ref_loss = _reference_loss(layer, x_tensor, y, seed=3)
    reference = tape.gradient(ref_loss, x_tensor).numpy()
    assert lean.shape == x.shape and np.abs(reference).min() > 0  # every step reaches the loss
    np.testing.assert_allclose(lean, reference, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(plain, reference, rtol=RTOL, atol=ATOL)
    assert np.all(masked.numpy()[2, length - 7:] == 0) and np.abs(masked.numpy()[2, :length - 7]).min() > 0


@pytest.mark.parametrize("mode", ["gr_hrnn", "mr_hrnn"])
def test_lean_input_gradients_equal_autodiff_other_modes(mode):
    layer = _layer(mode)
    x, y = _data(34)
    run = tf.function(lambda lean: layer.loss_and_gradients(x, y, "sparse_categorical_crossentropy", lean=lean,
                                                            return_input_gradients=True))
    (lean_loss, _, lean), (plain_loss, _, plain) = run(True), run(False)
    np.testing.assert_allclose(float(lean_loss), float(plain_loss), rtol=RTOL)
    assert np.abs(plain.numpy()).max() > 0
    np.testing.assert_allclose(lean, plain, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("mode", ["gr_hrnn", "mr_hrnn"])
def test_lean_gradients_equal_autodiff_other_modes(mode):
    layer = _layer(mode)
    x, y = _data(34)  # mr_hrnn: windows of ceil((17 + 4) / 4) = 6 segments, 9 segments in all
    lean_loss, lean = _grads(layer, True, x, y, "sparse_categorical_crossentropy")
    plain_loss, plain = _grads(layer, False, x, y, "sparse_categorical_crossentropy")
    np.testing.assert_allclose(lean_loss, plain_loss, rtol=RTOL)
    for a, b in zip(lean, plain):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


def test_hrnn_and_gr_hrnn_gradients_differ():
    x, y = _data(24)
    results = {}
    for mode in ("hrnn", "gr_hrnn"):
        layer = _layer(mode)  # same seed: same weights
        results[mode] = _grads(layer, False, x, y, "sparse_categorical_crossentropy")
    assert results["hrnn"][0] == pytest.approx(results["gr_hrnn"][0], rel=1e-6)  # same forward pass
    lower_kernel_full, lower_kernel_cut = results["hrnn"][1][0], results["gr_hrnn"][1][0]
    assert np.abs(lower_kernel_full - lower_kernel_cut).max() > 1e-3 * np.abs(lower_kernel_full).max()


def test_boundary_input_ticks_the_upper_level():
    x, _ = _data(12)
    layer = _layer("gr_hrnn")
    every_k = np.zeros((BATCH, 12), bool)
    every_k[:, K - 1 :: K] = True
    np.testing.assert_allclose(layer([x, every_k]), layer(x), atol=1e-6)  # boundaries every k = periods
    never = layer([x, np.zeros((BATCH, 12), bool)])
    no_tick = _layer("gr_hrnn", periods=13)  # one padded segment: its tick falls on a masked step
    np.testing.assert_allclose(never, no_tick(x), atol=1e-6)
    other = every_k.copy()
    other[0] = False
    other[0, 1] = True
    moved, periodic = layer([x, other]).numpy(), layer(x).numpy()
    np.testing.assert_allclose(moved[1:], periodic[1:], atol=1e-6)  # examples tick independently
    np.testing.assert_allclose(moved[0, :2], periodic[0, :2], atol=1e-6)  # same until the first tick
    assert not np.allclose(moved[0, 2:], periodic[0, 2:], atol=1e-3)


def test_boundary_lean_gradients_equal_autodiff():
    layer = _layer()
    x, y = _data(14)
    boundaries = np.random.default_rng(2).uniform(size=(BATCH, 14)) < 0.3
    lean_loss, lean = _grads(layer, True, [x, boundaries], y, "sparse_categorical_crossentropy", seed=1)
    plain_loss, plain = _grads(layer, False, [x, boundaries], y, "sparse_categorical_crossentropy", seed=1)
    np.testing.assert_allclose(lean_loss, plain_loss, rtol=RTOL)
    for a, b in zip(lean, plain):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


def test_three_levels():
    cells = [keras.layers.GRUCell(8), keras.layers.SimpleRNNCell(6), keras.layers.GRUCell(5)]
    layer = _layer(cells=cells, periods=[3, 2])
    x, y = _data(20)
    out = layer(x, training=True)
    assert out.shape == (BATCH, 20, CLASSES) and np.all(np.isfinite(out))
    assert len(layer.losses) == 1 and np.isfinite(float(layer.losses[0]))
    lean_loss, lean = _grads(layer, True, x, y, "sparse_categorical_crossentropy", seed=5)
    plain_loss, plain = _grads(layer, False, x, y, "sparse_categorical_crossentropy", seed=5)
    np.testing.assert_allclose(lean_loss, plain_loss, rtol=RTOL)
    top_decoder = [v.path for v in layer.trainable_variables].index(layer.decoder_hidden[1].kernel.path)
    assert np.abs(lean[top_decoder]).max() > 0  # the level-2 decoder is trained
    for a, b in zip(lean, plain):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


def test_harness():
    x = np.eye(FEATURES, dtype="float32")[np.random.default_rng(0).integers(0, FEATURES, size=(BATCH, 10))]
    run_layer_test(
        DecoupledHRNN,
        {
            "cells": [keras.layers.GRUCell(8), keras.layers.LSTMCell(6)],
            "periods": 4,
            "mode": "decoupled",
            "beta": 0.5,
            "aux_hidden_units": 7,
            "aux_loss": "categorical_crossentropy",
            "output_units": CLASSES,
            "allow_padding": True,
            "seed": 4,
        },
        x,
        expected_output_shape=(BATCH, 10, CLASSES),
        expected_num_trainable_weights=12,  # GRU 3, LSTM 3, the decoder's two Dense 4, the head 2
        expected_num_non_trainable_weights=0,
        other_input_data=x[:2, :6],
        atol=1e-5,
    )


def test_masks_and_variable_lengths():
    layer = _layer()
    x, y = _data(16)
    lengths = np.array([16, 11, 6])
    mask = np.arange(16)[None, :] < lengths[:, None]
    out = layer(x, mask=mask).numpy()
    assert np.all(out[~mask] == 0)
    for b, n in enumerate(lengths):  # a padded sequence gives the outputs of the short one
        np.testing.assert_allclose(out[b, :n], layer(x[b : b + 1, :n]).numpy()[0], atol=1e-5)
    lean_loss, lean = _grads(layer, True, x, y, "sparse_categorical_crossentropy", mask=mask, seed=2)
    plain_loss, plain = _grads(layer, False, x, y, "sparse_categorical_crossentropy", mask=mask, seed=2)
    np.testing.assert_allclose(lean_loss, plain_loss, rtol=RTOL)
    for a, b in zip(lean, plain):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)
    inputs = keras.Input((None, FEATURES))  # the mask of a Masking layer reaches the layer
    model = keras.Model(inputs, _layer()(keras.layers.Masking(0.0)(inputs)))
    zeroed = np.where(mask[:, :, None], x, 0.0).astype("float32")
    np.testing.assert_allclose(model(zeroed).numpy()[~mask], 0.0)


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"periods=4.*sequence length 10"):
        _layer(allow_padding=False)(_data(10)[0])
    with pytest.raises(ValueError, match=r"boundaries.*\(3, 10\).*\(3, 9\)"):
        _layer()([_data(10)[0], np.zeros((BATCH, 9), bool)])
    with pytest.raises(ValueError, match=r"mode='fast'"):
        _layer("fast")
    with pytest.raises(ValueError, match=r"mode='mr_hrnn' takes no boundaries"):
        _layer("mr_hrnn")([_data(8)[0], np.zeros((BATCH, 8), bool)])
    with pytest.raises(ValueError, match=r"mode='gr_hrnn' has no decoders.*beta=0.5"):
        _layer("gr_hrnn", beta=0.5)
    with pytest.raises(ValueError, match=r"beta=-0.1"):
        DecoupledHRNN([keras.layers.GRUCell(4), keras.layers.GRUCell(4)], periods=2, beta=-0.1)


def test_saved_model_round_trip():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((12, FEATURES))
    model = keras.Model(inputs, _layer()(inputs))
    x, _ = _data(12)
    expected = model(x).numpy()
    with tempfile.TemporaryDirectory() as folder:
        first, moved = os.path.join(folder, "export"), os.path.join(folder, "moved")
        model.export(first, format="tf_saved_model", verbose=False)
        shutil.move(first, moved)
        reloaded = tf.saved_model.load(moved)
        np.testing.assert_allclose(reloaded.serve(tf.constant(x)).numpy(), expected, atol=1e-5)


@pytest.mark.parametrize("periods", [[5], [5, 5], [2, 2, 2]])
def test_every_output_depends_on_the_whole_past(periods):
    """Changing the first inputs changes every later output, however deep the hierarchy."""
    cells = [keras.layers.GRUCell(8)] + [keras.layers.LSTMCell(6) for _ in periods]
    layer = _layer("decoupled", cells=cells, periods=periods)
    length = 2 * int(np.prod(periods)) + 3  # past two ticks of the top level
    x, _ = _data(length)
    early = int(np.prod(periods))  # the whole first top-level segment
    changed = x.copy()
    changed[:, :early] = 1.0 - changed[:, :early]
    difference = np.abs(layer(changed).numpy() - layer(x).numpy())[:, early:].max(axis=-1)
    # The forward pass is deterministic: an output that does not depend on the changed inputs is
    # bit-identical (before the fix, 24 of the 3 x 28 later outputs with periods [5, 5]); the weakest
    # real dependence here, 4 levels deep, is about 4e-6.
    assert difference.min() > 0, np.argwhere(difference == 0)[:5]


@pytest.mark.parametrize("mode", ["hrnn", "gr_hrnn", "decoupled", "mr_hrnn"])
def test_eager_gradients_equal_traced(mode):
    """Eagerly, with a top level that never ticks (T=4 < 5 x 5), unconnected variables get zeros."""
    cells = [keras.layers.GRUCell(8), keras.layers.SimpleRNNCell(6), keras.layers.GRUCell(5)]
    layer = _layer(mode, cells=cells, periods=[5, 5])
    x, y = _data(4)
    eager_loss, eager = layer.loss_and_gradients(x, y, "sparse_categorical_crossentropy", seed=5)
    traced_loss, traced = _grads(layer, True, x, y, "sparse_categorical_crossentropy", seed=5)
    np.testing.assert_allclose(float(eager_loss), traced_loss, rtol=RTOL)
    top = [v.path for v in layer.trainable_variables].index(layer.cells[2].kernel.path)
    assert not np.any(eager[top].numpy())  # the top cell never runs
    for a, b in zip(eager, traced):
        np.testing.assert_allclose(a.numpy(), b, rtol=RTOL, atol=ATOL)


def test_hrnn_with_decoders():
    """hrnn with beta > 0: the decoders train, their loss reaches the lower levels, beta=0 is plain hrnn."""
    x, y = _data(24)
    with_decoders = _layer("hrnn", beta=0.5)
    loss, lean = _grads(with_decoders, True, x, y, "sparse_categorical_crossentropy", seed=3)
    decoupled = _layer("decoupled", beta=0.5)  # same seed: same weights, the same forward pass and decoder loss
    decoupled_loss, restricted = _grads(decoupled, True, x, y, "sparse_categorical_crossentropy", seed=3)
    np.testing.assert_allclose(loss, decoupled_loss, rtol=1e-6)
    paths = [v.path for v in with_decoders.trainable_variables]
    assert np.abs(lean[paths.index(with_decoders.decoder_hidden[0].kernel.path)]).max() > 0
    lower = paths.index(with_decoders.cells[0].kernel.path)  # true gradients: differ from the restricted ones
    assert np.abs(lean[lower] - restricted[lower]).max() > 1e-3 * np.abs(lean[lower]).max()
    plain = _layer("hrnn", beta=0.0)
    assert _grads(plain, True, x, y, "sparse_categorical_crossentropy")[0] < loss  # no decoder term
    assert not plain.decoder_hidden


def _bidirectional(mode: str = "gr_hrnn") -> BidirectionalHRNN:
    layer = BidirectionalHRNN(_layer(mode), name="bihrnn")
    layer.build((None, None, FEATURES))
    return layer


@pytest.mark.parametrize("mode", ["gr_hrnn", "hrnn"])
def test_bidirectional_lean_gradients_equal_plain_autodiff(mode):
    """``linear_gradients`` (each direction's lean path) against autodiff of the merged output's surrogate."""
    layer = _bidirectional(mode)
    x, _ = _data(14)
    lengths = np.array([14, 9, 5])
    mask = np.arange(14)[None, :] < lengths[:, None]
    g = np.random.default_rng(3).normal(size=(BATCH, 14, CLASSES)).astype("float32") * mask[:, :, None]
    loss, lean, lean_x = tf.function(lambda: layer.linear_gradients(x, g, mask=mask, return_input_gradients=True))()
    x_tensor = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x_tensor)
        surrogate = tf.reduce_sum(g * layer(x_tensor, mask=mask)) / mask.sum()  # a mean over the valid steps
    *plain, plain_x = tape.gradient(surrogate, [*layer.trainable_variables, x_tensor])
    assert len(lean) == len(plain) == len(layer.forward.trainable_variables) * 2
    np.testing.assert_allclose(float(loss), float(surrogate), rtol=RTOL)
    for a, b in zip(lean, plain):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(lean_x, plain_x, rtol=RTOL, atol=ATOL)  # both directions' share, padding 0
    assert np.abs(plain_x.numpy()[1, :9]).min() > 0 and np.all(plain_x.numpy()[1, 9:] == 0)


def test_bidirectional_outputs_see_the_whole_sequence_and_never_the_padding():
    """A late input reaches every earlier valid output (only through the backward direction); a padded one
    reaches none, and the backward direction on a padded row equals it on the row alone."""
    layer = _bidirectional()
    x, _ = _data(12)
    lengths = np.array([12, 8, 8])
    mask = np.arange(12)[None, :] < lengths[:, None]
    out = layer(x, mask=mask).numpy()
    late = x.copy()
    late[:, 7] = 1.0 - late[:, 7]  # the last valid step of rows 1 and 2
    changed = np.abs(layer(late, mask=mask).numpy() - out).max(axis=-1)
    assert changed[:, :7].min() > 0, np.argwhere(changed[:, :7] == 0)[:5]
    forward_only = np.abs(layer.forward(late, mask=mask).numpy() - layer.forward(x, mask=mask).numpy())
    assert forward_only[:, :7].max() == 0  # the forward direction alone is causal
    padded = x.copy()
    padded[1:, 8:] = 7.0
    np.testing.assert_array_equal(layer(padded, mask=mask).numpy(), out)
    assert np.all(out[~mask] == 0)
    np.testing.assert_allclose(out[1, :8], layer(x[1:2, :8]).numpy()[0], atol=1e-5)


def test_bidirectional_harness():
    x, _ = _data(10)
    run_layer_test(
        BidirectionalHRNN,
        {"layer": DecoupledHRNN([keras.layers.GRUCell(8), keras.layers.LSTMCell(6)], periods=4, mode="decoupled",
                                beta=0.5, aux_hidden_units=7, output_units=CLASSES, seed=4)},
        x,
        expected_output_shape=(BATCH, 10, CLASSES),
        expected_num_trainable_weights=24,  # each direction's 12: GRU 3, LSTM 3, the decoder's two Dense 4, head 2
        expected_num_non_trainable_weights=0,
        other_input_data=x[:2, :6],
        atol=1e-5,
    )


def test_bidirectional_round_trip_and_bad_layer(tmp_path):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((None, FEATURES))
    model = keras.Model(inputs, BidirectionalHRNN(_layer("decoupled"))(inputs))
    x, _ = _data(12)
    path = tmp_path / "model.keras"
    model.save(path)
    np.testing.assert_allclose(keras.saving.load_model(path)(x).numpy(), model(x).numpy(), atol=1e-6)
    without_head = BidirectionalHRNN(DecoupledHRNN([keras.layers.GRUCell(8), keras.layers.GRUCell(6)], periods=K))
    assert without_head(x).shape == (BATCH, 12, 16)  # the two level-0 outputs, concatenated
    with pytest.raises(ValueError, match="needs output_units"):
        without_head.linear_gradients(x, np.zeros((BATCH, 12, 16), "float32"))
    with pytest.raises(ValueError, match="must be a DecoupledHRNN, got GRU"):
        BidirectionalHRNN(keras.layers.GRU(4))
