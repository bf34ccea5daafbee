"""Test configuration: size markers (as keras-hub does) and quiet TensorFlow logs."""
import contextlib
import io
import json
import os
import shutil
from pathlib import Path
from typing import Callable

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-extra-large", action="store_true", default=False,
                     help="also run tests marked extra_large (default presets, benchmarks)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-extra-large"):
        return
    marker = pytest.mark.skip(reason="extra_large: opt in with --run-extra-large")
    for item in items:
        if "extra_large" in item.keywords:
            item.add_marker(marker)


@pytest.fixture(scope="session")
def tiny_exports(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every registered pipeline trained on its tiny preset once per test session, as a person runs it.

    Each run goes through the command line without ``--json`` (``seqapps run NAME --preset tiny``),
    so ``tests/test_user_paths.py`` can read what a person sees on the terminal.

    The exports go to ``<root>/saved_models`` and, as a person's would, the run folders to the
    default ``--logdir``, ``<root>/runs`` beside them. Tests only read them.

    Returns:
        ``{name: {"export", "run_folder", "code", "out", "err"}}``: the export folder
        (``<root>/saved_models/<name>/1``), the run folder (``<root>/runs/<name>/1``, with
        ``report.html``), the exit code and what the command printed on stdout and stderr.
    """
    from seqapps import cli
    from seqapps.pipeline import REGISTRY

    root = tmp_path_factory.mktemp("tiny_exports")
    found = {}
    for name in REGISTRY.names():
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(["run", name, "--preset", "tiny", "--out", str(root / "saved_models")])
        found[name] = {"export": str(root / "saved_models" / name / "1"), "run_folder": str(root / "runs" / name / "1"),
                       "code": code, "out": out.getvalue(), "err": err.getvalue()}
    return found


@pytest.fixture(scope="session")
def tiny_run(tiny_exports: dict, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict]:
    """A private copy of a pipeline's tiny export from ``tiny_exports``, with the run's result.

    A test that fine-tunes from the copy, or writes next to it, leaves the shared exports alone;
    no pipeline is trained twice on its tiny preset in one session.

    Returns:
        ``copy(name)`` -> the result ``runner.run(name, "tiny")`` returned (as the export's
        ``metrics.json`` holds it), its ``export`` the copy's folder ``<tmp>/<name>/1``.
    """
    def copy(name: str) -> dict:
        assert tiny_exports[name]["code"] == 0, tiny_exports[name]["err"]
        folder = tmp_path_factory.mktemp(f"{name}_copy") / name / "1"
        shutil.copytree(tiny_exports[name]["export"], folder)
        result = json.loads((folder / "assets.extra" / "metrics.json").read_text(encoding="utf-8"))
        return {"pipeline": name, "preset": "tiny", **result, "export": str(folder)}

    return copy


@pytest.fixture(scope="session")
def tiny_report(tiny_exports: dict) -> Callable[[str], tuple]:
    """What a pipeline's tiny run from ``tiny_exports`` left in its run folder, for the report's tests.

    Returns:
        ``report(name)`` -> ``(folder, result, arrays)``: the run folder (``runs/<name>/1``), its
        ``result.json`` and its report data (``report_data.npz``).
    """
    from seqapps.report import run_folder

    def report(name: str) -> tuple:
        assert tiny_exports[name]["code"] == 0, tiny_exports[name]["err"]
        folder = Path(tiny_exports[name]["run_folder"])
        result = json.loads((folder / run_folder.RESULT_FILE).read_text(encoding="utf-8"))
        return folder, result, run_folder.load_report_data(folder)

    return report
