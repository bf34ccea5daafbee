"""Decoupled hierarchical RNN with locally computable losses (Mujika et al., 2019).

The layer runs the whole hierarchy in ``tf.while_loop``s over segments of
``periods[0]`` steps. Two training paths share that segment function:

- ``call`` / ``sequence_loss``: plain TensorFlow autodiff. Under ``fit`` it keeps
  the activations of every step, so memory grows with T.
- ``loss_and_gradients``: the memory-lean path. In ``gr_hrnn`` and
  ``decoupled`` mode the forward loop keeps only each segment's incoming carry
  (the upper states, O(T/k)); a reverse loop recomputes one segment at a time
  under a ``GradientTape`` (O(k)) and carries the carry's gradient backwards.
  In ``mr_hrnn`` mode it backpropagates each truncation window as soon as it
  has run. Its gradients equal autodiff of the same graph.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import keras
import tensorflow as tf

from seqapps.layers.hrnn_modes import MODES

AUX_LOSSES = ("mse", "categorical_crossentropy")


def _mse(y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
    return tf.reduce_mean(tf.square(tf.cast(y_true, y_pred.dtype) - y_pred), axis=-1)


def _categorical(y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
    return tf.nn.softmax_cross_entropy_with_logits(labels=tf.cast(y_true, y_pred.dtype), logits=y_pred)


def _sparse_categorical(y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.cast(y_true, tf.int32), logits=y_pred)


def _binary(y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
    labels = tf.cast(y_true, y_pred.dtype)
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=y_pred), axis=-1)


# Per-step losses on logits: fn(y_true of one step, y_pred of one step) -> (batch,).
TASK_LOSSES: dict[str, Callable[[tf.Tensor, tf.Tensor], tf.Tensor]] = {
    "mse": _mse,
    "categorical_crossentropy": _categorical,
    "sparse_categorical_crossentropy": _sparse_categorical,
    "binary_crossentropy": _binary,
}


def _as_list(value: Any, length: int) -> list:
    """``value`` repeated ``length`` times, or ``list(value)`` if it is a sequence."""
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value] * length


def _chunk_time(x: tf.Tensor, k: int, n_chunks: tf.Tensor, pad: tf.Tensor) -> tf.Tensor:
    """(batch, T, ...) -> time-major segments (n_chunks, k, batch, ...), zero-padded."""
    rank = len(x.shape)
    x = tf.pad(x, [[0, 0], [0, pad]] + [[0, 0]] * (rank - 2))
    x = tf.reshape(x, tf.concat([[tf.shape(x)[0], n_chunks, k], tf.shape(x)[2:]], 0))
    return tf.transpose(x, [1, 2, 0] + list(range(3, rank + 1)))


def _unchunk_time(x: tf.Tensor, length: tf.Tensor) -> tf.Tensor:
    """Inverse of ``_chunk_time``: (n_chunks, k, batch, ...) -> (batch, length, ...), the padding dropped."""
    rank = len(x.shape)
    x = tf.transpose(x, [2, 0, 1] + list(range(3, rank)))
    x = tf.reshape(x, tf.concat([[tf.shape(x)[0], -1], tf.shape(x)[3:]], 0))
    return x[:, :length]


def _gradient(
    tape: tf.GradientTape, target: Any, sources: list, output_gradients: list | None = None
) -> list[tf.Tensor]:
    """``tape.gradient`` with zeros for unconnected sources.

    ``unconnected_gradients="zero"`` fails eagerly on Keras 3 variables (their dtype is a string).
    """
    grads = tape.gradient(target, sources, output_gradients=output_gradients)
    return [
        (tf.zeros_like(s) if isinstance(s, tf.Tensor) else tf.zeros(s.shape, s.dtype)) if g is None else g
        for g, s in zip(grads, sources)
    ]


def _keep_gradient(value: tf.Tensor, keep: tf.Tensor) -> tf.Tensor:
    """``value`` whose gradient is multiplied by the 0/1 scalar ``keep``."""
    stopped = tf.stop_gradient(value)
    return keep * value + (1.0 - keep) * stopped


@keras.saving.register_keras_serializable(package="seqapps")
class DecoupledHRNN(keras.layers.Layer):
    """Hierarchical RNN whose levels can be trained with local losses.

    Level 0 reads ``x_t`` at every step together with the current output of
    level 1 and emits ``y_t``. Level 1 ticks every ``periods[0]`` steps (or
    where a boundary input is true): it reads the output of level 0, updates
    its state, and level 0's state is reset to zeros. Level ``j >= 2`` ticks
    every ``periods[j - 1]`` ticks of level ``j - 1`` by the same rule, and
    level ``j``'s input is the output of level ``j - 1`` joined with the output
    of level ``j + 1``. A level ``j >= 1`` reset by a tick of level ``j + 1``
    restarts from one step of its cell on level ``j + 1``'s new output (and
    zeros from below), top down, so that level 0 sees the whole past at every
    step. Masked steps keep every state and never tick.

    In ``decoupled`` mode (and ``hrnn`` with ``beta > 0``) each level
    ``j >= 1`` has a decoder (one tanh layer of ``aux_hidden_units``, then a
    linear layer) that gets the output sent up
    by level ``j - 1`` at a tick plus a one-hot index ``i`` drawn uniformly
    from 1..``periods[j - 1]`` (1..min(k, steps since the last tick) with
    boundaries). It must output the ``i``-th previous input of level
    ``j - 1`` (``i = 1``: the latest): the input ``x`` for level 1 (loss
    ``aux_loss``), the outputs of level ``j - 2`` that level ``j - 1`` read
    for higher levels (mean squared error, targets without gradient). Each
    level's loss is a mean over its ticks and examples, weighted by ``beta``.
    The layer adds it with ``add_loss`` when called with ``training=True``;
    ``sequence_loss`` and ``loss_and_gradients`` include it in what they
    return.

    Modes (``mode``):
    - ``"hrnn"``: true gradients everywhere; with ``beta > 0`` it has the
      decoders too (the paper grid-searched beta for this baseline), and their
      losses backpropagate through the whole hierarchy.
    - ``"gr_hrnn"``: the upward edges go through ``tf.stop_gradient``, so
      dh^U/dh^L = 0 at each tick; no auxiliary loss.
    - ``"decoupled"``: ``gr_hrnn`` plus the auxiliary losses (the paper).
    - ``"mr_hrnn"``: true gradients, truncated to windows of
      ``ceil((2T/k + k) / k)`` whole segments (``k = periods[0]``, about
      ``2T/k + k`` steps, the memory of ``decoupled``): every state passed
      from one window to the next goes through ``tf.stop_gradient``. No
      auxiliary loss.

    Memory-lean training: ``loss_and_gradients`` computes the per-step task
    loss inside each segment (through the optional ``output_units`` head), so
    ``gr_hrnn`` and ``decoupled`` training keeps O(k) lower states plus
    O(T/k) segment carries, and ``mr_hrnn`` one window. Its inputs must be
    the raw features (one-hot or real), since it returns no input gradient.
    Cell dropout is not supported there (recomputation would redraw it).

    Args:
        cells: Keras RNN cells, lowest level first, at least two
            (``LSTMCell``, ``GRUCell``, ``SimpleRNNCell`` or any cell whose
            first state is its output). The layer holds copies made from
            their configs, under the layer's dtype policy (the cells' states
            live in the layer's loops, in its compute dtype).
        periods: ticks of level ``j - 1`` per tick of level ``j``: an int for
            every level, or one int per level above the first. With a
            boundary input ``periods[0]`` is the largest index the level-1
            decoder is asked about.
        mode: one of ``"hrnn"``, ``"gr_hrnn"``, ``"decoupled"``,
            ``"mr_hrnn"``.
        beta: auxiliary loss weight, >= 0: a float, or one per level above
            the first. None: 1 in ``decoupled`` mode, 0 in the others;
            ``gr_hrnn`` and ``mr_hrnn`` take only 0.
        aux_hidden_units: width of each decoder's hidden layer.
        aux_loss: level-1 reconstruction loss: ``"mse"`` for real-valued
            inputs, ``"categorical_crossentropy"`` for one-hot inputs.
        output_units: if set, a linear head maps each ``y_t`` to this many
            logits; otherwise the layer returns level 0's outputs.
        allow_padding: pad a sequence that the product of ``periods`` does not
            divide (the padded steps are masked). If False such a sequence
            raises a ValueError.
        seed: seed of the auxiliary indices drawn in ``call``.
        **kwargs: base layer arguments (``name``, ``dtype``, ...).

    Call arguments:
        inputs: ``x`` of shape (batch, T, features), or ``[x, boundaries]``
            with a boolean ``boundaries`` of shape (batch, T): level 1 ticks
            after each step where it is true instead of every
            ``periods[0]`` steps.
        training: whether to add the auxiliary loss (when the layer has decoders).
        mask: boolean (batch, T) mask of valid steps.

    Returns:
        (batch, T, output_units or the level-0 output size); zeros at masked
        steps.

    Example:
    ```python
    layer = DecoupledHRNN(
        [keras.layers.GRUCell(64), keras.layers.GRUCell(32)],
        periods=10,
        output_units=8,
    )
    x = np.random.uniform(size=(4, 50, 8)).astype("float32")
    logits = layer(x)  # (4, 50, 8)
    targets = np.random.randint(0, 8, size=(4, 50))
    loss, grads = layer.loss_and_gradients(x, targets, "sparse_categorical_crossentropy")
    ```

    Reference:
    - [Mujika, Weissenberger and Steger, 2019. Decoupling Hierarchical
      Recurrent Neural Networks With Locally Computable Losses.](
      https://arxiv.org/abs/1910.05245)
    """

    def __init__(
        self,
        cells: Sequence[keras.layers.Layer | dict],
        periods: int | Sequence[int],
        mode: str = "decoupled",
        beta: float | Sequence[float] | None = None,
        aux_hidden_units: int = 128,
        aux_loss: str = "mse",
        output_units: int | None = None,
        allow_padding: bool = True,
        seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not isinstance(cells, (list, tuple)) or len(cells) < 2:
            raise ValueError(f"cells must be a list of at least two RNN cells, got cells={cells!r}")
        levels = len(cells)
        period_list = _as_list(periods, levels - 1)
        if len(period_list) != levels - 1 or any(not isinstance(k, int) or k < 1 for k in period_list):
            raise ValueError(
                f"periods must be a positive int or {levels - 1} positive ints (one per upper level), "
                f"got periods={periods!r}"
            )
        if mode not in MODES:
            raise ValueError(f"Unknown mode={mode!r}; expected one of {MODES}")
        beta_list = _as_list((1.0 if mode == "decoupled" else 0.0) if beta is None else beta, levels - 1)
        if len(beta_list) != levels - 1 or any(float(b) < 0 for b in beta_list):
            raise ValueError(f"beta must be >= 0 (a float or {levels - 1} floats), got beta={beta!r}")
        if mode in ("gr_hrnn", "mr_hrnn") and any(float(b) > 0 for b in beta_list):
            raise ValueError(f"mode={mode!r} has no decoders, so beta must be 0, got beta={beta!r}")
        if aux_loss not in AUX_LOSSES:
            raise ValueError(f"Unknown aux_loss={aux_loss!r}; expected one of {AUX_LOSSES}")
        if aux_hidden_units < 1:
            raise ValueError(f"aux_hidden_units must be >= 1, got aux_hidden_units={aux_hidden_units}")
        if output_units is not None and output_units < 1:
            raise ValueError(f"output_units must be None or >= 1, got output_units={output_units}")
        self.cells = [self._copy_cell(cell) for cell in cells]
        self.periods = periods
        self.mode = mode
        self.beta = beta
        self.aux_hidden_units = aux_hidden_units
        self.aux_loss = aux_loss
        self.output_units = output_units
        self.allow_padding = allow_padding
        self.seed = seed
        self._periods = [int(k) for k in period_list]
        self._betas = [float(b) for b in beta_list]
        self._decoders = mode == "decoupled" or (mode == "hrnn" and any(b > 0 for b in self._betas))
        self._seed_generator = keras.random.SeedGenerator(seed)
        self.supports_masking = True

    def _copy_cell(self, cell: keras.layers.Layer | dict) -> keras.layers.Layer:
        """A copy of ``cell`` (or its serialised config) under this layer's dtype policy."""
        serialized = cell if isinstance(cell, dict) else keras.saving.serialize_keras_object(cell)
        config = {**serialized["config"], "dtype": keras.dtype_policies.serialize(self.dtype_policy)}
        return keras.saving.deserialize_keras_object({**serialized, "config": config})

    @property
    def levels(self) -> int:
        """Number of levels of the hierarchy."""
        return len(self.cells)

    def _output_size(self, level: int) -> int:
        return int(self.cells[level].output_size)

    def build(self, input_shape: Any) -> None:
        x_shape = input_shape[0] if isinstance(input_shape[0], (list, tuple)) else input_shape
        features = int(x_shape[-1])
        self._features = features
        for level, cell in enumerate(self.cells):
            below = features if level == 0 else self._output_size(level - 1)
            above = self._output_size(level + 1) if level + 1 < self.levels else 0
            if not cell.built:
                cell.build((None, below + above))
        self.decoder_hidden = []
        self.decoder_output = []
        if self._decoders:
            for level in range(1, self.levels):
                target = features if level == 1 else self._output_size(level - 2)
                source = self._output_size(level - 1) + self._periods[level - 1]
                hidden = keras.layers.Dense(
                    self.aux_hidden_units, activation="tanh", name=f"decoder_{level}_hidden", dtype=self.dtype_policy
                )
                hidden.build((None, source))
                output = keras.layers.Dense(target, name=f"decoder_{level}_output", dtype=self.dtype_policy)
                output.build((None, self.aux_hidden_units))
                self.decoder_hidden.append(hidden)
                self.decoder_output.append(output)
        self.head = None
        if self.output_units is not None:
            self.head = keras.layers.Dense(self.output_units, name="head", dtype=self.dtype_policy)
            self.head.build((None, self._output_size(0)))

    def _split_inputs(self, inputs: Any) -> tuple[tf.Tensor, tf.Tensor | None]:
        """``inputs`` as ``(x, boundaries or None)``, with shape checks."""
        if isinstance(inputs, (list, tuple)):
            if len(inputs) != 2:
                raise ValueError(f"inputs must be x or [x, boundaries], got {len(inputs)} tensors")
            x, boundaries = inputs
        else:
            x, boundaries = inputs, None
        x = tf.convert_to_tensor(x, dtype=self.compute_dtype)
        if len(x.shape) != 3:
            raise ValueError(f"inputs must have shape (batch, time, features), got shape {tuple(x.shape)}")
        if boundaries is not None:
            boundaries = tf.convert_to_tensor(boundaries)
            shape = tuple(boundaries.shape)
            expected = tuple(x.shape[:2])
            if len(shape) != 2 or any(a is not None and b is not None and a != b for a, b in zip(shape, expected)):
                raise ValueError(
                    f"boundaries must have shape (batch, time) = {expected}, got boundaries of shape {shape}"
                )
            boundaries = tf.cast(boundaries, tf.bool)
        return x, boundaries

    def _check_length(self, x: tf.Tensor, boundaries: tf.Tensor | None) -> None:
        """Raises if padding is needed but not allowed, or for ``mr_hrnn`` with boundaries."""
        if boundaries is not None and self.mode == "mr_hrnn":
            raise ValueError(
                "mode='mr_hrnn' takes no boundaries input: its truncation windows count periodic segments, "
                "which boundary-driven ticks do not have"
            )
        length = x.shape[1]
        span = math.prod(self._periods) if boundaries is None else self._periods[0]
        if not self.allow_padding and length is not None and length % span:
            raise ValueError(
                f"periods={self.periods!r} (segment of {span} steps) does not divide the sequence length "
                f"{length} and allow_padding=False"
            )

    def _prepare(
        self,
        x: tf.Tensor,
        mask: tf.Tensor | None,
        boundaries: tf.Tensor | None,
        targets: tf.Tensor | None,
        uniforms: tf.Tensor,
    ) -> dict[str, tf.Tensor]:
        """Time-major segments of every per-step input, padded and masked."""
        self._check_length(x, boundaries)
        k = self._periods[0]
        length = tf.shape(x)[1]
        n_chunks = (length + k - 1) // k
        pad = n_chunks * k - length
        if mask is None:
            mask = tf.ones(tf.shape(x)[:2], tf.bool)
        data = {
            "x": _chunk_time(x, k, n_chunks, pad),
            "mask": _chunk_time(tf.cast(mask, tf.bool), k, n_chunks, pad),
            "u": _chunk_time(uniforms, k, n_chunks, pad),
        }
        if boundaries is not None:
            data["boundaries"] = _chunk_time(boundaries, k, n_chunks, pad)
        if targets is not None:
            data["targets"] = _chunk_time(tf.convert_to_tensor(targets), k, n_chunks, pad)
        return data

    def _uniforms(self, x: tf.Tensor, seed: int | None, draw: bool) -> tf.Tensor:
        """Uniform [0, 1) draws of shape (batch, T, levels - 1) for the auxiliary indices (zeros if not ``draw``)."""
        shape = tf.concat([tf.shape(x)[:2], [self.levels - 1]], 0)
        if not draw:
            return tf.zeros(shape, self.compute_dtype)
        if seed is None:
            return keras.random.uniform(shape, dtype=self.compute_dtype, seed=self._seed_generator)
        return tf.random.stateless_uniform(shape, seed=[seed, 0], dtype=self.compute_dtype)

    def _initial_carry(self, batch: tf.Tensor, boundary_mode: bool) -> dict[str, tf.Tensor]:
        """Zero states, plus the buffers and counters of the auxiliary targets."""
        dtype = self.compute_dtype
        carry = {}
        for level, cell in enumerate(self.cells):
            for index, size in enumerate(tf.nest.flatten(cell.state_size)):
                carry[f"state{level}_{index}"] = tf.zeros([batch, size], dtype)
        for level in range(1, self.levels):
            if level == 1 and not boundary_mode:
                continue
            width = self._features if level == 1 else self._output_size(level - 2)
            carry[f"buffer{level}"] = tf.zeros([batch, self._periods[level - 1], width], dtype)
            carry[f"position{level}"] = tf.zeros([batch], tf.int32)
            carry[f"count{level}"] = tf.zeros([batch], tf.int32)
        return carry

    def _states(self, carry: dict[str, tf.Tensor], level: int) -> list[tf.Tensor]:
        return [carry[f"state{level}_{i}"] for i in range(len(tf.nest.flatten(self.cells[level].state_size)))]

    def _set_states(
        self, carry: dict[str, tf.Tensor], level: int, states: list[tf.Tensor], where: tf.Tensor
    ) -> None:
        for i, state in enumerate(states):
            name = f"state{level}_{i}"
            carry[name] = tf.where(where[:, None], state, carry[name])

    def _cell_on_rows(
        self, level: int, inputs: tf.Tensor, states: list[tf.Tensor], any_row: tf.Tensor, training: bool | None
    ) -> list[tf.Tensor]:
        """Level ``level``'s cell on gathered rows; the states unchanged when there are none."""

        def run() -> list[tf.Tensor]:
            return tf.nest.flatten(self.cells[level](inputs, states, training=training)[1])

        return tf.cond(any_row, run, lambda: list(states))

    def _scatter_states(
        self, carry: dict[str, tf.Tensor], level: int, states: list[tf.Tensor], rows: tf.Tensor
    ) -> None:
        """Writes ``states`` (one row per entry of ``rows``) into rows ``rows`` of level ``level``'s states."""
        for i, state in enumerate(states):
            name = f"state{level}_{i}"
            carry[name] = tf.tensor_scatter_nd_update(carry[name], rows[:, None], state)

    def _push(self, carry: dict[str, tf.Tensor], level: int, value: tf.Tensor, where: tf.Tensor) -> None:
        """Writes ``value`` into level ``level``'s ring buffer where ``where``."""
        size = self._periods[level - 1]
        position = carry[f"position{level}"]
        slot = tf.logical_and(tf.one_hot(position, size, on_value=True, off_value=False), where[:, None])
        buffer = carry[f"buffer{level}"]
        carry[f"buffer{level}"] = tf.where(slot[:, :, None], tf.stop_gradient(value)[:, None, :], buffer)
        carry[f"position{level}"] = tf.where(where, (position + 1) % size, position)
        carry[f"count{level}"] = carry[f"count{level}"] + tf.cast(where, tf.int32)

    def _from_buffer(
        self, carry: dict[str, tf.Tensor], level: int, index: tf.Tensor
    ) -> tf.Tensor:
        """The ``index``-th previous entry (1 = latest) of level ``level``'s buffer."""
        size = self._periods[level - 1]
        slot = (carry[f"position{level}"] - index) % size
        return tf.gather(carry[f"buffer{level}"], slot, batch_dims=1)

    def _aux_loss(self, level: int, sent: tf.Tensor, index: tf.Tensor, target: tf.Tensor) -> tf.Tensor:
        """Per-example reconstruction loss of level ``level``'s decoder."""
        one_hot = tf.one_hot(index - 1, self._periods[level - 1], dtype=sent.dtype)
        hidden = self.decoder_hidden[level - 1](tf.concat([sent, one_hot], -1))
        prediction = self.decoder_output[level - 1](hidden)
        if level == 1 and self.aux_loss == "categorical_crossentropy":
            return _categorical(target, prediction)
        return _mse(target, prediction)

    def _tick(
        self,
        carry: dict[str, tf.Tensor],
        tick: tf.Tensor,
        aux_index: tf.Tensor,
        aux_target: tf.Tensor | None,
        aux_valid: tf.Tensor,
        uniforms: tf.Tensor,
        compute_aux: bool,
        training: bool | None,
    ) -> tuple[dict[str, tf.Tensor], list[tf.Tensor], list[tf.Tensor]]:
        """Levels 1.. tick where ``tick``; returns the carry and per-level aux sums and counts.

        The cells and decoders of the upper levels run on the ticking rows only (gathered, then
        scattered back), so boundary-driven ticks cost what the ticks need, not a full batch per step.
        """
        restricted = self.mode in ("gr_hrnn", "decoupled")
        sums, counts, ticks = [], [], []
        sent = carry["state0_0"]
        for level in range(1, self.levels):
            ticks.append(tick)
            rows = tf.where(tick)[:, 0]
            period = self._periods[level - 1]
            if level > 1:
                aux_index = 1 + tf.cast(tf.floor(uniforms[:, level - 1] * period), tf.int32)
                aux_index = tf.minimum(aux_index, period)
                aux_target = self._from_buffer(carry, level, aux_index)
                aux_valid = tf.ones_like(tick)
            weight = tf.cast(tf.gather(aux_valid, rows), sent.dtype)
            counts.append(tf.reduce_sum(weight))
            sent_rows = tf.gather(sent, rows)
            any_row = tf.size(rows) > 0  # Keras cells fail on an empty batch
            if compute_aux:
                index_rows, target_rows = tf.gather(aux_index, rows), tf.gather(aux_target, rows)
                sums.append(tf.cond(
                    any_row,
                    lambda: tf.reduce_sum(self._aux_loss(level, sent_rows, index_rows, target_rows) * weight),
                    lambda: tf.zeros([], sent.dtype),
                ))
            else:
                sums.append(tf.zeros([], sent.dtype))
            upward = tf.stop_gradient(sent_rows) if restricted else sent_rows
            cell_input = [upward] + ([tf.gather(carry[f"state{level + 1}_0"], rows)] if level + 1 < self.levels else [])
            states = [tf.gather(s, rows) for s in self._states(carry, level)]
            new_states = self._cell_on_rows(level, tf.concat(cell_input, -1), states, any_row, training)
            self._scatter_states(carry, level, new_states, rows)
            below = self._states(carry, level - 1)
            self._set_states(carry, level - 1, [tf.zeros_like(s) for s in below], tick)
            if level + 1 < self.levels:
                self._push(carry, level + 1, sent, tick)
                count = carry[f"count{level + 1}"]
                next_tick = tf.logical_and(tick, count >= self._periods[level])
                carry[f"count{level + 1}"] = tf.where(next_tick, tf.zeros_like(count), count)
                sent = carry[f"state{level}_0"]
                tick = next_tick
        # A level j >= 1 reset by level j + 1 starts again from one step of its cell on level j + 1's
        # new output (zero input from below), top down, so that level 0 sees the whole past at every step.
        for level in range(self.levels - 2, 0, -1):
            rows = tf.where(ticks[level])[:, 0]
            above = tf.gather(carry[f"state{level + 1}_0"], rows)
            below_input = tf.zeros([tf.shape(rows)[0], self._output_size(level - 1)], above.dtype)
            zero_states = [tf.zeros([tf.shape(rows)[0], s.shape[-1]], s.dtype) for s in self._states(carry, level)]
            primed = self._cell_on_rows(
                level, tf.concat([below_input, above], -1), zero_states, tf.size(rows) > 0, training
            )
            self._scatter_states(carry, level, primed, rows)
        return carry, sums, counts

    def _segment(
        self,
        carry: dict[str, tf.Tensor],
        data: dict[str, tf.Tensor],
        collect_outputs: bool,
        compute_aux: bool,
        task_loss: Callable[[tf.Tensor, tf.Tensor], tf.Tensor] | None,
        training: bool | None,
    ) -> tuple[dict[str, tf.Tensor], tf.Tensor | None, tf.Tensor, list[tf.Tensor], list[tf.Tensor]]:
        """Runs one segment of ``periods[0]`` steps.

        Args:
            carry: the states, buffers and counters at the segment's start.
            data: this segment's slices of ``_prepare``'s tensors (time first).
            collect_outputs: whether to return the per-step outputs.
            compute_aux: whether to evaluate the decoders (else aux sums are 0).
            task_loss: per-step loss on ``data["targets"]``, or None.
            training: passed to the cells.

        Returns:
            The carry at the segment's end, the outputs (k, batch, units) or
            None, the masked sum of the task loss, and per upper level the sum
            and the count of auxiliary losses.
        """
        k = self._periods[0]
        dtype = self.compute_dtype
        boundary_mode = "boundaries" in data
        zero = tf.zeros([], dtype)
        units = self.output_units or self._output_size(0)
        batch = tf.shape(data["x"])[1]

        def step(t, carry, task_sum, aux_sums, aux_counts, *outputs):
            x_t = data["x"][t]
            valid = data["mask"][t]
            upper = carry["state1_0"]
            output, new_states = self.cells[0](
                tf.concat([x_t, upper], -1), self._states(carry, 0), training=training
            )
            self._set_states(carry, 0, tf.nest.flatten(new_states), valid)
            if task_loss is None and not collect_outputs:
                y = None
            elif self.head is not None:
                y = self.head(tf.where(valid[:, None], output, tf.zeros_like(output)))
            else:
                y = output
            if task_loss is not None:
                task_sum += tf.reduce_sum(task_loss(data["targets"][t], y) * tf.cast(valid, dtype))
            if collect_outputs:
                outputs = (outputs[0].write(t, tf.where(valid[:, None], y, tf.zeros_like(y))),)
            if boundary_mode:
                self._push(carry, 1, x_t, valid)
                tick = tf.logical_and(data["boundaries"][t], valid)
                count = carry["count1"]
                available = tf.cast(tf.minimum(count, k), dtype)
                index = tf.clip_by_value(1 + tf.cast(tf.floor(data["u"][t][:, 0] * available), tf.int32), 1, k)
                target = self._from_buffer(carry, 1, index)
                carry, sums, counts = self._tick(
                    carry, tick, index, target, count > 0, data["u"][t], compute_aux, training
                )
                carry["count1"] = tf.where(tick, tf.zeros_like(count), count)
                aux_sums = [a + b for a, b in zip(aux_sums, sums)]
                aux_counts = [a + b for a, b in zip(aux_counts, counts)]
            return (t + 1, carry, task_sum, aux_sums, aux_counts) + tuple(outputs)

        aux0 = [zero] * (self.levels - 1)
        outputs = ()
        if collect_outputs:
            outputs = (tf.TensorArray(dtype, size=k, element_shape=tf.TensorShape([None, units])),)
        _, carry, task_sum, aux_sums, aux_counts, *outputs = tf.while_loop(
            lambda t, *_: t < k, step, (tf.constant(0), carry, zero, aux0, list(aux0)) + outputs
        )
        if not boundary_mode:
            last = k - 1
            tick = data["mask"][last]
            index = 1 + tf.cast(tf.floor(data["u"][last][:, 0] * k), tf.int32)
            index = tf.minimum(index, k)
            rows = tf.stack([k - index, tf.range(batch)], axis=1)
            target = tf.stop_gradient(tf.gather_nd(data["x"], rows))  # a constant, as the buffer's entries are
            carry, aux_sums, aux_counts = self._tick(
                carry, tick, index, target, tf.gather_nd(data["mask"], rows), data["u"][last], compute_aux, training
            )
        return carry, (outputs[0].stack() if collect_outputs else None), task_sum, aux_sums, aux_counts

    def _window_chunks(self, length: tf.Tensor) -> tf.Tensor:
        """Segments per ``mr_hrnn`` truncation window: ceil((2T/k + k) / k)."""
        k = self._periods[0]
        steps = tf.math.ceil(2.0 * tf.cast(length, tf.float32) / k) + k
        return tf.maximum(1, tf.cast(tf.math.ceil(steps / k), tf.int32))

    def _run(
        self,
        data: dict[str, tf.Tensor],
        carry: dict[str, tf.Tensor],
        start: tf.Tensor,
        stop: tf.Tensor,
        collect_outputs: bool,
        compute_aux: bool,
        task_loss: Callable[[tf.Tensor, tf.Tensor], tf.Tensor] | None,
        training: bool | None,
        window: tf.Tensor | None = None,
    ) -> tuple[dict[str, tf.Tensor], tf.Tensor | None, tf.Tensor, list[tf.Tensor], list[tf.Tensor]]:
        """Runs segments ``start``..``stop - 1`` with plain autodiff.

        With ``window`` the carry's gradient is cut every ``window`` segments.
        Returns what ``_segment`` returns, summed (outputs (T_pad, batch, units)).
        """
        dtype = self.compute_dtype
        zero = tf.zeros([], dtype)
        units = self.output_units or self._output_size(0)
        shape = tf.TensorShape([self._periods[0], None, units])
        outputs = tf.TensorArray(dtype, size=stop - start, element_shape=shape)

        def body(c, carry, outputs, task_sum, aux_sums, aux_counts):
            if window is not None:
                keep = tf.cast(tf.not_equal(c % window, 0), dtype)
                carry = {n: _keep_gradient(v, keep) if v.dtype.is_floating else v for n, v in carry.items()}
            segment = {n: v[c] for n, v in data.items()}
            carry, out, s, a, n = self._segment(carry, segment, collect_outputs, compute_aux, task_loss, training)
            if collect_outputs:
                outputs = outputs.write(c - start, out)
            aux_sums = [x + y for x, y in zip(aux_sums, a)]
            aux_counts = [x + y for x, y in zip(aux_counts, n)]
            return c + 1, carry, outputs, task_sum + s, aux_sums, aux_counts

        aux0 = [zero] * (self.levels - 1)
        _, carry, outputs, task_sum, aux_sums, aux_counts = tf.while_loop(
            lambda c, *_: c < stop, body, (start, carry, outputs, zero, aux0, list(aux0))
        )
        stacked = None
        if collect_outputs:
            stacked = outputs.stack()
            stacked = tf.reshape(stacked, tf.concat([[-1], tf.shape(stacked)[2:]], 0))
        return carry, stacked, task_sum, aux_sums, aux_counts

    def _aux_total(self, aux_sums: list[tf.Tensor], aux_counts: list[tf.Tensor]) -> tf.Tensor:
        """Sum over levels of beta_j times the mean auxiliary loss of level j."""
        total = tf.zeros([], self.compute_dtype)
        for beta, value, count in zip(self._betas, aux_sums, aux_counts):
            total += beta * value / tf.maximum(count, 1.0)
        return total

    def call(self, inputs: Any, training: bool | None = None, mask: Any = None) -> tf.Tensor:
        x, boundaries = self._split_inputs(inputs)
        if isinstance(mask, (list, tuple)):
            mask = mask[0]
        compute_aux = bool(training) and self._decoders
        data = self._prepare(x, mask, boundaries, None, self._uniforms(x, None, compute_aux))
        n_chunks = tf.shape(data["x"])[0]
        window = self._window_chunks(tf.shape(x)[1]) if self.mode == "mr_hrnn" else None
        _, outputs, _, aux_sums, aux_counts = self._run(
            data,
            self._initial_carry(tf.shape(x)[0], boundaries is not None),
            tf.constant(0),
            n_chunks,
            collect_outputs=True,
            compute_aux=compute_aux,
            task_loss=None,
            training=training,
            window=window,
        )
        if compute_aux:
            self.add_loss(self._aux_total(aux_sums, aux_counts))
        outputs = tf.transpose(outputs, [1, 0, 2])[:, : tf.shape(x)[1]]
        outputs.set_shape(self.compute_output_shape(tuple(x.shape)))  # the slice hides the static time steps
        return outputs

    def compute_mask(self, inputs: Any, mask: Any = None) -> Any:
        if isinstance(mask, (list, tuple)):
            return mask[0]
        return mask

    def compute_output_shape(self, input_shape: Any) -> tuple:
        x_shape = input_shape[0] if isinstance(input_shape[0], (list, tuple)) else input_shape
        return (x_shape[0], x_shape[1], self.output_units or self._output_size(0))

    def _loss_inputs(
        self,
        inputs: Any,
        targets: Any,
        task_loss: str | Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
        mask: Any,
        seed: int | None,
    ) -> tuple[dict[str, tf.Tensor], Callable, tf.Tensor, tf.Tensor, bool]:
        """Prepared segments, the per-step loss, the valid-step count, T and the boundary flag."""
        x, boundaries = self._split_inputs(inputs)
        if not self.built:
            self.build(tuple(x.shape))
        if isinstance(task_loss, str):
            if task_loss not in TASK_LOSSES:
                raise ValueError(f"Unknown task_loss={task_loss!r}; expected a callable or one of {tuple(TASK_LOSSES)}")
            task_loss = TASK_LOSSES[task_loss]
        data = self._prepare(x, mask, boundaries, targets, self._uniforms(x, seed, self._decoders))
        valid_steps = tf.maximum(tf.reduce_sum(tf.cast(data["mask"], self.compute_dtype)), 1.0)
        return data, task_loss, valid_steps, tf.shape(x)[1], boundaries is not None

    def sequence_loss(
        self,
        inputs: Any,
        targets: Any,
        task_loss: str | Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
        mask: Any = None,
        seed: int | None = None,
        training: bool | None = True,
    ) -> tf.Tensor:
        """The training loss through the plain graph, for ``tf.GradientTape``.

        Args:
            inputs: ``x`` or ``[x, boundaries]`` as in ``call``.
            targets: per-step targets, (batch, T) or (batch, T, ...).
            task_loss: a name in ``TASK_LOSSES`` or ``fn(y_true_t, y_pred_t) ->
                (batch,)``; applied to the head's logits (or the outputs).
            mask: boolean (batch, T) mask of valid steps.
            seed: int seed of the auxiliary indices (None: the layer's generator).
            training: passed to the cells.

        Returns:
            The mean task loss over valid steps, plus ``beta`` times the mean
            auxiliary loss of each level when the layer has decoders.
        """
        data, task_loss, valid_steps, length, boundary_mode = self._loss_inputs(inputs, targets, task_loss, mask, seed)
        window = self._window_chunks(length) if self.mode == "mr_hrnn" else None
        _, _, task_sum, aux_sums, aux_counts = self._run(
            data,
            self._initial_carry(tf.shape(data["x"])[2], boundary_mode),
            tf.constant(0),
            tf.shape(data["x"])[0],
            collect_outputs=False,
            compute_aux=self._decoders,
            task_loss=task_loss,
            training=training,
            window=window,
        )
        return task_sum / valid_steps + self._aux_total(aux_sums, aux_counts)

    def loss_and_gradients(
        self,
        inputs: Any,
        targets: Any,
        task_loss: str | Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
        mask: Any = None,
        seed: int | None = None,
        lean: bool = True,
        return_input_gradients: bool = False,
    ) -> tuple:
        """The training loss and its gradients, memory-lean where the mode allows.

        ``gr_hrnn`` and ``decoupled``: segment recomputation in a reverse loop.
        ``mr_hrnn``: each truncation window is backpropagated as it ends.
        ``hrnn`` (or ``lean=False``): plain autodiff of ``sequence_loss``. All
        give the gradients of ``sequence_loss`` up to float32 round-off. It
        runs eagerly too; wrap the call in ``tf.function`` for speed.

        Args:
            inputs: ``x`` or ``[x, boundaries]`` as in ``call``.
            targets: per-step targets, (batch, T) or (batch, T, ...).
            task_loss: as in ``sequence_loss``.
            mask: boolean (batch, T) mask of valid steps.
            seed: int seed of the auxiliary indices (None: the layer's generator).
            lean: False forces plain autodiff.
            return_input_gradients: also return the loss's gradient with respect to ``x``, so that a
                layer before this one (a convolutional front end) can be trained through the lean path.

        Returns:
            ``(loss, gradients)``, the gradients aligned with ``self.trainable_variables``; with
            ``return_input_gradients``, ``(loss, gradients, input_gradients)``, the last (batch, T, features).
            The auxiliary decoders' reconstruction targets count as constants: ``x`` reaches the loss
            through the cells only.
        """
        if not lean or self.mode == "hrnn":
            x, boundaries = self._split_inputs(inputs)
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = self.sequence_loss(x if boundaries is None else [x, boundaries], targets, task_loss,
                                          mask=mask, seed=seed)
            grads = _gradient(tape, loss, [*self.trainable_variables] + [x] * return_input_gradients)
            return (loss, grads[:-1], grads[-1]) if return_input_gradients else (loss, grads)
        for cell in self.cells:
            if getattr(cell, "dropout", 0) or getattr(cell, "recurrent_dropout", 0):
                raise ValueError(f"cell dropout is not supported by the lean path, got cell {cell.name}")
        data, task_loss, valid_steps, length, boundary_mode = self._loss_inputs(inputs, targets, task_loss, mask, seed)
        variables = self.trainable_variables
        carry0 = self._initial_carry(tf.shape(data["x"])[2], boundary_mode)
        if self.mode == "mr_hrnn":
            loss, grads, d_x = self._windowed_gradients(data, carry0, variables, task_loss, valid_steps, length,
                                                        return_input_gradients)
        else:
            loss, grads, d_x = self._recomputed_gradients(data, carry0, variables, task_loss, valid_steps,
                                                          return_input_gradients)
        return (loss, grads, _unchunk_time(d_x, length)) if return_input_gradients else (loss, grads)

    def _recomputed_gradients(
        self,
        data: dict[str, tf.Tensor],
        carry0: dict[str, tf.Tensor],
        variables: list,
        task_loss: Callable,
        valid_steps: tf.Tensor,
        input_gradients: bool,
    ) -> tuple[tf.Tensor, list[tf.Tensor], tf.Tensor | None]:
        """Restricted gradients: store segment carries, recompute segments in reverse.

        Returns the loss, the variables' gradients and, with ``input_gradients``, the gradient of the
        segments' ``x`` (else None)."""
        n_chunks = tf.shape(data["x"])[0]
        names = sorted(carry0)
        floating = [n for n in names if carry0[n].dtype.is_floating]
        stored = {
            n: tf.TensorArray(carry0[n].dtype, size=n_chunks, element_shape=carry0[n].shape) for n in names
        }
        zero = tf.zeros([], self.compute_dtype)

        def forward(c, carry, stored, counts):
            stored = {n: stored[n].write(c, carry[n]) for n in names}
            segment = {n: v[c] for n, v in data.items()}
            carry, _, _, _, n = self._segment(carry, segment, False, False, None, True)
            return c + 1, carry, stored, [a + b for a, b in zip(counts, n)]

        _, _, stored, counts = tf.while_loop(
            lambda c, *_: c < n_chunks,
            forward,
            (tf.constant(0), carry0, stored, [zero] * (self.levels - 1)),
        )
        scales = [beta / tf.maximum(count, 1.0) for beta, count in zip(self._betas, counts)]

        def backward(c, d_carry, grads, total, d_x):
            carry = {n: stored[n].read(c) for n in names}
            segment = {n: v[c] for n, v in data.items()}
            with tf.GradientTape() as tape:
                tape.watch([carry[n] for n in floating] + [segment["x"]] * input_gradients)
                out, _, task_sum, aux_sums, _ = self._segment(
                    carry, segment, False, self._decoders, task_loss, True
                )
                local = task_sum / valid_steps + sum((s * a for s, a in zip(scales, aux_sums)), zero)
            g = _gradient(
                tape,
                [local] + [out[n] for n in floating],
                list(variables) + [carry[n] for n in floating] + [segment["x"]] * input_gradients,
                output_gradients=[tf.ones_like(local)] + [d_carry[n] for n in floating],
            )
            grads = [a + b for a, b in zip(grads, g[: len(variables)])]
            d_carry = dict(zip(floating, g[len(variables) : len(variables) + len(floating)]))
            return c - 1, d_carry, grads, total + local, d_x.write(c, g[-1]) if input_gradients else d_x

        d_carry0 = {n: tf.zeros_like(carry0[n]) for n in floating}
        d_x = tf.TensorArray(data["x"].dtype, size=n_chunks if input_gradients else 0,
                             element_shape=data["x"].shape[1:])
        _, _, grads, loss, d_x = tf.while_loop(
            lambda c, *_: c >= 0,
            backward,
            (n_chunks - 1, d_carry0, [tf.zeros(v.shape, v.dtype) for v in variables], zero, d_x),
            parallel_iterations=1,  # else the next recomputations start early and hold their activations
        )
        return loss, grads, d_x.stack() if input_gradients else None

    def _windowed_gradients(
        self,
        data: dict[str, tf.Tensor],
        carry0: dict[str, tf.Tensor],
        variables: list,
        task_loss: Callable,
        valid_steps: tf.Tensor,
        length: tf.Tensor,
        input_gradients: bool,
    ) -> tuple[tf.Tensor, list[tf.Tensor], tf.Tensor | None]:
        """``mr_hrnn`` gradients: backpropagate each truncation window as it ends.

        Returns the loss, the variables' gradients and, with ``input_gradients``, the gradient of the
        segments' ``x`` (else None)."""
        n_chunks = tf.shape(data["x"])[0]
        window = self._window_chunks(length)
        zero = tf.zeros([], self.compute_dtype)

        def body(start, carry, grads, total, d_x):
            carry = {n: tf.stop_gradient(v) for n, v in carry.items()}
            with tf.GradientTape() as tape:
                if input_gradients:
                    tape.watch(data["x"])
                carry, _, task_sum, _, _ = self._run(
                    data, carry, start, tf.minimum(start + window, n_chunks), False, False, task_loss, True
                )
                local = task_sum / valid_steps
            g = _gradient(tape, local, [*variables] + [data["x"]] * input_gradients)
            grads = [a + b for a, b in zip(grads, g[: len(variables)])]
            return start + window, carry, grads, total + local, d_x + g[-1] if input_gradients else d_x

        d_x0 = tf.zeros_like(data["x"]) if input_gradients else zero
        _, _, grads, loss, d_x = tf.while_loop(
            lambda start, *_: start < n_chunks,
            body,
            (tf.constant(0), carry0, [tf.zeros(v.shape, v.dtype) for v in variables], zero, d_x0),
            parallel_iterations=1,
        )
        return loss, grads, d_x if input_gradients else None

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            {
                "cells": [keras.saving.serialize_keras_object(cell) for cell in self.cells],
                "periods": self.periods,
                "mode": self.mode,
                "beta": self.beta,
                "aux_hidden_units": self.aux_hidden_units,
                "aux_loss": self.aux_loss,
                "output_units": self.output_units,
                "allow_padding": self.allow_padding,
                "seed": self.seed,
            }
        )
        return config


