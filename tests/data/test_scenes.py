"""Tests of the generated captioning scenes, their captions and the caption fact checker (seqapps.data.scenes)."""
import dataclasses
import hashlib
import io
import itertools

import numpy as np
import pytest
from PIL import Image
from scipy import ndimage

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


def _digest(folder):
    return hashlib.sha1(b"".join(p.read_bytes() for p in sorted(folder.iterdir()))).hexdigest()


def test_held_out_style_scenes_are_deterministic_under_the_seed_and_their_captions_true(tmp_path):
    first = scenes.write_scenes(tmp_path / "a", 8, seed=5, style=scenes.PHOTO)
    second = scenes.write_scenes(tmp_path / "b", 8, seed=5, style=scenes.PHOTO)
    other = scenes.write_scenes(tmp_path / "c", 8, seed=6, style=scenes.PHOTO)
    assert _digest(first.parent) == _digest(second.parent) != _digest(other.parent)
    read = scenes.read_scenes(first.parent)
    assert {scene.style for scene in read.values()} == {"photo"}
    rows = [line.split(",", 1) for line in first.read_text().splitlines()[1:]]
    assert all(scenes.check_caption(caption.strip('"'), read[name]) for name, caption in rows)
    assert "grey" not in first.read_text()  # the photo style's phrasing names its background
    assert _digest(scenes.write_scenes(tmp_path / "flat", 8, seed=5).parent) != _digest(first.parent)


def test_texture_backgrounds_repeat_under_the_seed_and_span_plain_grey_to_a_photos_contrast():
    draws = [np.asarray(scenes.texture_background(np.random.default_rng(seed), 64), "float64") for seed in range(200)]
    again = np.asarray(scenes.texture_background(np.random.default_rng(0), 64), "float64")
    assert np.array_equal(draws[0], again) and not np.array_equal(draws[0], draws[1])
    spread = np.array([np.abs(pixels - scenes.BACKGROUND).mean() for pixels in draws])
    # faded 50-100% of the way to grey: from near-plain to textured, never beyond half of a full-contrast field
    assert spread.min() < 5 and spread.max() > 25 and spread.max() < 0.5 * 255
    photo = np.asarray(scenes.photo_background(np.random.default_rng(0), 64), "float64")
    assert spread.max() > np.abs(photo - scenes.BACKGROUND).mean() / 2  # as strong as the photos at the most


def test_the_varied_training_style_draws_filled_shapes_at_flat_sizes_and_never_a_photo_or_outline(tmp_path):
    assert (scenes.VARIED.sizes, scenes.VARIED.spacing, scenes.VARIED.outline, scenes.VARIED.photo) == (
        scenes.FLAT.sizes, scenes.FLAT.spacing, 0, False)
    scene = Scene((SceneObject("square", "blue", "large", 0.5, 0.5),), scenes.VARIED.name)
    filled = np.all(np.asarray(scenes.render(scene, 64, style=scenes.FLAT)) == scenes.COLOURS["blue"], axis=-1)
    interior = ndimage.binary_erosion(filled, iterations=4)  # beyond the blur's reach (sigma <= 1.2 px)
    for seed in range(5):
        pixels = np.asarray(scenes.render(scene, 64, np.random.default_rng(seed)), "float64")
        assert np.abs(pixels[interior] - scenes.COLOURS["blue"]).mean() < 12  # filled, up to JPEG artefacts
    first = scenes.write_scenes(tmp_path / "a", 8, seed=5, style=scenes.VARIED)
    assert _digest(first.parent) == _digest(scenes.write_scenes(tmp_path / "b", 8, seed=5, style=scenes.VARIED).parent)
    read = scenes.read_scenes(first.parent)
    assert {scene.style for scene in read.values()} == {"varied"}
    rows = [line.split(",", 1) for line in first.read_text().splitlines()[1:]]
    assert all(scenes.check_caption(caption.strip('"'), read[name]) for name, caption in rows)


def test_held_out_style_places_its_own_sizes_and_lets_objects_overlap():
    rng = np.random.default_rng(1)
    drawn = [scenes.random_scene(rng, style=scenes.PHOTO) for _ in range(300)]
    radius = scenes.PHOTO.sizes
    gaps = [np.hypot(a.x - b.x, a.y - b.y) / (radius[a.size] + radius[b.size])
            for scene in drawn for a, b in zip(scene.objects, scene.objects[1:])]
    assert min(gaps) < 1 and all(gap > scenes.PHOTO.spacing for gap in gaps)  # overlapping, never centred together
    assert all(o.size in radius and radius[o.size] <= o.x <= 1 - radius[o.size] for s in drawn for o in s.objects)
    flat = [scenes.random_scene(rng) for _ in range(300)]
    assert all(np.hypot(a.x - b.x, a.y - b.y) > scenes.SIZES[a.size] + scenes.SIZES[b.size]
               for scene in flat for a, b in itertools.combinations(scene.objects, 2))


