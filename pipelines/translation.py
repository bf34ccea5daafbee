"""Sentence translation with an RNN encoder-decoder and attention (Bahdanau et al. 2015; Luong et al. 2015).

Model: an embedding and a stacked bidirectional LSTM or GRU encode the source words; a second LSTM or GRU,
started from the encoder's final states, reads the target words (teacher forcing in training) and
attends over the encoder states at every step, with additive attention (``attention=bahdanau``: Keras'
``AdditiveAttention`` scored by a matrix product, ``seqapps.layers.attention_decoder.AdditiveAttention``) or
dot-product ``Attention`` (``attention=luong``). The decoder state and its context vector go through a
tanh layer (Luong's attentional hidden state) into the output layer, ``seqapps.layers.batch_nce.BatchNCE``:
``output=bnce`` trains it with batch NCE, ``output=softmax`` with the full softmax; evaluation and
serving always use the full softmax over the trained output embedding (PPL^f). With
``lexicon_bias=true`` (Arthur, Neubig & Nakamura 2016, the "bias" method) the output logits get
``log(p_lex + epsilon)``, where ``p_lex`` mixes the IBM Model 1 translation probabilities of the source
words (each word's ``lexicon_top_k`` likeliest, a non-trainable table of the model) by the step's
attention weights (``seqapps.layers.lexicon.LexiconBias``); B-NCE's batch columns get each row's
bias of their words (evaluated at those words only, from the lexicon's mixture), and decoding adds it
at every step.

Tokens: lower-case words with punctuation split (``seqapps.data.text.Tokenizer("word")``), one
vocabulary per language learned from the training pairs (``max_vocab``, ``min_count``). Unknown words
map to ``<unk>``. Both vocabularies ship in the export as asset files. Fine-tuning on new pairs
(``vocabulary=extend``, the default) appends the new words of the training pairs seen ``min_count``
times to each vocabulary (up to ``max_vocab``) and ``adapt_model`` grows the source and target
embeddings, the output layer and the lexicon table with ``seqapps.finetuning.transfer_weights``: the
exported words keep their rows, the new ones start as a fresh model would, and the lexicon is extended,
not refitted: the exported source words keep their IBM Model 1 rows, the new ones get the rows of the
IBM Model 1 fitted on the fine-tuning pairs (as do their ``<unk>`` replacements). ``vocabulary=keep``
keeps the exported vocabularies, new words mapping to ``<unk>``.

Data: English to Spanish verse pairs of the World English Bible (apt ``sword-text-web``) and the
Reina-Valera 1909 (apt ``sword-text-sparv``), both public domain, joined on the verse key, filtered by
length and split by chapter (``seqapps.data.pairs``). The ``tiny`` preset uses number phrases from pip
``num2words``. ``--data pairs.tsv`` reads the user's ``source<TAB>target`` lines (or a ``.csv``),
``--data tfds:NAME`` a translation dataset already in the local tfds data dir; ``reverse=true`` swaps
the direction. Pairs longer than ``max_length`` tokens are dropped, truncated or an error
(``too_long``); the counts are in the run's data report. Each pair is cut to its own length and a training
batch pads only to its longest pair, its weights scaled so that every token counts as in a batch padded to
``max_length`` (``_weigh_as_full_width``: the same objective). ``--set length_sorted_batches=32`` also batches
pairs of similar length together: B-NCE at ``min_count=1`` then trains 1.3x the tokens/s, but both outputs learn
less per epoch (the default's validation loss 1.701 against 1.665 after 6 epochs, beam chrF 41.70 against
44.77), so it is off by default (docs/results.md, "Additive attention as a matrix product, and batches of
similar length").

Metrics: corpus BLEU and chrF (sacrebleu) for greedy and beam search on the test pairs, against
references lower-cased and tokenised as the model's words; PPL^f of the test targets; training
tokens/s timed on a fresh copy of the model (``timing_steps``). Baseline: word-by-word lexical
translation with IBM Model 1 (``seqapps.baselines.LexicalTranslator``, the same fit as the lexicon bias's
table).

Export signatures (all of them plain TensorFlow):

- ``serving_default``: ``text`` (string ``[batch]``) -> ``translation`` (string ``[batch]``) and
  ``score`` (the greedy translation's log-probability per token, its end token included);
- ``beam``: ``text`` -> ``translations`` (string ``[batch, beam_size]``, best first) and ``scores``
  (log-probabilities divided by the GNMT length penalty ``((5 + length) / 6) ** length_penalty``);
- ``align``: ``text`` -> ``translation``, ``source_tokens`` and ``target_tokens`` (padded with ``""``)
  and ``attention`` (``[batch, target, source]``: how much each target word attended to each source word,
  collected while decoding);
- one more per decoding strategy registered in ``seqapps.generation.STRATEGIES``, shaped as ``serving_default``
  (one hypothesis) or ``beam`` (several), with the strategy's request inputs.

Report (``report.html``): BLEU and chrF of greedy and beam search beside the lexical baseline, a heatmap of
``align``'s attention for the first few test sentences, and the sample translations.

The beam's length penalty is chosen on the validation pairs by ``calibrate`` (``length_penalty_choices``).
An empty (or all-blank) text translates to ``""`` with score 0. Source texts are cut to ``max_length``
words and translations to ``max_decode_length`` words, so a 1 MB request costs what a long sentence
does; the server refuses texts over ``max_string_bytes`` (the export's limits).
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import keras
import numpy as np
import tensorflow as tf

from seqapps import metrics as seqapps_metrics
from seqapps import predictions
from seqapps.baselines import LexicalTranslator
from seqapps.config import SEQ2SEQ_ATTENTIONS, Seq2SeqConfig, require, require_split_fractions
from seqapps.data import datasets, samples
from seqapps.data import pairs as pair_data
from seqapps.data import splits as split_rule
from seqapps.data import text as text_data
from seqapps.export import ExportCalls, Limits, ServingModule, Signature
from seqapps.finetuning import VOCABULARY_CHOICES, VocabularyMap, grow_vocabulary, transfer_weights, vocabulary_report
from seqapps.generation import (Generation, Generator, evaluation_decoder, generate_texts, strategy_signatures,
                                unicode_texts)
from seqapps.layers.attention_decoder import CELLS, AttentionDecoder, PaddingMask
from seqapps.layers.decoding import BeamSearch, DecodingStrategy, GreedySearch
from seqapps.layers.batch_nce import BatchNCE, unigram_distribution
from seqapps.layers.lexicon import LexiconBias
from seqapps.losses import per_token_training_loss
from seqapps.pipeline import SPLIT_COUNTS, VOCABULARIES, Headline, Pipeline, Splits
from seqapps.report import plots
from seqapps.report.document import Section, Table, Text
from seqapps.training import training_tokens_per_second

CORPORA = ("bible", "numbers")
END = text_data.END_OF_SENTENCE
START = "<s>"
END_ID, START_ID = 1, 2  # ids right after <unk> in both vocabularies; END also pads
TOKENIZER = text_data.Tokenizer("word")
SAMPLES = 5  # test translations shown beside their references
REPORT_SENTENCES = 4  # test sentences whose attention the report draws (the first samples)
VOCABULARY_KEYS = ("source_vocabulary", "target_vocabulary")  # in the pipeline state


@dataclasses.dataclass
class TranslationConfig(Seq2SeqConfig):
    """Encoder-decoder settings; the decoder's and its generator's are ``Seq2SeqConfig``'s.

    Attributes:
        corpus: default data when no ``--data`` is given: "bible" (WEB -> RV1909) or "numbers" (num2words).
        num_pairs, max_number: the number phrases of the "numbers" corpus (how many, below which number).
        reverse: translate the other way (Spanish to English for the default data).
        max_length: the most word tokens of a source or target sentence.
        too_long: pairs over ``max_length``: "reject" (drop), "truncate" or "error".
        max_ratio: drop pairs whose token counts differ by more than this factor (misaligned verses).
        split_by: hold out whole "chapter"s or "book"s of verse pairs ("pair" for any data).
        val_fraction, test_fraction: shares of the groups held out (``seqapps.data.splits``).
        max_vocab: the most words per language, special tokens included (None: all).
        min_count: rarer training words map to ``<unk>`` (at fine-tuning: new words rarer than this are not added).
        vocabulary: at fine-tuning, "extend" adds the new words of the training pairs to both vocabularies,
            "keep" keeps the export's (new words become ``<unk>``).
        embedding_dim: word embedding size of both languages.
        units: decoder units (an even number); each direction of the encoder has ``units // 2``.
        encoder_layers: stacked bidirectional encoder layers.
        attention: "bahdanau" (additive) or "luong" (dot product); the lexicon bias and the
            ``<unk>`` replacement read it, so there is no "none".
        lexicon_bias: add ``log(p_lex + lexicon_epsilon)`` to the output logits, ``p_lex`` being IBM
            Model 1's translation probabilities of the source words mixed by the attention weights
            (Arthur et al. 2016), with both outputs, in training and decoding.
        lexicon_top_k: translations kept per source word in the lexicon table.
        lexicon_epsilon: the lexicon bias of a word no attended source word proposes is ``log(epsilon)``.
        length_penalty_choices: when set, ``calibrate`` decodes the validation pairs (at most
            ``max_eval_pairs``) with beam search at each of these alphas and keeps the one of the best
            validation BLEU as ``length_penalty`` for the test metrics and the export (None: keep
            ``length_penalty``).
        max_decode_length: the most words a translation may have.
        replace_unknown: write, in place of a ``<unk>`` output, the IBM Model 1 translation of the source
            word it attended to most, or that word itself when the lexicon has none (Luong et al. 2015),
            so rare words, names and numbers come through.
        max_eval_pairs: translate at most this many test pairs for BLEU/chrF (None: all).
        jit_compile: compile the training step with XLA.
    """

    corpus: str = "bible"
    num_pairs: int = 5000
    max_number: int = 100_000
    reverse: bool = False
    max_length: int = 30
    too_long: str = "reject"
    max_ratio: float = 2.0
    split_by: str = "chapter"
    val_fraction: float = 0.05
    test_fraction: float = 0.05
    max_vocab: int | None = None
    min_count: int = 2
    vocabulary: str = "extend"
    embedding_dim: int = 128
    units: int = 256
    encoder_layers: int = 1
    output: str = "bnce"
    lexicon_bias: bool = True
    lexicon_top_k: int = 10
    lexicon_epsilon: float = 1e-3
    log_z: float = 9.0
    beam_size: int = 4
    length_penalty_choices: list[float] | None = None
    max_decode_length: int = 60
    replace_unknown: bool = True
    max_eval_pairs: int | None = None
    jit_compile: bool = False
    batch_size: int = 64
    learning_rate: float = 2e-3
    epochs: int = 5
    early_stopping_patience: int = 3
    lr_patience: int = 1

    PRESETS = {
        "tiny": {"corpus": "numbers", "num_pairs": 600, "max_number": 1000, "split_by": "pair", "max_ratio": 4.0,
                 "val_fraction": 0.1, "test_fraction": 0.1, "embedding_dim": 16, "units": 32, "epochs": 1,
                 "steps_per_epoch": 20, "batch_size": 32, "beam_size": 2, "max_decode_length": 20,
                 "max_eval_pairs": 20, "timing_steps": 0, "length_penalty_choices": [0.6, 1.4]},
        # docs/results.md: softmax beats B-NCE per minute here; with the lexicon bias (on by default) 6 epochs
        # and the beam's length penalty chosen on validation (1.4) give BLEU 18.6/21.8 (greedy/beam) against
        # IBM Model 1's 12.2, chrF 39.8/42.5 against 42.0.
        "default": {"output": "softmax", "epochs": 6, "length_penalty_choices": [0.6, 1.0, 1.4, 2.0]},
        "full": {"max_length": 60, "units": 512, "embedding_dim": 256, "encoder_layers": 2, "epochs": 30,
                 "max_decode_length": 120},
    }

    CHOICES = {**Seq2SeqConfig.CHOICES, "attention": tuple(a for a in SEQ2SEQ_ATTENTIONS if a != "none")}

    def validate(self) -> None:
        super().validate()
        require(self.corpus in CORPORA, "corpus", self.corpus, f"one of {', '.join(CORPORA)}")
        require(self.too_long in pair_data.TOO_LONG, "too_long", self.too_long,
                f"one of {', '.join(pair_data.TOO_LONG)}")
        require(self.split_by in pair_data.SPLIT_UNITS, "split_by", self.split_by,
                f"one of {', '.join(pair_data.SPLIT_UNITS)}")
        require(self.vocabulary in VOCABULARY_CHOICES, "vocabulary", self.vocabulary,
                f"one of {', '.join(VOCABULARY_CHOICES)}")
        for name in ("num_pairs", "max_number", "max_length", "encoder_layers", "max_decode_length", "min_count",
                     "lexicon_top_k"):
            require(getattr(self, name) >= 1, name, getattr(self, name), "an integer >= 1")
        require(self.units >= 2 and self.units % 2 == 0, "units", self.units, "an even integer >= 2")
        require(self.max_ratio >= 1, "max_ratio", self.max_ratio, "a number >= 1")
        require(self.lexicon_epsilon > 0, "lexicon_epsilon", self.lexicon_epsilon, "a number > 0")
        require(self.length_penalty_choices is None or (len(self.length_penalty_choices) >= 1 and all(
            isinstance(alpha, (int, float)) and alpha >= 0 for alpha in self.length_penalty_choices)),
            "length_penalty_choices", self.length_penalty_choices, "null or a list of numbers >= 0")
        require(self.max_vocab is None or self.max_vocab >= 4, "max_vocab", self.max_vocab, "null or >= 4")
        require(self.max_eval_pairs is None or self.max_eval_pairs >= 1, "max_eval_pairs", self.max_eval_pairs,
                "null or >= 1")
        require_split_fractions(self.val_fraction, self.test_fraction)


def read_pairs(config: TranslationConfig, data_path: str | None) -> pair_data.Pairs:
    """The configured pairs, before the length limit: the user's file or tfds data, or the default corpus."""
    if datasets.is_tfds(data_path):
        found = datasets.tfds_pairs(data_path)
    elif data_path:
        found = pair_data.read_pairs_file(data_path)
    elif config.corpus == "numbers":
        found = pair_data.number_pairs(config.num_pairs, config.max_number, seed=config.seed)
    else:
        found = pair_data.bible_pairs()
    return found.reversed() if config.reverse else found


