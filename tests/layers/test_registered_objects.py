"""Every registered Keras object of the library goes through the shared harness or a round trip.

Registration is explicit: ``import seqapps`` registers nothing, ``import seqapps.serializable`` registers
everything, and ``seqapps.serializable.load_model`` reads a ``.keras`` file with no other import.
"""
import json
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

from seqapps.layers.ngram_context import NGramContext
from seqapps.layers.time_features import SeasonalDifference
from seqapps.losses import ScaledMeanAbsoluteError
from tests.layers.harness import run_layer_test


def test_import_seqapps_registers_nothing_and_load_model_needs_no_other_import(tmp_path):
    path = tmp_path / "ngram.keras"
    keras.Sequential([keras.Input((5, 3)), NGramContext(order=2)]).save(path)
    script = textwrap.dedent(f"""
        import json, sys
        import seqapps
        light = "tensorflow" not in sys.modules
        import keras
        hidden = keras.saving.get_registered_object("seqapps>NGramContext")
        from seqapps import serializable
        model = serializable.load_model({str(path)!r})
        missing = [name for names in serializable.REGISTERED.values() for name in names
                   if keras.saving.get_registered_object("seqapps>" + name) is None]
        print(json.dumps({{"light": light, "hidden": hidden is not None, "missing": missing,
                          "layer": type(model.layers[-1]).__name__,
                          "pipelines": sorted(m for m in sys.modules if m.split(".")[0] == "pipelines")}}))
    """)
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert json.loads(completed.stdout.strip().splitlines()[-1]) == {
        "light": True, "hidden": False, "missing": [], "layer": "NGramContext", "pipelines": []}


def test_ngram_context_concatenates_windows_of_order_minus_one_words():
    embeddings = np.arange(2 * 5 * 3, dtype="float32").reshape(2, 5, 3)
    layer = run_layer_test(NGramContext, {"order": 3}, embeddings, expected_output_shape=(2, 4, 6),
                           expected_num_trainable_weights=0, expected_num_non_trainable_weights=0,
                           other_input_data=embeddings[:1, :3], not_applicable={"fit": "the layer has no weights"})
    out = keras.ops.convert_to_numpy(layer(embeddings))
    expected = np.concatenate([embeddings[:, :4], embeddings[:, 1:5]], axis=-1)  # words t and t+1
    np.testing.assert_array_equal(out, expected)


def test_seasonal_difference_is_values_beside_their_change_over_one_period():
    window = np.random.default_rng(0).normal(size=(3, 7, 2)).astype("float32")
    layer = run_layer_test(SeasonalDifference, {"period": 3}, window, expected_output_shape=(3, 4, 4),
                           expected_num_trainable_weights=0, expected_num_non_trainable_weights=0,
                           other_input_data=window[:2, :5], not_applicable={"fit": "the layer has no weights"})
    out = keras.ops.convert_to_numpy(layer(window))
    np.testing.assert_allclose(out, np.concatenate([window[:, 3:], window[:, 3:] - window[:, :4]], axis=-1),
                               atol=1e-6)


def test_scaled_mae_matches_numpy_and_round_trips():
    loss = ScaledMeanAbsoluteError([2.0, 0.5])
    restored = keras.saving.deserialize_keras_object(json.loads(json.dumps(keras.saving.serialize_keras_object(loss))))
    y_true = np.array([[1.0, 2.0], [3.0, 4.0]], "float32")
    y_pred = np.array([[2.0, 2.5], [1.0, 4.0]], "float32")
    expected = np.mean(np.mean(np.abs(y_true - y_pred) / np.array([2.0, 0.5]), axis=-1))
    assert isinstance(restored, ScaledMeanAbsoluteError) and restored.scale == [2.0, 0.5]
    assert float(restored(y_true, y_pred)) == pytest.approx(expected, rel=1e-6)


def test_serializable_lists_every_object_the_library_registers():
    import keras

    from seqapps import serializable

    registered = {key.partition(">")[2] for key in keras.saving.get_custom_objects() if key.startswith("seqapps>")}
    listed = {name for names in serializable.REGISTERED.values() for name in names}
    assert registered == listed  # a registered object missing from REGISTERED would not load from a fresh process
