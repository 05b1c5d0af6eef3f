"""Small model builders shared by the tests."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def int8_exact_reason():
    """Why oneDNN's 8-bit products are not exact here (no oneDNN, or no VNNI/AMX), or None."""
    from glassrt.kernels.onednn import capi

    if capi.UNAVAILABLE is not None:
        return capi.UNAVAILABLE
    from glassrt.kernels.onednn import int8

    return int8.exact_reason()


def skip_without_vnni(reason="this CPU has no VNNI/AMX: the int8 paths are left alone (tested apart)"):
    """A test that needs oneDNN's exact 8-bit engine: skipped where the CPU lacks VNNI/AMX
    (where oneDNN is missing altogether, the modules skip as a whole)."""
    import pytest

    from glassrt.kernels.onednn import capi

    return pytest.mark.skipif(capi.UNAVAILABLE is None and int8_exact_reason() is not None, reason=reason)


def session_without_pass(m, pass_name: str, **kwargs):
    """glassrt.InferenceSession(m, **kwargs) with one graph pass left out of the pipeline:
    a fusion's result against the same model without it."""
    import glassrt
    from glassrt import passes

    saved = list(passes.PIPELINE)
    passes.PIPELINE[:] = [p for p in saved if p.name != pass_name]
    try:
        return glassrt.InferenceSession(m, **kwargs)
    finally:
        passes.PIPELINE[:] = saved


def op_types(sess) -> list:
    """The op types of a session's graph after the passes, sorted."""
    return sorted(n.op_type for n in sess.placement.graph.nodes)


def ort_outputs(m, feeds: dict, **options) -> list:
    """onnxruntime's outputs for model m (quiet; `options` set on its SessionOptions)."""
    import pytest

    ort = pytest.importorskip("onnxruntime")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    for k, v in options.items():
        setattr(so, k, v)
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def count_calls(monkeypatch, module, name) -> list:
    """Replace module.name by a wrapper that calls it and appends to the list returned (a
    spy: which path a kernel took). A lazily compiled loop (kernels/cpu/_jit.py) is compiled
    first: a module's first compilation replaces only the lazy names it finds, and would not
    find one hidden behind the wrapper."""
    from glassrt.kernels.cpu import _jit

    real, calls = getattr(module, name), []
    if isinstance(real, _jit._Lazy):
        real = real.dispatcher()
    monkeypatch.setattr(module, name, lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    return calls


def model(nodes, inputs, outputs, initializers=(), opset=18, domains=None, ir_version=9):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in (domains or {}).items()]
    return helper.make_model(graph, opset_imports=opsets, ir_version=ir_version)


