"""Layers of the audio models: the log-mel front end, and over its spectrogram-like sequences [batch, time,
features] training-time masking and summaries over time.

``LogMelSpectrogram`` is the one front end, inside the model, so that training and serving compute the
same features (STFT, a mel filterbank built once by librosa and saved as a weight, log with a floor).
librosa is imported only when a ``LogMelSpectrogram`` builds its filterbank; the first librosa call in a
fresh environment compiles numba functions and writes them to numba's cache (measured: ~40 s once, ~3 s later).
"""
from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="seqapps")
class TimeStatistics(keras.layers.Layer):
    """Statistics over time of a sequence, concatenated: a fixed-size summary of every feature.

    Args:
        statistics: names from ``"mean"``, ``"max"`` and ``"std"`` (population standard deviation), in output order.
        **kwargs: base layer arguments (name, dtype, ...).

    Call arguments:
        inputs: float [batch, time, features].

    Returns:
        float [batch, len(statistics) * features].

    Example:
    ```python
    summary = TimeStatistics(("mean", "std"))(keras.ops.ones((2, 10, 4)))  # [2, 8]: means, then deviations
    ```
    """

    REDUCTIONS = {"mean": keras.ops.mean, "max": keras.ops.max, "std": keras.ops.std}

    def __init__(self, statistics: tuple[str, ...] | list[str] = ("mean", "max"), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        unknown = [name for name in statistics if name not in self.REDUCTIONS]
        if not statistics or unknown:
            raise ValueError(f"TimeStatistics: statistics must be names from {', '.join(self.REDUCTIONS)}, "
                             f"got {list(statistics)}")
        self.statistics = tuple(statistics)

    def call(self, inputs: Any) -> Any:
        return keras.ops.concatenate([self.REDUCTIONS[name](inputs, axis=1) for name in self.statistics], axis=-1)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        features = None if input_shape[-1] is None else input_shape[-1] * len(self.statistics)
        return (input_shape[0], features)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "statistics": list(self.statistics)}


@keras.saving.register_keras_serializable(package="seqapps")
class SpecAugment(keras.layers.Layer):
    """SpecAugment-style masking (Park et al. 2019) of a spectrogram while training; the identity otherwise.

    Each example gets ``masks`` time masks and ``masks`` band masks, each of a width drawn uniformly from
    ``0..max_width`` at a uniform position; masked values are set to 0 (the band mean of standardised features).

    Args:
        masks: masks per axis and example.
        max_frames: the widest time mask.
        max_bands: the widest band mask.
        seed: seed of the draws.
        **kwargs: base layer arguments (name, dtype, ...).

    Call arguments:
        inputs: float [batch, time, bands].
        training: mask only when True.

    Returns:
        The inputs, masked when training.

    Example:
    ```python
    masked = SpecAugment(masks=2, max_frames=20, max_bands=8)(log_mel, training=True)
    ```
    """

    def __init__(self, masks: int = 2, max_frames: int = 20, max_bands: int = 8, seed: int | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if masks < 0 or max_frames < 0 or max_bands < 0:
            raise ValueError(f"SpecAugment: masks, max_frames and max_bands must be >= 0, got {masks}, "
                             f"{max_frames}, {max_bands}")
        self.masks = masks
        self.max_frames = max_frames
        self.max_bands = max_bands
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def _keep(self, batch: Any, size: Any, max_width: int) -> Any:
        """float [batch, size]: 0 inside any of the ``masks`` random spans, 1 elsewhere."""
        positions = keras.ops.arange(size, dtype="float32")[None, :]
        keep = keras.ops.ones((batch, size))
        for _ in range(self.masks):
            width = keras.ops.floor(keras.random.uniform((batch, 1), 0, max_width + 1, seed=self.seed_generator))
            width = keras.ops.minimum(width, keras.ops.cast(size, "float32"))
            start = keras.ops.floor(keras.random.uniform((batch, 1), seed=self.seed_generator)
                                    * (keras.ops.cast(size, "float32") - width + 1))
            inside = keras.ops.logical_and(positions >= start, positions < start + width)
            keep = keep * keras.ops.cast(keras.ops.logical_not(inside), "float32")
        return keep

    def call(self, inputs: Any, training: bool = False) -> Any:
        if not training or self.masks == 0:
            return inputs
        batch, frames, bands = keras.ops.shape(inputs)[0], keras.ops.shape(inputs)[1], keras.ops.shape(inputs)[2]
        keep_frames = self._keep(batch, frames, self.max_frames)[:, :, None]
        keep_bands = self._keep(batch, bands, self.max_bands)[:, None, :]
        return inputs * keras.ops.cast(keep_frames * keep_bands, inputs.dtype)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        return tuple(input_shape)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "masks": self.masks, "max_frames": self.max_frames,
                "max_bands": self.max_bands, "seed": self.seed}


