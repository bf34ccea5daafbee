"""TF Serving's REST JSON: predict, classify and regress requests checked and converted to arrays,
answers formatted.

Requests are bounded before anything reaches TensorFlow (``seqapps.export_format.Limits``): the
nesting depth (the signature's rank, at most 32: deeper string tensors crash TensorFlow), rows per
request, bytes per string, and generated length (integer inputs named ``length`` or ``*_length``);
batched inputs must agree on their row count.
An export's ``assets.extra/limits.json`` sets them; the server's options are the defaults for the
bounds an export leaves unset (``request_limits``). Nothing here imports FastAPI: the gRPC API uses
it too.
"""
from __future__ import annotations

import base64
import binascii
import collections
import dataclasses
import json
import re
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from seqapps.export_format import (CLASSIFY_METHOD, DEFAULT_SIGNATURE, LENGTH_INPUT, REGRESS_METHOD, Limits,
                                   parse_version)
from seqapps.serving.repository import LoadedSignature, LoadedVersion, RequestError, TensorInfo

BYTES_SUFFIX = "_bytes"
MAX_RANK = 32  # TensorFlow's own limit for many kernels; tf.constant of a rank-33 string array segfaults
CLASSIFY, REGRESS = CLASSIFY_METHOD, REGRESS_METHOD


def request_limits(server: Limits, export: Limits | None) -> Limits:
    """The bounds a request to one export is checked against.

    The export's bounds take the place of the server's; the server's stand where the export sets
    none. ``max_audio_samples`` bounds a free dimension too, so it raises ``max_sequence_length``.
    The server's generated-length bound applies only to exports that set no bound at all (or
    carry no ``limits.json``).

    Args:
        server: the server's bounds (``ServingOptions.limits``).
        export: the export's ``limits.json`` (``None``: it has none).

    Returns:
        The bounds checked: ``max_batch_size``, ``max_string_bytes``, ``max_generated_length`` and
        ``max_sequence_length`` (``None``: no bound).
    """
    if export is None or all(value is None for value in dataclasses.astuple(export)):
        return server
    changes = {name: getattr(export, name) for name in ("max_batch_size", "max_string_bytes", "max_sequence_length")
               if getattr(export, name) is not None}
    # An export whose limits.json leaves it null generates nothing: an input named ``length``
    # there is a size (speech's waveform length), not a generation budget.
    changes["max_generated_length"] = export.max_generated_length
    if export.max_audio_samples is not None:
        changes["max_sequence_length"] = max(export.max_audio_samples, export.max_sequence_length or 0)
    return dataclasses.replace(server, **changes)


@dataclasses.dataclass
class CheckedRequest:
    """A checked request: the signature, its input arrays, the format used, and how to answer.

    Attributes:
        signature: the signature to call.
        inputs: one array per input, of the signature's dtype and rank.
        row_format: answer ``predictions`` rows (else ``outputs``).
        squeeze: trailing size-1 dimensions the request left out; they are dropped from the
            outputs again, as TF Serving's answer (which never added them) has it.
    """

    signature: LoadedSignature
    inputs: dict[str, np.ndarray]
    row_format: bool
    squeeze: int = 0

    @property
    def rows(self) -> int | None:
        """The common leading dimension of the inputs, or ``None`` when they disagree."""
        sizes = {value.shape[0] if value.ndim else None for value in self.inputs.values()}
        return sizes.pop() if len(sizes) == 1 else None


def _is_b64(value: Any) -> bool:
    return isinstance(value, dict) and list(value) == ["b64"]


def _depth(value: Any) -> int:
    """The nesting depth of a JSON value along its first elements: its rank, if it is rectangular
    (an empty list counts as one level, as NumPy's ``[]`` has rank 1)."""
    depth = 0
    while isinstance(value, list):
        value, depth = value[0] if value else None, depth + 1
    return depth


def _string_leaf(value: Any, name: str, limit: int | None, what: str = "Input") -> bytes:
    if isinstance(value, str):
        leaf = value.encode("utf-8")
    elif _is_b64(value) and isinstance(value["b64"], str):
        try:
            leaf = base64.b64decode(value["b64"], validate=True)
        except (binascii.Error, ValueError) as error:
            raise RequestError(400, f"{what} '{name}': bad base64 string ({error})") from None
    else:
        leaf = None
    if leaf is not None:
        _string_within(leaf, name, limit, what)
        return leaf
    raise RequestError(400, f"{what} '{name}' is a string tensor: expected strings or {{\"b64\": ...}} objects, "
                            f"got {json.dumps(value)[:80]}")


