"""A discrete translation lexicon as a bias of a decoder's word scores (Arthur, Neubig & Nakamura 2016).

``LexiconBias`` holds a lexicon ``p_lex(target word | source word)`` (for example IBM Model 1's), each
source word keeping its ``top_k`` likeliest target words, as two non-trainable weights. At every decoder
step the lexical distribution over target words is the attention-weighted mixture of the source words'
rows, ``p_lex(. | t) = sum_j attention[t, j] * p_lex(. | x_j)``, and the layer returns
``log(p_lex(. | t) + epsilon)``, which the output layer adds to its logits (the paper's "bias" method).
The table is sparse (``[source vocabulary, top_k]`` ids and probabilities) and the mixture is one
``unsorted_segment_sum``, a core TensorFlow op, so exports stay plain TensorFlow.

With ``mixture=True`` the layer returns the mixture's terms instead of the dense ``[B, T, V]`` bias
(``lexical_mixture``): one entry ``(id, weight) = (e_jk, attention[t, j] p_jk)`` per attended source
word's table entry. A sampled output layer (``BatchNCE``'s B-NCE) then asks for the bias at its columns
only (``lexical_log_bias_at_columns``) and for its normaliser under the noise distribution
(``lexical_log_noise_mass``), which cost the entries, not ``V``; every other use densifies it
(``lexical_log_bias``), with the same numbers as the dense call.
"""
from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

#: the keys of a lexical mixture (``lexical_mixture``)
MIXTURE_KEYS = ("ids", "weights", "epsilon")


def lexical_mixture(attention: tf.Tensor, source_ids: tf.Tensor, table_ids: tf.Tensor, table_probs: tf.Tensor,
                    epsilon: float) -> dict[str, tf.Tensor]:
    """The terms of the attention-weighted mixture of the source words' lexicon rows.

    ``p_lex(v | t) = sum_e weights[t, e] [ids[e] == v]``, and the bias is ``log(p_lex + epsilon)``.

    Args:
        attention: ``[B, T, S]`` attention weights of ``T`` target steps over ``S`` source positions.
        source_ids: int ``[B, S]`` source word ids.
        table_ids: int ``[source vocabulary, k]`` target ids of each source word's entries.
        table_probs: ``[source vocabulary, k]`` their probabilities (0 for unused entries).
        epsilon: added to the lexical probability before the log.

    Returns:
        Dict with ``"ids"`` (int ``[B, 1, S k]``, the entries' target ids, shared by a sentence's steps),
        ``"weights"`` (``[B, T, S k]``, ``attention[t, j] p_jk``) and ``"epsilon"`` (a scalar).
    """
    attention = tf.convert_to_tensor(attention)
    shape = tf.shape(attention)
    entry_ids = tf.gather(table_ids, source_ids)  # [B, S, k]
    entry_probs = tf.cast(tf.gather(table_probs, source_ids), attention.dtype)
    weights = attention[..., tf.newaxis] * entry_probs[:, tf.newaxis]  # [B, T, S, k]
    entries = shape[2] * tf.shape(entry_ids)[2]
    return {"ids": tf.reshape(entry_ids, [shape[0], 1, entries]),
            "weights": tf.reshape(weights, [shape[0], shape[1], entries]),
            "epsilon": tf.constant(epsilon, attention.dtype)}


def lexical_distribution(mixture: dict[str, tf.Tensor], vocab_size: int) -> tf.Tensor:
    """The mixture summed into every target word.

    Args:
        mixture: ``lexical_mixture``'s terms.
        vocab_size: the number of target words ``V``.

    Returns:
        ``[B, T, V]`` lexical probabilities (each row sums to its attention mass times the rows' mass).
    """
    weights = mixture["weights"]
    shape = tf.shape(weights)
    rows = tf.reshape(tf.range(shape[0] * shape[1]), [shape[0], shape[1], 1])
    segments = rows * vocab_size + tf.cast(mixture["ids"], rows.dtype)
    mixed = tf.math.unsorted_segment_sum(tf.reshape(weights, [-1]), tf.reshape(segments, [-1]),
                                         shape[0] * shape[1] * vocab_size)
    return tf.reshape(mixed, [shape[0], shape[1], vocab_size])


def lexical_log_bias(mixture: dict[str, tf.Tensor], vocab_size: int) -> tf.Tensor:
    """The dense bias ``log(p_lex + epsilon)`` of every target word, ``[B, T, V]``.

    Args:
        mixture: ``lexical_mixture``'s terms.
        vocab_size: the number of target words ``V``.
    """
    return tf.math.log(lexical_distribution(mixture, vocab_size) + mixture["epsilon"])


