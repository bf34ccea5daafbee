"""Hostile requests to a real ``seqapps serve`` process: bounded time and memory, and it serves on."""
import base64
import io
import struct
from typing import Any, Callable

import numpy as np
import pytest
import soundfile
import tensorflow as tf
from PIL import Image

from seqapps.data.images import MAX_JPEG_SCANS, MAX_REQUEST_PIXELS
from tests.data.image_bombs import flat_png, gif, progressive_jpeg
from tests.serving.hostile import Outcome, ServerProcess

pytestmark = pytest.mark.large


TEXT = "/v1/models/text_generation:predict"


def normal_text(server: ServerProcess) -> Callable[[], Outcome]:
    """A normal request to text_generation: two characters after "a"."""
    return lambda: server.post(TEXT, json={"instances": [{"prompt": "a", "length": 2, "temperature": 1.0, "top_k": 0}]})


def test_the_harness_measures_a_refused_request_and_the_server_serves_on(hostile_server):
    normal = normal_text(hostile_server)
    row = {"prompt": "a", "length": 1, "temperature": 1.0, "top_k": 0}
    too_many = hostile_server.post(TEXT, json={"instances": [row] * 100_000})
    assert too_many.status == 400 and "limit" in too_many.body["error"]
    assert hostile_server.grpc_port
    hostile_server.check(too_many, normal)
    with pytest.raises(AssertionError):  # the check can fail: a 200 that is not the right answer
        hostile_server.check(normal(), normal, answered=lambda body: False)


# --- audio: speech_recognition and music_tagging (issue 25, items 2, 3, 6, 7 and 8) ---------------------------------

RATE = 16000  # both audio pipelines' model rate
SPEECH, MUSIC = "/v1/models/speech_recognition:predict", "/v1/models/music_tagging:predict"


def b64(data: bytes) -> dict:
    """TF Serving's JSON for binary data."""
    return {"b64": base64.b64encode(data).decode("ascii")}


def wav(samples: np.ndarray, subtype: str = "PCM_16", container: str = "WAV") -> bytes:
    """A mono 16 kHz WAV file of int32 ``samples`` (full scale 2^31); libsndfile keeps their top bits (a float
    file gets them scaled to [-1, 1], as libsndfile writes integers to floats unscaled)."""
    buffer = io.BytesIO()
    data = (samples / 2.0 ** 31).astype(np.float32) if subtype == "FLOAT" else samples
    soundfile.write(buffer, data, RATE, format=container, subtype=subtype)
    return buffer.getvalue()


def coarse_clip(seed: int, samples: int) -> np.ndarray:
    """Random int32 samples that are multiples of 2^24 (k/128 of full scale): every WAV format holds them exactly."""
    return np.random.default_rng(seed).integers(-128, 128, samples).astype(np.int32) << 24


def wav_request(*files: bytes) -> dict:
    return {"signature_name": "wav_bytes", "instances": [b64(data) for data in files]}


