"""Large buffers straight from the OS, private, on transparent huge pages from their first touch (or once a plan keeps running).

Packed weights and plan arenas are the memory a run streams through: a GPT-2-sized decode
step reads ~340 MB of layer weights once per token, ~85,000 pages of 4 KiB. Most
distributions set transparent huge pages to `madvise`: a process gets 2 MiB pages only for
memory it asks for with madvise(MADV_HUGEPAGE). glassrt's arenas were anonymous maps (so
that an evicted plan's arena goes back to the OS at once) that asked for nothing, and were
MAP_SHARED (Python's mmap default): a forked child running the session wrote into its
parent's arena. So buffers of at least one huge page are mapped here private and aligned
to 2 MiB.

When: GLASSRT_HUGE_PAGES says. "early" (the default): every such buffer is advised before
its first touch, so packed weights, weights read from the file and arenas are on huge pages
from their first run (where the kernel grants them: it may not, with no free huge page).
Measured on the 2-core AVX2 EPYC VM, alternating processes, late then early: GPT-2 decoding
lower in 7 pairs of 7 unpinned (34.6-40.8 -> 28.2-38.0 ms a token) and in 4 of 6 with the
OpenBLAS pin (30.9-35.4 -> 28.5-35.4); BERT-base batch 1 lower in 4 of 4 unpinned (339-364 ->
334-360 ms) and 2 of 3 pinned (334-341 -> 331-337); the cost, a first touch of fresh huge
pages (64 MiB: 14-115 ms against 25-32 on small pages there): BERT-base's creation and first
run 1.21-1.25 -> 1.32-1.61 s (onnxruntime 1.23), the small models' none measurable
(MobileNetV2 0.18 s, SqueezeNet 0.09 s). The slab small buffers are carved from (`carve`)
stays on small pages until it is full, as in "late".

"late": they start on small pages, and move onto huge pages when a plan has run STRAIGHT_AFTER
times (runtime/plan.py: a plan that keeps running, a served model or a decoding loop):
`promote_when_idle` then queues the whole huge pages of every buffer mapped since (the
partial page at a buffer's end stays small, so no buffer grows beyond its size, but for an
arena, which is written whole), and a thread advises them and has the kernel collapse them
(MADV_COLLAPSE, Linux 6.1; on an older kernel the advice alone lets khugepaged do it over
time) one huge page at a time, only while no plan run goes on (`promote` does it all at
once, in the caller); a process that runs plans back to back (a benchmark's loop) keeps
small pages. For a VM whose first touches of huge pages cost much more: wherever the host
takes back what a guest frees (free page reporting: Firecracker, WSL2, cloud microVMs), the
guest hands a huge page out of the 2 MiB blocks it has reported, which the host must fault
in again, while small pages come from blocks it kept. Measured on such a VM, BERT-base
batch 8's first run (its 340 MB of weights packed): 3.0-3.9 s on huge pages from the start,
1.4-1.6 s on small pages (three rounds of alternating processes); GPT-2 decoding per token on
small pages against huge pages: 0.98x, 1.07x, 1.07x (16 alternating 32-token rounds each).
In steady runs the huge pages pay (`benchmarks/huge_pages.py`, twelve GPT-2 layers'
one-row products through NumPy's BLAS, ms per pass over 4 KiB / huge pages: 17.8 / 16.0,
15.5 / 15.1, 17.2 / 16.3), and the collapse is a cost paid once (GPT-2's 300-455 MB: 0.5-5.2
s on that VM, a tenth of that where a machine's memory is its own), in idle time: paid in
the run that triggered it, it stalled that run (see IDLE_S). Weights read from a model file
are left by promote unless a kernel reads one where it lies (promote_with_the_rest): most are
packed on the first run and never read again. A plan's arena is advised at once under
either (os_buffer(early=True): runtime/memory.py's allocate_arena says what it gains).

"0" turns the advice off (the buffers are still mapped the same way); `explain` shows the
kernel's setting, the policy, what was advised when and what collapsed.
"""
from __future__ import annotations

import errno
import functools
import mmap
import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass

import numpy as np

