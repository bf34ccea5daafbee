"""Test configuration: size markers (as keras-hub does) and quiet TensorFlow logs."""
import contextlib
import io
import os

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

    Returns:
        ``{name: {"export", "code", "out", "err"}}``: the export folder (``<root>/<name>/1``), the exit
        code and what the command printed on stdout and stderr.
    """
    from seqapps import cli
    from seqapps.pipeline import REGISTRY

    root = tmp_path_factory.mktemp("tiny_exports")
    found = {}
    for name in REGISTRY.names():
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(["run", name, "--preset", "tiny", "--out", str(root)])
        found[name] = {"export": str(root / name / "1"), "code": code, "out": out.getvalue(), "err": err.getvalue()}
    return found
