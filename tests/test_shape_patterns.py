"""Plans shared across shapes: after `generalize_after` distinct input shapes of one
structure, a new shape runs on one plan compiled with the varying dims symbolic (a KV
cache that grows per decode step would otherwise compile a plan per step)."""
from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import glassrt
from glassrt.runtime.runner import ShapePattern

ort = pytest.importorskip("onnxruntime")
D = 8


def _decoder_step(same_dim_name=True):
    """One attention step over a KV cache: q (b, 1, D), past (b, past, D) -> (out, new cache)."""
    rng = np.random.default_rng(0)
    wq = numpy_helper.from_array(rng.standard_normal((D, D)).astype(np.float32), "wq")
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"]),
        helper.make_node("Concat", ["past_k", "x"], ["k"], axis=1),
        helper.make_node("Concat", ["past_v", "x"], ["v"], axis=1),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Softmax", ["s"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    vdim = "past" if same_dim_name else "past_v_len"
    g = helper.make_graph(nodes, "g", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 1, D]),
        helper.make_tensor_value_info("past_k", TensorProto.FLOAT, ["b", "past", D]),
        helper.make_tensor_value_info("past_v", TensorProto.FLOAT, ["b", vdim, D])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "k", "v")], initializer=[wq])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def _feeds(past, past_v=None, batch=1, seed=0):
    rng = np.random.default_rng(seed + past)
    return {"x": rng.standard_normal((batch, 1, D)).astype(np.float32),
            "past_k": rng.standard_normal((batch, past, D)).astype(np.float32),
            "past_v": rng.standard_normal((batch, past if past_v is None else past_v, D)).astype(np.float32)}


def _patterns(sess):
    return [k for k in sess.runner.plans if isinstance(k, ShapePattern)]