HUGE_PAGE = 2 << 20
_THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


@dataclass
class PageStats:
    """Bytes mapped by this module in this process, and how many of them were advised."""

    buffers: int = 0
    mapped_bytes: int = 0
    advised_bytes: int = 0  # moved onto huge pages by promote (advised, then collapsed where the kernel can)
    collapsed_bytes: int = 0  # of those, collapsed at once (MADV_COLLAPSE)
    huge_from_start_bytes: int = 0  # advised before their first touch (policy "early", and arenas)
    promote_seconds: float = 0.0  # spent in promote, all calls
    populated_bytes: int = 0  # faulted in ahead of their first touch, on another thread (populate_soon)


stats = PageStats()


@functools.lru_cache(maxsize=1)
def thp_mode() -> str:
    """The kernel's transparent huge page setting: always, madvise, never or unavailable
    (read once: every large buffer asks)."""
    try:
        with open(_THP_SETTING) as f:
            text = f.read()
    except OSError:
        return "unavailable"
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else "unavailable"


def policy() -> str:
    """When large buffers move onto huge pages (GLASSRT_HUGE_PAGES, see the module's doc):
    "early" (the default), "late", or "off" ("0")."""
    value = os.environ.get("GLASSRT_HUGE_PAGES", "early").strip().lower()
    return "off" if value in ("0", "off", "never") else "late" if value == "late" else "early"


def advice_enabled() -> bool:
    return policy() != "off" and hasattr(mmap, "MADV_HUGEPAGE") and thp_mode() in ("always", "madvise")


def _private_map(nbytes: int) -> mmap.mmap:
    """Anonymous private memory. Python's mmap maps MAP_SHARED unless told otherwise, and
    shared anonymous memory is shmem: a forked child would write into its parent's buffers,
    and Linux gives shmem huge pages only where shmem_enabled says so (usually never)."""
    return mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def os_buffer(nbytes: int, whole_pages: bool = False, *, promoted: bool = True,
              early: bool | None = None) -> np.ndarray:
    """A zeroed uint8 array of nbytes, mapped from the OS; from one huge page up its start
    is 2 MiB aligned and its whole huge pages wait for `promote` (see the module's doc).
    With `whole_pages` the partial page at its end is promoted too: a buffer that is all
    written at each run (a plan's arena) then takes one huge page there, not up to 511
    small ones, for at most one huge page more of resident memory. With promoted=False
    promote leaves it unless promote_with_the_rest asks (weights read from a model file:
    most are packed and never read again; a kernel that reads one where it lies asks).
    early: its whole huge pages advised at once, before anything touches them (True: whatever
    the policy, a plan's arena: see allocate_arena; False: never, the carving slab; None: as
    the policy says); promote then leaves it."""
    return _os_mapping(nbytes, whole_pages, promoted, early)[0]


# Buffers of a huge page or more still on small pages: (the mapping, weakly, its address and
# length, the offset and length of its whole huge pages there, whether promote takes it)
_pending: list = []
_pending_lock = threading.Lock()
_prune_at = [64]
MADV_COLLAPSE = getattr(mmap, "MADV_COLLAPSE", 25)  # Linux's value (Python 3.11's mmap does not name it)
_collapse_works = [True]  # until a kernel without MADV_COLLAPSE says EINVAL to a huge-page-advised range


