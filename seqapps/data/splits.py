"""The one train/validation/test split rule of the pipelines that split data they read.

Of ``n`` items (lines, images, clips, utterances, or groups of them: pieces, chapters, books),
``max(1, round(n * val_fraction))`` go to validation and ``max(1, round(n * test_fraction))`` to test,
at every size, and at least one is left for training; a data set too small for that is refused
with one ``DataError`` line naming the source, the count and how many items are needed.

Which items go where is deterministic, in one of two ways:

- ``interleave`` (text): the held-out items are spread evenly through the data in its own order
  (about every ``1 / (val_fraction + test_fraction)``-th item, alternating validation and test), so
  every part of a text is in each split;
- ``shuffle`` (media and sentence pairs, whose file order says nothing): a seeded permutation deals
  the first ``n_test`` items to test and the next ``n_val`` to validation, so a folder sorted by
  speaker, tag or topic is not split by that order.

``split_groups`` applies the rule to groups (a piece's clips, a chapter's verses), so that the
items of one group share a split.
"""
from __future__ import annotations

import math
from typing import Hashable, Mapping, Sequence

import numpy as np

from seqapps.errors import DataError

SPLITS = ("train", "val", "test")
SPREADS = ("interleave", "shuffle")


def split_sizes(count: int, val_fraction: float, test_fraction: float, source: str, unit: str) -> dict[str, int]:
    """The number of items in each split.

    Args:
        count: the items (or groups) to split.
        val_fraction, test_fraction: the requested shares, each > 0, summing below 1.
        source: what the items come from (a file or folder), named in the error.
        unit: what an item is, plural ("images", "lines", "chapters").

    Returns:
        ``{"train", "val", "test"}`` counts summing to ``count``.

    Raises:
        DataError: fewer than one training item would be left.
    """
    sizes = _sizes(count, val_fraction, test_fraction)
    if sizes["train"] < 1:
        raise DataError(f"{source}: {count} {unit} are too few to split into training, validation and test "
                        f"(val_fraction={val_fraction:g} and test_fraction={test_fraction:g} hold out "
                        f"{sizes['val']} and {sizes['test']}); give at least "
                        f"{_fewest(count, val_fraction, test_fraction)} {unit}")
    return sizes


def _sizes(count: int, val_fraction: float, test_fraction: float) -> dict[str, int]:
    n_val, n_test = max(1, round(count * val_fraction)), max(1, round(count * test_fraction))
    return {"train": count - n_val - n_test, "val": n_val, "test": n_test}


def _fewest(count: int, val_fraction: float, test_fraction: float) -> int:
    """The smallest size above ``count`` from which on every size leaves a training item."""
    # from `sure` on, n_train >= n * (1 - val - test) - 2 >= 1
    sure = math.ceil(3 / (1 - val_fraction - test_fraction))
    fewest = sure
    for size in range(sure - 1, count, -1):
        if _sizes(size, val_fraction, test_fraction)["train"] < 1:
            break
        fewest = size
    return fewest


def assign_splits(count: int, val_fraction: float, test_fraction: float, source: str, unit: str,
                  spread: str = "interleave", seed: int = 0) -> list[str]:
    """The split of each of ``count`` items (see the module docstring for the rule).

    Args:
        count: the items, in their order.
        val_fraction, test_fraction: the requested shares, each > 0, summing below 1.
        source, unit: name the data in an error (see ``split_sizes``).
        spread: ``"interleave"`` (evenly through the order) or ``"shuffle"`` (a seeded permutation).
        seed: the permutation's seed (``shuffle`` only).

    Returns:
        ``"train"``, ``"val"`` or ``"test"`` for each item.

    Raises:
        DataError: the data are too few to split.
        ValueError: an unknown ``spread``.
    """
    sizes = split_sizes(count, val_fraction, test_fraction, source, unit)
    labels = ["train"] * count
    if spread == "interleave":
        held_out = sizes["val"] + sizes["test"]
        val_ranks = set(_evenly(held_out, sizes["val"]))
        for rank, position in enumerate(_evenly(count, held_out)):
            labels[position] = "val" if rank in val_ranks else "test"
    elif spread == "shuffle":
        order = np.random.default_rng(seed).permutation(count)
        for position in order[: sizes["test"]]:
            labels[position] = "test"
        for position in order[sizes["test"]: sizes["test"] + sizes["val"]]:
            labels[position] = "val"
    else:
        raise ValueError(f"spread {spread!r}: expected one of {', '.join(SPREADS)}")
    return labels


def _evenly(count: int, chosen: int) -> list[int]:
    """``chosen`` distinct positions of ``range(count)`` spread evenly: the middle of each of ``chosen`` equal parts."""
    return [(2 * part + 1) * count // (2 * chosen) for part in range(chosen)]


def split_groups(groups: Sequence[Hashable], val_fraction: float, test_fraction: float, source: str, unit: str,
                 spread: str = "shuffle", seed: int = 0) -> list[str]:
    """The split of each item, by group: the rule applied to the distinct groups, in first-seen order.

    Args:
        groups: each item's group; the items of a group share a split.
        val_fraction, test_fraction, spread, seed: as ``assign_splits``.
        source, unit: name the data in an error; ``unit`` names the groups ("pieces", "chapters").

    Returns:
        ``"train"``, ``"val"`` or ``"test"`` for each item.
    """
    distinct = list(dict.fromkeys(groups))
    split_of = dict(zip(distinct, assign_splits(len(distinct), val_fraction, test_fraction, source, unit,
                                                spread, seed)))
    return [split_of[group] for group in groups]


def split_indices(labels: Sequence[str]) -> dict[str, list[int]]:
    """The item indices of each split, in order: ``{"train": [...], "val": [...], "test": [...]}``."""
    indices: dict[str, list[int]] = {name: [] for name in SPLITS}
    for index, label in enumerate(labels):
        indices[label].append(index)
    return indices


def split_counts(unit: str, sizes: Mapping[str, int]) -> dict[str, int | str]:
    """The ``seqapps.pipeline.SPLIT_COUNTS`` report value, ``{"unit": "images", "train": 19, "val": 3, "test": 3}``.

    Args:
        unit: what was counted, plural ("images", "lines", "windows").
        sizes: the count of each of ``SPLITS`` (other keys, such as ``test_novel``, are left out).
    """
    return {"unit": unit, **{name: int(sizes[name]) for name in SPLITS}}
