"""Hostile inputs to valid nodes: every ONNX node test case is run with each of its inputs
mutated in turn (made a scalar, emptied, given an extra dim, cut along its last dim, given
another float/int type). Each run must either succeed or raise a GlassrtError whose
message is glassrt's own: the node, the inputs and what was expected, not a Python or
NumPy internal such as "tuple index out of range" leaking from a rule or kernel.

Found this way (and fixed): scalars where axes or shapes are due, Gather/Concat/Split on
scalars, negative Split sizes, RotaryEmbedding position ids past the cache (read
wrapped around), a per-column zero point taken per row by MatMulInteger, 0-d inputs
to QuantizeLinear and DynamicQuantizeLinear.
"""
from __future__ import annotations

import functools
import warnings

import numpy as np
import onnx
import pytest
from onnx.backend.test.case.node import collect_testcases

import glassrt

# Phrases that only a Python / NumPy internal writes: a message carrying one tells the user
# nothing about which input is wrong.
INTERNAL = ("tuple index out of range", "list index out of range", "too many indices", "object of type",
            "NoneType", "ArrayType", "iteration over a 0-d", "has no attribute", "unhashable", "not subscriptable",
            "KeyError", "UnboundLocalError", "RecursionError", "AssertionError", "NameError",
            "unsupported operand", "AxisError", "ZeroDivisionError")
SHARDS = 8


def _mutations(a):
    if a.ndim and a.size:
        yield "scalar", np.asarray(a.reshape(-1)[0])
    if a.ndim:
        yield "empty", a[:0]
    yield "extra_dim", a[None]
    if a.dtype == np.float32:
        yield "as_float64", a.astype(np.float64)
    if a.dtype.kind == "i":
        yield "as_float32", a.astype(np.float32)
    if a.ndim and a.shape[-1] > 1:
        yield "cut_last", a[..., :1]


@functools.lru_cache(maxsize=1)
def _cases():
    out = []
    with warnings.catch_warnings():  # building the expected outputs warns about overflows
        warnings.simplefilter("ignore")
        collected = collect_testcases(None)
    for case in collected:
        if case.kind != "node" or not case.data_sets:
            continue
        inputs, _ = case.data_sets[0]
        if all(isinstance(a, np.ndarray) and a.dtype != object for a in inputs):
            out.append((case.name, case.model, inputs))
    return sorted(out, key=lambda c: c[0])


@pytest.mark.parametrize("shard", range(SHARDS))
def test_mutated_inputs_fail_cleanly(shard):
    problems, runs = [], 0
    for name, proto, inputs in _cases()[shard::SHARDS]:
        m = onnx.ModelProto()
        m.CopyFrom(proto)
        for vi in list(m.graph.input) + list(m.graph.output):  # let the mutated shapes in
            vi.type.tensor_type.ClearField("shape")
        names = [vi.name for vi in m.graph.input]
        for k, a in enumerate(inputs):
            for what, b in _mutations(a):
                feeds = dict(zip(names, inputs))
                feeds[names[k]] = b
                mm = m
                if b.dtype != a.dtype:
                    mm = onnx.ModelProto()
                    mm.CopyFrom(m)
                    mm.graph.input[k].type.tensor_type.elem_type = onnx.helper.np_dtype_to_tensor_dtype(b.dtype)
                runs += 1
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        sess = glassrt.InferenceSession(mm.SerializeToString(), providers=["cpu"], fallback="silent")
                        sess.run(None, feeds)
                except glassrt.GlassrtError as e:
                    leaked = [p for p in INTERNAL if p in str(e)]
                    if leaked:
                        problems.append(f"{name} input {k} {what}: {str(e)[-300:]}")
                except Exception as e:  # noqa: BLE001 - anything else is the failure being tested for
                    problems.append(f"{name} input {k} {what}: {type(e).__name__}: {str(e)[:300]}")
    assert runs > 100
    assert not problems, "\n".join(problems)
