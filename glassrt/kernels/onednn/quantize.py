"""Quantizing kernels on oneDNN's OpenMP pool: glassrt::QuantizeDequantize (a QDQ model's
fake-quantized activations), DynamicQuantizeLinear's codes and DequantizeLinear, each one
binary primitive.

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

DynamicQuantizeLinear: a quantize_dynamic model quantizes every activation that feeds an
integer product (a BERT-base: 49 a pass, 128 x 768 or 128 x 3072 floats each). Its range
(min and max) stays NumPy's, as cpu's kernel takes it (vector code already; NaN left out);
its codes, rint(x / scale) + zero point saturated into uint8, are one binary primitive: a
division (vdivps, the exact x / scale cpu's and onnxruntime's kernels divide by), its
epilogue a round half to even and a binary add of the zero point (both a run-time value:
the scale and zero point change every call), saturated into uint8 as it is written (a NaN
as 0, as cpu's kernel gives it): the same bytes (tests/test_onednn_quantize.py), on
OpenMP's threads, with no Numba. It was cpu's compiled loop shared out over the threads on
Numba's OpenMP layer, cpu's one-thread NumPy steps until Numba had loaded, and asking for
them started that load (~0.5 s of the GIL on its thread, started by the model's second
run): a quantize_dynamic BERT-base in a fresh process ended no run in its first 0.4-0.6 s
after the first, and its peak RSS was 375-379 MiB; 274-277 now, the steady runs the same.
"""
from __future__ import annotations

import math
import threading

import numpy as np

from ..buffers import NHWC, as_out
from ..registry import kernel
from . import capi, dnnl
from .capi import ARG_ATTR_SCALES, ARG_ATTR_ZERO_POINTS
from .dnnl import ARG_DST, ARG_FROM, ARG_SRC, ARG_SRC_0, ARG_SRC_1, ARG_TO, MemoryDesc
from .kernels import MAX_ELEMENTS, SMALL_ELEMENTS, _PerThreads, _unavailable, run_alone, shared_pd

SHARED_FROM = 16384  # values: below this the codes are made on the calling thread alone

_bound = threading.local()  # per thread: {key: (bound step, its run-time argument arrays...)}


def _bound_here(key, bind):
    """bind() for `key` and this thread's OpenMP count, made once per thread: a step's run-time
    arguments (a scale, a zero point) are arrays it reads, so each thread running a session
    binds its own. The oldest go beyond 64 (a model of many sizes)."""
    steps = getattr(_bound, "steps", None)
    if steps is None:
        steps = _bound.steps = {}
    key = (key, capi.get_max_threads())
    hit = steps.get(key)
    if hit is None:
        if len(steps) >= 64:
            steps.pop(next(iter(steps)))
        hit = steps[key] = bind()
    return hit


def _codes_step(n: int):
    """(the codes primitive for n values bound on this thread, its scale and zero point arrays)."""
    def bind():
        pd = shared_pd(("dynamic quantize codes", n), lambda: _codes_pd(n))
        scale, zero = np.zeros(1, np.float32), np.zeros(1, np.float32)
        return (pd.primitive().bind({ARG_SRC_0: None, ARG_SRC_1: scale, ARG_DST: None,
                                     pd.attr.post_ops.binary_arg(): zero}), scale, zero)

    return _bound_here(("codes", n), bind)


def _codes_pd(n: int):
    flat, one = MemoryDesc.create((n,), np.float32, "a"), MemoryDesc.create((1,), np.float32, "a")
    post = dnnl.PostOps().eltwise("round").binary("add", one)
    return dnnl.binary(flat, one, MemoryDesc.create((n,), np.uint8, "a"), "div", attr=dnnl.Attr(post_ops=post))


def _reason(ctx):
    return _unavailable(ctx)


@kernel("DynamicQuantizeLinear", provider="onednn", dtypes=[np.float32], multi=True, out=True,
        accepts=_reason, name="threads", layouts=(NHWC,))
