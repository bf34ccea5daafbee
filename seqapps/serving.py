"""TF Serving's REST API over ``saved_models/<name>/<version>/``, on FastAPI and uvicorn.

A client written for TF Serving works unchanged:

    GET  /v1/models/{name}[/versions/{v}]             version status
    GET  /v1/models/{name}[/versions/{v}]/metadata    signature defs
    POST /v1/models/{name}[/versions/{v}]:predict     row (``instances``) or columnar (``inputs``) format

Models are called through ``tf.saved_model.load``, as TF Serving does, in a
thread pool off the event loop. The latest integer-named version of each model
is served; a poll thread picks up new versions and drops the old one only after
the new one has loaded. Requests that arrive together can be merged along the
batch dimension (``max_batch_size``, ``batch_timeout_ms``), as TF Serving's
batching does. Bad requests are answered ``{"error": "..."}`` with 400 or 404.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import re
import socket
import threading
import weakref
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import numpy as np
import tensorflow as tf
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response
from google.protobuf import json_format
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from tensorflow.core.protobuf import saved_model_pb2

from seqapps.errors import SeqappsError

DEFAULT_SIGNATURE = "serving_default"
BYTES_SUFFIX = "_bytes"
MODEL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
INLINE_PARSE_BYTES = 256 * 1024  # larger bodies are parsed in a worker thread, off the event loop
logger = logging.getLogger("seqapps.serving")


class RequestError(Exception):
    """A request the server answers with ``{"error": message}`` and a 4xx status."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message


@dataclasses.dataclass(frozen=True)
class ServingOptions:
    """How the server batches, limits and polls.

    Attributes:
        max_batch_size: most rows merged into one model call; 0 or 1 turns batching off.
        batch_timeout_ms: how long a batch waits for more requests once it has one; with 0, a
            batch takes the requests that queued while the model was busy (TF Serving's advice
            for CPUs), so a lone request waits for nothing.
        max_body_bytes: larger request bodies are refused with 400.
        poll_seconds: how often the model root is scanned for new versions.
        model_threads: threads that call the models (and batches run at once per signature).
    """

    max_batch_size: int = 16
    batch_timeout_ms: float = 0.0
    max_body_bytes: int = 32 * 1024 * 1024
    poll_seconds: float = 1.0
    model_threads: int = 4


# --- loaded models ---------------------------------------------------------------------------

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


# --- request parsing and response formatting -------------------------------------------------

@dataclasses.dataclass
class PredictRequest:
    """A checked predict request: the signature, its input arrays, and the format used."""

    signature: Signature
    inputs: dict[str, np.ndarray]
    row_format: bool

    @property
    def rows(self) -> int | None:
        """The common leading dimension of the inputs, or ``None`` when they disagree."""
        sizes = {value.shape[0] if value.ndim else None for value in self.inputs.values()}
        return sizes.pop() if len(sizes) == 1 else None


def _is_b64(value: Any) -> bool:
    return isinstance(value, dict) and list(value) == ["b64"]


def _string_leaf(value: Any, name: str) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if _is_b64(value) and isinstance(value["b64"], str):
        try:
            return base64.b64decode(value["b64"], validate=True)
        except (binascii.Error, ValueError) as error:
            raise RequestError(400, f"Input '{name}': bad base64 string ({error})") from None
    raise RequestError(400, f"Input '{name}' is a string tensor: expected strings or {{\"b64\": ...}} objects, "
                            f"got {json.dumps(value)[:80]}")


def _string_array(value: Any, name: str) -> np.ndarray:
    flat: list[bytes] = []

    def shape_of(node: Any) -> tuple[int, ...]:
        if not isinstance(node, list):
            flat.append(_string_leaf(node, name))
            return ()
        shapes = [shape_of(child) for child in node]
        if any(shape != shapes[0] for shape in shapes):
            raise RequestError(400, f"Input '{name}' is a ragged list; expected a rectangular one")
        return (len(node), *(shapes[0] if shapes else ()))

    shape = shape_of(value)
    array = np.empty(len(flat), dtype=object)
    array[:] = flat
    return array.reshape(shape)


