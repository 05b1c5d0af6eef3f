"""Large buffers straight from the OS, backed by transparent huge pages where Linux offers them.

Packed weights and plan arenas are the memory a run streams through: a GPT-2-sized decode
step reads ~340 MB of layer weights once per token. With 4 KiB pages that is ~85,000 TLB
entries per token, and the page walks show: on this project's 2-core AMD machine, twelve
GPT-2 layers' matrix-vector products (NumPy, 2 threads) took 15.1-15.6 ms per pass over
4 KiB pages and 11.7-13.1 ms over 2 MiB pages (benchmarks/huge_pages.py).

Most distributions set transparent huge pages to `madvise`: a process gets them only for
memory it asks for with madvise(MADV_HUGEPAGE), which malloc never does. So buffers of at
least one huge page are mapped here (anonymous mmap: zeroed, and given back to the OS as
soon as the array dies), aligned to 2 MiB, and the whole huge pages inside the buffer are
advised; the partial page at its end stays on small pages, so no buffer grows in resident
memory by more than its own size. GLASSRT_HUGE_PAGES=0 turns the advice off (the buffers
are still mapped the same way); `explain` shows what the kernel does with it.
"""
from __future__ import annotations

import mmap
import os
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


def thp_mode() -> str:
    """The kernel's transparent huge page setting: always, madvise, never or unavailable."""
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


def os_buffer(nbytes: int) -> np.ndarray:
    """A zeroed uint8 array of nbytes, mapped from the OS; from one huge page up its start
    is 2 MiB aligned and its whole huge pages are advised (see the module's doc)."""
    nbytes = max(int(nbytes), 1)
    if nbytes < HUGE_PAGE:
        return np.frombuffer(mmap.mmap(-1, nbytes), dtype=np.uint8)
    # (the slack mapped before the aligned start is never touched, so never resident)
    region = mmap.mmap(-1, nbytes + HUGE_PAGE)
    whole = np.frombuffer(region, dtype=np.uint8)
    start = (-whole.ctypes.data) % HUGE_PAGE
    advised = nbytes // HUGE_PAGE * HUGE_PAGE
    stats.buffers += 1
    stats.mapped_bytes += nbytes
    if advice_enabled():
        try:
            region.madvise(mmap.MADV_HUGEPAGE, start, advised)
            stats.advised_bytes += advised
        except OSError:  # a kernel without THP for anonymous memory: small pages, as malloc's
            pass
    return whole[start:start + nbytes]
