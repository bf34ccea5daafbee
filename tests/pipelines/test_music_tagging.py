"""Checks of the music_tagging pipeline: its tiny run (the shared session export), bad input, the baselines."""
import copy
import csv
import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile
import tensorflow as tf

from pipelines.music_tagging import MusicTagging, clip_mfccs, mfcc_logistic_scores
from seqapps import cli, export, serializable
from seqapps.config import resolve_config
from seqapps.data import music
from seqapps.errors import DataError
from seqapps.export_format import read_export
from seqapps.metrics import roc_curves
from seqapps.pipeline import VOCABULARIES
from seqapps.report import run_folder
from seqapps.report.document import Table, figures_of
from tests.export_harness import call_in_tensorflow_only_process
from tests.pipelines.cli_runner import assert_rejected_in_one_line, export_metrics, run_cli, run_tiny
from tests.pipelines.report_checks import assert_figures_decode
from tests.test_exports import warmup_calls

RATE = music.SAMPLE_RATE


@pytest.fixture(scope="module")
def music_run(tiny_exports):
    export = Path(tiny_exports["music_tagging"]["export"])
    return export, export_metrics(export)


@pytest.mark.large
def test_tiny_run_reports_aucs_beside_both_baselines_and_splits_by_piece(music_run):
    _, metrics = music_run
    assert metrics["data"]["renderer"] == "synth"
    for report in (metrics["metrics"], *metrics["baseline"].values()):
        assert 0 <= report["roc_auc_micro"] <= 1 and 0 <= report["pr_auc_micro"] <= 1
    assert set(metrics["baseline"]) == {"tag_priors", "mfcc_logistic_regression"}
    # priors give every test clip the same score per tag: no ranking, AUC 0.5
    assert all(v == 0.5 for v in metrics["baseline"]["tag_priors"]["roc_auc_per_tag"].values())
    root = Path(metrics["data"]["source"].partition("(")[2].rstrip(")"))
    with open(root / "metadata.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    splits_of_piece = {}
    for row in rows:
        splits_of_piece.setdefault(row["piece"], set()).add(row["split"])
        assert row["tags"].count("genre:") == 1 and "instrument:" in row["tags"] and "tempo:" in row["tags"]
    assert all(len(splits) == 1 for splits in splits_of_piece.values())


@pytest.mark.large
def test_signatures_rank_tags_pad_short_clips_decode_22050_hz_wav_and_reject_nan(music_run, tmp_path):
    export, _ = music_run
    state = __import__("json").loads((export / "assets.extra" / "state.json").read_text())
    loaded = tf.saved_model.load(str(export))
    rng = np.random.default_rng(0)
    short = 0.1 * rng.standard_normal(RATE // 4).astype(np.float32)  # shorter than one window: padded
    batch = np.stack([np.zeros(RATE * 5, np.float32), np.pad(short, (0, RATE * 5 - short.size))])
    out = loaded.signatures["serving_default"](waveform=tf.constant(batch))
    scores, tags = out["scores"].numpy(), out["tags"].numpy()
    assert scores.shape == tags.shape == (2, len(state["tags"])) and np.all((scores >= 0) & (scores <= 1))
    for row_scores, row_tags in zip(scores, tags):  # best first, and the names match the scores
        ranked = [row_scores[state["tags"].index(t.decode())] for t in row_tags]
        assert np.all(np.diff(ranked) <= 0)
    np.testing.assert_array_equal(out["detected"].numpy(), scores >= np.array(state["thresholds"])[None, :])
    alone = loaded.signatures["serving_default"](waveform=tf.constant(short[None, :]))["scores"].numpy()
    assert alone.shape == (1, len(state["tags"]))
    taggram = loaded.signatures["taggram"](waveform=tf.constant(batch))
    window = state["window_samples"]
    windows = -(-batch.shape[1] // window)
    assert taggram["window_scores"].shape == (2, windows, len(state["tags"]))
    # non-overlapping windows, the last one ending at the track's end
    starts = np.minimum(np.arange(windows) * window, batch.shape[1] - window)
    np.testing.assert_allclose(taggram["window_start"].numpy(), np.tile(starts / RATE, (2, 1)))  # batch first
    np.testing.assert_allclose(taggram["window_end"].numpy(), np.tile((starts + window) / RATE, (2, 1)))
    assert [[t.decode() for t in row] for row in taggram["tags"].numpy()] == [state["tags"]] * 2

    from scipy import signal

    clip = 0.3 * np.sin(2 * np.pi * 440 * np.arange(RATE * 3) / RATE).astype(np.float32)
    soundfile.write(tmp_path / "clip.wav", signal.resample_poly(clip, 441, 320), 22050, subtype="PCM_16")
    wav = loaded.signatures["wav_bytes"](wav=tf.constant([(tmp_path / "clip.wav").read_bytes()]))
    direct = loaded.signatures["serving_default"](waveform=tf.constant(clip[None, :]))
    # the in-graph resampler and 16-bit quantisation change the features slightly
    np.testing.assert_allclose(wav["scores"].numpy(), direct["scores"].numpy(), atol=0.05)
    with pytest.raises(tf.errors.InvalidArgumentError):
        loaded.signatures["serving_default"](waveform=tf.constant([[0.0, np.nan, 0.0]], tf.float32))


@pytest.mark.large
def test_finetune_with_tags_replace_exports_and_predicts_only_the_users_tags(music_run, tmp_path, capsys):
    export, _ = music_run
    copy = tmp_path / "models" / "music_tagging" / "1"
    shutil.copytree(export, copy)
    folder = _user_folder(tmp_path / "mine", count=24)
    code, answer, err = run_cli(capsys, "finetune", "music_tagging", "--from", str(copy), "--data", str(folder),
                                "--set", "tags=replace", "--json")
    assert code == 0, err
    old_tags, grown = read_export(copy).state["tags"], read_export(answer["export"])
    assert grown.state["tags"] == ["high", "low", "tone"] and len(grown.state["thresholds"]) == 3
    assert answer["data"][VOCABULARIES]["tags"] == {"added": ["high", "low", "tone"], "removed": old_tags, "size": 3,
                                                    "clips_with_unseen_tags": {"val": 0, "test": 0}}
    loaded = tf.saved_model.load(str(grown.path))
    clip = soundfile.read(folder / "0.wav", dtype="float32")[0]
    ranked = loaded.signatures["serving_default"](waveform=tf.constant(clip[None, :]))["tags"].numpy()[0]
    assert sorted(tag.decode() for tag in ranked) == ["high", "low", "tone"]
    assert cli.main(["predict", str(grown.path), str(folder / "0.wav"), str(folder / "1.wav")]) == 0
    printed = capsys.readouterr().out
    assert printed.count("0.wav") == printed.count("1.wav") == 1
    assert not [tag for tag in old_tags if tag in printed]


def _write_clip(path: Path, frequency: float, seconds: float = 1.0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    soundfile.write(path, 0.3 * np.sin(2 * np.pi * frequency * np.arange(int(RATE * seconds)) / RATE), RATE)


def test_user_csv_splits_tags_on_semicolon_or_bar_and_tag_folders_are_read(tmp_path):
    _write_clip(tmp_path / "a.wav", 220)
    _write_clip(tmp_path / "b.wav", 880)
    (tmp_path / "tags.csv").write_text("path,tags\na.wav,low; calm\nb.wav,high|loud|high\n")
    clips = music.read_tagged_folder(tmp_path)
    assert [c.tags for c in clips] == [["low", "calm"], ["high", "loud"]]
    folders = tmp_path / "by_tag"
    _write_clip(folders / "low" / "x.wav", 220)
    _write_clip(folders / "calm" / "x.wav", 220)
    assert [sorted(c.tags) for c in music.read_tagged_folder(folders)] == [["calm", "low"]]


@pytest.mark.parametrize("table, message", [
    ("path,tags\na.wav,low\nb.wav,\n", "tags.csv line 3: the row has no tags"),
    ("path,tags\nmissing.wav,low\n", "tags.csv line 2: no such audio file"),
    ("file,labels\na.wav,low\n", "tags.csv line 1: expected a header with columns path,tags"),
])
def test_bad_tables_are_one_line_errors_naming_the_row(tmp_path, table, message):
    _write_clip(tmp_path / "a.wav", 220)
    _write_clip(tmp_path / "b.wav", 220)
    (tmp_path / "tags.csv").write_text(table)
    with pytest.raises(DataError, match=message) as caught:
        music.read_tagged_folder(tmp_path)
    assert "\n" not in str(caught.value)


def _user_folder(tmp_path: Path, count: int = 20) -> Path:
    rows = ["path,tags"]
    for i in range(count):
        _write_clip(tmp_path / f"{i}.wav", 220 if i % 2 else 880, seconds=2.0)
        rows.append(f"{i}.wav,{'low' if i % 2 else 'high'};tone")
    (tmp_path / "tags.csv").write_text("\n".join(rows) + "\n")
    return tmp_path


def test_fine_tuning_on_a_new_tag_extends_the_outputs_keeping_the_old_weights(tmp_path):
    pipeline = MusicTagging()
    config = resolve_config(MusicTagging.Config, "tiny")
    folder = _user_folder(tmp_path)
    data = pipeline.load_data(config, str(folder))
    assert data.state["tags"] == ["high", "low", "tone"] and data.report["clips"]["train"] > 0
    old_state = {**data.state, "tags": ["tone", "high"], "thresholds": [0.3, 0.4]}
    old_model = pipeline.build_model(config, dataclasses.replace(data, state=old_state))
    grown_data = pipeline.load_data(config, str(folder), state=old_state)
    assert grown_data.state["tags"] == ["tone", "high", "low"] and grown_data.state["thresholds"] == [0.3, 0.4, 0.5]
    grown = pipeline.adapt_model(old_model, config, grown_data)
    assert grown.output_shape == (None, 3)
    kernel, bias = grown.get_layer("scores").get_weights()
    old_kernel, old_bias = old_model.get_layer("scores").get_weights()
    np.testing.assert_array_equal(kernel[:, :2], old_kernel)
    np.testing.assert_array_equal(bias[:2], old_bias)
    for old, new in zip(old_model.layers, grown.layers):
        if old.name != "scores":
            for a, b in zip(old.get_weights(), new.get_weights()):
                np.testing.assert_array_equal(a, b)


def test_tags_replace_keeps_exactly_the_users_tags_and_reports_what_changed(tmp_path):
    pipeline = MusicTagging()
    folder = str(_user_folder(tmp_path))
    exported = {**pipeline.load_data(resolve_config(MusicTagging.Config, "tiny"), folder).state,
                "tags": ["genre:reel", "tone", "mode:major"], "thresholds": [0.2, 0.3, 0.4]}
    extended = pipeline.load_data(resolve_config(MusicTagging.Config, "tiny"), folder, state=exported)
    added = extended.state["tags"][3:]
    assert extended.state["tags"][:3] == exported["tags"] and sorted(added) == ["high", "low"]
    assert extended.report[VOCABULARIES]["tags"] == {"added": added, "removed": [], "size": 5,
                                                     "clips_with_unseen_tags": {"val": 0, "test": 0}}
    config = resolve_config(MusicTagging.Config, "tiny", overrides=["tags=replace"])
    replaced = pipeline.load_data(config, folder, state=exported)
    assert replaced.state["tags"] == ["high", "low", "tone"] and replaced.state["thresholds"] == [0.5, 0.5, 0.3]
    assert replaced.report[VOCABULARIES]["tags"] == {"added": ["high", "low"], "removed": ["genre:reel", "mode:major"],
                                                     "size": 3, "clips_with_unseen_tags": {"val": 0, "test": 0}}
    assert replaced.arrays["test"]["targets"].shape[1] == 3
    old_model = pipeline.build_model(config, dataclasses.replace(replaced, state=exported))
    old_kernel = old_model.get_layer("scores").get_weights()[0]
    old_model.get_layer("scores").set_weights([old_kernel, np.array([0.1, 0.2, 0.3], np.float32)])  # trained
    grown = pipeline.adapt_model(old_model, config, replaced)
    assert grown.output_shape == (None, 3)
    kernel, bias = grown.get_layer("scores").get_weights()
    # "tone" keeps its unit (old 1, new 2); "high" and "low" start as a fresh layer does (zero bias)
    np.testing.assert_array_equal(kernel[:, 2], old_kernel[:, 1])
    np.testing.assert_allclose(bias, [0.0, 0.0, 0.2])


def test_a_bad_tags_setting_exits_2_with_one_line(capsys, tmp_path):
    assert_rejected_in_one_line(capsys, tmp_path, "music_tagging", ["--set", "tags=bogus"],
                                "'tags'")


def test_held_out_clips_with_tags_training_never_saw_are_counted(tmp_path):
    folder = _user_folder(tmp_path)
    rows = (folder / "tags.csv").read_text().splitlines()
    (folder / "tags.csv").write_text("\n".join([rows[0], *(f"{row};clip:{i}" for i, row in enumerate(rows[1:]))]))
    data = MusicTagging().load_data(resolve_config(MusicTagging.Config, "tiny"), str(folder))
    # every clip has a tag of its own: each held-out clip has one that training never saw
    assert data.report[VOCABULARIES]["tags"]["clips_with_unseen_tags"] == {
        "val": len(data.arrays["val"]["paths"]), "test": len(data.arrays["test"]["paths"])}
    assert data.report[VOCABULARIES]["tags"]["size"] == 3 + len(data.arrays["train"]["paths"])


def test_corrupt_or_empty_audio_is_a_data_error_naming_the_file(tmp_path):
    pipeline = MusicTagging()
    config = resolve_config(MusicTagging.Config, "tiny")
    folder = _user_folder(tmp_path)
    (folder / "3.wav").write_bytes(b"")
    with pytest.raises(DataError, match="3.wav: the file is empty"):
        pipeline.load_data(config, str(folder))
    (folder / "3.wav").write_bytes(b"RIFF not really a wav file")
    with pytest.raises(DataError, match="3.wav: cannot be read as audio"):
        pipeline.load_data(config, str(folder))


def test_mfcc_logistic_regression_separates_low_and_high_tones_and_priors_fill_one_class_tags():
    rng = np.random.default_rng(0)
    frequencies = [200, 250, 300, 2000, 2500, 3000, 220, 2200]
    clips = [0.3 * np.sin(2 * np.pi * f * np.arange(RATE // 2) / RATE) + 0.01 * rng.standard_normal(RATE // 2)
             for f in frequencies]
    high = np.array([[f > 1000, 1] for f in frequencies], np.float32)  # tag 1 is on everywhere
    features = clip_mfccs(clips, RATE)
    scores = mfcc_logistic_scores(features[:6], high[:6], features[6:])
    assert scores[1, 0] > 0.5 > scores[0, 0]  # 2,200 Hz scores high, 220 Hz low
    np.testing.assert_array_equal(scores[:, 1], [1.0, 1.0])  # one class in training: its prior


def test_calibrate_returns_thresholds_of_validation_scores_and_evaluate_decides_by_the_states(tmp_path):
    pipeline = MusicTagging()
    config = resolve_config(MusicTagging.Config, "tiny")
    data = pipeline.load_data(config, str(_user_folder(tmp_path)))
    model = pipeline.build_model(config, data)
    state = copy.deepcopy(data.state)
    calibrated = pipeline.calibrate(model, config, data)
    assert data.state == state  # calibrate returns what it chose; the runner adds it to the state
    assert list(calibrated) == ["thresholds"] and len(calibrated["thresholds"]) == len(state["tags"])
    val = data.arrays["val"]
    scores = pipeline.clip_scores(model, val["waveforms"], state)
    for tag, threshold in enumerate(calibrated["thresholds"]):  # F1-optimal cuts are scores of validation clips
        assert threshold in scores[:, tag] if val["targets"][:, tag].any() else threshold == 0.5
    cuts = [0.0] + [1.01] * (len(state["tags"]) - 1)  # the first tag decided for every test clip, the others never
    at = dataclasses.replace(data, state={**state, "thresholds": cuts})
    metrics, _ = pipeline.evaluate(model, config, at)
    assert at.state == {**state, "thresholds": cuts}  # evaluate changes nothing
    test = data.arrays["test"]["targets"]
    assert metrics["recall_micro"] == pytest.approx(test[:, 0].sum() / test.sum())
    assert metrics["precision_micro"] == pytest.approx(test[:, 0].mean())


@pytest.mark.parametrize("rnn, pooling", [("hrnn", "meanmax"), ("bihrnn", "meanmax"), ("bihrnn", "last")])
def test_hrnn_model_scores_every_tag_and_needs_two_levels(tmp_path, rnn, pooling):
    from seqapps.errors import ConfigError

    pipeline = MusicTagging()
    config = resolve_config(MusicTagging.Config, "tiny", overrides=[f"rnn={rnn}", "units=[8,8]", f"pooling={pooling}"])
    data = pipeline.load_data(config, str(_user_folder(tmp_path)))
    model = pipeline.build_model(config, data)
    window = data.state["window_samples"]
    scores = model(np.random.default_rng(0).normal(size=(3, window)).astype(np.float32)).numpy()
    assert scores.shape == (3, 3) and np.all((scores > 0) & (scores < 1))
    assert any(layer.name == rnn for layer in model.layers)
    if rnn == "bihrnn":  # both directions' weights reach the scores
        hrnn = model.get_layer(rnn)
        with tf.GradientTape() as tape:
            score = tf.reduce_sum(model(np.ones((1, window), np.float32)))
        forward, backward = tape.gradient(score, [hrnn.forward.trainable_variables, hrnn.backward.trainable_variables])
        assert all(float(tf.reduce_max(tf.abs(g))) > 0 for g in (forward[0], backward[0]))
    with pytest.raises(ConfigError, match="units"):
        resolve_config(MusicTagging.Config, "tiny", overrides=[f"rnn={rnn}", "units=[8]"])


@pytest.mark.large
def test_bihrnn_tiny_run_exports_a_tensorflow_only_model_without_cudnn_ops(tmp_path):
    path = run_tiny(tmp_path / "exports", "music_tagging", "rnn=bihrnn", "units=[8,8]")
    assert export.cudnn_ops(path) == []
    info = read_export(path)
    assert any(layer.name == "bihrnn" for layer in serializable.load_model(info.keras_model_path).layers)
    calls = warmup_calls(path)
    answer = call_in_tensorflow_only_process(path, calls)
    assert answer["imported"] == [] and {name for name, _ in calls} <= set(answer["signatures"])
    assert 0.0 <= export_metrics(path)["metrics"]["roc_auc_micro"] <= 1.0


def test_abc_books_are_read_tune_by_tune_with_the_genre_of_their_rhythm_field(tmp_path):
    book = tmp_path / "book.abc"
    book.write_text("X: 1\nT:One\nR:Reel\nK:D\nABcd|\n\nX:2\nT:Two\nR: double jig\nK:G\nGAB|\n\n"
                    "X:3\nT:Three\nR:air\nK:G\nG|\n\nX:4\nT:Four\nK:G\nG|\n")
    assert music.abc_tunes(book) == [(1, "reel"), (2, "double jig"), (3, "air"), (4, "")]
    pieces = music.collection_pieces("oneills")
    names = [p.name for p in pieces]
    assert len(names) == len(set(names)) and {p.genre for p in pieces} == {"reel", "jig", "hornpipe"}
    # tune 740 is in two transcriptions (0732-0758_bs.abc and _mh.abc): taken once, from the first file
    assert [p.path.name for p in pieces if p.number == 740] == ["0732-0758_bs.abc"]
    tune = next(p for p in pieces if p.number == 740)
    score = music.parse_piece(tune)  # one tune of the book, not the whole opus
    assert score.metadata.title == "The Kilkenny Jig"
    assert music.score_tags(tune, score)["genre"] == "jig" and "composer" not in music.score_tags(tune, score)


def test_render_cache_returns_the_same_clip_without_rendering_again(tmp_path, monkeypatch):
    import pretty_midi

    monkeypatch.setenv("SEQAPPS_DATA", str(tmp_path))
    midi = pretty_midi.PrettyMIDI()
    midi.instruments.append(pretty_midi.Instrument(0))
    midi.instruments[0].notes.append(pretty_midi.Note(velocity=90, pitch=60, start=0.0, end=1.0))
    buffer = __import__("io").BytesIO()
    midi.write(buffer)
    spec = music.CorpusSpec(["bach"], 1, 1, 2.0, "synth")
    first = music.render_clip(buffer.getvalue(), [0, 0, 0], spec)
    audio = soundfile.read(first[0], dtype="int16")[0]
    assert audio.size == 2 * RATE and first[0].parent == tmp_path / "music" / "renders"

    def no_render(*args, **kwargs):
        raise AssertionError("rendered again")

    monkeypatch.setattr(music, "render", no_render)
    assert music.render_clip(buffer.getvalue(), [0, 0, 0], spec) == first  # the same draws, the cached file
    with pytest.raises(AssertionError, match="rendered again"):  # another take is another clip
        music.render_clip(buffer.getvalue(), [0, 0, 1], spec)


def test_thirty_user_clips_split_as_requested(tmp_path):
    config = resolve_config(MusicTagging.Config, "tiny", overrides=["val_fraction=0.2", "test_fraction=0.1"])
    data = MusicTagging().load_data(config, str(_user_folder(tmp_path, count=30)))
    assert data.report["split_counts"] == {"unit": "clips", "train": 21, "val": 6, "test": 3}
    paths = [path for split in ("train", "val", "test") for path in data.arrays[split]["paths"]]
    assert sorted(paths) == sorted(str(tmp_path / f"{i}.wav") for i in range(30))


@pytest.fixture(scope="module")
def music_report(tiny_report):
    """The tiny run's folder: its result (``result.json``) and report data."""
    return tiny_report("music_tagging")


@pytest.mark.large
def test_report_roc_curves_run_to_one_one_and_their_areas_are_the_per_tag_aucs(music_report):
    _, result, arrays = music_report
    tags = list(arrays["tags"])
    assert arrays["scores"].shape == arrays["targets"].shape == (result["data"]["clips"]["test"], len(tags))
    curves = roc_curves(arrays["targets"], arrays["scores"], tags)
    assert curves and set(curves) == set(result["metrics"]["roc_auc_per_tag"])
    assert set(tags) - set(curves) == set(result["metrics"]["skipped_tags"])
    for tag, (false_positives, true_positives) in curves.items():
        assert (false_positives[0], true_positives[0]) == (0, 0) and (false_positives[-1], true_positives[-1]) == (1, 1)
        assert np.all(np.diff(false_positives) >= 0) and np.all(np.diff(true_positives) >= 0)
        # the export's scores, clip by clip, rank the clips as evaluate's did
        assert np.trapezoid(true_positives, false_positives) == pytest.approx(result["metrics"]["roc_auc_per_tag"][tag])


@pytest.mark.large
def test_report_taggrams_have_a_window_per_hop_ending_at_the_clip_end_and_average_to_the_scores(music_report):
    _, result, arrays = music_report
    window, clip = result["config"]["window_seconds"], result["config"]["clip_seconds"]
    assert list(arrays["taggram_tags"]) == list(arrays["tags"])
    for i in range(2):  # the tiny run's two test clips (REPORT_TAGGRAMS is 3)
        starts, ends, taggram = arrays[f"window_start/{i}"], arrays[f"window_end/{i}"], arrays[f"taggram/{i}"]
        count = int(np.ceil(clip / window))
        np.testing.assert_allclose(starts, np.minimum(np.arange(count) * window, clip - window), atol=1e-4)
        np.testing.assert_allclose(ends, starts + window, atol=1e-4)
        assert taggram.shape == (count, len(arrays["tags"])) and np.all((taggram >= 0) & (taggram <= 1))
        np.testing.assert_allclose(taggram.mean(axis=0), arrays["scores"][i], atol=1e-6)  # aggregate: mean
    assert "taggram/2" not in arrays


@pytest.mark.large
def test_report_sections_draw_rocs_taggrams_and_per_tag_aucs_and_build_without_report_data(music_report):
    folder, result, arrays = music_report
    page = (folder / run_folder.REPORT_FILE).read_text()
    assert all(f'id="{anchor}"' in page for anchor in ("roc-curves", "taggram", "per-tag-auc"))
    sections = {section.id(): section for section in MusicTagging().report_sections(result, arrays)}
    assert list(sections) == ["roc-curves", "taggram", "per-tag-auc"]
    figures = figures_of(sections.values())
    assert [f.name for f in figures] == ["roc_curves", "taggram_0", "taggram_1", "per_tag_auc"]
    assert_figures_decode(sections.values())
    (table, *_) = [block for block in sections["per-tag-auc"].blocks if isinstance(block, Table)]
    baseline = result["baseline"]["mfcc_logistic_regression"]["roc_auc_per_tag"]
    assert [row[:3] for row in table.rows] == [[tag, auc, baseline[tag]]
                                               for tag, auc in result["metrics"]["roc_auc_per_tag"].items()]
    bare = MusicTagging().report_sections(result, {})
    assert [s.id() for s in bare] == ["roc-curves", "taggram", "per-tag-auc"]
    assert [f.name for f in figures_of(bare)] == ["per_tag_auc"]
