"""TF Serving's REST JSON: predict requests checked and converted to arrays, answers formatted."""
from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from typing import Any

import numpy as np
import tensorflow as tf
from fastapi import Request
from fastapi.responses import Response

from seqapps.serving.repository import LoadedVersion, RequestError, Signature, TensorInfo

DEFAULT_SIGNATURE = "serving_default"
BYTES_SUFFIX = "_bytes"


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



def json_response(content: Any, status_code: int = 200) -> Response:
    """JSON like TF Serving's: NaN and Infinity are written as such, not refused."""
    return Response(json.dumps(content, separators=(",", ":")), status_code=status_code,
                    media_type="application/json")


def error_response(status_code: int, message: str) -> Response:
    return json_response({"error": message}, status_code)


def parse_version(version: str) -> int:
    if not version.isdigit():
        raise RequestError(400, f"Invalid version {version!r}: versions are integers")
    return int(version)


async def read_body(request: Request, limit: int) -> bytes:
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


def decode_and_parse(body: bytes, loaded: LoadedVersion) -> PredictRequest:
    try:
        decoded = json.loads(body)
    except (ValueError, RecursionError) as error:
        raise RequestError(400, f"JSON Parse error: {error}") from None
    try:
        return parse_predict_request(decoded, loaded)
    except RecursionError:
        raise RequestError(400, "The request's lists are nested too deeply") from None

