"""``seqapps serve``: TF Serving's REST API over a temp model root, on free loopback ports."""
import asyncio
import base64
import concurrent.futures
import contextlib
import http.client
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seqapps import cli
from seqapps.export_format import Limits
from seqapps.serving.app import free_port, serve_in_thread
from seqapps.serving.batching import Batcher
from seqapps.serving.protocol import request_limits
from seqapps.serving.repository import LoadedSignature, TensorInfo
from seqapps.serving.runner import ServingOptions

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


def save_generate(path: Path, limits: dict | None = None) -> None:
    """Saves a stand-in for text_generation's signature: ``prompt`` of any rank and a scalar
    ``length``; the answer takes ``length`` steps of a while loop (so a big length runs long)."""

    class Generate(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec(None, tf.string, name="prompt"),
                                      tf.TensorSpec([], tf.int32, name="length")])
        def serve(self, prompt, length):
            flat = tf.reshape(prompt, [-1])
            _, state = tf.while_loop(lambda i, x: i < length, lambda i, x: (i + 1, tf.sin(x) + 1.0),
                                     (tf.constant(0), tf.zeros(tf.shape(flat))))
            return {"text": flat + tf.strings.as_string(tf.cast(state > -1.0, tf.int32))}

    module = Generate()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    if limits is not None:
        (path / "assets.extra").mkdir(exist_ok=True)
        (path / "assets.extra" / "limits.json").write_text(json.dumps(limits))


def save_half_plus_two(path: Path) -> None:
    """Rebuilds TF Serving's ``half_plus_two`` test model: y = 0.5 x + 2 as ``serving_default``
    (``x`` float32 [-1, 1]) and as ``classify_x_to_y`` and ``regress_x_to_y`` over serialized
    tf.Examples holding ``x``. tf.saved_model.save marks every signature as a predict one, so
    the two method names are set in saved_model.pb afterwards, as TF Serving's copy has them."""
    from tensorflow.core.protobuf import saved_model_pb2

    class HalfPlusTwo(tf.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = tf.Variable(0.5), tf.Variable(2.0)

        @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32, name="x")])
        def predict(self, x):
            return {"y": self.a * x + self.b}

        def parse(self, serialized):
            return tf.io.parse_example(serialized, {"x": tf.io.FixedLenFeature([1], tf.float32)})["x"]

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
        def classify(self, inputs):
            return {"scores": self.a * self.parse(inputs) + self.b}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
        def regress(self, inputs):
            return {"outputs": self.a * self.parse(inputs) + self.b}

    module = HalfPlusTwo()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.predict,
                                                       "classify_x_to_y": module.classify,
                                                       "regress_x_to_y": module.regress})
    proto = saved_model_pb2.SavedModel.FromString((path / "saved_model.pb").read_bytes())
    defs = proto.meta_graphs[0].signature_def
    defs["classify_x_to_y"].method_name = "tensorflow/serving/classify"
    defs["regress_x_to_y"].method_name = "tensorflow/serving/regress"
    (path / "saved_model.pb").write_bytes(proto.SerializeToString())


@pytest.fixture(scope="module")
def model_root(tmp_path_factory, tiny_run):
    root = tmp_path_factory.mktemp("saved_models")
    shutil.copytree(tiny_run(WEATHER)["export"], root / WEATHER / "1")  # the session's tiny run
    save_echo(root / "echo" / "1", "v1:")
    shutil.copytree(root / "echo" / "1", root / "hot" / "1")
    shutil.copytree(root / "echo" / "1", root / "labelled" / "1")
    save_echo(root / "labelled" / "2", "v2:")
    save_generate(root / "generate" / "1")
    save_generate(root / "slow" / "1", {"max_generated_length": 10 ** 9, "max_batch_size": 4})
    save_half_plus_two(root / "half_plus_two" / "123")
    for ignored in (root / WEATHER / ".tmp-123-abc", root / WEATHER / ".checkpoints", root / WEATHER / "abc",
                    root / ".hidden" / "1", root / "empty"):
        ignored.mkdir(parents=True, exist_ok=True)
    (root / "notes.txt").write_text("not a model")
    for odd in ("\u00b2", "\u0661", "9" * 200):
        shutil.copytree(root / "echo" / "1", root / "echo" / odd)  # not ASCII integers: ignored
    (root / LABELS).write_text(json.dumps({"labelled": {"stable": 1, "canary": 2}}))
    return root


