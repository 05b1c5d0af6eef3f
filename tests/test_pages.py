"""Large buffers from the OS on transparent huge pages: from their first touch (policy
"early", the default; a plan's arena under any policy), or moved once a plan keeps running
(policy "late") (glassrt/pages.py)."""
from __future__ import annotations

import os
import time

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


def _promote_or_skip():
    if not pages.advice_enabled():
        pytest.skip(f"transparent huge pages: {pages.thp_mode()}")
    return pages.promote()


def test_buffers_start_on_small_pages_and_promote_moves_their_whole_huge_pages(monkeypatch):
    """Policy "late": written before promote, a buffer is on small pages (unless the kernel puts every
    mapping on huge pages); promote advises its whole huge pages, never the partial tail,
    and collapses them where the kernel can; the contents stay."""
    monkeypatch.setenv("GLASSRT_HUGE_PAGES", "late")
    _promote_or_skip()  # what earlier tests left pending
    buf = pages.os_buffer(3 * pages.HUGE_PAGE + 100)
    buf[...] = 1
    if pages.thp_mode() == "madvise":
        assert smaps_kib(buf.ctypes.data, "AnonHugePages:") in (None, 0)
    assert pages.pending_bytes() >= 3 * pages.HUGE_PAGE
    before, collapsed = pages.stats.advised_bytes, pages.stats.collapsed_bytes
    assert _promote_or_skip() == 3 * pages.HUGE_PAGE
    assert pages.stats.advised_bytes - before == 3 * pages.HUGE_PAGE
    assert pages.pending_bytes() <= pages.SLAB  # (the slab being carved waits)
    assert int(buf.sum()) == buf.nbytes  # unchanged by the collapse
    huge = smaps_kib(buf.ctypes.data, "AnonHugePages:")
    # the kernel may decline (no free huge page, no MADV_COLLAPSE); never more than the whole pages
    assert huge is None or huge <= 3 * pages.HUGE_PAGE // 1024
    if pages.stats.collapsed_bytes - collapsed == 3 * pages.HUGE_PAGE and huge is not None:
        assert huge == 3 * pages.HUGE_PAGE // 1024
    assert pages.promote() == 0  # each buffer once


def test_a_weight_buffer_waits_until_a_kernel_reads_it_where_it_lies(monkeypatch):
    """A weight read from the model file (promoted=False) is left by promote until a kernel
    that reads it where it lies says so (with a view of it, here transposed)."""
    monkeypatch.setenv("GLASSRT_HUGE_PAGES", "late")
    _promote_or_skip()
    w = pages.os_buffer(2 * pages.HUGE_PAGE, promoted=False).view(np.float32).reshape(1024, 1024)
    w[...] = 2
    assert pages.pending_bytes() <= pages.SLAB and _promote_or_skip() == 0  # promote leaves it
    assert pages.promote_with_the_rest(w.T) and not pages.promote_with_the_rest(np.zeros(3))
    before = pages.stats.advised_bytes
    assert _promote_or_skip() == 2 * pages.HUGE_PAGE and pages.stats.advised_bytes - before == 2 * pages.HUGE_PAGE
    assert float(w.sum()) == 2.0 * w.size and not pages.promote_with_the_rest(w)  # moved: no longer waiting


