"""End-to-end checks of the speech_recognition pipeline on its tiny preset (espeak-ng corpus), through the CLI."""
import csv
import dataclasses
import itertools
import json
import shutil
from pathlib import Path

import keras
import numpy as np
import pytest
import soundfile
import tensorflow as tf

from pipelines.speech_recognition import SpeechRecognition
from seqapps import export as export_module
from seqapps import serializable
from seqapps.config import resolve_config
from seqapps.data import speech
from seqapps.errors import DataError
from seqapps.export_format import read_export
from seqapps.pipeline import VOCABULARIES
from seqapps.report import run_folder
from seqapps.report.document import Table, figures_of
from tests.pipelines.cli_runner import assert_rejected_in_one_line, export_metrics, run_cli, run_tiny
from tests.pipelines.report_checks import assert_figures_decode

pytestmark = pytest.mark.large


@pytest.fixture(scope="module")
def speech_run(tiny_run):
    """The session's tiny run (a private copy), for the tests that read its export."""
    result = tiny_run("speech_recognition")
    return Path(result["export"]), result


@pytest.fixture(scope="module")
def tiny_corpus(speech_run):
    """The generated tiny corpus's folder (made by the run) and its rows."""
    root = speech_run[1]["data"]["source"].partition("(")[2].rstrip(")")
    with open(f"{root}/metadata.csv", newline="") as handle:
        return root, list(csv.DictReader(handle))


def test_tiny_run_reports_cer_and_wer_beside_the_baselines(speech_run):
    _, metrics = speech_run
    assert metrics["data"]["utterances"] == {"train": 24, "val": 4, "test": 4}
    test_set = metrics["metrics"]["test_sets"]["espeak-ng (held-out voices)"]  # tiny: espeak-ng alone
    assert test_set["utterances"] == 4 and test_set["greedy_cer"] == metrics["metrics"]["greedy_cer"]
    for kind in ("greedy", "beam"):
        assert metrics["metrics"][f"{kind}_cer"] >= 0 and metrics["metrics"][f"{kind}_wer"] >= 0
    assert metrics["baseline"]["empty_transcript"] == {"cer": 1.0, "wer": 1.0}
    assert metrics["baseline"]["most_frequent_sentence"]["wer"] > 0.5  # test sentences are never trained on


def test_the_beam_search_reads_the_language_model_of_the_pair_chosen_on_validation(speech_run, tmp_path):
    export, result = speech_run
    state = json.loads((export / "assets.extra" / "state.json").read_text())
    by_choice = state["val_beam_cer_by_lm"]
    assert list(by_choice) == ["0,0", "0.5,1", "0.8,2", "1.2,2"]  # the tiny preset keeps the default choices
    chosen = min(by_choice, key=by_choice.get)
    assert chosen == f"{state['lm_weight']:g},{state['lm_bonus']:g}" and chosen != "0,0"  # tiny: the LM helps
    assert "beam_no_lm_cer" in result["metrics"]  # the search without it, beside
    # with the search without it as the only choice, the export holds no language model: five fewer variables
    plain = run_tiny(tmp_path / "plain", "speech_recognition", "lm_choices=[[0,0]]")
    metrics = export_metrics(plain)["metrics"]
    assert metrics["lm_weight"] == metrics["lm_bonus"] == 0 and "beam_no_lm_cer" not in metrics  # the summary says so

    def saved_variables(folder):
        return len(tf.train.load_checkpoint(str(folder / "variables" / "variables")).get_variable_to_shape_map())
    assert saved_variables(export) - saved_variables(plain) == 5  # n-gram keys and counts, context keys, totals, types


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


