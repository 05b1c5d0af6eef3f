"""Random graphs, compared with onnxruntime: the memory planner's reuse (in place, views,
lifetimes) and the kernels meet combinations no hand-written test thought of."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import glassrt

ort = pytest.importorskip("onnxruntime")

UNARY = ["Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Exp", "Softplus", "Identity", "Erf"]
BINARY = ["Add", "Sub", "Mul", "Max", "Min"]


def random_model(seed: int):
    """A DAG over one (B, C, H, W) input: elementwise ops (often in place), reshapes and
    transposes (views), concat/slice/reductions, matmul — with fan-out, so values live long."""
    rng = np.random.default_rng(seed)
    b, c, h, w = (int(v) for v in rng.integers(1, 5, 4))
    shape = {"x": (b, c, h, w)}
    nodes, inits, pool = [], [], ["x"]
    k = 0

    def new(op, ins, out_shape, **attrs):
        nonlocal k
        k += 1
        name = f"v{k}"
        nodes.append(helper.make_node(op, ins, [name], name=f"n{k}", **attrs))
        shape[name] = tuple(out_shape)
        pool.append(name)
        return name

    def same_shape_pair(a):
        for cand in rng.permutation(pool):
            if shape[cand] == shape[a]:
                return cand
        return a

    for _ in range(int(rng.integers(6, 16))):
        a = str(rng.choice(pool))
        kind = rng.integers(0, 9)
        s = shape[a]
        if kind <= 2:
            new(str(rng.choice(UNARY)), [a], s)
        elif kind <= 4:
            other = same_shape_pair(a) if rng.random() < 0.7 else None
            if other is None:  # broadcast against a constant of a suffix shape
                cshape = s[-int(rng.integers(1, len(s) + 1)):]
                cname = f"c{k}"
                inits.append(numpy_helper.from_array(rng.standard_normal(cshape).astype(np.float32), cname))
                other = cname
            new(str(rng.choice(BINARY)), [a, other], s)
        elif kind == 5 and len(s) >= 2:
            perm = [int(p) for p in rng.permutation(len(s))]
            new("Transpose", [a], [s[p] for p in perm], perm=perm)
        elif kind == 6:
            flat = int(np.prod(s))
            target = (s[0], flat // s[0]) if len(s) > 1 else (flat,)
            cname = f"shape{k}"
            inits.append(numpy_helper.from_array(np.array(target, np.int64), cname))
            new("Reshape", [a, cname], target)
        elif kind == 7:
            other = same_shape_pair(a)
            axis = int(rng.integers(0, len(s)))
            out = list(s)
            out[axis] *= 2
            new("Concat", [a, other], out, axis=axis)
        else:
            axis = int(rng.integers(0, len(s)))
            out = list(s)
            out[axis] = 1
            if rng.random() < 0.5:
                new("ReduceMax", [a], out, axes=[axis], keepdims=1)
            else:  # ReduceSum-13 takes its axes as an input
                cname = f"axes{k}"
                inits.append(numpy_helper.from_array(np.array([axis], np.int64), cname))
                new("ReduceSum", [a, cname], out, keepdims=1)
    outs = list(dict.fromkeys([pool[-1]] + [str(v) for v in rng.choice(pool[1:], min(3, len(pool) - 1))]))
    graph = helper.make_graph(nodes, f"random{seed}", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [b, c, h, w])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return m, (b, c, h, w)


@pytest.mark.parametrize("seed", range(60))
def test_random_graph_matches_onnxruntime(seed):
    m, shape = random_model(seed)
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    expected = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    sess = glassrt.InferenceSession(m, providers=["cpu"], fallback="error")
    for _ in range(2):  # the second run replays the plan over the same arena
        got = sess.run(None, {"x": x})
        for g, e in zip(got, expected):
            assert g.shape == e.shape
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
