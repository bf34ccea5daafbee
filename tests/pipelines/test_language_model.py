"""End-to-end checks of the language_model pipeline on its tiny preset, through the CLI."""
import functools
import math

import keras
import numpy as np
import pytest

from pipelines import language_model
from seqapps import cli, serializable
from seqapps.config import resolve_config
from seqapps.data import samples
from seqapps.data import text as text_data
from seqapps.export_format import read_export
from seqapps.layers.batch_nce import unigram_distribution
from seqapps.pipeline import EPOCH_METRIC_EXAMPLES, VOCABULARIES
from tests.export_harness import call_in_tensorflow_only_process, decoded
from tests.pipelines.cli_runner import finetune_on_sample, run_cli, sample_fine_tuning, weights_by_path
from tests.pipelines.epoch_reports import (assert_sections, last_epoch_values, reference_log_probs,
                                           trained_model_and_data)

pytestmark = pytest.mark.large


@pytest.fixture(scope="module")
def lm_export(tiny_run):
    """The session's tiny run (LSTM + ReLU bottleneck, B-NCE, pydoc topics), a private copy."""
    return tiny_run("language_model")


def test_tiny_run_reports_both_perplexities_speed_and_a_unigram_baseline(lm_export):
    metrics = lm_export["metrics"]
    assert set(metrics) == {"ppl_full", "ppl_self_normalized", "parameters", "vocabulary", "train_tokens_per_s",
                            "train_seconds_per_epoch"}
    assert metrics["vocabulary"] == 2000 and 1 < metrics["ppl_full"] < 1e5 and metrics["ppl_self_normalized"] > 1
    assert metrics["train_tokens_per_s"] > 0 and metrics["parameters"] > 0
    assert 1 < lm_export["baseline"]["unigram"]["ppl_full"] < 2000
    assert lm_export["data"]["source"] == "pydoc_data.topics"


@pytest.mark.parametrize("architecture, loss", [("ffnn_relu", "softmax"), ("rnn", "snce")])
def test_other_architectures_and_losses_train_and_export(capsys, tmp_path, architecture, loss):
    code, result, err = run_cli(capsys, "run", "language_model", "--preset", "tiny", "--json", "--out",
                                str(tmp_path), "--set", f"architecture={architecture}", "--set", f"loss={loss}")
    assert code == 0, err
    assert result["export"] == str(tmp_path / "language_model" / "1")
    assert math.isfinite(result["metrics"]["ppl_full"])


def test_bnce_with_one_target_per_batch_needs_extra_noise(capsys, tmp_path):
    one_target = ["--set", "batch_size=1"]  # noise_scope=time_step: one target per step
    code, _, err = run_cli(capsys, "run", "language_model", "--preset", "tiny", "--out", str(tmp_path), *one_target)
    assert code == 2 and "extra_noise" in err and len(err.strip().splitlines()) == 1
    language_model.LanguageModelConfig(batch_size=1, noise_scope="batch").validate()  # seq_len targets pooled
    code, result, err = run_cli(capsys, "run", "language_model", "--preset", "tiny", "--json", "--out",
                                str(tmp_path), *one_target, "--set", "extra_noise=20")
    assert code == 0, err


def test_export_scores_raw_text_in_a_tensorflow_only_process(lm_export):
    text = np.array(["The return statement", "", "zzqx return"], dtype=object)
    (out,) = call_in_tensorflow_only_process(lm_export["export"], [("serving_default", {"text": text})])["outputs"]
    answer = {"words": decoded(out["words"]), "log_probs": out["log_probs"].tolist(),
              "perplexity": out["perplexity"].tolist(), "next": decoded(out["next_words"]),
              "next_log_probs": out["next_log_probs"].tolist()}
    assert answer["words"][0] == ["the", "return", "statement"] and answer["words"][1] == ["", "", ""]
    assert answer["words"][2][:2] == ["<unk>", "return"]
    first = answer["log_probs"][0]
    assert all(value < 0 for value in first)
    assert answer["perplexity"][0] == pytest.approx(math.exp(-sum(first) / 3), rel=1e-4)
    assert answer["perplexity"][1] == 1.0  # no words: nothing to score
    assert [len(row) for row in answer["next"]] == [5, 5, 5]
    assert answer["next_log_probs"][0] == sorted(answer["next_log_probs"][0], reverse=True)


