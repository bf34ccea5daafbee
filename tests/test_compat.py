"""Each Keras workaround in ``seqapps.compat`` still does its job on the installed Keras.

When one of these fails after a Keras upgrade, read the workaround's docstring: the
private API it relies on changed, or the bug it works around may be fixed.
"""
import keras
import numpy as np
import tensorflow as tf

from seqapps import compat


def test_written_for_this_keras_line():
    # A new minor release needs these tests to pass before WRITTEN_FOR_KERAS moves on.
    assert keras.__version__.startswith(compat.WRITTEN_FOR_KERAS), keras.__version__


def test_all_layers_finds_nested_recurrent_layers():
    inner = keras.Sequential([keras.Input((3, 2)), keras.layers.GRU(4)], name="inner")
    outer = keras.Sequential([keras.Input((3, 2)), inner, keras.layers.Dense(1)])
    names = [layer.name for layer in compat.all_layers(outer)]
    assert "inner" in names and any(isinstance(layer, keras.layers.GRU) for layer in compat.all_layers(outer))


def test_build_once_from_batch_lets_fit_run_on_an_uneven_last_batch_under_mirrored():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    data = tf.data.Dataset.from_tensor_slices((np.ones((5, 2), "float32"), np.zeros((5, 1), "float32"))).batch(2)
    compat.build_once_from_batch(model, next(iter(data)))
    assert model.built
    history = model.fit(data, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_logs_get_a_leading_axis_of_one():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    compat.make_logs_reducible_across_workers(model)
    logs = model.train_step((tf.ones((4, 2)), tf.zeros((4, 1))))
    assert all(tuple(value.shape) == (1,) for value in logs.values())
