"""glassrt vs onnxruntime on single Conv nodes: the conv shapes of resnet50 and vgg19.

Each shape is a model with one Conv (bias, and optionally a Relu after it, which glassrt
fuses into FusedConv), random weights, the same input for both runtimes, the same thread
count. Runs alternate in blocks (a few glassrt runs, then a few onnxruntime runs, ...) so
that noise from a busy machine hits both alike; the first run of each block is dropped.
Each cell is a median. The last rows weigh each shape by how often the model has it: the
time its convs take, one run each, in either runtime.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from _common import alternating_medians, ort_session  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import glassrt  # noqa: E402

# (label, input channels, output channels, input size, kernel, stride, {model: count})
SHAPES = [
    ("7x7/2 3>64 @224", 3, 64, 224, 7, 2, {"resnet50": 1}),
    ("3x3 64>64 @56", 64, 64, 56, 3, 1, {"resnet50": 3}),
    ("3x3 128>128 @28", 128, 128, 28, 3, 1, {"resnet50": 3}),
    ("3x3 256>256 @14", 256, 256, 14, 3, 1, {"resnet50": 5}),
    ("3x3 512>512 @7", 512, 512, 7, 3, 1, {"resnet50": 2}),
    ("3x3/2 128>128 @56", 128, 128, 56, 3, 2, {"resnet50": 1}),
    ("3x3/2 256>256 @28", 256, 256, 28, 3, 2, {"resnet50": 1}),
    ("3x3/2 512>512 @14", 512, 512, 14, 3, 2, {"resnet50": 1}),
    ("1x1 64>64 @56", 64, 64, 56, 1, 1, {"resnet50": 1}),
    ("1x1 64>256 @56", 64, 256, 56, 1, 1, {"resnet50": 4}),
    ("1x1 256>64 @56", 256, 64, 56, 1, 1, {"resnet50": 2}),
    ("1x1 256>128 @56", 256, 128, 56, 1, 1, {"resnet50": 1}),
    ("1x1/2 256>512 @56", 256, 512, 56, 1, 2, {"resnet50": 1}),
    ("1x1 128>512 @28", 128, 512, 28, 1, 1, {"resnet50": 4}),
    ("1x1 512>128 @28", 512, 128, 28, 1, 1, {"resnet50": 3}),
    ("1x1 512>256 @28", 512, 256, 28, 1, 1, {"resnet50": 1}),
    ("1x1/2 512>1024 @28", 512, 1024, 28, 1, 2, {"resnet50": 1}),
    ("1x1 256>1024 @14", 256, 1024, 14, 1, 1, {"resnet50": 6}),
    ("1x1 1024>256 @14", 1024, 256, 14, 1, 1, {"resnet50": 5}),
    ("1x1 1024>512 @14", 1024, 512, 14, 1, 1, {"resnet50": 1}),
    ("1x1/2 1024>2048 @14", 1024, 2048, 14, 1, 2, {"resnet50": 1}),
    ("1x1 512>2048 @7", 512, 2048, 7, 1, 1, {"resnet50": 3}),
    ("1x1 2048>512 @7", 2048, 512, 7, 1, 1, {"resnet50": 2}),
    ("3x3 3>64 @224", 3, 64, 224, 3, 1, {"vgg19": 1}),
    ("3x3 64>64 @224", 64, 64, 224, 3, 1, {"vgg19": 1}),
    ("3x3 64>128 @112", 64, 128, 112, 3, 1, {"vgg19": 1}),
    ("3x3 128>128 @112", 128, 128, 112, 3, 1, {"vgg19": 1}),
    ("3x3 128>256 @56", 128, 256, 56, 3, 1, {"vgg19": 1}),
    ("3x3 256>256 @56", 256, 256, 56, 3, 1, {"vgg19": 3}),
    ("3x3 256>512 @28", 256, 512, 28, 3, 1, {"vgg19": 1}),
    ("3x3 512>512 @28", 512, 512, 28, 3, 1, {"vgg19": 3}),
    ("3x3 512>512 @14", 512, 512, 14, 3, 1, {"vgg19": 4}),
]


def conv_model(c, m, size, k, stride, relu, batch, seed=0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((m, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if relu else "y"], name="conv", kernel_shape=[k, k],
                              strides=[stride, stride], pads=[k // 2] * 4)]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"], name="relu"))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, c, size, size])
    g = helper.make_graph(nodes, "conv", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=9).SerializeToString()


def bench(shape, runs, threads, relu, batch, ort_spin=True):
    label, c, m, size, k, stride, counts = shape
    data = conv_model(c, m, size, k, stride, relu, batch)
    feeds = {"x": np.random.default_rng(1).standard_normal((batch, c, size, size)).astype(np.float32)}
    g = glassrt.InferenceSession(data, providers=["cpu"], fallback="error",
                                 sess_options=glassrt.SessionOptions(intra_op_num_threads=threads))
    o = ort_session(data, threads)
    if not ort_spin:  # onnxruntime's idle threads otherwise spin a while after each run
        import onnxruntime

        so = onnxruntime.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads, so.log_severity_level = threads, 1, 3
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        o = onnxruntime.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    tg, to = alternating_medians(g, o, feeds, runs, pause=0.0 if not ort_spin else 0.25)
    a, b = g.run(None, feeds)[0], o.run(None, feeds)[0]
    err = float(np.abs(a - b).max() / np.abs(b).max())
    kernel = g.explain()["nodes"][0]["kernel"].split(".")[-1]
    return tg, to, kernel, err


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--relu", action="store_true", help="Conv + Relu (a FusedConv in glassrt)")
    ap.add_argument("--models", nargs="*", default=["resnet50", "vgg19"])
    ap.add_argument("--match", default="", help="only shapes whose label contains this")
    ap.add_argument("--ort-no-spin", action="store_true",
                    help="onnxruntime's threads block when idle instead of spinning (its spinning threads slow "
                         "down glassrt's BLAS threads in the next block, and OpenBLAS's spinning ones onnxruntime)")
    a = ap.parse_args(argv)
    shapes = [s for s in SHAPES if set(s[6]) & set(a.models) and a.match in s[0]]
    t = Table(title=f"Conv{' + Relu' if a.relu else ''}, batch {a.batch}, {a.threads} threads: median ms of about "
                    f"{a.runs} runs each, in alternating blocks")
    for col in ("shape", "glassrt kernel", "glassrt ms", "onnxruntime ms", "glassrt / ort", "max rel diff"):
        t.add_column(col, justify="left" if col in ("shape", "glassrt kernel") else "right")
    totals = {}
    for s in shapes:
        g, o, kernel, err = bench(s, a.runs, a.threads, a.relu, a.batch, not a.ort_no_spin)
        print(f"{s[0]:22s} {kernel:12s} {g:9.3f} {o:9.3f} {g / o:6.2f}x", file=sys.stderr, flush=True)
        t.add_row(s[0], kernel, f"{g:.3f}", f"{o:.3f}", f"{g / o:.2f}x", f"{err:.1e}")
        for model, n in s[6].items():
            tg, to = totals.get(model, (0.0, 0.0))
            totals[model] = (tg + n * g, to + n * o)
    for model, (tg, to) in totals.items():
        if model in a.models:
            t.add_row(f"all {model} convs", "(weighted)", f"{tg:.2f}", f"{to:.2f}", f"{tg / to:.2f}x", "", style="bold")
    Console(width=max(Console().width, 120)).print(t)


if __name__ == "__main__":
    main()
