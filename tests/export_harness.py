"""Runs SavedModel signatures in a fresh process that imports only TensorFlow, as TF Serving does."""
from __future__ import annotations

import pickle
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

_SCRIPT = """
import pickle, sys
for blocked in ("keras", "seqapps", "pipelines"):  # an import of any of them now fails
    sys.modules[blocked] = None
import tensorflow as tf
export_dir, calls_file, answer_file = sys.argv[1:]
calls = pickle.load(open(calls_file, "rb"))
loaded = tf.saved_model.load(export_dir)
outputs = []
for signature, inputs in calls:
    result = loaded.signatures[signature](**{name: tf.constant(value) for name, value in inputs.items()})
    outputs.append({name: value.numpy() for name, value in result.items()})
imported = sorted(name for name in ("keras", "seqapps", "pipelines") if sys.modules.get(name) is not None)
pickle.dump({"outputs": outputs, "imported": imported, "signatures": sorted(loaded.signatures)},
            open(answer_file, "wb"))
"""


def call_in_tensorflow_only_process(export_dir: str | Path,
                                    calls: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Loads ``export_dir`` in a new Python process that can import only TensorFlow and calls signatures.

    ``keras``, ``seqapps`` and ``pipelines`` are made unimportable in that process, so the
    export provably needs none of them (TF Serving has no Python at all).

    Args:
        export_dir: the SavedModel folder.
        calls: ``(signature name, inputs)`` pairs; inputs are NumPy arrays or lists.

    Returns:
        ``{"outputs": [dict of NumPy outputs per call], "imported": [keras/seqapps/pipelines if imported],
        "signatures": [names]}``.

    Raises:
        AssertionError: the process failed (its stderr tail is the message).
    """
    with tempfile.TemporaryDirectory() as folder:
        calls_file, answer_file = Path(folder) / "calls.pkl", Path(folder) / "answer.pkl"
        calls_file.write_bytes(pickle.dumps([(name, {k: np.asarray(v) if not isinstance(v, np.ndarray) else v
                                                     for k, v in inputs.items()}) for name, inputs in calls]))
        completed = subprocess.run([sys.executable, "-c", _SCRIPT, str(export_dir), str(calls_file),
                                    str(answer_file)], capture_output=True, text=True, cwd=folder)
        assert completed.returncode == 0, completed.stderr[-3000:]
        return pickle.loads(answer_file.read_bytes())


def decoded(array: np.ndarray) -> Any:
    """A string output as nested lists of ``str``."""
    return np.vectorize(lambda b: b.decode("utf-8"), otypes=[object])(array).tolist()

