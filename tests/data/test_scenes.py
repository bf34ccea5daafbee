"""Tests of the generated captioning scenes, their captions and the caption fact checker (seqapps.data.scenes)."""
import hashlib

import numpy as np
import pytest

from seqapps.data import scenes
from seqapps.data.scenes import Scene, SceneObject

RED_LEFT = SceneObject("square", "red", "small", 0.2, 0.5)
BLUE_RIGHT = SceneObject("circle", "blue", "large", 0.7, 0.45)
TWO_AND_ONE = Scene((SceneObject("square", "red", "small", 0.15, 0.2), SceneObject("circle", "green", "large", 0.5, 0.7),
                     SceneObject("square", "red", "large", 0.85, 0.3)))


def test_every_generated_caption_is_true_of_its_scene_and_training_scenes_avoid_held_out_pairs():
    rng = np.random.default_rng(0)
    train = [scenes.random_scene(rng) for _ in range(300)]
    novel = [scenes.random_scene(rng, held_out=True) for _ in range(100)]
    assert not any(s.held_out for s in train) and all(s.held_out for s in novel)
    assert {len(s.objects) for s in train} == {1, 2, 3}
    for scene in train + novel:
        phrasings = scenes.captions(scene)
        assert len(set(phrasings)) >= 2 and all(scenes.check_caption(c, scene) for c in phrasings)


def test_captions_count_relate_and_list_objects():
    assert scenes.captions(Scene((RED_LEFT, BLUE_RIGHT)))[:2] == [
        "a small red square to the left of a large blue circle", "a large blue circle to the right of a small red square"]
    assert scenes.captions(TWO_AND_ONE)[0] == "two red squares and a large green circle"
    assert scenes.captions(Scene((BLUE_RIGHT,)))[1] == "there is a large blue circle"


@pytest.mark.parametrize("caption, expected", [
    ("A small red square to the left of a large blue circle.", True),
    ("a red square and a blue circle", True),  # sizes may be left out
    ("a small blue square to the left of a large blue circle", False),  # wrong colour
    ("a small red square to the right of a large blue circle", False),  # wrong relation
    ("a large red square to the left of a large blue circle", False),  # wrong size
    ("a small red square", False),  # an object is missing
    ("two red squares and a large blue circle", False),  # wrong count
    ("a small red squares to the left of a large blue circle", False),  # number disagrees with plural
    ("red things", False),
    ("", False),
])
def test_check_caption_parses_facts_back_and_checks_them(caption, expected):
    assert scenes.check_caption(caption, Scene((RED_LEFT, BLUE_RIGHT))) is expected


def test_counts_are_checked_against_the_objects_of_that_colour_and_shape():
    assert scenes.check_caption("two red squares and a green circle", TWO_AND_ONE)
    assert not scenes.check_caption("two small red squares and a green circle", TWO_AND_ONE)  # one is large
    assert not scenes.check_caption("a red square, a red square and a green circle", TWO_AND_ONE)
    assert not scenes.check_caption("three red squares", TWO_AND_ONE)


def test_write_scenes_is_deterministic_and_reads_back(tmp_path):
    first = scenes.write_scenes(tmp_path / "a", 12, seed=5)
    second = scenes.write_scenes(tmp_path / "b", 12, seed=5)
    digest = lambda folder: hashlib.sha1(b"".join(p.read_bytes() for p in sorted(folder.iterdir()))).hexdigest()  # noqa: E731
    assert digest(first.parent) == digest(second.parent)
    assert first.read_text().splitlines()[0] == "image,caption"
    read = scenes.read_scenes(first.parent)
    assert len(read) == 12
    rows = [line.split(",", 1) for line in first.read_text().splitlines()[1:]]
    assert all(scenes.check_caption(caption.strip('"'), read[name]) for name, caption in rows)
