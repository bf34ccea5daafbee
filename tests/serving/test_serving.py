"""``seqapps serve``: TF Serving's REST API over a temp model root, on free loopback ports."""
import asyncio
import base64
import concurrent.futures
import http.client
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seqapps import cli, runner, serving

pytestmark = pytest.mark.large

REPO = Path(__file__).resolve().parents[2]
WEATHER = "weather_forecasting"
COLUMNS = ["temp_air", "temp_dew", "relative_humidity", "pressure", "wind_speed"]
MAX_BODY = 1_000_000


def save_echo(path: Path, tag: str) -> None:
    """Saves a SavedModel taking a tf.string ``text``: ``serving_default`` returns ``echo_bytes``
    (the input), ``greeting`` (``tag`` + text) and ``length``; ``upper`` has one output."""

    class Echo(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
        def serve(self, text):
            return {"echo_bytes": text, "greeting": tf.strings.join([tag, text]),
                    "length": tf.strings.length(text)}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
        def upper(self, text):
            return {"upper": tf.strings.upper(text)}

    module = Echo()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve, "upper": module.upper})


@pytest.fixture(scope="module")
def model_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("saved_models")
    runner.run(WEATHER, "tiny", out=root)
    save_echo(root / "echo" / "1", "v1:")
    shutil.copytree(root / "echo" / "1", root / "hot" / "1")
    for ignored in (root / WEATHER / ".tmp-123-abc", root / WEATHER / ".checkpoints", root / WEATHER / "abc",
                    root / ".hidden" / "1", root / "empty"):
        ignored.mkdir(parents=True, exist_ok=True)
    (root / "notes.txt").write_text("not a model")
    return root


@pytest.fixture(scope="module")
def url(model_root):
    options = serving.ServingOptions(max_batch_size=8, batch_timeout_ms=2, max_body_bytes=MAX_BODY,
                                     poll_seconds=0.2, model_threads=2)
    with serving.serve_in_thread(model_root, options) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def client(url):
    with httpx.Client(base_url=url, timeout=60) as http_client:
        yield http_client


@pytest.fixture(scope="module")
def weather_signature(model_root):
    return tf.saved_model.load(str(model_root / WEATHER / "1")).signatures["serving_default"]


def weather_inputs(rows, seed=0):
    rng = np.random.default_rng(seed)
    inputs = {column: rng.normal(10, 5, (rows, 48)).astype("float32") for column in COLUMNS}
    inputs["end_time"] = 1_700_000_000 + 3600 * np.arange(rows, dtype="int64")
    return inputs


def direct(signature, inputs):
    return {key: value.numpy() for key, value in signature(
        **{name: tf.constant(value) for name, value in inputs.items()}).items()}


def instances(inputs):
    rows = len(inputs["end_time"])
    return [{name: value[i].tolist() for name, value in inputs.items()} for i in range(rows)]


