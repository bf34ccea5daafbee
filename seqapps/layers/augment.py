"""Waveform augmentation in the graph, for training only: speed, pitch, noise, reverberation, telephone band.

Each function takes a zero-padded batch ``waveform`` float32 [batch, samples] with its
valid ``length`` int [batch] and the per-example settings already drawn, so that tests
can compare it with a NumPy or librosa reference; ``WaveformAugment`` draws the settings
from a seeded generator and applies them. Anchors: the Kaldi speed-perturbation recipe
(Ko et al. 2015: copies at 0.9, 1.0 and 1.1 times the speed, by resampling, which moves
pitch and tempo together), librosa's ``pitch_shift`` (a phase-vocoder time stretch, then a
resampling back to the length), additive noise at a signal-to-noise ratio, convolution
with a synthetic exponentially decaying room impulse response, and the 300-3,400 Hz band
of telephone speech.
"""
from __future__ import annotations

import math
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from seqapps.layers.resampling import resample_waveform

AUGMENTATIONS = ("speed", "pitch", "noise", "reverb", "telephone")
SPEED_FACTORS = (0.9, 1.0, 1.1)
TELEPHONE_BAND = (300.0, 3400.0)
_VOCODER_FFT, _VOCODER_HOP = 512, 128


def valid_mask(length: tf.Tensor, samples: tf.Tensor) -> tf.Tensor:
    """float32 [batch, samples]: 1 on the valid samples, 0 on the padding."""
    return tf.sequence_mask(tf.cast(length, tf.int32), samples, dtype=tf.float32)


def add_noise(waveform: tf.Tensor, length: tf.Tensor, snr_db: tf.Tensor, noise: tf.Tensor) -> tf.Tensor:
    """Adds noise scaled so that each example's signal-to-noise ratio over its valid samples is ``snr_db``.

    Args:
        waveform: float32 [batch, samples].
        length: int [batch] valid samples.
        snr_db: float32 [batch] the ratio of the waveform's power to the added noise's, in dB.
        noise: float32 [batch, samples] the noise before scaling (any power).

    Returns:
        The noisy waveform, zero past each length.
    """
    mask = valid_mask(length, tf.shape(waveform)[1])
    signal_power = tf.reduce_sum(tf.square(waveform * mask), axis=1)
    noise_power = tf.maximum(tf.reduce_sum(tf.square(noise * mask), axis=1), 1e-12)
    scale = tf.sqrt(signal_power / (noise_power * tf.pow(10.0, snr_db / 10.0)))
    return (waveform + noise * scale[:, None]) * mask


def impulse_responses(rt60: tf.Tensor, noise: tf.Tensor, sample_rate: int) -> tf.Tensor:
    """Synthetic room impulse responses: noise under an envelope that falls 60 dB in ``rt60`` seconds.

    Args:
        rt60: float32 [batch] reverberation times in seconds.
        noise: float32 [batch, taps] white noise (the taps cover the longest rt60).
        sample_rate: Hz.

    Returns:
        float32 [batch, taps] responses of unit energy.
    """
    t = tf.range(tf.shape(noise)[1], dtype=tf.float32) / sample_rate
    response = noise * tf.exp(-math.log(1000.0) * t[None, :] / rt60[:, None])
    return response * tf.math.rsqrt(tf.reduce_sum(tf.square(response), axis=1, keepdims=True))


def reverberate(waveform: tf.Tensor, length: tf.Tensor, impulse: tf.Tensor, wet: tf.Tensor) -> tf.Tensor:
    """The dry waveform plus ``wet`` times its convolution with an impulse response, cut to its length.

    Args:
        waveform: float32 [batch, samples].
        length: int [batch] valid samples.
        impulse: float32 [batch, taps] (``impulse_responses``).
        wet: float32 [batch] the reverberant part's gain.

    Returns:
        float32 [batch, samples], zero past each length.
    """
    samples = tf.shape(waveform)[1]
    size = samples + tf.shape(impulse)[1] - 1
    fft_length = tf.cast(2 ** tf.math.ceil(tf.math.log(tf.cast(size, tf.float32)) / math.log(2.0)), tf.int32)
    spectrum = tf.signal.rfft(waveform, [fft_length]) * tf.signal.rfft(impulse, [fft_length])
    wet_part = tf.signal.irfft(spectrum, [fft_length])[:, :samples]
    return (waveform + wet[:, None] * wet_part) * valid_mask(length, samples)