def normal(server: ServerProcess, path: str) -> Callable[[], Outcome]:
    """A normal request to ``path``: a quarter second of 16-bit WAV."""
    return lambda: server.post(path, json=wav_request(wav(coarse_clip(0, RATE // 4))))


def same_answer(pipeline: str, got: dict, expected: dict) -> bool:
    """Whether two answers of one audio pipeline agree: the same text or tags, scores within 1e-5 (see callers)."""
    texts, numbers = {"speech_recognition": (["transcript"], ["score"]),
                      "music_tagging": (["tags", "detected"], ["scores"])}[pipeline]
    return (all(got[key] == expected[key] for key in texts)
            and all(np.allclose(got[key], expected[key], rtol=1e-5, atol=1e-5) for key in numbers))


@pytest.mark.parametrize("path", [SPEECH, MUSIC])
@pytest.mark.parametrize("rate", [5_000_000, 2 ** 31 - 1])
def test_a_wav_claiming_an_extreme_sample_rate_gets_a_400_naming_the_rate(hostile_server, path, rate):
    data = bytearray(wav(coarse_clip(1, RATE // 4)))
    struct.pack_into("<II", data, 24, rate, rate * 2 % 2 ** 32)  # the fmt chunk's sample rate and byte rate
    outcome = hostile_server.post(path, json=wav_request(bytes(data)))
    assert outcome.status == 400 and f"sample rate of {rate} Hz; expected 1000 to 384000 Hz" in outcome.body["error"]
    hostile_server.check(outcome, normal(hostile_server, path))


def test_music_tagging_answers_64_short_wavs_as_their_waveforms_within_the_memory_bound(hostile_server):
    clips = [coarse_clip(seed, RATE // 10) for seed in range(64)]  # 0.1 s each: the decoder pads to the longest
    expected = hostile_server.post(MUSIC, json={"instances": [(clip / 2.0 ** 31).tolist() for clip in clips]})
    assert expected.status == 200
    outcome = hostile_server.post(MUSIC, json=wav_request(*(wav(clip) for clip in clips)))
    # The WAVs hold exactly the waveforms sent above, so the rows may differ only by float32 rounding in the model.
    hostile_server.check(outcome, normal(hostile_server, MUSIC), answered=lambda body: len(body["predictions"]) == 64
                         and all(same_answer("music_tagging", got, want)
                                 for got, want in zip(body["predictions"], expected.body["predictions"])))


def test_speech_clips_samples_of_1e38_to_full_scale_and_no_output_is_nan(hostile_server):
    loud = np.random.default_rng(2).uniform(-1, 1, RATE // 2) * 1e38  # within float32, beyond any audio
    expected = hostile_server.post(SPEECH, json={"inputs": {"waveform": [np.clip(loud, -1, 1).tolist()],
                                                            "length": [loud.size]}})
    assert expected.status == 200
    outcome = hostile_server.post(SPEECH, json={"inputs": {"waveform": [loud.tolist()], "length": [loud.size]}})
    hostile_server.check(outcome, normal(hostile_server, SPEECH), answered=lambda body: (
        np.isfinite(body["outputs"]["score"]).all()
        and same_answer("speech_recognition", body["outputs"], expected.body["outputs"])))


@pytest.mark.parametrize("pipeline", ["speech_recognition", "music_tagging"])
@pytest.mark.parametrize("subtype, container", [("PCM_U8", "WAV"), ("PCM_24", "WAV"), ("PCM_32", "WAV"),
                                                ("FLOAT", "WAV"), ("PCM_16", "WAVEX")])
def test_every_wav_format_gets_the_answer_of_16_bit_pcm(hostile_server, pipeline, subtype, container):
    samples = coarse_clip(3, RATE // 4)
    data = wav(samples, subtype, container)
    reference = wav(samples)
    assert np.array_equal(soundfile.read(io.BytesIO(data))[0], soundfile.read(io.BytesIO(reference))[0])
    path = f"/v1/models/{pipeline}:predict"
    expected = hostile_server.post(path, json=wav_request(reference))
    assert expected.status == 200
    outcome = hostile_server.post(path, json=wav_request(data))
    # Both files hold the same samples exactly (asserted above), so the graph decodes the same waveform: the answers
    # may differ only by float32 rounding (1e-5 is far below any score gap that changes a word or a tag).
    hostile_server.check(outcome, normal(hostile_server, path), answered=lambda body: same_answer(
        pipeline, body["predictions"][0], expected.body["predictions"][0]))


@pytest.mark.parametrize("path", [SPEECH, MUSIC])
@pytest.mark.parametrize("body", ["raw", "b64", "riff"])
def test_random_bytes_as_a_wav_get_a_400_in_the_users_terms(hostile_server, path, body):
    noise = np.random.default_rng(4).bytes(3000)
    request = {"raw": {"content": noise}, "b64": {"json": wav_request(noise)},
               "riff": {"json": wav_request(b"RIFF" + noise[:4] + b"WAVE" + noise)}}[body]
    outcome = hostile_server.post(path, **request)
    assert outcome.status == 400 and "codec" not in outcome.body["error"], outcome
    assert ("WAV file" if body != "raw" else "not UTF-8 JSON") in outcome.body["error"], outcome
    hostile_server.check(outcome, normal(hostile_server, path))


# --- requests whose inputs disagree with the signature's batch (issue 25, item 7) -------------------------------------

def grpc_predict(server: ServerProcess, model: str, inputs: dict[str, np.ndarray]) -> Any:
    """Sends a gRPC Predict to the server; returns the ``grpc.RpcError`` it raised (or fails)."""
    import grpc

    from seqapps.serving import apis

    pb = apis.messages()
    request = pb.predict.PredictRequest()
    request.model_spec.name = model
    for key, value in inputs.items():
        request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        with pytest.raises(grpc.RpcError) as error:
            pb.services_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return error.value


def test_a_length_per_prompt_with_one_too_many_is_refused_naming_both_counts(hostile_server):
    prompts, lengths = ["a", "b", "c", "d"], [2, 2, 2, 2, 2]
    outcome = hostile_server.post(TEXT, json={"inputs": {"prompt": prompts, "length": lengths,
                                                         "temperature": [1.0] * 4, "top_k": [0] * 4}})
    message = "Input 'length' has 5 rows but 'prompt' has 4: every input needs one entry per example"
    assert outcome.status == 400 and outcome.body["error"] == message
    hostile_server.check(outcome, normal_text(hostile_server))
    error = grpc_predict(hostile_server, "text_generation", {
        "prompt": np.array(prompts, dtype=object), "length": np.array(lengths, np.int32),
        "temperature": np.ones(4, np.float32), "top_k": np.zeros(4, np.int32)})
    assert error.details() == message
    assert normal_text(hostile_server)().status == 200


@pytest.mark.parametrize("path, request_body", [
    (SPEECH, {"inputs": {"waveform": [0.0] * 4000, "length": [4000]}}),
    (MUSIC, {"inputs": [0.0] * 4000}),
    (MUSIC, {"instances": [0.0] * 4000}),
])
def test_a_rank_1_waveform_is_refused_saying_a_batch_of_rows_was_expected(hostile_server, path, request_body):
    outcome = hostile_server.post(path, json=request_body)
    message = ("Input 'waveform' is a rank-1 list of 4000 entries; the signature expects rank 2, shape [-1, -1]: "
               "a list of rows, one per example (send one example inside a list)")
    assert outcome.status == 400 and outcome.body["error"] == message
    hostile_server.check(outcome, normal(hostile_server, path))
    model = path.split("/")[-1].split(":")[0]
    arrays = {"waveform": np.zeros(4000, np.float32), "length": np.array([4000], np.int32)}
    error = grpc_predict(hostile_server, model, {key: arrays[key] for key in (
        ["waveform", "length"] if model == "speech_recognition" else ["waveform"])})
    assert error.details() == message


# --- images: image_captioning and pixel_mnist (issue 25, items 1, 4 and 5) ------------------------------------------

#: The signature input of encoded image bytes, per image pipeline.
IMAGE_INPUTS = {"image_captioning": "image_bytes", "pixel_mnist": "image"}


def _image_bombs() -> dict[str, list[bytes]]:
    flat = Image.new("RGB", (4096, 4096), (30, 90, 200))
    return {
        "lying GIF": [gif((64, 64), [(20_000, 20_000, 1)])],  # 270 kB: TensorFlow decoded 400 megapixels
        "lying GIF of three frames": [gif((64, 64), [(20_000, 20_000, 1)] * 3)],
        "repeated-scan JPEG": [progressive_jpeg(flat, repeats=6000)],  # 297 kB of 6,010 scans at 4096 x 4096
        "256 large PNGs": [flat_png(4096)] * 256,  # each within every bound of one image
    }


BOMB_ERRORS = {"lying GIF": "does not fit within its screen",
               "lying GIF of three frames": "does not fit within its screen",
               "repeated-scan JPEG": f"more than the limit of {MAX_JPEG_SCANS} scans",
               "256 large PNGs": f"larger than the limit of {MAX_REQUEST_PIXELS} pixels together"}


def _send_images(server, model: str, images: list[bytes]):
    return server.post(f"/v1/models/{model}:predict", json={
        "inputs": {IMAGE_INPUTS[model]: [{"b64": base64.b64encode(image).decode()} for image in images]}})


@pytest.mark.parametrize("model", sorted(IMAGE_INPUTS))
def test_image_bombs_get_a_400_naming_the_problem_quickly(hostile_server, model):
    def normal():
        return _send_images(hostile_server, model, [flat_png(28)])

    for name, images in _image_bombs().items():
        outcome = _send_images(hostile_server, model, images)
        hostile_server.check(outcome, normal)
        assert outcome.status == 400 and BOMB_ERRORS[name] in outcome.body["error"], (name, outcome)
