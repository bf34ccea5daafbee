"""The FastAPI application of TF Serving's REST API, the uvicorn server, and ``seqapps serve``."""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import socket
import threading
import weakref
from pathlib import Path
from typing import AsyncIterator, Iterator

import numpy as np
import tensorflow as tf
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from seqapps.errors import SeqappsError
from seqapps.serving.batching import Batcher
from seqapps.serving.protocol import (DEFAULT_SIGNATURE, PredictRequest, decode_and_parse, error_response,
                                      format_predict_response, json_response, parse_version, read_body)
from seqapps.serving.repository import ModelRepository, RequestError, Signature

INLINE_PARSE_BYTES = 256 * 1024  # larger bodies are parsed in a worker thread, off the event loop
logger = logging.getLogger("seqapps.serving")


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
        return error_response(error.status_code, error.message)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> Response:
        message = "Malformed request" if error.status_code == 404 else str(error.detail)
        return error_response(error.status_code, f"{message}: {request.method} {request.url.path}")

    @app.exception_handler(Exception)
    async def internal_error(request: Request, error: Exception) -> Response:
        logger.error("%s %s failed", request.method, request.url.path, exc_info=error)
        return error_response(500, f"{type(error).__name__}: {error}")

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
        body = await read_body(request, options.max_body_bytes)
        if len(body) > INLINE_PARSE_BYTES:
            parsed = await run_in_threadpool(decode_and_parse, body, loaded)
        else:
            parsed = decode_and_parse(body, loaded)
        outputs = await run_model(parsed)
        return json_response(format_predict_response(outputs, parsed.row_format))

    def metadata(model_name: str, version: int | None) -> Response:
        loaded = repository.get(model_name, version)
        return json_response({
            "model_spec": {"name": loaded.name, "signature_name": "", "version": str(loaded.version)},
            "metadata": {"signature_def": {"signature_def": loaded.signature_defs}}})

    @app.get("/v1/models/{model_name}", summary="Status of the served version")
    async def model_status(model_name: str) -> Response:
        return json_response(repository.status(model_name))

    @app.get("/v1/models/{model_name}/versions/{version}", summary="Status of one version")
    async def version_status(model_name: str, version: str) -> Response:
        return json_response(repository.status(model_name, parse_version(version)))

    @app.get("/v1/models/{model_name}/metadata", summary="Signatures of the served version")
    async def model_metadata(model_name: str) -> Response:
        return metadata(model_name, None)

    @app.get("/v1/models/{model_name}/versions/{version}/metadata", summary="Signatures of one version")
    async def version_metadata(model_name: str, version: str) -> Response:
        return metadata(model_name, parse_version(version))

    @app.post("/v1/models/{model_name}:predict", summary="Predict with the served version",
              openapi_extra=_PREDICT_BODY)
    async def model_predict(model_name: str, request: Request) -> Response:
        return await predict(request, model_name, None)

    @app.post("/v1/models/{model_name}/versions/{version}:predict", summary="Predict with one version",
              openapi_extra=_PREDICT_BODY)
    async def version_predict(model_name: str, version: str, request: Request) -> Response:
        return await predict(request, model_name, parse_version(version))

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
