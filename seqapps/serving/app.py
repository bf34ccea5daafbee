"""The FastAPI application of TF Serving's REST API, the uvicorn server, and ``seqapps serve``.

The routes form one ``APIRouter`` (``router``); ``create_app`` mounts it with the error handlers,
the HEAD middleware and the lifespan, and keeps what the routes read in ``app.state.seqapps``.
This is the only module that imports FastAPI.

Every request runs under a deadline (``request_timeout_s``, 504 past it) that covers reading
its body, parsing and the model call; a model call whose client has gone, or whose deadline
has passed, is stopped inside TensorFlow (a cancellation manager), so no thread stays pinned.
Connections that do not finish their headers within ``header_timeout_s`` are closed, idle
keep-alive ones after ``idle_timeout_s``. SIGTERM or Ctrl-C stops accepting, drains the
requests in flight for up to ``drain_seconds``, cancels the rest, and exits.
"""
from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import dataclasses
import json
import logging
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, AsyncIterator, Awaitable, Callable, Iterator

import uvicorn
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import Response
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from seqapps.errors import SeqappsError
from seqapps.export_format import DEFAULT_SIGNATURE
from seqapps.serving.metrics import STATUS_NAMES, Metrics
from seqapps.serving.protocol import (CLASSIFY, REGRESS, decode_and_parse, format_examples_response,
                                      format_predict_response, tf_error_message, version_from_url)
from seqapps.serving.repository import LoadedVersion, ModelRepository, RequestError
from seqapps.serving.runner import ModelRunner, ServingOptions

if TYPE_CHECKING:  # imported when gRPC is asked for: grpc is not loaded otherwise
    from seqapps.serving.grpc_service import GrpcServer

INLINE_PARSE_BYTES = 256 * 1024  # larger bodies are parsed in a worker thread, off the event loop
TRIM_BYTES = 1024 * 1024  # after a larger body, freed heap is handed back to the OS (malloc_trim)...
TRIM_DELAYS_S = (0.5, 3.0)  # ...this long after its answer has been sent (freed by then, even under load)
logger = logging.getLogger("seqapps.serving")


def _trim_heap() -> None:
    """Hands freed heap pages back to the OS (glibc keeps them otherwise: RSS would stay at its peak)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


_LIBC = None
with contextlib.suppress(OSError, AttributeError, TypeError):
    _LIBC = ctypes.CDLL(ctypes.util.find_library("c"))
    _LIBC.malloc_trim  # noqa: B018 - absent outside glibc


class HeapTrimmer:
    """Trims the heap twice after a large request's answer has been sent, one schedule at a time."""

    def __init__(self) -> None:
        self._pending = False

    async def soon(self) -> None:
        """Schedules the trims, unless some are pending already."""
        if self._pending:
            return
        self._pending = True
        loop = asyncio.get_running_loop()

        def trim(last: bool) -> None:
            loop.run_in_executor(None, _trim_heap)
            self._pending = not last

        for delay in TRIM_DELAYS_S:
            loop.call_later(delay, trim, delay == TRIM_DELAYS_S[-1])


@dataclasses.dataclass
class AppState:
    """What the routes read (``app.state.seqapps``), and what runs as the application starts and stops.

    Attributes:
        repository: the models served; its poll thread runs while the application does.
        options: bounds, timeouts and body size.
        metrics: where requests are counted.
        runner: what runs the models (shared with gRPC).
        on_startup, on_shutdown: coroutines run as the application starts and stops (the gRPC server).
    """

    repository: ModelRepository
    options: ServingOptions
    metrics: Metrics
    runner: ModelRunner
    on_startup: Callable[[], Awaitable[None]] | None = None
    on_shutdown: Callable[[], Awaitable[None]] | None = None
    trimmer: HeapTrimmer = dataclasses.field(default_factory=HeapTrimmer)


def _app_state(request: Request) -> AppState:
    return request.app.state.seqapps


AppStateParam = Annotated[AppState, Depends(_app_state)]  # a route's ``state`` argument


def json_response(content: Any, status_code: int = 200) -> Response:
    """JSON like TF Serving's: NaN and Infinity are written as such, not refused."""
    return Response(json.dumps(content, separators=(",", ":")), status_code=status_code,
                    media_type="application/json")


