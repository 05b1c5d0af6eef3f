"""glassrt's intra-op threads: one pool, one policy, for every kernel that runs in parallel.

Why not BLAS's own threads: OpenBLAS splits a GEMM statically into one share per thread,
and its idle threads spin-wait. When another process holds a core, the whole GEMM waits
for the share of the thread that is not running (measured on the 2-core machine: a
1×768×2304 matmul takes 0.15 ms on one OpenBLAS thread and 12 ms on two while the other
core was busy). So BLAS runs single-threaded inside glassrt's kernels, and a kernel that
pays for threads splits its work into tasks that this pool's threads claim one at a time:
a thread the OS has descheduled delays the run by at most the one task it holds, and the
calling thread takes the rest. Idle workers sleep on a condition (no spinning), so a busy
machine loses nothing to glassrt's waiting threads.

    parallel_for(n, fn)        # fn(0) ... fn(n-1), on the pool and the calling thread
    matmul(a, b, out)          # np.matmul split over the pool when it is big enough

A session's runs use a pool of SessionOptions.intra_op_num_threads threads (0: the CPUs
this process may use); pools are made once per size and shared by sessions.
"""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager

import numpy as np

# Below this many multiply-adds a GEMM runs on the calling thread alone: waking a worker
# costs tens of microseconds, about what a single thread does in this much work.
MIN_PARALLEL_MACS = 1 << 18
# Tasks per thread: enough that a late thread leaves little to wait for, few enough that
# each task is big enough for BLAS to run at full speed.
TASKS_PER_THREAD = 4


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class _Job:
    __slots__ = ("fn", "n", "next", "done", "lock", "finished", "error")

    def __init__(self, fn, n):
        self.fn, self.n = fn, n
        self.next = 0
        self.done = 0
        self.lock = threading.Lock()
        self.finished = threading.Event()
        self.error = None

    def claim(self):
        with self.lock:
            i = self.next
            if i >= self.n:
                return None
            self.next = i + 1
            return i

    def work(self):
        while True:
            i = self.claim()
            if i is None:
                return
            try:
                if self.error is None:
                    self.fn(i)
            except BaseException as e:  # reported to the caller, which re-raises it
                self.error = self.error or e
            with self.lock:
                self.done += 1
                if self.done == self.n:
                    self.finished.set()


class ThreadPool:
    """`size - 1` sleeping workers plus the calling thread; one job at a time (a second
    caller meanwhile runs its tasks itself)."""

    def __init__(self, size: int):
        self.size = max(1, int(size))
        self._cv = threading.Condition()
        self._job = None
        self._generation = 0
        self._busy = threading.Lock()
        self._local = threading.local()
        self._workers = [threading.Thread(target=self._serve, name=f"glassrt-worker-{k}", daemon=True)
                         for k in range(self.size - 1)]
        for t in self._workers:
            t.start()

    def _serve(self):
        self._local.worker = True
        seen = 0
        while True:
            with self._cv:
                while self._generation == seen:
                    self._cv.wait()
                seen, job = self._generation, self._job
            if job is not None:
                job.work()

    def run(self, n: int, fn) -> None:
        if n <= 0:
            return
        if n == 1 or self.size == 1 or getattr(self._local, "worker", False) or not self._busy.acquire(blocking=False):
            for i in range(n):  # nested, single-threaded, or the pool is taken: run here
                fn(i)
            return
        try:
            job = _Job(fn, n)
            with self._cv:
                self._job, self._generation = job, self._generation + 1
                self._cv.notify_all()
            job.work()
            job.finished.wait()
            with self._cv:
                self._job = None
            if job.error is not None:
                raise job.error
        finally:
            self._busy.release()


_pools: dict[int, ThreadPool] = {}
_pools_lock = threading.Lock()
_current = threading.local()  # the pool of the run this thread is in


def pool_of(size: int) -> ThreadPool:
    """The process's pool of `size` threads (0: every CPU this process may use), made once."""
    size = size if size and size > 0 else available_cpus()
    with _pools_lock:
        if size not in _pools:
            _pools[size] = ThreadPool(size)
        return _pools[size]


