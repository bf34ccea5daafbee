"""What REST and gRPC share to run requests: the server's options and the ``ModelRunner``.

Nothing here imports FastAPI: the gRPC API (``grpc_service``) runs its requests through the same
runner as the REST application (``app``), with the same threads and batchers.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import os
import weakref

import numpy as np
import tensorflow as tf

from seqapps.export_format import Limits
from seqapps.serving.batching import Batcher
from seqapps.serving.protocol import CheckedRequest, tf_error_message
from seqapps.serving.repository import LoadedSignature, RequestError, cancellation

logger = logging.getLogger("seqapps.serving")


@dataclasses.dataclass(frozen=True)
class ServingOptions:
    """How the server batches, bounds, times out and polls.

    Attributes:
        max_batch_size: most rows merged into one model call; 0 or 1 turns batching off.
        batch_timeout_ms: how long a batch waits for more requests once it has one; with 0, a
            batch takes the requests that queued while the model was busy (TF Serving's advice
            for CPUs), so a lone request waits for nothing.
        max_body_bytes: larger request bodies are refused with 400.
        poll_seconds: how often the model root is scanned for new versions.
        model_threads: threads that call the models (and batches run at once per signature); with
            batching on, the requests that are not batched take at most all but one of them.
        request_timeout_s: deadline of one request, from its headers to its answer (504 past it).
        max_request_rows, max_string_bytes, max_generated_length: request bounds (400 past them)
            for exports whose ``limits.json`` does not set them.
        header_timeout_s: a connection that has not sent a request's headers within this is closed.
        idle_timeout_s: an idle keep-alive connection is closed after this.
        drain_seconds: on SIGTERM/Ctrl-C, how long requests in flight may finish before they are cancelled.
        labels_file: optional version-labels file (``MODEL: {LABEL: VERSION}``, YAML or JSON).
        grpc_port: also serve TF Serving's gRPC API on this port (0: a free one); ``None``: no gRPC.
    """

    max_batch_size: int = 16
    batch_timeout_ms: float = 0.0
    max_body_bytes: int = 32 * 1024 * 1024
    poll_seconds: float = 1.0
    model_threads: int = 4
    request_timeout_s: float = 60.0
    max_request_rows: int = 1024
    max_string_bytes: int = 64 * 1024
    max_generated_length: int = 4096
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 30.0
    drain_seconds: float = 10.0
    labels_file: str | None = None
    grpc_port: int | None = None

    @property
    def limits(self) -> Limits:
        """The request bounds for exports that set none."""
        return Limits(max_batch_size=self.max_request_rows, max_string_bytes=self.max_string_bytes,
                      max_generated_length=self.max_generated_length)


def reserve_inter_op_threads(model_threads: int) -> None:
    """Gives TensorFlow's inter-op thread pool at least one thread per model thread.

    A running ``tf.function`` whose graph loops (generation, the decoders' ``while_loop``) keeps one
    inter-op thread until the loop ends, and TensorFlow sizes that pool to the cores. On 2 cores, two
    long generations at once left a 1-row request no thread until one of them ended: 0.77 s against
    3 ms (issue 25, item 16; docs/results.md). Four threads cost a lone call about 3% against two.
    The pool can only be sized before TensorFlow's runtime starts: later (a server started inside a
    process that has run TensorFlow), it is left as it is, with one log line.

    Args:
        model_threads: threads that call the models at once.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        tf.config.threading.set_inter_op_parallelism_threads(max(cores, model_threads))
    except RuntimeError:  # the runtime has started
        logger.info("TensorFlow's inter-op threads are already set (%s); long calls may delay short ones",
                    tf.config.threading.get_inter_op_parallelism_threads() or "one per core")


class ModelRunner:
    """Runs checked requests on their signatures: batching, cancellation, TF errors as 400s."""

    def __init__(self, options: ServingOptions) -> None:
        """Sizes TensorFlow's inter-op pool to the model threads (``reserve_inter_op_threads``).

        Args:
            options: batching and thread settings.
        """
        reserve_inter_op_threads(options.model_threads)
        self.options = options
        self.executor = concurrent.futures.ThreadPoolExecutor(options.model_threads,
                                                              thread_name_prefix="seqapps-model")
        self._batchers: weakref.WeakKeyDictionary[LoadedSignature, Batcher] = weakref.WeakKeyDictionary()
        self.running: set[cancellation.CancellationManager] = set()  # of the model calls in progress
        # with batching on, the requests that are not batched run on at most model_threads - 1 threads at
        # once, so however long they run (until their deadline), a thread stays free for the batched ones
        self._unbatched_slots = asyncio.Semaphore(max(1, options.model_threads - 1))

    async def run(self, request: CheckedRequest) -> dict[str, np.ndarray]:
        """Runs one request; cancelling the awaiting task stops the model call.

        Args:
            request: the checked request.

        Returns:
            One array per output of the signature.

        Raises:
            RequestError: 400 when TensorFlow refuses the inputs.
        """
        signature, rows, options = request.signature, request.rows, self.options
        try:
            if options.max_batch_size > 1 and signature.batchable and rows and rows <= options.max_batch_size:
                batcher = self._batchers.get(signature)
                if batcher is None:
                    batcher = self._batchers[signature] = Batcher(
                        signature, self.executor, options.max_batch_size, options.batch_timeout_ms / 1000,
                        options.model_threads, self.running)
                return await batcher.predict(request.inputs, rows)
            if options.max_batch_size > 1:
                async with self._unbatched_slots:
                    return await self._call(signature, request.inputs)
            return await self._call(signature, request.inputs)
        except (tf.errors.InvalidArgumentError, tf.errors.OutOfRangeError, ValueError, TypeError) as error:
            raise RequestError(400, tf_error_message(error)) from None

    async def _call(self, signature: LoadedSignature, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Calls ``signature`` on a model thread; cancelling the awaiting task stops the call inside TensorFlow."""
        manager = cancellation.CancellationManager()
        self.running.add(manager)
        future = asyncio.get_running_loop().run_in_executor(self.executor, signature.call, inputs, manager)
        try:
            return await future
        except asyncio.CancelledError:
            manager.start_cancel()
            raise
        finally:
            self.running.discard(manager)

    def shutdown(self) -> None:
        """Drops queued calls, stops the running ones and waits for their threads."""
        for manager in list(self.running):
            manager.start_cancel()
        self.executor.shutdown(wait=True, cancel_futures=True)
