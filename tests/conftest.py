"""Test configuration: size markers (as keras-hub does) and quiet TensorFlow logs."""
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
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

    For developers only: ``SEQAPPS_TINY_EXPORTS_CACHE=DIR`` keeps them in DIR across sessions and trains
    only the pipelines without a ``DIR/results/NAME.json``; delete that file (or the folder) after
    changing what a pipeline exports. CI never sets it.

    Returns:
        ``{name: {"export", "run_folder", "code", "out", "err"}}``: the export folder
        (``<root>/saved_models/<name>/1``), the run folder (``<root>/runs/<name>/1``, with
        ``report.html``), the exit code and what the command printed on stdout and stderr.
    """
    from seqapps import cli
    from seqapps.pipeline import REGISTRY

    cache = os.environ.get("SEQAPPS_TINY_EXPORTS_CACHE")
    root = Path(cache) if cache else tmp_path_factory.mktemp("tiny_exports")
    found = {}
    for name in REGISTRY.names():
        record = root / "results" / f"{name}.json"
        if cache and record.exists():  # paths relative to the cache, so that a copied cache works too
            found[name] = {**json.loads(record.read_text()), "export": str(root / "saved_models" / name / "1"),
                           "run_folder": str(root / "runs" / name / "1")}
            continue
        for folder in (root / "saved_models" / name, root / "runs" / name):  # a partial run of an earlier session
            shutil.rmtree(folder, ignore_errors=True)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(["run", name, "--preset", "tiny", "--out", str(root / "saved_models")])
        found[name] = {"export": str(root / "saved_models" / name / "1"), "run_folder": str(root / "runs" / name / "1"),
                       "code": code, "out": out.getvalue(), "err": err.getvalue()}
        if cache:
            record.parent.mkdir(parents=True, exist_ok=True)
            record.write_text(json.dumps(found[name]))
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


@pytest.fixture(scope="session")
def tiny_finetune(tiny_run: Callable[[str], dict], tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict]:
    """``seqapps finetune NAME`` once per session on a copy of the pipeline's tiny export, as a person runs it.

    The data is the pipeline's sample data (``Pipeline.write_sample_data(folder, seed=3)``), or, for a
    pipeline that reads no user data, the export folder itself (which it must refuse). The command runs
    without ``--json``, in a process of its own (so its stderr is what a person sees, whatever TensorFlow
    logged earlier in the session), and ``tests/test_user_paths.py`` and the pipelines' own tests read the
    same fine-tune: what it printed and the export it wrote.

    Returns:
        ``fine_tune(name)`` -> ``{"from", "data", "code", "out", "err", "export"}``: the copy it started
        from (``<tmp>/<name>/1``), the ``--data`` path (None when the pipeline reads none), the exit code,
        what it printed on stdout and stderr, and the new export's folder (``<tmp>/<name>/2``).
    """
    from seqapps.pipeline import REGISTRY

    done = {}

    def fine_tune(name: str) -> dict:
        if name not in done:
            source = tiny_run(name)["export"]
            data, _ = REGISTRY.get(name)().write_sample_data(tmp_path_factory.mktemp(f"{name}_sample"), seed=3)
            ran = subprocess.run([sys.executable, "-c", "import sys; from seqapps import cli; sys.exit(cli.main())",
                                  "finetune", name, "--from", source, "--data", data or source],
                                 capture_output=True, text=True,
                                 env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
            done[name] = {"from": source, "data": data, "code": ran.returncode, "out": ran.stdout, "err": ran.stderr,
                          "export": str(Path(source).parent / "2")}
        return done[name]

    return fine_tune
