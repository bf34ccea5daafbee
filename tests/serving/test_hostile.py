"""Hostile requests to a real ``seqapps serve`` process: bounded time and memory, and it serves on."""
import pytest

pytestmark = pytest.mark.large


def test_the_harness_measures_a_refused_request_and_the_server_serves_on(hostile_server):
    def normal():
        return hostile_server.post("/v1/models/text_generation:predict",
                                   json={"instances": [{"prompt": "a", "length": 2, "temperature": 1.0, "top_k": 0}]})

    too_many = hostile_server.post("/v1/models/text_generation:predict",
                                   json={"instances": [{"prompt": "a", "length": 1, "temperature": 1.0, "top_k": 0}] * 100_000})
    assert too_many.status == 400 and "limit" in too_many.body["error"]
    assert hostile_server.grpc_port
    hostile_server.check(too_many, normal)
    with pytest.raises(AssertionError):  # the check can fail: a 200 that is not the right answer
        hostile_server.check(normal(), normal, answered=lambda body: False)
