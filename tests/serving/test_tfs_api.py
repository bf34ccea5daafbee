"""TF Serving's Classify and Regress APIs on the tiny exports, over REST and over gRPC with TF Serving's stubs.

pixel_mnist and music_tagging export a ``classify`` signature, the forecasting pipelines a ``regress``
one (``seqapps.export.examples_signature``). Their answers are checked against the same server's
``:predict`` on the signature they wrap. The gRPC tests send TF Serving's own messages through
``tensorflow_serving.apis`` (``pip install --no-deps "tensorflow-serving-api==2.21.*"``), in a
client process of their own (``tests/serving/tfs_api_client.py``); where that package is missing
they skip, unless ``SEQAPPS_REQUIRE_TFS_API=1`` (CI) makes that a failure.
"""
from __future__ import annotations

import base64
import importlib.util
import json
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from seqapps.data import audio
from tests.serving.hostile import REPO, ServerProcess

pytestmark = pytest.mark.large

CLASSIFY, REGRESS = "tensorflow/serving/classify", "tensorflow/serving/regress"
DIGITS = [str(digit) for digit in range(10)]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _state(server: ServerProcess, name: str) -> dict[str, Any]:
    return json.loads((server.model_root / name / "1" / "assets.extra" / "state.json").read_text())


def _pngs(count: int) -> list[bytes]:
    """Seeded 8x8 grey PNGs."""
    pixels = np.random.default_rng(0).integers(0, 256, (count, 8, 8, 1), dtype=np.uint8)
    return [tf.io.encode_png(image).numpy() for image in pixels]


def _wavs(rate: int) -> list[bytes]:
    """Two one-second WAVs: a 440 Hz and a 1,760 Hz tone."""
    t = np.arange(rate) / rate
    return [audio.wav_bytes((0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32), rate) for hz in (440, 1760)]


