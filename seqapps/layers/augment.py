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


# --- log-mel features ---------------------------------------------------------------------------

FEATURE_AUGMENTATIONS = ("vtlp", "specaugment")
#: Every augmentation a speech model takes: of the waveform, then of the log-mel.
ALL_AUGMENTATIONS = AUGMENTATIONS + FEATURE_AUGMENTATIONS
#: VTLP's range of warp factors (Jaitly and Hinton 2013: 0.9 to 1.1).
VTLP_WARP = (0.9, 1.1)


def slaney_hz_to_mel(hz: tf.Tensor) -> tf.Tensor:
    """librosa's ``hz_to_mel`` (Slaney: linear below 1 kHz, logarithmic above), in the graph."""
    hz = tf.convert_to_tensor(hz, tf.float32)
    return tf.where(hz < 1000.0, 3.0 * hz / 200.0, 15.0 + tf.math.log(tf.maximum(hz, 1e-3) / 1000.0) * 27.0 /
                    math.log(6.4))


def warp_mel_bands(features: tf.Tensor, factor: tf.Tensor, fmin: float, fmax: float) -> tf.Tensor:
    """Vocal tract length perturbation (Jaitly and Hinton 2013) of log-mel features.

    Band ``m`` of example ``b`` takes the value the features have at frequency ``centre_m / factor_b``
    (linear interpolation between bands, clamped to the first and last band), where the centres are
    librosa's Slaney mel centres of ``features.shape[-1]`` bands between ``fmin`` and ``fmax``. A factor
    above 1 moves the spectral envelope up, as a shorter vocal tract does.

    Args:
        features: float32 [batch, frames, bands].
        factor: float32 [batch], the warp of each example (1: unchanged).
        fmin, fmax: the filterbank's range in Hz.

    Returns:
        The warped features, of the same shape.
    """
    bands = features.shape[-1]
    low, high = slaney_hz_to_mel(fmin), slaney_hz_to_mel(fmax)
    centres = np.linspace(0.0, 1.0, bands + 2)[1:-1]  # of the mel range
    hz = _slaney_mel_to_hz(low + (high - low) * tf.constant(centres, tf.float32))
    source = (slaney_hz_to_mel(hz[None, :] / factor[:, None]) - low) / (high - low) * (bands + 1) - 1.0
    source = tf.clip_by_value(source, 0.0, bands - 1.0)  # [batch, bands]
    below = tf.minimum(tf.cast(tf.floor(source), tf.int32), bands - 2)
    weight = (source - tf.cast(below, tf.float32))[:, None, :]
    lower = tf.gather(features, below, axis=2, batch_dims=1)
    upper = tf.gather(features, below + 1, axis=2, batch_dims=1)
    return lower + weight * (upper - lower)


def _slaney_mel_to_hz(mel: tf.Tensor) -> tf.Tensor:
    return tf.where(mel < 15.0, 200.0 * mel / 3.0, 1000.0 * tf.exp((mel - 15.0) * math.log(6.4) / 27.0))


def mask_spans(features: tf.Tensor, start: tf.Tensor, width: tf.Tensor, axis: int) -> tf.Tensor:
    """SpecAugment's masks (Park et al. 2019): zeroes ``width`` positions from ``start`` along ``axis``.

    Args:
        features: float32 [batch, frames, bands], normalised (zero is the mean).
        start, width: int32 [batch, masks], each example's spans along ``axis`` (1: frames, 2: bands).
        axis: 1 or 2.

    Returns:
        The features with every span of every example set to zero.
    """
    positions = tf.range(tf.shape(features)[axis])[None, None, :]
    inside = (positions >= start[..., None]) & (positions < (start + width)[..., None])  # [batch, masks, size]
    keep = 1.0 - tf.cast(tf.reduce_any(inside, axis=1), features.dtype)  # [batch, size]
    return features * (keep[:, :, None] if axis == 1 else keep[:, None, :])


