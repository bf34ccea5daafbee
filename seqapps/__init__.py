"""seqapps: recurrent-network applications on Keras 3 / TensorFlow.

``import seqapps`` imports no TensorFlow. The library's Keras objects
(``seqapps.serializable``) are registered as soon as Keras has been imported, before
or after this package, so that ``keras.saving.load_model`` reads any seqapps
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


def _initializing(name: str) -> bool:
    module = sys.modules.get(name)
    return module is not None and bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def _register_when_settled() -> None:
    """Imports ``seqapps.serializable`` once Keras is loaded and no seqapps module is half imported.

    A seqapps module that imports Keras is itself still initialising at that moment;
    registering then would import it again in a circle, so registration waits until
    the outermost import has finished.
    """
    if "seqapps.serializable" in sys.modules or "keras" not in sys.modules or _initializing("keras"):
        return
    if any(_initializing(name) for name in list(sys.modules) if name.startswith("seqapps.")):
        return
    importlib.import_module("seqapps.serializable")
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _RegisterAfterImports)]


class _RegisterAfterImports(importlib.abc.MetaPathFinder):
    """Runs ``_register_when_settled`` after ``keras`` or any ``seqapps`` module finishes importing."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname != "keras" and not fullname.startswith("seqapps."):
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            module.__spec__._initializing = False  # type: ignore[union-attr]
            _register_when_settled()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if "keras" in sys.modules:
    _register_when_settled()
else:
    sys.meta_path.insert(0, _RegisterAfterImports())