def dynamic_quantize_linear_threads(x, *, out=(None, None, None)):
    """cpu's DynamicQuantizeLinear, its codes one oneDNN binary primitive on OpenMP's threads
    (see the module's doc); where the codes cannot be written in x's order (plain values into
    channels-last codes), cpu's kernel."""
    from ..cpu.quantize import codes_pair, data_range, dynamic_quantize_linear, dynamic_range_params

    y_out, scale_out, zp_out = (tuple(out) + (None,) * 3)[:3]
    flat = codes_pair(x, y_out) if x.size and x.size <= MAX_ELEMENTS else None
    if flat is None:
        return dynamic_quantize_linear(x, out=out)
    scale, zp = dynamic_range_params(*data_range(x))
    step, s, z = _codes_step(x.size)
    s[0], z[0] = scale, zp
    run_alone(step, {ARG_SRC_0: flat[0], ARG_DST: flat[1]}, x.size < SHARED_FROM)
    return flat[2], as_out(np.asarray(scale, np.float32), scale_out), as_out(np.asarray(zp, np.uint8), zp_out)


# ---------------------------------------------------------------- DequantizeLinear

_F32 = np.dtype(np.float32)


def _dequantize_step(n: int, dt: np.dtype):
    """(the (x - z) * s reorder of n values of dt into float32 bound on this thread, the z and
    s arrays it reads when it runs)."""
    def bind():
        pd = shared_pd(("dequantize", n, dt.str), lambda: dnnl.reorder(
            MemoryDesc.create((n,), dt, "a"), MemoryDesc.create((n,), np.float32, "a"),
            attr=dnnl.Attr(scales={ARG_SRC: 0}, zero_points={ARG_SRC: 0})))
        zero, scale = dnnl.vector(np.zeros(1, np.int32)), dnnl.vector(np.zeros(1, np.float32))
        return (pd.primitive().bind({ARG_FROM: None, ARG_TO: None, ARG_ATTR_SCALES | ARG_SRC: scale,
                                     ARG_ATTR_ZERO_POINTS | ARG_SRC: zero}), zero.array, scale.array)

    return _bound_here(("dequantize", n, dt.str), bind)


def _dequantize_reason(ctx):
    why = _unavailable(ctx)
    if why:
        return why
    shape = ctx.shape(0)
    if shape is not None and all(type(d) is int for d in shape) and math.prod(shape) < SMALL_ELEMENTS:
        return (f"{math.prod(shape):,} values: cpu's kernel is quicker on so few (a primitive's call, its "
                "memory cold after a model's run, costs more than the values)")
    return None


@kernel("DequantizeLinear", provider="onednn", versions=(10, None), dtypes=[np.uint8, np.int8], out=True,
        accepts=_dequantize_reason, name="binary", layouts=(NHWC,), blas=False)
def dequantize_linear_binary(x, x_scale, x_zero_point=None, *, out=None, axis=1, block_size=0, output_dtype=0):
    """y = (x - x_zero_point) * x_scale per tensor into float32: one reorder of the 8-bit
    values, its source zero point and scale run-time values (oneDNN's binary primitive has
    only its reference kernel for 8-bit operands: 4.5 ms for 98,304 values, this 30 us). The
    8-bit x - z is exact and the product one rounding, cpu's steps: its bytes, measured
    over 2,400 random cases with infinite, NaN, zero and negative scales. A quantize_dynamic
    BERT-base dequantizes its three gathered embeddings this way every run; cpu's kernel does
    it in one compiled pass once Numba has loaded, and asking for that pass started Numba's
    load (~0.5 s of the GIL on its thread, ~100 MB) in a model that needs nothing else of it.
    Per axis, blocked, another output type, a zero point of another type: cpu's kernel."""
    from ..cpu.quantize import _flat_pair, _np, dequantize_linear

    per_tensor = x_scale.dtype == _F32 and x_scale.size == 1 and not block_size and x.size \
        and x.size <= MAX_ELEMENTS and (not output_dtype or _np(output_dtype) == _F32) \
        and (x_zero_point is None or (x_zero_point.dtype == x.dtype and x_zero_point.size == 1))
    y = (np.empty(x.shape, np.float32) if out is None else out) if per_tensor else None
    pair = _flat_pair(x, y) if per_tensor and y.shape == x.shape and y.dtype == _F32 else None
    if pair is None:
        return dequantize_linear(x, x_scale, x_zero_point, out=out, axis=axis, block_size=block_size,
                                 output_dtype=output_dtype)
    step, z, s = _dequantize_step(x.size, x.dtype)
    z[0] = 0 if x_zero_point is None else x_zero_point.reshape(-1)[0]
    s[0] = x_scale.reshape(-1)[0]
    step.run({ARG_FROM: pair[0], ARG_TO: pair[1]})  # (static shapes of fewer values stayed on cpu: _dequantize_reason)
    return y


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
