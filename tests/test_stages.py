"""Each stage of the flow on its own, on crafted graphs: load → passes → infer → place →
plan memory → compile → run. The other tests go through InferenceSession; these call the
stage functions directly, so a stage that breaks is named by the test that fails."""
from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import glassrt
from glassrt import onnx_io, symbolic
from glassrt.errors import GlassrtError, ShapeInferenceError, UnsupportedOperatorError
from glassrt.ir import TensorType
from glassrt.passes import PIPELINE, run_passes, selected
from glassrt.runtime import providers as providers_mod
from glassrt.runtime.infer import infer
from glassrt.runtime.memory import StepIO, plan_memory
from glassrt.runtime.options import SessionOptions
from glassrt.runtime.placement import place
from glassrt.runtime.plan import compile_plan, run_plan
from glassrt.runtime.runner import GraphRunner

from .helpers import init, model, tensor


def _graph(nodes, inputs, outputs, inits=(), opset=18):
    return onnx_io.load(model(nodes, inputs, outputs, inits, opset=opset))


def _typed_placement(graph, providers=("cpu",)):
    provs = providers_mod.make(list(providers))
    return place(graph, infer(graph, {}, strict=False), provs)


# ---------------------------------------------------------------- infer


def test_infer_keeps_symbolic_dims_and_propagates_shape_values():
    g = _graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Shape", ["h"], ["s"]),
                helper.make_node("Reshape", ["x", "s2"], ["r"])],
               [tensor("x", ["batch", 4])], [tensor("h", None), tensor("s", None, TensorProto.INT64), tensor("r", None)],
               [init("w", np.ones((4, 3), np.float32)), init("s2", np.array([-1, 2], np.int64))])
    inf = infer(g, {}, strict=False)
    batch = symbolic.symbol("batch")
    assert inf.types["h"] == TensorType(np.dtype(np.float32), (batch, 3))
    assert list(inf.values["s"]) == [batch, 3]  # Shape's value is known, symbolically
    assert inf.types["r"].shape == (2 * batch, 2)
    concrete = infer(g, {"x": TensorType(np.dtype(np.float32), (5, 4))})
    assert concrete.types["r"].shape == (10, 2)


def test_infer_names_the_node_of_a_static_shape_error():
    g = _graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [tensor("x", [2, 4])], [tensor("y", None)],
               [init("w", np.ones((5, 3), np.float32))])
    with pytest.raises(ShapeInferenceError, match="MatMul node 'mm'"):
        infer(g, {}, strict=False)


def _counting_rules(monkeypatch):
    import glassrt.runtime.infer as infer_mod

    ran, real = [], infer_mod.infer_node
    monkeypatch.setattr(infer_mod, "infer_node", lambda g, node, *a: ran.append(node.name) or real(g, node, *a))
    return ran


def test_infer_reuses_an_earlier_inference_only_where_a_node_and_its_inputs_are_unchanged(monkeypatch):
    from dataclasses import replace

    g = _graph([helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["r"], name="relu"),
                helper.make_node("Shape", ["r"], ["s"], name="shape"),
                helper.make_node("Reshape", ["r", "s2"], ["y"], name="reshape")],
               [tensor("x", ["batch", 4])], [tensor("y", None), tensor("s", None, TensorProto.INT64)],
               [init("w", np.ones((4, 6), np.float32)), init("s2", np.array([-1, 3], np.int64))])
    first = infer(g, {}, strict=False)
    ran = _counting_rules(monkeypatch)
    again = infer(g, {}, strict=False, reuse=first)
    assert ran == [] and again.types == first.types and again.values.keys() == first.values.keys()
    # A new node (a pass's rewrite) is inferred, and so is what reads its output when its type changed.
    wider = replace(g, nodes=[g.nodes[0], replace(g.nodes[1], inputs=["x"]), *g.nodes[2:]])
    ran.clear()
    changed = infer(wider, {}, strict=False, reuse=first)
    assert ran == ["relu", "shape", "reshape"]
    fresh = infer(wider, {}, strict=False).types  # y's first dim is a new unknown (batch*4/3): named anew
    assert {k: t for k, t in changed.types.items() if k != "y"} == {k: t for k, t in fresh.items() if k != "y"}
    assert changed.types["y"].shape[1] == 3
    # A new constant value read by an unchanged node: inferred again (values compared by identity).
    other = replace(g, initializers={**g.initializers, "s2": np.array([-1, 2], np.int64)})
    ran.clear()
    res = infer(other, {}, strict=False, reuse=first)
    assert ran == ["reshape"] and res.types["y"].shape[1] == 2
    # Concrete input types: nothing is equal to the symbolic run, everything is inferred.
    ran.clear()
    concrete = infer(g, {"x": TensorType(np.dtype(np.float32), (5, 4))}, reuse=first)
    assert len(ran) == 4 and concrete.types["y"].shape == (10, 3)


def test_a_static_models_session_infers_each_node_once_and_its_plan_none(monkeypatch):
    ran = _counting_rules(monkeypatch)
    g = model([helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
               helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"], name="bn"),
               helper.make_node("Relu", ["n"], ["y"], name="relu")],
              [tensor("x", [1, 2, 5, 5])], [tensor("y", None)],
              [init("w", np.ones((3, 2, 3, 3), np.float32)), init("s", np.ones(3, np.float32)),
               init("b", np.zeros(3, np.float32)), init("m", np.zeros(3, np.float32)),
               init("v", np.ones(3, np.float32))])
    sess = glassrt.InferenceSession(g.SerializeToString(), ["cpu"])
    assert sorted(ran) == sorted(["bn", "conv", "relu", *[n.name for n in sess.graph.nodes]])  # + the fused node
    ran.clear()
    y, = sess.run(None, {"x": np.ones((1, 2, 5, 5), np.float32)})
    assert ran == [] and y.shape == (1, 3, 3, 3)


