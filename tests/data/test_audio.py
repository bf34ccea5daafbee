"""Audio files, in-graph WAV decoding and resampling, and the log-mel front end, against soundfile/soxr/librosa."""
import io
import json
import struct
import subprocess
import sys
import textwrap

import librosa
import numpy as np
import pytest
import soundfile
import tensorflow as tf

from seqapps.data.audio import (
    MAX_SAMPLE_RATE,
    MIN_SAMPLE_RATE,
    bounded,
    clip_dataset,
    cut_windows,
    decode_wav,
    read_audio,
    shared_samples,
    signature_rows,
    window_dataset,
    window_starts,
)
from seqapps.data.audio import wav_bytes as resampled_wav_bytes
from seqapps.errors import DataError
from seqapps.layers.resampling import resample_waveform
from seqapps.layers.spectrogram import LogMelSpectrogram
from tests.layers.harness import run_layer_test

RATE = 16000


def tone_and_chirp(rate: int, seconds: float = 1.0, top: float = 6000.0) -> np.ndarray:
    """A 440 Hz tone plus a linear chirp from 100 Hz to ``top`` Hz, peak amplitude 0.8."""
    t = np.arange(int(seconds * rate)) / rate
    chirp = np.sin(2 * np.pi * (100 * t + (top - 100) / (2 * seconds) * t**2))
    return (0.4 * np.sin(2 * np.pi * 440 * t) + 0.4 * chirp).astype(np.float32)


def wav_bytes(samples: np.ndarray, rate: int, subtype: str = "PCM_16", fmt: str = "WAV") -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


def riff(chunks: list[tuple[bytes, bytes]]) -> bytes:
    """A RIFF/WAVE file of these (id, payload) chunks, each padded to an even size."""
    body = b"".join(name + struct.pack("<I", len(data)) + data + b"\0" * (len(data) % 2) for name, data in chunks)
    return b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WAVE" + body


def fmt_chunk(rate: int, channels: int = 1, floats: bool = False) -> tuple[bytes, bytes]:
    """A plain ``fmt `` chunk: 16-bit PCM (or 32-bit float) at ``rate``, whatever the rate."""
    width = 4 if floats else 2
    return b"fmt ", struct.pack("<HHIIHH", 3 if floats else 1, channels, rate, rate * channels * width % 2 ** 32,
                                channels * width, 8 * width)


# --- read_audio ------------------------------------------------------------------------------------------------------


def test_read_audio_downmixes_and_resamples_like_librosa(tmp_path):
    left, right = tone_and_chirp(22050), 0.5 * tone_and_chirp(22050)
    path = tmp_path / "stereo.wav"
    soundfile.write(path, np.stack([left, right], axis=1), 22050, subtype="FLOAT")
    audio = read_audio(path, RATE)
    expected = librosa.resample((left + right) / 2, orig_sr=22050, target_sr=RATE)  # soxr HQ, librosa's default
    assert audio.dtype == np.float32 and audio.shape == (RATE,)
    np.testing.assert_allclose(audio, expected, atol=1e-6)  # same resampler: float32 round-off only


@pytest.mark.parametrize("fmt, subtype, atol", [
    ("FLAC", "PCM_16", 1e-4),  # lossless: 16-bit quantisation (3e-5) only
    ("OGG", "VORBIS", 0.1),  # lossy codecs: the waveform is close, not equal
    ("MP3", "MPEG_LAYER_III", 0.1),
])
def test_read_audio_reads_flac_ogg_and_mp3(tmp_path, fmt, subtype, atol):
    signal = tone_and_chirp(RATE, top=3000)
    path = tmp_path / f"clip.{fmt.lower()}"
    soundfile.write(path, signal, RATE, format=fmt, subtype=subtype)
    audio = read_audio(path, RATE)
    assert audio.shape == signal.shape
    # Lossy codecs: compare the middle (encoder start-up and fades at the ends) and the correlation.
    middle = slice(2000, -2000)
    assert np.corrcoef(audio[middle], signal[middle])[0, 1] > 0.99
    assert np.abs(audio[middle] - signal[middle]).max() < atol


