"""Dynamic batching: concurrent requests for one model stacked into one run.

Requests whose inputs agree in everything but the batch dim (dim 0: same names, dtypes and
other dims) are concatenated along it, run once, and each output is split back by the
rows each request brought. A batch closes when it holds `max_batch_size` rows or when its
oldest request has waited `timeout_s`; while a run is in flight the next requests queue,
so a busy server batches even with timeout 0 and an idle one adds no wait beyond it.

The runs happen on an executor thread: the event loop stays free to take requests (glassrt
releases the GIL in its BLAS/oneDNN/Numba kernels). One batch runs at a time per model:
on CPU a run already uses the cores through its intra-op threads.

Only models whose every input and output has the same named batch dim first are batched
(app.py decides); a stacked run whose outputs do not have the stacked rows first (a model
that mixes rows) or that fails is rerun request by request, so no request ever gets
another's rows or another's error. Where the requests then all run alone (or the rows were
mixed), the model does not really take a batch, and batching stops for it, with a warning.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .protocol import ProtocolError

log = logging.getLogger("glassrt.serve")


@dataclass
class _Pending:
    feeds: dict
    rows: int
    key: tuple  # what must agree for two requests to share a run
    future: asyncio.Future
    enqueued: float = field(default_factory=time.perf_counter)


def _key(feeds: dict) -> tuple:
    return tuple(sorted((n, a.dtype.str, a.shape[1:]) for n, a in feeds.items()))


class Batcher:
    """run(feeds) -> outputs (a list of arrays), called on `executor`. on_run(rows,
    [queue seconds per request]) is called for each run, for the metrics."""

    def __init__(self, run, executor, *, max_batch_size: int, timeout_s: float, max_queue: int, on_run):
        self.run, self.executor = run, executor
        self.max_rows, self.timeout_s, self.max_queue = max_batch_size, timeout_s, max_queue
        self.on_run = on_run
        self._waiting: deque[_Pending] = deque()
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        self._loop = None

    async def submit(self, feeds: dict) -> list:
        loop = asyncio.get_running_loop()
        if self._worker is None or self._loop is not loop:  # started lazily, on the loop that serves
            self._loop, self._wakeup = loop, asyncio.Event()
            self._worker = loop.create_task(self._work())
        if len(self._waiting) >= self.max_queue:
            raise ProtocolError(f"the model's queue is full ({self.max_queue} requests waiting); retry later", 503)
        rows = next(iter(feeds.values())).shape[0]
        pending = _Pending(feeds, rows, _key(feeds), loop.create_future())
        self._waiting.append(pending)
        self._wakeup.set()
        return await pending.future

    def close(self):
        if self._worker is not None:
            self._worker.cancel()

    def _rows_ready(self, first: _Pending) -> int:
        return sum(p.rows for p in self._waiting if p.key == first.key)

    async def _work(self):
        loop = asyncio.get_running_loop()
        while True:
            while not self._waiting:
                self._wakeup.clear()
                await self._wakeup.wait()
            first = self._waiting[0]
            deadline = first.enqueued + self.timeout_s
            while self._rows_ready(first) < self.max_rows and (left := deadline - time.perf_counter()) > 0:
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), left)
                except asyncio.TimeoutError:
                    break
            batch, rows = self._take(first)
            try:
                results = await loop.run_in_executor(self.executor, self._run_batch, batch, rows)
            except Exception as e:  # noqa: BLE001  the executor itself failed (shut down): tell everyone
                results = [e] * len(batch)
            for p, r in zip(batch, results):
                if p.future.done():  # the client went away
                    continue
                if isinstance(r, BaseException):
                    p.future.set_exception(r)
                else:
                    p.future.set_result(r)

    def _take(self, first: _Pending) -> tuple[list, int]:
        """The first request, and the compatible ones after it, oldest first, up to max rows."""
        batch, rows, keep = [], 0, deque()
        while self._waiting:
            p = self._waiting.popleft()
            fits = p is first or (p.key == first.key and first.rows > 0 and p.rows > 0
                                  and rows + p.rows <= self.max_rows)
            if fits:
                batch.append(p)
                rows += p.rows
            else:
                keep.append(p)
        self._waiting = keep
        return batch, rows

    def _run_batch(self, batch: list, rows: int) -> list:
        """Each request's outputs (or its exception), in batch order. On the executor thread."""
        start = time.perf_counter()
        self.on_run(rows, [start - p.enqueued for p in batch])
        if len(batch) == 1:
            return [self._run_one(batch[0].feeds)]
        stacked = {name: np.concatenate([p.feeds[name] for p in batch]) for name in batch[0].feeds}
        try:
            outs = self.run(stacked)
        except Exception as e:  # noqa: BLE001  find out whose: each request alone gets its own answer
            alone = [self._run_one(p.feeds) for p in batch]
            if not any(isinstance(r, BaseException) for r in alone):
                # Every request runs alone, none stacked: the model does not take a batch
                # (a Reshape to a constant batch of 1, say) whatever its inputs declare.
                log.warning("batching turned off: a batch of %d requests failed (%s: %s) where each alone "
                            "runs", len(batch), type(e).__name__, e)
                self.max_rows = 1
            return alone
        if not all(isinstance(o, np.ndarray) and o.ndim and o.shape[0] == rows for o in outs):
            log.warning("batching turned off: a batched run's outputs do not have the %d stacked rows first "
                        "(shapes %s): the model mixes rows", rows, [getattr(o, "shape", None) for o in outs])
            self.max_rows = 1
            return [self._run_one(p.feeds) for p in batch]
        cuts = np.cumsum([p.rows for p in batch])[:-1]
        per_output = [np.split(o, cuts) for o in outs]
        return [[parts[i] for parts in per_output] for i in range(len(batch))]

    def _run_one(self, feeds):
        try:
            return self.run(feeds)
        except Exception as e:  # noqa: BLE001  handed to the request's future, answered as its error
            return e
