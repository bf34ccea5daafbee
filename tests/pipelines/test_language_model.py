"""End-to-end checks of the language_model pipeline on its tiny preset, through the CLI."""
import functools
import math

import numpy as np
import pytest

from pipelines import language_model
from seqapps import cli, runner
from seqapps.data import text as text_data
from tests.export_harness import call_in_tensorflow_only_process, decoded
from tests.pipelines.cli_runner import run_cli

pytestmark = pytest.mark.large


@pytest.fixture(scope="module")
def lm_export(tmp_path_factory):
    """Runs the tiny preset (LSTM + ReLU bottleneck, B-NCE, pydoc topics) once."""
    out = tmp_path_factory.mktemp("exports")
    return runner.run("language_model", "tiny", out=out)


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