def test_read_audio_rejects_bad_files_in_one_line_naming_the_file_and_csv_line(tmp_path):
    good = wav_bytes(tone_and_chirp(RATE), RATE)
    nan_wav = wav_bytes(np.array([0.1, np.nan, 0.2], np.float32), RATE, subtype="FLOAT")
    cases = {
        "missing.wav": (None, "no such audio file"),
        "empty.wav": (b"", "the file is empty"),
        "text.wav": (b"path,transcript\nclip.wav,hello\n", "cannot be read as audio"),
        "cut.wav": (good[:30], "cannot be read as audio"),
        "silent.wav": (wav_bytes(np.zeros(0, np.float32), RATE), "the audio has no samples"),
        "nan.wav": (nan_wav, "holds NaN or infinite samples"),
        "long.wav": (good, "1.0 s long, longer than the limit of 0.5 s"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / name
        if content is not None:
            path.write_bytes(content)
        with pytest.raises(DataError, match=message) as error:
            read_audio(path, RATE, max_seconds=0.5, csv_path="clips.csv", row=4)
        assert str(error.value).startswith(f"clips.csv line 4: audio {path}: ") and "\n" not in str(error.value)


# --- In-graph resampling and WAV decoding ------------------------------------------------------------------------------


def test_in_graph_resampler_matches_librosa_from_22050_to_16000_hz():
    signal = tone_and_chirp(22050)  # content up to 6 kHz: inside both resamplers' flat passbands (< 7.5 kHz)
    ours = resample_waveform(tf.constant(signal), 22050, RATE).numpy()
    expected = librosa.resample(signal, orig_sr=22050, target_sr=RATE)
    assert ours.shape == expected.shape == (RATE,)
    # Measured: 2.2e-4 (peak amplitude 0.8, so -71 dB) everywhere but the last 40 samples (2.5 ms), where soxr's
    # flush of the cut-off signal differs from our zero extension (6.3e-3). Both are linear-phase low-passes; the
    # rest of the difference is their stopband leakage and passband ripple.
    np.testing.assert_allclose(ours[:-64], expected[:-64], atol=5e-4)
    np.testing.assert_allclose(ours, expected, atol=2e-2)
    np.testing.assert_array_equal(resample_waveform(tf.constant(signal), 22050, 22050).numpy(), signal)


def test_decode_wav_pads_a_batch_of_rates_and_channels_to_the_models_rate():
    fast = tone_and_chirp(22050, seconds=0.5)
    slow = tone_and_chirp(8000, seconds=0.25, top=3000)
    batch = tf.constant([wav_bytes(np.stack([fast, fast], axis=1), 22050), wav_bytes(slow, 8000)])
    waveform, lengths = decode_wav(batch, RATE)
    assert lengths.numpy().tolist() == [8000, 4000] and waveform.shape == (2, 8000)
    # Reference: the 16-bit samples soundfile reads from the same bytes, resampled by librosa (see the tolerance above).
    quantised_fast, _ = soundfile.read(io.BytesIO(batch[0].numpy()), dtype="float32")
    expected = librosa.resample(quantised_fast.mean(axis=1), orig_sr=22050, target_sr=RATE)
    np.testing.assert_allclose(waveform[0, :7936], expected[:7936], atol=5e-4)
    assert np.all(waveform[1, 4000:].numpy() == 0)
    same_rate, length = decode_wav(tf.constant([wav_bytes(slow, 8000)]), 8000, resample=False)
    np.testing.assert_allclose(same_rate[0], slow, atol=1 / 32768)  # 16-bit quantisation
    assert int(length[0]) == 2000


@pytest.mark.parametrize("data, options, message", [
    (wav_bytes(tone_and_chirp(8000), 8000), {"resample": False}, "not at the model rate of 16000 Hz"),
    (wav_bytes(tone_and_chirp(RATE), RATE), {"max_samples": 1000}, "longer than the limit of 1000 samples"),
    (wav_bytes(np.zeros(0, np.float32), RATE), {}, "has no samples"),
    (wav_bytes(tone_and_chirp(RATE), RATE, subtype="DOUBLE"), {}, "format 3 with 64 bits per sample; expected PCM"),
    (wav_bytes(tone_and_chirp(RATE), RATE, subtype="IMA_ADPCM"), {}, "format 17 with 4 bits"),
    (b"RIFF, but not really", {}, "not a WAV file: expected a RIFF/WAVE header"),
    (np.random.default_rng(0).bytes(3000), {}, "not a WAV file: expected a RIFF/WAVE header"),
    (b"RIFF\x04\x00\x00\x00WAVE", {}, "no fmt and data chunks"),
    (riff([(b"LIST", b"x")] * 70), {}, "no fmt and data chunks within its first 64 chunks"),
    (riff([(b"fmt ", b"\x01\x00")]), {}, "no fmt and data chunks"),
    (riff([(b"fmt ", b"\x01\x00\x01\x00"), (b"data", b"\x00\x00")]), {}, "fmt chunk cut short"),
    (riff([fmt_chunk(rate=RATE, channels=0), (b"data", b"\x00\x00")]), {}, "declares 0 channels; expected 1 to 1024"),
    (riff([fmt_chunk(rate=RATE), (b"data", b"")]), {}, "has no samples"),
    (riff([fmt_chunk(rate=RATE, floats=True), (b"data", np.array([0.5, np.inf], "<f4").tobytes())]), {},
     "NaN or infinite"),
])
def test_decode_wav_rejects_with_invalid_argument(data, options, message):
    decode = tf.function(lambda contents: decode_wav(contents, RATE, **options))
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        decode(tf.constant([data]))


def test_nan_waveforms_are_rejected_huge_ones_clipped_and_silence_gives_the_floor():
    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN or Inf"):
        bounded(tf.constant([[0.0, np.nan]]))
    np.testing.assert_array_equal(bounded(tf.constant([[1e38, -3e38, 0.25, -1.5]])), [[1.0, -1.0, 0.25, -1.0]])
    features = LogMelSpectrogram(sample_rate=RATE, n_mels=8, log_floor=1e-5)(np.zeros((1, 1600), np.float32))
    np.testing.assert_allclose(features, np.log(1e-5), rtol=1e-6)


@pytest.mark.parametrize("subtype", ["PCM_U8", "PCM_16", "PCM_24", "PCM_32", "FLOAT"])
@pytest.mark.parametrize("fmt", ["WAV", "WAVEX"])
def test_decode_wav_reads_every_pcm_and_float_format_as_soundfile_does(subtype, fmt):
    rng = np.random.default_rng(1)
    stereo = np.stack([0.9 * tone_and_chirp(RATE, seconds=0.1), rng.uniform(-1, 1, 1600)], axis=1)
    data = wav_bytes(stereo, RATE, subtype, fmt)
    reference, _ = soundfile.read(io.BytesIO(data), dtype="float32")
    waveform, length = decode_wav(tf.constant([data]), RATE, resample=False)
    assert int(length[0]) == 1600 and waveform.shape == (1, 1600)
    # The same scaling (2^(bits - 1); unsigned 8-bit offset by 128) and a float32 mean of two channels:
    # measured 0 difference in every format; 1e-7 allows a different order of float32 additions.
    np.testing.assert_allclose(waveform[0], reference.mean(axis=1), rtol=0, atol=1e-7)


def test_decode_wav_walks_past_other_chunks_and_cuts_a_data_size_past_the_end():
    samples = (0.5 * tone_and_chirp(8000, seconds=0.05) * 32767).astype("<i2")
    data = riff([(b"LIST", b"odd"), fmt_chunk(rate=8000), (b"fact", b"\0" * 4), (b"data", samples.tobytes())])
    data = data[:-8]  # the last 4 samples lost: the data chunk claims more than the file holds
    reference, _ = soundfile.read(io.BytesIO(data), dtype="float32")
    waveform, length = decode_wav(tf.constant([data]), 8000, resample=False)
    assert int(length[0]) == reference.size == samples.size - 4
    np.testing.assert_array_equal(waveform[0], reference)


@pytest.mark.parametrize("rate, subtype", [(11025, "PCM_24"), (44100, "PCM_U8"), (MAX_SAMPLE_RATE, "FLOAT")])
def test_decode_wav_resamples_odd_rates_and_formats_like_librosa(rate, subtype):
    stereo = np.stack([tone_and_chirp(rate, seconds=0.25, top=4000), 0.5 * tone_and_chirp(rate, seconds=0.25, top=3000)], 1)
    data = wav_bytes(stereo, rate, subtype, "WAVEX")
    reference, _ = soundfile.read(io.BytesIO(data), dtype="float32")
    expected = librosa.resample(reference.mean(axis=1), orig_sr=rate, target_sr=RATE)
    waveform, length = decode_wav(tf.constant([data]), RATE)
    assert int(length[0]) == expected.size == 4000
    # As test_in_graph_resampler_matches_librosa_from_22050_to_16000_hz: two band-limited resamplers, apart from
    # the last 128 samples (8 ms), where soxr's flush differs from our zero extension.
    np.testing.assert_allclose(waveform[0, :-128], expected[:-128], atol=5e-4)


@pytest.mark.parametrize("rate", [0, 1, MIN_SAMPLE_RATE - 1, MAX_SAMPLE_RATE + 1, 5_000_000, 2 ** 31 - 1, 2 ** 32 - 1])
def test_decode_wav_refuses_rates_out_of_bounds_before_resampling(rate):
    data = riff([fmt_chunk(rate=rate % 2 ** 32), (b"data", b"\x01\x00" * 4000)])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=f"declares a sample rate of {rate} Hz; expected 1000 to 384000 Hz"):
        decode_wav(tf.constant([data]), RATE)


def test_decode_wav_accepts_the_bounds_and_pads_a_batch_to_its_longest_clip():
    clips = [riff([fmt_chunk(rate=rate), (b"data", b"\x00\x10" * count)])
             for rate, count in [(MIN_SAMPLE_RATE, 100), (MAX_SAMPLE_RATE, 4800)]]
    waveform, lengths = decode_wav(tf.constant(clips), RATE, max_samples=10 ** 7)
    assert lengths.numpy().tolist() == [1600, 200] and waveform.shape == (2, 1600)  # not padded to max_samples
    np.testing.assert_allclose(waveform[1, 20:180], 4096 / 32768, atol=1e-3)  # a constant stays itself


# --- LogMelSpectrogram -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("options", [
    {"n_fft": 512, "hop_length": 160, "win_length": 400, "n_mels": 64, "fmin": 20.0, "fmax": 7600.0},
    {"n_fft": 400, "hop_length": 128, "n_mels": 40, "center": False},
])
def test_log_mel_matches_librosa_melspectrogram(options):
    signal = tone_and_chirp(RATE, top=7000)
    layer = LogMelSpectrogram(sample_rate=RATE, log_floor=1e-6, **options)
    ours = layer(signal[None]).numpy()[0]
    # librosa: power 2, the same Hann window, centring with zero padding (pad_mode="constant", its default).
    expected = np.log(np.maximum(librosa.feature.melspectrogram(y=signal, sr=RATE, power=2.0, **options).T, 1e-6))
    assert ours.shape == expected.shape
    # Measured max |difference| 2.1e-4 (first case) and 1.4e-4 in natural-log units (0.001 dB): float32 FFT round-off,
    # about 1e-5 of the loudest bins, is relatively largest in the quietest bins near the floor. 1e-3 leaves 5x.
    np.testing.assert_allclose(ours, expected, atol=1e-3)


