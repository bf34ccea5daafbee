"""Audio: reading files in Python, decoding WAV bytes in the graph, and resampling.

- ``read_audio`` (training data, ``predict``): WAV, FLAC, OGG/Vorbis and MP3 through
  soundfile (libsndfile), other formats through an audioread backend when one is
  installed (ffmpeg, GStreamer); mono float32 at the requested rate, resampled with
  soxr's "HQ" quality (what ``librosa.resample`` does by default).
- ``wav_bytes`` (export examples): a waveform written as WAV bytes at another rate.
- ``signature_rows`` (``predict``): clips as a zero-padded batch or as WAV bytes, with their lengths.
- ``decode_wav`` (exports): a batch of WAV bytes (PCM of 8 to 32 bits, float, extensible) parsed
  in TensorFlow ops -> a zero-padded mono float32 batch and the lengths, resampled in the graph by
  ``seqapps.layers.resampling.resample_waveform``, a windowed-sinc (Kaiser) band-limited interpolator.
- ``window_starts``, ``cut_windows``, ``window_dataset``: a track cut into fixed-length windows
  (the last one ending at the track's end, a short track zero-padded), in the graph or as a
  ``tf.data`` dataset of training windows.
- ``clip_dataset``: clips stored back to back, as a ``tf.data`` dataset of whole clips. Both datasets read
  their samples from one variable (``shared_samples``), so the dataset holds one copy of the audio.

Non-finite samples: ``read_audio`` raises ``DataError``; in the graph, a float waveform sent to
an export and the samples of a float WAV pass ``bounded`` (InvalidArgument for NaN or Inf, then
clipped to [-1, 1], so that huge amplitudes cannot overflow the features to NaN), since the
log-mel front end in the model (``seqapps.layers.spectrogram.LogMelSpectrogram``) passes NaN through. Silence is valid: its
log-mel features are the floor, ``log(log_floor)``.

soundfile, soxr and audioread are imported only where they are used.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from seqapps.data.files import where as name_file
from seqapps.errors import DataError
from seqapps.layers.resampling import resample_waveform

#: ``decode_wav``'s default bound, in seconds at the model's sample rate.
DEFAULT_MAX_SECONDS = 30.0
#: Sample rates a WAV file may declare, in Hz: the resampler's taps grow with the source rate.
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 1000, 384000
#: Channels a WAV file may declare (libsndfile's own bound).
MAX_CHANNELS = 1024
#: RIFF chunks ``decode_wav`` reads while looking for ``fmt `` and ``data``.
MAX_CHUNKS = 64
_PCM, _FLOAT, _EXTENSIBLE = 1, 3, 0xFFFE  # WAVE format tags


# --- Python: files ---------------------------------------------------------------------------------------------------


def _decode_file(path: Path, where: str, max_seconds: float | None) -> tuple[np.ndarray, int]:
    """Frames [n, channels] and the rate, through soundfile, else audioread."""
    import soundfile

    def valid_rate(rate: int) -> int:
        if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
            raise DataError(f"{where}: the header gives a sample rate of {rate} Hz; expected "
                            f"{MIN_SAMPLE_RATE} to {MAX_SAMPLE_RATE} Hz")
        return rate

    def too_long(seconds: float) -> None:
        if max_seconds is not None and seconds > max_seconds:
            raise DataError(f"{where}: {seconds:.1f} s long, longer than the limit of {max_seconds:g} s")

    try:
        with soundfile.SoundFile(str(path)) as file:
            too_long(file.frames / valid_rate(file.samplerate))
            return file.read(dtype="float32", always_2d=True), file.samplerate
    except (RuntimeError, TypeError) as error:  # LibsndfileError is a RuntimeError
        reason = str(error).splitlines()[0] if str(error) else error.__class__.__name__
    import audioread

    try:
        with audioread.audio_open(str(path)) as file:
            rate, channels = valid_rate(file.samplerate), file.channels
            too_long(file.duration)
            pcm = np.frombuffer(b"".join(file), dtype="<i2")
    except (audioread.exceptions.NoBackendError, audioread.exceptions.DecodeError, OSError, EOFError):
        raise DataError(f"{where}: cannot be read as audio (soundfile: {reason}; no audioread backend decodes it "
                        "either); expected WAV, FLAC, OGG or MP3") from None
    return (pcm.astype(np.float32) / 32768.0).reshape(-1, channels), rate


def read_audio(path: str | Path, sample_rate: int, max_seconds: float | None = None,
               csv_path: str | Path | None = None, row: int | None = None) -> np.ndarray:
    """Reads an audio file as mono float32 at ``sample_rate`` (channels averaged, soxr HQ resampling).

    Args:
        path: a WAV, FLAC, OGG or MP3 file (others if an audioread backend can decode them).
        sample_rate: the rate to return, in Hz.
        max_seconds: if given, a longer file raises ``DataError`` (checked before decoding).
        csv_path: the CSV file that names the audio, for messages.
        row: the line of ``csv_path`` that names it (1 is the header), for messages.

    Returns:
        float32 [samples], normally within [-1, 1].

    Raises:
        DataError: the file is missing, empty, unreadable, corrupt, has no samples, holds
            NaN or Inf, declares a sample rate outside ``MIN_SAMPLE_RATE``-``MAX_SAMPLE_RATE``, or is too long; one line
            naming the file (and the CSV line).
    """
    path = Path(path)
    where = name_file(path, csv_path, row, "audio")
    if not path.is_file():
        raise DataError(f"{where}: no such audio file")
    if path.stat().st_size == 0:
        raise DataError(f"{where}: the file is empty (expected WAV, FLAC, OGG or MP3 audio)")
    frames, rate = _decode_file(path, where, max_seconds)
    if frames.size == 0:
        raise DataError(f"{where}: the audio has no samples")
    if not np.isfinite(frames).all():
        raise DataError(f"{where}: the audio holds NaN or infinite samples")
    mono = frames[:, 0] if frames.shape[1] == 1 else frames.mean(axis=1)  # no copy of a long mono file
    if rate != sample_rate:
        import soxr

        mono = soxr.resample(mono, rate, sample_rate, quality="HQ")
    return np.ascontiguousarray(mono, dtype=np.float32)


# --- Graph: WAV bytes, resampling, checks -------------------------------------------------------------------------


def _bytes(contents: tf.Tensor, offset: Any, count: Any) -> tf.Tensor:
    """Up to ``count`` bytes of ``contents`` from ``offset`` (int64 positions, clamped to the string)."""
    size = tf.cast(tf.strings.length(contents), tf.int64)
    offset = tf.clip_by_value(tf.cast(offset, tf.int64), 0, size)
    count = tf.clip_by_value(tf.cast(count, tf.int64), 0, size - offset)
    return tf.strings.substr(contents, tf.cast(offset, tf.int32), tf.cast(count, tf.int32))


def _uint(contents: tf.Tensor, offset: tf.Tensor, width: int) -> tf.Tensor:
    """The little-endian unsigned integer of ``width`` bytes at ``offset`` (int64; bytes past the end read as 0)."""
    raw = tf.cast(tf.io.decode_raw(_bytes(contents, offset, width), tf.uint8), tf.int64)
    raw = tf.pad(raw, [[0, width - tf.size(raw)]])
    return tf.reduce_sum(raw * tf.constant([256 ** i for i in range(width)], tf.int64))


def _chunks(contents: tf.Tensor, size: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """Walks a RIFF file's chunks (from byte 12) to its first ``fmt `` and ``data`` chunks, at most ``MAX_CHUNKS``.

    Returns:
        ``(fmt_start, fmt_size, data_start, data_size)``, int64: each chunk's first byte after its
        8-byte header and its declared size; -1 for a chunk not found.
    """
    def walking(offset, count, fmt_start, fmt_size, data_start, data_size):
        return (offset + 8 <= size) & (count < MAX_CHUNKS) & ((fmt_start < 0) | (data_start < 0))

    def step(offset, count, fmt_start, fmt_size, data_start, data_size):
        name, declared, start = _bytes(contents, offset, 4), _uint(contents, offset + 4, 4), offset + 8
        is_fmt, is_data = tf.equal(name, "fmt ") & (fmt_start < 0), tf.equal(name, "data") & (data_start < 0)
        return (start + declared + declared % 2, count + 1,  # chunks are padded to an even size
                tf.where(is_fmt, start, fmt_start), tf.where(is_fmt, declared, fmt_size),
                tf.where(is_data, start, data_start), tf.where(is_data, declared, data_size))

    minus = tf.constant(-1, tf.int64)
    found = tf.while_loop(walking, step, (tf.constant(12, tf.int64), tf.constant(0, tf.int64), minus, minus, minus,
                                          minus), maximum_iterations=MAX_CHUNKS)
    return found[2:]


def _in_order(checks: list[tuple[tf.Tensor, list[Any]]]) -> list[tf.Operation]:
    """Asserts each ``(condition, message)`` after the ones before it, so that the first failing one is reported."""
    dependencies: list[tf.Operation] = []
    for condition, message in checks:
        with tf.control_dependencies(dependencies):
            dependencies = [tf.debugging.Assert(condition, message)]
    return dependencies


def _wav_samples(contents: tf.Tensor, sample_rate: int, limit: int) -> tuple[tf.Tensor, tf.Tensor]:
    """Parses one WAV file's header and samples (see ``decode_wav`` for the formats and checks).

    Args:
        contents: a string scalar, the file.
        sample_rate: the model's rate in Hz.
        limit: the most samples accepted, counted at ``sample_rate``.

    Returns:
        ``(frames, rate)``: float32 [frames, channels] in [-1, 1] (PCM scaled as soundfile does) and the int64 rate.
    """
    size = tf.cast(tf.strings.length(contents), tf.int64)
    riff = tf.equal(_bytes(contents, 0, 4), "RIFF") & tf.equal(_bytes(contents, 8, 4), "WAVE")
    fmt_start, fmt_size, data_start, data_size = _chunks(contents, size)
    tag, channels, rate = _uint(contents, fmt_start, 2), _uint(contents, fmt_start + 2, 2), _uint(contents,
                                                                                                  fmt_start + 4, 4)
    bits = _uint(contents, fmt_start + 14, 2)
    extensible = tf.equal(tag, _EXTENSIBLE)
    tag = tf.where(extensible, _uint(contents, fmt_start + 24, 2), tag)  # the sub-format GUID's first two bytes
    kind = tf.where(tf.equal(tag, _PCM) & tf.equal(bits, 8), 0, tf.where(tf.equal(tag, _PCM) & tf.equal(bits, 16), 1,
           tf.where(tf.equal(tag, _PCM) & tf.equal(bits, 24), 2, tf.where(tf.equal(tag, _PCM) & tf.equal(bits, 32), 3,
           tf.where(tf.equal(tag, _FLOAT) & tf.equal(bits, 32), 4, -1)))))
    frame_bytes = tf.maximum(channels, 1) * tf.maximum(bits // 8, 1)
    frames = tf.maximum(tf.minimum(data_size, size - data_start), 0) // frame_bytes
    at_model_rate = (frames * sample_rate + tf.maximum(rate, 1) - 1) // tf.maximum(rate, 1)
    checks = _in_order([
        (riff, ["not a WAV file: expected a RIFF/WAVE header (RIFF at byte 0, WAVE at byte 8)"]),
        ((fmt_start >= 0) & (data_start >= 0), [
            f"a WAV file has no fmt and data chunks within its first {MAX_CHUNKS} chunks (expected a WAV file)"]),
        ((fmt_size >= 16) & (~extensible | (fmt_size >= 40)) & (fmt_start + fmt_size <= size),
         ["a WAV file has a fmt chunk cut short (expected a WAV file)"]),
        (kind >= 0, [tf.strings.format(
            "a WAV file holds format {} with {} bits per sample; expected PCM of 8, 16, 24 or 32 bits or 32-bit "
            "float (plain or WAVE_FORMAT_EXTENSIBLE)", (tag, bits))]),
        ((channels >= 1) & (channels <= MAX_CHANNELS), [tf.strings.format(
            f"a WAV file declares {{}} channels; expected 1 to {MAX_CHANNELS}", channels)]),
        ((rate >= MIN_SAMPLE_RATE) & (rate <= MAX_SAMPLE_RATE), [tf.strings.format(
            f"a WAV file declares a sample rate of {{}} Hz; expected {MIN_SAMPLE_RATE} to {MAX_SAMPLE_RATE} Hz",
            rate)]),
        (frames > 0, ["a WAV file has no samples"]),
        (at_model_rate <= limit, [tf.strings.format(
            f"a WAV file is longer than the limit of {limit} samples at {sample_rate} Hz ({limit / sample_rate:g} s)"
            f": it holds {{}} samples at {{}} Hz", (frames, rate))]),
    ])
    with tf.control_dependencies(checks):
        data = _bytes(contents, data_start, frames * frame_bytes)

    def integers(dtype: tf.DType, scale: float) -> Any:
        return lambda: tf.cast(tf.io.decode_raw(data, dtype, little_endian=True), tf.float32) / scale

    def unsigned_8() -> tf.Tensor:
        return (tf.cast(tf.io.decode_raw(data, tf.uint8), tf.float32) - 128.0) / 128.0

    def signed_24() -> tf.Tensor:
        raw = tf.reshape(tf.cast(tf.io.decode_raw(data, tf.uint8), tf.int32), [-1, 3])
        value = raw[:, 0] + raw[:, 1] * 256 + raw[:, 2] * 65536
        return tf.cast(value - tf.where(value >= 1 << 23, 1 << 24, 0), tf.float32) / float(1 << 23)

    def floats() -> tf.Tensor:
        return tf.io.decode_raw(data, tf.float32, little_endian=True)

    samples = tf.switch_case(tf.cast(tf.maximum(kind, 0), tf.int32), [
        unsigned_8, integers(tf.int16, 32768.0), signed_24, integers(tf.int32, 2.0 ** 31), floats])
    return tf.reshape(bounded(samples, "a WAV file holds NaN or infinite samples"), [-1, channels]), rate


def decode_wav(wav_bytes: tf.Tensor, sample_rate: int, resample: bool = True,
               max_samples: int | None = None) -> tuple[tf.Tensor, tf.Tensor]:
    """Decodes a batch of WAV files in the graph into mono waveforms at ``sample_rate``.

    The RIFF chunks are walked to the ``fmt `` and ``data`` chunks (at most ``MAX_CHUNKS``; a
    ``data`` size past the end of the file is cut to it, as libsndfile does). Formats: PCM of 8
    (unsigned), 16, 24 or 32 bits and 32-bit float, plain or WAVE_FORMAT_EXTENSIBLE, any number
    of channels up to ``MAX_CHANNELS`` (averaged). PCM is scaled to [-1, 1) by 2^(bits-1), as
    soundfile reads it; float samples are clipped to [-1, 1] (``bounded``). Every size read from
    the header is checked before the samples are decoded: the rate (``MIN_SAMPLE_RATE`` to
    ``MAX_SAMPLE_RATE``), the channels, and the length at the model's rate.

    Args:
        wav_bytes: string tensor [batch] of WAV file contents.
        sample_rate: the model's rate in Hz.
        resample: resample other rates with ``resample_waveform``; if False a WAV at another
            rate raises InvalidArgument.
        max_samples: the longest accepted waveform, counted at ``sample_rate`` (default
            ``DEFAULT_MAX_SECONDS`` of audio); longer raises InvalidArgument before decoding.

    Returns:
        ``(waveform, lengths)``: float32 [batch, longest] zero-padded after each waveform (to the
        longest in the batch, not to ``max_samples``), and int32 [batch] sample counts.

    Raises:
        tf.errors.InvalidArgumentError (when run): not a WAV file, an unsupported format, a rate,
            channel count or length out of bounds, no samples, NaN or Inf, or another rate with
            ``resample=False``; the message says what was expected.
    """
    limit = int(max_samples if max_samples is not None else DEFAULT_MAX_SECONDS * sample_rate)

    def decode(contents: tf.Tensor) -> tf.Tensor:
        frames, rate = _wav_samples(contents, sample_rate, limit)
        checks = [] if resample else [tf.debugging.Assert(tf.equal(rate, sample_rate), [tf.strings.format(
            f"a WAV file is at {{}} Hz, not at the model rate of {sample_rate} Hz, and resampling is off", rate)])]
        with tf.control_dependencies(checks):
            mono = tf.reduce_mean(frames, axis=1)
        return resample_waveform(mono, rate, sample_rate) if resample else mono

    waveforms = tf.map_fn(decode, tf.reshape(wav_bytes, [-1]),
                          fn_output_signature=tf.RaggedTensorSpec([None], tf.float32, ragged_rank=0))
    return waveforms.to_tensor(), tf.cast(waveforms.row_lengths(), tf.int32)


def wav_bytes(waveform: np.ndarray, sample_rate: int, file_rate: int = 22050) -> bytes:
    """A mono 16-bit PCM WAV file of ``waveform``, resampled to ``file_rate``.

    Exports use it for the example of their ``wav_bytes`` signature: a file rate other than
    the model's makes the warm-up request exercise ``decode_wav``'s in-graph resampler.

    Args:
        waveform: float samples in [-1, 1] at ``sample_rate``.
        sample_rate: the waveform's rate in Hz.
        file_rate: the rate written in the file, in Hz.

    Returns:
        The bytes of the WAV file.
    """
    import io

    import soundfile
    from scipy import signal

    common = math.gcd(file_rate, sample_rate)
    resampled = signal.resample_poly(np.asarray(waveform, np.float64), file_rate // common, sample_rate // common)
    buffer = io.BytesIO()
    soundfile.write(buffer, np.clip(resampled, -1.0, 1.0), file_rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def signature_rows(waveforms: list[np.ndarray], sample_rate: int, wav: bool) -> dict[str, np.ndarray]:
    """Waveforms as the rows of an audio signature (``seqapps predict``).

    Args:
        waveforms: float32 [samples] clips at ``sample_rate``.
        sample_rate: the model's rate in Hz.
        wav: the signature takes ``wav`` bytes (each clip written by ``wav_bytes`` at the model's rate)
            rather than a ``waveform`` batch.

    Returns:
        ``{"wav": [rows]}`` or ``{"waveform": [rows, longest]}`` (zero-padded), and ``length`` int32
        [rows], each clip's samples (an input of signatures that take it, row metadata for the others).
    """
    lengths = np.array([w.size for w in waveforms], np.int32)
    if wav:
        return {"wav": np.array([wav_bytes(w, sample_rate, sample_rate) for w in waveforms], dtype=object),
                "length": lengths}
    batch = np.zeros((len(waveforms), max(lengths, default=0)), np.float32)
    for row, waveform in zip(batch, waveforms):
        row[: waveform.size] = waveform
    return {"waveform": batch, "length": lengths}


def bounded(waveform: tf.Tensor, message: str = "a waveform holds NaN or Inf samples") -> tf.Tensor:
    """Returns ``waveform`` clipped to [-1, 1] (full scale), raising InvalidArgument (when run) for NaN or Inf.

    Every float waveform a signature takes goes through it: louder samples are not audio a
    microphone or a PCM file can hold, and amplitudes such as 1e38 overflow the log-mel power
    (inf, then NaN scores). Clipping keeps such input an answerable request, as a PCM file
    would have held it (``soundfile`` clips the same way when writing floats to PCM).

    Args:
        waveform: float32 samples, any shape.
        message: the error for NaN or Inf.

    Returns:
        The waveform, clipped.
    """
    return tf.clip_by_value(tf.debugging.assert_all_finite(waveform, message), -1.0, 1.0)


# --- Windows of a track ----------------------------------------------------------------------------------------------


def window_starts(samples: Any, window: int, hop: int) -> tf.Tensor:
    """Start samples of the windows that cover a track: every ``hop`` samples, the last one ending at the track's end.

    Args:
        samples: the track's length (a track shorter than ``window`` is one window, zero-padded).
        window: the window length in samples.
        hop: samples between window starts.

    Returns:
        int32 [windows], ascending, each ``<= max(samples - window, 0)``.
    """
    last = tf.maximum(tf.cast(samples, tf.int32) - window, 0)
    count = 1 + (last + hop - 1) // hop
    return tf.minimum(tf.range(count) * hop, last)


def cut_windows(waveform: tf.Tensor, window: int) -> tuple[tf.Tensor, tf.Tensor]:
    """The non-overlapping windows of a zero-padded batch (``window_starts`` with hop = window).

    Args:
        waveform: float32 [batch, samples].
        window: the window length in samples.

    Returns:
        ``(windows, starts)``: float32 [batch, windows, window] and int32 [windows].
    """
    samples = tf.shape(waveform)[1]
    padded = tf.pad(waveform, [[0, 0], [0, tf.maximum(window - samples, 0)]])
    starts = window_starts(samples, window, window)
    return tf.gather(padded, starts[:, None] + tf.range(window)[None, :], axis=1), starts


def shared_samples(samples: np.ndarray) -> tf.Variable:
    """``samples`` as one non-trainable CPU variable, for ``tf.data`` functions to read in place.

    ``from_tensor_slices`` copies its tensors into the dataset, and so does a dataset function that captures a
    tensor once the dataset is iterated; either way a dataset of clips holds the audio twice. A function that
    captures a variable reads it by reference (``docs/probes/dataset_copies.py`` measures the three).

    Args:
        samples: the array; the variable holds a copy, so the caller may drop it.

    Returns:
        The variable.
    """
    with tf.device("/CPU:0"):
        return tf.Variable(samples, trainable=False, name="samples")


def clip_dataset(samples: np.ndarray, lengths: np.ndarray) -> tf.data.Dataset:
    """Clips stored back to back, as a dataset of ``(clip, length)`` read from one ``shared_samples`` variable.

    Args:
        samples: [total samples], every clip after the one before, of any dtype.
        lengths: each clip's length in samples.

    Returns:
        A dataset of ``(samples[start:start + length], int32 length)``, clip by clip.
    """
    held = shared_samples(samples)
    lengths = np.asarray(lengths, np.int64)
    starts = np.cumsum(lengths) - lengths
    return tf.data.Dataset.from_tensor_slices((starts, lengths)).map(
        lambda start, length: (held[start:start + length], tf.cast(length, tf.int32)))


def window_dataset(waveforms: list[np.ndarray], targets: np.ndarray, window: int, hop: int) -> tf.data.Dataset:
    """(window, clip targets) pairs of every clip's windows (``window_starts``), sliced from one flat array.

    Args:
        waveforms: float32 clips of any length (one shorter than ``window`` is zero-padded).
        targets: [clips, ...], each clip's targets, repeated for each of its windows.
        window: the window length in samples.
        hop: samples between window starts.

    Returns:
        A dataset of ``(float32 [window], targets[clip])``, clip by clip, window by window.
    """
    lengths = [max(w.size, window) for w in waveforms]
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    flat = np.zeros(sum(lengths), np.float32)
    starts, rows = [], []
    for row, (waveform, offset) in enumerate(zip(waveforms, offsets)):
        flat[offset:offset + waveform.size] = waveform
        clip_starts = window_starts(waveform.size, window, hop).numpy()
        starts.append(offset + clip_starts)
        rows += [row] * clip_starts.size
    flat, labels = shared_samples(flat), tf.constant(targets[rows])
    return tf.data.Dataset.from_tensor_slices((np.concatenate(starts), np.arange(len(rows)))).map(
        lambda start, i: (flat[start:start + window], labels[i]))