LABELS = "labels.json"
TIMEOUT_S = 4.0  # the fixture server's request deadline: long enough for any good request here


@pytest.fixture(scope="module")
def url(model_root):
    options = ServingOptions(max_batch_size=8, batch_timeout_ms=2, max_body_bytes=MAX_BODY,
                             poll_seconds=0.2, model_threads=2, request_timeout_s=TIMEOUT_S,
                             labels_file=str(model_root / LABELS))
    with serve_in_thread(model_root, options) as base_url:
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
    # A batched call and a one-row call run different float32 matmul blockings (oneDNN picks them by
    # batch size): the forecast sums terms of up to ~100 degC, so a few ulps of those (6e-6 each) show.
    np.testing.assert_allclose([row["temp_air"] for row in predictions], expected["temp_air"], rtol=1e-5,
                               atol=1e-4)
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


def test_an_exports_limits_take_the_place_of_the_servers():
    server = ServingOptions(max_request_rows=1024, max_string_bytes=100, max_generated_length=4096).limits
    assert request_limits(server, None) == server  # no limits.json: the server's bounds
    assert request_limits(server, Limits(max_batch_size=None)) == server  # one that sets none: the same
    speech = request_limits(server, Limits(max_batch_size=4, max_audio_samples=16_000, max_sequence_length=100))
    assert (speech.max_batch_size, speech.max_string_bytes, speech.max_sequence_length) == (4, 100, 16_000)
    assert speech.max_generated_length is None  # it generates nothing: its ``length`` input is a size
    assert request_limits(server, Limits(max_generated_length=10 ** 9)).max_generated_length == 10 ** 9


def test_the_grpc_path_does_not_import_fastapi():
    script = "import sys, seqapps.serving.grpc_service; print('fastapi' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}, check=True)
    assert done.stdout.strip() == "False"


def test_batcher_merges_queued_requests_and_isolates_a_failing_one():
    calls = []

    def double(x):
        calls.append(int(x.shape[0]))
        tf.debugging.assert_non_negative(x)
        return {"y": x * 2.0}

    info = TensorInfo(tf.float32, (None, 2))
    signature = LoadedSignature("serving_default", double, {"x": info}, {"y": info})
    good = [np.full((rows, 2), value, "float32") for rows, value in ((1, 1.0), (2, 2.0), (3, 3.0))]
    bad = np.full((1, 2), -1.0, "float32")

    def send_all(requests):
        async def gather():
            batcher = Batcher(signature, executor, max_batch_size=16, timeout=0.05, slots=1)
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


# --- issue 15: hostile but valid requests; the server answers a good request after each ---------------

def nested(value, depth):
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("depth", [33, 65, 400])
def test_a_prompt_nested_deeper_than_32_is_refused_before_tensorflow(client, weather_signature, depth):
    # ~100 bytes that made TensorFlow segfault (33 levels) or answer 500 (65 to ~400 levels)
    body = {"inputs": {"prompt": nested("a", depth), "length": 1}}
    response = client.post("/v1/models/generate:predict", json=body)
    assert response.status_code == 400, response.text
    assert "rank 32" in response.json()["error"]
    shallow = client.post("/v1/models/generate:predict", json={"inputs": {"prompt": nested("a", 3), "length": 2}})
    assert shallow.json() == {"outputs": ["a1"]}  # rank 3 of a rank-free input is fine
    assert_serves_weather(client, weather_signature)


def test_nesting_deeper_than_the_signature_rank_is_refused(client, weather_signature):
    response = client.post("/v1/models/echo:predict", json={"inputs": {"text": [[["a"]]]}})
    assert response.status_code == 400 and "rank 1" in response.json()["error"]
    assert_serves_weather(client, weather_signature)


