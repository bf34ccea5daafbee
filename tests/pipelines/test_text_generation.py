"""End-to-end checks of the text_generation (char-RNN) pipeline on its tiny preset, through the CLI."""
import functools
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

from pipelines import text_generation
from seqapps import cli, serializable
from seqapps.config import resolve_config
from seqapps.data import text as text_data
from seqapps.export_format import read_export, read_limits
from seqapps.pipeline import EPOCH_METRIC_EXAMPLES, VOCABULARIES
from tests.export_harness import call_in_tensorflow_only_process, decoded
from tests.pipelines.cli_runner import finetune_on_sample, run_cli, sample_fine_tuning, weights_by_path
from tests.pipelines.epoch_reports import (assert_sections, last_epoch_values, reference_log_probs,
                                           trained_model_and_data)

pytestmark = pytest.mark.large


@pytest.fixture(scope="module")
def char_export(tiny_run):
    """The session's tiny run (one small LSTM on pydoc topics), a private copy."""
    return tiny_run("text_generation")


def test_tiny_run_reports_bits_per_char_and_a_unigram_baseline(char_export):
    assert set(char_export["metrics"]) == {"bits_per_char", "parameters"}
    assert 0 < char_export["metrics"]["bits_per_char"] < 10
    assert 3 < char_export["baseline"]["unigram"]["bits_per_char"] < 7
    assert char_export["data"]["source"] == "pydoc_data.topics"


def request(prompts: list[str], length, temperature, top_k=0) -> tuple[str, dict[str, np.ndarray]]:
    """A serving_default call; length, temperature and top_k are one value for all rows or one per row."""
    rows = len(prompts)
    return ("serving_default", {"prompt": np.array(prompts, dtype=object),
                                "length": np.broadcast_to(np.array(length, "int32"), rows).copy(),
                                "temperature": np.broadcast_to(np.array(temperature, "float32"), rows).copy(),
                                "top_k": np.broadcast_to(np.array(top_k, "int32"), rows).copy()})


def test_export_generates_text_in_a_tensorflow_only_process(char_export, tmp_path):
    moved = tmp_path / "moved"
    shutil.copytree(char_export["export"], moved)  # the vocabulary asset travels with the folder
    assert (moved / "assets" / "chars.txt").is_file()
    calls = [request(["In the", "\u00df\u20ac unknown chars", ""], 12, 0.0), request(["In the", "x", ""], 12, 0.0),
             request(["In the"], 30, 1.0), request(["abc"], 0, 1.0),
             request(["def", "In the", "In the"], [5, 0, 9], [0.5, 1.0, 0.0], [3, 0, 1])]
    answer = call_in_tensorflow_only_process(moved, calls)
    assert answer["imported"] == []
    greedy, again, sampled, empty, per_row = [(decoded(out["text"]), decoded(out["generated"]))
                                              for out in answer["outputs"]]
    texts, generated = greedy
    assert [len(g) for g in generated] == [12, 12, 12]
    assert texts[0] == "In the" + generated[0] and texts[1].startswith("\u00df\u20ac unknown chars")
    assert again[1][0] == generated[0] and again[1][2] == generated[2]  # greedy: deterministic
    assert len(sampled[1][0]) == 30
    assert empty == (["abc"], [""])
    texts, generated = per_row  # each row its own length, temperature and top_k
    assert [len(g) for g in generated] == [5, 0, 9] and texts[0].startswith("def") and texts[1] == "In the"
    assert generated[2] == greedy[1][0][:9]  # temperature 0 is greedy whatever top_k


def test_export_rejects_prompts_and_lengths_over_its_limits(char_export):
    serve = tf.saved_model.load(char_export["export"]).signatures["serving_default"]
    limits = read_limits(char_export["export"])
    assert limits.max_generated_length == 1000 and limits.max_string_bytes == 4 * 2000
    for prompts, length, message in [(["x" * 2001], 5, "max_prompt_chars=2000"),
                                     (["x"], 1001, "max_generated_length=1000")]:
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            serve(**{k: tf.constant(v) for k, v in request(prompts, length, 1.0)[1].items()})


