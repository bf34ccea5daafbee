"""Data files: how errors name a file (the file alone, or the CSV line that lists it), the data
cache, and generated data folders written atomically."""
from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Callable


def data_home() -> Path:
    """The data cache, where generated corpora and converted tfds sets are kept: ``$SEQAPPS_DATA``, else
    ``~/.cache/seqapps``."""
    return Path(os.environ.get("SEQAPPS_DATA") or Path.home() / ".cache" / "seqapps")


def where(path: str | Path, csv_path: str | Path | None = None, row: int | None = None, kind: str = "file") -> str:
    """Names a data file for an error message.

    Args:
        path: the file.
        csv_path: the table that lists the file, if any.
        row: the table's line number, if known.
        kind: what the file holds ("audio", "image"), said before its path.

    Returns:
        ``"path"``, or ``"table line N: kind path"``.
    """
    if csv_path is None:
        return str(path)
    return f"{csv_path}" + (f" line {row}" if row is not None else "") + f": {kind} {path}"


def build_folder_atomically(final: Path, build: Callable[[Path], None]) -> Path:
    """Builds a data folder in a hidden temporary sibling and renames it into place.

    A kill at any moment leaves no half-written ``final``; when another process finished
    the same folder first, its copy is kept and this one discarded.

    Args:
        final: the folder to create.
        build: writes the folder's contents into the temporary folder it is given.

    Returns:
        ``final``.
    """
    temporary = final.parent / f".{final.name}.{uuid.uuid4().hex[:8]}"
    try:
        temporary.mkdir(parents=True)
        build(temporary)
        if not final.exists():
            os.replace(temporary, final)
    finally:
        if temporary.exists():
            shutil.rmtree(temporary)
    return final