BOUNDED = {
    "generated length 10**9 (std::bad_alloc)": ("generate", {"inputs": {"prompt": ["a"], "length": 10 ** 9}},
                                                 "limit is 4096"),
    "a 100 kB prompt": ("generate", {"inputs": {"prompt": ["x" * 100_000], "length": 1}}, "limit of 65536 bytes"),
    "rows over the export's limits.json": ("slow", {"inputs": {"prompt": ["a"] * 5, "length": 1}}, "limit is 4"),
    "200,000 one-character prompts": ("echo", {"instances": ["a"] * 200_000}, "limit is 1024"),
    "an empty prompt list": ("generate", {"inputs": {"prompt": [], "length": 1}}, "no rows"),
    "an empty batch": ("echo", {"inputs": {"text": []}}, "no rows"),
}


@pytest.mark.parametrize("case", list(BOUNDED))
def test_unbounded_work_is_refused_with_400(client, weather_signature, case):
    name, body, message = BOUNDED[case]
    response = client.post(f"/v1/models/{name}:predict", json=body)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]
    assert "\n" not in response.json()["error"]
    assert_serves_weather(client, weather_signature)


def test_the_deadline_stops_long_calls_and_frees_the_model_threads(url, client, weather_signature):
    long_call = {"inputs": {"prompt": ["a"], "length": 10 ** 9}}  # ~30 min of loop: allowed by its limits.json
    began = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # as many as the server's model threads
        answers = list(pool.map(lambda _: httpx.post(f"{url}/v1/models/slow:predict", json=long_call, timeout=60),
                                range(2)))
    assert [a.status_code for a in answers] == [504, 504], answers[0].text
    assert time.monotonic() - began < TIMEOUT_S + 10
    quick = time.monotonic()
    assert client.post("/v1/models/slow:predict", json={"inputs": {"prompt": ["a"], "length": 3}}).status_code == 200
    assert time.monotonic() - quick < 2.0  # both threads were given back, not pinned by the stopped calls
    assert_serves_weather(client, weather_signature)


def test_work_whose_client_has_gone_is_abandoned(url, client, weather_signature):
    long_call = {"inputs": {"prompt": ["a"], "length": 10 ** 9}}

    def give_up(_):
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/models/slow:predict", json=long_call, timeout=0.5)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(give_up, range(2)))
    began = time.monotonic()
    response = client.post("/v1/models/slow:predict", json={"inputs": {"prompt": ["b"], "length": 3}})
    assert response.status_code == 200
    assert time.monotonic() - began < TIMEOUT_S - 1  # sooner than the deadline would have freed the threads
    assert_serves_weather(client, weather_signature)


def test_version_folders_must_be_ascii_integers(url, client, model_root, weather_signature):
    status = client.get("/v1/models/echo").json()["model_version_status"]
    assert [s["version"] for s in status] == ["1"]  # '\u00b2', '\u0661' and 200 digits were ignored
    for path in ("/v1/models/echo/versions/%C2%B2", "/v1/models/echo/versions/%D9%A1",
                 "/v1/models/echo/versions/" + "9" * 5000, "/v1/models/echo/versions/%C2%B2:predict"):
        got, answer = raw_request(url, "POST" if path.endswith("predict") else "GET", path,
                                  b'{"instances": ["x"]}' if path.endswith("predict") else b"")
        assert got == 400, (path, answer)
        assert "ASCII" in answer["error"]
    shutil.copytree(model_root / "echo" / "1", model_root / "echo" / "7")  # the poll thread is alive
    deadline = time.monotonic() + 30
    while client.get("/v1/models/echo").json()["model_version_status"][0]["version"] != "7":
        assert time.monotonic() < deadline, "version 7 was not loaded: the poll thread died?"
        time.sleep(0.1)
    shutil.rmtree(model_root / "echo" / "7")
    assert_serves_weather(client, weather_signature)


def test_a_version_copied_in_slowly_is_retried_until_it_loads(client, model_root, tmp_path):
    source, target = model_root / "echo" / "1", model_root / "copied" / "1"
    save_echo(tmp_path / "v", "copied:")
    target.mkdir(parents=True)
    shutil.copy(tmp_path / "v" / "saved_model.pb", target)  # variables/ has not arrived yet
    deadline = time.monotonic() + 30
    while "END" not in json.dumps(client.get("/v1/models/copied").json()):
        assert time.monotonic() < deadline, client.get("/v1/models/copied").text
        time.sleep(0.1)
    shutil.copytree(tmp_path / "v" / "variables", target / "variables")
    deadline = time.monotonic() + 30
    while client.get("/v1/models/copied").json()["model_version_status"][0]["state"] != "AVAILABLE":
        assert time.monotonic() < deadline, "the completed copy was never loaded"
        time.sleep(0.1)
    assert client.post("/v1/models/copied:predict", json={"instances": ["x"]}).json()["predictions"][0][
        "greeting"] == "copied:x"
    assert source.is_dir()


