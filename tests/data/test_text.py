"""Tests of the text corpora readers, tokenisation and vocabularies (seqapps.data.text)."""
import os
import stat

import pytest
import tensorflow as tf

from seqapps.data import text
from seqapps.errors import DataError

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
    assert parts["val"][:2] == ["line 0", "line 1"] and parts["test"][0] == "line 2"
    with pytest.raises(DataError, match="too little text: 2 lines leave the train and test split"):
        text.split_lines(lines[:2], 0.02, 0.03)


def _debian_corpus(reader, packages: str):
    """Reads an installed Debian corpus. CI (SEQAPPS_REQUIRE_DEBIAN_DATA=1) installs the packages
    and must read them; elsewhere a machine without them skips, since they are optional there."""
    try:
        return reader()
    except DataError:
        if os.environ.get("SEQAPPS_REQUIRE_DEBIAN_DATA") == "1":
            raise
        pytest.skip(f"Debian packages not installed: {packages}")


def test_installed_kjv_bible_reads_every_verse():
    corpus = _debian_corpus(text.kjv_bible, text.KJV_PACKAGES)
    assert len(corpus.lines) == 31_102  # verses of the KJV
    assert corpus.lines[0] == "In the beginning God created the heaven and the earth."


def test_installed_wordnet_glosses_are_a_large_vocabulary_corpus():
    corpus = _debian_corpus(text.wordnet_glosses, text.WORDNET_PACKAGES)
    tokens = [token for line in corpus.lines for token in text.word_tokens(line)]
    assert len(tokens) >= 1_000_000 and len(set(tokens)) >= 50_000


def test_first_lines_up_to_stops_once_the_budget_is_reached():
    assert text.first_lines_up_to(["abc", "de", "fgh"], 5) == ["abc", "de"]  # 4 + 3 >= 5 after two lines
    assert text.first_lines_up_to([["a", "b"], ["c"]], 1) == [["a", "b"]]
