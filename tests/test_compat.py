"""Each Keras workaround in ``seqapps.compat`` still does its job on the installed Keras.

When one of these fails after a Keras upgrade, read the workaround's docstring: the
private API it relies on changed, or the bug it works around may be fixed.
"""
import json
import os
import subprocess
import sys
import textwrap

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


def test_own_gradient_clipping_decides_the_applied_gradients():
    class DoublingSGD(compat.OwnGradientClipping, keras.optimizers.SGD):
        def clip_gradients(self, grads):
            return super().clip_gradients([2.0 * g for g in grads])

    variable = keras.Variable(np.zeros(3, "float32"))
    gradient = tf.constant([1.0, -2.0, 3.0])
    DoublingSGD(learning_rate=1.0, clipnorm=100.0).apply_gradients([(gradient, variable)])
    # Keras still routes apply_gradients through _clip_gradients (else the update would be -gradient), and the
    # default still applies Keras' own clipping afterwards (clipnorm 100 leaves a norm-7.5 gradient unchanged).
    np.testing.assert_array_equal(variable.numpy(), -2.0 * gradient.numpy())
    variable.assign(np.zeros(3, "float32"))
    DoublingSGD(learning_rate=1.0, clipnorm=1.0).apply_gradients([(gradient, variable)])
    np.testing.assert_allclose(np.linalg.norm(variable.numpy()), 1.0, rtol=1e-6)  # clipped to norm 1


def test_batch_predictor_computes_each_row_once_under_two_mirrored_replicas():
    # Two logical CPUs must be set before TensorFlow starts, hence a fresh process.
    code = textwrap.dedent("""
        import json
        import numpy as np
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        import keras
        from seqapps import compat
        strategy = tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")])
        with strategy.scope():
            model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        x = np.arange(12, dtype="float32").reshape(4, 3)
        predict = compat.batch_predictor(model)
        print(json.dumps({"replicas": strategy.num_replicas_in_sync, "same": predict is compat.batch_predictor(model),
                          "found": predict(x).numpy().tolist(), "expected": model(x).numpy().tolist(),
                          "predict_on_batch_rows": len(model.predict_on_batch(x))}))
    """)
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                               env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert completed.returncode == 0, completed.stderr[-2000:]
    answer = json.loads(completed.stdout.strip().splitlines()[-1])
    assert answer["replicas"] == 2 and answer["same"]  # one traced function per model
    np.testing.assert_allclose(answer["found"], answer["expected"], rtol=1e-6)
    # The Keras bug it works around: when predict_on_batch returns one row per input row, drop batch_predictor.
    assert answer["predict_on_batch_rows"] == 8


def test_adam_moments_are_the_slots_keras_adam_updates():
    variables = [keras.Variable(np.zeros((2, 3), "float32")), keras.Variable(np.zeros((4,), "float32"))]
    optimizer = keras.optimizers.Adam(learning_rate=0.1, beta_1=0.9, beta_2=0.99)
    gradients = [np.full((2, 3), 2.0, "float32"), np.full((4,), -1.0, "float32")]
    optimizer.apply([tf.constant(g) for g in gradients], variables)
    for variable, gradient in zip(variables, gradients):
        for tf_or_keras in (variable, variable.value):  # both forms reach update_step
            momentum, velocity = compat.adam_moments(optimizer, tf_or_keras)
            np.testing.assert_allclose(momentum.numpy(), 0.1 * gradient, rtol=1e-6)  # (1 - beta_1) g after one step
            np.testing.assert_allclose(velocity.numpy(), 0.01 * gradient ** 2, rtol=1e-6)  # (1 - beta_2) g^2
