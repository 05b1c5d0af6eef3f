"""glassrt::ChannelShuffle (passes/fuse_shuffle.py): ShuffleNet's Reshape → Transpose →
Reshape becomes one node that oneDNN runs inside its NHWC region; same numbers; it does
not fire on other Transposes or shapes."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import helper

import glassrt
from glassrt.kernels.onednn import capi

from .helpers import init, model, tensor

RNG = np.random.default_rng(0)


def _shuffle_model(groups=4, channels=16, perm=(0, 2, 1, 3, 4), split=None):
    w1 = RNG.standard_normal((channels, 8, 3, 3)).astype(np.float32) * 0.2
    w2 = RNG.standard_normal((8, channels, 1, 1)).astype(np.float32) * 0.2
    split = split or [0, groups, channels // groups, 6, 6]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Reshape", ["c1", "split"], ["g"], name="split"),
             helper.make_node("Transpose", ["g"], ["t"], perm=list(perm), name="swap"),
             helper.make_node("Reshape", ["t", "merge"], ["s"], name="merge"),
             helper.make_node("Conv", ["s", "w2"], ["y"], name="conv2")]
    inits = [init("w1", w1), init("w2", w2), init("split", np.array(split, np.int64)),
             init("merge", np.array([0, channels, 6, 6], np.int64))]
    return model(nodes, [tensor("x", ["n", 8, 6, 6])], [tensor("y", None)], inits, opset=13)


def _run(m, providers, x, **options):
    so = glassrt.SessionOptions()
    for k, v in options.items():
        setattr(so, k, v)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = glassrt.InferenceSession(m.SerializeToString(), so, providers=providers)
    return s, s.run(None, {"x": x})[0]


@pytest.mark.parametrize("providers", [["cpu"], pytest.param(None, marks=pytest.mark.skipif(
    capi.UNAVAILABLE is not None, reason="oneDNN unavailable"))], ids=["cpu", "default"])
def test_a_channel_shuffle_is_one_node_with_the_same_result(providers):
    m = _shuffle_model()
    x = RNG.standard_normal((2, 8, 6, 6)).astype(np.float32)
    s, fused = _run(m, providers, x)
    ops = {n["name"]: (n["op"], n["kernel"]) for n in s.explain()["nodes"]}
    assert ops["merge"][0] == "ChannelShuffle" and "split" not in ops and "swap" not in ops
    if providers is None:
        assert ops["merge"][1] == "onednn.ChannelShuffle.shuffle"
        assert s.explain()["summary"]["layouts"]["nhwc_values"] >= 2  # conv1 → shuffle → conv2 stay NHWC
    _, plain = _run(m, ["cpu"], x, graph_optimization_level="basic")
    np.testing.assert_allclose(fused, plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("perm, split", [((0, 1, 2, 4, 3), None), ((0, 2, 1, 3, 4), [0, 4, 4, 36, 1])],
                         ids=["other-transpose", "other-split"])
def test_other_reshapes_and_transposes_are_left_alone(perm, split):
    m = _shuffle_model(perm=perm, split=split)
    if split:  # (n, 4, 4, 36, 1) → swap → (n, 4, 4, 36, 1): not the (n, g, C/g, H, W) pattern
        m.graph.node[3].input[1] = "merge"
    x = RNG.standard_normal((1, 8, 6, 6)).astype(np.float32)
    s, _ = _run(m, ["cpu"], x)
    assert "ChannelShuffle" not in {n["op"] for n in s.explain()["nodes"]}


def test_channel_shuffle_contract_refuses_groups_that_do_not_divide():
    m = model([helper.make_node("ChannelShuffle", ["x"], ["y"], domain="glassrt", group=3)],
              [tensor("x", [1, 8, 2, 2])], [tensor("y", None)], opset=13, domains={"glassrt": 1})
    with pytest.raises(glassrt.ShapeInferenceError, match="8 channels do not split into 3 groups"):
        glassrt.InferenceSession(m)
