"""Tagged music clips: scores from the music21 corpus rendered to audio, and the user's tagged audio.

Generated corpus (``rendered_corpus``): pieces from licence-checked collections of the
music21 corpus (Bach chorales, Palestrina masses, Monteverdi madrigals, reels, jigs and
hornpipes from Ryan's Mammoth Collection and from O'Neill's Music of Ireland; the Essen
folk songs are left out, their licence is non-commercial only) are parsed, written to
MIDI and rendered to 16 kHz audio by FluidSynth with General MIDI soundfonts
(``renderer="fluidsynth"``) or by ``pretty_midi``'s synthesiser (``renderer="synth"``: one
oscillator waveform per instrument family, so the family is audible). Each rendering
draws, from the seed (``draw_rendering``): an instrument program, a tempo band and a tempo
inside it, a transposition of up to ``MAX_SEMITONES`` semitones, a velocity curve
(``velocity_curve``), and FluidSynth's reverb and chorus settings (``EFFECT_RANGES``).
The training and validation clips are rendered with the corpus's ``soundfonts`` in turn;
the test pieces are rendered with them too (split ``test``) and, when the corpus names a
``held_out_soundfont``, once more with that one (split ``held_out``), which no training
clip uses. Every tag is true by construction or from the score: ``genre:``, ``composer:``
(where known), ``mode:`` (music21's key analysis: major or minor, which a transposition
keeps; no tag names a key), ``meter:``, ``tempo:`` (the drawn band) and ``instrument:``
(family of the drawn program). Fixed-length clips go to
``$SEQAPPS_DATA/music/<renderer>-<hash>/`` with a ``metadata.csv`` (path, tags, piece,
split, soundfont and the draws) and ``info.json`` naming the renderer and soundfonts.
Splits are by piece: no piece is in two of train, val and test. Each rendered clip is also
kept under ``$SEQAPPS_DATA/music/renders/``, keyed by everything that makes it (the
piece's MIDI, its place in the corpus and take, the seed, the renderer and soundfont), so
a corpus that shares pieces with an earlier one renders only the new clips.

User data (``read_tagged_folder``): a folder with a CSV ``path,tags`` (tags separated
by ``;`` or ``|``), or one sub-folder per tag.
"""
from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from seqapps.data import splits as split_rule
from seqapps.data.files import build_folder_atomically
from seqapps.data.files import data_home
from seqapps.errors import DataError

SAMPLE_RATE = 16000
GENERATOR_VERSION = 3
SOUNDFONT_DIRS = (Path("/usr/share/sounds/sf2"), Path("/usr/share/sounds/sf3"))
#: soundfont file -> the Debian package that installs it (under ``SOUNDFONT_DIRS``)
SOUNDFONT_PACKAGES = {"TimGM6mb.sf2": "timgm6mb-soundfont", "FluidR3_GM.sf2": "fluid-soundfont-gm",
                      "sf_GMbank.sf2": "csound-soundfont", "MuseScore_General_Lite.sf3": "musescore-general-soundfont-small",
                      "MuseScore_General.sf3": "musescore-general-soundfont"}
TRAIN_SOUNDFONTS = ("TimGM6mb.sf2", "FluidR3_GM.sf2")
HELD_OUT_SOUNDFONT = "sf_GMbank.sf2"  # Csound's General MIDI bank: another source than both training ones
RENDERERS = ("auto", "synth", "fluidsynth")
SYNTH_SOURCE = "synth"  # the soundfont column of a clip rendered by pretty_midi
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3")
#: instrument family -> (General MIDI programs, the synth renderer's oscillator)
FAMILIES = {"piano": ((0, 1, 4), "sine"), "organ": ((16, 19), "square"), "strings": ((40, 42, 48), "sawtooth"),
            "flute": ((73, 72), "sine"), "brass": ((56, 61), "sawtooth"), "reed": ((71, 68), "square")}
