"""English text corpora, word and character tokenisation, and vocabularies with counts.

Corpora (all offline, see ``/work/shared/DATA-SOURCES.md``):

- ``kjv_bible``: the King James Bible from the SWORD module ``engKJV2006eb``
  (apt ``libsword-utils`` + ``sword-text-kjv``; public domain), read with the
  ``mod2imp`` command, markup and footnotes stripped: one verse per line.
  ``sword_bible`` reads any installed SWORD Bible module the same way, by verse
  key (the translation pipeline joins the World English Bible and the
  Reina-Valera 1909 on it).
- ``wordnet_glosses``: the glosses of WordNet 3.0 (apt ``wordnet-base``; WordNet
  3.0 licence), one gloss per line: 1.45M words, 59k distinct.
- ``pydoc_topics``: the help topics shipped with Python (``pydoc_data``; PSF
  licence), a pip-free fallback of about 70k words.
- ``read_text_file``: any UTF-8 text file of the user's.

Word tokenisation is lower-case words and single punctuation marks; the same
rule runs in a TensorFlow graph (``tf_word_tokens``) so that exports need no
Python. Every failure is a ``DataError`` of one line.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import re
import shutil
import subprocess
import tempfile
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence, Sized

import numpy as np

from seqapps.data import splits
from seqapps.errors import DataError

if TYPE_CHECKING:
    import tensorflow as tf

KJV_MODULE = "engKJV2006eb"
KJV_PACKAGES = "libsword-utils sword-text-kjv"
WORDNET_DIR = "/usr/share/wordnet"
WORDNET_PACKAGES = "wordnet-base"
WORDNET_PARTS = ("noun", "verb", "adj", "adv")

#: Punctuation (anything but letters, digits, whitespace and the ASCII apostrophe, in any script) is split off;
#: the same classes in Python's ``re`` (where ``\w`` is letters, digits and ``_``) and in TensorFlow's RE2.
PUNCTUATION = r"(_|[^\w'\t\n\r ])"
TF_PUNCTUATION = r"([^\p{L}\p{N}'\t\n\r ])"
UNKNOWN = "<unk>"
LEVELS = ("char", "word")
END_OF_SENTENCE = "</s>"

_VERSE_KEY = re.compile(r"^\$\$\$(.*) (\d+):(\d+)$")
#: Tags that separate words: footnotes and the added words of ``transChange`` (``...</w><transChange>y``).
_WORD_BREAK = re.compile(r"<note\b.*?</note>|</?transChange\b[^>]*>", re.DOTALL)
#: Front and back matter that follows a book's last verse (the WEB's glossary): cut off.
_MATTER = re.compile(r"<div\b[^>]*\btype=\"(?:front|introduction|glossary)\".*", re.DOTALL)
_TAG = re.compile(r"<[^>]*>")
#: Spaces the word breaks leave inside brackets and before marks: ``( is it``, ``life )``, ``God ,``.
_SPACE_INSIDE = re.compile(r"(?<=[(\[¿¡]) +| +(?=[.,;:!?)\]])")
_SPACES = re.compile(r"\s+")


@dataclasses.dataclass
class Corpus:
    """Lines of text with where they came from.

    Attributes:
        lines: non-empty lines (verses, glosses, paragraphs) without newlines.
        source: a file name or package, for messages and reports.
        licence: the licence of the text.
    """

    lines: list[str]
    source: str
    licence: str

    @property
    def num_chars(self) -> int:
        """Characters in all lines, counting one newline per line."""
        return sum(len(line) + 1 for line in self.lines)

    def head(self, max_chars: int | None) -> "Corpus":
        """The first lines up to ``max_chars`` characters (``first_lines_up_to``; None: all of them)."""
        return self if max_chars is None else Corpus(first_lines_up_to(self.lines, max_chars), self.source,
                                                     self.licence)


def _apt_error(what: str, packages: str) -> DataError:
    return DataError(f"{what} needs the Debian package(s) {packages}: run `apt-get install -y {packages}`, "
                     "or pass --data your.txt")


def _nonempty(lines: Iterable[str], source: str, licence: str) -> Corpus:
    kept = [line for line in (_SPACES.sub(" ", raw).strip() for raw in lines) if line]
    if not kept:
        raise DataError(f"{source}: the corpus is empty (no text after removing blank lines and markup)")
    return Corpus(kept, source, licence)


def read_utf8(path: str | Path) -> str:
    """Reads a user's UTF-8 text file (a BOM is allowed).

    Args:
        path: the file.

    Returns:
        The decoded text.

    Raises:
        DataError: missing, empty, binary or not UTF-8 (naming the line and byte).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such text file")
    raw = path.read_bytes()
    if not raw.strip():
        raise DataError(f"{path}: the file is empty")
    if b"\x00" in raw[:8192]:
        raise DataError(f"{path}: binary file (NUL bytes), expected UTF-8 text")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise DataError(f"{path}: line {line}: byte 0x{raw[error.start]:02x} is not UTF-8; the text is in an "
                        "unknown encoding, convert it first (e.g. `iconv -f latin1 -t utf-8`)") from None


