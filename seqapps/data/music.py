"""Tagged music clips: scores from the music21 corpus rendered to audio, and the user's tagged audio.

Generated corpus (``rendered_corpus``): pieces from licence-checked collections of the
music21 corpus (Bach chorales, Palestrina masses, Monteverdi madrigals, reels, jigs and
hornpipes from Ryan's Mammoth Collection; the Essen folk songs are left out, their
licence is non-commercial only) are parsed, written to MIDI, given an instrument program
and a tempo drawn from the seed for each rendering, and rendered to 16 kHz audio by
FluidSynth with a General MIDI soundfont (``renderer="fluidsynth"``, when the
``fluidsynth`` binary and a soundfont exist) or by ``pretty_midi``'s synthesiser
(``renderer="synth"``: one oscillator waveform per instrument family, so the family is
audible). Every tag is true by construction or from the score: ``genre:``,
``composer:`` (where known), ``mode:`` (music21's key analysis), ``meter:``,
``tempo:`` (band of the drawn tempo) and ``instrument:`` (family of the drawn
program). Fixed-length clips go to ``$SEQAPPS_DATA/music/<hash>/`` with a
``metadata.csv`` (path, tags, piece, split) and ``info.json`` naming the renderer.
Splits are by piece: no piece is in two splits.

User data (``read_tagged_folder``): a folder with a CSV ``path,tags`` (tags separated
by ``;`` or ``|``), or one sub-folder per tag.
"""
from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from seqapps.data.files import build_folder_atomically
from seqapps.data.files import data_home
from seqapps.errors import DataError

SAMPLE_RATE = 16000
GENERATOR_VERSION = 2
SOUNDFONT_DIR = Path("/usr/share/sounds/sf2")
SOUNDFONTS = ("TimGM6mb.sf2", "FluidR3_GM.sf2", "default-GM.sf2")
RENDERERS = ("auto", "synth", "fluidsynth")
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3")
#: instrument family -> (General MIDI programs, the synth renderer's oscillator)
FAMILIES = {"piano": ((0, 1, 4), "sine"), "organ": ((16, 19), "square"), "strings": ((40, 42, 48), "sawtooth"),
            "flute": ((73, 72), "sine"), "brass": ((56, 61), "sawtooth"), "reed": ((71, 68), "square")}
TEMPO_BANDS = ((0, 80, "slow"), (80, 120, "moderate"), (120, 1000, "fast"))
#: collection -> (music21 corpus folder, file pattern, genre or None (from the file name), composer, licence)
COLLECTIONS = {
    "bach": ("bach", r"^bwv.*\.mxl$", "chorale", "bach", "public domain (J. S. Bach); music21 corpus encoding"),
    "palestrina": ("palestrina", r"\.krn$", "mass", "palestrina",
                   "public domain (Palestrina); music21 corpus Humdrum encoding"),
    "monteverdi": ("monteverdi", r"^madrigal.*\.mxl$", "madrigal", "monteverdi",
                   "public domain (Monteverdi); music21 corpus encoding"),
    "ryans": ("ryansMammoth", r"(Reel|Jig|Hornpipe)\.abc$", None, None,
              "public domain (Ryan's Mammoth Collection, 1883); music21 corpus ABC encoding"),
}


def corpus_pieces(collections: Sequence[str], per_collection: int, seed: int) -> list[tuple[str, Path]]:
    """Picks pieces from each collection, deterministically.

    Args:
        collections: names from ``COLLECTIONS``.
        per_collection: pieces to take from each.
        seed: the seed of the choice.

    Returns:
        ``(collection, score path)`` pairs.
    """
    import music21

    root = Path(music21.__file__).parent / "corpus"
    chosen = []
    for name in collections:
        folder, pattern, _, _, _ = COLLECTIONS[name]
        paths = sorted(p for p in (root / folder).iterdir() if re.search(pattern, p.name))
        order = np.random.default_rng([seed, len(chosen)]).permutation(len(paths))
        chosen += [(name, paths[i]) for i in order[:per_collection]]
    return chosen