#: tempo bands in quarter notes per minute: ``[low, high)`` and the ``tempo:`` tag; a rendering draws a band,
#: then a tempo inside it
TEMPO_BANDS = ((50, 80, "slow"), (80, 120, "moderate"), (120, 180, "fast"))
MAX_SEMITONES = 2  # a rendering is transposed by a whole number of semitones in [-2, 2]
VELOCITY_GAMMAS = (0.5, 2.0)  # the velocity curve's exponent, drawn log-uniformly in this range
#: FluidSynth setting -> (low, high) of its uniform draw; integers for an int setting (FluidSynth's own ranges are
#: wider: chorus depth up to 256 ms, level up to 10; its speed minimum, 0.1 Hz, is refused as out of range when given)
EFFECT_RANGES = {"synth.reverb.room-size": (0.0, 1.0), "synth.reverb.damp": (0.0, 1.0),
                 "synth.reverb.width": (0.0, 100.0), "synth.reverb.level": (0.0, 1.0),
                 "synth.chorus.nr": (0, 10), "synth.chorus.level": (0.0, 4.0),
                 "synth.chorus.speed": (0.2, 5.0), "synth.chorus.depth": (0.0, 20.0)}
RENDER_VERSION = 2  # bump when a clip's audio changes for the same inputs, so cached renders are redone
#: the tune types (``R:`` field of O'Neill's ABC tunes, lower case) kept, and their genre tag
RHYTHM_GENRES = {"reel": "reel", "jig": "jig", "double jig": "jig", "hornpipe": "hornpipe"}


class Collection(NamedTuple):
    """A collection of the music21 corpus.

    Attributes:
        folder: its folder in ``music21/corpus``.
        pattern: the regular expression its score files match (for Ryan's, group 1 is the genre).
        genre: the genre tag of every piece; None: from the file name (``pattern`` group 1) or, for
            ``tunes`` collections, from each tune's ``R:`` field (``RHYTHM_GENRES``; other tunes are left out).
        composer: the composer tag; None for traditional tunes.
        licence: its licence and provenance.
        tunes: its files are ABC books of many tunes, each parsed alone by its ``X:`` number.
    """

    folder: str
    pattern: str
    genre: str | None
    composer: str | None
    licence: str
    tunes: bool = False


COLLECTIONS = {
    "bach": Collection("bach", r"^bwv.*\.mxl$", "chorale", "bach",
                       "public domain (J. S. Bach); music21 corpus encoding"),
    "palestrina": Collection("palestrina", r"\.krn$", "mass", "palestrina",
                             "public domain (Palestrina); music21 corpus Humdrum encoding"),
    "monteverdi": Collection("monteverdi", r"^madrigal.*\.mxl$", "madrigal", "monteverdi",
                             "public domain (Monteverdi); music21 corpus encoding"),
    "ryans": Collection("ryansMammoth", r"(Reel|Jig|Hornpipe)\.abc$", None, None,
                        "public domain (Ryan's Mammoth Collection, 1883); music21 corpus ABC encoding"),
    # no licence file in the folder (unlike essenFolksong's non-commercial one) and none in the tunes' headers;
    # the ABC transcriptions are volunteers' (Z: fields), shipped with the encoders' permission
    # (music21/corpus/license.txt)
    "oneills": Collection("oneills1850", r"\.abc$", None, None,
                          "public domain (F. O'Neill, Music of Ireland: 1850 Melodies, 1903); music21 corpus ABC "
                          "encoding by volunteer transcribers", tunes=True),
}


@dataclasses.dataclass(frozen=True)
class Piece:
    """One score of the corpus.

    Attributes:
        collection: its collection name.
        path: its corpus file.
        number: its ``X:`` number in a multi-tune ABC file, else None.
        genre: its genre tag.
    """

    collection: str
    path: Path
    number: int | None
    genre: str

    @property
    def name(self) -> str:
        """``collection/file`` (``#number`` for a tune of a multi-tune file): the piece's split group."""
        return f"{self.collection}/{self.path.name}" + ("" if self.number is None else f"#{self.number}")


def abc_tunes(path: Path) -> list[tuple[int, str]]:
    """The tunes of a multi-tune ABC file: ``(X: number, R: field in lower case or "")`` in file order.

    A line scan of the two header fields: music21's ``ABCHandler`` tokenises every note of the
    file too (10 s for O'Neill's 39 files against milliseconds).
    """
    tunes: list[list] = []
    for line in path.read_text(encoding="latin-1").splitlines():
        if match := re.match(r"X:\s*(\d+)", line):
            tunes.append([int(match.group(1)), ""])
        elif tunes and line.startswith("R:"):
            tunes[-1][1] = line[2:].strip().lower()
    return [(number, rhythm) for number, rhythm in tunes]