def _reverse_valid(values: tf.Tensor, lengths: tf.Tensor) -> tf.Tensor:
    """Reverses each row's first ``lengths`` steps (axis 1) and leaves its padding where it is."""
    return tf.reverse_sequence(values, tf.cast(lengths, tf.int64), seq_axis=1, batch_axis=0)


@keras.saving.register_keras_serializable(package="seqapps")
class BidirectionalHRNN(keras.layers.Layer):
    """A ``DecoupledHRNN`` read forwards, and a copy of it read backwards, merged at every step.

    The backward copy runs the same configuration on each sequence's valid steps reversed, so that
    its output at step ``t`` has read steps ``t..T-1``; padding stays at the end, so both
    directions share the mask. With ``output_units``, the two heads' logits are summed: one linear
    head over the concatenated forward and backward outputs (``W [h_f; h_b] = W_f h_f + W_b h_b``),
    whose bias is split in two. Without, the outputs are concatenated. Each direction keeps its own
    restricted gradients, decoders and memory bound (k + 2T/k), so training costs twice one layer.

    Args:
        layer: the forward ``DecoupledHRNN`` (or its serialised form); the backward one is a copy
            of its configuration with fresh weights.
        **kwargs: base layer arguments.

    Call arguments:
        inputs: ``x`` (batch, T, features).
        training: whether each direction adds its auxiliary loss.
        mask: boolean (batch, T) mask of valid steps, valid steps first.

    Returns:
        (batch, T, output_units), or (batch, T, 2 x the level-0 output size) without a head.

    Example:
    ```python
    layer = BidirectionalHRNN(DecoupledHRNN([keras.layers.GRUCell(16), keras.layers.GRUCell(8)], periods=4,
                                            output_units=5))
    logits = layer(np.zeros((2, 12, 3), "float32"))  # (2, 12, 5)
    ```
    """

    def __init__(self, layer: DecoupledHRNN | dict, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if isinstance(layer, dict):
            layer = keras.saving.deserialize_keras_object(layer)
        if not isinstance(layer, DecoupledHRNN):
            raise ValueError(f"layer must be a DecoupledHRNN, got {type(layer).__name__}")
        config = {**layer.get_config(), "name": "backward"}
        self.forward = layer
        self.backward = DecoupledHRNN.from_config(config)
        self.supports_masking = True

    def build(self, input_shape: Any) -> None:
        for direction in (self.forward, self.backward):
            if not direction.built:  # a loaded forward layer is built by its own config
                direction.build(input_shape)
        self.built = True

    @staticmethod
    def _lengths(x: tf.Tensor, mask: Any) -> tf.Tensor:
        if mask is None:
            return tf.fill([tf.shape(x)[0]], tf.shape(x)[1])
        return tf.reduce_sum(tf.cast(mask, tf.int32), axis=1)

    def call(self, inputs: Any, training: bool | None = None, mask: Any = None) -> tf.Tensor:
        lengths = self._lengths(inputs, mask)
        forward = self.forward(inputs, training=training, mask=mask)
        backward = _reverse_valid(self.backward(_reverse_valid(inputs, lengths), training=training, mask=mask),
                                  lengths)
        if self.forward.output_units:
            return forward + backward
        return tf.concat([forward, backward], axis=-1)

    def compute_mask(self, inputs: Any, mask: Any = None) -> Any:
        return mask

    def compute_output_shape(self, input_shape: Any) -> tuple:
        batch, steps, width = self.forward.compute_output_shape(input_shape)
        return (batch, steps, width if self.forward.output_units else 2 * width)

    def linear_gradients(self, inputs: tf.Tensor, step_gradients: tf.Tensor, mask: Any = None,
                         return_input_gradients: bool = False) -> tuple:
        """Gradients of ``sum_t <g_t, y_t> / valid steps`` (plus each direction's auxiliary loss), memory-lean.

        A loss that is not a sum over steps (CTC) reaches the lean path as this linear surrogate, with
        ``g = dL/dy`` (times the valid steps) from a forward pass: the sum's gradient is each
        direction's own lean gradient, the backward one's with ``g`` reversed as its input is.

        Args:
            inputs: ``x`` (batch, T, features).
            step_gradients: ``g`` (batch, T, output width), without gradient.
            mask: boolean (batch, T) mask of valid steps.
            return_input_gradients: also return the gradient with respect to ``inputs`` (both directions').

        Returns:
            ``(loss, gradients)``: the surrogate's value and its gradients, aligned with
            ``self.trainable_variables`` (the forward layer's, then the backward one's); with
            ``return_input_gradients``, ``(loss, gradients, input_gradients)``.
        """
        if not self.forward.output_units:
            raise ValueError("linear_gradients needs output_units: the surrogate is over the summed heads")
        lengths = self._lengths(inputs, mask)

        def surrogate(g: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            return tf.reduce_sum(g * y, axis=-1)

        forward_loss, forward_grads, *forward_input = self.forward.loss_and_gradients(
            inputs, step_gradients, surrogate, mask=mask, return_input_gradients=return_input_gradients)
        backward_loss, backward_grads, *backward_input = self.backward.loss_and_gradients(
            _reverse_valid(inputs, lengths), _reverse_valid(step_gradients, lengths), surrogate, mask=mask,
            return_input_gradients=return_input_gradients)
        loss, grads = forward_loss + backward_loss, [*forward_grads, *backward_grads]
        if not return_input_gradients:
            return loss, grads
        return loss, grads, forward_input[0] + _reverse_valid(backward_input[0], lengths)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "layer": keras.saving.serialize_keras_object(self.forward)}
