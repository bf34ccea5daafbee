"""Small data sets of the kinds users bring, written in the formats ``--data`` reads.

Each pipeline's ``write_sample_data`` calls one of these with what is particular to its task
(its column names, its words). They make the registry-wide user-path test possible without a
test per pipeline, and they show by example what a user's folder looks like. Everything follows
from a seed; nothing is downloaded.
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Sequence

import numpy as np

#: the made-up words the sample texts use, none of which the embedded data sets hold
NEW_WORDS = ("zeppelin", "quokka", "marimba", "tundra", "origami", "vortex")
#: accented letters the sample transcripts and texts use, outside the embedded corpora's a-z
NEW_CHARACTERS = ("é", "ñ")


def sample_sentences(count: int, seed: int = 0) -> list[str]:
    """Short English sentences, several of them holding ``NEW_WORDS``.

    Args:
        count: how many.
        seed: picks the words.

    Returns:
        ``count`` lower-case sentences of 4-7 words.
    """
    rng = np.random.default_rng(seed)
    subjects = ("the old man", "a small child", "my sister", "the teacher", "our neighbour", "the captain")
    verbs = ("sees", "paints", "finds", "wants", "likes", "carries")
    places = ("near the river", "in the garden", "at the market", "by the sea", "on the hill", "in the city")
    found = []
    for i in range(count):
        thing = NEW_WORDS[i % len(NEW_WORDS)] if i % 2 == 0 else rng.choice(("house", "boat", "tree", "letter"))
        found.append(f"{rng.choice(subjects)} {rng.choice(verbs)} a {thing} {rng.choice(places)}")
    return found


def write_text(path: Path, lines: Sequence[str]) -> Path:
    """A UTF-8 text file of one line per entry (the text pipelines' ``--data any.txt``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_table(path: Path, header: Sequence[str] | None, rows: Sequence[Sequence[object]],
                delimiter: str = ",") -> Path:
    """A CSV (or, with ``delimiter="\\t"``, TSV) file, with a header row unless ``header`` is None."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, delimiter=delimiter)
        if header is not None:
            writer.writerow(header)
        writer.writerows(rows)
    return path


def write_series(path: Path, start: str, step: str, rows: int, columns: dict[str, tuple[float, float, float]],
                 seed: int = 0) -> Path:
    """A time-series CSV: ``timestamp`` plus one column per ``columns`` entry.

    Args:
        path: the CSV to write.
        start: the first timestamp (``"2024-01-01"``).
        step: the sampling interval as pandas reads it (``"30min"``, ``"1h"``).
        rows: how many timestamps.
        columns: name -> ``(level, daily amplitude, noise standard deviation)``; each column is a
            daily sine wave with a weekly modulation, plus Gaussian noise.
        seed: the noise.

    Returns:
        ``path``.
    """
    import pandas as pd

    rng = np.random.default_rng(seed)
    times = pd.date_range(start, periods=rows, freq=step)
    hours = (times - times[0]).total_seconds().to_numpy() / 3600.0
    frame = pd.DataFrame({"timestamp": times.strftime("%Y-%m-%d %H:%M:%S")})
    for name, (level, amplitude, noise) in columns.items():
        weekly = 1.0 + 0.1 * np.sin(2 * np.pi * hours / (24 * 7))
        frame[name] = np.round(level + amplitude * weekly * np.sin(2 * np.pi * hours / 24)
                               + noise * rng.standard_normal(rows), 3)
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False)
    return path


def write_shape_images(folder: Path, count: int, seed: int = 0, size: int = 64) -> tuple[Path, list[Path]]:
    """A captioned image folder: PNG photos of a "temple" or a "flower" in a colour, and ``captions.csv``.

    The words "temple" and "flower" are outside the generated scenes' vocabulary, so a captioning
    model fine-tuned on this folder has to add them.

    Args:
        folder: the folder to fill.
        count: how many images (two captions each).
        seed: the colours and positions.
        size: the image side in pixels.

    Returns:
        ``(captions.csv, the image files)``.
    """
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    colours = {"red": (220, 40, 40), "blue": (40, 80, 220), "green": (40, 170, 60)}
    folder.mkdir(parents=True, exist_ok=True)
    rows, images = [], []
    for i in range(count):
        colour = list(colours)[i % len(colours)]
        kind = "temple" if (i // len(colours)) % 2 == 0 else "flower"
        image = Image.new("RGB", (size, size), (235, 235, 235))
        draw = ImageDraw.Draw(image)
        cx, cy = size * rng.uniform(0.4, 0.6), size * rng.uniform(0.4, 0.6)
        r = size * 0.25
        if kind == "temple":  # a roof on three columns
            draw.polygon([(cx - r, cy - r * 0.3), (cx, cy - r), (cx + r, cy - r * 0.3)], fill=colours[colour])
            for offset in (-0.8, 0.0, 0.8):
                draw.rectangle([cx + offset * r - 2, cy - r * 0.3, cx + offset * r + 2, cy + r], fill=colours[colour])
        else:  # five petals round a centre
            for angle in np.linspace(0, 2 * np.pi, 5, endpoint=False):
                px, py = cx + 0.55 * r * np.cos(angle), cy + 0.55 * r * np.sin(angle)
                draw.ellipse([px - r * 0.4, py - r * 0.4, px + r * 0.4, py + r * 0.4], fill=colours[colour])
            draw.ellipse([cx - r * 0.25, cy - r * 0.25, cx + r * 0.25, cy + r * 0.25], fill=(240, 220, 60))
        path = folder / f"photo_{i:02d}.png"
        image.save(path)
        images.append(path)
        rows += [(path.name, f"a {colour} {kind}"), (path.name, f"a photo of a {colour} {kind}")]
    return write_table(folder / "captions.csv", ("image", "caption"), rows), images


def write_tone_clips(folder: Path, count: int, sample_rate: int, seconds: float, seed: int = 0
                     ) -> tuple[Path, list[Path]]:
    """A tagged audio folder: WAV clips of note sequences and ``tags.csv`` (``path,tags``).

    Each clip is a run of plucked notes, low or high ("dark" or "bright") and slow or fast
    ("calm" or "lively"): four tags the embedded corpus does not have.

    Args:
        folder: the folder to fill.
        count: how many clips.
        sample_rate: of the files.
        seconds: each clip's length.
        seed: the notes.

    Returns:
        ``(tags.csv, the clip files)``.
    """
    import soundfile

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    rows, clips = [], []
    samples = int(seconds * sample_rate)
    for i in range(count):
        high, fast = i % 2 == 0, (i // 2) % 2 == 0
        note_seconds = 0.15 if fast else 0.5
        waveform = np.zeros(samples, np.float32)
        for start in range(0, samples, int(note_seconds * sample_rate)):
            frequency = (880.0 if high else 165.0) * 2 ** (rng.integers(0, 12) / 12)
            t = np.arange(min(int(note_seconds * sample_rate), samples - start)) / sample_rate
            waveform[start: start + t.size] = 0.3 * np.sin(2 * np.pi * frequency * t) * np.exp(-t * 6)
        path = folder / f"clip_{i:02d}.wav"
        soundfile.write(path, waveform, sample_rate, subtype="PCM_16")
        clips.append(path)
        rows.append((path.name, f"{'bright' if high else 'dark'};{'lively' if fast else 'calm'}"))
    return write_table(folder / "tags.csv", ("path", "tags"), rows), clips


def write_spoken_sentences(folder: Path, sentences: Sequence[str], sample_rate: int = 16000
                           ) -> tuple[Path, list[Path]]:
    """A transcribed audio folder: each sentence spoken by espeak-ng into ``wavs/``, and ``metadata.csv``.

    Args:
        folder: the folder to fill.
        sentences: the transcripts (espeak-ng reads UTF-8, accents included).
        sample_rate: of the files.

    Returns:
        ``(metadata.csv with path,transcript rows, the WAV files)``.
    """
    import librosa
    import soundfile

    from seqapps.data.speech import Espeak

    espeak = Espeak.get()
    (folder / "wavs").mkdir(parents=True, exist_ok=True)
    rows, files = [], []
    for i, sentence in enumerate(sentences):
        audio, _ = espeak.synthesize(sentence, "en-us+m3" if i % 2 else "en+f2")
        waveform = librosa.resample(audio.astype(np.float32) / 32768.0, orig_sr=espeak.sample_rate,
                                    target_sr=sample_rate)
        path = folder / "wavs" / f"sentence_{i:02d}.wav"
        soundfile.write(path, waveform, sample_rate, subtype="PCM_16")
        files.append(path)
        rows.append((f"wavs/{path.name}", sentence))
    return write_table(folder / "metadata.csv", ("path", "transcript"), rows), files


def write_digit_folders(folder: Path, per_digit: int, seed: int = 0, size: int = 28) -> list[Path]:
    """An image-classification folder: one sub-folder per digit (``0/`` ... ``9/``) of grey PNG images.

    The digits are scikit-learn's bundled 8x8 digits, upsampled to ``size`` pixels, light ink on
    black as in MNIST.

    Returns:
        The image files, digit by digit.
    """
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(seed)
    files = []
    for digit in range(10):
        chosen = rng.choice(np.flatnonzero(digits.target == digit), per_digit, replace=False)
        (folder / str(digit)).mkdir(parents=True, exist_ok=True)
        for index in chosen:
            ink = (digits.images[index] * (255.0 / 16.0)).astype(np.uint8)
            image = Image.fromarray(ink, mode="L").resize((size, size), Image.BILINEAR)
            path = folder / str(digit) / f"scan_{index:04d}.png"
            image.save(path)
            files.append(path)
    return files
