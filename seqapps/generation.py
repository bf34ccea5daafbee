"""One sequence-to-sequence generator, shared by translation and captioning.

``Generator`` runs a trained ``AttentionDecoder``, its output layer (and, for translation, its
``LexiconBias``) through ``seqapps.layers.decoding.dynamic_decode`` with any decoding strategy,
collecting each token's attention weights while it decodes (no second, teacher-forced pass), and
turns the ids into words and texts with the target vocabulary's in-graph lookup.

``STRATEGIES`` maps serving signature names to decoding strategies: ``serving_default`` is greedy
search, ``beam`` beam search. ``strategy_signatures`` builds one export signature per entry for
a pipeline, so a decoding method added there (one ``DecodingStrategy`` subclass) is served by
every pipeline built on the generator, with no change to the pipeline modules. A one-hypothesis
strategy's signature returns ``<text>`` and ``score`` (log-probability per token, the end token
included); a beam's returns ``<texts> [batch, H]`` (best first) and ``scores`` (the strategy's).
"""
from __future__ import annotations

import copy
import dataclasses
import weakref
from typing import Any, Callable, Mapping, Sequence

import keras
import numpy as np
import tensorflow as tf

from seqapps.export import Signature
from seqapps.layers import decoding
from seqapps.layers.attention_decoder import AttentionDecoder

#: serving signature name -> the strategy it decodes with (``DecodingStrategy.from_request`` builds it)
STRATEGIES: dict[str, type[decoding.DecodingStrategy]] = {
    "serving_default": decoding.GreedySearch,
    "beam": decoding.BeamSearch,
}


@dataclasses.dataclass
class Generation:
    """What a pipeline generated for one batch.

    Attributes:
        hypotheses: the decoder's hypotheses (``[batch, H, ...]``, best first).
        words: string ``[batch, H, T]``, the words of each hypothesis, ``""`` from its end on.
        valid: bool ``[batch]``, the rows that had something to generate from (others score 0),
            or None for all.
    """

    hypotheses: decoding.Hypotheses
    words: tf.Tensor
    valid: tf.Tensor | None = None


