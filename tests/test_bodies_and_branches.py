"""If / Loop bodies get the pass pipeline (passes/bodies.py), a plan runs an If whose
condition its shapes decide as the branch taken (runtime/inline.py), If typing looks only
at the branch taken when the condition is known (ops/meta/control.py), and comparisons
propagate known values (ops/meta/shape.py). Everything checked against onnxruntime."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import glassrt
from glassrt import onnx_io
from glassrt.ir import TensorType
from glassrt.runtime.infer import infer

from .helpers import init, model, tensor

RNG = np.random.default_rng(3)
X = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
W = (RNG.standard_normal((4, 3, 3, 3)) / 4).astype(np.float32)
W2 = (RNG.standard_normal((4, 3, 3, 3)) / 4).astype(np.float32)
STATS = [RNG.uniform(0.5, 1.5, 4), RNG.standard_normal(4), RNG.standard_normal(4), RNG.uniform(0.5, 1.5, 4)]


def _ort(m, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _const(name, array):
    return helper.make_node("Constant", [], [name], name=f"const_{name}",
                            value=helper.make_tensor(name + "_t", TensorProto.FLOAT, array.shape, array.ravel()))


def _branchy_model():
    """If(flag): then = Conv(x, Constant w) -> BatchNormalization (Constant stats) -> Relu;
    else = Conv(x, Slice of an outer weight) -> Relu."""
    then_nodes = [_const("tw", W)] + [_const(f"s{i}", a.astype(np.float32)) for i, a in enumerate(STATS)] + [
        helper.make_node("Conv", ["x", "tw"], ["tc"], name="t_conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["tc", "s0", "s1", "s2", "s3"], ["tb"], name="t_bn"),
        helper.make_node("Relu", ["tb"], ["ty"], name="t_relu")]
    then_g = helper.make_graph(then_nodes, "then", [], [tensor("ty", [1, 4, 8, 8])])
    starts, ends = init("e_starts", np.array([0], np.int64)), init("e_ends", np.array([4], np.int64))
    else_nodes = [helper.make_node("Slice", ["outer_w", "e_starts", "e_ends"], ["ew"], name="e_slice"),
                  helper.make_node("Conv", ["x", "ew"], ["ec"], name="e_conv", pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", ["ec"], ["ey"], name="e_relu")]
    else_g = helper.make_graph(else_nodes, "else", [], [tensor("ey", [1, 4, 8, 8])], [starts, ends])
    node = helper.make_node("If", ["flag"], ["y"], name="if", then_branch=then_g, else_branch=else_g)
    outer_w = np.concatenate([W2, W2[:2]])  # 6 filters, the else branch slices the first 4
    return model([node], [tensor("x", list(X.shape)), tensor("flag", [], TensorProto.BOOL)], [tensor("y", [1, 4, 8, 8])],
                 [init("outer_w", outer_w)])


@pytest.mark.parametrize("flag", [True, False])
def test_bodies_are_optimized_and_agree(flag):
    m = _branchy_model()
    feeds = {"x": X, "flag": np.array(flag)}
    sess = glassrt.InferenceSession(m)
    np.testing.assert_allclose(sess.run(None, feeds)[0], _ort(m, feeds)[0], rtol=1e-4, atol=1e-4)
    plain = glassrt.InferenceSession(m, sess_options=glassrt.SessionOptions(graph_optimization_level="none"))
    np.testing.assert_allclose(sess.run(None, feeds)[0], plain.run(None, feeds)[0], rtol=1e-5, atol=1e-5)
    bodies = sess.placement.subgraphs["if"]
    then_ops = [n.op_type for n in bodies["then_branch"].graph.nodes]
    else_ops = [n.op_type for n in bodies["else_branch"].graph.nodes]
    assert then_ops == ["FusedConv"], then_ops  # Constants folded, BN into the conv, Relu fused
    assert else_ops == ["FusedConv"], else_ops  # the outer weight captured, its Slice folded
    assert all(d.provider == "onednn" for b in bodies.values() for d in b.decisions.values())
    names = [r.name for r in sess.passes]
    assert "fold_batchnorm_into_conv in if.then_branch" in names
    assert "fold_constants in if.else_branch" in names
    # the outer weight is read through a name of the body's own (ONNX forbids redefining outer names)
    else_body = bodies["else_branch"].graph
    assert "outer_w" not in else_body.initializers
    # ... so the branch no longer reads it from outside: neither it nor the If is fed it per run
    assert else_body.outer_names == ["x"], else_body.outer_names
    if_node = next(n for n in sess.graph.nodes if n.op_type == "If")
    assert if_node.implicit_inputs == ["x"], if_node.implicit_inputs
    loaded = next(n for n in onnx_io.load(m).nodes if n.op_type == "If")  # (as the file has it)
    assert sorted(loaded.implicit_inputs) == ["outer_w", "x"], loaded.implicit_inputs


def test_optimized_bodies_write_a_valid_model(tmp_path):
    import onnx

    m = _branchy_model()
    out = tmp_path / "opt.onnx"
    glassrt.InferenceSession(m, sess_options=glassrt.SessionOptions(optimized_model_filepath=str(out)))
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    feeds = {"x": X, "flag": np.array(False)}
    again = glassrt.InferenceSession(str(out)).run(None, feeds)[0]
    np.testing.assert_allclose(again, _ort(m, feeds)[0], rtol=1e-4, atol=1e-4)


def _guarded_model(guard_name="if"):
    """y = x * 2 where x's second dim is 4 (the If a shape guard), else Squeeze(x, 1), which
    the shapes fed here could not run: only the taken branch may be typed."""
    shape = helper.make_node("Shape", ["x"], ["s"], name="shape")
    dim = helper.make_node("Gather", ["s", "one"], ["d"], name="dim", axis=0)
    eq = helper.make_node("Equal", ["d", "four"], ["c"], name="eq")
    then_g = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["ty"], name="t_mul")], "then", [],
                               [tensor("ty", None)])
    else_g = helper.make_graph([helper.make_node("Squeeze", ["x", "one_v"], ["ey"], name="e_sq")], "else", [],
                               [tensor("ey", None)])
    node = helper.make_node("If", ["c"], ["y"], name=guard_name, then_branch=then_g, else_branch=else_g)
    return model([shape, dim, eq, node], [tensor("x", ["n", "k"])], [tensor("y", None)],
                 [init("one", np.array(1, np.int64)), init("four", np.array(4, np.int64)),
                  init("two", np.array(2.0, np.float32)), init("one_v", np.array([1], np.int64))])


def test_a_shape_guard_runs_as_the_branch_taken():
    m = _guarded_model()
    sess = glassrt.InferenceSession(m)
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], x * 2)
    plan = sess.runner.plan_for({"x": x})
    assert plan.inlined == (("if", "then_branch"),)
    assert "If" not in [st.node.op_type for st in plan.steps]
    x1 = RNG.standard_normal((3, 1)).astype(np.float32)  # the other branch, in a plan of its own
    np.testing.assert_allclose(sess.run(None, {"x": x1})[0], _ort(m, {"x": x1})[0])
    assert sess.runner.plan_for({"x": x1}).inlined == (("if", "else_branch"),)


def test_an_if_on_a_value_fed_at_run_time_stays_an_if():
    m = _branchy_model()
    sess = glassrt.InferenceSession(m)
    feeds = {"x": X, "flag": np.array(True)}
    sess.run(None, feeds)
    plan = sess.runner.plan_for(feeds)
    assert plan.inlined == () and [st.node.op_type for st in plan.steps] == ["If"]


def test_a_branch_whose_names_are_taken_is_not_inlined():
    m = _guarded_model()
    m.graph.node[0].name = "t_mul"  # the then branch's Mul has this node name too
    sess = glassrt.InferenceSession(m)
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], x * 2)
    assert sess.runner.plan_for({"x": x}).inlined == ()


def test_if_typing_with_one_failing_branch_and_an_unknown_condition():
    """The condition fed at run time; the plan's shapes (3, 4) are static, and the else
    branch (Squeeze of a dim of 4) cannot run on them. Typing it no longer fails the plan:
    the then branch's types stand, a run taking it works, and a run taking the other fails
    there, naming its node. (A branch that fails on the declared static shapes themselves
    loads too: the next test.)"""
    then_g = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["ty"], name="t_mul")], "then", [],
                               [tensor("ty", None)])
    else_g = helper.make_graph([helper.make_node("Squeeze", ["x", "one_v"], ["ey"], name="e_sq")], "else", [],
                               [tensor("ey", None)])
    node = helper.make_node("If", ["flag"], ["y"], name="if", then_branch=then_g, else_branch=else_g)
    m = model([node], [tensor("x", ["n", "k"]), tensor("flag", [], TensorProto.BOOL)], [tensor("y", None)],
              [init("two", np.array(2.0, np.float32)), init("one_v", np.array([1], np.int64))])
    sess = glassrt.InferenceSession(m)
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x, "flag": np.array(True)})[0], x * 2)
    t = sess.runner.plan_for({"x": x, "flag": np.array(True)}).types["y"]
    assert isinstance(t, TensorType) and t.shape == (3, 4)
    with pytest.raises(glassrt.GlassrtError, match="e_sq"):
        sess.run(None, {"x": x, "flag": np.array(False)})


@pytest.mark.parametrize("op", ["If", "Loop"])
def test_a_body_that_cannot_run_on_the_declared_shapes_fails_only_when_it_runs(op):
    """A guard's branch (or a loop body) that cannot run on the model's declared static shapes
    (a Reshape of (2, 3) into 7 values) loads, as onnxruntime loads it: the run that takes
    the other branch (or no iteration) works, and the one that runs it fails there, naming
    its node, with onnxruntime failing too."""
    good = helper.make_graph([helper.make_node("Reshape", ["x", "six"], ["gy"], name="g_reshape")], "good", [],
                             [tensor("gy", None)])
    bad_nodes = [helper.make_node("Reshape", ["x", "seven"], ["by"], name="bad_reshape")]
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    inits = [init("six", np.array([6], np.int64)), init("seven", np.array([7], np.int64))]
    if op == "If":
        bad = helper.make_graph(bad_nodes, "bad", [], [tensor("by", None)])
        node = helper.make_node("If", ["flag"], ["y"], name="guard", then_branch=good, else_branch=bad)
        m = model([node], [tensor("x", [2, 3]), tensor("flag", [], TensorProto.BOOL)], [tensor("y", None)], inits)
        works, fails = {"x": x, "flag": np.array(True)}, {"x": x, "flag": np.array(False)}
        want = x.reshape(6)
    else:  # (a carried value: what a loop of no iterations returns is then its input)
        body = helper.make_graph(bad_nodes + [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep"),
                                              helper.make_node("ReduceSum", ["by"], ["s"], name="total", keepdims=0),
                                              helper.make_node("Add", ["v_in", "s"], ["v_out"], name="acc")],
                                 "body", [tensor("i", [], TensorProto.INT64), tensor("cond_in", [], TensorProto.BOOL),
                                          tensor("v_in", [])],
                                 [tensor("cond_out", [], TensorProto.BOOL), tensor("v_out", [])])
        node = helper.make_node("Loop", ["trips", "", "v0"], ["y"], name="loop", body=body)
        m = model([node], [tensor("x", [2, 3]), tensor("trips", [], TensorProto.INT64)], [tensor("y", None)],
                  inits + [init("v0", np.array(1.5, np.float32))])
        works, fails = {"x": x, "trips": np.array(0, np.int64)}, {"x": x, "trips": np.array(2, np.int64)}
        want = np.array(1.5, np.float32)
    sess = glassrt.InferenceSession(m)
    got = sess.run(None, works)[0]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, _ort(m, works)[0])
    with pytest.raises(glassrt.GlassrtError, match="bad_reshape"):
        sess.run(None, fails)
    with pytest.raises(Exception):
        _ort(m, fails)


def test_comparisons_and_logic_propagate_known_values():
    from glassrt import onnx_io

    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Size", ["s"], ["n"]),
             helper.make_node("Equal", ["n", "two"], ["e"]), helper.make_node("Not", ["e"], ["ne"]),
             helper.make_node("Less", ["n", "two"], ["lt"]), helper.make_node("Or", ["ne", "lt"], ["o"]),
             helper.make_node("Div", ["neg7", "two"], ["q"])]
    m = model(nodes, [tensor("x", ["a", "b"])], [tensor(v, None, TensorProto.BOOL) for v in ("e", "ne", "o")]
              + [tensor("q", None, TensorProto.INT64)],
              [init("two", np.array(2, np.int64)), init("neg7", np.array(-7, np.int64))])
    inf = infer(onnx_io.from_proto(m, None), {"x": TensorType(np.dtype(np.float32), (1, 128))})
    assert bool(inf.values["e"]) is True and bool(inf.values["ne"]) is False and bool(inf.values["o"]) is False
    assert int(inf.values["q"]) == -3  # ONNX truncates toward zero (not -4)


def test_pad_borders_match_numpy():
    from types import SimpleNamespace

    from glassrt.kernels.cpu.shape import pad

    for mode in ("reflect", "edge", "wrap", "constant"):
        for shape in [(5,), (3, 4), (2, 3, 4)]:
            for _ in range(10):
                r = len(shape)
                pads = [int(v) for v in RNG.integers(0, 4, 2 * r)]
                x = RNG.standard_normal(shape).astype(np.float32)
                width = [(pads[i], pads[i + r]) for i in range(r)]
                try:
                    want = np.pad(x, width, mode=mode)
                except ValueError:
                    continue
                # the pads computed per run, and known when the step is bound (its geometry kept)
                for known in (None, np.array(pads)):
                    step = pad(SimpleNamespace(attrs={"mode": mode}, opset=18, has=lambda i: i < 2,
                                               const=lambda i, known=known: known if i == 1 else None))
                    for out in (None, np.empty(want.shape, np.float32), np.empty(want.shape, np.float32)):
                        np.testing.assert_array_equal(step(x, np.array(pads), out=out), want)


def test_pad_keeps_one_geometry_per_shape_and_crops():
    """The bound Pad keeps its geometry per input shape: a new shape, or negative pads that
    crop, are worked out anew, never taken from another shape's."""
    from types import SimpleNamespace

    from glassrt.kernels.cpu.shape import pad

    step = pad(SimpleNamespace(attrs={"mode": "reflect"}, opset=18, has=lambda i: i < 2,
                               const=lambda i: np.array([0, 2, 0, -1]) if i == 1 else None))
    for shape in [(2, 5), (3, 7), (2, 5)]:
        x = RNG.standard_normal(shape).astype(np.float32)
        want = np.pad(x[:, :-1], [(0, 0), (2, 0)], mode="reflect")
        np.testing.assert_array_equal(step(x, None), want)
        np.testing.assert_array_equal(step(x, None, out=np.empty(want.shape, np.float32)), want)