def pool() -> ThreadPool:
    return getattr(_current, "pool", None) or pool_of(0)


def threads() -> int:
    return pool().size


@contextmanager
def running_with(size: int):
    """Kernels called in this block (on this thread) spread their work over a pool of
    `size` threads, and BLAS runs single-threaded inside their tasks."""
    previous = getattr(_current, "pool", None)
    _current.pool = pool_of(size)
    try:
        with single_threaded_blas():
            yield _current.pool
    finally:
        _current.pool = previous


def parallel_for(n: int, fn) -> None:
    """fn(i) for i in range(n), spread over the pool (the calling thread takes part)."""
    pool().run(n, fn)


def ranges(total: int, parts: int, align: int = 1) -> list[tuple[int, int]]:
    """`total` split into at most `parts` contiguous (start, stop) ranges, each start a
    multiple of `align` (SIMD-friendly column blocks)."""
    parts = max(1, min(parts, -(-total // align)))
    step = -(-total // parts)
    step = -(-step // align) * align
    return [(s, min(total, s + step)) for s in range(0, total, step)]


def matmul(a, b, out):
    """out[...] = a @ b (np.matmul's semantics, operands of rank 2 or more), spread over the
    pool when the product is big enough to pay for it: a 2-D product by column blocks (or
    row blocks when there are more rows), a stacked one by matrices."""
    if a.ndim < 2 or b.ndim < 2 or out is None or a.dtype.kind != "f" or threads() == 1 \
            or out.size * a.shape[-1] < MIN_PARALLEL_MACS:
        return np.matmul(a, b, out=out)
    if b.ndim == 2 and (a.ndim == 2 or (a.flags.c_contiguous and out.flags.c_contiguous)):
        _matmul_2d(a.reshape(-1, a.shape[-1]), b, out.reshape(-1, b.shape[-1]))
        return out
    batch = out.shape[:-2]
    index = list(np.ndindex(*batch))

    def operand(x, i):  # x's matrix for output matrix i, broadcasting as np.matmul does
        lead = x.shape[:-2]
        return x[tuple(0 if d == 1 else j for d, j in zip(lead, i[len(i) - len(lead):]))]

    parallel_for(len(index), lambda k: np.matmul(operand(a, index[k]), operand(b, index[k]), out=out[index[k]]))
    return out


def _matmul_2d(a, b, out):
    m, n = a.shape[0], b.shape[1]
    parts = threads() * TASKS_PER_THREAD
    if n >= m:
        blocks = ranges(n, parts, align=16)
        parallel_for(len(blocks), lambda i: np.matmul(a, b[:, blocks[i][0]:blocks[i][1]],
                                                      out=out[:, blocks[i][0]:blocks[i][1]]))
    else:
        blocks = ranges(m, parts, align=4)
        parallel_for(len(blocks), lambda i: np.matmul(a[blocks[i][0]:blocks[i][1]], b,
                                                      out=out[blocks[i][0]:blocks[i][1]]))


# ---------------------------------------------------------------- BLAS's own threads

_blas_lock = threading.Lock()
_blas_users = 0
_blas_saved: list = []


def _blas_controllers():
    try:
        from threadpoolctl import ThreadpoolController

        return [c for c in ThreadpoolController().lib_controllers if c.user_api == "blas"]
    except Exception:  # no threadpoolctl, or a BLAS it cannot drive: nothing to limit
        return []


_controllers = None


@contextmanager
def single_threaded_blas():
    """BLAS at one thread while glassrt runs (its parallelism is this pool's); the
    previous setting comes back when the last concurrent run leaves."""
    global _blas_users, _controllers
    with _blas_lock:
        if _controllers is None:
            _controllers = _blas_controllers()
        if _blas_users == 0:
            _blas_saved[:] = [c.get_num_threads() for c in _controllers]
            for c in _controllers:
                c.set_num_threads(1)
        _blas_users += 1
    try:
        yield
    finally:
        with _blas_lock:
            _blas_users -= 1
            if _blas_users == 0:
                for c, n in zip(_controllers, _blas_saved):
                    c.set_num_threads(n)