def _os_mapping(nbytes: int, whole_pages: bool = False, promoted: bool = True,
                early: bool | None = None) -> tuple[np.ndarray, mmap.mmap, int]:
    """os_buffer's array, the mapping it lies in and its offset there."""
    nbytes = max(int(nbytes), 1)
    if nbytes < HUGE_PAGE:
        region = _private_map(nbytes)
        return np.frombuffer(region, dtype=np.uint8), region, 0
    # (the slack mapped around the aligned pages is never touched, so never resident)
    region = _private_map(nbytes + 2 * HUGE_PAGE)
    whole = np.frombuffer(region, dtype=np.uint8)
    start = (-whole.ctypes.data) % HUGE_PAGE
    if promoted:
        stats.buffers += 1
        stats.mapped_bytes += nbytes
    if advice_enabled():
        pages = (-(-nbytes // HUGE_PAGE) if whole_pages else nbytes // HUGE_PAGE) * HUGE_PAGE
        if early or (early is None and policy() == "early"):
            if _madvise()(whole.ctypes.data + start, pages, mmap.MADV_HUGEPAGE) == 0:
                stats.huge_from_start_bytes += pages
            return whole[start:start + nbytes], region, start
        with _pending_lock:
            if len(_pending) >= _prune_at[0]:  # buffers that died unmoved (sessions that never kept running)
                _pending[:] = [e for e in _pending if e[0]() is not None]
                _prune_at[0] = 2 * len(_pending) + 64
            _pending.append([weakref.ref(region), whole.ctypes.data, whole.nbytes, start, pages, promoted])
    return whole[start:start + nbytes], region, start


def pending_bytes() -> int:
    """Bytes of live buffers still on small pages that promote would move, or that
    promote_when_idle queued and has not moved yet."""
    with _pending_lock:
        waiting = sum(e[4] for e in _pending if e[5] and e[0]() is not None)
    return waiting + moving_bytes()


def promote() -> int:
    """Move the buffers mapped since the last call onto huge pages now (bytes advised): their
    whole huge pages are advised and collapsed (MADV_COLLAPSE copies each 2 MiB into a huge
    page; on a kernel without it khugepaged collapses the advised ranges in its own time).
    Plans call promote_when_idle instead: done here, in a run, it cost that run 0.5-5.2 s for
    GPT-2's 300-455 MB; a thread collapsing them all beside the runs was no better (the runs
    wait on the pages being copied: 30 ms decode steps took 150-1,100 ms). The slab being
    carved waits for the next call (its unused end would become resident)."""
    if not advice_enabled():
        return 0
    _queue_due()
    return _move_queued()


def promote_with_the_rest(arr: np.ndarray) -> bool:
    """Have the next promote move the os_buffer holding `arr` (a view of it, transposed or
    not) though it was mapped with promoted=False: a kernel that reads a weight where it
    lies at every run calls this as it binds. False where `arr` is not in such a buffer."""
    if not isinstance(arr, np.ndarray) or arr.size == 0:
        return False
    addr = arr.__array_interface__["data"][0]
    with _pending_lock:
        for e in _pending:
            if e[1] <= addr < e[1] + e[2] and e[0]() is not None:
                e[5] = True
                return True
    return False


MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # (Linux 5.14; Python 3.11's mmap does not name it)
_populate_works = [sys.platform.startswith("linux")]  # until a kernel without it says EINVAL


def populate_soon(buf: np.ndarray) -> threading.Thread | None:
    """Fault `buf`'s pages in now, on a thread of its own (madvise MADV_POPULATE_WRITE, the
    GIL let go meanwhile), instead of one by one as its first user writes them. For a
    buffer made just before it is first written, with Python work between (a plan's arena:
    the plan's compilation ends and the first run binds its steps as it goes): on a 2-core VM
    whose first touch of a page costs 2.5-6 us (a fresh huge page 0.3-3.6 ms), the first run's
    early steps stalled on them (a YOLOv8n's 2.7 MiB arena: its first run's oneDNN steps
    20.4-26.6 -> 18.0-20.1 ms, five alternating process pairs; with the OpenBLAS pin no change,
    19.1-21.2 against 18.5-29.8 in four). On a Zen 4 VM no effect either way (first runs of
    yolo, MobileNetV2 and densenet121, six pairs each, within the noise). The thread, or None
    where none was started (a kernel without it; a buffer that does not start a page)."""
    if not _populate_works[0] or not isinstance(buf, np.ndarray) or buf.nbytes == 0:
        return None
    addr = buf.__array_interface__["data"][0]
    if addr % mmap.PAGESIZE:
        return None
    length = -(-buf.nbytes // mmap.PAGESIZE) * mmap.PAGESIZE

    def populate(keep=buf):  # (`keep`: the mapping stays while the kernel fills it)
        import ctypes

        if _madvise()(addr, length, MADV_POPULATE_WRITE) != 0:
            stats.populated_bytes -= length
            if ctypes.get_errno() in (errno.EINVAL, errno.ENOSYS):
                _populate_works[0] = False

    stats.populated_bytes += length  # (counted as asked: explain reports it while the thread may still run)

    thread = threading.Thread(target=populate, name="glassrt-populate", daemon=True)
    thread.start()
    return thread


@functools.lru_cache(maxsize=1)
def _madvise():
    """libc's madvise through ctypes, which lets go of the GIL during the call (Python's
    mmap.madvise keeps it): other threads' runs go on while the kernel copies."""
    import ctypes

    fn = ctypes.CDLL(None, use_errno=True).madvise
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


# ---------------------------------------------------------------- moving in idle time

# A huge page's move starts once the process has run no plan for this long, so that no run
# waits on pages being copied: a move in the run that triggered it stalled that run (GPT-2's
# 18th decode step: 1.1-6.8 s on the 2-core AMD VM; resnet50's 16th run 0.22-0.44 s). A loop
# that never pauses keeps small pages: GPT-2's decode 16.7-16.8 ms a token against 16.5-18.4
# moved, unpinned, and 11.45 against 10.1-10.4 with the OpenBLAS pin.
IDLE_S = 0.05
_activity = threading.Lock()
_in_flight = [0, 0.0]  # plan runs going on now, when the last one ended (time.monotonic)
_queue: list = []  # [(mapping weakly, first byte, bytes)] of whole huge pages due to move
_queue_lock = threading.Lock()
_wake = threading.Event()
_mover: list = [None]  # the thread that moves them


def run_began() -> None:
    """A plan run starts (runtime/plan.py): no huge page starts moving until it ends."""
    with _activity:
        _in_flight[0] += 1


def run_ended() -> None:
    with _activity:
        _in_flight[0] -= 1
        _in_flight[1] = time.monotonic()


def promote_when_idle() -> int:
    """What promote moves (bytes returned), moved instead a huge page at a time by a thread
    of its own, each page only once the process has run nothing for IDLE_S: a process that
    runs plans back to back (a benchmark's loop) keeps small pages, one with pauses (a
    server between requests) moves them in its pauses. A run that starts while a page is
    being copied waits for that page alone (milliseconds), where it reads it."""
    if not advice_enabled():
        return 0
    queued = _queue_due()
    with _queue_lock:
        if _queue and (_mover[0] is None or not _mover[0].is_alive()):  # (none yet, or a forked child's)
            _mover[0] = threading.Thread(target=_move_pages, name="glassrt-huge-pages", daemon=True)
            _mover[0].start()
    _wake.set()
    return queued


def _queue_due() -> int:
    """The whole huge pages of the live buffers due to move (every one mapped since, but
    those waiting for a kernel to read them where they lie, and the slab being carved: its
    unused end would become resident) queued, a 2 MiB page an entry; bytes queued."""
    with _slab_lock:
        carving = _slab[2]
    due = lambda e: e[5] and e[0]() is not carving  # noqa: E731
    with _pending_lock:
        live = [e for e in _pending if e[0]() is not None]
        todo = [e for e in live if due(e)]
        _pending[:] = [e for e in live if not due(e)]
    with _queue_lock:
        for ref, address, _, start, n, _ in todo:
            _queue.extend((ref, address + start + k, min(HUGE_PAGE, n - k)) for k in range(0, n, HUGE_PAGE))
    return sum(e[4] for e in todo)


def _wait_for_idle() -> None:
    while True:
        with _activity:
            running, last = _in_flight
        wait = IDLE_S if running else IDLE_S - (time.monotonic() - last)
        if wait <= 0:
            return
        time.sleep(wait)


def _move_pages() -> None:
    while True:
        _wake.wait()
        while True:
            _wait_for_idle()
            with _queue_lock:
                if not _queue:
                    _wake.clear()
                    break
                page = _queue.pop(0)
            _move_page(*page)


def _move_queued() -> int:
    """Every queued page moved now, in the caller (promote); bytes advised."""
    moved = 0
    while True:
        with _queue_lock:
            if not _queue:
                return moved
            page = _queue.pop(0)
        moved += _move_page(*page)


def _move_page(ref, address: int, n: int) -> int:
    import ctypes

    region = ref()  # (held while its page moves: the mapping cannot go away meanwhile)
    if region is None or region.closed:
        return 0
    t0, madvise, moved = time.perf_counter(), _madvise(), 0
    if madvise(address, n, mmap.MADV_HUGEPAGE) == 0:
        stats.advised_bytes += n
        moved = n
        if _collapse_works[0]:
            if madvise(address, n, MADV_COLLAPSE) == 0:
                stats.collapsed_bytes += n
            elif ctypes.get_errno() == errno.EINVAL:  # not this kernel (before 6.1): khugepaged will
                _collapse_works[0] = False
    stats.promote_seconds += time.perf_counter() - t0
    return moved


def moving_bytes() -> int:
    """Bytes queued by promote_when_idle and not moved yet."""
    with _queue_lock:
        return sum(n for _, _, n in _queue)


def wait_until_moved(timeout: float = 30.0) -> bool:
    """Until promote_when_idle's queue is empty (tests, benchmarks); False on timeout."""
    deadline = time.monotonic() + timeout
    while moving_bytes() or (_wake.is_set() and _mover[0] is not None and _mover[0].is_alive()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


# ---------------------------------------------------------------- small buffers from shared slabs

SLAB = 2 * HUGE_PAGE
_slab_lock = threading.Lock()
_slab: list = [None, 0, None, 0]  # the slab being carved, the offset of its first free byte, its mapping and offset there


def carve(nbytes: int, align: int = 64) -> np.ndarray:
    """A zeroed uint8 array of nbytes (< one huge page) cut from a shared slab (which
    `promote` moves onto huge pages with the other buffers, once it is full).

    A model's packed weights and its primitives' scratchpads are many buffers of tens to
    hundreds of KiB, each allocated once for the session's life. Allocated one by one they
    are separate maps of small pages (malloc maps anything over 128 KiB), and their first
    touches fault page by page: 53 buffers of 277 KiB, written once, took 8-11 ms here
    where one 14 MiB buffer took 2-3.5 ms. Carved pieces are never handed out twice (a
    slab is only cut forward, so each piece is still zero), and a slab goes back to the
    OS when the last array cut from it dies.

    The slab being cut stays on small pages: on huge pages the first piece cut from a
    slab's half makes all 2 MiB of it resident (a transformer's few small buffers, biases
    and scratchpads, a tenth of a slab). Its unused end is released once a plan's first
    run has made its buffers (release_slab_tail)."""
    nbytes = max(int(nbytes), 1)
    if nbytes >= HUGE_PAGE or align > HUGE_PAGE:
        raise ValueError(f"carve is for buffers below {HUGE_PAGE} bytes aligned to at most that")
    with _slab_lock:
        slab, offset = _slab[:2]
        start = -(-offset // align) * align
        if slab is None or start + nbytes > slab.nbytes:
            _slab[:] = _new_slab()
            slab, start = _slab[0], 0
        _slab[1] = start + nbytes
    return slab[start:start + nbytes]


def _new_slab() -> list:
    slab, region, at = _os_mapping(SLAB, early=False)
    return [slab, 0, region, at]


def release_slab_tail() -> int:
    """Give the OS back the pages of the slab being carved that no piece uses yet (madvise
    MADV_DONTNEED; bytes released): where the kernel put it on huge pages anyway
    (transparent huge pages "always"), a half-used slab holds all of its touched halves.
    The released pages read as zeros when touched again, so later pieces are still zero.
    Called once a plan's first run has made its kernels' buffers."""
    with _slab_lock:
        slab, offset, region, at = _slab
        if slab is None or not hasattr(mmap, "MADV_DONTNEED"):
            return 0
        first = at + -(-offset // mmap.PAGESIZE) * mmap.PAGESIZE
        n = at + slab.nbytes - first
        if n <= 0:
            return 0
        try:
            region.madvise(mmap.MADV_DONTNEED, first, n)
        except (OSError, ValueError):
            return 0
        return n