def test_explain_says_why_made_up_dims_have_no_plan():
    """Dims nobody named are taken as 1 to plan; a model that cannot run on those (a 64-wide
    conv over one sample) is still explained, the plan's absence said."""
    w = RNG.standard_normal((2, 1, 64)).astype(np.float32)
    m = model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")],
              [tensor("x", [1, 1, None])], [tensor("y", None)], [init("w", w)])
    report = glassrt.InferenceSession(m).explain()
    assert "taken as 1" in report["summary"]["plan_error"]
    assert report["nodes"][0]["name"] == "conv"


def test_a_wide_conv_over_a_symbolic_length_is_placed_on_onednn():
    """Judged on a stand-in length of 32 a 256-wide conv has no output; placement tries a
    larger stand-in before refusing (each plan re-checks its own shapes)."""
    w = (RNG.standard_normal((8, 1, 256)) / 16).astype(np.float32)
    m = model([helper.make_node("Conv", ["x", "w"], ["y"], name="stft", strides=[128])],
              [tensor("x", [1, 1, "samples"])], [tensor("y", None)], [init("w", w)])
    sess = glassrt.InferenceSession(m)
    assert sess.placement.decisions["stft"].provider == "onednn"
    x = RNG.standard_normal((1, 1, 640)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], _ort(m, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_int_gemm_is_exact_for_8_bit_data():
    """int_gemm's float32 GEMMs over slices of 256 give the exact int32 product, for every
    combination of signedness, zero points per tensor / row / column, 1-D operands and
    inner dimensions across the slice boundary."""
    from glassrt.kernels.int_gemm import centered, int_matmul

    for trial in range(150):
        ta, tb = RNG.choice([np.uint8, np.int8], 2)
        ia, ib = np.iinfo(ta), np.iinfo(tb)
        m, n = int(RNG.integers(1, 5)), int(RNG.integers(1, 6))
        k = int(RNG.choice([0, 1, 255, 256, 257, 600]))
        a_shape = [[m, k], [k], [2, m, k]][trial % 3]
        b_shape = [k] if trial % 7 == 0 else [k, n]
        a = RNG.integers(ia.min, ia.max + 1, a_shape).astype(ta)
        b = RNG.integers(ib.min, ib.max + 1, b_shape).astype(tb)
        za = RNG.integers(ia.min, ia.max + 1, (m, 1)).astype(ta) if len(a_shape) == 2 and trial % 2 else ta(5)
        zb = RNG.integers(ib.min, ib.max + 1, n).astype(tb) if len(b_shape) == 2 and trial % 3 else tb(7)
        want = np.asarray(np.matmul(a.astype(np.int64) - np.asarray(za, np.int64),
                                    b.astype(np.int64) - np.asarray(zb, np.int64))).astype(np.int32)
        for bb in (b, centered(b, zb)):
            got = int_matmul(a, za, bb, zb)
            assert got.dtype == np.int32 and got.shape == want.shape and np.array_equal(got, want)


@pytest.mark.parametrize("with_state,want_y", [(False, True), (True, True), (True, False)])
def test_the_plain_lstm_path_agrees(with_state, want_y, monkeypatch):
    """One forward direction with the default activations takes the short path
    (kernels/cpu/rnn.py _plain_lstm); it agrees with onnxruntime."""
    t, n, i, h = 5, 3, 7, 6
    x = RNG.standard_normal((t, n, i)).astype(np.float32)
    w = (RNG.standard_normal((1, 4 * h, i)) / 3).astype(np.float32)
    r = (RNG.standard_normal((1, 4 * h, h)) / 3).astype(np.float32)
    b = RNG.standard_normal((1, 8 * h)).astype(np.float32)
    inputs = ["x", "w", "r", "b", ""] + (["h0", "c0"] if with_state else [])
    outputs = (["y"] if want_y else [""]) + ["yh", "yc"]
    inits = [init("w", w), init("r", r), init("b", b)]
    if with_state:
        inits += [init("h0", RNG.standard_normal((1, n, h)).astype(np.float32)),
                  init("c0", RNG.standard_normal((1, n, h)).astype(np.float32))]
    node = helper.make_node("LSTM", inputs, outputs, name="lstm", hidden_size=h)
    m = model([node], [tensor("x", [t, n, i])], [tensor(o, None) for o in outputs if o], inits)
    from glassrt.kernels.cpu import rnn

    taken, plain = [], rnn._plain_lstm
    monkeypatch.setattr(rnn, "_plain_lstm", lambda *a: taken.append(1) or plain(*a))
    got = glassrt.InferenceSession(m, providers=["cpu"]).run(None, {"x": x})
    assert taken, "the short path was not taken"
    for g, want in zip(got, _ort(m, {"x": x})):
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5)


