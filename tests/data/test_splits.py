"""The split rule (seqapps.data.splits), checked by brute force over sizes and fractions."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from seqapps.data import splits
from seqapps.errors import DataError

FRACTIONS = [(0.1, 0.1), (0.05, 0.1), (0.02, 0.03), (0.15, 0.2), (0.3, 0.3), (0.45, 0.45)]


def expected_sizes(n: int, val_fraction: float, test_fraction: float) -> tuple[int, int, int]:
    n_val, n_test = max(1, round(n * val_fraction)), max(1, round(n * test_fraction))
    return n - n_val - n_test, n_val, n_test


@pytest.mark.parametrize("spread", splits.SPREADS)
@pytest.mark.parametrize("val_fraction,test_fraction", FRACTIONS)
def test_every_size_gets_the_requested_counts_and_every_item_one_split(spread, val_fraction, test_fraction):
    for n in range(3, 301):
        train, val, test = expected_sizes(n, val_fraction, test_fraction)
        if train < 1:
            with pytest.raises(DataError, match=rf"^src: {n} images are too few .* give at least \d+ images$"):
                splits.assign_splits(n, val_fraction, test_fraction, "src", "images", spread, seed=n)
            continue
        labels = splits.assign_splits(n, val_fraction, test_fraction, "src", "images", spread, seed=n)
        assert len(labels) == n and set(labels) <= set(splits.SPLITS)
        assert [labels.count(name) for name in splits.SPLITS] == [train, val, test], n
        indices = splits.split_indices(labels)
        assert sorted(itertools.chain(*indices.values())) == list(range(n))


@pytest.mark.parametrize("val_fraction,test_fraction", FRACTIONS)
def test_the_smallest_size_named_in_the_error_and_every_larger_one_split(val_fraction, test_fraction):
    for n in range(1, 40):
        if expected_sizes(n, val_fraction, test_fraction)[0] >= 1:
            continue
        with pytest.raises(DataError) as refused:
            splits.split_sizes(n, val_fraction, test_fraction, "src", "lines")
        fewest = int(str(refused.value).rsplit(" ", 2)[-2])
        assert fewest > n and all(expected_sizes(m, val_fraction, test_fraction)[0] >= 1
                                  for m in range(fewest, 400))
        assert expected_sizes(fewest - 1, val_fraction, test_fraction)[0] < 1 or fewest - 1 == n
        assert "\n" not in str(refused.value)


def test_interleave_spreads_the_held_out_items_through_the_order():
    labels = splits.assign_splits(1000, 0.02, 0.03, "corpus", "lines")
    for name in ("val", "test"):
        positions = np.flatnonzero(np.array(labels) == name)
        # evenly spaced: 20 val items about 50 apart, 30 test items about 33 apart, none bunched at an end
        assert np.ptp(np.diff(positions)) <= 1000 // len(positions)
        assert positions[0] < 1000 / len(positions) and positions[-1] > 1000 - 1000 / len(positions)
    assert labels == splits.assign_splits(1000, 0.02, 0.03, "corpus", "lines")  # deterministic


def test_shuffle_is_seeded_and_does_not_follow_the_order():
    first = splits.assign_splits(40, 0.1, 0.1, "folder", "clips", "shuffle", seed=1)
    assert first == splits.assign_splits(40, 0.1, 0.1, "folder", "clips", "shuffle", seed=1)
    assert first != splits.assign_splits(40, 0.1, 0.1, "folder", "clips", "shuffle", seed=2)
    assert first[:8] != ["val"] * 4 + ["test"] * 4 and first[-8:] != ["val"] * 4 + ["test"] * 4


def test_groups_share_a_split_and_groups_are_counted():
    groups = [f"piece {i // 3}" for i in range(30)]  # 10 pieces of 3 clips
    labels = splits.split_groups(groups, 0.2, 0.2, "folder", "pieces", seed=0)
    by_group = {group: {label for g, label in zip(groups, labels) if g == group} for group in groups}
    assert all(len(found) == 1 for found in by_group.values())
    assert [labels.count(name) for name in splits.SPLITS] == [18, 6, 6]  # 6, 2 and 2 pieces
    with pytest.raises(DataError, match="folder: 2 pieces are too few .* give at least 3 pieces"):
        splits.split_groups(groups[:6], 0.2, 0.2, "folder", "pieces")
