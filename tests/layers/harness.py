"""Shared test harness for seqapps Keras layers.

Every research layer goes through the same checks (modelled on keras-hub's
``run_layer_test``): config and JSON round trips, an eager and a symbolic call,
a one-step fit, and a ``.keras`` save and reload that keeps the outputs.
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Callable

import keras
import numpy as np

from seqapps import serializable


def _as_inputs(structure: Any) -> Any:
    """Symbolic ``keras.Input``s with the shapes and dtypes of ``structure``."""
    return keras.tree.map_structure(
        lambda x: keras.Input(shape=np.shape(x)[1:], batch_size=None, dtype=keras.backend.standardize_dtype(x.dtype)),
        structure,
    )


def run_layer_test(
    layer_cls: type[keras.layers.Layer],
    init_kwargs: dict[str, Any],
    input_data: Any,
    expected_output_shape: tuple[int, ...] | None = None,
    call_kwargs: dict[str, Any] | None = None,
    run_training_check: bool = True,
    training_loss: Callable[[Any], Any] | None = None,
    atol: float = 1e-6,
) -> keras.layers.Layer:
    """Runs the standard layer checks and returns the layer built in the eager call.

    Args:
        layer_cls: the layer class under test.
        init_kwargs: constructor arguments.
        input_data: NumPy input (an array, or a list/dict of arrays) for one batch.
        expected_output_shape: if given, the eager output must have this shape
            (a list of shapes for a layer with several outputs).
        call_kwargs: extra keyword arguments for ``layer(inputs, **call_kwargs)``.
        run_training_check: whether to compile and fit one step.
        training_loss: loss for the fit check, ``fn(y_true, y_pred)``; default
            mean squared error against zeros.
        atol: tolerance for the save/reload output comparison.

    Returns:
        The layer instance used for the eager call.
    """
    call_kwargs = call_kwargs or {}

    # Config round trip: every init argument comes back unchanged.
    layer = layer_cls(**init_kwargs)
    config = layer.get_config()
    for key, value in init_kwargs.items():
        assert key in config, f"get_config() lacks init argument {key!r}"
    revived = layer_cls.from_config(config)
    assert revived.get_config() == config, "from_config(get_config()) changed the config"

    # JSON round trip through the Keras serialisation registry.
    serialized = keras.saving.serialize_keras_object(layer)
    restored = keras.saving.deserialize_keras_object(json.loads(json.dumps(serialized)))
    assert isinstance(restored, layer_cls)
    assert restored.get_config() == config

    # Eager call.
    outputs = keras.tree.flatten(layer(input_data, **call_kwargs))
    if expected_output_shape is not None:
        expected = expected_output_shape if isinstance(expected_output_shape, list) else [expected_output_shape]
        assert [tuple(o.shape) for o in outputs] == [tuple(s) for s in expected], (outputs, expected)
    for output in outputs:
        assert np.all(np.isfinite(keras.ops.convert_to_numpy(output))), "eager output is not finite"

    # Symbolic call inside a functional model, then a one-step fit.
    symbolic_inputs = _as_inputs(input_data)
    model_layer = layer_cls(**init_kwargs)
    model = keras.Model(symbolic_inputs, model_layer(symbolic_inputs, **call_kwargs))
    if run_training_check:
        target = np.zeros(keras.ops.shape(model(input_data)), dtype="float32")  # single-output layers only
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss=training_loss or "mse")
        history = model.fit(input_data, target, batch_size=len(target), epochs=1, verbose=0)
        assert np.isfinite(history.history["loss"][0]), "training loss is not finite"

    # .keras save and reload keeps the outputs.
    expected = [keras.ops.convert_to_numpy(o) for o in keras.tree.flatten(model(input_data))]
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.keras")
        model.save(path)
        reloaded = serializable.load_model(path)
    for actual, wanted in zip(keras.tree.flatten(reloaded(input_data)), expected):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(actual), wanted, atol=atol)
    return layer
