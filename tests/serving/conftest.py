"""Fixtures of the serving tests."""
from pathlib import Path

import pytest

from tests.serving.hostile import ServerProcess


@pytest.fixture(scope="session")
def hostile_server(tiny_model_root: Path) -> ServerProcess:
    """One ``seqapps serve`` process over every tiny export (REST and gRPC), shared by the hostile tests.

    Tests must leave it serving: ``ServerProcess.check`` asserts it still answers a normal request.
    """
    with ServerProcess(tiny_model_root, ["--grpc-port", "0"]) as server:
        yield server