def _numeric_array(value: Any, name: str, dtype: tf.DType) -> np.ndarray:
    try:
        array = np.asarray(value)
    except (ValueError, TypeError, OverflowError):
        raise RequestError(400, f"Input '{name}' is a ragged or mixed list; expected a rectangular "
                                "list of numbers") from None
    if array.size:
        if dtype.is_bool:
            allowed = "b"
        elif dtype.is_integer:
            allowed = "iu"
        elif dtype.is_floating:
            allowed = "iuf"
        else:
            raise RequestError(400, f"Input '{name}' has dtype {dtype.name}, which JSON cannot carry")
        if array.dtype.kind not in allowed:
            wanted = {"b": "booleans", "iu": "integers", "iuf": "numbers"}[allowed]
            raise RequestError(400, f"Input '{name}' expects {wanted} ({dtype.name}); got {array.dtype.kind!r}-kind "
                                    "values (strings, nulls, objects, or integers too large?)")
        if dtype.is_integer and (array.min() < dtype.min or array.max() > dtype.max):
            raise RequestError(400, f"Input '{name}': a value is out of the range of {dtype.name}")
    return array.astype(dtype.as_numpy_dtype)


def _to_array(value: Any, name: str, info: TensorInfo) -> np.ndarray:
    if info.dtype == tf.string:
        return _string_array(value, name)
    return _numeric_array(value, name, info.dtype)


