"""Shared test harness for seqapps Keras layers and models, at keras-hub's ``run_layer_test`` level.

``run_layer_test`` puts a layer class through every check: the config and JSON round
trips (every ``__init__`` argument in ``get_config``, the same ``dir()`` after
deserialisation, the same outputs from the restored layer), a symbolic call whose output
spec matches the eager output, the weight counts, a one-step fit that changes every
trainable weight, a ``.keras`` save and reload, a ``tf.function`` with unknown batch (and
time) dimensions called on two shapes, and a run under the ``mixed_float16`` policy.
A check that does not apply to a layer is named in ``not_applicable`` with the reason.
"""
from __future__ import annotations

import inspect
import json
import os
import tempfile
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from seqapps import serializable
from seqapps.compat import all_layers

#: The checks a test may declare not applicable, each with a one-line reason.
OPTIONAL_CHECKS = ("fit", "tf_function", "mixed_precision")


def run_layer_test(
    layer_cls: type[keras.layers.Layer],
    init_kwargs: dict[str, Any],
    input_data: Any,
    *,
    expected_output_shape: tuple[int, ...] | list[tuple[int, ...]],
    expected_num_trainable_weights: int,
    expected_num_non_trainable_weights: int,
    call_kwargs: dict[str, Any] | None = None,
    other_input_data: Any = None,
    training_target: Any = None,
    training_loss: str | Callable[[Any, Any], Any] | None = None,
    not_applicable: dict[str, str] | None = None,
    atol: float = 1e-6,
) -> keras.layers.Layer:
    """Runs the standard checks on a layer (or model) class and returns the layer of the eager call.

    Args:
        layer_cls: the layer or ``keras.Model`` class under test.
        init_kwargs: constructor arguments; Keras objects among them are copied for each new instance.
        input_data: NumPy input (an array, or a list/dict of arrays) for one batch.
        expected_output_shape: the eager output's shape (a list of shapes for several outputs).
        expected_num_trainable_weights: ``len(layer.trainable_weights)`` once built.
        expected_num_non_trainable_weights: ``len(layer.non_trainable_weights)`` once built.
        call_kwargs: extra keyword arguments of every call.
        other_input_data: a batch of another batch size (and length) for the ``tf.function`` check;
            the axes whose sizes differ from ``input_data``'s are left unknown in its signature.
        training_target: the fit check's target; default zeros of the output's shape.
        training_loss: the fit check's loss (a model class trains with its own ``train_step``); default "mse".
        not_applicable: ``{check: reason}`` for checks of ``OPTIONAL_CHECKS`` that do not apply.
        atol: tolerance of the output comparisons (float32 outputs of two instances or graphs).

    Returns:
        The layer instance built by the eager call.
    """
    call_kwargs = call_kwargs or {}
    not_applicable = not_applicable or {}
    assert set(not_applicable) <= set(OPTIONAL_CHECKS), f"unknown checks {set(not_applicable) - set(OPTIONAL_CHECKS)}"
    assert all(isinstance(why, str) and why.strip() for why in not_applicable.values()), "say why it does not apply"
    if expected_num_trainable_weights == 0:
        assert "fit" in not_applicable, "a layer without trainable weights has no fit step: say so in not_applicable"

    _check_config_round_trips(_new(layer_cls, init_kwargs))

    symbolic_layer = _new(layer_cls, init_kwargs)
    symbolic = keras.tree.flatten(symbolic_layer(_keras_tensors(input_data), **call_kwargs))
    _check_weight_counts(symbolic_layer, expected_num_trainable_weights, expected_num_non_trainable_weights)

    layer = _new(layer_cls, init_kwargs)
    outputs = keras.tree.flatten(layer(input_data, **call_kwargs))
    _check_weight_counts(layer, expected_num_trainable_weights, expected_num_non_trainable_weights)
    expected = expected_output_shape if isinstance(expected_output_shape, list) else [expected_output_shape]
    assert [tuple(o.shape) for o in outputs] == [tuple(s) for s in expected], "unexpected output shapes"
    _check_float_outputs(layer, outputs)
    specs, eager = [(tuple(s.shape), _dtype(s)) for s in symbolic], [(tuple(o.shape), _dtype(o)) for o in outputs]
    assert specs == eager, f"the symbolic call's output spec {specs} differs from the eager output's {eager}"
    _check_restored_layer(layer, input_data, outputs, call_kwargs, atol)

    model = _model(layer_cls, init_kwargs, input_data, call_kwargs)
    if "fit" not in not_applicable:
        _check_fit(model, input_data, training_target, training_loss)
    _check_keras_save(model, input_data, atol)
    if "tf_function" not in not_applicable:
        assert other_input_data is not None, "give other_input_data, or say why the tf.function check does not apply"
        _check_tf_function(layer, input_data, outputs, other_input_data, call_kwargs, atol)
    if "mixed_precision" not in not_applicable:
        _check_mixed_precision(layer_cls, init_kwargs, input_data, call_kwargs)
    return layer


