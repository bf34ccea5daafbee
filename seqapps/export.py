"""Versioned, atomic SavedModel exports that TF Serving loads as they are.

Layout of one export (``saved_models/<pipeline>/<version>/``)::

    saved_model.pb, variables/      signature ``serving_default``: raw inputs -> readable outputs
    assets.extra/config.yaml        the resolved config (pipeline, preset, fields)
    assets.extra/metrics.json       test metrics and baselines of this version
    assets.extra/state.json         pipeline state (columns, frequency, ...) for predict/finetune
    assets.extra/model.keras        the trainable Keras model, for finetune
    assets.extra/tf_serving_warmup_requests   one PredictionLog record (TF Serving warm-up)

An export is written to a hidden temporary folder next to its final place,
checked by loading it back, and renamed into place: a crash leaves no partial
version, and versions are never overwritten.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import keras
import numpy as np
import tensorflow as tf
import yaml
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from seqapps.errors import ExportError

ASSETS_EXTRA = "assets.extra"
WARMUP_FILE = "tf_serving_warmup_requests"
STAGING_PREFIX = ".tmp-"  # hidden folder an export is written to before it is renamed into place


def version_dirs(model_root: Path) -> dict[int, Path]:
    """Returns ``{version: folder}`` for the integer-named folders under ``model_root``."""
    if not model_root.is_dir():
        return {}
    return {int(p.name): p for p in model_root.iterdir() if p.is_dir() and p.name.isdigit()}


@contextlib.contextmanager
def cpu_compatible_recurrent_layers(model: keras.Model) -> Iterator[None]:
    """Makes Keras LSTM/GRU layers trace their generic kernels, not cuDNN's.

    Keras picks the fused CudnnRNN op when a GPU is visible; a graph holding it
    cannot run on a CPU-only TF Serving. ``use_cudnn`` is read when a layer is
    traced, so it is switched off for the export's tracing and restored after.
    """
    layers = [layer for layer in model._flatten_layers(include_self=True, recursive=True)  # noqa: SLF001
              if hasattr(layer, "use_cudnn")]
    saved = [layer.use_cudnn for layer in layers]
    for layer in layers:
        layer.use_cudnn = False
    try:
        yield
    finally:
        for layer, value in zip(layers, saved):
            layer.use_cudnn = value


def cudnn_ops(export_dir: Path) -> list[str]:
    """Returns the names of CudnnRNN ops anywhere in a SavedModel's graphs."""
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((Path(export_dir) / "saved_model.pb").read_bytes())
    found = []
    for meta_graph in proto.meta_graphs:
        nodes = list(meta_graph.graph_def.node)
        for function in meta_graph.graph_def.library.function:
            nodes.extend(function.node_def)
        found.extend(node.name for node in nodes if node.op.startswith("Cudnn"))
    return found