def read_text_file(path: str | Path) -> Corpus:
    """Reads a user's UTF-8 text file (a BOM is allowed) as non-blank lines.

    Args:
        path: the file.

    Returns:
        The file's lines.

    Raises:
        DataError: as ``read_utf8``.
    """
    return _nonempty(read_utf8(path).splitlines(), str(path), "the user's")


@dataclasses.dataclass(frozen=True)
class SwordModule:
    """A SWORD Bible module and the Debian packages that install it.

    Attributes:
        name: the module name given to ``mod2imp``.
        packages: the apt packages, ``libsword-utils`` included.
        title: a readable name for reports.
    """

    name: str
    packages: str
    title: str


KJV = SwordModule(KJV_MODULE, KJV_PACKAGES, "King James Bible")
WEB = SwordModule("engWEB2015eb", "libsword-utils sword-text-web", "World English Bible")
RV1909 = SwordModule("spaRV1909eb", "libsword-utils sword-text-sparv", "Reina-Valera 1909")


def sword_verses(imp_text: str) -> dict[str, str]:
    """Extracts verse texts from ``mod2imp`` output: markup, Strong's tags, footnotes, headings and back matter removed.

    Args:
        imp_text: the SWORD import format (``$$$Book c:v`` lines, each followed by its OSIS text).

    Returns:
        ``{"Genesis 1:1": "In the beginning ...", ...}`` in module order, spaces collapsed; chapter and
        book headings (keyed ``c:0`` or ``0:0``) and verses left empty by the markup are dropped.
    """
    verses, key = {}, None
    for line in imp_text.splitlines():
        if line.startswith("$$$"):
            match = _VERSE_KEY.match(line)
            key = line[3:] if match and int(match.group(2)) > 0 and int(match.group(3)) > 0 else None
            continue
        if key is not None:
            plain = _TAG.sub("", _WORD_BREAK.sub(" ", _MATTER.sub("", line))).replace("\u00b6", " ")
            verse = _SPACE_INSIDE.sub("", _SPACES.sub(" ", plain)).strip()
            if verse:
                verses[key] = verse
    return verses


def sword_bible(module: SwordModule, binary: str = "mod2imp") -> dict[str, str]:
    """Reads an installed SWORD Bible module, one verse per key.

    Args:
        module: the module, e.g. ``KJV``, ``WEB`` or ``RV1909``.
        binary: the ``mod2imp`` command (from ``libsword-utils``).

    Returns:
        ``sword_verses`` of the module's text.

    Raises:
        DataError: the command or the module is not installed (naming the apt packages).
    """
    what = f"the {module.title} (SWORD module {module.name})"
    if shutil.which(binary) is None:
        raise _apt_error(what, module.packages)
    completed = subprocess.run([binary, module.name], capture_output=True, check=False)
    text = completed.stdout.decode("utf-8", errors="replace")
    if completed.returncode != 0 or "$$$" not in text:
        raise _apt_error(what, module.packages)
    return sword_verses(text)