def _format_shape(shape: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("-1" if dim is None else str(dim) for dim in shape) + "]"


def _check_shape(name: str, array: np.ndarray, info: TensorInfo) -> None:
    if info.shape is None:
        return
    if array.ndim != len(info.shape) or any(want is not None and want != got
                                            for want, got in zip(info.shape, array.shape)):
        raise RequestError(400, f"Input '{name}' has shape {_format_shape(array.shape)}; the signature "
                                f"expects {_format_shape(info.shape)}")


def _named(values: dict[str, Any], signature: Signature, where: str) -> dict[str, Any]:
    unknown = sorted(set(values) - set(signature.inputs))
    missing = sorted(set(signature.inputs) - set(values))
    if unknown or missing:
        problem = f"unknown input(s) {unknown}" if unknown else f"missing input(s) {missing}"
        raise RequestError(400, f"{where}: {problem}; signature '{signature.name}' takes "
                                f"{sorted(signature.inputs)}")
    return values


def parse_predict_request(body: Any, loaded: LoadedVersion) -> PredictRequest:
    """Checks a decoded predict body against the model and converts its inputs.

    Args:
        body: the decoded JSON body.
        loaded: the model version asked for.

    Returns:
        The signature, its inputs as arrays of the signature's dtypes, and the format.

    Raises:
        RequestError: 400 naming what is wrong.
    """
    if not isinstance(body, dict):
        raise RequestError(400, "The request body must be a JSON object")
    if ("instances" in body) == ("inputs" in body):
        raise RequestError(400, "The request body must have exactly one of 'instances' (row format) "
                                "or 'inputs' (columnar format)")
    signature_name = body.get("signature_name", DEFAULT_SIGNATURE)
    if not isinstance(signature_name, str) or signature_name not in loaded.signatures:
        raise RequestError(400, f"Serving signature name: {json.dumps(signature_name)} not found in signature "
                                f"def; the model has {sorted(loaded.signatures)}")
    signature = loaded.signatures[signature_name]
    single = next(iter(signature.inputs)) if len(signature.inputs) == 1 else None
    row_format = "instances" in body
    if row_format:
        instances = body["instances"]
        if not isinstance(instances, list) or not instances:
            raise RequestError(400, "'instances' must be a non-empty list")
        named = [isinstance(row, dict) and not _is_b64(row) for row in instances]
        if all(named):
            columns = {key: [_named(row, signature, f"instances[{i}]")[key] for i, row in enumerate(instances)]
                       for key in signature.inputs}
        elif any(named) or single is None:
            raise RequestError(400, f"'instances' must all be objects keyed by input name "
                                    f"{sorted(signature.inputs)}" + ("" if single is None else " or all be values"))
        else:
            columns = {single: instances}
        for key, info in signature.inputs.items():
            if not info.shape and info.shape is not None:
                raise RequestError(400, f"Input '{key}' is a scalar: use the columnar 'inputs' format")
    else:
        given = body["inputs"]
        if isinstance(given, dict) and not _is_b64(given):
            columns = _named(given, signature, "'inputs'")
        elif single is None:
            raise RequestError(400, f"'inputs' must be an object keyed by input name {sorted(signature.inputs)}")
        else:
            columns = {single: given}
    inputs = {}
    for key, info in signature.inputs.items():
        inputs[key] = _to_array(columns[key], key, info)
        _check_shape(key, inputs[key], info)
    return PredictRequest(signature, inputs, row_format)


def _jsonable(name: str, value: np.ndarray) -> Any:
    if value.dtype.kind in "OS":
        if name.endswith(BYTES_SUFFIX):
            encode = np.frompyfunc(lambda b: {"b64": base64.b64encode(b).decode("ascii")}, 1, 1)
        else:
            encode = np.frompyfunc(lambda b: b.decode("utf-8", "replace"), 1, 1)
        return np.asarray(encode(value), dtype=object).tolist()
    return value.tolist()


def format_predict_response(outputs: dict[str, np.ndarray], row_format: bool) -> dict[str, Any]:
    """Builds TF Serving's predict answer.

    Args:
        outputs: one array per output name.
        row_format: answer ``predictions`` (one entry per row) rather than ``outputs``.

    Returns:
        ``{"predictions": ...}`` or ``{"outputs": ...}``; a single output is answered as a plain list.
        String outputs named ``*_bytes`` are ``{"b64": ...}`` objects, other strings UTF-8 text.

    Raises:
        RequestError: 400 when the row format is asked but the outputs' batch sizes differ.
    """
    values = {key: _jsonable(key, value) for key, value in outputs.items()}
    if not row_format:
        return {"outputs": next(iter(values.values())) if len(values) == 1 else values}
    sizes = {value.shape[0] if value.ndim else None for value in outputs.values()}
    if len(sizes) != 1 or None in sizes:
        raise RequestError(400, "The outputs do not share one batch size; use the columnar 'inputs' format")
    if len(values) == 1:
        return {"predictions": next(iter(values.values()))}
    return {"predictions": [{key: value[i] for key, value in values.items()} for i in range(sizes.pop())]}


# --- batching ----------------------------------------------------------------------------------

@dataclasses.dataclass(eq=False)
class _Queued:
    inputs: dict[str, np.ndarray]
    rows: int
    future: asyncio.Future


class Batcher:
    """Merges requests to one signature that arrive together, as TF Serving's batching does.

    A batch is started by the first queued request and closes when it holds
    ``max_batch_size`` rows or ``timeout`` seconds have passed; while all
    ``slots`` are running batches, requests keep queuing. Inputs are concatenated
    along the batch dimension and the outputs split back; if a merged call fails,
    its requests are run one by one so that only the bad one fails.
    """

    def __init__(self, signature: Signature, executor: concurrent.futures.Executor, max_batch_size: int,
                 timeout: float, slots: int) -> None:
        """Args:
            signature: a batchable signature.
            executor: the thread pool that runs model calls.
            max_batch_size: most rows per call.
            timeout: seconds a batch waits for more rows.
            slots: most batches running at once.
        """
        self.signature = signature
        self.executor = executor
        self.max_batch_size = max_batch_size
        self.timeout = timeout
        self._slots = asyncio.Semaphore(slots)
        self._queue: list[_Queued] = []
        self._queued_rows = 0
        self._arrived = asyncio.Event()
        self._dispatcher: asyncio.Task | None = None
        self._running: set[asyncio.Task] = set()

    async def predict(self, inputs: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
        """Queues one request and waits for its outputs.

        Args:
            inputs: the request's arrays, all with leading dimension ``rows``.
            rows: its batch size.

        Returns:
            The request's own rows of each output.
        """
        loop = asyncio.get_running_loop()
        item = _Queued(inputs, rows, loop.create_future())
        self._queue.append(item)
        self._queued_rows += rows
        self._arrived.set()
        if self._dispatcher is None or self._dispatcher.done():
            self._dispatcher = loop.create_task(self._dispatch())
        return await item.future

    async def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queue:
            await self._slots.acquire()
            deadline = loop.time() + self.timeout
            while self._queued_rows < self.max_batch_size and (remaining := deadline - loop.time()) > 0:
                self._arrived.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), remaining)
            batch, rows = [], 0
            while self._queue and (not batch or rows + self._queue[0].rows <= self.max_batch_size):
                item = self._queue.pop(0)
                self._queued_rows -= item.rows
                if not item.future.done():  # a cancelled request (client gone) is dropped
                    batch.append(item)
                    rows += item.rows
            task = loop.create_task(self._execute(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _execute(self, batch: list[_Queued]) -> None:
        try:
            results = await asyncio.get_running_loop().run_in_executor(self.executor, self._call, batch)
        finally:
            self._slots.release()
        for item, result in zip(batch, results):
            if item.future.done():
                continue
            if isinstance(result, Exception):
                item.future.set_exception(result)
            else:
                item.future.set_result(result)

    def _call(self, batch: list[_Queued]) -> list[dict[str, np.ndarray] | Exception]:
        results: dict[int, dict[str, np.ndarray] | Exception] = {}
        groups: dict[tuple, list[int]] = {}
        for index, item in enumerate(batch):
            key = tuple((name, value.shape[1:]) for name, value in sorted(item.inputs.items()))
            groups.setdefault(key, []).append(index)
        for indices in groups.values():
            if len(indices) > 1:
                merged = {name: np.concatenate([batch[i].inputs[name] for i in indices])
                          for name in self.signature.inputs}
                total = sum(batch[i].rows for i in indices)
                try:
                    outputs = self.signature.call(merged)
                except Exception:  # one bad request must not fail the others: run them one by one below
                    outputs = None
                if outputs is not None and all(v.ndim and v.shape[0] == total for v in outputs.values()):
                    offset = 0
                    for i in indices:
                        rows = batch[i].rows
                        results[i] = {name: value[offset:offset + rows] for name, value in outputs.items()}
                        offset += rows
                    continue
            for i in indices:
                try:
                    results[i] = self.signature.call(batch[i].inputs)
                except Exception as error:  # handed to the request that caused it
                    results[i] = error
        return [results[i] for i in range(len(batch))]


# --- the HTTP application ----------------------------------------------------------------------

def _json_response(content: Any, status_code: int = 200) -> Response:
    """JSON like TF Serving's: NaN and Infinity are written as such, not refused."""
    return Response(json.dumps(content, separators=(",", ":")), status_code=status_code,
                    media_type="application/json")


def _error(status_code: int, message: str) -> Response:
    return _json_response({"error": message}, status_code)


def _parse_version(version: str) -> int:
    if not version.isdigit():
        raise RequestError(400, f"Invalid version {version!r}: versions are integers")
    return int(version)


async def _read_body(request: Request, limit: int) -> bytes:
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise RequestError(400, f"Request body of {length} bytes is over the limit of {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(400, f"Request body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _decode_and_parse(body: bytes, loaded: LoadedVersion) -> PredictRequest:
    try:
        decoded = json.loads(body)
    except (ValueError, RecursionError) as error:
        raise RequestError(400, f"JSON Parse error: {error}") from None
    try:
        return parse_predict_request(decoded, loaded)
    except RecursionError:
        raise RequestError(400, "The request's lists are nested too deeply") from None


_PREDICT_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object",
    "description": "TF Serving's predict request: exactly one of 'instances' (row format) or 'inputs' "
                   "(columnar format). Bytes go as {\"b64\": \"...\"}.",
    "properties": {"signature_name": {"type": "string", "default": DEFAULT_SIGNATURE},
                   "instances": {"type": "array", "items": {}},
                   "inputs": {}}}}}}}


