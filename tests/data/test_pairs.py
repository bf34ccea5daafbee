"""Tests of the sentence-pair readers, length limits and group splits (seqapps.data.pairs)."""
import pytest

from seqapps.data import pairs, text
from seqapps.errors import DataError
from tests.debian_data import installed_or_skip

# Markup as mod2imp prints it: Strong's tags with added words glued to them (RV1909), a footnote between
# two words (WEB), a book's end followed by its glossary, and a heading verse.
WEB_SAMPLE = """$$$Genesis 1:0
<chapter n="1" osisID="Gen.1" sID="Gen.1"/>
$$$Genesis 1:1
<w lemma="strong:H0430">In</w> <w lemma="strong:H7225">beginning</w>, <w lemma="strong:H0430">God</w>\
<note placement="foot"><reference type="annotateRef">1:1 </reference>The Hebrew word.</note>\
<w lemma="strong:H1254">created</w> the earth.
$$$Revelation of John 22:21
The grace be with all the saints. Amen. <chapter eID="Rev.22"/> <div eID="gen1" osisID="Rev" type="book"/> \
<div sID="gen2" type="glossary"/> <milestone n="Glossary"/> Abaddon Abaddon is Hebrew for destruction.
"""
RV_SAMPLE = """$$$Genesis 1:1
<w lemma="strong:H7225">EN el principio</w> <w lemma="strong:H1254">crió</w> <w lemma="strong:H0430">Dios</w>.
$$$Genesis 2:12
<w lemma="strong:H8033">hay allí</w><transChange type="added">también</transChange><w lemma="strong:H0916">\
bdelio</w> (<transChange type="added">es</transChange> bueno).
"""


def test_sword_verses_strip_strongs_tags_notes_and_back_matter():
    assert text.sword_verses(WEB_SAMPLE) == {
        "Genesis 1:1": "In beginning, God created the earth.",
        "Revelation of John 22:21": "The grace be with all the saints. Amen.",
    }
    assert text.sword_verses(RV_SAMPLE) == {"Genesis 1:1": "EN el principio crió Dios.",
                                             "Genesis 2:12": "hay allí también bdelio (es bueno)."}


def _pairs_file(tmp_path, content: bytes, name: str = "pairs.tsv"):
    path = tmp_path / name
    path.write_bytes(content)
    return path


def test_tsv_pairs_ignore_extra_columns_and_count_blank_lines(tmp_path):
    path = _pairs_file(tmp_path, "Go.\tVe.\tCC-BY 2.0 (France) #2877272\n\n  \nHi.\tHola.\n".encode())
    read = pairs.read_pairs_file(path)
    assert (read.sources, read.targets, read.keys) == (["Go.", "Hi."], ["Ve.", "Hola."], ["line 1", "line 4"])
    assert read.counts == {"blank_lines": 2} and read.origin == str(path)
    assert read.reversed().sources == ["Ve.", "Hola."]


def test_csv_pairs_skip_a_source_target_header_and_unquote_commas(tmp_path):
    path = _pairs_file(tmp_path, b'source,target\n"Yes, sir.","S\xc3\xad, se\xc3\xb1or."\n', "pairs.csv")
    read = pairs.read_pairs_file(path)
    assert (read.sources, read.targets, read.keys) == (["Yes, sir."], ["Sí, señor."], ["line 2"])


@pytest.mark.parametrize("content, message", [
    (b"Go.\tVe.\nHello.\n", "line 2: no target text; expected source<TAB>target"),
    (b"Go.\tVe.\nHello.\t  \n", "line 2: no target text"),
    (b"\tVe.\n", "line 1: no source text"),
    (b"Go.\tVe.\nna\xefve\tingenuo\n", "line 2: byte 0xef is not UTF-8"),
    (b"", "the file is empty"),
    (b"\n\n", "the file is empty"),
    (b"source\ttarget\n", "no sentence pairs"),
])
def test_bad_pair_files_raise_one_line_data_errors(tmp_path, content, message):
    path = _pairs_file(tmp_path, content)
    with pytest.raises(DataError, match=message) as raised:
        pairs.read_pairs_file(path)
    assert str(path) in str(raised.value) and "\n" not in str(raised.value)


