"""The export format, known once: file names, the version rule, limits, the export reader, warm-up records.

``seqapps.export`` writes exports in this format and ``seqapps.serving`` reads them. The module
imports neither Keras nor TensorFlow at module level: ``seqapps finetune`` and ``seqapps predict``
read ``--from`` / the model path with ``read_export`` before TensorFlow is imported. Only the
warm-up functions import TensorFlow, when they are called.

Layout of one export (``saved_models/<pipeline>/<version>/``)::

    saved_model.pb, variables/      signatures: ``serving_default`` and any others, raw in, readable out
    assets/                         vocabularies and other files the graph reads (tf.lookup tables)
    assets.extra/config.yaml        the resolved config (pipeline, preset, fields)
    assets.extra/limits.json        request bounds (batch, string bytes, generated length, ...)
    assets.extra/metrics.json       test metrics and baselines of this version
    assets.extra/state.json         pipeline state (columns, frequency, ...) for predict/finetune
    assets.extra/model.keras        the trainable Keras model, for finetune
    assets.extra/tf_serving_warmup_requests   one PredictionLog record per signature (TF Serving warm-up)
"""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any, Mapping

import yaml

from seqapps.errors import ExportError

SAVED_MODEL_FILE = "saved_model.pb"
ASSETS_EXTRA = "assets.extra"  # TF Serving ignores this folder
CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.json"
STATE_FILE = "state.json"
LIMITS_FILE = "limits.json"
EXAMPLES_FILE = "examples_signatures.json"  # classify/regress signature -> the signature its tf.Examples feed
KERAS_MODEL_FILE = "model.keras"
WARMUP_FILE = "tf_serving_warmup_requests"  # the name TF Serving looks for in assets.extra
STAGING_PREFIX = ".tmp-"  # hidden folder an export is written to before it is renamed into place
DEFAULT_SIGNATURE = "serving_default"
# A SignatureDef's method_name: what TF Serving's Predict, Classify and Regress APIs accept.
PREDICT_METHOD = "tensorflow/serving/predict"
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"
EXAMPLES_INPUT = "inputs"  # the one input of a classify or regress signature: serialized tf.Examples
LENGTH_INPUT = re.compile(r"(.*_)?length")  # an integer input so named is a generated length (max_generated_length)
VERSION = re.compile(r"[0-9]{1,18}")  # ASCII digits only; 18 digits fit an int64, as TF Serving's


def parse_version(name: str) -> int | None:
    """Returns the version a folder or URL names, or ``None`` unless it is 1 to 18 ASCII digits.

    Args:
        name: a folder name or a URL's version part.

    Returns:
        The version number, or ``None``.
    """
    return int(name) if VERSION.fullmatch(name) else None


def version_dirs(model_root: Path) -> dict[int, Path]:
    """Returns ``{version: folder}`` for the folders under ``model_root`` that ``parse_version`` accepts.

    Other folders (``.tmp-*``, ``.checkpoints``, ``²``, 200 digits) are ignored: an export never
    depends on other folders' names.

    Args:
        model_root: ``saved_models/<pipeline>``; a missing folder has no versions.

    Returns:
        The version folders by number.
    """
    if not model_root.is_dir():
        return {}
    return {version: path for path in model_root.iterdir()
            if path.is_dir() and (version := parse_version(path.name)) is not None}


@dataclasses.dataclass(frozen=True)
class Limits:
    """Request bounds an export carries (``assets.extra/limits.json``); servers answer 400 past them.

    ``None`` means the bound does not apply to the pipeline. Pipelines also enforce
    their generation and size bounds in the graph, so TF Serving is bounded too.

    Attributes:
        max_batch_size: rows per request.
        max_string_bytes: bytes of one string input element (text, encoded audio or image).
        max_generated_length: tokens or characters a decoder may generate (the largest value of
            an integer input named ``length`` or ``*_length``).
        max_sequence_length: tokens or steps of one input sequence (a free non-batch dimension).
        max_audio_samples: samples of one waveform.
        max_image_pixels: decoded pixels of one image.
    """

    max_batch_size: int | None = 1024
    max_string_bytes: int | None = None
    max_generated_length: int | None = None
    max_sequence_length: int | None = None
    max_audio_samples: int | None = None
    max_image_pixels: int | None = None

    def to_dict(self) -> dict[str, int | None]:
        """The bounds as a JSON-able dict."""
        return dataclasses.asdict(self)


def read_limits(export_dir: str | Path) -> Limits | None:
    """Reads an export's ``assets.extra/limits.json``.

    Args:
        export_dir: the version folder.

    Returns:
        The bounds; a field the file leaves out or sets to ``null`` is ``None``, and keys that
        are not fields of ``Limits`` are ignored. ``None`` when the export has no such file
        (a SavedModel seqapps did not write).

    Raises:
        ExportError: the file is not a JSON object of non-negative integers or nulls.
    """
    path = Path(export_dir) / ASSETS_EXTRA / LIMITS_FILE
    if not path.is_file():
        return None
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise ExportError(f"{path}: not JSON ({error})") from None
    if not isinstance(values, dict) or not all(
            value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)
            for value in values.values()):
        raise ExportError(f"{path}: expected an object of non-negative integers or nulls")
    return Limits(**{field.name: values.get(field.name) for field in dataclasses.fields(Limits)})