def test_in_graph_greedy_decoding_matches_the_keras_model(char_export):
    info = read_export(char_export["export"])
    chars = info.state["vocabulary"]["tokens"]
    model = serializable.load_model(info.keras_model_path)
    serve = tf.saved_model.load(str(info.path)).signatures["serving_default"]
    prompt = "The return"
    generated = serve(prompt=tf.constant([prompt]), length=tf.constant([6]), temperature=tf.constant([0.0]),
                      top_k=tf.constant([0]))
    ids = [chars.index(c) for c in "\n" + prompt]
    expected = ""
    for _ in range(6):
        logits = model.predict(np.array([ids], "int32"), verbose=0)[0, -1]
        ids.append(int(np.argmax(logits)))
        expected += chars[ids[-1]]
    assert generated["generated"].numpy()[0].decode() == expected


def test_predict_prints_generated_text_from_a_prompt(char_export, capsys):
    assert cli.main(["predict", char_export["export"], "In the beginning"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[0] == "'In the beginning':" and printed[1].startswith("  In the beginning")
    assert len("\n".join(printed[1:])) > len("  In the beginning")
    code, answer, _ = run_cli(capsys, "predict", char_export["export"], "In the", "And", "--json")
    assert [t[:3] for t in answer["texts"]] == ["In ", "And"]


def test_predict_sets_the_signature_inputs_the_command_line_does_not_give(char_export, capsys):
    code, answer, err = run_cli(capsys, "predict", char_export["export"], "In the", "And", "--set", "length=5",
                                "--set", "temperature=0.5", "--signature", "serving_default", "--json")
    assert code == 0, err
    # Five characters generated after each prompt (the prompt is printed with them).
    assert [len(text) for text in answer["texts"]] == [len("In the") + 5, len("And") + 5]
    for argv, message in [(["--set", "top_q=3"], "signature 'serving_default''s inputs: length, prompt, temperature"),
                          (["--set", "length=many"], "expected int32 values for input 'length'"),
                          (["--signature", "nosuch"], "no signature 'nosuch'")]:
        code, _, err = run_cli(capsys, "predict", char_export["export"], "In the", *argv)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_user_text_file_trains(capsys, tmp_path):
    corpus = tmp_path / "mine.txt"
    corpus.write_text("\n".join(f"line {i}: the quick brown fox jumps over the lazy dog" for i in range(400)),
                      encoding="utf-8")
    code, result, err = run_cli(capsys, "run", "text_generation", "--preset", "tiny", "--json", "--out",
                                str(tmp_path / "out"), "--data", str(corpus))
    assert code == 0, err
    assert result["data"]["source"] == str(corpus) and result["data"]["lines"] == 400


@pytest.mark.parametrize("content, message", [
    (b"", "the file is empty"),
    (b"In the beginning\n\xff\xfe text", "line 2: byte 0xff is not UTF-8"),
])
def test_bad_text_files_exit_2_with_one_line(capsys, tmp_path, content, message):
    (tmp_path / "bad.txt").write_bytes(content)
    code, _, err = run_cli(capsys, "run", "text_generation", "--preset", "tiny", "--data", str(tmp_path / "bad.txt"),
                           "--out", str(tmp_path / "out"))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_missing_sword_packages_exit_2_naming_the_apt_command(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(text_generation.CORPORA, "kjv",
                        functools.partial(text_data.kjv_bible, binary=str(tmp_path / "no-mod2imp")))
    code, _, err = run_cli(capsys, "run", "text_generation", "--out", str(tmp_path / "out"))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "apt-get install -y libsword-utils sword-text-kjv" in err


def test_fine_tuning_adds_the_new_characters_and_keeps_the_old_rows(char_export, tmp_path):
    pipeline = text_generation.TextGeneration()
    info, data = sample_fine_tuning(pipeline, char_export["export"], tmp_path)
    config, old = resolve_config(pipeline.Config, "tiny"), info.state["vocabulary"]["tokens"]
    chars = data.state["vocabulary"]["tokens"]
    assert chars[: len(old)] == old and chars[len(old):] == ["é", "ñ"]  # as often each: first seen first
    assert data.report[VOCABULARIES] == {"characters": {"added": ["é", "ñ"], "size": len(old) + 2, "oov_rate": 0.0}}
    loaded = serializable.load_model(info.keras_model_path)
    exported = weights_by_path(loaded)
    grown = pipeline.adapt_model(loaded, config, data)
    new = weights_by_path(grown)
    assert new["embedding/embeddings"].shape == (len(old) + 2, config.embedding_dim)
    assert new["logits/kernel"].shape == (config.units, len(old) + 2) and new["logits/bias"].shape == (len(old) + 2,)
    np.testing.assert_array_equal(new["embedding/embeddings"][: len(old)], exported["embedding/embeddings"])
    np.testing.assert_array_equal(new["logits/kernel"][:, : len(old)], exported["logits/kernel"])
    np.testing.assert_array_equal(new["logits/bias"], np.r_[exported["logits/bias"], 0.0, 0.0])
    for before, after in zip(loaded.weights, grown.weights):  # the LSTMs: copied whole
        if after.path.startswith("lstm"):
            np.testing.assert_array_equal(keras.ops.convert_to_numpy(after), exported[before.path])
    # vocabulary=keep: the export's characters, the new ones read as <unk> (id 0), the model as exported
    _, kept = sample_fine_tuning(pipeline, char_export["export"], tmp_path, "vocabulary=keep")
    assert kept.state["vocabulary"]["tokens"] == old
    assert kept.report[VOCABULARIES]["characters"]["added"] == [] and kept.arrays["train_counts"][0] > 0
    loaded = serializable.load_model(info.keras_model_path)
    assert pipeline.adapt_model(loaded, config, kept) is loaded


def test_a_fine_tuned_export_reads_and_continues_a_prompt_with_a_new_character(char_export, tmp_path, capsys):
    printed, info = finetune_on_sample(capsys, "text_generation", char_export["export"], tmp_path)
    assert "characters: " in printed and "2 added (é, ñ)" in printed
    chars = info.state["vocabulary"]["tokens"]
    assert text_data.Vocabulary.read(info.path / "assets" / "chars.txt").tokens == chars
    # the graph reads ñ as its new id: its greedy continuation is the Keras model's from those ids
    model = serializable.load_model(info.keras_model_path)
    serve = tf.saved_model.load(str(info.path)).signatures["serving_default"]
    generated = serve(prompt=tf.constant(["señor"]), length=tf.constant([5]), temperature=tf.constant([0.0]),
                      top_k=tf.constant([0]))["generated"].numpy()[0].decode()
    ids = [chars.index(c) for c in "\nseñor"]
    for _ in range(5):
        logits = model.predict(np.array([ids], "int32"), verbose=0)[0, -1]
        ids.append(int(np.argmax(logits[1:])) + 1)  # the export never generates <unk>
    assert generated == "".join(chars[i] for i in ids[-5:])
    assert cli.main(["predict", str(info.path), "señor"]) == 0 and "señor" in capsys.readouterr().out


def test_epoch_bits_per_char_are_those_of_the_first_validation_windows(tiny_exports, tiny_report):
    result, _ = tiny_report("text_generation")[1:]
    logged = last_epoch_values(result, ["bits_per_char"])
    model, data = trained_model_and_data(tiny_exports, "text_generation")
    log_probs = [reference_log_probs(model(chars, training=False).numpy(), targets.numpy()).reshape(-1)
                 for chars, targets in data.val.take(EPOCH_METRIC_EXAMPLES).batch(500)]
    # float32 logits reduced in another order: 1e-5 relative is rounding, far below a training step's change
    np.testing.assert_allclose(logged["bits_per_char"], -np.concatenate(log_probs).mean() / np.log(2), rtol=1e-5)


def test_report_shows_greedy_and_sampled_texts_from_test_prompts(tiny_exports, tiny_report):
    result, arrays = tiny_report("text_generation")[1:]
    assert_sections("text_generation", result, arrays, ["samples"], figures=0)
    prompts = arrays["samples/prompt"]
    assert len(prompts) == text_generation.REPORT_PROMPTS * len(text_generation.REPORT_TEMPERATURES)
    assert sorted(set(arrays["samples/temperature"])) == sorted(text_generation.REPORT_TEMPERATURES)
    assert all(1 <= len(prompt.split()) <= text_generation.REPORT_PROMPT_WORDS for prompt in prompts)
    # each sample is as long as asked: one character per step, <unk> never generated
    assert [len(text) for text in arrays["samples/generated"]] == [text_generation.REPORT_SAMPLE_CHARS] * len(prompts)
    table = text_generation.TextGeneration().report_sections(result, arrays)[0].blocks[0]
    assert [row[0] for row in table.rows] == [repr(str(prompt)) for prompt in prompts]
