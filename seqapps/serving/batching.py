"""Merging concurrent requests to one signature along the batch dimension."""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses

import numpy as np

from seqapps.serving.repository import LoadedSignature, cancellation


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
    its requests are run one by one so that only the bad one fails. A call whose
    requests have all gone (cancelled: client gone, deadline passed) is stopped.
    """

    def __init__(self, signature: LoadedSignature, executor: concurrent.futures.Executor, max_batch_size: int,
                 timeout: float, slots: int, running: set | None = None) -> None:
        """Args:
            signature: a batchable signature.
            executor: the thread pool that runs model calls.
            max_batch_size: most rows per call.
            timeout: seconds a batch waits for more rows.
            slots: most batches running at once.
            running: where the cancellation manager of each call in progress is kept (to stop them all).
        """
        self.running = set() if running is None else running
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
        manager = cancellation.CancellationManager()

        def abandon(_: asyncio.Future) -> None:
            if all(item.future.done() for item in batch):
                manager.start_cancel()  # nobody waits for this call any more: stop it

        for item in batch:
            item.future.add_done_callback(abandon)
        self.running.add(manager)
        try:
            results = await asyncio.get_running_loop().run_in_executor(self.executor, self._call, batch, manager)
        finally:
            self.running.discard(manager)
            self._slots.release()
        for item, result in zip(batch, results):
            if item.future.done():
                continue
            if isinstance(result, Exception):
                item.future.set_exception(result)
            else:
                item.future.set_result(result)

    def _call(self, batch: list[_Queued], manager: cancellation.CancellationManager
              ) -> list[dict[str, np.ndarray] | Exception]:
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
                    outputs = self.signature.call(merged, manager)
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
                    results[i] = self.signature.call(batch[i].inputs, manager)
                except Exception as error:  # handed to the request that caused it
                    results[i] = error
        return [results[i] for i in range(len(batch))]
