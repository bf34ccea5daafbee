"""Tests of the spoken-sentence generator and the transcribed-audio reader (seqapps.data.speech)."""
import csv
import json
import os
import subprocess
import sys

import librosa
import numpy as np
import pytest
import soundfile

from seqapps.data import speech
from seqapps.errors import DataError
from tests.debian_data import installed_or_skip

SENTENCE = "in the beginning god created the heaven and the earth"


def test_spoken_sentences_keep_plain_clauses_of_frequent_words():
    lines = ["The \"if\" statement: use it, often.", "Call f(x) with 3 args; the end", "the cat's hat is red!",
             "the the the", "the cat is here, and the hat is there"]
    kept = speech.spoken_sentences(lines, min_words=3, max_words=6, vocabulary_size=None)
    # digits and symbols drop a clause, quotes are removed, an inner apostrophe stays, duplicates go
    assert kept == ["the if statement", "the cat's hat is red", "the the the", "the cat is here",
                    "and the hat is there"]
    frequent = speech.spoken_sentences(lines, min_words=3, max_words=6, vocabulary_size=3)
    assert frequent == ["the the the"]  # "the", "is", "hat"/"cat" are the 3 most frequent words


def test_normalize_transcript():
    assert speech.normalize_transcript("  Hello,\tWORLD  ﬁne ") == "hello, world fine"


def test_word_spans_group_words_without_events_and_end_at_the_next_onset():
    onsets = [(0, 0), (7, 4544), (17, 14393)]  # as espeak-ng reports "In the beginning God": "the" has none
    spans = speech.word_spans("In the beginning God", onsets, speech_start=889, speech_end=20000)
    assert spans == [("In the", 889, 4544), ("beginning", 4544, 14393), ("God", 14393, 20000)]


def test_espeak_reports_word_onsets_in_order_inside_the_audio():
    audio, onsets = speech.Espeak.get().synthesize(SENTENCE, "en-us+m1", rate=175, pitch=50)
    seconds = audio.size / speech.Espeak.get().sample_rate
    starts = [sample for _, sample in onsets]
    assert audio.dtype == np.int16 and 2.0 < seconds < 4.5
    assert starts == sorted(starts) and starts[-1] < audio.size
    words = {SENTENCE[position:].split()[0] for position, _ in onsets}
    assert {"beginning", "god", "created", "heaven", "earth"} <= words


def test_generated_corpus_is_deterministic_and_holds_out_voices(tmp_path, monkeypatch):
    monkeypatch.setenv("SEQAPPS_DATA", str(tmp_path / "a"))
    sentences = [SENTENCE, "and the earth was without form", "let there be light", "and there was light",
                 "and god saw the light", "that it was good"]
    spec = speech.CorpusSpec("test", {"train": 4, "val": 2, "test": 2}, seed=3)
    root = speech.spoken_corpus(spec, lambda: sentences)
    monkeypatch.setenv("SEQAPPS_DATA", str(tmp_path / "b"))
    again = speech.spoken_corpus(spec, lambda: sentences)
    assert (root / "metadata.csv").read_bytes() == (again / "metadata.csv").read_bytes()
    assert (root / "wavs/test_00001.wav").read_bytes() == (again / "wavs/test_00001.wav").read_bytes()
    with open(root / "metadata.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    variants = {split: {row["voice"].split("+")[1] for row in rows if row["split"] == split}
                for split in ("train", "val", "test")}
    transcripts = {split: {row["transcript"] for row in rows if row["split"] == split} for split in variants}
    assert not variants["train"] & (variants["val"] | variants["test"])
    assert not transcripts["train"] & (transcripts["val"] | transcripts["test"])
    audio, rate = soundfile.read(root / rows[0]["path"])
    spans = json.loads((root / "words.json").read_text())[rows[0]["path"]]
    assert rate == speech.SAMPLE_RATE and " ".join(words for words, _, _ in spans) == rows[0]["transcript"]
    assert all(0 <= start < end <= audio.size / rate for _, start, end in spans)
    utterances, _ = speech.read_generated(root)
    assert [len(utterances[s]) for s in ("train", "val", "test")] == [4, 2, 2]


