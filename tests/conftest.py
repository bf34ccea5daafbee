"""Test configuration: size markers (as keras-hub does) and quiet TensorFlow logs."""
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator, Mapping

import pytest
from filelock import FileLock

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-extra-large", action="store_true", default=False,
                     help="also run tests marked extra_large (default presets, benchmarks)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items[:] = scheduled_order(items)
    if config.getoption("--run-extra-large"):
        return
    marker = pytest.mark.skip(reason="extra_large: opt in with --run-extra-large")
    for item in items:
        if "extra_large" in item.keywords:
            item.add_marker(marker)


def scheduled_order(items: list[pytest.Item]) -> list[pytest.Item]:
    """The tests, module by module, in the order pytest-xdist hands the modules to its workers.

    ``--dist loadscope`` gives each worker a whole module at a time, in this order (setup.cfg turns off its
    own reordering). The modules marked ``long_fixtures`` go first, so that a module whose shared
    fixture runs for minutes is not the last one a worker starts while the other worker sits idle;
    then the rest, the modules with most tests first (what pytest-xdist's reordering does).

    Args:
        items: the collected tests.

    Returns:
        The same tests; a module's tests keep their order.
    """
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)

    def weight(tests: list[pytest.Item]) -> tuple[bool, int]:
        return "long_fixtures" not in tests[0].keywords, -len(tests)

    return [item for tests in sorted(modules.values(), key=weight) for item in tests]


def shared_folder(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A folder every pytest-xdist worker of this session sees (the session's temporary folder without xdist).

    Args:
        tmp_path_factory: pytest's factory; under xdist its base folder is one worker's, inside the session's.
        name: the folder's name.

    Returns:
        ``<session tmp>/<name>``, created.
    """
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class OncePerSession(Mapping):
    """``{pipeline name: what one command did}``, each command run once per session on first use.

    Whichever xdist worker asks first runs it, under a file lock, and writes its record as JSON in a folder
    all workers share; the others wait on the lock and read the record. Paths in a record are stored
    relative to the folder, so that a copied folder works too.
    """

    def __init__(self, root: Path, make: Callable[[Path, str], dict]) -> None:
        """
        Args:
            root: the shared folder (records in ``root/results``, locks in ``root/locks``).
            make: ``(root, name) -> record``: runs the command; the record's ``export``, ``run_folder``
                and ``from`` entries are paths inside ``root``.
        """
        self.root = root
        self.make = make
        self.found: dict[str, dict] = {}

    def __getitem__(self, name: str) -> dict:
        from seqapps.pipeline import REGISTRY

        if name not in REGISTRY.names():
            raise KeyError(name)
        if name not in self.found:
            record = self.root / "results" / f"{name}.json"
            (self.root / "locks").mkdir(exist_ok=True)
            with FileLock(self.root / "locks" / f"{name}.lock"):
                if not record.exists():
                    made = self.make(self.root, name)
                    relative = {key: str(Path(value).relative_to(self.root)) if key in PATH_KEYS and value else value
                                for key, value in made.items()}
                    record.parent.mkdir(exist_ok=True)
                    record.write_text(json.dumps(relative))
            stored = json.loads(record.read_text())
            self.found[name] = {key: str(self.root / value) if key in PATH_KEYS and value else value
                                for key, value in stored.items()}
        return self.found[name]

    def __iter__(self) -> Iterator[str]:
        from seqapps.pipeline import REGISTRY

        return iter(REGISTRY.names())

    def __len__(self) -> int:
        from seqapps.pipeline import REGISTRY

        return len(REGISTRY.names())


PATH_KEYS = ("export", "run_folder", "from")  # the entries of a OncePerSession record that are paths in its folder


def _tiny_run(root: Path, name: str) -> dict:
    """``seqapps run NAME --preset tiny --out ROOT/saved_models`` in this process, as a person runs it."""
    from seqapps import cli

    for folder in (root / "saved_models" / name, root / "runs" / name):  # a partial run of an earlier session
        shutil.rmtree(folder, ignore_errors=True)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["run", name, "--preset", "tiny", "--out", str(root / "saved_models")])
    return {"export": str(root / "saved_models" / name / "1"), "run_folder": str(root / "runs" / name / "1"),
            "code": code, "out": out.getvalue(), "err": err.getvalue()}


@pytest.fixture(scope="session")
def tiny_exports(tmp_path_factory: pytest.TempPathFactory) -> Mapping[str, dict]:
    """Every registered pipeline trained on its tiny preset once per test session, as a person runs it.

    Each run goes through the command line without ``--json`` (``seqapps run NAME --preset tiny``),
    so ``tests/test_user_paths.py`` can read what a person sees on the terminal. A pipeline is trained
    when a test first asks for it, by one xdist worker for all of them (``OncePerSession``).

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
    cache = os.environ.get("SEQAPPS_TINY_EXPORTS_CACHE")
    root = Path(cache) if cache else shared_folder(tmp_path_factory, "tiny_exports")
    root.mkdir(parents=True, exist_ok=True)
    return OncePerSession(root, _tiny_run)


@pytest.fixture(scope="session")
def tiny_model_root(tiny_exports: Mapping[str, dict]) -> Path:
    """The folder that holds every pipeline's tiny export (``<root>/saved_models``), each one trained by now."""
    roots = {Path(tiny_exports[name]["export"]).parents[1] for name in tiny_exports}
    assert len(roots) == 1, roots
    return roots.pop()


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
def tiny_finetune(tiny_exports: Mapping[str, dict], tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict]:
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

    def fine_tune_once(root: Path, name: str) -> dict:
        source = root / name / "1"
        shutil.rmtree(source.parent, ignore_errors=True)  # a partial fine-tune of an earlier session
        shutil.copytree(tiny_exports[name]["export"], source)
        data, _ = REGISTRY.get(name)().write_sample_data(tmp_path_factory.mktemp(f"{name}_sample"), seed=3)
        ran = subprocess.run([sys.executable, "-c", "import sys; from seqapps import cli; sys.exit(cli.main())",
                              "finetune", name, "--from", str(source), "--data", data or str(source)],
                             capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        return {"from": str(source), "data": data, "code": ran.returncode, "out": ran.stdout, "err": ran.stderr,
                "export": str(source.parent / "2")}

    done = OncePerSession(shared_folder(tmp_path_factory, "tiny_finetunes"), fine_tune_once)

    def fine_tune(name: str) -> dict:
        return done[name]

    return fine_tune