def test_a_body_is_inferred_once_per_scope_while_a_session_is_made():
    """While subgraph_memo() is open (a session's creation, a plan's compilation), a body's
    inference is kept per body and per what it reads from its scope: asked again with equal
    outer types and values (a small value by its contents) it is answered from the memo; an
    outer value that differs, or no memo, infers it again."""
    from glassrt import onnx_io
    from glassrt.runtime.infer import infer_body, subgraph_memo

    m = helper.make_model(helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=helper.make_graph(
            [helper.make_node("Reshape", ["x", "shape"], ["t"])], "then", [], [helper.make_tensor_value_info(
                "t", TensorProto.FLOAT, None)]), else_branch=helper.make_graph(
            [helper.make_node("Identity", ["x"], ["e"])], "else", [], [helper.make_tensor_value_info(
                "e", TensorProto.FLOAT, None)]))],
        "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
              helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
              helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]), opset_imports=[helper.make_opsetid("", 17)])
    body = onnx_io.from_proto(m, None).nodes[0].attrs["then_branch"]
    types = {"x": TensorType(np.dtype(np.float32), (2, 6)), "shape": TensorType(np.dtype(np.int64), (2,))}
    with subgraph_memo():
        a = infer_body(body, {}, types, {"shape": np.array([3, 4])})
        b = infer_body(body, {}, dict(types), {"shape": np.array([3, 4])})  # equal contents, another array
        c = infer_body(body, {}, types, {"shape": np.array([4, 3])})
    assert a is b and a.types["t"].shape == (3, 4) and c.types["t"].shape == (4, 3)
    assert infer_body(body, {}, types, {"shape": np.array([3, 4])}) is not a  # no memo open: inferred again


