"""Quantizing kernels on oneDNN's OpenMP pool: glassrt::QuantizeDequantize (a QDQ model's
fake-quantized activations) as one binary primitive, and DynamicQuantizeLinear.

QuantizeDequantize, (clip(rint(x / s) + z, lo, hi) - z) * s, is a binary division of x by
s (vdivps: the exact x / s, as cpu's kernel and onnxruntime divide; a multiply by 1 / s
rounds some values the other way) whose epilogue is round (half to even), a clip to
(lo - z, hi - z), then a binary multiply by s (fake_quant_post_ops): the same bits as cpu's
kernel (tests/test_onednn_quantize.py). Measured on the 2-core AVX2 machine, a
quantize_static MobileNetV2 in QDQ form (66 of them a run): 46 ms a run on cpu's NumPy
path, 7.4 on its compiled loop (one thread), and that loop needs Numba, whose load stalled
runs 2-10 of a fresh process to 1.2-1.5 s in all; here 0.15-0.22 s, two threads and no
Numba (peak RSS 236 -> 111 MiB), the 66 passes 6.9-8.2 ms a run (the pass is memory-bound;
alternating processes, OpenBLAS pinned and not).

DynamicQuantizeLinear: a quantize_dynamic model quantizes every
activation that feeds an integer product (a BERT-base: 49 a pass, 128 x 768 or 128 x 3072
floats each), and cpu's kernel does it on one thread: its range (min and max) and then
its codes (a float32 division each: the exact x / scale onnxruntime's kernel divides by;
a reorder that multiplies by the reciprocal gives other codes). Here each of OpenMP's
threads takes a block of the values for the codes, cpu's compiled loop on its block, run
on Numba's `omp` layer, the pool oneDNN's primitives run on (row_panels.py: no second pool
spinning beside it): the same bytes. The range stays NumPy's min and max (vector code
already; a compiled min/max that keeps NaN did not vectorize: 10x slower, measured).

Only where the loops can run (Numba already loaded by the process, OpenMP's layer, not a
forked child: row_panels.why_not_here), on values and codes laid out alike (plain or
channels-last) and large enough to share out; otherwise each call is cpu's kernel.
"""
from __future__ import annotations

import math

import numpy as np

from ..buffers import NHWC, as_out
from ..cpu._jit import compiled, jit, numba_threads
from ..registry import kernel
from . import capi, dnnl, row_panels
from .dnnl import ARG_DST, ARG_SRC_0, ARG_SRC_1, MemoryDesc
from .kernels import SMALL_ELEMENTS, _PerThreads, _unavailable, run_alone, shared_pd

SHARED_FROM = 16384  # values: below this one thread's pass is a few microseconds

prange = range  # numba.prange once the loops are compiled (_why_not)
_quantize8 = None  # cpu's loop, bound when the loops are compiled (cpu's module loads ml_dtypes: not before)


@jit(parallel=True, boundscheck=False)
def _codes(x, s, z, out, threads):  # pragma: no cover - compiled
    """cpu's codes (its compiled loop, _quantize8) of each thread's block of x."""
    n = x.size
    for t in prange(threads):
        a, b = n * t // threads, n * (t + 1) // threads
        _quantize8(x[a:b], s, z, np.float32(0), np.float32(255), out[a:b])


_READY: list = []  # [None] once compiled, [reason] when the loops cannot run


def _why_not() -> str | None:
    why = row_panels.why_not_here()  # (Numba loaded, its OpenMP layer, not a forked child)
    if why is None and not _READY:
        try:
            import numba

            from ..cpu import quantize as cpu

            globals()["prange"], globals()["_quantize8"] = numba.prange, compiled(cpu._quantize8)
            compiled(_codes)(np.zeros(1, np.float32), np.float32(1), np.float32(0), np.zeros(1, np.uint8), 1)
            _READY.append(None)
        except Exception as e:  # noqa: BLE001 - a Numba that cannot compile them: cpu's kernel runs
            _READY.append(f"the loops failed to compile: {type(e).__name__}: {e}")
    return why or (_READY[0] if _READY else None)


def _reason(ctx):
    return _unavailable(ctx)


@kernel("DynamicQuantizeLinear", provider="onednn", dtypes=[np.float32], multi=True, out=True,
        accepts=_reason, name="threads", layouts=(NHWC,))
def dynamic_quantize_linear_threads(x, *, out=(None, None, None)):
    """cpu's DynamicQuantizeLinear, its codes shared out over OpenMP's threads (see the
    module's doc). A quantize_dynamic BERT-base (49 calls a pass): 28.5 -> 27.5 ms a run,
    medians of a four-round A/B of this kernel alone (its calls 5.7 -> 5.1-5.3 ms)."""
    from ..cpu.quantize import codes_pair, data_range, dynamic_quantize_linear, dynamic_range_params

    y_out, scale_out, zp_out = (tuple(out) + (None,) * 3)[:3]
    threads = max(1, capi.get_max_threads())
    flat = None if threads == 1 or x.size < SHARED_FROM or _why_not() else codes_pair(x, y_out)
    if flat is None:
        return dynamic_quantize_linear(x, out=out)
    numba_threads(threads)  # (per thread; another session may have set its own since)
    scale, zp = dynamic_range_params(*data_range(x))  # (NumPy's reductions: vector code already)
    compiled(_codes)(flat[0], scale, zp, flat[1], threads)
    y = flat[2]
    return y, as_out(np.asarray(scale, np.float32), scale_out), as_out(np.asarray(zp, np.uint8), zp_out)


# ---------------------------------------------------------------- glassrt::QuantizeDequantize