def test_infer_records_rather_than_raises_on_symbolic_inputs():
    """On the model's symbolic types a contradiction may be a matter of the dims' values:
    it is recorded (explain shows it) and only raised once real shapes come."""
    g = _graph([helper.make_node("Concat", ["x", "w"], ["y"], name="cat", axis=1)], [tensor("x", [2, "k"])],
               [tensor("y", None)], [init("w", np.ones((3, 3), np.float32))])
    inf = infer(g, {}, strict=False)
    assert "Concat node 'cat'" in inf.problems["cat"] and inf.types["y"].shape is None
    with pytest.raises(ShapeInferenceError, match="Concat node 'cat'"):
        infer(g, {"x": TensorType(np.dtype(np.float32), (2, 4))})  # strict, with a real shape


# ---------------------------------------------------------------- place


def test_place_records_why_each_provider_was_skipped():
    from glassrt.kernels.registry import Kernel
    from glassrt.runtime.providers import Provider

    class OnlyRelu(Provider):
        name = "only_relu"

        def kernels(self, domain, op_type, opset):
            return [Kernel("only_relu.Relu", self.name, "", "Relu", lambda x: np.maximum(x, 0))] \
                if op_type == "Relu" else []

    g = _graph([helper.make_node("Relu", ["x"], ["a"], name="r"), helper.make_node("Neg", ["a"], ["y"], name="n")],
               [tensor("x", [3])], [tensor("y", [3])])
    p = place(g, infer(g, {}, strict=False), [OnlyRelu(), *providers_mod.make(["cpu"])])
    assert p.decisions["r"].provider == "only_relu" and not p.decisions["r"].fallback
    neg = p.decisions["n"]
    assert neg.provider == "cpu" and neg.fallback
    assert neg.rejected == [("only_relu", "no only_relu kernel for Neg")]
    assert [f.node for f in p.fallbacks] == ["n"]
    assert p.counts() == {"only_relu": 1, "cpu": 1}


def test_place_refuses_an_unknown_op_naming_it():
    g = onnx_io.load(model([helper.make_node("NoSuchOp", ["x"], ["y"], name="mystery", domain="nowhere")],
                           [tensor("x", [3])], [tensor("y", [3])], domains={"nowhere": 1}))
    with pytest.raises(UnsupportedOperatorError, match="NoSuchOp node 'mystery'.*no such operator"):
        _typed_placement(g)


def test_place_does_not_rewrite_the_graph():
    """Placement only places: the nodes it returns are the ones it was given (no expansion)."""
    g = _graph([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["y"])],
               [tensor("x", [3])], [tensor("y", [3])])
    p = _typed_placement(g)
    assert [n.op_type for n in p.graph.nodes] == ["Relu", "Neg"] and p.transfers == []


# ---------------------------------------------------------------- passes


def _passes(graph, level="all", providers=("cpu",), **options):
    opts = SessionOptions(graph_optimization_level=level, **options)
    return run_passes(graph, opts, providers_mod.make(list(providers)), lambda g: infer(g, {}, strict=False))


def _conv_bn_relu(bn_mean_size=4, extra_reader=False, output_mid=False):
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"], name="bn"),
             helper.make_node("Relu", ["n"], ["y"], name="relu")]
    outputs = [tensor("y", None)]
    if extra_reader:
        nodes.append(helper.make_node("Neg", ["c"], ["z"], name="other_reader"))
        outputs.append(tensor("z", None))
    if output_mid:
        outputs.append(tensor("n", None))
    inits = [init("w", rng.standard_normal((4, 3, 3, 3)).astype(np.float32)), init("b", np.zeros(4, np.float32)),
             init("s", np.ones(4, np.float32)), init("bb", np.zeros(4, np.float32)),
             init("m", rng.standard_normal(bn_mean_size).astype(np.float32)),
             init("v", np.ones(4, np.float32))]
    return model(nodes, [tensor("x", [1, 3, 8, 8])], outputs, inits)


def test_pass_levels_select_passes_and_every_run_is_recorded():
    names = lambda level: [p.name for p in selected(PIPELINE, SessionOptions(graph_optimization_level=level))]  # noqa
    assert names("none") == ["expand_composites"]
    assert "fold_constants" in names("basic") and "fuse_conv_activation" not in names("basic")
    assert "fuse_conv_activation" in names("extended") and names("all") == [p.name for p in PIPELINE]
    assert names("ORT_ENABLE_BASIC") == names("basic") and names(99) == names("all")
    with pytest.raises(glassrt.InvalidArgumentError, match="graph_optimization_level"):
        names("fastest")
    graph, ctx, records = _passes(onnx_io.load(_conv_bn_relu()))
    assert [r.name for r in records] == names("all")
    by_name = {r.name: r for r in records}
    assert by_name["fold_batchnorm_into_conv"].changes == ["fold BatchNormalization 'bn' into Conv 'conv'"]
    assert by_name["fold_batchnorm_into_conv"].nodes_before == 3 and by_name["fold_batchnorm_into_conv"].nodes_after == 2
    assert [n.op_type for n in graph.nodes] == ["FusedConv"]