#: what ``_pair_elements``' components are padded with in a batch: ``END_ID`` (the masks read it), zero weights
PADDING_VALUES = ({"source": END_ID, "target_in": END_ID, "target_out": END_ID}, 0.0, 0.0)


def _padded(rows: Sequence[np.ndarray], width: int) -> np.ndarray:
    """Rows of ids padded with ``END_ID`` to ``[len(rows), width]``."""
    out = np.full((len(rows), width), END_ID, "int32")
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def _model_arrays(sources: list[list[str]], targets: list[list[str]], source_vocab: text_data.Vocabulary,
                  target_vocab: text_data.Vocabulary, max_length: int) -> dict[str, np.ndarray]:
    """Teacher-forcing arrays: ``source``, ``target_in`` (``<s> y``), ``target_out`` (``y </s>``), ``weights``."""
    encoded = [target_vocab.encode(sentence) for sentence in targets]
    return {
        "source": _padded([source_vocab.encode(sentence) for sentence in sources], max_length),
        "target_in": _padded([np.r_[START_ID, ids] for ids in encoded], max_length + 1),
        "target_out": _padded([np.r_[ids, END_ID] for ids in encoded], max_length + 1),
        "weights": (np.arange(max_length + 1)[None, :] <= np.array([len(ids) for ids in encoded])[:, None]
                    ).astype("float32"),
    }


