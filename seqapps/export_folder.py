"""An export folder's layout and its reader, without TensorFlow or Keras.

``seqapps finetune`` and ``seqapps predict`` check ``--from`` / the model path with ``read_export``
before they import TensorFlow (``seqapps.export`` writes exports and re-exports these names).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import yaml

from seqapps.errors import ExportError

ASSETS_EXTRA = "assets.extra"


def version_dirs(model_root: Path) -> dict[int, Path]:
    """Returns ``{version: folder}`` for the folders named by 1 to 18 ASCII digits under ``model_root``
    (others, such as ``²``, are ignored: an export never depends on other folders' names)."""
    if not model_root.is_dir():
        return {}
    return {int(p.name): p for p in model_root.iterdir()
            if p.is_dir() and p.name.isascii() and p.name.isdigit() and len(p.name) <= 18}


@dataclasses.dataclass
class ExportInfo:
    """An export folder and what ``assets.extra`` says about it."""

    path: Path
    pipeline: str
    preset: str
    config: dict[str, Any]
    state: dict[str, Any]
    metrics: dict[str, Any]

    @property
    def keras_model_path(self) -> Path:
        """The trainable model saved with the export."""
        return self.path / ASSETS_EXTRA / "model.keras"

    @property
    def version(self) -> int:
        """The export's version number."""
        return int(self.path.name)


def read_export(path: str | Path) -> ExportInfo:
    """Reads an export folder; ``saved_models/NAME`` means its latest version.

    Raises:
        ExportError: the folder is missing or is not a complete seqapps export.
    """
    path = Path(path)
    if not path.is_dir():
        raise ExportError(f"{path}: no such export folder (expected saved_models/NAME/VERSION)")
    if not (path / "saved_model.pb").is_file():
        versions = version_dirs(path)
        if not versions:
            raise ExportError(f"{path}: not a SavedModel export (no saved_model.pb, and no version folders)")
        path = versions[max(versions)]
    extra = path / ASSETS_EXTRA
    needed = ["config.yaml", "state.json", "metrics.json", "model.keras"]
    missing = [name for name in needed if not (extra / name).is_file()]
    if not (path / "saved_model.pb").is_file() or missing:
        raise ExportError(f"{path}: incomplete export, missing {', '.join(missing) or 'saved_model.pb'}")
    saved = yaml.safe_load((extra / "config.yaml").read_text(encoding="utf-8"))
    if not isinstance(saved, dict) or "pipeline" not in saved:
        raise ExportError(f"{extra / 'config.yaml'}: not a seqapps config (no 'pipeline' key)")
    return ExportInfo(path=path, pipeline=saved["pipeline"], preset=saved.get("preset", "default"),
                      config=saved.get("config") or {},
                      state=json.loads((extra / "state.json").read_text(encoding="utf-8")),
                      metrics=json.loads((extra / "metrics.json").read_text(encoding="utf-8")))