def write_export(
    model: keras.Model,
    serving_fn: Callable,
    input_signature: list[tf.TensorSpec] | dict[str, tf.TensorSpec],
    serving_example: dict[str, np.ndarray],
    model_root: Path,
    config_yaml: str,
    metrics: dict[str, Any],
    state: dict[str, Any],
) -> Path:
    """Exports a new version under ``model_root`` and returns its folder.

    Args:
        model: the trained Keras model (saved as ``model.keras`` too).
        serving_fn: raw inputs -> dict of readable outputs; it calls ``model``.
        input_signature: the serving inputs, as ``tf.TensorSpec``s.
        serving_example: one batch of raw inputs; the export is called on it
            before it is renamed into place, and it becomes the warm-up request.
        model_root: ``saved_models/<pipeline>``.
        config_yaml: the resolved config as YAML text.
        metrics: JSON-able metrics to store.
        state: JSON-able pipeline state to store.

    Returns:
        The final folder ``model_root/<version>``.

    Raises:
        ExportError: the written export does not load, or its graph holds CudnnRNN ops.
    """
    model_root.mkdir(parents=True, exist_ok=True)
    remove_abandoned_staging(model_root)
    staging = model_root / f"{STAGING_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        archive = keras.export.ExportArchive()
        archive.track(model)
        with cpu_compatible_recurrent_layers(model):
            archive.add_endpoint("serving_default", serving_fn, input_signature=input_signature)
            archive.write_out(str(staging), verbose=False)
        extra = staging / ASSETS_EXTRA
        extra.mkdir()
        (extra / "config.yaml").write_text(config_yaml, encoding="utf-8")
        (extra / "metrics.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")
        (extra / "state.json").write_text(json.dumps(state, indent=2), encoding="utf-8")
        model.save(extra / "model.keras")
        write_warmup_requests(extra / WARMUP_FILE, model_root.name, serving_example)
        _check_export(staging, serving_example)
        return _rename_into_place(staging, model_root)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def remove_abandoned_staging(model_root: Path) -> list[Path]:
    """Deletes the hidden ``.tmp-PID-*`` folders of exports whose process is gone (killed mid-export).

    A folder whose process still runs on this machine is another export in progress
    and is left alone.

    Args:
        model_root: ``saved_models/<pipeline>``.

    Returns:
        The folders removed.
    """
    removed = []
    for folder in model_root.glob(f"{STAGING_PREFIX}*"):
        pid = folder.name[len(STAGING_PREFIX):].partition("-")[0]
        if pid.isdigit() and pid.isascii() and _process_alive(int(pid)):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _check_export(export_dir: Path, example: dict[str, np.ndarray]) -> None:
    found = cudnn_ops(export_dir)
    if found:
        raise ExportError(f"{export_dir}: serving graph holds CudnnRNN ops ({', '.join(found[:3])}), "
                          "which a CPU-only server cannot run")
    outputs = tf.saved_model.load(str(export_dir)).signatures["serving_default"](
        **{name: tf.constant(value) for name, value in example.items()})
    for name, value in outputs.items():
        if value.dtype.is_floating and not np.all(np.isfinite(value.numpy())):
            raise ExportError(f"{export_dir}: serving output {name!r} is not finite on the example input")


def _rename_into_place(staging: Path, model_root: Path) -> Path:
    """Renames ``staging`` to the next free version; a concurrent writer takes the next one."""
    while True:
        version = max(version_dirs(model_root), default=0) + 1
        target = model_root / str(version)
        try:
            os.rename(staging, target)
            return target
        except OSError:
            if not target.exists():
                raise


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
        return self.path / ASSETS_EXTRA / "model.keras"

    @property
    def version(self) -> int:
        """The export's version number."""
        return int(self.path.name)


def read_export(path: str | Path) -> ExportInfo:
    """Reads an export folder; ``saved_models/NAME`` means its latest version.

    Raises:
        ExportError: the folder is missing or is not a complete seqapps export.
    """
    path = Path(path)
    if not path.is_dir():
        raise ExportError(f"{path}: no such export folder (expected saved_models/NAME/VERSION)")
    if not (path / "saved_model.pb").is_file():
        versions = version_dirs(path)
        if not versions:
            raise ExportError(f"{path}: not a SavedModel export (no saved_model.pb, and no version folders)")
        path = versions[max(versions)]
    extra = path / ASSETS_EXTRA
    needed = ["config.yaml", "state.json", "metrics.json", "model.keras"]
    missing = [name for name in needed if not (extra / name).is_file()]
    if not (path / "saved_model.pb").is_file() or missing:
        raise ExportError(f"{path}: incomplete export, missing {', '.join(missing) or 'saved_model.pb'}")
    saved = yaml.safe_load((extra / "config.yaml").read_text(encoding="utf-8"))
    if not isinstance(saved, dict) or "pipeline" not in saved:
        raise ExportError(f"{extra / 'config.yaml'}: not a seqapps config (no 'pipeline' key)")
    return ExportInfo(path=path, pipeline=saved["pipeline"], preset=saved.get("preset", "default"),
                      config=saved.get("config") or {},
                      state=json.loads((extra / "state.json").read_text(encoding="utf-8")),
                      metrics=json.loads((extra / "metrics.json").read_text(encoding="utf-8")))