def band_limit(waveform: tf.Tensor, length: tf.Tensor, sample_rate: int,
               band: tuple[float, float] = TELEPHONE_BAND) -> tf.Tensor:
    """Removes every frequency outside ``band`` (an ideal band-pass over the whole clip's spectrum).

    Args:
        waveform: float32 [batch, samples].
        length: int [batch] valid samples.
        sample_rate: Hz.
        band: the kept frequencies, ``(low, high)`` Hz.

    Returns:
        float32 [batch, samples], zero past each length.
    """
    samples = tf.shape(waveform)[1]
    spectrum = tf.signal.rfft(waveform, [samples])
    frequencies = tf.range(tf.shape(spectrum)[1], dtype=tf.float32) * sample_rate / tf.cast(samples, tf.float32)
    keep = tf.cast((frequencies >= band[0]) & (frequencies <= band[1]), tf.complex64)
    return tf.signal.irfft(spectrum * keep[None, :], [samples]) * valid_mask(length, samples)


def _per_example(function: Any, waveform: tf.Tensor, length: tf.Tensor, value: tf.Tensor,
                 out_length: tf.Tensor) -> tf.Tensor:
    """``function(valid samples, value)`` of each example, zero-padded to the longest ``out_length``."""
    width = tf.reduce_max(out_length)

    def one(args: tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]) -> tf.Tensor:
        row, n, setting, out = args
        result = function(row[:n], setting)[:out]
        return tf.pad(result, [[0, width - tf.shape(result)[0]]])

    return tf.map_fn(one, (waveform, tf.cast(length, tf.int32), value, out_length),
                     fn_output_signature=tf.TensorSpec([None], tf.float32))


