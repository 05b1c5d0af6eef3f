"""Large buffers straight from the OS, private, and on transparent huge pages where Linux offers them.

Packed weights and plan arenas are the memory a run streams through: a GPT-2-sized decode
step reads ~340 MB of layer weights once per token, ~85,000 pages of 4 KiB. Most
distributions set transparent huge pages to `madvise`: a process gets 2 MiB pages only for
memory it asks for with madvise(MADV_HUGEPAGE). NumPy asks for its own allocations of 4 MiB
and more; glassrt's arenas were anonymous maps (so that an evicted plan's arena goes back to
the OS at once) that asked for nothing, and were MAP_SHARED (Python's mmap default): a
forked child running the session wrote into its parent's arena.

So buffers of at least one huge page are mapped here private, aligned to 2 MiB, and the
whole huge pages inside them are advised; the partial page at the end stays on small
pages, so no buffer grows in resident memory beyond its own size. Measured on the 2-core
AVX-512 machine (benchmarks/huge_pages.py: twelve GPT-2 layers' one-row products, NumPy's
BLAS, alternating passes in one process), ms per pass over 4 KiB / huge pages: 17.8 / 16.0,
15.5 / 15.1, 17.2 / 16.3. GLASSRT_HUGE_PAGES=0 turns the advice off (the buffers are still
mapped the same way); `explain` shows the kernel's setting and what was advised.
"""
from __future__ import annotations

import functools
import mmap
import os
import threading
from dataclasses import dataclass

import numpy as np

HUGE_PAGE = 2 << 20
_THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


@dataclass
class PageStats:
    """Bytes mapped by this module in this process, and how many of them were advised."""

    buffers: int = 0
    mapped_bytes: int = 0
    advised_bytes: int = 0


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


def advice_enabled() -> bool:
    return os.environ.get("GLASSRT_HUGE_PAGES", "1") != "0" and hasattr(mmap, "MADV_HUGEPAGE") \
        and thp_mode() in ("always", "madvise")


def _private_map(nbytes: int) -> mmap.mmap:
    """Anonymous private memory. Python's mmap maps MAP_SHARED unless told otherwise, and
    shared anonymous memory is shmem: a forked child would write into its parent's buffers,
    and Linux gives shmem huge pages only where shmem_enabled says so (usually never)."""
    return mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def os_buffer(nbytes: int, whole_pages: bool = False) -> np.ndarray:
    """A zeroed uint8 array of nbytes, mapped from the OS; from one huge page up its start
    is 2 MiB aligned and its whole huge pages are advised (see the module's doc). With
    `whole_pages` the partial page at its end is advised too: a buffer that is all written
    at once (a plan's arena) then faults in one huge page there instead of up to 511 small
    ones, for at most one huge page more of resident memory."""
    return _os_mapping(nbytes, whole_pages)[0]


def _os_mapping(nbytes: int, whole_pages: bool = False) -> tuple[np.ndarray, mmap.mmap, int]:
    """os_buffer's array, the mapping it lies in and its offset there."""
    nbytes = max(int(nbytes), 1)
    if nbytes < HUGE_PAGE:
        region = _private_map(nbytes)
        return np.frombuffer(region, dtype=np.uint8), region, 0
    # (the slack mapped around the aligned pages is never touched, so never resident)
    region = _private_map(nbytes + 2 * HUGE_PAGE)
    whole = np.frombuffer(region, dtype=np.uint8)
    start = (-whole.ctypes.data) % HUGE_PAGE
    advised = (-(-nbytes // HUGE_PAGE) if whole_pages else nbytes // HUGE_PAGE) * HUGE_PAGE
    stats.buffers += 1
    stats.mapped_bytes += nbytes
    if advice_enabled():
        try:
            region.madvise(mmap.MADV_HUGEPAGE, start, advised)
            stats.advised_bytes += advised
        except OSError:  # a kernel without THP for anonymous memory: small pages, as malloc's
            pass
    return whole[start:start + nbytes], region, start


# ---------------------------------------------------------------- small buffers from shared slabs

SLAB = 2 * HUGE_PAGE
_slab_lock = threading.Lock()
_slab: list = [None, 0, None, 0]  # the slab being carved, the offset of its first free byte, its mapping and offset there


def carve(nbytes: int, align: int = 64) -> np.ndarray:
    """A zeroed uint8 array of nbytes (< one huge page) cut from a shared slab on huge pages.

    A model's packed weights and its primitives' scratchpads are many buffers of tens to
    hundreds of KiB, each allocated once for the session's life. Allocated one by one they
    are separate maps of small pages (malloc maps anything over 128 KiB), and their first
    touches fault page by page: 53 buffers of 277 KiB, written once, took 8-11 ms here
    where one 14 MiB buffer took 2-3.5 ms. Carved pieces are never handed out twice (a
    slab is only cut forward, so each piece is still zero), and a slab goes back to the
    OS when the last array cut from it dies.

    On huge pages the first piece cut from a slab's half makes all 2 MiB of it resident: a
    transformer's few small buffers (biases, scratchpads: a tenth of a slab) hold up to
    1.9 MiB more than they use (GPT-2 decoding: +0.3 MiB peak measured), while a CNN's many
    small weights fill the slab and fault it in two faults instead of ~500 (squeezenet's
    first run 1,556 -> 601 page faults with the arena's whole pages, shufflenet's 1,135 ->
    379; its time moved within the noise on the development VM, whose fresh memory costs
    per byte touched in slow spells and per fault in quick ones). The unused end of the slab being
    cut is released once a plan's first run has made its buffers (release_slab_tail)."""
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
    slab, region, at = _os_mapping(SLAB)
    return [slab, 0, region, at]


def release_slab_tail() -> int:
    """Give the OS back the pages of the slab being carved that no piece uses yet (madvise
    MADV_DONTNEED; bytes released): on huge pages a half-used slab holds all of its touched
    halves. The released pages read as zeros when touched again, so later pieces are still
    zero. Called once a plan's first run has made its kernels' buffers."""
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