def kjv_bible(binary: str = "mod2imp", module: str = KJV_MODULE) -> Corpus:
    """The King James Bible (public domain), one verse per line, from the SWORD module.

    Args:
        binary: the ``mod2imp`` command (from ``libsword-utils``).
        module: the SWORD module name (from ``sword-text-kjv``).

    Returns:
        31,102 verses, about 4.3M characters.

    Raises:
        DataError: the command or the module is not installed (naming the apt packages).
    """
    verses = sword_bible(dataclasses.replace(KJV, name=module), binary)
    return _nonempty(verses.values(), f"SWORD module {module} (apt sword-text-kjv)", "public domain")


def wordnet_glosses(root: str | Path = WORDNET_DIR) -> Corpus:
    """The glosses (definitions and examples) of WordNet 3.0, one per line.

    Args:
        root: the folder holding ``data.noun`` and the other data files.

    Returns:
        117,659 glosses, about 1.45M words (WordNet 3.0 licence, Princeton University).

    Raises:
        DataError: the files are missing (naming the apt package).
    """
    root = Path(root)
    files = [root / f"data.{part}" for part in WORDNET_PARTS]
    if not all(path.is_file() for path in files):
        raise _apt_error("the WordNet glosses", WORDNET_PACKAGES)
    glosses = []
    for path in files:
        with path.open(encoding="utf-8", errors="replace") as lines:
            glosses.extend(line.partition(" | ")[2] for line in lines if not line.startswith("  "))
    return _nonempty(glosses, f"{root}/data.* (apt wordnet-base)", "WordNet 3.0 licence")


def pydoc_topics() -> Corpus:
    """Python's help topics (PSF licence), one paragraph per line: a pip-free English text of ~70k words."""
    from pydoc_data.topics import topics

    paragraphs = [p for name in sorted(topics) for p in re.split(r"\n\s*\n", topics[name])]
    return _nonempty(paragraphs, "pydoc_data.topics", "PSF licence")


def word_tokens(line: str) -> list[str]:
    """Lower-case words and single punctuation marks; ``tf_word_tokens`` is the same in a graph."""
    return re.sub(PUNCTUATION, r" \1 ", line.lower()).split()


def tf_word_tokens(text: "tf.Tensor") -> "tf.RaggedTensor":
    """``word_tokens`` of a ``[batch]`` string tensor, as a ragged ``[batch, None]`` tensor."""
    import tensorflow as tf

    lowered = tf.strings.lower(text, encoding="utf-8")
    return tf.strings.split(tf.strings.regex_replace(lowered, TF_PUNCTUATION, r" \1 "))


@dataclasses.dataclass(frozen=True)
class Tokenizer:
    """Splits text into tokens the same way in Python (training data) and in a graph (serving).

    Levels:

    - ``"char"``: every Unicode character is a token (case and spaces kept);
    - ``"word"``: lower-case words and single punctuation marks (``word_tokens``).

    Attributes:
        level: ``"char"`` or ``"word"``.

    Example:
        >>> Tokenizer("word").tokenize("It's 3.5, OK!")
        ["it's", '3', '.', '5', ',', 'ok', '!']
        >>> Tokenizer("char").join(["a", "b"])
        'ab'
    """

    level: str = "char"

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"tokenizer level must be one of {', '.join(LEVELS)}, got {self.level!r}")

    @property
    def separator(self) -> str:
        """What ``join`` puts between tokens: nothing for characters, a space for words."""
        return "" if self.level == "char" else " "

    def tokenize(self, line: str) -> list[str]:
        """The tokens of one string."""
        return list(line) if self.level == "char" else word_tokens(line)

    def join(self, tokens: Iterable[str]) -> str:
        """Tokens back into text (words are joined with single spaces)."""
        return self.separator.join(tokens)

    def tf_tokenize(self, text: "tf.Tensor") -> "tf.RaggedTensor":
        """``tokenize`` of a ``[batch]`` string tensor, as a ragged ``[batch, None]`` string tensor.

        Invalid UTF-8 bytes become U+FFFD at the character level.
        """
        import tensorflow as tf

        if self.level == "char":
            return tf.strings.unicode_split(text, "UTF-8", errors="replace")
        return tf_word_tokens(text)

    def tf_join(self, tokens: "tf.Tensor | tf.RaggedTensor") -> "tf.Tensor":
        """``join`` over the last axis of a (ragged) string tensor."""
        import tensorflow as tf

        return tf.strings.reduce_join(tokens, axis=-1, separator=self.separator)


