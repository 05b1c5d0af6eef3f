"""glassrt vs onnxruntime on single pooling and depthwise-conv nodes with shapes from real CNNs.

Same process, same inputs, same thread count (SessionOptions(intra_op_num_threads=N) for
glassrt, intra_op_num_threads=N for onnxruntime). Runs alternate in blocks (a few glassrt
runs, then a few onnxruntime runs, ...) so that noise from a busy machine hits both alike;
the first run of each block is dropped. Each cell is a median.

The "numpy" column is glassrt with the compiled kernels (pool.py / conv.py, names ending
in `_nb`) hidden from selection, i.e. the general NumPy kernels they take over from. The
compiled kernels are single-threaded; "ort 1t" is onnxruntime on one thread, for scale.
Ratios are glassrt / onnxruntime (N threads): below 1 means glassrt is faster. On a
shared machine the N-thread onnxruntime times move with the other processes' load.

    python benchmarks/pool_and_depthwise.py --runs 30 --threads 2
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from _common import ort_session  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

import glassrt  # noqa: E402
from glassrt.kernels import registry  # noqa: E402


def _model(op, x_shape, attrs, w_shape=None, act=None, seed=0):
    rng = np.random.default_rng(seed)
    inits, inputs = [], ["x"]
    if w_shape is not None:
        w = rng.standard_normal(w_shape).astype(np.float32) * 0.3
        b = rng.standard_normal(w_shape[0]).astype(np.float32) * 0.1
        inits = [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel()),
                 helper.make_tensor("b", TensorProto.FLOAT, b.shape, b.ravel())]
        inputs = ["x", "w", "b"]
    nodes = [helper.make_node(op, inputs, ["y" if act is None else "t"], **attrs)]
    if act == "Relu":
        nodes.append(helper.make_node("Relu", ["t"], ["y"]))
    elif act == "Clip":  # Relu6, as MobileNets export it
        inits += [helper.make_tensor("lo", TensorProto.FLOAT, [], [0.0]),
                  helper.make_tensor("hi", TensorProto.FLOAT, [], [6.0])]
        nodes.append(helper.make_node("Clip", ["t", "lo", "hi"], ["y"]))
    g = helper.make_graph(nodes, op, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _pool(op, c, hw, k, s, p=0, ceil=0, include_pad=None):
    name = ("MaxPool" if op == "MaxPool" else "AvgPool") + f" {k}x{k} s{s}" + (f" p{p}" if p else "") \
        + (" ceil" if ceil else "") + (" incl" if include_pad else "") + f" 1x{c}x{hw}x{hw}"
    attrs = dict(kernel_shape=[k, k], strides=[s, s], pads=[p] * 4, ceil_mode=ceil)
    if include_pad is not None:
        attrs["count_include_pad"] = include_pad
    return name, (op, (1, c, hw, hw), attrs, None, None)


def _dw(c, hw, k=3, s=1, act=None):
    p = k // 2
    attrs = dict(group=c, kernel_shape=[k, k], strides=[s, s], pads=[p] * 4)
    return (f"depthwise {k}x{k} s{s} 1x{c}x{hw}x{hw}" + (f" +{act}" if act else ""),
            ("Conv", (1, c, hw, hw), attrs, (c, 1, k, k), act))


CASES = [  # ResNet / SqueezeNet / VGG pools, Inception / DenseNet averages, MobileNet / ShuffleNet / MNASNet depthwise
    _pool("MaxPool", 64, 112, 3, 2, p=1),
    _pool("MaxPool", 96, 111, 3, 2, ceil=1),
    _pool("MaxPool", 128, 112, 2, 2),
    _pool("AveragePool", 256, 28, 3, 1, p=1),
    _pool("AveragePool", 192, 35, 3, 1, p=1, include_pad=1),
    _pool("AveragePool", 256, 56, 2, 2),
    _dw(64, 56, s=1),
    _dw(64, 56, s=2),
    _dw(144, 56, s=1, act="Clip"),
    _dw(232, 14, s=1),
    _dw(960, 7, s=1, act="Clip"),
    _dw(672, 14, k=5, s=2, act="Relu"),
]


@contextlib.contextmanager
def hidden(suffix):
    """Hide the cpu kernels whose name ends with `suffix` from sessions made inside."""
    from glassrt.runtime import _load_cpu_kernels

    _load_cpu_kernels()  # all of them, or a session would import a hidden kernel's module again
    removed = []
    for op, dom in (("MaxPool", ""), ("AveragePool", ""), ("Conv", ""), ("FusedConv", "glassrt")):
        ks = registry.kernels_for("cpu", dom, op)
        for k in [k for k in ks if k.name.endswith(suffix)]:
            ks.remove(k)
            removed.append((ks, k))
    try:
        yield
    finally:
        for ks, k in removed:
            ks.append(k)


def _glassrt(data, threads):
    s = glassrt.InferenceSession(data, providers=["cpu"], fallback="error",
                                 sess_options=glassrt.SessionOptions(intra_op_num_threads=threads))
    return s


def _kernel_name(sess, feeds):
    sess.run(None, feeds)
    nodes = sess.explain()["nodes"]
    return ",".join(n["kernel"].split(".", 2)[-1] for n in nodes)


def bench(case, runs, threads, numpy_too):
    op, x_shape, attrs, w_shape, act = case
    data = _model(op, x_shape, attrs, w_shape, act)
    feeds = {"x": np.random.default_rng(1).standard_normal(x_shape, dtype=np.float32)}
    sessions = {"glassrt": _glassrt(data, threads), "ort": ort_session(data, threads), "ort1": ort_session(data, 1)}
    if numpy_too:
        with hidden("_nb"):
            sessions["numpy"] = _glassrt(data, threads)
    for s in sessions.values():  # warm up: plans, Numba compiles (or cache loads), ORT's first-run allocations
        for _ in range(2):
            s.run(None, feeds)
    times = {k: [] for k in sessions}
    block = 4
    for _ in range(max(1, runs // (block - 1))):
        for name, s in sessions.items():
            for i in range(block):
                t0 = time.perf_counter()
                s.run(None, feeds)
                if i:
                    times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    ref = sessions["ort"].run(None, feeds)[0]
    diff = float(np.abs(sessions["glassrt"].run(None, feeds)[0] - ref).max())
    return med, diff, _kernel_name(sessions["glassrt"], feeds)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-numpy", action="store_true", help="skip the NumPy-kernel column")
    ap.add_argument("--only", default="", help="run only the cases whose name contains this")
    a = ap.parse_args(argv)
    rows = []
    for name, case in CASES:
        if a.only.lower() in name.lower():
            rows.append((name, *bench(case, a.runs, a.threads, not a.no_numpy)))
            print(f"  {name}: done", file=sys.stderr, flush=True)
    print(f"\nmedian ms, {a.threads} threads, about {a.runs} runs each in alternating blocks")
    head = (f"{'case':38} {'kernel':22} {'numpy':>8} {'glassrt':>8} {'ort':>8} {'ort 1t':>8} {'numpy/ort':>10} "
            f"{'glassrt/ort':>12} {'max|diff|':>9}")
    print(head)
    print("-" * len(head))
    ratios, ratios1 = [], []
    for name, med, diff, kname in rows:
        g, o, n = med["glassrt"], med["ort"], med.get("numpy")
        ratios.append(g / o)
        ratios1.append(g / med["ort1"])
        print(f"{name:38} {kname:22} {(f'{n:.3f}' if n else '-'):>8} {g:8.3f} {o:8.3f} {med['ort1']:8.3f} "
              f"{(f'{n / o:.2f}x' if n else '-'):>10} {g / o:11.2f}x {diff:9.1e}")
    print(f"geometric mean glassrt/ort: {float(np.exp(np.mean(np.log(ratios)))):.2f}x "
          f"(glassrt/ort 1t: {float(np.exp(np.mean(np.log(ratios1)))):.2f}x)")


if __name__ == "__main__":
    main()