def collection_pieces(name: str) -> list[Piece]:
    """Every usable piece of a collection, sorted by file (a book's tunes in file order); a tune number found in two
    files (O'Neill's has some tunes in two transcriptions) is taken from the first."""
    import music21

    collection = COLLECTIONS[name]
    paths = sorted(p for p in (Path(music21.__file__).parent / "corpus" / collection.folder).iterdir()
                   if re.search(collection.pattern, p.name))
    if not collection.tunes:
        return [Piece(name, path, None, collection.genre or re.search(collection.pattern, path.name).group(1).lower())
                for path in paths]
    pieces, seen = [], set()
    for path in paths:
        for number, rhythm in abc_tunes(path):
            if number not in seen and rhythm in RHYTHM_GENRES:
                pieces.append(Piece(name, path, number, collection.genre or RHYTHM_GENRES[rhythm]))
            seen.add(number)
    return pieces


def corpus_pieces(collections: Sequence[str], per_collection: int, seed: int) -> list[Piece]:
    """Picks pieces from each collection, deterministically.

    Args:
        collections: names from ``COLLECTIONS``.
        per_collection: pieces to take from each.
        seed: the seed of the choice.

    Returns:
        The pieces, collection by collection.
    """
    chosen = []
    for name in collections:
        pieces = collection_pieces(name)
        order = np.random.default_rng([seed, len(chosen)]).permutation(len(pieces))
        chosen += [pieces[i] for i in order[:per_collection]]
    return chosen


def parse_piece(piece: Piece) -> object:
    """The ``music21`` score of a piece (one tune of a multi-tune ABC file by its number)."""
    import music21

    if piece.number is None:
        return music21.converter.parse(piece.path)
    return music21.converter.parse(piece.path, number=piece.number)


def score_tags(piece: Piece, score: object) -> dict[str, str]:
    """The tags a score carries itself: genre, composer, mode and meter.

    Args:
        piece: the piece (its genre, and its collection's composer).
        score: its parsed ``music21`` score.
    """
    from music21 import meter

    tags = {"genre": piece.genre}
    composer = COLLECTIONS[piece.collection].composer
    if composer:
        tags["composer"] = composer
    tags["mode"] = score.analyze("key").mode
    signature = score.recurse().getElementsByClass(meter.TimeSignature).first()
    if signature is not None:
        tags["meter"] = signature.ratioString
    return tags


def tempo_band(bpm: float) -> str:
    """``slow``, ``moderate`` or ``fast`` for a tempo in quarter notes per minute (``TEMPO_BANDS``)."""
    return next(name for low, high, name in TEMPO_BANDS if low <= bpm < high)


def find_soundfont(name: str) -> Path:
    """An installed soundfont: a file name under ``SOUNDFONT_DIRS``, or a path.

    Raises:
        DataError: it is not installed; one line naming the ``apt-get install`` command where the package is known.
    """
    given = Path(name)
    found = [given] if given.is_absolute() else [folder / name for folder in SOUNDFONT_DIRS]
    path = next((p for p in found if p.is_file()), None)
    if path is not None:
        return path
    if name in SOUNDFONT_PACKAGES:
        raise DataError(f"soundfont {name} is not installed: apt-get install {SOUNDFONT_PACKAGES[name]}; "
                        "or use --set renderer=synth")
    raise DataError(f"soundfont {name}: no such file in {' or '.join(map(str, SOUNDFONT_DIRS))}; give an installed "
                    f".sf2/.sf3 file name or path (known ones: {', '.join(SOUNDFONT_PACKAGES)})")


def resolve_renderer(renderer: str, soundfonts: Sequence[str]) -> str:
    """``auto`` -> ``fluidsynth`` when its binary is installed, else ``synth``; with ``fluidsynth`` every soundfont
    must be installed.

    Args:
        renderer: one of ``RENDERERS``.
        soundfonts: every soundfont the corpus renders with.

    Raises:
        DataError: ``fluidsynth`` was asked for and its binary is missing, or a soundfont is (``find_soundfont``).
    """
    if renderer == "synth" or (renderer == "auto" and shutil.which("fluidsynth") is None):
        return "synth"
    if shutil.which("fluidsynth") is None:
        raise DataError("renderer=fluidsynth needs the fluidsynth binary: apt-get install fluidsynth; "
                        "or use --set renderer=synth")
    for name in soundfonts:
        find_soundfont(name)
    return "fluidsynth"