def _windows(state: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """Seeded windows of every input column, as floats, with an integer ``end_time``."""
    rng = np.random.default_rng(1)
    return [{**{name: [float(v) for v in rng.normal(10.0, 3.0, state["lookback"]).round(3)]
                for name in state["input_cols"]}, "end_time": 1_700_000_000 + 3600 * i} for i in range(count)]


def _check_ranked(results: list, expected: list[dict[str, float]]) -> None:
    """Each row: every class once, highest score first, each score the one ``:predict`` gave that class."""
    assert len(results) == len(expected)
    for row, scores in zip(results, expected):
        assert all(np.diff([score for _, score in row]) <= 0), row
        assert sorted(label for label, _ in row) == sorted(scores)
        for label, score in row:
            assert score == pytest.approx(scores[label], abs=1e-5), label


def _metadata_method(server: ServerProcess, model: str, signature: str) -> str:
    body = server.measure(lambda client: client.get(f"/v1/models/{model}/metadata")).body
    return body["metadata"]["signature_def"]["signature_def"][signature]["method_name"]


def test_rest_classify_pixel_mnist_ranks_the_digits_as_predict_scores_them(hostile_server):
    images = _pngs(3)
    assert _metadata_method(hostile_server, "pixel_mnist", "classify") == CLASSIFY
    predicted = hostile_server.post("/v1/models/pixel_mnist:predict",
                                    json={"instances": [{"b64": _b64(image)} for image in images]})
    expected = [dict(zip(DIGITS, row["probabilities"])) for row in predicted.body["predictions"]]
    classified = hostile_server.post("/v1/models/pixel_mnist:classify", json={
        "signature_name": "classify", "examples": [{"image": {"b64": _b64(image)}} for image in images]})
    assert classified.status == 200, classified
    _check_ranked(classified.body["results"], expected)


def test_rest_classify_music_tagging_ranks_the_tags_as_wav_bytes_scores_them(hostile_server):
    state = _state(hostile_server, "music_tagging")
    wavs = _wavs(state["sample_rate"])
    predicted = hostile_server.post("/v1/models/music_tagging:predict", json={
        "signature_name": "wav_bytes", "inputs": {"wav": [{"b64": _b64(wav)} for wav in wavs]}})
    assert predicted.status == 200, predicted
    expected = [dict(zip(state["tags"], row)) for row in predicted.body["outputs"]["scores"]]
    classified = hostile_server.post("/v1/models/music_tagging:classify", json={
        "signature_name": "classify", "examples": [{"wav": {"b64": _b64(wav)}} for wav in wavs]})
    assert classified.status == 200, classified
    _check_ranked(classified.body["results"], expected)


@pytest.mark.parametrize("name", ["weather_forecasting", "load_forecasting"])
def test_rest_regress_is_the_first_step_of_the_first_targets_forecast(hostile_server, name):
    state = _state(hostile_server, name)
    assert _metadata_method(hostile_server, name, "regress") == REGRESS
    windows = _windows(state, 3)
    predicted = hostile_server.post(f"/v1/models/{name}:predict", json={"instances": windows})
    expected = [row[state["target_cols"][0]][0] for row in predicted.body["predictions"]]
    regressed = hostile_server.post(f"/v1/models/{name}:regress",
                                    json={"signature_name": "regress", "examples": windows})
    assert regressed.status == 200, regressed
    assert regressed.body["results"] == pytest.approx(expected, abs=1e-4)
    # TF Serving's context: features every example shares, here each window's columns but the first
    first = state["input_cols"][0]
    shared = {key: value for key, value in windows[0].items() if key != first}
    with_context = hostile_server.post(f"/v1/models/{name}:regress", json={
        "signature_name": "regress", "context": shared, "examples": [{first: windows[0][first]}]})
    assert with_context.body["results"] == pytest.approx(expected[:1], abs=1e-4)


@pytest.mark.parametrize("model, body, expected", [
    ("pixel_mnist", {"signature_name": "classify", "examples": [{"picture": {"b64": ""}}]},
     "Every example needs the feature 'image' (string)"),
    ("pixel_mnist", {"signature_name": "classify", "examples": [{"image": "x" * (21 << 20)}]},
     f"Feature 'image': a string of {21 << 20} bytes is over the limit of {20 << 20} bytes"),
    ("pixel_mnist", {"signature_name": "classify", "examples": [{"image": 3.0}]},
     "examples[0], feature 'image': Data types don't match"),
    ("pixel_mnist", {"signature_name": "serving_default", "examples": [{"image": ""}]},
     f"Expected {CLASSIFY} signature method_name"),
    ("weather_forecasting", {"signature_name": "regress", "examples": [{"temp_air": [1.0]}]},
     "examples[0], feature 'temp_air': Number of float values != expected"),
])
def test_rest_bad_examples_get_a_400_naming_what_was_expected(hostile_server, model, body, expected):
    outcome = hostile_server.post(f"/v1/models/{model}:{'regress' if model != 'pixel_mnist' else 'classify'}",
                                  json=body)
    assert outcome.body["error"].startswith(expected), outcome
    assert "Name: <unknown>" not in outcome.body["error"], outcome
    hostile_server.check(outcome, lambda: hostile_server.post("/v1/models/pixel_mnist:classify", json={
        "signature_name": "classify", "examples": [{"image": {"b64": _b64(_pngs(1)[0])}}]}))


def _official_stubs_or_skip() -> None:
    """CI (SEQAPPS_REQUIRE_TFS_API=1) installs tensorflow-serving-api and must find it; elsewhere a
    machine without it skips."""
    if importlib.util.find_spec("tensorflow_serving") is not None:
        return
    hint = 'pip install --no-deps "tensorflow-serving-api==2.21.*"'
    if os.environ.get("SEQAPPS_REQUIRE_TFS_API") == "1":
        pytest.fail(f"SEQAPPS_REQUIRE_TFS_API=1 but tensorflow_serving.apis is missing: {hint}")
    pytest.skip(f"no tensorflow_serving.apis: {hint}")


def _grpc(server: ServerProcess, calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Sends the calls through TF Serving's stubs (``tfs_api_client``) and returns their answers."""
    result = subprocess.run([sys.executable, "-m", "tests.serving.tfs_api_client", str(server.grpc_port)],
                            input=json.dumps([{"method": m, "request": r} for m, r in calls]), capture_output=True,
                            text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def _examples(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """tf.Examples in protobuf's JSON mapping: bytes as base64, floats and integers as lists."""
    def feature(value: Any) -> dict[str, Any]:
        if isinstance(value, bytes):
            return {"bytesList": {"value": [_b64(value)]}}
        if isinstance(value, int):
            return {"int64List": {"value": [str(value)]}}
        return {"floatList": {"value": value}}
    return [{"features": {"feature": {key: feature(value) for key, value in row.items()}}} for row in rows]


def _spec(model: str, signature: str) -> dict[str, str]:
    return {"name": model, "signatureName": signature}


def test_grpc_classify_regress_and_multi_inference_with_tf_servings_stubs(hostile_server):
    _official_stubs_or_skip()
    images, windows = _pngs(2), _windows(_state(hostile_server, "weather_forecasting"), 2)
    image_input = {"exampleList": {"examples": _examples([{"image": image} for image in images])}}
    window_input = {"exampleList": {"examples": _examples(windows)}}
    first = next(iter(windows[0]))  # every window's first column, beside the other columns of window 0 as context
    shared = {key: value for key, value in windows[0].items() if key != first}
    classify_task = {"modelSpec": _spec("pixel_mnist", "classify"), "methodName": CLASSIFY}
    answers = _grpc(hostile_server, [
        ("Classify", {"modelSpec": _spec("pixel_mnist", "classify"), "input": image_input}),
        ("Regress", {"modelSpec": _spec("weather_forecasting", "regress"), "input": window_input}),
        ("MultiInference", {"tasks": [classify_task], "input": image_input}),
        ("MultiInference", {"tasks": [classify_task, classify_task], "input": image_input}),
        ("MultiInference", {"input": image_input, "tasks": [
            classify_task, {**classify_task, "modelSpec": _spec("music_tagging", "classify")}]}),
        ("Regress", {"modelSpec": _spec("pixel_mnist", "classify"), "input": image_input}),
        ("Classify", {"modelSpec": _spec("pixel_mnist", "classify"), "input": {"exampleList": {
            "examples": _examples([{"image": images[0]}] * 1025)}}}),
        ("Classify", {"modelSpec": _spec("pixel_mnist", "classify"), "input": {}}),
        ("Regress", {"modelSpec": _spec("weather_forecasting", "regress"), "input": {"exampleListWithContext": {
            "context": _examples([{"note": b"x" * 70_000}])[0], "examples": _examples(windows)}}}),
        ("Regress", {"modelSpec": _spec("weather_forecasting", "regress"), "input": {"exampleListWithContext": {
            "context": _examples([shared])[0], "examples": _examples([{first: w[first]} for w in windows])}}}),
        ("HandleReloadConfigRequest", {"config": {"modelConfigList": {"config": [
            {"name": "pixel_mnist", "basePath": "/models/pixel_mnist", "modelPlatform": "tensorflow"}]}}}),
    ])
    (classified, regressed, multi, duplicate, two_models, wrong_method, too_many, empty, long_string, with_context,
     reload) = answers

    rest = hostile_server.post("/v1/models/pixel_mnist:classify", json={
        "signature_name": "classify", "examples": [{"image": {"b64": _b64(image)}} for image in images]}).body
    assert classified["code"] == "OK", classified
    response = classified["response"]
    assert response["modelSpec"] == {"name": "pixel_mnist", "version": "1", "signatureName": "classify"}
    rows = [[[c["label"], c.get("score", 0.0)] for c in row["classes"]]
            for row in response["result"]["classifications"]]
    _check_ranked(rows, [dict(row) for row in rest["results"]])

    expected = hostile_server.post("/v1/models/weather_forecasting:regress",
                                   json={"signature_name": "regress", "examples": windows}).body["results"]
    assert regressed["code"] == "OK", regressed
    assert [r["value"] for r in regressed["response"]["result"]["regressions"]] == pytest.approx(expected, abs=1e-4)

    first_only = hostile_server.post("/v1/models/weather_forecasting:regress", json={
        "signature_name": "regress", "examples": [{**shared, first: w[first]} for w in windows]}).body["results"]
    assert [r["value"] for r in with_context["response"]["result"]["regressions"]] == pytest.approx(first_only,
                                                                                                   abs=1e-4)
    assert first_only[1] != pytest.approx(expected[1], abs=1e-4)  # the context took the place of window 1's columns

    assert multi["code"] == "OK", multi
    (result,) = multi["response"]["results"]
    assert result["modelSpec"]["signatureName"] == "classify"
    assert result["classificationResult"] == response["result"]

    assert duplicate["code"] == "INVALID_ARGUMENT" and "Duplicate" in duplicate["details"], duplicate
    assert two_models["code"] == "INVALID_ARGUMENT" and "same model name" in two_models["details"], two_models
    assert wrong_method["code"] == "INVALID_ARGUMENT" and REGRESS in wrong_method["details"], wrong_method
    assert too_many["code"] == "INVALID_ARGUMENT" and "limit" in too_many["details"], too_many
    assert empty["code"] == "INVALID_ARGUMENT" and "empty" in empty["details"], empty
    assert long_string == {"code": "INVALID_ARGUMENT", "details": "Feature 'note': a string of 70000 bytes is over "
                                                                  "the limit of 65536 bytes"}, long_string
    assert reload["code"] == "FAILED_PRECONDITION", reload
    assert "only legal to transition from one ModelConfigList" in reload["details"], reload


def test_predict_on_a_classify_signature_sends_the_files_as_tf_examples(tiny_exports, tmp_path):
    path = tmp_path / "digit.png"
    path.write_bytes(_pngs(1)[0])

    def predict(signature: str) -> dict:
        done = subprocess.run([sys.executable, "-m", "seqapps.cli", "predict", tiny_exports["pixel_mnist"]["export"],
                               "--signature", signature, str(path), "--json"], capture_output=True, text=True,
                              cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
        assert done.returncode == 0 and done.stderr == "", done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    classified, default = predict("classify"), predict("serving_default")
    row = classified["rows"][0]
    assert row["input"] == str(path)
    assert row["classes"][0] == str(default["predictions"][0]["label"])
    assert row["scores"] == sorted(row["scores"], reverse=True)
    np.testing.assert_allclose(row["scores"][0], max(default["predictions"][0]["probabilities"]), atol=1e-4)