def tensor(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def add_model(shape=("batch", 3)):
    """y = x + 1 (float), with a symbolic batch dim."""
    return model([helper.make_node("Add", ["x", "one"], ["y"], name="add")],
                 [tensor("x", list(shape))], [tensor("y", list(shape))],
                 [init("one", np.ones(shape[-1], np.float32))])


def expose(m: onnx.ModelProto, names) -> onnx.ModelProto:
    """A copy of m with extra graph outputs (values of unknown type are allowed by ORT too)."""
    out = onnx.ModelProto()
    out.CopyFrom(m)
    for n in names:
        out.graph.output.append(onnx.ValueInfoProto(name=n))
    return out


def transformer_encoder(d_model=64, heads=4, d_ff=128, layers=2, seed=0, opset=17):
    """A post-LN transformer encoder as exporters write it: symbolic batch and seq, reshapes
    through Shape/Gather/Concat, LayerNormalization, Erf-based GELU."""
    rng = np.random.default_rng(seed)
    dh = d_model // heads
    nodes, inits = [], []

    def w(name, *shape, scale=None):
        scale = scale if scale is not None else 1 / np.sqrt(shape[0])
        inits.append(init(name, (rng.standard_normal(shape) * scale).astype(np.float32)))
        return name

    def node(op, ins, outs, **attrs):
        nodes.append(helper.make_node(op, ins, outs, name=outs[0], **attrs))
        return outs[0]

    inits += [init("i0", np.array([0], np.int64)), init("i1", np.array([1], np.int64)),
              init("heads_dh", np.array([heads, dh], np.int64)), init("dmodel", np.array([d_model], np.int64)),
              init("sqrt_dh", np.array(np.sqrt(dh), np.float32)), init("half", np.array(0.5, np.float32)),
              init("one", np.array(1.0, np.float32)), init("rsqrt2", np.array(1 / np.sqrt(2), np.float32))]
    x = "x"
    shape = node("Shape", [x], ["shape"])
    b = node("Gather", [shape, "i0"], ["b"], axis=0)
    s = node("Gather", [shape, "i1"], ["s"], axis=0)
    split_shape = node("Concat", [b, s, "heads_dh"], ["split_shape"], axis=0)
    merge_shape = node("Concat", [b, s, "dmodel"], ["merge_shape"], axis=0)
    for L in range(layers):
        p = f"l{L}_"
        heads_out = {}
        for t in ("q", "k", "v"):
            y = node("MatMul", [x, w(p + "w" + t, d_model, d_model)], [p + t + "_mm"])
            y = node("Add", [y, w(p + "b" + t, d_model, scale=0.1)], [p + t])
            y = node("Reshape", [y, split_shape], [p + t + "_split"])
            perm = [0, 2, 3, 1] if t == "k" else [0, 2, 1, 3]
            heads_out[t] = node("Transpose", [y], [p + t + "_heads"], perm=perm)
        sc = node("MatMul", [heads_out["q"], heads_out["k"]], [p + "scores"])
        sc = node("Div", [sc, "sqrt_dh"], [p + "scaled"])
        pr = node("Softmax", [sc], [p + "probs"], axis=-1)
        ctxv = node("MatMul", [pr, heads_out["v"]], [p + "ctx"])
        ctxv = node("Transpose", [ctxv], [p + "ctx_t"], perm=[0, 2, 1, 3])
        ctxv = node("Reshape", [ctxv, merge_shape], [p + "ctx_merged"])
        att = node("MatMul", [ctxv, w(p + "wo", d_model, d_model)], [p + "att"])
        res = node("Add", [att, x], [p + "res1"])
        ln1 = node("LayerNormalization", [res, w(p + "g1", d_model, scale=1.0), w(p + "be1", d_model, scale=0.1)],
                   [p + "ln1"], axis=-1, epsilon=1e-5)
        h = node("MatMul", [ln1, w(p + "w1", d_model, d_ff)], [p + "ff1"])
        h = node("Add", [h, w(p + "b1", d_ff, scale=0.1)], [p + "ff1b"])
        e = node("Mul", [h, "rsqrt2"], [p + "gx"])
        e = node("Erf", [e], [p + "erf"])
        e = node("Add", [e, "one"], [p + "erf1"])
        e = node("Mul", [h, e], [p + "gh"])
        g = node("Mul", [e, "half"], [p + "gelu"])
        h2 = node("MatMul", [g, w(p + "w2", d_ff, d_model)], [p + "ff2"])
        res2 = node("Add", [h2, ln1], [p + "res2"])
        x = node("LayerNormalization", [res2, w(p + "g2", d_model, scale=1.0), w(p + "be2", d_model, scale=0.1)],
                 [p + "out"], axis=-1, epsilon=1e-5)
    node("Identity", [x], ["y"])
    return model(nodes, [tensor("x", ["batch", "seq", d_model])], [tensor("y", ["batch", "seq", d_model])],
                 inits, opset=opset)


def smaps_kib(address: int, field: str) -> int | None:
    """KiB that /proc/self/smaps reports under `field` ("Rss:", "AnonHugePages:") for the
    mapping holding `address`, or None where there is no such file or mapping."""
    try:
        with open("/proc/self/smaps") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    inside = False
    for line in lines:
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == field:
            return int(line.split()[1])
    return None


def passes_in_a_forked_child(check, timeout: float = 60.0) -> None:
    """Fork; the child exits 0 when check() is true, 1 when false, 2 when it raised; fail the
    test on any other exit, or when the child is still running after `timeout` seconds (a
    child that hangs, as GNU OpenMP's workers do after a fork)."""
    import os
    import time
    import warnings

    import pytest

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # (forking a process with threads: the point)
        pid = os.fork()
    if pid == 0:
        try:
            os._exit(0 if check() else 1)
        finally:
            os._exit(2)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung in its run")
