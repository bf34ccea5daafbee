"""End-to-end checks of the speech_recognition pipeline on its tiny preset (espeak-ng corpus), through the CLI."""
import csv
import shutil

import numpy as np
import pytest
import soundfile
import tensorflow as tf

from seqapps.config import resolve_config
from seqapps.data import speech
from tests.pipelines.cli_runner import assert_rejected_in_one_line, export_metrics, run_cli, run_tiny

pytestmark = pytest.mark.large


@pytest.fixture(scope="module")
def speech_run(tmp_path_factory):
    """Runs the tiny preset once, for the tests that read its export."""
    export = run_tiny(tmp_path_factory.mktemp("exports"), "speech_recognition")
    return export, export_metrics(export)


@pytest.fixture(scope="module")
def tiny_corpus(speech_run):
    """The generated tiny corpus's folder (made by the run) and its rows."""
    root = speech_run[1]["data"]["source"].partition("(")[2].rstrip(")")
    with open(f"{root}/metadata.csv", newline="") as handle:
        return root, list(csv.DictReader(handle))


def test_tiny_run_reports_cer_and_wer_beside_the_baselines(speech_run):
    _, metrics = speech_run
    assert metrics["data"]["utterances"] == {"train": 24, "val": 4, "test": 4}
    for kind in ("greedy", "beam"):
        assert metrics["metrics"][f"{kind}_cer"] >= 0 and metrics["metrics"][f"{kind}_wer"] >= 0
    assert metrics["baseline"]["empty_transcript"] == {"cer": 1.0, "wer": 1.0}
    assert metrics["baseline"]["most_frequent_sentence"]["wer"] > 0.5  # test sentences are never trained on


