"""Exact 8-bit integer products on oneDNN's int8 matmul, for products with a constant B:
MatMulInteger, and the products of com.microsoft's DynamicQuantizeLSTM (its onednn kernel
is registered in contrib/microsoft_quant.py, `Int8Weights` and `lstm_reason` from here).

glassrt's own path (kernels/int_gemm.py) converts 8-bit data to float32 and runs float
GEMMs, exact but at float speed and four times the bytes. oneDNN multiplies the bytes
themselves (u8 x s8 into s32: VNNI's vpdpbusd, AMX's tdpbusd). Measured on the 2-core
AVX-512 + AMX machine: 40 x 1024 @ 1024 x 8210 (ddddocr's classifier weights) 12.9 ms -> 0.43 ms,
one LSTM step (1 x 512 @ 512 x 2048) 352 -> 19 us.

Exact only where the CPU adds the byte products without saturating: with VNNI or AMX.
Without them (AVX2, AVX-512 before Cascade Lake) oneDNN's u8 x s8 kernels pass pairs of
products through a saturating 16-bit add (vpmaddubsw), so these kernels refuse there and
cpu's exact float path runs (`explain` says why).

Any 8-bit operands map onto u8 x s8 with a correction in int32:
    A' = A as u8 (an s8 A plus 128, its zero point plus 128),
    B' = B as s8 (a u8 B minus 128), B - zb = B' + d with d = 128 - zb (u8) or -zb (s8),
    (A' - za) @ (B' + d) = A'B' - za * colsum(B') + (rowsum(A') - K * za) * d.
The primitive computes A'B'; the rest is a few int32 vector operations. int32 arithmetic
wraps, so the identity holds modulo 2**32 as onnxruntime's int32 accumulator wraps.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from ..buffers import as_out
from ..int_gemm import Prepared
from ..registry import kernel
from . import capi, dnnl
from .dnnl import ARG_BIAS, ARG_DST, ARG_SRC, ARG_WEIGHTS, MemoryDesc
from .capi import ARG_ATTR_SCALES, ARG_ATTR_ZERO_POINTS
from ...ops.geometry import per_channel_size, spatial_pads
from .kernels import KeptViews, _unavailable, packed_weights, shared_pd
from ..buffers import NHWC
from ..cpu._jit import jit

_I8 = [np.int8, np.uint8]
_PRIMITIVES_MAX = 16  # row counts kept per weight (an LSTM's batch, a classifier's sequence)


def exact_reason() -> str | None:
    """None where oneDNN's 8-bit products are exact on this CPU, else why not."""
    if capi.UNAVAILABLE:
        return f"oneDNN is unavailable: {capi.UNAVAILABLE}"
    isa = capi.require().dnnl_get_effective_cpu_isa()
    if any(isa & bits == bits for bits in (capi.CPU_ISA["avx2_vnni"], capi.CPU_ISA["avx512_core_vnni"])):
        return None
    name = capi.require().dnnl_cpu_isa2str(isa)
    return (f"the CPU's instruction set ({name.decode() if name else isa}) has no VNNI or AMX: oneDNN's 8-bit "
            "products saturate there, so glassrt's exact float path runs")


