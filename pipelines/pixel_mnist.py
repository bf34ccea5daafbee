"""Sequential pixel digit classification (pixel MNIST) with the decoupled HRNN.

The model reads an image one pixel per step (row by row, T = ``image_size``^2, 784
for 28x28), optionally in a fixed random order (``permute=true``: permuted pixel
MNIST), and classifies the digit from its output at the last step; only that step
is scored. Default data: scikit-learn's bundled 8x8 digits (1,797 images, BSD-3),
scaled to 0..255 and resized bilinearly to ``image_size``; ``--data tfds:mnist``
reads MNIST from a local tensorflow_datasets folder (no download).

Metric: test accuracy (and cross-entropy), beside the majority class and a
logistic regression on the raw pixels; the accuracy on the first validation images
after every epoch (the report draws it under the mode's name).

The export's ``serving_default`` takes ``image``, a string tensor [batch] of
encoded grayscale or colour JPEG/PNG/GIF/BMP bytes (any size up to the limits of
``seqapps.data.images.decode_images``: converted to gray and resized to ``image_size``
in the graph; pixels 0..255, white digit on black as in MNIST), and
returns ``label`` (int64 digit) and ``probabilities`` (float32 [batch, 10]). Its ``classify``
signature is TF Serving's classification API over the same graph: serialized ``tf.train.Example``s
(``inputs``), each with the encoded image as the bytes feature ``image``, in; ``classes`` (the digits
"0".."9") and ``scores`` (their probabilities), most probable first, out.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Sequence

import keras
import numpy as np
import tensorflow as tf

from seqapps.config import HRNNConfig, require, require_split_fractions
from seqapps.data import datasets, samples
from seqapps.data import splits as split_rule
from seqapps.data.images import IMAGES_PER_CALL, MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS, decode_images, read_image_bytes
from seqapps.errors import DataError
from seqapps.export import ExportCalls, Limits, ServingModule, Signature, examples_signature, ranked_classes
from seqapps.export_format import CLASSIFY_METHOD
from seqapps.hrnn import bench_report_data, build_hrnn, mode_and_bench_sections
from seqapps.layers.hrnn_model import HRNNSequenceModel
from seqapps.metrics import label_log_probs
from seqapps.pipeline import EPOCH_METRIC_EXAMPLES, SPLIT_COUNTS, Headline, Pipeline, Splits, row_inputs
from seqapps.report.document import Section

CLASSES = 10
PERMUTATION_SEED = 1234  # the permutation is fixed: the same for every run of an image size


@dataclasses.dataclass
class PixelMnistConfig(HRNNConfig):
    """Pixel MNIST settings (plus the hierarchy's, see ``HRNNConfig``).

    Attributes:
        image_size: images are resized to image_size x image_size; T = image_size^2.
        permute: read the pixels in a fixed random order.
        max_train_images: use at most this many training images (None: all).
        val_fraction, test_fraction: shares of the digits held out (tfds: of its train split
            for validation; its test split is the test set).
    """

    image_size: int = 28
    permute: bool = False
    max_train_images: int | None = None
    val_fraction: float = 0.15
    test_fraction: float = 0.15
    PRESETS = {
        "tiny": {"image_size": 8, "periods": 8, "units": [8, 8], "aux_hidden_units": 8, "epochs": 1,
                 "steps_per_epoch": 3, "batch_size": 16, "max_train_images": 96,
                 "val_fraction": 0.03, "test_fraction": 0.03},
        "default": {"image_size": 14, "units": [64, 64], "epochs": 15, "batch_size": 32, "learning_rate": 2e-3},
        "full": {"units": [128, 128], "aux_hidden_units": 128, "epochs": 100, "batch_size": 100,
                 "early_stopping_patience": 10, "lr_patience": 4},
    }

    def validate(self) -> None:
        super().validate()
        require(2 <= self.image_size <= 64, "image_size", self.image_size, "an integer in [2, 64]")
        require(self.max_train_images is None or self.max_train_images >= 1, "max_train_images",
                self.max_train_images, "null or an integer >= 1")
        require_split_fractions(self.val_fraction, self.test_fraction)


def digits_images() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits as float32 (n, 8, 8) in 0..255 and int labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    return (digits.images * (255.0 / 16.0)).astype(np.float32), digits.target.astype(np.int64)


def pixel_order(image_size: int, permute: bool) -> np.ndarray:
    """Returns the order in which pixels are read: identity or a fixed permutation."""
    steps = image_size * image_size
    if not permute:
        return np.arange(steps)
    return np.random.default_rng(PERMUTATION_SEED).permutation(steps)


def digit_folder(folder: Path, image_size: int) -> tuple[np.ndarray, np.ndarray, str]:
    """A user's digit images: one sub-folder per digit, ``0/`` to ``9/`` (Keras' ``image_dataset_from_directory``
    layout), of PNG, JPEG, GIF or BMP files, light ink on dark as in MNIST.

    Each image is decoded and resized as the export's signature does (``decode_images``, luma).

    Args:
        folder: the folder.
        image_size: the side the images are resized to.

    Returns:
        ``(images float32 [n, size, size] in 0..255, labels int64 [n], the folder's name)``.

    Raises:
        DataError: the folder is a file, holds no digit folder, a sub-folder is not named by a digit,
            or a file is not an image (named).
    """
    if not folder.is_dir():
        raise DataError(f"{folder}: expected a folder with one sub-folder per digit (0/ ... 9/) of images, "
                        "or tfds:mnist, or no --data for the bundled scikit-learn digits")
    subfolders = sorted(path for path in folder.iterdir() if path.is_dir() and not path.name.startswith("."))
    wrong = [path.name for path in subfolders if path.name not in [str(d) for d in range(CLASSES)]]
    if wrong or not subfolders:
        raise DataError(f"{folder / wrong[0] if wrong else folder}: expected sub-folders named by digits 0-9, "
                        f"one per class, holding its images")
    files = [(path, int(sub.name)) for sub in subfolders for path in sorted(sub.iterdir())
             if path.is_file() and not path.name.startswith(".")]
    if not files:
        raise DataError(f"{folder}: the digit folders hold no image files")
    encoded = [read_image_bytes(path) for path, _ in files]
    images = np.concatenate([decode_images(tf.constant(encoded[start: start + 256]), image_size, image_size,
                                           channels=1, max_request_pixels=None).numpy()[..., 0]
                             for start in range(0, len(encoded), 256)])
    return images.astype(np.float32), np.array([label for _, label in files], np.int64), str(folder)


class PixelMnist(Pipeline):
    """Classify a digit read one pixel per step (plain or permuted order)."""

    Config = PixelMnistConfig
    predict_input = "image files of digits (PNG, JPEG, GIF or BMP), one per row"
    predict_rows_per_call = IMAGES_PER_CALL  # within the graph's pixel budget of one call, whatever the files' sizes

    headline_metrics = (Headline("accuracy", "accuracy", "%", 100.0),
                        Headline("cross_entropy", "cross-entropy", "nats", higher_is_better=False))

    def write_sample_data(self, folder: Path, seed: int = 0) -> tuple[str | None, list[str]]:
        """A folder of 30 digit images, one sub-folder per digit."""
        files = samples.write_digit_folders(folder / "digits", per_digit=3, seed=seed)
        return str(folder / "digits"), [str(files[0]), str(files[-1])]

    def load_data(self, config: PixelMnistConfig, data_path: str | None,
                  state: dict[str, Any] | None = None) -> Splits:
        rng = np.random.default_rng(config.seed)
        if data_path is None:
            images, labels = digits_images()
            order = rng.permutation(len(labels))
            n_val, n_test = round(len(order) * config.val_fraction), round(len(order) * config.test_fraction)
            parts = {"val": order[:n_val], "test": order[n_val:n_val + n_test], "train": order[n_val + n_test:]}
            raw = {name: (images[index], labels[index]) for name, index in parts.items()}
            source = "sklearn.datasets.load_digits (8x8, BSD-3)"
        elif datasets.is_tfds(data_path):
            loaded = datasets.tfds_images(data_path)  # train and test, or the one split named
            images, labels = loaded["train"]
            order = rng.permutation(len(labels))
            n_val = round(len(order) * config.val_fraction)
            n_test = 0 if "test" in loaded else round(len(order) * config.test_fraction)
            held_out = order[n_val:n_val + n_test]
            raw = {"val": (images[order[:n_val]], labels[order[:n_val]]),
                   "test": loaded.get("test", (images[held_out], labels[held_out])),
                   "train": (images[order[n_val + n_test:]], labels[order[n_val + n_test:]])}
            source = data_path
        else:
            images, labels, source = digit_folder(Path(data_path), config.image_size)
            assigned = np.array(split_rule.assign_splits(len(labels), config.val_fraction, config.test_fraction,
                                                         source, "images", "shuffle", config.seed))
            raw = {name: (images[assigned == name], labels[assigned == name]) for name in ("val", "test", "train")}
        if config.max_train_images is not None:
            raw["train"] = tuple(part[: config.max_train_images] for part in raw["train"])
        size = config.image_size
        order = pixel_order(size, config.permute)
        state = {"image_size": size, "permute": config.permute, "order": order.tolist()}
        splits = {}
        for name, (images, labels) in raw.items():
            pixels = self._sequences(tf.image.resize(images[..., None], [size, size]).numpy()[..., 0], order)
            targets = np.zeros((len(labels), size * size, 2), np.float32)
            targets[:, -1] = np.stack([labels, np.full(len(labels), size * size)], axis=1)
            splits[name] = (pixels, targets)
        report = {"source": source, "image_size": size, "steps": size * size, "permute": config.permute,
                  "images": {name: int(len(part[1])) for name, part in raw.items()}}
        report[SPLIT_COUNTS] = split_rule.split_counts("images", report["images"])
        arrays = {"val": splits["val"], "val_labels": raw["val"][1],
                  "test": splits["test"], "test_labels": raw["test"][1], "train_labels": raw["train"][1],
                  "train_pixels": splits["train"][0][..., 0], "test_images": raw["test"][0][:2]}
        return Splits(*(tf.data.Dataset.from_tensor_slices(splits[name]) for name in ("train", "val", "test")),
                      state=state, report=report, arrays=arrays)

    @staticmethod
    def _sequences(images: np.ndarray, order: np.ndarray) -> np.ndarray:
        """(n, s, s) pixels in 0..255 -> (n, s*s, 1) in 0..1, in reading order."""
        flat = np.clip(images.reshape(len(images), -1), 0, 255) / 255.0
        return flat[:, order, None].astype(np.float32)

    def build_model(self, config: PixelMnistConfig, data: Splits) -> keras.Model:
        model = HRNNSequenceModel(build_hrnn(config, CLASSES, "mse"), name=self.name)
        model.build((None, None, 1))
        return model

    def compile_args(self, config: PixelMnistConfig, data: Splits) -> dict[str, Any]:
        return {"jit_compile": False}  # the lean train_step computes its own loss

    @staticmethod
    def scores(model: keras.Model, pixels: np.ndarray, labels: np.ndarray) -> dict[str, float]:
        """Accuracy and cross-entropy (nats) of the digit read from the last step's output.

        Args:
            model: the model.
            pixels: (n, T, 1) sequences in reading order, in 0..1.
            labels: (n,) digits.
        """
        logits = model.predict(pixels, batch_size=128, verbose=0)[:, -1]
        return {"accuracy": float((logits.argmax(-1) == labels).mean()),
                "cross_entropy": float(-label_log_probs(logits, labels).mean())}

    def epoch_metrics(self, model: keras.Model, config: PixelMnistConfig, data: Splits) -> dict[str, float]:
        """The accuracy (``scores``) on the first ``EPOCH_METRIC_EXAMPLES`` validation images."""
        first = slice(EPOCH_METRIC_EXAMPLES)
        scores = self.scores(model, data.arrays["val"][0][first], data.arrays["val_labels"][first])
        return {"accuracy": scores["accuracy"]}

    def evaluate(self, model: keras.Model, config: PixelMnistConfig,
                 data: Splits) -> tuple[dict[str, float], dict[str, Any]]:
        from sklearn.linear_model import LogisticRegression

        pixels, _ = data.arrays["test"]
        labels, train_labels = data.arrays["test_labels"], data.arrays["train_labels"]
        metrics = self.scores(model, pixels, labels)
        majority = np.bincount(train_labels, minlength=CLASSES).argmax()
        regression = LogisticRegression(max_iter=500).fit(data.arrays["train_pixels"], train_labels)
        return metrics, {
            "majority_class": {"accuracy": float((labels == majority).mean())},
            "logistic_regression": {"accuracy": float((regression.predict(pixels[..., 0]) == labels).mean())},
        }

    def report_data(self, model: keras.Model, config: PixelMnistConfig, data: Splits,
                    export: ExportCalls) -> dict[str, np.ndarray]:
        """The memory bench's rows, when it was run (``seqapps.hrnn.bench_report_data``)."""
        return bench_report_data(export.path)

    def report_sections(self, result: dict[str, Any], arrays: dict[str, np.ndarray]) -> list[Section]:
        """The accuracy per epoch under the mode's name, and the memory bench."""
        return mode_and_bench_sections(result, arrays, [("accuracy", "accuracy")])

    def serving_module(self, model: keras.Model, config: PixelMnistConfig, data: Splits) -> ServingModule:
        size = data.state["image_size"]
        order = tf.constant(data.state["order"], tf.int32)

        def serve(inputs: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
            images = decode_images(inputs["image"], size, size, channels=1)
            pixels = tf.clip_by_value(tf.reshape(images, [-1, size * size]), 0.0, 255.0) / 255.0
            logits = model(tf.gather(pixels, order, axis=1)[..., None], training=False)[:, -1]
            probabilities = tf.nn.softmax(logits, axis=-1)
            return {"label": tf.argmax(probabilities, axis=-1), "probabilities": probabilities}

        images = data.arrays["test_images"]
        encoded = [tf.io.encode_png(tf.cast(tf.round(image[..., None]), tf.uint8)).numpy() for image in images]
        example = {"image": np.array(encoded, dtype=object)}
        default = Signature({"image": tf.TensorSpec([None], tf.string)}, example, run=serve)
        digits = tf.constant([str(digit) for digit in range(10)])
        classify = examples_signature(default, CLASSIFY_METHOD,
                                      lambda outputs: ranked_classes(digits, outputs["probabilities"]))
        return ServingModule(model, {"serving_default": default, "classify": classify})

    def limits(self, config: PixelMnistConfig, data: Splits) -> Limits:
        # The bounds decode_images enforces in the graph, declared so that servers answer 400 before decoding.
        return Limits(max_string_bytes=MAX_IMAGE_BYTES, max_image_pixels=MAX_IMAGE_PIXELS)

    def predict_inputs(self, state: dict[str, Any], inputs: list[str], signature: Any) -> dict[str, np.ndarray]:
        return {"image": np.array([read_image_bytes(name) for name in inputs], dtype=object)}

    def format_prediction(self, state: dict[str, Any], inputs: dict[str, np.ndarray],
                          outputs: dict[str, np.ndarray], signature: str = "serving_default",
                          given: Sequence[str] = ()) -> tuple[str, Any]:
        files = row_inputs(given, inputs, len(outputs["label"]))
        rows = [{"input": name, "label": int(label), "probabilities": [round(float(p), 4) for p in probs]}
                for name, label, probs in zip(files, outputs["label"], outputs["probabilities"])]
        text = "\n".join(f"{row['input']}: digit {row['label']} (p = {max(row['probabilities']):.3f})" for row in rows)
        return text, {"predictions": rows}