def _pair_elements(arrays: dict[str, np.ndarray]) -> tf.data.Dataset:
    """``({"source", "target_in", "target_out"}, zeros, weights)`` elements of ``_model_arrays``' rows, each cut to
    its own length (the source's words; the target's words and ``</s>``), so that batches pad only to their
    longest pair (with ``PADDING_VALUES``) and ``length_sorted_batches`` can group pairs of similar length."""

    def cut(inputs: dict[str, tf.Tensor], zeros: tf.Tensor, weights: tf.Tensor) -> tuple:
        # at least one column: a source of no tokens keeps one END pad, as serving's encoded batches do
        source_length = tf.maximum(tf.reduce_sum(tf.cast(tf.not_equal(inputs["source"], END_ID), tf.int32)), 1)
        target_length = tf.cast(tf.reduce_sum(weights), tf.int32)
        targets = {key: inputs[key][:target_length] for key in ("target_in", "target_out")}
        return {"source": inputs["source"][:source_length], **targets}, zeros[:target_length], weights[:target_length]

    return tf.data.Dataset.from_tensor_slices((
        {key: arrays[key] for key in ("source", "target_in", "target_out")},
        np.zeros_like(arrays["weights"]), arrays["weights"])).map(cut)


def _weigh_as_full_width(width: int) -> Callable[..., tuple]:
    """A ``Splits.batch_map`` that scales a batch's weights by its width over ``width``.

    Keras divides a batch's weighted per-token loss by its number of cells (``sum_over_batch_size``), so a
    batch cut to its longest pair would weigh each of its tokens by ``1 / (batch * its width)``: a batch of
    short pairs would count each token up to 3x as much as one of long pairs. Scaled, every token weighs
    ``1 / (batch * width)`` in every batch, the objective of batches padded to the full width.
    """

    def weigh(inputs: dict[str, tf.Tensor], zeros: tf.Tensor, weights: tf.Tensor) -> tuple:
        return inputs, zeros, weights * (tf.cast(tf.shape(weights)[1], weights.dtype) / width)

    return weigh