class Int8Weights(Prepared):
    """A constant 8-bit B (K, N) with its zero point (none, one, or one per column), made
    ready once for products with any number of rows: `product(a, za)` is the int32
    (a - za) @ (B - zb) of an 8-bit a (M, K), za None, one value or one per row (M, 1)."""

    def __init__(self, b: np.ndarray, zb=None):
        b = np.asarray(b)
        if b.ndim != 2 or b.dtype not in (np.int8, np.uint8):
            raise ValueError(f"B must be a 2-D 8-bit array, got {b.dtype}{list(b.shape)}")
        self.k, self.n = b.shape
        z = np.zeros((), np.int32) if zb is None else np.asarray(zb).astype(np.int32)
        if b.dtype == np.uint8:
            self.bs = np.ascontiguousarray((b ^ np.uint8(0x80)).view(np.int8))
            d = np.int32(128) - z
        else:
            self.bs = np.ascontiguousarray(b)
            d = -z
        self.d = None if not d.any() else (d.reshape(-1) if d.size > 1 else d.reshape(()))  # (zero: none)
        self._packed = {}  # weights layout -> packed B (kept alive while this is)
        self._steps = {}  # (OpenMP threads, rows) -> bound primitive

    def _pack(self, wmd):
        """B packed into the layout `wmd` (once per layout)."""
        if wmd not in self._packed:
            self._packed[wmd] = packed_weights(self.bs, None, wmd)
        return self._packed[wmd]

    @functools.cached_property
    def colsum(self) -> np.ndarray:
        """B's column sums, for a product with A's zero point (`product`): summed when
        first needed, as the requantizing path never needs them (a MobileNetV2's 1280 x 1000
        classifier: ~0.3 ms of its session's creation)."""
        return self.bs.sum(axis=0, dtype=np.int32)

    def _step(self, m: int):
        key = (capi.get_max_threads(), m)
        step = self._steps.get(key)
        if step is None:
            pd = dnnl.matmul(MemoryDesc.create((m, self.k), np.uint8, "ab"),
                             MemoryDesc.create((self.k, self.n), np.int8, "any"),
                             MemoryDesc.create((m, self.n), np.int32, "ab"))
            wmd = pd.weights_md()
            if len(self._steps) >= _PRIMITIVES_MAX:
                self._steps.pop(next(iter(self._steps)))
            step = self._steps[key] = pd.primitive().bind(
                {ARG_SRC: None, ARG_WEIGHTS: self._pack(wmd).memory, ARG_DST: None})
        return step

    @property
    def scalable(self) -> bool:
        """Whether `scaled` can run: B is s8 with no zero point (its offset d is 0), so
        oneDNN's own zero-point compensation (A's only) gives the exact sums."""
        return self.d is None and self.bs.dtype == np.int8

    def _scaled_pd(self, m: int, bias: bool, y_dtype=np.float32):
        """The scaled matmul's descriptor: float32 y, or 8-bit y with its zero point."""
        quantized = np.dtype(y_dtype) != np.float32
        attr = dnnl.Attr(scales={ARG_SRC: 0, ARG_WEIGHTS: 2},
                         zero_points={ARG_SRC: 0, ARG_DST: 0} if quantized else {ARG_SRC: 0})
        key = ("int8 scaled matmul", m, self.k, self.n, bias, np.dtype(y_dtype).str)
        return shared_pd(key, lambda: dnnl.matmul(
            MemoryDesc.create((m, self.k), np.uint8, "ab"), MemoryDesc.create((self.k, self.n), np.int8, "any"),
            MemoryDesc.create((m, self.n), y_dtype, "ab"),
            MemoryDesc.create((1, self.n), np.float32, "ab") if bias else None, attr=attr))

    def _scaled_step(self, m: int, bias: bool, y_dtype=np.float32):
        key = (capi.get_max_threads(), m, "scaled", bias, np.dtype(y_dtype).str)
        step = self._steps.get(key)
        if step is None:
            pd = self._scaled_pd(m, bias, y_dtype)
            wmd = pd.weights_md()
            if len(self._steps) >= _PRIMITIVES_MAX:
                self._steps.pop(next(iter(self._steps)))
            one = lambda dt: dnnl.vector(np.zeros(1, dt))  # noqa: E731
            args = {ARG_SRC: None, ARG_WEIGHTS: self._pack(wmd).memory, ARG_DST: None,
                    ARG_ATTR_SCALES | ARG_SRC: one(np.float32),
                    ARG_ATTR_SCALES | ARG_WEIGHTS: dnnl.vector(np.zeros(self.n, np.float32)),
                    ARG_ATTR_ZERO_POINTS | ARG_SRC: one(np.int32)}
            if np.dtype(y_dtype) != np.float32:
                args[ARG_ATTR_ZERO_POINTS | ARG_DST] = one(np.int32)
            if bias:
                args[ARG_BIAS] = None
            step = self._steps[key] = pd.primitive().bind(args)
        return step

    def requantizes(self, y_dtype) -> bool:
        """Whether `requantized` runs on a fast oneDNN kernel for y_dtype (and one row)."""
        return self.scalable and not self._scaled_pd(1, True, y_dtype).impl.startswith(("ref", "gemm:"))

    def requantized(self, a: np.ndarray, za, mult: np.ndarray, bias, y_zero_point: int, y_dtype,
                    out=None) -> np.ndarray:
        """8-bit y = saturate(round_half_even((a - za) @ B · mult + bias) + y_zero_point),
        mult and bias float32 per column (N,), bias None for none: QGemm's requantization
        (mult = alpha · a_scale · b_scale / y_scale, bias = C · mult) written by oneDNN as it
        forms the sums, which never reach memory. onnxruntime rounds (acc + C) · mult: where
        that and acc · mult + C · mult fall on two sides of a rounding tie, the code differs
        by one (as _RequantizingConv's). Only where `scalable`."""
        return self._scaled_run(a, za, 1.0, mult, bias, y_dtype, y_zero_point, out)

    def scaled(self, a: np.ndarray, za, a_scale, b_scale, bias=None, out=None) -> np.ndarray:
        """float32 (a - za) @ B · a_scale · b_scale (+ bias): the exact integer sums, scaled
        and biased by oneDNN as it writes them (onnxruntime's MatMulIntegerToFloat; B's
        scale one value or one per column). Only where `scalable`."""
        return self._scaled_run(a, za, np.float32(np.asarray(a_scale).reshape(())),
                                np.broadcast_to(np.asarray(b_scale, np.float32).reshape(-1), (self.n,)),
                                bias, np.float32, None, out)

    def _scaled_run(self, a, za, src_scale, weight_scales, bias, y_dtype, y_zero_point, out):
        """The scaled matmul of `scaled` and `requantized` (y_zero_point None: float32 y)."""
        if not self.scalable:
            raise ValueError("B has a zero point (or is uint8): its sums need product()'s corrections")
        m = a.shape[0]
        z = za if type(za) is int else (0 if za is None else int(np.asarray(za).reshape(())))
        if a.dtype == np.int8:
            a, z = a.view(np.uint8) ^ np.uint8(0x80), z + 128
        a = np.ascontiguousarray(a)
        dense = out is not None and out.flags.c_contiguous and out.shape == (m, self.n) and out.dtype == y_dtype
        y = out if dense else np.empty((m, self.n), y_dtype)
        if m:
            step = self._scaled_step(m, bias is not None, y_dtype)
            step[ARG_ATTR_SCALES | ARG_SRC].array[0] = src_scale
            step[ARG_ATTR_SCALES | ARG_WEIGHTS].array[:] = weight_scales
            step[ARG_ATTR_ZERO_POINTS | ARG_SRC].array[0] = z
            if y_zero_point is not None:
                step[ARG_ATTR_ZERO_POINTS | ARG_DST].array[0] = y_zero_point
            buffers = {ARG_SRC: a, ARG_DST: y}
            if bias is not None:
                buffers[ARG_BIAS] = np.ascontiguousarray(bias, np.float32).reshape(1, self.n)
            step.run(buffers)
        return as_out(y, out) if out is not None and not dense else y

    def product(self, a: np.ndarray, za=None) -> np.ndarray:
        if a.ndim != 2 or a.shape[1] != self.k or a.dtype not in (np.int8, np.uint8):
            raise ValueError(f"A must be an 8-bit (M, {self.k}) array, got {a.dtype}{list(a.shape)}")
        z = np.zeros((), np.int32) if za is None else np.asarray(za).astype(np.int32)
        if a.dtype == np.int8:  # as u8: A + 128, its zero point too
            a, z = a.view(np.uint8) ^ np.uint8(0x80), z + np.int32(128)
        a = np.ascontiguousarray(a)
        m = a.shape[0]
        acc = np.empty((m, self.n), np.int32)
        if m:
            self._step(m).run({ARG_SRC: a, ARG_DST: acc})
        z = z.reshape(-1, 1) if z.size > 1 else z.reshape(())
        if z.any():
            acc -= z * self.colsum
        if self.d is not None:
            rows = a.sum(axis=1, dtype=np.int32).reshape(-1, 1) - np.int32(self.k) * z
            acc += rows * self.d
        return acc


# ---------------------------------------------------------------- MatMulInteger


def constant_b_reason(ctx, zb_at: int) -> str | None:
    """Why a product's B (input 1) is not what a kernel can make ready once, when the plan is
    built: a constant non-empty 2-D 8-bit matrix whose zero point (input `zb_at`) is a
    constant of one value or one per column; or None. (This module's and int8_float_matmul.py's.)"""
    b, a_shape = ctx.const(1), ctx.shape(0)
    if b is None:
        return "B is not a constant (it is made ready once, when the plan is built)"
    if b.ndim != 2 or b.dtype not in (np.int8, np.uint8):
        return f"B is {b.dtype}{list(b.shape)}, not a 2-D 8-bit matrix"
    if b.size == 0:
        return "B is empty (cpu writes the zeros or the empty result)"
    if a_shape is None or len(a_shape) < 1:
        return "A's rank is not known"
    if ctx.has(zb_at):
        bz = ctx.const(zb_at)
        if bz is None:
            return "b_zero_point is computed at run time"
        if bz.size != 1 and bz.shape not in ((b.shape[1],), (1, b.shape[1])):
            return f"b_zero_point {list(bz.shape)} is neither one value nor one per column"
    return None


def _matmul_integer_reason(ctx):
    return _unavailable(ctx) or exact_reason() or constant_b_reason(ctx, 3)


@kernel("MatMulInteger", provider="onednn", dtypes=_I8, out=True, bind=True, accepts=_matmul_integer_reason,
        name="int8")