def test_predict_prints_perplexity_and_next_words(lm_export, capsys):
    code, answer, _ = run_cli(capsys, "predict", lm_export["export"], "the return statement", "--json")
    assert code == 0
    (result,) = answer["results"]
    assert [w["word"] for w in result["words"]] == ["the", "return", "statement"]
    assert len(result["next_words"]) == 5 and result["perplexity"] > 1
    assert cli.main(["predict", lm_export["export"], "the return statement"]) == 0
    assert "'the return statement': perplexity" in capsys.readouterr().out


def test_user_text_file_trains(capsys, tmp_path):
    corpus = tmp_path / "mine.txt"
    corpus.write_text("\n".join(line for line in text_data.pydoc_topics().lines[:400]), encoding="utf-8")
    code, result, err = run_cli(capsys, "run", "language_model", "--preset", "tiny", "--json", "--out",
                                str(tmp_path / "out"), "--data", str(corpus))
    assert code == 0, err
    assert result["data"]["source"] == str(corpus) and result["data"]["lines"] == 400


@pytest.mark.parametrize("content, message", [
    (b"\n\n", "the file is empty"),
    (b"plain words\nna\xefve\n", "line 2: byte 0xef is not UTF-8"),
])
def test_bad_text_files_exit_2_with_one_line(capsys, tmp_path, content, message):
    (tmp_path / "bad.txt").write_bytes(content)
    code, _, err = run_cli(capsys, "run", "language_model", "--preset", "tiny", "--data", str(tmp_path / "bad.txt"),
                           "--out", str(tmp_path / "out"))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_missing_wordnet_package_exits_2_naming_the_apt_command(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(language_model.CORPORA, "wordnet",
                        functools.partial(text_data.wordnet_glosses, tmp_path / "no-wordnet"))
    code, _, err = run_cli(capsys, "run", "language_model", "--out", str(tmp_path / "out"))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "apt-get install -y wordnet-base" in err


def test_fine_tuning_adds_the_new_words_and_keeps_the_old_rows(lm_export, tmp_path):
    pipeline = language_model.LanguageModel()
    info, data = sample_fine_tuning(pipeline, lm_export["export"], tmp_path)
    config, old = resolve_config(pipeline.Config, "tiny"), info.state["vocabulary"]["tokens"]
    words, counts = data.state["vocabulary"]["tokens"], data.arrays["train_counts"]
    added = words[len(old):]
    assert words[: len(old)] == old and added and set(samples.NEW_WORDS) & set(added)
    # min_count=1 and fewer words than max_vocab: every training word has an id, the new ones the most frequent first
    assert counts[0] == 0 and data.report["train_oov_rate"] == 0.0
    assert (counts[len(old):] > 0).all() and (np.diff(counts[len(old):]) <= 0).all()
    facts = data.report[VOCABULARIES]["words"]
    assert facts["added"] == added and facts["size"] == len(words) and 0 <= facts["oov_rate"] < 1
    loaded = serializable.load_model(info.keras_model_path)
    exported = weights_by_path(loaded)
    grown = pipeline.adapt_model(loaded, config, data)
    new = weights_by_path(grown)
    assert new["embedding/embeddings"].shape == (len(words), config.embedding_dim)
    assert new["output/kernel"].shape == (len(words), config.bottleneck_units)
    for path in ("embedding/embeddings", "output/kernel", "output/bias"):
        np.testing.assert_array_equal(new[path][: len(old)], exported[path])
    for before, after in zip(loaded.weights, grown.weights):  # the layers between them: copied whole
        if not after.path.startswith(("embedding/", "output/")):
            np.testing.assert_array_equal(keras.ops.convert_to_numpy(after), exported[before.path])
    # the new words' bias and the B-NCE noise: the fine-tuning data's unigram over the grown vocabulary
    unigram = unigram_distribution(counts)
    np.testing.assert_allclose(new["output/bias"][len(old):], np.log(unigram[len(old):]) + config.log_z, rtol=1e-6)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(grown.get_layer("output").noise_probs), unigram, rtol=1e-6)
    # vocabulary=keep: the export's words, the new ones read as <unk>, the model as exported
    _, kept = sample_fine_tuning(pipeline, lm_export["export"], tmp_path, "vocabulary=keep")
    assert kept.state["vocabulary"]["tokens"] == old and kept.report["train_oov_rate"] > 0
    assert kept.report[VOCABULARIES]["words"]["added"] == []
    loaded = serializable.load_model(info.keras_model_path)
    assert pipeline.adapt_model(loaded, config, kept) is loaded