@pytest.mark.parametrize("signature", ["serving_default", "words"])
def test_predict_sends_a_long_files_pieces_a_few_at_a_time_with_one_calls_answer(
        speech_run, tiny_corpus, tmp_path, capsys, monkeypatch, signature):
    export, _ = speech_run
    root, rows = tiny_corpus
    long = np.concatenate([soundfile.read(f"{root}/{row['path']}", dtype="float32")[0] for row in rows[:16]])
    soundfile.write(tmp_path / "long.flac", long, speech.SAMPLE_RATE)
    calls = []
    monkeypatch.setattr(export_module, "call_signature",
                        lambda function, inputs, call=export_module.call_signature: calls.append(
                            len(inputs["length"])) or call(function, inputs))
    answers = {}
    for rows_per_call in (None, 1):
        monkeypatch.setattr(SpeechRecognition, "predict_rows_per_call", rows_per_call)
        code, answers[rows_per_call], err = run_cli(capsys, "predict", str(export), str(tmp_path / "long.flac"),
                                                    "--signature", signature, "--json")
        assert code == 0, err
    pieces = answers[None]["predictions"][0]["pieces"]
    assert pieces >= 3 and calls == [pieces] + [1] * pieces
    (batched,), (one,) = answers[1]["predictions"], answers[None]["predictions"]
    if signature == "words":  # the same words at the same times; a confidence may differ in float rounding
        assert [(w["word"], w["start"], w["end"]) for w in batched["words"]] == [
            (w["word"], w["start"], w["end"]) for w in one["words"]]
        assert [w["confidence"] for w in batched["words"]] == pytest.approx(
            [w["confidence"] for w in one["words"]], abs=2e-3)
    else:
        assert batched["transcript"] == one["transcript"] and batched["score"] == pytest.approx(one["score"], rel=1e-5)


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
    # the beam search's language model counts the training transcripts alone: each character and each end once
    language_model = data.arrays["language_model"]
    unigrams = language_model.context_totals.numpy()[language_model.context_keys.numpy() == 1]  # order 1, no context
    assert unigrams.tolist() == [sum(len(t) + 1 for t in data.arrays["train"]["transcripts"])]
    assert language_model.order == config.lm_order and language_model.num_classes == len(data.state["chars"])


def test_a_split_read_in_chunks_holds_every_clip_in_order_and_names_a_bad_row_of_a_later_chunk(
        tmp_path, tiny_corpus, monkeypatch):
    from pipelines import speech_recognition

    folder = _user_folder(tmp_path, tiny_corpus,
                          lambda rows: "path,transcript\n" + "".join(f"{r['path']},{r['transcript']}\n" for r in rows))
    utterances = speech.read_transcripts(folder)
    config = resolve_config(speech_recognition.SpeechRecognitionConfig, "tiny")
    labels = [[1 + i % 7 for i in range(len(u.transcript))] for u in utterances]  # no repeats: one frame each
    monkeypatch.setattr(speech_recognition, "CLIPS_PER_READ", 5)  # 32 clips: six full chunks and a partial one
    samples, lengths = speech_recognition._read_clips(utterances, labels, config)
    expected = speech.load_waveforms(utterances, config.max_seconds)
    assert lengths.tolist() == [clip.size for clip in expected]
    np.testing.assert_array_equal(  # the int16 rounding of each clip, back to back
        samples, np.concatenate([np.round(np.clip(clip, -1, 1) * 32767).astype(np.int16) for clip in expected]))
    labels[13] = [1 + i % 7 for i in range(2000)]  # the 14th row: the third chunk's fourth clip
    with pytest.raises(DataError, match=r"metadata.csv line 15: the transcript \(\d+ characters\) is too long"):
        speech_recognition._read_clips(utterances, labels, config)


def test_corrupt_audio_in_user_data_names_file_and_row(capsys, tmp_path, tiny_corpus):
    folder = _user_folder(tmp_path, tiny_corpus,
                          lambda rows: "path,transcript\n" + "".join(f"{r['path']},{r['transcript']}\n" for r in rows))
    (folder / "wavs" / "train_00003.wav").write_bytes(b"RIFF\x00\x00not audio")
    assert_rejected_in_one_line(capsys, tmp_path / "out", "speech_recognition", ["--data", str(folder)],
                                "metadata.csv line 5: ")


@pytest.mark.parametrize("setting, message", [("encoder=transformer", "'encoder'"), ("oov=map", "'oov'"),
                                              ("vocabulary=grow", "'vocabulary'"), ("units=8", "'units'"),
                                              ("sources=espeak,marytts", "'sources'"),
                                              ("test_sets=espeak:en-us+m1", "'test_sets'"),
                                              ("vtlp_warp=1.1,0.9", "'vtlp_warp'"), ("vtlp_warp=0,1", "'vtlp_warp'"),
                                              ("vtlp_warp=0.9", "'vtlp_warp'"), ("lm_order=16", "'lm_order'"),
                                              ("lm_choices=[[-1,0]]", "'lm_choices'"), ("lm_choices=[1]", "'lm_choices'")])
def test_bad_config_exits_2_with_one_line(capsys, tmp_path, setting, message):
    extra = ["--set", "encoder=hrnn"] if setting == "units=8" else []
    assert_rejected_in_one_line(capsys, tmp_path, "speech_recognition", ["--set", setting, *extra], message)


