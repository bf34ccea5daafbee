"""Runs the ``seqapps`` command in-process for the end-to-end pipeline tests."""
import json
from typing import Any

from seqapps import cli


def run_cli(capsys: Any, *argv: str) -> tuple[int, Any, str]:
    """Runs ``seqapps ARGV``; returns (exit code, last stdout line as JSON or None, stderr)."""
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    try:
        last = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        last = None
    return code, last, captured.err