@pytest.mark.parametrize("shape", scenes.SHAPES)
def test_outlines_are_the_boundary_of_the_filled_shape_only(shape):
    scene = Scene((SceneObject(shape, "blue", "large", 0.5, 0.5),))
    filled, outline = (np.any(np.asarray(scenes.render(scene, 64, style=style)) != scenes.BACKGROUND, axis=-1)
                       for style in (scenes.FLAT, dataclasses.replace(scenes.FLAT, outline=2)))
    interior = ndimage.binary_erosion(filled, iterations=3)  # a 2-pixel line and one pixel of rasterisation slack
    boundary = filled & ~ndimage.binary_erosion(filled)
    assert not np.any(outline & interior) and np.all(outline <= ndimage.binary_dilation(filled))
    assert np.mean(outline[boundary]) > 0.9


def test_gaussian_blur_equals_a_numpy_separable_gaussian_with_reflected_edges():
    pixels = np.random.default_rng(0).integers(0, 256, (20, 17, 3)).astype("uint8")
    sigma = 1.3
    radius = int(3 * sigma + 0.5)
    taps = np.exp(-np.arange(-radius, radius + 1) ** 2 / (2 * sigma ** 2))
    taps /= taps.sum()
    expected = pixels.astype("float64")
    for axis in (0, 1):
        padding = [(radius, radius) if a == axis else (0, 0) for a in range(3)]
        padded = np.pad(expected, padding, mode="symmetric")
        expected = sum(w * np.take(padded, range(i, i + pixels.shape[axis]), axis=axis) for i, w in enumerate(taps))
    found = np.asarray(scenes.gaussian_blur(Image.fromarray(pixels), sigma)).astype("int64")
    assert np.abs(found - np.round(expected)).max() <= 1 and np.mean(found == np.round(expected)) > 0.99
    assert np.abs(found - pixels).mean() > 10  # it did blur noise


def test_jpeg_artefacts_are_the_decoded_jpeg_at_that_quality_and_deterministic():
    pixels = np.asarray(scenes.render(Scene((RED_LEFT, BLUE_RIGHT)), 64))
    image = Image.fromarray(pixels)
    low, again, high = (np.asarray(scenes.jpeg_artefacts(image, q)) for q in (20, 20, 90))
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=20)
    assert np.array_equal(low, np.asarray(Image.open(buffer))) and np.array_equal(low, again)
    error = {q: np.abs(found.astype(int) - pixels).mean() for q, found in ((20, low), (90, high))}
    assert error[20] > error[90] > 0


def test_photo_backgrounds_are_faded_crops_of_the_sample_photos():
    photos = scenes._sample_photos()
    background = np.asarray(scenes.photo_background(np.random.default_rng(3), 32)).astype(float)
    assert np.array_equal(background, np.asarray(scenes.photo_background(np.random.default_rng(3), 32)))
    assert background.std() > 5  # not plain
    # halfway to the grey 235: every value is 0.5 * photo + 117.5
    low = 0.5 * min(p.min() for p in photos) + 117.5
    assert background.min() >= np.floor(low) and background.max() <= np.ceil(0.5 * 255 + 117.5)


def test_a_background_grey_range_draws_the_grey_per_image_and_keeps_the_objects_colours():
    style = dataclasses.replace(scenes.VARIED, name="greys", background_grey=(100, 235), blur=(0.0, 0.0),
                                jpeg_quality=None)
    scene = Scene((SceneObject("square", "blue", "large", 0.5, 0.5),), style.name)
    medians = []
    for seed in range(60):
        pixels = np.asarray(scenes.render(scene, 64, np.random.default_rng(seed), style=style), "float64")
        assert np.array_equal(pixels[32, 32], scenes.COLOURS["blue"])
        medians.append(np.median(pixels[:8, :8]))  # a corner: background only
    assert min(medians) < 140 and max(medians) > 200



def test_a_fixed_background_grey_paints_a_plain_background_that_grey():
    scene = Scene((SceneObject("circle", "red", "small", 0.3, 0.3),))
    darker = np.asarray(scenes.render(scene, 64, style=dataclasses.replace(scenes.FLAT, background_grey=(165, 165))))
    flat = np.asarray(scenes.render(scene, 64))
    assert np.all(darker[-8:, -8:] == 165) and np.all(flat[-8:, -8:] == scenes.BACKGROUND[0])
    assert np.array_equal(darker == 165, flat == scenes.BACKGROUND[0])  # the same objects, only the grey differs
