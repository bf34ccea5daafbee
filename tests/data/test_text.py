"""Tests of the text corpora readers, tokenisation and vocabularies (seqapps.data.text)."""
import json
import shutil
import stat

import numpy as np
import pytest
import tensorflow as tf

from seqapps.data import text
from seqapps.errors import DataError
from tests.debian_data import installed_or_skip
from tests.export_harness import call_in_tensorflow_only_process, decoded

IMP_SAMPLE = """$$$[ Module Heading ]
$$$Genesis 0:0
<div canonical="true" osisID="Gen" type="book"/> <title level="1">The First Book of Moses</title>
$$$Genesis 1:0
<chapter n="1" osisID="Gen.1" sID="Gen.1"/>
$$$Genesis 1:1
In the <w lemma="strong:H7225">beginning</w> <w lemma="strong:H0430">God</w> created the earth.
$$$Genesis 1:4
<div sID="gen4" type="x-p"/>\u00b6 And God saw the <w>light</w>, that <transChange type="added">it was</transChange> \
good.<note placement="foot"><reference type="annotateRef">1.4 </reference>the light from: Heb. between</note>
"""


def test_sword_verses_strip_markup_notes_and_headings():
    assert list(text.sword_verses(IMP_SAMPLE).values()) == [
        "In the beginning God created the earth.",
        "And God saw the light, that it was good.",
    ]


def test_read_text_file_returns_non_blank_lines_and_accepts_a_bom(tmp_path):
    path = tmp_path / "mine.txt"
    path.write_bytes("\ufeffFirst  line\n\n  second line \n".encode("utf-8"))
    corpus = text.read_text_file(path)
    assert corpus.lines == ["First line", "second line"] and corpus.source == str(path)


@pytest.mark.parametrize("content, message", [
    (b"", "the file is empty"),
    (b" \n\n\t\n", "the file is empty"),
    (b"caf\xc3\xa9 ok\nna\xefve latin-1\n", r"line 2: byte 0xef is not UTF-8; the text is in an unknown encoding"),
    (b"\x7fELF\x00\x01", "binary file"),
])
def test_unreadable_text_files_raise_one_line_data_errors(tmp_path, content, message):
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    with pytest.raises(DataError, match=message) as raised:
        text.read_text_file(path)
    assert str(path) in str(raised.value) and "\n" not in str(raised.value)


def test_missing_file_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="no such text file"):
        text.read_text_file(tmp_path / "nope.txt")


def test_missing_mod2imp_names_the_apt_packages(tmp_path):
    with pytest.raises(DataError) as raised:
        text.kjv_bible(binary=str(tmp_path / "mod2imp"))
    message = str(raised.value)
    assert "apt-get install -y libsword-utils sword-text-kjv" in message and "\n" not in message