class Generator(tf.Module):
    """A trained attention decoder and its output layer as in-graph generation, words out.

    Args:
        decoder: the trained decoder.
        output: the output layer: ``output(hidden [n, 1, H])`` gives log-probabilities ``[n, 1, V]``
            (``BatchNCE`` called without targets).
        lookup: the target vocabulary's in-graph lookup (``Vocabulary.lookup()``).
        tokenizer: the target side's ``seqapps.data.text.Tokenizer``, for ``texts``.
        start_id, end_id: the ids that start and end a word sequence (``end_id`` also pads).
        lexicon: optional ``seqapps.layers.lexicon.LexiconBias`` whose bias under each step's attention
            is added to the output's logits; the decoder state then holds the source ids as ``"source_ids"``.
    """

    def __init__(self, decoder: AttentionDecoder, output: keras.layers.Layer, lookup: tf.Module, tokenizer: Any,
                 start_id: int, end_id: int, lexicon: keras.layers.Layer | None = None) -> None:
        super().__init__(name="generator")
        self.decoder, self.output, self.lookup, self.tokenizer = decoder, output, lookup, tokenizer
        self.start_id, self.end_id = int(start_id), int(end_id)
        self.lexicon = lexicon

    def step(self, ids: tf.Tensor, state: dict[str, Any], step: tf.Tensor) -> tuple[tf.Tensor, dict[str, Any],
                                                                                     tf.Tensor]:
        """One decoding step: ``(log-probabilities [n, V], new state, attention [n, S])``."""
        hidden, state, weights = self.decoder.step(ids, state, return_attention=True)
        bias = None if self.lexicon is None else self.lexicon(
            {"attention": weights[:, None, :], "source_ids": state["source_ids"]})
        return self.output(hidden[:, None, :], logit_bias=bias)[:, 0, :], state, weights

    def generate(self, state: dict[str, Any], strategy: decoding.DecodingStrategy, max_length: int | tf.Tensor,
                 attention: bool = False) -> decoding.Hypotheses:
        """Decodes from the decoder state ``{"rnn", "memory"[, "memory_mask", "source_ids"]}``.

        Args:
            state: the encoder's decoder state, ``[batch, ...]`` tensors.
            strategy: the decoding strategy.
            max_length: the most words (the end token included).
            attention: collect each word's attention weights over the memory.

        Returns:
            The hypotheses, ``attention [batch, H, T, S]`` with ``attention=True``.
        """
        memory = state["memory"]
        return decoding.dynamic_decode(self.step, strategy, tf.fill([tf.shape(memory)[0]], self.start_id), state,
                                       max_length, self.end_id, tf.shape(memory)[1] if attention else None)

    def keep(self, ids: tf.Tensor) -> tf.Tensor:
        """True for the words before the first end token (ids ``[..., T]``)."""
        ended = tf.cumsum(tf.cast(ids == self.end_id, tf.int32), axis=-1, exclusive=True) > 0
        return ~ended & (ids != self.end_id)

    def words(self, ids: tf.Tensor) -> tf.Tensor:
        """The words of ``ids [..., T]``, ``""`` from the end token on."""
        return tf.where(self.keep(ids), self.lookup.tokens(ids), "")

    def texts(self, words: tf.Tensor) -> tf.Tensor:
        """Joins the non-empty words of each row of ``words [..., T]`` into one string ``[...]``."""
        flat = tf.reshape(words, [-1, tf.shape(words)[-1]])
        joined = self.tokenizer.tf_join(tf.ragged.boolean_mask(flat, flat != ""))
        return tf.reshape(joined, tf.shape(words)[:-1])

    def outputs(self, generation: Generation, names: tuple[str, str]) -> dict[str, tf.Tensor]:
        """A strategy signature's outputs: ``{text, "score"}`` for one hypothesis, else ``{texts, "scores"}``.

        Args:
            generation: what was generated.
            names: the output names of one text and of the n-best texts (``("caption", "captions")``).
        """
        found, texts = generation.hypotheses, self.texts(generation.words)
        valid = tf.ones(tf.shape(texts)[:1], tf.bool) if generation.valid is None else generation.valid
        if found.ids.shape[1] == 1:
            per_token = found.log_probs[:, 0] / tf.cast(found.lengths[:, 0], tf.float32)
            return {names[0]: texts[:, 0], "score": tf.where(valid, per_token, 0.0)}
        return {names[1]: texts, "scores": tf.where(valid[:, None], found.scores, 0.0)}


GenerateFn = Callable[[Any, decoding.DecodingStrategy], Generation]
"""``generate(model_inputs, strategy) -> Generation``: a pipeline's encoder and decoding for one batch."""


def strategy_signatures(generator: Generator, generate: GenerateFn, preprocess: Callable[[dict[str, tf.Tensor]], Any],
                        settings: Mapping[str, Any], inputs: dict[str, tf.TensorSpec],
                        example: dict[str, np.ndarray], names: tuple[str, str]) -> dict[str, Signature]:
    """One serving signature per entry of ``STRATEGIES``, each decoding with its strategy.

    Args:
        generator: the pipeline's generator.
        generate: the pipeline's encoder and decoding (see ``GenerateFn``).
        preprocess: raw inputs -> what ``generate`` takes.
        settings: the export's decoding settings (``beam_size``, ``length_penalty``), for ``from_request``.
        inputs: the raw inputs every signature takes; a strategy's ``request_inputs`` are added to them.
        example: one small batch of ``inputs``.
        names: the output names of one text and of the n-best texts.

    Returns:
        Signature name -> signature.
    """
    rows = len(next(iter(example.values())))
    signatures = {}
    for name, strategy_class in STRATEGIES.items():
        extra = strategy_class.request_inputs

        def run(raw: dict[str, tf.Tensor], strategy_class: type[decoding.DecodingStrategy] = strategy_class
                ) -> dict[str, tf.Tensor]:
            strategy = strategy_class.from_request(settings, raw)
            return generator.outputs(generate(preprocess(raw), strategy), names)

        signatures[name] = Signature(
            inputs={**inputs, **{key: tf.TensorSpec([None], dtype, name=key) for key, (dtype, _) in extra.items()}},
            example={**example, **{key: np.full(rows, value, dtype.as_numpy_dtype)
                                   for key, (dtype, value) in extra.items()}},
            run=run)
    return signatures


