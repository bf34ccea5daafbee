"""Every pipeline's tiny export, served by ``seqapps serve`` and called with its own warm-up request."""
import base64
import json

import httpx
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2

from seqapps import export_format
from seqapps.pipeline import REGISTRY
from seqapps.serving.app import serve_in_thread
from seqapps.serving.runner import ServingOptions

pytestmark = pytest.mark.large


@pytest.fixture(scope="module")
def client(tiny_model_root):
    with serve_in_thread(tiny_model_root, ServingOptions(poll_seconds=0.2)) as url:
        with httpx.Client(base_url=url, timeout=120) as http_client:
            yield http_client


def warmup_inputs(version_dir) -> dict[str, np.ndarray]:
    """The inputs of the export's TF Serving warm-up request, as NumPy arrays."""
    logs = export_format.read_warmup_requests(version_dir / export_format.ASSETS_EXTRA / export_format.WARMUP_FILE)
    (log,) = [log for log in logs if log.predict_log.request.model_spec.signature_name == "serving_default"]
    return {name: tf.make_ndarray(tensor_pb2.TensorProto.FromString(proto.SerializeToString()))
            for name, proto in log.predict_log.request.inputs.items()}


def to_json(value: np.ndarray):
    """TF Serving's JSON for a tensor: bytes as {"b64": ...}, numbers as nested lists."""
    if value.dtype == object:
        return np.vectorize(lambda b: {"b64": base64.b64encode(b).decode()}, otypes=[object])(value).tolist()
    return value.tolist()


@pytest.mark.parametrize("name", REGISTRY.names())
def test_every_pipeline_export_is_served_like_tf_serving(client, tiny_model_root, name):
    status = client.get(f"/v1/models/{name}").json()
    assert status["model_version_status"][0]["state"] == "AVAILABLE", status
    metadata = client.get(f"/v1/models/{name}/metadata").json()
    signature = metadata["metadata"]["signature_def"]["signature_def"]["serving_default"]

    inputs = warmup_inputs(tiny_model_root / name / "1")
    assert set(inputs) == set(signature["inputs"])
    response = client.post(f"/v1/models/{name}:predict",
                           json={"inputs": {key: to_json(value) for key, value in inputs.items()}})
    assert response.status_code == 200, response.text
    outputs = response.json()["outputs"]
    direct = tf.saved_model.load(str(tiny_model_root / name / "1")).signatures["serving_default"](
        **{key: tf.constant(value) for key, value in inputs.items()})
    if not isinstance(outputs, dict):  # a single output comes back bare, as TF Serving does
        outputs = {next(iter(direct)): outputs}
    assert set(outputs) == set(direct) == set(signature["outputs"])
    for key, value in direct.items():
        assert np.shape(outputs[key]) == tuple(value.shape), key


def over_limit_requests(inputs: dict[str, np.ndarray], limits: dict) -> dict[str, dict]:
    """Requests just past each bound the export's limits.json sets, built from its warm-up request."""
    requests = {}
    rows = limits["max_batch_size"] + 1
    requests["rows"] = {key: np.repeat(value[:1], rows, axis=0) for key, value in inputs.items()}
    strings = [key for key, value in inputs.items() if value.dtype == object]
    if limits.get("max_string_bytes") and strings:
        big = {key: value[:1].copy() for key, value in inputs.items()}
        big[strings[0]][0] = b"a" * (limits["max_string_bytes"] + 1)
        requests["string bytes"] = big
    if limits.get("max_generated_length") and "length" in inputs:
        long = {key: value[:1].copy() for key, value in inputs.items()}
        long["length"][0] = limits["max_generated_length"] + 1
        requests["generated length"] = long
    return requests


@pytest.mark.parametrize("name", REGISTRY.names())
def test_every_pipeline_export_bounds_its_requests(client, tiny_model_root, name):
    version_dir = tiny_model_root / name / "1"
    limits = json.loads((version_dir / export_format.ASSETS_EXTRA / export_format.LIMITS_FILE).read_text())
    inputs = warmup_inputs(version_dir)
    for bound, request in over_limit_requests(inputs, limits).items():
        response = client.post(f"/v1/models/{name}:predict",
                               json={"inputs": {key: to_json(value) for key, value in request.items()}})
        assert response.status_code == 400, (bound, response.text)
        assert "limit" in response.json()["error"], bound
    good = client.post(f"/v1/models/{name}:predict", json={"inputs": {k: to_json(v) for k, v in inputs.items()}})
    assert good.status_code == 200, good.text
