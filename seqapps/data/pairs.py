"""Sentence pairs for translation: Bible verses, number phrases and the user's TSV/CSV files.

Sources (all offline, see ``/work/shared/DATA-SOURCES.md``):

- ``bible_pairs``: two SWORD Bible modules joined on the verse key, by default the
  World English Bible (apt ``sword-text-web``) and the Reina-Valera 1909 (apt
  ``sword-text-sparv``): about 31,000 English-Spanish pairs, public domain. Each pair
  keeps its verse key, so ``split_pairs`` can hold out whole chapters or books.
- ``number_pairs``: cardinal numbers written out by pip ``num2words`` (LGPL) in
  English and another language; no apt step, for tests.
- ``read_pairs_file``: Anki/Tatoeba-style ``source<TAB>target`` lines (``.tsv``,
  ``.txt``) or a CSV (``.csv``) of ``source,target`` rows. Extra columns are ignored;
  a first row ``source, target`` is a header. Blank lines are skipped and counted;
  a row without a source or target is a ``DataError`` naming the file and line.

``limit_length`` then applies the configured maximum length in word tokens:
longer pairs are dropped (``reject``), cut (``truncate``) or an error, and are counted.
"""
from __future__ import annotations

import collections
import csv
import dataclasses
import random
from pathlib import Path
from typing import Iterable

from seqapps.data import splits, text
from seqapps.errors import DataError

TOO_LONG = ("reject", "truncate", "error")
SPLIT_UNITS = ("chapter", "book", "pair")
_HEADER = ("source", "target")


@dataclasses.dataclass
class Pairs:
    """Aligned sentence pairs with where they came from.

    Attributes:
        sources, targets: the texts, ``sources[i]`` translated as ``targets[i]``.
        keys: one reference per pair: the verse key (``"Genesis 1:1"``), the number, or the file line.
        origin: a file name or package, for messages and reports.
        licence: the licence of the text.
        counts: what reading and filtering did (``blank_lines``, ``too_long``, ...).
    """

    sources: list[str]
    targets: list[str]
    keys: list[str]
    origin: str
    licence: str
    counts: dict[str, int] = dataclasses.field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.sources)

    def subset(self, indices: Iterable[int]) -> "Pairs":
        """The pairs at ``indices`` (in that order), with the same origin and counts."""
        indices = list(indices)
        return Pairs([self.sources[i] for i in indices], [self.targets[i] for i in indices],
                     [self.keys[i] for i in indices], self.origin, self.licence, dict(self.counts))

    def reversed(self) -> "Pairs":
        """The same pairs translated the other way (targets become sources)."""
        return dataclasses.replace(self, sources=self.targets, targets=self.sources)


def bible_pairs(source: text.SwordModule = text.WEB, target: text.SwordModule = text.RV1909,
                binary: str = "mod2imp") -> Pairs:
    """Verse pairs of two installed SWORD Bibles, joined on the verse key, in the source's order.

    Args:
        source, target: the modules (default: World English Bible to Reina-Valera 1909).
        binary: the ``mod2imp`` command.

    Returns:
        The pairs keyed ``"Book chapter:verse"``; verses that only one module has are counted in
        ``counts["unmatched"]``.

    Raises:
        DataError: a command or module is missing (naming the apt packages).
    """
    left, right = text.sword_bible(source, binary), text.sword_bible(target, binary)
    keys = [key for key in left if key in right]
    return Pairs([left[key] for key in keys], [right[key] for key in keys], keys,
                 f"SWORD modules {source.name} and {target.name} (apt {source.packages} {target.packages.split()[-1]})",
                 "public domain", {"unmatched": len(left) + len(right) - 2 * len(keys)})


def number_pairs(count: int, max_number: int = 10_000, target_lang: str = "es", seed: int = 0) -> Pairs:
    """Distinct random numbers written out in English and in ``target_lang`` by ``num2words``.

    Args:
        count: how many pairs (at most ``max_number``).
        max_number: numbers are drawn from ``0 .. max_number - 1``.
        target_lang: a ``num2words`` language code.
        seed: the sampling seed.

    Returns:
        Pairs such as ``("twenty-one", "veintiuno")``, keyed by the number.
    """
    from num2words import num2words

    if not 1 <= count <= max_number:
        raise DataError(f"number_pairs: count={count} must be between 1 and max_number={max_number}")
    numbers = random.Random(seed).sample(range(max_number), count)
    return Pairs([num2words(n, lang="en") for n in numbers], [num2words(n, lang=target_lang) for n in numbers],
                 [str(n) for n in numbers], f"num2words en-{target_lang}", "LGPL (num2words)")