def _string_within(leaf: bytes, name: str, limit: int | None, what: str) -> None:
    """Refuses a string over ``max_string_bytes``; ``what`` is ``Input`` or ``Feature``."""
    if limit is not None and len(leaf) > limit:
        raise RequestError(400, f"{what} '{name}': a string of {len(leaf)} bytes is over the limit of {limit} bytes")


def _string_array(value: Any, name: str, max_rank: int, limit: int | None) -> np.ndarray:
    flat: list[bytes] = []

    def shape_of(node: Any, depth: int) -> tuple[int, ...]:
        if not isinstance(node, list):
            flat.append(_string_leaf(node, name, limit))
            return ()
        if depth >= max_rank:
            raise _too_deep(name, max_rank)
        shapes = [shape_of(child, depth + 1) for child in node]
        if any(shape != shapes[0] for shape in shapes):
            raise RequestError(400, f"Input '{name}' is a ragged list; expected a rectangular one")
        return (len(node), *(shapes[0] if shapes else ()))

    shape = shape_of(value, 0)
    array = np.empty(len(flat), dtype=object)
    array[:] = flat
    return array.reshape(shape)


def _numeric_array(value: Any, name: str, dtype: tf.DType, max_rank: int) -> np.ndarray:
    if _depth(value) > max_rank:  # before NumPy sees it
        raise _too_deep(name, max_rank)
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


def _too_deep(name: str, max_rank: int) -> RequestError:
    return RequestError(400, f"Input '{name}' is nested deeper than rank {max_rank}, the most its signature takes")


def _to_array(value: Any, name: str, info: TensorInfo, limits: Limits) -> np.ndarray:
    max_rank = MAX_RANK if info.shape is None else min(len(info.shape), MAX_RANK)
    if info.dtype == tf.string:
        array = _string_array(value, name, max_rank, limits.max_string_bytes)
    else:
        array = _numeric_array(value, name, info.dtype, max_rank)
    if array.ndim > max_rank:
        raise _too_deep(name, max_rank)
    return array