def score_tags(collection: str, path: Path, score: object) -> dict[str, str]:
    """The tags a score carries itself: genre, composer, mode and meter.

    Args:
        collection: its collection name.
        path: its corpus file (a fiddle tune's genre is the end of its file name).
        score: the parsed ``music21`` score.
    """
    from music21 import meter

    _, _, genre, composer, _ = COLLECTIONS[collection]
    tags = {"genre": genre or re.search(r"(Reel|Jig|Hornpipe)\.abc$", path.name).group(1).lower()}
    if composer:
        tags["composer"] = composer
    tags["mode"] = score.analyze("key").mode
    signature = score.recurse().getElementsByClass(meter.TimeSignature).first()
    if signature is not None:
        tags["meter"] = signature.ratioString
    return tags


def tempo_band(bpm: float) -> str:
    """``slow``, ``moderate`` or ``fast`` for a tempo in quarter notes per minute."""
    return next(name for low, high, name in TEMPO_BANDS if low <= bpm < high)


def find_soundfont() -> Path | None:
    """The first General MIDI soundfont installed under ``/usr/share/sounds/sf2``, or None."""
    return next((SOUNDFONT_DIR / name for name in SOUNDFONTS if (SOUNDFONT_DIR / name).is_file()), None)


def resolve_renderer(renderer: str) -> str:
    """``auto`` -> ``fluidsynth`` when its binary and a soundfont are installed, else ``synth``.

    Raises:
        DataError: ``fluidsynth`` was asked for and is missing.
    """
    available = shutil.which("fluidsynth") is not None and find_soundfont() is not None
    if renderer == "fluidsynth" and not available:
        raise DataError("renderer=fluidsynth needs the fluidsynth binary and a soundfont in /usr/share/sounds/sf2 "
                        "(apt-get install fluidsynth timgm6mb-soundfont); or use --set renderer=synth")
    return "fluidsynth" if renderer == "fluidsynth" or (renderer == "auto" and available) else "synth"


