"""Image captions: a folder of images with a CSV ``image,caption`` (Flickr8k/COCO style).

Several rows may name one image (one caption each). ``--data`` may be the CSV file or the folder
holding ``captions.csv``; image paths are relative to the CSV's folder. Every bad row is a
``DataError`` naming the CSV file and line: a missing image, an empty caption, a file that is not
an image or is truncated (checked by ``seqapps.data.images.read_image``).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from seqapps.data.tables import read_csv
from seqapps.errors import DataError

CAPTIONS_FILE = "captions.csv"
COLUMNS = ("image", "caption")


@dataclasses.dataclass
class CaptionedImages:
    """Images with their reference captions.

    Attributes:
        images: image paths, each once, in the order of their first row.
        captions: ``captions[i]`` lists the references of ``images[i]``.
        source: the CSV file, for messages and reports.
    """

    images: list[Path]
    captions: list[list[str]]
    source: str

    def __len__(self) -> int:
        return len(self.images)


def read_captions(path: str | Path, check_images: bool = True) -> CaptionedImages:
    """Reads an ``image,caption`` CSV (or the ``captions.csv`` of a folder) and checks every row.

    Args:
        path: the CSV file, or a folder holding ``captions.csv``.
        check_images: open every image once (missing, not an image, truncated, too large).

    Returns:
        The images and their captions.

    Raises:
        DataError: no CSV, no ``image``/``caption`` column, an empty caption or image name, or an
            image that is missing or unreadable; the message names the CSV file and line.
    """
    path = Path(path)
    csv_path = path / CAPTIONS_FILE if path.is_dir() else path
    if path.is_dir() and not csv_path.is_file():
        raise DataError(f"{path}: no {CAPTIONS_FILE} in the folder; expected a CSV with columns image,caption")
    frame = read_csv(csv_path)
    missing = [column for column in COLUMNS if column not in frame.columns]
    if missing:
        raise DataError(f"{csv_path}: no {' or '.join(missing)} column; the header is "
                        f"{','.join(map(str, frame.columns))}, expected image,caption")
    order: dict[str, int] = {}
    images: list[Path] = []
    captions: list[list[str]] = []
    for position, (name, caption) in enumerate(zip(frame["image"], frame["caption"])):
        line = position + frame.attrs["first_line"]
        if not isinstance(name, str) or not name.strip():
            raise DataError(f"{csv_path}: line {line}: empty image name")
        if not isinstance(caption, str) or not caption.strip():
            raise DataError(f"{csv_path}: line {line}: empty caption for image {name}")
        if name not in order:
            image = csv_path.parent / name
            if check_images:
                from seqapps.data.images import read_image

                read_image(image, csv_path, line)
            order[name] = len(images)
            images.append(image)
            captions.append([])
        captions[order[name]].append(" ".join(caption.split()))
    return CaptionedImages(images, captions, str(csv_path))
