"""Audio: reading files in Python, decoding WAV bytes in the graph, and resampling.

- ``read_audio`` (training data, ``predict``): WAV, FLAC, OGG/Vorbis and MP3 through
  soundfile (libsndfile), other formats through an audioread backend when one is
  installed (ffmpeg, GStreamer); mono float32 at the requested rate, resampled with
  soxr's "HQ" quality (what ``librosa.resample`` does by default).
- ``wav_bytes`` (export examples): a waveform written as WAV bytes at another rate.
- ``signature_rows`` (``predict``): clips as a zero-padded batch or as WAV bytes, with their lengths.
- ``decode_wav`` (exports): a batch of 16-bit PCM WAV bytes -> a zero-padded mono
  float32 batch and the lengths, resampled in the graph by ``resample_waveform``, a windowed-sinc
  (Kaiser) band-limited interpolator written in core TensorFlow ops.
- ``window_starts``, ``cut_windows``, ``window_dataset``: a track cut into fixed-length windows
  (the last one ending at the track's end, a short track zero-padded), in the graph or as a
  ``tf.data`` dataset of training windows.

Non-finite samples: ``read_audio`` raises ``DataError``; 16-bit WAV bytes cannot hold
them; a float waveform sent to an export should pass ``assert_finite`` (InvalidArgument
for NaN or Inf), since the log-mel front end in the model
(``seqapps.layers.spectrogram.LogMelSpectrogram``) passes NaN through. Silence is valid: its
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

#: ``decode_wav``'s default bound, in seconds at the model's sample rate.
DEFAULT_MAX_SECONDS = 30.0
#: Resampler settings: sinc zero crossings on each side, Kaiser window beta, and the cutoff as a share of the
#: lower Nyquist frequency (the transition band sits just below it, as in soxr and resampy).
ZERO_CROSSINGS = 32
KAISER_BETA = 10.0
ROLLOFF = 0.94
_CHUNK = 4096  # output samples per resampling step (memory: _CHUNK x taps floats)
#: The sample rates ``read_audio`` accepts from a file's header, in Hz (resampling work grows with the ratio).
FILE_RATES = (1000, 384000)


# --- Python: files ---------------------------------------------------------------------------------------------------


def _decode_file(path: Path, where: str, max_seconds: float | None) -> tuple[np.ndarray, int]:
    """Frames [n, channels] and the rate, through soundfile, else audioread."""
    import soundfile

    def valid_rate(rate: int) -> int:
        if not FILE_RATES[0] <= rate <= FILE_RATES[1]:
            raise DataError(f"{where}: the header gives a sample rate of {rate} Hz; expected "
                            f"{FILE_RATES[0]} to {FILE_RATES[1]} Hz")
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
            NaN or Inf, declares a sample rate outside ``FILE_RATES``, or is too long; one line
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
    mono = frames.mean(axis=1)
    if rate != sample_rate:
        import soxr

        mono = soxr.resample(mono, rate, sample_rate, quality="HQ")
    return mono.astype(np.float32)


# --- Graph: WAV bytes, resampling, checks -------------------------------------------------------------------------


def resample_waveform(waveform: tf.Tensor, source_rate: tf.Tensor | int, target_rate: int) -> tf.Tensor:
    """Resamples one mono waveform in the graph by band-limited (windowed-sinc) interpolation.

    Output sample ``n`` sits at source time ``t = n * source_rate / target_rate`` (the
    first samples coincide) and is ``sum_k x[k] h(t - k)`` with ``h`` a sinc low-pass at
    ``ROLLOFF`` times the lower of the two Nyquist frequencies, truncated at
    ``ZERO_CROSSINGS`` zero crossings each side by a Kaiser window (beta ``KAISER_BETA``);
    beyond the ends the signal is zero. Positions are exact integer ratios (no drift).
    Work runs in chunks of output samples, so memory is O(chunk x taps), not O(length x taps).

    Args:
        waveform: float32 [samples].
        source_rate: its sample rate in Hz (a scalar tensor, e.g. from ``tf.audio.decode_wav``).
        target_rate: the rate to produce, in Hz.

    Returns:
        float32 [ceil(samples * target_rate / source_rate)]; the input unchanged when the rates are equal.
    """
    source = tf.cast(source_rate, tf.int64)
    target = tf.constant(target_rate, tf.int64)

    def interpolate() -> tf.Tensor:
        length = tf.cast(tf.shape(waveform)[0], tf.int64)
        out_length = (length * target + source - 1) // source
        cutoff = ROLLOFF * tf.minimum(1.0, tf.cast(target, tf.float32) / tf.cast(source, tf.float32))
        half_taps = tf.cast(tf.math.ceil(ZERO_CROSSINGS / cutoff), tf.int64)
        taps = tf.range(-half_taps + 1, half_taps + 1)  # source offsets around floor(t)
        padded = tf.pad(waveform, [[half_taps, half_taps + 1]])
        chunks = (out_length + _CHUNK - 1) // _CHUNK

        def chunk(index: tf.Tensor) -> tf.Tensor:
            n = index * _CHUNK + tf.range(_CHUNK, dtype=tf.int64)
            base = n * source // target
            frac = tf.cast(n * source - base * target, tf.float32) / tf.cast(target, tf.float32)
            tau = frac[:, None] - tf.cast(taps[None, :], tf.float32)  # t - k, in source samples
            position = tau * cutoff / ZERO_CROSSINGS  # in [-1, 1] inside the window
            window = tf.math.bessel_i0(KAISER_BETA * tf.sqrt(tf.nn.relu(1.0 - tf.square(position))))
            window = tf.where(tf.abs(position) <= 1.0, window / tf.math.bessel_i0(KAISER_BETA), 0.0)
            kernel = cutoff * _sinc(cutoff * tau) * window
            samples = tf.gather(padded, tf.clip_by_value(base[:, None] + taps[None, :] + half_taps, 0,
                                                         tf.cast(tf.shape(padded)[0], tf.int64) - 1))
            return tf.reduce_sum(samples * kernel, axis=1)

        values = tf.map_fn(chunk, tf.range(chunks), fn_output_signature=tf.TensorSpec([_CHUNK], tf.float32))
        return tf.reshape(values, [-1])[:out_length]

    return tf.cond(tf.equal(source, target), lambda: tf.identity(waveform), interpolate)


def _sinc(x: tf.Tensor) -> tf.Tensor:
    """sin(pi x) / (pi x), 1 at 0."""
    safe = tf.where(tf.equal(x, 0.0), tf.ones_like(x), x)
    return tf.where(tf.equal(x, 0.0), tf.ones_like(x), tf.sin(math.pi * safe) / (math.pi * safe))


def decode_wav(wav_bytes: tf.Tensor, sample_rate: int, resample: bool = True,
               max_samples: int | None = None) -> tuple[tf.Tensor, tf.Tensor]:
    """Decodes a batch of 16-bit PCM WAV files in the graph into mono waveforms at ``sample_rate``.

    Args:
        wav_bytes: string tensor [batch] of WAV file contents (16-bit PCM, any rate and channels).
        sample_rate: the model's rate in Hz.
        resample: resample other rates with ``resample_waveform``; if False a WAV at another
            rate raises InvalidArgument.
        max_samples: the longest accepted waveform, counted at ``sample_rate`` (default
            ``DEFAULT_MAX_SECONDS`` of audio); longer raises InvalidArgument before resampling.

    Returns:
        ``(waveform, lengths)``: float32 [batch, longest] zero-padded after each waveform,
        and int32 [batch] sample counts.

    Raises:
        tf.errors.InvalidArgumentError (when run): not 16-bit PCM WAV, no samples, too long,
            or another rate with ``resample=False``.
    """
    limit = int(max_samples if max_samples is not None else DEFAULT_MAX_SECONDS * sample_rate)

    def decode(contents: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        audio, rate = tf.audio.decode_wav(contents)
        frames = tf.cast(tf.shape(audio)[0], tf.int64)
        out_length = (frames * sample_rate + tf.cast(rate, tf.int64) - 1) // tf.cast(rate, tf.int64)
        checks = [
            tf.debugging.Assert(frames > 0, ["a WAV file has no samples"]),
            tf.debugging.Assert(out_length <= limit, [
                f"a WAV file is longer than the limit of {limit} samples at {sample_rate} Hz; samples:", out_length]),
        ]
        if not resample:
            checks.append(tf.debugging.Assert(tf.equal(rate, sample_rate), [
                f"a WAV file is not at the model rate of {sample_rate} Hz and resampling is off; its rate:",
                rate]))
        with tf.control_dependencies(checks):
            mono = tf.reduce_mean(audio, axis=1)
        if resample:
            mono = resample_waveform(mono, rate, sample_rate)
        length = tf.shape(mono)[0]
        return tf.pad(mono, [[0, limit - length]]), length

    waveforms, lengths = tf.map_fn(decode, tf.reshape(wav_bytes, [-1]),
                                   fn_output_signature=(tf.TensorSpec([limit], tf.float32),
                                                        tf.TensorSpec([], tf.int32)))
    return waveforms[:, :tf.reduce_max(tf.concat([lengths, [0]], 0))], lengths


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


def assert_finite(waveform: tf.Tensor) -> tf.Tensor:
    """Returns ``waveform``, raising InvalidArgument (when run) if it holds NaN or Inf."""
    return tf.debugging.assert_all_finite(waveform, "a waveform holds NaN or Inf samples")


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
    flat, labels = tf.constant(flat), tf.constant(targets[rows])
    return tf.data.Dataset.from_tensor_slices((np.concatenate(starts), np.arange(len(rows)))).map(
        lambda start, i: (flat[start:start + window], labels[i]))
