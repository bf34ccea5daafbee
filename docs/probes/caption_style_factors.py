"""Which part of the held-out drawing style a captioning export fails on: one factor of ``scenes.PHOTO`` at a time.

A probe behind docs/results.md (issue 26 item 3), not library code. It draws scenes of seen colour/shape pairs
in ``scenes.FLAT`` with one factor changed: each factor of the held-out style (the photo background, outlines,
the other sizes, overlap, blur with JPEG artefacts), the procedural texture of the ``varied`` training style, and
the photo background's brightness alone (plain grey at 165, the median of ``scenes.photo_background``'s means,
against 235). It adds ``FLAT`` and ``PHOTO`` themselves. It captions them with the export's greedy signature
(``serving_default``, PNG bytes in) and prints, per export, the share of captions whose facts are all true
(``scenes.check_caption``), as a Markdown table.

Usage::

    python docs/probes/caption_style_factors.py EXPORT [EXPORT ...] [--scenes 300] [--seed 11]
"""
from __future__ import annotations

import argparse
import dataclasses
import io

import numpy as np
import tensorflow as tf

from seqapps.data import scenes

BATCH = 32
IMAGE_SIZE = 64

#: column label -> the style the scenes are placed and drawn in
VARIANTS = {
    "flat": scenes.FLAT,
    "photo background": dataclasses.replace(scenes.FLAT, photo=True),
    "plain grey 165": dataclasses.replace(scenes.FLAT, background_grey=(165, 165)),
    "outlines": dataclasses.replace(scenes.FLAT, outline=scenes.PHOTO.outline),
    "other sizes": dataclasses.replace(scenes.FLAT, sizes=scenes.PHOTO.sizes),
    "overlap": dataclasses.replace(scenes.FLAT, spacing=scenes.PHOTO.spacing),
    "blur + JPEG": dataclasses.replace(scenes.FLAT, blur=scenes.PHOTO.blur, jpeg_quality=scenes.PHOTO.jpeg_quality),
    "texture (varied's)": dataclasses.replace(scenes.FLAT, texture=True),
    "photo (all)": scenes.PHOTO,
}


def drawn_scenes(style: scenes.Style, count: int, seed: int) -> tuple[list[scenes.Scene], list[bytes]]:
    """``count`` scenes of seen pairs placed and drawn in ``style``, and their PNG bytes.

    Args:
        style: the placement and drawing.
        count: how many scenes.
        seed: the generator's seed (the same for every style, so the draws line up where the style allows).

    Returns:
        The scenes and their encoded images.
    """
    rng = np.random.default_rng(seed)
    found, encoded = [], []
    for _ in range(count):
        scene = scenes.random_scene(rng, held_out=False, style=style)
        buffer = io.BytesIO()
        scenes.render(scene, IMAGE_SIZE, rng, style=style).save(buffer, format="PNG")
        found.append(scene)
        encoded.append(buffer.getvalue())
    return found, encoded


def fact_accuracy(export: str, variants: dict[str, tuple[list[scenes.Scene], list[bytes]]]) -> dict[str, float]:
    """The share of greedy captions of ``export`` whose facts are all true, per variant.

    Args:
        export: a captioning SavedModel folder.
        variants: label -> (scenes, PNG bytes), from ``drawn_scenes``.

    Returns:
        label -> fact accuracy.
    """
    caption = tf.saved_model.load(export).signatures["serving_default"]
    accuracy = {}
    for label, (found, encoded) in variants.items():
        captions = []
        for start in range(0, len(encoded), BATCH):
            out = caption(image_bytes=tf.constant(encoded[start: start + BATCH]))
            captions.extend(text.decode() for text in out["caption"].numpy())
        accuracy[label] = float(np.mean([scenes.check_caption(text, scene) for text, scene in zip(captions, found)]))
    return accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("exports", nargs="+")
    parser.add_argument("--scenes", type=int, default=300)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    variants = {label: drawn_scenes(style, args.scenes, args.seed) for label, style in VARIANTS.items()}
    print("| export | " + " | ".join(VARIANTS) + " |")
    print("|---" * (len(VARIANTS) + 1) + "|")
    for export in args.exports:
        accuracy = fact_accuracy(export, variants)
        print(f"| {export} | " + " | ".join(f"{accuracy[label]:.3f}" for label in VARIANTS) + " |")


if __name__ == "__main__":
    main()
