"""Band-limited resampling of a waveform in the graph, in core TensorFlow ops.

A layer module so that the layers that resample (``seqapps.layers.augment``'s speed and pitch) and the
data readers (``seqapps.data.audio``'s WAV decoding) share one resampler.
"""
from __future__ import annotations

import math

import tensorflow as tf

#: Resampler settings: sinc zero crossings on each side, Kaiser window beta, and the cutoff as a share of the
#: lower Nyquist frequency (the transition band sits just below it, as in soxr and resampy).
ZERO_CROSSINGS = 32
KAISER_BETA = 10.0
ROLLOFF = 0.94
_CHUNK_TAPS = 1 << 20  # (output sample, tap) pairs per resampling step: about 4 MB per float32 tensor


def resample_waveform(waveform: tf.Tensor, source_rate: tf.Tensor | int, target_rate: int) -> tf.Tensor:
    """Resamples one mono waveform in the graph by band-limited (windowed-sinc) interpolation.

    Output sample ``n`` sits at source time ``t = n * source_rate / target_rate`` (the
    first samples coincide) and is ``sum_k x[k] h(t - k)`` with ``h`` a sinc low-pass at
    ``ROLLOFF`` times the lower of the two Nyquist frequencies, truncated at
    ``ZERO_CROSSINGS`` zero crossings each side by a Kaiser window (beta ``KAISER_BETA``);
    beyond the ends the signal is zero. Positions are exact integer ratios (no drift).
    The taps grow with ``source_rate / target_rate``; work runs in chunks of output samples
    sized so that a chunk holds at most ``_CHUNK_TAPS`` (sample, tap) pairs, one or two chunks
    at a time, so memory does not grow with the rate or the length. Callers bound the source
    rate (``decode_wav`` takes ``MIN_SAMPLE_RATE`` to ``MAX_SAMPLE_RATE``).

    Args:
        waveform: float32 [samples].
        source_rate: its sample rate in Hz (a positive scalar tensor, e.g. from a WAV header).
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
        size = tf.maximum(_CHUNK_TAPS // (2 * half_taps), 1)  # output samples per chunk
        chunks = (out_length + size - 1) // size

        def chunk(index: tf.Tensor) -> tf.Tensor:
            n = index * size + tf.range(size, dtype=tf.int64)
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

        values = tf.map_fn(chunk, tf.range(chunks), fn_output_signature=tf.TensorSpec([None], tf.float32),
                           parallel_iterations=2)
        return tf.reshape(values, [-1])[:out_length]

    return tf.cond(tf.equal(source, target), lambda: tf.identity(waveform), interpolate)


def _sinc(x: tf.Tensor) -> tf.Tensor:
    """sin(pi x) / (pi x), 1 at 0."""
    safe = tf.where(tf.equal(x, 0.0), tf.ones_like(x), x)
    return tf.where(tf.equal(x, 0.0), tf.ones_like(x), tf.sin(math.pi * safe) / (math.pi * safe))