def test_http_errors_are_json_and_head_answers_as_get(url, client, weather_signature):
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(b"GARBAGE\x00 / HTTP/1.1\r\n\r\n")
        reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 400") and json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]
    got, answer = raw_request(url, "GET", f"/v1/models/{WEATHER}/")  # no 307 redirect
    assert got == 404 and isinstance(answer["error"], str)
    head = httpx.head(f"{url}/v1/models/{WEATHER}", timeout=30)
    assert head.status_code == 200 and head.headers["content-type"] == "application/json" and not head.content
    assert_serves_weather(client, weather_signature)


# --- TF Serving conformance: its documented REST examples on half_plus_two ---------------------------

def test_half_plus_two_rest_examples(client):
    assert client.get("/v1/models/half_plus_two").json() == {"model_version_status": [
        {"version": "123", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]}
    metadata = client.get("/v1/models/half_plus_two/metadata").json()
    signatures = metadata["metadata"]["signature_def"]["signature_def"]
    assert metadata["model_spec"] == {"name": "half_plus_two", "signature_name": "", "version": "123"}
    assert set(signatures) == {"serving_default", "classify_x_to_y", "regress_x_to_y"}
    assert signatures["classify_x_to_y"]["method_name"] == "tensorflow/serving/classify"
    # the quick start: missing trailing dimensions of size 1 are accepted, as TF Serving does
    assert client.post("/v1/models/half_plus_two:predict", json={"instances": [1.0, 2.0, 5.0]}).json() == {
        "predictions": [2.5, 3.0, 4.5]}
    assert client.post("/v1/models/half_plus_two:predict", json={"inputs": [2.0, 3.0, 4.0]}).json() == {
        "outputs": [3.0, 3.5, 4.0]}
    assert client.post("/v1/models/half_plus_two:predict", json={"instances": [[1.0], [2.0]]}).json() == {
        "predictions": [[2.5], [3.0]]}  # the declared shape answers in the declared shape
    assert client.post("/v1/models/half_plus_two:classify", json={
        "signature_name": "classify_x_to_y", "examples": [{"x": 2.0}]}).json() == {"results": [[["", 3.0]]]}
    assert client.post("/v1/models/half_plus_two/versions/123:regress", json={
        "signature_name": "regress_x_to_y", "examples": [{"x": 2.0}, {"x": 4.0}]}).json() == {"results": [3.0, 4.0]}
    context = client.post("/v1/models/half_plus_two:regress", json={
        "signature_name": "regress_x_to_y", "context": {"x": 6.0}, "examples": [{}]})
    assert context.json() == {"results": [5.0]}


@pytest.mark.parametrize("verb,body", [
    ("classify", {"examples": [{"x": 2.0}]}),  # serving_default is a predict signature
    ("regress", {"signature_name": "classify_x_to_y", "examples": [{"x": 2.0}]}),
    ("regress", {"signature_name": "regress_x_to_y", "examples": []}),
    ("regress", {"signature_name": "regress_x_to_y", "examples": [{"x": "two"}]}),
    ("regress", {"signature_name": "regress_x_to_y", "examples": [{"x": [1.0, "a"]}]}),
])
def test_bad_classify_and_regress_requests_get_400(client, verb, body):
    response = client.post(f"/v1/models/half_plus_two:{verb}", json=body)
    assert response.status_code == 400, response.text
    assert isinstance(response.json()["error"], str)
    assert client.post("/v1/models/half_plus_two:predict", json={"instances": [1.0]}).json() == {
        "predictions": [2.5]}


def test_version_labels(client):
    assert client.get("/v1/models/labelled").json()["model_version_status"][0]["version"] == "2"
    assert [s["version"] for s in client.get("/v1/models/labelled").json()["model_version_status"]] == ["2", "1"]
    assert client.get("/v1/models/labelled/labels/stable").json()["model_version_status"][0]["version"] == "1"
    for label, tag in (("stable", "v1:"), ("canary", "v2:")):
        answer = client.post(f"/v1/models/labelled/labels/{label}:predict", json={"instances": ["x"]}).json()
        assert answer["predictions"][0]["greeting"] == tag + "x"
    assert client.get("/v1/models/labelled/labels/stable/metadata").json()["model_spec"]["version"] == "1"
    assert client.get("/v1/models/labelled/labels/nope").status_code == 400
    assert client.post("/v1/models/labelled:predict", json={"instances": ["x"]}).json()["predictions"][0][
        "greeting"] == "v2:x"


def test_prometheus_metrics_count_requests_per_model(client):
    client.post("/v1/models/half_plus_two:predict", json={"instances": [1.0]})
    client.post("/v1/models/half_plus_two:predict", json={"instances": "bad"})
    text = client.get("/monitoring/prometheus/metrics").text
    assert "# TYPE :tensorflow:serving:request_count counter" in text
    counts = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(":tensorflow:serving:request_count{")}
    assert counts[':tensorflow:serving:request_count{model_name="half_plus_two",status="OK"}'] >= 1
    assert counts[':tensorflow:serving:request_count{model_name="half_plus_two",status="INVALID_ARGUMENT"}'] >= 1
    assert (':tensorflow:serving:request_latency_count{model_name="half_plus_two",API="predict",'
            'entrypoint="REST"}') in text