def test_signatures_transcribe_time_words_decode_wav_and_reject_nan(speech_run, tiny_corpus, tmp_path):
    export, _ = speech_run
    root, rows = tiny_corpus
    loaded = tf.saved_model.load(str(export))
    audio, rate = soundfile.read(f"{root}/{rows[-1]['path']}", dtype="float32")
    batch = {"waveform": tf.constant(np.stack([audio, np.zeros_like(audio)])),
             "length": tf.constant([audio.size, audio.size // 2], tf.int32)}
    greedy = loaded.signatures["serving_default"](**batch)
    assert greedy["transcript"].shape == (2,) and greedy["score"].shape == (2,)
    assert loaded.signatures["beam"](**batch)["transcript"].shape == (2,)
    words = loaded.signatures["words"](**batch)
    assert words["words"].shape[0] == 2 and words["start"].shape == words["end"].shape == words["words"].shape
    starts, ends = words["start"].numpy(), words["end"].numpy()
    assert np.all(ends[starts > 0] >= starts[starts > 0]) and np.all(ends <= audio.size / rate + 1e-3)

    from scipy import signal

    resampled = signal.resample_poly(audio, 441, 320).astype(np.float32)  # the clip at 22,050 Hz
    soundfile.write(tmp_path / "clip.wav", resampled, 22050, subtype="PCM_16")
    wav = loaded.signatures["wav_bytes"](wav=tf.constant([(tmp_path / "clip.wav").read_bytes()]))
    assert wav["transcript"].shape == (1,)

    bad = batch["waveform"].numpy()
    bad[0, 10] = np.nan
    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN or Inf"):
        loaded.signatures["serving_default"](waveform=tf.constant(bad), length=batch["length"])
    too_long = np.zeros((1, 15 * speech.SAMPLE_RATE + 1), np.float32)  # the tiny preset's max_seconds is 15
    with pytest.raises(tf.errors.InvalidArgumentError, match="longer than max_seconds"):
        loaded.signatures["serving_default"](waveform=tf.constant(too_long), length=tf.constant([too_long.shape[1]]))


def test_predict_cuts_a_long_file_at_silences_and_joins_the_transcript(speech_run, tiny_corpus, tmp_path, capsys):
    export, _ = speech_run
    root, rows = tiny_corpus
    clips = [soundfile.read(f"{root}/{row['path']}", dtype="float32")[0] for row in rows[:10]]
    long = np.concatenate(clips)
    assert long.size > 15 * speech.SAMPLE_RATE  # longer than the tiny preset's max_seconds
    soundfile.write(tmp_path / "long.flac", long, speech.SAMPLE_RATE)
    code, answer, _ = run_cli(capsys, "predict", str(export), str(tmp_path / "long.flac"), "--json")
    (row,) = answer["predictions"]
    assert code == 0 and row["pieces"] == -(-long.size // (15 * speech.SAMPLE_RATE)) and isinstance(
        row["transcript"], str)


def _user_folder(tmp_path, tiny_corpus, table):
    root, rows = tiny_corpus
    folder = tmp_path / "mine"
    (folder / "wavs").mkdir(parents=True)
    for row in rows:
        shutil.copy(f"{root}/{row['path']}", folder / row["path"])
    (folder / "metadata.csv").write_text(table(rows))
    return folder


@pytest.mark.parametrize("table, message", [
    (lambda rows: "path,transcript\n" + "".join(f"{r['path']},{r['transcript']}\n" for r in rows)
     + "wavs/gone.wav,hello\n", "line 34: audio file"),
    (lambda rows: "path,transcript\n" + "".join(f"{r['path']},{r['transcript']}\n" for r in rows[:20])
     + f"{rows[20]['path']},{'a very long transcript ' * 20}\n", "line 22: the transcript (459 characters) is too long"),
])
def test_bad_user_data_exits_2_with_one_line(capsys, tmp_path, tiny_corpus, table, message):
    folder = _user_folder(tmp_path, tiny_corpus, table)
    assert_rejected_in_one_line(capsys, tmp_path / "out", "speech_recognition", ["--data", str(folder)], message)


def test_the_users_recordings_split_as_requested(tmp_path, tiny_corpus):
    from pipelines.speech_recognition import SpeechRecognition, SpeechRecognitionConfig

    folder = _user_folder(tmp_path, tiny_corpus,
                          lambda rows: "path,transcript\n" + "".join(f"{r['path']},{r['transcript']}\n" for r in rows))
    config = resolve_config(SpeechRecognitionConfig, "tiny",
                            overrides=["val_fraction=0.1", "test_fraction=0.2", "oov=drop"])  # a held-out "q"
    data = SpeechRecognition().load_data(config, str(folder))
    rows = len(tiny_corpus[1])  # 32: 3 for validation, 6 for test
    assert data.report["split_counts"] == {"unit": "utterances", "train": rows - 9, "val": 3, "test": 6}
    paths = [path for split in ("train", "val", "test") for path in data.arrays[split]["paths"]]
    assert sorted(paths) == sorted(str(folder / row["path"]) for row in tiny_corpus[1])


def test_corrupt_audio_in_user_data_names_file_and_row(capsys, tmp_path, tiny_corpus):
    folder = _user_folder(tmp_path, tiny_corpus,
                          lambda rows: "path,transcript\n" + "".join(f"{r['path']},{r['transcript']}\n" for r in rows))
    (folder / "wavs" / "train_00003.wav").write_bytes(b"RIFF\x00\x00not audio")
    assert_rejected_in_one_line(capsys, tmp_path / "out", "speech_recognition", ["--data", str(folder)],
                                "metadata.csv line 5: ")


@pytest.mark.parametrize("setting, message", [("encoder=transformer", "'encoder'"), ("oov=map", "'oov'"),
                                              ("units=8", "'units'")])
def test_bad_config_exits_2_with_one_line(capsys, tmp_path, setting, message):
    extra = ["--set", "encoder=hrnn"] if setting == "units=8" else []
    assert_rejected_in_one_line(capsys, tmp_path, "speech_recognition", ["--set", setting, *extra], message)


def test_finetune_continues_on_the_users_recordings(capsys, speech_run, tiny_corpus, tmp_path):
    export, _ = speech_run
    folder = _user_folder(tmp_path, tiny_corpus, lambda rows: "path,sentence\n" + "".join(
        f"{r['path']},{r['transcript'].upper()}\n" for r in rows))  # Common Voice's column; case is normalised
    copy = tmp_path / "models" / "speech_recognition" / "1"
    shutil.copytree(export, copy)
    code, answer, err = run_cli(capsys, "finetune", "speech_recognition", "--from", str(copy), "--data", str(folder),
                                "--json")
    assert code == 0, err
    assert answer["export"].endswith("speech_recognition/2") and "greedy_cer" in answer["metrics_before"]


def test_word_timings_of_a_model_that_transcribes_fall_inside_espeaks_word_spans(tmp_path, monkeypatch):
    """The CTC word timings, on utterances whose word boundaries the generator recorded from espeak-ng.

    A small model is trained until it transcribes its four utterances exactly (a model that
    cannot transcribe has no words to time); then every word's start, read from its CTC
    posteriors as the ``words`` signature does, must fall inside that word's span in
    ``words.json`` (espeak-ng's word events; words without their own event share their group's span).
    """
    import json

    import keras

    from seqapps.layers import ctc

    monkeypatch.setenv("SEQAPPS_DATA", str(tmp_path))
    keras.utils.set_random_seed(0)
    sentences = ["in the beginning god created the heaven", "and the earth was without form", "let there be light",
                 "and there was light", "and god saw the light", "that it was good"]
    root = speech.espeak_corpus(speech.CorpusSpec("timing", {"train": 4, "val": 1, "test": 1}, seed=3),
                                lambda: sentences)
    with open(root / "metadata.csv", newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row["split"] == "train"]
    spans = json.loads((root / "words.json").read_text())
    chars = ["", *sorted({c for row in rows for c in row["transcript"]})]
    audio = [soundfile.read(root / row["path"], dtype="float32")[0] for row in rows]
    inputs = {"waveform": np.stack([np.pad(a, (0, max(map(len, audio)) - len(a))) for a in audio]),
              "length": np.array([len(a) for a in audio], np.int32)}
    labels = keras.utils.pad_sequences([[chars.index(c) for c in row["transcript"]] for row in rows],
                                       padding="post")
    model = ctc.CTCSpeechModel(num_classes=len(chars), n_mels=20, units=[32], conv_filters=32, stride=2)
    model.build()
    model.compile(optimizer=keras.optimizers.Adam(3e-3), jit_compile=False)
    table, lengths = tf.constant(chars), model.output_lengths(inputs["length"])
    truth = [row["transcript"].encode() for row in rows]
    for _ in range(12):  # 50 steps at a time, until the transcripts are exact (about 300 steps)
        model.fit(tf.data.Dataset.from_tensors((inputs, labels)).repeat(), steps_per_epoch=50, shuffle=False, verbose=0)
        logits = model(inputs)
        if ctc.ids_to_text(ctc.ctc_greedy_decode(logits, lengths)[0], table).numpy().tolist() == truth:
            break
    else:
        pytest.fail("the model did not learn to transcribe its four training utterances")
    found = ctc.ctc_word_spans(logits, lengths, table, chars.index(" "), model.seconds_per_frame)
    frame = model.seconds_per_frame  # a start is a frame's time: allow one frame at a span's edges
    for i, row in enumerate(rows):
        words, starts = found["words"].numpy()[i], found["start"].numpy()[i]
        expected = [(start, end) for group, start, end in spans[row["path"]] for _ in group.split()]
        assert [w.decode() for w in words[:len(expected)]] == row["transcript"].split()
        for word, start, (low, high) in zip(row["transcript"].split(), starts, expected):
            assert low - frame <= start < high + frame, (row["transcript"], word, start, (low, high))
