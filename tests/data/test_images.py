"""Image decoding in the graph (formats, colour conversion, resizing, memory bounds) and file validation."""
import io
import json
import re
import struct
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from seqapps.data.images import (
    MAX_GIF_STEPS,
    MAX_IMAGE_PIXELS,
    MAX_JPEG_SCANS,
    MAX_REQUEST_PIXELS,
    decode_images,
    read_image,
    read_image_bytes,
)
from seqapps.errors import DataError
from seqapps.serving.protocol import tf_error_message
from tests.data.image_bombs import flat_png, gif, progressive_jpeg

RNG = np.random.default_rng(7)
PIXELS = RNG.integers(0, 256, size=(5, 7, 4), dtype=np.uint8)


def encode(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def pil_rgb(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.float32)


LOSSLESS = {
    "png_rgba": encode(Image.fromarray(PIXELS, "RGBA"), "PNG"),
    "png_gray": encode(Image.fromarray(PIXELS[..., 0], "L"), "PNG"),
    "png_palette": encode(Image.fromarray(PIXELS[..., :3]).convert("P"), "PNG"),
    "bmp_rgb": encode(Image.fromarray(PIXELS[..., :3]), "BMP"),
    "gif": encode(Image.fromarray(PIXELS[..., :3]), "GIF"),
}


@pytest.mark.parametrize("name", sorted(LOSSLESS))
def test_lossless_formats_decode_to_the_same_rgb_pixels_as_pil(name):
    # At the image's own size the resize is the identity, so the pixels must equal PIL's RGB conversion exactly
    # (gray and palette expanded, alpha dropped).
    decoded = decode_images(tf.constant([LOSSLESS[name]]), 5, 7).numpy()
    np.testing.assert_array_equal(decoded[0], pil_rgb(LOSSLESS[name]))


def test_jpeg_matches_pil_and_a_batch_mixes_formats_and_sizes():
    jpeg = encode(Image.fromarray(PIXELS[..., :3]), "JPEG", quality=95)
    decoded = decode_images(tf.constant([jpeg]), 5, 7).numpy()[0]
    # Both use libjpeg(-turbo) but may differ in IDCT and chroma upsampling: a few levels of 255 apart at most.
    assert np.abs(decoded - pil_rgb(jpeg)).max() <= 8
    big = encode(Image.fromarray(np.zeros((40, 30, 3), np.uint8)), "PNG")
    batch = decode_images(tf.constant([jpeg, big, LOSSLESS["gif"]]), 16, 12).numpy()
    assert batch.shape == (3, 16, 12, 3) and batch.dtype == np.float32
    assert 0 <= batch.min() and batch.max() <= 255 and np.all(batch[1] == 0)


def test_gray_output_and_aspect_ratio_padding():
    white = encode(Image.new("RGB", (20, 10), (255, 255, 255)), "PNG")  # 20 wide, 10 high
    gray = decode_images(tf.constant([white]), 10, 20, channels=1).numpy()[0]
    np.testing.assert_allclose(gray, 255, atol=0.1)  # luma weights sum to 1 (0.2989 + 0.5870 + 0.1140)
    padded = decode_images(tf.constant([white]), 20, 20, keep_aspect_ratio=True).numpy()[0]
    # Scaled to 20 x 10 and centred: 5 black rows above and below, the image between.
    assert np.all(padded[:5] == 0) and np.all(padded[15:] == 0)
    np.testing.assert_allclose(padded[5:15], 255, atol=0.1)
    stretched = decode_images(tf.constant([white]), 20, 20).numpy()[0]
    np.testing.assert_allclose(stretched, 255, atol=0.1)


@pytest.mark.parametrize("data, limits, message", [
    (b"hello, not an image", {}, "not JPEG, PNG, GIF or BMP"),
    (b"", {}, "not JPEG, PNG, GIF or BMP"),
    (LOSSLESS["bmp_rgb"], {"max_bytes": 100}, "larger than the limit of 100 bytes"),
    (LOSSLESS["png_gray"], {"max_pixels": 34}, "larger than the limit of 34 pixels"),
])
def test_bad_or_oversized_bytes_raise_invalid_argument_before_decoding(data, limits, message):
    decode = tf.function(lambda images: decode_images(images, 4, 4, **limits))
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        decode(tf.constant([data]))


def test_a_jpeg_over_the_pixel_budget_is_decoded_at_a_smaller_scale():
    # 40 x 48 = 1,920 pixels over a budget of 500: 1/2 scale gives 480 pixels, so it is accepted.
    jpeg = encode(Image.new("RGB", (48, 40), (200, 10, 10)), "JPEG", quality=95)
    image = decode_images(tf.constant([jpeg]), 8, 8, max_pixels=500).numpy()[0]
    np.testing.assert_allclose(image.mean(axis=(0, 1)), [200, 10, 10], atol=4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="limit of 20 pixels"):
        decode_images(tf.constant([jpeg]), 8, 8, max_pixels=20)  # 1/8 scale is 5 x 6 = 30 pixels


def png_header_only(width: int, height: int) -> bytes:
    """A PNG signature, a valid IHDR chunk of the given size (8-bit gray) and IEND: a header with no pixels."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


def test_a_40000_by_40000_header_is_refused_in_the_graph_and_in_python(tmp_path):
    # 1.6 gigapixels: PIL itself raises DecompressionBombError for this at open; both paths answer from the header.
    data = png_header_only(40_000, 40_000)
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"limit of {MAX_IMAGE_PIXELS} pixels"):
        decode_images(tf.constant([data]), 8, 8)
    (tmp_path / "bomb.png").write_bytes(data)
    with pytest.raises(DataError, match=f"larger than the limit of {MAX_IMAGE_PIXELS} pixels"):
        read_image(tmp_path / "bomb.png")
    (tmp_path / "big.png").write_bytes(png_header_only(10_000, 10_000))  # PIL only warns: our limit answers
    with pytest.raises(DataError, match="10000 x 10000 pixels, larger than the limit"):
        read_image_bytes(tmp_path / "big.png")


# --- Issue 25: bombs that the header's size does not show --------------------------------------------------------------

LYING_GIFS = {
    "20000x20000 frame on a 64x64 screen": gif((64, 64), [(20_000, 20_000, 1)]),  # 270 kB, 400 megapixels
    "three such frames": gif((64, 64), [(20_000, 20_000, 1)] * 3),
    "a frame past the screen's right edge": gif((64, 64), [(64, 64, 1)], left=16),
}


@pytest.mark.parametrize("name", sorted(LYING_GIFS))
def test_a_gif_frame_outside_its_screen_is_refused_in_the_graph_and_in_python(tmp_path, name):
    decode = tf.function(lambda images: decode_images(images, 8, 8))
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        decode(tf.constant([LYING_GIFS[name]]))
    # The line a server answers with: the frame's size and place, then the screen's, from the header.
    assert re.fullmatch(r"the first frame of a GIF \(width x height at left, top\): \d+ \d+ \d+ 0 does not fit within "
                        r"its screen \(width x height, from its header\): 64 64", tf_error_message(error.value))
    # PIL reads the first frame's size at open (its bomb check or ours refuses it); a frame past the edge widens it.
    (tmp_path / "lying.gif").write_bytes(LYING_GIFS[name])
    for read in (read_image, read_image_bytes):
        with pytest.raises(DataError, match=r"limit of \d+ pixels|does not fit within its screen of 64 x 64") as error:
            read(tmp_path / "lying.gif")
        assert "\n" not in str(error.value)


def test_gifs_decode_to_pils_first_frame_and_later_frames_are_not_decoded(tmp_path):
    frames = [Image.fromarray(RNG.integers(0, 256, (12, 16, 3), dtype=np.uint8)) for _ in range(3)]
    animated = encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50)
    # A second frame outside the screen: only the first frame is decoded (PIL, too, decodes frames on demand);
    # TensorFlow's GIF decoder would decode both at the second one's 3000 x 3000.
    later_bomb = gif((16, 12), [(16, 12, 1), (3000, 3000, 2)])
    for data in (animated, later_bomb, gif((16, 12), [(16, 12, 2)])):
        decoded = decode_images(tf.constant([data]), 12, 16).numpy()[0]
        np.testing.assert_array_equal(decoded, pil_rgb(data))
        (tmp_path / "x.gif").write_bytes(data)
        np.testing.assert_array_equal(read_image(tmp_path / "x.gif"), pil_rgb(data))
    np.testing.assert_array_equal(pil_rgb(later_bomb)[0, 0], [200, 30, 90])  # colour 1 of the table


def test_a_gif_walk_past_its_bound_or_the_bytes_is_refused():
    header = gif((64, 64), [])[:-1] + b"\x2c" + struct.pack("<HHHHB", 0, 0, 64, 64, 0) + b"\x02"
    # Data sub-blocks of alternating sizes (1, 2, 1, ...): one walk step each.
    ragged = header + b"\x01\x00\x02\x00\x00" * MAX_GIF_STEPS + b"\x00;"
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"more than the limit of {MAX_GIF_STEPS} runs"):
        decode_images(tf.constant([ragged]), 8, 8)
    with pytest.raises(tf.errors.InvalidArgumentError, match="truncated or corrupt before its first frame ends"):
        decode_images(tf.constant([gif((64, 64), [(64, 64, 1)])[:40]]), 8, 8)


def test_a_jpeg_of_too_many_scans_is_refused_and_progressive_jpegs_decode_as_pil(tmp_path):
    image = Image.fromarray(RNG.integers(0, 256, (48, 64, 3), dtype=np.uint8))
    progressive = progressive_jpeg(image)
    assert progressive.count(b"\xff\xda") == 10  # libjpeg's script for colour images
    for data in (progressive, progressive_jpeg(image, repeats=MAX_JPEG_SCANS - 10)):  # at the bound
        decoded = decode_images(tf.constant([data]), 48, 64).numpy()[0]
        assert np.abs(decoded - pil_rgb(data)).max() <= 8  # libjpeg(-turbo) IDCT differences
    repeated = progressive_jpeg(image, repeats=MAX_JPEG_SCANS - 9)
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"more than the limit of {MAX_JPEG_SCANS} scans"):
        decode_images(tf.constant([repeated]), 8, 8)
    (tmp_path / "scans.jpg").write_bytes(repeated)
    with pytest.raises(DataError, match=f"{MAX_JPEG_SCANS + 1} scans, more than the limit of {MAX_JPEG_SCANS}$"):
        read_image(tmp_path / "scans.jpg")
    (tmp_path / "ok.jpg").write_bytes(progressive)
    assert read_image(tmp_path / "ok.jpg").shape == (48, 64, 3)


def test_the_pixels_of_a_batch_together_are_bounded_before_decoding():
    pngs = tf.constant([flat_png(64)] * 5)
    assert decode_images(pngs, 4, 4, max_request_pixels=5 * 64 * 64).shape == (5, 4, 4, 3)
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"limit of {5 * 64 * 64 - 1} pixels together"):
        decode_images(pngs, 4, 4, max_request_pixels=5 * 64 * 64 - 1)
    # A JPEG counts at the scale it is decoded at: 48 x 40 over a 500-pixel image budget is 24 x 20 = 480 pixels.
    jpeg = encode(Image.new("RGB", (48, 40)), "JPEG")
    decode_images(tf.constant([jpeg]), 4, 4, max_pixels=500, max_request_pixels=480)
    with pytest.raises(tf.errors.InvalidArgumentError, match="limit of 479 pixels together"):
        decode_images(tf.constant([jpeg]), 4, 4, max_pixels=500, max_request_pixels=479)
    # The default: a few full-size images, refused from their headers (five 4096 x 4096 PNGs of 16 kB each).
    count = MAX_REQUEST_PIXELS // MAX_IMAGE_PIXELS + 1
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"limit of {MAX_REQUEST_PIXELS} pixels together"):
        decode_images(tf.constant([flat_png(4096)] * count), 4, 4)


MEMORY_SCRIPT = textwrap.dedent("""
    import json, resource, sys
    import tensorflow as tf
    from seqapps.data.images import decode_images

    def peak_mb():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    decode = tf.function(lambda images: decode_images(images, 224, 224))
    for warm_up in (tf.io.encode_png(tf.zeros([64, 64, 3], tf.uint8)), tf.io.encode_jpeg(tf.zeros([64, 64, 3], tf.uint8))):
        decode(tf.reshape(warm_up, [1]))
    result = {"baseline": peak_mb()}
    for path in sys.argv[1:]:
        try:
            decode(tf.constant([open(path, "rb").read()]))
            result[path] = {"decoded": True}
        except tf.errors.InvalidArgumentError as error:
            result[path] = {"decoded": False, "message": error.message}
        result[path]["peak_increase_mb"] = peak_mb() - result["baseline"]
    print(json.dumps(result))
""")


@pytest.mark.large
def test_a_10000_by_10000_image_does_not_exhaust_memory(tmp_path):
    # A 10k x 10k image is 300 MB as uint8 RGB and 1.2 GB as float32: decoding it plainly with tf.io.decode_image
    # and resizing raised this machine's peak RSS by ~330 MB. The PNG (97 kB) must be refused from its header; the
    # JPEG is decoded at 1/4 scale (2,500^2 pixels within the default 4,096^2 budget: ~19 MB uint8 + ~75 MB float).
    png, jpeg = tmp_path / "huge.png", tmp_path / "huge.jpg"
    Image.new("L", (10_000, 10_000)).save(png)
    Image.new("L", (10_000, 10_000), 128).save(jpeg, quality=50)
    run = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, str(png), str(jpeg)], capture_output=True, text=True,
                         timeout=300, check=True)
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert not result[str(png)]["decoded"] and f"limit of {MAX_IMAGE_PIXELS} pixels" in result[str(png)]["message"]
    assert result[str(png)]["peak_increase_mb"] < 30
    assert result[str(jpeg)]["decoded"] and result[str(jpeg)]["peak_increase_mb"] < 150


# --- Python-side validation ----------------------------------------------------------------------------------------


def test_read_image_gives_uint8_rgb_and_read_image_bytes_the_file(tmp_path):
    path = tmp_path / "a.png"
    path.write_bytes(LOSSLESS["png_rgba"])
    pixels = read_image(path)
    assert pixels.dtype == np.uint8 and pixels.shape == (5, 7, 3)
    np.testing.assert_array_equal(pixels, PIXELS[..., :3])
    assert read_image_bytes(path) == LOSSLESS["png_rgba"]


@pytest.mark.parametrize("content, message", [
    (None, "no such image file"),
    (b"", "the file is empty"),
    (b"caption,text\n", "not a JPEG, PNG, GIF or BMP image"),
    (LOSSLESS["png_rgba"][:60], "truncated or corrupt"),
    (encode(Image.new("RGB", (4, 4)), "TIFF"), "a TIFF image, expected JPEG, PNG, GIF or BMP"),
    (encode(Image.new("L", (300, 200)), "PNG"), "300 x 200 pixels, larger than the limit of 1000 pixels"),
])
def test_bad_image_files_raise_one_line_data_errors_naming_the_file_and_csv_line(tmp_path, content, message):
    path = tmp_path / "images" / "x.img"
    path.parent.mkdir()
    if content is not None:
        path.write_bytes(content)
    for read in (read_image, read_image_bytes):
        with pytest.raises(DataError, match=message) as error:
            read(path, csv_path="captions.csv", row=3, max_pixels=1000)
        text = str(error.value)
        assert text.startswith(f"captions.csv line 3: image {path}: ") and "\n" not in text
    with pytest.raises(DataError, match=f"^{path}: "):
        read_image(path, max_pixels=1000)
