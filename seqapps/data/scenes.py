"""Generated scenes with true captions, for image captioning without a photo data set.

A scene holds one to three objects, each a shape in a colour and a size at a position. It is
drawn with PIL and described by compositional captions: counts ("two red squares"), attributes
("a small blue circle") and spatial relations ("... to the left of ..."), several phrasings per
scene. Everything follows from a seed, so a data set is the same on every machine.

Some (colour, shape) combinations are held out of training (``HELD_OUT``): scenes containing one
make up a second test split that measures generalisation apart from memorisation.

Because the truth is known, ``check_caption`` parses a caption back into facts (objects, counts,
sizes, relations) and checks them against the scene: BLEU cannot tell "two red squares" from "two
blue squares"; this can.

``write_scenes`` writes the images and a ``captions.csv`` (``image,caption``, several rows per image)
in the layout users give their own data in, so one reader serves both.
"""
from __future__ import annotations

import csv
import dataclasses
import itertools
import re
from pathlib import Path
from typing import Iterable

import numpy as np

SHAPES = ("circle", "square", "triangle", "diamond")
COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (230, 200, 30),
           "purple": (150, 60, 190)}
SIZES = {"small": 0.12, "large": 0.22}  # radius as a fraction of the image side
#: (colour, shape) pairs that never appear in the training scenes.
HELD_OUT = (("red", "circle"), ("blue", "square"), ("green", "triangle"), ("yellow", "diamond"))
RELATIONS = ("to the left of", "to the right of", "above", "below")
_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3}
_NUMBER_WORDS = {1: "a", 2: "two", 3: "three"}


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
    """Objects on a plain background, listed from left to right."""

    objects: tuple[SceneObject, ...]

    @property
    def held_out(self) -> bool:
        """True when an object has a (colour, shape) combination of ``HELD_OUT``."""
        return any((o.colour, o.shape) in HELD_OUT for o in self.objects)


def random_scene(rng: np.random.Generator, held_out: bool | None = False, max_tries: int = 100) -> Scene:
    """Draws a scene of 1-3 objects that do not overlap.

    Args:
        rng: the random generator (the scene is a function of its state).
        held_out: False for training scenes (no ``HELD_OUT`` combination), True to force at least one,
            None for either.
        max_tries: placements tried per object before the whole scene is redrawn.

    Returns:
        The scene.
    """
    while True:
        count = int(rng.integers(1, 4))
        objects: list[SceneObject] = []
        for _ in range(count):
            shape, colour = SHAPES[rng.integers(len(SHAPES))], list(COLOURS)[rng.integers(len(COLOURS))]
            size = list(SIZES)[rng.integers(len(SIZES))]
            radius = SIZES[size]
            for _ in range(max_tries):
                x, y = rng.uniform(radius, 1 - radius, size=2)
                if all(np.hypot(x - o.x, y - o.y) > radius + SIZES[o.size] + 0.02 for o in objects):
                    objects.append(SceneObject(shape, colour, size, round(float(x), 3), round(float(y), 3)))
                    break
        scene = Scene(tuple(sorted(objects, key=lambda o: o.x)))
        if len(objects) == count and (held_out is None or scene.held_out == held_out):
            return scene


def render(scene: Scene, size: int = 64) -> "PIL.Image.Image":  # noqa: F821
    """Draws the scene as an RGB image of ``size x size`` pixels on a light grey background."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size), (235, 235, 235))
    draw = ImageDraw.Draw(image)
    for o in scene.objects:
        cx, cy, r = o.x * size, o.y * size, SIZES[o.size] * size
        colour = COLOURS[o.colour]
        if o.shape == "circle":
            draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=colour)
        elif o.shape == "square":
            side = r * 0.85
            draw.rectangle([cx - side, cy - side, cx + side, cy + side], fill=colour)
        elif o.shape == "triangle":
            draw.polygon([(cx, cy - r), (cx - r, cy + r * 0.8), (cx + r, cy + r * 0.8)], fill=colour)
        else:
            draw.polygon([(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)], fill=colour)
    return image


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
        return [phrases[0], f"there {verb} {phrases[0]}", f"{phrases[0]} on a grey background"]
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
                 image_size: int = 64) -> Path:
    """Writes ``count`` scenes as PNG files plus ``captions.csv`` (``image,caption``, one row per phrasing)
    and ``scenes.csv`` (the objects, for ``check_caption``) into ``folder``, unless already complete.

    Args:
        folder: the output folder (created).
        count: how many scenes.
        seed: the generator's seed: the same seed writes the same files.
        held_out: as for ``random_scene``.
        image_size: the image side in pixels.

    Returns:
        The path of ``captions.csv``.
    """
    folder = Path(folder)
    target = folder / "captions.csv"
    if target.is_file() and (folder / "scenes.csv").is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    scenes = [random_scene(rng, held_out) for _ in range(count)]
    rows, objects = [], []
    for i, scene in enumerate(scenes):
        name = f"scene_{i:05d}.png"
        render(scene, image_size).save(folder / name)
        rows.extend((name, caption) for caption in captions(scene))
        objects.extend((name, o.shape, o.colour, o.size, o.x, o.y) for o in scene.objects)
    _write_csv(folder / "scenes.csv", ("image", "shape", "colour", "size", "x", "y"), objects)
    _write_csv(target, ("image", "caption"), rows)  # last: its presence marks a complete folder
    return target


def read_scenes(folder: str | Path) -> dict[str, Scene]:
    """Reads ``scenes.csv`` written by ``write_scenes``: image name -> scene."""
    with open(Path(folder) / "scenes.csv", newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    return {name: Scene(tuple(SceneObject(r["shape"], r["colour"], r["size"], float(r["x"]), float(r["y"]))
                              for r in group))
            for name, group in itertools.groupby(rows, key=lambda r: r["image"])}


def _write_csv(path: Path, header: tuple[str, ...], rows: Iterable[tuple]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(header)
        writer.writerows(rows)
