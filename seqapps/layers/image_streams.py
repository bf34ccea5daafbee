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
import numpy as np
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


@keras.saving.register_keras_serializable(package="seqapps")
class LocalContrastNorm(keras.layers.Layer):
    """Local contrast normalisation of one-channel images (Pinto et al. 2008; Jarrett et al. 2009).

    Each pixel has its neighbourhood's Gaussian-weighted mean subtracted and is divided by the neighbourhood's
    standard deviation, floored at that deviation's mean over the image: ``v = x - G * x``,
    ``y = v / max(c, sqrt(G * v^2))`` with ``c`` the image's mean of ``sqrt(G * v^2)`` (or ``min_deviation``
    where that is larger). The view keeps edges
    and drops the background's level and slow gradients, so a shape reads alike on plain grey, on a textured
    or photographic background and (near its boundary) filled or outlined. Edges are mirrored
    (``scipy.ndimage`` ``mode="mirror"``).

    Args:
        sigma: the Gaussian's standard deviation in pixels; the kernel reaches ``round(3 * sigma)`` pixels.
        min_deviation: the floor is at least this (in the input's units), so faint texture stays faint
            (Pinto et al. normalise only where the local norm exceeds a threshold).
        epsilon: added to the floor, so a flat image gives zeros.
        **kwargs: base layer arguments.

    Call arguments:
        images: float [batch, height, width, 1], height and width above the kernel's reach.

    Returns:
        The normalised images, the same shape.

    Example:
    ```python
    view = LocalContrastNorm(sigma=4.0)(RandomChannelMix(seed=1)(images))
    ```
    """

    def __init__(self, sigma: float = 4.0, min_deviation: float = 0.0, epsilon: float = 1e-3, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if sigma <= 0:
            raise ValueError(f"`sigma` must be > 0; got sigma={sigma}")
        self.sigma = float(sigma)
        self.min_deviation = float(min_deviation)
        self.epsilon = float(epsilon)
        self.reach = int(3 * self.sigma + 0.5)
        kernel = np.exp(-0.5 * (np.arange(-self.reach, self.reach + 1) / self.sigma) ** 2)
        self._kernel = kernel / kernel.sum()  # float64, cast to the input's dtype when used

    def _smooth(self, images: tf.Tensor) -> tf.Tensor:
        """The separable Gaussian of ``images`` [batch, height, width, 1] with mirrored edges."""
        reach = self.reach
        padded = tf.pad(images, [[0, 0], [reach, reach], [reach, reach], [0, 0]], mode="REFLECT")
        kernel = tf.cast(self._kernel, images.dtype)
        rows = tf.nn.conv2d(padded, tf.reshape(kernel, (-1, 1, 1, 1)), strides=1, padding="VALID")
        return tf.nn.conv2d(rows, tf.reshape(kernel, (1, -1, 1, 1)), strides=1, padding="VALID")

    def call(self, images: tf.Tensor) -> tf.Tensor:
        images = tf.cast(images, self.compute_dtype)
        centred = images - self._smooth(images)
        deviation = tf.sqrt(tf.maximum(self._smooth(tf.square(centred)), 0.0))
        floor = tf.maximum(tf.reduce_mean(deviation, axis=[1, 2, 3], keepdims=True), self.min_deviation) + self.epsilon
        return centred / tf.maximum(deviation, floor)

    def compute_output_shape(self, input_shape: tuple) -> tuple:
        return tuple(input_shape)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "sigma": self.sigma, "min_deviation": self.min_deviation,
                "epsilon": self.epsilon}
