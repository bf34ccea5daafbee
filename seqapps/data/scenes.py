"""Generated scenes with true captions, for image captioning without a photo data set.

A scene holds one to three objects, each a shape in a colour and a size at a position. It is
drawn with PIL and described by compositional captions: counts ("two red squares"), attributes
("a small blue circle") and spatial relations ("... to the left of ..."), several phrasings per
scene. Everything follows from a seed, so a data set is the same on every machine.

Some (colour, shape) combinations are held out of training (``HELD_OUT``): scenes containing one
make up a second test split that measures generalisation apart from memorisation. Scenes are drawn in a
``Style``: training uses ``FLAT`` (filled shapes on plain grey, apart) or ``VARIED`` (the same filled
shapes on procedural textures, with random blur and JPEG artefacts: domain randomisation); ``PHOTO``, never
used in training, draws outlines over a crop of one of scikit-learn's sample photos, with other object sizes,
objects that may overlap, Gaussian blur and JPEG artefacts, so a test split in it measures a drawing style
the model never saw.

Because the truth is known, ``check_caption`` parses a caption back into facts (objects, counts,
sizes, relations) and checks them against the scene: BLEU cannot tell "two red squares" from "two
blue squares"; this can.

``write_scenes`` writes the images and a ``captions.csv`` (``image,caption``, several rows per image)
in the layout users give their own data in, so one reader serves both.
"""
from __future__ import annotations

import csv
import dataclasses
import functools
import io
import itertools
import re
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import numpy as np

if TYPE_CHECKING:  # PIL is imported where it draws, so importing this module stays cheap
    import PIL.Image

SHAPES = ("circle", "square", "triangle", "diamond")
COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (230, 200, 30),
           "purple": (150, 60, 190)}
SIZES = {"small": 0.12, "large": 0.22}  # radius as a fraction of the image side
#: (colour, shape) pairs that never appear in the training scenes.
HELD_OUT = (("red", "circle"), ("blue", "square"), ("green", "triangle"), ("yellow", "diamond"))
RELATIONS = ("to the left of", "to the right of", "above", "below")
#: the role of each colour and shape word of the captions (a compositional decoder reads roles, not words)
WORD_ROLES = {**{colour: "colour" for colour in COLOURS}, **{shape: "shape" for shape in SHAPES},
              **{f"{shape}s": "shapes" for shape in SHAPES}}
_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3}
_NUMBER_WORDS = {1: "a", 2: "two", 3: "three"}
BACKGROUND = (235, 235, 235)
SCENES_FILE = "scenes.csv"  # the objects of each image, beside captions.csv


@dataclasses.dataclass(frozen=True)
class Style:
    """How scenes are drawn and placed.

    Attributes:
        name: the style's label, written beside every object in ``scenes.csv``.
        sizes: the radius of each size word, as a fraction of the image side.
        spacing: objects' centres are at least ``spacing * (r1 + r2) + 0.02`` apart (below 1: they may overlap).
        photo: draw on a crop of a scikit-learn sample photo instead of plain grey.
        texture: draw on a procedural texture (``texture_background``) instead of plain grey.
        background_grey: the range of the grey level drawn per image: the plain background's, or the one a
            texture is faded towards (a photo is always faded towards ``BACKGROUND``).
        outline: the outline's width in pixels at 64 px (0: filled shapes).
        blur: the range of the Gaussian blur's sigma, in pixels at 64 px ((0, 0): none).
        jpeg_quality: the range of the JPEG quality the image is compressed at (None: no compression).
        background: what a caption calls the background ("... on a grey background").
    """

    name: str
    sizes: dict[str, float] = dataclasses.field(default_factory=lambda: dict(SIZES))
    spacing: float = 1.0
    photo: bool = False
    texture: bool = False
    background_grey: tuple[int, int] = (BACKGROUND[0], BACKGROUND[0])
    outline: int = 0
    blur: tuple[float, float] = (0.0, 0.0)
    jpeg_quality: tuple[int, int] | None = None
    background: str = "a grey background"


#: the training style: filled shapes on plain grey, apart.
FLAT = Style("flat")
#: the held-out style: outlines on photos, other sizes, overlapping, blurred and JPEG-compressed.
PHOTO = Style("photo", sizes={"small": 0.09, "large": 0.28}, spacing=0.6, photo=True, outline=2, blur=(0.5, 1.0),
              jpeg_quality=(20, 50), background="a photo")
#: a training style that randomises what the held-out style changes without drawing it: the same filled shapes,
#: sizes and spacing as FLAT, on procedural textures (no photos), blurred and JPEG-compressed by random amounts.
VARIED = Style("varied", texture=True, blur=(0.0, 1.2), jpeg_quality=(20, 95), background="a textured background")
STYLES = {style.name: style for style in (FLAT, PHOTO, VARIED)}
#: the styles a training split may be drawn in
TRAINING_STYLES = (FLAT.name, VARIED.name)