@keras.saving.register_keras_serializable(package="seqapps")
class LogMelSpectrogram(keras.layers.Layer):
    """Log-mel spectrogram of a batch of waveforms, computed in the graph.

    The power spectrogram (``tf.signal.stft`` with a periodic Hann window of
    ``win_length`` samples, centred in ``n_fft`` as librosa does) is multiplied by a mel
    filterbank and floored before the natural log: ``log(max(mel_power, log_floor))``.
    The filterbank (librosa's Slaney mel scale, Slaney area normalisation:
    ``librosa.filters.mel``) is built once in ``build`` and kept as a non-trainable
    weight, so it is saved with the model and a SavedModel needs no librosa. With
    ``center`` (librosa's default) frame ``t`` is centred on sample ``t * hop_length``,
    the signal being padded with ``n_fft // 2`` zeros (librosa's ``pad_mode="constant"``).
    The valid frames then equal ``librosa.feature.melspectrogram(power=2)`` of each
    waveform alone; frames from ``frame_lengths(lengths)`` on are padding to mask.

    Args:
        sample_rate: the waveform's rate in Hz.
        n_fft: FFT size in samples.
        hop_length: samples between frames.
        win_length: window length (<= n_fft; default n_fft).
        n_mels: number of mel bands.
        fmin, fmax: the filterbank's frequency range in Hz (fmax default sample_rate / 2).
        log_floor: the smallest mel power before the log (silence maps to log(log_floor)).
        center: centre frames on their sample (True) or start them there (False).
        **kwargs: base layer arguments (name, dtype, ...).

    Call arguments:
        inputs: float [batch, samples] waveforms (zero-padded).
        lengths: optional int [batch] valid samples; samples from there on are set to 0,
            so the padding does not leak into the last valid frames.

    Returns:
        float [batch, frames, n_mels], frames = ``frame_lengths(samples)``.

    Example:
    ```python
    front_end = LogMelSpectrogram(sample_rate=16000, n_fft=400, hop_length=160, n_mels=80)
    waveform, lengths = seqapps.data.audio.decode_wav(wav_bytes, 16000)
    features = front_end(waveform, lengths=lengths)        # [batch, frames, 80]
    mask = tf.sequence_mask(front_end.frame_lengths(lengths), tf.shape(features)[1])
    ```
    """

    def __init__(self, sample_rate: int = 16000, n_fft: int = 512, hop_length: int = 160,
                 win_length: int | None = None, n_mels: int = 80, fmin: float = 0.0, fmax: float | None = None,
                 log_floor: float = 1e-6, center: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        win = n_fft if win_length is None else win_length
        if not 0 < win <= n_fft or hop_length <= 0 or n_mels <= 0 or log_floor <= 0:
            raise ValueError(f"LogMelSpectrogram: need 0 < win_length ({win}) <= n_fft ({n_fft}), hop_length > 0, "
                             f"n_mels > 0 and log_floor > 0")
        if not 0 <= fmin < (fmax if fmax is not None else sample_rate / 2) <= sample_rate / 2:
            raise ValueError(f"LogMelSpectrogram: need 0 <= fmin < fmax <= sample_rate / 2, got {fmin}, {fmax}")
        self.sample_rate = sample_rate
        self.n_fft = n_fft
        self.hop_length = hop_length
        self.win_length = win_length
        self.n_mels = n_mels
        self.fmin = fmin
        self.fmax = fmax
        self.log_floor = log_floor
        self.center = center

    @property
    def _window(self) -> int:
        return self.n_fft if self.win_length is None else self.win_length

    def build(self, input_shape: Any) -> None:
        import librosa

        filterbank = librosa.filters.mel(sr=self.sample_rate, n_fft=self.n_fft, n_mels=self.n_mels,
                                         fmin=self.fmin, fmax=self.fmax)
        self.mel_filterbank = self.add_weight(
            name="mel_filterbank", shape=(self.n_fft // 2 + 1, self.n_mels),
            initializer=keras.initializers.Constant(filterbank.T.astype("float32")), trainable=False,
            dtype="float32")
        super().build(input_shape)

    def frame_lengths(self, lengths: Any) -> tf.Tensor:
        """Valid frames for waveforms of ``lengths`` samples (int32, like librosa's frame count)."""
        lengths = tf.cast(lengths, tf.int32)
        if self.center:
            return 1 + lengths // self.hop_length
        return tf.maximum(0, 1 + (lengths - self.n_fft) // self.hop_length)

    def call(self, inputs: Any, lengths: Any = None) -> tf.Tensor:
        waveform = tf.cast(inputs, tf.float32)
        samples = tf.shape(waveform)[1]
        if lengths is not None:
            waveform = tf.where(tf.range(samples)[None, :] < tf.cast(lengths, tf.int32)[:, None], waveform, 0.0)
        # librosa's frame of n_fft samples holds the window centred; tf.signal.stft's frames are the window itself,
        # so the signal is shifted by (n_fft - win) // 2 to align them (the FFT magnitude ignores the zero padding).
        shift = (self.n_fft // 2 if self.center else 0) - (self.n_fft - self._window) // 2
        if shift >= 0:
            waveform = tf.pad(waveform, [[0, 0], [shift, self.n_fft]])
        else:
            waveform = tf.pad(waveform[:, -shift:], [[0, 0], [0, self.n_fft]])
        stft = tf.signal.stft(waveform, frame_length=self._window, frame_step=self.hop_length,
                              fft_length=self.n_fft, window_fn=tf.signal.hann_window, pad_end=False)
        frames = self.frame_lengths(samples)
        power = tf.square(tf.abs(stft[:, :frames]))
        mel = tf.matmul(power, tf.cast(self.mel_filterbank, tf.float32))
        return tf.cast(tf.math.log(tf.maximum(mel, self.log_floor)), self.compute_dtype)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        samples = input_shape[1]
        if samples is None:
            frames = None
        elif self.center:
            frames = 1 + samples // self.hop_length
        else:
            frames = max(0, 1 + (samples - self.n_fft) // self.hop_length)
        return (input_shape[0], frames, self.n_mels)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update({"sample_rate": self.sample_rate, "n_fft": self.n_fft, "hop_length": self.hop_length,
                       "win_length": self.win_length, "n_mels": self.n_mels, "fmin": self.fmin, "fmax": self.fmax,
                       "log_floor": self.log_floor, "center": self.center})
        return config
