"""8-bit convolutions (QLinearConv, ConvInteger) exact on oneDNN's float32 convolution, for
CPUs whose 8-bit products saturate.

Without VNNI or AMX (AVX2, AVX-512 before Cascade Lake) oneDNN's u8 x s8 convolutions pass
pairs of products through a saturating 16-bit add, so int8.py's kernels refuse there, and
cpu's exact path (im2col, then float32 GEMMs one group at a time) is slow: measured on a
2-core AVX2 EPYC (Zen 1), a quantize_static MobileNetV2 (QOperator) ran 404 ms against
onnxruntime's 13, 96 % of it in QLinearConv.

Here the integer convolution runs as a float32 one. (x - xz) and (w - wz) are integers;
where every partial sum stays within 2**24 in magnitude float32 holds each exactly, in
whatever order the kernel adds them. That bound is checked once per filter, on the constant
weights and bias, with the largest |x - xz| the input's type allows:
    max|x - xz| * sum_k |w[m, k] - wz[m]| + |b[m]| <= 2**24
(the suite's quantize_static MobileNetV2: its 960-input filters reach 55 % of it). Where a
filter reaches past it and the conv is not grouped, the input channels are cut into runs
that each stay within it (`_channel_parts`), one convolution a run, their sums added in
float64 and requantized in NumPy (the light ResNet-50 through quantize_static: 11 of its 53
convs, 3x3 over 512 channels and wider; 416 -> 164 ms against onnxruntime's 141). A grouped
conv past it is refused, `explain` says why, and cpu's exact path runs.

Three oneDNN primitives a call, each a jit kernel on AVX2:
  reorder  x (8-bit, NCHW or NHWC) -> float32 NHWC x - xz       (its source zero point)
  conv     float32 + b, then post-ops: * M per filter, round half to even  -> float32 NHWC
  reorder  -> y = that + yz, saturated to y's type               (its destination zero point)
M = x_scale * w_scale / y_scale formed in float32, so y = sat(rint(fl((acc + b) * M)) + yz):
onnxruntime's requantization (MLAS's), bit for bit, and cpu's kernel's but where its float64
product lands the other side of a rounding tie. ConvInteger stops after the conv: its int32
sums, exact.
"""
from __future__ import annotations

import math

import numpy as np

from ..buffers import NHWC
from ..registry import kernel
from . import dnnl
from .capi import ARG_ATTR_ZERO_POINTS
from .dnnl import ARG_BIAS, ARG_DST, ARG_FROM, ARG_SRC, ARG_TO, ARG_WEIGHTS, MemoryDesc
from .int8 import _I8, _conv_integer_geometry, _conv_integer_reason
from .kernels import _PerThreads, _Views, _fmt, _workspace_views, _ws_bytes, packed_weights, shared_pd

EXACT_LIMIT = 1 << 24  # float32 holds every integer up to here