@dataclasses.dataclass(frozen=True)
class Rendering:
    """What one rendering of a piece draws (``draw_rendering``).

    Attributes:
        family, program: the instrument family and its General MIDI program.
        bpm: the tempo in quarter notes per minute, inside its ``tempo_band``.
        semitones: the transposition.
        velocity_gamma: the velocity curve's exponent (``velocity_curve``).
        effects: FluidSynth's reverb and chorus settings (``EFFECT_RANGES``).
        offset: where the clip starts, as a fraction of the room the rendered piece leaves for it.
    """

    family: str
    program: int
    bpm: float
    semitones: int
    velocity_gamma: float
    effects: dict[str, float]
    offset: float


def draw_rendering(rng_seed: Sequence[int]) -> Rendering:
    """The draws of one rendering: instrument, tempo (a band, then a tempo in it), transposition, velocity curve,
    reverb and chorus, and the clip's offset; the same seed gives the same draws."""
    rng = np.random.default_rng(list(rng_seed))
    family = list(FAMILIES)[rng.integers(len(FAMILIES))]
    program = int(rng.choice(FAMILIES[family][0]))
    low, high, _ = TEMPO_BANDS[rng.integers(len(TEMPO_BANDS))]
    bpm = float(rng.uniform(low, high))
    semitones = int(rng.integers(-MAX_SEMITONES, MAX_SEMITONES + 1))
    gamma = float(np.exp(rng.uniform(*np.log(VELOCITY_GAMMAS))))
    effects = {name: int(rng.integers(low, high + 1)) if isinstance(low, int) else round(float(rng.uniform(low, high)), 3)
               for name, (low, high) in EFFECT_RANGES.items()}
    return Rendering(family, program, bpm, semitones, gamma, effects, float(rng.random()))


def velocity_curve(velocity: int, gamma: float) -> int:
    """A note's velocity through the curve ``127 (v / 127) ** gamma``, rounded, at least 1 (gamma < 1 is louder)."""
    return max(1, int(round(127 * (velocity / 127) ** gamma)))


def prepare_midi(midi_bytes: bytes, rendering: Rendering) -> object:
    """A piece's MIDI as one rendering plays it: every part on the drawn program (no drums), every note transposed
    (kept in 0..127) and through the velocity curve, and the times scaled from the file's first tempo to the drawn one.

    Returns:
        The ``pretty_midi.PrettyMIDI``.
    """
    import pretty_midi

    midi = pretty_midi.PrettyMIDI(io.BytesIO(midi_bytes))
    for instrument in midi.instruments:
        instrument.program, instrument.is_drum = rendering.program, False
        for note in instrument.notes:
            note.pitch = min(127, max(0, note.pitch + rendering.semitones))
            note.velocity = velocity_curve(note.velocity, rendering.velocity_gamma)
    written = midi.get_tempo_changes()[1][0] if len(midi.get_tempo_changes()[1]) else 120.0
    end = midi.get_end_time()
    midi.adjust_times([0.0, end], [0.0, end * written / rendering.bpm])
    return midi


def fluidsynth_command(midi_path: Path, wav_path: Path, soundfont: Path, effects: dict[str, float],
                       sample_rate: int = SAMPLE_RATE) -> list[str]:
    """The ``fluidsynth`` command rendering a MIDI file to a WAV file with a soundfont and reverb and chorus settings."""
    settings = [arg for name, value in effects.items() for arg in ("-o", f"{name}={value}")]
    return ["fluidsynth", "-ni", "-q", "-g", "0.6", "-r", str(sample_rate), *settings, "-F", str(wav_path),
            str(soundfont), str(midi_path)]


