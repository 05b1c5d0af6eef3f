"""1-D convolutions and (k, 1) columns on oneDNN (kernels/onednn/kernels.py `_geometry`): a
1-D conv runs as the 2-D conv of height 1, a column as the row of its transpose, over the
same bytes; a chain of 1-D convs keeps its values channels-last (N, W, C) between them
(runtime/layout.py). Each checked against onnxruntime and glassrt's own cpu kernels."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

import glassrt

from .helpers import init, model, tensor

RNG = np.random.default_rng(7)


def _ort(m, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _check(m, feeds, expect_onednn):
    sess = glassrt.InferenceSession(m)
    got = sess.run(None, feeds)
    cpu = glassrt.InferenceSession(m, providers=["cpu"]).run(None, feeds)
    for g, w, c in zip(got, _ort(m, feeds), cpu):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(g, c, rtol=1e-4, atol=1e-4)
    kernels = {r["name"]: r["kernel"] for r in sess.explain()["nodes"]}
    for name in expect_onednn:
        assert kernels[name].startswith("onednn."), kernels
    return sess


CASES = [  # (x shape, w shape, attributes)
    ((1, 4, 50), (8, 4, 3), {}),
    ((2, 3, 31), (6, 3, 5), {"pads": [2, 1], "strides": [2]}),
    ((1, 8, 40), (8, 1, 3), {"group": 8, "pads": [1, 1]}),  # depthwise
    ((1, 1, 576), (32, 1, 256), {"strides": [128]}),  # an STFT as audio models write it
    ((1, 6, 20), (4, 6, 3), {"dilations": [2], "pads": [2, 2]}),
]


@pytest.mark.parametrize("x_shape,w_shape,attrs", CASES)
def test_a_1d_conv_runs_on_onednn_and_agrees(x_shape, w_shape, attrs):
    x = RNG.standard_normal(x_shape).astype(np.float32)
    w = (RNG.standard_normal(w_shape) / 4).astype(np.float32)
    b = RNG.standard_normal(w_shape[0]).astype(np.float32)
    m = model([helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", **attrs)],
              [tensor("x", list(x_shape))], [tensor("y", None)], [init("w", w), init("b", b)])
    _check(m, {"x": x}, ["conv"])


def test_a_chain_of_1d_convs_stays_channels_last_between_them():
    x = RNG.standard_normal((1, 16, 12)).astype(np.float32)
    ws = [(RNG.standard_normal((16, 16, 3)) / 8).astype(np.float32) for _ in range(3)]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="c0", pads=[1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"], name="r0"),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], name="c1", pads=[1, 1]),
             helper.make_node("Add", ["c1", "r0"], ["a1"], name="res"),  # fused as the conv's residual
             helper.make_node("Conv", ["a1", "w2"], ["y"], name="c2", pads=[1, 1])]
    m = model(nodes, [tensor("x", [1, 16, 12])], [tensor("y", None)], [init(f"w{i}", w) for i, w in enumerate(ws)])
    sess = _check(m, {"x": x}, ["c0", "c1", "c2"])
    plan = next(iter(sess.runner.plans.values()))
    assert set(plan.layouts) == {"r0", "a1"} and set(plan.layouts.values()) == {"nhwc"}


def test_a_column_conv_runs_as_a_row():
    """magika's (1, 256, 512, 1) conv with a (5, 1) kernel: 6.5 ms as a column, 1.7 as a row."""
    x = RNG.standard_normal((1, 8, 40, 1)).astype(np.float32)
    w = (RNG.standard_normal((12, 8, 5, 1)) / 4).astype(np.float32)
    m = model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[2, 0, 2, 0], strides=[2, 3])],
              [tensor("x", [1, 8, 40, 1])], [tensor("y", None)], [init("w", w)])
    _check(m, {"x": x}, ["conv"])


def test_a_column_with_width_pads_is_not_turned():
    """Pads along the width give it more than one column: the conv is not a column then."""
    from glassrt.kernels.onednn.kernels import _geometry

    g = _geometry((1, 8, 40, 1), (12, 8, 5, 1), None, None, None, (2, 1, 2, 1), "NOTSET")
    assert g[0] == (1, 8, 40, 1) and g[5] == (1, 12, 40, 3)
    turned = _geometry((1, 8, 40, 1), (12, 8, 5, 1), None, None, None, (2, 0, 2, 0), "NOTSET")
    assert turned[0] == (1, 8, 1, 40) and turned[2] == (1, 5) and turned[5] == (1, 12, 1, 40)


@pytest.mark.parametrize("first_from_conv", [False, True])
def test_an_add_between_layouts_stays_off_the_reference_kernel(first_from_conv):
    """oneDNN's binary has jit kernels only where src0 and dst share a layout: two NCHW
    inputs into an NHWC output (rapidocr-det's FPN) ran its reference kernel, 7.2 ms at
    (1, 24, 80, 112). The input in the output's layout goes first; with none, the add writes
    the inputs' layout and a reorder the output's."""
    x = RNG.standard_normal((1, 8, 20, 24)).astype(np.float32)
    w = (RNG.standard_normal((8, 8, 3, 3)) / 8).astype(np.float32)
    nodes = [helper.make_node("Sin", ["x"], ["a"], name="a"),  # cpu: NCHW
             (helper.make_node("Conv", ["x", "w"], ["b"], name="b", pads=[1, 1, 1, 1]) if first_from_conv
              else helper.make_node("Cos", ["x"], ["b"], name="b")),
             helper.make_node("Add", ["b", "a"] if first_from_conv else ["a", "b"], ["s"], name="add"),
             helper.make_node("Conv", ["s", "w"], ["y"], name="conv", pads=[1, 1, 1, 1]),  # reads s in NHWC
             helper.make_node("Relu", ["b"], ["r"], name="relu")]  # b read twice: the Add is not fused into b's conv
    m = model(nodes, [tensor("x", list(x.shape))], [tensor("y", None), tensor("r", None)],
              [init("w", w)])
    sess = _check(m, {"x": x}, ["add", "conv"])
    plan = next(iter(sess.runner.plans.values()))
    assert plan.layouts.get("s") == "nhwc" and plan.layouts.get("a") is None
    step = next(st for st in plan.steps if st.node.name == "add")
    main, _ = _built(step)
    assert not main.pd.impl.startswith("ref"), main.pd.impl


def _built(step):
    """The bound primitives of an onednn Add step (its closure's _PerThreads)."""
    for cell in step.fn.__closure__:
        v = cell.cell_contents
        if type(v).__name__ == "_PerThreads":
            return v.get()
    raise AssertionError("no primitives found")
