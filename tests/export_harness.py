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
jobs_file, answer_file = sys.argv[1:]
answers = {}
for key, (export_dir, calls) in pickle.load(open(jobs_file, "rb")).items():
    try:
        loaded = tf.saved_model.load(export_dir)
        outputs = []
        for signature, inputs in calls:
            result = loaded.signatures[signature](**{name: tf.constant(value) for name, value in inputs.items()})
            outputs.append({name: value.numpy() for name, value in result.items()})
        answers[key] = {"outputs": outputs, "signatures": sorted(loaded.signatures)}
    except Exception as error:  # the other exports still answer
        answers[key] = {"error": f"{type(error).__name__}: {error}"}
    answers[key]["imported"] = sorted(name for name in ("keras", "seqapps", "pipelines")
                                      if sys.modules.get(name) is not None)
pickle.dump(answers, open(answer_file, "wb"))
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
        AssertionError: the process failed, or the export did not load or answer (the error is the message).
    """
    answer = call_many_in_tensorflow_only_process({"export": (export_dir, calls)})["export"]
    assert "error" not in answer, answer["error"]
    return answer


def call_many_in_tensorflow_only_process(
        jobs: dict[str, tuple[str | Path, list[tuple[str, dict[str, Any]]]]]) -> dict[str, dict[str, Any]]:
    """``call_in_tensorflow_only_process`` for several exports, one after another in one process.

    Args:
        jobs: ``{key: (export folder, calls)}``.

    Returns:
        ``{key: answer}``: each answer as ``call_in_tensorflow_only_process`` returns it, or ``{"error": what
        failed, "imported": ...}`` for an export that did not load or answer; ``imported`` counts every
        export loaded up to that one.

    Raises:
        AssertionError: the process failed (its stderr tail is the message).
    """
    with tempfile.TemporaryDirectory() as folder:
        jobs_file, answer_file = Path(folder) / "jobs.pkl", Path(folder) / "answer.pkl"
        jobs_file.write_bytes(pickle.dumps({
            key: (str(export_dir), [(name, {k: v if isinstance(v, np.ndarray) else np.asarray(v)
                                           for k, v in inputs.items()}) for name, inputs in calls])
            for key, (export_dir, calls) in jobs.items()}))
        completed = subprocess.run([sys.executable, "-c", _SCRIPT, str(jobs_file), str(answer_file)],
                                   capture_output=True, text=True, cwd=folder)
        assert completed.returncode == 0, completed.stderr[-3000:]
        return pickle.loads(answer_file.read_bytes())


def decoded(array: np.ndarray) -> Any:
    """A string output as nested lists of ``str``."""
    return np.vectorize(lambda b: b.decode("utf-8"), otypes=[object])(array).tolist()

