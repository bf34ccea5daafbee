"""Colour and shape read apart: a colour-blind view of an image for a shape stream.

A convnet over RGB pixels learns features that tie a shape to the colours it was seen in. When some
(colour, shape) pairs never occur in training, those features describe a novel pair as the nearest
seen one. ``RandomChannelMix`` gives a shape stream a single grey channel whose mix of the colour
channels is drawn at random per image during training, so the stream's grey level says little about
an object's colour and its features learn shape alone. A colour stream of 1 x 1 convolutions (which
see one pixel each, so no shape) supplies the colour. Anchors: colour augmentation for shape bias
(Geirhos et al. 2019) and the two-stream "what" factorisation of compositional-generalisation work.
"""
from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="seqapps")
class RandomChannelMix(keras.layers.Layer):
    """One grey channel: a random convex mix of the input's channels per image in training, their mean otherwise.

    In training each image's weights are drawn from a flat Dirichlet distribution (normalised
    exponential draws), so every convex mix is equally likely; at inference the weights are the mean
    of that distribution, equal weights.

    Args:
        seed: seed of the draws.
        **kwargs: base layer arguments.

    Call arguments:
        images: float [batch, height, width, channels].
        training: draw the weights only when True.

    Returns:
        [batch, height, width, 1] in the layer's compute dtype.

    Example:
    ```python
    grey = RandomChannelMix(seed=1)(images, training=True)
    ```
    """

    def __init__(self, seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def call(self, images: tf.Tensor, training: bool | None = None) -> tf.Tensor:
        images = tf.cast(images, self.compute_dtype)
        channels = images.shape[-1]
        if not training:
            return tf.reduce_mean(images, axis=-1, keepdims=True)
        uniform = keras.random.uniform((tf.shape(images)[0], channels), 1e-6, 1.0, seed=self.seed_generator)
        draws = -tf.math.log(uniform)
        weights = tf.cast(draws / tf.reduce_sum(draws, axis=-1, keepdims=True), self.compute_dtype)
        return tf.einsum("bhwc,bc->bhw", images, weights)[..., None]

    def compute_output_shape(self, input_shape: tuple) -> tuple:
        return (*input_shape[:-1], 1)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "seed": self.seed}
