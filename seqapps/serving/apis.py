"""TF Serving's API messages and gRPC stubs, generated from ``protos/seqapps_tfs/*.proto``.

The protos are the subset of TF Serving's public API (``tensorflow_serving/apis``) that seqapps
uses, written for seqapps with TF Serving's package, names and field numbers, so TF Serving's own
clients, stubs and warm-up readers interoperate: ``PredictRequest`` and the other messages of
the gRPC services (``grpc_service``), and ``PredictionLog``, the warm-up records an export carries
(``seqapps.export_format``). They import TensorFlow's ``tensor.proto``, ``example.proto``,
``meta_graph.proto`` and ``error_codes.proto``, which the TensorFlow wheel ships compiled but not as
``.proto`` text: their descriptors are handed to ``grpc_tools.protoc`` as a descriptor set. The modules
are generated on first use into ``~/.cache/seqapps/grpc-<hash>/`` (``$XDG_CACHE_HOME`` is honoured), so neither
``tensorflow-serving-api`` nor the full ``tensorflow`` package is needed. Their messages have TF
Serving's full names: do not import them in one process together with ``tensorflow_serving.apis``
(the protobuf registry refuses duplicates).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import os
import subprocess
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

PROTOS = Path(__file__).parent / "protos"
PACKAGE = "seqapps_tfs"


@dataclasses.dataclass(frozen=True)
class Modules:
    """The generated modules, one per ``.proto`` file (``services_grpc``: the gRPC stubs and servicers)."""

    model: ModuleType
    input: ModuleType
    predict: ModuleType
    classification: ModuleType
    regression: ModuleType
    inference: ModuleType
    model_management: ModuleType
    prediction_log: ModuleType
    get_model_metadata: ModuleType
    get_model_status: ModuleType
    services: ModuleType
    services_grpc: ModuleType


def _tensorflow_descriptor_set() -> bytes:
    """The descriptors of the TensorFlow and protobuf ``.proto`` files the seqapps protos import."""
    from google.protobuf import any_pb2, descriptor_pb2, wrappers_pb2
    from tensorflow.core.example import example_pb2
    from tensorflow.core.framework import tensor_pb2
    from tensorflow.core.protobuf import error_codes_pb2, meta_graph_pb2

    files: dict[str, descriptor_pb2.FileDescriptorProto] = {}

    def add(file_descriptor: Any) -> None:
        if file_descriptor.name in files:
            return
        for dependency in file_descriptor.dependencies:
            add(dependency)
        proto = descriptor_pb2.FileDescriptorProto()
        file_descriptor.CopyToProto(proto)
        files[file_descriptor.name] = proto

    for module in (any_pb2, wrappers_pb2, tensor_pb2, example_pb2, meta_graph_pb2, error_codes_pb2):
        add(module.DESCRIPTOR)
    return descriptor_pb2.FileDescriptorSet(file=list(files.values())).SerializeToString()


def generate(out: Path | None = None) -> Path:
    """Generates the Python messages and gRPC stubs of ``protos/`` with ``grpc_tools.protoc``.

    Args:
        out: the folder to write ``seqapps_tfs/*_pb2*.py`` into (default: a cache folder keyed by the
            protos' contents and the protobuf and grpcio versions; reused when present).

    Returns:
        The folder to put on ``sys.path``.

    Raises:
        RuntimeError: protoc failed.
    """
    import google.protobuf
    import grpc

    sources = sorted((PROTOS / PACKAGE).glob("*.proto"))
    if out is None:
        key = hashlib.sha256(b"".join(path.read_bytes() for path in sources)
                             + f"{google.protobuf.__version__} {grpc.__version__}".encode()).hexdigest()[:16]
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        out = cache / "seqapps" / f"grpc-{key}"
    if (out / PACKAGE / "services_pb2_grpc.py").is_file():
        return out
    staging = out.with_name(f".tmp-{out.name}-{uuid.uuid4().hex[:8]}")
    (staging / PACKAGE).mkdir(parents=True)
    descriptor_set = staging / "tensorflow.desc"
    descriptor_set.write_bytes(_tensorflow_descriptor_set())
    # protoc runs in its own process: its bundled protobuf C++ library crashes next to TensorFlow's.
    result = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"--descriptor_set_in={descriptor_set}",
                             f"-I{PROTOS}", f"--python_out={staging}", f"--grpc_python_out={staging}",
                             *(f"{PACKAGE}/{path.name}" for path in sources)], capture_output=True, text=True)
    descriptor_set.unlink()
    if result.returncode != 0:
        raise RuntimeError(f"grpc_tools.protoc failed on {PROTOS}: {result.stderr.strip()}")
    (staging / PACKAGE / "__init__.py").write_text("")
    try:
        staging.rename(out)
    except OSError:  # another process published the same modules first
        if not (out / PACKAGE / "services_pb2_grpc.py").is_file():
            raise
    return out


@functools.cache
def messages() -> Modules:
    """Imports the generated modules, generating them first when needed.

    Returns:
        The modules; for example ``messages().predict.PredictRequest``.
    """
    folder = str(generate())
    if folder not in sys.path:
        sys.path.append(folder)
    modules = {field.name: importlib.import_module(f"{PACKAGE}.{field.name}_pb2")
               for field in dataclasses.fields(Modules) if field.name != "services_grpc"}
    return Modules(**modules, services_grpc=importlib.import_module(f"{PACKAGE}.services_pb2_grpc"))