def change_speed(waveform: tf.Tensor, length: tf.Tensor, factor: tf.Tensor,
                 sample_rate: int) -> tuple[tf.Tensor, tf.Tensor]:
    """Plays each example ``factor`` times as fast by resampling (Kaldi's speed perturbation): the length
    divides by the factor and every frequency multiplies by it.

    Args:
        waveform: float32 [batch, samples].
        length: int [batch] valid samples.
        factor: float32 [batch] speeds (1 leaves an example as it is).
        sample_rate: Hz.

    Returns:
        ``(waveform, length)``: the new zero-padded batch and its lengths, ``ceil(length / factor)``.
    """
    source = tf.cast(tf.round(sample_rate * factor), tf.int64)
    out_length = tf.cast((tf.cast(length, tf.int64) * sample_rate + source - 1) // source, tf.int32)

    def resample(row: tf.Tensor, rate: tf.Tensor) -> tf.Tensor:
        return resample_waveform(row, rate, sample_rate)

    return _per_example(resample, waveform, length, source, out_length), out_length


def _time_stretch(row: tf.Tensor, rate: tf.Tensor) -> tf.Tensor:
    """A phase-vocoder time stretch of one waveform (as librosa's ``phase_vocoder``): ``rate`` > 1 is shorter."""
    pad = _VOCODER_FFT // 2
    stft = tf.signal.stft(tf.pad(row, [[pad, pad]]), _VOCODER_FFT, _VOCODER_HOP, pad_end=True)
    frames = tf.shape(stft)[0]
    stft = tf.concat([stft, tf.zeros([2, tf.shape(stft)[1]], stft.dtype)], axis=0)
    steps = tf.range(0.0, tf.cast(frames, tf.float32), rate)
    index = tf.cast(tf.floor(steps), tf.int32)
    alpha = (steps - tf.floor(steps))[:, None]
    first, second = tf.gather(stft, index), tf.gather(stft, index + 1)
    magnitude = (1.0 - alpha) * tf.abs(first) + alpha * tf.abs(second)
    advance = tf.linspace(0.0, np.pi * _VOCODER_HOP, tf.shape(stft)[1])[None, :]
    delta = tf.math.angle(second) - tf.math.angle(first) - advance
    delta -= 2.0 * np.pi * tf.round(delta / (2.0 * np.pi))
    phase = tf.math.angle(stft[:1]) + tf.cumsum(advance + delta, axis=0, exclusive=True)
    spectrum = tf.complex(magnitude * tf.cos(phase), magnitude * tf.sin(phase))
    stretched = tf.signal.inverse_stft(spectrum, _VOCODER_FFT, _VOCODER_HOP,
                                       window_fn=tf.signal.inverse_stft_window_fn(_VOCODER_HOP))
    return stretched[tf.cast(tf.round(pad / rate), tf.int32):]  # the padding, stretched too


def shift_pitch(waveform: tf.Tensor, length: tf.Tensor, semitones: tf.Tensor, sample_rate: int) -> tf.Tensor:
    """Moves each example's pitch by ``semitones`` and keeps its length (librosa's ``pitch_shift`` method: a
    phase-vocoder stretch by ``2 ** (semitones / 12)``, then a resampling back to the length).

    Args:
        waveform: float32 [batch, samples].
        length: int [batch] valid samples.
        semitones: float32 [batch] shifts (0 leaves an example as it is).
        sample_rate: Hz.

    Returns:
        float32 [batch, samples], zero past each length.
    """
    def shift(row: tf.Tensor, steps: tf.Tensor) -> tf.Tensor:
        ratio = tf.pow(2.0, steps / 12.0)
        def moved() -> tf.Tensor:
            stretched = _time_stretch(row, 1.0 / ratio)
            source = tf.cast(tf.round(sample_rate * ratio), tf.int64)
            resampled = resample_waveform(stretched, source, sample_rate)
            return tf.pad(resampled, [[0, tf.maximum(tf.shape(row)[0] - tf.shape(resampled)[0], 0)]])
        return tf.cond(tf.equal(steps, 0.0), lambda: row, moved)

    return _per_example(shift, waveform, length, tf.cast(semitones, tf.float32), tf.cast(length, tf.int32))


class WaveformAugment(keras.layers.Layer):
    """Random speed, pitch, noise, reverberation and telephone band of a waveform batch while training.

    Per example: ``speed`` plays it at a factor drawn from ``SPEED_FACTORS`` (as Kaldi's three
    copies); each other augmentation applies with probability ``probability``: ``pitch`` a shift
    drawn uniformly within ``max_semitones``, ``noise`` white noise at an SNR drawn uniformly in
    ``snr_db``, ``reverb`` a synthetic room response of a reverberation time drawn in ``rt60`` and a
    wet gain in [0.3, 1], ``telephone`` the 300-3,400 Hz band. Outside training it is the identity,
    and no export calls it (``CTCSpeechModel`` applies it in ``train_step`` only). It is not registered
    for serialisation: the model that owns it rebuilds it from its own config.

    Args:
        augmentations: names of ``AUGMENTATIONS``, applied in that order.
        sample_rate: Hz.
        probability: the share of examples each of pitch, noise, reverb and telephone touches.
        max_semitones: the largest pitch shift.
        snr_db: the range of signal-to-noise ratios.
        rt60: the range of reverberation times, seconds.
        seed: seed of the draws.
        **kwargs: base layer arguments.

    Call arguments:
        inputs: ``{"waveform": float32 [batch, samples], "length": int [batch]}``.
        min_length: int [batch] or None: an example is sped up only when it keeps at least this many
            samples (the frames its CTC labels need).
        training: augment only when True.

    Returns:
        ``{"waveform", "length"}``: the augmented batch (speed changes the lengths).

    Example:
    ```python
    augment = WaveformAugment(["speed", "noise"], sample_rate=16000, seed=1)
    batch = augment({"waveform": waveform, "length": length}, training=True)
    ```
    """

    def __init__(self, augmentations: list[str] | tuple[str, ...] = AUGMENTATIONS, sample_rate: int = 16000,
                 probability: float = 0.5, max_semitones: float = 2.0, snr_db: tuple[float, float] = (5.0, 30.0),
                 rt60: tuple[float, float] = (0.2, 0.8), seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        unknown = sorted(set(augmentations) - set(AUGMENTATIONS))
        if unknown:
            raise ValueError(f"WaveformAugment: unknown augmentations {unknown}, expected some of {AUGMENTATIONS}")
        self.augmentations = [name for name in AUGMENTATIONS if name in augmentations]
        self.sample_rate, self.probability, self.max_semitones = sample_rate, probability, max_semitones
        self.snr_db, self.rt60, self.seed = tuple(snr_db), tuple(rt60), seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def _uniform(self, batch: tf.Tensor, low: float, high: float) -> tf.Tensor:
        return keras.random.uniform((batch,), low, high, seed=self.seed_generator)

    def _chosen(self, batch: tf.Tensor) -> tf.Tensor:
        return tf.cast(self._uniform(batch, 0.0, 1.0) < self.probability, tf.float32)

    def call(self, inputs: dict[str, tf.Tensor], min_length: tf.Tensor | None = None,
             training: bool | None = None) -> dict[str, tf.Tensor]:
        waveform, length = tf.cast(inputs["waveform"], tf.float32), tf.cast(inputs["length"], tf.int32)
        if not training or not self.augmentations:
            return {"waveform": waveform, "length": length}
        batch = tf.shape(waveform)[0]
        if "speed" in self.augmentations:
            pick = tf.cast(tf.floor(self._uniform(batch, 0.0, len(SPEED_FACTORS))), tf.int32)
            factor = tf.gather(tf.constant(SPEED_FACTORS, tf.float32), tf.minimum(pick, len(SPEED_FACTORS) - 1))
            if min_length is not None:
                kept = tf.cast(tf.math.ceil(tf.cast(length, tf.float32) / factor), tf.int32)
                factor = tf.where(kept >= tf.cast(min_length, tf.int32), factor, 1.0)
            waveform, length = change_speed(waveform, length, factor, self.sample_rate)
        if "pitch" in self.augmentations:
            steps = self._uniform(batch, -self.max_semitones, self.max_semitones) * self._chosen(batch)
            waveform = shift_pitch(waveform, length, steps, self.sample_rate)
        if "noise" in self.augmentations:
            snr = self._uniform(batch, *self.snr_db)
            noise = keras.random.normal(tf.shape(waveform), seed=self.seed_generator) * self._chosen(batch)[:, None]
            waveform = add_noise(waveform, length, snr, noise)
        if "reverb" in self.augmentations:
            taps = int(self.rt60[1] * self.sample_rate)
            impulse = impulse_responses(self._uniform(batch, *self.rt60),
                                        keras.random.normal((batch, taps), seed=self.seed_generator), self.sample_rate)
            waveform = reverberate(waveform, length, impulse, self._uniform(batch, 0.3, 1.0) * self._chosen(batch))
        if "telephone" in self.augmentations:
            chosen = self._chosen(batch)[:, None]
            waveform = chosen * band_limit(waveform, length, self.sample_rate) + (1.0 - chosen) * waveform
        return {"waveform": waveform, "length": length}

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "augmentations": list(self.augmentations), "sample_rate": self.sample_rate,
                "probability": self.probability, "max_semitones": self.max_semitones, "snr_db": list(self.snr_db),
                "rt60": list(self.rt60), "seed": self.seed}
