"""seqapps: recurrent-network applications on Keras 3 / TensorFlow.

``import seqapps`` imports no TensorFlow. The library's Keras objects
(``seqapps.serializable``) are registered as soon as Keras is imported, before or
after this package, so that ``keras.saving.load_model`` reads any seqapps
``.keras`` file without importing a pipeline.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType
from typing import Any, Sequence

__version__ = "0.1.0"


class _RegisterAfterKeras(importlib.abc.MetaPathFinder):
    """Imports ``seqapps.serializable`` right after the ``keras`` package finishes importing."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname != "keras":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("keras")
        if spec is None or spec.loader is None:
            return spec
        exec_keras = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            exec_keras(module)
            importlib.import_module("seqapps.serializable")

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if "keras" in sys.modules:
    importlib.import_module("seqapps.serializable")
else:
    sys.meta_path.insert(0, _RegisterAfterKeras())
