"""``format_prediction`` of every pipeline on every signature: each row names its input, empty outputs say so.

The focused tests feed outputs shaped as each signature documents them (the shapes the tiny exports
return) and check the figures against NumPy; the last test runs every signature of every tiny
export on its own warm-up request, so a new signature or pipeline is covered with no new code.
"""
import json

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2

from seqapps import export_format
from seqapps.pipeline import INPUT_INDEX, REGISTRY, format_rows, row_inputs


def strings(rows):
    """A NumPy object array of UTF-8 bytes, as a SavedModel returns string tensors."""
    return np.vectorize(lambda s: s.encode("utf-8"), otypes=[object])(np.array(rows, dtype=object))


def pipeline(name):
    return REGISTRY.get(name)()


def test_row_inputs_follow_the_input_index_and_number_rows_beyond_the_inputs():
    assert row_inputs(["a.wav", "b.wav"], {INPUT_INDEX: np.array([0, 0, 1])}, 3) == ["a.wav", "a.wav", "b.wav"]
    assert row_inputs(["a.png"], {}, 2) == ["a.png", "row 2"]
    text, value = format_rows(["x.bin"], {"score": np.array([0.5], np.float32)})
    assert text == "x.bin:\n  score: 0.5" and value == {"rows": [{"input": "x.bin", "score": 0.5}]}


# --- translation ---------------------------------------------------------------------------------

SOURCES = np.array(["one two", ""], dtype=object)


def test_translation_greedy_rows_name_their_source_and_say_an_empty_translation():
    outputs = {"translation": strings(["uno dos", ""]), "score": np.array([-0.5, 0.0], np.float32)}
    text, value = pipeline("translation").format_prediction({}, {"text": SOURCES}, outputs, "serving_default")
    assert text.splitlines() == ["'one two' -> uno dos  (score -0.500)", "'' -> (empty translation)  (score 0.000)"]
    assert value == {"inputs": ["one two", ""], "translations": ["uno dos", ""], "scores": [-0.5, 0.0]}


def test_translation_beam_lists_the_n_best_with_scores_under_each_source():
    outputs = {"translations": strings([["uno dos", "uno"], ["", ""]]),
               "scores": np.array([[-1.25, -2.5], [0.0, 0.0]], np.float32)}
    text, value = pipeline("translation").format_prediction({}, {"text": SOURCES}, outputs, "beam")
    assert text.splitlines() == ["'one two':", "  1. uno dos  (score -1.250)", "  2. uno  (score -2.500)",
                                 "'':", "  1. (empty translation)  (score 0.000)",
                                 "  2. (empty translation)  (score 0.000)"]
    assert value["rows"][0] == {"input": "one two", "translations": [{"text": "uno dos", "score": -1.25},
                                                                      {"text": "uno", "score": -2.5}]}


def test_translation_align_shows_each_word_s_most_attended_source_word():
    rng = np.random.default_rng(0)
    attention = np.zeros((2, 3, 2), np.float32)  # [batch, target, source], padding rows and columns zero
    attention[0, :2] = rng.dirichlet([1, 1], size=2)
    outputs = {"translation": strings(["uno dos", ""]), "source_tokens": strings([["one", "two"], ["", ""]]),
               "target_tokens": strings([["uno", "dos", ""], ["", "", ""]]), "attention": attention}
    text, value = pipeline("translation").format_prediction({}, {"text": SOURCES}, outputs, "align")
    best = attention[0, :2].argmax(axis=1)
    expected = [{"target": word, "source": ["one", "two"][b], "weight": round(float(attention[0, i, b]), 4)}
                for i, (word, b) in enumerate(zip(["uno", "dos"], best))]
    first, second = value["rows"]
    assert first["alignment"] == expected and np.asarray(first["attention"]).shape == (2, 2)
    assert second == {"input": "", "translation": "", "alignment": [], "source_tokens": [], "target_tokens": [],
                      "attention": []}
    lines = text.splitlines()
    assert lines[0] == "'one two' -> uno dos" and lines[2] == "'' -> (empty translation)"
    assert lines[1] == "  " + ", ".join(f"{a['target']}←{a['source']} {a['weight']:.2f}" for a in expected)