def test_limit_length_rejects_truncates_or_refuses_long_pairs_and_counts_them():
    given = pairs.Pairs(["a b c d", "a b", "a"], ["x y", "x y z", "x y z w v"], ["1", "2", "3"], "mine", "the user's")
    rejected = pairs.limit_length(given, max_length=3)
    assert rejected.sources == ["a b"] and rejected.counts == {"too_long": 2, "bad_ratio": 0}
    truncated = pairs.limit_length(given, max_length=3, too_long="truncate")
    assert truncated.sources == ["a b c", "a b", "a"] and truncated.targets == ["x y", "x y z", "x y z"]
    assert truncated.counts["too_long"] == 2
    assert pairs.limit_length(given, 10, max_ratio=2.0).keys == ["1", "2"]  # 1 vs 5 tokens is a bad ratio
    with pytest.raises(DataError, match=r"mine: 1: a pair of 4 and 2 tokens is longer than max_length=3"):
        pairs.limit_length(given, max_length=3, too_long="error")
    with pytest.raises(DataError, match="no pair is left"):
        pairs.limit_length(given, max_length=0)


def test_split_pairs_keeps_whole_chapters_or_books_together():
    keys = [f"{book} {chapter}:{verse}" for book in ("Genesis", "I Kings", "John", "Song of Solomon", "Acts")
            for chapter in range(1, 21) for verse in range(1, 6)]
    verses = pairs.Pairs(keys, keys, keys, "sample", "public domain")
    for unit in ("chapter", "book"):
        splits = pairs.split_pairs(verses, 0.2, 0.2, unit=unit)
        groups = {name: {pairs.unit_of(key, unit) for key in part.keys} for name, part in splits.items()}
        assert sum(len(part) for part in splits.values()) == len(keys)
        assert not groups["train"] & groups["val"] and not groups["train"] & groups["test"]
        assert not groups["val"] & groups["test"]
        held_out = {"chapter": 20, "book": 1}[unit]  # 100 chapters or 5 books: 20% each
        assert len(groups["val"]) == len(groups["test"]) == held_out
    assert pairs.unit_of("Song of Solomon 3:4", "book") == "Song of Solomon"
    assert pairs.unit_of("Song of Solomon 3:4", "chapter") == "Song of Solomon 3"
    assert pairs.unit_of("line 7", "chapter") == "line 7"
    with pytest.raises(DataError, match=r"^sample \(split by book\): 1 books are too few .* give at least 3 books$"):
        pairs.split_pairs(verses.subset(range(5)), 0.2, 0.2, unit="book")  # one book cannot fill three splits


def test_number_pairs_are_distinct_seeded_num2words_phrases():
    numbers = pairs.number_pairs(50, max_number=100, seed=3)
    assert len(set(numbers.keys)) == 50 and numbers.keys == pairs.number_pairs(50, max_number=100, seed=3).keys
    every = pairs.number_pairs(100, max_number=100)
    phrase = dict(zip(every.keys, zip(every.sources, every.targets)))
    assert sorted(phrase, key=int) == [str(n) for n in range(100)]
    assert phrase["21"] == ("twenty-one", "veintiuno") and phrase["99"] == ("ninety-nine", "noventa y nueve")
    with pytest.raises(DataError, match="count=101 must be between 1 and max_number=100"):
        pairs.number_pairs(101, max_number=100)


def test_installed_bibles_join_on_the_verse_key():
    verses = installed_or_skip(pairs.bible_pairs, "libsword-utils sword-text-web sword-text-sparv")
    assert len(verses) == 31_077  # verses both the WEB and the RV1909 have
    first = verses.keys.index("Genesis 1:1")
    assert verses.sources[first] == "In the beginning, God created the heavens and the earth."
    assert verses.targets[first] == "EN el principio crió Dios los cielos y la tierra."
    assert not any("<" in line or "strong:" in line for line in verses.sources + verses.targets)