def error_response(status_code: int, message: str) -> Response:
    """TF Serving's error answer, ``{"error": message}``."""
    return json_response({"error": message}, status_code)


async def read_body(request: Request, limit: int) -> bytes:
    """Reads a request's body, refusing it (400) once it is over ``limit`` bytes."""
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


async def _until_disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def run_while_connected(request: Request, work: Awaitable[Any]) -> Any:
    """Awaits ``work`` unless the client goes first, in which case ``work`` is cancelled.

    Raises:
        RequestError: 499 when the client closed the connection.
    """
    task, gone = asyncio.ensure_future(work), asyncio.ensure_future(_until_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, gone):
            pending.cancel()
        await asyncio.wait({task, gone})  # let ``work`` stop its model call before going on
    if task.done() and not task.cancelled():
        return task.result()
    raise RequestError(499, "The client closed the connection")


class _HeadAsGet:
    """ASGI middleware answering HEAD as GET; the server sends no body for HEAD (RFC 9110)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and scope["method"] == "HEAD":
            scope = {**scope, "method": "GET"}  # a copy: uvicorn still sees HEAD and leaves the body out
        await self.app(scope, receive, send)


_PREDICT_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object",
    "description": "TF Serving's predict request: exactly one of 'instances' (row format) or 'inputs' "
                   "(columnar format). Bytes go as {\"b64\": \"...\"}.",
    "properties": {"signature_name": {"type": "string", "default": DEFAULT_SIGNATURE},
                   "instances": {"type": "array", "items": {}},
                   "inputs": {}}}}}}}
_EXAMPLES_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object",
    "description": "TF Serving's classify/regress request: tf.Example features as JSON.",
    "properties": {"signature_name": {"type": "string"}, "context": {"type": "object"},
                   "examples": {"type": "array", "items": {"type": "object"}}}}}}}}

router = APIRouter()


@router.get("/v1/models/{model_name}", summary="Status of the served versions")
async def model_status(model_name: str, state: AppStateParam) -> Response:
    return json_response(state.repository.status(model_name))


@router.get("/v1/models/{model_name}/versions/{version}", summary="Status of one version")
async def version_status(model_name: str, version: str, state: AppStateParam) -> Response:
    return json_response(state.repository.status(model_name, version_from_url(version)))


@router.get("/v1/models/{model_name}/labels/{label}", summary="Status of a labelled version")
async def label_status(model_name: str, label: str, state: AppStateParam) -> Response:
    return json_response(state.repository.status(model_name, label=label))


def _metadata(loaded: LoadedVersion) -> Response:
    return json_response({
        "model_spec": {"name": loaded.name, "signature_name": "", "version": str(loaded.version)},
        "metadata": {"signature_def": {"signature_def": loaded.signature_defs}}})


@router.get("/v1/models/{model_name}/metadata", summary="Signatures of the latest version")
async def model_metadata(model_name: str, state: AppStateParam) -> Response:
    return _metadata(state.repository.get(model_name))


@router.get("/v1/models/{model_name}/versions/{version}/metadata", summary="Signatures of one version")
async def version_metadata(model_name: str, version: str, state: AppStateParam) -> Response:
    return _metadata(state.repository.get(model_name, version_from_url(version)))


@router.get("/v1/models/{model_name}/labels/{label}/metadata", summary="Signatures of a labelled version")
async def label_metadata(model_name: str, label: str, state: AppStateParam) -> Response:
    return _metadata(state.repository.get(model_name, label=label))


@router.get("/monitoring/prometheus/metrics", summary="Request counts and latencies")
async def prometheus_metrics(state: AppStateParam) -> Response:
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")


async def _answer(state: AppState, request: Request, model_name: str, version: int | None, label: str | None,
                  method: str | None) -> Response:
    """Reads, parses and runs one predict (``method`` ``None``), classify or regress request."""
    loaded = state.repository.get(model_name, version, label)
    body = await read_body(request, state.options.max_body_bytes)
    big = len(body) > TRIM_BYTES
    limits = state.options.limits
    try:
        if len(body) > INLINE_PARSE_BYTES:
            parsed = await run_in_threadpool(decode_and_parse, body, loaded, limits, method)
        else:
            parsed = decode_and_parse(body, loaded, limits, method)
        outputs = await run_while_connected(request, state.runner.run(parsed))
        if method is None:
            response = json_response(format_predict_response(outputs, parsed.row_format, parsed.squeeze))
        else:
            response = json_response(format_examples_response(outputs, method))
    except BaseException:
        if big:
            await state.trimmer.soon()
        raise
    if big:  # once the answer has been sent
        response.background = BackgroundTask(state.trimmer.soon)
    return response


async def _timed(state: AppState, request: Request, model_name: str, version: str | None, label: str | None,
                 method: str | None) -> Response:
    """``_answer`` under the request deadline, counted in the metrics."""
    began, status = time.perf_counter(), 500
    timeout = state.options.request_timeout_s
    try:
        async with asyncio.timeout(timeout):
            response = await _answer(state, request, model_name,
                                     None if version is None else version_from_url(version), label, method)
        status = response.status_code
        return response
    except TimeoutError:
        status = 504
        raise RequestError(504, f"Deadline of {timeout:g} s exceeded") from None
    except RequestError as error:
        status = error.status_code
        raise
    except asyncio.CancelledError:  # the drain time is over: the request ends here, answered in JSON
        status = 503
        raise RequestError(503, "The server is shutting down") from None
    finally:
        api = {None: "predict", CLASSIFY: "classify", REGRESS: "regress"}[method]
        state.metrics.record(model_name, api, "REST", STATUS_NAMES.get(status, "UNKNOWN"),
                             time.perf_counter() - began)


def _add_inference_routes(verb: str, method: str | None, body: dict[str, Any]) -> None:
    """Adds ``POST .../{model}[/versions/{v}|/labels/{l}]:{verb}`` for the latest, one and a labelled version."""

    async def latest(model_name: str, request: Request, state: AppStateParam) -> Response:
        return await _timed(state, request, model_name, None, None, method)

    async def by_version(model_name: str, version: str, request: Request, state: AppStateParam) -> Response:
        return await _timed(state, request, model_name, version, None, method)

    async def by_label(model_name: str, label: str, request: Request, state: AppStateParam) -> Response:
        return await _timed(state, request, model_name, None, label, method)

    title = verb.title()
    router.add_api_route(f"/v1/models/{{model_name}}:{verb}", latest, methods=["POST"],
                         summary=f"{title} with the latest version", openapi_extra=body, name=f"{verb}_latest")
    router.add_api_route(f"/v1/models/{{model_name}}/versions/{{version}}:{verb}", by_version, methods=["POST"],
                         summary=f"{title} with one version", openapi_extra=body, name=f"{verb}_version")
    router.add_api_route(f"/v1/models/{{model_name}}/labels/{{label}}:{verb}", by_label, methods=["POST"],
                         summary=f"{title} with a labelled version", openapi_extra=body, name=f"{verb}_label")


_add_inference_routes("predict", None, _PREDICT_BODY)
_add_inference_routes("classify", CLASSIFY, _EXAMPLES_BODY)
_add_inference_routes("regress", REGRESS, _EXAMPLES_BODY)


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    state: AppState = app.state.seqapps
    state.repository.start_polling()
    if state.on_startup is not None:
        await state.on_startup()
    try:
        yield
    finally:
        if state.on_shutdown is not None:
            await state.on_shutdown()
        state.repository.stop_polling()
        state.runner.shutdown()


async def _request_error(request: Request, error: RequestError) -> Response:
    return error_response(error.status_code, error.message)


async def _http_error(request: Request, error: StarletteHTTPException) -> Response:
    message = "Malformed request" if error.status_code == 404 else str(error.detail)
    return error_response(error.status_code, f"{message}: {request.method} {request.url.path}")


async def _internal_error(request: Request, error: Exception) -> Response:
    logger.error("%s %s failed", request.method, request.url.path, exc_info=error)
    return error_response(500, f"{type(error).__name__}: {tf_error_message(error)}")


def create_app(repository: ModelRepository, options: ServingOptions, metrics: Metrics | None = None,
               runner: ModelRunner | None = None,
               on_startup: Callable[[], Awaitable[None]] | None = None,
               on_shutdown: Callable[[], Awaitable[None]] | None = None) -> FastAPI:
    """Builds the FastAPI application of TF Serving's REST API (OpenAPI at ``/openapi.json``).

    Args:
        repository: the models to serve; its poll thread runs while the application does.
        options: batching, bounds, timeouts and thread settings.
        metrics: where requests are counted (default: a new ``Metrics``).
        runner: what runs the models (default: a new ``ModelRunner``; shared with gRPC when given).
        on_startup, on_shutdown: coroutines run as the application starts and stops (the gRPC server).

    Returns:
        The application.
    """
    app = FastAPI(title="seqapps serve", version="1", redirect_slashes=False,
                  description="TF Serving's REST API (v1) over the SavedModels of a seqapps model root.",
                  lifespan=_lifespan)
    app.state.seqapps = AppState(repository, options, metrics or Metrics(), runner or ModelRunner(options),
                              on_startup, on_shutdown)
    app.add_exception_handler(RequestError, _request_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
    app.add_middleware(_HeadAsGet)
    app.include_router(router)
    return app


class _Protocol(HttpToolsProtocol):
    """uvicorn's HTTP protocol with a header timeout and TF Serving's ``{"error": ...}`` body on its own 400s."""

    header_timeout_s = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm_header_timer()

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timeout)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.cycle is None or self.cycle.response_complete:  # bytes of a new request's headers
            self._arm_header_timer()
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._disarm_header_timer()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        body = json.dumps({"error": msg}).encode()
        self.transport.write(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
                             b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n"
                             + body)
        self.transport.close()


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


def free_port(host: str) -> int:
    """A TCP port of ``host`` free right now (for gRPC's port 0; another process could take it first)."""
    with bind(host, 0) as sock:
        return sock.getsockname()[1]


def make_server(model_root: str | Path, sock: socket.socket, options: ServingOptions,
                host: str = "127.0.0.1") -> tuple[uvicorn.Server, ModelRepository, GrpcServer | None]:
    """Loads the models under ``model_root`` and builds a uvicorn server for them (not yet running).

    Args:
        model_root: the folder holding ``<name>/<version>/``.
        sock: the listening socket (see ``bind``); pass it to ``server.run(sockets=[sock])``.
        options: serving options.
        host: the address the gRPC server binds (with ``options.grpc_port``).

    Returns:
        The server, the model repository behind it, and the gRPC server (``None`` without ``grpc_port``).

    Raises:
        SeqappsError: ``model_root`` is not a folder.
    """
    root = Path(model_root)
    if not root.is_dir():
        raise SeqappsError(f"{root}: no such model root folder (expected saved_models/NAME/VERSION/)")
    metrics, runner = Metrics(), ModelRunner(options)  # before any model loads: it sizes TensorFlow's threads
    repository = ModelRepository(root, options.poll_seconds,
                                 None if options.labels_file is None else Path(options.labels_file))
    try:
        repository.refresh()
    except (OSError, ValueError) as error:
        raise SeqappsError(f"{root}: cannot scan the model root: {error}") from None
    on_startup = on_shutdown = grpc_server = None
    if options.grpc_port is not None:
        from seqapps.serving import grpc_service

        grpc_server = grpc_service.GrpcServer(repository, runner, metrics, options, host,
                                              options.grpc_port or free_port(host))
        on_startup, on_shutdown = grpc_server.start, grpc_server.stop
    protocol = type("SeqappsHttpProtocol", (_Protocol,), {"header_timeout_s": options.header_timeout_s})
    config = uvicorn.Config(create_app(repository, options, metrics, runner, on_startup, on_shutdown),
                            log_level="warning", access_log=False, http=protocol,
                            timeout_keep_alive=options.idle_timeout_s, timeout_graceful_shutdown=options.drain_seconds,
                            lifespan="on")
    return uvicorn.Server(config), repository, grpc_server


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
    server, _, _ = make_server(model_root, sock, options, host)
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
    server, repository, grpc_server = make_server(model_root, sock, options, host)
    shown = f"[{host}]" if ":" in host else host
    names = ", ".join(repository.names()) or "no models yet"
    grpc_note = "" if grpc_server is None else f" (gRPC on {shown}:{grpc_server.port})"
    print(f"seqapps serve: http://{shown}:{sock.getsockname()[1]} serving {names} from {repository.root}{grpc_note}",
          flush=True)
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn shuts down gracefully, then re-raises Ctrl-C
        server.run(sockets=[sock])
