"""Character-level language model with a two-level HRNN whose upper level ticks at word ends.

The lower RNN reads one character per step (one-hot) and predicts the next one. The
upper RNN ticks after every space or line break (the word-boundary input of
``DecoupledHRNN``), when the lower state is sent up and reset. ``mode=decoupled``
trains it with restricted gradients plus the decoder loss (the level-1 decoder
reconstructs one of the last ``periods`` characters of the word), ``mode=hrnn``
with true gradients (the unrestricted baseline of the paper).

Text is split into lines; the validation and test lines are spread evenly through
the text (``seqapps.data.text.split_lines``). Each split is joined with line breaks and cut
into windows of ``seq_len`` + 1 characters. Default data: Python's help topics
(``pydoc_data``, pip-free); ``corpus=kjv`` or ``wordnet`` read the apt corpora,
``--data your.txt`` any UTF-8 text. Fine-tuning (``seqapps finetune hrnn_char_lm --from
EXPORT --data your.txt``) adds every character of the training lines that the export lacks
(``vocabulary=extend``, the default; ``min_char_count`` applies to a vocabulary built from
scratch only): the old characters keep their ids, the new ones follow, and the one-hot
input (the bottom cell's kernel rows), the output head and the level-1 decoder's output
grow by as many entries (``seqapps.finetuning.transfer_weights``; the new ones start as a
fresh model's). ``vocabulary=keep`` keeps the export's characters, new ones mapping to the
unknown id.

Metric: bits per character on the test windows, beside the training characters'
unigram distribution (add-one smoothed); the same on the first validation windows after
every epoch, from the main output only (not the decoder's loss; the report draws it under
the mode's name).

The export's ``serving_default`` takes ``text`` (string [batch]) and returns
``bits_per_character`` (the model's cost of the text, each character predicted from
a line break and the characters before it), ``next_chars`` (the 5 likeliest next
characters, string [batch, 5]) and ``next_probabilities`` (float32 [batch, 5]).
Characters map to ids with the vocabulary's asset-file lookup tables (``seqapps.data.text``).
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Sequence

import keras
import numpy as np
import tensorflow as tf

from seqapps import metrics, predictions
from seqapps.config import HRNNConfig, require, require_split_fractions
from seqapps.data import datasets, samples
from seqapps.data import splits as split_rule
from seqapps.data import text as text_data
from seqapps.errors import DataError
from seqapps.export import ExportCalls, ServingModule, Signature
from seqapps.finetuning import (VOCABULARY_CHOICES, VocabularyMap, fine_tuning_vocabulary, transfer_weights,
                                vocabulary_report)
from seqapps.hrnn import bench_report_data, build_hrnn, mode_and_bench_sections
from seqapps.layers.hrnn_model import HRNNSequenceModel
from seqapps.pipeline import EPOCH_METRIC_EXAMPLES, SPLIT_COUNTS, VOCABULARIES, Headline, Pipeline, Splits
from seqapps.report.document import Section

CORPORA = {"pydoc": text_data.pydoc_topics, "kjv": text_data.kjv_bible, "wordnet": text_data.wordnet_glosses}
START = "\n"  # every text is read after a line break, as every training line is
BOUNDARIES = ("\n", " ")  # the upper level ticks after these
TOP = 5
TOKENIZER = text_data.Tokenizer("char")


@dataclasses.dataclass
class HRNNCharLMConfig(HRNNConfig):
    """Char LM settings (plus the hierarchy's, see ``HRNNConfig``; ``periods`` bounds the decoder's index).

    Attributes:
        corpus: default data without ``--data``: "pydoc", "kjv" or "wordnet".
        seq_len: characters per training window.
        max_chars: use only the first lines up to this many characters (None: all).
        min_char_count: rarer training characters map to the unknown id (at fine-tuning every new one is added).
        val_fraction, test_fraction: shares of the lines held out.
        vocabulary: at fine-tuning, "extend" (the training lines' new characters get ids after the export's)
            or "keep" (the export's characters; new ones map to the unknown id).
    """

    corpus: str = "pydoc"
    seq_len: int = 100
    max_chars: int | None = 400_000
    min_char_count: int = 5
    val_fraction: float = 0.05
    test_fraction: float = 0.05
    vocabulary: str = "extend"
    PRESETS = {
        "tiny": {"seq_len": 40, "max_chars": 30_000, "units": [16, 16], "aux_hidden_units": 16, "epochs": 1,
                 "steps_per_epoch": 3, "batch_size": 16},
        "default": {"units": [128, 128], "aux_hidden_units": 64, "epochs": 6, "steps_per_epoch": 150,
                    "batch_size": 32, "learning_rate": 2e-3},
        "full": {"corpus": "kjv", "max_chars": None, "units": [512, 512], "aux_hidden_units": 256, "epochs": 50,
                 "batch_size": 64, "early_stopping_patience": 5},
    }

    def validate(self) -> None:
        super().validate()
        require(len(self.units) == 2, "units", self.units, "two integers (lower and upper level)")
        require(self.mode != "mr_hrnn", "mode", self.mode,
                "hrnn, gr_hrnn or decoupled (mr_hrnn truncates to windows of periodic segments, "
                "which word-boundary ticks do not have)")
        require(self.corpus in CORPORA, "corpus", self.corpus, f"one of {', '.join(CORPORA)}")
        require(self.seq_len >= 2, "seq_len", self.seq_len, "an integer >= 2")
        require(self.max_chars is None or self.max_chars >= 1000, "max_chars", self.max_chars,
                "null or an integer >= 1000")
        require(self.vocabulary in VOCABULARY_CHOICES, "vocabulary", self.vocabulary,
                f"one of {', '.join(VOCABULARY_CHOICES)}")
        require(self.min_char_count >= 1, "min_char_count", self.min_char_count, "an integer >= 1")
        require_split_fractions(self.val_fraction, self.test_fraction)


def weighted_windows(ids: np.ndarray, seq_len: int, what: str) -> tuple[np.ndarray, np.ndarray]:
    """``text_data.windows`` with the targets as the HRNN model's lean train step reads them.

    Returns:
        ``(inputs, targets)``: int32 (n, seq_len) and float32 (n, seq_len, 2) of next id and weight 1.
    """
    inputs, targets = text_data.windows(ids, seq_len, what=what)
    return inputs, np.stack([targets.astype(np.float32), np.ones(targets.shape, np.float32)], axis=-1)


class HRNNCharLM(Pipeline):
    """Next-character prediction with an upper RNN that ticks at word ends."""

    Config = HRNNCharLMConfig
    predict_input = "texts, one per row: bits per character and the likeliest next characters"

    headline_metrics = (Headline("bpc", "BPC", "bits/char", higher_is_better=False),)

    def write_sample_data(self, folder: Path, seed: int = 0) -> tuple[str | None, list[str]]:
        """A text file of 40 sentences, some with accented letters the help topics lack."""
        lines = samples.sample_sentences(40, seed)
        lines[1::4] = [f"{line} at the café of the señor" for line in lines[1::4]]
        return str(samples.write_text(folder / "my_text.txt", lines)), ["the old man sees", "a café"]

    def load_data(self, config: HRNNCharLMConfig, data_path: str | None,
                  state: dict[str, Any] | None = None) -> Splits:
        corpus = (datasets.read_corpus(data_path) if data_path else CORPORA[config.corpus]()).head(config.max_chars)
        parts = text_data.joined_splits(corpus, config.val_fraction, config.test_fraction, START)
        train_chars = TOKENIZER.tokenize(parts["train"])
        if state is None:
            vocabulary = text_data.build_vocabulary(train_chars, min_count=config.min_char_count, reserved=BOUNDARIES)
            exported = len(vocabulary)
        else:  # fine-tuning: every new character (vocabulary=extend) after the export's
            vocabulary = fine_tuning_vocabulary(state["vocabulary"], train_chars, config.vocabulary)
            exported = len(state["vocabulary"]["tokens"])
        state = {**(state or {}), "vocabulary": vocabulary.state()}
        streams = {name: vocabulary.encode(TOKENIZER.tokenize(part)) for name, part in parts.items()}
        splits = {name: weighted_windows(stream, config.seq_len, f"{corpus.source}: the {name} split")
                  for name, stream in streams.items()}
        report = {"source": corpus.source, "licence": corpus.licence, "lines": len(corpus.lines),
                  SPLIT_COUNTS: split_rule.split_counts("lines", split_rule.split_sizes(
                      len(corpus.lines), config.val_fraction, config.test_fraction, corpus.source, "lines")),
                  "characters": corpus.num_chars,
                  "vocabulary": len(vocabulary), "windows": {name: int(len(w[0])) for name, w in splits.items()},
                  VOCABULARIES: {"characters": vocabulary_report(exported, vocabulary.tokens,
                                                                 TOKENIZER.tokenize(parts["test"]))}}
        return Splits(*(tf.data.Dataset.from_tensor_slices(splits[name]) for name in ("train", "val", "test")),
                      state=state, report=report,
                      arrays={"val": splits["val"], "test": splits["test"],
                              "train_counts": np.bincount(streams["train"], minlength=len(vocabulary))})

    def build_model(self, config: HRNNCharLMConfig, data: Splits) -> keras.Model:
        vocabulary = text_data.Vocabulary(**data.state["vocabulary"])
        model = HRNNSequenceModel(build_hrnn(config, len(vocabulary), "categorical_crossentropy"),
                                  one_hot_depth=len(vocabulary), boundary_ids=[vocabulary.id(c) for c in BOUNDARIES],
                                  name=self.name)
        model.build((None, None))
        return model

    def adapt_model(self, model: keras.Model, config: HRNNCharLMConfig, data: Splits) -> keras.Model:
        """Grows the one-hot input, the head and the level-1 decoder's output for the characters ``load_data``
        added (after the old ones)."""
        chars = data.state["vocabulary"]["tokens"]
        mapping = VocabularyMap.from_tokens(chars[: model.one_hot_depth], chars)
        if mapping.is_identity:
            return model
        grown = self.build_model(config, data)
        hrnn = grown.hrnn  # the bottom cell reads the one-hot characters, then the level above
        layers = [hrnn.cells[0], hrnn.head, *hrnn.decoder_output[:1]]  # decoder 1 reconstructs the characters
        transfer_weights(model, grown, {layer.path: mapping for layer in layers})
        return grown

    def compile_args(self, config: HRNNCharLMConfig, data: Splits) -> dict[str, Any]:
        return {"jit_compile": False}  # the lean train_step computes its own loss

    @staticmethod
    def bits_per_char(model: keras.Model, inputs: np.ndarray, targets: np.ndarray) -> float:
        """The model's bits per character on windows, from its main output (the next character).

        Args:
            model: the model.
            inputs, targets: windows as ``weighted_windows`` makes them.
        """
        logits = model.predict(inputs, batch_size=64, verbose=0)
        return metrics.bits_per_char(metrics.label_log_probs(logits, targets[..., 0]))

    def epoch_metrics(self, model: keras.Model, config: HRNNCharLMConfig, data: Splits) -> dict[str, float]:
        """``bits_per_char`` on the first ``EPOCH_METRIC_EXAMPLES`` validation windows."""
        inputs, targets = data.arrays["val"]
        return {"bpc": self.bits_per_char(model, inputs[:EPOCH_METRIC_EXAMPLES], targets[:EPOCH_METRIC_EXAMPLES])}

    def evaluate(self, model: keras.Model, config: HRNNCharLMConfig,
                 data: Splits) -> tuple[dict[str, float], dict[str, Any]]:
        inputs, targets = data.arrays["test"]
        unigram = metrics.unigram_log_probs(data.arrays["train_counts"], targets[..., 0].astype(np.int64))
        return ({"bpc": self.bits_per_char(model, inputs, targets)},
                {"unigram": {"bpc": metrics.bits_per_char(unigram)}})

    def report_data(self, model: keras.Model, config: HRNNCharLMConfig, data: Splits,
                    export: ExportCalls) -> dict[str, np.ndarray]:
        """The memory bench's rows, when it was run (``seqapps.hrnn.bench_report_data``)."""
        return bench_report_data(export.path)

    def report_sections(self, result: dict[str, Any], arrays: dict[str, np.ndarray]) -> list[Section]:
        """Bits per character per epoch under the mode's name, and the memory bench."""
        return mode_and_bench_sections(result, arrays, [("bpc", "bits per character")])

    def serving_module(self, model: keras.Model, config: HRNNCharLMConfig, data: Splits) -> ServingModule:
        size = len(data.state["vocabulary"]["tokens"])
        char_lookup = text_data.Vocabulary(**data.state["vocabulary"]).lookup(name="chars")

        def serve(inputs: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
            ids = char_lookup.ids(TOKENIZER.tf_tokenize(START + inputs["text"]))
            lengths = tf.cast(ids.row_lengths(), tf.int32)
            dense = ids.to_tensor()
            mask = tf.sequence_mask(lengths, tf.shape(dense)[1])
            log_probs = tf.nn.log_softmax(model(dense, training=False, mask=mask), axis=-1)
            scored = tf.sequence_mask(lengths - 1, tf.shape(dense)[1])
            following = tf.concat([dense[:, 1:], tf.zeros_like(dense[:, :1])], axis=1)
            nats = -tf.gather(log_probs, following, batch_dims=2)
            bits = tf.reduce_sum(tf.where(scored, nats, 0.0), axis=1) / math.log(2)
            bpc = tf.math.divide_no_nan(bits, tf.cast(lengths - 1, tf.float32))
            last = tf.gather(log_probs, lengths - 1, batch_dims=1)
            top = tf.math.top_k(last, k=min(TOP, size))
            return {"bits_per_character": bpc, "next_chars": char_lookup.tokens(top.indices),
                    "next_probabilities": tf.exp(top.values)}

        example = {"text": np.array(["the value of ", "import"], dtype=object)}
        return ServingModule(model, {"serving_default": Signature({"text": tf.TensorSpec([None], tf.string)},
                                                                  example, run=serve)},
                             resources={"chars": char_lookup})

    def predict_inputs(self, state: dict[str, Any], inputs: list[str], signature: Any) -> dict[str, np.ndarray]:
        if not all(inputs):
            raise DataError("expected non-empty text inputs")
        return {"text": np.array(inputs, dtype=object)}

    def format_prediction(self, state: dict[str, Any], inputs: dict[str, np.ndarray],
                          outputs: dict[str, np.ndarray], signature: str = "serving_default",
                          given: Sequence[str] = ()) -> tuple[str, Any]:
        rows = []
        for text, bpc, chars, probs in zip(inputs["text"], outputs["bits_per_character"], outputs["next_chars"],
                                           outputs["next_probabilities"]):
            rows.append({"text": predictions.text(text), "bits_per_character": round(float(bpc), 4),
                         "next": [{"char": c.decode("utf-8"), "p": round(float(p), 4)} for c, p in zip(chars, probs)]})
        lines = [f"{predictions.quoted(row['text'])}: {row['bits_per_character']:.3f} bits/char; next: "
                 + ", ".join(f"{n['char']!r} {n['p']:.3f}" for n in row["next"]) for row in rows]
        return "\n".join(lines), {"predictions": rows}