def _format_shape(shape: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("-1" if dim is None else str(dim) for dim in shape) + "]"


def _fit_shape(name: str, array: np.ndarray, info: TensorInfo) -> tuple[np.ndarray, int]:
    """Checks ``array`` against the signature's shape; returns it (with any trailing size-1
    dimensions the request left out added, as TF Serving, which feeds tensors as they come,
    accepts) and how many were added."""
    if info.shape is None:
        return array, 0
    missing = len(info.shape) - array.ndim
    if 0 < missing and all(dim == 1 for dim in info.shape[array.ndim:]):
        array = array.reshape(array.shape + (1,) * missing)
    else:
        missing = 0
    if missing == 0 and array.ndim < len(info.shape):
        _check_batched(name, array.ndim, array.shape[0] if array.ndim else 0, info)
    if array.ndim != len(info.shape) or any(want is not None and want != got
                                            for want, got in zip(info.shape, array.shape)):
        raise RequestError(400, f"Input '{name}' has shape {_format_shape(array.shape)}; the signature "
                                f"expects {_format_shape(info.shape)}")
    return array, missing


def _check_batched(name: str, rank: int, first: int, info: TensorInfo) -> None:
    """Refuses an input sent as one example without its batch dimension (a waveform as one list of
    samples), which would otherwise be read as that many rows.

    Args:
        name: the input's name.
        rank: the rank sent.
        first: the length of the first axis sent (0 for a scalar).
        info: the signature's input.

    Raises:
        RequestError: 400 saying that a batch of rows was expected, with its shape.
    """
    if not info.batched or rank != len(info.shape) - 1 or all(dim == 1 for dim in info.shape[rank:]):
        return
    sent = "a single value" if rank == 0 else f"a rank-{rank} list of {first} entries"
    raise RequestError(400, f"Input '{name}' is {sent}; the signature expects rank {len(info.shape)}, shape "
                            f"{_format_shape(info.shape)}: a list of rows, one per example (send one example "
                            "inside a list)")


def _check_rows_agree(inputs: dict[str, np.ndarray], signature: LoadedSignature) -> None:
    """Refuses batched inputs of different row counts (a ``length`` per prompt, but one too many).

    Raises:
        RequestError: 400 naming two inputs and their row counts.
    """
    rows = {key: inputs[key].shape[0] for key in sorted(inputs) if signature.inputs[key].batched}
    if len(set(rows.values())) > 1:
        usual = collections.Counter(rows.values()).most_common(1)[0][0]
        agreeing = next(key for key, count in rows.items() if count == usual)
        odd = next(key for key, count in rows.items() if count != usual)
        raise RequestError(400, f"Input '{odd}' has {rows[odd]} rows but '{agreeing}' has {usual}: every input "
                                "needs one entry per example")


def _check_limits(name: str, array: np.ndarray, info: TensorInfo, limits: Limits) -> None:
    if (info.batched or info.shape is None) and array.ndim:  # a rank-free input's first axis counts as rows
        if array.shape[0] == 0:
            raise RequestError(400, f"Input '{name}' has no rows; send at least one")
        if limits.max_batch_size is not None and array.shape[0] > limits.max_batch_size:
            raise RequestError(400, f"Input '{name}' has {array.shape[0]} rows; the limit is "
                                    f"{limits.max_batch_size} per request")
    if limits.max_sequence_length is not None and info.shape is not None:
        for axis, dim in enumerate(info.shape[1:], 1):
            if dim is None and array.shape[axis] > limits.max_sequence_length:
                raise RequestError(400, f"Input '{name}' has {array.shape[axis]} steps on axis {axis}; the limit "
                                        f"is {limits.max_sequence_length}")
    if (limits.max_generated_length is not None and info.dtype.is_integer and LENGTH_INPUT.fullmatch(name)
            and array.size and array.max() > limits.max_generated_length):
        raise RequestError(400, f"Input '{name}' asks for {array.max()}; the limit is "
                                f"{limits.max_generated_length}")


def _named(values: dict[str, Any], signature: LoadedSignature, where: str) -> dict[str, Any]:
    unknown = sorted(set(values) - set(signature.inputs))
    missing = sorted(set(signature.inputs) - set(values))
    if unknown or missing:
        problem = f"unknown input(s) {unknown}" if unknown else f"missing input(s) {missing}"
        raise RequestError(400, f"{where}: {problem}; signature '{signature.name}' takes "
                                f"{sorted(signature.inputs)}")
    return values


def _signature(body: dict, loaded: LoadedVersion, methods: tuple[str, ...] | None = None) -> LoadedSignature:
    signature_name = body.get("signature_name", DEFAULT_SIGNATURE)
    if not isinstance(signature_name, str) or signature_name not in loaded.signatures:
        raise RequestError(400, f"Serving signature name: {json.dumps(signature_name)} not found in signature "
                                f"def; the model has {sorted(loaded.signatures)}")
    if methods is not None:
        method = loaded.signature_defs.get(signature_name, {}).get("method_name")
        if method not in methods:
            raise RequestError(400, f"Expected {' or '.join(methods)} signature method_name, got: {method} "
                                    f"(signature '{signature_name}')")
    return loaded.signatures[signature_name]


def _rows_within(count: int, limits: Limits, where: str) -> None:
    """Refuses a request with too many rows before its values are converted."""
    if limits.max_batch_size is not None and count > limits.max_batch_size:
        raise RequestError(400, f"{where} has {count} rows; the limit is {limits.max_batch_size} per request")


def parse_predict_request(body: Any, loaded: LoadedVersion,
                          limits: Limits) -> CheckedRequest:
    """Checks a decoded predict body against the model and converts its inputs.

    Args:
        body: the decoded JSON body.
        loaded: the model version asked for.
        limits: the server's bounds (the export's ``limits.json`` overrides them).

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
    limits = request_limits(limits, loaded.limits)
    signature = _signature(body, loaded)
    single = next(iter(signature.inputs)) if len(signature.inputs) == 1 else None
    row_format = "instances" in body
    if row_format:
        instances = body["instances"]
        if not isinstance(instances, list) or not instances:
            raise RequestError(400, "'instances' must be a non-empty list")
        if single is not None and not isinstance(instances[0], dict):  # one waveform's samples as instances
            _check_batched(single, _depth(instances), len(instances), signature.inputs[single])
        _rows_within(len(instances), limits, "'instances'")
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
    inputs, squeeze = {}, 0
    for key, info in signature.inputs.items():
        if (info.batched or info.shape is None) and isinstance(columns[key], list):
            if info.shape is not None:
                _check_batched(key, _depth(columns[key]), len(columns[key]), info)
            _rows_within(len(columns[key]), limits, f"Input '{key}'")
        array, added = _fit_shape(key, _to_array(columns[key], key, info, limits), info)
        _check_limits(key, array, info, limits)
        inputs[key], squeeze = array, max(squeeze, added)
    _check_rows_agree(inputs, signature)
    return CheckedRequest(signature, inputs, row_format, squeeze)


def check_arrays(loaded: LoadedVersion, signature_name: str, arrays: dict[str, np.ndarray],
                 limits: Limits) -> CheckedRequest:
    """Checks decoded tensors (gRPC's ``PredictRequest.inputs``) as a columnar predict request.

    Args:
        loaded: the model version asked for.
        signature_name: the signature (empty: ``serving_default``).
        arrays: one array per input name.
        limits: the server's bounds (the export's ``limits.json`` overrides them).

    Returns:
        The checked request (columnar format).

    Raises:
        RequestError: 400 naming what is wrong.
    """
    limits = request_limits(limits, loaded.limits)
    signature = _signature({"signature_name": signature_name or DEFAULT_SIGNATURE}, loaded)
    inputs, squeeze = {}, 0
    for key, info in signature.inputs.items():
        array = _named(arrays, signature, "inputs")[key]
        max_rank = MAX_RANK if info.shape is None else min(len(info.shape), MAX_RANK)
        if array.ndim > max_rank:
            raise _too_deep(key, max_rank)
        if array.dtype != info.dtype.as_numpy_dtype and not (info.dtype == tf.string and array.dtype == object):
            raise RequestError(400, f"Input '{key}' has dtype {tf.as_dtype(array.dtype).name}; the signature "
                                    f"expects {info.dtype.name}")
        if info.dtype == tf.string and limits.max_string_bytes is not None and array.size and max(
                len(value) for value in array.flat) > limits.max_string_bytes:
            raise RequestError(400, f"Input '{key}': a string is over the limit of {limits.max_string_bytes} bytes")
        array, added = _fit_shape(key, array, info)
        _check_limits(key, array, info, limits)
        inputs[key], squeeze = array, max(squeeze, added)
    _check_rows_agree(inputs, signature)
    return CheckedRequest(signature, inputs, row_format=False, squeeze=squeeze)


def _feature(value: Any, name: str, limits: Limits) -> Any:
    """One feature of TF Serving's tf.Example JSON: numbers (all integers: int64), strings, b64."""
    values = value if isinstance(value, list) else [value]
    if all(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
        return tf.train.Feature(bytes_list=tf.train.BytesList(
            value=[_string_leaf(v, name, limits.max_string_bytes, "Feature") for v in values]))
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
        raise RequestError(400, f"Feature '{name}' mixes numbers with other values")
    if all(isinstance(v, int) for v in values):
        if any(not -2 ** 63 <= v < 2 ** 63 for v in values):
            raise RequestError(400, f"Feature '{name}': a value is out of the range of int64")
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))
    return tf.train.Feature(float_list=tf.train.FloatList(value=values))


