"""TF Serving's gRPC API on the event loop of the REST server: ``PredictionService.Predict``,
``Classify``, ``Regress``, ``MultiInference`` and ``GetModelMetadata``, and ``ModelService.GetModelStatus``
(``HandleReloadConfigRequest`` is refused: the server serves a model root, not a model config list).

The messages and services are the ones ``apis`` generates from ``protos/seqapps_tfs/*.proto``
(TF Serving's package, names and field numbers, so TF Serving's own clients and stubs
interoperate). Requests run through the ``ModelRunner`` the REST API uses, with the REST API's
checks and bounds (``seqapps.serving.protocol``). FastAPI is not imported here.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable

import grpc
import numpy as np
import tensorflow as tf
from google.protobuf import json_format
from tensorflow.core.protobuf import meta_graph_pb2

from seqapps.serving import apis
from seqapps.serving.metrics import STATUS_NAMES, Metrics
from seqapps.export_format import DEFAULT_SIGNATURE
from seqapps.serving.protocol import (CLASSIFY, REGRESS, check_arrays, check_examples, format_examples_response,
                                      squeeze_outputs)
from seqapps.serving.repository import LoadedVersion, ModelRepository, RequestError
from seqapps.serving.runner import ModelRunner, ServingOptions

CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND,
         412: grpc.StatusCode.FAILED_PRECONDITION, 499: grpc.StatusCode.CANCELLED,
         504: grpc.StatusCode.DEADLINE_EXCEEDED}
# TF Serving's answer to a reload that is not from one ModelConfigList to another (ServerCore::ReloadConfig).
RELOAD_REFUSED = ("Cannot transition to requested config. It is only legal to transition from one ModelConfigList "
                  "to another. seqapps serve serves every model folder under its model root, which is not a "
                  "ModelConfigList: add, replace or remove folders there instead")


class GrpcServer:
    """The gRPC server: started and stopped on the REST server's event loop (its lifespan)."""

    def __init__(self, repository: ModelRepository, runner: ModelRunner, metrics: Metrics,
                 options: ServingOptions, host: str, port: int) -> None:
        """Args:
            repository: the models to serve.
            runner: the ``ModelRunner`` shared with the REST API (same threads and batchers).
            metrics: where requests are counted (``entrypoint="GRPC"``).
            options: the ``ServingOptions`` (limits, timeouts, body bytes as the message limit).
            host: the address to bind.
            port: the TCP port.
        """
        self.repository, self.runner, self.metrics, self.options = repository, runner, metrics, options
        self.host, self.port = host, port
        self.pb = apis.messages()
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        """Binds the port and starts serving."""
        limit = self.options.max_body_bytes
        self._server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit),
                                                ("grpc.max_send_message_length", max(limit, 64 * 1024 * 1024))])
        services = self.pb.services_grpc
        services.add_PredictionServiceServicer_to_server(_PredictionService(self), self._server)
        services.add_ModelServiceServicer_to_server(_ModelService(self), self._server)
        shown = f"[{self.host}]" if ":" in self.host else self.host
        if self._server.add_insecure_port(f"{shown}:{self.port}") == 0:
            raise RuntimeError(f"cannot listen on {shown}:{self.port} for gRPC")
        await self._server.start()

    async def stop(self) -> None:
        """Stops accepting and lets calls in flight finish for up to ``drain_seconds``."""
        if self._server is not None:
            await self._server.stop(grace=self.options.drain_seconds)
            self._server = None

    def loaded(self, model_spec: Any) -> LoadedVersion:
        """The loaded version a ``ModelSpec`` names (latest, a version or a label)."""
        return self.repository.get(model_spec.name, *_version_choice(model_spec))

    async def call(self, context: grpc.aio.ServicerContext, name: str, api: str,
                   work: Callable[[], Awaitable[Any]]) -> Any:
        """Runs ``work()`` under the request deadline; a ``RequestError`` aborts with its gRPC code."""
        began, status = time.perf_counter(), 500
        timeout = self.options.request_timeout_s
        remaining = context.time_remaining()
        if remaining is not None:
            timeout = min(timeout, remaining)
        try:
            async with asyncio.timeout(timeout):
                result = await work()
            status = 200
            return result
        except TimeoutError:
            status = 504
            await context.abort(CODES[504], f"Deadline of {timeout:g} s exceeded")
        except RequestError as error:
            status = error.status_code
            await context.abort(CODES.get(error.status_code, grpc.StatusCode.INTERNAL), error.message)
        finally:
            self.metrics.record(name, api, "GRPC", STATUS_NAMES.get(status, "UNKNOWN"), time.perf_counter() - began)