def create_app(repository: ModelRepository, options: ServingOptions) -> FastAPI:
    """Builds the FastAPI application of TF Serving's REST API (OpenAPI at ``/openapi.json``).

    Args:
        repository: the models to serve; its poll thread runs while the application does.
        options: batching, body limit and thread settings.

    Returns:
        The application.
    """
    executor = concurrent.futures.ThreadPoolExecutor(options.model_threads, thread_name_prefix="seqapps-model")
    batchers: weakref.WeakKeyDictionary[Signature, Batcher] = weakref.WeakKeyDictionary()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        repository.start_polling()
        try:
            yield
        finally:
            repository.stop_polling()
            executor.shutdown(wait=True)

    app = FastAPI(title="seqapps serve", version="1",
                  description="TF Serving's REST API (v1) over the SavedModels of a seqapps model root.",
                  lifespan=lifespan)

    @app.exception_handler(RequestError)
    async def request_error(request: Request, error: RequestError) -> Response:
        return _error(error.status_code, error.message)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> Response:
        message = "Malformed request" if error.status_code == 404 else str(error.detail)
        return _error(error.status_code, f"{message}: {request.method} {request.url.path}")

    @app.exception_handler(Exception)
    async def internal_error(request: Request, error: Exception) -> Response:
        logger.error("%s %s failed", request.method, request.url.path, exc_info=error)
        return _error(500, f"{type(error).__name__}: {error}")

    async def run_model(request: PredictRequest) -> dict[str, np.ndarray]:
        signature, rows = request.signature, request.rows
        loop = asyncio.get_running_loop()
        try:
            if options.max_batch_size > 1 and signature.batchable and rows and rows <= options.max_batch_size:
                batcher = batchers.get(signature)
                if batcher is None:
                    batcher = batchers[signature] = Batcher(signature, executor, options.max_batch_size,
                                                            options.batch_timeout_ms / 1000, options.model_threads)
                return await batcher.predict(request.inputs, rows)
            return await loop.run_in_executor(executor, signature.call, request.inputs)
        except (tf.errors.InvalidArgumentError, ValueError, TypeError) as error:
            raise RequestError(400, str(getattr(error, "message", error))) from None

    async def predict(request: Request, model_name: str, version: int | None) -> Response:
        loaded = repository.get(model_name, version)
        body = await _read_body(request, options.max_body_bytes)
        if len(body) > INLINE_PARSE_BYTES:
            parsed = await run_in_threadpool(_decode_and_parse, body, loaded)
        else:
            parsed = _decode_and_parse(body, loaded)
        outputs = await run_model(parsed)
        return _json_response(format_predict_response(outputs, parsed.row_format))

    def metadata(model_name: str, version: int | None) -> Response:
        loaded = repository.get(model_name, version)
        return _json_response({
            "model_spec": {"name": loaded.name, "signature_name": "", "version": str(loaded.version)},
            "metadata": {"signature_def": {"signature_def": loaded.signature_defs}}})

    @app.get("/v1/models/{model_name}", summary="Status of the served version")
    async def model_status(model_name: str) -> Response:
        return _json_response(repository.status(model_name))

    @app.get("/v1/models/{model_name}/versions/{version}", summary="Status of one version")
    async def version_status(model_name: str, version: str) -> Response:
        return _json_response(repository.status(model_name, _parse_version(version)))

    @app.get("/v1/models/{model_name}/metadata", summary="Signatures of the served version")
    async def model_metadata(model_name: str) -> Response:
        return metadata(model_name, None)

    @app.get("/v1/models/{model_name}/versions/{version}/metadata", summary="Signatures of one version")
    async def version_metadata(model_name: str, version: str) -> Response:
        return metadata(model_name, _parse_version(version))

    @app.post("/v1/models/{model_name}:predict", summary="Predict with the served version",
              openapi_extra=_PREDICT_BODY)
    async def model_predict(model_name: str, request: Request) -> Response:
        return await predict(request, model_name, None)

    @app.post("/v1/models/{model_name}/versions/{version}:predict", summary="Predict with one version",
              openapi_extra=_PREDICT_BODY)
    async def version_predict(model_name: str, version: str, request: Request) -> Response:
        return await predict(request, model_name, _parse_version(version))

    return app