class Translation(Pipeline):
    """RNN encoder-decoder with attention; greedy and beam search in the export."""

    Config = TranslationConfig
    predict_input = "source-language texts, one per row (quote each); --signature beam or align"

    # --- data -------------------------------------------------------------------------------

    headline_metrics = (Headline("greedy_bleu", "BLEU greedy", baseline_key="bleu"),
                        Headline("beam_bleu", "BLEU beam", baseline_key="bleu"),
                        Headline("greedy_chrf", "chrF greedy", baseline_key="chrf"),
                        Headline("beam_chrf", "chrF beam", baseline_key="chrf"),
                        Headline("ppl_full", "perplexity", higher_is_better=False))

    def write_sample_data(self, folder: Path, seed: int = 0) -> tuple[str | None, list[str]]:
        """40 English-Spanish pairs (``pairs.tsv``, Anki's header-less ``source<TAB>target``) counting things, some of them words the number phrases lack."""
        from num2words import num2words

        things = [("cats", "gatos"), ("dogs", "perros"), ("boats", "barcos"), ("trees", "árboles"),
                  ("zeppelins", "zepelines"), ("quokkas", "quokkas"), ("houses", "casas"), ("letters", "cartas")]
        rows = [(f"{num2words(n)} {en}", f"{num2words(n, lang='es')} {es}")
                for i, (en, es) in enumerate(things) for n in range(2 + i % 3, 7 + i % 3)]
        path = samples.write_table(folder / "pairs.tsv", None, rows, delimiter="\t")
        return str(path), ["three dogs", "twenty one"]

    def load_data(self, config: TranslationConfig, data_path: str | None,
                  state: dict[str, Any] | None = None) -> Splits:
        found = pair_data.limit_length(read_pairs(config, data_path), config.max_length, config.too_long,
                                       config.max_ratio)
        parts = pair_data.split_pairs(found, config.val_fraction, config.test_fraction, config.split_by, config.seed)
        tokens = {name: ([TOKENIZER.tokenize(line) for line in part.sources],
                         [TOKENIZER.tokenize(line) for line in part.targets]) for name, part in parts.items()}
        lexical = LexicalTranslator.fit(*tokens["train"], top_k=config.lexicon_top_k)
        train_words = [[word for sentence in side for word in sentence] for side in tokens["train"]]
        exported = [len(state[key]) for key in VOCABULARY_KEYS] if state else None  # fine-tuning: the export's
        if state is None:
            vocabularies = [text_data.build_vocabulary(words, config.max_vocab, config.min_count, reserved=[END, START])
                            for words in train_words]
            state = {"source_vocabulary": vocabularies[0].tokens, "target_vocabulary": vocabularies[1].tokens,
                     "max_length": config.max_length, "max_decode_length": config.max_decode_length,
                     "beam_size": config.beam_size, "length_penalty": config.length_penalty,
                     "replace_unknown": config.replace_unknown,
                     "unknown_replacements": lexical.table if config.replace_unknown else {}}
        elif config.vocabulary == "extend":
            state = {**state, **{key: grow_vocabulary(state[key], words, config.min_count, config.max_vocab)
                                 for key, words in zip(VOCABULARY_KEYS, train_words)}}
            if state["replace_unknown"]:  # the exported words keep theirs
                state["unknown_replacements"] = {**lexical.table, **state.get("unknown_replacements", {})}
        source_vocab, target_vocab = _vocabularies(state)
        arrays = {name: _model_arrays(*tokens[name], source_vocab, target_vocab, config.max_length)
                  for name in parts}
        target_counts = np.bincount(arrays["train"]["target_out"][arrays["train"]["weights"] > 0],
                                    minlength=len(target_vocab))
        datasets_ = {name: _pair_elements(part) for name, part in arrays.items()}
        oov = {name: round(float(np.mean(part["target_out"][part["weights"] > 0] == 0)), 4)
               for name, part in arrays.items()}
        report = {"source": found.origin, "licence": found.licence, "counts": found.counts,
                  "pairs": {name: len(part) for name, part in parts.items()},
                  SPLIT_COUNTS: split_rule.split_counts("pairs", {name: len(part) for name, part in parts.items()}),
                  "source_vocabulary": len(source_vocab), "target_vocabulary": len(target_vocab),
                  "target_oov_rate": oov,
                  VOCABULARIES: {name: vocabulary_report(size, state[key], (word for line in side for word in line))
                                 for name, key, size, side in zip(("source words", "target words"), VOCABULARY_KEYS,
                                                                   exported or (len(source_vocab), len(target_vocab)),
                                                                   tokens["test"])}}
        return Splits(datasets_["train"], datasets_["val"], datasets_["test"], state=state, report=report,
                      arrays={"val": parts["val"], "test": parts["test"], "lexical": lexical, "target_counts": target_counts},
                      padding_values=PADDING_VALUES, batch_map=_weigh_as_full_width(config.max_length + 1))

    # --- model ------------------------------------------------------------------------------

    def build_model(self, config: TranslationConfig, data: Splits) -> keras.Model:
        source_size, target_size = len(data.state["source_vocabulary"]), len(data.state["target_vocabulary"])
        source = keras.Input((None,), dtype="int32", name="source")
        target_in = keras.Input((None,), dtype="int32", name="target_in")
        target_out = keras.Input((None,), dtype="int32", name="target_out")
        rnn = CELLS[config.cell]
        source_mask = PaddingMask(END_ID, name="source_mask")(source)
        hidden = keras.layers.Embedding(source_size, config.embedding_dim, name="source_embedding")(source)
        hidden = keras.layers.Dropout(config.dropout, name="source_dropout")(hidden)
        for i in range(config.encoder_layers):
            last = i == config.encoder_layers - 1
            outputs = keras.layers.Bidirectional(
                rnn(config.units // 2, return_sequences=True, return_state=last), name=f"encoder_{i + 1}",
            )(hidden, mask=source_mask)
            hidden = outputs[0] if last else outputs
        memory = keras.layers.Identity(name="memory")(hidden)
        states = outputs[1:]  # forward states, then backward states
        per_direction = len(states) // 2
        initial_state = [keras.layers.Dense(config.units, activation="tanh", name=f"bridge_{k}")(
            keras.layers.Concatenate(name=f"final_state_{k}")([states[k], states[per_direction + k]]))
            for k in range(per_direction)]
        decoder = AttentionDecoder(target_size, config.embedding_dim, config.units, cell=config.cell,
                                   attention=config.attention, dropout=config.dropout, name="decoder")
        decoder_inputs = {"ids": target_in, "memory": memory, "memory_mask": source_mask, "state": initial_state}
        output = BatchNCE(target_size, loss=config.output, log_z=config.log_z, extra_noise=config.extra_noise,
                          noise_scope=config.noise_scope, compact_batch=not config.jit_compile, seed=config.seed,
                          name="output")
        # target_in is END from the token after target_out's END on: those tokens are padding, never noise
        target_mask = PaddingMask(END_ID, name="target_mask")(target_in)
        if config.lexicon_bias:
            attended, attention = decoder(decoder_inputs, return_attention=True)
            lexicon = LexiconBias(source_size, target_size, config.lexicon_top_k, config.lexicon_epsilon,
                                  name="lexicon")
            per_token = output([attended, target_out], target_mask=target_mask,
                               logit_bias=lexicon({"attention": attention, "source_ids": source}, mixture=True))
            lexicon.set_table(*data.arrays["lexical"].lexicon(*_vocabularies(data.state), config.lexicon_top_k))
        else:
            per_token = output([decoder(decoder_inputs), target_out], target_mask=target_mask)
        unigram = unigram_distribution(data.arrays["target_counts"])
        output.set_noise_distribution(unigram)
        output.bias.assign((np.log(unigram) + config.log_z).astype("float32"))  # start at the unigram model
        return keras.Model({"source": source, "target_in": target_in, "target_out": target_out}, per_token,
                           name=self.name)

    def adapt_model(self, model: keras.Model, config: TranslationConfig, data: Splits) -> keras.Model:
        """Grows the embeddings, the output layer and the lexicon for the words ``load_data`` added (after the old).

        The exported lexicon rows are kept (their target ids renumbered); the new source words' rows are those
        ``build_model`` fits on the fine-tuning pairs. A changed ``output`` criterion also rebuilds the model.
        """
        exported = [model.get_layer("source_embedding").input_dim, model.get_layer("output").vocab_size]
        words = [data.state[key] for key in VOCABULARY_KEYS]
        if exported == [len(side) for side in words] and model.get_layer("output").loss == config.output:
            return model
        grown = self.build_model(config, data)
        source, target = (VocabularyMap.from_tokens(side[:size], side) for side, size in zip(words, exported))
        maps, value_maps = {"source_embedding": source, "decoder/embedding": target, "output": target}, {}
        if config.lexicon_bias:  # its rows are source words, its ids target words
            maps["lexicon"], value_maps["lexicon/table_ids"] = source, target
        transfer_weights(model, grown, maps, value_maps)
        return grown

    def compile_args(self, config: TranslationConfig, data: Splits) -> dict[str, Any]:
        return {"loss": per_token_training_loss, "jit_compile": config.jit_compile}

    # --- evaluation -------------------------------------------------------------------------

    def calibrate(self, model: keras.Model, config: TranslationConfig, data: Splits) -> dict[str, Any]:
        """Chooses the beam's length penalty: the ``length_penalty_choices`` alpha of the best validation BLEU.

        Returns:
            ``{"length_penalty": chosen, "val_beam_bleu_by_length_penalty": {alpha: BLEU}}``, or ``{}``
            when ``length_penalty_choices`` is not set (the state keeps ``length_penalty``).
        """
        choices = config.length_penalty_choices
        if not choices:
            return {}
        sources, references = _eval_pairs(config, data.arrays["val"])
        beams = _evaluation_texts(model, data.state, sources, [BeamSearch(int(data.state["beam_size"]), float(alpha))
                                                               for alpha in choices])
        bleu = {float(alpha): seqapps_metrics.bleu(references, hypotheses)["score"]
                for alpha, hypotheses in zip(choices, beams)}
        chosen = max(bleu, key=bleu.get)  # the first of equal scores
        return {"length_penalty": chosen,
                "val_beam_bleu_by_length_penalty": {str(alpha): score for alpha, score in bleu.items()}}

    def evaluate(self, model: keras.Model, config: TranslationConfig,
                 data: Splits) -> tuple[dict[str, float], dict[str, Any]]:
        nll, weights = [], []
        for inputs, _, weight in data.test.padded_batch(128, padding_values=data.padding_values):
            nll.append(model(inputs, training=False).numpy().reshape(-1))
            weights.append(weight.numpy().reshape(-1))
        sources, references = _eval_pairs(config, data.arrays["test"])
        count = len(sources)
        start = time.perf_counter()
        (greedy,) = _evaluation_texts(model, data.state, sources, [GreedySearch()])
        greedy_seconds = time.perf_counter() - start
        (beam,) = _evaluation_texts(model, data.state, sources, [BeamSearch.from_request(data.state, {})])
        metrics = {"ppl_full": seqapps_metrics.perplexity(-np.concatenate(nll), np.concatenate(weights)),
                   **_bleu_chrf(references, greedy, "greedy"), **_bleu_chrf(references, beam, "beam"),
                   "greedy_sentences_per_s": round(count / greedy_seconds, 1),
                   "parameters": int(model.count_params()), "eval_pairs": count}
        if config.timing_steps:
            metrics["train_tokens_per_s"] = training_tokens_per_second(
                model, config, self.compile_args(config, data), data)
        if config.length_penalty_choices:  # what calibrate chose, and on what (not yet before a fine-tuning)
            metrics.update({key: data.state[key] for key in ("length_penalty", "val_beam_bleu_by_length_penalty")
                            if key in data.state})
        metrics["samples/translations"] = [{"source": s, "reference": r, "greedy": g, "beam": b}
                                           for s, r, g, b in zip(sources, references, greedy, beam)][:SAMPLES]
        lexical = data.arrays["lexical"]
        baseline = [TOKENIZER.join(lexical.translate(TOKENIZER.tokenize(line))) for line in sources]
        return metrics, {"lexical_ibm1": _bleu_chrf(references, baseline, "")}

    # --- export -----------------------------------------------------------------------------

    def serving_module(self, model: keras.Model, config: TranslationConfig, data: Splits) -> ServingModule:
        """``serving_default`` (greedy), ``beam`` and every other strategy of ``seqapps.generation.STRATEGIES``,
        and ``align``; the module owns both vocabularies (asset files) and the ``<unk>`` replacements."""
        translator = Translator(model, data.state)
        text = {"text": tf.TensorSpec([None], tf.string, name="text")}
        example = {"text": np.array(["In the beginning God created the heavens and the earth.", ""], dtype=object)}
        signatures = strategy_signatures(translator.generator, translator.generate, translator.preprocess,
                                         data.state, text, example, ("translation", "translations"))
        signatures["align"] = Signature(inputs=text, example=example, run=translator.align,
                                        preprocess=translator.preprocess)
        return ServingModule(model, signatures, resources={
            "source_vocabulary": translator.source_lookup, "target_vocabulary": translator.generator.lookup,
            "unknown_replacements": translator.replacements})

    # --- report -----------------------------------------------------------------------------

    def report_data(self, model: keras.Model, config: TranslationConfig, data: Splits,
                    export: ExportCalls) -> dict[str, np.ndarray]:
        """The first test sentences (the first samples) sent to the export's ``align`` signature as texts.

        Returns:
            ``source`` (the texts), ``translation`` (greedy), ``source_tokens [n, S]`` and ``target_tokens
            [n, T]`` (padded with ""), and ``attention [n, T, S]`` (each target word's weights over the
            source words), as ``align`` returned them.
        """
        sources = data.arrays["test"].sources[:REPORT_SENTENCES]
        align = export("align", {"text": np.array(sources, dtype=object)})
        return {"source": np.array(sources, dtype=str),
                **{key: unicode_texts(align[key]) for key in ("translation", "source_tokens", "target_tokens")},
                "attention": align["attention"].astype("float32")}

    def report_sections(self, result: dict[str, Any], arrays: dict[str, np.ndarray]) -> list[Section]:
        """BLEU and chrF of greedy and beam search beside the lexical baseline, the attention of a few test
        sentences (from ``report_data``) and the sample translations of the result."""
        return [_scores_section(result), _attention_section(arrays), _samples_section(result)]

    def limits(self, config: TranslationConfig, data: Splits) -> Limits:
        return Limits(max_batch_size=256, max_string_bytes=100_000, max_generated_length=config.max_decode_length,
                      max_sequence_length=config.max_length)

    def format_prediction(self, state: dict[str, Any], inputs: dict[str, np.ndarray],
                          outputs: dict[str, np.ndarray], signature: str = "serving_default",
                          given: Sequence[str] = ()) -> tuple[str, Any]:
        """Each source text with its translation: the greedy one (or another strategy's) and its score, the
        n-best list (``beam``, or a strategy's ``translations``), or, per translated word, the source word it
        attends to most (``align``)."""
        sources = [predictions.text(value) for value in inputs["text"]]
        if "translations" in outputs:
            return predictions.ranked_rows(list(map(predictions.quoted, sources)), sources, outputs["translations"],
                                           outputs["scores"], "translation", "translations")
        translations = [predictions.text(value) for value in outputs["translation"]]
        if signature == "align":
            return _alignments(sources, translations, outputs)
        scores = [round(float(score), 4) for score in outputs["score"]]
        lines = [f"{predictions.quoted(source)} -> {predictions.said(found, 'translation')}  (score {score:.3f})"
                 for source, found, score in zip(sources, translations, scores)]
        return "\n".join(lines), {"inputs": sources, "translations": translations, "scores": scores}


def _alignments(sources: list[str], translations: list[str], outputs: dict[str, np.ndarray]) -> tuple[str, Any]:
    """The ``align`` signature's rows: per translated word, the source word it attends to most.

    Returns:
        ``(text, {"rows": [{"input", "translation", "alignment": [{"target", "source", "weight"}],
        "source_tokens", "target_tokens", "attention"}]})``, the attention cut to the real words.
    """
    lines, rows = [], []
    for row, (source, translation) in enumerate(zip(sources, translations)):
        source_tokens = [word for word in map(predictions.text, outputs["source_tokens"][row]) if word]
        target_tokens = [word for word in map(predictions.text, outputs["target_tokens"][row]) if word]
        strongest = predictions.strongest(target_tokens, outputs["attention"][row], len(source_tokens))
        alignment = [{"target": word, "source": source_tokens[position], "weight": round(weight, 4)}
                     for word, position, weight in strongest]
        lines.append(f"{predictions.quoted(source)} -> {predictions.said(translation, 'translation')}")
        if alignment:
            lines.append("  " + ", ".join(f"{a['target']}←{a['source']} {a['weight']:.2f}" for a in alignment))
        attention = outputs["attention"][row][: len(target_tokens), : len(source_tokens)]
        rows.append({"input": source, "translation": translation, "alignment": alignment,
                     "source_tokens": source_tokens, "target_tokens": target_tokens,
                     "attention": np.round(attention.astype("float64"), 4).tolist()})
    return "\n".join(lines), {"rows": rows}


def _scores_section(result: dict[str, Any]) -> Section:
    """BLEU and chrF on the test pairs: greedy and beam search against the word-by-word IBM Model 1 baseline."""
    metrics = result.get("metrics", {})
    systems = {"greedy search": (metrics, "greedy_"), "beam search": (metrics, "beam_"),
               "word by word (IBM Model 1)": ((result.get("baseline") or {}).get("lexical_ibm1", {}), "")}
    values = {name: {label: found[f"{prefix}{key}"] for label, key in (("BLEU", "bleu"), ("chrF", "chrf"))
                     if f"{prefix}{key}" in found} for name, (found, prefix) in systems.items()}
    values = {name: scores for name, scores in values.items() if scores}
    signature = metrics.get("signature/greedy_bleu", "")
    blocks: list[Any] = [Table(["", "BLEU", "chrF"], [[name, scores.get("BLEU"), scores.get("chrF")]
                                                      for name, scores in values.items()],
                               caption=f"corpus scores on {metrics.get('eval_pairs', '?')} test pairs"
                                       + (f" (sacrebleu {signature})" if signature else ""))]
    if values:
        blocks.append(plots.bar_chart("translation_scores", "BLEU and chrF on the test pairs", values, "score (0-100)"))
    if "length_penalty" in metrics:
        chosen = ", ".join(f"{alpha}: {bleu:.4g}" for alpha, bleu in
                           metrics.get("val_beam_bleu_by_length_penalty", {}).items())
        blocks.append(Text(f"The beam's length penalty {metrics['length_penalty']} had the best validation BLEU "
                           f"(by length penalty: {chosen})."))
    return Section("BLEU and chrF", blocks, anchor="scores")


def _attention_section(arrays: dict[str, np.ndarray]) -> Section:
    """A heatmap per report sentence: each word of the greedy translation (rows) over the source words."""
    if "attention" not in arrays:
        return Section("Attention", [Text("No attention maps: this report was built without the run's report data.")],
                       anchor="attention")
    blocks: list[Any] = []
    for row, (source, translation) in enumerate(zip(arrays["source"], arrays["translation"])):
        source_words = [word for word in arrays["source_tokens"][row] if word]
        target_words = [word for word in arrays["target_tokens"][row] if word]
        if source_words and target_words:
            blocks.append(plots.heatmap(
                f"attention_{row + 1}", f"test sentence {row + 1}",
                arrays["attention"][row, : len(target_words), : len(source_words)], source_words, target_words,
                "source words", "greedy translation", caption=f"{source} → {translation}",
                colorbar="attention weight"))
    return Section("Attention", blocks or [Text("The report sentences translated to nothing.")], anchor="attention")


def _samples_section(result: dict[str, Any]) -> Section:
    """The run's sample translations: source, reference, greedy and beam search."""
    samples = result.get("metrics", {}).get("samples/translations", [])
    rows = [[sample["source"], sample["reference"],
             *(predictions.said(sample[key], "translation") for key in ("greedy", "beam"))] for sample in samples]
    return Section("Sample translations", [Table(["source", "reference", "greedy", "beam"], rows,
                                                 caption="the first test pairs; references tokenised as the "
                                                         "model's words")], anchor="samples")


def _eval_pairs(config: TranslationConfig, pairs: pair_data.Pairs) -> tuple[list[str], list[str]]:
    """The first ``max_eval_pairs`` sources and their references, tokenised as the model's words."""
    count = min(len(pairs), config.max_eval_pairs or len(pairs))
    return pairs.sources[:count], [TOKENIZER.join(TOKENIZER.tokenize(t)) for t in pairs.targets[:count]]


def _vocabularies(state: dict[str, Any]) -> tuple[text_data.Vocabulary, text_data.Vocabulary]:
    """The source and target vocabularies of the pipeline state."""
    return tuple(text_data.Vocabulary(state[key], [0] * len(state[key])) for key in VOCABULARY_KEYS)


def _evaluation_texts(model: keras.Model, state: dict[str, Any], sources: Sequence[str],
                      strategies: Sequence[DecodingStrategy]) -> list[list[str]]:
    """Translates Python strings with each strategy (its best hypothesis), for evaluation.

    Args:
        model: the training model.
        state: the pipeline state (vocabularies and decoding settings).
        sources: the source texts.
        strategies: the decoding strategies.

    Returns:
        One list of translations per strategy.
    """
    key = json.dumps({name: state.get(name) for name in (*VOCABULARY_KEYS, "max_length", "max_decode_length",
                                                         "replace_unknown", "unknown_replacements")}, sort_keys=True)
    translator, functions = evaluation_decoder(model, key, lambda: Translator(model, state))
    return generate_texts(translator.generator, translator.generate, strategies, sources, preprocess=translator.encode,
                          functions=functions)


def _bleu_chrf(references: list[str], hypotheses: list[str], prefix: str) -> dict[str, Any]:
    """``{prefix_bleu, prefix_chrf}`` with sacrebleu, and their signatures."""
    name = f"{prefix}_" if prefix else ""
    bleu = seqapps_metrics.bleu(references, hypotheses)
    chrf = seqapps_metrics.chrf(references, hypotheses)
    return {f"{name}bleu": round(bleu["score"], 2), f"{name}chrf": round(chrf["score"], 2),
            f"signature/{name}bleu": bleu["signature"], f"signature/{name}chrf": chrf["signature"]}


class Translator(tf.Module):
    """The trained model as in-graph translation: strings in, strings out, with any decoding strategy.

    The encoder is the Keras model's source side; decoding runs its ``AttentionDecoder``, output layer and
    ``LexiconBias`` (when the model has one) through ``seqapps.generation.Generator``, which collects the
    attention that ``align`` returns and the ``<unk>`` replacement reads. The vocabularies are asset files
    read by ``tf.lookup`` tables, and so are the ``<unk>`` replacements (``text_data.word_map_lookup``).

    Args:
        model: the training model of ``Translation.build_model``.
        state: the pipeline state (vocabularies and decoding settings).
    """

    def __init__(self, model: keras.Model, state: dict[str, Any]) -> None:
        super().__init__(name="translator")
        self.source_lookup, target_lookup = (vocabulary.lookup(name=key) for vocabulary, key in zip(
            _vocabularies(state), VOCABULARY_KEYS))
        self.max_length = int(state["max_length"])
        self.max_decode_length = int(state["max_decode_length"])
        self.replace_unknown = bool(state["replace_unknown"])
        # the lexicon's best translation of each source word, an asset file (none in older exports: words are copied)
        self.replacements = text_data.word_map_lookup(state.get("unknown_replacements", {}), "unknown_replacements")
        bridges = sorted((layer for layer in model.layers if layer.name.startswith("bridge_")),
                         key=lambda layer: int(layer.name.rpartition("_")[2]))
        self.encoder = keras.Model(model.input["source"], [model.get_layer("memory").output,
                                                           model.get_layer("source_mask").output,
                                                           *(layer.output for layer in bridges)])
        lexicon = next((layer for layer in model.layers if layer.name == "lexicon"), None)
        self.generator = Generator(model.get_layer("decoder"), model.get_layer("output"), target_lookup, TOKENIZER,
                                   START_ID, END_ID, lexicon)

    def preprocess(self, inputs: dict[str, tf.Tensor]) -> dict[str, Any]:
        """The raw ``text [batch]`` of a request, encoded (``encode``)."""
        return self.encode(inputs["text"])

    def encode(self, text: tf.Tensor) -> dict[str, Any]:
        """Source words (cut to ``max_length``; ``""`` pads), their count, and the decoder's start state.

        The ids get one ``END_ID`` pad column more than the words, so an all-empty batch still has one
        (masked) position to attend to.
        """
        tokens = TOKENIZER.tf_tokenize(tf.reshape(text, [-1]))[:, : self.max_length]
        ids = self.source_lookup.ids(tokens).to_tensor(default_value=END_ID)
        ids = tf.pad(ids, [[0, 0], [0, 1]], constant_values=END_ID)
        memory, mask, *rnn_state = self.encoder(ids, training=False)
        words = tf.pad(tokens.to_tensor(default_value=""), [[0, 0], [0, 1]], constant_values="")
        return {"words": words, "lengths": tf.cast(tokens.row_lengths(), tf.int32),
                "state": {"rnn": list(rnn_state), "memory": memory, "memory_mask": mask, "source_ids": ids}}

    def generate(self, source: dict[str, Any], strategy: DecodingStrategy, attention: bool = False) -> Generation:
        """Translates an encoded batch: at most twice the longest source plus 10 words, never over
        ``max_decode_length``; an empty source translates to no words.

        With ``replace_unknown``, a ``<unk>`` output becomes the lexicon's translation of the source word it
        attended to most, or that word itself (Luong et al. 2015).

        Args:
            source: ``encode``'s batch.
            strategy: the decoding strategy.
            attention: collect the attention weights (always collected with ``replace_unknown``).
        """
        limit = tf.minimum(self.max_decode_length, 2 * tf.reduce_max(tf.concat([source["lengths"], [0]], 0)) + 10)
        found = self.generator.generate(source["state"], strategy, limit, attention or self.replace_unknown)
        words = self.generator.words(found.ids)
        if self.replace_unknown:
            source_words = tf.repeat(source["words"][:, None, :], tf.shape(found.ids)[1], axis=1)
            attended = tf.gather(source_words, tf.argmax(found.attention, axis=-1, output_type=tf.int32),
                                 batch_dims=2)
            translated = self.replacements.lookup(attended)
            replacement = tf.where(translated != "", translated, attended)
            words = tf.where((found.ids == 0) & (attended != "") & (words != ""), replacement, words)
        valid = source["lengths"] > 0
        return Generation(found, tf.where(valid[:, None, None], words, ""), valid)

    def align(self, source: dict[str, Any]) -> dict[str, tf.Tensor]:
        """An encoded batch -> the greedy ``translation``, ``source_tokens [batch, S]``, ``target_tokens
        [batch, T]`` (padded with "") and ``attention [batch, T, S]`` (zero outside the tokens)."""
        found = self.generate(source, GreedySearch(), attention=True)
        words, weights = found.words[:, 0], found.hypotheses.attention[:, 0]
        source_words = source["words"][:, :-1]
        real = tf.cast((words != "")[:, :, None] & (source_words != "")[:, None, :], weights.dtype)
        return {"translation": self.generator.texts(words), "source_tokens": source_words, "target_tokens": words,
                "attention": weights[:, :, :-1] * real}
