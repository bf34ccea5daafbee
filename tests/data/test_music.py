"""Tests of the rendered music corpus (seqapps.data.music): its soundfonts, the held-out one, and each rendering's
draws (transposition, velocity curve, tempo, reverb and chorus) against references."""
import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest

from pipelines.music_tagging import HELD_OUT, MusicTagging
from seqapps.config import ConfigError, resolve_config
from seqapps.data import music
from seqapps.errors import DataError
from tests.debian_data import installed_or_skip
from tests.pipelines.cli_runner import assert_rejected_in_one_line

RATE = music.SAMPLE_RATE
PACKAGES = "fluidsynth timgm6mb-soundfont fluid-soundfont-gm csound-soundfont"
#: a small FluidSynth corpus: 6 pieces, each rendered once, 2 s clips
SMALL = ["collections=[bach,ryans]", "pieces_per_collection=3", "renderings=1", "clip_seconds=2.0",
         "window_seconds=1.0", "renderer=fluidsynth"]


def _midi_bytes(notes: list[tuple[int, int, float, float]], bpm: float = 120.0) -> bytes:
    """A one-part MIDI file at ``bpm`` with notes ``(pitch, velocity, start s, end s)``."""
    import pretty_midi

    midi = pretty_midi.PrettyMIDI(initial_tempo=bpm)
    midi.instruments.append(pretty_midi.Instrument(0))
    midi.instruments[0].notes += [pretty_midi.Note(velocity=v, pitch=p, start=s, end=e) for p, v, s, e in notes]
    buffer = io.BytesIO()
    midi.write(buffer)
    return buffer.getvalue()


def _rendering(**draws) -> music.Rendering:
    fields = {"family": "piano", "program": 0, "bpm": 120.0, "semitones": 0, "velocity_gamma": 1.0, "effects": {},
              "offset": 0.0}
    return music.Rendering(**{**fields, **draws})


def test_the_default_config_lists_two_training_soundfonts_and_holds_out_a_third():
    config = resolve_config(MusicTagging.Config, "default")
    assert config.soundfonts == ["TimGM6mb.sf2", "FluidR3_GM.sf2"] and config.held_out_soundfont == "sf_GMbank.sf2"
    assert {music.SOUNDFONT_PACKAGES[name] for name in [*config.soundfonts, config.held_out_soundfont]} == {
        "timgm6mb-soundfont", "fluid-soundfont-gm", "csound-soundfont"}
    assert resolve_config(MusicTagging.Config, "tiny").renderer == "synth"  # pip only: no soundfont
    single = resolve_config(MusicTagging.Config, "default", overrides=["soundfonts=[TimGM6mb.sf2]",
                                                                       "held_out_soundfont=null"])
    assert single.soundfonts == ["TimGM6mb.sf2"] and single.held_out_soundfont is None
    with pytest.raises(ConfigError, match="held_out_soundfont"):  # the held-out soundfont must not be trained on
        resolve_config(MusicTagging.Config, "default", overrides=["held_out_soundfont=FluidR3_GM.sf2"])
    with pytest.raises(ConfigError, match="soundfonts"):
        resolve_config(MusicTagging.Config, "default", overrides=["soundfonts=[]"])


def test_synth_corpora_ignore_the_soundfonts_in_their_cache_key():
    spec = music.CorpusSpec(["bach"], 2, 1, 2.0, "synth")
    other = music.CorpusSpec(["bach"], 2, 1, 2.0, "synth", soundfonts=["x.sf2"], held_out_soundfont="y.sf2")
    assert spec.key() == other.key()
    assert music.CorpusSpec(["bach"], 2, 1, 2.0, "fluidsynth").key() != music.CorpusSpec(
        ["bach"], 2, 1, 2.0, "fluidsynth", soundfonts=["TimGM6mb.sf2"]).key()


def test_a_missing_soundfont_or_fluidsynth_is_one_line_naming_the_apt_get_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(music, "SOUNDFONT_DIRS", (tmp_path,))
    with pytest.raises(DataError) as caught:
        music.find_soundfont("FluidR3_GM.sf2")
    assert str(caught.value) == ("soundfont FluidR3_GM.sf2 is not installed: apt-get install fluid-soundfont-gm; "
                                 "or use --set renderer=synth")
    with pytest.raises(DataError, match=r"^soundfont mine.sf2: no such file in .*; give an installed .sf2/.sf3 file"):
        music.find_soundfont("mine.sf2")
    (tmp_path / "mine.sf2").write_bytes(b"")
    assert music.find_soundfont("mine.sf2") == tmp_path / "mine.sf2"
    assert music.find_soundfont(str(tmp_path / "mine.sf2")) == tmp_path / "mine.sf2"  # a path is taken as it is
    monkeypatch.setattr(music.shutil, "which", lambda name: "/usr/bin/fluidsynth")
    assert_rejected_in_one_line(capsys, tmp_path / "out", "music_tagging", ["--set", "renderer=fluidsynth"],
                                "soundfont TimGM6mb.sf2 is not installed: apt-get install timgm6mb-soundfont")
    assert music.resolve_renderer("synth", ["FluidR3_GM.sf2"]) == "synth"
    monkeypatch.setattr(music.shutil, "which", lambda name: None)
    assert music.resolve_renderer("auto", ["FluidR3_GM.sf2"]) == "synth"
    with pytest.raises(DataError, match=r"^renderer=fluidsynth needs the fluidsynth binary: apt-get install fluidsynth;"):
        music.resolve_renderer("fluidsynth", [])


