"""Issue 25, items 9, 11 and 12: hostile command-line inputs to ``seqapps predict`` exit 2 with one stderr line."""
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile


def _predict(*args: str | bytes) -> tuple[int, list[str]]:
    """Runs ``seqapps predict ARGS`` as a person does; returns the exit code and the stderr lines."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", "import sys; from seqapps import cli; sys.exit(cli.main())",
                           "predict", *args], capture_output=True, env=env, timeout=300)
    return done.returncode, done.stderr.decode("utf-8", "replace").splitlines()


def test_rate_zero_wav_is_one_line(tiny_exports: dict, tmp_path: Path) -> None:
    path = tmp_path / "rate0.wav"
    soundfile.write(path, np.zeros(8000, np.float32), 8000, subtype="PCM_16")
    header = bytearray(path.read_bytes())
    header[24:32] = struct.pack("<II", 0, 0)  # sample rate and byte rate
    path.write_bytes(bytes(header))
    code, lines = _predict(tiny_exports["speech_recognition"]["export"], str(path))
    assert code == 2 and len(lines) == 1, lines
    assert "rate0.wav" in lines[0] and "sample rate of 0 Hz" in lines[0]


@pytest.mark.parametrize("name", ["translation", "text_generation"])
def test_non_utf8_argument_is_one_line(tiny_exports: dict, name: str) -> None:
    code, lines = _predict(tiny_exports[name]["export"], b"ab\xff\xfe")
    assert code == 2 and len(lines) == 1, lines
    assert "b'ab\\xff\\xfe'" in lines[0] and "not UTF-8 text" in lines[0]


@pytest.mark.parametrize("value, expected", [("length=1000000000", "at most"), ("length=99999999999", "at most"),
                                             ("top_k=99999999999", "int32"),
                                             ("temperature=1.0e+400", "finite")])
def test_huge_set_value_is_one_line(tiny_exports: dict, value: str, expected: str) -> None:
    code, lines = _predict(tiny_exports["text_generation"]["export"], "hi", "--set", value)
    assert code == 2 and len(lines) == 1, lines
    assert value in lines[0] and expected in lines[0]


def test_image_bombs_through_predict_are_one_line_and_many_large_images_are_answered(tiny_exports: dict, tmp_path: Path) -> None:
    from seqapps.data.images import MAX_IMAGE_PIXELS, MAX_REQUEST_PIXELS
    from tests.data.image_bombs import flat_png, gif

    lying = tmp_path / "lying.gif"
    lying.write_bytes(gif((64, 64), [(64, 64, 1)], left=16))  # PIL widens it to 80 x 64; the graph refuses it
    code, lines = _predict(tiny_exports["pixel_mnist"]["export"], str(lying))
    assert code == 2 and len(lines) == 1, lines
    assert "lying.gif" in lines[0] and "does not fit within its screen of 64 x 64 pixels" in lines[0]
    # Each image within every bound, together over the pixels the export decodes in one call: predict sends
    # them a few at a time, and every file gets its answer (black digits: all the same).
    paths = [tmp_path / f"{index}.png" for index in range(MAX_REQUEST_PIXELS // MAX_IMAGE_PIXELS + 1)]
    for path in paths:
        path.write_bytes(flat_png(4096))
    done = subprocess.run([sys.executable, "-m", "seqapps.cli", "predict", tiny_exports["pixel_mnist"]["export"],
                           *map(str, paths)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr
    answers = [line for line in done.stdout.splitlines() if line.strip()]
    assert len(answers) >= len(paths), done.stdout