def parse_examples_request(body: Any, loaded: LoadedVersion, method: str,
                           limits: Limits) -> CheckedRequest:
    """Checks a classify or regress body (TF Serving's tf.Example JSON) and serializes its examples.

    Args:
        body: ``{"signature_name"?, "context"?: {feature: value}, "examples": [{feature: value}, ...]}``;
            a value is a number, a string, ``{"b64": ...}`` or a list of one of them.
        loaded: the model version asked for.
        method: ``CLASSIFY`` or ``REGRESS``.
        limits: the server's bounds (the export's ``limits.json`` overrides them).

    Returns:
        The request, its one string input holding the serialized ``tf.train.Example`` of each example
        (the context's features merged into each).

    Raises:
        RequestError: 400 naming what is wrong.
    """
    if not isinstance(body, dict):
        raise RequestError(400, "The request body must be a JSON object")
    limits = request_limits(limits, loaded.limits)
    examples, context = body.get("examples"), body.get("context", {})
    if not isinstance(examples, list) or not examples or not all(isinstance(e, dict) for e in examples):
        raise RequestError(400, "'examples' must be a non-empty list of objects keyed by feature name")
    if not isinstance(context, dict):
        raise RequestError(400, "'context' must be an object keyed by feature name")
    signature = _examples_signature(loaded, body.get("signature_name", DEFAULT_SIGNATURE), method,
                                    len(examples), limits)
    shared = {name: _feature(value, name, limits) for name, value in context.items()}
    serialized = np.empty(len(examples), dtype=object)
    for i, example in enumerate(examples):
        features = {**shared, **{name: _feature(value, name, limits) for name, value in example.items()}}
        serialized[i] = tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()
    return _examples_request(signature, serialized)


