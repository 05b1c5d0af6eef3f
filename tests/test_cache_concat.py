"""glassrt::CacheConcat (passes/cache_concat.py, kernels/cpu/cache.py): a KV cache's Concat
appends into spare room behind a present it handed out. A decode loop gets onnxruntime's
numbers step after step; no present handed out ever changes (a past fed twice is copied,
presents are read-only); the pass leaves Concats alone where a strided past could reach a
reader that is not known to take it."""
from __future__ import annotations

import threading
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from onnx import TensorProto, helper

import glassrt
from glassrt.errors import GlassrtError
from glassrt.kernels import cache_views
from glassrt.kernels.cpu import cache

from .helpers import init, model, op_types, ort_outputs, tensor

H, D = 3, 4


def _decoder(past_readers=(), keep_output=True, three=False):
    """One step of a toy decoder: k = x·W, present = Concat(past, k) along the rows, and
    y = present's row sums weighted by x (a reader of the present inside the graph)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["k"], name="proj"),
             helper.make_node("Concat", ["past", "k"] + (["k"] if three else []), ["present"], axis=-2, name="cat"),
             helper.make_node("ReduceSum", ["present", "axes"], ["rows"], keepdims=0, name="sum"),
             helper.make_node("Mul", ["rows", "x2"], ["y"], name="scale")]
    nodes += [helper.make_node(op, ["past"] + extra, [f"{op}_out"], name=f"{op}_reader") for op, extra in past_readers]
    inputs = [tensor("x", [1, H, 1, D]), tensor("x2", [1, H, D]), tensor("past", [1, H, "t", D])]
    outputs = [tensor("y", [1, H, D])] + ([tensor("present", [1, H, "t1", D])] if keep_output else [])
    outputs += [tensor(f"{op}_out", None, TensorProto.INT64 if op == "Shape" else TensorProto.FLOAT)
                for op, _ in past_readers]
    inits = [init("w", rng.standard_normal((D, D)).astype(np.float32)), init("axes", np.array([2], np.int64))]
    return model(nodes, inputs, outputs, inits, opset=17)


def _kernel(axis):
    """The kernel's step as a plan binds it, without a memory limit."""
    return cache.cache_concat(SimpleNamespace(attrs={"axis": axis}, memory_limit=None, node=None))