@dataclasses.dataclass(frozen=True)
class SceneObject:
    """One object: its kind and where it is.

    Attributes:
        shape: one of ``SHAPES``.
        colour: one of ``COLOURS``.
        size: one of ``SIZES``.
        x, y: the centre, as fractions of the image width and height (y grows downwards).
    """

    shape: str
    colour: str
    size: str
    x: float
    y: float


@dataclasses.dataclass(frozen=True)
class Scene:
    """Objects listed from left to right, and the name of the style they are drawn in."""

    objects: tuple[SceneObject, ...]
    style: str = FLAT.name

    @property
    def held_out(self) -> bool:
        """True when an object has a (colour, shape) combination of ``HELD_OUT``."""
        return any((o.colour, o.shape) in HELD_OUT for o in self.objects)


def random_scene(rng: np.random.Generator, held_out: bool | None = False, max_tries: int = 100,
                 style: Style = FLAT) -> Scene:
    """Draws a scene of 1-3 objects, apart as ``style.spacing`` says.

    Args:
        rng: the random generator (the scene is a function of its state).
        held_out: False for training scenes (no ``HELD_OUT`` combination), True to force at least one,
            None for either.
        max_tries: placements tried per object before the whole scene is redrawn.
        style: the sizes and spacing of the objects, and the scene's style label.

    Returns:
        The scene.
    """
    while True:
        count = int(rng.integers(1, 4))
        objects: list[SceneObject] = []
        for _ in range(count):
            shape, colour = SHAPES[rng.integers(len(SHAPES))], list(COLOURS)[rng.integers(len(COLOURS))]
            size = list(style.sizes)[rng.integers(len(style.sizes))]
            radius = style.sizes[size]
            for _ in range(max_tries):
                x, y = rng.uniform(radius, 1 - radius, size=2)
                if all(np.hypot(x - o.x, y - o.y) > style.spacing * (radius + style.sizes[o.size]) + 0.02
                       for o in objects):
                    objects.append(SceneObject(shape, colour, size, round(float(x), 3), round(float(y), 3)))
                    break
        scene = Scene(tuple(sorted(objects, key=lambda o: o.x)), style.name)
        if len(objects) == count and (held_out is None or scene.held_out == held_out):
            return scene


def render(scene: Scene, size: int = 64, rng: np.random.Generator | None = None,
           style: Style | None = None) -> PIL.Image.Image:
    """Draws the scene as an RGB image of ``size x size`` pixels in its style.

    Args:
        scene: the scene.
        size: the image side in pixels.
        rng: draws the photo crop or texture, blur and JPEG quality of a style that has them (FLAT draws
            nothing).
        style: the drawing (default: the scene's, ``STYLES[scene.style]``).

    Returns:
        The image.
    """
    from PIL import Image, ImageDraw

    style = style or STYLES[scene.style]
    rng = rng if rng is not None else np.random.default_rng(0)
    low, high = style.background_grey
    grey = (int(rng.integers(low, high + 1)) if high > low else low,) * 3
    if style.photo:
        image = photo_background(rng, size)
    elif style.texture:
        image = texture_background(rng, size, grey)
    else:
        image = Image.new("RGB", (size, size), grey)
    draw = ImageDraw.Draw(image)
    width = max(1, round(style.outline * size / 64)) if style.outline else 0
    for o in scene.objects:
        cx, cy, r = o.x * size, o.y * size, style.sizes[o.size] * size
        paint = {"outline": COLOURS[o.colour], "width": width} if width else {"fill": COLOURS[o.colour]}
        if o.shape == "circle":
            draw.ellipse([cx - r, cy - r, cx + r, cy + r], **paint)
        elif o.shape == "square":
            side = r * 0.85
            draw.rectangle([cx - side, cy - side, cx + side, cy + side], **paint)
        elif o.shape == "triangle":
            draw.polygon([(cx, cy - r), (cx - r, cy + r * 0.8), (cx + r, cy + r * 0.8)], **paint)
        else:
            draw.polygon([(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)], **paint)
    if style.blur[1] > 0:
        image = gaussian_blur(image, float(rng.uniform(*style.blur)) * size / 64)
    if style.jpeg_quality:
        image = jpeg_artefacts(image, int(rng.integers(style.jpeg_quality[0], style.jpeg_quality[1] + 1)))
    return image


@functools.cache
def _sample_photos() -> tuple[np.ndarray, ...]:
    """scikit-learn's two sample photos (``load_sample_images``: china.jpg, flower.jpg), uint8 ``[427, 640, 3]``."""
    from sklearn.datasets import load_sample_images

    return tuple(load_sample_images().images)


