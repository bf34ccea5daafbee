"""Spoken sentences: an espeak-ng corpus generator and the reader of a user's transcribed audio.

The generated corpus (the default data of ``speech_recognition``) is made by the
espeak-ng synthesiser that the pip wheel ``espeakng-loader`` bundles (GPL-3+),
driven through ctypes. Each utterance is one sentence from an offline English text
(``seqapps.data.text``), spoken by an English accent with a voice variant, a rate
and a pitch drawn from a seeded generator, then padded with silence, given a light
synthetic reverberation and noise, and resampled to 16 kHz. Whole voice variants
are held out: the validation and test splits are spoken by variants that training
never hears, and by sentences that training never reads. The corpus is written
once into the data cache (``$SEQAPPS_DATA``, default ``~/.cache/seqapps``) as the
layout a user's data has (``wavs/*.wav`` and ``metadata.csv``), plus ``words.json``
with each word's start and end from espeak-ng's word events.

User data: a folder of audio files and a CSV with a header holding the columns
``path`` (relative to the folder) and ``transcript`` (Common Voice's ``sentence``
and ``text`` are accepted too), comma, tab or ``|`` separated. LJSpeech's
header-less ``metadata.csv`` (``id|text|normalized text``, audio in ``wavs/id.wav``)
is read as it is.

Transcripts are normalised (``normalize_transcript``): lower case, Unicode NFKC,
runs of white space become one space. Characters outside the model's character set
are an error that lists them (``oov="error"``, the default), or are deleted
(``oov="drop"``), a policy the caller documents.
"""
from __future__ import annotations

import collections
import csv
import ctypes
import dataclasses
import hashlib
import io
import json
import re
import subprocess
import sys
import threading
import unicodedata
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from seqapps.data.files import build_folder_atomically, data_home
from seqapps.errors import DataError

SAMPLE_RATE = 16000
GENERATOR_VERSION = 1  # bump when the generator's output changes, so cached corpora are rebuilt
ACCENTS = ("en-us", "en", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-us-nyc", "en-gb-x-gbclan",
           "en-gb-x-gbcwmd")
#: Voice variants (speakers) per split: validation and test variants are never heard in training.
VARIANTS = {
    "train": ("m1", "m2", "m4", "m5", "m6", "f1", "f3", "f4", "klatt", "klatt3", "iven", "john", "max",
              "paul", "robert", "steph", "linda", "adam", "Andy", "rob"),
    "val": ("m7", "f5", "travis"),
    "test": ("m3", "f2", "quincy", "benjamin"),
}
OOV_POLICIES = ("error", "drop")
SPOKEN_CHARS = " 'abcdefghijklmnopqrstuvwxyz"  # every character a generated transcript may hold
TRANSCRIPT_COLUMNS = ("transcript", "sentence", "text")

_RATE, _PITCH, _RANGE = 1, 3, 4  # espeak_PARAMETER values
_SYNCHRONOUS, _CHARS_UTF8, _WORD_EVENT = 2, 1, 1
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)*")
_CLAUSE_BREAK = re.compile(r"[,;:.!?()\[\]{}]+|\s[-\u2013\u2014]+\s|--")
_QUOTES = re.compile("[\"`\u201c\u201d\u2018]|(?<![a-z])'|'(?![a-z])")
_SPACES = re.compile(r"\s+")


def normalize_transcript(text: str) -> str:
    """Lower case, NFKC, single spaces, stripped: the form transcripts are compared and trained in."""
    return _SPACES.sub(" ", unicodedata.normalize("NFKC", text).lower()).strip()