# --- image captioning ----------------------------------------------------------------------------

IMAGES = {"image_bytes": np.array([b"png", b"png"], dtype=object)}
FILES = ["a.png", "b.png"]


def test_captioning_beam_and_greedy_rows_name_the_file_and_say_an_empty_caption():
    captioning = pipeline("image_captioning")
    greedy = {"caption": strings(["a red circle", ""]), "score": np.array([-0.25, -3.0], np.float32)}
    text, value = captioning.format_prediction({}, IMAGES, greedy, "serving_default", FILES)
    assert text.splitlines() == ["a.png: a red circle  (score -0.250)", "b.png: (empty caption)  (score -3.000)"]
    assert value["captions"] == ["a red circle", ""] and value["scores"] == [-0.25, -3.0]
    beam = {"captions": strings([["", "a red circle"], ["a square", "a blue square"]]),
            "scores": np.array([[-2.0, -4.0], [-1.0, -1.5]], np.float32)}
    text, value = captioning.format_prediction({}, IMAGES, beam, "beam", FILES)
    assert text.splitlines()[:3] == ["a.png:", "  1. (empty caption)  (score -2.000)",
                                     "  2. a red circle  (score -4.000)"]
    assert [row["input"] for row in value["rows"]] == FILES


def test_captioning_attention_names_the_image_region_each_word_attends_to():
    attention = np.full((2, 3, 64), 0.5 / 63, np.float32)  # an 8x8 grid
    attention[0, 0, 0] = attention[0, 1, 8 * 7 + 7] = attention[1, 0, 8 * 3 + 4] = 0.5  # top left, bottom right, centre
    attention[0, 2] = attention[1, 1:] = 0.0  # padding words
    outputs = {"caption": strings(["red circle", "square"]), "words": strings([["red", "circle", ""],
                                                                              ["square", "", ""]]),
               "attention": attention}
    text, value = pipeline("image_captioning").format_prediction({}, IMAGES, outputs, "attention", FILES)
    first, second = value["rows"]
    assert [(a["word"], a["cell"], a["region"]) for a in first["alignment"]] == [
        ("red", [0, 0], "top left"), ("circle", [7, 7], "bottom right")]
    assert second["alignment"] == [{"word": "square", "cell": [3, 4], "region": "centre", "weight": 0.5}]
    assert text.splitlines()[0] == "a.png: red circle" and "red→top left r1c1 0.50" in text.splitlines()[1]


# --- audio ---------------------------------------------------------------------------------------

def test_taggram_prints_each_file_s_top_tags_per_window_and_only_its_own_windows():
    rate = 16000
    scores = np.array([[[0.1, 0.9, 0.5, 0.2], [0.8, 0.1, 0.3, 0.4], [0.6, 0.2, 0.7, 0.1]]] * 2, np.float32)
    outputs = {"window_scores": scores, "tags": strings([["reel", "jig", "air", "march"]] * 2),
               "window_start": np.array([[0.0, 5.0, 7.0]] * 2, np.float32),  # a 12 s batch of 5 s windows
               "window_end": np.array([[5.0, 10.0, 12.0]] * 2, np.float32)}
    inputs = {"waveform": np.zeros((2, 12 * rate), np.float32), "length": np.array([12 * rate, 6 * rate])}
    text, value = pipeline("music_tagging").format_prediction({"sample_rate": rate}, inputs, outputs, "taggram",
                                                              ["long.wav", "short.wav"])
    assert text.splitlines() == ["long.wav:", "  0.0-5.0 s: jig 0.90, air 0.50, march 0.20",
                                 "  5.0-10.0 s: reel 0.80, march 0.40, air 0.30",
                                 "  7.0-12.0 s: air 0.70, reel 0.60, jig 0.20",
                                 "short.wav:", "  0.0-5.0 s: jig 0.90, air 0.50, march 0.20",
                                 "  5.0-6.0 s: reel 0.80, march 0.40, air 0.30"]  # the 6 s file ends at 6 s
    short = value["rows"][1]
    assert short["tags"] == ["reel", "jig", "air", "march"] and len(short["windows"]) == 2
    assert short["windows"][1]["scores"] == [0.8, 0.1, 0.3, 0.4]


