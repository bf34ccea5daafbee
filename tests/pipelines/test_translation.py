"""Tests of the translation pipeline: a tiny end-to-end run, its report, fine-tuning and bad input."""
import json
from pathlib import Path

import keras
import numpy as np
import pytest

from pipelines import translation
from seqapps import runner
from seqapps.config import resolve_config
from seqapps.export import ExportCalls
from seqapps.pipeline import VOCABULARIES
from seqapps.training import batch_datasets
from seqapps.report import run_folder
from seqapps.report.document import Table, figures_of
from tests.export_harness import call_in_tensorflow_only_process, decoded
from tests.pipelines.cli_runner import assert_rejected_in_one_line
from tests.pipelines.report_checks import assert_attention_sums_to_one, assert_figures_decode, sections_by_anchor


# --- the pipeline, end to end on the tiny preset (num2words pairs: no apt step) -------------------------------


@pytest.fixture(scope="module")
def tiny_export(tiny_run):
    """The session's tiny run (a 32-unit BiLSTM/attention model on 600 number phrases), a private copy."""
    return tiny_run("translation")


@pytest.mark.large
def test_tiny_run_reports_bleu_and_chrf_for_greedy_beam_and_the_lexical_baseline(tiny_export):
    metrics, baseline = tiny_export["metrics"], tiny_export["baseline"]["lexical_ibm1"]
    for name in ("greedy_bleu", "greedy_chrf", "beam_bleu", "beam_chrf"):
        assert 0 <= metrics[name] <= 100
    assert metrics["signature/greedy_bleu"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp")
    assert 0 <= baseline["bleu"] <= 100 and baseline["chrf"] > 20  # number words map one to one often
    assert 1 < metrics["ppl_full"] < tiny_export["data"]["target_vocabulary"] * 2
    assert len(metrics["samples/translations"]) == 5
    assert tiny_export["data"]["source"] == "num2words en-es"


@pytest.mark.large
def test_beam_length_penalty_is_the_best_validation_choice_and_is_exported(tiny_export):
    metrics = tiny_export["metrics"]
    by_alpha = {float(alpha): bleu for alpha, bleu in metrics["val_beam_bleu_by_length_penalty"].items()}
    assert sorted(by_alpha) == [0.6, 1.4]  # the tiny preset's choices
    best = max(by_alpha.values())
    assert metrics["length_penalty"] == next(alpha for alpha, bleu in by_alpha.items() if bleu == best)
    state = json.loads((Path(tiny_export["export"]) / "assets.extra" / "state.json").read_text())
    assert state["length_penalty"] == metrics["length_penalty"]  # the export decodes with the choice


@pytest.mark.large
def test_export_translates_empty_long_and_unknown_text_in_a_tensorflow_only_process(tiny_export):
    texts = np.array(["three hundred and five", "", "   ", "zzz unknown words", "one " * 250_000], dtype=object)
    answer = call_in_tensorflow_only_process(tiny_export["export"], [
        (name, {"text": texts}) for name in ("serving_default", "beam", "align")])
    assert answer["imported"] == []
    greedy, beam, align = answer["outputs"]
    translations = decoded(greedy["translation"])
    assert len(translations) == 5 and translations[1:3] == ["", ""]  # an empty text translates to ""
    assert greedy["score"][1:3].tolist() == [0.0, 0.0] and np.all((greedy["score"] > -50) & (greedy["score"] <= 0))
    assert beam["translations"].shape == (5, 2) and beam["scores"].shape == (5, 2)
    assert np.all(beam["scores"][:, 0] >= beam["scores"][:, 1])  # best first
    assert decoded(align["translation"]) == translations
    source, target, attention = decoded(align["source_tokens"]), decoded(align["target_tokens"]), align["attention"]
    assert attention.shape == (5, len(target[0]), len(source[0]))
    assert source[0][:4] == ["three", "hundred", "and", "five"]
    assert sum(1 for token in source[4] if token) == 30  # a 1 MB text is cut to max_length words
    # Rows of real target words sum to 1 over the real source words (a softmax), padding rows to 0.
    words = np.array([[token != "" for token in row] for row in target])
    np.testing.assert_allclose(attention.sum(-1)[words], 1.0, atol=1e-5)
    assert np.all(attention.sum(-1)[~words] == 0)


@pytest.mark.large
def test_report_data_is_what_the_export_serves_for_the_first_sample_sentences(tiny_exports, tiny_report):
    _, result, arrays = tiny_report("translation")
    samples = result["metrics"]["samples/translations"][: translation.REPORT_SENTENCES]
    assert arrays["source"].tolist() == [sample["source"] for sample in samples]
    served = ExportCalls(tiny_exports["translation"]["export"])("serving_default",
                                                                 {"text": arrays["source"].astype(object)})
    assert arrays["translation"].tolist() == decoded(served["translation"])
    assert [[word for word in row if word] for row in arrays["source_tokens"].tolist()] == [
        translation.TOKENIZER.tokenize(source) for source in arrays["source"]]
    rows, columns = arrays["target_tokens"].shape[1], arrays["source_tokens"].shape[1]
    assert arrays["attention"].shape == (len(samples), rows, columns)
    assert_attention_sums_to_one(arrays["attention"], arrays["target_tokens"] != "", arrays["source_tokens"] != "")


@pytest.mark.large
def test_report_sections_show_scores_attention_per_sentence_and_samples_even_without_report_data(tiny_report):
    folder, result, arrays = tiny_report("translation")
    sections = sections_by_anchor(translation.Translation(), result, arrays)
    assert list(sections) == ["scores", "attention", "samples"]
    metrics, lexical = result["metrics"], result["baseline"]["lexical_ibm1"]
    scores = next(block for block in sections["scores"].blocks if isinstance(block, Table))
    assert [list(row) for row in scores.rows] == [
        ["greedy search", metrics["greedy_bleu"], metrics["greedy_chrf"]],
        ["beam search", metrics["beam_bleu"], metrics["beam_chrf"]],
        ["word by word (IBM Model 1)", lexical["bleu"], lexical["chrf"]]]
    with_words = sum(1 for source, target in zip(arrays["source_tokens"], arrays["target_tokens"])
                     if any(source) and any(target))
    assert [figure.name for figure in figures_of([sections["attention"]])] == [
        f"attention_{row + 1}" for row in range(with_words)]
    assert_figures_decode(sections.values())
    samples = sections["samples"].blocks[0]
    assert [row[0] for row in samples.rows] == [s["source"] for s in metrics["samples/translations"]]
    page = (folder / run_folder.REPORT_FILE).read_text(encoding="utf-8")
    assert all(f'id="{anchor}"' in page for anchor in sections) and 'id="figure-attention_1"' in page
    # Rebuilt from an export alone (no report data): the attention is left out, the rest is drawn.
    without = sections_by_anchor(translation.Translation(), result, {})
    assert list(without) == list(sections) and figures_of([without["attention"]]) == []
    assert [figure.name for figure in figures_of(list(without.values()))] == ["translation_scores"]


@pytest.mark.large
def test_predict_prints_one_translation_per_text(tiny_export):
    text, value = runner.predict(tiny_export["export"], ["three hundred", "twelve"])
    assert value["inputs"] == ["three hundred", "twelve"] and len(value["translations"]) == 2
    assert [line.partition(" -> ")[0] for line in text.splitlines()] == ["'three hundred'", "'twelve'"]


@pytest.mark.parametrize("content, extra, message", [
    (b"one\tuno\ntwo\n", (), "line 2: no target text; expected source<TAB>target"),
    (b"one\tuno\ndos\xe9\tdos\n", (), "line 2: byte 0xe9 is not UTF-8"),
    (b"one two three four\tuno\n" * 40, ("--set", "max_length=3", "--set", "too_long=error"),
     "line 1: a pair of 4 and 1 tokens is longer than max_length=3"),
])
def test_bad_pair_files_are_one_line_errors(capsys, tmp_path, content, extra, message):
    path = tmp_path / "pairs.tsv"
    path.write_bytes(content)
    assert_rejected_in_one_line(capsys, tmp_path / "out", "translation", ["--data", str(path), *extra], message)


def test_user_pairs_keep_the_exported_vocabularies_and_map_new_words_to_unknown_with_vocabulary_keep(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("".join(f"word{i} one\tpalabra{i} uno\n" for i in range(60)) + "\n", encoding="utf-8")
    pipeline = translation.Translation()
    config = resolve_config(translation.TranslationConfig, "tiny", overrides=["split_by=pair", "too_long=truncate",
                                                                               "vocabulary=keep"])
    state = {"source_vocabulary": ["<unk>", "</s>", "<s>", "one"], "target_vocabulary": ["<unk>", "</s>", "<s>", "uno"],
             "max_length": 30, "max_decode_length": 20, "beam_size": 2, "length_penalty": 0.6, "replace_unknown": True}
    data = pipeline.load_data(config, str(path), state=state)
    assert data.state is state and data.report["counts"]["blank_lines"] == 1
    inputs, _, weights = next(iter(data.train))  # each pair cut to its own length
    assert inputs["source"].numpy().tolist() == [0, 3]  # "wordN" is unknown
    assert inputs["target_in"].numpy().tolist() == [translation.START_ID, 0, 3]
    assert inputs["target_out"].numpy().tolist() == [0, 3, translation.END_ID]
    assert weights.numpy().tolist() == [1, 1, 1]


def test_forty_user_pairs_split_as_requested(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("".join(f"word{i} one\tpalabra{i} uno\n" for i in range(40)), encoding="utf-8")
    config = resolve_config(translation.TranslationConfig, "tiny",
                            overrides=["split_by=chapter", "val_fraction=0.15", "test_fraction=0.1"])
    data = translation.Translation().load_data(config, str(path))
    assert data.report["split_counts"] == {"unit": "pairs", "train": 30, "val": 6, "test": 4}
    held_out = [*data.arrays["val"].sources, *data.arrays["test"].sources]
    assert len(set(held_out)) == 10 and held_out != [f"word{i} one" for i in range(30, 40)]  # not the file's end


@pytest.mark.parametrize("output", ["bnce", "softmax"])
def test_batches_pad_to_their_longest_pair_with_end_and_lose_the_same_as_full_width_ones(output):
    """Training batches pad each pair with END only to the batch's longest pair (here grouped by length; every
    pair once an epoch), and the per-token loss of the real tokens is that of the same pairs padded to the full
    ``max_length`` width, in training (B-NCE's batch-wide noise included) and in evaluation."""
    pipeline = translation.Translation()
    config = resolve_config(translation.TranslationConfig, "tiny", overrides=[f"output={output}", "dropout=0.0",
                                                                              "steps_per_epoch=null",
                                                                              "length_sorted_batches=32"])
    data = pipeline.load_data(config, None)
    train, _, steps = batch_datasets(data, config)
    widths = [int(batch[0]["target_in"].shape[1]) for batch in train.take(steps)]
    assert sum(1 for _ in train.take(steps).unbatch()) == int(data.train.cardinality())  # every pair once
    assert len(set(widths)) > 1 and max(widths) < config.max_length + 1  # each batch its own width, not the full

    pairs = list(data.train.take(64))
    inputs, zeros, weights = next(iter(data.train.take(64).padded_batch(64, padding_values=data.padding_values)))
    assert len({len(pair[2]) for pair in pairs}) > 1  # pairs of several lengths: the batch pads some
    for row, (pair, _, pair_weights) in enumerate(pairs):
        for key, ids in pair.items():
            length = len(ids)
            np.testing.assert_array_equal(inputs[key][row, :length], ids)
            assert np.all(inputs[key].numpy()[row, length:] == translation.END_ID), key
        assert np.all(weights.numpy()[row, len(pair_weights):] == 0)

    model = pipeline.build_model(config, data)
    model.compile(optimizer="sgd", **pipeline.compile_args(config, data))
    full = {key: np.pad(value.numpy(), [(0, 0), (0, (config.max_length + 1) - value.shape[1])],
                        constant_values=translation.END_ID)[:, :config.max_length if key == "source" else None]
            for key, value in inputs.items()}
    real = weights.numpy() > 0
    for training in (True, False):
        cut = keras.ops.convert_to_numpy(model(inputs, training=training))
        wide = keras.ops.convert_to_numpy(model(full, training=training))[:, :cut.shape[1]]
        # float32 sums over another number of masked steps: 1e-5
        np.testing.assert_allclose(cut[real], wide[real], rtol=1e-5, atol=1e-5)
    # Keras' loss of the batch (a mean over its cells) is the full-width batch's once batch_map reweighs it
    full_weights = np.pad(weights.numpy(), [(0, 0), (0, config.max_length + 1 - weights.shape[1])])
    wide_loss = model.test_on_batch(full, np.zeros_like(full_weights), full_weights)
    assert model.test_on_batch(*data.batch_map(inputs, zeros, weights)) == pytest.approx(wide_loss, rel=1e-5)
    assert model.test_on_batch(inputs, zeros, weights) > 1.5 * wide_loss  # unweighed: the cut batch's cells are fewer


ENGLISH, SPANISH = ["one", "two", "three", "four"], ["uno", "dos", "tres", "cuatro"]


def _pair_file(path, words: int, lines: int, seed: int):
    """Lines of two number words and their Spanish, drawn from the first ``words`` of each list."""
    rng = np.random.default_rng(seed)
    english, spanish = [*ENGLISH, "seven", "eight"][:words], [*SPANISH, "siete", "ocho"][:words]
    rows = [(rng.integers(words), rng.integers(words)) for _ in range(lines)]
    path.write_text("".join(f"{english[a]} {english[b]}\t{spanish[a]} {spanish[b]}\n" for a, b in rows),
                    encoding="utf-8")
    return str(path)


def _step_logits(model, inputs) -> np.ndarray:
    """The output layer's logits at every target step, lexicon bias included, in NumPy: h W^T + b + bias.

    The model's lexicon returns its mixture (B-NCE evaluates it at the batch's columns); the dense bias is
    called here from the decoder's attention.
    """
    output, lexicon = model.get_layer("output"), model.get_layer("lexicon")
    hidden, attention = keras.Model(model.input, model.get_layer("decoder").output[:2])(inputs, training=False)
    lexical = lexicon({"attention": attention, "source_ids": inputs["source"]})
    return (keras.ops.convert_to_numpy(hidden) @ keras.ops.convert_to_numpy(output.kernel).T
            + keras.ops.convert_to_numpy(output.bias) + keras.ops.convert_to_numpy(lexical))


@pytest.mark.parametrize("output", ["bnce", "softmax"])
def test_fine_tuning_pairs_with_new_words_grow_the_vocabularies_and_keep_the_old_logits(tmp_path, output):
    pipeline = translation.Translation()
    config = resolve_config(translation.TranslationConfig, "tiny", overrides=[f"output={output}"])
    old = pipeline.load_data(config, _pair_file(tmp_path / "old.tsv", 4, 80, seed=0))
    model = pipeline.build_model(config, old)
    new = pipeline.load_data(config, _pair_file(tmp_path / "new.tsv", 6, 40, seed=1), state=old.state)
    for key, added in (("source_vocabulary", {"seven", "eight"}), ("target_vocabulary", {"siete", "ocho"})):
        assert new.state[key][: len(old.state[key])] == old.state[key]  # the old words keep their ids
        assert set(new.state[key][len(old.state[key]):]) == added
    report = new.report[VOCABULARIES]["target words"]
    assert set(report["added"]) == {"siete", "ocho"} and report["size"] == len(old.state["target_vocabulary"]) + 2
    assert report["oov_rate"] == 0.0 and new.report["target_oov_rate"]["train"] == 0.0
    grown = pipeline.adapt_model(model, config, new)
    size = len(old.state["target_vocabulary"])
    assert grown.get_layer("output").vocab_size == size + 2 and grown.get_layer("output").loss == output
    assert grown.get_layer("source_embedding").input_dim == len(old.state["source_vocabulary"]) + 2
    inputs = next(iter(old.test.padded_batch(4, padding_values=old.padding_values)))[0]  # old words only: same ids
    before, after = _step_logits(model, inputs), _step_logits(grown, inputs)
    # float32 matmuls of the same numbers in another order; logits are O(10)
    np.testing.assert_allclose(after[..., :size], before, rtol=1e-5, atol=1e-4)
    # the new source words get the lexicon rows of IBM Model 1 fitted on the fine-tuning pairs
    seven = new.state["source_vocabulary"].index("seven")
    table = keras.ops.convert_to_numpy(grown.get_layer("lexicon").table_ids)
    assert new.state["target_vocabulary"][table[seven, 0]] == "siete"