def test_log_mel_of_a_padded_batch_equals_each_waveform_alone():
    signal = tone_and_chirp(RATE, seconds=0.5)
    short = signal[:5000]
    batch = np.stack([signal, np.pad(short, (0, len(signal) - len(short)), constant_values=0.7)])  # junk padding
    layer = LogMelSpectrogram(sample_rate=RATE, n_fft=400, hop_length=160, n_mels=40)
    features = layer(batch, lengths=np.array([len(signal), len(short)])).numpy()
    frames = layer.frame_lengths(np.array([len(signal), len(short)])).numpy()
    assert frames.tolist() == [51, 32] and features.shape == (2, 51, 40)
    alone = np.log(np.maximum(librosa.feature.melspectrogram(y=short, sr=RATE, n_fft=400, hop_length=160,
                                                             n_mels=40).T, 1e-6))
    np.testing.assert_allclose(features[1, :32], alone, atol=1e-3)  # tolerance as in the librosa test


def test_log_mel_layer_harness_and_mixed_precision():
    # No trainable weights; the filterbank is a non-trainable weight that the .keras round trip restores.
    options = {"sample_rate": 8000, "n_fft": 256, "hop_length": 80, "win_length": 200, "n_mels": 20,
               "fmin": 50.0, "fmax": 3800.0, "log_floor": 1e-5, "center": True}
    waveform = np.random.default_rng(0).normal(size=(2, 800)).astype("float32")
    layer = run_layer_test(LogMelSpectrogram, options, waveform, expected_output_shape=(2, 11, 20),
                           expected_num_trainable_weights=0, expected_num_non_trainable_weights=1,
                           other_input_data=waveform[:1, :400],
                           not_applicable={"fit": "the layer has no trainable weights"}, atol=1e-5)
    assert [w.name for w in layer.weights] == ["mel_filterbank"] and not layer.trainable_weights
    # Under mixed precision the STFT still runs in float32 (FFTs need it); only the output is float16.
    half = LogMelSpectrogram(dtype="mixed_float16", **options)(waveform)
    assert half.dtype == "float16"
    np.testing.assert_allclose(half.numpy(), layer(waveform).numpy(), atol=1e-2)  # float16 spacing at |x| <= 16