def check_examples(loaded: LoadedVersion, signature_name: str, method: str, examples: Sequence[Any],
                   context: Any | None, limits: Limits) -> CheckedRequest:
    """Checks the ``tensorflow.Example`` messages of a gRPC ``Input`` for a classify or regress signature.

    Args:
        loaded: the model version asked for.
        signature_name: the signature (empty: ``serving_default``).
        method: ``CLASSIFY`` or ``REGRESS``.
        examples: the examples (``ExampleList.examples``).
        context: the features every example shares (``ExampleListWithContext.context``), or ``None``;
            an example's own feature of the same name takes its place, as in the REST API.
        limits: the server's bounds (the export's ``limits.json`` overrides them).

    Returns:
        The request, its one string input holding each example serialized.

    Raises:
        RequestError: 400 naming what is wrong.
    """
    limits = request_limits(limits, loaded.limits)
    if not examples:
        raise RequestError(400, "Input is empty: it needs at least one tf.Example")
    signature = _examples_signature(loaded, signature_name or DEFAULT_SIGNATURE, method, len(examples), limits)
    for example in [*([] if context is None else [context]), *examples]:
        for name, feature in example.features.feature.items():
            for value in feature.bytes_list.value:
                _string_within(value, name, limits.max_string_bytes, "Feature")
    shared = b"" if context is None else context.SerializeToString()  # parsing the two merges their features
    serialized = np.array([shared + example.SerializeToString() for example in examples], dtype=object)
    return _examples_request(signature, serialized)


def _examples_signature(loaded: LoadedVersion, signature_name: Any, method: str, rows: int,
                        limits: Limits) -> LoadedSignature:
    """The classify or regress signature a request names, checked to take ``rows`` serialized tf.Examples."""
    signature = _signature({"signature_name": signature_name}, loaded, (method,))
    _rows_within(rows, limits, "'examples'")
    if len(signature.inputs) != 1 or next(iter(signature.inputs.values())).dtype != tf.string:
        raise RequestError(400, f"Signature '{signature.name}' does not take one string tensor of tf.Examples")
    return signature


def _examples_request(signature: LoadedSignature, serialized: np.ndarray) -> CheckedRequest:
    (key, info), = signature.inputs.items()
    array, _ = _fit_shape(key, serialized, info)
    return CheckedRequest(signature, {key: array}, row_format=True)


def _jsonable(name: str, value: np.ndarray) -> Any:
    if value.dtype.kind in "OS":
        if name.endswith(BYTES_SUFFIX):
            encode = np.frompyfunc(lambda b: {"b64": base64.b64encode(b).decode("ascii")}, 1, 1)
        else:
            encode = np.frompyfunc(lambda b: b.decode("utf-8", "replace"), 1, 1)
        return np.asarray(encode(value), dtype=object).tolist()
    return value.tolist()


def squeeze_outputs(outputs: dict[str, np.ndarray], squeeze: int) -> dict[str, np.ndarray]:
    """Drops ``squeeze`` trailing size-1 dimensions from the outputs that have them (see ``CheckedRequest``)."""
    if not squeeze:
        return outputs
    return {key: value.reshape(value.shape[:-squeeze]) if value.ndim > squeeze
            and value.shape[-squeeze:] == (1,) * squeeze else value for key, value in outputs.items()}


def format_predict_response(outputs: dict[str, np.ndarray], row_format: bool, squeeze: int = 0) -> dict[str, Any]:
    """Builds TF Serving's predict answer.

    Args:
        outputs: one array per output name.
        row_format: answer ``predictions`` (one entry per row) rather than ``outputs``.
        squeeze: drop this many trailing size-1 dimensions from outputs that have them (see ``CheckedRequest``).

    Returns:
        ``{"predictions": ...}`` or ``{"outputs": ...}``; a single output is answered as a plain list.
        String outputs named ``*_bytes`` are ``{"b64": ...}`` objects, other strings UTF-8 text.

    Raises:
        RequestError: 400 when the row format is asked but the outputs' batch sizes differ.
    """
    outputs = squeeze_outputs(outputs, squeeze)
    values = {key: _jsonable(key, value) for key, value in outputs.items()}
    if not row_format:
        return {"outputs": next(iter(values.values())) if len(values) == 1 else values}
    sizes = {value.shape[0] if value.ndim else None for value in outputs.values()}
    if len(sizes) != 1 or None in sizes:
        raise RequestError(400, "The outputs do not share one batch size; use the columnar 'inputs' format")
    if len(values) == 1:
        return {"predictions": next(iter(values.values()))}
    return {"predictions": [{key: value[i] for key, value in values.items()} for i in range(sizes.pop())]}