def assert_weather_matches(predictions, expected):
    np.testing.assert_allclose([row["temp_air"] for row in predictions], expected["temp_air"], rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_array_equal([row["forecast_time"] for row in predictions], expected["forecast_time"])


def assert_serves_weather(client, weather_signature):
    inputs = weather_inputs(2, seed=7)
    response = client.post(f"/v1/models/{WEATHER}:predict", json={"instances": instances(inputs)})
    assert response.status_code == 200, response.text
    assert_weather_matches(response.json()["predictions"], direct(weather_signature, inputs))


def raw_request(url, method, path, body=b""):
    """Sends ``path`` exactly as written (no client-side URL normalization); returns (status, JSON)."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        connection.request(method, path, body, {"content-type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_status_ignores_temp_and_non_integer_folders(client):
    available = {"model_version_status": [{"version": "1", "state": "AVAILABLE",
                                           "status": {"error_code": "OK", "error_message": ""}}]}
    assert client.get(f"/v1/models/{WEATHER}").json() == available
    assert client.get(f"/v1/models/{WEATHER}/versions/1").json() == available
    assert client.get("/v1/models/empty").status_code == 404
    assert "/v1/models/{model_name}:predict" in client.get("/openapi.json").json()["paths"]


def test_metadata_lists_signature_names_dtypes_and_shapes(client):
    body = client.get(f"/v1/models/{WEATHER}/metadata").json()
    assert body["model_spec"] == {"name": WEATHER, "signature_name": "", "version": "1"}
    signature = body["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert signature["method_name"] == "tensorflow/serving/predict"
    assert set(signature["inputs"]) == {*COLUMNS, "end_time"}
    assert signature["inputs"]["temp_air"]["dtype"] == "DT_FLOAT"
    assert [d["size"] for d in signature["inputs"]["temp_air"]["tensor_shape"]["dim"]] == ["-1", "48"]
    assert signature["inputs"]["end_time"]["dtype"] == "DT_INT64"
    assert signature["outputs"]["temp_air"]["dtype"] == "DT_FLOAT"
    assert [d["size"] for d in signature["outputs"]["temp_air"]["tensor_shape"]["dim"]] == ["-1", "24"]
    echo = client.get("/v1/models/echo/versions/1/metadata").json()["metadata"]["signature_def"]["signature_def"]
    assert set(echo) == {"serving_default", "upper"}
    assert echo["upper"]["inputs"]["text"]["dtype"] == "DT_STRING"


def test_predict_row_and_columnar_match_saved_model(client, weather_signature):
    inputs = weather_inputs(3)
    expected = direct(weather_signature, inputs)
    for path in (f"/v1/models/{WEATHER}:predict", f"/v1/models/{WEATHER}/versions/1:predict"):
        response = client.post(path, json={"instances": instances(inputs)})
        assert response.status_code == 200, response.text
        assert_weather_matches(response.json()["predictions"], expected)
    response = client.post(f"/v1/models/{WEATHER}:predict", json={
        "signature_name": "serving_default", "inputs": {name: value.tolist() for name, value in inputs.items()}})
    assert response.status_code == 200, response.text
    outputs = response.json()["outputs"]
    np.testing.assert_allclose(outputs["temp_air"], expected["temp_air"], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(outputs["forecast_time"], expected["forecast_time"])


def test_concurrent_requests_are_batched_and_split_back(url, weather_signature):
    requests = [weather_inputs(1 + i % 3, seed=i) for i in range(24)]

    def send(inputs):
        with httpx.Client(base_url=url, timeout=60) as own:
            return own.post(f"/v1/models/{WEATHER}:predict", json={"instances": instances(inputs)})

    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        responses = list(pool.map(send, requests))
    for inputs, response in zip(requests, responses):
        assert response.status_code == 200, response.text
        assert_weather_matches(response.json()["predictions"], direct(weather_signature, inputs))


def test_batcher_merges_queued_requests_and_isolates_a_failing_one():
    calls = []

    def double(x):
        calls.append(int(x.shape[0]))
        tf.debugging.assert_non_negative(x)
        return {"y": x * 2.0}

    info = serving.TensorInfo(tf.float32, (None, 2))
    signature = serving.Signature("serving_default", double, {"x": info}, {"y": info})
    good = [np.full((rows, 2), value, "float32") for rows, value in ((1, 1.0), (2, 2.0), (3, 3.0))]
    bad = np.full((1, 2), -1.0, "float32")

    def send_all(requests):
        async def gather():
            batcher = serving.Batcher(signature, executor, max_batch_size=16, timeout=0.05, slots=1)
            return await asyncio.gather(*(batcher.predict({"x": x}, len(x)) for x in requests),
                                        return_exceptions=True)
        return asyncio.run(gather())

    with concurrent.futures.ThreadPoolExecutor(1) as executor:
        results = send_all(good)
        assert calls == [6]  # one call, split back per request
        for x, result in zip(good, results):
            np.testing.assert_array_equal(result["y"], x * 2)
        calls.clear()
        results = send_all([*good, bad])
    assert calls[0] == 7  # the merged call fails, so each request is rerun alone
    assert sorted(calls[1:]) == [1, 1, 2, 3]
    assert isinstance(results[3], tf.errors.InvalidArgumentError)
    for x, result in zip(good, results):
        np.testing.assert_array_equal(result["y"], x * 2)


def test_b64_inputs_and_bytes_outputs(client):
    raw = b"\xff\x00binary"
    response = client.post("/v1/models/echo:predict",
                           json={"instances": [{"b64": base64.b64encode(raw).decode()}, "héllo"]})
    assert response.status_code == 200, response.text
    first, second = response.json()["predictions"]
    assert base64.b64decode(first["echo_bytes"]["b64"]) == raw
    assert first["length"] == len(raw)
    assert second == {"echo_bytes": {"b64": base64.b64encode("héllo".encode()).decode()},
                      "greeting": "v1:héllo", "length": len("héllo".encode())}
    single = client.post("/v1/models/echo:predict", json={"signature_name": "upper", "instances": ["ab", "c"]})
    assert single.json() == {"predictions": ["AB", "C"]}
    columnar = client.post("/v1/models/echo:predict",
                           json={"signature_name": "upper", "inputs": {"text": [{"b64": "eHk="}]}})
    assert columnar.json() == {"outputs": ["XY"]}


def test_new_version_is_picked_up_without_downtime(client, model_root):
    staging = model_root / "hot" / ".tmp-export"
    save_echo(staging, "v2:")
    staging.rename(model_root / "hot" / "2")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        response = client.post("/v1/models/hot:predict", json={"instances": ["x"]})
        assert response.status_code == 200, response.text  # the old version serves until the new one loads
        if response.json()["predictions"][0]["greeting"] == "v2:x":
            break
        time.sleep(0.1)
    else:
        pytest.fail("version 2 was not picked up within 60 s")
    status = client.get("/v1/models/hot").json()["model_version_status"]
    assert [(s["version"], s["state"]) for s in status] == [("2", "AVAILABLE")]
    assert client.get("/v1/models/hot/versions/1").status_code == 404
    assert client.post("/v1/models/hot/versions/2:predict", json={"inputs": ["y"]}).status_code == 200


def test_a_broken_version_is_reported_and_the_last_good_one_served(client, model_root):
    broken = model_root / "hot" / ".tmp-broken"
    broken.mkdir()
    (broken / "saved_model.pb").write_bytes(b"not a SavedModel")
    broken.rename(model_root / "hot" / "3")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "3" not in [s["version"] for s in
                                                      client.get("/v1/models/hot").json()["model_version_status"]]:
        time.sleep(0.1)
    status = client.get("/v1/models/hot").json()["model_version_status"]
    assert [(s["version"], s["state"], s["status"]["error_code"]) for s in status] == [
        ("3", "END", "UNKNOWN"), ("2", "AVAILABLE", "OK")]
    assert client.post("/v1/models/hot:predict", json={"instances": ["z"]}).json()["predictions"][0][
        "greeting"] == "v2:z"
    assert client.post("/v1/models/hot/versions/3:predict", json={"instances": ["z"]}).status_code == 404


def good_row(**changes):
    row = {name: value[0].tolist() for name, value in weather_inputs(1).items()}
    row.update(changes)
    return row


BAD_PREDICTS = {
    "malformed JSON": (WEATHER, b'{"instances": [1, 2', 400),
    "not an object": (WEATHER, b"[1, 2, 3]", 400),
    "not UTF-8": (WEATHER, b"\xff\xfe{}", 400),
    "both formats": (WEATHER, {"instances": [good_row()], "inputs": {}}, 400),
    "neither format": (WEATHER, {"signature_name": "serving_default"}, 400),
    "empty instances": (WEATHER, {"instances": []}, 400),
    "unknown input name": (WEATHER, {"instances": [good_row(bogus=[1.0])]}, 400),
    "missing input": (WEATHER, {"inputs": {"temp_air": [[0.0] * 48]}}, 400),
    "mixed instances": (WEATHER, {"instances": [good_row(), [1.0]]}, 400),
    "unknown signature": (WEATHER, {"signature_name": "nope", "instances": [good_row()]}, 400),
    "string for float": (WEATHER, {"instances": [good_row(temp_air=["warm"] * 48)]}, 400),
    "float for int64": (WEATHER, {"instances": [good_row(end_time=1.5)]}, 400),
    "int64 overflow": (WEATHER, {"instances": [good_row(end_time=2 ** 70)]}, 400),
    "null value": (WEATHER, {"instances": [good_row(end_time=None)]}, 400),
    "b64 for a float input": (WEATHER, {"instances": [good_row(end_time={"b64": "AAAA"})]}, 400),
    "wrong shape": (WEATHER, {"instances": [good_row(temp_air=[1.0] * 47)]}, 400),
    "wrong rank": (WEATHER, {"inputs": {**{c: [1.0] * 48 for c in COLUMNS}, "end_time": [1]}}, 400),
    "ragged": (WEATHER, {"inputs": {**{c: [[1.0] * 48, [1.0]] for c in COLUMNS}, "end_time": [1, 2]}}, 400),
    "bad b64": ("echo", {"instances": [{"b64": "not base64!"}]}, 400),
    "number for a string input": ("echo", {"instances": [3]}, 400),
    "ragged strings": ("echo", {"inputs": {"text": [["a"], "b"]}}, 400),
    "unknown model": ("nosuchmodel", {"instances": [good_row()]}, 404),
    "model without versions": ("empty", {"instances": ["x"]}, 404),
    "hidden model folder": (".hidden", {"instances": ["x"]}, 400),
}


@pytest.mark.parametrize("case", list(BAD_PREDICTS))
def test_bad_predict_requests_get_4xx_and_json_error(client, weather_signature, case):
    name, body, status = BAD_PREDICTS[case]
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = client.post(f"/v1/models/{name}:predict", content=content,
                           headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    assert isinstance(response.json()["error"], str)
    assert_serves_weather(client, weather_signature)


BAD_PATHS = {
    "unknown version": ("GET", f"/v1/models/{WEATHER}/versions/9", 404),
    "unknown version predict": ("POST", f"/v1/models/{WEATHER}/versions/9:predict", 404),
    "non-integer version": ("GET", f"/v1/models/{WEATHER}/versions/latest", 400),
    "dot-dot": ("GET", "/v1/models/..", 400),
    "encoded dot-dot": ("GET", "/v1/models/%2E%2E/metadata", 400),
    "dot-dot predict": ("POST", "/v1/models/..:predict", 400),
    "encoded slash": ("POST", "/v1/models/..%2F..%2Fetc:predict", 404),
    "slash in name": ("GET", f"/v1/models/x/{WEATHER}", 404),
    "unknown route": ("GET", "/v2/models", 404),
    "wrong method": ("DELETE", f"/v1/models/{WEATHER}", 405),
}


@pytest.mark.parametrize("case", list(BAD_PATHS))
def test_bad_paths_get_4xx_and_json_error(url, client, weather_signature, case):
    method, path, status = BAD_PATHS[case]
    body = json.dumps({"instances": ["x"]}).encode() if method == "POST" else b""
    got, answer = raw_request(url, method, path, body)
    assert got == status, answer
    assert isinstance(answer["error"], str)
    assert_serves_weather(client, weather_signature)


def test_body_over_limit_gets_400(url, client, weather_signature):
    big = json.dumps({"instances": ["x" * MAX_BODY]}).encode()
    response = client.post("/v1/models/echo:predict", content=big, headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert "limit" in response.json()["error"]

    def chunks():
        yield big[:MAX_BODY // 2]
        yield big[MAX_BODY // 2:]

    chunked = client.post("/v1/models/echo:predict", content=chunks(), headers={"content-type": "application/json"})
    assert chunked.status_code == 400
    assert_serves_weather(client, weather_signature)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
    | st.sampled_from(["temp_air", "end_time", "text", "upper", "serving_default", "b64", "AAAA"]),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(
        st.sampled_from(["instances", "inputs", "signature_name", "b64", "text", "end_time", *COLUMNS])
        | st.text(max_size=4), children, max_size=4),
    max_leaves=30)
BODIES = st.one_of(
    JSON_VALUES.map(lambda value: json.dumps(value).encode()),
    st.fixed_dictionaries({}, optional={"instances": JSON_VALUES, "inputs": JSON_VALUES,
                                        "signature_name": JSON_VALUES}).map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=64))


@settings(max_examples=120, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from([WEATHER, "echo"]), body=BODIES)
def test_fuzzed_bodies_never_break_the_server(client, model, body):
    response = client.post(f"/v1/models/{model}:predict", content=body, headers={"content-type": "application/json"})
    assert response.status_code in (200, 400), response.text
    if response.status_code == 400:
        assert isinstance(response.json()["error"], str)


def test_server_answers_after_fuzzing(client, weather_signature):
    assert_serves_weather(client, weather_signature)


def test_cli_serve_in_a_subprocess(model_root):
    process = subprocess.Popen(
        [sys.executable, "-m", "seqapps.cli", "serve", str(model_root), "--port", "0", "--max-batch-size", "0"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"})
    try:
        selector = selectors.DefaultSelector()
        selector.register(process.stdout, selectors.EVENT_READ)
        assert selector.select(timeout=120), "seqapps serve printed nothing within 120 s"
        line = process.stdout.readline()
        assert line.startswith("seqapps serve: http://127.0.0.1:"), line
        base_url = line.split()[2]
        status = httpx.get(f"{base_url}/v1/models/echo", timeout=30).json()
        assert status["model_version_status"][0]["state"] == "AVAILABLE"
        answer = httpx.post(f"{base_url}/v1/models/echo:predict", json={"instances": ["q"]}, timeout=30).json()
        assert answer["predictions"][0]["greeting"] == "v1:q"
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0  # Ctrl-C: graceful shutdown, exit code 0


def test_cli_serve_reports_a_missing_root(tmp_path, capsys):
    assert cli.main(["serve", str(tmp_path / "missing"), "--port", "0"]) == 2
    assert "no such model root" in capsys.readouterr().err