EXPORT_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf  # (TensorFlow itself puts a lazy "keras" module in sys.modules)
    loaded = tf.saved_model.load(sys.argv[1])
    out = loaded.signatures["serving_default"](wav=tf.constant([open(sys.argv[2], "rb").read()]))
    result = {k: v.numpy().tolist() for k, v in out.items()}
    result["imported"] = sorted(m for m in ("seqapps", "librosa", "soundfile") if m in sys.modules)
    print(json.dumps(result))
""")


@pytest.mark.large
def test_wav_bytes_to_log_mel_runs_in_a_tensorflow_only_process(tmp_path):
    layer = LogMelSpectrogram(sample_rate=RATE, n_fft=400, hop_length=160, n_mels=16)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="wav")])
    def serve(wav):
        waveform, lengths = decode_wav(wav, RATE)
        return {"features": layer(waveform, lengths=lengths), "frames": layer.frame_lengths(lengths)}

    clip = wav_bytes(tone_and_chirp(22050, seconds=0.3), 22050)
    expected = serve(tf.constant([clip]))
    module = tf.Module()
    module.layer = layer
    tf.saved_model.save(module, str(tmp_path / "export"), signatures={"serving_default": serve})
    (tmp_path / "clip.wav").write_bytes(clip)
    run = subprocess.run([sys.executable, "-c", EXPORT_SCRIPT, str(tmp_path / "export"), str(tmp_path / "clip.wav")],
                         capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["frames"] == [31] and result["imported"] == []
    np.testing.assert_allclose(result["features"], expected["features"].numpy(), atol=1e-5)


@pytest.mark.parametrize("rate", [16000, 22050, 44100])
def test_wav_bytes_writes_the_waveform_at_the_file_rate(rate):
    waveform = 0.5 * tone_and_chirp(rate, seconds=0.5, top=4000.0)
    data, file_rate = soundfile.read(io.BytesIO(resampled_wav_bytes(waveform, rate)), dtype="float32")
    assert file_rate == 22050 and data.ndim == 1
    assert abs(data.size - 0.5 * 22050) <= 1
    # Back at the waveform's rate with librosa's soxr resampler: the two band-limited resamplers and
    # 16-bit rounding (3e-5) differ by far less than the 0.5 peak; 0.01 allows the edges' ringing.
    back = librosa.resample(data, orig_sr=22050, target_sr=rate)[: waveform.size]
    assert np.max(np.abs(back[100:-100] - waveform[100:back.size - 100])) < 0.01


def test_signature_rows_pad_a_batch_or_write_wav_bytes_the_export_decodes_back():
    rng = np.random.default_rng(0)
    clips = [0.5 * rng.uniform(-1, 1, size).astype(np.float32) for size in (1600, 400)]
    batch = signature_rows(clips, 16000, wav=False)
    assert batch["waveform"].shape == (2, 1600) and batch["length"].tolist() == [1600, 400]
    np.testing.assert_array_equal(batch["waveform"][1], np.pad(clips[1], (0, 1200)))
    encoded = signature_rows(clips, 16000, wav=True)
    assert set(encoded) == {"wav", "length"} and encoded["length"].tolist() == [1600, 400]
    waveform, lengths = decode_wav(tf.constant(encoded["wav"]), 16000)  # at the model's rate: no resampling
    assert lengths.numpy().tolist() == [1600, 400]
    np.testing.assert_allclose(waveform.numpy(), batch["waveform"], atol=1 / 32767)  # 16-bit rounding


@pytest.mark.parametrize("samples, window, hop", [(10, 3, 3), (10, 3, 1), (9, 3, 3), (2, 3, 3), (3, 3, 2), (11, 4, 3)])
def test_window_starts_cover_every_sample_and_the_last_window_ends_at_the_track_end(samples, window, hop):
    starts = window_starts(samples, window, hop).numpy()
    # brute force: starts every hop while a window fits, then one more ending at the end if samples are left over
    expected = list(range(0, max(samples - window, 0) + 1, hop))
    if expected[-1] + window < samples:
        expected.append(samples - window)
    np.testing.assert_array_equal(starts, expected)
    waveform = np.arange(1, samples + 1, dtype=np.float32)[None, :]
    windows, _ = cut_windows(tf.constant(waveform), window)
    reference = np.pad(waveform[0], (0, max(window - samples, 0)))  # a short track: one zero-padded window
    for row, start in zip(windows.numpy()[0], window_starts(samples, window, window).numpy()):
        np.testing.assert_array_equal(row, reference[start:start + window])


def test_window_dataset_slices_each_clip_and_repeats_its_targets():
    clips = [np.arange(1, 8, dtype=np.float32), np.arange(10, 12, dtype=np.float32)]
    targets = np.array([[1, 0], [0, 1]], np.float32)
    rows = [(x.numpy().tolist(), y.numpy().tolist()) for x, y in window_dataset(clips, targets, 3, 2)]
    assert rows == [([1, 2, 3], [1, 0]), ([3, 4, 5], [1, 0]), ([5, 6, 7], [1, 0]), ([10, 11, 0], [0, 1])]


def test_clip_dataset_gives_each_clip_whole_in_order_with_its_length():
    lengths = np.array([3, 0, 5, 1])
    samples = np.arange(1, 10, dtype=np.int16)
    rows = [(clip.numpy().tolist(), int(length)) for clip, length in clip_dataset(samples, lengths)]
    assert rows == [([1, 2, 3], 3), ([], 0), ([4, 5, 6, 7, 8], 5), ([9], 1)]
    assert clip_dataset(samples, lengths).element_spec[0].dtype == tf.int16


def test_a_dataset_reads_shared_samples_in_place_where_a_captured_tensor_is_copied():
    held = shared_samples(np.zeros(4, np.float32))
    dataset = tf.data.Dataset.range(4).map(lambda i: held[i])
    held.assign(np.arange(4, dtype=np.float32))  # after the dataset was made: it sees the new values
    assert [float(x) for x in dataset] == [0.0, 1.0, 2.0, 3.0]