def photo_background(rng: np.random.Generator, size: int) -> PIL.Image.Image:
    """A random square crop (30-80% of the short side) of a sample photo, scaled to ``size`` and faded halfway
    to the plain background's grey so that the shapes stay visible."""
    from PIL import Image

    photos = _sample_photos()
    photo = photos[rng.integers(len(photos))]
    side = int(rng.uniform(0.3, 0.8) * min(photo.shape[:2]))
    top, left = (int(rng.integers(0, extent - side + 1)) for extent in photo.shape[:2])
    crop = Image.fromarray(photo[top: top + side, left: left + side]).resize((size, size), Image.Resampling.BILINEAR)
    return Image.blend(crop, Image.new("RGB", (size, size), BACKGROUND), 0.5)


def texture_background(rng: np.random.Generator, size: int,
                       grey: tuple[int, int, int] = BACKGROUND) -> PIL.Image.Image:
    """A procedural background that is no photo: a random colour field of 2-12 cells a side, upsampled bicubically,
    plus Gaussian pixel noise of a random standard deviation (0-30 levels), faded 50-100% of the way to ``grey``
    (50%: as strong as ``photo_background``; 100%: plain ``grey``)."""
    from PIL import Image

    cells = int(rng.integers(2, 13))
    field = Image.fromarray(rng.integers(0, 256, (cells, cells, 3), dtype=np.uint8))
    pixels = np.asarray(field.resize((size, size), Image.Resampling.BICUBIC), "float64")
    pixels = pixels + rng.normal(0.0, rng.uniform(0.0, 30.0), pixels.shape)
    fade = rng.uniform(0.5, 1.0)
    pixels = (1.0 - fade) * pixels + fade * np.asarray(grey, "float64")
    return Image.fromarray(np.clip(np.round(pixels), 0, 255).astype("uint8"))


def gaussian_blur(image: PIL.Image.Image, sigma: float) -> PIL.Image.Image:
    """The image blurred by a Gaussian of ``sigma`` pixels over height and width (edges reflected, cut at
    3 sigma, rounded to uint8)."""
    from PIL import Image
    from scipy.ndimage import gaussian_filter

    blurred = gaussian_filter(np.asarray(image, "float64"), sigma=(sigma, sigma, 0), mode="reflect", truncate=3.0)
    return Image.fromarray(np.clip(np.round(blurred), 0, 255).astype("uint8"))


def jpeg_artefacts(image: PIL.Image.Image, quality: int) -> PIL.Image.Image:
    """The image as it reads back after JPEG compression at ``quality`` (1-95)."""
    from PIL import Image

    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=quality)
    return Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")


def relation(a: SceneObject, b: SceneObject) -> str:
    """Where ``a`` is relative to ``b``: along the axis on which they are further apart."""
    dx, dy = a.x - b.x, a.y - b.y
    if abs(dx) >= abs(dy):
        return "to the left of" if dx < 0 else "to the right of"
    return "above" if dy < 0 else "below"


def _phrase(objects: list[SceneObject]) -> str:
    """A noun phrase for objects of one colour and shape: ``a small red circle`` or ``two red circles``."""
    first = objects[0]
    if len(objects) == 1:
        return f"a {first.size} {first.colour} {first.shape}"
    return f"{_NUMBER_WORDS[len(objects)]} {first.colour} {first.shape}s"


def captions(scene: Scene) -> list[str]:
    """Every phrasing of the scene's true caption (at least two; order fixed).

    Objects of the same colour and shape are counted together ("two red squares"); two different
    objects are related by position; otherwise objects are listed from left to right.
    """
    groups: dict[tuple[str, str], list[SceneObject]] = {}
    for o in scene.objects:
        groups.setdefault((o.colour, o.shape), []).append(o)
    phrases = [_phrase(group) for group in groups.values()]
    if len(phrases) == 1:
        verb = "is" if len(scene.objects) == 1 else "are"
        return [phrases[0], f"there {verb} {phrases[0]}", f"{phrases[0]} on {STYLES[scene.style].background}"]
    if len(scene.objects) == 2:
        a, b = scene.objects
        inverse = {"to the left of": "to the right of", "to the right of": "to the left of", "above": "below",
                   "below": "above"}
        rel = relation(a, b)
        return [f"{phrases[0]} {rel} {phrases[1]}", f"{phrases[1]} {inverse[rel]} {phrases[0]}",
                f"{phrases[0]} and {phrases[1]}"]
    listed = ", ".join(phrases[:-1]) + f" and {phrases[-1]}"
    return [listed, f"there are {listed}", f"{', '.join(reversed(phrases[1:]))} and {phrases[0]}"]


