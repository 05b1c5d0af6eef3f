"""A replayed plan runs as one compiled function (glassrt/runtime/straight.py): the same
outputs as the step loop, the same errors, every kind of step, nothing from the model in
the compiled source."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import glassrt
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
             helper.make_node("Split", ["r"], ["a", "b"], axis=1, num_outputs=2),
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
