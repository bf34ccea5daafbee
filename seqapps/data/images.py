"""Images: bounded in-graph decoding of encoded bytes, and Python-side reading and validation of image files.

In the graph (``decode_images``, for exports and ``tf.data``), a batch of JPEG, PNG,
GIF or BMP bytes becomes float32 RGB pixels (0..255) of one size. Before anything is
decoded, each image's width and height are read from its header (the PNG IHDR chunk,
the GIF screen descriptor, the BMP info header; ``tf.io.extract_jpeg_shape`` for
JPEG), so that a small file that expands to a huge image (a 10,000 x 10,000 PNG is
about 100 kB) is rejected with InvalidArgument instead of exhausting memory. A JPEG
larger than the pixel budget is decoded at 1/2, 1/4 or 1/8 scale by libjpeg's DCT
scaling when that brings it within the budget (photos from large camera sensors).

In Python (``read_image``, ``read_image_bytes``, for training data and ``predict``),
PIL opens the file; a missing, non-image, truncated or oversized file raises a
``DataError`` of one line naming the file and, when given, the CSV line that names it.
"""
from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from seqapps.data.files import where as name_file
from seqapps.errors import DataError

if TYPE_CHECKING:
    import tensorflow as tf

#: Formats both TensorFlow's decoders and the validators accept (PIL's format names).
FORMATS = ("JPEG", "PNG", "GIF", "BMP")
#: Default byte budget of one encoded image.
MAX_IMAGE_BYTES = 20 * 2**20
#: Default pixel budget of one decoded image: 4096 x 4096 (a 12-megapixel phone photo fits at full size).
MAX_IMAGE_PIXELS = 4096 * 4096
_JPEG_RATIOS = (1, 2, 4, 8)
_HEADER_BYTES = 32


def _format_list() -> str:
    return ", ".join(FORMATS[:-1]) + " or " + FORMATS[-1]


# --- In the graph ------------------------------------------------------------------------------------------------------