class _Spec:
    """What a QLinearConv / ConvInteger node needs, read once from its constants: the
    centered float32 weights (grouped as oneDNN takes them), bias, zero points, multiplier."""

    def __init__(self, ctx, qlinear: bool):
        self.qlinear = qlinear
        w = ctx.const(3 if qlinear else 1)
        wz_i, xz_i = (5, 2) if qlinear else (3, 2)
        self.m, self.group = int(w.shape[0]), int(ctx.attrs.get("group", 1))
        self.geometry = _conv_integer_geometry(ctx, w_at=3 if qlinear else 1)
        wz = ctx.const(wz_i) if ctx.has(wz_i) else None
        xz = ctx.const(xz_i) if ctx.has(xz_i) else None
        # glassrt::CenteredQLinearConv: x and/or y as float32 codes minus their zero point
        self.x_centered = bool(int(ctx.attrs.get("x_centered", 0)))
        self.y_centered = bool(int(ctx.attrs.get("y_centered", 0)))
        self.x_dtype = np.dtype(ctx.dtype(2) if self.x_centered else ctx.dtype(0))
        self.y_dtype = np.dtype(np.int32) if not qlinear else np.dtype(ctx.dtype(7) if ctx.has(7) else self.x_dtype)
        self.why = self._constants(ctx, w, wz, xz)
        if self.why:
            return
        # w - wz as int16 (8-bit codes less a zero point of their type: within +-255), its
        # absolute values for the bound, then the float32 weights: 8 bytes a weight made where
        # int32 differences, their absolute values and a float32 copy were 12 (each page new:
        # a MobileNetV2's 52 convs)
        diff = w.astype(np.int16)
        if self.wz.any():
            diff -= (self.wz.reshape(-1, 1, 1, 1) if self.wz.size > 1 else self.wz.reshape(())).astype(np.int16)
        lo, hi = (-128, 127) if self.x_dtype == np.int8 else (0, 255)
        reach = max(self.xz - lo, hi - self.xz)  # the largest |x - xz| an input can have
        # per filter, the most its products can add: reach * sum |w| (per input channel only
        # where a filter goes past the bound and its channels are cut into parts below)
        bound = reach * np.abs(diff).reshape(self.m, -1).sum(axis=1, dtype=np.int64) + \
            (0 if self.bias is None else np.abs(self.bias.astype(np.int64)))
        centered = diff.astype(np.float32)
        self.parts = [(0, w.shape[1])]
        if bound.max() > EXACT_LIMIT:
            reaches = reach * np.abs(diff).reshape(*diff.shape[:2], -1).sum(axis=2, dtype=np.int64)
            self.parts = _channel_parts(reaches) if self.group == 1 else None
            if not self.parts or len(self.parts) > MAX_PARTS:
                self.why = (f"a filter's sums can reach {int(bound.max()):,} (|x - x_zero_point| up to {reach} times "
                            f"its weights plus bias): past 2**24, where float32 stops holding integers exactly, "
                            + ("and a grouped conv is not cut into parts" if self.group > 1 else
                               f"and cut into parts that stay within it it would take over {MAX_PARTS}"))
                return
        self.weights = [np.ascontiguousarray(centered[:, c0:c1]).reshape(
            dnnl.grouped_weights_shape((self.m, c1 - c0, *w.shape[2:]), self.group)) for c0, c1 in self.parts]
        self.bias_f = None if self.bias is None else self.bias.astype(np.float32)

    def _constants(self, ctx, w, wz, xz):
        """Reads the zero points, bias and scales; why not, where one is not a constant of a
        supported shape (they are fixed into the primitives)."""
        m = self.m
        if ctx.has(2) and xz is None:
            return "x_zero_point is computed at run time (this kernel fixes it into its primitives)"
        if xz is not None and (xz.size != 1 or xz.dtype != self.x_dtype):
            return f"x_zero_point is {xz.dtype}{list(xz.shape)}, not one {self.x_dtype} value"
        self.xz = 0 if xz is None else int(xz.reshape(-1)[0])
        if wz is None and ctx.has(5 if self.qlinear else 3):
            return "w_zero_point is computed at run time"
        self.wz = np.zeros(1, np.int32) if wz is None else wz.astype(np.int32).reshape(-1)
        if self.wz.size not in (1, m):
            return f"w_zero_point has {self.wz.size} values, neither one nor one per filter ({m})"
        self.bias = None
        if not self.qlinear:
            return None
        if ctx.has(8):
            b = ctx.const(8)
            if b is None or b.dtype != np.int32 or b.shape != (m,):
                return "the bias is not a constant int32 vector with one value per filter"
            self.bias = b
        scales = [ctx.const(i) for i in (1, 4, 6)]
        if any(s is None or s.dtype != np.float32 for s in scales):
            return "a scale is computed at run time or not float32 (this kernel fixes them into its primitives)"
        xs, ws, ys = scales
        if xs.size != 1 or ys.size != 1 or ws.size not in (1, m):
            return f"scales of {xs.size}, {ws.size}, {ys.size} values: x's and y's must be one, w's one or one per filter"
        if self.y_dtype not in (np.dtype(np.uint8), np.dtype(np.int8)):
            return f"y is {self.y_dtype}, not 8-bit"
        yz = ctx.const(7) if ctx.has(7) else None
        if ctx.has(7) and (yz is None or yz.size != 1):
            return "y_zero_point is computed at run time or holds more than one value"
        self.yz = 0 if yz is None else int(yz.reshape(-1)[0])
        # the multiplier as onnxruntime forms it: x_scale * w_scale / y_scale, in float32
        with np.errstate(all="ignore"):
            mult = (xs.reshape(()) * ws.reshape(-1) / ys.reshape(())).astype(np.float32)
        if not np.isfinite(mult).all():
            return "the scales make a multiplier that is not finite (a zero y_scale): cpu's kernel takes it as it is"
        self.mult = np.ascontiguousarray(np.broadcast_to(mult, (m,)).reshape(1, m, 1, 1))
        return None

    def conv_pd(self, part: int = 0):
        """The float32 convolution's descriptor (shared by equal convolutions): of the whole
        input with the bias and, for QLinearConv, the requantizing post-ops; or, where the
        input channels are cut into parts, of part `part` alone, its sums as they are."""
        x_shape, k, begin, end, out_hw, strides, dil = self.geometry
        whole = len(self.parts) == 1
        if not whole:  # (parts are cut only where group is 1: their channels are the input's)
            c0, c1 = self.parts[part]
            x_shape = (x_shape[0], c1 - c0, *x_shape[2:])
        x_shape = tuple(x_shape)
        y_shape = (x_shape[0], self.m, *out_hw)
        post = dnnl.PostOps()
        centered = None
        if self.qlinear and whole:
            post.binary("mul", MemoryDesc.create((1, self.m, 1, 1), np.float32, "abcd")).eltwise("round")
            if self.y_centered:  # sat(v + yz) - yz, exactly (v is a whole number): y's codes minus yz
                lo, hi = np.iinfo(self.y_dtype).min, np.iinfo(self.y_dtype).max
                centered = (float(lo - self.yz), float(hi - self.yz))
                post.eltwise("clip", *centered)
        bias = whole and self.bias_f is not None
        wshape = self.weights[part].shape
        key = ("8-bit conv as float32", x_shape, wshape, tuple(strides), tuple(dil), tuple(begin), tuple(end), bias,
               self.qlinear and whole, centered)
        return shared_pd(key, lambda: dnnl.convolution(
            MemoryDesc.create(x_shape, np.float32, "acdb"), MemoryDesc.create(wshape, np.float32, "any"),
            MemoryDesc.create(y_shape, np.float32, "acdb"), MemoryDesc.create((self.m,), np.float32, "a") if bias else None,
            strides=list(strides), dilations=[d - 1 for d in dil], padding_l=list(begin), padding_r=list(end),
            attr=dnnl.Attr(post_ops=post)), ahead=True)

    @property
    def shapes(self):
        x_shape, out_hw = self.geometry[0], self.geometry[4]
        return tuple(x_shape), (x_shape[0], self.m, *out_hw)


