"""Primitives made before the first run, on two threads at once.

Making a primitive is oneDNN generating its machine code: 0.2-1.5 ms a convolution (a
YOLOv8n's 18 convolutions: 11 ms of its 38 ms first run), in one foreign call that
releases the GIL. Placement and plan selection make a conv's or a matmul's descriptor to
ask its implementation (kernels.shared_pd), well before the first run binds it: `submit`
queues such a descriptor, and `make_queued`, called as a plan's first run begins, makes the
queued primitives on the calling thread and a worker thread at once, each on a core.

Measured before choosing this (2-core machine): a worker making them as they are queued,
during placement, cost the interpreter ~0.15 ms a primitive in GIL hand-overs (placement
3-4 ms slower, the first run 6 ms faster); one making them during the first run's steps
slowed the steps' two-thread primitives (its core shared): 5-10 ms worse than none.

`claim` is how a primitive is taken (PrimitiveDesc.primitive): a job still queued is taken
back (the caller makes it), one being made is waited for, one made is handed over. A
primitive is made with the OpenMP thread count its descriptor was made for (oneDNN builds a
kernel for the calling thread's count and keys its cache by it), and a first run makes those
of its own count. A fork waits for the jobs in progress; the child makes what was queued
itself. GLASSRT_PRIMITIVES_AHEAD=0: none queued.
"""
from __future__ import annotations

import atexit
import collections
import os
import threading
from ctypes import byref, c_void_p

from . import capi

QUEUED, TAKEN, RUNNING, DONE = range(4)
MAX_QUEUED = 512  # (a session placed and never run leaves its jobs: the oldest are dropped)

_cv = threading.Condition()
_queue: collections.deque = collections.deque()
_burst: collections.deque = collections.deque()  # what make_queued is making now
_worker: threading.Thread | None = None
_running = 0  # jobs being made
_closing = False


def turned_off() -> bool:
    return os.environ.get("GLASSRT_PRIMITIVES_AHEAD", "1").strip().lower() in ("0", "false", "no", "off")


class Job:
    """One descriptor's primitive to make (the descriptor kept alive until then)."""

    __slots__ = ("pd", "threads", "state", "handle")

    def __init__(self, pd, threads: int):
        self.pd, self.threads, self.state, self.handle = pd, threads, QUEUED, None

    def make(self) -> None:
        """Make the primitive (the GIL released meanwhile); a failure leaves no handle, and
        the claimer makes it again, which reports oneDNN's error where it happens."""
        if capi.get_max_threads() != self.threads:
            capi.set_num_threads(self.threads)
        h = c_void_p()
        if capi.lib.dnnl_primitive_create(byref(h), self.pd.handle) == 0:
            self.handle = h

    def __del__(self, _capi=capi):  # made, never claimed (its descriptor went unused)
        try:  # (at the interpreter's exit _closing is True, or None once the module's globals are cleared)
            h = self.handle
            if h is not None and h.value and _closing is False and _capi.lib is not None:
                _capi.lib.dnnl_primitive_destroy(h)
        except Exception:  # nothing a destructor could report to
            pass


def submit(pd) -> Job | None:
    """Queue the making of `pd`'s primitive for the next make_queued; None when turned off."""
    if _closing or turned_off():
        return None
    job = Job(pd, capi.get_max_threads())
    with _cv:
        if len(_queue) >= MAX_QUEUED:
            _drop(_queue.popleft())
        _queue.append(job)
    return job


def claim(job: Job):
    """The primitive's handle made ahead (c_void_p), or None: the caller makes it."""
    with _cv:
        if job.state == QUEUED:
            _drop(job)
            return None
        while job.state == RUNNING:
            _cv.wait()
    h, job.handle = job.handle, None
    return h


def make_queued() -> None:
    """Make the queued primitives for this thread's OpenMP count (the run's) now, on this
    thread and the worker's; returns when all are made. (Those made for another count stay
    queued: a session of one thread whose placement asked two-thread descriptors would
    never bind them.)"""
    global _queue
    if not _queue:
        return
    threads = capi.get_max_threads()
    with _cv:
        mine = [j for j in _queue if j.threads == threads]
        if not mine:
            return
        _queue = collections.deque(j for j in _queue if j.threads != threads)
        _burst.extend(mine)
        _start_worker()
        _cv.notify()
    while _make_next():
        pass
    with _cv:
        while _running:
            _cv.wait()


def _drop(job: Job) -> None:
    if job.state == QUEUED:
        job.state, job.pd = TAKEN, None


def _make_next() -> bool:
    """Make the next queued job here; False when none is left."""
    global _running
    with _cv:
        while _burst:
            job = _burst.popleft()
            if job.state == QUEUED:
                break
        else:
            return False
        job.state = RUNNING
        _running += 1
    try:
        job.make()
    finally:
        with _cv:
            job.state, job.pd = DONE, None
            _running -= 1
            _cv.notify_all()
    return True


def _start_worker() -> None:
    global _worker
    if _worker is None:
        _worker = threading.Thread(target=_work, name="glassrt-primitives-ahead", daemon=True)
        _worker.start()


def _work() -> None:
    while True:
        with _cv:
            while not _burst and not _closing:
                _cv.wait()
            if _closing:
                return
        _make_next()


@atexit.register
def _at_exit() -> None:
    global _closing
    with _cv:
        _closing = True
        for q in (_queue, _burst):
            while q:
                _drop(q.popleft())
        _cv.notify_all()
        while _running:  # (a primitive half made when the library unloads)
            _cv.wait()


def _before_fork() -> None:
    _cv.acquire()
    while _running:
        _cv.wait()


def _after_fork_in_child() -> None:
    global _cv, _queue, _burst, _worker, _running
    # the jobs still queued stay QUEUED: the child's claims take each back and make it
    _cv, _queue, _burst, _worker, _running = threading.Condition(), collections.deque(), collections.deque(), None, 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=lambda: _cv.release(),
                        after_in_child=_after_fork_in_child)
