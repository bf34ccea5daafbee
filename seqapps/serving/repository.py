"""The model root: ``<root>/<name>/<version>/`` folders, their loading with ``tf.saved_model.load``,
and the poll thread that picks up new versions.

A version is a folder named by an ASCII decimal integer (at most 18 digits) holding a
``saved_model.pb``; other names are ignored with one log line. Each model serves its newest
loadable version, plus the versions its labels (``--version-labels``) point to. A version that
fails to load is retried, with backoff, once the files in its folder change: a folder copied in
slowly is picked up when the copy is complete. Publishing by an atomic rename of a complete
folder (as ``seqapps run`` does) never shows a partial version.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
from google.protobuf import json_format
from tensorflow.core.protobuf import saved_model_pb2
# Private (TF 2.21): the only way to stop a running tf.function call; keras-free, so not in seqapps.compat.
# Tested by tests/serving (deadline, client gone, SIGTERM). Drop when TensorFlow has a public one.
from tensorflow.python.eager import cancellation

from seqapps.export_format import SAVED_MODEL_FILE, Limits, parse_version, read_limits, version_dirs



class _ThreadCancellationContext:
    """``cancellation.CancellationManagerContext`` with the active manager kept per thread.

    TF 2.21 keeps the manager of the call being made in a module global (``cancellation._active_context``),
    read by ``Context.call_function`` when the call starts. With two model threads, one thread's exit from
    its context could reset the global between the other's entry and its call, so that call ran under no
    manager: a 504's ``start_cancel`` then left it running (a 30-minute loop outlived its deadline and held
    a thread). Installed by ``_per_thread_cancellation``; drop it when TensorFlow keeps the context per thread.
    """

    _local = threading.local()

    def __init__(self, manager: cancellation.CancellationManager) -> None:
        self._manager = manager
        self._previous: cancellation.CancellationManager | None = None

    def __enter__(self) -> None:
        self._previous = self.active()
        self._local.manager = self._manager

    def __exit__(self, *exc_info: object) -> None:
        self._local.manager = self._previous

    @classmethod
    def active(cls) -> cancellation.CancellationManager | None:
        """The manager of this thread's call, or None."""
        return getattr(cls._local, "manager", None)


def _per_thread_cancellation() -> None:
    """Makes TensorFlow read the cancellation manager of the calling thread (see ``_ThreadCancellationContext``)."""
    cancellation.CancellationManagerContext = _ThreadCancellationContext
    cancellation.context = _ThreadCancellationContext.active


_per_thread_cancellation()

MODEL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
MAX_RETRY_SECONDS = 30.0
logger = logging.getLogger("seqapps.serving")


class RequestError(Exception):
    """A request the server answers with ``{"error": message}`` and a 4xx status."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One named input or output of a signature: dtype and shape (``None`` dims are unknown)."""

    dtype: tf.DType
    shape: tuple[int | None, ...] | None

    @classmethod
    def from_spec(cls, spec: tf.TensorSpec) -> TensorInfo:
        """Returns the info of ``spec``; ``shape`` is ``None`` when its rank is unknown."""
        shape = None if spec.shape.rank is None else tuple(spec.shape.as_list())
        return cls(spec.dtype, shape)

    @property
    def batched(self) -> bool:
        """Whether the leading dimension is a free batch dimension."""
        return bool(self.shape) and self.shape[0] is None


@dataclasses.dataclass(eq=False)
class LoadedSignature:
    """A callable signature of a loaded SavedModel: its function and its tensors (hashed by identity)."""

    name: str
    function: Any
    inputs: dict[str, TensorInfo]
    outputs: dict[str, TensorInfo]

    @classmethod
    def from_function(cls, name: str, function: Any) -> LoadedSignature:
        """Reads the input and output specs of a signature's concrete function."""
        inputs = {key: TensorInfo.from_spec(spec) for key, spec in function.structured_input_signature[1].items()}
        outputs = {key: TensorInfo.from_spec(spec) for key, spec in function.structured_outputs.items()}
        return cls(name, function, inputs, outputs)

    @property
    def batchable(self) -> bool:
        """Whether requests can be concatenated: every input and output has a free batch dimension."""
        return all(info.batched for info in (*self.inputs.values(), *self.outputs.values()))

    def call(self, inputs: dict[str, np.ndarray],
             manager: cancellation.CancellationManager | None = None) -> dict[str, np.ndarray]:
        """Runs the signature (blocking).

        Args:
            inputs: one array per input name, already checked against the signature.
            manager: when given, ``manager.start_cancel()`` from another thread stops the
                call between two ops (``tf.errors.CancelledError``).

        Returns:
            One array per output name.
        """
        tensors = {key: tf.constant(value, dtype=self.inputs[key].dtype) for key, value in inputs.items()}
        function = self.function if manager is None else manager.get_cancelable_function(self.function)
        return {key: value.numpy() for key, value in function(**tensors).items()}


