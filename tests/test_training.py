"""Tests of the shared training pieces: global-norm clipping of sparse gradients."""
from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from seqapps.config import TrainingConfig
from seqapps.training import clip_by_global_norm, make_optimizer


def _sparse_and_dense() -> tuple[list, list]:
    """An embedding-like IndexedSlices gradient with duplicate rows, a dense one, and their dense forms."""
    rng = np.random.default_rng(0)
    indices = np.array([3, 1, 3, 3, 0, 1], "int32")  # rows 3 and 1 repeat
    values = rng.uniform(0.5, 1.5, size=(6, 4)).astype("float32")  # duplicates add up
    sparse = tf.IndexedSlices(tf.constant(values), tf.constant(indices), tf.constant([5, 4]))
    dense = tf.constant(rng.normal(size=(2, 3)).astype("float32"))
    return [sparse, dense], [tf.convert_to_tensor(sparse), dense]


def test_clipping_sparse_gradients_equals_dense_clipping():
    grads, dense = _sparse_and_dense()
    norm = float(tf.linalg.global_norm(dense))
    raw = float(np.sqrt(sum(np.sum(np.square(g.values if hasattr(g, "values") else g)) for g in grads)))
    assert abs(raw - norm) > 0.1 * norm  # the raw slices' norm is not the gradient's: the case that matters
    for clip_norm in (0.5 * norm, 2.0 * norm):  # clipped, and left alone
        expected, _ = tf.clip_by_global_norm(dense, clip_norm)
        clipped = clip_by_global_norm(grads, clip_norm)
        assert isinstance(clipped[0], tf.IndexedSlices)
        for a, b in zip(clipped, expected):
            # float32 sums of a few numbers in another order: round-off far below 1e-6.
            np.testing.assert_allclose(tf.convert_to_tensor(a).numpy(), b.numpy(), rtol=1e-6, atol=1e-6)
    xla = tf.function(lambda: clip_by_global_norm(grads, 0.5 * norm)[0].values, jit_compile=True)()
    np.testing.assert_allclose(xla.numpy(), clip_by_global_norm(grads, 0.5 * norm)[0].values.numpy(), rtol=1e-6)


def test_optimizer_step_with_sparse_gradients_equals_dense_step():
    grads, dense = _sparse_and_dense()
    norm = float(tf.linalg.global_norm(dense))
    results = []
    for given in (grads, dense):
        for name in ("sgd", "adam"):
            config = TrainingConfig(optimizer=name, learning_rate=0.1, clipnorm=0.5 * norm)
            variables = [keras.Variable(np.ones((5, 4), "float32")), keras.Variable(np.ones((2, 3), "float32"))]
            make_optimizer(config).apply(given, variables)
            results.append([v.numpy() for v in variables])
    for sparse_step, dense_step in zip(results[:2], results[2:]):
        for a, b in zip(sparse_step, dense_step):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)  # float32 round-off of one update


def test_optimizer_round_trip():
    optimizer = make_optimizer(TrainingConfig(optimizer="adam", learning_rate=0.01, clipnorm=2.0))
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(restored) is type(optimizer) and restored.global_clipnorm == 2.0
