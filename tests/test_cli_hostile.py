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