def generate_texts(generator: Generator, generate: GenerateFn, strategies: Sequence[decoding.DecodingStrategy],
                   inputs: Sequence[Any] | np.ndarray, preprocess: Callable[[tf.Tensor], Any] | None = None,
                   batch_size: int = 64, functions: dict[tuple, Callable[..., tf.Tensor]] | None = None
                   ) -> list[list[str]]:
    """The best text of every input with each strategy, decoded in batches (for evaluation).

    Strategies that differ only in their ``tensor_settings`` (beams with several length penalties)
    share one traced function, those settings fed to it as tensors: a calibration over many
    settings traces once, not once per setting.

    Args:
        generator: the pipeline's generator.
        generate: the pipeline's encoder and decoding (see ``GenerateFn``).
        strategies: the decoding strategies.
        inputs: rows of texts or arrays; ``preprocess`` (default: none) turns a batch of them into
            what ``generate`` takes.
        preprocess: batch tensor -> what ``generate`` takes.
        batch_size: rows per call.
        functions: the traced functions of earlier calls with the same ``generator``, ``generate`` and
            ``preprocess``, which this call reuses and adds to (None: none kept).

    Returns:
        One list of texts per strategy, in the order of ``strategies``.
    """
    functions = {} if functions is None else functions
    found = []
    for strategy in strategies:
        settings = {name: tf.constant(getattr(strategy, name), tf.float32) for name in strategy.tensor_settings}
        shape = tuple(sorted((name, value) for name, value in vars(strategy).items() if name not in settings))
        key = (type(strategy), shape)
        if key not in functions:
            def best(batch: tf.Tensor, values: dict[str, tf.Tensor],
                     template: decoding.DecodingStrategy = strategy) -> tf.Tensor:
                chosen = copy.copy(template)
                vars(chosen).update(values)
                return generator.texts(generate(preprocess(batch) if preprocess else batch, chosen).words)[:, 0]

            functions[key] = tf.function(best, reduce_retracing=True)
        found.append([value.decode("utf-8") for start in range(0, len(inputs), batch_size)
                      for value in functions[key](tf.constant(inputs[start: start + batch_size]), settings).numpy()])
    return found


#: each model's evaluation decoder (a pipeline's translator or captioner), the state it was built from and
#: its traced functions: a run's calibration and evaluation, and a fine-tune's evaluations before and after
#: training, trace each strategy once per model, not once per call (the traced functions read the
#: weights as they are at each call). A decoder must not hold its model, or the model is never freed.
_EVALUATION: weakref.WeakKeyDictionary[keras.Model, tuple[str, Any, dict]] = weakref.WeakKeyDictionary()


def evaluation_decoder(model: keras.Model, key: str, build: Callable[[], Any]) -> tuple[Any, dict]:
    """``model``'s evaluation decoder and its traced functions (``generate_texts``'s ``functions``).

    Args:
        model: the training model.
        key: what the decoder reads besides the weights (its part of the pipeline state, as a string);
            another key builds a new decoder.
        build: builds the decoder.

    Returns:
        ``(decoder, functions)``.
    """
    cached = _EVALUATION.get(model)
    if cached is None or cached[0] != key:
        cached = _EVALUATION[model] = (key, build(), {})
    return cached[1], cached[2]


def unicode_texts(values: np.ndarray) -> np.ndarray:
    """A signature's string output (UTF-8 bytes) as a Unicode array of its shape, which NumPy saves without pickles.

    Args:
        values: what a loaded signature returned for a string output (an object array of bytes).

    Returns:
        The same texts, dtype ``str``.
    """
    return np.char.decode(np.asarray(values).astype(bytes), "utf-8")