def test_fusions_that_must_not_fire():
    # The conv output has a second reader: BatchNormalization cannot go into its weights.
    g, _, records = _passes(onnx_io.load(_conv_bn_relu(extra_reader=True)))
    assert [n.op_type for n in g.nodes] == ["Conv", "FusedBatchNormalization", "Neg"]  # BN + Relu, not into the conv
    # The BatchNormalization output is a graph output: the Relu may not swallow it.
    g, _, _ = _passes(onnx_io.load(_conv_bn_relu(output_mid=True)))
    assert "Relu" in [n.op_type for n in g.nodes]
    # A residual that broadcasts is not the conv output's shape: no residual fusion.
    rng = np.random.default_rng(1)
    m = model([helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
               helper.make_node("Add", ["c", "bias"], ["y"], name="add")],
              [tensor("x", [1, 2, 4, 4])], [tensor("y", None)],
              [init("w", rng.standard_normal((2, 2, 1, 1)).astype(np.float32)),
               init("bias", rng.standard_normal((1, 2, 4, 1)).astype(np.float32))])
    g, _, _ = _passes(onnx_io.load(m))
    assert [n.op_type for n in g.nodes] == ["Conv", "Add"]
    # Clip with bounds known only at run time stays a Clip.
    m = model([helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
               helper.make_node("Clip", ["c", "lo", "hi"], ["y"], name="clip")],
              [tensor("x", [1, 2, 4, 4]), tensor("lo", []), tensor("hi", [])], [tensor("y", None)],
              [init("w", rng.standard_normal((2, 2, 1, 1)).astype(np.float32))])
    g, _, _ = _passes(onnx_io.load(m))
    assert [n.op_type for n in g.nodes] == ["Conv", "Clip"]
    # x·0.6·(1 + erf(x/√2)) is not GELU.
    m = model([helper.make_node("Div", ["x", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
               helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["x", "a"], ["m"]),
               helper.make_node("Mul", ["m", "c"], ["y"])],
              [tensor("x", [4])], [tensor("y", None)],
              [init("sqrt2", np.float32(np.sqrt(2))), init("one", np.float32(1)), init("c", np.float32(0.6))])
    g, _, _ = _passes(onnx_io.load(m))
    assert "Gelu" not in [n.op_type for n in g.nodes]


def test_passes_on_a_malformed_model_raise_a_glassrt_error_naming_the_node():
    """BatchNormalization's mean has 3 values where the conv has 4 channels: the folding
    pass leaves it alone and the type check names the node (never a NumPy broadcast error)."""
    with pytest.raises(ShapeInferenceError, match="BatchNormalization node 'bn'"):
        glassrt.InferenceSession(_conv_bn_relu(bn_mean_size=3), providers=["cpu"])


def test_a_failing_decomposition_is_shown_not_hidden():
    op = glassrt.custom_op("stage_tests::halve(Tensor x) -> Tensor", dtypes=[np.float32])
    op.register_meta(lambda x: x)

    def broken(g, x):
        raise RuntimeError("the decomposition has a bug")

    op.register_decomposition(broken)
    m = model([helper.make_node("halve", ["x"], ["y"], name="h", domain="stage_tests")], [tensor("x", [2])],
              [tensor("y", [2])], domains={"stage_tests": 1})
    with pytest.raises(UnsupportedOperatorError, match="decomposition failed: RuntimeError: the decomposition has a bug"):
        glassrt.InferenceSession(m, providers=["cpu"])


def test_folding_honours_fold_limit_bytes():
    m = model([helper.make_node("ConstantOfShape", ["shape"], ["big"], name="fill",
                                value=helper.make_tensor("v", 1, [1], [1.0])),
               helper.make_node("Add", ["x", "big"], ["y"], name="add")],
              [tensor("x", [256, 1024])], [tensor("y", [256, 1024])], [init("shape", np.array([256, 1024], np.int64))])
    small = glassrt.InferenceSession(m, providers=["cpu"], sess_options=SessionOptions(fold_limit_bytes=1 << 19))
    assert small.folded == [] and "big" not in small.graph.initializers
    big = glassrt.InferenceSession(m, providers=["cpu"])
    assert big.folded == ["fill"] and big.graph.initializers["big"].shape == (256, 1024)
    x = np.ones((256, 1024), np.float32)
    np.testing.assert_array_equal(small.run(None, {"x": x})[0], big.run(None, {"x": x})[0])


def test_constants_fold_as_they_stand_within_the_limit(monkeypatch):
    """A Constant folds as its kernel gives it (`value`, `value_floats`...), without a
    provider's verdict and a kernel bound for it (a Paddle export carries hundreds); one
    over fold_limit_bytes stays a node, which the plan's folding does not take either."""
    from glassrt.runtime import folding

    w = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    m = model([helper.make_node("Constant", [], ["w"], name="cw", value=onnx.numpy_helper.from_array(w, "w")),
               helper.make_node("Constant", [], ["b"], name="cb", value_floats=[0.5] * 64),
               helper.make_node("MatMul", ["x", "w"], ["xw"], name="mm"),
               helper.make_node("Add", ["xw", "b"], ["y"], name="add")],
              [tensor("x", [2, 64])], [tensor("y", [2, 64])])
    folded = []
    real = folding.fold_with_providers
    monkeypatch.setattr("glassrt.passes.constant_folding.fold_with_providers",
                        lambda node, *a: folded.append(node.name) or real(node, *a))
    x = np.ones((2, 64), np.float32)
    sess = glassrt.InferenceSession(m, providers=["cpu"])
    assert sorted(sess.folded) == ["cb", "cw"] and folded == ["mm", "add"]  # (asked, not folded: x is an input)
    assert sess.graph.initializers["w"] is not None
    np.testing.assert_array_equal(sess.graph.initializers["w"], w)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], x @ w + 0.5, rtol=1e-6)
    small = glassrt.InferenceSession(m, providers=["cpu"], sess_options=SessionOptions(fold_limit_bytes=1024))
    assert small.folded == ["cb"] and "w" not in small.graph.initializers
    np.testing.assert_allclose(small.run(None, {"x": x})[0], x @ w + 0.5, rtol=1e-6)


# ---------------------------------------------------------------- memory planner


def _first_fit(order, sizes, lives):
    placed, top = [], 0
    for i in order:
        busy = sorted((o, o + sizes[j]) for j, o in placed if lives[j][0] <= lives[i][1] and lives[i][0] <= lives[j][1])
        offset = 0
        for lo, hi in busy:
            if lo - offset >= sizes[i]:
                break
            offset = max(offset, hi)
        placed.append((i, offset))
        top = max(top, offset + sizes[i])
    return top