def test_growing_cache_shares_one_plan_and_matches_onnxruntime():
    model = _decoder_step()
    sess = glassrt.InferenceSession(model, providers=["cpu"])
    oracle = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for past in range(1, 30):
        feeds = _feeds(past)
        for got, want in zip(sess.run(None, feeds), oracle.run(None, feeds)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    stats = sess.memory_stats()
    # an exact plan for each of the first 3 shapes, then one plan for every new past
    assert stats["plans_built"] == sess.options.generalize_after + 1, stats
    (pattern,) = _patterns(sess)
    assert "past" in repr(pattern) and "x[" in repr(pattern)


def test_the_pattern_comes_from_the_latest_shapes_not_an_earlier_prompt():
    """A batch of 4 first (a prompt), then one-row steps with a growing cache: the plan
    shared by the steps keeps the batch fixed at 1 (it varied only before them), so only
    the cache's nodes bind per shape."""
    sess = glassrt.InferenceSession(_decoder_step(), providers=["cpu"])
    sess.run(None, _feeds(3, batch=4))
    for past in range(4, 12):
        sess.run(None, _feeds(past))
    (pattern,) = _patterns(sess)
    assert pattern.matches(sess.runner.signature(_feeds(20), None))
    assert not pattern.matches(sess.runner.signature(_feeds(20, batch=2), None))


def test_generalize_after_zero_compiles_per_shape():
    sess = glassrt.InferenceSession(_decoder_step(), providers=["cpu"],
                                    sess_options=glassrt.SessionOptions(generalize_after=0, plan_cache_size=64))
    for past in range(1, 10):
        sess.run(None, _feeds(past))
    assert sess.memory_stats()["plans_built"] == 9 and not _patterns(sess)


def _decoder_with_projections():
    """_decoder_step with a layer's worth of projections after it, as a decoder has: most
    of its steps have the same shapes at every cache length."""
    m = onnx.load_from_string(_decoder_step())
    rng = np.random.default_rng(3)
    g = m.graph
    prev = "y"
    for i in range(8):
        w = numpy_helper.from_array(rng.standard_normal((D, D)).astype(np.float32) / 3, f"w{i}")
        g.initializer.append(w)
        g.node.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"]))
        g.node.append(helper.make_node("Tanh", [f"h{i}"], [f"t{i}"]))
        prev = f"t{i}"
    g.output[0].name = prev
    return m.SerializeToString()


def _rows_product():
    """x (b, s, D) @ W: a plan with the rows symbolic binds the product at every run (on
    onednn a primitive per row count: matmul_rows.py; on cpu the kernel's output per run)."""
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((D, 64)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", D])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def _rows_feeds(s):
    return {"x": np.random.default_rng(s).standard_normal((1, s, D)).astype(np.float32)}


def _onednn_or_skip():
    from glassrt.kernels.onednn import capi

    if capi.UNAVAILABLE is not None:
        pytest.skip(str(capi.UNAVAILABLE))


@pytest.mark.parametrize("providers", [["onednn", "cpu"], ["cpu"]])
def test_a_hot_shape_gets_its_own_plan_where_the_shared_plan_is_slower(providers):
    """The shared plan binds its one step per run (on onednn: its primitive per row count,
    not moved to cpu): a shape asked again and again gets a plan of its own."""
    if "onednn" in providers:
        _onednn_or_skip()
    sess = glassrt.InferenceSession(_rows_product(), providers=providers)
    for rows in range(1, 8):
        sess.run(None, _rows_feeds(rows))
    (pattern,) = _patterns(sess)
    shared = sess.runner.plans[pattern]
    assert not shared.moved and shared.dynamic_steps == len(shared.steps)
    if "onednn" in providers:
        assert [st.kernel.name for st in shared.steps] == ["onednn.MatMul.matmul_any_rows"]
    built = sess.memory_stats()["plans_built"]
    for _ in range(4):  # asked for again and again: compiled for exactly this shape
        sess.run(None, _rows_feeds(20))
    assert sess.memory_stats()["plans_built"] == built + 1
    own = [key for key in sess.runner.plans if not isinstance(key, ShapePattern)]
    assert any(("x", (1, 20, D), "<f4") in key for key in own), own


def test_a_hot_shape_keeps_a_shared_plan_that_is_not_slower():
    """A decode loop's positions, each asked once a generation: the shared plan runs all
    its nodes on the providers placement chose and binds only the cache's few nodes per run,
    so a position asked often stays on it (a plan of its own would start cold at every
    position)."""
    sess = glassrt.InferenceSession(_decoder_with_projections(), providers=["cpu"])
    for past in range(1, 8):
        sess.run(None, _feeds(past))
    (pattern,) = _patterns(sess)
    shared = sess.runner.plans[pattern]
    assert not shared.moved and shared.dynamic_steps * 4 <= len(shared.steps), (shared.dynamic_steps, len(shared.steps))
    built, hits = sess.memory_stats()["plans_built"], sess.memory_stats()["plan_hits"]
    for _ in range(6):
        sess.run(None, _feeds(20))
    assert sess.memory_stats()["plans_built"] == built and sess.memory_stats()["plan_hits"] == hits + 6


@pytest.mark.parametrize("case", ["slower", "kept"])
def test_more_hot_shapes_than_the_cache_holds_share_the_pattern(case):
    """A loop run again and again: every shape is seen often, more of them than the plan
    cache holds. Hot shapes take free slots only (where they take any); once the cache is
    full they run on the shared plan instead of compiling (and evicting) a plan per step.
    Where the shared plan is no slower ("kept"), the plans the first shapes got before it
    existed give way to it once it is warm: run once a loop, they would stay cold."""
    if case == "slower":
        _onednn_or_skip()
    model, feeds, providers = ((_rows_product(), _rows_feeds, ["onednn", "cpu"]) if case == "slower"
                               else (_decoder_with_projections(), _feeds, ["cpu"]))
    opts = glassrt.SessionOptions(plan_cache_size=6)
    sess = glassrt.InferenceSession(model, providers=providers, sess_options=opts)
    oracle = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for _ in range(6):
        for n in range(1, 21):
            f = feeds(n)
            for got, want in zip(sess.run(None, f), oracle.run(None, f)):
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    stats = sess.memory_stats()
    assert len(_patterns(sess)) == 1
    if case == "slower":
        assert stats["plans_evicted"] == 0 and stats["plans_built"] == stats["plans_cached"] == 6, stats
    else:  # the first shapes' own plans (made before the pattern), still cold, gave way to the warm shared plan
        after = sess.options.generalize_after
        assert stats["plans_built"] == after + 1 and stats["plans_evicted"] == after, stats
        assert stats["plans_cached"] == 1, stats


def test_unequal_values_of_one_dim_name_do_not_use_the_pattern():
    """past_k and past_v share the dim name 'past': the shared plan may rely on their being
    equal, so a feed where they differ gets a plan of its own, and the same answer."""
    model = _decoder_step(same_dim_name=True)
    sess = glassrt.InferenceSession(model, providers=["cpu"])
    for past in range(1, 8):
        sess.run(None, _feeds(past))
    assert _patterns(sess)
    pattern = _patterns(sess)[0]
    odd = _feeds(9, past_v=9)
    assert pattern.matches(sess.runner.signature(odd, None))
    assert not pattern.matches(sess.runner.signature(_feeds(9, past_v=11), None))
    assert not pattern.matches(sess.runner.signature(_feeds(0), None))  # an empty dim: a plan of its own
    assert not pattern.matches(sess.runner.signature(_feeds(9, batch=2), None))  # batch never varied


def test_pattern_plans_are_safe_across_threads():
    model = _decoder_step()
    sess = glassrt.InferenceSession(model, providers=["cpu"])
    oracle = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for past in range(1, 6):
        sess.run(None, _feeds(past))
    errors = []

    def work(offset):
        try:
            for past in range(10 + offset, 60, 4):
                feeds = _feeds(past, seed=offset)
                for got, want in zip(sess.run(None, feeds), oracle.run(None, feeds)):
                    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_shape_formulas_bind_symbols_from_input_dims():
    from glassrt import symbolic
    from glassrt.ir import TensorType
    from glassrt.runtime.shape_formula import ShapeFormula

    past = symbolic.symbol("past")
    f32 = np.dtype(np.float32)
    formula = ShapeFormula.build([TensorType(f32, (1, 4, past, 16)), TensorType(f32, (1, 4, 1, 16))],
                                 [TensorType(f32, (1, 4, past + 1, 16))])
    a, b = np.zeros((1, 4, 9, 16), np.float32), np.zeros((1, 4, 1, 16), np.float32)
    assert formula.evaluate([a, b]) == [(1, 4, 10, 16)]
    assert formula.evaluate([a, np.zeros((1, 4, 2, 16), np.float32)]) is None  # a fixed dim differs
    assert formula.evaluate([np.zeros((1, 4, 0, 16), np.float32), b]) is None  # past = 0: not the plan's case
    shifted = ShapeFormula.build([TensorType(f32, (past + 1, 3))], [TensorType(f32, (3, past + 1))])
    assert shifted.evaluate([np.zeros((7, 3), np.float32)]) == [(3, 7)]  # past + 1 = 7 binds past = 6
    assert ShapeFormula.build([TensorType(f32, (past * 2,))], [TensorType(f32, (past,))]) is None
    # one symbol in two places must take one value; an expression dim is checked, not bound
    pair = ShapeFormula.build([TensorType(f32, (past, past)), TensorType(f32, (past * 2,))],
                              [TensorType(f32, (past - 2, 1))])
    assert pair.evaluate([np.zeros((5, 5)), np.zeros(10)]) == [(3, 1)]
    assert pair.evaluate([np.zeros((5, 4)), np.zeros(10)]) is None
    assert pair.evaluate([np.zeros((5, 5)), np.zeros(9)]) is None
    assert pair.evaluate([np.zeros((1, 1)), np.zeros(2)]) is None  # past - 2 < 0
    assert pair.evaluate([np.zeros((5, 5)), None]) is None and pair.evaluate([np.zeros(5), np.zeros(10)]) is None


def test_symbolic_slice_bounds_out_of_range_fail_loudly_not_silently():
    """data[:n] with n from the input's shape: shape inference takes n within the data (as
    onnxruntime's does), so a plan shared by several n treats the slice as n long. When n
    exceeds the data, the real slice is shorter, and the node that meets both lengths
    fails with its name, on the shared plan as on a plan of its own."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Slice", ["data", "zero", "s"], ["d"]),
             helper.make_node("Add", ["d", "x"], ["y"], name="add")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
                          [numpy_helper.from_array(np.arange(6, dtype=np.float32), "data"),
                           numpy_helper.from_array(np.array([0], np.int64), "zero")])
    sess = glassrt.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
                                    providers=["cpu"])
    for n in (2, 3, 4, 5):  # the fourth distinct length runs on the shared plan
        np.testing.assert_array_equal(sess.run(None, {"x": np.ones(n, np.float32)})[0], np.arange(n) + 1)
    assert _patterns(sess)
    with pytest.raises(glassrt.GlassrtError, match="Add node 'add'"):
        sess.run(None, {"x": np.ones(8, np.float32)})


def test_any_shape_kernels_bind_once_in_a_shared_plan(monkeypatch):
    """Softmax over a growing row and a Slice whose bounds arrive as inputs (GPT-2's causal
    mask) are bound once in the shared plan, not once per shape, and stay right."""
    from glassrt.kernels import registry

    nodes = [helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("Slice", ["p", "start", "end", "axis"], ["y"])]
    g = helper.make_graph(nodes, "g", [
        helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, "n"]),
        helper.make_tensor_value_info("start", TensorProto.INT64, [1]),
        helper.make_tensor_value_info("end", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(np.array([1], np.int64), "axis")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    sess = glassrt.InferenceSession(model, providers=["cpu"])
    binds = []
    original = registry.Kernel.bind
    monkeypatch.setattr(registry.Kernel, "bind", lambda k, ctx: binds.append(k.name) or original(k, ctx))
    rng = np.random.default_rng(0)
    for n in range(2, 14):
        s = rng.standard_normal((1, n)).astype(np.float32)
        lo, hi = n // 3, n - 1
        (y,) = sess.run(None, {"s": s, "start": np.array([lo], np.int64), "end": np.array([hi], np.int64)})
        p = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
        np.testing.assert_allclose(y, p[:, lo:hi], rtol=1e-6, atol=1e-7)
    assert len(_patterns(sess)) == 1
    # one bind each in the shared plan; the exact plans before it bind once per shape
    shared = sess.options.generalize_after
    assert binds.count("cpu.Softmax") == shared + 1 and binds.count("cpu.Slice") == shared + 1, binds


def test_a_cache_that_outgrows_the_memory_limit_on_the_shared_plan_is_refused():
    """The shared plan sizes the cache's Concat per run: a length whose output would pass
    the session's memory limit is a MemoryLimitError naming the node, not an allocation,
    and the lengths under it still run (the compiled replay included)."""
    opts = glassrt.SessionOptions(memory_limit_bytes=1 << 13)  # 8 KiB: a cache of 255 rows of D floats
    sess = glassrt.InferenceSession(_decoder_step(), providers=["cpu"], sess_options=opts)
    oracle = ort.InferenceSession(_decoder_step(), providers=["CPUExecutionProvider"])
    for past in list(range(1, 30)) + [250]:
        feeds = _feeds(past)
        for got, want in zip(sess.run(None, feeds), oracle.run(None, feeds)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert _patterns(sess)
    with pytest.raises(glassrt.MemoryLimitError, match=r"Concat.*memory limit of 8,192 bytes"):
        sess.run(None, _feeds(300))


def test_a_shared_plan_is_slower_only_for_moved_nodes_that_compute():
    """A node the shared plan moved onto a view (GPT-2's attention Transposes: oneDNN's
    transpose refused the symbolic dims, cpu's is a view) costs nothing: the shared plan
    stays the one hot shapes use. A moved node that computes makes it the slower one."""
    from types import SimpleNamespace as NS

    from glassrt.runtime.runner import _slower

    def plan(alias):
        return NS(moved=("t",), dynamic_steps=0, steps=[NS(node=NS(name="t"), kernel=NS(alias=alias)),
                                                        NS(node=NS(name="m"), kernel=NS(alias=False))])

    assert not _slower(plan(alias=True))
    assert _slower(plan(alias=False))


def test_a_moved_node_leaves_the_other_values_channels_last():
    """In a shared plan a product moved to cpu (its rows symbolic, and A read transposed,
    which onednn's any-rows product does not take); the convolutions beside it keep their
    NHWC values (only the moved node's own values go plain), and the outputs are onnxruntime's."""
    _onednn_or_skip()
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n) for n, s in
             (("w", (D, 16)), ("k1", (8, 3, 3, 3)), ("k2", (8, 8, 3, 3)))]
    nodes = [helper.make_node("Gemm", ["z", "w"], ["y2"], transA=1),
             helper.make_node("Conv", ["x", "k1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "k2"], ["y1"], pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12]),
                                       helper.make_tensor_value_info("z", TensorProto.FLOAT, [D, "s"])],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("y1", "y2")], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    sess = glassrt.InferenceSession(model, providers=["onednn", "cpu"])
    oracle = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    x = rng.standard_normal((1, 3, 12, 12)).astype(np.float32)
    for rows in range(1, 8):
        f = {"x": x, "z": rng.standard_normal((D, rows)).astype(np.float32)}
        for got, want in zip(sess.run(None, f), oracle.run(None, f)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    (pattern,) = _patterns(sess)
    shared = sess.runner.plans[pattern]
    ops = {st.node.name: st.node.op_type for st in shared.steps}
    assert shared.moved and {ops[n] for n in shared.moved} == {"Gemm"}, shared.moved
    assert shared.layouts.get("r1") == "nhwc", shared.layouts


def test_a_shared_plan_that_moved_most_of_its_work_gives_each_shape_its_own():
    """A CNN's batch left symbolic: oneDNN's convolutions are bound to concrete shapes, so a
    shared plan would run every one on cpu's kernels (squeezenet at batch 5: 248 against 60
    ms a run). Each batch size compiles a plan of its own instead, and answers as
    onnxruntime does."""
    _onednn_or_skip()
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) / 4, n) for n, s in
             (("k1", (8, 3, 3, 3)), ("k2", (8, 8, 3, 3)))]
    nodes = [helper.make_node("Conv", ["x", "k1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "k2"], ["y"], pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 12, 12])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    sess = glassrt.InferenceSession(model, providers=["onednn", "cpu"])
    oracle = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for n in (1, 2, 3, 4, 5, 6, 5):
        f = {"x": rng.standard_normal((n, 3, 12, 12)).astype(np.float32)}
        np.testing.assert_allclose(sess.run(None, f)[0], oracle.run(None, f)[0], rtol=1e-4, atol=1e-4)
    assert not _patterns(sess)
    shapes = sorted(shape[0] for key in sess.runner.plans for name, shape, _ in key if name == "x")
    assert shapes == [1, 2, 3, 4, 5, 6], shapes
    assert all(st.provider == "onednn" for p in sess.runner.plans.values() for st in p.steps)


def _heads_model(shape_of_input=True):
    """The exporter's reshape into heads: Shape -> Gather(1) -> Unsqueeze -> Concat([1, s, 2, D/2])
    -> Reshape; the Shape of x itself (a plan input) or of a computed value (Relu(x)); the
    Concat's value is also a graph output."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Shape", ["x" if shape_of_input else "r"], ["sh"]),
             helper.make_node("Gather", ["sh", "one"], ["len"], axis=0),
             helper.make_node("Unsqueeze", ["len", "zero"], ["len1"]),
             helper.make_node("Concat", ["batch", "len1", "heads"], ["target"], axis=0),
             helper.make_node("Reshape", ["r", "target"], ["y"])]
    inits = [numpy_helper.from_array(np.array(1, np.int64), "one"), numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([1], np.int64), "batch"),
             numpy_helper.from_array(np.array([2, D // 2], np.int64), "heads")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "s", D])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("target", TensorProto.INT64, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


@pytest.mark.parametrize("shape_of_input", [True, False])
def test_a_shared_plan_computes_shape_values_from_the_input_shapes(shape_of_input):
    """The Gather / Unsqueeze / Concat that make a Reshape's target from a Shape do not run in
    the shared plan: their values come from the input shapes as the run starts (the target,
    a graph output too, returned as onnxruntime returns it). A Shape of the plan input does
    not run either; one of a computed value runs, its output checked. The plan names them."""
    model = _heads_model(shape_of_input)
    sess = glassrt.InferenceSession(model, providers=["cpu"])
    oracle = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for s in (2, 3, 4, 5, 7, 5, 1):
        x = np.random.default_rng(s).standard_normal((1, s, D)).astype(np.float32)
        got, want = sess.run(None, {"x": x}), oracle.run(None, {"x": x})
        for g_, w_ in zip(got, want):
            assert g_.dtype == w_.dtype and g_.shape == w_.shape
            np.testing.assert_array_equal(g_, w_)
    (plan,) = [sess.runner.plans[k] for k in _patterns(sess)]
    ran = {st.node.op_type: st for st in plan.steps}
    assert not {"Gather", "Unsqueeze", "Concat"} & set(ran), sorted(ran)
    assert ("Shape" in ran) is not shape_of_input
    assert set(plan.from_shapes) == {"Gather_2", "Unsqueeze_3", "Concat_4"} | ({"Shape_1"} if shape_of_input else set())
    assert plan.from_shapes["Concat_4"] == "target = [1, s, 2, 4]"


def test_shape_values_with_bounds_from_the_data_still_run():
    """A Slice of a shape whose bounds are computed (not constants) is not taken for a value
    of the input shapes: it runs, as do the nodes after it."""
    nodes = [helper.make_node("Shape", ["x"], ["sh"]),
             helper.make_node("Slice", ["sh", "start", "end"], ["part"]),
             helper.make_node("Reshape", ["x", "part"], ["y"])]
    inits = [numpy_helper.from_array(np.array([0], np.int64), "start")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "s", D]),
                                       helper.make_tensor_value_info("end", TensorProto.INT64, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    sess = glassrt.InferenceSession(model, providers=["cpu"])
    oracle = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for s in (2, 3, 4, 5, 6):
        f = {"x": np.ones((1, s, D), np.float32), "end": np.array([3], np.int64)}
        np.testing.assert_array_equal(sess.run(None, f)[0], oracle.run(None, f)[0])
    for plan in (sess.runner.plans[k] for k in _patterns(sess)):
        assert "Slice_1" not in plan.from_shapes and "Slice" in {st.node.op_type for st in plan.steps}
