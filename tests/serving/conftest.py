"""Fixtures of the serving tests."""
from pathlib import Path

import pytest

from tests.serving.hostile import ServerProcess


@pytest.fixture(scope="session")
def hostile_server(tiny_exports: dict) -> ServerProcess:
    """One ``seqapps serve`` process over every tiny export (REST and gRPC), shared by the hostile tests.

    Tests must leave it serving: ``ServerProcess.check`` asserts it still answers a normal request.
    """
    model_root = Path(next(iter(tiny_exports.values()))["export"]).parents[1]
    with ServerProcess(model_root, ["--grpc-port", "0"]) as server:
        yield server
