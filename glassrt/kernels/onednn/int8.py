"""Exact 8-bit integer products on oneDNN's int8 matmul, for products with a constant B:
MatMulInteger, and the products of com.microsoft's DynamicQuantizeLSTM (its onednn kernel
is registered in contrib/microsoft_quant.py, `Int8Weights` and `lstm_reason` from here).

glassrt's own path (kernels/int_gemm.py) converts 8-bit data to float32 and runs float
GEMMs, exact but at float speed and four times the bytes. oneDNN multiplies the bytes
themselves (u8 x s8 into s32: VNNI's vpdpbusd, AMX's tdpbusd). Measured on the 2-core
AVX-512 + AMX machine: ddddocr's classifier (40 x 1024 @ 1024 x 8210) 12.9 ms -> 0.43 ms,
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

import numpy as np

from ..buffers import as_out
from ..int_gemm import Prepared
from ..registry import kernel
from . import capi, dnnl
from .dnnl import ARG_DST, ARG_SRC, ARG_WEIGHTS, MemoryDesc
from .kernels import _unavailable, packed_weights

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
        self.d = d.reshape(-1) if d.size > 1 else (d.reshape(()) if d.any() else None)
        self.colsum = self.bs.sum(axis=0, dtype=np.int32)
        self._packed = {}  # weights layout -> packed B (kept alive while this is)
        self._steps = {}  # (OpenMP threads, rows) -> bound primitive

    def _step(self, m: int):
        key = (capi.get_max_threads(), m)
        step = self._steps.get(key)
        if step is None:
            pd = dnnl.matmul(MemoryDesc.create((m, self.k), np.uint8, "ab"),
                             MemoryDesc.create((self.k, self.n), np.int8, "any"),
                             MemoryDesc.create((m, self.n), np.int32, "ab"))
            wmd = pd.weights_md()
            if wmd not in self._packed:
                self._packed[wmd] = packed_weights(self.bs, None, wmd)
            if len(self._steps) >= _PRIMITIVES_MAX:
                self._steps.pop(next(iter(self._steps)))
            step = self._steps[key] = pd.primitive().bind(
                {ARG_SRC: None, ARG_WEIGHTS: self._packed[wmd].memory, ARG_DST: None})
        return step

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


def _matmul_integer_reason(ctx):
    why = _unavailable(ctx) or exact_reason()
    if why:
        return why
    b, a_shape = ctx.const(1), ctx.shape(0)
    if b is None:
        return "B is not a constant (its bytes are reordered once, when the plan is built)"
    if b.ndim != 2 or b.dtype not in (np.int8, np.uint8):
        return f"B is {b.dtype}{list(b.shape)}, not a 2-D 8-bit matrix"
    if a_shape is None or len(a_shape) < 1:
        return "A's rank is not known"
    if ctx.has(3):
        bz = ctx.const(3)
        if bz is None:
            return "b_zero_point is computed at run time"
        if bz.size != 1 and bz.shape not in ((b.shape[1],), (1, b.shape[1])):
            return f"b_zero_point {list(bz.shape)} is neither one value nor one per column"
    return None


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
        if v.ndim != 3 or v.dtype not in (np.int8, np.uint8):
            return f"{what} is {v.dtype}{list(v.shape)}, not 3-D 8-bit weights"
    for i, what in ((9, "W_zero_point"), (11, "R_zero_point")):
        if ctx.has(i) and ctx.const(i) is None:
            return f"{what} is computed at run time"
    return None
