"""Spoken sentences: a corpus generator over several synthesisers and the reader of a user's transcribed audio.

The generated corpus (the default data of ``speech_recognition``) is spoken by the
sources a config lists (``Source``: an engine and optionally one voice):

- ``espeak``: the espeak-ng synthesiser that the pip wheel ``espeakng-loader``
  bundles (GPL-3+), driven through ctypes; an English accent with a voice variant,
  a rate and a pitch drawn per utterance, word times from its word events;
- ``festival``: the Festival synthesiser (apt ``FESTIVAL_PACKAGES``), voices
  ``kal_diphone``, ``ked_diphone`` and ``cmu_us_slt_arctic_hts``, a rate drawn per
  utterance, word times from the utterance's Word relation;
- ``flite``: CMU Flite (apt ``flite``), a separate engine, voices ``FLITE_VOICES``,
  a rate drawn per utterance, no word times;
- ``pico``: SVOX Pico, the HMM synthesiser of Android's open-source tree, which the pip
  package ``ttspico`` builds (Apache-2.0), its two female voices ``en-US`` and ``en-GB``,
  a rate and a pitch drawn per utterance, no word times.

Each utterance is one sentence from an offline English text (``seqapps.data.text``),
then padded with silence, given a light synthetic reverberation and noise, and
resampled to 16 kHz. Whole voices are held out: validation and test are spoken by
espeak-ng variants that training never hears, and by sentences that training never
reads; the test split holds one test set per listed test source (a Festival voice or
a whole engine that training never uses). The corpus is written once into the data
cache (``$SEQAPPS_DATA``, default ``~/.cache/seqapps``) as the layout a user's data
has (``wavs/*.wav`` and ``metadata.csv``, whose ``source``, ``engine`` and ``voice``
columns label each row), plus ``words.json`` with each word's start and end for the
engines that give them.

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
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import unicodedata
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from seqapps.data.files import build_folder_atomically, data_home
from seqapps.errors import DataError

SAMPLE_RATE = 16000
GENERATOR_VERSION = 2  # bump when the generator's output changes, so cached corpora are rebuilt
ACCENTS = ("en-us", "en", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-us-nyc", "en-gb-x-gbclan",
           "en-gb-x-gbcwmd")
#: Voice variants (speakers) per split: validation and test variants are never heard in training.
VARIANTS = {
    "train": ("m1", "m2", "m4", "m5", "m6", "f1", "f3", "f4", "klatt", "klatt3", "iven", "john", "max",
              "paul", "robert", "steph", "linda", "adam", "Andy", "rob"),
    "val": ("m7", "f5", "travis"),
    "test": ("m3", "f2", "quincy", "benjamin"),
}
#: The synthesisers a source names, as the summary and the report name them.
ENGINE_TITLES = {"espeak": "espeak-ng", "festival": "Festival", "flite": "CMU Flite", "pico": "SVOX Pico"}
#: The voices of an engine source that names none (espeak-ng's are ``VARIANTS`` of the split).
ENGINE_VOICES = {"festival": ("kal_diphone", "ked_diphone", "cmu_us_slt_arctic_hts"),
                 "flite": ("kal", "kal16", "awb", "rms", "slt"),
                 "pico": ("en-US", "en-GB")}
FLITE_VOICES = ENGINE_VOICES["flite"]
FESTIVAL_PACKAGES = "festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts"
FLITE_PACKAGES = "flite"
PICO_PACKAGE = "ttspico"
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


# --- Festival and Flite, through their command-line programs ------------------------------------------

def _missing_package(engine: str, packages: str, what: str) -> DataError:
    return DataError(f"{ENGINE_TITLES[engine]} {what} needs the Debian package(s) {packages}: run "
                     f"`apt-get install -y {packages}`, or pass --data your_audio/")


def _festival_word_spans(words: list[tuple[str, float, float]], text: str) -> list[tuple[str, float, float]] | None:
    """Festival's Word items as spans of the sentence's words, or None when they do not spell it.

    Festival cuts a clitic off its word ("cat's": "cat", "'s" without times); the clitic
    joins the word before it.
    """
    spans: list[list] = []
    for name, start, end in words:
        if name.startswith("'") and spans:
            spans[-1][0] += name
        else:
            spans.append([name, start, end])
    if [name for name, _, _ in spans] != text.split():
        return None
    return [(name, start, end) for name, start, end in spans]


def _scheme_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def festival_voices() -> tuple[str, ...]:
    """The Festival voices installed here.

    Raises:
        DataError: Festival is not installed (naming the ``apt-get install`` command).
    """
    if shutil.which("festival") is None:
        raise _missing_package("festival", FESTIVAL_PACKAGES, "speech")
    done = subprocess.run(["festival", "--pipe"], input="(print (voice.list))\n", capture_output=True, text=True,
                          check=False)
    return tuple(done.stdout.strip().strip("()").split())


def flite_voices() -> tuple[str, ...]:
    """The voices the ``flite`` program has built in.

    Raises:
        DataError: Flite is not installed (naming the ``apt-get install`` command).
    """
    if shutil.which("flite") is None:
        raise _missing_package("flite", FLITE_PACKAGES, "speech")
    done = subprocess.run(["flite", "-lv"], capture_output=True, text=True, check=False)
    return tuple(done.stdout.partition(":")[2].split())


def festival_synthesize(texts: Sequence[str], voice: str, stretches: Sequence[float], folder: Path
                        ) -> list[tuple[Path, list[tuple[str, float, float]] | None]]:
    """Speaks sentences with one Festival voice in one Festival process.

    Args:
        texts: the sentences (letters, apostrophes and spaces).
        voice: a Festival voice (``festival_voices``).
        stretches: each sentence's ``Duration_Stretch`` (above 1 is slower).
        folder: where the WAV files go (``festival_<i>.wav``).

    Returns:
        Per sentence, its WAV file and its words' ``(word, start, end)`` seconds (None when
        Festival's words do not spell the sentence).

    Raises:
        DataError: Festival or the voice is not installed, or Festival fails.
    """
    if voice not in festival_voices():
        raise _missing_package("festival", FESTIVAL_PACKAGES, f"voice {voice!r}")
    lines = [f"(voice_{voice})",
             "(define (say index text stretch file)"
             " (Parameter.set 'Duration_Stretch stretch)"
             " (let ((utt (utt.synth (eval (list 'Utterance 'Text text)))))"
             " (utt.save.wave utt file 'riff)"
             " (mapcar (lambda (w) (format t \"word %d %s %f %f\\n\" index (item.name w)"
             " (item.feat w \"word_start\") (item.feat w \"word_end\"))) (utt.relation.items utt 'Word))))"]
    files = [folder / f"festival_{i}.wav" for i in range(len(texts))]
    lines += [f"(say {i} {_scheme_string(text)} {stretch:.4f} {_scheme_string(str(path))})"
              for i, (text, stretch, path) in enumerate(zip(texts, stretches, files))]
    script = folder / "festival.scm"
    script.write_text("\n".join(lines) + "\n", encoding="utf-8")
    done = subprocess.run(["festival", "-b", str(script)], capture_output=True, text=True, check=False)
    words: list[list[tuple[str, float, float]]] = [[] for _ in texts]
    for line in done.stdout.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "word":
            index, name, start, end = rest.split()
            words[int(index)].append((name, float(start), float(end)))
    failed = next((path for path in files if not path.is_file()), None)
    if "SIOD ERROR" in done.stdout + done.stderr or failed is not None:
        message = next((line for line in (done.stdout + done.stderr).splitlines() if "ERROR" in line), "no message")
        raise DataError(f"Festival (voice {voice}) failed: {message.strip()}")
    return [(path, _festival_word_spans(found, text)) for path, found, text in zip(files, words, texts)]


def flite_synthesize(text: str, voice: str, stretch: float, path: Path) -> Path:
    """Speaks a sentence with a Flite voice into a WAV file.

    Args:
        text: the sentence.
        voice: a built-in Flite voice (``flite_voices``).
        stretch: the ``duration_stretch`` (above 1 is slower).
        path: the WAV file to write.

    Returns:
        ``path``.

    Raises:
        DataError: Flite or the voice is missing, or Flite writes no audio.
    """
    if voice not in flite_voices():
        raise _missing_package("flite", FLITE_PACKAGES, f"voice {voice!r}")
    done = subprocess.run(["flite", "-voice", voice, "--setf", f"duration_stretch={stretch:.4f}", "-t", text,
                           "-o", str(path)], capture_output=True, text=True, check=False)
    if done.returncode != 0 or not path.is_file():
        raise DataError(f"Flite (voice {voice}) failed: {(done.stderr.strip().splitlines() or ['no message'])[-1]}")
    return path


def pico_synthesize(text: str, voice: str, rate: int, pitch: int) -> np.ndarray:
    """Speaks a sentence with an SVOX Pico voice.

    Args:
        text: the sentence.
        voice: ``en-US`` or ``en-GB`` (``ENGINE_VOICES["pico"]``).
        rate: the speaking rate in percent of the voice's own (Pico admits 20-500).
        pitch: the pitch in percent of the voice's own (Pico admits 50-200).

    Returns:
        16-bit samples at 16 kHz.

    Raises:
        DataError: the pip package ``ttspico`` is missing, or Pico writes no audio.
    """
    engine = _pico_engine(voice)
    engine.rate, engine.pitch = rate, pitch
    audio = engine.speak(text)
    if not audio:
        raise DataError(f"SVOX Pico (voice {voice}) wrote no audio for {text!r}")
    return np.frombuffer(audio, np.int16)


_PICO_ENGINES: dict[str, object] = {}


def _import_ttspico() -> object:
    """Imports ttspico with its C library bound to its own symbols first (``RTLD_DEEPBIND``).

    Pico carries Ooura's FFT (``rdft``, ``cftb1st``, ...) under the names that TensorFlow's framework library
    exports globally; loaded after TensorFlow without this, Pico's calls reach TensorFlow's functions and crash.
    """
    flags = sys.getdlopenflags()
    sys.setdlopenflags(flags | getattr(os, "RTLD_DEEPBIND", 0))
    try:
        import ttspico
    finally:
        sys.setdlopenflags(flags)
    return ttspico


def _new_pico_engine(voice: str) -> object:
    """A ``ttspico.TtsEngine`` that has loaded ``voice``'s files.

    Raises:
        DataError: ttspico is not installed, or the voice's files are missing from it (one line each).
    """
    try:
        ttspico = _import_ttspico()
    except ImportError:
        raise DataError(f"SVOX Pico needs the pip package {PICO_PACKAGE}: run `pip install {PICO_PACKAGE}` "
                        "(it compiles C: a C compiler and the Python headers), or pass --data your_audio/") from None
    try:
        return ttspico.TtsEngine(voice)
    except RuntimeError as error:  # its voice files are missing from the installed package
        raise DataError(f"SVOX Pico voice {voice!r}: {error}; reinstall it with `pip install --force-reinstall "
                        f"{PICO_PACKAGE}`") from None


def _pico_engine(voice: str) -> object:
    """The process's engine of ``voice``, made on first use (each engine loads its voice's files once)."""
    if voice not in _PICO_ENGINES:
        _PICO_ENGINES[voice] = _new_pico_engine(voice)
    return _PICO_ENGINES[voice]


# --- the generated corpus -------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Source:
    """A synthesiser, and optionally one of its voices: ``engine`` or ``engine:voice`` in a config.

    Attributes:
        engine: a key of ``ENGINE_TITLES``.
        voice: one voice (an espeak-ng ``accent+variant``, a Festival, Flite or Pico voice), or None for
            every voice of the engine (espeak-ng: the split's ``VARIANTS`` under random accents).
    """

    engine: str
    voice: str | None = None

    @classmethod
    def parse(cls, text: str) -> "Source":
        """Reads ``engine`` or ``engine:voice``.

        Raises:
            DataError: an unknown engine, or a voice the engine does not have.
        """
        engine, _, voice = str(text).strip().partition(":")
        if engine not in ENGINE_TITLES:
            raise DataError(f"speech source {text!r}: unknown engine {engine!r}, expected one of "
                            f"{', '.join(ENGINE_TITLES)} (engine or engine:voice)")
        if voice and engine in ENGINE_VOICES and voice not in ENGINE_VOICES[engine]:
            raise DataError(f"speech source {text!r}: {ENGINE_TITLES[engine]} has no voice {voice!r}, expected one "
                            f"of {', '.join(ENGINE_VOICES[engine])}")
        return cls(engine, voice or None)

    def __str__(self) -> str:
        return f"{self.engine}:{self.voice}" if self.voice else self.engine

    def title(self) -> str:
        """The engine's name and the voice, for people: ``Festival cmu_us_slt_arctic_hts``."""
        return f"{ENGINE_TITLES[self.engine]} {self.voice}" if self.voice else ENGINE_TITLES[self.engine]

    def draw_voice(self, split: str, rng: np.random.Generator) -> str:
        """The voice of one utterance of ``split``."""
        if self.voice:
            return self.voice
        if self.engine == "espeak":
            return f"{rng.choice(ACCENTS)}+{rng.choice(VARIANTS[split])}"
        return str(rng.choice(ENGINE_VOICES[self.engine]))

    def require(self) -> None:
        """Checks that the engine (and the voice) is installed.

        Raises:
            DataError: naming the ``apt-get install`` (or pip) command that installs it.
        """
        if self.engine == "espeak":
            Espeak.get()
            return
        if self.engine == "pico":  # every voice it may draw, loaded and freed: the corpus is spoken in another process
            for voice in (self.voice,) if self.voice else ENGINE_VOICES[self.engine]:
                _new_pico_engine(voice)
            return
        installed = festival_voices() if self.engine == "festival" else flite_voices()
        packages = FESTIVAL_PACKAGES if self.engine == "festival" else FLITE_PACKAGES
        for voice in (self.voice,) if self.voice else ENGINE_VOICES[self.engine]:
            if voice not in installed:
                raise _missing_package(self.engine, packages, f"voice {voice!r}")


@dataclasses.dataclass
class CorpusSpec:
    """What a generated corpus holds; its hash names the cache folder.

    Attributes:
        source: the sentence text ("pydoc" or "kjv").
        sizes: utterances per split, ``{"train", "val", "test"}``; ``test`` is per test set.
        seed: the seed of every random choice.
        min_words, max_words, vocabulary_size: the sentence filter (``spoken_sentences``).
        sources: the ``Source`` texts that speak training and validation, in turn.
        test_sets: one ``Source`` text per test set.
    """

    source: str
    sizes: dict[str, int]
    seed: int = 0
    min_words: int = 3
    max_words: int = 10
    vocabulary_size: int | None = 2000
    sources: list[str] = dataclasses.field(default_factory=lambda: ["espeak"])
    test_sets: list[str] = dataclasses.field(default_factory=lambda: ["espeak"])

    def key(self) -> str:
        """A short hash of the spec and the generator version."""
        text = json.dumps({**dataclasses.asdict(self), "version": GENERATOR_VERSION}, sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:12]


def _augment(audio: np.ndarray, rate_in: int, rng: np.random.Generator) -> tuple[np.ndarray, float, dict[str, float]]:
    """Pads with silence, adds reverberation and noise, and resamples float audio to 16 kHz.

    Returns:
        ``(float32 audio at 16 kHz, leading pad in seconds, the drawn settings)``.
    """
    from scipy import signal

    lead, trail = (int(rng.uniform(0.05, 0.35) * rate_in) for _ in range(2))
    dry = np.concatenate([np.zeros(lead), audio.astype(np.float64), np.zeros(trail)])
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
    return noisy.astype(np.float32), lead / rate_in, settings


@dataclasses.dataclass
class _Job:
    """One utterance to speak: where it goes, what it says, who says it, and its generator."""

    path: str
    split: str
    text: str
    source: Source
    voice: str
    rate: int
    pitch: int
    pitch_range: int
    rng: np.random.Generator


Spoken = tuple[np.ndarray, int, "list[tuple[str, float, float]] | None"]  # audio in [-1, 1], its rate, word spans


def _speak_espeak(jobs: list[_Job], scratch: Path) -> Iterator[tuple[_Job, Spoken]]:
    espeak = Espeak.get()
    for job in jobs:
        audio, onsets = espeak.synthesize(job.text, job.voice, job.rate, job.pitch, job.pitch_range)
        loud = np.flatnonzero(np.abs(audio) > 300)  # of 32,768: -41 dBFS, above espeak-ng's silences
        speech = (int(loud[0]), int(loud[-1]) + 1) if loud.size else (0, audio.size)
        spans = [(group, start / espeak.sample_rate, end / espeak.sample_rate)
                 for group, start, end in word_spans(job.text, onsets, *speech)]
        yield job, (audio / 32768.0, espeak.sample_rate, spans)


def _read_wav(path: Path) -> tuple[np.ndarray, int]:
    import soundfile

    audio, rate = soundfile.read(path, dtype="float64", always_2d=True)
    path.unlink()
    return audio.mean(axis=1), rate


def _speak_festival(jobs: list[_Job], scratch: Path) -> Iterator[tuple[_Job, Spoken]]:
    for voice in sorted({job.voice for job in jobs}):
        group = [job for job in jobs if job.voice == voice]
        spoken = festival_synthesize([job.text for job in group], voice, [175 / job.rate for job in group], scratch)
        for job, (path, spans) in zip(group, spoken):
            yield job, (*_read_wav(path), spans)


def _speak_flite(jobs: list[_Job], scratch: Path) -> Iterator[tuple[_Job, Spoken]]:
    for job in jobs:
        yield job, (*_read_wav(flite_synthesize(job.text, job.voice, 175 / job.rate, scratch / "flite.wav")), None)


def _speak_pico(jobs: list[_Job], scratch: Path) -> Iterator[tuple[_Job, Spoken]]:
    for job in jobs:
        audio = pico_synthesize(job.text, job.voice, *_pico_rate_and_pitch(job))
        yield job, (audio / 32768.0, SAMPLE_RATE, None)


def _pico_rate_and_pitch(job: _Job) -> tuple[int, int]:
    """Pico's rate and pitch in percent from a job's espeak-ng scales: the rate as the other engines read it
    (175 words a minute is the voice's own), the pitch within 3 semitones of the voice's own (25-75 of
    espeak-ng's 0-99)."""
    return round(100 * job.rate / 175), round(100 * 2 ** ((job.pitch - 50) / 100))


_SPEAKERS = {"espeak": _speak_espeak, "festival": _speak_festival, "flite": _speak_flite, "pico": _speak_pico}


def _jobs(sentences: dict[str, list[str]], sizes: dict[str, int], seed: int, sources: Sequence[Source],
          test_sets: Sequence[Source]) -> list[_Job]:
    """Every utterance's sentence, source (training sources in turn; ``sizes["test"]`` per test set) and voice."""
    jobs = []
    for number, split in enumerate(("train", "val", "test")):
        order = np.random.default_rng([seed, number]).permutation(len(sentences[split]))
        if split == "test":
            chosen = [source for source in test_sets for _ in range(sizes[split])]
        else:
            chosen = [sources[i % len(sources)] for i in range(sizes[split])]
        for i, source in enumerate(chosen):
            rng = np.random.default_rng([seed, number, i])
            voice = source.draw_voice(split, rng)
            rate, pitch, pitch_range = int(rng.integers(130, 211)), int(rng.integers(25, 76)), int(rng.integers(30, 81))
            jobs.append(_Job(f"wavs/{split}_{i:05d}.wav", split, sentences[split][order[i % len(order)]], source,
                             voice, rate, pitch, pitch_range, rng))
    return jobs


def generate_corpus(root: Path, sentences: dict[str, list[str]], sizes: dict[str, int], seed: int,
                    sources: Sequence[str] = ("espeak",), test_sets: Sequence[str] = ("espeak",)) -> None:
    """Writes a spoken corpus: ``wavs/``, ``metadata.csv`` and ``words.json`` under ``root``.

    espeak-ng carries hidden state from one synthesis to the next (the same call gives
    durations a few milliseconds apart), which no re-initialisation resets; its output
    is a fixed function of the calls made since the process started. So the audio is
    reproducible when this runs in a fresh process, as ``spoken_corpus`` does.

    Args:
        root: an empty or new folder.
        sentences: the sentences of each split (cycled when a split asks for more).
        sizes: utterances per split (``test``: per test set).
        seed: the seed of the voices, rates, pitches, padding, reverberation and noise.
        sources: the ``Source`` texts of training and validation, in turn.
        test_sets: a ``Source`` text per test set.
    """
    import soundfile

    jobs = _jobs(sentences, sizes, seed, [Source.parse(s) for s in sources], [Source.parse(s) for s in test_sets])
    (root / "wavs").mkdir(parents=True, exist_ok=True)
    rows, words = {}, {}
    with tempfile.TemporaryDirectory(dir=root) as scratch:
        for engine, speak in _SPEAKERS.items():
            for job, (audio, rate_in, spans) in speak([job for job in jobs if job.source.engine == engine],
                                                      Path(scratch)):
                waveform, lead, settings = _augment(audio, rate_in, job.rng)
                soundfile.write(root / job.path, waveform, SAMPLE_RATE, subtype="PCM_16")
                if spans is not None:
                    words[job.path] = [[group, round(lead + start, 3), round(lead + end, 3)]
                                       for group, start, end in spans]
                rows[job.path] = {"path": job.path, "transcript": job.text, "split": job.split,
                                  "source": str(job.source), "engine": job.source.engine, "voice": job.voice,
                                  "rate": job.rate, "pitch": job.pitch if engine == "espeak" else "", **settings}
    with open(root / "metadata.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[jobs[0].path]))
        writer.writeheader()
        writer.writerows(rows[job.path] for job in jobs)
    (root / "words.json").write_text(json.dumps(words), encoding="utf-8")


def spoken_corpus(spec: CorpusSpec, lines: Callable[[], list[str]]) -> Path:
    """The cached corpus of ``spec``, generated on first use (atomically: a crash leaves nothing).

    Args:
        spec: sizes, seed, sentence filter, sources and test sets.
        lines: returns the text lines the sentences come from (called only when generating).

    Returns:
        The corpus folder, ``$SEQAPPS_DATA/speech/<source>-<hash>``.

    Raises:
        DataError: the text yields too few sentences for a split, or a source's engine or voice
            is not installed (naming the command that installs it).
    """
    final = data_home() / "speech" / f"{spec.source}-{spec.key()}"
    if (final / "metadata.csv").is_file():
        return final
    for source in dict.fromkeys(Source.parse(s) for s in [*spec.sources, *spec.test_sets]):
        source.require()
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
        (folder / "sentences.json").write_text(json.dumps({"sentences": parts, "sizes": spec.sizes, "seed": spec.seed,
                                                           "sources": spec.sources, "test_sets": spec.test_sets}),
                                               encoding="utf-8")
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
        speaker: the voice that speaks it in a generated corpus (an espeak-ng variant of ``VARIANTS``,
            a Festival, Flite or Pico voice; None for user data).
        source: the ``Source`` text of the training source or test set it belongs to in a generated
            corpus (None for user data).
        engine: the engine that spoke it in a generated corpus (None for user data).
    """

    path: Path
    transcript: str
    csv_path: Path
    line: int
    split: str | None = None
    speaker: str | None = None
    source: str | None = None
    engine: str | None = None

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
            speaker = row["voice"].partition("+")[2] if row["engine"] == "espeak" else row["voice"]
            utterances[row["split"]].append(Utterance(root / row["path"], row["transcript"], root / "metadata.csv",
                                                      number, row["split"], speaker, row["source"], row["engine"]))
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
    generate_corpus(_folder, _job["sentences"], _job["sizes"], _job["seed"], _job["sources"], _job["test_sets"])