class FeatureAugment(keras.layers.Layer):
    """VTLP and SpecAugment of normalised log-mel features while training.

    ``vtlp`` warps every example's frequency axis by a factor drawn uniformly in ``warp``
    (``warp_mel_bands``). ``specaugment`` zeroes ``masks`` spans of up to ``max_band_share`` of the bands
    and ``masks`` spans of up to ``max_frame_share`` of each example's valid frames (at most
    ``max_frames``), SpecAugment's frequency and time masks (its LD policy scaled to short clips; no
    time warping). Outside training it is the identity; ``CTCSpeechModel`` calls it in training only, so
    no export holds it.

    Args:
        augmentations: names of ``FEATURE_AUGMENTATIONS``.
        fmin, fmax: the filterbank's range in Hz (``vtlp``).
        warp: the range of warp factors.
        masks: spans of each kind per example.
        max_band_share, max_frame_share, max_frames: the widest spans.
        seed: seed of the draws.
        **kwargs: base layer arguments.

    Call arguments:
        features: float32 [batch, frames, bands], zero on padded frames.
        frames: int32 [batch], each example's valid frames.
        training: augment only when True.
    """

    def __init__(self, augmentations: list[str] | tuple[str, ...] = FEATURE_AUGMENTATIONS, fmin: float = 0.0,
                 fmax: float = 8000.0, warp: tuple[float, float] = VTLP_WARP, masks: int = 2,
                 max_band_share: float = 27 / 80, max_frame_share: float = 0.1, max_frames: int = 40,
                 seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        unknown = sorted(set(augmentations) - set(FEATURE_AUGMENTATIONS))
        if unknown:
            raise ValueError(f"FeatureAugment: unknown augmentations {unknown}, expected some of "
                             f"{FEATURE_AUGMENTATIONS}")
        self.augmentations = [name for name in FEATURE_AUGMENTATIONS if name in augmentations]
        self.fmin, self.fmax, self.warp, self.masks = fmin, fmax, tuple(warp), masks
        self.max_band_share, self.max_frame_share, self.max_frames = max_band_share, max_frame_share, max_frames
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def _spans(self, batch: tf.Tensor, size: tf.Tensor, widest: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """``masks`` spans per example: widths uniform in [0, widest], starts uniform where the span fits."""
        shape = (batch, self.masks)
        widest = tf.cast(widest, tf.float32)[:, None]
        width = tf.cast(tf.floor(keras.random.uniform(shape, seed=self.seed_generator) * (widest + 1.0)), tf.int32)
        room = tf.cast(tf.maximum(tf.cast(size, tf.int32)[:, None] - width, 0), tf.float32)
        start = tf.cast(tf.floor(keras.random.uniform(shape, seed=self.seed_generator) * (room + 1.0)), tf.int32)
        return start, width

    def call(self, features: tf.Tensor, frames: tf.Tensor, training: bool | None = None) -> tf.Tensor:
        if not training or not self.augmentations:
            return features
        batch, bands = tf.shape(features)[0], features.shape[-1]
        if "vtlp" in self.augmentations:
            factor = keras.random.uniform((batch,), *self.warp, seed=self.seed_generator)
            features = warp_mel_bands(features, factor, self.fmin, self.fmax)
        if "specaugment" in self.augmentations:
            band_limit = tf.fill([batch], int(self.max_band_share * bands))
            start, width = self._spans(batch, tf.fill([batch], bands), band_limit)
            features = mask_spans(features, start, width, axis=2)
            frame_limit = tf.minimum(tf.cast(self.max_frame_share * tf.cast(frames, tf.float32), tf.int32),
                                     self.max_frames)
            start, width = self._spans(batch, frames, frame_limit)
            features = mask_spans(features, start, width, axis=1)
        return features

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "augmentations": list(self.augmentations), "fmin": self.fmin,
                "fmax": self.fmax, "warp": list(self.warp), "masks": self.masks,
                "max_band_share": self.max_band_share, "max_frame_share": self.max_frame_share,
                "max_frames": self.max_frames, "seed": self.seed}