def _graph_string_constants(export) -> list[list[str]]:
    """The string constants (lists) of the SavedModel's graph and its functions: the in-graph tables."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel.FromString((export / "saved_model.pb").read_bytes())
    graph = saved.meta_graphs[0].graph_def
    nodes = [*graph.node, *(node for function in graph.library.function for node in function.node_def)]
    values = [tf.make_ndarray(node.attr["value"].tensor) for node in nodes
              if node.op == "Const" and node.attr["value"].tensor.dtype == tf.string.as_datatype_enum]
    return [[item.decode() for item in value.ravel()] for value in values if value.ndim == 1]


def test_finetune_on_a_new_character_grows_the_export_to_emit_it(tiny_finetune):
    # The session's fine-tune of the tiny export on sentences with "café" and "señor" (the tiny corpus has
    # neither accent); the Common Voice column name and case folding are the reader's (tests/data/test_speech.py).
    tuned = tiny_finetune("speech_recognition")
    assert tuned["code"] == 0, tuned["err"]
    old_chars, grown = read_export(tuned["from"]).state["chars"], read_export(tuned["export"])
    chars = grown.state["chars"]
    added = grown.metrics["data"][VOCABULARIES]["characters"]["added"]
    assert sorted(added) == ["é", "ñ"] and chars == [*old_chars, *added]
    # the serving graph's character table holds the new characters
    assert chars in _graph_string_constants(grown.path) and chars not in _graph_string_constants(Path(tuned["from"]))
    model = serializable.load_model(grown.keras_model_path)
    assert model.num_classes == model.logits_layers[0].units == len(old_chars) + 2


def _recordings(folder, transcripts):
    """A folder of one-second noise clips (not silent, so they are valid audio) with ``transcripts``."""
    rng = np.random.default_rng(0)
    (folder / "wavs").mkdir(parents=True)
    for i in range(len(transcripts)):
        soundfile.write(folder / "wavs" / f"{i}.wav", 0.1 * rng.standard_normal(speech.SAMPLE_RATE),
                        speech.SAMPLE_RATE)
    (folder / "metadata.csv").write_text("path,transcript\n" + "".join(
        f"wavs/{i}.wav,{text}\n" for i, text in enumerate(transcripts)))
    return str(folder)


@pytest.fixture()
def exported_state(tmp_path):
    """The pipeline state of a model trained on transcripts of ``a``, ``b``, ``c`` and spaces."""
    pipeline = SpeechRecognition()
    data = pipeline.load_data(resolve_config(SpeechRecognition.Config, "tiny"),
                              _recordings(tmp_path / "old", ["a cab", "abba", "a bac"] * 8))
    assert data.state["chars"] == ["", " ", "a", "b", "c"]
    return data.state


def test_fine_tuning_extends_the_character_set_after_the_old_characters(tmp_path, exported_state):
    pipeline = SpeechRecognition()
    data = pipeline.load_data(resolve_config(SpeechRecognition.Config, "tiny"),
                              _recordings(tmp_path / "new", ["Café à la carte"] * 24), state=exported_state)
    # the blank stays class 0 and the old characters keep their classes; the new ones follow, in order of
    # frequency, then of first appearance
    added = ["f", "é", "à", "l", "r", "t", "e"]
    assert data.state["chars"] == ["", " ", "a", "b", "c", *added]
    assert data.report[VOCABULARIES] == {"characters": {"added": added, "size": 11, "oov_rate": 0.0}}
    (_, labels), = data.train.take(1)
    assert [data.state["chars"][i] for i in labels.numpy()] == list("café à la carte")


@pytest.mark.parametrize("encoder, units", [("birnn", "[8]"), ("hrnn", "[8,8]"), ("bihrnn", "[8,8]")])
def test_growing_the_ctc_output_layer_keeps_the_blank_and_the_old_characters_outputs(tmp_path, exported_state,
                                                                                   encoder, units):
    keras.utils.set_random_seed(0)
    pipeline = SpeechRecognition()
    config = resolve_config(SpeechRecognition.Config, "tiny", overrides=[f"encoder={encoder}", f"units={units}"])
    data = pipeline.load_data(config, _recordings(tmp_path / "new", ["a cabé"] * 24), state=exported_state)
    old = pipeline.build_model(config, dataclasses.replace(data, state=exported_state))
    rng = np.random.default_rng(1)
    for weight in old.trainable_weights:  # a trained model's weights: no zero bias
        weight.assign(rng.normal(scale=0.3, size=weight.shape).astype("float32"))
    (inputs, _), = data.test.padded_batch(2).take(1)
    before = old(inputs).numpy()
    grown = pipeline.adapt_model(old, config, data)
    assert old.num_classes == 5 and grown.num_classes == 6
    assert [layer.units for layer in grown.logits_layers] == [6] * (2 if encoder == "bihrnn" else 1)
    for kept, new in zip(old.weights, grown.weights):
        if any(new.path.startswith(layer.path) for layer in grown.logits_layers):
            new = new.numpy()[..., :5]
        np.testing.assert_array_equal(kept.numpy(), new, err_msg=kept.path)
    # class 0 (the blank) and the old characters score every frame as the exported model does
    np.testing.assert_allclose(grown(inputs).numpy()[..., :5], before, rtol=1e-5, atol=1e-5)


def test_vocabulary_keep_refuses_or_drops_new_characters_as_before(tmp_path, exported_state):
    pipeline = SpeechRecognition()
    folder = _recordings(tmp_path / "new", ["a cab", "a bac é"] * 12)
    with pytest.raises(DataError, match=r"1 transcript character.*'é' \(.*metadata.csv line \d+\)"):
        pipeline.load_data(resolve_config(SpeechRecognition.Config, "tiny", overrides=["vocabulary=keep"]), folder,
                           state=exported_state)
    config = resolve_config(SpeechRecognition.Config, "tiny", overrides=["vocabulary=keep", "oov=drop"])
    data = pipeline.load_data(config, folder, state=exported_state)
    assert data.state["chars"] == exported_state["chars"]
    assert set("".join(data.arrays["test"]["transcripts"])) <= set("abc ")
    # the share of test characters outside the character set, counted on the transcripts before dropping
    written = [("a cab", "a bac é")[int(Path(path).stem) % 2] for path in data.arrays["test"]["paths"]]
    expected = sum(text.count("é") for text in written) / sum(map(len, written))
    assert expected > 0 and data.report[VOCABULARIES]["characters"] == {"added": [], "size": 4,
                                                                         "oov_rate": round(expected, 4)}


def test_word_timings_of_a_model_that_transcribes_fall_inside_espeaks_word_spans(tmp_path, monkeypatch):
    """The CTC word timings, on utterances whose word boundaries the generator recorded from espeak-ng.

    A small model is trained until it transcribes its four utterances exactly (a model that
    cannot transcribe has no words to time); then every word's start, read from its CTC
    posteriors as the ``words`` signature does, must fall inside that word's span in
    ``words.json`` (espeak-ng's word events; words without their own event share their group's span).
    """
    import keras

    from seqapps.layers import ctc

    monkeypatch.setenv("SEQAPPS_DATA", str(tmp_path))
    keras.utils.set_random_seed(0)
    sentences = ["in the beginning god created the heaven", "and the earth was without form", "let there be light",
                 "and there was light", "and god saw the light", "that it was good"]
    root = speech.spoken_corpus(speech.CorpusSpec("timing", {"train": 4, "val": 1, "test": 1}, seed=3),
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


@pytest.fixture(scope="module")
def speech_report(tiny_report):
    """The tiny run's folder: its result (``result.json``) and report data."""
    return tiny_report("speech_recognition")


