"""In-graph decoding for generative models: one loop, and strategies that choose the tokens.

``dynamic_decode`` drives a step function in one ``tf.while_loop`` of core TensorFlow ops
(no tensorflow-addons, no ``GatherTree``), so it traces inside a ``tf.function`` and runs
from a SavedModel in a process that imports only TensorFlow. A ``DecodingStrategy`` decides,
at every step, each hypothesis' next token and the hypothesis it extends (its parent):
``GreedySearch``, ``Sampling`` (temperature, top-k, top-p) and ``BeamSearch`` (GNMT length
penalty). The loop reorders the state, the token histories and the attention history by
the parents, as OpenNMT-tf ``opennmt/utils/decoding.py`` does; a new decoding method is one
subclass. ``greedy_search``, ``sample`` and ``beam_search`` are the strategies' functional
forms. ``max_length`` may be a Python int or an int32 tensor.

The step function::

    step_fn(ids, state, step) -> (logits, new_state)            or, collecting attention,
    step_fn(ids, state, step) -> (logits, new_state, attention)
        ids:       int32 [n], the tokens fed at this step
        state:     a nested structure of [n, ...] tensors
        step:      int32 scalar, 0 for the first generated token
        logits:    float [n, V], scores of the next token
        attention: float [n, S], the step's attention weights over a memory of S positions

``n`` is batch x hypotheses: row ``b * H + k`` is hypothesis k of batch row b (``H`` is the
strategy's ``hypotheses``: 1 for greedy search and sampling, the beam size for beam search).

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
- The attention history holds, for every generated token, the weights of the step that
  chose it; it is reordered with the hypotheses, so it belongs to the returned sequences.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Mapping

import tensorflow as tf

StepFn = Callable[[tf.Tensor, Any, tf.Tensor], tuple]


@dataclasses.dataclass
class Hypotheses:
    """What ``dynamic_decode`` found, best first per batch row.

    Attributes:
        ids: int32 ``[batch, H, T]``, the generated tokens.
        scores: float32 ``[batch, H]``, the strategy's ranking scores (beam search: the
            log-probabilities divided by the length penalty; otherwise the log-probabilities).
        log_probs: float32 ``[batch, H]``, the summed log-probabilities.
        lengths: int32 ``[batch, H]``, tokens up to and including the first end token.
        attention: float32 ``[batch, H, T, S]``, each token's attention weights, or None when
            the step function gives none.
    """

    ids: tf.Tensor
    scores: tf.Tensor
    log_probs: tf.Tensor
    lengths: tf.Tensor
    attention: tf.Tensor | None = None


class DecodingStrategy:
    """Chooses every hypothesis' next token and the hypothesis it extends; subclass to add a method.

    A subclass sets ``hypotheses`` (per batch row) and implements ``step``. Serving signatures
    build a strategy per request with ``from_request`` (``seqapps.generation.STRATEGIES``):
    ``request_inputs`` names the per-row inputs the signature adds for it, each with an example value.
    """

    hypotheses: int = 1
    #: input name -> (dtype, example value) of the per-row inputs a serving signature adds
    request_inputs: ClassVar[dict[str, tuple[tf.DType, Any]]] = {}
    #: the float settings (attributes) a traced decoding may take as scalar tensors: strategies that
    #: differ only in them decode in one graph (``seqapps.generation.generate_texts``)
    tensor_settings: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_request(cls, settings: Mapping[str, Any], inputs: Mapping[str, tf.Tensor]) -> "DecodingStrategy":
        """The strategy a serving signature decodes with.

        Args:
            settings: the export's decoding settings (``beam_size``, ``length_penalty``, ...).
            inputs: the request's raw inputs, ``request_inputs`` among them.
        """
        return cls()

    def initial_log_probs(self, batch: tf.Tensor) -> tf.Tensor:
        """float32 ``[batch, H]``: the starting log-probability of each hypothesis (default 0)."""
        return tf.zeros([batch, self.hypotheses])

    def step(self, step: tf.Tensor, logits: tf.Tensor, log_probs: tf.Tensor, totals: tf.Tensor,
             lengths: tf.Tensor, finished: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Chooses the next tokens.

        Args:
            step: int32 scalar, 0 for the first generated token.
            logits: float32 ``[batch, H, V]``, the step function's logits.
            log_probs: float32 ``[batch, H, V]``, ``log_softmax(logits)``, except that a finished
                hypothesis' row is 0 at the end token and -inf elsewhere (its one continuation).
            totals: float32 ``[batch, H, V]``, each extension's summed log-probability.
            lengths: int32 ``[batch, H]``, each hypothesis' length once extended.
            finished: bool ``[batch, H]``, the hypotheses that have ended.

        Returns:
            ``(parents, tokens)``: int32 ``[batch, H]``, the hypothesis each new one extends and its token.
        """
        raise NotImplementedError

    def scores(self, log_probs: tf.Tensor, lengths: tf.Tensor) -> tf.Tensor:
        """float32 ``[batch, H]``: the final ranking scores (default: the log-probabilities)."""
        return log_probs