def split_lines(lines: list[str], val_fraction: float, test_fraction: float,
                source: str = "the text") -> dict[str, list[str]]:
    """Splits lines into train/val/test, the held-out lines spread evenly through the text
    (``seqapps.data.splits``, ``interleave``), so every part of the text is in each split.

    Args:
        lines: the corpus lines in order.
        val_fraction, test_fraction: shares of the lines (``max(1, round(n * share))`` lines each).
        source: the text's file or name, for the error.

    Returns:
        ``{"train", "val", "test"}`` lists of lines, each in corpus order.

    Raises:
        DataError: too few lines to leave one for training.
    """
    labels = splits.assign_splits(len(lines), val_fraction, test_fraction, source, "lines")
    return {name: [lines[i] for i in indices] for name, indices in splits.split_indices(labels).items()}


def joined_splits(corpus: Corpus, val_fraction: float, test_fraction: float,
                  separator: str = "\n") -> dict[str, str]:
    """A corpus as one text per split, for character models.

    Args:
        corpus: the lines.
        val_fraction, test_fraction: as ``split_lines``.
        separator: joins the lines of a split, and starts and ends it.

    Returns:
        ``{"train", "val", "test"}`` texts, e.g. ``"\nline 1\nline 3\n"``.
    """
    return {name: separator + separator.join(part) + separator
            for name, part in split_lines(corpus.lines, val_fraction, test_fraction, corpus.source).items()}