def matmul_integer(ctx):
    """int32 (A - a_zp) @ (B - b_zp) on oneDNN's u8 x s8 matmul, B constant (see the module doc)."""
    from ..cpu.quantize import _row_param

    weights = Int8Weights(ctx.const(1), ctx.const(3) if ctx.has(3) else None)

    def step(a, b, a_zero_point=None, b_zero_point=None, *, out=None):
        k = weights.k
        if a.shape[-1] != k:
            raise ValueError(f"inner dimensions differ: A {list(a.shape)} @ B {[k, weights.n]}")
        lead = a.shape[:-2] if a.ndim >= 2 else ()
        rows = a.reshape(-1, k)
        za = None
        if a_zero_point is not None:
            za = _row_param(a_zero_point, a.shape, "a_zero_point")
            if za.ndim:  # one per row: as many as rows, batch dims included
                za = np.broadcast_to(za, a.shape[:-1] + (1,)).reshape(-1, 1)
        acc = weights.product(rows, za)
        shape = (*lead, a.shape[-2], weights.n) if a.ndim >= 2 else (weights.n,)
        return as_out(acc.reshape(shape), out, cast=True)

    return step


# ---------------------------------------------------------------- DynamicQuantizeLSTM
# (the kernel itself is registered by contrib/microsoft_quant.py, with the op's cpu kernel)


def lstm_reason(ctx):
    """Why the onednn provider cannot run com.microsoft's DynamicQuantizeLSTM node, or None."""
    why = _unavailable(ctx) or exact_reason()
    if why:
        return why
    for i, what in ((1, "W"), (2, "R")):
        v = ctx.const(i)
        if v is None:
            return f"{what} is not a constant (its bytes are reordered once, when the plan is built)"
        if v.ndim != 3 or v.dtype not in (np.int8, np.uint8) or v.size == 0:
            return f"{what} is {v.dtype}{list(v.shape)}, not non-empty 3-D 8-bit weights"
    for i, what in ((9, "W_zero_point"), (11, "R_zero_point")):
        if ctx.has(i) and ctx.const(i) is None:
            return f"{what} is computed at run time"
    return None


# ---------------------------------------------------------------- ConvInteger
#
# The same mapping for a convolution, where "sum over the inner dimension" is "sum over the
# window's valid positions": padding adds nothing (ONNX pads x with its zero point, so a
# padded position's centered value is 0). With x' = x as u8 (zero point xz) and w' = w as
# s8 (w - wz = w' + d, d per filter):
#     y = conv(x', w') - xz * C1 + d * (S - xz * count)
# where conv pads with zeros, C1 = the sum of w' over each output's valid window positions
# (a constant of the geometry), S = the sum of x' over them (a second conv, with weights of
# ones, one output per group: only where some d is not 0) and count = how many there are.


def _window_validity(size, out, k, stride, dil, begin):
    """[out, k]: whether kernel tap i of output position o reads inside the input (1) or a pad (0)."""
    pos = np.arange(out)[:, None] * stride - begin + np.arange(k)[None, :] * dil
    return ((pos >= 0) & (pos < size)).astype(np.int64)


class _ThreadCountPds:
    """A convolution's descriptor for the OpenMP thread count a run has: oneDNN fixes a
    primitive's work split, and how many threads it starts, when its descriptor is made, so
    a primitive made from the descriptor placement asked (at the session's creation) ran on
    that many threads whatever the run's count (measured: a session of intra_op_num_threads=1,
    or one that moved to one thread under load, ran its 8-bit convolutions on two)."""

    __slots__ = ("key", "make", "packed")

    def pd(self, key, make):
        """The descriptor for the current thread count (shared_pd), remembering how to make it."""
        self.key, self.make, self.packed = key, make, {}
        return shared_pd(key, make, ahead=True)

    def now(self, weights):
        """(the descriptor for the current thread count, `weights` packed for it)."""
        pd = shared_pd(self.key, self.make)
        wmd = pd.weights_md()
        if wmd not in self.packed:
            self.packed[wmd] = packed_weights(weights, None, wmd)
        return pd, self.packed[wmd]


class _Int8Conv:
    """One 2-D u8 x s8 -> s32 convolution, NHWC activations, weights packed once."""

    def __init__(self, x_shape, w_s8, group, strides, dil, begin, end):
        self._pds = _ThreadCountPds()
        n, c, h, w = x_shape
        m = w_s8.shape[0]
        self.y_shape = (n, m, *_out_hw((h, w), w_s8.shape[2:], strides, dil, begin, end))
        wshape = dnnl.grouped_weights_shape(w_s8.shape, group)
        # one descriptor per geometry: placement asks its implementation, the binding runs it
        key = ("int8 conv", tuple(x_shape), wshape, tuple(strides), tuple(dil), tuple(begin), tuple(end))
        self.pd = self._pds.pd(key, lambda: dnnl.convolution(
            MemoryDesc.create(x_shape, np.uint8, "acdb"), MemoryDesc.create(wshape, np.int8, "any"),
            MemoryDesc.create(self.y_shape, np.int32, "acdb"), strides=list(strides),
            dilations=[d - 1 for d in dil], padding_l=list(begin), padding_r=list(end)))
        self.weights = w_s8.reshape(wshape)
        self._steps = {}

    def run(self, x_nhwc: np.ndarray, into: np.ndarray | None = None) -> np.ndarray:
        """The s32 output, NHWC: `into` (a C-contiguous int32 array of that shape) or a new array."""
        key = capi.get_max_threads()
        step = self._steps.get(key)
        if step is None:
            pd, packed = self._pds.now(self.weights)
            step = self._steps[key] = pd.primitive().bind({ARG_SRC: None, ARG_WEIGHTS: packed.memory, ARG_DST: None})
        n, m, oh, ow = self.y_shape
        y = np.empty((n, oh, ow, m), np.int32) if into is None else into
        step.run({ARG_SRC: x_nhwc, ARG_DST: y})
        return y