def spoken_sentences(lines: Iterable[str], min_words: int = 3, max_words: int = 10,
                     vocabulary_size: int | None = 2000) -> list[str]:
    """Clauses of a text that a synthesiser reads as they are written.

    Lines are cut at punctuation into clauses; a clause is kept when, after lower-casing
    and removing quotation marks, it is only words of letters (an inner apostrophe
    allowed), it has ``min_words`` to ``max_words`` words, and every word is among the
    text's ``vocabulary_size`` most frequent (which leaves out most rare names, which
    the synthesiser's letter-to-sound rules guess at). Digits, symbols and code never
    pass, so the transcript says what the audio says.

    Args:
        lines: the text, one verse or paragraph per line.
        min_words, max_words: the length range of a kept clause.
        vocabulary_size: how many of the most frequent words are allowed (None: all).

    Returns:
        Distinct clauses in order of first occurrence, words separated by one space.
    """
    clauses = []
    for line in lines:
        for part in _CLAUSE_BREAK.split(line.lower().replace("\u2019", "'")):
            words = _QUOTES.sub(" ", part).split()
            if min_words <= len(words) <= max_words and all(_WORD.fullmatch(word) for word in words):
                clauses.append(words)
    counts = collections.Counter(word for words in clauses for word in words)
    allowed = {word for word, _ in counts.most_common(vocabulary_size)}
    kept = (" ".join(words) for words in clauses if all(word in allowed for word in words))
    return list(dict.fromkeys(kept))


# --- espeak-ng through ctypes ---------------------------------------------------------------------

class _Event(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("unique_identifier", ctypes.c_uint), ("text_position", ctypes.c_int),
                ("length", ctypes.c_int), ("audio_position", ctypes.c_int), ("sample", ctypes.c_int),
                ("user_data", ctypes.c_void_p), ("id", ctypes.c_void_p)]


_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event))


class Espeak:
    """The espeak-ng library of the ``espeakng-loader`` wheel, one synthesis at a time.

    espeak-ng keeps global state, so there is one instance per process (``Espeak.get()``)
    and a lock around each synthesis.
    """

    _instance: "Espeak | None" = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        try:
            import espeakng_loader
        except ImportError:
            raise DataError("the generated speech corpus needs the pip package espeakng-loader: "
                            "run `pip install espeakng-loader`, or pass --data your_audio/") from None
        self._lib = ctypes.CDLL(espeakng_loader.get_library_path())
        self._lib.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int,
                                           ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
        self._lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        self.sample_rate = self._lib.espeak_Initialize(_SYNCHRONOUS, 0, espeakng_loader.get_data_path().encode(), 0)
        if self.sample_rate <= 0:
            raise DataError(f"espeak-ng failed to start (espeak_Initialize returned {self.sample_rate})")
        self._chunks: list[np.ndarray] = []
        self._events: list[tuple[int, int, int]] = []
        self._callback = _CALLBACK(self._receive)  # kept referenced: the library calls it
        self._lib.espeak_SetSynthCallback(self._callback)

    @classmethod
    def get(cls) -> "Espeak":
        """The process's instance, started on first use."""
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def _receive(self, wav: ctypes.POINTER(ctypes.c_short), count: int, events: ctypes.POINTER(_Event)) -> int:
        if count > 0:
            self._chunks.append(np.ctypeslib.as_array(wav, (count,)).copy())
        i = 0
        while events[i].type != 0:
            if events[i].type == _WORD_EVENT:
                self._events.append((events[i].text_position - 1, events[i].length, events[i].sample))
            i += 1
        return 0

    def synthesize(self, text: str, voice: str, rate: int = 175, pitch: int = 50,
                   pitch_range: int = 50) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """Speaks ASCII text.

        Args:
            text: the words to say.
            voice: an espeak-ng voice name, ``accent+variant`` (``"en-us+f3"``).
            rate: words per minute (80-450).
            pitch, pitch_range: 0-100.

        Returns:
            ``(audio, onsets)``: int16 samples at ``sample_rate``, and ``(character offset,
            sample)`` of each word event. Short words may share their neighbour's event.

        Raises:
            DataError: espeak-ng does not know the voice.
        """
        with self._lock:
            if self._lib.espeak_SetVoiceByName(voice.encode()) != 0:
                raise DataError(f"espeak-ng has no voice {voice!r}")
            for parameter, value in ((_RATE, rate), (_PITCH, pitch), (_RANGE, pitch_range)):
                self._lib.espeak_SetParameter(parameter, int(value), 0)
            self._chunks, self._events = [], []
            data = text.encode("utf-8")
            self._lib.espeak_Synth(data, len(data) + 1, 0, 0, 0, _CHARS_UTF8, None, None)
            self._lib.espeak_Synchronize()
            audio = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.int16)
            return audio, [(position, sample) for position, _, sample in self._events]