@pytest.mark.parametrize("nbytes", [3 * pages.HUGE_PAGE + 100, 4 * pages.HUGE_PAGE])
def test_an_arena_is_promoted_with_its_tail_page(nbytes, monkeypatch):
    """whole_pages (a plan's arena, written whole at each run): the partial page at the end
    is promoted as well, the buffer still exactly its size and zeroed; the rounded-up page
    lies inside the mapping."""
    monkeypatch.setenv("GLASSRT_HUGE_PAGES", "late")
    _promote_or_skip()
    buf = pages.os_buffer(nbytes, whole_pages=True)
    assert buf.nbytes == nbytes and not buf.any() and buf.ctypes.data % pages.HUGE_PAGE == 0
    buf[...] = 3
    assert _promote_or_skip() == -(-nbytes // pages.HUGE_PAGE) * pages.HUGE_PAGE
    assert int(buf[-1]) == 3 and int(buf[0]) == 3
    huge = smaps_kib(buf.ctypes.data, "AnonHugePages:")
    assert huge is None or huge <= 4 * pages.HUGE_PAGE // 1024


def test_early_advises_whole_huge_pages_before_the_first_touch(monkeypatch):
    """Policy "early" (the default): a buffer's whole huge pages (an arena's tail page too),
    a weight's read from the file as well, are advised as it is mapped, nothing is left for
    promote; the slab small buffers are carved from is not (it waits until it is full)."""
    monkeypatch.delenv("GLASSRT_HUGE_PAGES", raising=False)
    if not pages.advice_enabled():
        pytest.skip(f"transparent huge pages: {pages.thp_mode()}")
    assert pages.policy() == "early"
    pages.promote()
    before = pages.stats.huge_from_start_bytes
    buf = pages.os_buffer(3 * pages.HUGE_PAGE + 100)
    arena = pages.os_buffer(pages.HUGE_PAGE + 100, whole_pages=True)
    weight = pages.os_buffer(2 * pages.HUGE_PAGE, promoted=False)
    assert pages.stats.huge_from_start_bytes - before == (3 + 2 + 2) * pages.HUGE_PAGE
    assert not buf.any() and not arena.any() and not weight.any()
    buf[...], arena[...], weight[...] = 1, 2, 3
    assert int(buf.sum()) == buf.nbytes and int(arena[-1]) == 2 and int(weight[-1]) == 3
    assert pages.pending_bytes() <= pages.SLAB and pages.promote() == 0  # (the slab being carved waits)
    assert not pages.promote_with_the_rest(weight)  # (on huge pages already: nothing waits)
    huge = smaps_kib(buf.ctypes.data, "AnonHugePages:")
    assert huge is None or huge <= 3 * pages.HUGE_PAGE // 1024  # never the partial tail


@pytest.mark.parametrize("value, policy", [("early", "early"), ("late", "late"), ("0", "off"), ("off", "off"),
                                           ("1", "early"), (" LATE ", "late")])
def test_the_policy_is_read_from_the_environment(monkeypatch, value, policy):
    monkeypatch.setenv("GLASSRT_HUGE_PAGES", value)
    assert pages.policy() == policy


def test_the_advice_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("GLASSRT_HUGE_PAGES", "0")
    before = pages.stats.advised_bytes
    buf = pages.os_buffer(2 * pages.HUGE_PAGE)
    assert not pages.advice_enabled() and pages.promote() == 0 and pages.stats.advised_bytes == before
    assert buf.ctypes.data % pages.HUGE_PAGE == 0 and not buf.any()


def test_a_dead_buffer_is_not_promoted(monkeypatch):
    monkeypatch.setenv("GLASSRT_HUGE_PAGES", "late")
    _promote_or_skip()
    buf = pages.os_buffer(2 * pages.HUGE_PAGE)
    del buf
    assert pages.pending_bytes() <= pages.SLAB and _promote_or_skip() == 0  # (the slab being carved waits)


def test_a_plans_arena_is_on_huge_pages_from_its_first_touch(monkeypatch):
    """runtime/memory.py's allocate_arena advises an arena of a huge page or more before
    anything touches it (every run writes all of it); promote then leaves it, and the
    results are those of small pages."""
    import glassrt
    from glassrt.runtime.plan import STRAIGHT_AFTER
    from onnx import TensorProto, helper

    monkeypatch.setenv("GLASSRT_HUGE_PAGES", "late")
    _promote_or_skip()
    n = 1 << 20  # 4 MiB float32 values: the arena is mapped from the OS
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["n"]),
                           helper.make_node("Abs", ["n"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])])
    sess = glassrt.InferenceSession(helper.make_model(g).SerializeToString(), providers=["cpu"])
    x = np.linspace(-1, 1, n, dtype=np.float32)
    before = pages.stats.huge_from_start_bytes
    first = sess.run(None, {"x": x})[0]
    assert pages.stats.huge_from_start_bytes >= before + pages.HUGE_PAGE  # (the plan, and its arena, made now)
    np.testing.assert_array_equal(first, np.abs(-np.maximum(x, 0)))
    advised = pages.stats.advised_bytes
    for _ in range(STRAIGHT_AFTER + 1):
        out = sess.run(None, {"x": x})[0]
    assert pages.wait_until_moved()
    np.testing.assert_array_equal(out, first)
    assert pages.stats.advised_bytes == advised  # nothing left for promote: the arena was advised at once
    monkeypatch.setenv("GLASSRT_HUGE_PAGES", "0")  # and not where huge pages are turned off
    before = pages.stats.huge_from_start_bytes
    glassrt.InferenceSession(helper.make_model(g).SerializeToString(), providers=["cpu"]).run(None, {"x": x})
    assert pages.stats.huge_from_start_bytes == before


def test_huge_pages_move_only_while_no_run_goes_on(monkeypatch):
    """promote_when_idle queues the buffers' whole huge pages; its thread moves them once no
    plan run has gone on for IDLE_S: a run in flight (or runs back to back) holds them."""
    monkeypatch.setenv("GLASSRT_HUGE_PAGES", "late")
    _promote_or_skip()
    buf = pages.os_buffer(2 * pages.HUGE_PAGE)
    buf[...] = 5
    before = pages.stats.advised_bytes
    pages.run_began()
    try:
        assert pages.promote_when_idle() == 2 * pages.HUGE_PAGE
        time.sleep(4 * pages.IDLE_S)
        assert pages.moving_bytes() == 2 * pages.HUGE_PAGE and pages.stats.advised_bytes == before
    finally:
        pages.run_ended()
    assert pages.wait_until_moved() and pages.moving_bytes() == 0
    assert pages.stats.advised_bytes - before == 2 * pages.HUGE_PAGE and int(buf.sum()) == 5 * buf.nbytes
    assert pages.promote_when_idle() == 0  # each buffer once


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


def test_a_plans_arena_is_faulted_in_on_another_thread_before_its_first_run_writes_it(monkeypatch):
    """allocate_arena has the arena's pages faulted in by a thread of its own (populate_soon),
    so that the first run's steps do not stall on them; its contents stay zeros, and the
    run's results are the same."""
    from glassrt.runtime import memory

    started = []
    real = memory.populate_soon
    monkeypatch.setattr(memory, "populate_soon", lambda buf: started.append(real(buf)) or started[-1])
    before = pages.stats.populated_bytes
    arena = memory.allocate_arena(3 * pages.HUGE_PAGE + 12345)
    if started[0] is None:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE")
    started[0].join()
    assert pages.stats.populated_bytes - before >= arena.nbytes
    rss = smaps_kib(arena.__array_interface__["data"][0], "Rss:")
    if rss is not None:
        assert rss * 1024 >= arena.nbytes  # resident before anything wrote it
    assert not arena.any()
    small = memory.allocate_arena(1 << 19)  # (below 1 MiB: malloc's, not populated)
    assert len(started) == 1 and small.nbytes == 1 << 19


def test_populate_soon_refuses_what_does_not_start_a_page():
    buf = pages.os_buffer(1 << 16)
    assert pages.populate_soon(buf[1:]) is None
    t = pages.populate_soon(buf)
    assert t is None or (t.join() or True)
    assert not buf.any()