class _RequantizingConv:
    """QLinearConv whole on oneDNN: a u8 x s8 convolution whose int32 sums oneDNN scales,
    biases, rounds and saturates as it writes them (its jit / AMX kernels' output stage), so
    the sums never reach memory. Weights s8 with zero point 0 (x's zero point is oneDNN's
    runtime zero point, padding included); y u8 or s8 with its zero point, or float32 (then
    no zero point: glassrt::ConvIntegerToFloat, float32(sums)·scale + bias, which oneDNN
    forms as that chain does, measured bit for bit on its jit, VNNI and AMX kernels).

    Requantized in float32 as onnxruntime does it, in another order: oneDNN forms
    acc·M + b·M (M = x_scale·w_scale/y_scale per filter, as onnxruntime forms it), onnxruntime
    (acc + b)·M, cpu's kernel the same in float64: where that lands on a rounding tie the
    code differs by one (2 of 200,704 outputs of a 3x3 conv of 32 to 64 channels, random data).
    Measured there: 54 us, against 230 us for the int32 sums and glassrt's own requantization."""

    def __init__(self, x_shape, w_s8, group, strides, dil, begin, end, y_dtype, per_filter, bias, *,
                 x_zero_point: bool = True, y_zero_point: bool = True):
        """x_zero_point / y_zero_point False: that zero point is 0 in every run (a constant),
        and the primitive is made without it. oneDNN's depthwise kernel for VNNI (brdgmm_dw)
        takes no zero point: the 8-bit MobileNetV2's depthwise convolutions, whose x and y
        both follow a ReLU6 (zero points 0), ran on its older jit_int8 kernel at ~2x the time
        (14x14x576: 39.3 against 25.3 us, 7x7x960: 28.1 against 14.1, two threads; the same
        bytes out, zero points 0 given to one and left out of the other)."""
        n, c, h, w = x_shape
        m = w_s8.shape[0]
        self.y_shape = (n, m, *_out_hw((h, w), w_s8.shape[2:], strides, dil, begin, end))
        self.m, self.bias = m, bias
        self.quantized = np.dtype(y_dtype) != np.float32  # (a float32 y has no zero point)
        self.x_zero_point, self.y_zero_point = x_zero_point, y_zero_point and self.quantized
        wshape = dnnl.grouped_weights_shape(w_s8.shape, group)
        mask = (0b11 if group > 1 else 0b1) if per_filter else 0
        key = ("int8 requantizing conv", tuple(x_shape), wshape, tuple(strides), tuple(dil), tuple(begin), tuple(end),
               np.dtype(y_dtype).str, mask, bias, self.x_zero_point, self.y_zero_point)
        zero_points = {a: 0 for a, on in ((ARG_SRC, self.x_zero_point), (ARG_DST, self.y_zero_point)) if on}
        self._pds = _ThreadCountPds()
        self.pd = self._pds.pd(key, lambda: dnnl.convolution(
            MemoryDesc.create(x_shape, np.uint8, "acdb"), MemoryDesc.create(wshape, np.int8, "any"),
            MemoryDesc.create(self.y_shape, y_dtype, "acdb"), MemoryDesc.create((m,), np.float32, "a") if bias else None,
            strides=list(strides), dilations=[d - 1 for d in dil], padding_l=list(begin), padding_r=list(end),
            attr=dnnl.Attr(scales={ARG_WEIGHTS: mask}, zero_points=zero_points)))
        self.weights, self.n_scales, self.y_dtype = w_s8.reshape(wshape), m if per_filter else 1, y_dtype
        self._steps, self._written = {}, {}

    def run(self, x_nhwc, params: tuple, y_nhwc) -> None:
        """y_nhwc (N, OH, OW, M) = the requantized conv of x_nhwc (u8); params (x's zero point,
        the multiplier, the scaled bias, y's zero point) written into the primitive's
        arguments only when they are another tuple than the last run's (constant ones: once)."""
        key = capi.get_max_threads()
        step = self._steps.get(key)
        if step is None:
            pd, packed = self._pds.now(self.weights)
            args = {ARG_SRC: None, ARG_WEIGHTS: packed.memory, ARG_DST: None,
                    ARG_ATTR_SCALES | ARG_WEIGHTS: dnnl.vector(np.zeros(self.n_scales, np.float32))}
            if self.x_zero_point:
                args[ARG_ATTR_ZERO_POINTS | ARG_SRC] = dnnl.vector(np.zeros(1, np.int32))
            if self.y_zero_point:
                args[ARG_ATTR_ZERO_POINTS | ARG_DST] = dnnl.vector(np.zeros(1, np.int32))
            if self.bias:
                args[ARG_BIAS] = dnnl.vector(np.zeros(self.m, np.float32))
            step = self._steps[key] = pd.primitive().bind(args)
        if self._written.get(key) is not params:
            xz, mult, bias, yz = params
            step[ARG_ATTR_SCALES | ARG_WEIGHTS].array[:] = mult
            if self.x_zero_point:
                step[ARG_ATTR_ZERO_POINTS | ARG_SRC].array[0] = xz
            elif xz:
                raise ValueError(f"x's zero point is {xz}, but this convolution was made for 0")
            if self.y_zero_point:
                step[ARG_ATTR_ZERO_POINTS | ARG_DST].array[0] = yz
            elif yz:
                raise ValueError(f"y's zero point is {yz}, but this convolution was made for 0")
            if self.bias:
                step[ARG_BIAS].array[:] = bias
            self._written[key] = params
        step.run({ARG_SRC: x_nhwc, ARG_DST: y_nhwc})

    def current_step(self):
        """The bound step for the calling thread's OpenMP count (None before its first run)."""
        return self._steps.get(capi.get_max_threads())

    def replay(self, step) -> bool:
        """Execute `step` again as it stands, if it is the current thread count's (its
        arguments and parameters as the last run wrote them): False where it is not."""
        if step is None or self._steps.get(capi.get_max_threads()) is not step:
            return False
        step.run()
        return True