def _new(layer_cls: type[keras.layers.Layer], init_kwargs: dict[str, Any],
         strip_dtype: bool = False) -> keras.layers.Layer:
    """A new instance; Keras objects in ``init_kwargs`` are copied so that no two instances share weights.

    With ``strip_dtype`` the copies drop their dtype policy and take the global one, as objects
    made under that policy would.
    """
    def copy(value: Any) -> Any:
        if not isinstance(value, keras.layers.Layer):
            return value
        serialized = keras.saving.serialize_keras_object(value)
        if strip_dtype:
            serialized["config"].pop("dtype", None)
        return keras.saving.deserialize_keras_object(serialized)

    return layer_cls(**{key: keras.tree.map_structure(copy, value) for key, value in init_kwargs.items()})


def _keras_tensors(structure: Any) -> Any:
    """``keras.KerasTensor``s with the shapes and dtypes of ``structure``."""
    return keras.tree.map_structure(lambda x: keras.KerasTensor(np.shape(x), dtype=_dtype(x)), structure)


def _inputs(structure: Any) -> Any:
    """Functional-model ``keras.Input``s with the shapes (batch unknown) and dtypes of ``structure``; a dict's
    inputs are named by their keys, as Keras matches dict data to inputs by name."""
    def new_input(x: Any, name: str | None = None) -> keras.KerasTensor:
        return keras.Input(shape=np.shape(x)[1:], dtype=_dtype(x), name=name)

    if isinstance(structure, dict):
        return {key: new_input(x, key) if hasattr(x, "dtype") else keras.tree.map_structure(new_input, x)
                for key, x in structure.items()}
    return keras.tree.map_structure(new_input, structure)


def _dtype(x: Any) -> str:
    return keras.backend.standardize_dtype(x.dtype)


def _numpy(structure: Any) -> list[np.ndarray]:
    return [keras.ops.convert_to_numpy(x) for x in keras.tree.flatten(structure)]


def _check_config_round_trips(layer: keras.layers.Layer) -> None:
    """Every argument of the class's own ``__init__`` is in ``get_config``; ``from_config`` and JSON restore it."""
    config = layer.get_config()
    init = type(layer).__init__
    parameters = [] if init.__module__.startswith("keras") else inspect.signature(init).parameters.values()
    missing = [p.name for p in parameters if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
               and p.name not in config]
    assert not missing, f"get_config() lacks the init arguments {missing}"
    config_json = json.dumps(config, sort_keys=True)
    revived = type(layer).from_config(config)
    assert json.dumps(revived.get_config(), sort_keys=True) == config_json, "from_config(get_config()) changed it"
    assert set(dir(revived)) == set(dir(layer)), "from_config gave an object with other attributes"
    serialized = json.loads(json.dumps(keras.saving.serialize_keras_object(layer)))
    restored = keras.saving.deserialize_keras_object(serialized)
    assert type(restored) is type(layer), f"deserialisation gave a {type(restored).__name__}"
    assert json.dumps(restored.get_config(), sort_keys=True) == config_json, "the JSON round trip changed the config"
    assert set(dir(restored)) == set(dir(layer)), "deserialisation gave an object with other attributes"


def _check_weight_counts(layer: keras.layers.Layer, trainable: int, non_trainable: int) -> None:
    assert layer.built
    assert len(layer.trainable_weights) == trainable, [w.path for w in layer.trainable_weights]
    assert len(layer.non_trainable_weights) == non_trainable, [w.path for w in layer.non_trainable_weights]


def _check_float_outputs(layer: keras.layers.Layer, outputs: list) -> None:
    """Floating outputs are finite and in the layer's compute dtype."""
    for output in outputs:
        if keras.backend.is_float_dtype(output.dtype):
            assert _dtype(output) == layer.compute_dtype, f"a {_dtype(output)} output of a {layer.compute_dtype} layer"
            assert np.all(np.isfinite(keras.ops.convert_to_numpy(output))), "an output is not finite"