MAX_PARTS = 16


def _channel_parts(reaches: np.ndarray) -> list[tuple[int, int]]:
    """The input channels cut into runs [c0, c1) in each of which every filter's products
    can add up to at most 2**24 (`reaches`: filters x channels, the most each channel's
    products add): each run's sums are exact in float32, and their total is formed in float64."""
    parts, c0, run = [], 0, np.zeros(reaches.shape[0], np.int64)
    for c in range(reaches.shape[1]):
        if (run + reaches[:, c]).max() > EXACT_LIMIT:
            if c == c0:
                return []  # (one channel past it alone: a kernel of over 500 taps of 8 bits)
            parts.append((c0, c))
            c0, run = c, np.zeros_like(run)
        run += reaches[:, c]
    return parts + [(c0, reaches.shape[1])]


def _spec(ctx, qlinear: bool) -> _Spec:
    """The node's _Spec, read once for placement and every plan (a value: its arrays are only
    read, so the contexts of one node share it, as they share verdicts)."""
    return ctx.verdict(("8-bit conv as float32: spec", qlinear), lambda: _Spec(ctx, qlinear))


def _reason(ctx, qlinear: bool):
    def now():
        why = _conv_integer_reason(ctx, w_at=3 if qlinear else 1, wz_at=5 if qlinear else 3, impl=False,
                                   isa=False)
        if why:
            return why
        spec = _spec(ctx, qlinear)
        if spec.why:
            return spec.why
        for part in range(len(spec.parts)):
            impl = spec.conv_pd(part).impl
            if impl.startswith(("ref", "gemm:")):
                return f"oneDNN has only its generic implementation ({impl}) for this convolution"
        return None
    return ctx.verdict(("8-bit conv as float32", qlinear), now)