def render(midi: object, family: str, renderer: str, soundfont: str | None = None,
           effects: dict[str, float] | None = None, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Renders a ``pretty_midi.PrettyMIDI`` (programs already set) to mono float32 audio, peak 0.7.

    Args:
        midi: the MIDI data.
        family: the instrument family (the synth renderer's oscillator).
        renderer: ``synth`` or ``fluidsynth``.
        soundfont: FluidSynth's soundfont (``find_soundfont``).
        effects: FluidSynth's settings (reverb and chorus); none: its defaults.
        sample_rate: output rate in Hz.
    """
    if renderer == "synth":
        from scipy import signal

        oscillator = {"sine": np.sin, "square": lambda t: 0.5 * signal.square(t),
                      "sawtooth": lambda t: 0.5 * signal.sawtooth(t)}[FAMILIES[family][1]]
        audio = midi.synthesize(fs=sample_rate, wave=oscillator)
    else:
        with tempfile.TemporaryDirectory() as folder:
            midi.write(f"{folder}/in.mid")
            subprocess.run(fluidsynth_command(Path(folder, "in.mid"), Path(folder, "out.wav"), find_soundfont(soundfont),
                                              effects or {}, sample_rate), check=True, capture_output=True)
            import soundfile

            audio = soundfile.read(f"{folder}/out.wav", dtype="float32", always_2d=True)[0].mean(axis=1)
    peak = np.abs(audio).max() if audio.size else 0.0
    return (0.7 * audio / peak if peak > 0 else audio).astype(np.float32)


@dataclasses.dataclass
class CorpusSpec:
    """What a rendered corpus holds; its hash names the cache folder.

    Attributes:
        collections: names from ``COLLECTIONS``.
        pieces_per_collection: pieces taken from each collection.
        renderings: renderings of each piece (each with its own draws).
        clip_seconds: length of every clip.
        renderer: ``synth`` or ``fluidsynth`` (resolved, not ``auto``).
        val_fraction, test_fraction: shares of the pieces held out.
        seed: the seed of every random choice.
        soundfonts: FluidSynth's soundfonts of the train, val and test clips, in turn (ignored by ``synth``).
        held_out_soundfont: the soundfont of the ``held_out`` split (the test pieces again), or None (no such split;
            ignored by ``synth``).
    """

    collections: list[str]
    pieces_per_collection: int
    renderings: int
    clip_seconds: float
    renderer: str
    val_fraction: float = 0.15
    test_fraction: float = 0.2
    seed: int = 0
    soundfonts: list[str] = dataclasses.field(default_factory=lambda: list(TRAIN_SOUNDFONTS))
    held_out_soundfont: str | None = None

    def key(self) -> str:
        """A short hash of the spec (the soundfonts only for ``fluidsynth``) and the generator version."""
        fields = dataclasses.asdict(self)
        if self.renderer == "synth":
            fields.update(soundfonts=[], held_out_soundfont=None)
        text = json.dumps({**fields, "version": GENERATOR_VERSION}, sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:12]


def render_key(midi_bytes: bytes, rng_seed: Sequence[int], spec: CorpusSpec, soundfont: str | None) -> str:
    """The name of a clip in the render cache: a hash of everything that makes its audio."""
    text = json.dumps({"midi": hashlib.sha1(midi_bytes).hexdigest(), "rng": list(rng_seed), "renderer": spec.renderer,
                       "soundfont": soundfont, "clip_seconds": spec.clip_seconds, "sample_rate": SAMPLE_RATE,
                       "version": RENDER_VERSION}, sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def render_clip(midi_bytes: bytes, rng_seed: Sequence[int], spec: CorpusSpec,
                soundfont: str | None = None) -> tuple[Path, Rendering]:
    """One rendering of a piece (``draw_rendering``, ``prepare_midi``), cut to a clip at the drawn offset and kept in
    the cache.

    Args:
        midi_bytes: the piece's MIDI file.
        rng_seed: the seed of the rendering's draws.
        spec: the corpus (its renderer and clip length).
        soundfont: FluidSynth's soundfont (None with ``synth``).

    Returns:
        ``(cached clip file, the draws)``.
    """
    import soundfile

    rendering = draw_rendering(rng_seed)
    cached = data_home() / "music" / "renders" / f"{render_key(midi_bytes, rng_seed, spec, soundfont)}.wav"
    if cached.is_file():
        return cached, rendering
    audio = render(prepare_midi(midi_bytes, rendering), rendering.family, spec.renderer, soundfont, rendering.effects)
    clip = int(spec.clip_seconds * SAMPLE_RATE)
    start = int(rendering.offset * max(0, audio.size - clip))
    piece_clip = np.zeros(clip, np.float32)
    piece_clip[: audio[start:start + clip].size] = audio[start:start + clip]
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_name(f".{cached.stem}.{os.getpid()}.wav")  # renamed into place: a kill leaves no half file
    soundfile.write(partial, piece_clip, SAMPLE_RATE, subtype="PCM_16")
    os.replace(partial, cached)
    return cached, rendering


def parsed_pieces(pieces: Sequence[Piece], folder: Path) -> tuple[list[tuple[Piece, dict[str, str], bytes]], list[str]]:
    """The pieces that parse, with their score tags and MIDI files.

    Args:
        pieces: the pieces (``corpus_pieces``).
        folder: a scratch folder for music21's MIDI writer.

    Returns:
        ``([(piece, tags, MIDI bytes)], ["piece: error" for each piece that failed])``.
    """
    import pretty_midi

    parsed, failed = [], []
    for piece in pieces:
        try:
            score = parse_piece(piece)
            tags = score_tags(piece, score)
            midi_bytes = Path(score.write("midi", fp=folder / "piece.mid")).read_bytes()
            pretty_midi.PrettyMIDI(io.BytesIO(midi_bytes))
        except Exception as error:  # noqa: BLE001 - music21 raises many types; ~1 work in 25 fails (DATA-SOURCES.md)
            failed.append(f"{piece.name}: {error.__class__.__name__}")
            continue
        parsed.append((piece, tags, midi_bytes))
    (folder / "piece.mid").unlink(missing_ok=True)
    return parsed, failed


def clip_row(folder: Path, name: str, cached: Path, rendering: Rendering, tags: dict[str, str], piece: Piece,
             split: str, soundfont: str | None) -> dict[str, object]:
    """Links a cached clip into the corpus folder as ``name`` and returns its ``metadata.csv`` row."""
    try:  # a hard link shares the cached file's data
        os.link(cached, folder / name)
    except OSError:
        shutil.copyfile(cached, folder / name)
    clip_tags = {**tags, "tempo": tempo_band(rendering.bpm), "instrument": rendering.family}
    return {"path": name, "tags": ";".join(f"{k}:{v}" for k, v in clip_tags.items()), "piece": piece.name,
            "split": split, "soundfont": soundfont or SYNTH_SOURCE, "program": rendering.program,
            "bpm": round(rendering.bpm, 3), "semitones": rendering.semitones,
            "velocity_gamma": round(rendering.velocity_gamma, 4), "effects": json.dumps(rendering.effects)}


def _generate(folder: Path, spec: CorpusSpec) -> None:
    """Renders the corpus of ``spec`` into ``folder`` (clips/*.wav, metadata.csv, info.json)."""
    parsed, failed = parsed_pieces(corpus_pieces(spec.collections, spec.pieces_per_collection, spec.seed), folder)
    fluidsynth = spec.renderer == "fluidsynth"
    rows = []
    (folder / "clips").mkdir()
    splits = split_rule.split_groups([piece.name for piece, _, _ in parsed], spec.val_fraction, spec.test_fraction,
                                     f"the {', '.join(spec.collections)} corpus", "pieces", seed=spec.seed)
    for number, ((piece, tags, midi_bytes), split) in enumerate(zip(parsed, splits)):
        for take in range(spec.renderings):
            soundfont = spec.soundfonts[(number + take) % len(spec.soundfonts)] if fluidsynth else None
            cached, rendering = render_clip(midi_bytes, [spec.seed, number, take], spec, soundfont)
            rows.append(clip_row(folder, f"clips/{number:04d}-{take}.wav", cached, rendering, tags, piece, split,
                                 soundfont))
            if split == "test" and fluidsynth and spec.held_out_soundfont:  # the same piece, an unheard soundfont
                cached, rendering = render_clip(midi_bytes, [spec.seed, number, take, 1], spec, spec.held_out_soundfont)
                rows.append(clip_row(folder, f"clips/{number:04d}-{take}-held-out.wav", cached, rendering, tags,
                                     piece, "held_out", spec.held_out_soundfont))
    with open(folder / "metadata.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    licences = {name: COLLECTIONS[name].licence for name in spec.collections}
    soundfonts = {"train": [str(find_soundfont(name)) for name in spec.soundfonts],
                  "held_out": spec.held_out_soundfont and str(find_soundfont(spec.held_out_soundfont))} \
        if fluidsynth else None
    (folder / "info.json").write_text(json.dumps({"spec": dataclasses.asdict(spec), "renderer": spec.renderer,
                                                  "soundfonts": soundfonts, "licences": licences, "failed": failed},
                                                 indent=1))


def rendered_corpus(spec: CorpusSpec) -> Path:
    """The cached corpus of ``spec``, rendered on first use (atomically: a crash leaves nothing).

    Returns:
        The corpus folder, ``$SEQAPPS_DATA/music/<renderer>-<hash>``.
    """
    final = data_home() / "music" / f"{spec.renderer}-{spec.key()}"
    if (final / "metadata.csv").is_file():
        return final
    return build_folder_atomically(final, lambda folder: _generate(folder, spec))


@dataclasses.dataclass
class TaggedClip:
    """One audio file and its tags.

    Attributes:
        path: the audio file.
        tags: its tag names.
        where: how messages name it (the CSV line, or the file).
        group: clips of one group (a piece) stay in one split.
        split: the split fixed by the corpus (``held_out``: the test pieces in the held-out soundfont), or None.
        source: the soundfont that rendered it (``synth``: pretty_midi), or None (the user's audio).
    """

    path: Path
    tags: list[str]
    where: str
    group: str
    split: str | None = None
    source: str | None = None


def split_tags(text: str) -> list[str]:
    """Tags of a CSV cell: separated by ``;`` or ``|``, stripped, empty ones dropped, order kept, no repeats."""
    return list(dict.fromkeys(tag.strip() for tag in re.split(r"[;|]", text) if tag.strip()))


def read_generated(root: Path) -> list[TaggedClip]:
    """The clips of a rendered corpus with their fixed splits."""
    with open(root / "metadata.csv", newline="", encoding="utf-8") as handle:
        return [TaggedClip(root / row["path"], split_tags(row["tags"]), f"{root / 'metadata.csv'} line {line}",
                           row["piece"], row["split"], row["soundfont"])
                for line, row in enumerate(csv.DictReader(handle), start=2)]


def read_tagged_folder(folder: str | Path, csv_name: str = "tags.csv") -> list[TaggedClip]:
    """Reads the user's tagged audio: ``folder/csv_name`` with columns ``path,tags``, else one sub-folder per tag.

    In the folder layout, files of the same name in several tag folders are one clip with all those tags.

    Args:
        folder: the ``--data`` folder.
        csv_name: the table inside it; paths in it are relative to the folder.

    Returns:
        The clips in table (or sorted file) order; each is its own group.

    Raises:
        DataError: no table and no tag folders, a missing column, a row without tags,
            a row naming a missing file; one line naming the file and line.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"{folder}: not a folder; give a folder of audio with {csv_name} (path,tags) "
                        "or one sub-folder per tag")
    table = folder / csv_name
    if table.is_file():
        try:
            text = table.read_bytes().decode("utf-8-sig")
        except UnicodeDecodeError as error:
            raise DataError(f"{table}: byte {error.start} is not UTF-8 text; save the table as UTF-8") from None
        rows = list(csv.reader(io.StringIO(text)))
        header = [cell.strip().lower() for cell in rows[0]] if rows else []
        if "path" not in header or "tags" not in header:
            raise DataError(f"{table} line 1: expected a header with columns path,tags, got {','.join(header)!r}")
        p, t = header.index("path"), header.index("tags")
        clips = []
        for line, row in enumerate(rows[1:], start=2):
            if not any(cell.strip() for cell in row):
                continue
            where = f"{table} line {line}"
            tags = split_tags(row[t]) if len(row) > t else []
            if not tags:
                raise DataError(f"{where}: the row has no tags; give one or more tags separated by ; or |")
            path = folder / row[p].strip()
            if not path.is_file():
                raise DataError(f"{where}: no such audio file {path}")
            clips.append(TaggedClip(path, tags, f"{where}: audio {path}", str(path)))
        if not clips:
            raise DataError(f"{table}: no rows; expected one row path,tags per clip")
        return clips
    by_name: dict[str, tuple[Path, list[str]]] = {}  # a clip with several tags sits in each tag's folder
    for tag_folder in sorted(p for p in folder.iterdir() if p.is_dir()):
        for path in sorted(tag_folder.iterdir()):
            if path.suffix.lower() in AUDIO_SUFFIXES:
                by_name.setdefault(path.name, (path, []))[1].append(tag_folder.name)
    if not by_name:
        raise DataError(f"{folder}: found neither {csv_name} (columns path,tags) nor tag sub-folders holding "
                        f"audio ({', '.join(AUDIO_SUFFIXES)})")
    return [TaggedClip(path, tags, str(path), name) for name, (path, tags) in by_name.items()]