def test_music_tags_name_each_file():
    state = {"tags": ["reel", "jig"], "thresholds": [0.5, 0.5]}
    outputs = {"scores": np.array([[0.9, 0.6], [0.1, 0.2]], np.float32), "tags": strings([["reel", "jig"]] * 2),
               "detected": np.array([[True, True], [False, False]])}
    text, value = pipeline("music_tagging").format_prediction(state, {"length": np.array([5, 5])}, outputs,
                                                              "wav_bytes", ["a.wav", "b.wav"])
    assert text.splitlines() == ["a.wav: reel 0.90, jig 0.60", "b.wav: (no tag above its threshold)"]
    assert [row["file"] for row in value["predictions"]] == ["a.wav", "b.wav"]


def test_speech_joins_the_pieces_of_each_file_and_shifts_their_word_times():
    rate = 16000
    # three INPUTs, the same file twice: "a.wav" was cut into two pieces of 2 s and 1 s
    inputs = {"length": np.array([2 * rate, rate, rate, rate]), INPUT_INDEX: np.array([0, 0, 1, 2])}
    given = ["a.wav", "b.wav", "a.wav"]
    speech = pipeline("speech_recognition")
    outputs = {"transcript": strings(["hello", "world", "", "again"]),
               "score": np.array([-1.0, -2.0, -3.0, -4.0], np.float32)}
    text, value = speech.format_prediction({"sample_rate": rate}, inputs, outputs, "beam", given)
    assert text.splitlines() == ["a.wav: hello world  (score -3.000)", "b.wav: (empty transcript)  (score -3.000)",
                                 "a.wav: again  (score -4.000)"]
    assert [row["pieces"] for row in value["predictions"]] == [2, 1, 1]
    words = {"words": strings([["hello", ""], ["world", ""], ["", ""], ["a", "b"]]),
             "start": np.array([[0.5, 0], [0.25, 0], [0, 0], [0, 0.5]], np.float32),
             "end": np.array([[1.0, 0], [0.75, 0], [0, 0], [0.25, 1.0]], np.float32),
             "confidence": np.full((4, 2), 0.5, np.float32), "num_words": np.array([1, 1, 0, 2], np.int32)}
    text, value = speech.format_prediction({"sample_rate": rate}, inputs, words, "words", given)
    assert text.splitlines() == ["a.wav: hello[0.50-1.00] world[2.25-2.75]", "b.wav: (no words)",
                                 "a.wav: a[0.00-0.25] b[0.50-1.00]"]


# --- every signature of every tiny export ----------------------------------------------------------

@pytest.mark.large
@pytest.mark.parametrize("name", REGISTRY.names())
def test_every_signature_of_the_tiny_export_is_formatted_naming_each_row(tiny_exports, name):
    path = tiny_exports[name]["export"]
    info = export_format.read_export(path)
    loaded = tf.saved_model.load(str(path))
    logs = export_format.read_warmup_requests(info.path / export_format.ASSETS_EXTRA / export_format.WARMUP_FILE)
    for log in logs:
        request = log.predict_log.request
        signature = request.model_spec.signature_name
        inputs = {key: tf.make_ndarray(tensor_pb2.TensorProto.FromString(proto.SerializeToString()))
                  for key, proto in request.inputs.items()}
        outputs = {key: value.numpy() for key, value in loaded.signatures[signature](
            **{key: tf.constant(value) for key, value in inputs.items()}).items()}
        rows = len(next(iter(inputs.values())))
        given = [f"input-{row}.dat" for row in range(rows)]
        text, value = pipeline(name).format_answer(info.state, inputs, outputs, signature, given)
        json.dumps(value)  # JSON-able
        texts = [value for value in inputs.values() if value.dtype == object and value.ndim == 1]
        for row in range(rows):  # a row is headed by its file (given) or by its text
            decoded = [t[row].decode("utf-8", "replace") for t in texts]  # a text, or an encoded file
            named = [given[row], *map(repr, decoded), *filter(None, decoded)]
            assert any(n in text for n in named), f"{name}:{signature}: row {row} is not named:\n{text}"