def word_spans(text: str, onsets: Sequence[tuple[int, int]], speech_start: int,
               speech_end: int) -> list[tuple[str, int, int]]:
    """Groups a sentence's words by espeak-ng's word events, with start and end samples.

    A word without its own event joins the group of the word before it (espeak-ng gives
    "in the" one event). The first group starts at ``speech_start`` (espeak-ng puts its
    event at sample 0, before the audio's leading silence); a group ends where the next
    one starts; the last ends at ``speech_end``.

    Args:
        text: the spoken sentence.
        onsets: ``(character offset, sample)`` of each word event.
        speech_start, speech_end: the samples where the sound starts and ends.

    Returns:
        ``(words, start, end)`` per group, in order.
    """
    starts = dict(onsets)
    groups: list[list] = []
    for match in re.finditer(r"\S+", text):
        if match.start() in starts or not groups:
            groups.append([match.group(), min(max(starts.get(match.start(), 0), speech_start), speech_end)])
        else:
            groups[-1][0] += " " + match.group()
    ends = [start for _, start in groups[1:]] + [speech_end]
    return [(words, start, end) for (words, start), end in zip(groups, ends)]


# --- the generated corpus -------------------------------------------------------------------------

@dataclasses.dataclass
class CorpusSpec:
    """What a generated corpus holds; its hash names the cache folder.

    Attributes:
        source: the sentence text ("pydoc" or "kjv").
        sizes: utterances per split, ``{"train", "val", "test"}``.
        seed: the seed of every random choice.
        min_words, max_words, vocabulary_size: the sentence filter (``spoken_sentences``).
    """

    source: str
    sizes: dict[str, int]
    seed: int = 0
    min_words: int = 3
    max_words: int = 10
    vocabulary_size: int | None = 2000

    def key(self) -> str:
        """A short hash of the spec and the generator version."""
        text = json.dumps({**dataclasses.asdict(self), "version": GENERATOR_VERSION}, sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:12]


def _augment(audio: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, int, dict[str, float]]:
    """Pads with silence, adds reverberation and noise, and resamples int16 22,050 Hz audio to 16 kHz.

    Returns:
        ``(float32 audio at 16 kHz, leading pad in input samples, the drawn settings)``.
    """
    from scipy import signal

    rate_in = Espeak.get().sample_rate
    lead, trail = (int(rng.uniform(0.05, 0.35) * rate_in) for _ in range(2))
    dry = np.concatenate([np.zeros(lead), audio.astype(np.float64) / 32768.0, np.zeros(trail)])
    rt60, wet = rng.uniform(0.1, 0.4), rng.uniform(0.05, 0.25)
    t = np.arange(int(rt60 * rate_in)) / rate_in
    impulse = rng.standard_normal(t.size) * np.exp(-6.9 * t / rt60)
    impulse /= np.sqrt(np.sum(impulse ** 2))
    mixed = dry + wet * signal.fftconvolve(dry, impulse)[: dry.size]
    resampled = signal.resample_poly(mixed, SAMPLE_RATE, rate_in)
    snr_db = rng.uniform(12.0, 35.0)
    power = np.mean(resampled ** 2)
    noisy = resampled + rng.standard_normal(resampled.size) * np.sqrt(power / 10 ** (snr_db / 10))
    noisy *= rng.uniform(0.3, 0.9) / max(np.max(np.abs(noisy)), 1e-9)
    settings = {"rt60": round(rt60, 3), "wet": round(wet, 3), "snr_db": round(snr_db, 1)}
    return noisy.astype(np.float32), lead, settings