def render(midi: object, family: str, renderer: str, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Renders a ``pretty_midi.PrettyMIDI`` (programs already set) to mono float32 audio.

    Args:
        midi: the MIDI data.
        family: the instrument family (the synth renderer's oscillator).
        renderer: ``synth`` or ``fluidsynth``.
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
            subprocess.run(["fluidsynth", "-ni", "-q", "-g", "0.6", "-r", str(sample_rate), "-F", f"{folder}/out.wav",
                            str(find_soundfont()), f"{folder}/in.mid"], check=True, capture_output=True)
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
        renderings: renderings of each piece (each its own instrument and tempo).
        clip_seconds: length of every clip.
        renderer: ``synth`` or ``fluidsynth`` (resolved, not ``auto``).
        val_fraction, test_fraction: shares of the pieces held out.
        seed: the seed of every random choice.
    """

    collections: list[str]
    pieces_per_collection: int
    renderings: int
    clip_seconds: float
    renderer: str
    val_fraction: float = 0.15
    test_fraction: float = 0.2
    seed: int = 0

    def key(self) -> str:
        """A short hash of the spec and the generator version."""
        text = json.dumps({**dataclasses.asdict(self), "version": GENERATOR_VERSION}, sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:12]


def split_groups(groups: Sequence[str], val_fraction: float, test_fraction: float, seed: int) -> list[str]:
    """The split of each item, by group: a seeded permutation of the distinct groups cut into test, val and train.

    Args:
        groups: each item's group (a piece); a group's items share a split.
        val_fraction, test_fraction: shares of the groups held out (each at least one group).
        seed: the seed of the permutation.

    Returns:
        ``"train"``, ``"val"`` or ``"test"`` for each item.

    Raises:
        DataError: fewer than 3 groups, so a split would be empty.
    """
    distinct = list(dict.fromkeys(groups))
    if len(distinct) < 3:
        raise DataError(f"{len(distinct)} clip(s) or piece(s) cannot fill train, validation and test; give at "
                        "least 3 (better dozens)")
    order = np.random.default_rng(seed).permutation(len(distinct))
    n_test = max(1, round(len(distinct) * test_fraction))
    n_val = max(1, min(round(len(distinct) * val_fraction), len(distinct) - n_test - 1))
    split_of = {distinct[index]: "test" if rank < n_test else "val" if rank < n_test + n_val else "train"
                for rank, index in enumerate(order)}
    return [split_of[group] for group in groups]


def _generate(folder: Path, spec: CorpusSpec) -> None:
    """Renders the corpus of ``spec`` into ``folder`` (clips/*.wav, metadata.csv, info.json)."""
    import music21
    import pretty_midi
    import soundfile

    clip = int(spec.clip_seconds * SAMPLE_RATE)
    parsed, failed = [], []
    for collection, path in corpus_pieces(spec.collections, spec.pieces_per_collection, spec.seed):
        try:
            score = music21.converter.parse(path)
            tags = score_tags(collection, path, score)
            midi_bytes = Path(score.write("midi", fp=folder / "piece.mid")).read_bytes()
            pretty_midi.PrettyMIDI(io.BytesIO(midi_bytes))
        except Exception as error:  # noqa: BLE001 - music21 raises many types; ~1 work in 25 fails (DATA-SOURCES.md)
            failed.append(f"{path.name}: {error.__class__.__name__}")
            continue
        parsed.append((collection, path, tags, midi_bytes))
    (folder / "piece.mid").unlink(missing_ok=True)
    rows = []
    (folder / "clips").mkdir()
    splits = split_groups([str(path) for _, path, _, _ in parsed], spec.val_fraction, spec.test_fraction, spec.seed)
    for number, ((collection, path, tags, midi_bytes), split) in enumerate(zip(parsed, splits)):
        for take in range(spec.renderings):
            rng = np.random.default_rng([spec.seed, number, take])
            midi = pretty_midi.PrettyMIDI(io.BytesIO(midi_bytes))
            family = list(FAMILIES)[rng.integers(len(FAMILIES))]
            program = int(rng.choice(FAMILIES[family][0]))
            for instrument in midi.instruments:
                instrument.program, instrument.is_drum = program, False
            bpm = float(rng.uniform(50, 180))
            written = midi.get_tempo_changes()[1][0] if len(midi.get_tempo_changes()[1]) else 120.0
            end = midi.get_end_time()
            midi.adjust_times([0.0, end], [0.0, end * written / bpm])
            audio = render(midi, family, spec.renderer)
            start = int(rng.integers(0, max(1, audio.size - clip)))
            piece_clip = np.zeros(clip, np.float32)
            piece_clip[: audio[start:start + clip].size] = audio[start:start + clip]
            name = f"clips/{number:04d}-{take}.wav"
            soundfile.write(folder / name, piece_clip, SAMPLE_RATE, subtype="PCM_16")
            clip_tags = {**tags, "tempo": tempo_band(bpm), "instrument": family}
            rows.append({"path": name, "tags": ";".join(f"{k}:{v}" for k, v in clip_tags.items()),
                         "piece": f"{collection}/{path.name}", "split": split, "program": program,
                         "bpm": round(bpm, 1)})
    with open(folder / "metadata.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    licences = {name: COLLECTIONS[name][4] for name in spec.collections}
    (folder / "info.json").write_text(json.dumps({"spec": dataclasses.asdict(spec), "renderer": spec.renderer,
                                                  "soundfont": str(find_soundfont()) if spec.renderer == "fluidsynth"
                                                  else None, "licences": licences, "failed": failed}, indent=1))


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
        split: the split fixed by the corpus, or None.
    """

    path: Path
    tags: list[str]
    where: str
    group: str
    split: str | None = None


def split_tags(text: str) -> list[str]:
    """Tags of a CSV cell: separated by ``;`` or ``|``, stripped, empty ones dropped, order kept, no repeats."""
    return list(dict.fromkeys(tag.strip() for tag in re.split(r"[;|]", text) if tag.strip()))


def read_generated(root: Path) -> list[TaggedClip]:
    """The clips of a rendered corpus with their fixed splits."""
    with open(root / "metadata.csv", newline="", encoding="utf-8") as handle:
        return [TaggedClip(root / row["path"], split_tags(row["tags"]), f"{root / 'metadata.csv'} line {line}",
                           row["piece"], row["split"]) for line, row in enumerate(csv.DictReader(handle), start=2)]


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