# --- gRPC ----------------------------------------------------------------------------------------------

def test_grpc_predict_metadata_and_status_round_trip(model_root):
    import grpc

    from seqapps.serving import apis

    pb = apis.messages()
    port = free_port("127.0.0.1")
    options = ServingOptions(poll_seconds=0.2, grpc_port=port, request_timeout_s=TIMEOUT_S,
                             labels_file=str(model_root / LABELS))
    with serve_in_thread(model_root, options), grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        prediction = pb.services_grpc.PredictionServiceStub(channel)
        request = pb.predict.PredictRequest()
        request.model_spec.name = "half_plus_two"
        request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([[1.0], [2.0], [5.0]], "float32")))
        response = prediction.Predict(request, timeout=30)
        np.testing.assert_array_equal(tf.make_ndarray(response.outputs["y"]), [[2.5], [3.0], [4.5]])
        assert (response.model_spec.name, response.model_spec.version.value) == ("half_plus_two", 123)

        request.model_spec.version_label = "canary"
        with pytest.raises(grpc.RpcError) as error:
            prediction.Predict(request, timeout=30)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # half_plus_two has no labels
        text = pb.predict.PredictRequest()
        text.model_spec.name, text.model_spec.version_label = "labelled", "stable"
        text.inputs["text"].CopyFrom(tf.make_tensor_proto(np.array([b"q"], dtype=object)))
        assert tf.make_ndarray(prediction.Predict(text, timeout=30).outputs["greeting"]).tolist() == [b"v1:q"]
        deep = pb.predict.PredictRequest()
        deep.model_spec.name = "generate"
        deep.inputs["prompt"].CopyFrom(tf.make_tensor_proto(np.array(nested("a", 33), dtype=object)))
        deep.inputs["length"].CopyFrom(tf.make_tensor_proto(np.int32(1)))
        with pytest.raises(grpc.RpcError) as error:
            prediction.Predict(deep, timeout=30)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT

        metadata = prediction.GetModelMetadata(pb.get_model_metadata.GetModelMetadataRequest(
            model_spec={"name": "half_plus_two"}, metadata_field=["signature_def"]), timeout=30)
        signature_map = pb.get_model_metadata.SignatureDefMap()
        metadata.metadata["signature_def"].Unpack(signature_map)
        assert signature_map.signature_def["serving_default"].inputs["x"].dtype == tf.float32.as_datatype_enum

        status = pb.services_grpc.ModelServiceStub(channel).GetModelStatus(
            pb.get_model_status.GetModelStatusRequest(model_spec={"name": "half_plus_two"}), timeout=30)
        (version,) = status.model_version_status
        assert (version.version, version.state, version.status.error_code) == (123, 30, 0)  # AVAILABLE, OK
        with pytest.raises(grpc.RpcError) as error:
            pb.services_grpc.ModelServiceStub(channel).GetModelStatus(
                pb.get_model_status.GetModelStatusRequest(model_spec={"name": "nosuchmodel"}), timeout=30)
        assert error.value.code() == grpc.StatusCode.NOT_FOUND