@dataclasses.dataclass
class Vocabulary:
    """Tokens by id, with training counts; id 0 is the unknown token.

    The one vocabulary type of the text pipelines, at the character or the word
    level. Python code maps tokens with ``encode``/``decode``; a serving graph
    maps them with ``lookup``, whose tables read the vocabulary from an asset file
    of the SavedModel (one token per line, see ``write``).

    Attributes:
        tokens: ``tokens[i]`` is the string of id ``i``; ``tokens[0]`` is ``UNKNOWN``.
        counts: ``counts[i]`` is how often id ``i`` occurs in the training tokens
            (for id 0: the tokens outside the vocabulary).

    Example:
        >>> vocabulary = build_vocabulary("abracadabra")
        >>> vocabulary.tokens, vocabulary.encode("cab?").tolist()
        (['<unk>', 'a', 'b', 'r', 'c', 'd'], [4, 1, 2, 0])
    """

    tokens: list[str]
    counts: list[int]

    def __post_init__(self) -> None:
        if not self.tokens or self.tokens[0] != UNKNOWN:
            raise ValueError(f"a vocabulary starts with {UNKNOWN!r} (id 0), got {self.tokens[:1]!r}")
        if len(set(self.tokens)) != len(self.tokens) or "" in self.tokens:
            raise ValueError("vocabulary tokens must be distinct and non-empty")
        if len(self.counts) != len(self.tokens):
            raise ValueError(f"{len(self.tokens)} tokens but {len(self.counts)} counts")
        self._index = {token: i for i, token in enumerate(self.tokens)}

    def __len__(self) -> int:
        return len(self.tokens)

    def id(self, token: str) -> int:
        """The id of one token (0 if unknown)."""
        return self._index.get(token, 0)

    def encode(self, tokens: Iterable[str]) -> np.ndarray:
        """Maps tokens to int32 ids; unknown tokens map to 0."""
        return np.fromiter((self._index.get(token, 0) for token in tokens), dtype="int32")

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Maps ids back to tokens."""
        return [self.tokens[i] for i in ids]

    @classmethod
    def counted(cls, tokens: Sequence[str], counter: Mapping[str, int]) -> "Vocabulary":
        """A vocabulary of ``tokens`` (``UNKNOWN`` first) with their training counts.

        Args:
            tokens: the tokens by id.
            counter: how often each training token occurs (a ``collections.Counter``).

        Returns:
            The vocabulary; id 0 counts the training tokens outside ``tokens``.
        """
        counts = [counter.get(token, 0) for token in tokens[1:]]
        return cls(list(tokens), [sum(counter.values()) - sum(counts), *counts])

    def state(self) -> dict[str, list]:
        """The JSON-able form saved in a pipeline's state; ``Vocabulary(**state)`` rebuilds it."""
        return {"tokens": list(self.tokens), "counts": [int(c) for c in self.counts]}

    def write(self, path: str | Path) -> Path:
        """Writes one token per line, UTF-8, in id order, escaped (``escape``) so that every token,
        a line break included, stays on its own line."""
        path = Path(path)
        path.write_bytes(b"".join(escape(token).encode("utf-8") + b"\n" for token in self.tokens))
        return path

    @classmethod
    def read(cls, path: str | Path) -> "Vocabulary":
        """Reads a file written by ``write`` (counts are unknown: zeros)."""
        lines = Path(path).read_bytes().decode("utf-8").split("\n")[:-1]
        return cls([unescape(line) for line in lines], [0] * len(lines))

    def lookup(self, directory: str | Path | None = None, name: str = "vocabulary") -> "tf.Module":
        """Writes the vocabulary file and returns the in-graph lookup that reads it.

        Args:
            directory: where to write ``<name>.txt`` (None: a fresh temporary folder, removed
                when the lookup is garbage-collected). Saving a SavedModel copies the file
                into its ``assets/`` folder.
            name: the file's stem; give each vocabulary of one export its own name.

        Returns:
            A ``VocabularyLookup`` to track with the exported model.
        """
        folder = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="seqapps-vocabulary-"))
        lookup = _vocabulary_lookup_class()(str(self.write(folder / f"{name}.txt")), len(self))
        if directory is None:
            weakref.finalize(lookup, shutil.rmtree, str(folder), True)
        return lookup


_ESCAPES = (("\\", "\\b"), ("\n", "\\n"), ("\r", "\\r"))


def escape(token: str) -> str:
    """A token as one line of a vocabulary file: backslash, line feed and carriage return
    become ``\\b``, ``\\n`` and ``\\r`` (``unescape`` reverses it; the same rule runs in a graph)."""
    for raw, escaped in _ESCAPES:
        token = token.replace(raw, escaped)
    return token


def unescape(line: str) -> str:
    """Reverses ``escape``: every backslash of an escaped line starts a two-character unit."""
    for raw, escaped in reversed(_ESCAPES):
        line = line.replace(escaped, raw)
    return line


def _tf_escape(tokens: "tf.Tensor") -> "tf.Tensor":
    """``escape`` in the graph."""
    import tensorflow as tf

    return tf.strings.regex_replace(tf.strings.regex_replace(tf.strings.regex_replace(
        tokens, r"\\", r"\\b"), "\n", r"\\n"), "\r", r"\\r")


def _tf_unescape(lines: "tf.Tensor") -> "tf.Tensor":
    """``unescape`` in the graph."""
    import tensorflow as tf

    return tf.strings.regex_replace(tf.strings.regex_replace(tf.strings.regex_replace(
        lines, r"\\r", "\r"), r"\\n", "\n"), r"\\b", r"\\")


