"""Versioned, atomic SavedModel exports that TF Serving loads as they are.

A pipeline declares its export as named ``Signature``s, each in Model Garden's
shape (``official/core/export_base.py``): preprocess raw inputs in the graph, run
the model (or a decoder over it), postprocess into readable outputs. Every input
has a leading batch dimension, so TF Serving's row format works. ``Limits`` are the
request bounds servers enforce. The layout of an export, its file names, its limits and its
warm-up records are ``seqapps.export_format``'s: this module writes that format.

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

from seqapps import compat
from seqapps.errors import ExportError
from seqapps.export_format import (ASSETS_EXTRA, CONFIG_FILE, DEFAULT_SIGNATURE, EXAMPLES_FILE, EXAMPLES_INPUT,
                                   KERAS_MODEL_FILE, LIMITS_FILE, METRICS_FILE, PREDICT_METHOD, SAVED_MODEL_FILE,
                                   STAGING_PREFIX, STATE_FILE, WARMUP_FILE, Limits, version_dirs,
                                   write_warmup_requests)


@dataclasses.dataclass
class Signature:
    """One serving signature: ``postprocess(run(preprocess(inputs)), inputs)``, traced in the graph.

    Attributes:
        inputs: the raw inputs by name; every shape starts with ``None``, the batch.
        example: one small batch of raw inputs; the export is checked on it and it
            becomes the signature's warm-up request.
        run: the model stage: preprocessed inputs -> model outputs (a Keras model
            call, or a decoder from ``seqapps.layers.decoding`` over it).
        preprocess: raw inputs dict -> what ``run`` takes (default: the dict itself).
        postprocess: ``(model outputs, raw inputs)`` -> dict of readable outputs
            (default: the model outputs, which must then be a dict).
        method: the SignatureDef's method_name, the TF Serving API that calls it (``PREDICT_METHOD``,
            ``CLASSIFY_METHOD`` or ``REGRESS_METHOD`` of ``seqapps.export_format``).
        wraps: for a classify or regress signature, the signature of the same module whose inputs
            its tf.Examples hold (``examples_signature``); ``seqapps predict`` builds those inputs.
    """

    inputs: dict[str, tf.TensorSpec]
    example: dict[str, np.ndarray]
    run: Callable[[Any], Any]
    preprocess: Callable[[dict[str, tf.Tensor]], Any] | None = None
    postprocess: Callable[[Any, dict[str, tf.Tensor]], dict[str, tf.Tensor]] | None = None
    method: str = PREDICT_METHOD
    wraps: "Signature | None" = None

    def __call__(self, inputs: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """Runs the three stages on a dict of raw input tensors."""
        model_inputs = self.preprocess(inputs) if self.preprocess else inputs
        outputs = self.run(model_inputs)
        return self.postprocess(outputs, inputs) if self.postprocess else outputs

    def input_specs(self) -> dict[str, tf.TensorSpec]:
        """The input specs, each named as its key."""
        return {name: tf.TensorSpec(spec.shape, spec.dtype, name=name) for name, spec in self.inputs.items()}


def examples_signature(inner: Signature, method: str,
                       answer: Callable[[dict[str, tf.Tensor]], dict[str, tf.Tensor]]) -> Signature:
    """A classify or regress signature over another signature: TF Serving's tf.Example API in front of it.

    Its one input, ``inputs``, holds serialized ``tf.train.Example``s; each has one feature per
    input of ``inner``, named and shaped as that input's row (``tf.io.parse_example`` in the graph).
    ``inner`` then runs on them unchanged, and ``answer`` turns its outputs into the API's: ``classes``
    and ``scores`` for classify, ``outputs`` for regress.

    Args:
        inner: the signature whose inputs are the features (float32, int64 or string, each row of
            a fully known shape).
        method: ``CLASSIFY_METHOD`` or ``REGRESS_METHOD``.
        answer: ``inner``'s outputs -> the API's outputs.

    Returns:
        The signature; its example is ``inner``'s, serialized.

    Raises:
        ExportError: an input of ``inner`` cannot be a tf.Example feature.
    """
    features = {}
    for name, spec in inner.inputs.items():
        if spec.dtype not in (tf.float32, tf.int64, tf.string) or not spec.shape[1:].is_fully_defined():
            raise ExportError(f"input {name!r} ({spec.dtype.name}, shape {spec.shape}) cannot be a tf.Example "
                              "feature: it needs float32, int64 or string, and a known row shape")
        features[name] = tf.io.FixedLenFeature(spec.shape[1:], spec.dtype)
    return Signature({EXAMPLES_INPUT: tf.TensorSpec([None], tf.string)},
                     {EXAMPLES_INPUT: serialize_examples(inner.example)},
                     run=lambda parsed: answer(inner(parsed)),
                     preprocess=lambda raw: tf.io.parse_example(raw[EXAMPLES_INPUT], features), method=method,
                     wraps=inner)


def serialize_examples(columns: dict[str, np.ndarray]) -> np.ndarray:
    """Serializes rows of arrays as ``tf.train.Example``s, one feature per array.

    Args:
        columns: name -> array with a leading batch dimension (floats, integers or bytes).

    Returns:
        A 1-D object array of serialized examples, one per row.
    """
    def feature(value: np.ndarray) -> tf.train.Feature:
        flat = np.asarray(value).reshape(-1)
        if flat.dtype.kind in "OSU":
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=list(flat)))
        if flat.dtype.kind == "f":
            return tf.train.Feature(float_list=tf.train.FloatList(value=flat))
        return tf.train.Feature(int64_list=tf.train.Int64List(value=flat))

    rows = len(next(iter(columns.values())))
    return np.array([tf.train.Example(features=tf.train.Features(feature={
        name: feature(value[i]) for name, value in columns.items()})).SerializeToString() for i in range(rows)],
        dtype=object)


def ranked_classes(names: tf.Tensor, scores: tf.Tensor) -> dict[str, tf.Tensor]:
    """A classify signature's outputs: every class name and its score, highest score first.

    Args:
        names: [classes] string class names.
        scores: [batch, classes] scores in the order of ``names``.

    Returns:
        ``classes`` [batch, classes] (strings) and ``scores`` [batch, classes] (float32), row by row
        in descending score.
    """
    order = tf.argsort(scores, axis=1, direction="DESCENDING", stable=True)
    return {"classes": tf.gather(names, order), "scores": tf.cast(tf.gather(scores, order, batch_dims=1), tf.float32)}


class ServingModule(tf.Module):
    """What an export serves, as Model Garden's ``ExportModule``: the model, its resources and signatures.

    The module owns the Keras model and every resource the signatures read (vocabulary
    lookups, other ``tf.lookup`` tables), so the SavedModel saves them: a table's vocabulary
    file becomes an asset (``assets/``). Nothing is attached to the Keras model.

    Args:
        model: the trained Keras model.
        signatures: the serving signatures by name; ``serving_default`` is required.
        resources: name -> trackable object the signatures read (for example
            ``seqapps.data.text.Vocabulary.lookup()``); tracked as ``module.resources[name]``.
        name: the module's name.
    """

    def __init__(self, model: keras.Model, signatures: dict[str, Signature],
                 resources: dict[str, tf.Module] | None = None, name: str = "serving") -> None:
        super().__init__(name=name)
        self.model = model
        self.resources = dict(resources or {})
        self._signatures = dict(signatures)  # functions, not trackables: the SavedModel keeps their traces

    @property
    def signatures(self) -> dict[str, Signature]:
        """The serving signatures by name."""
        return dict(self._signatures)


def _check_batch_leading(name: str, signature: Signature) -> None:
    for input_name, spec in signature.inputs.items():
        if spec.shape.rank is None or spec.shape.rank == 0 or spec.shape[0] is not None:
            raise ExportError(f"signature {name!r}: input {input_name!r} has shape {spec.shape}; every input "
                              "needs a leading batch dimension of size None (TF Serving's row format)")


@contextlib.contextmanager
def cpu_compatible_recurrent_layers(model: keras.Model) -> Iterator[None]:
    """Makes Keras LSTM/GRU layers trace their generic kernels, not cuDNN's.

    Keras picks the fused CudnnRNN op when a GPU is visible; a graph holding it
    cannot run on a CPU-only TF Serving. ``use_cudnn`` is read when a layer is
    traced, so it is switched off for the export's tracing and restored after.
    """
    layers = [layer for layer in compat.all_layers(model) if hasattr(layer, "use_cudnn")]
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
    proto.ParseFromString((Path(export_dir) / SAVED_MODEL_FILE).read_bytes())
    found = []
    for meta_graph in proto.meta_graphs:
        nodes = list(meta_graph.graph_def.node)
        for function in meta_graph.graph_def.library.function:
            nodes.extend(function.node_def)
        found.extend(node.name for node in nodes if node.op.startswith("Cudnn"))
    return found


def write_export(
    module: ServingModule,
    model_root: Path,
    config_yaml: str,
    metrics: dict[str, Any],
    state: dict[str, Any],
    limits: Limits | None = None,
) -> Path:
    """Exports a new version under ``model_root`` and returns its folder.

    Args:
        module: the model, its resources and its signatures (``serving_default`` is
            required); the model is saved as ``model.keras`` too, for fine-tuning.
        model_root: ``saved_models/<pipeline>``.
        config_yaml: the resolved config as YAML text.
        metrics: JSON-able metrics to store.
        state: JSON-able pipeline state to store.
        limits: the request bounds to store (default: ``Limits()``).

    Returns:
        The final folder ``model_root/<version>``.

    Raises:
        ExportError: a signature lacks a leading batch dimension, the written export
            does not load, a signature's output is not finite on its example, or the
            graph holds CudnnRNN ops.
    """
    model, signatures = module.model, module.signatures
    if DEFAULT_SIGNATURE not in signatures:
        raise ExportError(f"the export needs a {DEFAULT_SIGNATURE!r} signature, got {', '.join(signatures)}")
    for name, signature in signatures.items():
        _check_batch_leading(name, signature)
    wrapped = _wrapped_signatures(signatures)
    model_root.mkdir(parents=True, exist_ok=True)
    remove_abandoned_staging(model_root)
    staging = model_root / f"{STAGING_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        archive = keras.export.ExportArchive()
        archive.track(model)
        archive.track(module)  # its resources: lookup tables and their vocabulary assets
        with cpu_compatible_recurrent_layers(model):
            for name, signature in signatures.items():
                archive.add_endpoint(name, signature, input_signature=[signature.input_specs()])
            archive.write_out(str(staging), verbose=False)
        _set_method_names(staging, {name: signature.method for name, signature in signatures.items()})
        extra = staging / ASSETS_EXTRA
        extra.mkdir()
        (extra / CONFIG_FILE).write_text(config_yaml, encoding="utf-8")
        (extra / METRICS_FILE).write_text(json.dumps(metrics, indent=2), encoding="utf-8")
        (extra / STATE_FILE).write_text(json.dumps(state, indent=2), encoding="utf-8")
        (extra / LIMITS_FILE).write_text(json.dumps((limits or Limits()).to_dict(), indent=2), encoding="utf-8")
        if wrapped:
            (extra / EXAMPLES_FILE).write_text(json.dumps(wrapped, indent=2), encoding="utf-8")
        model.save(extra / KERAS_MODEL_FILE)
        examples = {name: signature.example for name, signature in signatures.items()}
        write_warmup_requests(extra / WARMUP_FILE, model_root.name, examples)
        _check_export(staging, model_root, examples)
        return _rename_into_place(staging, model_root)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _wrapped_signatures(signatures: dict[str, Signature]) -> dict[str, str]:
    """``{classify or regress signature: the name of the signature it wraps}``, from ``Signature.wraps``.

    Raises:
        ExportError: a signature wraps one the module does not export.
    """
    wrapped = {}
    for name, signature in signatures.items():
        if signature.wraps is None:
            continue
        inner = [other for other, candidate in signatures.items() if candidate is signature.wraps]
        if not inner:
            raise ExportError(f"signature {name!r} wraps a signature the module does not export")
        wrapped[name] = inner[0]
    return wrapped


def _set_method_names(export_dir: Path, methods: dict[str, str]) -> None:
    """Writes each signature's method_name into ``saved_model.pb``.

    ``tf.saved_model.save`` (under Keras' ``ExportArchive``) marks every signature as a predict one,
    and TF Serving's Classify and Regress APIs refuse those; the method name is only a label of the
    SignatureDef, which ``tf.saved_model.load`` does not read.
    """
    from tensorflow.core.protobuf import saved_model_pb2

    if all(method == PREDICT_METHOD for method in methods.values()):
        return
    path = export_dir / SAVED_MODEL_FILE
    proto = saved_model_pb2.SavedModel.FromString(path.read_bytes())
    for meta_graph in proto.meta_graphs:
        for name, method in methods.items():
            meta_graph.signature_def[name].method_name = method
    path.write_bytes(proto.SerializeToString())


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


def call_signature(function: Any, example: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Calls a loaded SavedModel signature on NumPy inputs; returns NumPy outputs."""
    outputs = function(**{name: tf.constant(value) for name, value in example.items()})
    return {name: value.numpy() for name, value in outputs.items()}


def call_in_batches(function: Any, inputs: dict[str, np.ndarray], rows_per_call: int | None) -> dict[str, np.ndarray]:
    """Calls a loaded signature on at most ``rows_per_call`` rows at a time; joins the outputs as one call's.

    Each call gets its rows as they are in ``inputs`` (the same padding), so a row's outputs are those
    of one call on all rows. An output whose later dimensions depend on the call (a longest
    sequence, a most words) is padded to the longest of the calls with zeros (empty strings).

    Args:
        function: a loaded signature.
        inputs: NumPy inputs, all with the same leading batch dimension.
        rows_per_call: the most rows per call; None calls once.

    Returns:
        One array per output, ``rows`` first.
    """
    rows = len(next(iter(inputs.values()))) if inputs else 0
    if rows_per_call is None or rows <= rows_per_call:
        return call_signature(function, inputs)
    parts = [call_signature(function, {name: value[start:start + rows_per_call] for name, value in inputs.items()})
             for start in range(0, rows, rows_per_call)]
    joined = {}
    for name in parts[0]:
        shape = np.max([part[name].shape for part in parts], axis=0)
        joined[name] = np.concatenate([np.pad(part[name], [(0, 0)] + [(0, int(size) - now) for size, now in
                                                                      zip(shape[1:], part[name].shape[1:])],
                                              constant_values=b"" if part[name].dtype == object else 0)
                                       for part in parts])
    return joined


class ExportCalls:
    """Calls the signatures of a written export, loading it on the first call (``Pipeline.report_data``).

    Args:
        path: the export folder.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._loaded: Any = None

    def __call__(self, signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Runs ``signature`` on NumPy inputs (a leading batch dimension); returns NumPy outputs."""
        if self._loaded is None:
            self._loaded = tf.saved_model.load(str(self.path))
        return call_signature(self._loaded.signatures[signature], inputs)


def _check_export(staging: Path, model_root: Path, examples: dict[str, dict[str, np.ndarray]]) -> None:
    """Refuses an export a CPU-only server cannot run, or whose outputs on its own example are not finite.

    Args:
        staging: the export, still in its temporary folder.
        model_root: the folder it is for (named in the error; the temporary folder is removed).
        examples: ``{signature name: example inputs}``.

    Raises:
        ExportError: CudnnRNN ops in the graph, or a NaN or infinite output (a diverged model).
    """
    found = cudnn_ops(staging)
    if found:
        raise ExportError(f"{model_root}: not exported: the serving graph holds CudnnRNN ops "
                          f"({', '.join(found[:3])}), which a CPU-only server cannot run")
    loaded = tf.saved_model.load(str(staging))
    for signature_name, example in examples.items():
        for name, value in call_signature(loaded.signatures[signature_name], example).items():
            if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
                raise ExportError(f"{model_root}: not exported: output {name!r} of signature {signature_name!r} is "
                                  "not finite on the example input (the training diverged? lower learning_rate)")


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