def lexical_log_bias_at_columns(mixture: dict[str, tf.Tensor], columns: tf.Tensor) -> tf.Tensor:
    """The bias ``log(p_lex(c | t) + epsilon)`` of the words ``columns`` only, never summed over ``V``.

    Each entry is summed into the slot of its word among the columns' distinct words (none when the word
    is not a column), so a duplicated column gets its word's value.

    Args:
        mixture: ``lexical_mixture``'s terms, ``T`` steps per sentence.
        columns: int word ids, ``[M]`` (the columns of every row) or ``[T, M]`` (one set per step).

    Returns:
        ``[B, T, M]``: row ``(b, t)``'s bias of each of its columns.
    """
    weights = mixture["weights"]
    shape = tf.shape(weights)
    columns = tf.cast(columns, tf.int32)
    words = tf.sort(tf.unique(tf.reshape(columns, [-1])).y)[tf.newaxis]  # [1, U], sorted
    num_words = tf.shape(words)[1]
    entry_ids = tf.cast(tf.reshape(mixture["ids"], [1, -1]), tf.int32)
    slots = tf.minimum(tf.searchsorted(words, entry_ids), num_words - 1)
    is_column = tf.equal(tf.gather(words[0], slots[0]), entry_ids[0])
    slots = tf.reshape(tf.where(is_column, slots[0], -1), tf.shape(mixture["ids"]))  # [B, 1, E], -1: no column
    rows = tf.reshape(tf.range(shape[0] * shape[1]), [shape[0], shape[1], 1])
    segments = tf.where(slots >= 0, rows * num_words + slots, -1)  # negative segments are dropped
    mixed = tf.math.unsorted_segment_sum(tf.reshape(weights, [-1]), tf.reshape(segments, [-1]),
                                         shape[0] * shape[1] * num_words)
    log_bias = tf.math.log(tf.reshape(mixed, [shape[0], shape[1], num_words]) + mixture["epsilon"])
    positions = tf.searchsorted(words, tf.reshape(columns, [1, -1]))[0]  # each column's slot
    if columns.shape.rank == 1:
        return tf.gather(log_bias, positions, axis=2)
    per_step = tf.gather(tf.transpose(log_bias, [1, 0, 2]), tf.reshape(positions, tf.shape(columns)), axis=2,
                         batch_dims=1)  # [T, B, M]
    return tf.transpose(per_step, [1, 0, 2])


def lexical_log_noise_mass(mixture: dict[str, tf.Tensor], noise_probs: tf.Tensor) -> tf.Tensor:
    """``log sum_v p_n(v) exp(bias_v)`` of every row, exactly and without ``V``.

    With ``bias_v = log(p_lex(v | t) + epsilon)`` and ``sum_v p_n(v) = 1`` it is
    ``log(epsilon + sum_e weights[t, e] p_n(ids[e]))``.

    Args:
        mixture: ``lexical_mixture``'s terms.
        noise_probs: ``[V]`` noise distribution ``p_n`` (sums to 1).

    Returns:
        ``[B, T]``, what ``BatchNCE``'s ``noise_centred_bias`` subtracts from each row.
    """
    weights = mixture["weights"]
    entry_noise = tf.gather(tf.cast(noise_probs, weights.dtype), mixture["ids"])  # [B, 1, E]
    return tf.math.log(mixture["epsilon"] + tf.reduce_sum(weights * entry_noise, axis=-1))


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
        mixture: bool, return the mixture's terms (``lexical_mixture``) instead of the dense bias, for an
            output layer that evaluates them (``BatchNCE``'s ``logit_bias``).

    Returns:
        ``[B, T, V]``, the bias to add to the output layer's logits (or the mixture's terms).

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

    def call(self, inputs: dict[str, Any], mixture: bool = False) -> tf.Tensor | dict[str, tf.Tensor]:
        terms = lexical_mixture(inputs["attention"], tf.cast(inputs["source_ids"], "int32"), self.table_ids,
                                self.table_probs, self.epsilon)
        return terms if mixture else lexical_log_bias(terms, self.target_vocab_size)

    def compute_output_shape(self, input_shape: dict[str, Any]) -> tuple:
        return tuple(input_shape["attention"])[:2] + (self.target_vocab_size,)

    def compute_output_spec(self, inputs: dict[str, Any], mixture: bool = False) -> Any:
        batch, steps, source = inputs["attention"].shape
        if not mixture:
            return keras.KerasTensor((batch, steps, self.target_vocab_size), dtype=self.compute_dtype)
        entries = None if source is None else source * self.top_k
        return {"ids": keras.KerasTensor((batch, 1, entries), dtype="int32"),
                "weights": keras.KerasTensor((batch, steps, entries), dtype=self.compute_dtype),
                "epsilon": keras.KerasTensor((), dtype=self.compute_dtype)}

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "source_vocab_size": self.source_vocab_size,
                "target_vocab_size": self.target_vocab_size, "top_k": self.top_k, "epsilon": self.epsilon}
