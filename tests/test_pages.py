"""Large buffers from the OS on transparent huge pages (glassrt/pages.py)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from glassrt import pages

from .helpers import smaps_kib


@pytest.mark.parametrize("nbytes", [1, 4096, pages.HUGE_PAGE - 1, pages.HUGE_PAGE, 5 * pages.HUGE_PAGE + 12345])
def test_buffers_are_zeroed_aligned_and_exactly_sized(nbytes):
    buf = pages.os_buffer(nbytes)
    assert buf.dtype == np.uint8 and buf.nbytes == nbytes and not buf.any()
    assert buf.ctypes.data % 64 == 0
    if nbytes >= pages.HUGE_PAGE:
        assert buf.ctypes.data % pages.HUGE_PAGE == 0
    buf[...] = 7  # writable to its last byte
    assert int(buf[-1]) == 7


def test_whole_huge_pages_are_advised_and_the_tail_is_not(monkeypatch):
    monkeypatch.setenv("GLASSRT_HUGE_PAGES", "1")
    before = pages.stats.advised_bytes
    buf = pages.os_buffer(3 * pages.HUGE_PAGE + 100)
    if not pages.advice_enabled():
        assert pages.stats.advised_bytes == before
        pytest.skip(f"transparent huge pages: {pages.thp_mode()}")
    assert pages.stats.advised_bytes - before == 3 * pages.HUGE_PAGE
    buf[...] = 1
    huge = smaps_kib(buf.ctypes.data, "AnonHugePages:")
    # the kernel may decline (no free huge page); it must never back more than the whole pages
    assert huge is None or huge <= 3 * pages.HUGE_PAGE // 1024


@pytest.mark.parametrize("nbytes", [3 * pages.HUGE_PAGE + 100, 4 * pages.HUGE_PAGE])
def test_an_arena_asks_for_its_tail_page_too(nbytes, monkeypatch):
    """whole_pages (a plan's arena, written at once): the partial page at the end is advised
    as well, the buffer still exactly its size and zeroed; the rounded-up page lies inside
    the mapping (writing the buffer's last byte faults it in without touching anything else)."""
    monkeypatch.setenv("GLASSRT_HUGE_PAGES", "1")
    before = pages.stats.advised_bytes
    buf = pages.os_buffer(nbytes, whole_pages=True)
    assert buf.nbytes == nbytes and not buf.any() and buf.ctypes.data % pages.HUGE_PAGE == 0
    if not pages.advice_enabled():
        pytest.skip(f"transparent huge pages: {pages.thp_mode()}")
    assert pages.stats.advised_bytes - before == -(-nbytes // pages.HUGE_PAGE) * pages.HUGE_PAGE
    buf[...] = 3
    huge = smaps_kib(buf.ctypes.data, "AnonHugePages:")
    assert huge is None or huge <= 4 * pages.HUGE_PAGE // 1024


def test_the_advice_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("GLASSRT_HUGE_PAGES", "0")
    before = pages.stats.advised_bytes
    buf = pages.os_buffer(2 * pages.HUGE_PAGE)
    assert not pages.advice_enabled() and pages.stats.advised_bytes == before
    assert buf.ctypes.data % pages.HUGE_PAGE == 0 and not buf.any()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
@pytest.mark.parametrize("nbytes", [1 << 20, 3 * pages.HUGE_PAGE])
def test_a_forked_child_writes_its_own_copy_of_an_arena(nbytes):
    """A server that creates a session and then forks workers (gunicorn's preload, a
    multiprocessing pool) must not have the workers' runs write into each other's arenas:
    the maps are private (copy on write), not MAP_SHARED as Python's mmap defaults to."""
    from glassrt.runtime.memory import allocate_arena

    arena = allocate_arena(nbytes)
    arena[...] = 1
    pid = os.fork()
    if pid == 0:  # the child: write all of it, then leave without running pytest's exit
        arena[...] = 2
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert (arena == 1).all()


def test_carved_buffers_are_zeroed_aligned_and_never_overlap():
    pieces = [pages.carve(n, align) for n, align in [(1, 64), (100, 64), (300_000, 4096), (70, 128)] * 20]
    spans = sorted((p.ctypes.data, p.ctypes.data + p.nbytes) for p in pieces)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
    for p, (_, align) in zip(pieces, [(1, 64), (100, 64), (300_000, 4096), (70, 128)] * 20):
        assert not p.any() and p.ctypes.data % align == 0
    with pytest.raises(ValueError):
        pages.carve(pages.HUGE_PAGE)


def test_the_unused_end_of_a_slab_is_given_back_and_later_pieces_are_still_zero():
    piece = pages.carve(100_000)
    piece[...] = 1
    released = pages.release_slab_tail()
    assert released > 0 and released % 4096 == 0
    assert int(piece.sum()) == 100_000  # what was handed out is untouched
    later = [pages.carve(300_000) for _ in range(3)]  # from the released part, and then a new slab
    assert not any(p.any() for p in later)


def test_the_gc_is_paused_only_while_a_session_is_made_and_back_on_after_a_failure():
    import gc

    import glassrt
    from glassrt.runtime.gc_pause import gc_paused

    from .helpers import add_model

    seen = []
    with gc_paused():
        seen.append(gc.isenabled())
        with gc_paused():  # nested: the inner exit must not switch it back on
            pass
        seen.append(gc.isenabled())
    assert seen == [False, False] and gc.isenabled()
    glassrt.InferenceSession(add_model().SerializeToString(), providers=["cpu"])
    assert gc.isenabled()
    with pytest.raises(glassrt.GlassrtError):
        glassrt.InferenceSession(b"not a model", providers=["cpu"])
    assert gc.isenabled()
