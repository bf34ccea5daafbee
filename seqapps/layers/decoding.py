"""In-graph decoding for generative models: greedy search, sampling and beam search.

Every decoder drives a step function in one ``tf.while_loop`` of core TensorFlow
ops (no tensorflow-addons, no ``GatherTree``), so it traces inside a
``tf.function`` and runs from a SavedModel in a process that imports only
TensorFlow. ``max_length`` may be a Python int or an int32 tensor.

The step function::

    step_fn(ids, state, step) -> (logits, new_state)
        ids:    int32 [n], the tokens fed at this step
        state:  a nested structure of [n, ...] tensors
        step:   int32 scalar, 0 for the first generated token
        logits: float [n, V], scores of the next token

``n`` is the batch for ``greedy_search`` and ``sample`` and batch x beam_size
for ``beam_search``.

Output conventions:

- ``ids`` hold the generated tokens only (not ``start_ids``). A sequence stops at
  its first ``end_id``, which is kept; every later position is ``end_id``.
  An ``end_id`` outside ``[0, V)`` (for example -1) never ends a sequence.
- The time axis is as long as the loop ran: ``max_length``, or fewer steps when
  every sequence (every beam) ended earlier.
- The *length* of a sequence counts its generated tokens up to and including
  the first ``end_id``; a sequence that never ends has length ``max_length``.
  The GNMT length penalty of beam search is ``((5 + length) / 6) ** alpha``.
- Log-probabilities are natural logs under the model's distribution
  ``log_softmax(logits)`` (before temperature, top-k or top-p), summed over the
  tokens up to and including the first ``end_id``.

Decoding strategies as in OpenNMT-tf ``opennmt/utils/decoding.py``; the beam
search keeps whole token histories and reorders them, and the state, with
``tf.gather`` on the parent beam indices.
"""
from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

StepFn = Callable[[tf.Tensor, Any, tf.Tensor], tuple[tf.Tensor, Any]]


def greedy_search(step_fn: StepFn, start_ids: tf.Tensor, initial_state: Any, max_length: int | tf.Tensor,
                  end_id: int) -> tuple[tf.Tensor, tf.Tensor]:
    """Decodes by taking the likeliest token at every step (ties: the lowest id).

    Args:
        step_fn: ``(ids, state, step) -> (logits, new_state)``, see the module docstring.
        start_ids: int32 ``[batch]``, the first tokens fed.
        initial_state: nested ``[batch, ...]`` tensors.
        max_length: the most tokens generated per sequence.
        end_id: the token that ends a sequence.

    Returns:
        ``(ids, log_probs)``: int32 ``[batch, T]`` with ``T <= max_length``, and float32 ``[batch]``.
    """
    return _decode(step_fn, start_ids, initial_state, max_length, end_id,
                   lambda logits, step: tf.argmax(logits, axis=-1, output_type=tf.int32))