@functools.cache
def _vocabulary_lookup_class() -> type:
    import tensorflow as tf

    class VocabularyLookup(tf.Module):
        """Token <-> id tables that read a vocabulary file shipped as a SavedModel asset.

        Both tables are ``tf.lookup.StaticHashTable``s with a ``TextFileInitializer`` over a
        ``tf.saved_model.Asset`` (as OpenNMT-tf does), so the vocabulary is a file in the
        export's ``assets/`` folder, not a graph constant, and the export keeps working after
        its folder is moved. Track the object with the model (an attribute of it or of the
        exported ``tf.Module``) and call its methods in the serving function.

        Args:
            path: a file written by ``Vocabulary.write``.
            size: its number of tokens (checked when the tables are initialised).
        """

        def __init__(self, path: str, size: int) -> None:
            super().__init__(name="vocabulary_lookup")
            self.asset = tf.saved_model.Asset(path)
            self.size = int(size)
            whole_line, line_number = tf.lookup.TextFileIndex.WHOLE_LINE, tf.lookup.TextFileIndex.LINE_NUMBER
            self.token_to_id = tf.lookup.StaticHashTable(tf.lookup.TextFileInitializer(
                self.asset, tf.string, whole_line, tf.int64, line_number, vocab_size=self.size), default_value=0)
            self.id_to_token = tf.lookup.StaticHashTable(tf.lookup.TextFileInitializer(
                self.asset, tf.int64, line_number, tf.string, whole_line, vocab_size=self.size),
                default_value=UNKNOWN)

        def ids(self, tokens: "tf.Tensor | tf.RaggedTensor") -> "tf.Tensor | tf.RaggedTensor":
            """int32 ids of a (ragged) string tensor of tokens; unknown tokens map to 0."""
            return tf.ragged.map_flat_values(
                lambda flat: tf.cast(self.token_to_id.lookup(_tf_escape(flat)), tf.int32), tokens)

        def tokens(self, ids: "tf.Tensor | tf.RaggedTensor") -> "tf.Tensor | tf.RaggedTensor":
            """Tokens of a (ragged) integer tensor of ids; ids outside the vocabulary give ``UNKNOWN``."""
            return tf.ragged.map_flat_values(
                lambda flat: _tf_unescape(self.id_to_token.lookup(tf.cast(flat, tf.int64))), ids)

    return VocabularyLookup


def word_map_lookup(mapping: Mapping[str, str], name: str) -> "tf.Module":
    """An in-graph word -> word table read from a two-column asset file (a lexicon's best translations).

    The file (``<name>.tsv``: key, tab, value, both ``escape``d) is written to a fresh temporary folder,
    removed when the lookup is garbage-collected; a SavedModel that tracks the lookup copies it into
    ``assets/``. Words have no tabs: they come from a whitespace tokenizer.

    Args:
        mapping: word -> word; a word outside it maps to ``""``.
        name: the file's stem.

    Returns:
        A ``tf.Module`` whose ``lookup(words)`` maps a string tensor of words.

    Raises:
        ValueError: a key or value holds a tab.
    """
    import tensorflow as tf

    if any("\t" in word for pair in mapping.items() for word in pair):
        raise ValueError(f"{name}: a word holds a tab")
    folder = Path(tempfile.mkdtemp(prefix="seqapps-word-map-"))
    path = folder / f"{name}.tsv"
    lines = [f"{escape(key)}\t{escape(value)}\n" for key, value in {"": "", **mapping}.items()]
    path.write_bytes("".join(lines).encode("utf-8"))

    class WordMapLookup(tf.Module):
        def __init__(self) -> None:
            super().__init__(name=f"{name}_lookup")
            self.asset = tf.saved_model.Asset(str(path))
            self.table = tf.lookup.StaticHashTable(tf.lookup.TextFileInitializer(
                self.asset, tf.string, 0, tf.string, 1, delimiter="\t", vocab_size=len(lines)), default_value="")

        def lookup(self, words: tf.Tensor) -> tf.Tensor:
            """The value of each word of ``words`` (``""`` for a word outside the map)."""
            return _tf_unescape(self.table.lookup(_tf_escape(words)))

    found = WordMapLookup()
    weakref.finalize(found, shutil.rmtree, str(folder), True)
    return found