@dataclasses.dataclass
class LoadedVersion:
    """One loaded version of a model: its signatures, their SignatureDefs (for metadata) and limits
    (``None``: the export carries no ``limits.json``)."""

    name: str
    version: int
    path: Path
    module: Any  # keeps the loaded variables alive
    signatures: dict[str, LoadedSignature]
    signature_defs: dict[str, Any]
    limits: Limits | None


def load_version(name: str, version: int, path: Path) -> LoadedVersion:
    """Loads one version folder with ``tf.saved_model.load``.

    Args:
        name: the model name.
        version: the version number.
        path: the version folder (holds ``saved_model.pb``).

    Returns:
        The loaded version.
    """
    limits = read_limits(path)
    module = tf.saved_model.load(str(path))
    signatures = {key: LoadedSignature.from_function(key, fn) for key, fn in module.signatures.items()}
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((path / SAVED_MODEL_FILE).read_bytes())
    defs = proto.meta_graphs[0].signature_def
    signature_defs = {key: json_format.MessageToDict(defs[key], always_print_fields_with_no_presence=True,
                                                     preserving_proto_field_name=True)
                      for key in signatures if key in defs}
    return LoadedVersion(name, version, path, module, signatures, signature_defs, limits)


def fingerprint(path: Path) -> tuple:
    """The relative path, size and modification time of every file under ``path`` (to see a change)."""
    entries = []
    for folder, _, files in os.walk(path):
        for file in files:
            with contextlib.suppress(OSError):  # a file removed while we look
                stat = os.stat(os.path.join(folder, file))
                entries.append((os.path.relpath(os.path.join(folder, file), path), stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(entries))


def valid_model_name(name: str) -> bool:
    """Whether ``name`` may name a model: letters, digits, ``_.-``, no ``..``, not hidden."""
    return MODEL_NAME.fullmatch(name) is not None and ".." not in name


@dataclasses.dataclass
class FailedVersion:
    """A version that did not load: why, what its folder held then, and when to try again."""

    message: str
    files: tuple
    attempts: int
    retry_at: float


@dataclasses.dataclass
class ServedModel:
    """The loaded versions of one model and the versions that failed to load."""

    loaded: dict[int, LoadedVersion] = dataclasses.field(default_factory=dict)
    failed: dict[int, FailedVersion] = dataclasses.field(default_factory=dict)

    @property
    def latest(self) -> LoadedVersion | None:
        """The newest loaded version."""
        return self.loaded[max(self.loaded)] if self.loaded else None


def read_labels(path: Path) -> dict[str, dict[str, int]]:
    """Reads a version-labels file: ``{"MODEL": {"LABEL": VERSION, ...}, ...}`` (JSON or YAML).

    Raises:
        ValueError: the file is not such a mapping.
    """
    import yaml

    labels = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(labels, dict) or not all(
            isinstance(model, dict) and all(isinstance(label, str) and isinstance(version, int)
                                            and not isinstance(version, bool) for label, version in model.items())
            for model in labels.values()):
        raise ValueError(f"{path}: expected MODEL: {{LABEL: VERSION, ...}} mappings of integer versions")
    return {str(name): dict(model) for name, model in labels.items()}


class ModelRepository:
    """The models under one root folder, each at its latest loadable version (and its labelled ones)."""

    def __init__(self, root: Path, poll_seconds: float = 1.0, labels_file: Path | None = None) -> None:
        """Args:
            root: the model root (``saved_models``).
            poll_seconds: the poll thread's period.
            labels_file: optional version-labels file (see ``read_labels``), reread on every poll.
        """
        self.root = Path(root).resolve()
        self.poll_seconds = poll_seconds
        self.labels_file = labels_file
        self.labels: dict[str, dict[str, int]] = {}
        self._models: dict[str, ServedModel] = {}
        self._ignored: set[Path] = set()
        self._refresh_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def refresh(self) -> None:
        """Scans the root once: loads each model's wanted versions, then drops the ones no longer wanted."""
        with self._refresh_lock:
            if self.labels_file is not None:
                try:
                    self.labels = read_labels(self.labels_file)
                except (OSError, ValueError) as error:  # keep the labels last read
                    logger.warning("cannot read version labels: %s", error)
            found = {p.name: p for p in self.root.iterdir() if p.is_dir() and valid_model_name(p.name)}
            for name, model_dir in sorted(found.items()):
                self._log_ignored(model_dir)
                versions = {version: path for version, path in version_dirs(model_dir).items()
                            if (path / SAVED_MODEL_FILE).is_file()}
                if name in self._models or versions:
                    self._refresh_model(name, self._models.setdefault(name, ServedModel()), versions)
            for name in set(self._models) - set(found):
                del self._models[name]
                logger.info("%s removed", name)

    def _refresh_model(self, name: str, model: ServedModel, versions: dict[int, Path]) -> None:
        now = time.monotonic()
        loadable = {}
        for version, path in versions.items():
            failed = model.failed.get(version)
            if failed is None:
                loadable[version] = path
            elif now >= failed.retry_at and fingerprint(path) != failed.files:
                loadable[version] = path  # its files changed since it failed: try again
        wanted = set(self.labels.get(name, {}).values()) & set(versions)
        newest = max((v for v in versions if v not in model.failed or v in loadable), default=None)
        if newest is not None:
            wanted.add(newest)
        for version in sorted(wanted - set(model.loaded)):
            if version not in loadable:
                continue
            path = loadable[version]
            files = fingerprint(path)
            try:
                loaded = load_version(name, version, path)
            except Exception as error:  # any broken folder must not stop the server
                attempts = model.failed[version].attempts + 1 if version in model.failed else 1
                wait = min(self.poll_seconds * 2 ** (attempts - 1), MAX_RETRY_SECONDS)
                model.failed[version] = FailedVersion(f"{type(error).__name__}: {error}", files, attempts,
                                                      now + wait)
                logger.warning("%s version %d failed to load (attempt %d): %s", name, version, attempts, error)
            else:
                model.failed.pop(version, None)
                model.loaded[version] = loaded
                logger.info("serving %s version %d", name, version)
        on_disk = set(model.loaded) & set(versions)
        keep = set(self.labels.get(name, {}).values()) | {max(on_disk or model.loaded, default=0)}
        for version in set(model.loaded) - keep:
            del model.loaded[version]
            logger.info("%s version %d unloaded", name, version)
        for version in set(model.failed) - set(versions):
            del model.failed[version]

    def _log_ignored(self, model_dir: Path) -> None:
        for path in model_dir.iterdir():
            if (path not in self._ignored and path.name[:1] != "." and parse_version(path.name) is None
                    and (path / SAVED_MODEL_FILE).is_file()):
                self._ignored.add(path)
                logger.warning("ignoring %s: a version folder is named by an integer of 1 to 18 ASCII digits", path)

    def names(self) -> list[str]:
        """Returns the names of the models being served."""
        return sorted(name for name, model in self._models.items() if model.loaded)

    def get(self, name: str, version: int | None = None, label: str | None = None) -> LoadedVersion:
        """Returns the latest loaded version of ``name``, or that exact version, or the labelled one.

        Raises:
            RequestError: 400 for an invalid name or unknown label, 404 for an unknown model or version.
        """
        model = self._model(name)
        if label is not None:
            if label not in self.labels.get(name, {}):
                raise RequestError(400, f"Unrecognized servable version label: {label}")
            version = self.labels[name][label]
        loaded = model.latest if version is None else model.loaded.get(version)
        if loaded is None:
            wanted = f"Latest({name})" if version is None else f"Specific({name}, {version})"
            raise RequestError(404, f"Servable not found for request: {wanted}")
        return loaded

    def status(self, name: str, version: int | None = None, label: str | None = None) -> dict[str, Any]:
        """Returns TF Serving's ``GetModelStatus`` answer for ``name`` (optionally one version or label).

        Raises:
            RequestError: 400 for an invalid name or unknown label, 404 for an unknown model or version.
        """
        model = self._model(name)
        entries = {v: ("END", "UNKNOWN", failed.message) for v, failed in dict(model.failed).items()}
        entries.update({v: ("AVAILABLE", "OK", "") for v in list(model.loaded)})  # the poll thread writes both
        if label is not None:
            version = self.get(name, label=label).version
        if version is not None:
            if version not in entries:
                raise RequestError(404, f"Could not find version {version} of model {name}")
            entries = {version: entries[version]}
        return {"model_version_status": [
            {"version": str(v), "state": state, "status": {"error_code": code, "error_message": message}}
            for v, (state, code, message) in sorted(entries.items(), reverse=True)]}

    def _model(self, name: str) -> ServedModel:
        if not valid_model_name(name):
            raise RequestError(400, f"Invalid model name {name!r}: use letters, digits, '_', '.', '-', no '..'")
        model = self._models.get(name)
        if model is None:
            raise RequestError(404, f"Could not find any versions of model {name}")
        return model

    def start_polling(self) -> None:
        """Starts the thread that calls ``refresh`` every ``poll_seconds``."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll, name="seqapps-model-poll", daemon=True)
        self._thread.start()

    def stop_polling(self) -> None:
        """Stops the poll thread and waits for a load in progress."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.refresh()
            except Exception as error:  # nothing on disk may end the poll thread: log, keep serving
                logger.warning("cannot scan %s: %s", self.root, error)
