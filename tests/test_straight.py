"""A replayed plan runs as one compiled function (glassrt/runtime/straight.py): the same
outputs as the step loop, the same errors, every kind of step, nothing from the model in
the compiled source."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import glassrt
from glassrt.runtime import plan as plan_module
from glassrt.runtime.plan import STRAIGHT_AFTER
from glassrt.tools import light_models


def _compiled(sess) -> list:
    return [p.straight is not None for p in sess.runner.plans.values()]


@pytest.mark.parametrize("name", ["squeezenet", "shufflenet"])
def test_light_model_replays_match_the_loop_and_the_expected_output(name):
    """Shipped light models (onnx's expected outputs): the first runs go through the loop,
    the later ones through the compiled function; all bit-identical, all as expected."""
    model = onnx.load(light_models.path(name))
    x_name, shape = light_models.input_shape(model)
    feeds = {x_name: light_models.reference_input(shape)}
    sess = glassrt.InferenceSession(str(light_models.path(name)))
    runs = [sess.run(None, feeds)[0] for _ in range(STRAIGHT_AFTER + 3)]
    assert _compiled(sess) == [True]
    for r in runs[1:]:
        np.testing.assert_array_equal(r, runs[0])
    np.testing.assert_allclose(runs[-1], light_models.expected_output(name), rtol=1e-3, atol=1e-5)


def _model(nodes, inputs, outputs, inits=()):
    return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                             opset_imports=[helper.make_opsetid("", 17)])


def _vi(name, shape, elem=1):
    return helper.make_tensor_value_info(name, elem, shape)


def test_every_kind_of_step_and_the_same_results_as_the_loop():
    """Split (several outputs), a symbolic batch (outputs sized per run, pool buffers freed),
    graph outputs that are also read by later nodes, a Shape (int64) and an optional input."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Split", ["r"], ["a", "b"], axis=1),
             helper.make_node("Mul", ["a", "b"], ["m"]),
             helper.make_node("Shape", ["m"], ["s"]),
             helper.make_node("Clip", ["m", "", "hi"], ["c"]),
             helper.make_node("Softmax", ["c"], ["y"], axis=-1)]
    m = _model(nodes, [_vi("x", ["n", 4])], [_vi("y", ["n", 2]), _vi("a", ["n", 2]), _vi("s", [2], 7)],
               [helper.make_tensor("hi", 1, [], [0.5])])
    sess = glassrt.InferenceSession(m.SerializeToString(), providers=["cpu"])
    rng = np.random.default_rng(0)
    for n in [3] * STRAIGHT_AFTER + [5] * (STRAIGHT_AFTER + 2) + [3, 3]:
        x = rng.standard_normal((n, 4)).astype(np.float32)
        y, a, s = sess.run(None, {"x": x})
        r = np.maximum(x, 0)
        mm = np.minimum(r[:, :2] * r[:, 2:], 0.5)
        e = np.exp(mm - mm.max(-1, keepdims=True))
        np.testing.assert_allclose(y, e / e.sum(-1, keepdims=True), rtol=1e-6)
        np.testing.assert_array_equal(a, r[:, :2])
        np.testing.assert_array_equal(s, [n, 2])
    assert any(_compiled(sess))


