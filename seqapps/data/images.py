"""Images: bounded in-graph decoding of encoded bytes, and Python-side reading and validation of image files.

In the graph (``decode_images``, for exports and ``tf.data``), a batch of JPEG, PNG,
GIF or BMP bytes becomes float32 RGB pixels (0..255) of one size. Before anything is
decoded, each image's width and height are read from its header (the PNG IHDR chunk,
the GIF screen descriptor, the BMP info header; ``tf.io.extract_jpeg_shape`` for
JPEG), so that a small file that expands to a huge image (a 10,000 x 10,000 PNG is
about 100 kB) is rejected with InvalidArgument instead of exhausting memory. A JPEG
larger than the pixel budget is decoded at 1/2, 1/4 or 1/8 scale by libjpeg's DCT
scaling when that brings it within the budget (photos from large camera sensors).
A GIF's blocks are walked to the end of its first frame, which must lie within the
screen (a 270 kB GIF can declare a 20,000 x 20,000 frame on a 64 x 64 screen), and
only that frame is decoded; a JPEG may have at most ``MAX_JPEG_SCANS`` scans (a
progressive scan repeated thousands of times decodes for minutes); and the batch's
pixels together are bounded (``MAX_REQUEST_PIXELS``), which bounds a request's time.

In Python (``read_image``, ``read_image_bytes``, for training data and ``predict``),
PIL opens the file (PIL reads a GIF's first frame size at open and widens the image to
it); a missing, non-image, truncated or oversized file, a GIF frame outside its screen
or a JPEG of too many scans raises a
``DataError`` of one line naming the file and, when given, the CSV line that names it.
"""
from __future__ import annotations

import io
import struct
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
#: Default pixel budget of one request's images together: decoding is about 0.1-0.6 s per 4096 x 4096 image on
#: a CPU core, and up to 1 s for a progressive JPEG of ``MAX_JPEG_SCANS`` scans (each refinement scan re-reads
#: every block), so the slowest admitted request decodes in a few seconds, within a server's deadline.
MAX_REQUEST_PIXELS = 4 * MAX_IMAGE_PIXELS
#: Full-size images within one request's budget: what ``seqapps predict`` sends an image export per call.
IMAGES_PER_CALL = MAX_REQUEST_PIXELS // MAX_IMAGE_PIXELS
#: Most start-of-scan markers in one JPEG: libjpeg's progressive script (what PIL writes) has 10 for colour and 6
#: for gray, plus one per embedded thumbnail; 24 leaves room for other encoders' scripts. Every scan is decoded
#: over the whole image (about 60 ms per refinement scan of a 4096 x 4096 photo on one busy core), so a scan
#: repeated 6,000 times decoded for a minute.
MAX_JPEG_SCANS = 24
#: Most steps of the walk through a GIF's blocks to the end of its first frame (each step is one block or one run
#: of equal data sub-blocks; a file PIL or giflib writes takes a few steps per extension and frame).
MAX_GIF_STEPS = 64
_GIF_RUN = 4096
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