def test_missing_sword_module_names_the_apt_packages(tmp_path):
    fake = tmp_path / "mod2imp"
    fake.write_text("#!/bin/sh\necho \"$0: Couldn't find module: $1\"\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(DataError, match=r"SWORD module engKJV2006eb.*apt-get install -y libsword-utils sword-text-kjv"):
        text.kjv_bible(binary=str(fake))


def test_wordnet_glosses_skip_the_licence_header(tmp_path):
    for part in text.WORDNET_PARTS:
        (tmp_path / f"data.{part}").write_text(
            "  1 This software and database is being provided to you\n"
            f"00001740 03 n 01 entity 0 003 ~ 00001930 n 0000 | a {part} gloss; \"an example\"  \n")
    corpus = text.wordnet_glosses(tmp_path)
    assert corpus.lines == [f'a {part} gloss; "an example"' for part in text.WORDNET_PARTS]
    assert corpus.licence == "WordNet 3.0 licence"


def test_missing_wordnet_names_the_apt_package(tmp_path):
    with pytest.raises(DataError, match=r"run `apt-get install -y wordnet-base`"):
        text.wordnet_glosses(tmp_path)


def test_pydoc_topics_is_a_pip_free_english_text():
    corpus = text.pydoc_topics()
    assert len(corpus.lines) > 1000 and sum(len(text.word_tokens(line)) for line in corpus.lines) > 50_000


@pytest.mark.parametrize("line", [
    "Hello, World! It's 3.5 o'clock",
    "tabs\tand  spaces \u2014 and caf\u00e9 (dashes) -- \"quotes\"",
    "\u00bfQui\u00e9n cri\u00f3 los a\u00f1os? \u00a1Jehov\u00e1! snake_case x\u00b2 \u00c9xodo \u0394\u03b9\u03bf\u03c2",
    "",
])
def test_word_tokens_match_the_in_graph_tokeniser(line):
    in_graph = [token.decode() for token in text.tf_word_tokens(tf.constant([line])).to_list()[0]]
    assert in_graph == text.word_tokens(line)


def test_word_tokens_split_punctuation_and_lower_case():
    assert text.word_tokens("It's 3.5, OK!") == ["it's", "3", ".", "5", ",", "ok", "!"]
    assert text.word_tokens("\u00bfA\u00f1os?") == ["\u00bf", "a\u00f1os", "?"]  # letters of any script stay whole


def test_vocabulary_orders_by_count_and_counts_unknown_tokens():
    tokens = "b a b c b a d </s> </s>".split()
    vocab = text.build_vocabulary(tokens, max_size=4, reserved=[text.END_OF_SENTENCE])
    assert vocab.tokens == ["<unk>", "</s>", "b", "a"]
    assert vocab.counts == [2, 2, 3, 2]  # c and d are unknown
    assert vocab.encode(["a", "zzz", "</s>"]).tolist() == [3, 0, 1]
    assert text.build_vocabulary(tokens, min_count=2).tokens == ["<unk>", "b", "a", "</s>"]


def test_split_lines_interleaves_and_rejects_too_little_text():
    lines = [f"line {i}" for i in range(300)]
    parts = text.split_lines(lines, 0.02, 0.03)
    assert [len(parts[name]) for name in ("train", "val", "test")] == [285, 6, 9]
    # 15 held-out lines, one in the middle of every 20, the 6 validation ones spread evenly among them
    assert parts["test"][:2] == ["line 10", "line 50"] and parts["val"][0] == "line 30"
    assert sorted(parts["train"] + parts["val"] + parts["test"], key=lambda line: int(line[5:])) == lines
    with pytest.raises(DataError, match=r"^mine.txt: 2 lines are too few to split into training, validation and "
                                        r"test \(.*\); give at least 3 lines$"):
        text.split_lines(lines[:2], 0.02, 0.03, "mine.txt")


def test_installed_kjv_bible_reads_every_verse():
    corpus = installed_or_skip(text.kjv_bible, text.KJV_PACKAGES)
    assert len(corpus.lines) == 31_102  # verses of the KJV
    assert corpus.lines[0] == "In the beginning God created the heaven and the earth."


def test_installed_wordnet_glosses_are_a_large_vocabulary_corpus():
    corpus = installed_or_skip(text.wordnet_glosses, text.WORDNET_PACKAGES)
    tokens = [token for line in corpus.lines for token in text.word_tokens(line)]
    assert len(tokens) >= 1_000_000 and len(set(tokens)) >= 50_000


def test_first_lines_up_to_stops_once_the_budget_is_reached():
    assert text.first_lines_up_to(["abc", "de", "fgh"], 5) == ["abc", "de"]  # 4 + 3 >= 5 after two lines
    assert text.first_lines_up_to([["a", "b"], ["c"]], 1) == [["a", "b"]]


@pytest.mark.parametrize("line", ["Hello, World! It's 3.5", "caf\u00e9 \u2014 na\u00efve\n", ""])
@pytest.mark.parametrize("level", text.LEVELS)
def test_tokenizer_is_the_same_in_python_and_in_a_graph(level, line):
    tokenizer = text.Tokenizer(level)
    in_graph = [t.decode("utf-8") for t in tokenizer.tf_tokenize(tf.constant([line])).to_list()[0]]
    assert in_graph == tokenizer.tokenize(line)
    assert tokenizer.tf_join(tf.ragged.constant([in_graph], dtype=tf.string)).numpy()[0].decode() == \
        tokenizer.join(in_graph)


def test_tokenizer_worked_examples_and_bad_level():
    assert text.Tokenizer("char").tokenize("Ab c") == ["A", "b", " ", "c"]
    assert text.Tokenizer("word").tokenize("Ab c.") == ["ab", "c", "."]
    assert text.Tokenizer("word").join(["ab", "c", "."]) == "ab c ." and text.Tokenizer("char").join("ab") == "ab"
    with pytest.raises(ValueError, match="tokenizer level must be one of char, word"):
        text.Tokenizer("bpe")


def test_vocabulary_worked_example_encode_decode_and_state():
    vocabulary = text.build_vocabulary("abracadabra")
    assert vocabulary.tokens == ["<unk>", "a", "b", "r", "c", "d"] and vocabulary.counts == [0, 5, 2, 2, 1, 1]
    assert vocabulary.encode("cab?").tolist() == [4, 1, 2, 0] and vocabulary.id("r") == 3 and vocabulary.id("?") == 0
    assert vocabulary.decode([3, 1, 0]) == ["r", "a", "<unk>"]
    assert text.Vocabulary(**json.loads(json.dumps(vocabulary.state()))) == vocabulary
    with pytest.raises(ValueError, match="starts with '<unk>'"):
        text.Vocabulary(["a"], [1])
    with pytest.raises(ValueError, match="distinct and non-empty"):
        text.Vocabulary(["<unk>", "a", "a"], [0, 1, 1])


#: Tokens that a line-based vocabulary file must survive: line breaks, backslashes next to the
#: letters of the escapes, Unicode line separators, tabs and spaces.
AWKWARD = ["\n", "\r", "\\", "\\n", "\\b", "x\\b\ny", "\u2028", "\x0c", "\t", " ", "\u00e9", "\\\\r\r"]


def test_escape_round_trips_and_keeps_one_token_per_line():
    for token in AWKWARD:
        assert text.unescape(text.escape(token)) == token
        assert "\n" not in text.escape(token) and "\r" not in text.escape(token)
    assert text.escape("a\nb\\") == "a\\nb\\b"


def test_vocabulary_file_round_trip(tmp_path):
    vocabulary = text.Vocabulary(["<unk>", *AWKWARD], [0] * (len(AWKWARD) + 1))
    path = vocabulary.write(tmp_path / "vocab.txt")
    assert path.read_bytes().count(b"\n") == len(vocabulary)
    assert text.Vocabulary.read(path).tokens == vocabulary.tokens


def test_lookup_maps_tokens_and_ids_in_a_graph_like_encode_and_decode():
    vocabulary = text.Vocabulary(["<unk>", *AWKWARD], [0] * (len(AWKWARD) + 1))
    lookup = vocabulary.lookup()
    tokens = tf.ragged.constant([[*AWKWARD, "unseen"], ["\n"]])
    ids = lookup.ids(tokens)
    assert ids.dtype == tf.int32
    assert ids.to_list() == [vocabulary.encode([*AWKWARD, "unseen"]).tolist(), [1]]
    assert [[t.decode() for t in row] for row in lookup.tokens(ids).to_list()] == [[*AWKWARD, "<unk>"], ["\n"]]
    assert lookup.tokens(tf.constant([0, 99, -1])).numpy().tolist() == [b"<unk>"] * 3  # out of range: unknown
    assert lookup.ids(tf.constant([["\t", "zz"]])).numpy().tolist() == [[vocabulary.id("\t"), 0]]  # dense too


class Serving(tf.Module):
    def __init__(self, vocabulary: text.Vocabulary):
        super().__init__()
        self.tokenizer = text.Tokenizer("char")
        self.lookup = vocabulary.lookup(name="chars")

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def serve(self, text_in):
        ids = self.lookup.ids(self.tokenizer.tf_tokenize(text_in))
        return {"ids": ids.to_tensor(-1), "text": self.tokenizer.tf_join(self.lookup.tokens(ids))}


def test_vocabulary_ships_as_an_asset_and_works_after_the_export_moves(tmp_path):
    vocabulary = text.build_vocabulary("ab\nc\\d" * 3, reserved=["<quokka>"])
    module = Serving(vocabulary)
    tf.saved_model.save(module, str(tmp_path / "first"), signatures={"serving_default": module.serve})
    assert text.Vocabulary.read(tmp_path / "first" / "assets" / "chars.txt").tokens == vocabulary.tokens
    saved = (tmp_path / "first" / "saved_model.pb").read_bytes()
    assert b"<quokka>" not in saved  # the tokens live in the asset, not as graph constants
    del module  # the temporary vocabulary file goes; the export keeps its copy
    shutil.move(tmp_path / "first", tmp_path / "moved")
    answer = call_in_tensorflow_only_process(tmp_path / "moved", [
        ("serving_default", {"text_in": np.array(["a\nb", "dz\\"], dtype=object)})])
    assert answer["imported"] == []
    (outputs,) = answer["outputs"]
    assert outputs["ids"].tolist() == [vocabulary.encode("a\nb").tolist(), vocabulary.encode("dz\\").tolist()]
    assert decoded(outputs["text"]) == ["a\nb", "d<unk>\\"]


def _save_word_map(mapping: dict, folder) -> None:
    """Saves a module serving ``text.word_map_lookup(mapping)``; its objects go when this returns."""
    module, lookup = tf.Module(), text.word_map_lookup(mapping, "replacements")
    module.words = lookup  # tracked: the export saves its table and asset
    module.serve = tf.function(lambda words: {"mapped": lookup.lookup(words)},
                               input_signature=[tf.TensorSpec([None], tf.string)])
    tf.saved_model.save(module, str(folder), signatures={"serving_default": module.serve})


def test_word_map_ships_as_an_asset_and_maps_words_after_the_export_moves(tmp_path):
    _save_word_map({"casa": "house", "a\\b": "c\\d", "zorro": "fox"}, tmp_path / "first")
    assert (tmp_path / "first" / "assets" / "replacements.tsv").is_file()
    assert b"zorro" not in (tmp_path / "first" / "saved_model.pb").read_bytes()  # in the asset, not the graph
    shutil.move(tmp_path / "first", tmp_path / "moved")
    answer = call_in_tensorflow_only_process(tmp_path / "moved", [
        ("serving_default", {"words": np.array(["casa", "a\\b", "perro", ""], dtype=object)})])
    assert decoded(answer["outputs"][0]["mapped"]) == ["house", "c\\d", "", ""]
    with pytest.raises(ValueError, match="holds a tab"):
        text.word_map_lookup({"a\tb": "c"}, "bad")


def test_windows_worked_example():
    inputs, targets = text.windows(np.arange(10), 3)
    assert inputs.tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert targets.tolist() == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    inputs, targets = text.windows(np.arange(1, 9), 3, context=2, pad_id=0)  # 8 ids: (8 - 1) // 3 = 2 windows
    assert inputs.tolist() == [[0, 0, 1, 2, 3], [2, 3, 4, 5, 6]] and targets.tolist() == [[2, 3, 4], [5, 6, 7]]
    assert inputs.dtype == np.int32 and targets.dtype == np.int32


def test_windows_reject_a_stream_shorter_than_one_window():
    with pytest.raises(DataError, match=r"^mine.txt: the val split has 3 tokens, fewer than one window of "
                                        r"seq_len=3 \(it needs 4\)"):
        text.windows(np.arange(3), 3, what="mine.txt: the val split")


def test_joined_splits_and_head_worked_example():
    corpus = text.Corpus([f"l{i}" for i in range(100)], "mine.txt", "mine")
    parts = text.joined_splits(corpus.head(12), 0.01, 0.01)  # head: l0..l3 (3 chars each), 12 characters
    assert parts == {"train": "\nl0\nl2\n", "val": "\nl3\n", "test": "\nl1\n"}
    assert corpus.head(None) is corpus and corpus.head(12).source == "mine.txt"