def test_a_kernel_error_names_the_node_as_the_loop_does():
    """An index out of range, found by the kernel at run time: the same NodeExecutionError
    from the step loop (first run) and from the compiled replays."""
    m = _model([helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Gather", ["n", "i"], ["y"], name="bad")],
               [_vi("x", [6]), _vi("i", [2], 7)], [_vi("y", [2])])
    sess = glassrt.InferenceSession(m.SerializeToString(), providers=["cpu"])
    good = {"x": np.arange(6, dtype=np.float32), "i": np.array([1, 5], np.int64)}
    bad = {"x": np.arange(6, dtype=np.float32), "i": np.array([1, 9], np.int64)}
    messages = []
    for _ in range(STRAIGHT_AFTER + 2):
        np.testing.assert_array_equal(sess.run(None, good)[0], [-1, -5])
        with pytest.raises(glassrt.NodeExecutionError) as e:
            sess.run(None, bad)
        messages.append(str(e.value))
    assert _compiled(sess) == [True]
    assert "'bad'" in messages[0] and "Gather" in messages[0]
    assert len(set(messages)) == 1, messages


def test_names_from_the_model_never_reach_the_compiled_source():
    evil = 'x"]); __import__("os").system("echo pwned"); (["'
    m = _model([helper.make_node("Neg", [evil], ["n"], name=evil), helper.make_node("Abs", ["n"], [evil + "y"])],
               [_vi(evil, [3])], [_vi(evil + "y", [3])])
    sess = glassrt.InferenceSession(m.SerializeToString(), providers=["cpu"])
    for _ in range(STRAIGHT_AFTER + 2):
        (y,) = sess.run(None, {evil: np.array([-1, 2, -3], np.float32)})
        np.testing.assert_array_equal(y, [1, 2, 3])
    assert _compiled(sess) == [True]  # the replays above ran the compiled function


def test_a_plan_with_no_steps():
    """Everything folded at load: the compiled replay has nothing to run."""
    m = _model([helper.make_node("Add", ["a", "b"], ["y"])], [], [_vi("y", [2])],
               [helper.make_tensor("a", 1, [2], [1, 2]), helper.make_tensor("b", 1, [2], [3, 4])])
    sess = glassrt.InferenceSession(m.SerializeToString(), providers=["cpu"])
    for _ in range(STRAIGHT_AFTER + 2):
        np.testing.assert_array_equal(sess.run(None, {})[0], [4, 6])
    assert _compiled(sess) == [True]


def test_an_output_that_breaks_the_meta_is_caught_in_the_replays_as_in_the_loop():
    """A kernel that allocates its own output (a custom op without `out`) and returns the
    wrong shape on one run: the compiled replay raises the loop's KernelContractError,
    naming the node and both shapes; the runs around it are unaffected."""
    op = glassrt.custom_op("ex::flaky(Tensor x) -> Tensor", dtypes=[np.float32])
    calls = []

    def kernel(x):
        calls.append(1)
        return x[:1].copy() if len(calls) in (3, STRAIGHT_AFTER + 3) else x * 2

    try:
        op.register_meta(lambda x: x)
        op.register_kernel("cpu", kernel)
        m = helper.make_model(helper.make_graph(
            [helper.make_node("flaky", ["x"], ["f"], domain="ex", name="odd"), helper.make_node("Neg", ["f"], ["y"])],
            "g", [_vi("x", [3])], [_vi("y", [3])]),
            opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ex", 1)])
        sess = glassrt.InferenceSession(m, providers=["cpu"])
        x = {"x": np.array([1, 2, 3], np.float32)}
        messages = []
        for i in range(STRAIGHT_AFTER + 4):
            if len(calls) + 1 in (3, STRAIGHT_AFTER + 3):
                with pytest.raises(glassrt.errors.KernelContractError) as e:
                    sess.run(None, x)
                messages.append(str(e.value))
            else:
                np.testing.assert_array_equal(sess.run(None, x)[0], [-2, -4, -6])
        assert _compiled(sess) == [True]
        assert len(messages) == 2 and messages[0] == messages[1], messages
        assert "'odd'" in messages[0] and "float[1]" in messages[0] and "float[3]" in messages[0]
    finally:
        op.unregister()


def test_several_outputs_in_the_replays():
    """Split into three (one output unused) and LayerNormalization's first output alone:
    written out inline, the same results as the loop's first runs."""
    nodes = [helper.make_node("Split", ["x"], ["a", "", "c"], axis=1),
             helper.make_node("LayerNormalization", ["a", "s", "b"], ["n"], axis=-1),
             helper.make_node("Add", ["n", "c"], ["y"])]
    m = _model(nodes, [_vi("x", [2, 6])], [_vi("y", [2, 2])],
               [helper.make_tensor("s", 1, [2], [1.0, 2.0]), helper.make_tensor("b", 1, [2], [0.5, -0.5])])
    sess = glassrt.InferenceSession(m.SerializeToString())
    x = {"x": np.random.default_rng(0).standard_normal((2, 6)).astype(np.float32)}
    looped = []  # the steps handed to the loop's body (all of them in the 16 runs before the replay)
    real = plan_module.execute_step
    plan_module.execute_step = lambda st, *a, **k: (looped.append(st.node.op_type), real(st, *a, **k))[1]
    try:
        runs = [sess.run(None, x)[0] for _ in range(STRAIGHT_AFTER + 3)]
    finally:
        plan_module.execute_step = real
    assert _compiled(sess) == [True]
    # the replays run every step inline: the Add's output, a small graph output, is written
    # into the arena and copied out (plan.COPIED_OUTPUT_BYTES), not made new by the loop's body
    assert looped[3 * STRAIGHT_AFTER:] == [], looped[3 * STRAIGHT_AFTER:]
    a, c = x["x"][:, :2], x["x"][:, 4:]
    expected = (a - a.mean(-1, keepdims=True)) / np.sqrt(a.var(-1, keepdims=True) + 1e-5) * [1, 2] + [0.5, -0.5] + c
    for r in runs:
        np.testing.assert_allclose(r, expected, rtol=1e-5, atol=1e-5)


def test_views_of_the_arena_are_kept_between_replays_and_others_are_made_each_run():
    """Split into contiguous pieces and Reshape by a constant, of a value the plan writes into
    its arena: made once in the replay, and still each run's values (they are views). A
    Reshape by a shape given at run time is made each run (its shape is that run's); a view
    of the caller's own array is not kept (nothing of the caller's is held between runs)."""
    import gc
    import weakref

    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Split", ["r"], ["a", "b"], axis=1),
             helper.make_node("Reshape", ["a", "flat"], ["af"]),
             helper.make_node("Mul", ["af", "two"], ["y"]),
             helper.make_node("Reshape", ["b", "shape"], ["bs"]),
             helper.make_node("Reshape", ["x", "flat"], ["xf"])]
    m = _model(nodes, [_vi("x", [1, 4]), _vi("shape", [2], 7)], [_vi("y", None), _vi("bs", None), _vi("xf", None)],
               [helper.make_tensor("flat", 7, [1], [-1]), helper.make_tensor("two", 1, [], [2.0])])
    sess = glassrt.InferenceSession(m.SerializeToString(), providers=["cpu"])
    calls = {}

    def counting(st):
        key, fn = f"{st.node.op_type}:{','.join(st.node.inputs)}", st.fn
        calls[key] = 0

        def counted(*a, **k):
            calls[key] += 1
            return fn(*a, **k)
        return counted

    rng = np.random.default_rng(5)
    for i in range(STRAIGHT_AFTER + 6):
        x = rng.standard_normal((1, 4)).astype(np.float32)
        shape = np.array([2, 1] if i % 2 else [1, 2], np.int64)
        y, bs, xf = sess.run(None, {"x": x, "shape": shape})
        r = np.maximum(x, 0)
        np.testing.assert_array_equal(y, r[0, :2] * 2)
        np.testing.assert_array_equal(bs, r[:, 2:].reshape(shape))
        np.testing.assert_array_equal(xf, x.reshape(-1))
        if i == STRAIGHT_AFTER + 1:  # compiled by now: count the view kernels' calls from here
            plan = next(iter(sess.runner.plans.values()))
            assert plan.straight is not None
            for st in plan.steps:
                if st.kernel.alias:
                    st.fn = counting(st)
            plan.straight, plan.runs = None, STRAIGHT_AFTER - 1  # compiled again at the next run
    # 4 runs: the loop's (which compiles the replay again), then the replay's first, which
    # makes the views; the next two keep them
    assert calls["Split:r"] == 2 and calls["Reshape:a,flat"] == 2, calls
    assert calls["Reshape:b,shape"] == 4 and calls["Reshape:x,flat"] == 4, calls  # made every run
    x = rng.standard_normal((1, 4)).astype(np.float32)
    ref = weakref.ref(x)
    sess.run(None, {"x": x, "shape": np.array([1, 2], np.int64)})
    del x
    gc.collect()
    assert ref() is None  # the view of the caller's input was not kept


def test_the_replays_give_back_to_the_pool_only_what_came_from_it():
    """Values freed in a replay go back to the plan's pool only where a step bound per run
    (the only kind handed pool buffers) or a view of its output made them: a static plan's
    replays never call the pool (each call a lock and a lookup, ~1.7 us a freed value); a
    NonZero's output and the Transpose viewing it still go back, every run."""
    axes = helper.make_tensor("axes", onnx.TensorProto.INT64, [1], [0])
    static = glassrt.InferenceSession(_model(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Unsqueeze", ["r", "axes"], ["u"]),
         helper.make_node("Identity", ["u"], ["i"]), helper.make_node("Squeeze", ["i", "axes"], ["s"]),
         helper.make_node("Neg", ["s"], ["y"])], [_vi("x", [4, 8])], [_vi("y", None)], [axes]), providers=["cpu"])
    feeds = {"x": np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)}
    for _ in range(STRAIGHT_AFTER + 1):
        static.run(None, feeds)
    (plan,) = static.runner.plans.values()
    assert sum(len(st.free) for st in plan.steps) >= 2  # the views are dropped as they die
    calls = []
    pool = static.runner.pool
    pool.release = lambda a, _f=pool.release: calls.append(a) or _f(a)
    np.testing.assert_array_equal(static.run(None, feeds)[0], -np.maximum(feeds["x"], 0))
    assert _compiled(static) == [True] and calls == []

    dynamic = glassrt.InferenceSession(_model(
        [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Transpose", ["nz"], ["t"]),
         helper.make_node("Cast", ["t"], ["y"], to=1)], [_vi("x", [512])], [_vi("y", None)]), providers=["cpu"])
    x = np.ones(512, np.float32)
    for _ in range(STRAIGHT_AFTER + 50):
        dynamic.run(None, {"x": x})
    stats = dynamic.memory_stats()["pool"]
    assert _compiled(dynamic) == [True] and stats["misses"] == 1 and stats["allocated_bytes"] == 0, stats