# --- TF Serving warm-up requests -------------------------------------------------------------
# TF Serving replays ``assets.extra/tf_serving_warmup_requests`` (a TFRecord file of
# ``tensorflow.serving.PredictionLog`` protos) when it loads a model. The serving protos ship
# in ``tensorflow-serving-api``, which pulls in the full (GPU) tensorflow package, so the few
# messages needed are declared here, field numbers as in tensorflow_serving/apis/*.proto, in a
# private descriptor pool.

def _serving_messages() -> dict[str, type]:
    from tensorflow.core.framework import tensor_pb2

    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add_file(file_descriptor: Any) -> None:
        for dependency in file_descriptor.dependencies:
            add_file(dependency)
        if file_descriptor.name not in added:
            proto = descriptor_pb2.FileDescriptorProto()
            file_descriptor.CopyToProto(proto)
            pool.Add(proto)
            added.add(file_descriptor.name)

    add_file(tensor_pb2.DESCRIPTOR)
    serving = descriptor_pb2.FileDescriptorProto(
        name="seqapps/serving_warmup.proto", package="tensorflow.serving", syntax="proto3",
        dependency=[tensor_pb2.DESCRIPTOR.name])
    optional, message_type = (descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
                              descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE)
    string_type, repeated = (descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                             descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED)
    spec = serving.message_type.add(name="ModelSpec")
    spec.field.add(name="name", number=1, label=optional, type=string_type)
    spec.field.add(name="signature_name", number=3, label=optional, type=string_type)
    request = serving.message_type.add(name="PredictRequest")
    request.field.add(name="model_spec", number=1, label=optional, type=message_type,
                      type_name=".tensorflow.serving.ModelSpec")
    entry = request.nested_type.add(name="InputsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, label=optional, type=string_type)
    entry.field.add(name="value", number=2, label=optional, type=message_type, type_name=".tensorflow.TensorProto")
    request.field.add(name="inputs", number=2, label=repeated, type=message_type,
                      type_name=".tensorflow.serving.PredictRequest.InputsEntry")
    predict_log = serving.message_type.add(name="PredictLog")
    predict_log.field.add(name="request", number=1, label=optional, type=message_type,
                          type_name=".tensorflow.serving.PredictRequest")
    prediction_log = serving.message_type.add(name="PredictionLog")
    prediction_log.field.add(name="predict_log", number=6, label=optional, type=message_type,
                             type_name=".tensorflow.serving.PredictLog")
    pool.Add(serving)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"tensorflow.serving.{name}"))
            for name in ("PredictionLog", "PredictRequest")}


def write_warmup_requests(path: Path, model_name: str, example: dict[str, np.ndarray]) -> None:
    """Writes one ``PredictionLog`` warm-up record calling ``serving_default`` on ``example``."""
    prediction_log = _serving_messages()["PredictionLog"]()
    request = prediction_log.predict_log.request
    request.model_spec.name = model_name
    request.model_spec.signature_name = "serving_default"
    for name, value in example.items():
        request.inputs[name].ParseFromString(tf.make_tensor_proto(value).SerializeToString())
    with tf.io.TFRecordWriter(str(path)) as writer:
        writer.write(prediction_log.SerializeToString())


def read_warmup_requests(path: Path) -> list[Any]:
    """Parses a warm-up file back into ``PredictionLog`` messages."""
    message = _serving_messages()["PredictionLog"]
    logs = []
    for record in tf.data.TFRecordDataset(str(path)):
        log = message()
        log.ParseFromString(record.numpy())
        logs.append(log)
    return logs