def _fake_quant_params(ctx, scale: int = 1, zero: int = 2):
    """(scale, zero point) as float32 and the zero point type's range (lo, hi), from the node's
    constant inputs `scale` and `zero`; None where one is computed at run time or holds more
    than one value."""
    from ..cpu.quantize import _int_range

    scale, zero = ctx.const(scale), ctx.const(zero) if ctx.has(zero) else np.zeros((), np.uint8)
    if scale is None or zero is None or scale.size != 1 or zero.size != 1 or scale.dtype != np.float32:
        return None
    lo, hi = _int_range(zero.dtype)
    return np.float32(scale.reshape(-1)[0]), np.float32(zero.reshape(-1)[0]), float(lo), float(hi)


def _fake_quant_reason(ctx):
    why = _unavailable(ctx)
    if why:
        return why
    if _fake_quant_params(ctx) is None:
        return "the scale or zero point is computed at run time or not one value (this kernel fixes them into its primitive)"
    return None


def _fake_quant_drops_nan(ctx, scale: int = 1, zero: int = 2):
    """oneDNN's clip is a max/min instruction: a NaN comes out of it as the range's minimum,
    where the reference quantizes it to 0. The same value for uint8 (minimum 0); not for int8."""
    params = _fake_quant_params(ctx, scale, zero)
    if params is not None and params[2] != 0:
        return f"oneDNN's clip makes a NaN the range's minimum ({params[2]:.0f}), where the reference quantizes it to 0"
    return None


def fake_quant_post_ops(post, z, lo, hi, one: MemoryDesc, divide: bool = True):
    """`post` with the quantization's steps appended: [binary division by s,] round (half to
    even), clip to (lo - z, hi - z), binary multiply by s, + 0; `one` is s's descriptor (one
    value broadcast). A fused conv's epilogue (kernels.py) and this kernel's, whose
    primitive is the division itself.

    The same bits as cpu's (clip(q + z, lo, hi) - z) * s: q is a whole number, so q + z and
    the clip's result - z are exact (a q too large to add z to exactly is clipped either
    way), and a NaN becomes lo - z both ways (oneDNN's clip gives its minimum). The + 0
    turns a -0 (x just below zero rounded) into cpu's +0, as its + z - z does. Two post-ops
    fewer than the steps spelled out: a 1x1 conv's 1.2 M outputs (MobileNetV2's 16 -> 96)
    1155 -> ~980 us with the epilogue, 611 without (the division is most of the rest)."""
    if divide:
        post.binary("div", one)
    return post.eltwise("round").eltwise("clip", float(lo) - float(z), float(hi) - float(z)) \
        .binary("mul", one).eltwise("linear", 1.0, 0.0)


@kernel("QuantizeDequantize", provider="onednn", domain="glassrt", dtypes=[np.float32], out=True, bind=True,
        accepts=_fake_quant_reason, layouts=(NHWC,), static_only=True, name="binary", blas=False,
        drops_nan=_fake_quant_drops_nan)
def quantize_dequantize(ctx):
    """(clip(rint(x / s) + z, lo, hi) - z) * s as one oneDNN binary division with its epilogue
    (see the module's doc), over the output's bytes in memory order (plain or channels-last:
    each element on its own; an input laid out otherwise read into that order); an output
    laid out neither way goes through cpu's kernel."""
    from ..cpu.quantize import _flat_pair
    from ..cpu.quantize import quantize_dequantize as cpu_kernel

    s, z, lo, hi = _fake_quant_params(ctx)
    n = math.prod(int(d) for d in ctx.shape(0))
    scale = np.full(1, s, np.float32)  # (src1 of the division and of the multiply: kept alive here)

    def make_pd():
        flat = MemoryDesc.create((n,), np.float32, "a")
        one = MemoryDesc.create((1,), np.float32, "a")
        post = fake_quant_post_ops(dnnl.PostOps(), z, lo, hi, one, divide=False)
        return dnnl.binary(flat, one, flat, "div", attr=dnnl.Attr(post_ops=post))

    def pd():  # (shared by the nodes of one size and zero point; s is an argument)
        return shared_pd(("fake quantize", n, float(z), lo, hi), make_pd, ahead=True)

    pd()  # (made now: its primitive is made ahead of the first run, ahead.py)

    def build():
        desc = pd()
        return desc.primitive().bind({ARG_SRC_0: None, ARG_SRC_1: scale, ARG_DST: None,
                                      desc.attr.post_ops.binary_arg(): scale})

    prims = _PerThreads(build)
    alone = n < SMALL_ELEMENTS
    fallback = cpu_kernel(ctx)
    kept = [None, None, None]  # (x, y, their flat views): a plan hands the same arena views every run

    def flat(x, y):
        """_flat_pair, kept while x and y come back (its ~6 us, and the primitive's memories
        then see the same arrays and are not re-pointed: ~10 us each). A copy of x (its
        layout not y's) holds this run's values: made again every run."""
        if kept[0] is x and kept[1] is y:
            return kept[2]
        pair = _flat_pair(np.asarray(x, np.float32), y) if y.shape == x.shape and x.size == n else None
        if pair is not None and np.may_share_memory(pair[0], x):
            kept[:] = x, y, pair
        return pair

    def step(x, scale_in, zero_point=None, *, out=None):
        y = np.empty(x.shape, np.float32) if out is None else out
        pair = flat(x, y)
        if pair is None:
            return fallback(x, scale_in, zero_point, out=out)
        run_alone(prims.get(), {ARG_SRC_0: pair[0], ARG_DST: pair[1]}, alone)
        return y

    return step