def _gif_first_frame(encoded: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Walks a GIF's blocks to the end of its first frame, reading every declared size on the way.

    The walk starts after the header, logical screen descriptor and global colour table; each
    step then passes one block introducer (an extension, or the first image descriptor with
    its local colour table and LZW code size byte) or one run of up to ``_GIF_RUN`` data
    sub-blocks of the same size (encoders write full 255-byte sub-blocks, so a frame's data
    is a few steps). At most ``MAX_GIF_STEPS`` steps are taken.

    Args:
        encoded: scalar string, GIF bytes.

    Returns:
        (state, end, frame): state 0 when the first frame's data ends within the bytes, 1 when the
        walk needed more than ``MAX_GIF_STEPS`` steps, 2 when the bytes end, or a block is neither
        an extension nor an image, first; ``end`` the offset just past the first frame's data;
        ``frame`` its declared [left, top, width, height].
    """
    import tensorflow as tf

    length = tf.strings.length(encoded)
    data = tf.io.decode_raw(tf.strings.join([encoded, tf.constant(b"\0" * 16)]), tf.uint8)

    def byte(offset: tf.Tensor) -> tf.Tensor:
        return tf.cast(tf.gather(data, tf.clip_by_value(offset, 0, length + 15)), tf.int32)

    def u16(offset: tf.Tensor) -> tf.Tensor:
        return byte(offset) + 256 * byte(offset + 1)

    def table(packed: tf.Tensor) -> tf.Tensor:
        """Bytes of the colour table a packed field declares (3 x 2^(size + 1) when its flag is set)."""
        return tf.where(packed >= 128, 3 * tf.bitwise.left_shift(tf.constant(2), packed % 8), 0)

    # Phases: 0 at a block, 1 in an extension's sub-blocks, 2 in the first frame's sub-blocks, 3 past its data,
    # 4 at something that is neither an extension nor an image (a trailer or corrupt bytes).
    def step(offset, phase, steps, frame):
        at = byte(offset)
        descriptor = tf.stack([u16(offset + 1), u16(offset + 3), u16(offset + 5), u16(offset + 7)])
        block_offset = tf.where(at == 0x21, offset + 2, offset + 11 + table(byte(offset + 9)))
        block_phase = tf.where(at == 0x21, 1, tf.where(at == 0x2C, 2, 4))
        # A run of sub-blocks of this one's size: its length is the first that differs (or _GIF_RUN).
        same = byte(offset + (at + 1) * tf.range(_GIF_RUN)) == at
        run = tf.where(tf.reduce_all(same), _GIF_RUN, tf.argmin(tf.cast(same, tf.int32), output_type=tf.int32))
        sub_offset = tf.where(at == 0, offset + 1, offset + (at + 1) * run)
        sub_phase = tf.where(at == 0, tf.where(phase == 1, 0, 3), phase)
        return (tf.where(phase == 0, block_offset, sub_offset), tf.where(phase == 0, block_phase, sub_phase),
                steps + 1, tf.where(tf.logical_and(phase == 0, at == 0x2C), descriptor, frame))

    offset, phase, steps, frame = tf.while_loop(
        lambda offset, phase, steps, frame: tf.logical_and(phase < 3, offset < length),
        step, (13 + table(byte(10)), tf.constant(0), tf.constant(0), tf.zeros([4], tf.int32)),
        maximum_iterations=MAX_GIF_STEPS)
    state = tf.where(phase == 3, 0, tf.where(tf.logical_and(phase < 3, steps >= MAX_GIF_STEPS), 1, 2))
    return state, offset, frame


def _jpeg_scans(encoded: tf.Tensor) -> tf.Tensor:
    """Start-of-scan markers (0xFF 0xDA) in JPEG bytes: entropy-coded data stuffs every 0xFF with 0x00, so
    each is a scan (or, rarely, bytes inside a metadata segment, such as an embedded thumbnail's scans)."""
    import tensorflow as tf

    data = tf.io.decode_raw(tf.strings.join([encoded, tf.constant(b"\0")]), tf.uint8)
    return tf.math.count_nonzero(tf.logical_and(data[:-1] == 0xFF, data[1:] == 0xDA), dtype=tf.int32)


def decode_images(
    image_bytes: tf.Tensor,
    height: int,
    width: int,
    channels: int = 3,
    keep_aspect_ratio: bool = False,
    max_bytes: int = MAX_IMAGE_BYTES,
    max_pixels: int = MAX_IMAGE_PIXELS,
    max_request_pixels: int | None = MAX_REQUEST_PIXELS,
) -> tf.Tensor:
    """Decodes and resizes a batch of encoded images inside a TensorFlow graph, with bounded memory and time.

    Grayscale and palette images are expanded to RGB; the alpha channel of RGBA images
    is dropped (not composited). An animated GIF gives its first frame: the bytes after
    its data are not decoded. Resizing is bilinear with antialiasing; with
    ``keep_aspect_ratio`` the image is scaled to fit and centred on a zero (black) canvas
    (``tf.image.resize_with_pad``), otherwise it is stretched to ``height`` x ``width``.

    Every image's header is read before any is decoded: its size, a GIF's first frame
    (which must lie within the GIF's screen, and whose blocks are walked to at most
    ``MAX_GIF_STEPS`` steps) and a JPEG's number of scans (at most ``MAX_JPEG_SCANS``).

    Args:
        image_bytes: string tensor [batch] of JPEG, PNG, GIF or BMP bytes.
        height, width: output size in pixels.
        channels: 3 for RGB, 1 for luma (ITU-R 601 weights, ``tf.image.rgb_to_grayscale``).
        keep_aspect_ratio: pad instead of stretching.
        max_bytes: longest accepted encoded image.
        max_pixels: largest accepted height x width; read from the header before decoding
            (a larger JPEG is decoded at the smallest of 1/2, 1/4, 1/8 scale that fits).
        max_request_pixels: most pixels decoded for the whole batch (JPEGs at their decoding
            scale), which bounds a request's decoding time; ``None`` for no bound (reading a
            training set in chunks).

    Returns:
        float32 [batch, height, width, channels] in 0..255.

    Raises:
        tf.errors.InvalidArgumentError (when run): bytes that are not one of the four
            formats, over ``max_bytes``, over ``max_pixels`` or corrupt, a GIF frame outside
            its screen, a JPEG of too many scans, a batch over ``max_request_pixels``.
    """
    import tensorflow as tf

    if channels not in (1, 3):
        raise ValueError(f"channels={channels}: expected 1 (gray) or 3 (RGB)")

    def inspect(encoded: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
        """(format index, JPEG ratio index, decoded pixels, bytes to decode) of one image, after its checks."""
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
            scans = tf.cond(kind == 0, lambda: _jpeg_scans(encoded), lambda: tf.constant(0))
            state, end, frame = tf.cond(kind == 2, lambda: _gif_first_frame(encoded),
                                        lambda: (tf.constant(0), tf.strings.length(encoded), tf.zeros([4], tf.int32)))
        is_gif = kind == 2
        frame = tf.cast(frame, tf.int64)
        checks = [
            tf.debugging.Assert(scans <= MAX_JPEG_SCANS, [
                f"a progressive JPEG has more than the limit of {MAX_JPEG_SCANS} scans:", scans]),
            tf.debugging.Assert(state != 1, [
                "the blocks of a GIF before the end of its first frame vary in size more than the limit of "
                f"{MAX_GIF_STEPS} runs (an encoder writes equal blocks)"]),
            tf.debugging.Assert(state != 2, ["the GIF data is truncated or corrupt before its first frame ends"]),
            tf.debugging.Assert(tf.logical_or(tf.logical_not(is_gif), tf.logical_and(
                frame[0] + frame[2] <= columns, frame[1] + frame[3] <= rows)), [
                "the first frame of a GIF (width x height at left, top):", frame[2], frame[3], frame[0], frame[1],
                "does not fit within its screen (width x height, from its header):", columns, rows])]
        with tf.control_dependencies(checks):
            to_decode = tf.where(is_gif, tf.strings.join([tf.strings.substr(encoded, 0, end), ";"]), encoded)
            return kind, ratio_index, tf.gather(tf.stack(scaled), ratio_index), to_decode

    def decode(inspected: tuple[tf.Tensor, tf.Tensor, tf.Tensor]) -> tf.Tensor:
        encoded, kind, ratio_index = inspected
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

    kinds, ratio_indices, pixels, to_decode = tf.map_fn(
        inspect, tf.reshape(image_bytes, [-1]),
        fn_output_signature=(tf.int32, tf.int32, tf.int64, tf.string))
    checks = []
    if max_request_pixels is not None:
        checks.append(tf.debugging.Assert(tf.reduce_sum(pixels) <= max_request_pixels, [
            f"the images of one request are larger than the limit of {max_request_pixels} pixels together "
            "(height x width from their headers; send fewer or smaller images):", tf.reduce_sum(pixels)]))
    with tf.control_dependencies(checks):
        return tf.map_fn(decode, (tf.identity(to_decode), kinds, ratio_indices),
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
    screen = struct.unpack("<HH", data[6:10]) if image.format == "GIF" else image.size
    if image.size != screen:  # PIL widens a GIF to a first frame outside its screen; decode_images refuses it
        raise DataError(f"{where}: the first frame of the GIF does not fit within its screen of {screen[0]} x "
                        f"{screen[1]} pixels (from its header)")
    scans = data.count(b"\xff\xda") if image.format == "JPEG" else 0
    if scans > MAX_JPEG_SCANS:
        raise DataError(f"{where}: a progressive JPEG of {scans} scans, more than the limit of {MAX_JPEG_SCANS}")
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