def test_report_data_times_ordered_words_inside_each_utterance_as_its_posteriors_spell_them(speech_report):
    _, result, arrays = speech_report
    config = result["config"]
    classes = [{"blank": "", "space": " "}.get(label, label) for label in arrays["classes"]]
    assert classes[0] == "" and " " in classes
    for i in range(3):  # REPORT_UTTERANCES of the tiny run's 4 test utterances
        seconds, starts, ends = float(arrays[f"seconds/{i}"]), arrays[f"start/{i}"], arrays[f"end/{i}"]
        samples = round(seconds * speech.SAMPLE_RATE)
        log_mel, posteriors = arrays[f"log_mel/{i}"], arrays[f"posteriors/{i}"]
        assert log_mel.shape == (1 + samples // config["hop_length"], config["n_mels"])  # centred STFT frames
        assert posteriors.shape == (-(-log_mel.shape[0] // config["stride"]), len(classes))
        np.testing.assert_allclose(posteriors.sum(axis=1), 1.0, atol=1e-5)
        assert np.all((0 <= starts) & (starts < ends) & (ends <= seconds + 1e-6))
        assert np.all(ends[:-1] <= starts[1:])  # in order, not overlapping
        # the export's words are the greedy path of the model's posteriors: the figure shows one decoding
        path = [key for key, _ in itertools.groupby(np.argmax(posteriors, axis=1)) if key != 0]
        assert list(arrays[f"words/{i}"]) == "".join(classes[k] for k in path).split()
    assert "seconds/3" not in arrays


def test_per_voice_error_rates_weigh_up_to_the_test_splits(speech_report, tiny_corpus):
    _, result, _ = speech_report
    _, rows = tiny_corpus
    per_voice = result["metrics"]["per_voice"]
    test = [row for row in rows if row["split"] == "test"]
    voices = {row["voice"].partition("+")[2] for row in test}
    assert set(per_voice) == voices and voices <= set(speech.VARIANTS["test"])
    assert sum(v["utterances"] for v in per_voice.values()) == len(test)
    # corpus rates: the whole split's is each voice's weighted by its reference characters (words)
    for rate, count in (("cer", len), ("wer", lambda text: len(text.split()))):
        size = {voice: sum(count(r["transcript"]) for r in test if r["voice"].endswith(f"+{voice}"))
                for voice in voices}
        for kind in ("greedy", "beam", "beam_no_lm"):  # the last: the search without the language model
            weighted = sum(per_voice[v][f"{kind}_{rate}"] * size[v] for v in voices) / sum(size.values())
            assert weighted == pytest.approx(result["metrics"][f"{kind}_{rate}"], rel=1e-9)


def test_report_sections_draw_each_utterance_and_the_voices_and_build_without_report_data(speech_report):
    folder, result, arrays = speech_report
    page = (folder / run_folder.REPORT_FILE).read_text()
    assert 'id="word-timings"' in page and 'id="per-voice"' in page and 'id="per-test-set"' in page
    assert "espeak-ng (held-out voices)" in page  # the test set is named by its engine
    sections = {section.id(): section for section in SpeechRecognition().report_sections(result, arrays)}
    assert list(sections) == ["word-timings", "per-test-set", "per-voice"]
    figures = figures_of(sections.values())
    assert [f.name for f in figures] == ["word_timings_0", "word_timings_1", "word_timings_2",
                                         "test_sets_error_rates", "per_voice_error_rates"]
    assert_figures_decode(sections.values())
    (table,) = [block for block in sections["per-voice"].blocks if isinstance(block, Table)]
    voices = [f"voice {voice}" for voice in result["metrics"]["per_voice"]]
    assert [row[0] for row in table.rows] == [*voices, "all test voices", "baseline: empty transcript",
                                              "baseline: most frequent sentence"]
    headlines = SpeechRecognition.headline_metrics
    assert table.rows[-2][2:] == [100.0] * len(headlines)  # the empty transcript: every character and word deleted
    (table,) = [block for block in sections["per-test-set"].blocks if isinstance(block, Table)]
    assert [row[0] for row in table.rows][0] == "espeak-ng (held-out voices)"
    bare = SpeechRecognition().report_sections(result, {})
    assert [s.id() for s in bare] == ["word-timings", "per-test-set", "per-voice"]
    assert [f.name for f in figures_of(bare)] == ["test_sets_error_rates", "per_voice_error_rates"]


def test_the_default_sources_never_speak_a_held_out_voice_or_engine_in_training(tmp_path, monkeypatch):
    """Every training and validation item of the default preset's corpus (at a tiny size) is labelled by a
    training source, and none is the held-out Festival voice, an espeak-ng test variant or Flite."""
    from tests.data.test_speech import SYNTHESISERS
    from tests.debian_data import installed_or_skip

    monkeypatch.setenv("SEQAPPS_DATA", str(tmp_path))
    config = resolve_config(SpeechRecognition.Config, "default", overrides=[
        "corpus=pydoc", "train_utterances=9", "val_utterances=4", "test_utterances=2"])
    assert config.test_sets == ["espeak", "festival:cmu_us_slt_arctic_hts", "flite"]
    data = installed_or_skip(lambda: SpeechRecognition().load_data(config, None),
                             f"{SYNTHESISERS}, and pip {speech.PICO_PACKAGE}")
    for split in ("train", "val"):
        labels = list(zip(data.arrays[split]["sources"], data.arrays[split]["speakers"]))
        assert {source for source, _ in labels} == {"espeak", "festival:kal_diphone", "festival:ked_diphone", "pico"}
        assert all(not source.startswith("flite") and speaker != "cmu_us_slt_arctic_hts" for source, speaker in labels)
        assert not {speaker for source, speaker in labels if source == "espeak"} & set(speech.VARIANTS["test"])
    assert data.arrays["test"]["sources"] == ["espeak"] * 2 + ["festival:cmu_us_slt_arctic_hts"] * 2 + ["flite"] * 2
    assert set(data.report["test_sets"].values()) == {
        "espeak-ng (held-out voices)", "Festival cmu_us_slt_arctic_hts (held-out voice)", "CMU Flite (held-out engine)"}
