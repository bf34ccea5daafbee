"""Every Keras layer and model the library registers goes through the shared harness (tests/layers/harness.py)."""
import ast
import importlib
import pathlib
import pkgutil

import keras

import seqapps.layers
import seqapps.serializable  # noqa: F401  (imports every module with registered objects)

TESTS = pathlib.Path(__file__).resolve().parents[1]


def registered_layer_names() -> set[str]:
    """The layers and models registered under the ``seqapps`` package, with every module of seqapps.layers imported."""
    for module in pkgutil.iter_modules(seqapps.layers.__path__):
        importlib.import_module(f"seqapps.layers.{module.name}")
    return {key.split(">", 1)[1] for key, value in keras.saving.get_custom_objects().items()
            if key.startswith("seqapps>") and isinstance(value, type) and issubclass(value, keras.layers.Layer)}


def _name(node: ast.expr) -> str:
    """``x`` of a name ``x`` or an attribute ``a.x``."""
    return node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")


def harnessed_names() -> set[str]:
    """The first argument of every ``run_layer_test(...)`` call in the test suite."""
    return {_name(node.args[0]) for path in TESTS.rglob("test_*.py")
            for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.Call) and _name(node.func) == "run_layer_test" and node.args}


def test_every_registered_layer_and_model_has_a_harness_test():
    registered = registered_layer_names()
    assert {"BatchNCE", "DecoupledHRNN", "HRNNSequenceModel", "LogMelSpectrogram"} <= registered  # the scan works
    missing = registered - harnessed_names()
    assert not missing, f"registered without a run_layer_test: {sorted(missing)}"