def _header_size(encoded: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(format index into FORMATS or -1, height, width) of one encoded image, read from its header bytes."""
    import tensorflow as tf

    # The first bytes, zero-padded so that every fixed-offset read below is in range even for a short string.
    header = tf.strings.substr(tf.strings.join([tf.strings.substr(encoded, 0, _HEADER_BYTES),
                                                tf.constant(b"\0" * _HEADER_BYTES)]), 0, _HEADER_BYTES)

    def field(offset: int, dtype: tf.DType, little_endian: bool) -> tf.Tensor:
        """Two integers of ``dtype`` from ``offset`` on (width and height in every header here)."""
        pair = tf.strings.substr(header, offset, 2 * dtype.size)
        return tf.cast(tf.io.decode_raw(pair, dtype, little_endian), tf.int64)

    def jpeg() -> tf.Tensor:
        return tf.cast(tf.io.extract_jpeg_shape(encoded)[:2], tf.int64)

    png = field(16, tf.int32, little_endian=False)  # IHDR: width, height (big-endian)
    gif = field(6, tf.uint16, little_endian=True)  # logical screen: width, height
    bmp = tf.abs(field(18, tf.int32, little_endian=True))  # BITMAPINFOHEADER: width, height (< 0: top-down)
    magic = [tf.strings.substr(header, 0, 3) == b"\xff\xd8\xff", tf.strings.substr(header, 0, 8) == b"\x89PNG\r\n\x1a\n",
             tf.strings.regex_full_match(tf.strings.substr(header, 0, 6), "GIF8[79]a"),
             tf.strings.substr(header, 0, 2) == b"BM"]
    kind = tf.reduce_max(tf.where(tf.stack(magic), tf.range(len(FORMATS), dtype=tf.int32), -1))
    branches = [jpeg, lambda: png[::-1], lambda: gif[::-1], lambda: bmp[::-1], lambda: tf.zeros([2], tf.int64)]
    size = tf.switch_case(tf.where(kind < 0, len(FORMATS), kind), branches)
    return kind, size[0], size[1]


def decode_images(
    image_bytes: tf.Tensor,
    height: int,
    width: int,
    channels: int = 3,
    keep_aspect_ratio: bool = False,
    max_bytes: int = MAX_IMAGE_BYTES,
    max_pixels: int = MAX_IMAGE_PIXELS,
) -> tf.Tensor:
    """Decodes and resizes a batch of encoded images inside a TensorFlow graph, with bounded memory.

    Grayscale and palette images are expanded to RGB; the alpha channel of RGBA images
    is dropped (not composited). An animated GIF gives its first frame. Resizing is
    bilinear with antialiasing; with ``keep_aspect_ratio`` the image is scaled to fit and
    centred on a zero (black) canvas (``tf.image.resize_with_pad``), otherwise it is
    stretched to ``height`` x ``width``.

    Args:
        image_bytes: string tensor [batch] of JPEG, PNG, GIF or BMP bytes.
        height, width: output size in pixels.
        channels: 3 for RGB, 1 for luma (ITU-R 601 weights, ``tf.image.rgb_to_grayscale``).
        keep_aspect_ratio: pad instead of stretching.
        max_bytes: longest accepted encoded image.
        max_pixels: largest accepted height x width; read from the header before decoding
            (a larger JPEG is decoded at the smallest of 1/2, 1/4, 1/8 scale that fits).

    Returns:
        float32 [batch, height, width, channels] in 0..255.

    Raises:
        tf.errors.InvalidArgumentError (when run): bytes that are not one of the four
            formats, over ``max_bytes``, over ``max_pixels`` or corrupt.
    """
    import tensorflow as tf

    if channels not in (1, 3):
        raise ValueError(f"channels={channels}: expected 1 (gray) or 3 (RGB)")

    def decode(encoded: tf.Tensor) -> tf.Tensor:
        checks = [tf.debugging.assert_less_equal(
            tf.strings.length(encoded), max_bytes,
            message=f"an encoded image is larger than the limit of {max_bytes} bytes")]
        with tf.control_dependencies(checks):
            kind, rows, columns = _header_size(encoded)
        checks = [tf.debugging.Assert(kind >= 0, [f"image bytes are not {_format_list()}"])]
        scaled = [(rows + ratio - 1) // ratio * ((columns + ratio - 1) // ratio) for ratio in _JPEG_RATIOS]
        fits = tf.stack(scaled) <= max_pixels
        # A JPEG uses the first ratio whose scaled size fits; any other format must fit at full size.
        ratio_index = tf.argmax(tf.cast(fits, tf.int32), output_type=tf.int32)
        checks.append(tf.debugging.Assert(
            tf.logical_and(fits[-1], tf.logical_or(kind == 0, fits[0])),
            [f"an image is larger than the limit of {max_pixels} pixels (height x width, from its header):", rows,
             columns]))
        with tf.control_dependencies(checks):
            image = tf.cond(
                kind == 0,
                lambda: tf.switch_case(ratio_index, [
                    lambda ratio=ratio: tf.io.decode_jpeg(encoded, channels=3, ratio=ratio) for ratio in _JPEG_RATIOS]),
                lambda: tf.io.decode_image(encoded, channels=3, expand_animations=False))
        image = tf.cast(image, tf.float32)
        if channels == 1:
            image = tf.image.rgb_to_grayscale(image)
        if keep_aspect_ratio:
            return tf.image.resize_with_pad(image, height, width, antialias=True)
        return tf.image.resize(image, [height, width], antialias=True)

    return tf.map_fn(decode, tf.reshape(image_bytes, [-1]),
                     fn_output_signature=tf.TensorSpec([height, width, channels], tf.float32))


# --- In Python -----------------------------------------------------------------------------------------------------------


def _open_image(data: bytes, where: str, max_pixels: int):
    """Opens and fully decodes encoded bytes with PIL, checking format and size first."""
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():  # PIL's own bomb warning: the max_pixels check below replaces it
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError:
        raise DataError(f"{where}: larger than the limit of {max_pixels} pixels") from None
    except (UnidentifiedImageError, OSError):
        raise DataError(f"{where}: not a {_format_list()} image") from None
    if image.format not in FORMATS:
        raise DataError(f"{where}: a {image.format} image, expected {_format_list()}")
    columns, rows = image.size
    if rows * columns > max_pixels:
        raise DataError(f"{where}: {columns} x {rows} pixels, larger than the limit of {max_pixels} pixels")
    try:
        image.load()
    except (OSError, SyntaxError, ValueError) as error:  # PIL's truncated and corrupt-data errors
        raise DataError(f"{where}: the {image.format} data is truncated or corrupt ({error})") from None
    return image


def _read_bytes(path: str | Path, csv_path: str | Path | None, row: int | None, max_bytes: int) -> tuple[bytes, str]:
    path = Path(path)
    where = name_file(path, csv_path, row, "image")
    if not path.is_file():
        raise DataError(f"{where}: no such image file (expected a {_format_list()} image)")
    if path.stat().st_size == 0:
        raise DataError(f"{where}: the file is empty (expected a {_format_list()} image)")
    if path.stat().st_size > max_bytes:
        raise DataError(f"{where}: {path.stat().st_size} bytes, larger than the limit of {max_bytes} bytes")
    return path.read_bytes(), where


def read_image(path: str | Path, csv_path: str | Path | None = None, row: int | None = None,
               max_bytes: int = MAX_IMAGE_BYTES, max_pixels: int = MAX_IMAGE_PIXELS) -> np.ndarray:
    """Reads an image file as RGB pixels (grayscale and palette expanded, alpha dropped).

    Args:
        path: a JPEG, PNG, GIF or BMP file.
        csv_path: the CSV file that names the image, for messages.
        row: the line of ``csv_path`` that names it (1 is the header), for messages.
        max_bytes: largest accepted file.
        max_pixels: largest accepted width x height, checked before decoding.

    Returns:
        uint8 [height, width, 3].

    Raises:
        DataError: the file is missing, empty, not one of the four formats, truncated,
            corrupt or too large; the message names it (and the CSV line).
    """
    data, where = _read_bytes(path, csv_path, row, max_bytes)
    return np.asarray(_open_image(data, where, max_pixels).convert("RGB"))


def read_image_bytes(path: str | Path, csv_path: str | Path | None = None, row: int | None = None,
                     max_bytes: int = MAX_IMAGE_BYTES, max_pixels: int = MAX_IMAGE_PIXELS) -> bytes:
    """Reads an image file's encoded bytes after checking that they decode (for ``decode_images``).

    Args:
        path, csv_path, row, max_bytes, max_pixels: as for ``read_image``.

    Returns:
        The file's bytes, unchanged.

    Raises:
        DataError: as for ``read_image``.
    """
    data, where = _read_bytes(path, csv_path, row, max_bytes)
    _open_image(data, where, max_pixels)
    return data