def test_draws_are_the_seeds_and_span_their_ranges():
    draws = [music.draw_rendering([42, number, 0]) for number in range(300)]
    assert draws[7] == music.draw_rendering([42, 7, 0]) and draws[7] != music.draw_rendering([42, 7, 1])
    assert {d.semitones for d in draws} == set(range(-music.MAX_SEMITONES, music.MAX_SEMITONES + 1))
    assert {music.tempo_band(d.bpm) for d in draws} == {"slow", "moderate", "fast"}
    assert all(music.TEMPO_BANDS[0][0] <= d.bpm < music.TEMPO_BANDS[-1][1] for d in draws)
    gammas = np.array([d.velocity_gamma for d in draws])
    assert gammas.min() >= 0.5 and gammas.max() <= 2.0 and (gammas < 1).mean() == pytest.approx(0.5, abs=0.1)
    for name, (low, high) in music.EFFECT_RANGES.items():
        values = [d.effects[name] for d in draws]
        assert low <= min(values) and max(values) <= high and len(set(values)) > 5
        assert all(isinstance(v, int) for v in values) == isinstance(low, int)
    assert {d.family for d in draws} == set(music.FAMILIES)
    assert all(d.program in music.FAMILIES[d.family][0] for d in draws)


def test_prepared_midi_is_transposed_through_the_velocity_curve_at_the_drawn_tempo():
    import pretty_midi

    notes = [(60, 100, 0.0, 0.5), (64, 40, 0.5, 1.0), (126, 127, 1.0, 1.5), (1, 1, 1.5, 2.0)]
    midi = music.prepare_midi(_midi_bytes(notes, bpm=120.0), _rendering(program=40, bpm=80.0, semitones=2,
                                                                        velocity_gamma=0.5))
    played = midi.instruments[0]
    assert played.program == 40 and not played.is_drum
    pitches, velocities, starts, ends = (np.array([note[i] for note in notes]) for i in range(4))
    assert [n.pitch for n in played.notes] == np.minimum(pitches + 2, 127).tolist()  # 126 + 2 stays at 127
    np.testing.assert_array_equal([n.velocity for n in played.notes],
                                  np.maximum(1, np.round(127 * (velocities / 127) ** 0.5)).astype(int))
    stretch = 120.0 / 80.0  # from the written tempo to the drawn one
    np.testing.assert_allclose([n.start for n in played.notes], starts * stretch, atol=2e-3)
    np.testing.assert_allclose([n.end for n in played.notes], ends * stretch, atol=2e-3)
    assert music.velocity_curve(64, 2.0) == 32 and music.velocity_curve(1, 2.0) == 1  # never silent
    # the synthesiser plays the transposed pitch: A4 up 2 semitones is B4
    audio = music.render(music.prepare_midi(_midi_bytes([(69, 100, 0.0, 1.0)]), _rendering(semitones=2)), "flute",
                         "synth")
    spectrum = np.abs(np.fft.rfft(audio[:RATE]))
    assert np.fft.rfftfreq(RATE, 1 / RATE)[spectrum.argmax()] == pytest.approx(pretty_midi.note_number_to_hz(71),
                                                                             abs=1.0)


def test_fluidsynth_gets_the_drawn_reverb_and_chorus_and_reverb_lengthens_the_tail(tmp_path):
    effects = music.draw_rendering([0, 1, 2]).effects
    command = music.fluidsynth_command(tmp_path / "in.mid", tmp_path / "out.wav", tmp_path / "sf.sf2", effects)
    settings = [command[i + 1] for i, arg in enumerate(command) if arg == "-o"]
    assert settings == [f"{name}={value}" for name, value in effects.items()]
    assert command[-2:] == [str(tmp_path / "sf.sf2"), str(tmp_path / "in.mid")]
    installed_or_skip(lambda: music.resolve_renderer("fluidsynth", ["FluidR3_GM.sf2"]), PACKAGES)
    midi = music.prepare_midi(_midi_bytes([(60, 110, 0.0, 0.3)]), _rendering())
    dry = {name: 0.0 if name.endswith("level") else low for name, (low, _) in music.EFFECT_RANGES.items()}
    wet = {**dry, "synth.reverb.room-size": 1.0, "synth.reverb.level": 1.0, "synth.reverb.width": 100.0}
    tails = [np.abs(music.render(midi, "piano", "fluidsynth", "FluidR3_GM.sf2", settings)[int(1.2 * RATE):]).sum()
             for settings in (dry, wet)]
    assert tails[1] > 2 * tails[0]  # peak-normalised renders: the reverberant one rings on after the note


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    """The small FluidSynth corpus loaded by the pipeline, rendered into a fresh data folder."""
    home = tmp_path_factory.mktemp("music_data")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SEQAPPS_DATA", str(home))
        config = resolve_config(MusicTagging.Config, "tiny", overrides=SMALL)
        data = installed_or_skip(lambda: MusicTagging().load_data(config, None), PACKAGES)
    return config, data, Path(data.report["source"].partition("(")[2].rstrip(")"))