def test_a_fine_tuned_export_scores_the_new_words(lm_export, tmp_path, capsys):
    printed, info = finetune_on_sample(capsys, "language_model", lm_export["export"], tmp_path)
    added = info.state["vocabulary"]["tokens"][len(read_export(lm_export["export"]).state["vocabulary"]["tokens"]):]
    assert f"words: {len(info.state['vocabulary']['tokens'])} in all; {len(added)} added" in printed
    assert text_data.Vocabulary.read(info.path / "assets" / "words.txt").tokens == info.state["vocabulary"]["tokens"]
    new_word = next(word for word in samples.NEW_WORDS if word in added)
    code, answer, _ = run_cli(capsys, "predict", str(info.path), f"the old man sees a {new_word}", "--json")
    assert [w["word"] for w in answer["results"][0]["words"]] == ["the", "old", "man", "sees", "a",
                                                                                 new_word]


def test_epoch_perplexities_are_those_of_the_first_validation_windows(tiny_exports, tiny_report):
    result, _ = tiny_report("language_model")[1:]
    logged = last_epoch_values(result, ["ppl_full", "ppl_self_normalized"])
    model, data = trained_model_and_data(tiny_exports, "language_model")
    body = keras.Model(model.inputs[0], model.get_layer("hidden").output)
    output = model.get_layer("output")
    kernel, bias = output.kernel.numpy().astype(np.float64), output.bias.numpy().astype(np.float64)
    full, normalized = [], []
    for inputs, _ in data.val.take(EPOCH_METRIC_EXAMPLES).batch(500):
        logits = body(inputs["tokens"], training=False).numpy().astype(np.float64) @ kernel.T + bias
        targets = inputs["targets"].numpy()
        full.append(reference_log_probs(logits, targets).reshape(-1))
        normalized.append((np.take_along_axis(logits, targets[..., None], -1)[..., 0] - output.log_z).reshape(-1))
    # float32 scores reduced in another order: 1e-4 relative is rounding, far below a training step's change
    np.testing.assert_allclose(logged["ppl_full"], np.exp(-np.concatenate(full).mean()), rtol=1e-4)
    np.testing.assert_allclose(logged["ppl_self_normalized"], np.exp(-np.concatenate(normalized).mean()), rtol=1e-4)


def test_report_draws_both_perplexities_and_scores_test_sentences_through_the_export(tiny_exports, tiny_report):
    result, arrays = tiny_report("language_model")[1:]
    assert_sections("language_model", result, arrays, ["perplexity", "sentences"], figures=1)
    sentences = arrays["sentences/text"]
    assert 1 <= len(sentences) <= language_model.REPORT_SENTENCES
    assert all(4 <= len(sentence.split()) <= language_model.REPORT_MAX_WORDS for sentence in sentences)
    assert np.all(np.isfinite(arrays["sentences/perplexity"])) and np.all(arrays["sentences/perplexity"] > 1)
    assert arrays["sentences/next_words"].shape == (len(sentences), 5)
    probabilities = np.exp(arrays["sentences/next_log_probs"])
    assert np.all(np.diff(probabilities, axis=1) <= 0) and np.all(probabilities.sum(1) <= 1 + 1e-5)
