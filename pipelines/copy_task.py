"""The copy task of Mujika, Weissenberger & Steger (2019) for the decoupled HRNN.

A sequence of ``length`` (T) steps holds a random binary string of ``string_length``
(L) bits, then blanks; the model reads it one symbol per step (one-hot: 0, 1, blank)
and must output the string again at steps L..2L-1, right after it ends. Only those
L steps are scored. The lower level is reset every ``periods[0]`` (k) steps, so the
bits must pass through the upper level(s). Data is generated from the seed.

Metrics on held-out sequences: bits per character (cross-entropy of the copied bits,
in bits), whether the task is solved (bpc < ``solved_bpc``, 0.15 in the paper) and
bit accuracy; the baseline guesses uniform bits (1 bpc). The same, on the first
validation sequences, after every epoch (the report draws them under the mode's name).

The export's ``serving_default`` takes ``bits``, a string tensor [batch] such as
"0110" (at most T/2 characters; the model was trained on strings of L), and
returns ``copy``, the copied bits as a string, and ``confidence``, the mean
probability of the copied bits.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Sequence

import keras
import numpy as np
import tensorflow as tf

from seqapps.config import HRNNConfig, require
from seqapps.data import splits as split_rule
from seqapps.errors import DataError
from seqapps.export import ExportCalls, ServingModule, Signature
from seqapps.hrnn import bench_report_data, build_hrnn, mode_and_bench_sections
from seqapps.layers.hrnn_model import HRNNSequenceModel
from seqapps.metrics import bits_per_char, label_log_probs
from seqapps.pipeline import EPOCH_METRIC_EXAMPLES, SPLIT_COUNTS, Headline, Pipeline, Splits
from seqapps.report.document import Section

BLANK = 2
SYMBOLS = 3  # 0, 1, blank


@dataclasses.dataclass
class CopyTaskConfig(HRNNConfig):
    """Copy task settings (plus the hierarchy's, see ``HRNNConfig``).

    Attributes:
        length: steps per sequence (T).
        string_length: bits to copy (L), at most T/2.
        train_sequences, val_sequences, test_sequences: generated sequences per split.
        solved_bpc: a run solves the task when the test bits per character fall below this.
    """

    length: int = 200
    string_length: int = 10
    train_sequences: int = 20000
    val_sequences: int = 256
    test_sequences: int = 512
    solved_bpc: float = 0.15
    PRESETS = {
        "tiny": {"length": 20, "string_length": 4, "periods": 5, "units": [8, 8], "aux_hidden_units": 8,
                 "train_sequences": 64, "val_sequences": 16, "test_sequences": 16, "epochs": 1,
                 "steps_per_epoch": 3, "batch_size": 16},
        "default": {"string_length": 10, "train_sequences": 16000, "epochs": 40, "steps_per_epoch": 100,
                    "batch_size": 32, "learning_rate": 2e-3, "early_stopping_patience": 40, "lr_patience": 3},
        # The paper's settings, for a GPU or a long CPU run. 2 levels: T=200, k=10, L=100.
        "full": {"length": 200, "periods": 10, "string_length": 100, "units": [256, 256], "aux_hidden_units": 256,
                 "train_sequences": 100000, "epochs": 200, "steps_per_epoch": 500, "batch_size": 64,
                 "early_stopping_patience": 20, "lr_patience": 8},
        # 3 levels: k=5 then 25, T=1000, L=500; --set beta=0.1,0 drops the middle (level-2) decoder.
        "three_level": {"length": 1000, "periods": [5, 5], "string_length": 500, "units": [64, 256, 1024],
                        "aux_hidden_units": 256, "beta": [0.1, 1.0], "train_sequences": 100000, "epochs": 200,
                        "steps_per_epoch": 500, "batch_size": 64, "early_stopping_patience": 20,
                        "lr_patience": 8},
    }

    def validate(self) -> None:
        super().validate()
        require(self.length >= 2, "length", self.length, "an integer >= 2")
        require(1 <= self.string_length <= self.length // 2, "string_length", self.string_length,
                f"an integer in [1, length/2 = {self.length // 2}]")
        require(min(self.train_sequences, self.val_sequences, self.test_sequences) >= 1,
                "train_sequences/val_sequences/test_sequences",
                (self.train_sequences, self.val_sequences, self.test_sequences), "integers >= 1")
        require(self.solved_bpc > 0, "solved_bpc", self.solved_bpc, "a number > 0")


def copy_sequences(count: int, length: int, string_length: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Generates copy-task sequences.

    Args:
        count: sequences.
        length: steps per sequence (T).
        string_length: bits per string (L).
        rng: the random generator.

    Returns:
        ``(inputs, targets)``: int32 symbols (count, T) with the bits then blanks, and float32
        (count, T, 2) of target bit and weight; weight T/L at steps L..2L-1, 0 elsewhere.
    """
    bits = rng.integers(0, 2, size=(count, string_length), dtype=np.int32)
    inputs = np.full((count, length), BLANK, np.int32)
    inputs[:, :string_length] = bits
    targets = np.zeros((count, length, 2), np.float32)
    targets[:, string_length:2 * string_length, 0] = bits
    targets[:, string_length:2 * string_length, 1] = length / string_length
    return inputs, targets


class CopyTask(Pipeline):
    """Copy a binary string after reading it, through a (decoupled) hierarchical RNN."""

    Config = CopyTaskConfig
    predict_input = "strings of 0s and 1s, one per row"

    headline_metrics = (Headline("bpc", "bits per bit", higher_is_better=False),
                        Headline("bit_accuracy", "bits right", "%", 100.0), Headline("solved", "strings solved", "%", 100.0))

    def write_sample_data(self, folder: Path, seed: int = 0) -> tuple[str | None, list[str]]:
        """The copy task generates its sequences and reads no data; predict takes bit strings."""
        return None, ["0110", "1011"]

    def load_data(self, config: CopyTaskConfig, data_path: str | None,
                  state: dict[str, Any] | None = None) -> Splits:
        if data_path is not None:
            raise DataError(f"--data {data_path}: the copy task generates its data; set length, string_length "
                            "and the *_sequences fields instead")
        rng = np.random.default_rng(config.seed)
        splits = {name: copy_sequences(count, config.length, config.string_length, rng)
                  for name, count in [("train", config.train_sequences), ("val", config.val_sequences),
                                      ("test", config.test_sequences)]}
        state = {"length": config.length, "string_length": config.string_length}
        report = {"length": config.length, "string_length": config.string_length,
                  "sequences": {name: int(inputs.shape[0]) for name, (inputs, _) in splits.items()}}
        report[SPLIT_COUNTS] = split_rule.split_counts("sequences", report["sequences"])
        return Splits(*(tf.data.Dataset.from_tensor_slices(splits[name]) for name in ("train", "val", "test")),
                      state=state, report=report, arrays={"val": splits["val"], "test": splits["test"]})

    def build_model(self, config: CopyTaskConfig, data: Splits) -> keras.Model:
        model = HRNNSequenceModel(build_hrnn(config, 2, "categorical_crossentropy"), one_hot_depth=SYMBOLS,
                                  name=self.name)
        model.build((None, None))
        return model

    def compile_args(self, config: CopyTaskConfig, data: Splits) -> dict[str, Any]:
        return {"jit_compile": False}  # the lean train_step computes its own loss

    @staticmethod
    def scores(model: keras.Model, config: CopyTaskConfig, inputs: np.ndarray,
               targets: np.ndarray) -> dict[str, float]:
        """The task metrics of sequences: bits per copied bit, the share of copied bits right, solved or not.

        Args:
            model: the model.
            config: ``solved_bpc``.
            inputs, targets: sequences as ``copy_sequences`` makes them (only the weighted steps count).

        Returns:
            ``{"bpc", "bit_accuracy", "solved"}`` (solved: 1.0 when bpc < ``solved_bpc``, else 0.0).
        """
        logits = model.predict(inputs, batch_size=128, verbose=0)
        scored = targets[..., 1] > 0
        labels = targets[..., 0].astype(np.int64)
        bpc = bits_per_char(label_log_probs(logits, labels), scored)
        accuracy = float((logits.argmax(-1) == labels)[scored].mean())
        return {"bpc": bpc, "bit_accuracy": accuracy, "solved": float(bpc < config.solved_bpc)}

    def epoch_metrics(self, model: keras.Model, config: CopyTaskConfig, data: Splits) -> dict[str, float]:
        """``scores`` on the first ``EPOCH_METRIC_EXAMPLES`` validation sequences."""
        inputs, targets = data.arrays["val"]
        return self.scores(model, config, inputs[:EPOCH_METRIC_EXAMPLES], targets[:EPOCH_METRIC_EXAMPLES])

    def evaluate(self, model: keras.Model, config: CopyTaskConfig,
                 data: Splits) -> tuple[dict[str, float], dict[str, Any]]:
        return (self.scores(model, config, *data.arrays["test"]),
                {"uniform_bits": {"bpc": 1.0, "bit_accuracy": 0.5, "solved": 0.0}})

    def report_data(self, model: keras.Model, config: CopyTaskConfig, data: Splits,
                    export: ExportCalls) -> dict[str, np.ndarray]:
        """The memory bench's rows, when it was run (``seqapps.hrnn.bench_report_data``)."""
        return bench_report_data(export.path)

    def report_sections(self, result: dict[str, Any], arrays: dict[str, np.ndarray]) -> list[Section]:
        """Bits per bit per epoch under the mode's name, below which the task counts as solved; the memory bench."""
        solved_below = (result.get("config") or {}).get("solved_bpc")
        return mode_and_bench_sections(result, arrays, [("bpc", "bits per bit"), ("solved", "solved")],
                                    {"solved below": solved_below} if solved_below is not None else None)

    def serving_module(self, model: keras.Model, config: CopyTaskConfig, data: Splits) -> ServingModule:
        length = data.state["length"]

        def serve(inputs: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
            chars = tf.strings.bytes_split(inputs["bits"])
            symbols = tf.where(tf.equal(chars, "1"), 1, tf.where(tf.equal(chars, "0"), 0, BLANK))
            symbols = symbols.to_tensor(default_value=BLANK, shape=[None, length])
            given = tf.minimum(tf.cast(chars.row_lengths(), tf.int32), length // 2)
            probabilities = tf.nn.softmax(model(symbols, training=False), axis=-1)
            positions = tf.minimum(given[:, None] + tf.range(tf.reduce_max(given))[None, :], length - 1)
            copied = tf.gather(probabilities, positions, batch_dims=1)
            chosen = tf.RaggedTensor.from_tensor(tf.argmax(copied, axis=-1), lengths=given)
            text = tf.strings.reduce_join(tf.gather(tf.constant(["0", "1"]), chosen), axis=1)
            best = tf.RaggedTensor.from_tensor(tf.reduce_max(copied, axis=-1), lengths=given)
            confidence = tf.math.divide_no_nan(tf.reduce_sum(best, axis=1), tf.cast(given, tf.float32))
            return {"copy": text, "confidence": confidence}

        given = data.arrays["test"][0][:2, : data.state["string_length"]]
        example = {"bits": np.array(["".join(str(b) for b in row) for row in given], dtype=object)}
        return ServingModule(model, {"serving_default": Signature({"bits": tf.TensorSpec([None], tf.string)},
                                                                  example, run=serve)})

    def predict_inputs(self, state: dict[str, Any], inputs: list[str], signature: Any) -> dict[str, np.ndarray]:
        longest = state["length"] // 2
        for text in inputs:
            if not text or set(text) - {"0", "1"} or len(text) > longest:
                raise DataError(f"input {text!r}: expected a string of 0s and 1s, 1 to {longest} long "
                                f"(the model was trained on {state['string_length']} bits)")
        return {"bits": np.array(inputs, dtype=object)}

    def format_prediction(self, state: dict[str, Any], inputs: dict[str, np.ndarray],
                          outputs: dict[str, np.ndarray], signature: str = "serving_default",
                          given: Sequence[str] = ()) -> tuple[str, Any]:
        rows = [{"input": given.decode() if isinstance(given, bytes) else str(given), "copy": copy.decode(),
                 "confidence": round(float(confidence), 4)}
                for given, copy, confidence in zip(inputs["bits"], outputs["copy"], outputs["confidence"])]
        text = "\n".join(f"{row['input']} -> {row['copy']} (confidence {row['confidence']:.3f})" for row in rows)
        return text, {"copies": rows}