def _version_choice(model_spec: Any) -> tuple[int | None, str | None]:
    """The ``(version, label)`` a ``ModelSpec`` names; both ``None``: the latest version."""
    choice = model_spec.WhichOneof("version_choice")
    return (model_spec.version.value if choice == "version" else None,
            model_spec.version_label if choice == "version_label" else None)


def _answer_spec(spec: Any, loaded: LoadedVersion, signature_name: str) -> None:
    """Fills an answer's ``ModelSpec``: the model, the version that answered and the signature."""
    spec.name = loaded.name
    spec.version.value = loaded.version
    spec.signature_name = signature_name


def _to_array(proto: Any, name: str, max_elements: int) -> np.ndarray:
    dims = [dim.size for dim in proto.tensor_shape.dim]
    if len(dims) > 64 or any(size < 0 for size in dims) or int(np.prod(dims, dtype=np.float64)) > max_elements:
        raise RequestError(400, f"Input '{name}' has shape {dims}: too large or invalid")
    try:
        return tf.make_ndarray(proto)
    except (TypeError, ValueError) as error:
        raise RequestError(400, f"Input '{name}': {error}") from None


class _PredictionService:
    def __init__(self, server: GrpcServer) -> None:
        self.server = server

    async def Predict(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802 - gRPC name
        server, pb = self.server, self.server.pb

        async def work() -> Any:
            loaded = server.loaded(request.model_spec)
            arrays = {key: _to_array(value, key, server.options.max_body_bytes // 4)
                      for key, value in request.inputs.items()}
            parsed = check_arrays(loaded, request.model_spec.signature_name, arrays, server.options.limits)
            outputs = squeeze_outputs(await server.runner.run(parsed), parsed.squeeze)
            wanted = set(request.output_filter) or set(outputs)
            unknown = wanted - set(outputs)
            if unknown:
                raise RequestError(400, f"output_filter names unknown output(s) {sorted(unknown)}")
            response = pb.predict.PredictResponse()
            _answer_spec(response.model_spec, loaded, parsed.signature.name)
            for key in sorted(wanted):
                response.outputs[key].CopyFrom(tf.make_tensor_proto(outputs[key]))
            return response
        return await server.call(context, request.model_spec.name, "predict", work)

    async def Classify(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802 - gRPC name
        return await self._examples(request, context, CLASSIFY)

    async def Regress(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802 - gRPC name
        return await self._examples(request, context, REGRESS)

    async def _examples(self, request: Any, context: grpc.aio.ServicerContext, method: str) -> Any:
        """A ``ClassificationRequest`` or ``RegressionRequest``: one signature over the request's tf.Examples."""
        server, pb = self.server, self.server.pb

        async def work() -> Any:
            loaded = server.loaded(request.model_spec)
            result, signature_name = await self._infer(loaded, request.model_spec.signature_name, method, request.input)
            response = (pb.classification.ClassificationResponse if method == CLASSIFY
                        else pb.regression.RegressionResponse)()
            _answer_spec(response.model_spec, loaded, signature_name)
            response.result.CopyFrom(result)
            return response
        return await server.call(context, request.model_spec.name, method.rpartition("/")[2], work)

    async def MultiInference(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        server, pb = self.server, self.server.pb
        tasks = list(request.tasks)

        async def work() -> Any:
            if not tasks:
                raise RequestError(400, "MultiInferenceRequest must specify at least one task")
            if len({task.model_spec.name for task in tasks}) > 1:
                raise RequestError(400, "All ModelSpecs in a MultiInferenceRequest must access the same model name")
            if len({_version_choice(task.model_spec) for task in tasks}) > 1:
                raise RequestError(400, "All ModelSpecs in a MultiInferenceRequest must access the same model "
                                        "version")
            names = [task.model_spec.signature_name or DEFAULT_SIGNATURE for task in tasks]
            repeated = sorted({name for name in names if names.count(name) > 1})
            if repeated:
                raise RequestError(400, f"Duplicate evaluation of signature: {repeated[0]}")
            for task in tasks:
                if task.method_name not in (CLASSIFY, REGRESS):
                    raise RequestError(400, f"Unsupported signature method_name: {task.method_name!r}; expected "
                                            f"{CLASSIFY} or {REGRESS}")
            loaded = server.loaded(tasks[0].model_spec)
            answers = await asyncio.gather(*(self._infer(loaded, name, task.method_name, request.input)
                                             for name, task in zip(names, tasks)))
            response = pb.inference.MultiInferenceResponse()
            for task, (result, signature_name) in zip(tasks, answers):
                entry = response.results.add()
                _answer_spec(entry.model_spec, loaded, signature_name)
                field = "classification_result" if task.method_name == CLASSIFY else "regression_result"
                getattr(entry, field).CopyFrom(result)
            return response
        return await server.call(context, tasks[0].model_spec.name if tasks else "", "MultiInference", work)

    async def _infer(self, loaded: LoadedVersion, signature_name: str, method: str, given: Any) -> tuple[Any, str]:
        """Runs a classify or regress signature on an ``Input``.

        Args:
            loaded: the model version.
            signature_name: the signature (empty: ``serving_default``).
            method: ``CLASSIFY`` or ``REGRESS``.
            given: the request's ``Input``.

        Returns:
            The ``ClassificationResult`` or ``RegressionResult``, and the signature's name.

        Raises:
            RequestError: 400 when the input, the signature or its outputs do not fit the API.
        """
        server, pb = self.server, self.server.pb
        kind = given.WhichOneof("kind")
        listed = getattr(given, kind) if kind else pb.input.ExampleList()
        context = listed.context if kind == "example_list_with_context" else None
        parsed = check_examples(loaded, signature_name, method, listed.examples, context, server.options.limits)
        rows = format_examples_response(await server.runner.run(parsed), method)["results"]
        if method == REGRESS:
            return pb.regression.RegressionResult(
                regressions=[pb.regression.Regression(value=value) for value in rows]), parsed.signature.name
        result = pb.classification.ClassificationResult()
        for row in rows:
            result.classifications.add().classes.extend(
                pb.classification.Class(label=label, score=score) for label, score in row)
        return result, parsed.signature.name

    async def GetModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        server, pb = self.server, self.server.pb

        async def work() -> Any:
            if list(request.metadata_field) != ["signature_def"]:
                raise RequestError(400, "metadata_field must be ['signature_def'], the only metadata served")
            loaded = server.loaded(request.model_spec)
            signature_map = pb.get_model_metadata.SignatureDefMap()
            for key, definition in loaded.signature_defs.items():
                signature_map.signature_def[key].CopyFrom(
                    json_format.ParseDict(definition, meta_graph_pb2.SignatureDef()))
            response = pb.get_model_metadata.GetModelMetadataResponse()
            response.model_spec.name = loaded.name
            response.model_spec.version.value = loaded.version
            response.metadata["signature_def"].Pack(signature_map)
            return response
        return await server.call(context, request.model_spec.name, "GetModelMetadata", work)


class _ModelService:
    def __init__(self, server: GrpcServer) -> None:
        self.server = server

    async def GetModelStatus(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        server, pb = self.server, self.server.pb

        async def work() -> Any:
            status = server.repository.status(request.model_spec.name, *_version_choice(request.model_spec))
            messages = pb.get_model_status
            response = messages.GetModelStatusResponse()
            for entry in status["model_version_status"]:
                version = response.model_version_status.add(
                    version=int(entry["version"]), state=messages.ModelVersionStatus.State.Value(entry["state"]))
                version.status.error_code = entry["status"]["error_code"]
                version.status.error_message = entry["status"]["error_message"]
            return response
        return await server.call(context, request.model_spec.name, "GetModelStatus", work)

    async def HandleReloadConfigRequest(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        """Refused as TF Serving refuses a reload it cannot make: the models served are a model root's folders."""

        async def work() -> Any:
            if request.config.WhichOneof("config") != "model_config_list":
                raise RequestError(400, "ServerConfig is not of type ModelConfigList.")
            raise RequestError(412, RELOAD_REFUSED)
        return await self.server.call(context, "", "HandleReloadConfigRequest", work)
