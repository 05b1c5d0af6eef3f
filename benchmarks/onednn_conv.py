"""Every Conv of light_resnet50 and light_squeezenet, batch 1, random weights: glassrt's cpu
kernel vs oneDNN 3.2 (through glassrt.kernels.onednn) vs onnxruntime, same thread count.

Columns, per distinct conv shape (median ms of about --runs runs each):

  glassrt     a one-Conv model in glassrt.InferenceSession (its cpu kernel, as benchmarks/conv.py)
  dnnl nchw   oneDNN, plain NCHW src/dst, weights format `any` pre-packed once (a bound Step)
  dnnl any    oneDNN, src/dst format `any` (the layout a whole blocked network would keep),
              input already in that layout, reorders excluded
  dnnl 8c     (--nchw8c) src/dst forced to nChw8c, the classic jit:avx2 blocked layout
              (src stays nchw when channels are not a multiple of 8: the first layer)
  ort         onnxruntime on the same one-Conv model (intra_op 2, inter_op 1)

All contenders run in alternating blocks with a pause before each block (the idle worker
threads of OpenBLAS, libgomp and onnxruntime spin for a while after a run and would steal
the next block's cores); the first run of each block is dropped. The model rows weigh each
shape by how many convs of that shape the model has. Then the same with a Relu after each
conv (glassrt FusedConv, oneDNN eltwise post-op, onnxruntime's fused Conv+Relu), and, for
resnet50, what reorders plain->blocked (src) and blocked->plain (dst) around each conv cost.

Other modes: --overhead (per-call cost of a bound Step), --wait-policy (OMP_WAIT_POLICY /
GOMP_SPINCOUNT vs a competing busy process, in subprocesses), --ab (oneDNN `any` against
onnxruntime alone, more runs, --repeat times).

    python benchmarks/onednn_conv.py --runs 12 --threads 2
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


@dataclass(frozen=True)
class ConvSpec:
    x: tuple
    w: tuple
    bias: bool
    strides: tuple
    pads: tuple
    group: int
    dilations: tuple

    @property
    def label(self):
        k = "x".join(map(str, self.w[2:]))
        s = f"/{self.strides[0]}" if max(self.strides) > 1 else ""
        g = f" g{self.group}" if self.group > 1 else ""
        return f"{k}{s} {self.x[1]}>{self.w[0]}{g} @{self.x[2]}"

    @property
    def flops(self):
        y = conv_out(self)
        return 2 * int(np.prod(y)) * int(np.prod(self.w[1:]))


def conv_out(s: ConvSpec):
    from glassrt.kernels.onednn.dnnl import conv_output_shape

    return conv_output_shape(s.x, s.w, s.strides, s.dilations, s.pads)


def model_convs(name: str) -> dict[ConvSpec, int]:
    """Distinct Conv configurations of a light model and how often each occurs, with input
    shapes from one onnxruntime run that exposes every conv input as an output."""
    import onnxruntime as ort

    from glassrt.tools import light_models as L

    m = L.randomize_weights(onnx.load(str(L.path(name))))
    inits = {t.name: tuple(t.dims) for t in m.graph.initializer}
    convs = [n for n in m.graph.node if n.op_type == "Conv"]
    have = {o.name for o in m.graph.output}
    for n in convs:
        if n.input[0] not in have:
            m.graph.output.append(helper.make_tensor_value_info(n.input[0], TensorProto.FLOAT, None))
            have.add(n.input[0])
    xname, xshape = L.input_shape(m)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    vals = dict(zip(names, sess.run(None, {xname: np.zeros(xshape, np.float32)})))
    out: dict[ConvSpec, int] = {}
    for n in convs:
        a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
        if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            raise NotImplementedError(f"auto_pad in {n.name}")
        w = inits[n.input[1]]
        nsp = len(w) - 2
        spec = ConvSpec(x=tuple(vals[n.input[0]].shape), w=w, bias=len(n.input) > 2 and bool(n.input[2]),
                        strides=tuple(a.get("strides", [1] * nsp)), pads=tuple(a.get("pads", [0] * 2 * nsp)),
                        group=int(a.get("group", 1)), dilations=tuple(a.get("dilations", [1] * nsp)))
        out[spec] = out.get(spec, 0) + 1
    return out


def weights(spec: ConvSpec, seed=0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal(spec.w) / np.sqrt(np.prod(spec.w[1:]))).astype(np.float32)
    b = rng.standard_normal(spec.w[0]).astype(np.float32) if spec.bias else None
    x = rng.standard_normal(spec.x).astype(np.float32)
    return w, b, x


def conv_model(spec: ConvSpec, w, b, relu: bool) -> bytes:
    inputs = ["x", "w"] + (["b"] if b is not None else [])
    nodes = [helper.make_node("Conv", inputs, ["c" if relu else "y"], name="conv", kernel_shape=list(spec.w[2:]),
                              strides=list(spec.strides), pads=list(spec.pads), group=spec.group,
                              dilations=list(spec.dilations))]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"], name="relu"))
    inits = [numpy_helper.from_array(w, "w")] + ([numpy_helper.from_array(b, "b")] if b is not None else [])
    g = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(spec.x))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=9).SerializeToString()


class OneDNNConv:
    """A conv through oneDNN: weights pre-packed once, src/dst bound once; call() runs it."""

    def __init__(self, spec: ConvSpec, w, b, x, relu: bool, layout: str):
        from glassrt.kernels.onednn import dnnl as D

        self.D = D
        fmt = {"nchw": "plain", "any": "any", "8c": "nChw8c"}[layout]
        src_fmt = "plain" if layout == "8c" and spec.x[1] % 8 else fmt  # jit:avx2 reads a first layer in nchw
        self.pd = D.conv(spec.x, spec.w, group=spec.group, strides=spec.strides, dilations=spec.dilations,
                         pads=spec.pads, bias=b is not None, src_format=src_fmt, dst_format=fmt,
                         post_ops=["relu"] if relu else None)
        user_w = D.md(D.grouped_weights_shape(spec.w, spec.group), np.float32,
                      "goihw" if spec.group > 1 else "oihw")
        self.wmem = D.prepack(w, user_w, self.pd.weights_md())
        self.src_md, self.dst_md = self.pd.src_md(), self.pd.dst_md()
        self.src = D.from_numpy(x, self.src_md)  # plain: a copy of x; blocked: x reordered, once
        self.dst = D.Memory(self.dst_md)
        args = {D.ARG_SRC: self.src, D.ARG_WEIGHTS: self.wmem, D.ARG_DST: self.dst}
        if b is not None:
            args[D.ARG_BIAS] = b
        self.step = self.pd.primitive().bind(args)
        self.impl = self.pd.impl
        self.formats = f"{self.src_md.format}/{self.pd.weights_md().format}"

    def __call__(self):
        self.step.run()

    def output(self):
        return self.D.to_numpy(self.dst)

    def reorders(self):
        """Callables for the reorders a plain network would need around this conv."""
        D = self.D
        plain_x = np.empty(self.src_md.dims, np.float32)
        plain_y = np.empty(self.dst_md.dims, np.float32)
        r_in = D.reorder(D.MemoryDesc.from_array(plain_x), self.src_md).primitive().bind(
            {D.ARG_FROM: plain_x, D.ARG_TO: self.src})
        r_out = D.reorder(self.dst_md, D.MemoryDesc.from_array(plain_y)).primitive().bind(
            {D.ARG_FROM: self.dst, D.ARG_TO: plain_y})
        return r_in.run, r_out.run, (r_in.pd.impl, r_out.pd.impl)


def alternating(fns: dict, runs: int, block: int = 4, pause: float = 0.15) -> dict:
    """Times (ms) of each callable, run in alternating blocks after two warm-up runs each;
    a pause before each block, the first run of each block dropped."""
    for _ in range(2):
        for f in fns.values():
            f()
    acc = {k: [] for k in fns}
    for _ in range(max(1, -(-runs // (block - 1)))):
        for k, f in fns.items():
            time.sleep(pause)
            for i in range(block):
                t0 = time.perf_counter()
                f()
                if i:
                    acc[k].append((time.perf_counter() - t0) * 1e3)
    return acc


def med(v):
    return statistics.median(v)


def bench_spec(spec: ConvSpec, relu: bool, a, reorder: bool = False) -> dict:
    import onnxruntime as ort

    import glassrt

    w, b, x = weights(spec)
    data = conv_model(spec, w, b, relu)
    feeds = {"x": x}
    g = glassrt.InferenceSession(data, providers=["cpu"], fallback="error",
                                 sess_options=glassrt.SessionOptions(intra_op_num_threads=a.threads))
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads, so.log_severity_level = a.threads, 1, 3
    if a.ort_no_spin:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    o = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    from glassrt.kernels.onednn import capi

    capi.set_num_threads(a.threads)  # before creating primitives: oneDNN fixes their thread count then
    layouts = ["nchw", "any"] + (["8c"] if a.nchw8c else [])
    dn = {lay: OneDNNConv(spec, w, b, x, relu, lay) for lay in layouts}
    fns = {"glassrt": lambda: g.run(None, feeds)}
    fns.update({f"dnnl {lay}": dn[lay] for lay in layouts})
    fns["ort"] = lambda: o.run(None, feeds)
    samples = alternating(fns, a.runs, pause=a.pause)
    t = {k: med(v) for k, v in samples.items()}
    tmin = {k: min(v) for k, v in samples.items()}
    ref = o.run(None, feeds)[0]
    scale = float(np.abs(ref).max()) or 1.0
    errs = {"glassrt": float(np.abs(g.run(None, feeds)[0] - ref).max()) / scale}
    for lay in layouts:
        errs[f"dnnl {lay}"] = float(np.abs(dn[lay].output() - ref).max()) / scale
    kernel = g.explain()["nodes"][0]["kernel"].split(".")[-1]
    res = {"t": t, "min": tmin, "err": errs, "kernel": kernel, "impl": {k: dn[k].impl for k in layouts},
           "formats": {k: dn[k].formats for k in layouts}}
    if reorder:
        rin, rout, impls = dn["any"].reorders()
        tr = alternating({"in": rin, "out": rout}, a.runs, pause=a.pause)
        res["reorder"] = (med(tr["in"]), med(tr["out"]), impls)
    return res


def run_tables(a):
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 230))
    specs = {m: model_convs(m) for m in a.models}
    for relu in ([False, True] if a.relu == "both" else [a.relu == "only"]):
        layouts = ["nchw", "any"] + (["8c"] if a.nchw8c else [])
        cols = ["glassrt"] + [f"dnnl {lay}" for lay in layouts] + ["ort"]
        totals, totals_min = {}, {}
        reorder_tot = {}
        for model, convs in specs.items():
            t = Table(title=f"{model}: Conv{' + Relu' if relu else ''}, batch 1, {a.threads} threads, median ms "
                            f"of ~{a.runs} runs, alternating blocks")
            impl_col = "dnnl impl (" + " | ".join(layouts) + ")"
            for c in ["shape", "n", "glassrt kernel"] + [f"{c} ms" for c in cols] + [
                    impl_col, "any layout src/wei", "any/ort", "glassrt/ort", "max rel err"]:
                t.add_column(c, justify="left" if c in ("shape", "glassrt kernel", impl_col,
                                                         "any layout src/wei") else "right")
            tot = dict.fromkeys(cols, 0.0)
            tot_min = dict.fromkeys(cols, 0.0)
            for spec, n in sorted(convs.items(), key=lambda kv: -kv[0].flops * kv[1]):
                if a.match and a.match not in spec.label:
                    continue
                r = bench_spec(spec, relu, a, reorder=(a.reorders and model == "resnet50" and not relu))
                for c in cols:
                    tot[c] += n * r["t"][c]
                    tot_min[c] += n * r["min"][c]
                if "reorder" in r:
                    ri, ro, impls = r["reorder"]
                    rt = reorder_tot.setdefault(model, [0.0, 0.0, set()])
                    rt[0] += n * ri
                    rt[1] += n * ro
                    rt[2].add(impls)
                line = (f"{spec.label:22s} x{n} {r['kernel']:14s} "
                        + " ".join(f"{c}={r['t'][c]:.3f}" for c in cols) + f" {r['impl']}")
                print(line, file=sys.stderr, flush=True)
                t.add_row(spec.label, str(n), r["kernel"], *[f"{r['t'][c]:.3f}" for c in cols],
                          f"{r['impl']['nchw']} | {r['impl']['any']}" + (f" | {r['impl']['8c']}" if a.nchw8c else ""),
                          r["formats"]["any"], f"{r['t']['dnnl any'] / r['t']['ort']:.2f}x",
                          f"{r['t']['glassrt'] / r['t']['ort']:.2f}x", f"{max(r['err'].values()):.1e}")
            t.add_row(f"all {model} convs", str(sum(convs.values())), "(weighted)", *[f"{tot[c]:.2f}" for c in cols],
                      "", "", f"{tot['dnnl any'] / tot['ort']:.2f}x", f"{tot['glassrt'] / tot['ort']:.2f}x", "",
                      style="bold")
            totals[model] = tot
            totals_min[model] = tot_min
            console.print(t)
        s = Table(title=f"Per-model conv totals{' (Conv + Relu)' if relu else ''}, ms, {a.threads} threads: sum "
                        f"over the model's convs of each shape's median (and of its fastest run)")
        for c in ["model", "stat"] + cols + ["glassrt/ort", "dnnl nchw/ort", "dnnl any/ort"]:
            s.add_column(c, justify="left" if c in ("model", "stat") else "right")
        for model in totals:
            for stat, tot in (("median", totals[model]), ("min", totals_min[model])):
                s.add_row(model, stat, *[f"{tot[c]:.2f}" for c in cols], f"{tot['glassrt'] / tot['ort']:.2f}x",
                          f"{tot['dnnl nchw'] / tot['ort']:.2f}x", f"{tot['dnnl any'] / tot['ort']:.2f}x")
        console.print(s)
        for model, (ri, ro, impls) in reorder_tot.items():
            console.print(f"[bold]{model}[/]: reorders around every conv (plain->'any' src, 'any'->plain dst), "
                          f"summed over its {sum(specs[model].values())} convs: {ri:.2f} ms in + {ro:.2f} ms out = "
                          f"{ri + ro:.2f} ms, vs {totals[model]['dnnl any']:.2f} ms of blocked convs "
                          f"(reorder impls: {sorted(impls)})")


def run_ab(a):
    """oneDNN `any` vs onnxruntime only (no glassrt/BLAS threads in the process): a longer,
    two-contender check of the per-model totals, repeated --repeat times."""
    import onnxruntime as ort

    from glassrt.kernels.onednn import capi

    capi.set_num_threads(a.threads)
    for model in a.models:
        convs = model_convs(model)
        setups = []
        for spec, n in convs.items():
            w, b, x = weights(spec)
            so = ort.SessionOptions()
            so.intra_op_num_threads, so.inter_op_num_threads, so.log_severity_level = a.threads, 1, 3
            if a.ort_no_spin:
                so.add_session_config_entry("session.intra_op.allow_spinning", "0")
            o = ort.InferenceSession(conv_model(spec, w, b, a.relu == "only"), so, providers=["CPUExecutionProvider"])
            d = OneDNNConv(spec, w, b, x, a.relu == "only", "any")
            g = None
            if a.ab_glassrt:  # a third contender: glassrt's session (BLAS / Numba threads in the process)
                import glassrt

                gs = glassrt.InferenceSession(conv_model(spec, w, b, a.relu == "only"), providers=["cpu"],
                                              sess_options=glassrt.SessionOptions(intra_op_num_threads=a.threads))
                g = (lambda gs=gs, x=x: gs.run(None, {"x": x}))
            setups.append((spec, n, d, (lambda o=o, x=x: o.run(None, {"x": x})), g))
        for rep in range(a.repeat):
            td = to = tdm = tom = 0.0
            for spec, n, d, orun, grun in setups:
                fns = {"glassrt": grun} if grun else {}
                fns.update({"dnnl": d, "ort": orun})
                r = alternating(fns, a.runs, pause=a.pause)
                td += n * med(r["dnnl"])
                to += n * med(r["ort"])
                tdm += n * min(r["dnnl"])
                tom += n * min(r["ort"])
            print(f"{model} convs{' + relu' if a.relu == 'only' else ''}, rep {rep}: dnnl any {td:.2f} ms, "
                  f"ort {to:.2f} ms, ratio {td / to:.2f}x (sums of medians); mins {tdm:.2f} vs {tom:.2f} = "
                  f"{tdm / tom:.2f}x", flush=True)


# --------------------------------------------------------------------------- per-call overhead


def run_overhead(a):
    from glassrt.kernels.onednn import capi
    from glassrt.kernels.onednn import dnnl as D

    def med_us(fn, n=20000, reps=7):
        res = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            res.append((time.perf_counter() - t0) / n * 1e6)
        return statistics.median(res)

    for threads in (1, a.threads):
        capi.set_num_threads(threads)
        x, y, y2 = np.ones(16, np.float32), np.empty(16, np.float32), np.empty(16, np.float32)
        pd = D.eltwise(D.md((16,), np.float32, "a"), None, "relu")
        step = pd.primitive().bind({D.ARG_SRC: x, D.ARG_DST: y})
        s = D.stream()
        ex, wait = capi._execute, capi._wait
        ph, sh, na, ar = step._prim_h, s.handle, step._nargs, step._args
        alt = [{D.ARG_DST: y}, {D.ARG_DST: y2}]
        i = [0]

        def new_dst():
            i[0] ^= 1
            step.run(alt[i[0]])

        print(f"{threads} thread(s), relu on 16 floats ({pd.impl}), median of 7 x 20000 calls, "
              f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}:")
        print(f"  execute + stream wait (raw ctypes)   {med_us(lambda: (ex(ph, sh, na, ar), wait(sh))):6.2f} us")
        print(f"  Step.run()                           {med_us(step.run):6.2f} us")
        print(f"  Step.run(dst = another array)        {med_us(new_dst):6.2f} us  (set_data_handle, checked)")
        print(f"  numpy.maximum(x, 0, out=y)           {med_us(lambda: np.maximum(x, 0, out=y)):6.2f} us")


# --------------------------------------------------------------------------- OpenMP wait policy under load

_CHILD = r"""
import os, sys, time, statistics, json
sys.path.insert(0, {root!r})
import numpy as np
SHAPES = [(64, 64, 56, 3), (256, 64, 56, 1), (128, 128, 28, 3), (512, 128, 28, 1), (256, 256, 14, 3),
          (1024, 256, 14, 1)]
