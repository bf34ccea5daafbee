"""Layers over spectrogram-like sequences [batch, time, features]: training-time masking and summaries over time."""
from __future__ import annotations

from typing import Any

import keras


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