def __getattr__(name: str) -> Any:
    """``VocabularyLookup`` is built on first use, so that importing this module does not import TensorFlow."""
    if name == "VocabularyLookup":
        return _vocabulary_lookup_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_vocabulary(tokens: Iterable[str], max_size: int | None = None, min_count: int = 1,
                     reserved: Iterable[str] = ()) -> Vocabulary:
    """Builds a vocabulary of the most frequent tokens (ties broken by first occurrence).

    Args:
        tokens: the training tokens.
        max_size: the most ids, the unknown token included (None: no limit).
        min_count: tokens seen fewer times map to the unknown token.
        reserved: tokens that always get ids right after ``UNKNOWN`` (e.g. ``END_OF_SENTENCE``).

    Returns:
        The vocabulary, ordered by decreasing count after the reserved tokens.
    """
    counter = collections.Counter(tokens)
    reserved = [token for token in reserved if token != UNKNOWN]
    kept = [(token, count) for token, count in counter.most_common()
            if count >= min_count and token not in reserved and token != UNKNOWN]
    if max_size is not None:
        kept = kept[: max(0, max_size - 1 - len(reserved))]
    return Vocabulary.counted([UNKNOWN, *reserved, *(token for token, _ in kept)], counter)


def first_lines_up_to(lines: Sequence[Sized], budget: int) -> list:
    """The first lines whose sizes (plus one separator each) reach ``budget``.

    Args:
        lines: strings (sized in characters) or token lists (sized in tokens).
        budget: how many characters or tokens to keep, at least.

    Returns:
        The leading lines, stopping at the first line that starts past ``budget``.
    """
    kept, total = [], 0
    for line in lines:
        if total >= budget:
            break
        kept.append(line)
        total += len(line) + 1
    return kept


def windows(ids: np.ndarray, seq_len: int, context: int = 0, pad_id: int = 0,
            what: str = "the text") -> tuple[np.ndarray, np.ndarray]:
    """Cuts one token stream into non-overlapping next-token windows.

    Window ``j`` predicts ``ids[j*seq_len + 1 : (j+1)*seq_len + 1]`` from the ``seq_len``
    tokens one step earlier, preceded by the ``context`` tokens before them (for an
    n-gram model's first targets); ``context`` copies of ``pad_id`` stand before the
    stream's start. The tail that does not fill a window is dropped.

    Args:
        ids: int token ids ``[N]`` of one split.
        seq_len: targets per window (>= 1).
        context: extra input tokens before each window (>= 0).
        pad_id: the id before the stream's start.
        what: names the stream in the error (e.g. ``"corpus.txt: the val split"``).

    Returns:
        ``(inputs, targets)``: int32 ``[windows, context + seq_len]`` and ``[windows, seq_len]``.

    Raises:
        DataError: the stream is shorter than one window (``seq_len + 1`` tokens).
    """
    ids = np.asarray(ids, dtype="int32")
    count = (len(ids) - 1) // seq_len
    if count <= 0:
        raise DataError(f"{what} has {len(ids)} tokens, fewer than one window of seq_len={seq_len} "
                        f"(it needs {seq_len + 1}); give more text or lower seq_len")
    padded = np.concatenate([np.full(context, pad_id, "int32"), ids])
    starts = np.arange(count)[:, None] * seq_len
    inputs = padded[starts + np.arange(context + seq_len)[None, :]]
    targets = ids[starts + 1 + np.arange(seq_len)[None, :]]
    return inputs, targets
