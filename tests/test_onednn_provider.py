"""The `onednn` provider (kernels/onednn/kernels.py): oneDNN primitives placed like any
provider's kernels, NHWC between its own nodes (runtime/layout.py), results equal to
glassrt's cpu kernels and to onnxruntime. Skipped where the oneDNN library is missing."""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import helper

import glassrt
from glassrt.kernels.onednn import capi
from glassrt.tools import light_models as lm

from .helpers import init, model, tensor

pytestmark = pytest.mark.skipif(capi.UNAVAILABLE is not None, reason=f"oneDNN: {capi.UNAVAILABLE}")


def _sessions(m):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return (glassrt.InferenceSession(m, providers=["onednn", "cpu"]),
                glassrt.InferenceSession(m, providers=["cpu"]))


@pytest.mark.parametrize("name", ["squeezenet", "densenet121", "inception_v1", "bvlc_alexnet"])
def test_light_models_match_the_cpu_kernels(name):
    m = lm.randomize_weights(onnx.load(lm.path(name)), seed=1)
    x_name, shape = lm.input_shape(m)
    x = np.random.default_rng(2).random(shape, dtype=np.float32)
    fast, cpu = _sessions(m)
    report = fast.explain()
    assert report["summary"]["nodes_per_provider"].get("onednn", 0) >= 10
    assert report["summary"]["layouts"]["nhwc_values"] >= 5
    for _ in range(2):  # a replay reuses the bound primitives and the arena
        a, b = fast.run(None, {x_name: x})[0], cpu.run(None, {x_name: x})[0]
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_a_region_meets_plain_values_at_its_edges():
    """conv → pool → conv (all oneDNN: NHWC inside) → Reshape (cpu: the pool before it writes
    NCHW), a residual read by a conv from a graph input, and the region's values as graph
    outputs: every layout change happens inside a oneDNN kernel, and the numbers agree."""
    rng = np.random.default_rng(0)
    w1 = init("w1", rng.standard_normal((16, 3, 3, 3)).astype(np.float32) * 0.2)
    w2 = init("w2", rng.standard_normal((16, 16, 1, 1)).astype(np.float32) * 0.2)
    nodes = [helper.make_node("Conv", ["x", w1.name], ["c1"], pads=[1, 1, 1, 1], name="c1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="r1"),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="p1"),
             helper.make_node("Conv", ["p1", w2.name], ["c2"], name="c2"),
             helper.make_node("Add", ["c2", "p1"], ["s"], name="add"),
             helper.make_node("GlobalAveragePool", ["s"], ["g"], name="gap"),
             helper.make_node("Reshape", ["g", "shape"], ["y"], name="flat")]
    m = model(nodes, [tensor("x", [2, 3, 8, 8])], [tensor("y", None), tensor("r1", None)],
              [w1, w2, init("shape", np.array([2, -1], np.int64))], opset=17)
    fast, cpu = _sessions(m)
    layouts = fast.placement.layouts
    assert layouts.get("p1") == "nhwc" and layouts.get("c2", layouts.get("s")) == "nhwc"
    assert "r1" not in layouts and "g" not in layouts  # a graph output; read by the cpu Reshape
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    for a, b in zip(fast.run(None, {"x": x}), cpu.run(None, {"x": x})):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    edges = fast.explain()["summary"]["layouts"]["edges"]
    assert {"value": "x", "node": "c1", "kind": "read"} in edges


def test_symbolic_shapes_go_to_the_cpu_kernels_with_a_reason():
    m = model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], [tensor("x", ["n", 3, 8, 8])],
              [tensor("y", None)], [init("w", np.ones((4, 3, 1, 1), np.float32))], opset=17)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sess = glassrt.InferenceSession(m, providers=["onednn", "cpu"])
    node = sess.explain()["nodes"][0]
    assert node["provider"] == "cpu" and "bound to concrete shapes" in node["reason"]
    y = sess.run(None, {"x": np.ones((2, 3, 8, 8), np.float32)})[0]
    np.testing.assert_allclose(y, np.full((2, 4, 8, 8), 3.0))
