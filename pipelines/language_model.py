"""Word-level language model trained with B-NCE, S-NCE or a full softmax (Oualil & Klakow, 2017).

Architectures (config ``architecture``), as in the paper:

- ``ffnn``: a feed-forward n-gram model (``ngram_order`` 5: the 4 previous words'
  embeddings, concatenated, then a tanh layer);
- ``rnn``: a SimpleRNN with a linear projection;
- ``lstm``: an LSTM;
- ``*_relu`` (``ffnn_relu``, ``rnn_relu``, ``lstm_relu``): the same with a dense
  ReLU bottleneck before the output layer, which the paper found better with
  fewer parameters.

The output layer is ``seqapps.layers.batch_nce.BatchNCE``: it returns the
per-token training loss of ``loss`` while training and the full-softmax
negative log-likelihood otherwise, so the validation loss that drives the
learning-rate halving is log PPL^f whatever the training loss.

Data: the text is one token stream (lines end with ``</s>``), cut into
windows of ``seq_len`` targets; a step trains on ``batch_size`` windows.
B-NCE's batch (``noise_scope``) is, as in the paper, the ``batch_size`` targets
of one time step (400 by default, the paper's B: ``K = 399`` noise words, the
other sequences' targets at that step), or with ``noise_scope=batch`` all
``batch_size x seq_len`` targets of the step pooled (each row's noise then holds
the other words of its own window). Duplicated targets stay noise samples
(the paper's unigram noise) unless ``remove_accidental_hits``. Recurrent
windows start from a zero state. Default data: the WordNet 3.0
glosses (apt ``wordnet-base``; WordNet 3.0 licence), 1.7M tokens, 57k types;
``--data your.txt`` trains on any UTF-8 text.

Fine-tuning (``seqapps finetune language_model --from EXPORT --data your.txt``)
extends the export's vocabulary (``vocabulary=extend``, the default) with the
vocabulary the training lines would get from scratch under the config's
``max_vocab`` and ``min_count`` (OpenNMT-tf's ``update_vocab`` merge): the new
words seen ``min_count`` times, at most ``max_vocab`` of the data's own words, follow
the old ones, whose ids are kept. ``max_vocab`` bounds what one data set brings, not
the grown vocabulary. The embedding and the output layer grow by as many rows
(``seqapps.finetuning.transfer_weights``); a new word's output bias starts at its
log-unigram, and the noise distribution of B-NCE and S-NCE is the fine-tuning
data's unigram over the grown vocabulary. ``vocabulary=keep`` keeps the export's
words, new ones mapping to ``<unk>``.

The output bias starts at ``log p_unigram + log Z``, so that both
normalisations start at the unigram model: B-NCE only pushes down the scores
of words that occur in a batch, and without it the many rare words keep a
large share of the full softmax for a long time.

Metrics: PPL^f (full softmax) and PPL^n (self-normalised, ``exp(s - log Z)``)
on the test lines, the parameter count, training tokens/s and seconds per
epoch; baseline: an add-one unigram model on the same tokens. PPL^f and PPL^n
are also measured on the first validation windows after every epoch; the report
draws both over training and shows what the export says of a few test sentences
(their perplexity and the likeliest next words).
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Sequence

import keras
import numpy as np
import tensorflow as tf

from seqapps import predictions
from seqapps.config import TrainingConfig, require, require_split_fractions
from seqapps.data import datasets, samples
from seqapps.data import splits as split_rule
from seqapps.data import text as text_data
from seqapps.export import ExportCalls, ServingModule, Signature
from seqapps.finetuning import (VOCABULARY_CHOICES, VocabularyMap, fine_tuning_vocabulary, transfer_weights,
                                vocabulary_report)
from seqapps.layers.batch_nce import LOSSES, NOISE_SCOPES, BatchNCE, unigram_distribution
from seqapps.layers.ngram_context import NGramContext
from seqapps.losses import per_token_training_loss
from seqapps.metrics import perplexity, unigram_log_probs
from seqapps.pipeline import EPOCH_METRIC_EXAMPLES, SPLIT_COUNTS, VOCABULARIES, Headline, Pipeline, Splits
from seqapps.report import plots, run_folder
from seqapps.report.document import Section, Table, Text
from seqapps.training import seconds_per_training_step

ARCHITECTURES = ("ffnn", "ffnn_relu", "rnn", "rnn_relu", "lstm", "lstm_relu")
CORPORA = {"wordnet": text_data.wordnet_glosses, "pydoc": text_data.pydoc_topics}
TOKENIZER = text_data.Tokenizer("word")
#: the report scores this many test lines of 4 to ``REPORT_MAX_WORDS`` words through the export
REPORT_SENTENCES = 4
REPORT_MAX_WORDS = 25
#: the perplexities, by key, as the report names them
PERPLEXITIES = (("ppl_full", "PPL^f"), ("ppl_self_normalized", "PPL^n"))


@dataclasses.dataclass
class LanguageModelConfig(TrainingConfig):
    """Language-model settings; the defaults are the paper's (Oualil & Klakow, 2017).

    Attributes:
        architecture: one of ``ARCHITECTURES``.
        loss: "bnce", "snce" or "softmax" (the output layer's training criterion).
        corpus: default data when no ``--data`` is given: "wordnet" or "pydoc".
        embedding_dim: word embedding size.
        hidden_units: units of the tanh layer / SimpleRNN / LSTM.
        projection_units: size of the SimpleRNN's linear projection.
        bottleneck_units: size of the ReLU bottleneck of the ``*_relu`` variants.
        ngram_order: n of the feed-forward n-gram model.
        seq_len: targets per training window.
        log_z: the fixed log normaliser of the NCE losses.
        num_noise: S-NCE noise samples per batch.
        extra_noise: extra unigram noise samples of adaptive B-NCE (for small batches).
        noise_scope: B-NCE's batch: "time_step" (the paper's: the batch's targets at one
            step) or "batch" (all the step's targets pooled).
        remove_accidental_hits: drop a row's own word from its noise (default False, the
            paper's: duplicates stay noise samples).
        max_vocab: the most words, ``<unk>`` and ``</s>`` included (None: all); at fine-tuning, the most
            words the fine-tuning data's own vocabulary holds (its new ones are added).
        min_count: rarer training words map to ``<unk>`` (and are not added at fine-tuning).
        vocabulary: at fine-tuning, "extend" (the training lines' new words get ids after the export's)
            or "keep" (the export's words; new ones map to ``<unk>``).
        max_words: use only the first lines up to this many tokens (None: all).
        max_eval_tokens: evaluate validation and test on at most this many tokens (None: all).
        val_fraction, test_fraction: shares of the lines held out, spread evenly through the text.
        top_k: next-word candidates returned by the export.
        timing_steps: timed training steps (on a fresh copy) for tokens/s.
        jit_compile: compile the training step with XLA.
    """

    architecture: str = "lstm_relu"
    loss: str = "bnce"
    corpus: str = "wordnet"
    embedding_dim: int = 200
    hidden_units: int = 200
    projection_units: int = 200
    bottleneck_units: int = 200
    ngram_order: int = 5
    seq_len: int = 20
    log_z: float = 9.0
    num_noise: int = 100
    extra_noise: int = 0
    noise_scope: str = "time_step"
    remove_accidental_hits: bool = False
    max_vocab: int | None = None
    min_count: int = 1
    vocabulary: str = "extend"
    max_words: int | None = None
    max_eval_tokens: int | None = 20000
    val_fraction: float = 0.02
    test_fraction: float = 0.03
    top_k: int = 5
    timing_steps: int = 20
    jit_compile: bool = True
    batch_size: int = 400
    learning_rate: float = 0.4
    optimizer: str = "sgd"
    clipnorm: float = 5.0
    lr_patience: int = 0
    early_stopping_patience: int = 2

    PRESETS = {
        "tiny": {"corpus": "pydoc", "architecture": "lstm_relu", "embedding_dim": 16, "hidden_units": 16,
                 "projection_units": 16, "bottleneck_units": 16, "max_vocab": 2000, "seq_len": 10,
                 "batch_size": 8, "epochs": 1, "steps_per_epoch": 5, "max_eval_tokens": 2000,
                 "timing_steps": 2, "jit_compile": False},
        # The paper's SGD lr 0.4, read as for the loss summed over a window's 20 steps: 0.4 x 20 on the mean over a
        # step's 8,000 targets. At 0.4 on the mean no loss left the unigram in 600 updates; at 8 B-NCE reached test
        # PPL^f 496, at 40 it stayed at the unigram (docs/results.md, issue 27 item 3). The tiny preset's small
        # models keep 0.4: at 8 its rnn with S-NCE diverges.
        "default": {"epochs": 2, "steps_per_epoch": 60, "learning_rate": 8.0},  # 0.96M training tokens
        "full": {"epochs": 30, "early_stopping_patience": 3, "max_eval_tokens": None, "learning_rate": 8.0},
    }

    def validate(self) -> None:
        super().validate()
        require(self.architecture in ARCHITECTURES, "architecture", self.architecture,
                f"one of {', '.join(ARCHITECTURES)}")
        require(self.loss in LOSSES, "loss", self.loss, f"one of {', '.join(LOSSES)}")
        require(self.corpus in CORPORA, "corpus", self.corpus, f"one of {', '.join(CORPORA)}")
        for name in ("embedding_dim", "hidden_units", "projection_units", "bottleneck_units", "seq_len",
                     "num_noise", "top_k", "min_count"):
            require(getattr(self, name) >= 1, name, getattr(self, name), "an integer >= 1")
        require(self.ngram_order >= 2, "ngram_order", self.ngram_order, "an integer >= 2")
        require(self.extra_noise >= 0 and self.timing_steps >= 0, "extra_noise/timing_steps",
                (self.extra_noise, self.timing_steps), "integers >= 0")
        require(self.vocabulary in VOCABULARY_CHOICES, "vocabulary", self.vocabulary,
                f"one of {', '.join(VOCABULARY_CHOICES)}")
        require(self.noise_scope in NOISE_SCOPES, "noise_scope", self.noise_scope, f"one of {', '.join(NOISE_SCOPES)}")
        targets = self.batch_size * (self.seq_len if self.noise_scope == "batch" else 1)
        require(self.loss != "bnce" or targets >= 2 or self.extra_noise >= 1, "extra_noise", self.extra_noise,
                f"an integer >= 1 with loss=bnce and one target per B-NCE batch ({targets}): "
                "B-NCE's noise samples are the batch's other targets; set extra_noise (adaptive B-NCE)")
        require(self.max_vocab is None or self.max_vocab >= 3, "max_vocab", self.max_vocab, "null or >= 3")
        require(self.max_words is None or self.max_words >= 1, "max_words", self.max_words, "null or >= 1")
        require(self.max_eval_tokens is None or self.max_eval_tokens >= 1, "max_eval_tokens",
                self.max_eval_tokens, "null or >= 1")
        require_split_fractions(self.val_fraction, self.test_fraction)


def context_tokens(architecture: str, ngram_order: int) -> int:
    """Inputs before the first target's context word: ``order - 2`` for the n-gram model, else 0."""
    return ngram_order - 2 if architecture.startswith("ffnn") else 0


class LanguageModel(Pipeline):
    """Word-level LM (5-gram FFNN, RNN, LSTM, ReLU bottlenecks) trained with B-NCE / S-NCE / softmax."""

    Config = LanguageModelConfig
    predict_input = "texts, one per row: their perplexity and the likeliest next words"

    # --- data -------------------------------------------------------------------------------

    headline_metrics = (Headline("ppl_full", "PPL^f", higher_is_better=False),
                        Headline("ppl_self_normalized", "PPL^n", baseline_key="ppl_full", higher_is_better=False))

    def write_sample_data(self, folder: Path, seed: int = 0) -> tuple[str | None, list[str]]:
        """A text file of 40 lines of two sentences each, a quarter of them with made-up words (``samples.NEW_WORDS``)."""
        sentences = samples.sample_sentences(80, seed)
        lines = [f"{first} . {second} ." for first, second in zip(sentences[0::2], sentences[1::2])]
        path = samples.write_text(folder / "my_text.txt", lines)
        return str(path), ["the old man sees a quokka", "my sister likes the boat"]

    def load_data(self, config: LanguageModelConfig, data_path: str | None,
                  state: dict[str, Any] | None = None) -> Splits:
        corpus = datasets.read_corpus(data_path) if data_path else CORPORA[config.corpus]()
        lines = [TOKENIZER.tokenize(line) for line in corpus.lines]
        if config.max_words is not None:
            lines = text_data.first_lines_up_to(lines, config.max_words)
        parts = text_data.split_lines(lines, config.val_fraction, config.test_fraction, corpus.source)
        eos = text_data.END_OF_SENTENCE
        tokens = {name: [token for line in part for token in (*line, eos)] for name, part in parts.items()}
        if state is None:
            vocab = text_data.build_vocabulary(tokens["train"], config.max_vocab, config.min_count, reserved=[eos])
            state = {"context": context_tokens(config.architecture, config.ngram_order), "top_k": config.top_k}
            exported = len(vocab)
        else:  # fine-tuning: the new words by the config's rules (vocabulary=extend) after the export's
            vocab = fine_tuning_vocabulary(state["vocabulary"], tokens["train"], config.vocabulary, config.max_vocab,
                                           config.min_count)
            exported = len(state["vocabulary"]["tokens"])
        state = {**state, "vocabulary": vocab.state()}
        streams = {name: vocab.encode(part) for name, part in tokens.items()}
        counts = np.bincount(streams["train"], minlength=len(vocab))
        for name in ("val", "test"):
            if config.max_eval_tokens is not None:
                streams[name] = streams[name][: config.max_eval_tokens + 1]
        windows = {name: text_data.windows(stream, config.seq_len, state["context"], pad_id=vocab.id(eos),
                                           what=f"{corpus.source}: the {name} split")
                   for name, stream in streams.items()}
        report = {"source": corpus.source, "licence": corpus.licence, "lines": len(lines),
                  SPLIT_COUNTS: split_rule.split_counts("lines", {name: len(part) for name, part in parts.items()}),
                  "tokens": {name: int(len(stream)) for name, stream in streams.items()},
                  "vocabulary": len(vocab), "train_oov_rate": round(float(counts[0] / max(1, counts.sum())), 5),
                  VOCABULARIES: {"words": vocabulary_report(exported, vocab.tokens, tokens["test"])}}
        arrays = {"train_counts": counts, "test_targets": windows["test"][1].reshape(-1),
                  "report_sentences": [" ".join(line) for line in parts["test"]
                                       if 4 <= len(line) <= REPORT_MAX_WORDS][:REPORT_SENTENCES]}
        datasets_ = {name: tf.data.Dataset.from_tensor_slices(
            ({"tokens": inputs, "targets": targets}, np.zeros(targets.shape, "float32")))
            for name, (inputs, targets) in windows.items()}
        return Splits(datasets_["train"], datasets_["val"], datasets_["test"], state=state, report=report,
                      arrays=arrays)

    # --- model ------------------------------------------------------------------------------

    def build_model(self, config: LanguageModelConfig, data: Splits) -> keras.Model:
        vocab_size = len(data.state["vocabulary"]["tokens"])
        tokens = keras.Input((None,), dtype="int32", name="tokens")
        targets = keras.Input((None,), dtype="int32", name="targets")
        hidden = keras.layers.Embedding(vocab_size, config.embedding_dim, name="embedding")(tokens)
        kind = config.architecture.removesuffix("_relu")
        if kind == "ffnn":
            hidden = NGramContext(config.ngram_order, name="ngram_context")(hidden)
            hidden = keras.layers.Dense(config.hidden_units, activation="tanh", name="ffnn")(hidden)
        elif kind == "rnn":
            hidden = keras.layers.SimpleRNN(config.hidden_units, return_sequences=True, name="rnn")(hidden)
            hidden = keras.layers.Dense(config.projection_units, name="projection")(hidden)
        else:
            hidden = keras.layers.LSTM(config.hidden_units, return_sequences=True, name="lstm")(hidden)
        if config.architecture.endswith("_relu"):
            hidden = keras.layers.Dense(config.bottleneck_units, activation="relu", name="bottleneck")(hidden)
        hidden = keras.layers.Identity(name="hidden")(hidden)
        output = BatchNCE(vocab_size, loss=config.loss, log_z=config.log_z, num_noise=config.num_noise,
                          extra_noise=config.extra_noise, remove_accidental_hits=config.remove_accidental_hits,
                          noise_scope=config.noise_scope, compact_batch=not config.jit_compile, seed=config.seed,
                          name="output")
        per_token = output([hidden, targets])
        unigram = unigram_distribution(data.arrays["train_counts"])
        output.set_noise_distribution(unigram)
        # Start from the unigram model: exp(s - log Z) = p_unigram when the hidden state contributes nothing.
        output.bias.assign((np.log(unigram) + config.log_z).astype("float32"))
        return keras.Model([tokens, targets], per_token, name=self.name)

    def adapt_model(self, model: keras.Model, config: LanguageModelConfig, data: Splits) -> keras.Model:
        """Grows the embedding and the output layer for the words ``load_data`` added (after the old ones)."""
        words = data.state["vocabulary"]["tokens"]
        mapping = VocabularyMap.from_tokens(words[: model.get_layer("embedding").input_dim], words)
        if mapping.is_identity:
            return model
        grown = self.build_model(config, data)  # its output layer's bias and noise: the fine-tuning data's unigram
        transfer_weights(model, grown, {"embedding": mapping, "output": mapping})
        return grown

    def compile_args(self, config: LanguageModelConfig, data: Splits) -> dict[str, Any]:
        return {"loss": per_token_training_loss, "jit_compile": config.jit_compile}

    # --- evaluation -------------------------------------------------------------------------

    @staticmethod
    def perplexities(model: keras.Model, windows: tf.data.Dataset) -> dict[str, float]:
        """PPL^f (full softmax) and PPL^n (self-normalised) of the model on windows, 64 at a time.

        Args:
            model: the model.
            windows: a split, unbatched.

        Returns:
            ``{"ppl_full", "ppl_self_normalized"}``.
        """
        body = keras.Model(model.inputs[0], model.get_layer("hidden").output)
        output = model.get_layer("output")

        @tf.function(autograph=False)
        def log_probs(tokens: tf.Tensor, targets: tf.Tensor) -> dict[str, tf.Tensor]:
            return output.target_log_probs(body(tokens, training=False), targets)

        full, normalized = [], []
        for inputs, _ in windows.batch(64):
            found = log_probs(inputs["tokens"], inputs["targets"])
            full.append(found["full"].numpy().reshape(-1))
            normalized.append(found["self_normalized"].numpy().reshape(-1))
        return {"ppl_full": perplexity(np.concatenate(full)),
                "ppl_self_normalized": perplexity(np.concatenate(normalized))}

    def epoch_metrics(self, model: keras.Model, config: LanguageModelConfig, data: Splits) -> dict[str, float]:
        """``perplexities`` on the first ``EPOCH_METRIC_EXAMPLES`` validation windows."""
        return self.perplexities(model, data.val.take(EPOCH_METRIC_EXAMPLES))

    def evaluate(self, model: keras.Model, config: LanguageModelConfig,
                 data: Splits) -> tuple[dict[str, float], dict[str, Any]]:
        metrics = {**self.perplexities(model, data.test), "parameters": int(model.count_params()),
                   "vocabulary": len(data.state["vocabulary"]["tokens"])}
        metrics.update(self.throughput(model, config, data))
        unigram = unigram_log_probs(data.arrays["train_counts"], data.arrays["test_targets"])
        return metrics, {"unigram": {"ppl_full": perplexity(unigram)}}

    def throughput(self, model: keras.Model, config: LanguageModelConfig, data: Splits) -> dict[str, float]:
        """Times training steps of a fresh copy of ``model`` (the trained weights are not touched).

        Args:
            model: the trained model; its config and compile settings are copied.
            config: the batch size, window length, optimizer and ``timing_steps``.
            data: the training split.

        Returns:
            ``train_tokens_per_s`` and ``train_seconds_per_epoch`` (a pass over the
            training windows, or ``steps_per_epoch`` of them, at that speed; the
            run's ``training.seconds`` also counts validation).
        """
        if config.timing_steps == 0:
            return {}
        step = seconds_per_training_step(model, config, self.compile_args(config, data), data, config.timing_steps)
        steps = config.steps_per_epoch or math.ceil(int(data.train.cardinality()) / config.batch_size)
        return {"train_tokens_per_s": round(config.batch_size * config.seq_len / step, 1),
                "train_seconds_per_epoch": round(steps * step, 1)}

    # --- serving ----------------------------------------------------------------------------

    def report_data(self, model: keras.Model, config: LanguageModelConfig, data: Splits,
                    export: ExportCalls) -> dict[str, np.ndarray]:
        """What the export says of a few test sentences: their perplexity and the likeliest next words."""
        sentences = np.array(data.arrays["report_sentences"], dtype=object)
        if not len(sentences):
            return {}
        outputs = export("serving_default", {"text": sentences})
        return {"sentences/text": sentences.astype(str), "sentences/perplexity": outputs["perplexity"],
                "sentences/next_words": np.vectorize(predictions.text)(outputs["next_words"]),
                "sentences/next_log_probs": outputs["next_log_probs"]}

    def report_sections(self, result: dict[str, Any], arrays: dict[str, np.ndarray]) -> list[Section]:
        """PPL^f and PPL^n over training beside the unigram baseline; the export's view of a few test sentences."""
        history = (result.get("training") or {}).get("history") or {}
        curves = {label: run_folder.epoch_curve(history, f"val_{key}") for key, label in PERPLEXITIES}
        curves = {label: curve for label, curve in curves.items() if curve[0]}
        blocks: list[Any] = []
        unigram = ((result.get("baseline") or {}).get("unigram") or {}).get("ppl_full")
        if curves:
            epochs = sorted({epoch for xs, _ in curves.values() for epoch in xs})
            if isinstance(unigram, (int, float)):
                curves["unigram baseline (test PPL^f)"] = (epochs, [unigram] * len(epochs))
            values = [value for _, ys in curves.values() for value in ys]
            blocks.append(plots.line_chart("perplexity", "validation perplexity per epoch", curves, "epoch",
                                           "perplexity", log_y=max(values) > 10 * min(values), markers=True,
                                           caption="PPL^f: full softmax; PPL^n: self-normalised, exp(s - log Z); "
                                                   "PPL^n near PPL^f: the scores need no normalisation"))
        blocks.append(run_folder.last_epoch_table(result, PERPLEXITIES))
        if "sentences/text" in arrays:
            columns = [arrays[f"sentences/{name}"] for name in ("text", "perplexity", "next_words", "next_log_probs")]
            rows = [[text, float(ppl), ", ".join(f"{word} ({math.exp(log_p):.1%})"
                                                 for word, log_p in zip(words, scores))]
                    for text, ppl, words, scores in zip(*columns)]
            table = Table(["test sentence", "perplexity", "likeliest next words"], rows,
                          caption="serving_default on test lines: full-softmax perplexity, each word predicted "
                                  "from the sentence start")
        else:
            table = Text("(no sentences: the run saved no report data)")
        return [Section("Perplexity over training", blocks, anchor="perplexity"),
                Section("Sentences scored by the export", [table], anchor="sentences")]

    def serving_module(self, model: keras.Model, config: LanguageModelConfig, data: Splits) -> ServingModule:
        state = data.state
        vocabulary = text_data.Vocabulary(**state["vocabulary"])
        word_lookup = vocabulary.lookup(name="words")
        body = keras.Model(model.inputs[0], model.get_layer("hidden").output)
        output = model.get_layer("output")
        prefix, top_k = state["context"] + 1, min(state["top_k"], len(vocabulary))
        eos_id = vocabulary.id(text_data.END_OF_SENTENCE)

        def serve(inputs: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
            ragged = word_lookup.ids(TOKENIZER.tf_tokenize(inputs["text"]))
            lengths = tf.cast(ragged.row_lengths(), tf.int32)
            ids = ragged.to_tensor(eos_id)
            batch = tf.shape(ids)[0]
            inputs = tf.concat([tf.fill([batch, prefix], eos_id), ids], axis=1)
            log_probs = output(body(inputs, training=False))  # [batch, words + 1, V], full softmax
            mask = tf.sequence_mask(lengths, tf.shape(ids)[1], dtype=log_probs.dtype)
            word_log_probs = tf.gather(log_probs[:, :-1], ids, batch_dims=2) * mask
            total = tf.reduce_sum(word_log_probs, axis=1)
            next_word = tf.math.top_k(tf.gather(log_probs, lengths, batch_dims=1), k=top_k)
            seen = tf.where(mask > 0, word_lookup.tokens(ids), "")
            return {"words": seen, "log_probs": word_log_probs,
                    "perplexity": tf.exp(-total / tf.cast(tf.maximum(lengths, 1), total.dtype)),
                    "next_words": word_lookup.tokens(next_word.indices),
                    "next_log_probs": next_word.values}

        example = {"text": np.array(["the quick brown fox jumps over the lazy dog", ""], dtype=object)}
        return ServingModule(model, {"serving_default": Signature({"text": tf.TensorSpec([None], tf.string)},
                                                                  example, run=serve)},
                             resources={"words": word_lookup})

    def format_prediction(self, state: dict[str, Any], inputs: dict[str, np.ndarray],
                          outputs: dict[str, np.ndarray], signature: str = "serving_default",
                          given: Sequence[str] = ()) -> tuple[str, Any]:
        results, lines = [], []
        for i, text in enumerate(inputs["text"]):
            seen = [w.decode() for w in outputs["words"][i] if w]
            scores = [round(float(v), 3) for v in outputs["log_probs"][i][: len(seen)]]
            following = [{"word": w.decode(), "log_prob": round(float(v), 3)}
                         for w, v in zip(outputs["next_words"][i], outputs["next_log_probs"][i])]
            result = {"text": predictions.text(text), "perplexity": round(float(outputs["perplexity"][i]), 2),
                      "words": [{"word": w, "log_prob": s} for w, s in zip(seen, scores)], "next_words": following}
            results.append(result)
            lines.append(f"{predictions.quoted(text)}: perplexity {result['perplexity']}; next: "
                         + ", ".join(f"{n['word']} ({math.exp(n['log_prob']):.1%})" for n in following))
        return "\n".join(lines), {"results": results}

