"""Test configuration: size markers (as keras-hub does) and quiet TensorFlow logs."""
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
    """Every registered pipeline trained on its tiny preset once per test session.

    Returns:
        ``{name: run result}``; each result's ``export`` is ``<root>/<name>/1``.
    """
    from seqapps import runner
    from seqapps.pipeline import REGISTRY

    root = tmp_path_factory.mktemp("tiny_exports")
    return {name: runner.run(name, "tiny", out=root) for name in REGISTRY.names()}
