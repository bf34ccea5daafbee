"""How data errors name a file: the file alone, or the CSV line that lists it."""
from __future__ import annotations

from pathlib import Path


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
