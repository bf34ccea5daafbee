"""The model root: ``<root>/<name>/<version>/`` folders, their loading with ``tf.saved_model.load``,
and the poll thread that picks up new versions."""
from __future__ import annotations

import dataclasses
import logging
import re
import threading
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
from google.protobuf import json_format
from tensorflow.core.protobuf import saved_model_pb2

MODEL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
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
class Signature:
    """A callable signature of a loaded SavedModel (hashed by identity)."""

    name: str
    function: Any
    inputs: dict[str, TensorInfo]
    outputs: dict[str, TensorInfo]

    @classmethod
    def from_function(cls, name: str, function: Any) -> Signature:
        """Reads the input and output specs of a signature's concrete function."""
        inputs = {key: TensorInfo.from_spec(spec) for key, spec in function.structured_input_signature[1].items()}
        outputs = {key: TensorInfo.from_spec(spec) for key, spec in function.structured_outputs.items()}
        return cls(name, function, inputs, outputs)

    @property
    def batchable(self) -> bool:
        """Whether requests can be concatenated: every input and output has a free batch dimension."""
        return all(info.batched for info in (*self.inputs.values(), *self.outputs.values()))

    def call(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Runs the signature (blocking).

        Args:
            inputs: one array per input name, already checked against the signature.

        Returns:
            One array per output name.
        """
        tensors = {key: tf.constant(value, dtype=self.inputs[key].dtype) for key, value in inputs.items()}
        return {key: value.numpy() for key, value in self.function(**tensors).items()}


@dataclasses.dataclass
class LoadedVersion:
    """One loaded version of a model: its signatures and their SignatureDefs (for metadata)."""

    name: str
    version: int
    path: Path
    module: Any  # keeps the loaded variables alive
    signatures: dict[str, Signature]
    signature_defs: dict[str, Any]


def load_version(name: str, version: int, path: Path) -> LoadedVersion:
    """Loads one version folder with ``tf.saved_model.load``.

    Args:
        name: the model name.
        version: the version number.
        path: the version folder (holds ``saved_model.pb``).

    Returns:
        The loaded version.
    """
    module = tf.saved_model.load(str(path))
    signatures = {key: Signature.from_function(key, fn) for key, fn in module.signatures.items()}
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((path / "saved_model.pb").read_bytes())
    defs = proto.meta_graphs[0].signature_def
    signature_defs = {key: json_format.MessageToDict(defs[key], always_print_fields_with_no_presence=True,
                                                     preserving_proto_field_name=True)
                      for key in signatures if key in defs}
    return LoadedVersion(name, version, path, module, signatures, signature_defs)


def version_folders(model_dir: Path) -> dict[int, Path]:
    """Returns ``{version: folder}`` for integer-named folders holding a ``saved_model.pb``.

    Args:
        model_dir: ``<root>/<name>``; other folders (``.tmp-*``, ``.checkpoints``) are ignored.

    Returns:
        The version folders by number.
    """
    return {int(p.name): p for p in model_dir.iterdir()
            if p.name.isdigit() and p.is_dir() and (p / "saved_model.pb").is_file()}


def valid_model_name(name: str) -> bool:
    """Whether ``name`` may name a model: letters, digits, ``_.-``, no ``..``, not hidden."""
    return MODEL_NAME.fullmatch(name) is not None and ".." not in name


@dataclasses.dataclass
class ServedModel:
    """The served version of one model and the versions that failed to load."""

    current: LoadedVersion | None = None
    failed: dict[int, str] = dataclasses.field(default_factory=dict)


class ModelRepository:
    """The models under one root folder, each at its latest loadable version."""

    def __init__(self, root: Path, poll_seconds: float = 1.0) -> None:
        """Args:
            root: the model root (``saved_models``).
            poll_seconds: the poll thread's period.
        """
        self.root = Path(root).resolve()
        self.poll_seconds = poll_seconds
        self._models: dict[str, ServedModel] = {}
        self._refresh_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def refresh(self) -> None:
        """Scans the root once; loads each model's newest version before dropping the one served."""
        with self._refresh_lock:
            found = {p.name: p for p in self.root.iterdir() if p.is_dir() and valid_model_name(p.name)}
            for name, model_dir in sorted(found.items()):
                model = self._models.get(name, ServedModel())
                versions = {v: p for v, p in version_folders(model_dir).items() if v not in model.failed}
                if not versions or (model.current and model.current.version == max(versions)):
                    continue
                version = max(versions)
                try:
                    loaded = load_version(name, version, versions[version])
                except Exception as error:  # any broken folder must not stop the server
                    model.failed[version] = f"{type(error).__name__}: {error}"
                    logger.warning("%s version %d failed to load: %s", name, version, error)
                else:
                    model.current = loaded
                    logger.info("serving %s version %d", name, version)
                self._models[name] = model
            for name in set(self._models) - set(found):
                del self._models[name]
                logger.info("%s removed", name)

    def names(self) -> list[str]:
        """Returns the names of the models being served."""
        return sorted(name for name, model in self._models.items() if model.current)

    def get(self, name: str, version: int | None = None) -> LoadedVersion:
        """Returns the served version of ``name`` (or that exact version).

        Raises:
            RequestError: 400 for an invalid name, 404 for an unknown model or version.
        """
        model = self._model(name)
        if model.current is None or (version is not None and version != model.current.version):
            wanted = f"Latest({name})" if version is None else f"Specific({name}, {version})"
            raise RequestError(404, f"Servable not found for request: {wanted}")
        return model.current

    def status(self, name: str, version: int | None = None) -> dict[str, Any]:
        """Returns TF Serving's ``GetModelStatus`` answer for ``name`` (optionally one version).

        Raises:
            RequestError: 400 for an invalid name, 404 for an unknown model or version.
        """
        model = self._model(name)
        entries = {v: ("END", "UNKNOWN", message) for v, message in dict(model.failed).items()}  # poll thread adds
        if model.current:
            entries[model.current.version] = ("AVAILABLE", "OK", "")
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
            except OSError as error:  # the root vanished or is unreadable: keep serving what is loaded
                logger.warning("cannot scan %s: %s", self.root, error)