def _optimum(sizes, lives):
    """The smallest arena: first-fit at the lowest free offset, in the best of all orders
    (placing an optimal packing's buffers by increasing offset reproduces it or better)."""
    return min(_first_fit(order, sizes, lives) for order in itertools.permutations(range(len(sizes))))


@pytest.mark.parametrize("seed", range(12))
def test_memory_planner_reaches_the_optimum_on_small_cases(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 7))
    sizes = [int(rng.integers(1, 9)) * 64 for _ in range(n)]
    # Value i is produced by step i and last read by a later step.
    last = [int(rng.integers(i + 1, n + 1)) for i in range(n)]
    steps = []
    for k in range(n + 1):
        reads = [f"v{i}" for i in range(n) if last[i] == k]
        writes = [f"v{k}"] if k < n else ["out"]
        sizes_k = {f"v{k}": sizes[k]} if k < n else {}
        steps.append(StepIO(reads, writes, sizes_k))
    plan = plan_memory(steps, keep={"out"})
    lives = [(i, last[i]) for i in range(n)]
    assert plan.arena_bytes == _optimum(sizes, lives)
    assert plan.lower_bound_bytes <= plan.arena_bytes
    # No two values live at the same step share bytes.
    vals = [plan.values[f"v{i}"] for i in range(n)]
    for a, b in itertools.combinations(vals, 2):
        if a.first_step <= b.last_step and b.first_step <= a.last_step:
            assert a.offset + a.bytes <= b.offset or b.offset + b.bytes <= a.offset


@pytest.mark.parametrize("seed", range(6))
def test_a_plan_too_dense_for_the_search_is_swept_and_still_never_overlaps(seed, monkeypatch):
    """Above MAX_OVERLAPS pairs of values living together the planner places buffers in one
    first-fit sweep (the search looks at every living neighbour per placement: seconds for
    thousands of values read by one late node): no two values alive at once share bytes,
    and the arena is no larger than every value side by side."""
    import glassrt.runtime.memory as memory

    rng = np.random.default_rng(seed)
    n = 300
    sizes = [int(rng.integers(1, 40)) * 64 for _ in range(n)]
    last = [min(n, i + 1 + int(rng.exponential(20))) for i in range(n)]
    steps = []
    for k in range(n + 1):
        reads = [f"v{i}" for i in range(n) if last[i] == k]
        steps.append(StepIO(reads, [f"v{k}"] if k < n else ["out"], {f"v{k}": sizes[k]} if k < n else {}))
    searched = plan_memory(steps, keep={"out"})
    monkeypatch.setattr(memory, "MAX_OVERLAPS", 0)
    swept = plan_memory(steps, keep={"out"})
    for plan in (searched, swept):
        vals = [plan.values[f"v{i}"] for i in range(n)]
        for a, b in itertools.combinations(vals, 2):
            if a.first_step <= b.last_step and b.first_step <= a.last_step:
                assert a.offset + a.bytes <= b.offset or b.offset + b.bytes <= a.offset
        assert plan.lower_bound_bytes <= plan.arena_bytes <= sum(memory._align(x) for x in sizes)
    assert swept.arena_bytes <= 1.5 * searched.arena_bytes  # (first fit by first use: close to the search here)


def test_memory_planner_reuses_a_dying_input_in_place_and_keeps_views_alive():
    steps = [StepIO(["x"], ["a"], {"a": 256}),
             StepIO(["a"], ["b"], {"b": 256}, inplace={"b": "a"}),  # a dies here: b takes its bytes
             StepIO(["b"], ["v"], {}, aliases={"v": "b"}),  # v is a view of b
             StepIO(["v"], ["c"], {"c": 256}),
             StepIO(["c"], ["y"], {})]
    plan = plan_memory(steps, keep={"y"})
    assert plan.values["b"].offset == plan.values["a"].offset and plan.values["b"].kind == "inplace"
    assert plan.values["v"].kind == "alias"
    assert plan.values["c"].offset != plan.values["b"].offset  # b lives on through its view v
    assert plan.arena_bytes == plan.lower_bound_bytes == 512


# ---------------------------------------------------------------- compile and run


def test_compile_plan_then_replay_writes_into_the_same_arena():
    rng = np.random.default_rng(0)
    g = _graph([helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["r"]),
                helper.make_node("Add", ["r", "r"], ["y"], name="add")],
               [tensor("x", ["batch", 8])], [tensor("y", None)],
               [init("w", rng.standard_normal((8, 16)).astype(np.float32))])
    placement = _typed_placement(g)
    opts = SessionOptions()
    runner = GraphRunner(placement, opts)
    plan = compile_plan(placement, {"x": TensorType(np.dtype(np.float32), (4, 8))}, opts, runner.make_runner,
                        pool=runner.pool)
    assert [s.node.name for s in plan.steps] == ["mm", placement.graph.nodes[1].name, "add"]
    # y, a graph output of 128 bytes, is written into the arena too and copied out when the run returns
    assert plan.memory.values["h"].offset is not None and plan.memory.values["y"].kind == "copied_output"
    assert plan.memory.values["y"].offset is not None and plan.memory.values["y"].last_step == len(plan.steps)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    expected = 2 * np.maximum(x @ g.initializers["w"], 0)
    arena = plan.arena.__array_interface__["data"][0]
    for _ in range(2):
        y, = run_plan(plan, {"x": x})
        np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)  # the matmul kernel picked may sum in another order
    assert plan.arena.__array_interface__["data"][0] == arena
    y2, = run_plan(plan, {"x": x})
    assert y2 is not y and not np.shares_memory(y2, plan.arena)  # outputs are the caller's
    np.testing.assert_array_equal(y, y2)  # (the first run's array unchanged by the second)