def _session(m, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return glassrt.InferenceSession(m.SerializeToString(), providers=["cpu"], **kw)


def _step_feeds(rng, past):
    return {"x": rng.standard_normal((1, H, 1, D)).astype(np.float32),
            "x2": rng.standard_normal((1, H, D)).astype(np.float32), "past": past}


def test_a_decode_loop_appends_in_place_with_onnxruntimes_numbers():
    m = _decoder()
    s = _session(m)
    assert "CacheConcat" in op_types(s)
    rng = np.random.default_rng(1)
    past = np.zeros((1, H, 0, D), np.float32)
    presents, buffers = [], set()
    for _ in range(40):
        feeds = _step_feeds(rng, past)
        y, present = s.run(None, feeds)
        want = ort_outputs(m, {k: np.ascontiguousarray(v) for k, v in feeds.items()})
        np.testing.assert_allclose(y, want[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(present, want[1])
        presents.append((present, np.array(present)))
        buffers.add(id(present.base))
        past = present
    assert len(buffers) < 10  # one buffer grows by copies now and then, not a copy a step
    assert not presents[-1][0].flags.c_contiguous  # (the leading rows of a buffer with room behind)
    for present, then in presents:  # every present handed out still holds what it held
        np.testing.assert_array_equal(present, then)


def test_presents_are_read_only():
    s = _session(_decoder())
    _, present = s.run(None, _step_feeds(np.random.default_rng(2), np.ones((1, H, 2, D), np.float32)))
    assert not present.flags.writeable
    with pytest.raises(ValueError):
        present[0, 0, 0, 0] = 1.0
    copy = np.array(present)
    copy[0, 0, 0, 0] = 1.0  # a copy is the caller's to write


def test_a_past_fed_twice_is_copied_and_the_first_present_keeps_its_rows():
    m = _decoder()
    s = _session(m)
    rng = np.random.default_rng(3)
    _, past = s.run(None, _step_feeds(rng, np.ones((1, H, 3, D), np.float32)))
    a_feeds, b_feeds = _step_feeds(rng, past), _step_feeds(rng, past)
    _, a = s.run(None, a_feeds)
    a_then = np.array(a)
    _, b = s.run(None, b_feeds)  # branching off the same past: its rows behind are a's
    np.testing.assert_array_equal(a, a_then)
    np.testing.assert_array_equal(b, ort_outputs(m, {k: np.ascontiguousarray(v) for k, v in b_feeds.items()})[1])
    assert a.base is past.base and b.base is not past.base


def test_two_threads_feeding_one_past_each_get_their_own_rows():
    step = _kernel(2)
    past = step(np.zeros((1, H, 2, D), np.float32), np.ones((1, H, 1, D), np.float32))
    results, go = {}, threading.Barrier(2)

    def extend(value):
        go.wait()
        results[value] = step(past, np.full((1, H, 1, D), value, np.float32))

    threads = [threading.Thread(target=extend, args=(v,)) for v in (5.0, 7.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for value, present in results.items():
        np.testing.assert_array_equal(present[:, :, 3], value)
        np.testing.assert_array_equal(present[:, :, :3], past)
    assert sum(r.base is past.base for r in results.values()) <= 1


def test_a_past_the_caller_made_strided_is_read_as_it_is():
    m = _decoder()
    s = _session(m)
    rng = np.random.default_rng(4)
    wide = rng.standard_normal((1, H, 5, 2 * D)).astype(np.float32)
    feeds = _step_feeds(rng, wide[..., ::2])  # (not C-contiguous, not a present)
    y, present = s.run(None, feeds)
    want = ort_outputs(m, {k: np.ascontiguousarray(v) for k, v in feeds.items()})
    np.testing.assert_allclose(y, want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(present, want[1])


def test_a_new_part_of_another_shape_or_dtype_is_refused():
    step = _kernel(2)
    past = step(np.zeros((1, H, 2, D), np.float32), np.ones((1, H, 1, D), np.float32))
    with pytest.raises(ValueError, match="same dims outside axis"):
        step(past, np.ones((1, 1, 1, D), np.float32))  # (would broadcast into the heads)
    with pytest.raises(ValueError, match="one dtype"):
        step(past, np.ones((1, H, 1, D), np.float64))
    np.testing.assert_array_equal(step(past, np.full((1, H, 1, D), 2, np.float32))[:, :, 3], 2)  # still extendable


def test_a_mismatched_past_is_named_with_its_node():
    m = _decoder()
    m.graph.input[2].type.tensor_type.shape.dim[1].dim_param = "h"  # (the heads left unchecked at the input)
    s = _session(m)
    with pytest.raises(GlassrtError, match="CacheConcat node 'cat'.*differ outside axis"):
        s.run(None, _step_feeds(np.random.default_rng(5), np.ones((1, H + 1, 2, D), np.float32)))


@pytest.mark.parametrize("readers, keep_output, three, why", [
    ((("Relu", []),), True, False, "the past has a reader that is not a shape reader"),
    ((), False, False, "the present is not a graph output"),
    ((), True, True, "three inputs"),
])
def test_the_pass_leaves_a_concat_alone(readers, keep_output, three, why):
    s = _session(_decoder(past_readers=readers, keep_output=keep_output, three=three))
    assert "CacheConcat" not in op_types(s), why
    assert "Concat" in op_types(s)


def test_shape_readers_of_the_past_keep_the_rewrite_and_see_the_strided_past():
    m = _decoder(past_readers=(("Shape", []),))
    s = _session(m)
    assert "CacheConcat" in op_types(s)
    rng = np.random.default_rng(6)
    past = np.zeros((1, H, 1, D), np.float32)
    for t in range(1, 5):
        _, present, shape = s.run(None, _step_feeds(rng, past))
        assert list(shape) == [1, H, t, D]
        past = present


def test_fused_attention_reads_the_presents_buffer_in_place():
    step = _kernel(-2)
    rng = np.random.default_rng(7)
    k = step(rng.standard_normal((1, H, 5, D)).astype(np.float32), rng.standard_normal((1, H, 1, D)).astype(np.float32))
    assert cache_views.buffer_behind(k) is k.base and k.base.shape[2] > 6
    from glassrt.kernels.cpu.attention import _rows_buffer, scaled_dot_product_attention
    assert _rows_buffer(k) is k.base
    q = rng.standard_normal((1, H, 1, D)).astype(np.float32)
    y = scaled_dot_product_attention(q, k, k, scale=0.5)
    want = scaled_dot_product_attention(q, np.ascontiguousarray(k), np.ascontiguousarray(k), scale=0.5)
    np.testing.assert_allclose(y, want, rtol=1e-6)
    step(k, rng.standard_normal((1, H, 1, D)).astype(np.float32))  # extended: its rows behind are claimed
    assert cache_views.buffer_behind(k) is None


def test_bodies_are_left_alone():
    body = helper.make_graph(
        [helper.make_node("Concat", ["acc_in", "row"], ["acc_out"], axis=0, name="grow"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], name="cond")],
        "body",
        [tensor("i", [], TensorProto.INT64), tensor("cond_in", [], TensorProto.BOOL), tensor("acc_in", ["n", 2])],
        [tensor("cond_out", [], TensorProto.BOOL), tensor("acc_out", ["m", 2])],
        [init("row", np.ones((1, 2), np.float32))])
    m = model([helper.make_node("Loop", ["trips", "", "acc0"], ["acc"], body=body, name="loop")],
              [tensor("trips", [], TensorProto.INT64), tensor("acc0", ["n", 2])], [tensor("acc", ["m", 2])], opset=17)
    s = _session(m)
    assert not any(n.op_type == "CacheConcat" for n in s.placement.graph.walk())
    (acc,) = s.run(None, {"trips": np.array(3, np.int64), "acc0": np.zeros((1, 2), np.float32)})
    np.testing.assert_array_equal(acc, np.concatenate([np.zeros((1, 2)), np.ones((3, 2))]).astype(np.float32))


def test_the_nan_check_of_feeds_reads_a_present_in_place_and_only_its_rows():
    from glassrt.runtime.nan_handling import all_finite
    step = _kernel(2)
    present = step(np.zeros((1, H, 4, D), np.float32), np.ones((1, H, 1, D), np.float32))
    assert all_finite({"past": present})
    present.base[:, :, 5:] = np.nan  # (the room behind its rows: no value of it)
    assert all_finite({"past": present})
    extended = step(present, np.full((1, H, 1, D), np.inf, np.float32))
    assert not all_finite({"past": extended})


def test_a_cache_past_the_memory_limit_is_refused_naming_the_node_and_gets_no_room_past_it():
    limit = 4 * H * D * 20  # 20 rows
    s = _session(_decoder(), sess_options=glassrt.SessionOptions(memory_limit_bytes=limit))
    rng = np.random.default_rng(8)
    _, present = s.run(None, _step_feeds(rng, np.zeros((1, H, 15, D), np.float32)))
    assert present.base.shape[2] == 20  # (16 rows, room for 4 more: the limit, not 16 + 16)
    with pytest.raises(glassrt.MemoryLimitError, match="CacheConcat node 'cat'.*memory limit of 960 bytes"):
        s.run(None, _step_feeds(rng, np.zeros((1, H, 20, D), np.float32)))