def read_examples_signatures(export_dir: str | Path) -> dict[str, str]:
    """Reads which signature each classify or regress signature of an export wraps.

    Args:
        export_dir: the version folder.

    Returns:
        ``{classify or regress signature: the signature whose inputs its tf.Examples' features are}``;
        empty for an export without ``assets.extra/examples_signatures.json``.

    Raises:
        ExportError: the file is not a JSON object of signature names.
    """
    path = Path(export_dir) / ASSETS_EXTRA / EXAMPLES_FILE
    if not path.is_file():
        return {}
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise ExportError(f"{path}: not JSON ({error})") from None
    if not isinstance(values, dict) or not all(isinstance(value, str) for value in values.values()):
        raise ExportError(f"{path}: expected an object of signature names")
    return values


@dataclasses.dataclass
class ExportInfo:
    """An export folder and what ``assets.extra`` says about it."""

    path: Path
    pipeline: str
    preset: str
    config: dict[str, Any]
    state: dict[str, Any]
    metrics: dict[str, Any]

    @property
    def keras_model_path(self) -> Path:
        """The trainable model saved with the export."""
        return self.path / ASSETS_EXTRA / KERAS_MODEL_FILE

    @property
    def version(self) -> int:
        """The export's version number."""
        return int(self.path.name)


def read_export(path: str | Path) -> ExportInfo:
    """Reads an export folder; ``saved_models/NAME`` means its latest version.

    Args:
        path: a version folder, or a model folder holding version folders.

    Returns:
        The version folder and its saved config, state and metrics.

    Raises:
        ExportError: the folder is missing or is not a complete seqapps export.
    """
    path = Path(path)
    if not path.is_dir():
        raise ExportError(f"{path}: no such export folder (expected saved_models/NAME/VERSION)")
    if not (path / SAVED_MODEL_FILE).is_file():
        versions = version_dirs(path)
        if not versions:
            raise ExportError(f"{path}: not a SavedModel export (no {SAVED_MODEL_FILE}, and no version folders)")
        path = versions[max(versions)]
    extra = path / ASSETS_EXTRA
    needed = [CONFIG_FILE, STATE_FILE, METRICS_FILE, KERAS_MODEL_FILE]
    missing = [name for name in needed if not (extra / name).is_file()]
    if not (path / SAVED_MODEL_FILE).is_file() or missing:
        raise ExportError(f"{path}: incomplete export, missing {', '.join(missing) or SAVED_MODEL_FILE}")
    saved = yaml.safe_load((extra / CONFIG_FILE).read_text(encoding="utf-8"))
    if not isinstance(saved, dict) or "pipeline" not in saved:
        raise ExportError(f"{extra / CONFIG_FILE}: not a seqapps config (no 'pipeline' key)")
    return ExportInfo(path=path, pipeline=saved["pipeline"], preset=saved.get("preset", "default"),
                      config=saved.get("config") or {},
                      state=json.loads((extra / STATE_FILE).read_text(encoding="utf-8")),
                      metrics=json.loads((extra / METRICS_FILE).read_text(encoding="utf-8")))


# --- TF Serving warm-up requests -------------------------------------------------------------
# TF Serving replays ``assets.extra/tf_serving_warmup_requests``, a TFRecord file of
# ``tensorflow.serving.PredictionLog`` protos, when it loads a model. The messages are the ones
# ``seqapps.serving.apis`` generates from ``seqapps/serving/protos`` (also those of gRPC).

def write_warmup_requests(path: Path, model_name: str, examples: Mapping[str, Mapping[str, Any]]) -> None:
    """Writes one ``PredictionLog`` warm-up record per signature, calling it on its example.

    Args:
        path: the warm-up file to write.
        model_name: the served model's name.
        examples: signature name -> its example inputs (NumPy arrays).
    """
    import tensorflow as tf

    from seqapps.serving import apis

    prediction_log = apis.messages().prediction_log.PredictionLog
    with tf.io.TFRecordWriter(str(path)) as writer:
        for signature_name, example in examples.items():
            log = prediction_log()
            request = log.predict_log.request
            request.model_spec.name = model_name
            request.model_spec.signature_name = signature_name
            for name, value in example.items():
                request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
            writer.write(log.SerializeToString())


def read_warmup_requests(path: Path) -> list[Any]:
    """Parses a warm-up file back into ``PredictionLog`` messages.

    Args:
        path: the warm-up file.

    Returns:
        The records in file order.
    """
    import tensorflow as tf

    from seqapps.serving import apis

    prediction_log = apis.messages().prediction_log.PredictionLog
    return [prediction_log.FromString(record.numpy()) for record in tf.data.TFRecordDataset(str(path))]