def _check_restored_layer(layer: keras.layers.Layer, input_data: Any, outputs: list, call_kwargs: dict,
                          atol: float) -> None:
    """The JSON round trip of a built layer (rebuilt from its build config), given its weights, computes ``outputs``."""
    restored = keras.saving.deserialize_keras_object(json.loads(json.dumps(keras.saving.serialize_keras_object(layer))))
    assert restored.built, "deserialisation did not rebuild the layer from its build config"
    restored.set_weights(layer.get_weights())
    for actual, wanted in zip(_numpy(restored(input_data, **call_kwargs)), _numpy(outputs)):
        np.testing.assert_allclose(actual, wanted, atol=atol, err_msg="the restored layer computes other outputs")


def _model(layer_cls: type[keras.layers.Layer], init_kwargs: dict[str, Any], input_data: Any,
           call_kwargs: dict) -> keras.Model:
    """A built model class itself, or a functional model around a new layer."""
    if issubclass(layer_cls, keras.Model):
        model = _new(layer_cls, init_kwargs)
        model(input_data, **call_kwargs)
        return model
    inputs = _inputs(input_data)
    return keras.Model(inputs, _new(layer_cls, init_kwargs)(inputs, **call_kwargs))


def _check_fit(model: keras.Model, input_data: Any, target: Any,
               loss: str | Callable[[Any, Any], Any] | None) -> None:
    """One SGD step: a finite loss, and every trainable weight moves.

    The step runs eagerly: tracing a train step would cost more than all the other checks together.
    """
    if target is None:
        target = np.zeros(keras.ops.shape(model(input_data)), "float32")
    before = [keras.ops.convert_to_numpy(w) for w in model.trainable_weights]
    own_step = type(model).train_step is not keras.Model.train_step
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss=None if own_step else loss or "mse", run_eagerly=True)
    batch = len(keras.tree.flatten(input_data)[0])
    history = model.fit(input_data, target, batch_size=batch, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0]), "the training loss is not finite"
    still = [w.path for w, old in zip(model.trainable_weights, before)
             if np.array_equal(keras.ops.convert_to_numpy(w), old)]
    assert not still, f"one training step left these weights unchanged: {still}"


def _check_keras_save(model: keras.Model, input_data: Any, atol: float) -> None:
    """A ``.keras`` save and reload keeps the outputs."""
    expected = _numpy(model(input_data))
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.keras")
        model.save(path)
        reloaded = serializable.load_model(path)
    for actual, wanted in zip(_numpy(reloaded(input_data)), expected):
        np.testing.assert_allclose(actual, wanted, atol=atol, err_msg="the reloaded model computes other outputs")


def _check_tf_function(layer: keras.layers.Layer, input_data: Any, outputs: list, other_input_data: Any,
                       call_kwargs: dict, atol: float) -> None:
    """One trace with unknown batch (and time) dimensions serves two shapes, as the eager calls do (``outputs``)."""
    def spec(x: np.ndarray, other: np.ndarray) -> tf.TensorSpec:
        return tf.TensorSpec([a if a == b else None for a, b in zip(np.shape(x), np.shape(other))], _dtype(x))

    signature = keras.tree.map_structure(spec, input_data, other_input_data)
    assert all(s.shape[0] is None for s in keras.tree.flatten(signature)), "other_input_data needs another batch size"
    function = tf.function(lambda inputs: layer(inputs, **call_kwargs), input_signature=[signature])
    for data, eager in ((input_data, outputs), (other_input_data, layer(other_input_data, **call_kwargs))):
        for actual, wanted in zip(_numpy(function(data)), _numpy(eager)):
            np.testing.assert_allclose(actual, wanted, atol=atol, err_msg="the tf.function computes other outputs")
    assert function.experimental_get_tracing_count() == 1, "the tf.function traced again for another shape"


def _check_mixed_precision(layer_cls: type[keras.layers.Layer], init_kwargs: dict[str, Any], input_data: Any,
                           call_kwargs: dict) -> None:
    """Under the global ``mixed_float16`` policy: float16 computation and outputs, float32 weights, finite."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        layer = _new(layer_cls, init_kwargs, strip_dtype=True)
        outputs = keras.tree.flatten(layer(input_data, **call_kwargs))
    finally:
        keras.config.set_dtype_policy(previous)
    assert layer.compute_dtype == "float16"
    for sublayer in all_layers(layer):
        assert sublayer.compute_dtype == "float16", f"{sublayer.path} computes in {sublayer.compute_dtype}"
    for weight in layer.weights:
        if keras.backend.is_float_dtype(weight.dtype):
            assert _dtype(weight) == "float32", f"{weight.path} is {_dtype(weight)}"
    _check_float_outputs(layer, outputs)