def _out_hw(hw, k, strides, dil, begin, end):
    return tuple((hw[i] + begin[i] + end[i] - (dil[i] * (k[i] - 1) + 1)) // strides[i] + 1 for i in range(2))


def _conv_integer_geometry(ctx, w_at=1):
    x, w = ctx.shape(0), ctx.const(w_at).shape
    k = [int(v) for v in (ctx.attrs.get("kernel_shape") or w[2:])]
    begin, end, out, strides, dil = spatial_pads(list(x[2:]), k, ctx.attrs.get("strides"),
                                                 ctx.attrs.get("dilations"), ctx.attrs.get("pads"),
                                                 ctx.attrs.get("auto_pad", "NOTSET"))
    return tuple(int(v) for v in x), k, begin, end, out, [int(s) for s in strides], [int(d) for d in dil]


def _conv_integer_reason(ctx, w_at=1, wz_at=3, impl=True, isa=True):
    """Why this ConvInteger / QLinearConv is not oneDNN's, or None. impl=False: the checks
    before the one that builds the exact sums' primitive descriptor (to ask its implementation);
    isa=False: the shapes' checks alone (int8_float.py's kernels, which run on any CPU)."""
    why = _unavailable(ctx) or (exact_reason() if isa else None)
    if why:
        return why
    x, w = ctx.shape(0), ctx.const(w_at)
    if x is None or len(x) != 4 or not all(isinstance(d, int) for d in x):
        return "x is not a 4-D tensor of known shape (this kernel is for 2-D images)"
    if w is None:
        return "w is not a constant (its bytes are reordered once, when the plan is built)"
    if w.ndim != 4 or w.dtype not in (np.int8, np.uint8):
        return f"w is {w.dtype}{list(w.shape)}, not 4-D 8-bit weights"
    group = int(ctx.attrs.get("group", 1))
    if group < 1 or x[1] != w.shape[1] * group or w.shape[0] % group:
        return f"channels {x[1]} and weights {list(w.shape)} do not fit group {group}"
    if ctx.has(wz_at):
        wz = ctx.const(wz_at)
        if wz is None:
            return "w_zero_point is computed at run time"
        if wz.size not in (1, w.shape[0]):
            return f"w_zero_point has {wz.size} values, neither one nor one per filter ({w.shape[0]})"
    x_shape, k, begin, end, out, strides, dil = _conv_integer_geometry(ctx, w_at)
    if list(k) != list(w.shape[2:]) or min(out) <= 0 or min(begin + end) < 0:
        return "kernel_shape, pads or the output size do not fit (cpu reports the error)"
    if not impl:
        return None
    impl = _Int8Conv(x_shape, np.zeros(w.shape, np.int8), group, strides, dil, begin, end).pd.impl
    if impl.startswith(("ref", "gemm:")):
        return f"oneDNN has only its generic implementation ({impl}) for this 8-bit convolution"
    return None


def _nhwc_view(y):
    """y (N, C, H, W) as (N, H, W, C): a view, whatever y's layout."""
    return y.transpose(0, 2, 3, 1)


def _nhwc_bytes(x):
    """The (N, H, W, C) buffer oneDNN reads for an 8-bit x: the bytes themselves where x is a
    channels-last view (the plan keeps 8-bit values NHWC between these kernels), else a copy."""
    t = x.transpose(0, 2, 3, 1)
    return t if t.flags.c_contiguous else np.ascontiguousarray(t)


def _int8_conv(ctx, x_shape, k, begin, end, out_hw, strides, dil, w, wz, raw=False):
    """conv(x, xz) -> the int32 conv of (x - xz) with (w - wz), NCHW (a view of an NHWC
    array); w constant (its bytes packed once), wz one value or one per filter.

    raw: conv(x, xz) -> (acc, xz, c1) instead, acc the NHWC sums before the one correction
    that depends on x's zero point, acc - xz * c1 (the caller folds it into its own pass);
    any other correction (u8 weights, a weight zero point) is applied to acc already."""
    m, cg = w.shape[:2]
    group = int(ctx.attrs.get("group", 1))
    wz = np.zeros((), np.int32) if wz is None else np.asarray(wz).astype(np.int32).reshape(-1)
    if w.dtype == np.uint8:
        w_s8, d = (w ^ np.uint8(0x80)).view(np.int8), np.int32(128) - wz
    else:
        w_s8, d = w, -wz
    main = _Int8Conv(x_shape, np.ascontiguousarray(w_s8), group, strides, dil, begin, end)
    # the geometry's constants, laid out as the NHWC result: C1 [oh, ow, m] and count [oh, ow, 1]
    valid = [_window_validity(x_shape[2 + i], out_hw[i], k[i], strides[i], dil[i], begin[i]) for i in range(2)]
    taps = np.einsum("ai,bj->abij", *valid)  # [oh, ow, kh, kw]
    c1 = np.einsum("mij,abij->abm", w_s8.astype(np.int64).sum(axis=1), taps).astype(np.int32)
    d = np.broadcast_to(d, (m,)).astype(np.int32)
    ones = None
    if d.any():
        ones = _Int8Conv(x_shape, np.ones((group, cg, *k), np.int8), group, strides, dil, begin, end)
        count = (taps.sum(axis=(2, 3)) * cg).astype(np.int32)[:, :, None]
        d_groups = d.reshape(group, m // group)  # each filter's d, by group

    def conv(x, x_zero_point, into=None):
        xz = np.zeros((), np.int32) if x_zero_point is None else np.asarray(x_zero_point).astype(np.int32).reshape(())
        if x.dtype == np.int8:  # as u8: x + 128, its zero point too
            x, xz = x.view(np.uint8) ^ np.uint8(0x80), xz + np.int32(128)
        x_nhwc = _nhwc_bytes(x)
        y = main.run(x_nhwc, into)  # [n, oh, ow, m]: the corrections broadcast along its contiguous rows
        if ones is not None:
            s = ones.run(x_nhwc) - xz * count  # [n, oh, ow, group]
            y.reshape(*y.shape[:3], group, m // group)[...] += s[..., None] * d_groups
        if raw:
            return y, int(xz), c1
        if xz:
            y -= xz * c1
        return y.transpose(0, 3, 1, 2)

    return conv


@kernel("ConvInteger", provider="onednn", dtypes=_I8, out=True, bind=True, accepts=_conv_integer_reason,
        static_only=True, name="int8")
def conv_integer(ctx):
    """int32 conv of (x - x_zp) with (w - w_zp) on oneDNN's u8 x s8 convolution, w constant."""
    conv = _int8_conv(ctx, *_conv_integer_geometry(ctx), ctx.const(1), ctx.const(3) if ctx.has(3) else None)

    def step(x, w=None, x_zero_point=None, w_zero_point=None, *, out=None):
        return as_out(conv(x, x_zero_point), out, cast=True)

    return step


def _qlinear_conv_reason(ctx):
    """As ConvInteger's; where the requantizing convolution applies and has a fast kernel, its
    descriptor (the one the binding runs) answers, and no exact-sums descriptor is made.
    A verdict (BindContext.verdict): it reads the node, its types and constants, no layout."""
    return ctx.verdict("QLinearConv int8", lambda: _qlinear_conv_reason_now(ctx))


def _qlinear_conv_reason_now(ctx):
    why = _conv_integer_reason(ctx, w_at=3, wz_at=5, impl=False)
    if why:
        return why
    whole = _requantizing(ctx, _conv_integer_geometry(ctx, w_at=3))
    if whole is not None and not whole.pd.impl.startswith(("ref", "gemm:")):
        return None
    return _conv_integer_reason(ctx, w_at=3, wz_at=5)


def _sums_bytes(ctx):
    """QLinearConv's scratch: oneDNN's int32 sums (N, OH, OW, M), requantized into the output
    (a new array per call was as many page faults as pages: 400 for a 112x112x32 layer)."""
    if ctx.shape(0) is None or ctx.out_shape(0) is None:
        return 0
    return math.prod(int(d) for d in ctx.out_shape(0)) * 4


@kernel("QLinearConv", provider="onednn", dtypes=_I8, out=True, bind=True, accepts=_qlinear_conv_reason,
        static_only=True, name="int8", layouts=(NHWC,), workspace=_sums_bytes)
def qlinear_conv(ctx):
    """QLinearConv on oneDNN. With int8 weights of zero point 0 (quantize_static's), one
    convolution that requantizes as it writes (_RequantizingConv: a code apart from cpu's
    kernel at a rounding tie). Otherwise the exact int32 conv (as ConvInteger), then cpu's
    bias and requantization (kernels/cpu/quantize.py: its float64 steps, its bytes) in one
    compiled pass from oneDNN's NHWC sums into the output.

    x and y may be channels-last (runtime/layout.py: 8-bit values between these kernels
    stay NHWC, the layout oneDNN's int8 convolutions read and write); then no byte is
    transposed. Measured on a quantize_static MobileNetV2 (QOperator, 52 QLinearConvs,
    onnxruntime 2.3 ms): 55.7 ms in QLinearConv before (NumPy's requantization over NCHW
    copies 35 ms, the transposes 11), 13.9 with the compiled pass and NHWC values, 3.7
    requantized by oneDNN."""
    from ..cpu._jit import compiled, use_compiled
    from ..cpu.quantize import _int_range, qlinear_conv_output

    geometry = _conv_integer_geometry(ctx, w_at=3)
    whole = _requantizing_conv(ctx, geometry)
    if whole is not None:
        return whole
    conv = _int8_conv(ctx, *geometry, ctx.const(3), ctx.const(5), raw=True)
    m = int(ctx.const(3).shape[0])
    none32 = np.zeros((1, 1, m), np.int32)
    y_shape = [int(d) for d in ctx.out_shape(0)]
    ws = ctx.workspace
    count = math.prod(y_shape)
    sums = ws[:4 * count].view(np.int32).reshape(y_shape[0], *y_shape[2:], m) \
        if ws is not None and ws.nbytes >= 4 * count and ws.ctypes.data % 4 == 0 else None

    def step(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, b=None, *, out=None):
        acc, xz, c1 = conv(x, x_zero_point, sums)
        y_dt = y_zero_point.dtype if y_zero_point is not None else x.dtype
        ws = np.asarray(w_scale).reshape(-1)
        if not use_compiled("QLinearConv") or y_dt not in _I8 or ws.size not in (1, m) \
                or (b is not None and b.shape != (m,)):
            if xz:
                acc -= xz * c1
            return qlinear_conv_output(np.ascontiguousarray(acc.transpose(0, 3, 1, 2)), x, x_scale, w, w_scale,
                                       y_scale, y_zero_point, b, out)
        # the multiplier as cpu's kernel forms it: in the scales' float32, then float64
        mult = np.broadcast_to((x_scale.reshape(()) * ws / y_scale.reshape(())).astype(np.float64), (m,))
        bias = np.zeros(m, np.float64) if b is None else b.astype(np.float64)
        lo, hi = _int_range(y_dt)
        y = np.empty(acc.shape[:1] + (m,) + acc.shape[1:3], y_dt) if out is None else out
        compiled(_requantize_nhwc)(acc, xz, c1 if xz else none32, bias, np.ascontiguousarray(mult),
                                   float(0 if y_zero_point is None else y_zero_point.reshape(-1)[0]),
                                   float(lo), float(hi), y.transpose(0, 2, 3, 1))
        return y

    return step


def _requantizing(ctx, geometry):
    """The _RequantizingConv for this QLinearConv, or None where it does not apply: weights
    not int8 with zero point 0, y not 8-bit, scales per tensor or per filter (float32), the
    bias a constant int32 per filter. Made once per context: a plan asks the kernel's reason
    and then binds it with the same one (~90 us a conv, 52 in a MobileNetV2's first run)."""
    return ctx.cached("requantizing conv", lambda: _make_requantizing(ctx, geometry))


def _make_requantizing(ctx, geometry):
    w, wz = ctx.const(3), ctx.const(5) if ctx.has(5) else None
    y_dt = ctx.dtype(7) if ctx.has(7) else ctx.dtype(0)
    m = int(w.shape[0])
    ws = ctx.shape(4)
    # (math.prod of the shape, not np.prod: a few microseconds a call, twice per conv and plan)
    n_scales = math.prod(ws) if ws is not None and all(type(d) is int for d in ws) else None
    if w.dtype != np.int8 or n_scales not in (1, m) or y_dt not in _I8 \
            or any(ctx.dtype(i) != np.float32 for i in (1, 4, 6)) or (wz is not None and wz.any()):
        return None
    b = ctx.const(8) if ctx.has(8) else None
    if ctx.has(8) and (b is None or b.shape != (m,) or b.dtype != np.int32):
        return None
    x_shape, k, begin, end, out_hw, strides, dil = geometry
    group = int(ctx.attrs.get("group", 1))
    return _RequantizingConv(x_shape, np.ascontiguousarray(w), group, strides, dil, begin, end, y_dt,
                             n_scales == m and m > 1, b is not None,
                             x_zero_point=not (ctx.dtype(0) == np.uint8 and _zero_constant(ctx, 2)),
                             y_zero_point=not _zero_constant(ctx, 7))


def _zero_constant(ctx, i) -> bool:
    """Whether input i, a zero point, is absent or a constant 0 (as for an 8-bit x or y
    that follows a ReLU): the same in every run, so the primitive need not take it."""
    if not ctx.has(i):
        return True
    z = ctx.const(i)
    return z is not None and z.size == 1 and not z.any()


def _requantizing_conv(ctx, geometry):
    """QLinearConv's step on _RequantizingConv, or None where it does not apply (_requantizing)
    or oneDNN has no fast kernel for it."""
    conv = _requantizing(ctx, geometry)
    if conv is None or conv.pd.impl.startswith(("ref", "gemm:")):
        return None  # (zero points and scales on a geometry oneDNN's fast kernels do not take: the sums' path)
    y_dt = ctx.dtype(7) if ctx.has(7) else ctx.dtype(0)
    b = ctx.const(8) if ctx.has(8) else None
    bias_int = None if b is None else b.astype(np.float32)  # (exact below 2**24, as onnxruntime's float(acc + b))

    def params(x_dtype, x_scale, x_zero_point, w_scale, y_scale, y_zero_point):
        """(x's zero point as u8's, the multiplier, the scaled bias, y's zero point)."""
        for v, what in ((x_scale, "x_scale"), (x_zero_point, "x_zero_point"), (y_scale, "y_scale"),
                        (y_zero_point, "y_zero_point")):
            if v is not None and v.size != 1:  # (computed at run time: as cpu's kernel, an error)
                raise ValueError(f"{what} must hold one value (per-tensor quantization), got shape {list(v.shape)}")
        if x_zero_point is not None and x_zero_point.dtype != x_dtype:
            raise ValueError(f"x_zero_point is {x_zero_point.dtype} but x is {x_dtype}: they must match")
        xz = (0 if x_zero_point is None else int(x_zero_point.reshape(-1)[0])) + (128 if x_dtype == np.int8 else 0)
        # the multiplier as onnxruntime forms it: x_scale · w_scale / y_scale in float32
        mult = (x_scale.reshape(()) * w_scale.reshape(-1) / y_scale.reshape(())).astype(np.float32)
        return (xz, mult, None if bias_int is None else bias_int * mult,
                0 if y_zero_point is None else int(y_zero_point.reshape(-1)[0]))

    # constants (as quantize_static writes them): worked out once, here
    consts = [ctx.const(i) if ctx.has(i) else None for i in (1, 2, 4, 6, 7)]
    fixed = params(ctx.dtype(0), *consts) if all(c is not None or not ctx.has(i) for c, i in
                                                 zip(consts, (1, 2, 4, 6, 7))) else None
    run = _nhwc_runner(conv, y_dt)

    def step(x, x_scale, x_zero_point, w_, w_scale, w_zero_point, y_scale, y_zero_point=None, b_=None, *, out=None):
        return run(x, fixed or params(x.dtype, x_scale, x_zero_point, w_scale, y_scale, y_zero_point), out)

    return step


def _nhwc_runner(conv, y_dt):
    """run(x, params, out) -> y: `conv` (a _RequantizingConv) over x's NHWC bytes (an int8 x
    as u8: x + 128, its zero point in params already) into out's (a new y if None). The
    NHWC views of x and out are kept (KeptViews): the bound primitive then skips
    re-pointing its memories (two checked handle updates a call)."""
    x_views, out_views = KeptViews(_nhwc_bytes), KeptViews(_nhwc_view)
    last = [None, None, None, None]  # x, out, params and the bound step of a call that can be replayed

    def run(x, p, out):
        if x is last[0] and out is last[1] and p is last[2] and x is not None and conv.replay(last[3]):
            return out  # (the very arrays and parameters of the last call, its step's memories on them)
        last[:] = None, None, None, None
        if x.dtype == np.int8:
            x_nhwc = _nhwc_bytes(x.view(np.uint8) ^ np.uint8(0x80))  # (a new array every run)
        else:
            x_nhwc = x_views(0, x)
        y = np.empty(conv.y_shape, y_dt) if out is None else out
        y_nhwc = out_views(0, y) if out is not None else _nhwc_view(y)
        if y_nhwc.flags.c_contiguous:
            conv.run(x_nhwc, p, y_nhwc)
            if out is not None and x.dtype != np.int8 and x_views.kept(0, x) and out_views.kept(0, out):
                last[:] = x, out, p, conv.current_step()
        else:  # (an output not laid out channels-last: written through a dense buffer)
            dst = np.empty(y_nhwc.shape, y_dt)
            conv.run(x_nhwc, p, dst)
            np.copyto(y_nhwc, dst)
        return y

    return run


# ---------------------------------------------------------------- glassrt::ConvIntegerToFloat


def conv_integer_to_float_reason(ctx):
    why = _conv_integer_reason(ctx, w_at=1, wz_at=3, impl=False)
    if why:
        return why
    m = int(ctx.const(1).shape[0])
    if ctx.dtype(4) != np.float32 or per_channel_size(ctx.shape(4), m) is None:
        return "the scale is not float32, one value or one per output channel"
    if ctx.has(5):
        b = ctx.const(5)
        if b is None or b.dtype != np.float32 or per_channel_size(b.shape, m) is None:
            return "B is not a float32 constant, one value or one per output channel"
    if ctx.has(6) and (ctx.dtype(6) != np.int32 or per_channel_size(ctx.shape(6), m) is None):
        return "B_sums is not int32, one value or one per output channel"
    if _scaling(ctx):
        conv = _float_conv(ctx)
        if not conv.pd.impl.startswith(("ref", "gemm:")):
            return None
    return _conv_integer_reason(ctx, w_at=1, wz_at=3)  # (the exact sums' descriptor answers)


def _scaling(ctx) -> bool:
    """Whether oneDNN can scale and bias the sums as it writes them: int8 weights of zero
    point 0 (no correction of the sums after the convolution) and no bias added to the sums."""
    w, wz = ctx.const(1), ctx.const(3) if ctx.has(3) else None
    return w.dtype == np.int8 and (wz is None or not wz.any()) and not ctx.has(6)


def _float_conv(ctx):
    x_shape, k, begin, end, out_hw, strides, dil = _conv_integer_geometry(ctx)
    w = ctx.const(1)
    m = int(w.shape[0])
    per_filter = per_channel_size(ctx.shape(4), m) == m and m > 1
    return _RequantizingConv(x_shape, np.ascontiguousarray(w), int(ctx.attrs.get("group", 1)), strides, dil, begin,
                             end, np.float32, per_filter, ctx.has(5))


def _channel_values(ctx, i, m, dt):
    """Input i (a constant, one value or one per channel) as m values of dt; zeros if absent."""
    return np.zeros(m, dt) if not ctx.has(i) else np.broadcast_to(ctx.const(i).reshape(-1), (m,)).astype(dt)


@kernel("ConvIntegerToFloat", provider="onednn", domain="glassrt", dtypes=_I8, out=True, bind=True,
        accepts=conv_integer_to_float_reason, static_only=True, name="int8", layouts=(NHWC,))
def conv_integer_to_float(ctx):
    """float32(ConvInteger(x, w, x_zero_point) [+ B_sums]) · scale [+ B] on oneDNN. With int8
    weights of zero point 0 and no B_sums, one convolution: the exact u8 x s8 sums (x's zero
    point oneDNN's, padding included, as onnxruntime's ConvInteger pads with it), scaled and
    biased as they are written, in the chain's float32 steps (measured bit for bit).
    Otherwise (uint8 weights, a weight zero point, an int32 bias: older quantize_dynamic
    models) the exact sums, corrected, and the chain's steps in one compiled pass from them
    into the output. The scale is read at every run (x_scale · w_scale: x's scale is its
    DynamicQuantizeLinear's)."""
    m = int(ctx.const(1).shape[0])
    fbias = _channel_values(ctx, 5, m, np.float32)

    def check(x, x_zero_point, scale, n_scales):
        if x_zero_point is not None and (x_zero_point.size != 1 or x_zero_point.dtype != x.dtype):
            raise ValueError(f"x_zero_point must be one value of x's type {x.dtype}, got "
                             f"{x_zero_point.dtype}{list(x_zero_point.shape)}")
        if scale.size not in (1, n_scales) or scale.dtype != np.float32:
            raise ValueError(f"the scale must be float32 with one value or {n_scales}, got "
                             f"{scale.dtype}{list(scale.shape)}")

    if _scaling(ctx):
        conv = _float_conv(ctx)
        run = _nhwc_runner(conv, np.dtype(np.float32))
        bias = fbias if ctx.has(5) else None

        def step(x, w_, x_zero_point=None, w_zero_point=None, scale=None, b_=None, b_sums_=None, *, out=None):
            check(x, x_zero_point, scale, conv.n_scales)
            xz = (0 if x_zero_point is None else int(x_zero_point.reshape(-1)[0])) + (128 if x.dtype == np.int8 else 0)
            return run(x, (xz, scale.reshape(-1), bias, 0), out)

        return step

    from ..cpu._jit import compiled, use_compiled

    sums = _int8_conv(ctx, *_conv_integer_geometry(ctx), ctx.const(1), ctx.const(3) if ctx.has(3) else None, raw=True)
    fixed_ibias = _channel_values(ctx, 6, m, np.int32) if not ctx.has(6) or ctx.const(6) is not None else None
    has_fbias = ctx.has(5)
    y_shape = (int(ctx.shape(0)[0]), m, *[int(d) for d in ctx.out_shape(0)[2:]])

    def step(x, w_, x_zero_point=None, w_zero_point=None, scale=None, b_=None, b_sums=None, *, out=None):
        check(x, x_zero_point, scale, m)
        ibias = fixed_ibias
        if ibias is None:  # (quantized at run time, in x's scale: older quantize_dynamic models)
            if b_sums.dtype != np.int32 or b_sums.size not in (1, m):
                raise ValueError(f"B_sums must be int32 with one value or {m}, got {b_sums.dtype}{list(b_sums.shape)}")
            ibias = np.ascontiguousarray(np.broadcast_to(b_sums.reshape(-1), (m,)))
        acc, xz, c1 = sums(x, x_zero_point)
        y = np.empty(y_shape, np.float32) if out is None else out
        # the compiled pass once the process has Numba loaded (a second run starts it: _jit);
        # its NumPy twin until then (a first run no longer pays Numba's import: ddddocr's 0.45 s)
        dequantize = compiled(_dequantize_nhwc) if use_compiled("ConvIntegerToFloat") else _dequantize_nhwc_numpy
        dequantize(acc, xz, c1, ibias, np.ascontiguousarray(np.broadcast_to(scale.reshape(-1), (m,))), fbias,
                   has_fbias, y.transpose(0, 2, 3, 1))
        return y

    return step


def _dequantize_nhwc_numpy(acc, xz, c1, ibias, scale, fbias, has_fbias, out):
    """_dequantize_nhwc's steps on whole arrays (int64 sums wrapped to int32 as its casts
    wrap them): the same bits."""
    s = (acc.astype(np.int64) - np.int64(xz) * c1.astype(np.int64)).astype(np.int32)
    v = (s.astype(np.int64) + ibias.astype(np.int64)).astype(np.int32).astype(np.float32) * scale
    np.copyto(out, v + fbias if has_fbias else v)


@jit(error_model="numpy", boundscheck=False)
def _dequantize_nhwc(acc, xz, c1, ibias, scale, fbias, has_fbias, out):  # pragma: no cover - compiled
    """out = float32(int32(acc - xz·c1 + ibias)) · scale [+ fbias], channel last: acc (N, H, W, M)
    int32 sums, c1 (H, W, M), out an (N, H, W, M) view of the output in any layout. The chain's
    steps: ConvInteger's int32 sums, the int32 Add (wrapping), the float32 cast, product and
    sum (the sum only where there is a bias: x + 0.0 would turn -0.0 into 0.0)."""
    n, h, w, m = acc.shape
    for a in range(n):
        for i in range(h):
            for j in range(w):
                for c in range(m):
                    s = np.int32(np.int64(acc[a, i, j, c]) - np.int64(xz) * np.int64(c1[i, j, c]))
                    v = np.float32(np.int32(np.int64(s) + np.int64(ibias[c]))) * scale[c]
                    out[a, i, j, c] = v + fbias[c] if has_fbias else v


@jit(error_model="numpy", boundscheck=False)
def _requantize_nhwc(acc, xz, c1, bias, mult, yz, lo, hi, out):  # pragma: no cover - compiled
    """out = clip(rint((acc - xz·c1 + bias) · mult + yz), lo, hi), channel last: acc (N, H, W, M)
    int32 sums, c1 (H, W, M) (read only where xz is not 0), out an (N, H, W, M) view of the
    output in any layout. The float64 steps of cpu's _requantize, one rounding each (the
    corrected sum fits int64 and float64 exactly). One pixel's channels per inner loop, with
    no branch in it, so that it runs on vector registers."""
    n, h, w, m = acc.shape
    for a in range(n):
        for i in range(h):
            for j in range(w):
                if xz:
                    for c in range(m):
                        v = np.float64(np.int64(acc[a, i, j, c]) - xz * np.int64(c1[i, j, c]))
                        r = np.rint((v + bias[c]) * mult[c] + yz)
                        out[a, i, j, c] = min(max(r, lo), hi)
                else:
                    for c in range(m):
                        r = np.rint((np.float64(acc[a, i, j, c]) + bias[c]) * mult[c] + yz)
                        out[a, i, j, c] = min(max(r, lo), hi)


# ---------------------------------------------------------------- MatMulIntegerToFloat
# (registered in contrib/microsoft_quant.py with the op's cpu kernel, as DynamicQuantizeLSTM)


def _one_value(ctx, i) -> bool:
    shape = ctx.shape(i)
    return shape is not None and tuple(shape) in ((), (1,))


def matmul_integer_to_float_reason(ctx):
    """Why the onednn provider cannot run com.microsoft's MatMulIntegerToFloat node, or None."""
    why = _unavailable(ctx) or exact_reason()
    if why:
        return why
    b = ctx.const(1)
    if b is None:
        return "B is not a constant (its bytes are reordered once, when the plan is built)"
    if b.ndim != 2 or b.dtype != np.int8:
        return f"B is {b.dtype}{list(b.shape)}, not a 2-D int8 matrix (its zero point would not be 0)"
    if b.size == 0:
        return "B is empty (cpu writes the zeros or the empty result)"
    n = b.shape[1]
    if ctx.has(5) and (ctx.const(5) is None or ctx.const(5).any()):
        return "b_zero_point is not a constant 0 (oneDNN compensates A's zero point only)"
    if ctx.dtype(2) != np.float32 or ctx.dtype(3) != np.float32:
        return "the scales are not float32"
    if not _one_value(ctx, 2):
        return "a_scale is not one value"
    if not (_one_value(ctx, 3) or (ctx.shape(3) is not None and tuple(ctx.shape(3)) == (n,))):
        return f"b_scale is neither one value nor one per column ({n})"
    if ctx.has(4) and not _one_value(ctx, 4):
        return "a_zero_point is not one value"
    if ctx.has(6) and (ctx.dtype(6) != np.float32 or ctx.shape(6) is None or tuple(ctx.shape(6)) != (n,)):
        return f"the bias is not float32 of shape [{n}]"
    a = ctx.shape(0)
    if a is None or len(a) < 1:
        return "A's rank is not known"
    return None


def matmul_integer_to_float(ctx):
    """Y = (A - a_zp) @ B · a_scale · b_scale + bias, in one oneDNN matmul (B int8, constant)."""
    weights = Int8Weights(ctx.const(1))
    k, n = weights.k, weights.n

    def step(a, b, a_scale, b_scale, a_zero_point=None, b_zero_point=None, bias=None, *, out=None):
        if a.shape[-1] != k:
            raise ValueError(f"inner dimensions differ: A {list(a.shape)} @ B {[k, n]}")
        shape = (*a.shape[:-1], n)
        direct = out is not None and out.dtype == np.float32 and out.shape == shape and out.flags.c_contiguous
        y = weights.scaled(a.reshape(-1, k), a_zero_point, a_scale, b_scale, bias,
                           out=out.reshape(-1, n) if direct else None)
        return out if direct else as_out(y.reshape(shape), out, cast=True)

    return step
