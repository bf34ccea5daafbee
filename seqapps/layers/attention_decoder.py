"""An RNN decoder that attends over a memory, for translation and captioning.

``AttentionDecoder`` is the decoder of an encoder-decoder model (Bahdanau et al. 2015; Luong et al.
2015; Xu et al. 2015 for images): it embeds the previous target words, runs an LSTM or GRU from an
initial state given by the encoder, attends over the encoder's memory (source word states or a
feature-map grid) and combines the RNN output with its context vector into the attentional hidden
state ``tanh(W [h; c])`` that an output layer (``BatchNCE``) turns into word scores. The same
weights run over whole target sequences (teacher forcing) and one step at a time (``step``, for
``seqapps.layers.decoding``; ``seqapps.generation.Generator`` decodes with it).
"""
from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

CELLS = {"lstm": keras.layers.LSTM, "gru": keras.layers.GRU}
ATTENTIONS = ("bahdanau", "luong", "none")


class AdditiveAttention(keras.layers.AdditiveAttention):
    """Keras' ``AdditiveAttention`` (the same weights, scores and outputs), its scale contracted by a matrix product.

    Keras scores ``sum(scale * tanh(q + k), axis=-1)``: an elementwise product and a sum over the
    ``[batch, Tq, Tv, dim]`` tensor, whose gradient tiles and multiplies that tensor twice more. A
    matrix-vector product ``tanh(q + k) @ scale`` computes the same sum and its gradient as matrix
    products: the attention's forward and backward pass take half the time on CPU (docs/results.md,
    "Additive attention as a matrix product").
    """

    def _calculate_scores(self, query: tf.Tensor, key: tf.Tensor) -> tf.Tensor:
        hidden = keras.ops.tanh(keras.ops.expand_dims(query, -2) + keras.ops.expand_dims(key, -3))
        if self.scale is None:
            return keras.ops.sum(hidden, axis=-1)
        return keras.ops.squeeze(keras.ops.matmul(hidden, keras.ops.expand_dims(self.scale, -1)), -1)


@keras.saving.register_keras_serializable(package="seqapps")
class PaddingMask(keras.layers.Layer):
    """True where ids are not the padding id: the memory mask of an encoder over padded word ids.

    Args:
        pad_id: int, the id that pads sequences.
        **kwargs: other ``keras.layers.Layer`` arguments.

    Call arguments:
        inputs: int ids of any shape.

    Returns:
        A bool tensor of the same shape.

    Example:
    ```python
    mask = PaddingMask(pad_id=1)(ids)  # [[5, 7, 1, 1]] -> [[True, True, False, False]]
    ```
    """

    def __init__(self, pad_id: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pad_id = int(pad_id)

    def call(self, inputs: Any) -> Any:
        return keras.ops.not_equal(inputs, self.pad_id)

    def compute_output_shape(self, input_shape: tuple) -> tuple:
        return tuple(input_shape)

    def compute_output_spec(self, inputs: Any) -> keras.KerasTensor:
        return keras.KerasTensor(inputs.shape, dtype="bool")

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "pad_id": self.pad_id}