def sample(step_fn: StepFn, start_ids: tf.Tensor, initial_state: Any, max_length: int | tf.Tensor, end_id: int,
           temperature: float | tf.Tensor = 1.0, top_k: int | tf.Tensor = 0, top_p: float | tf.Tensor = 1.0,
           seed: int | None = None) -> tuple[tf.Tensor, tf.Tensor]:
    """Decodes by sampling every token from the tempered, truncated distribution.

    At each step the logits are divided by ``temperature``, restricted to the
    ``top_k`` likeliest tokens, then to the smallest set of likeliest tokens whose
    probability (renormalised after top-k) reaches ``top_p`` (the nucleus; tokens
    tied with the last one kept are kept too), and one token is drawn.
    ``temperature``, ``top_k`` and ``top_p`` are scalars or per-row ``[batch]``
    values. A row with ``temperature <= 0`` takes the argmax, as ``greedy_search``.

    Args:
        step_fn, start_ids, initial_state, max_length, end_id: as ``greedy_search``.
        temperature: > 0 to sample (1: the model's distribution), <= 0 for the argmax.
        top_k: keep only the k likeliest tokens (0: all).
        top_p: keep the nucleus of this probability mass (1: all).
        seed: None draws fresh randomness on every call; an int makes the draws a
            function of ``(seed, step)`` (stateless ops), so runs repeat exactly.

    Returns:
        ``(ids, log_probs)`` as ``greedy_search``.
    """

    def choose(logits: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
        rows = tf.shape(logits)[0]
        temp = _per_row(temperature, tf.float32, rows)
        filtered = logits / tf.where(temp > 0, temp, 1.0)[:, None]
        if not (isinstance(top_k, int) and top_k == 0):  # a filter runs only where some row asks for it
            filtered = _top_k_filter(filtered, _per_row(top_k, tf.int32, rows))
        if not (isinstance(top_p, (int, float)) and top_p >= 1):
            p = _per_row(top_p, tf.float32, rows)
            filtered = tf.cond(tf.reduce_any(p < 1), lambda: _top_p_filter(filtered, p), lambda: filtered)
        if seed is None:
            drawn = tf.random.categorical(filtered, 1, dtype=tf.int32)[:, 0]
        else:
            drawn = tf.random.stateless_categorical(filtered, 1, seed=tf.stack([tf.constant(seed, tf.int32), step]),
                                                    dtype=tf.int32)[:, 0]
        return tf.where(temp > 0, drawn, tf.argmax(logits, axis=-1, output_type=tf.int32))

    return _decode(step_fn, start_ids, initial_state, max_length, end_id, choose)


def beam_search(step_fn: StepFn, start_ids: tf.Tensor, initial_state: Any, beam_size: int,
                max_length: int | tf.Tensor, end_id: int, length_penalty: float = 0.0) -> tuple[tf.Tensor, tf.Tensor]:
    """Keeps the ``beam_size`` best hypotheses per row at every step.

    A hypothesis' score is its summed log-probability divided by
    ``((5 + length) / 6) ** length_penalty`` (GNMT; 0 means no normalisation).
    Each step ranks the extensions of the alive hypotheses together with the
    finished ones, which stay in the beam unchanged (their only continuation is
    ``end_id`` at no cost). The loop ends at ``max_length`` or when every beam has
    finished. Slots that no hypothesis can fill (fewer distinct sequences than
    beams) score ``-inf``.

    Args:
        step_fn: ``(ids, state, step) -> (logits, new_state)`` over ``batch * beam_size`` rows
            (row ``b * beam_size + k`` is beam k of batch row b).
        start_ids: int32 ``[batch]``, the first tokens fed.
        initial_state: nested ``[batch, ...]`` tensors (repeated for each beam).
        beam_size: hypotheses kept per row (a Python int >= 1).
        max_length: the most tokens generated per hypothesis.
        end_id: the token that ends a hypothesis.
        length_penalty: alpha of the GNMT length penalty (>= 0).

    Returns:
        ``(ids, scores)``: int32 ``[batch, beam_size, T]`` and float32 ``[batch, beam_size]``,
        best first.
    """
    if int(beam_size) != beam_size or beam_size < 1:
        raise ValueError(f"beam_size must be an integer >= 1, got {beam_size!r}")
    if length_penalty < 0:
        raise ValueError(f"length_penalty must be >= 0, got {length_penalty!r}")
    beam_size = int(beam_size)
    start_ids = tf.convert_to_tensor(start_ids, tf.int32)
    batch = tf.shape(start_ids)[0]
    max_length = tf.convert_to_tensor(max_length, tf.int32)

    def penalty(lengths: tf.Tensor) -> tf.Tensor:
        return ((5.0 + tf.cast(lengths, tf.float32)) / 6.0) ** length_penalty

    def body(step, ids, state, log_probs, lengths, finished, sequences):
        logits, state = step_fn(ids, state, step)
        vocab = tf.shape(logits)[-1]
        step_log_probs = tf.reshape(tf.nn.log_softmax(tf.cast(logits, tf.float32)), [batch, beam_size, vocab])
        only_end = tf.where(tf.range(vocab) == end_id, 0.0, float("-inf"))  # a finished beam's one continuation
        step_log_probs = tf.where(finished[..., None], only_end, step_log_probs)
        totals = log_probs[..., None] + step_log_probs
        new_lengths = lengths + tf.cast(~finished, tf.int32)
        scores = totals / penalty(new_lengths)[..., None]
        best = tf.math.top_k(tf.reshape(scores, [batch, beam_size * vocab]), k=beam_size)
        parents, tokens = best.indices // vocab, best.indices % vocab
        log_probs = tf.gather(tf.reshape(totals, [batch, -1]), best.indices, batch_dims=1)
        lengths = tf.gather(new_lengths, parents, batch_dims=1)
        finished = tf.gather(finished, parents, batch_dims=1) | (tokens == end_id)
        sequences = tf.concat([tf.gather(sequences, parents, batch_dims=1), tokens[..., None]], axis=2)
        flat_parents = tf.reshape(parents + tf.range(batch)[:, None] * beam_size, [-1])
        state = tf.nest.map_structure(lambda s: tf.gather(s, flat_parents), state)
        return step + 1, tf.reshape(tokens, [-1]), state, log_probs, lengths, finished, sequences

    first = tf.concat([tf.zeros([1]), tf.fill([beam_size - 1], float("-inf"))], axis=0)  # one start, not k copies
    loop_vars = (tf.constant(0), tf.repeat(start_ids, beam_size),
                 tf.nest.map_structure(lambda s: tf.repeat(s, beam_size, axis=0), initial_state),
                 tf.tile(first[None], [batch, 1]), tf.zeros([batch, beam_size], tf.int32),
                 tf.zeros([batch, beam_size], tf.bool), tf.zeros([batch, beam_size, 0], tf.int32))
    invariants = (*tf.nest.map_structure(_any_rows, loop_vars[:-1]), tf.TensorShape([None, beam_size, None]))
    _, _, _, log_probs, lengths, _, sequences = tf.while_loop(
        lambda step, *rest: (step < max_length) & ~tf.reduce_all(rest[4]), body, loop_vars,
        shape_invariants=invariants)
    scores = log_probs / penalty(lengths)
    order = tf.argsort(scores, axis=1, direction="DESCENDING", stable=True)
    return tf.gather(sequences, order, batch_dims=1), tf.gather(scores, order, batch_dims=1)


def advance(step_fn: StepFn, ids: tf.Tensor, lengths: tf.Tensor, initial_state: Any) -> Any:
    """Feeds each row's tokens through ``step_fn`` (a prompt "prefill"), keeping only the state.

    Row ``i`` consumes ``ids[i, :lengths[i]]``; its state stops changing after that.
    Decoding then continues from the returned state.

    Args:
        step_fn: ``(ids, state, step) -> (logits, new_state)``; ``step`` runs 0, 1, ... here too.
        ids: int32 ``[batch, width]``, padded rows.
        lengths: int32 ``[batch]`` in ``[0, width]``.
        initial_state: nested ``[batch, ...]`` tensors.

    Returns:
        The state after each row's tokens.
    """
    ids = tf.convert_to_tensor(ids, tf.int32)
    lengths = tf.convert_to_tensor(lengths, tf.int32)

    def body(step, state):
        _, new_state = step_fn(ids[:, step], state, step)
        active = step < lengths

        def keep(new: tf.Tensor, old: tf.Tensor) -> tf.Tensor:
            return tf.where(tf.reshape(active, [-1] + [1] * (new.shape.rank - 1)), new, old)

        return step + 1, tf.nest.map_structure(keep, new_state, state)

    invariants = tf.nest.map_structure(_any_rows, initial_state)
    _, state = tf.while_loop(lambda step, _: step < tf.reduce_max(tf.concat([lengths, [0]], 0)), body,
                             (tf.constant(0), initial_state), shape_invariants=(tf.TensorShape([]), invariants))
    return state


def _decode(step_fn: StepFn, start_ids: tf.Tensor, initial_state: Any, max_length: int | tf.Tensor, end_id: int,
            choose: Callable[[tf.Tensor, tf.Tensor], tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
    """The one-token-per-row loop shared by greedy search and sampling."""
    start_ids = tf.convert_to_tensor(start_ids, tf.int32)
    batch = tf.shape(start_ids)[0]
    max_length = tf.convert_to_tensor(max_length, tf.int32)

    def body(step, ids, state, log_probs, finished, outputs):
        logits, state = step_fn(ids, state, step)
        logits = tf.cast(logits, tf.float32)
        chosen = choose(logits, step)
        token_log_probs = tf.gather(tf.nn.log_softmax(logits), chosen, batch_dims=1)
        log_probs += tf.where(finished, 0.0, token_log_probs)
        chosen = tf.where(finished, end_id, chosen)
        outputs = tf.concat([outputs, chosen[:, None]], axis=1)
        return step + 1, chosen, state, log_probs, finished | (chosen == end_id), outputs

    loop_vars = (tf.constant(0), start_ids, initial_state, tf.zeros([batch]), tf.zeros([batch], tf.bool),
                 tf.zeros([batch, 0], tf.int32))
    invariants = (*tf.nest.map_structure(_any_rows, loop_vars[:-1]), tf.TensorShape([None, None]))
    _, _, _, log_probs, _, ids = tf.while_loop(
        lambda step, _ids, _state, _lp, finished, _out: (step < max_length) & ~tf.reduce_all(finished),
        body, loop_vars, shape_invariants=invariants)
    return ids, log_probs


def _any_rows(value: tf.Tensor) -> tf.TensorShape:
    """A loop variable's shape with its first (row) dimension left free; the other dimensions stay
    static, which keeps the step's kernels (matmuls of known width) fast."""
    shape = tf.convert_to_tensor(value).shape
    return shape if shape.rank == 0 else tf.TensorShape([None]).concatenate(shape[1:])


def _per_row(value: Any, dtype: tf.DType, rows: tf.Tensor) -> tf.Tensor:
    """A scalar or ``[rows]`` setting as a ``[rows]`` tensor."""
    value = tf.convert_to_tensor(value, dtype)
    return tf.broadcast_to(value, [rows])


def _top_k_filter(logits: tf.Tensor, k: tf.Tensor) -> tf.Tensor:
    """Sets all but each row's ``k`` largest logits (ties at the k-th kept) to -inf; ``k <= 0`` keeps all."""
    vocab = tf.shape(logits)[-1]
    k = tf.minimum(k, vocab)
    largest = tf.math.top_k(logits, k=tf.maximum(tf.reduce_max(k), 1)).values  # only as many as a row asks for
    kth = tf.where(k > 0, tf.gather(largest, tf.maximum(k, 1) - 1, batch_dims=1), float("-inf"))
    return tf.where(logits < kth[:, None], float("-inf"), logits)


def _top_p_filter(logits: tf.Tensor, p: tf.Tensor) -> tf.Tensor:
    """Keeps each row's smallest set of likeliest tokens whose probability reaches ``p`` (ties kept)."""
    ordered = tf.sort(logits, axis=-1, direction="DESCENDING")
    before = tf.cumsum(tf.nn.softmax(ordered), axis=-1, exclusive=True)  # mass of the tokens ahead of each
    kept = tf.reduce_sum(tf.cast(before < p[:, None], tf.int32), axis=-1)
    kept = tf.where(p >= 1.0, tf.shape(logits)[-1], kept)  # rounding must not drop the tail at p = 1
    threshold = tf.gather(ordered, tf.maximum(kept, 1) - 1, batch_dims=1)
    return tf.where(logits < threshold[:, None], float("-inf"), logits)