def _workspace(ctx, qlinear: bool) -> int:
    """The float32 x and y of a conv made whole (one made in parts keeps buffers of its own)."""
    if ctx.shape(0) is None or ctx.out_shape(0) is None or not all(type(d) is int for d in ctx.shape(0)) \
            or _reason(ctx, qlinear) is not None or len(_spec(ctx, qlinear).parts) > 1:
        return 0
    return _ws_bytes(math.prod(ctx.shape(0)), math.prod(ctx.out_shape(0)))


def _bind(ctx, qlinear: bool):
    spec = _spec(ctx, qlinear)
    in_layout = ctx.layout(ctx.node.inputs[0])
    out_layout = ctx.layout(ctx.node.outputs[0]) if qlinear else "nchw"
    if len(spec.parts) > 1:
        return _bind_parts(spec, in_layout)
    x_shape, y_shape = spec.shapes
    xf, yf = _workspace_views(ctx.workspace, math.prod(x_shape), math.prod(y_shape))
    xf = xf.reshape(x_shape[0], *x_shape[2:], x_shape[1])  # NHWC
    yf = yf.reshape(y_shape[0], *y_shape[2:], y_shape[1])

    # a centered x or y laid out channels-last is the conv's own source or destination
    x_direct, y_direct = spec.x_centered and in_layout == NHWC, spec.y_centered and out_layout == NHWC

    def to_float_pd():
        return _to_float_pd(x_shape, x_shape, (0, 0, 0, 0), spec.x_dtype, in_layout, spec.x_centered)

    def to_out_pd():
        y_dtype = np.float32 if spec.y_centered else spec.y_dtype
        zero_points = {ARG_TO: 0} if qlinear and not spec.y_centered else {}
        return shared_pd(("float32 to 8-bit", y_shape, np.dtype(y_dtype).str, out_layout, qlinear, spec.y_centered),
                         lambda: dnnl.reorder(MemoryDesc.create(y_shape, np.float32, "acdb"),
                                              MemoryDesc.create(y_shape, y_dtype, _fmt(out_layout)),
                                              attr=dnnl.Attr(zero_points=zero_points)), ahead=True)

    # (made now: their primitives are made ahead, as the conv's, ahead.py)
    None if x_direct else to_float_pd()
    None if y_direct else to_out_pd()

    def build():
        pd = spec.conv_pd()
        args = {ARG_SRC: xf, ARG_WEIGHTS: packed_weights(spec.weights[0], None, pd.weights_md()).memory, ARG_DST: yf}
        if spec.bias_f is not None:
            args[ARG_BIAS] = spec.bias_f
        if qlinear:
            args[pd.attr.post_ops.binary_arg()] = spec.mult
        conv = pd.primitive().bind(args)
        to_float = None if x_direct else to_float_pd().primitive().bind(
            {ARG_FROM: None, ARG_TO: xf} if spec.x_centered else
            {ARG_FROM: None, ARG_TO: xf, ARG_ATTR_ZERO_POINTS | ARG_FROM: dnnl.vector(np.array([spec.xz], np.int32))})
        if y_direct:
            return to_float, conv, None
        out_args = {ARG_FROM: yf, ARG_TO: None}
        if qlinear and not spec.y_centered:
            out_args[ARG_ATTR_ZERO_POINTS | ARG_TO] = dnnl.vector(np.array([spec.yz], np.int32))
        return to_float, conv, to_out_pd().primitive().bind(out_args)

    prims = _PerThreads(build)
    views = _Views()

    def step(x, *_, out=None):
        to_float, conv, to_out = prims.get()
        if out is None:
            out = np.empty(y_shape, np.float32 if spec.y_centered else spec.y_dtype)
            layout = "nchw"
        else:
            layout = out_layout
        if to_float is None:
            src = views("x", x, NHWC)
            if not src.flags.c_contiguous:  # (an x not laid out as planned: read through a copy)
                src = np.ascontiguousarray(src)
        else:
            to_float.run({ARG_FROM: views("x", x, in_layout)})
            src = xf
        dst = views("y", out, layout)
        if to_out is None and layout == NHWC and dst.flags.c_contiguous:
            conv.run({ARG_SRC: src, ARG_DST: dst})  # (a centered y, channels-last: the conv's own output)
            return out
        conv.run({ARG_SRC: src, ARG_DST: yf})
        if to_out is None:  # (a centered y for an output not laid out as planned)
            np.copyto(out, yf.transpose(0, 3, 1, 2))
            return out
        to_out.run({ARG_TO: dst})
        if not np.may_share_memory(dst, out):  # (an output not laid out as planned: written through a copy)
            np.copyto(out, dst.transpose(0, 3, 1, 2) if layout == NHWC else dst)
        return out

    return step