rng = np.random.default_rng(0)
W = [(rng.standard_normal((m, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32) for c, m, hw, k in SHAPES]
if {which!r} == "dnnl":
    from glassrt.kernels.onednn import capi, dnnl as D
    capi.set_num_threads({threads})
    steps = []
    for (c, m, hw, k), w in zip(SHAPES, W):
        pd = D.conv((1, c, hw, hw), w.shape, pads=[k // 2] * 4, bias=False, src_format="any", post_ops=["relu"])
        steps.append(pd.primitive().bind({{D.ARG_SRC: D.from_numpy(rng.standard_normal((1, c, hw, hw)).astype(
            np.float32), pd.src_md()), D.ARG_DST: D.Memory(pd.dst_md()),
            D.ARG_WEIGHTS: D.prepack(w, D.md(w.shape, np.float32, "oihw"), pd.weights_md())}}))
    def net():
        for st in steps:
            st.run()
else:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    # one session (one thread pool): six sessions would each keep a spinning worker
    nodes, ins, outs, inits, feeds = [], [], [], [], {{}}
    for i, ((c, m, hw, k), w) in enumerate(zip(SHAPES, W)):
        nodes += [helper.make_node("Conv", [f"x{{i}}", f"w{{i}}"], [f"c{{i}}"], pads=[k // 2] * 4),
                  helper.make_node("Relu", [f"c{{i}}"], [f"y{{i}}"])]
        ins.append(helper.make_tensor_value_info(f"x{{i}}", TensorProto.FLOAT, [1, c, hw, hw]))
        outs.append(helper.make_tensor_value_info(f"y{{i}}", TensorProto.FLOAT, None))
        inits.append(numpy_helper.from_array(w, f"w{{i}}"))
        feeds[f"x{{i}}"] = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = {threads}, 1
    if {which!r} == "ort_nospin":
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    o = ort.InferenceSession(helper.make_model(helper.make_graph(nodes, "g", ins, outs, inits),
                                               opset_imports=[helper.make_opsetid("", 18)],
                                               ir_version=9).SerializeToString(), so,
                             providers=["CPUExecutionProvider"])
    def net():
        o.run(None, feeds)
for _ in range(3):
    net()
ts = []
cpu0 = time.process_time()
end = time.time() + {seconds}
while time.time() < end:
    t0 = time.perf_counter(); net(); ts.append(time.perf_counter() - t0)
    time.sleep({gap})
print(json.dumps({{"median_ms": statistics.median(ts) * 1e3, "p90_ms": float(np.percentile(ts, 90)) * 1e3,
                  "min_ms": min(ts) * 1e3, "n": len(ts), "cpu_per_run_ms": (time.process_time() - cpu0) / len(ts) * 1e3}}))
"""

_HOG = "import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass\n"


def run_wait_policy(a):
    import json

    root = str(Path(__file__).resolve().parent.parent)
    envs = [("dnnl", "OMP_WAIT_POLICY unset", {}), ("dnnl", "OMP_WAIT_POLICY=passive", {"OMP_WAIT_POLICY": "passive"}),
            ("dnnl", "OMP_WAIT_POLICY=active", {"OMP_WAIT_POLICY": "active"}),
            ("dnnl", "GOMP_SPINCOUNT=0", {"GOMP_SPINCOUNT": "0"}),
            ("dnnl", "GOMP_SPINCOUNT=10000", {"GOMP_SPINCOUNT": "10000"}),
            ("ort", "onnxruntime (control)", {}), ("ort_nospin", "onnxruntime, no spinning", {})]
    print(f"6 resnet50 conv shapes (+ relu), blocked layout, {a.threads} threads, a pass every {a.gap * 1e3:.0f} ms "
          f"of idle, {a.seconds:.0f} s per line, each line a fresh process; other busy processes started beside it. "
          "ms per pass: median / p90 / min, and the process's CPU time per pass")
    for rep in range(a.repeat):
        for hogs in a.hogs:
            for which, label, extra in envs:
                env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
                env.update(extra)
                procs = [subprocess.Popen([sys.executable, "-c", _HOG.format(seconds=a.seconds + 30)])
                         for _ in range(hogs)]
                try:
                    code = _CHILD.format(root=root, threads=a.threads, seconds=a.seconds, gap=a.gap, which=which)
                    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                         timeout=a.seconds + 120)
                finally:
                    for p in procs:
                        p.kill()
                        p.wait()
                if out.returncode:
                    print(out.stderr[-2000:])
                    continue
                r = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"  rep {rep} {hogs} busy  {label:24s} median {r['median_ms']:7.2f}  p90 {r['p90_ms']:7.2f}  "
                      f"min {r['min_ms']:6.2f}  passes {r['n']:4d}  cpu/pass {r['cpu_per_run_ms']:6.2f}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", nargs="*", default=["resnet50", "squeezenet"])
    ap.add_argument("--match", default="", help="only shapes whose label contains this")
    ap.add_argument("--relu", choices=["both", "no", "only"], default="both", help="tables without/with a Relu")
    ap.add_argument("--nchw8c", action="store_true", help="also time src/dst forced to nChw8c")
    ap.add_argument("--no-reorders", dest="reorders", action="store_false")
    ap.add_argument("--pause", type=float, default=0.15, help="seconds before each block")
    ap.add_argument("--ort-no-spin", action="store_true")
    ap.add_argument("--overhead", action="store_true", help="only measure a bound Step's per-call overhead")
    ap.add_argument("--ab", action="store_true", help="only oneDNN `any` vs onnxruntime, per-model totals")
    ap.add_argument("--ab-glassrt", action="store_true", help="--ab with glassrt's session run as well (untimed)")
    ap.add_argument("--wait-policy", action="store_true", help="only the OMP_WAIT_POLICY/GOMP_SPINCOUNT experiment")
    ap.add_argument("--hogs", type=int, nargs="*", default=[0, 1, 2], help="busy processes for --wait-policy")
    ap.add_argument("--seconds", type=float, default=6.0, help="per --wait-policy configuration")
    ap.add_argument("--gap", type=float, default=0.005, help="idle time between runs for --wait-policy")
    ap.add_argument("--repeat", type=int, default=1, help="repetitions of the --wait-policy sweep")
    ap.add_argument("--omp-wait-policy", choices=["unset", "passive", "active"], default=None,
                    help="re-run this script with OMP_WAIT_POLICY so (libgomp reads it once, when it loads)")
    a = ap.parse_args(argv)
    if a.omp_wait_policy is not None:
        want = None if a.omp_wait_policy == "unset" else a.omp_wait_policy
        if os.environ.get("OMP_WAIT_POLICY") != want:
            env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
            if want:
                env["OMP_WAIT_POLICY"] = want
            os.execve(sys.executable, [sys.executable, *sys.argv], env)
    from glassrt.kernels.onednn import capi

    if capi.UNAVAILABLE:
        sys.exit(f"oneDNN unavailable: {capi.UNAVAILABLE}")
    if a.overhead:
        return run_overhead(a)
    if a.wait_policy:
        return run_wait_policy(a)
    if a.ab:
        return run_ab(a)
    print(capi.info(), f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}",
          f"GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT')}", file=sys.stderr)
    run_tables(a)


if __name__ == "__main__":
    main()
