"""Hostile images the tests build byte by byte (issue 25): GIFs whose frames lie about their size, JPEGs whose
last progressive scan repeats, and the PNGs of a request too large to decode in time."""
from __future__ import annotations

import io
import struct

from PIL import Image

#: The GIFs' global colour table: index 1 is the colour a frame is filled with.
GIF_COLOURS = ((0, 0, 0), (200, 30, 90), (0, 0, 255), (255, 255, 255))


def constant_lzw(pixels: int, colour: int) -> bytes:
    """GIF LZW data (2-bit code size) of ``pixels`` copies of one colour index.

    After each clear code the k-th code stands for a run of k pixels, so 400 million pixels take
    about 270 kB: a clear code is written whenever the 12-bit code table is full.
    """
    clear = 4
    end = clear + 1
    out, bits, count = bytearray(), 0, 0

    def emit(code: int, width: int) -> None:
        nonlocal bits, count
        bits |= code << count
        count += width
        while count >= 8:
            out.append(bits & 0xFF)
            bits >>= 8
            count -= 8

    width, run, left = 3, 1, pixels
    emit(clear, width)
    while left:
        taken = min(run, left)
        emit(colour if taken == 1 else end + taken - 1, width)
        left -= taken
        if end + run >= 1 << width and width < 12:  # the code just added needs one more bit
            width += 1
        if end + run >= 4095:
            emit(clear, width)
            width, run = 3, 1
        else:
            run += 1
    emit(end, width)
    if count:
        out.append(bits)
    return bytes(out)


def gif(screen: tuple[int, int], frames: list[tuple[int, int, int]], left: int = 0) -> bytes:
    """A GIF89a of a ``screen`` (width, height) and frames of (width, height, colour index) at (``left``, 0),
    each filled with its colour, in 255-byte data sub-blocks as encoders write them."""
    out = b"GIF89a" + struct.pack("<HHBBB", *screen, 0x81, 0, 0) + b"".join(bytes(c) for c in GIF_COLOURS)
    for width, height, colour in frames:
        data = constant_lzw(width * height, colour)
        blocks = b"".join(bytes([len(data[i:i + 255])]) + data[i:i + 255] for i in range(0, len(data), 255))
        out += b"\x2c" + struct.pack("<HHHHB", left, 0, width, height, 0) + b"\x02" + blocks + b"\0"
    return out + b";"


def progressive_jpeg(image: Image.Image, repeats: int = 0) -> bytes:
    """``image`` as a progressive JPEG (PIL's, libjpeg's scan script), its last scan written ``repeats`` more times."""
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", progressive=True, quality=90)
    data = buffer.getvalue()
    last_scan = data[data.rindex(b"\xff\xda"):-2]  # to the end-of-image marker
    return data[:-2] + last_scan * repeats + data[-2:]


def flat_png(size: int) -> bytes:
    """A black ``size`` x ``size`` gray PNG (small on disk, ``size``^2 pixels decoded)."""
    buffer = io.BytesIO()
    Image.new("L", (size, size)).save(buffer, "PNG")
    return buffer.getvalue()
