"""Tests of the translation pipeline: its lexical baseline, a tiny end-to-end run and bad input."""
import collections
import json
import random
from pathlib import Path

import numpy as np
import pytest

from pipelines import translation
from pipelines.translation import NULL, LexicalTranslator
from seqapps import runner
from seqapps.config import resolve_config
from seqapps.data.text import Vocabulary
from tests.export_harness import call_in_tensorflow_only_process, decoded
from tests.pipelines.cli_runner import assert_rejected_in_one_line


def _ibm1_reference(sources, targets, iterations):
    """IBM Model 1 EM written as the textbook's nested loops (Koehn 2010, fig. 4.3), with a NULL word."""
    target_vocab = {word for sentence in targets for word in sentence}
    t = collections.defaultdict(lambda: 1.0 / len(target_vocab))
    for _ in range(iterations):
        count, total = collections.defaultdict(float), collections.defaultdict(float)
        for source, target in zip(sources, targets):
            source = [NULL, *source]
            for f in target:
                norm = sum(t[(f, e)] for e in source)
                for e in source:
                    count[(f, e)] += t[(f, e)] / norm
                    total[e] += t[(f, e)] / norm
        t = collections.defaultdict(float, {(f, e): c / total[e] for (f, e), c in count.items()})
    best = {}
    for (f, e), p in sorted(t.items()):
        if e != NULL and p > best.get(e, ("", -1.0))[1]:
            best[e] = (f, p)
    return {e: f for e, (f, _) in best.items()}


def test_ibm1_learns_the_textbook_example():
    # Koehn (2010) section 4.2: "das Haus", "das Buch", "ein Buch"; EM links each word to its translation.
    translator = LexicalTranslator.fit([["the", "house"], ["the", "book"], ["a", "book"]],
                                       [["das", "haus"], ["das", "buch"], ["ein", "buch"]], iterations=10)
    assert translator.table == {"the": "das", "house": "haus", "book": "buch", "a": "ein"}
    assert translator.translate(["a", "house", "moses"]) == ["ein", "haus", "moses"]  # unseen words are copied


def test_ibm1_lexicon_table_gives_vocabulary_ids_with_unknown_targets_merged():
    translator = LexicalTranslator.fit([["the", "house"], ["the", "book"], ["a", "book"]],
                                       [["das", "haus"], ["das", "buch"], ["ein", "buch"]], iterations=10, top_k=3)
    t = {word: dict(found) for word, found in translator.translations.items()}
    source_vocab = Vocabulary(["<unk>", "</s>", "<s>", "the", "house", "book"], [0] * 6)  # "a" is unknown
    target_vocab = Vocabulary(["<unk>", "</s>", "<s>", "das", "buch"], [0] * 5)  # "haus", "ein" are unknown
    ids, probs = translator.lexicon(source_vocab, target_vocab, top_k=2)
    assert ids.shape == probs.shape == (6, 2) and not probs[:3].any()  # no translations of the special tokens
    assert ids[4].tolist() == [0, 3]  # house: haus (as <unk>), then das; it never met "buch"
    np.testing.assert_allclose(probs[4], [t["house"]["haus"], t["house"]["das"]], rtol=1e-6)
    assert ids[5, 0] == 4 and probs[5, 0] == pytest.approx(t["book"]["buch"], rel=1e-6)
    assert probs[5, 1] == pytest.approx(max(t["book"]["ein"], t["book"]["das"]), rel=1e-6)


def test_ibm1_matches_the_nested_loop_reference_on_random_pairs():
    rng = random.Random(0)
    sources = [[f"s{rng.randrange(12)}" for _ in range(rng.randint(1, 6))] for _ in range(60)]
    targets = [[f"t{rng.randrange(15)}" for _ in range(rng.randint(1, 6))] for _ in range(60)]
    assert LexicalTranslator.fit(sources, targets, iterations=4).table == _ibm1_reference(sources, targets, 4)


# --- the pipeline, end to end on the tiny preset (num2words pairs: no apt step) -------------------------------


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory):
    """Runs the tiny preset once: a 32-unit BiLSTM/attention model on 600 number phrases."""
    return runner.run("translation", "tiny", out=tmp_path_factory.mktemp("exports"))


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
def test_predict_prints_one_translation_per_text(tiny_export):
    text, value = runner.predict(tiny_export["export"], ["three hundred", "twelve"])
    assert len(value["translations"]) == 2 and text == "\n".join(value["translations"])


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


def test_user_pairs_keep_the_exported_vocabularies_and_map_new_words_to_unknown(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("".join(f"word{i} one\tpalabra{i} uno\n" for i in range(60)) + "\n", encoding="utf-8")
    pipeline = translation.Translation()
    config = resolve_config(translation.TranslationConfig, "tiny", overrides=["split_by=pair", "too_long=truncate"])
    state = {"source_vocabulary": ["<unk>", "</s>", "<s>", "one"], "target_vocabulary": ["<unk>", "</s>", "<s>", "uno"],
             "max_length": 30, "max_decode_length": 20, "beam_size": 2, "length_penalty": 0.6, "replace_unknown": True}
    data = pipeline.load_data(config, str(path), state=state)
    assert data.state is state and data.report["counts"]["blank_lines"] == 1
    inputs, _, weights = next(iter(data.train.batch(1)))
    assert inputs["source"].numpy()[0, :3].tolist() == [0, 3, translation.END_ID]  # "wordN" is unknown
    assert inputs["target_in"].numpy()[0, :3].tolist() == [translation.START_ID, 0, 3]
    assert inputs["target_out"].numpy()[0, :3].tolist() == [0, 3, translation.END_ID]
    assert weights.numpy()[0, :4].tolist() == [1, 1, 1, 0]


def test_forty_user_pairs_split_as_requested(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("".join(f"word{i} one\tpalabra{i} uno\n" for i in range(40)), encoding="utf-8")
    config = resolve_config(translation.TranslationConfig, "tiny",
                            overrides=["split_by=chapter", "val_fraction=0.15", "test_fraction=0.1"])
    data = translation.Translation().load_data(config, str(path))
    assert data.report["split_counts"] == {"unit": "pairs", "train": 30, "val": 6, "test": 4}
    held_out = [*data.arrays["val"].sources, *data.arrays["test"].sources]
    assert len(set(held_out)) == 10 and held_out != [f"word{i} one" for i in range(30, 40)]  # not the file's end