def test_a_large_graph_output_is_a_new_array_each_run_and_a_small_one_is_copied_out():
    """plan.COPIED_OUTPUT_BYTES: a small graph output lives in the arena until the run returns
    (its last step: after all of them), then is copied for the caller; one above the limit is
    written by its kernel into a new array every run, never the arena. Either way the caller's
    arrays are its own: a later run changes none of them."""
    from glassrt.runtime import plan as plan_module

    big_cols = plan_module.COPIED_OUTPUT_BYTES // 4 + 1  # float32 columns of one row: just over the limit
    g = _graph([helper.make_node("Relu", ["x"], ["small"], name="small"),
                helper.make_node("Relu", ["z"], ["big"], name="big")],
               [tensor("x", [1, 8]), tensor("z", [1, big_cols])], [tensor("small", None), tensor("big", None)], [])
    placement = _typed_placement(g)
    opts = SessionOptions()
    runner = GraphRunner(placement, opts)
    plan = compile_plan(placement, {"x": TensorType(np.dtype(np.float32), (1, 8)),
                                    "z": TensorType(np.dtype(np.float32), (1, big_cols))},
                        opts, runner.make_runner, pool=runner.pool)
    small, big = plan.memory.values["small"], plan.memory.values["big"]
    assert small.kind == "copied_output" and small.offset is not None
    assert big.kind == "output" and big.offset is None
    rng = np.random.default_rng(1)
    # past STRAIGHT_AFTER runs, so that the replayed straight-line function (runtime/straight.py)
    # writes the small output too, and every earlier result must still hold its own run's values
    feeds = [{"x": rng.standard_normal((1, 8)).astype(np.float32),
              "z": rng.standard_normal((1, big_cols)).astype(np.float32)}
             for _ in range(plan_module.STRAIGHT_AFTER + 3)]
    outs = [run_plan(plan, f) for f in feeds]
    assert plan.straight is not None
    for f, (s_out, b_out) in zip(feeds, outs):
        np.testing.assert_array_equal(s_out, np.maximum(f["x"], 0))
        np.testing.assert_array_equal(b_out, np.maximum(f["z"], 0))
        assert not np.shares_memory(s_out, plan.arena) and not np.shares_memory(b_out, plan.arena)


def test_run_plan_names_the_node_whose_kernel_fails():
    m = model([helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape")],
              [tensor("x", ["n"]), tensor("s", [2], 7)], [tensor("y", None)])
    placement = _typed_placement(onnx_io.load(m))
    opts = SessionOptions()
    runner = GraphRunner(placement, opts)
    plan = compile_plan(placement, {"x": TensorType(np.dtype(np.float32), (6,)),
                                    "s": TensorType(np.dtype(np.int64), (2,))}, opts, runner.make_runner)
    with pytest.raises(GlassrtError, match="Reshape node 'reshape'"):
        run_plan(plan, {"x": np.ones(6, np.float32), "s": np.array([4, 4], np.int64)})


def test_clip_bounds_of_shape_one_fuse_like_scalars():
    """onnxruntime takes Clip bounds of shape (1,) (exporters write them): they fuse into the
    conv as scalars would, and the result is the unfused one."""
    rng = np.random.default_rng(2)
    m = model([helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
               helper.make_node("Clip", ["c", "lo", "hi"], ["y"], name="clip")],
              [tensor("x", [1, 3, 4, 4])], [tensor("y", None)],
              [init("w", rng.standard_normal((4, 3, 1, 1)).astype(np.float32)), init("lo", np.array([0.0], np.float32)),
               init("hi", np.array([0.5], np.float32))], opset=17)
    fused = glassrt.InferenceSession(m, providers=["cpu"])
    assert [n.op_type for n in fused.graph.nodes] == ["FusedConv"]
    plain = glassrt.InferenceSession(m, providers=["cpu"], sess_options=SessionOptions(graph_optimization_level="none"))
    x = rng.standard_normal((1, 3, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(fused.run(None, {"x": x})[0], plain.run(None, {"x": x})[0], rtol=1e-6)


def test_pool_accounting_is_exact_over_many_runs_with_dynamic_outputs():
    """NonZero's output shape is known only at run time: the intermediate comes from the
    plan's pool and goes back every run; the graph output is the caller's, never a pool
    buffer. After 2,000 runs the pool holds exactly one block and hands out nothing."""
    m = model([helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Transpose", ["nz"], ["t"]),
               helper.make_node("Cast", ["t"], ["y"], to=1)],
              [tensor("x", [512])], [tensor("y", None)])
    sess = glassrt.InferenceSession(m, providers=["cpu"])
    x = np.ones(512, np.float32)
    kept = [sess.run(None, {"x": x})[0] for _ in range(2000)]
    stats = sess.memory_stats()["pool"]
    assert stats["allocated_bytes"] == 0
    assert stats["reserved_bytes"] == 4096 and stats["misses"] == 1  # one 512x1 int64 block, reused
    assert len({id(k) for k in kept}) == 2000 and all(k.shape == (512, 1) for k in kept)


def test_bad_session_arguments_are_glassrt_errors():
    with pytest.raises(glassrt.InvalidArgumentError, match="fallback must be"):
        glassrt.InferenceSession(_conv_bn_relu(), fallback="sometimes")
    with pytest.raises(glassrt.InvalidArgumentError, match="graph_optimization_level"):
        glassrt.InferenceSession(_conv_bn_relu(), sess_options=SessionOptions(graph_optimization_level="max"))


def test_a_plan_moves_a_node_its_placed_provider_refuses_for_the_plans_shapes():
    """Placement judges a kernel bound to concrete shapes on a stand-in binding of the
    symbolic dims; a plan whose real shapes it refuses runs the node on the next provider,
    says why, and keeps its values in plain layouts."""
    from glassrt.kernels.registry import Kernel
    from glassrt.runtime.providers import Provider

    def relu(ctx):
        return lambda x, *, out: np.maximum(x, 0, out=out)

    class SmallBatches(Provider):  # a partial provider whose kernel takes batches under 40
        name, partial = "small", True

        def kernels(self, domain, op_type, opset):
            if op_type != "Relu":
                return []
            return [Kernel("small.Relu", "small", "", "Relu", relu, out=True, builder=True, static_only=True,
                           accepts=lambda ctx: None if ctx.shape(0)[0] < 40 else "a batch of 40 or more")]

    m = model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [tensor("x", ["n", 3])], [tensor("y", None)])
    sess = glassrt.InferenceSession(m, providers=[SmallBatches(), "cpu"])
    assert sess.placement.decisions["relu"].provider == "small" and sess.fallbacks == []
    for n, provider in [(2, "small"), (50, "cpu")]:
        x = np.linspace(-1, 1, n * 3, dtype=np.float32).reshape(n, 3)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.maximum(x, 0))
        node = sess.explain({"n": n})["nodes"][0]
        assert node["provider"] == provider, node
    assert "small for these shapes: " in node["reason"] and "a batch of 40 or more" in node["reason"]


def _small_batch_relu(partial: bool):
    """A model of one Relu, batch symbolic, and a provider whose only kernel takes batches
    under 40 (known only when a plan's shapes are)."""
    from glassrt.kernels.registry import Kernel
    from glassrt.runtime.providers import Provider

    def relu(ctx):
        return lambda x, *, out: np.maximum(x, 0, out=out)

    class SmallBatches(Provider):
        name = "small"

        def kernels(self, domain, op_type, opset):
            if op_type != "Relu":
                return []
            return [Kernel("small.Relu", "small", "", "Relu", relu, out=True, builder=True, static_only=True,
                           accepts=lambda ctx: None if ctx.shape(0)[0] < 40 else "a batch of 40 or more")]

    SmallBatches.partial = partial
    m = model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [tensor("x", ["n", 3])], [tensor("y", None)])
    return m, SmallBatches()


