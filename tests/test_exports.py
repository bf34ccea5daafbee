"""One export check for every registered pipeline: a new pipeline is covered without a test of its own.

Each pipeline's tiny export is moved to another folder, reloaded in a process that
imports only TensorFlow, and every signature is called with its own warm-up request.
The answers must equal those of the trainable ``model.keras`` (loaded by
``seqapps.serializable.load_model`` alone, no pipeline module) run through the pipeline's signatures in Keras.
"""
import dataclasses
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2

from seqapps import export_format, serializable
from seqapps.config import resolve_config
from seqapps.pipeline import REGISTRY
from tests.export_harness import call_many_in_tensorflow_only_process

pytestmark = pytest.mark.large


def warmup_calls(export_dir) -> list[tuple[str, dict[str, np.ndarray]]]:
    """The export's TF Serving warm-up requests as ``(signature, inputs)`` pairs."""
    logs = export_format.read_warmup_requests(export_dir / export_format.ASSETS_EXTRA / export_format.WARMUP_FILE)
    return [(log.predict_log.request.model_spec.signature_name,
             {name: tf.make_ndarray(tensor_pb2.TensorProto.FromString(proto.SerializeToString()))
              for name, proto in log.predict_log.request.inputs.items()}) for log in logs]


@pytest.fixture(scope="module")
def moved_exports(tiny_exports, tmp_path_factory) -> dict[str, tuple[Path, list, dict]]:
    """Every pipeline's tiny export moved to another folder, then each one's warm-up requests sent to it
    in one process that imports only TensorFlow.

    Returns:
        ``{name: (the moved export, its warm-up calls, the answer of call_many_in_tensorflow_only_process)}``.
    """
    root = tmp_path_factory.mktemp("elsewhere")
    jobs = {}
    for name in REGISTRY.names():
        moved = root / name / "1"
        shutil.copytree(tiny_exports[name]["export"], moved)
        jobs[name] = (moved, warmup_calls(moved))
    answers = call_many_in_tensorflow_only_process(jobs)
    return {name: (moved, calls, answers[name]) for name, (moved, calls) in jobs.items()}


@pytest.mark.parametrize("name", REGISTRY.names())
def test_moved_export_runs_every_signature_like_the_keras_model(moved_exports, name):
    moved, calls, answer = moved_exports[name]
    assert "error" not in answer, answer["error"]
    assert answer["imported"] == []
    assert {signature for signature, _ in calls} == set(answer["signatures"])
    assert "serving_default" in answer["signatures"]

    info = export_format.read_export(moved)
    pipeline = REGISTRY.get(name)()
    config = resolve_config(pipeline.Config, "tiny")
    data = dataclasses.replace(pipeline.load_data(config, None), state=info.state)  # the export's calibrated state
    signatures = pipeline.serving_module(serializable.load_model(info.keras_model_path), config, data).signatures
    for (signature_name, inputs), served in zip(calls, answer["outputs"]):
        spec = signatures[signature_name]
        assert all(s.shape[0] is None for s in spec.inputs.values())  # TF Serving's row format works
        expected = spec({key: tf.constant(value) for key, value in inputs.items()})
        assert set(expected) == set(served), signature_name
        for key, value in expected.items():
            value = value.numpy()
            if value.dtype.kind == "f":  # graph vs eager float32 kernels: a few ulps on O(1)-O(100) values
                np.testing.assert_allclose(served[key], value, rtol=1e-4, atol=1e-4, err_msg=f"{name}:{key}")
            else:
                np.testing.assert_array_equal(served[key], value, err_msg=f"{name}:{key}")


@pytest.fixture(scope="module")
def keras_loads(tiny_exports) -> dict[str, dict]:
    """Every pipeline's ``model.keras`` loaded by ``seqapps.serializable`` alone, all in one new process.

    Returns:
        ``{name: {"params": parameter count} or {"error": what failed}}``; ``"pipelines imported"`` is
        the error of a load that imported a pipeline module.
    """
    paths = {name: str(export_format.read_export(tiny_exports[name]["export"]).keras_model_path)
             for name in REGISTRY.names()}
    script = textwrap.dedent(f"""
        import json, sys
        import seqapps
        assert "tensorflow" not in sys.modules  # import seqapps stays light
        from seqapps import serializable
        found = {{}}
        for name, path in {paths!r}.items():
            try:
                found[name] = {{"params": serializable.load_model(path).count_params()}}
            except Exception as error:
                found[name] = {{"error": f"{{type(error).__name__}}: {{error}}"}}
            if any(m == "pipelines" or m.startswith("pipelines.") for m in sys.modules):
                found[name] = {{"error": "pipelines imported"}}
                break
        print(json.dumps(found))
    """)
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr[-2000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", REGISTRY.names())
def test_keras_file_loads_with_seqapps_serializable_alone(keras_loads, name):
    loaded = keras_loads.get(name, {"error": "not loaded: an earlier load imported pipelines"})
    assert loaded.get("params", 0) > 0, loaded


def test_the_library_imports_no_pipeline():
    completed = subprocess.run([sys.executable, "-c", "import sys, seqapps.pipeline, seqapps.cli, seqapps.runner; "
                                "print(any(m.split('.')[0] == 'pipelines' for m in sys.modules))"],
                               capture_output=True, text=True)
    assert completed.stdout.strip() == "False", completed.stderr[-2000:]
