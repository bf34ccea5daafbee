"""A discrete translation lexicon as a bias of a decoder's word scores (Arthur, Neubig & Nakamura 2016).

``LexiconBias`` holds a lexicon ``p_lex(target word | source word)`` (for example IBM Model 1's), each
source word keeping its ``top_k`` likeliest target words, as two non-trainable weights. At every decoder
step the lexical distribution over target words is the attention-weighted mixture of the source words'
rows, ``p_lex(. | t) = sum_j attention[t, j] * p_lex(. | x_j)``, and the layer returns
``log(p_lex(. | t) + epsilon)``, which the output layer adds to its logits (the paper's "bias" method).
The table is sparse (``[source vocabulary, top_k]`` ids and probabilities) and the mixture is one
``unsorted_segment_sum``, a core TensorFlow op, so exports stay plain TensorFlow.
"""
from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf


def lexical_distribution(attention: tf.Tensor, source_ids: tf.Tensor, table_ids: tf.Tensor, table_probs: tf.Tensor,
                         vocab_size: int) -> tf.Tensor:
    """The attention-weighted mixture of the source words' lexicon rows.

    Args:
        attention: ``[B, T, S]`` attention weights of ``T`` target steps over ``S`` source positions.
        source_ids: int ``[B, S]`` source word ids.
        table_ids: int ``[source vocabulary, k]`` target ids of each source word's entries.
        table_probs: ``[source vocabulary, k]`` their probabilities (0 for unused entries).
        vocab_size: the number of target words ``V``.

    Returns:
        ``[B, T, V]`` lexical probabilities (each row sums to its attention mass times the rows' mass).
    """
    attention = tf.convert_to_tensor(attention)
    shape = tf.shape(attention)
    entry_ids = tf.gather(table_ids, source_ids)  # [B, S, k]
    entry_probs = tf.cast(tf.gather(table_probs, source_ids), attention.dtype)
    weights = attention[..., tf.newaxis] * entry_probs[:, tf.newaxis]  # [B, T, S, k]
    rows = tf.reshape(tf.range(shape[0] * shape[1]), [shape[0], shape[1], 1, 1])
    segments = rows * vocab_size + entry_ids[:, tf.newaxis]
    mixed = tf.math.unsorted_segment_sum(tf.reshape(weights, [-1]), tf.reshape(segments, [-1]),
                                         shape[0] * shape[1] * vocab_size)
    return tf.reshape(mixed, [shape[0], shape[1], vocab_size])


@keras.saving.register_keras_serializable(package="seqapps")
class LexiconBias(keras.layers.Layer):
    """``log(p_lex + epsilon)`` of a sparse translation lexicon under the decoder's attention.

    Args:
        source_vocab_size: int, source words (rows of the table).
        target_vocab_size: int, target words ``V``.
        top_k: int, target entries kept per source word.
        epsilon: float, added to the lexical probability before the log (the paper's 0.001), so
            words the lexicon does not propose get a finite bias ``log(epsilon)``.
        **kwargs: other ``keras.layers.Layer`` arguments.

    Call arguments:
        inputs: a dict with ``"attention"`` (``[B, T, S]``) and ``"source_ids"`` (int ``[B, S]``).

    Returns:
        ``[B, T, V]``, the bias to add to the output layer's logits.

    Example:
    ```python
    lexicon = LexiconBias(source_vocab_size=6000, target_vocab_size=9000, top_k=10)
    lexicon.build(None)
    lexicon.set_table(ids, probs)  # [6000, 10] each, e.g. from IBM Model 1
    bias = lexicon({"attention": weights, "source_ids": source})
    ```

    Reference:
        - [Arthur, Neubig & Nakamura, 2016](https://aclanthology.org/D16-1162/)
    """

    def __init__(self, source_vocab_size: int, target_vocab_size: int, top_k: int = 10, epsilon: float = 1e-3,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if min(int(source_vocab_size), int(target_vocab_size), int(top_k)) < 1:
            raise ValueError("`source_vocab_size`, `target_vocab_size` and `top_k` must be >= 1; got "
                             f"{source_vocab_size!r}, {target_vocab_size!r}, {top_k!r}")
        if not float(epsilon) > 0:
            raise ValueError(f"`epsilon` must be > 0; got epsilon={epsilon!r}")
        self.source_vocab_size = int(source_vocab_size)
        self.target_vocab_size = int(target_vocab_size)
        self.top_k = int(top_k)
        self.epsilon = float(epsilon)

    def build(self, input_shape: Any) -> None:
        shape = (self.source_vocab_size, self.top_k)
        self.table_ids = self.add_weight(name="table_ids", shape=shape, dtype="int32", initializer="zeros",
                                         trainable=False)
        self.table_probs = self.add_weight(name="table_probs", shape=shape, initializer="zeros", trainable=False)

    def set_table(self, ids: np.ndarray, probs: np.ndarray) -> None:
        """Sets the lexicon (the layer must be built).

        Args:
            ids: int ``[source_vocab_size, top_k]`` target ids, in ``[0, target_vocab_size)``.
            probs: ``[source_vocab_size, top_k]`` probabilities in ``[0, 1]``, each row summing to at most 1.
        """
        ids, probs = np.asarray(ids), np.asarray(probs, "float64")
        shape = (self.source_vocab_size, self.top_k)
        if ids.shape != shape or probs.shape != shape:
            raise ValueError(f"`ids` and `probs` must have shape {shape}; got {ids.shape} and {probs.shape}")
        if ids.min() < 0 or ids.max() >= self.target_vocab_size:
            raise ValueError(f"`ids` must lie in [0, {self.target_vocab_size})")
        if probs.min() < 0 or probs.sum(axis=1).max() > 1 + 1e-4:  # float32 rounding of fitted probabilities
            raise ValueError("`probs` must be >= 0 with rows summing to at most 1")
        self.table_ids.assign(ids.astype("int32"))
        self.table_probs.assign(probs.astype("float32"))

    def call(self, inputs: dict[str, Any]) -> tf.Tensor:
        mixed = lexical_distribution(inputs["attention"], tf.cast(inputs["source_ids"], "int32"),
                                     self.table_ids, self.table_probs, self.target_vocab_size)
        return tf.math.log(mixed + self.epsilon)

    def compute_output_shape(self, input_shape: dict[str, Any]) -> tuple:
        return tuple(input_shape["attention"])[:2] + (self.target_vocab_size,)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "source_vocab_size": self.source_vocab_size,
                "target_vocab_size": self.target_vocab_size, "top_k": self.top_k, "epsilon": self.epsilon}