# --- a real process: memory, header timeouts, SIGTERM ---------------------------------------------------

def rss_bytes(pid):
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_serve_process_memory_header_timeout_and_sigterm_drain(model_root):
    process = subprocess.Popen(
        [sys.executable, "-m", "seqapps.cli", "serve", str(model_root), "--port", "0", "--header-timeout-s", "1",
         "--drain-seconds", "2", "--request-timeout-s", "600", "--version-labels", str(model_root / LABELS)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"})
    try:
        line = process.stdout.readline()
        assert line.startswith("seqapps serve: http://127.0.0.1:"), line
        base_url = line.split()[2]
        parts = urlsplit(base_url)
        with httpx.Client(base_url=base_url, timeout=60) as http_client:
            good = {"instances": ["x"]}
            for _ in range(20):  # warm up: allocator and TensorFlow caches
                assert http_client.post("/v1/models/echo:predict", json=good).status_code == 200
            idle = rss_bytes(process.pid)
            huge = http_client.post("/v1/models/echo:predict", json={"instances": ["a"] * 1_000_000})
            assert huge.status_code == 400 and "limit is 1024" in huge.json()["error"]
            assert http_client.post("/v1/models/echo:predict", json=good).status_code == 200
            # 1M prompts took the probe's process from 670 MB to 3.4 GB for good. Here the 5 MB body becomes
            # ~100 MB of Python objects, refused before any array is built, freed and trimmed (measured: +2 to
            # +3 MB over an idle ~745 MB); 60 MB of slack leaves room for allocator noise.
            assert rss_bytes(process.pid) - idle < 60e6, (idle, rss_bytes(process.pid))
            accepted = http_client.post("/v1/models/echo:predict", json={"instances": ["b" * 30_000] * 1000})
            assert accepted.status_code == 200 and len(accepted.content) > 60e6
            del accepted
            # An accepted 30 MB request (arrays, tensors and a 70 MB answer) keeps +0 to +89 MB after the heap
            # is trimmed (five runs), in TensorFlow's and glibc's caches: bounded at 150 MB, far from +2.7 GB.
            deadline = time.monotonic() + 10  # trimmed 0.5 s and 3 s after the answer has been sent
            while rss_bytes(process.pid) - idle >= 150e6 and time.monotonic() < deadline:
                time.sleep(0.5)
            assert rss_bytes(process.pid) - idle < 150e6, (idle, rss_bytes(process.pid))

        with socket.create_connection((parts.hostname, parts.port), timeout=10) as slow:
            slow.sendall(b"GET /v1/models/echo HTTP/1.1\r\nHost: x\r\n")  # headers never finished
            began = time.monotonic()
            assert slow.recv(1024) == b""  # closed by the server
            assert time.monotonic() - began < 5

        def long_call():
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(f"{base_url}/v1/models/slow:predict", timeout=60,
                           json={"inputs": {"prompt": ["a"], "length": 10 ** 9}})

        caller = threading.Thread(target=long_call, daemon=True)
        caller.start()
        time.sleep(1.0)  # the call is running in a model thread
        began = time.monotonic()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=20)
        assert time.monotonic() - began < 10  # drained for 2 s, then the call was stopped
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_each_model_thread_calls_under_its_own_cancellation_manager():
    # TF 2.21 keeps the active manager in a module global: a second thread leaving its context between
    # this thread's entry and its call made that call uncancellable (a loop outlived its 504).
    from tensorflow.python.eager import cancellation

    mine, other = cancellation.CancellationManager(), cancellation.CancellationManager()
    entered, left = threading.Event(), threading.Event()

    def other_thread() -> None:
        entered.wait(10)
        with cancellation.CancellationManagerContext(other):
            assert cancellation.context() is other
        left.set()

    thread = threading.Thread(target=other_thread)
    thread.start()
    with cancellation.CancellationManagerContext(mine):
        entered.set()
        assert left.wait(10)
        assert cancellation.context() is mine  # what Context.call_function reads when this call starts
    thread.join()
    assert cancellation.context() is None