def _growing_loop(trips: int):
    """Loop: acc = Concat(acc, x * i) each iteration (the carried value grows: its shape
    changes every iteration), y_scan = ReduceSum(acc) per iteration, x read from outside."""
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT, name="cast"),
         helper.make_node("Mul", ["x", "fi"], ["xi"], name="mul"),
         helper.make_node("Concat", ["acc_in", "xi"], ["acc_out"], axis=0, name="cat"),
         helper.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0, name="sum"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], name="id")],
        "body", [tensor("i", [], TensorProto.INT64), tensor("cond_in", [], TensorProto.BOOL), tensor("acc_in", None)],
        [tensor("cond_out", [], TensorProto.BOOL), tensor("acc_out", None), tensor("total", [])])
    node = helper.make_node("Loop", ["trips", "", "acc0"], ["acc", "totals"], body=body, name="loop")
    return model([node], [tensor("x", [2]), tensor("acc0", [0]), tensor("trips", [], TensorProto.INT64)],
                 [tensor("acc", None), tensor("totals", None)])


def test_a_loop_whose_carried_value_grows_keeps_one_plan_per_shape_and_checks_them_in():
    """The iterations run through GraphRunner.repeated: a new feed shape takes another plan,
    and after the node (finished or failed) no body plan stays checked out."""
    m = _growing_loop(4)
    x, acc0 = np.array([1.0, 2.0], np.float32), np.zeros(0, np.float32)
    sess = glassrt.InferenceSession(m.SerializeToString())
    for _ in range(2):
        got = sess.run(None, {"x": x, "acc0": acc0, "trips": np.array(4, np.int64)})
        want = _ort(m, {"x": x, "acc0": acc0, "trips": np.array(4, np.int64)})
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w)
    (body,) = [r for _, r in sess.runner._sub_runners.values()]
    assert len(body.plans) >= 2 and not body._busy  # (one plan per acc length seen, all checked in)
    with pytest.raises(glassrt.GlassrtError):
        sess.run(None, {"x": np.ones(3, np.float32), "acc0": np.zeros((1, 2), np.float32),
                        "trips": np.array(2, np.int64)})
    assert not body._busy