@keras.saving.register_keras_serializable(package="seqapps")
class AttentionDecoder(keras.layers.Layer):
    """Embedding, LSTM/GRU and attention over a memory, combined into the attentional hidden state.

    Args:
        vocab_size: int, the number of target words.
        embedding_dim: int, the target word embedding size.
        units: int, RNN units; the memory's last axis must have this size too.
        cell: str, ``"lstm"`` or ``"gru"``.
        attention: str, ``"bahdanau"`` (additive, ``AdditiveAttention``), ``"luong"``
            (scaled dot product, ``keras.layers.Attention``) or ``"none"`` (no attention: the
            hidden state is ``tanh(W h)``, as in Show and Tell).
        dropout: float, dropout on the embeddings and on the hidden state while training.
        input_ids: list of ints or None, the id whose embedding each previous word is read as (None: its
            own). Words mapped to one id share one input embedding, so the RNN sees their role, not
            which of them was said (a compositional decoder: what the word is comes from the attention).
        **kwargs: other ``keras.layers.Layer`` arguments.

    Call arguments:
        inputs: a dict with ``"ids"`` (int ``[B, T]``, the previous words), ``"memory"`` (``[B, S, units]``),
            optionally ``"memory_mask"`` (bool ``[B, S]``, True for real positions; default all) and
            ``"state"`` (the RNN's initial state: a list of one ``[B, units]`` tensor for a GRU, two for
            an LSTM).
        training: bool, whether dropout is on.
        return_attention: bool, also return the attention weights ``[B, T, S]``.
        mask: ignored (the memory's Keras mask is given as ``memory_mask``).

    Returns:
        The hidden states ``[B, T, units]`` (and the attention weights).

    Example:
    ```python
    decoder = AttentionDecoder(vocab_size=100, embedding_dim=16, units=32)
    hidden = decoder({"ids": ids, "memory": memory, "memory_mask": mask, "state": [h, c]})
    step_hidden, state = decoder.step(ids[:, 0], {"rnn": [h, c], "memory": memory, "memory_mask": mask})
    ```
    """

    def __init__(self, vocab_size: int, embedding_dim: int, units: int, cell: str = "lstm",
                 attention: str = "bahdanau", dropout: float = 0.0, input_ids: list[int] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if cell not in CELLS:
            raise ValueError(f"`cell` must be one of {tuple(CELLS)}; got cell={cell!r}")
        if attention not in ATTENTIONS:
            raise ValueError(f"`attention` must be one of {ATTENTIONS}; got attention={attention!r}")
        self.vocab_size = int(vocab_size)
        self.embedding_dim = int(embedding_dim)
        self.units = int(units)
        self.cell_type = cell
        self.attention_type = attention
        self.dropout = float(dropout)
        if input_ids is not None and (len(input_ids) != self.vocab_size
                                      or not all(0 <= i < self.vocab_size for i in input_ids)):
            raise ValueError(f"`input_ids` must hold one id in [0, {self.vocab_size}) per word; got {len(input_ids)} "
                             f"ids from {min(input_ids, default=None)} to {max(input_ids, default=None)}")
        self.input_ids = None if input_ids is None else [int(i) for i in input_ids]
        self.embedding = keras.layers.Embedding(self.vocab_size, self.embedding_dim, name="embedding")
        self.rnn = CELLS[cell](self.units, return_sequences=True, name="rnn")
        self.attention = {"bahdanau": lambda: AdditiveAttention(name="attention"),
                          "luong": lambda: keras.layers.Attention(use_scale=True, name="attention"),
                          "none": lambda: None}[attention]()
        self.combine = keras.layers.Dense(self.units, activation="tanh", name="combine")
        self.embedding_dropout = keras.layers.Dropout(self.dropout)
        self.hidden_dropout = keras.layers.Dropout(self.dropout)

    @property
    def state_size(self) -> int:
        """How many ``[B, units]`` tensors the RNN state has: 2 for an LSTM, 1 for a GRU."""
        return 2 if self.cell_type == "lstm" else 1

    def build(self, input_shape: dict[str, Any]) -> None:
        ids_shape = tuple(input_shape["ids"])
        self.embedding.build(ids_shape)
        self.rnn.build(ids_shape + (self.embedding_dim,))
        query_shape = ids_shape + (self.units,)
        if self.attention is not None:
            self.attention.build([query_shape, tuple(input_shape["memory"])])
            self.combine.build(ids_shape + (2 * self.units,))
        else:
            self.combine.build(query_shape)

    def _embed(self, ids: tf.Tensor) -> tf.Tensor:
        """The input embedding of the previous words, read through ``input_ids``."""
        if self.input_ids is not None:
            ids = keras.ops.take(keras.ops.convert_to_tensor(self.input_ids, dtype="int32"),
                                 keras.ops.cast(ids, "int32"))
        return self.embedding(ids)

    def _hidden(self, output: tf.Tensor, memory: tf.Tensor, memory_mask: tf.Tensor | None,
                training: bool | None) -> tuple[tf.Tensor, tf.Tensor | None]:
        if self.attention is None:
            return self.hidden_dropout(self.combine(output), training=training), None
        context, weights = self.attention([output, memory], mask=None if memory_mask is None else [None, memory_mask],
                                          return_attention_scores=True, training=training)
        hidden = self.combine(keras.ops.concatenate([output, context], axis=-1))
        return self.hidden_dropout(hidden, training=training), weights

    def call(self, inputs: dict[str, Any], training: bool | None = None, return_attention: bool = False,
             mask: Any = None) -> Any:
        del mask  # Keras masks of the inputs are not used: ``memory_mask`` says which positions are real
        embedded = self.embedding_dropout(self._embed(inputs["ids"]), training=training)
        output = self.rnn(embedded, initial_state=list(inputs["state"]), training=training)
        hidden, weights = self._hidden(output, inputs["memory"], inputs.get("memory_mask"), training)
        if return_attention:
            if weights is None:  # no attention: zero weights of the memory's shape
                weights = keras.ops.zeros_like(output[..., :1]) * keras.ops.zeros_like(inputs["memory"][..., 0])[:, None]
            return hidden, weights
        return hidden

    def step(self, ids: tf.Tensor, state: dict[str, Any], return_attention: bool = False) -> tuple:
        """One decoding step, with the weights of ``call`` (no dropout).

        Args:
            ids: int ``[n]``, the previous words.
            state: ``{"rnn": [...], "memory": [n, S, units]}`` and optionally ``"memory_mask": [n, S]``
                (other entries are passed through).
            return_attention: also return the attention weights ``[n, S]`` (zeros without attention).

        Returns:
            ``(hidden [n, units], new state)`` with the same structure (and the attention weights).
        """
        output, rnn_state = self.rnn.cell(self._embed(ids), list(state["rnn"]), training=False)
        hidden, weights = self._hidden(output[:, None, :], state["memory"], state.get("memory_mask"), False)
        new_state = {**state, "rnn": list(rnn_state)}
        if not return_attention:
            return hidden[:, 0, :], new_state
        weights = tf.zeros_like(state["memory"][..., 0]) if weights is None else weights[:, 0, :]
        return hidden[:, 0, :], new_state, weights

    def compute_mask(self, inputs: Any, mask: Any = None) -> None:
        return None

    def compute_output_shape(self, input_shape: dict[str, Any]) -> tuple:
        return tuple(input_shape["ids"]) + (self.units,)

    def compute_output_spec(self, inputs: dict[str, Any], training: bool | None = None,
                            return_attention: bool = False, mask: Any = None) -> Any:
        ids, memory = tuple(inputs["ids"].shape), tuple(inputs["memory"].shape)
        hidden = keras.KerasTensor(ids + (self.units,), dtype=self.compute_dtype)
        return (hidden, keras.KerasTensor(ids + memory[1:2], dtype=self.compute_dtype)) if return_attention else hidden

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update({"vocab_size": self.vocab_size, "embedding_dim": self.embedding_dim, "units": self.units,
                       "cell": self.cell_type, "attention": self.attention_type, "dropout": self.dropout,
                       "input_ids": self.input_ids})
        return config