def bind(host: str, port: int) -> socket.socket:
    """Returns a listening TCP socket on ``host:port`` (port 0 picks a free one).

    Raises:
        SeqappsError: the address cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=1024)
    except OSError as error:
        raise SeqappsError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None


def make_server(model_root: str | Path, sock: socket.socket, options: ServingOptions) -> tuple[uvicorn.Server,
                                                                                              ModelRepository]:
    """Loads the models under ``model_root`` and builds a uvicorn server for them (not yet running).

    Args:
        model_root: the folder holding ``<name>/<version>/``.
        sock: the listening socket (see ``bind``); pass it to ``server.run(sockets=[sock])``.
        options: serving options.

    Returns:
        The server and the model repository behind it.

    Raises:
        SeqappsError: ``model_root`` is not a folder.
    """
    root = Path(model_root)
    if not root.is_dir():
        raise SeqappsError(f"{root}: no such model root folder (expected saved_models/NAME/VERSION/)")
    repository = ModelRepository(root, options.poll_seconds)
    repository.refresh()
    config = uvicorn.Config(create_app(repository, options), log_level="warning", access_log=False,
                            timeout_keep_alive=30, lifespan="on")
    return uvicorn.Server(config), repository


@contextlib.contextmanager
def serve_in_thread(model_root: str | Path, options: ServingOptions = ServingOptions(),
                    host: str = "127.0.0.1") -> Iterator[str]:
    """Runs a server on a free port of ``host`` in a background thread.

    Args:
        model_root: the folder holding ``<name>/<version>/``.
        options: serving options.
        host: the address to bind (loopback by default).

    Returns:
        A context manager yielding the base URL (``http://127.0.0.1:PORT``); the server stops on exit.
    """
    sock = bind(host, 0)
    server, _ = make_server(model_root, sock, options)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="seqapps-serve", daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the server thread stopped while starting")
            thread.join(0.02)
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join()
        sock.close()


def serve(model_root: str | Path, host: str = "127.0.0.1", port: int = 8501,
          options: ServingOptions = ServingOptions()) -> None:
    """Serves the models under ``model_root`` until interrupted (the ``seqapps serve`` command).

    Prints ``seqapps serve: http://HOST:PORT ...`` on stdout once listening (``port`` 0 picks a
    free port). Ctrl-C (SIGINT) stops it gracefully and returns; SIGTERM stops it gracefully and
    then ends the process by that signal, as uvicorn does.

    Args:
        model_root: the folder holding ``<name>/<version>/``.
        host: the address to bind; loopback unless told otherwise.
        port: the TCP port.
        options: serving options.

    Raises:
        SeqappsError: the root is not a folder or the address cannot be bound.
    """
    logging.basicConfig(level=logging.INFO, format="seqapps serve: %(message)s")
    sock = bind(host, port)
    server, repository = make_server(model_root, sock, options)
    shown = f"[{host}]" if ":" in host else host
    names = ", ".join(repository.names()) or "no models yet"
    print(f"seqapps serve: http://{shown}:{sock.getsockname()[1]} serving {names} from {repository.root}",
          flush=True)
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn shuts down gracefully, then re-raises Ctrl-C
        server.run(sockets=[sock])