def _to_float_pd(x_shape, part_shape, offsets, x_dtype, in_layout, centered=False):
    """A reorder of x's channels [offsets[1], +part_shape[1]) (its whole, with offsets 0) into
    dense float32 NHWC, minus x's zero point (a run-time argument); or, where x is centered
    already (float32 x - x_zero_point), a copy."""
    def make():
        src = MemoryDesc.create(x_shape, np.float32 if centered else x_dtype, _fmt(in_layout))
        if tuple(part_shape) != tuple(x_shape):
            src = src.submemory(part_shape, offsets)
        return dnnl.reorder(src, MemoryDesc.create(part_shape, np.float32, "acdb"),
                            attr=None if centered else dnnl.Attr(zero_points={ARG_FROM: 0}))
    return shared_pd(("8-bit to centered float32", x_shape, part_shape, offsets, x_dtype.str, in_layout, centered),
                     make, ahead=True)


def _bind_parts(spec, in_layout):
    """A conv whose sums could pass 2**24: one float32 convolution per run of input channels
    (_channel_parts), each exact; their sums added in float64 (exact), the bias added, then
    requantized as onnxruntime does it, float32((acc + b)) * M rounded half to even, plus yz
    (ConvInteger: the int32 sums). The per-run passes write into buffers made here."""
    x_shape, y_shape = spec.shapes
    n, m, oh, ow = y_shape
    parts = spec.parts
    xs = [np.empty((n, *x_shape[2:], c1 - c0), np.float32) for c0, c1 in parts]
    ys = [np.empty((n, oh, ow, m), np.float32) for _ in parts]
    acc = np.empty((n, oh, ow, m), np.float64)
    v = np.empty((n, oh, ow, m), np.float32) if spec.qlinear else None
    bias = None if spec.bias is None else spec.bias.astype(np.float64)
    mult = spec.mult.reshape(-1) if spec.qlinear else None
    lo, hi = (float(b) for b in (np.iinfo(spec.y_dtype).min, np.iinfo(spec.y_dtype).max)) if spec.qlinear else (0, 0)
    shapes = [(n, c1 - c0, *x_shape[2:]) for c0, c1 in parts]
    offsets = [(0, c0, 0, 0) for c0, _ in parts]
    for sh, off in zip(shapes, offsets):
        _to_float_pd(x_shape, sh, off, spec.x_dtype, in_layout, spec.x_centered)  # (made now: made ahead)

    def build():
        steps = []
        for i, (sh, off) in enumerate(zip(shapes, offsets)):
            zero_point = {} if spec.x_centered else {
                ARG_ATTR_ZERO_POINTS | ARG_FROM: dnnl.vector(np.array([spec.xz], np.int32))}
            to_float = _to_float_pd(x_shape, sh, off, spec.x_dtype, in_layout, spec.x_centered).primitive().bind(
                {ARG_FROM: None, ARG_TO: xs[i], **zero_point})
            pd = spec.conv_pd(i)
            conv = pd.primitive().bind({ARG_SRC: xs[i], ARG_DST: ys[i],
                                        ARG_WEIGHTS: packed_weights(spec.weights[i], None, pd.weights_md()).memory})
            steps.append((to_float, conv))
        return steps

    prims = _PerThreads(build)
    views = _Views()

    def step(x, *_, out=None):
        src = views("x", x, in_layout)
        for to_float, conv in prims.get():
            to_float.run({ARG_FROM: src})
            conv.run()
        np.add(ys[0], ys[1], out=acc, dtype=np.float64)
        for part in ys[2:]:
            np.add(acc, part, out=acc)
        if bias is not None:
            np.add(acc, bias, out=acc)
        y = np.empty(y_shape, np.float32 if spec.y_centered else spec.y_dtype) if out is None else out
        dst = y.transpose(0, 2, 3, 1)  # (N, OH, OW, M): the buffer itself where y is channels-last, else a view
        if not spec.qlinear:
            np.copyto(dst, acc, casting="unsafe")  # (exact: within int32, the sums of MAX_PARTS parts)
            return y
        np.copyto(v, acc, casting="same_kind")  # float32(acc + b), as onnxruntime converts its int32
        np.multiply(v, mult, out=v)
        np.rint(v, out=v)
        if spec.y_centered:  # y's codes minus yz, in float32 (exact: whole numbers)
            np.clip(v, lo - spec.yz, hi - spec.yz, out=v)
            np.copyto(dst, v)
            return y
        np.add(v, spec.yz, out=v)
        np.clip(v, lo, hi, out=v)
        np.copyto(dst, v, casting="unsafe")
        return y

    return step


