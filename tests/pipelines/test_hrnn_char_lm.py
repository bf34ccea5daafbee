"""End-to-end checks of the hrnn_char_lm pipeline (word-boundary HRNN) on its tiny preset, through the CLI."""
import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from pipelines.hrnn_char_lm import HRNNCharLM, weighted_windows
from seqapps import serializable
from seqapps.config import resolve_config
from seqapps.data import text as text_data
from seqapps.pipeline import EPOCH_METRIC_EXAMPLES, VOCABULARIES
from tests.pipelines.cli_runner import (assert_rejected_in_one_line, export_metrics, finetune_on_sample, run_cli,
                                       run_tiny, sample_fine_tuning)
from tests.pipelines.epoch_reports import (assert_sections, last_epoch_values, reference_log_probs,
                                           trained_model_and_data)

pytestmark = pytest.mark.large


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """Runs the tiny preset (pip-only text) once in hrnn mode, for the tests that read its export."""
    export = run_tiny(tmp_path_factory.mktemp("exports"), "hrnn_char_lm", "mode=hrnn")
    return export, export_metrics(export)


def test_windows_predict_the_next_character_with_weight_one():
    inputs, targets = weighted_windows(np.arange(10, dtype=np.int32), 3, "the text")
    np.testing.assert_array_equal(inputs, [[0, 1, 2], [3, 4, 5], [6, 7, 8]])
    np.testing.assert_array_equal(targets[..., 0], [[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    assert (targets[..., 1] == 1).all()


def test_tiny_run_reports_bpc_beside_the_unigram_baseline(lm_run):
    _, metrics = lm_run
    vocabulary = metrics["data"]["vocabulary"]
    assert metrics["data"]["source"] == "pydoc_data.topics"
    assert 0 < metrics["metrics"]["bpc"] < np.log2(vocabulary) + 1
    assert 2 < metrics["baseline"]["unigram"]["bpc"] < np.log2(vocabulary)


def test_predict_scores_text_and_names_next_characters(lm_run, capsys):
    export, _ = lm_run
    code, answer, _ = run_cli(capsys, "predict", str(export), "the value", "a longer line of words ", "--json")
    assert len(answer["predictions"]) == 2
    for row in answer["predictions"]:
        assert row["bits_per_character"] > 0 and len(row["next"]) == 5
        assert all(len(n["char"]) == 1 or n["char"] == "<unk>" for n in row["next"])
        assert 0 < sum(n["p"] for n in row["next"]) <= 1.0001


@pytest.mark.parametrize("setting, message", [
    ("mode=restricted", "'mode'"),
    ("beta=-2", "'beta'"),
    ("mode=mr_hrnn", "'mode'"),
    ("units=8,8,8", "'units'"),
    ("vocabulary=grow", "'vocabulary'"),
])
def test_bad_config_exits_2_with_one_line(capsys, tmp_path, setting, message):
    assert_rejected_in_one_line(capsys, tmp_path, "hrnn_char_lm", ["--set", setting], message)


def _randomise(model: keras.Model, seed: int) -> None:
    """Every weight to random values, as a trained model's (the zero biases too)."""
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        weight.assign(rng.normal(size=weight.shape).astype("float32"))


def test_fine_tuning_adds_the_new_characters_and_keeps_the_old_entries(lm_run, tmp_path):
    pipeline = HRNNCharLM()
    info, data = sample_fine_tuning(pipeline, lm_run[0], tmp_path)
    config = resolve_config(pipeline.Config, "tiny")  # decoupled: the level-1 decoder reconstructs characters
    old = info.state["vocabulary"]["tokens"]
    chars = data.state["vocabulary"]["tokens"]
    assert chars[: len(old)] == old and chars[len(old):] == ["é", "ñ"]
    assert data.report[VOCABULARIES] == {"characters": {"added": ["é", "ñ"], "size": len(old) + 2, "oov_rate": 0.0}}
    exported = pipeline.build_model(config, dataclasses.replace(data, state=info.state))
    _randomise(exported, 0)
    grown = pipeline.adapt_model(exported, config, data)
    pairs = {"bottom cell": (exported.hrnn.cells[0], grown.hrnn.cells[0], 0), "head": (exported.hrnn.head,
             grown.hrnn.head, 1), "decoder 1": (exported.hrnn.decoder_output[0], grown.hrnn.decoder_output[0], 1)}
    for name, (old_layer, new_layer, axis) in pairs.items():  # kernel rows (the cell) or columns of the characters
        before, after = (keras.ops.convert_to_numpy(layer.kernel) for layer in (old_layer, new_layer))
        assert after.shape[axis] == before.shape[axis] + 2, name
        np.testing.assert_array_equal(*(np.take(kernel, np.arange(len(old)), axis) for kernel in (after, before)))
    bottom_before, bottom_after = (keras.ops.convert_to_numpy(model.hrnn.cells[0].kernel) for model in (exported, grown))
    units = config.units[0]
    np.testing.assert_array_equal(bottom_after[-units:], bottom_before[-units:])  # the level above's rows
    # the old characters' logits of an old text, before training: the exported model's
    text = np.array([[chars.index(c) for c in "\nthe value of x"]], "int32")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(grown(text))[..., : len(old)],
                               keras.ops.convert_to_numpy(exported(text)), rtol=1e-5, atol=1e-5)
    # vocabulary=keep: the export's characters, the new ones read as the unknown id, the model as exported
    _, kept = sample_fine_tuning(pipeline, lm_run[0], tmp_path, "vocabulary=keep")
    assert kept.state["vocabulary"]["tokens"] == old and kept.arrays["train_counts"][0] > 0
    assert pipeline.adapt_model(exported, config, kept) is exported


def test_a_fine_tuned_export_scores_text_with_a_new_character(lm_run, tmp_path, capsys):
    printed, info = finetune_on_sample(capsys, "hrnn_char_lm", lm_run[0], tmp_path)
    assert "2 added (é, ñ)" in printed
    chars = info.state["vocabulary"]["tokens"]
    assert text_data.Vocabulary.read(info.path / "assets" / "chars.txt").tokens == chars
    # the graph reads ñ as its new id: its cost of the text is the Keras model's from those ids
    model = serializable.load_model(info.keras_model_path)
    ids = np.array([[chars.index(c) for c in "\nel señor"]], "int32")
    log_probs = np.log(keras.ops.convert_to_numpy(keras.ops.softmax(model(ids), axis=-1)))[0]
    expected = -np.mean(log_probs[np.arange(ids.shape[1] - 1), ids[0, 1:]]) / np.log(2)
    serve = tf.saved_model.load(str(info.path)).signatures["serving_default"]
    bpc = serve(text=tf.constant(["el señor"]))["bits_per_character"].numpy()[0]
    np.testing.assert_allclose(bpc, expected, rtol=1e-4)


def test_epoch_bits_per_char_are_those_of_the_main_output_on_the_first_validation_windows(tiny_exports, tiny_report):
    result, _ = tiny_report("hrnn_char_lm")[1:]
    logged = last_epoch_values(result, ["bpc"])
    model, data = trained_model_and_data(tiny_exports, "hrnn_char_lm")
    inputs, targets = (part[:EPOCH_METRIC_EXAMPLES] for part in data.arrays["val"])
    log_probs = reference_log_probs(model.predict(inputs, verbose=0), targets[..., 0])
    # float32 logits reduced in another order: 1e-5 relative is rounding, far below a training step's change
    np.testing.assert_allclose(logged["bpc"], -log_probs.mean() / np.log(2), rtol=1e-5)


def test_report_names_the_mode_beside_the_bits_per_char_curve(tiny_exports, tiny_report):
    result, arrays = tiny_report("hrnn_char_lm")[1:]
    assert_sections("hrnn_char_lm", result, arrays, ["task-metric", "memory-bench"], figures=1)