def _write_wav(path, seconds=0.5, amplitude=0.3, rate=22050):
    t = np.arange(int(seconds * rate)) / rate
    soundfile.write(path, (amplitude * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate)


def test_read_transcripts_common_voice_and_ljspeech_layouts(tmp_path):
    (tmp_path / "wavs").mkdir()
    _write_wav(tmp_path / "wavs" / "a.wav")
    (tmp_path / "cv.tsv").write_text("client_id\tpath\tsentence\nx\twavs/a.wav\tHello  World\n")
    (tmp_path / "metadata.csv").write_text('a|Printing, "in" the 1st sense|Printing, "in" the first sense\n')
    assert [(u.path.name, u.transcript) for u in speech.read_transcripts(tmp_path, "cv.tsv")] == [
        ("a.wav", "hello world")]
    assert [u.transcript for u in speech.read_transcripts(tmp_path)] == ['printing, "in" the first sense']
    waveform, = speech.load_waveforms(speech.read_transcripts(tmp_path), max_seconds=2.0)
    assert waveform.dtype == np.float32 and waveform.size == 8000  # 0.5 s resampled from 22,050 Hz to 16 kHz


@pytest.mark.parametrize("table, message", [
    ("path,transcript\nwavs/missing.wav,hello\n", "line 2: audio file .*missing.wav not found"),
    ("path,transcript\nwavs/ok.wav,hello\nwavs/ok.wav,\n", "line 3: the transcript of wavs/ok.wav is empty"),
    ("file,words\nwavs/ok.wav,hello\n", "expected a header with columns path and transcript"),
    ("path,caption\nwavs/ok.wav,hello\n", "no transcript column"),
    ("", "the file is empty"),
])
def test_bad_transcript_tables_name_the_row(tmp_path, table, message):
    (tmp_path / "wavs").mkdir()
    _write_wav(tmp_path / "wavs" / "ok.wav")
    (tmp_path / "metadata.csv").write_text(table)
    with pytest.raises(DataError, match=message) as raised:
        speech.read_transcripts(tmp_path)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("content, message", [
    (b"", "the file is empty"),
    (b"RIFF\x10\x00\x00\x00WAVEfmt garbage", "cannot be read as audio"),
    ("silent", "is silent"),
    ("long", "3.0 s long, longer than the limit of 2 s"),
])
def test_bad_audio_is_a_data_error_naming_the_row(tmp_path, content, message):
    (tmp_path / "wavs").mkdir()
    path = tmp_path / "wavs" / "x.wav"
    if content == "silent":
        _write_wav(path, amplitude=0.0)
    elif content == "long":
        _write_wav(path, seconds=3.0)
    else:
        path.write_bytes(content)
    (tmp_path / "metadata.csv").write_text("path,transcript\nwavs/x.wav,hello\n")
    with pytest.raises(DataError, match=message) as raised:
        speech.load_waveforms(speech.read_transcripts(tmp_path), max_seconds=2.0)
    assert "metadata.csv line 2" in str(raised.value) and "\n" not in str(raised.value)


def test_characters_the_model_cannot_emit_are_listed_or_dropped():
    rows = [speech.Utterance(None, "héllo wörld", "m.csv", 2), speech.Utterance(None, "ok", "m.csv", 3)]
    with pytest.raises(DataError, match=r"2 transcript character\(s\).*'é' \(m.csv line 2\), 'ö' \(m.csv line 2\)"):
        speech.apply_charset(rows, "abcdefghijklmnopqrstuvwxyz ")
    assert [u.transcript for u in speech.apply_charset(rows, "abcdefghijklmnopqrstuvwxyz ", "drop")] == [
        "hllo wrld", "ok"]
    with pytest.raises(DataError, match="m.csv line 2: nothing is left"):
        speech.apply_charset(rows[:1], "xyz ", "drop")


def test_long_clips_are_cut_at_the_quietest_moment():
    rate = 1000
    tone = np.sin(np.arange(10 * rate) / 3.0).astype(np.float32)
    tone[6500:6600] = 0.0  # a pause at 6.5-6.6 s, in the last third of the first 9 s window
    pieces = speech.split_at_silences(tone, max_samples=9 * rate, sample_rate=rate)
    assert [p.size for p in pieces] == [6525, 3475]  # cut at the centre of the first silent 50 ms frame
    assert np.array_equal(np.concatenate(pieces), tone)
    assert len(speech.split_at_silences(tone, 10 * rate, rate)) == 1


#: the Debian packages of the Festival and Flite readers
SYNTHESISERS = "festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts flite"


def test_festival_speaks_each_voice_with_word_times_that_spell_the_sentence(tmp_path):
    text = "the cat's hat is red"
    for voice in speech.ENGINE_VOICES["festival"]:
        (path, spans), = installed_or_skip(lambda: speech.festival_synthesize([text], voice, [1.0], tmp_path),
                                          SYNTHESISERS)
        audio, rate = soundfile.read(path)
        assert rate >= 16000 and 0.8 < audio.size / rate < 4.0  # the HTS voice speaks at 32 kHz
        assert [word for word, _, _ in spans] == text.split()  # the clitic 's joins its word
        times = [t for _, start, end in spans for t in (start, end)]
        assert times == sorted(times) and 0 < times[0] and times[-1] <= audio.size / rate


def test_festival_words_that_do_not_spell_the_sentence_give_no_times():
    words = [("the", 0.1, 0.2), ("cat", 0.2, 0.5), ("'s", 0.0, 0.0)]
    assert speech._festival_word_spans(words, "the cat's") == [("the", 0.1, 0.2), ("cat's", 0.2, 0.5)]
    assert speech._festival_word_spans(words, "the cats") is None


def test_flite_is_a_second_engine_with_its_own_voices(tmp_path):
    assert set(speech.FLITE_VOICES) <= set(installed_or_skip(speech.flite_voices, SYNTHESISERS))
    path = speech.flite_synthesize("let there be light", "slt", 1.2, tmp_path / "a.wav")
    audio, rate = soundfile.read(path)
    slower = speech.flite_synthesize("let there be light", "slt", 1.5, tmp_path / "b.wav")
    assert rate == 16000 and soundfile.info(slower).frames > audio.size > 0.5 * rate


def pico_or_skip(reader):
    """``reader()``, skipping when the pip package ttspico (a C build) is missing, except under CI."""
    return installed_or_skip(reader, f"pip {speech.PICO_PACKAGE}")


def _median_f0(samples: np.ndarray) -> float:
    f0, _, _ = librosa.pyin(samples.astype(np.float32) / 32768, fmin=60, fmax=500, sr=speech.SAMPLE_RATE)
    return float(np.nanmedian(f0))


@pytest.mark.parametrize("voice", speech.ENGINE_VOICES["pico"])
def test_pico_speaks_a_female_voice_at_the_rate_and_pitch_asked(voice):
    text = "let there be light and there was light"
    plain = pico_or_skip(lambda: speech.pico_synthesize(text, voice, 100, 100))
    faster = speech.pico_synthesize(text, voice, 200, 100)
    higher = speech.pico_synthesize(text, voice, 100, 141)
    assert plain.dtype == np.int16 and 1.5 < plain.size / speech.SAMPLE_RATE < 4
    assert 1.6 < plain.size / faster.size < 2.1  # twice the rate, minus the pauses Pico keeps
    assert _median_f0(plain) > 150  # both voices are female (slt, the held-out voice, is at about 175 Hz)
    assert _median_f0(higher) / _median_f0(plain) == pytest.approx(1.41, rel=0.03)  # librosa's pyin as reference


def test_pico_speaks_the_same_after_tensorflow_is_loaded():
    """Pico and TensorFlow's framework library export the same FFT names (``rdft``, ...): Pico must call its
    own, in a process that imported TensorFlow first (every training run's), as in one that never did."""
    speak = ("from seqapps.data import speech; import hashlib; "
             "print(hashlib.md5(speech.pico_synthesize('let there be light', 'en-GB', 120, 90).tobytes()).hexdigest())")
    pico_or_skip(lambda: speech.pico_synthesize("a", "en-GB", 100, 100))
    digests = [subprocess.run([sys.executable, "-c", first + speak], capture_output=True, text=True, check=False,
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
               for first in ("", "import tensorflow; ")]
    assert [d.returncode for d in digests] == [0, 0], digests[1].stderr[-500:]
    assert digests[0].stdout == digests[1].stdout and len(digests[0].stdout.strip()) == 32


def test_pico_rate_and_pitch_come_from_the_jobs_scales():
    job = speech._Job("x.wav", "train", "a b", speech.Source("pico"), "en-US", 175, 50, 50, None)
    assert speech._pico_rate_and_pitch(job) == (100, 100)
    job.rate, job.pitch = 210, 75
    assert speech._pico_rate_and_pitch(job) == (120, 119)  # 2 ** (25 / 100): three semitones


def test_a_missing_pico_is_one_line_naming_the_pip_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "ttspico", None)  # import ttspico raises ImportError
    with pytest.raises(DataError) as raised:
        speech.Source.parse("pico").require()
    assert "`pip install ttspico`" in str(raised.value) and "\n" not in str(raised.value)


def test_pico_without_its_voice_files_is_one_line_naming_the_reinstall(monkeypatch):
    class NoVoiceFiles:
        def __init__(self, language):
            raise RuntimeError(f"Could not instantiate TTS engine with language {language}")

    monkeypatch.setitem(sys.modules, "ttspico", type(sys)("ttspico"))
    sys.modules["ttspico"].TtsEngine = NoVoiceFiles
    monkeypatch.setattr(speech, "_PICO_ENGINES", {})
    with pytest.raises(DataError) as raised:
        speech.pico_synthesize("let there be light", "en-GB", 100, 100)
    assert "'en-GB'" in str(raised.value) and "`pip install --force-reinstall ttspico`" in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_corpus_with_pico_labels_its_rows_gives_no_word_times_and_repeats_under_its_seed(tmp_path, monkeypatch):
    sentences = [SENTENCE, "and the earth was without form", "let there be light", "and there was light",
                 "and god saw the light", "that it was good"]
    spec = speech.CorpusSpec("test", {"train": 4, "val": 2, "test": 2}, seed=3, sources=["espeak", "pico"],
                             test_sets=["espeak", "pico:en-GB"])
    roots = []
    for copy in ("a", "b"):
        monkeypatch.setenv("SEQAPPS_DATA", str(tmp_path / copy))
        roots.append(pico_or_skip(lambda: speech.spoken_corpus(spec, lambda: sentences)))
    utterances, words = speech.read_generated(roots[0])
    assert [u.source for u in utterances["train"]] == ["espeak", "pico"] * 2
    assert {u.speaker for u in utterances["train"] if u.engine == "pico"} <= set(speech.ENGINE_VOICES["pico"])
    assert [u.speaker for u in utterances["test"] if u.engine == "pico"] == ["en-GB"] * 2
    for utterance in utterances["train"] + utterances["test"]:
        assert (f"wavs/{utterance.path.name}" in words) == (utterance.engine == "espeak")
    files = sorted(p.relative_to(roots[0]) for p in roots[0].rglob("*.wav"))
    assert files and all((roots[0] / f).read_bytes() == (roots[1] / f).read_bytes() for f in files)


@pytest.mark.parametrize("source, packages", [("festival:kal_diphone", speech.FESTIVAL_PACKAGES),
                                              ("flite", speech.FLITE_PACKAGES)])
def test_a_missing_synthesiser_is_one_line_naming_the_apt_command(tmp_path, monkeypatch, source, packages):
    monkeypatch.setenv("PATH", str(tmp_path))  # no festival, no flite
    with pytest.raises(DataError) as raised:
        speech.Source.parse(source).require()
    assert f"`apt-get install -y {packages}`" in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize("text, message", [("marytts", "unknown engine 'marytts'"),
                                           ("festival:rab_diphone", "Festival has no voice 'rab_diphone'")])
def test_bad_source_names_are_one_line(text, message):
    with pytest.raises(DataError, match=message):
        speech.Source.parse(text)
    assert str(speech.Source.parse("festival:kal_diphone")) == "festival:kal_diphone"
    assert speech.Source.parse("flite").title() == "CMU Flite"
    assert speech.Source.parse("pico:en-GB").title() == "SVOX Pico en-GB"
    with pytest.raises(DataError, match="SVOX Pico has no voice 'fr-FR'"):
        speech.Source.parse("pico:fr-FR")


def test_a_corpus_of_several_engines_labels_every_row_and_keeps_times_where_the_engine_gives_them(
        tmp_path, monkeypatch):
    monkeypatch.setenv("SEQAPPS_DATA", str(tmp_path))
    sentences = [SENTENCE, "and the earth was without form", "let there be light", "and there was light",
                 "and god saw the light", "that it was good"]
    spec = speech.CorpusSpec("test", {"train": 6, "val": 2, "test": 2}, seed=3,
                             sources=["espeak", "festival:kal_diphone", "festival:ked_diphone"],
                             test_sets=["espeak", "festival:cmu_us_slt_arctic_hts", "flite"])
    root = installed_or_skip(lambda: speech.spoken_corpus(spec, lambda: sentences), SYNTHESISERS)
    utterances, words = speech.read_generated(root)
    assert [u.source for u in utterances["train"]] == ["espeak", "festival:kal_diphone", "festival:ked_diphone"] * 2
    assert [u.source for u in utterances["test"]] == ["espeak"] * 2 + ["festival:cmu_us_slt_arctic_hts"] * 2 + [
        "flite"] * 2
    assert {u.engine for u in utterances["test"]} == {"espeak", "festival", "flite"}
    for split in ("train", "test"):
        for utterance in utterances[split]:
            audio, rate = soundfile.read(utterance.path)
            assert rate == speech.SAMPLE_RATE and audio.size > 0.5 * rate
            spans = words.get(f"wavs/{utterance.path.name}")
            assert (spans is None) == (utterance.engine == "flite")  # Flite gives no word times
            if spans:
                assert " ".join(w for w, _, _ in spans) == utterance.transcript
                assert all(0 <= start < end <= audio.size / rate + 1e-3 for _, start, end in spans)