@kernel("QLinearConv", provider="onednn", dtypes=_I8, out=True, bind=True, accepts=lambda ctx: _reason(ctx, True),
        static_only=True, name="float32", layouts=(NHWC,), workspace=lambda ctx: _workspace(ctx, True))
def qlinear_conv(ctx):
    """QLinearConv as an exact float32 convolution (where its sums stay within 2**24), requantized
    as onnxruntime does: for CPUs without VNNI or AMX, where oneDNN's 8-bit products saturate."""
    return _bind(ctx, True)


@kernel("CenteredQLinearConv", provider="onednn", domain="glassrt", dtypes=[np.float32, *_I8], out=True, bind=True,
        accepts=lambda ctx: _reason(ctx, True), static_only=True, name="float32", layouts=(NHWC,),
        workspace=lambda ctx: _workspace(ctx, True))
def centered_qlinear_conv(ctx):
    """glassrt::CenteredQLinearConv: qlinear_conv's exact float32 convolution, its centered x
    read and its centered y written as the conv's own float32 NHWC source and destination
    (passes/center_qlinear_convs.py): the two 8-bit reorders between two such convs gone."""
    return _bind(ctx, True)


@kernel("ConvInteger", provider="onednn", dtypes=_I8, out=True, bind=True, accepts=lambda ctx: _reason(ctx, False),
        static_only=True, name="float32", workspace=lambda ctx: _workspace(ctx, False))
def conv_integer(ctx):
    """ConvInteger's int32 sums from an exact float32 convolution (where they stay within 2**24):
    for CPUs without VNNI or AMX, where oneDNN's 8-bit products saturate."""
    return _bind(ctx, False)