def _relu_feed(n):
    return {"x": np.linspace(-1, 1, n * 3, dtype=np.float32).reshape(n, 3)}


def test_a_plan_whose_shapes_a_complete_provider_refuses_counts_warns_and_errs_as_a_fallback():
    """A node placed on a complete provider (one that aims to run everything, as cpu) that a
    plan's shapes send to the next provider is a fallback, as at placement: listed in
    sess.fallbacks with the plan's shapes and warned of once; fallback="error" fails that
    run alone (no plan kept for it), the session still running the shapes it takes."""
    import warnings

    m, small = _small_batch_relu(partial=False)
    sess = glassrt.InferenceSession(m, providers=[small, "cpu"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (2, 50, 50, 60):
            np.testing.assert_array_equal(sess.run(None, _relu_feed(n))[0], np.maximum(_relu_feed(n)["x"], 0))
    warned = [str(w.message) for w in caught if issubclass(w.category, glassrt.FallbackWarning)]
    assert len(warned) == 1 and "input x: [50, 3]" in warned[0] and "a batch of 40 or more" in warned[0], warned
    (f,) = sess.fallbacks
    assert (f.node, f.op, f.provider, f.shapes) == ("relu", "Relu", "cpu", "input x: [50, 3]"), f
    assert f.reason.startswith("small: ") and "a batch of 40 or more" in str(f)

    strict = glassrt.InferenceSession(m, providers=[small, "cpu"], fallback="error")
    with pytest.raises(glassrt.FallbackError, match=r"for input x: \[50, 3\].*a batch of 40 or more"):
        strict.run(None, _relu_feed(50))
    np.testing.assert_array_equal(strict.run(None, _relu_feed(2))[0], np.maximum(_relu_feed(2)["x"], 0))
    assert list(strict.runner.plans) == [(("x", (2, 3), "<f4"),)] and strict.fallbacks == []
    with pytest.raises(glassrt.FallbackError):
        strict.run(None, _relu_feed(50))


def test_a_partial_provider_refusing_a_plans_shapes_is_no_fallback():
    """A partial provider (onednn) takes only what it is fast at: a plan's shapes it refuses
    move the node to the next provider by design, shown by explain, not counted or warned."""
    import warnings

    m, small = _small_batch_relu(partial=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", glassrt.FallbackWarning)
        sess = glassrt.InferenceSession(m, providers=[small, "cpu"], fallback="error")
        sess.run(None, _relu_feed(50))
    assert sess.fallbacks == [] and sess.runner.plans[(("x", (50, 3), "<f4"),)].moved == ("relu",)


def test_a_shared_plan_with_fallbacks_is_not_used_under_fallback_error():
    """Shapes of one structure come to share a plan with the varying dims symbolic; a
    complete provider that refuses symbolic dims would fall back there. Under "error" each
    shape gets a plan of its own instead (where the provider takes the node); under "warn"
    the shared plan runs, warned of once."""
    import warnings

    m, small = _small_batch_relu(partial=False)
    strict = glassrt.InferenceSession(m, providers=[small, "cpu"], fallback="error")
    for n in range(1, 9):
        np.testing.assert_array_equal(strict.run(None, _relu_feed(n))[0], np.maximum(_relu_feed(n)["x"], 0))
    assert all(isinstance(sig, tuple) for sig in strict.runner.plans), list(strict.runner.plans)
    assert all(st.provider == "small" for p in strict.runner.plans.values() for st in p.steps)

    sess = glassrt.InferenceSession(m, providers=[small, "cpu"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(1, 9):
            sess.run(None, _relu_feed(n))
    warned = [str(w.message) for w in caught if issubclass(w.category, glassrt.FallbackWarning)]
    assert len(warned) == 1 and "shared by shapes like input x: [n, 3]" in warned[0], warned
    assert [f.shapes for f in sess.fallbacks] == ["input x: [n, 3]"]


def test_a_plan_that_moves_a_node_keeps_its_values_plain_and_explain_says_so():
    """Two nodes of a partial NHWC provider: the value between them is NHWC. A plan whose
    shapes the provider refuses runs both on cpu, in plain layouts, and explain reports the
    plan's layouts (none), not placement's."""
    from glassrt.kernels.registry import Kernel
    from glassrt.runtime.providers import Provider

    def relu(ctx):
        return lambda x, *, out: np.maximum(x, 0, out=out)

    class SmallNhwc(Provider):
        name, partial = "small_nhwc", True

        def kernels(self, domain, op_type, opset):
            if op_type != "Relu":
                return []
            return [Kernel("small_nhwc.Relu", self.name, "", "Relu", relu, out=True, builder=True, static_only=True,
                           layouts=frozenset({"nhwc"}),
                           accepts=lambda ctx: None if ctx.shape(0)[0] < 40 else "a batch of 40 or more")]

    m = model([helper.make_node("Relu", ["x"], ["a"], name="r1"), helper.make_node("Relu", ["a"], ["b"], name="r2"),
               helper.make_node("Neg", ["b"], ["y"], name="neg")], [tensor("x", ["n", 3, 4, 4])], [tensor("y", None)])
    sess = glassrt.InferenceSession(m, providers=[SmallNhwc(), "cpu"])
    assert sess.placement.layouts == {"a": "nhwc"}
    for n, nhwc in [(2, 1), (50, 0)]:
        x = np.linspace(-1, 1, n * 48, dtype=np.float32).reshape(n, 3, 4, 4)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], -np.maximum(x, 0))
        report = sess.explain({"n": n})
        assert report["summary"]["layouts"]["nhwc_values"] == nhwc
        assert next(v for v in report["values"] if v["name"] == "a")["layout"] == ("nhwc" if nhwc else "nchw")


def test_identity_and_inference_dropout_are_removed_where_safe():
    from glassrt.passes.identity import remove_identities

    nodes = [helper.make_node("Identity", ["x"], ["a"], name="id1"),
             helper.make_node("Identity", ["a"], ["b"], name="id2"),               # a chain: readers of b read x
             helper.make_node("Dropout", ["b"], ["c", "unused_mask"], name="drop9"),  # opset 9, mask unread
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Dropout", ["r"], ["d", "mask"], name="drop_mask"),  # its mask is a graph output
             helper.make_node("Identity", ["r"], ["out"], name="id_out")]          # a graph output keeps its node
    g = _graph(nodes, [tensor("x", [3])], [tensor("d", None), tensor("mask", None, TensorProto.BOOL), tensor("out", None)], opset=9)
    g2, changes = remove_identities(g)
    names = [n.name for n in g2.nodes]
    assert names == ["relu", "drop_mask", "id_out"] and len(changes) == 3
    assert g2.nodes[0].inputs == ["x"]
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    m = model(nodes, [tensor("x", [3])], [tensor("d", None), tensor("mask", None, TensorProto.BOOL), tensor("out", None)], opset=9)
    got = glassrt.InferenceSession(m, providers=["cpu"]).run(None, {"x": x})
    assert got[0].tolist() == [0.0, 0.5, 2.0] and got[2].tolist() == [0.0, 0.5, 2.0]


def test_a_cast_to_the_type_a_graph_input_or_initializer_has_is_removed():
    """skl2onnx casts its float input to float first: that Cast passes the input through (the
    run is fed the declared type or refused). A Cast that changes the type, one whose input's
    type is only known by inference, and one writing a graph output stay."""
    from glassrt.passes.identity import remove_identities

    f, d = TensorProto.FLOAT, TensorProto.DOUBLE
    nodes = [helper.make_node("Cast", ["x"], ["xf"], name="same", to=f),
             helper.make_node("Cast", ["w"], ["wf"], name="same_init", to=f),
             helper.make_node("Add", ["xf", "wf"], ["s"], name="add"),
             helper.make_node("Cast", ["s"], ["sf"], name="inferred", to=f),  # (s's type: inference's to say)
             helper.make_node("Cast", ["sf"], ["y"], name="to_double", to=d),
             helper.make_node("Cast", ["x"], ["x_out"], name="graph_output", to=f)]
    inputs, outputs = [tensor("x", [3])], [tensor("y", None, d), tensor("x_out", None)]
    inits = [init("w", np.array([1.0, 2.0, 3.0], np.float32))]
    g2, changes = remove_identities(_graph(nodes, inputs, outputs, inits, opset=17))
    assert [n.name for n in g2.nodes] == ["add", "inferred", "to_double", "graph_output"], changes
    assert g2.nodes[0].inputs == ["x", "w"]
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    m = model(nodes, inputs, outputs, inits, opset=17)
    got = glassrt.InferenceSession(m, providers=["cpu"]).run(None, {"x": x})
    assert got[0].dtype == np.float64 and got[0].tolist() == [0.0, 2.5, 5.0] and got[1].tolist() == x.tolist()
    with pytest.raises(glassrt.GlassrtError, match="expected dtype"):  # the declared type is what a run is fed
        glassrt.InferenceSession(m, providers=["cpu"]).run(None, {"x": x.astype(np.float64)})
    # a body's inputs are fed by its node, not checked against what they declare: their Casts stay
    from glassrt.passes.manager import PassContext

    in_body = remove_identities(_graph(nodes, inputs, outputs, inits, opset=17), PassContext(None, [], body=True))[0]
    assert [n.name for n in in_body.nodes] == ["same", "add", "inferred", "to_double", "graph_output"]


def test_dropout_in_training_mode_stays():
    from glassrt.passes.identity import remove_identities

    nodes = [helper.make_node("Dropout", ["x", "ratio", "train"], ["y"], name="drop")]
    g = _graph(nodes, [tensor("x", [3])], [tensor("y", None)],
               [init("ratio", np.array(0.5, np.float32)), init("train", np.array(True))], opset=13)
    assert remove_identities(g)[1] == []


def test_values_inference_proves_are_folded_whatever_the_symbolic_dims():
    """Attention's scale as exporters write it: Shape(k)[-1:] → Squeeze → Cast → Sqrt → Div.
    The last dim is static, so the chain is a constant for every input: folded at session
    creation. The batch dim's Shape → Slice[0:1] depends on the input and stays a node."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Slice", ["shape", "minus1", "big"], ["last"], name="last"),
        helper.make_node("Squeeze", ["last", "zero"], ["d"], name="squeeze"),
        helper.make_node("Cast", ["d"], ["df"], to=1, name="cast"),
        helper.make_node("Sqrt", ["df"], ["scale"], name="sqrt"),
        helper.make_node("Div", ["x", "scale"], ["y"], name="div"),
        helper.make_node("Slice", ["shape", "zero", "one"], ["batch"], name="batch_of_shape"),
    ]
    m = model(nodes, [tensor("x", ["batch", 64])],
              [tensor("y", ["batch", 64]), tensor("batch", [1], onnx.TensorProto.INT64)],
              [init("minus1", np.array([-1], np.int64)), init("big", np.array([2**62], np.int64)),
               init("zero", np.array([0], np.int64)), init("one", np.array([1], np.int64))])
    sess = glassrt.InferenceSession(m.SerializeToString())
    assert {"shape", "batch_of_shape", "div"} <= {n.name for n in sess.graph.nodes}
    assert not {"last", "squeeze", "cast", "sqrt"} & {n.name for n in sess.graph.nodes}
    assert {"last", "squeeze", "cast", "sqrt"} <= set(sess.folded)
    for batch in (1, 5):
        x = np.random.default_rng(batch).standard_normal((batch, 64)).astype(np.float32)
        y, b = sess.run(None, {"x": x})
        np.testing.assert_allclose(y, x / 8.0, rtol=1e-6)
        assert b.tolist() == [batch]


def test_values_folding_computes_make_the_plans_shapes_static():
    """PyTorch writes F.pad's pads as Concat, Reshape, Slice (step -1), Transpose, Reshape
    and Cast of constants; inference has no value rule for some of them, so the Pad's output
    shape stayed symbolic and every step after it bound per run (silero-vad's If branches:
    38 of 43 steps). The plan folds those values anyway: it infers again with them."""
    from glassrt.runtime.plan import _DynamicStep

    I64 = onnx.TensorProto.INT64
    nodes = [
        helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", I64, [2], [2, 3])),
        helper.make_node("Constant", [], ["n"], value=helper.make_tensor("n", I64, [1], [2])),
        helper.make_node("ConstantOfShape", ["n"], ["z"], value=helper.make_tensor("v", I64, [1], [0])),
        helper.make_node("Concat", ["c", "z"], ["cat"], axis=0),
        helper.make_node("Constant", [], ["s22"], value=helper.make_tensor("s22", I64, [2], [-1, 2])),
        helper.make_node("Reshape", ["cat", "s22"], ["r"]),
        helper.make_node("Constant", [], ["st"], value=helper.make_tensor("st", I64, [1], [-1])),
        helper.make_node("Constant", [], ["en"], value=helper.make_tensor("en", I64, [1], [-(2**63)])),
        helper.make_node("Constant", [], ["ax"], value=helper.make_tensor("ax", I64, [1], [0])),
        helper.make_node("Slice", ["r", "st", "en", "ax", "st"], ["flip"]),
        helper.make_node("Transpose", ["flip"], ["t"], perm=[1, 0]),
        helper.make_node("Constant", [], ["m1"], value=helper.make_tensor("m1", I64, [1], [-1])),
        helper.make_node("Reshape", ["t", "m1"], ["flat"]),
        helper.make_node("Cast", ["flat"], ["pads"], to=I64),
        helper.make_node("Pad", ["x", "pads"], ["p"], mode="reflect"),
        helper.make_node("Relu", ["p"], ["y"]),
    ]
    m = model(nodes, [tensor("x", [1, 8])], [tensor("y", None)], opset=17)
    options = glassrt.SessionOptions(graph_optimization_level="none")  # no folding pass: the plan folds
    sess = glassrt.InferenceSession(m, options, providers=["cpu"])
    x = np.arange(-4, 4, dtype=np.float32).reshape(1, 8)
    # pads [0, 2, 0, 3] (the flipped rows, transposed): 2 before and 3 after on axis 1
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.maximum(np.pad(x, [(0, 0), (2, 3)], "reflect"), 0))
    plan = next(iter(sess.runner.plans.values()))
    assert plan.types["y"].shape == (1, 13)
    assert not [st.node.op_type for st in plan.steps if isinstance(st.fn, _DynamicStep)]


def test_readers_index_is_reused_only_for_the_same_nodes():
    """passes/_rewrite.Readers keeps the latest node list's index while the passes run: the
    same nodes in the same order reuse it; a list changed in place, another order, or other
    graph outputs index again; run_pipeline drops it at the end."""
    from dataclasses import replace

    from glassrt.passes._rewrite import Readers

    g = _graph([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
                helper.make_node("Abs", ["a"], ["y"])], [tensor("x", [2])], [tensor("y", [2])])
    nodes = list(g.nodes)
    first = Readers(g, nodes)
    assert Readers(g, list(nodes)).by_value is first.by_value  # (another list, the same nodes)
    assert [n.op_type for n in first.by_value["a"]] == ["Neg", "Abs"]
    nodes[1] = replace(nodes[1], inputs=["x"])  # changed in place: indexed again
    again = Readers(g, nodes)
    assert again.by_value is not first.by_value and [n.op_type for n in again.by_value["a"]] == ["Abs"]
    assert Readers(g, nodes[::-1]).by_value is not again.by_value
    other_outputs = replace(g, outputs=g.outputs + [g.inputs[0]])
    assert Readers(other_outputs, nodes[::-1]).single("x") is None  # (a graph output has no single reader)
    run_passes(g, SessionOptions(), providers_mod.make(["cpu"], []), lambda graph, reuse=None: infer(graph, {}))
    assert Readers._last is None
