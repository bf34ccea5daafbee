"""The n-gram context layer of the feed-forward language model (Bengio et al. 2003)."""
from __future__ import annotations

from typing import Any

import keras


@keras.saving.register_keras_serializable(package="seqapps")
class NGramContext(keras.layers.Layer):
    """Concatenates the embeddings of each window of ``order - 1`` consecutive words.

    Output ``t`` holds inputs ``t .. t + order - 2``: from ``L`` inputs it
    gives ``L - order + 2`` outputs, the last one the context of the word after
    the input.

    Args:
        order: n of the n-gram model (>= 2).
        **kwargs: other ``keras.layers.Layer`` arguments.

    Call arguments:
        inputs: ``[B, L, E]`` embeddings with ``L >= order - 1``.

    Returns:
        ``[B, L - order + 2, (order - 1) * E]``.
    """

    def __init__(self, order: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.order = int(order)

    def call(self, inputs: Any) -> Any:
        context = self.order - 1
        steps = keras.ops.shape(inputs)[1] - context + 1
        return keras.ops.concatenate([inputs[:, i: i + steps] for i in range(context)], axis=-1)

    def compute_output_shape(self, input_shape: tuple) -> tuple:
        length = None if input_shape[1] is None else input_shape[1] - self.order + 2
        return (input_shape[0], length, (self.order - 1) * input_shape[2])

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "order": self.order}