def generate_corpus(root: Path, sentences: dict[str, list[str]], sizes: dict[str, int], seed: int) -> None:
    """Writes a spoken corpus: ``wavs/``, ``metadata.csv`` and ``words.json`` under ``root``.

    espeak-ng carries hidden state from one synthesis to the next (the same call gives
    durations a few milliseconds apart), which no re-initialisation resets; its output
    is a fixed function of the calls made since the process started. So the audio is
    reproducible when this runs in a fresh process, as ``espeak_corpus`` does.

    Args:
        root: an empty or new folder.
        sentences: the sentences of each split (cycled when a split asks for more).
        sizes: utterances per split.
        seed: the seed of the voices, rates, pitches, padding, reverberation and noise.
    """
    import soundfile

    espeak = Espeak.get()
    (root / "wavs").mkdir(parents=True, exist_ok=True)
    rows, words = [], {}
    for number, split in enumerate(("train", "val", "test")):
        order = np.random.default_rng([seed, number]).permutation(len(sentences[split]))
        for i in range(sizes[split]):
            rng = np.random.default_rng([seed, number, i])
            text = sentences[split][order[i % len(order)]]
            voice = f"{rng.choice(ACCENTS)}+{rng.choice(VARIANTS[split])}"
            rate, pitch, pitch_range = int(rng.integers(130, 211)), int(rng.integers(25, 76)), int(rng.integers(30, 81))
            audio, onsets = espeak.synthesize(text, voice, rate, pitch, pitch_range)
            loud = np.flatnonzero(np.abs(audio) > 300)  # of 32,768: -41 dBFS, above espeak-ng's silences
            speech = (int(loud[0]), int(loud[-1]) + 1) if loud.size else (0, audio.size)
            waveform, lead, settings = _augment(audio, rng)
            scale = SAMPLE_RATE / espeak.sample_rate
            path = f"wavs/{split}_{i:05d}.wav"
            soundfile.write(root / path, waveform, SAMPLE_RATE, subtype="PCM_16")
            words[path] = [[group, round((lead + start) * scale / SAMPLE_RATE, 3),
                            round((lead + end) * scale / SAMPLE_RATE, 3)]
                           for group, start, end in word_spans(text, onsets, *speech)]
            rows.append({"path": path, "transcript": text, "split": split, "voice": voice, "rate": rate,
                         "pitch": pitch, **settings})
    with open(root / "metadata.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (root / "words.json").write_text(json.dumps(words), encoding="utf-8")


def espeak_corpus(spec: CorpusSpec, lines: Callable[[], list[str]]) -> Path:
    """The cached corpus of ``spec``, generated on first use (atomically: a crash leaves nothing).

    Args:
        spec: sizes, seed and sentence filter.
        lines: returns the text lines the sentences come from (called only when generating).

    Returns:
        The corpus folder, ``$SEQAPPS_DATA/speech/<source>-<hash>``.

    Raises:
        DataError: the text yields too few sentences for a split.
    """
    final = data_home() / "speech" / f"{spec.source}-{spec.key()}"
    if (final / "metadata.csv").is_file():
        return final
    sentences = spoken_sentences(lines(), spec.min_words, spec.max_words, spec.vocabulary_size)
    order = np.random.default_rng(spec.seed).permutation(len(sentences))
    total = sum(spec.sizes.values())
    parts, start = {}, 0
    for split in ("train", "val", "test"):  # disjoint sentences, in shares of the requested sizes
        count = max(1, round(len(sentences) * spec.sizes[split] / total))
        parts[split] = [sentences[i] for i in order[start:start + count]]
        start += count
    if len(sentences) < 3 or not all(parts.values()):
        raise DataError(f"the {spec.source} text gives only {len(sentences)} speakable sentences of "
                        f"{spec.min_words}-{spec.max_words} words; widen the word range or the vocabulary")
    def build(folder: Path) -> None:
        (folder / "sentences.json").write_text(json.dumps({"sentences": parts, "sizes": spec.sizes,
                                                           "seed": spec.seed}), encoding="utf-8")
        done = subprocess.run([sys.executable, "-m", "seqapps.data.speech", str(folder)], capture_output=True,
                              text=True, check=False)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise DataError(f"generating the spoken corpus in {final} failed: {last}")

    return build_folder_atomically(final, build)


# --- transcribed audio: the generated corpus and the user's ---------------------------------------

@dataclasses.dataclass
class Utterance:
    """One row of a transcript table.

    Attributes:
        path: the audio file.
        transcript: the normalised transcript.
        csv_path: the table naming it.
        line: the table's line that names it (1 is the first line).
        split: the split a generated corpus assigns (None for user data).
        speaker: the voice variant that speaks it in a generated corpus (``VARIANTS``; None for user data).
    """

    path: Path
    transcript: str
    csv_path: Path
    line: int
    split: str | None = None
    speaker: str | None = None

    @property
    def where(self) -> str:
        """``"table line N"``, for messages."""
        return f"{self.csv_path} line {self.line}"


def _table_rows(csv_path: Path) -> list[list[str]]:
    """Reads a UTF-8 table separated by ``|``, tabs or commas (the first the header line holds)."""
    if not csv_path.is_file():
        raise DataError(f"{csv_path}: transcript file not found; give a CSV with columns path,transcript "
                        "(--set csv=NAME inside the --data folder)")
    try:
        text = csv_path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise DataError(f"{csv_path}: byte {error.start} is not UTF-8 text; save the table as UTF-8") from None
    if not text.strip():
        raise DataError(f"{csv_path}: the file is empty, expected a header path,transcript and one row per clip")
    first = text.splitlines()[0]
    delimiter = next((d for d in "|\t" if d in first), ",")
    quoting = csv.QUOTE_NONE if delimiter == "|" else csv.QUOTE_MINIMAL  # LJSpeech has bare quotes
    return list(csv.reader(io.StringIO(text), delimiter=delimiter, quoting=quoting))


def read_transcripts(folder: str | Path, csv_name: str = "metadata.csv") -> list[Utterance]:
    """Reads a folder of audio files and its transcript table (LJSpeech / Common Voice layout).

    Args:
        folder: the data folder.
        csv_name: the table inside it (or an absolute path): a header with ``path`` and
            ``transcript`` (or ``sentence``/``text``), or LJSpeech's ``id|text|normalized``.

    Returns:
        One utterance per row, transcripts normalised, in file order.

    Raises:
        DataError: a missing table or column, an empty cell, or a path that is not a file
            (naming the table and row).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"{folder}: not a folder; --data takes a folder of audio files with a transcript CSV")
    csv_path = folder / csv_name
    rows = _table_rows(csv_path)
    header = [cell.strip().lower() for cell in rows[0]]
    if "path" in header:
        path_column = header.index("path")
        columns = [name for name in TRANSCRIPT_COLUMNS if name in header]
        if not columns:
            raise DataError(f"{csv_path}: no transcript column; expected a header with path and one of "
                            f"{', '.join(TRANSCRIPT_COLUMNS)}, got {','.join(header)}")
        text_column, body, first_row = header.index(columns[0]), rows[1:], 2
    elif len(rows[0]) == 3 and "|" not in rows[0][0]:  # LJSpeech: id|text|normalized text, no header
        path_column, text_column, body, first_row = 0, 2, rows, 1
    else:
        raise DataError(f"{csv_path}: expected a header with columns path and transcript, got {','.join(header)}")
    utterances = []
    for number, row in enumerate(body, start=first_row):
        where = f"{csv_path} line {number}"
        if not any(cell.strip() for cell in row):
            continue
        if len(row) <= max(path_column, text_column):
            raise DataError(f"{where}: has {len(row)} fields, expected a path and a transcript")
        name, transcript = row[path_column].strip(), normalize_transcript(row[text_column])
        if first_row == 1:
            name = f"wavs/{name}.wav"
        if not name:
            raise DataError(f"{where}: the path is empty")
        if not transcript:
            raise DataError(f"{where}: the transcript of {name} is empty")
        path = folder / name
        if not path.is_file():
            raise DataError(f"{where}: audio file {path} not found")
        utterances.append(Utterance(path, transcript, csv_path, number))
    if not utterances:
        raise DataError(f"{csv_path}: has no rows, expected one row per audio clip")
    return utterances


def read_generated(root: Path) -> tuple[dict[str, list[Utterance]], dict[str, list]]:
    """Reads a generated corpus: its utterances by split, and its word spans by path."""
    utterances: dict[str, list[Utterance]] = {"train": [], "val": [], "test": []}
    with open(root / "metadata.csv", newline="", encoding="utf-8") as handle:
        for number, row in enumerate(csv.DictReader(handle), start=2):
            utterances[row["split"]].append(Utterance(root / row["path"], row["transcript"], root / "metadata.csv",
                                                      number, row["split"], row["voice"].partition("+")[2]))
    return utterances, json.loads((root / "words.json").read_text(encoding="utf-8"))


def apply_charset(utterances: list[Utterance], charset: Iterable[str], oov: str = "error") -> list[Utterance]:
    """Checks transcripts against the characters a model emits.

    Args:
        utterances: normalised transcripts.
        charset: the characters the model can emit.
        oov: "error" (list the unknown characters and the first row holding each) or
            "drop" (delete them, then collapse spaces).

    Returns:
        The utterances, unchanged or with unknown characters deleted.

    Raises:
        DataError: with ``oov="error"``, a transcript holds a character outside ``charset``;
            with ``oov="drop"``, a transcript is left empty.
    """
    known = set(charset)
    first: dict[str, str] = {}
    for utterance in utterances:
        for char in utterance.transcript:
            if char not in known:
                first.setdefault(char, utterance.where)
    if not first:
        return utterances
    if oov == "error":
        listed = ", ".join(f"{char!r} ({where})" for char, where in sorted(first.items()))
        raise DataError(f"{len(first)} transcript character(s) the model cannot emit: {listed}; "
                        "remove them or pass --set oov=drop to delete them")
    kept = []
    for utterance in utterances:
        text = normalize_transcript("".join(c for c in utterance.transcript if c in known))
        if not text:
            raise DataError(f"{utterance.where}: nothing is left of the transcript once the characters the "
                            "model cannot emit are dropped")
        kept.append(dataclasses.replace(utterance, transcript=text))
    return kept


def load_waveforms(utterances: Sequence[Utterance], max_seconds: float,
                   sample_rate: int = SAMPLE_RATE) -> list[np.ndarray]:
    """Reads and checks the audio of transcribed utterances (``seqapps.data.audio.read_audio``).

    Args:
        utterances: the rows to read.
        max_seconds: the longest clip allowed.
        sample_rate: the rate to resample to.

    Returns:
        One float32 mono waveform per utterance.

    Raises:
        DataError: naming the table line, when a file is missing, unreadable or empty,
            longer than ``max_seconds``, holds NaN or Inf, or is silent (peak below
            -60 dBFS) while its transcript is not empty.
    """
    from seqapps.data.audio import read_audio

    waveforms = []
    for utterance in utterances:
        audio = read_audio(utterance.path, sample_rate, max_seconds, utterance.csv_path, utterance.line)
        if np.max(np.abs(audio)) < 1e-3:
            raise DataError(f"{utterance.where}: audio {utterance.path} is silent (peak below -60 dBFS) but its "
                            f"transcript is {utterance.transcript[:40]!r}")
        waveforms.append(audio)
    return waveforms


def split_at_silences(waveform: np.ndarray, max_samples: int, sample_rate: int = SAMPLE_RATE) -> list[np.ndarray]:
    """Cuts a long clip into pieces of at most ``max_samples``, each cut at a quiet moment.

    Each cut falls at the centre of the quietest 50 ms frame (lowest RMS) in the last
    third of the piece that would otherwise run to ``max_samples``; the pieces do not
    overlap, so their transcripts join with a space.

    Args:
        waveform: mono samples.
        max_samples: the longest piece.
        sample_rate: the samples' rate (for the 50 ms frame).

    Returns:
        Consecutive pieces covering the whole clip.
    """
    frame = max(1, sample_rate // 20)
    pieces, start = [], 0
    while waveform.size - start > max_samples:
        low = start + (2 * max_samples) // 3
        window = waveform[low: start + max_samples]
        count = max(1, window.size // frame)
        energy = np.square(window[: count * frame]).reshape(count, -1).mean(axis=1)
        cut = low + int(np.argmin(energy)) * frame + frame // 2
        pieces.append(waveform[start:cut])
        start = cut
    pieces.append(waveform[start:])
    return pieces

if __name__ == "__main__":  # the fresh process of ``espeak_corpus``: python -m seqapps.data.speech FOLDER
    _folder = Path(sys.argv[1])
    _job = json.loads((_folder / "sentences.json").read_text(encoding="utf-8"))
    generate_corpus(_folder, _job["sentences"], _job["sizes"], _job["seed"])