def read_pairs_file(path: str | Path) -> Pairs:
    """Reads the user's sentence pairs: ``source<TAB>target`` lines, or CSV rows for a ``.csv`` file.

    Args:
        path: the file; columns after the second are ignored (Tatoeba's attribution, for example).

    Returns:
        The pairs keyed ``"line N"``; ``counts["blank_lines"]`` says how many blank lines were skipped.

    Raises:
        DataError: missing, empty, binary or not UTF-8 (naming the line and byte); a row without a
            source or target (naming the line); no pairs at all.
    """
    path = Path(path)
    content = text.read_utf8(path)
    csv_file = path.suffix.lower() == ".csv"
    rows = csv.reader(content.splitlines(), **({} if csv_file else {"delimiter": "\t", "quoting": csv.QUOTE_NONE}))
    expected = "source,target" if csv_file else "source<TAB>target"
    sources, targets, keys, blank, first = [], [], [], 0, True
    for row in rows:
        fields = [field.strip() for field in row[:2]]
        if not any(field.strip() for field in row):
            blank += 1
            continue
        if first and tuple(field.lower() for field in fields) == _HEADER:
            first = False
            continue
        first = False
        if len(fields) < 2 or not fields[1]:
            raise DataError(f"{path}: line {rows.line_num}: no target text; expected {expected}")
        if not fields[0]:
            raise DataError(f"{path}: line {rows.line_num}: no source text; expected {expected}")
        sources.append(fields[0])
        targets.append(fields[1])
        keys.append(f"line {rows.line_num}")
    if not sources:
        raise DataError(f"{path}: no sentence pairs; expected lines of {expected}")
    return Pairs(sources, targets, keys, str(path), "the user's", {"blank_lines": blank})


def limit_length(pairs: Pairs, max_length: int, too_long: str = "reject", max_ratio: float | None = None) -> Pairs:
    """Applies a maximum length in word tokens (``text.word_tokens``) to both sides of every pair.

    Args:
        pairs: the pairs.
        max_length: the most tokens a source or target may have.
        too_long: ``"reject"`` drops longer pairs, ``"truncate"`` keeps their first ``max_length``
            tokens (joined by spaces), ``"error"`` raises.
        max_ratio: also drop pairs whose token counts differ by more than this factor
            (misaligned verses; None: keep them).

    Returns:
        The kept pairs, with ``counts["too_long"]`` (rejected or truncated) and ``counts["bad_ratio"]``.

    Raises:
        DataError: ``too_long="error"`` and a pair is too long (naming its key), or nothing is left.
    """
    if too_long not in TOO_LONG:
        raise DataError(f"too_long={too_long!r}: expected one of {', '.join(TOO_LONG)}")
    sources, targets, keys, counts = [], [], [], collections.Counter(pairs.counts)
    counts.update({"too_long": 0, "bad_ratio": 0})
    for source, target, key in zip(pairs.sources, pairs.targets, pairs.keys):
        source_tokens, target_tokens = text.word_tokens(source), text.word_tokens(target)
        longest = max(len(source_tokens), len(target_tokens))
        shortest = max(1, min(len(source_tokens), len(target_tokens)))
        if max_ratio is not None and longest / shortest > max_ratio:
            counts["bad_ratio"] += 1
            continue
        if longest > max_length:
            counts["too_long"] += 1
            if too_long == "error":
                raise DataError(f"{pairs.origin}: {key}: a pair of {len(source_tokens)} and {len(target_tokens)} "
                                f"tokens is longer than max_length={max_length}; set too_long=reject or truncate")
            if too_long == "reject":
                continue
            source, target = " ".join(source_tokens[:max_length]), " ".join(target_tokens[:max_length])
        sources.append(source)
        targets.append(target)
        keys.append(key)
    if not sources:
        raise DataError(f"{pairs.origin}: no pair is left after the length limit max_length={max_length}")
    return Pairs(sources, targets, keys, pairs.origin, pairs.licence, dict(counts))


def unit_of(key: str, unit: str) -> str:
    """The group a pair belongs to for splitting: its book, its chapter, or the pair itself.

    Args:
        key: a verse key ``"Book chapter:verse"`` (other keys are their own group).
        unit: one of ``SPLIT_UNITS``.
    """
    book, _, place = key.rpartition(" ")
    if unit == "pair" or not book or ":" not in place:
        return key
    return book if unit == "book" else f"{book} {place.partition(':')[0]}"


def split_pairs(pairs: Pairs, val_fraction: float, test_fraction: float, unit: str = "chapter",
                seed: int = 0) -> dict[str, Pairs]:
    """Splits pairs into train/val/test by whole groups (chapters or books), so test verses are not
    near-duplicates of training verses next to them.

    The groups are split by the library's rule (``seqapps.data.splits.split_groups``, a permutation
    seeded by ``seed``): ``max(1, round(groups * fraction))`` groups each for validation and test.

    Args:
        pairs: the pairs.
        val_fraction, test_fraction: the shares of the groups held out.
        unit: ``"chapter"``, ``"book"`` or ``"pair"`` (see ``unit_of``).
        seed: changes which groups are held out.

    Returns:
        ``{"train", "val", "test"}`` pairs, each in the original order.

    Raises:
        DataError: an unknown unit, or too few groups to leave one for training.
    """
    if unit not in SPLIT_UNITS:
        raise DataError(f"split unit {unit!r}: expected one of {', '.join(SPLIT_UNITS)}")
    labels = splits.split_groups([unit_of(key, unit) for key in pairs.keys], val_fraction, test_fraction,
                                 f"{pairs.origin} (split by {unit})", f"{unit}s", seed=seed)
    return {name: pairs.subset(part) for name, part in splits.split_indices(labels).items()}