def test_a_scans_iterations_check_their_body_plan_out_once(monkeypatch):
    """A Scan over rows of one shape checks its body's plan out once per node run, not once
    per iteration (GraphRunner.repeated), and gives onnxruntime's result. (Its state
    accumulates: iterations that were independent would run all at once, scan_batched.py.)"""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "row"], ["s_out"], name="acc"),
         helper.make_node("Sub", ["s_in", "row"], ["d"], name="sub"),
         helper.make_node("ReduceSumSquare", ["d"], ["dist"], keepdims=0, name="ssq")],
        "body", [tensor("s_in", [4]), tensor("row", [4])], [tensor("s_out", [4]), tensor("dist", [])])
    node = helper.make_node("Scan", ["x", "rows"], ["x_out", "dists"], body=body, num_scan_inputs=1, name="scan")
    m = model([node], [tensor("x", [4]), tensor("rows", [30, 4])], [tensor("x_out", None), tensor("dists", None)])
    sess = glassrt.InferenceSession(m.SerializeToString())
    feeds = {"x": RNG.standard_normal(4).astype(np.float32), "rows": RNG.standard_normal((30, 4)).astype(np.float32)}
    sess.run(None, feeds)  # (compiles the plans)
    (body_runner,) = [r for _, r in sess.runner._sub_runners.values()]
    checkouts = []
    real = body_runner._checkout
    monkeypatch.setattr(body_runner, "_checkout", lambda f: (checkouts.append(1), real(f))[1])
    got = sess.run(None, feeds)
    assert len(checkouts) == 1 and not body_runner._busy
    for g, w in zip(got, _ort(m, feeds)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_an_ifs_branch_plan_is_held_across_runs_while_its_feeds_keep_their_shapes(monkeypatch):
    """An If checks each branch's plan out once and keeps it while what the branch reads
    keeps its shapes (runner.HeldPlan): no signature, check-out and check-in per run; a new
    shape checks the old plan in. Results as onnxruntime's, whichever branch runs."""
    w = RNG.standard_normal((4, 3)).astype(np.float32)
    then_g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["tm"], name="t_mm"),
                                helper.make_node("Relu", ["tm"], ["ty"], name="t_relu")],
                               "then", [], [tensor("ty", None)])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["ey"], name="e_neg")], "else", [], [tensor("ey", None)])
    node = helper.make_node("If", ["flag"], ["y"], name="if", then_branch=then_g, else_branch=else_g)
    m = model([node], [tensor("x", ["n", 4]), tensor("flag", [], TensorProto.BOOL)], [tensor("y", None)],
              [init("w", w)])
    sess = glassrt.InferenceSession(m.SerializeToString())
    sess.run(None, {"x": np.ones((2, 4), np.float32), "flag": np.array(True)})
    runners = {r.placement.graph.name: r for _, r in sess.runner._sub_runners.values()}
    checkouts = []
    for r in runners.values():
        real = r._checkout
        monkeypatch.setattr(r, "_checkout", lambda f, real=real: (checkouts.append(1), real(f))[1])
    for k in range(12):
        rows = 2 if k < 8 else 5
        feeds = {"x": RNG.standard_normal((rows, 4)).astype(np.float32), "flag": np.array(k % 2 == 0)}
        np.testing.assert_allclose(sess.run(None, feeds)[0], _ort(m, feeds)[0], rtol=1e-5, atol=1e-5)
    assert len(checkouts) == 1 + 2  # the else branch's first plan, then each branch's plan for 5 rows
    assert all(len(r._busy) == 2 for r in runners.values())  # each plan of the model (2 rows, 5 rows) holds its own