_PHRASE = re.compile(r"\b(a|an|one|two|three) (?:(small|large) )?(" + "|".join(COLOURS) + r") (" +
                     "|".join(SHAPES) + r")(s?)\b")
_RELATION = re.compile(r"\b(" + "|".join(RELATIONS) + r")\b")


@dataclasses.dataclass(frozen=True)
class Mention:
    """A noun phrase parsed from a caption: how many objects of which colour and shape (and size)."""

    count: int
    colour: str
    shape: str
    size: str | None


def parse_caption(caption: str) -> tuple[list[Mention], list[str]] | None:
    """Parses a caption of the scene grammar into its noun phrases and the relations between them.

    Args:
        caption: the text (any case, extra spaces and punctuation allowed).

    Returns:
        ``(mentions, relations)``: the noun phrases in order, and the relation words found between
        consecutive phrases; None when the caption has no phrase or a phrase's number disagrees
        with its plural ("two red square", "a red squares").
    """
    text = " ".join(re.sub(r"[^a-z,]+", " ", caption.lower()).split())
    mentions = []
    for match in _PHRASE.finditer(text):
        count = _NUMBERS[match.group(1)]
        if (count > 1) != bool(match.group(5)):
            return None
        mentions.append(Mention(count, match.group(3), match.group(4), match.group(2)))
    if not mentions:
        return None
    return mentions, _RELATION.findall(text)


def check_caption(caption: str, scene: Scene) -> bool:
    """True when every fact the caption states is true of the scene, and it mentions every object.

    The facts: each phrase's count equals the number of objects of its colour and shape; a stated size
    is that object's size; a relation between two phrases holds between their objects; together the
    phrases cover all objects, each once.

    Args:
        caption: a generated or model caption.
        scene: the scene it describes.

    Returns:
        Whether the caption is fully correct.
    """
    parsed = parse_caption(caption)
    if parsed is None:
        return False
    mentions, relations = parsed
    kinds = [(m.colour, m.shape) for m in mentions]
    if len(set(kinds)) != len(kinds) or sum(m.count for m in mentions) != len(scene.objects):
        return False
    matched = []
    for mention in mentions:
        objects = [o for o in scene.objects if (o.colour, o.shape) == (mention.colour, mention.shape)]
        if len(objects) != mention.count or (mention.size and any(o.size != mention.size for o in objects)):
            return False
        matched.append(objects)
    if not relations:
        return True
    if len(relations) != 1 or len(mentions) != 2 or mentions[0].count != 1 or mentions[1].count != 1:
        return False
    return relation(matched[0][0], matched[1][0]) == relations[0]


def write_scenes(folder: str | Path, count: int, seed: int, held_out: bool | None = False,
                 image_size: int = 64, style: Style = FLAT) -> Path:
    """Writes ``count`` scenes as PNG files plus ``captions.csv`` (``image,caption``, one row per phrasing)
    and ``scenes.csv`` (the objects, for ``check_caption``) into ``folder``, unless already complete.

    Args:
        folder: the output folder (created).
        count: how many scenes.
        seed: the generator's seed: the same seed writes the same files.
        held_out: as for ``random_scene``.
        image_size: the image side in pixels.
        style: how the scenes are placed and drawn (its name is the ``style`` column of ``scenes.csv``).

    Returns:
        The path of ``captions.csv``.
    """
    folder = Path(folder)
    target = folder / "captions.csv"
    if target.is_file() and (folder / SCENES_FILE).is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    rows, objects = [], []
    for i in range(count):
        scene = random_scene(rng, held_out, style=style)
        name = f"scene_{i:05d}.png"
        render(scene, image_size, rng).save(folder / name)
        rows.extend((name, caption) for caption in captions(scene))
        objects.extend((name, o.shape, o.colour, o.size, o.x, o.y, scene.style) for o in scene.objects)
    _write_csv(folder / SCENES_FILE, ("image", "shape", "colour", "size", "x", "y", "style"), objects)
    _write_csv(target, ("image", "caption"), rows)  # last: its presence marks a complete folder
    return target


def read_scenes(folder: str | Path) -> dict[str, Scene]:
    """Reads ``scenes.csv`` written by ``write_scenes``: image name -> scene (FLAT where it has no style column)."""
    with open(Path(folder) / SCENES_FILE, newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    return {name: Scene(tuple(SceneObject(r["shape"], r["colour"], r["size"], float(r["x"]), float(r["y"]))
                              for r in group), group[0].get("style") or FLAT.name)
            for name, group in ((name, list(group)) for name, group in itertools.groupby(rows, key=lambda r: r["image"]))}


def _write_csv(path: Path, header: tuple[str, ...], rows: Iterable[tuple]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(header)
        writer.writerows(rows)
