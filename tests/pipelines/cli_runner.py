"""Runs the ``seqapps`` command in-process for the end-to-end pipeline tests."""
import json
from pathlib import Path
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


def run_tiny(out: Path, name: str, *overrides: str) -> Path:
    """Runs ``seqapps run NAME --preset tiny`` into ``out``; returns the export folder (version 1).

    Args:
        out: an empty export root.
        name: the pipeline.
        overrides: ``key=value`` config overrides.
    """
    sets = [arg for override in overrides for arg in ("--set", override)]
    assert cli.main(["run", name, "--preset", "tiny", "--json", "--out", str(out), *sets]) == 0
    return out / name / "1"


def export_metrics(export: Path) -> dict[str, Any]:
    """Reads the metrics saved with an export."""
    return json.loads((export / "assets.extra" / "metrics.json").read_text())


def assert_rejected_in_one_line(capsys: Any, out: Path, name: str, argv: list[str], message: str) -> None:
    """Checks that ``seqapps run NAME --preset tiny ARGV`` exits 2 with one line holding ``message``
    and writes no export.
    """
    code, _, err = run_cli(capsys, "run", name, "--preset", "tiny", *argv, "--out", str(out))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (out / name).exists()


def sample_fine_tuning(pipeline: Any, export: str | Path, folder: Path, *overrides: str) -> tuple[Any, Any]:
    """What ``seqapps finetune`` loads for ``pipeline`` from ``export`` on its sample data, without training.

    Args:
        pipeline: the pipeline object.
        export: a tiny export of it.
        folder: where ``write_sample_data`` writes.
        overrides: ``key=value`` settings over the tiny preset.

    Returns:
        ``(the export's info, the fine-tuning splits)``.
    """
    from seqapps.config import resolve_config
    from seqapps.export_format import read_export

    info = read_export(export)
    data_path, _ = pipeline.write_sample_data(folder)
    config = resolve_config(pipeline.Config, "tiny", overrides=list(overrides))
    return info, pipeline.load_data(config, data_path, state=info.state)


def weights_by_path(model: Any) -> dict[str, Any]:
    """A Keras model's weights as NumPy arrays, by path."""
    import keras

    return {weight.path: keras.ops.convert_to_numpy(weight) for weight in model.weights}