def _one_per_row(tokens: tf.Tensor, log_probs: tf.Tensor, finished: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """``(parents, tokens)`` of a one-hypothesis strategy: each row extends itself, and a finished row
    takes its one continuation, the end token (the only finite entry of its ``log_probs``)."""
    tokens = tf.where(finished, tf.argmax(log_probs, axis=-1, output_type=tf.int32), tokens)
    return tf.zeros_like(tokens), tokens


class GreedySearch(DecodingStrategy):
    """Takes the likeliest token at every step (ties: the lowest id)."""

    def step(self, step: tf.Tensor, logits: tf.Tensor, log_probs: tf.Tensor, totals: tf.Tensor,
             lengths: tf.Tensor, finished: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return _one_per_row(tf.argmax(logits, axis=-1, output_type=tf.int32), log_probs, finished)


class Sampling(DecodingStrategy):
    """Samples every token from the tempered, truncated distribution.

    At each step the logits are divided by ``temperature``, restricted to the
    ``top_k`` likeliest tokens, then to the smallest set of likeliest tokens whose
    probability (renormalised after top-k) reaches ``top_p`` (the nucleus; tokens
    tied with the last one kept are kept too), and one token is drawn.
    ``temperature``, ``top_k`` and ``top_p`` are scalars or per-row ``[batch]``
    values. A row with ``temperature <= 0`` takes the argmax, as ``GreedySearch``.

    Args:
        temperature: > 0 to sample (1: the model's distribution), <= 0 for the argmax.
        top_k: keep only the k likeliest tokens (0: all).
        top_p: keep the nucleus of this probability mass (1: all).
        seed: None draws fresh randomness on every call; an int makes the draws a
            function of ``(seed, step)`` (stateless ops), so runs repeat exactly.
    """

    def __init__(self, temperature: float | tf.Tensor = 1.0, top_k: int | tf.Tensor = 0,
                 top_p: float | tf.Tensor = 1.0, seed: int | None = None) -> None:
        self.temperature, self.top_k, self.top_p, self.seed = temperature, top_k, top_p, seed

    def step(self, step: tf.Tensor, logits: tf.Tensor, log_probs: tf.Tensor, totals: tf.Tensor,
             lengths: tf.Tensor, finished: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        logits = logits[:, 0, :]
        rows = tf.shape(logits)[0]
        temp = _per_row(self.temperature, tf.float32, rows)
        filtered = logits / tf.where(temp > 0, temp, 1.0)[:, None]
        if not (isinstance(self.top_k, int) and self.top_k == 0):  # a filter runs only where some row asks for it
            filtered = _top_k_filter(filtered, _per_row(self.top_k, tf.int32, rows))
        if not (isinstance(self.top_p, (int, float)) and self.top_p >= 1):
            p = _per_row(self.top_p, tf.float32, rows)
            filtered = tf.cond(tf.reduce_any(p < 1), lambda: _top_p_filter(filtered, p), lambda: filtered)
        if self.seed is None:
            drawn = tf.random.categorical(filtered, 1, dtype=tf.int32)[:, 0]
        else:
            drawn = tf.random.stateless_categorical(
                filtered, 1, seed=tf.stack([tf.constant(self.seed, tf.int32), step]), dtype=tf.int32)[:, 0]
        chosen = tf.where(temp > 0, drawn, tf.argmax(logits, axis=-1, output_type=tf.int32))
        return _one_per_row(chosen[:, None], log_probs, finished)


class BeamSearch(DecodingStrategy):
    """Keeps the ``beam_size`` best hypotheses per row at every step.

    A hypothesis' score is its summed log-probability divided by
    ``((5 + length) / 6) ** length_penalty`` (GNMT; 0 means no normalisation).
    Each step ranks the extensions of the alive hypotheses together with the
    finished ones, which stay in the beam unchanged (their only continuation is
    the end token at no cost). Slots that no hypothesis can fill (fewer distinct
    sequences than beams) score ``-inf``.

    Args:
        beam_size: hypotheses kept per row (a Python int >= 1).
        length_penalty: alpha of the GNMT length penalty (>= 0).

    Raises:
        ValueError: a beam size below 1 or a negative length penalty.
    """

    tensor_settings = ("length_penalty",)

    def __init__(self, beam_size: int, length_penalty: float = 0.0) -> None:
        if int(beam_size) != beam_size or beam_size < 1:
            raise ValueError(f"beam_size must be an integer >= 1, got {beam_size!r}")
        if length_penalty < 0:
            raise ValueError(f"length_penalty must be >= 0, got {length_penalty!r}")
        self.hypotheses, self.length_penalty = int(beam_size), float(length_penalty)

    @classmethod
    def from_request(cls, settings: Mapping[str, Any], inputs: Mapping[str, tf.Tensor]) -> "BeamSearch":
        return cls(int(settings["beam_size"]), float(settings["length_penalty"]))

    def initial_log_probs(self, batch: tf.Tensor) -> tf.Tensor:
        first = tf.concat([tf.zeros([1]), tf.fill([self.hypotheses - 1], float("-inf"))], axis=0)  # one start
        return tf.tile(first[None], [batch, 1])

    def _penalty(self, lengths: tf.Tensor) -> tf.Tensor:
        return ((5.0 + tf.cast(lengths, tf.float32)) / 6.0) ** self.length_penalty

    def step(self, step: tf.Tensor, logits: tf.Tensor, log_probs: tf.Tensor, totals: tf.Tensor,
             lengths: tf.Tensor, finished: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        batch, vocab = tf.shape(totals)[0], tf.shape(totals)[2]
        scores = totals / self._penalty(lengths)[..., None]
        best = tf.math.top_k(tf.reshape(scores, [batch, self.hypotheses * vocab]), k=self.hypotheses)
        return best.indices // vocab, best.indices % vocab

    def scores(self, log_probs: tf.Tensor, lengths: tf.Tensor) -> tf.Tensor:
        return log_probs / self._penalty(lengths)


def dynamic_decode(step_fn: StepFn, strategy: DecodingStrategy, start_ids: tf.Tensor, initial_state: Any,
                   max_length: int | tf.Tensor, end_id: int,
                   attention_size: int | tf.Tensor | None = None) -> Hypotheses:
    """Decodes with ``strategy`` until ``max_length`` tokens or until every hypothesis has ended.

    Args:
        step_fn: ``(ids, state, step) -> (logits, new_state[, attention])`` over ``batch * H`` rows,
            see the module docstring.
        strategy: chooses the tokens.
        start_ids: int32 ``[batch]``, the first tokens fed.
        initial_state: nested ``[batch, ...]`` tensors (repeated for each hypothesis).
        max_length: the most tokens generated per sequence.
        end_id: the token that ends a sequence.
        attention_size: the memory length S when ``step_fn`` returns attention weights to collect
            (None: it returns none).

    Returns:
        The hypotheses, best first per row.
    """
    hypotheses = strategy.hypotheses
    start_ids = tf.convert_to_tensor(start_ids, tf.int32)
    batch = tf.shape(start_ids)[0]
    max_length = tf.convert_to_tensor(max_length, tf.int32)
    collect = attention_size is not None

    def body(step, ids, state, log_probs, lengths, finished, sequences, history):
        logits, state, *attention = step_fn(ids, state, step)
        logits = tf.cast(logits, tf.float32)
        vocab = tf.shape(logits)[-1]
        logits = tf.reshape(logits, [batch, hypotheses, vocab])
        step_log_probs = tf.nn.log_softmax(logits)
        only_end = tf.where(tf.range(vocab) == end_id, 0.0, float("-inf"))  # a finished hypothesis' continuation
        step_log_probs = tf.where(finished[..., None], only_end, step_log_probs)
        totals = log_probs[..., None] + step_log_probs
        new_lengths = lengths + tf.cast(~finished, tf.int32)
        parents, tokens = strategy.step(step, logits, step_log_probs, totals, new_lengths, finished)
        log_probs = tf.gather(tf.reshape(totals, [batch, -1]), parents * vocab + tokens, batch_dims=1)
        lengths = tf.gather(new_lengths, parents, batch_dims=1)
        finished = tf.gather(finished, parents, batch_dims=1) | (tokens == end_id)
        sequences = tf.concat([tf.gather(sequences, parents, batch_dims=1), tokens[..., None]], axis=2)
        if collect:
            weights = tf.reshape(tf.cast(attention[0], tf.float32), [batch, hypotheses, 1, -1])  # the parents'
            history = tf.gather(tf.concat([history, weights], axis=2), parents, batch_dims=1)
        flat_parents = tf.reshape(parents + tf.range(batch)[:, None] * hypotheses, [-1])
        state = tf.nest.map_structure(lambda s: tf.gather(s, flat_parents), state)
        return step + 1, tf.reshape(tokens, [-1]), state, log_probs, lengths, finished, sequences, history

    history = tf.zeros([batch, hypotheses, 0, attention_size if collect else 0])
    loop_vars = (tf.constant(0), tf.repeat(start_ids, hypotheses),
                 tf.nest.map_structure(lambda s: tf.repeat(s, hypotheses, axis=0), initial_state),
                 strategy.initial_log_probs(batch), tf.zeros([batch, hypotheses], tf.int32),
                 tf.zeros([batch, hypotheses], tf.bool), tf.zeros([batch, hypotheses, 0], tf.int32), history)
    invariants = (*tf.nest.map_structure(_any_rows, loop_vars[:-2]), tf.TensorShape([None, hypotheses, None]),
                  tf.TensorShape([None, hypotheses, None, None]))
    _, _, _, log_probs, lengths, _, sequences, history = tf.while_loop(
        lambda step, *rest: (step < max_length) & ~tf.reduce_all(rest[4]), body, loop_vars,
        shape_invariants=invariants)
    scores = strategy.scores(log_probs, lengths)
    order = tf.argsort(scores, axis=1, direction="DESCENDING", stable=True)

    def best_first(value: tf.Tensor) -> tf.Tensor:
        return tf.gather(value, order, batch_dims=1)

    return Hypotheses(best_first(sequences), best_first(scores), best_first(log_probs), best_first(lengths),
                      best_first(history) if collect else None)


def greedy_search(step_fn: StepFn, start_ids: tf.Tensor, initial_state: Any, max_length: int | tf.Tensor,
                  end_id: int) -> tuple[tf.Tensor, tf.Tensor]:
    """``dynamic_decode`` with ``GreedySearch``: ``(ids [batch, T], log_probs [batch])``, ``T <= max_length``.

    Args:
        step_fn: ``(ids, state, step) -> (logits, new_state)``, see the module docstring.
        start_ids: int32 ``[batch]``, the first tokens fed.
        initial_state: nested ``[batch, ...]`` tensors.
        max_length: the most tokens generated per sequence.
        end_id: the token that ends a sequence.
    """
    found = dynamic_decode(step_fn, GreedySearch(), start_ids, initial_state, max_length, end_id)
    return found.ids[:, 0], found.log_probs[:, 0]


def sample(step_fn: StepFn, start_ids: tf.Tensor, initial_state: Any, max_length: int | tf.Tensor, end_id: int,
           temperature: float | tf.Tensor = 1.0, top_k: int | tf.Tensor = 0, top_p: float | tf.Tensor = 1.0,
           seed: int | None = None) -> tuple[tf.Tensor, tf.Tensor]:
    """``dynamic_decode`` with ``Sampling``: ``(ids [batch, T], log_probs [batch])`` as ``greedy_search``.

    Args:
        step_fn, start_ids, initial_state, max_length, end_id: as ``greedy_search``.
        temperature, top_k, top_p, seed: as ``Sampling``.
    """
    found = dynamic_decode(step_fn, Sampling(temperature, top_k, top_p, seed), start_ids, initial_state,
                           max_length, end_id)
    return found.ids[:, 0], found.log_probs[:, 0]


def beam_search(step_fn: StepFn, start_ids: tf.Tensor, initial_state: Any, beam_size: int,
                max_length: int | tf.Tensor, end_id: int, length_penalty: float = 0.0) -> tuple[tf.Tensor, tf.Tensor]:
    """``dynamic_decode`` with ``BeamSearch``: ``(ids [batch, beam_size, T], scores [batch, beam_size])``, best first.

    Args:
        step_fn: ``(ids, state, step) -> (logits, new_state)`` over ``batch * beam_size`` rows.
        start_ids, initial_state, max_length, end_id: as ``greedy_search``.
        beam_size, length_penalty: as ``BeamSearch``.
    """
    found = dynamic_decode(step_fn, BeamSearch(beam_size, length_penalty), start_ids, initial_state, max_length,
                           end_id)
    return found.ids, found.scores


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