def _metadata(root: Path) -> list[dict[str, str]]:
    with open(root / "metadata.csv", newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_no_training_clip_is_rendered_with_the_held_out_soundfont(small_corpus):
    config, data, root = small_corpus
    assert set(data.arrays["train"]["sources"]) == set(config.soundfonts)  # both, one piece after the other
    for split in ("train", "val", "test"):
        assert all(source in config.soundfonts for source in data.arrays[split]["sources"])
    assert set(data.arrays[HELD_OUT]["sources"]) == {"sf_GMbank.sf2"}
    rows = _metadata(root)
    pieces = {split: {row["piece"] for row in rows if row["split"] == split} for split in ("train", "val", "test",
                                                                                            HELD_OUT)}
    assert pieces[HELD_OUT] == pieces["test"] and not pieces[HELD_OUT] & (pieces["train"] | pieces["val"])
    assert data.report["soundfonts"]["train"] == sorted(config.soundfonts)
    assert data.report["soundfonts"][HELD_OUT] == ["sf_GMbank.sf2"]
    for row in rows:  # each clip's tempo tag names the band its drawn tempo is in
        low, high = next((low, high) for low, high, name in music.TEMPO_BANDS if f"tempo:{name}" in row["tags"])
        assert low <= float(row["bpm"]) < high and -2 <= int(row["semitones"]) <= 2
        assert json.loads(row["effects"]).keys() == music.EFFECT_RANGES.keys()


def test_the_corpus_renders_the_same_clips_from_the_same_seed(small_corpus, tmp_path, monkeypatch):
    _, _, root = small_corpus
    monkeypatch.setenv("SEQAPPS_DATA", str(tmp_path))  # an empty render cache: every clip rendered again
    spec = music.CorpusSpec(**json.loads((root / "info.json").read_text())["spec"])
    again = music.rendered_corpus(spec)
    assert again != root and _metadata(again) == _metadata(root)
    for row in _metadata(root):
        assert (again / row["path"]).read_bytes() == (root / row["path"]).read_bytes()


def test_evaluate_scores_both_test_splits_beside_the_mfcc_baseline_on_the_same_clips(small_corpus):
    from pipelines.music_tagging import clip_mfccs, mfcc_logistic_scores
    from seqapps.metrics import tagging_report

    config, data, _ = small_corpus
    pipeline = MusicTagging()
    model = pipeline.build_model(config, data)
    metrics, baselines = pipeline.evaluate(model, config, data)
    train, held_out, tags = data.arrays["train"], data.arrays[HELD_OUT], data.state["tags"]
    mfcc = mfcc_logistic_scores(clip_mfccs(train["waveforms"], RATE), train["targets"],
                                clip_mfccs(held_out["waveforms"], RATE))
    expected = tagging_report(held_out["targets"], mfcc, tags)
    assert baselines["mfcc_logistic_regression"][f"{HELD_OUT}/roc_auc_macro"] == pytest.approx(
        expected["roc_auc_macro"])
    assert baselines["mfcc_logistic_regression"][f"{HELD_OUT}/roc_auc_per_tag"] == pytest.approx(
        expected["roc_auc_per_tag"])
    scored = tagging_report(held_out["targets"], pipeline.clip_scores(model, held_out["waveforms"], data.state), tags)
    assert {f"{HELD_OUT}/{key}": value for key, value in scored.items()} == {
        key: value for key, value in metrics.items() if key.startswith(f"{HELD_OUT}/")}
    assert "roc_auc_macro" in metrics and "precision_micro" in metrics  # the seen-soundfont test split's
    result = {"metrics": metrics, "baseline": baselines, "data": data.report}
    (section,) = [s for s in pipeline.report_sections(result, {}) if s.id() == "soundfonts"]
    (table,) = section.blocks
    mfcc = baselines["mfcc_logistic_regression"]
    assert [row[0] for row in table.rows] == [f"test ({', '.join(data.report['soundfonts']['test'])})",
                                              f"{HELD_OUT} (sf_GMbank.sf2)"]
    assert table.rows[1][1] == metrics[f"{HELD_OUT}/roc_auc_macro"]
    assert table.rows[1][table.columns.index("mfcc_logistic_regression ROC-AUC macro")] == mfcc[
        f"{HELD_OUT}/roc_auc_macro"]
    assert table.rows[0][1] == metrics["roc_auc_macro"]
