"""oneDNN primitives made before a plan's first run (kernels/onednn/ahead.py): the
descriptors placement made are queued, made on two threads as the first run begins, each
with the OpenMP count it was made for, and handed to the kernels that bind them; the
results are those of primitives made where they are needed."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import helper

import glassrt
from glassrt.kernels.onednn import ahead, capi, dnnl

from .helpers import init, model, passes_in_a_forked_child, tensor

pytestmark = pytest.mark.skipif(capi.UNAVAILABLE is not None, reason=f"oneDNN: {capi.UNAVAILABLE}")


def _conv_net(channels=(3, 16, 24, 32), size=20, seed=0):
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    for i, (c, m) in enumerate(zip(channels, channels[1:])):
        w = init(f"w{i}", rng.standard_normal((m, c, 3, 3)).astype(np.float32) * 0.2)
        b = init(f"b{i}", rng.standard_normal(m).astype(np.float32))
        inits += [w, b]
        nodes += [helper.make_node("Conv", [x, w.name, b.name], [f"c{i}"], pads=[1, 1, 1, 1], name=f"conv{i}"),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}")]
        x = f"r{i}"
    return model(nodes, [tensor("x", [1, channels[0], size, size])], [tensor(x, None)], inits, opset=17)


def _session(m):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return glassrt.InferenceSession(m, providers=["onednn", "cpu"])


def test_placed_convs_primitives_are_made_before_the_first_run_and_agree(monkeypatch):
    made = []
    real = ahead.Job.make
    monkeypatch.setattr(ahead.Job, "make", lambda job: (made.append(job.pd.kind), real(job))[1])
    m = _conv_net(seed=1)  # (shapes of its own: descriptors not shared with other tests')
    x = np.random.default_rng(3).random((1, 3, 20, 20), dtype=np.float32)
    sess = _session(m)
    assert made == []  # queued at placement, made only as a run begins
    first = sess.run(None, {"x": x})[0]
    assert made.count("convolution") == 3
    monkeypatch.setenv("GLASSRT_PRIMITIVES_AHEAD", "0")
    dnnl_free = _session(_conv_net(seed=1))
    expected = glassrt.InferenceSession(m, providers=["cpu"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(first, expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(first, dnnl_free.run(None, {"x": x})[0])
    np.testing.assert_array_equal(first, sess.run(None, {"x": x})[0])


def _a_conv_pd(out_channels=8):
    return dnnl.conv((1, 4, 9, 9), (out_channels, 4, 3, 3), pads=[1, 1, 1, 1], src_format="acdb", bias=False)


def test_a_job_still_queued_is_taken_back_by_its_claimer():
    pd = _a_conv_pd(5)
    pd.make_ahead()
    job = pd._ahead
    assert job is not None and job.state == ahead.QUEUED
    prim = pd.primitive()  # made here, not waiting for any make_queued
    assert job.state == ahead.TAKEN and job.pd is None and prim.handle.value
    ahead.make_queued()  # the taken job is skipped, not made twice
    assert job.handle is None


def test_a_first_run_makes_the_primitives_of_its_own_thread_count():
    """Descriptors made while this thread ran one OpenMP thread are made (on whichever
    thread) for one when a one-thread run begins; those made for two stay queued for a run
    of two, and the caller's count is left as it was."""
    before = capi.get_max_threads()
    seen = []
    real = ahead.Job.make

    def make(job):
        real(job)
        seen.append((job, job.threads, capi.query_max_threads()))

    try:
        capi.set_num_threads(2)
        two = _a_conv_pd(11)
        two.make_ahead()
        capi.set_num_threads(1)
        one = _a_conv_pd(6)
        one.make_ahead()
        ahead.Job.make = make
        ahead.make_queued()
        assert capi.get_max_threads() == 1
    finally:
        ahead.Job.make = real
        capi.set_num_threads(before)
    # (only this test's jobs: an earlier test in this process may have left one-thread jobs queued)
    assert [(t, n) for job, t, n in seen if job in (one._ahead, two._ahead)] == [(1, 1)]
    assert one._ahead.state == ahead.DONE and two._ahead.state == ahead.QUEUED
    x = np.random.default_rng(0).random((1, 9, 9, 4), dtype=np.float32)
    prim = one.primitive()  # the one made ahead, handed over
    assert one._ahead is None and prim.handle.value
    step = prim.bind({dnnl.ARG_SRC: None, dnnl.ARG_WEIGHTS: dnnl.Memory(one.weights_md(), allocate=True),
                      dnnl.ARG_DST: None})
    y = np.full((1, 9, 9, 6), np.nan, np.float32)
    try:
        capi.set_num_threads(1)  # (run as it was made for)
        step.run({dnnl.ARG_SRC: x, dnnl.ARG_DST: y})
    finally:
        capi.set_num_threads(before)
    np.testing.assert_array_equal(y, 0)  # (zero weights)
    assert two.primitive().handle.value  # (taken back from the queue, made here)


def test_a_primitive_is_made_for_its_descriptors_count_on_any_thread():
    """The worker thread's own OpenMP count is whatever it started with: a job sets the
    count its descriptor was made for before making it (oneDNN keys the kernel by it)."""
    import threading

    before = capi.get_max_threads()
    try:
        capi.set_num_threads(5)  # (no machine's default here: a thread starts with its cores)
        pd = _a_conv_pd(12)
        pd.make_ahead()
    finally:
        capi.set_num_threads(before)
    job, seen = pd._ahead, []
    t = threading.Thread(target=lambda: (job.make(), seen.append(capi.query_max_threads())))
    t.start()
    t.join()
    assert job.threads == 5 and seen == [5] and job.handle is not None and job.handle.value


def test_another_implementation_drops_the_primitive_made_for_the_first():
    pd = _a_conv_pd(7)
    pd.make_ahead()
    ahead.make_queued()
    assert pd._ahead.state == ahead.DONE
    pd.next_impl()  # (whether or not there is one, the primitive made before is gone)
    assert pd._ahead is None and pd._prim is None


def test_a_descriptors_layouts_are_asked_once_and_again_after_another_implementation():
    pd = _a_conv_pd(11)
    w = pd.weights_md()
    assert pd.weights_md() is w and pd.src_md() is pd.src_md()  # (one clone per query, kept)
    if pd.next_impl():  # another implementation: its own layouts, asked of it
        assert pd.weights_md() is not w


def test_turned_off_queues_nothing(monkeypatch):
    monkeypatch.setenv("GLASSRT_PRIMITIVES_AHEAD", "0")
    pd = _a_conv_pd(9)
    pd.make_ahead()
    assert pd._ahead is None and pd.primitive().handle.value


def test_a_forked_child_makes_what_was_queued_itself():
    pd = _a_conv_pd(10)
    pd.make_ahead()

    def child():
        prim = pd.primitive()
        return prim.handle.value is not None and pd._ahead is None

    passes_in_a_forked_child(child)
    ahead.make_queued()
    assert pd.primitive().handle.value