def format_examples_response(outputs: dict[str, np.ndarray], method: str) -> dict[str, Any]:
    """Builds TF Serving's classify or regress answer from the signature's outputs.

    Args:
        outputs: ``classes`` and/or ``scores`` (classify, ``[batch, k]`` or ``[batch]``) or ``outputs``
            (regress, ``[batch]`` or ``[batch, 1]``).
        method: ``CLASSIFY`` or ``REGRESS``.

    Returns:
        ``{"results": [[[class, score], ...], ...]}`` (a missing class is ``""``) or ``{"results": [value, ...]}``.

    Raises:
        RequestError: 400 when the signature lacks those outputs.
    """
    if method == REGRESS:
        if "outputs" not in outputs:
            raise RequestError(400, "A regress signature must have an 'outputs' output")
        values = outputs["outputs"]
        return {"results": values.reshape(len(values), -1)[:, 0].tolist()}
    classes, scores = outputs.get("classes"), outputs.get("scores")
    if classes is None and scores is None:
        raise RequestError(400, "A classify signature must have a 'classes' or 'scores' output")
    rows = len(classes if classes is not None else scores)
    if classes is not None:
        classes = np.asarray(_jsonable("classes", classes.reshape(rows, -1)), dtype=object)
    if scores is not None:
        scores = scores.reshape(rows, -1)
    width = (classes if classes is not None else scores).shape[1]
    return {"results": [[["" if classes is None else classes[i, j], 0.0 if scores is None else float(scores[i, j])]
                         for j in range(width)] for i in range(rows)]}


# tf.io.parse_example's errors, said in the terms of TF Serving's tf.Example JSON (``examples``, features)
_EXAMPLE_ERRORS = [
    (re.compile(r"^Name: [^,]*, Feature: (\S+) \(data type: (\w+)\) is required but could not be found\.?$"),
     r"Every example needs the feature '\1' (\2)"),
    (re.compile(r"^Name: [^,]*, Key: (\S+), Index: (\d+)\.\s+(.*)$"), r"examples[\2], feature '\1': \3"),
]


def tf_error_message(error: Exception) -> str:
    """The one line of a TensorFlow error that says what went wrong (no graph node or op trace)."""
    text = str(getattr(error, "message", error))
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith(
        ("Graph execution error", "Detected at node", "<stack traces", "[["))]
    line = re.sub(r"^(\{\{function_node [^}]*\}\}\s*)+", "", lines[-1] if lines else text.strip())
    line = re.sub(r"\s*\[Op:[^\]]*\]$", "", line)
    assertion = re.fullmatch(r"assertion failed: \[(.*)\]", line)  # tf.debugging.Assert's message, unwrapped
    if assertion:
        line = assertion.group(1).replace("] [", " ")
    for pattern, replacement in _EXAMPLE_ERRORS:
        line = pattern.sub(replacement, line)
    return line or type(error).__name__



def version_from_url(version: str) -> int:
    """Returns the version a URL names.

    Raises:
        RequestError: 400 unless it is 1 to 18 ASCII digits.
    """
    number = parse_version(version)
    if number is None:
        raise RequestError(400, f"Invalid version {version[:40]!r}: versions are integers of 1 to 18 ASCII digits")
    return number


def decode_and_parse(body: bytes, loaded: LoadedVersion, limits: Limits,
                     method: str | None = None) -> CheckedRequest:
    """Decodes a JSON body and parses it as a predict request (or, with ``method``, classify/regress)."""
    try:
        decoded = json.loads(body)
    except UnicodeDecodeError as error:  # a ValueError whose text names a codec, not the request
        raise RequestError(400, f"The request body is not UTF-8 JSON (byte {error.start}); expected a JSON object, "
                                "with binary data such as WAV files as {\"b64\": \"...\"} strings") from None
    except (ValueError, RecursionError) as error:
        raise RequestError(400, f"JSON Parse error: {error}") from None
    try:
        if method is None:
            return parse_predict_request(decoded, loaded, limits)
        return parse_examples_request(decoded, loaded, method, limits)
    except RecursionError:
        raise RequestError(400, "The request's lists are nested too deeply") from None

