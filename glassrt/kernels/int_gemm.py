"""Exact integer products of 8-bit data through float32 GEMMs.

(A - za) @ (B - zb) with 8-bit A, B and zero points: every centered value lies in
[-255, 255], each product is at most 65,025 in magnitude, and a sum of 256 of them stays
below 2**24 — exactly representable in float32, whatever order BLAS adds them in. So the
inner dimension runs in slices of CHUNK, each slice one float32 GEMM whose result is an
exact integer, and the slices' results are summed in int32 (wrapping where onnxruntime's
int32 accumulator wraps). Against the float64 GEMMs used before (exact to 2**53 in one
call): half the bytes converted and moved, BLAS's float32 speed. ddddocr's quantized
classifier (MatMulInteger 40 x 1024 x 8210): 34.6 -> ~10 ms; its DynamicQuantizeLSTM,
whose recurrent weights were converted again at every step, converts them once a run.

`centered(b, zb)` converts an operand once where it is read many times (an LSTM's
recurrent weights); `int_matmul` takes either form, or a `Prepared` B: a constant made
ready for another engine's exact products (kernels/onednn/int8.py's bytes x bytes).
"""
from __future__ import annotations

import numpy as np

CHUNK = 256  # 256 * 255 * 255 < 2**24: a slice's sums are exact in float32
# Rows or columns of an 8-bit operand converted at a time: CHUNK x BLOCK float32 is 512 KiB,
# within the megabyte of scratch a replayed run may allocate
BLOCK = 512


class Centered:
    """(v - zp) as float32, exact for 8-bit data."""

    __slots__ = ("f",)

    def __init__(self, v, zp=None):
        f = np.asarray(v).astype(np.float32)
        if zp is not None:
            f -= np.asarray(zp, np.float32)
        self.f = f


class Prepared:
    """A constant B (with its zero point) that computes its own exact products:
    `product(a, za)` is the int32 (a - za) @ (B - zb) of a 2-D 8-bit a."""

    def product(self, a: np.ndarray, za=None) -> np.ndarray:
        raise NotImplementedError


def wrap(f: np.ndarray) -> Centered:
    """A float32 array that already holds centered 8-bit values, taken as it is."""
    c = Centered.__new__(Centered)
    c.f = f
    return c


def centered(v, zp=None) -> Centered:
    return v if isinstance(v, Centered) else Centered(v, zp)


def int_matmul(a, za, b, zb) -> np.ndarray:
    """The int32 product (a - za) @ (b - zb), with NumPy's matmul semantics (1-D operands,
    batch broadcasting); a and b 8-bit arrays or `Centered` (their zero point then ignored),
    za per tensor or per row of a, zb per tensor or per column of b (None: 0). Blocks of at
    most CHUNK inner elements (and BLOCK rows or columns of an operand converted as it goes):
    what is converted to float32 at a time stays under a megabyte of scratch. A `Prepared`
    b (its zero point then ignored) computes the product itself."""
    if isinstance(b, Prepared):
        return b.product(np.asarray(a), za)
    if not all(isinstance(v, Centered) or _is_int8(np.asarray(v).dtype) for v in (a, b)):
        return _wide(np.asarray(a), za, np.asarray(b), zb)
    A, za = (a.f, None) if isinstance(a, Centered) else (np.asarray(a), za)
    B, zb = (b.f, None) if isinstance(b, Centered) else (np.asarray(b), zb)
    vec_a, vec_b = A.ndim == 1, B.ndim == 1
    A = A[None, :] if vec_a else A
    B = B[:, None] if vec_b else B
    za = _rows(za, A.shape[-2])
    zb = _cols(zb, B.shape[-1])
    (m, k), n = A.shape[-2:], B.shape[-1]
    if B.shape[-2] != k:
        raise ValueError(f"inner dimensions differ: {list(A.shape)} @ {list(B.shape)}")
    acc = np.zeros(np.broadcast_shapes(A.shape[:-2], B.shape[:-2]) + (m, n), np.int32)
    # an operand converted per block is cut to BLOCK rows (columns); one converted already is not
    mb = m if A.dtype == np.float32 else BLOCK
    nb = n if B.dtype == np.float32 else BLOCK
    for m0 in range(0, m, mb):
        for n0 in range(0, n, nb):
            block = acc[..., m0:m0 + mb, n0:n0 + nb]
            for k0 in range(0, k, CHUNK):
                pa = _float32(A[..., m0:m0 + mb, k0:k0 + CHUNK], za[..., m0:m0 + mb, :] if za.ndim else za)
                pb = _float32(B[..., k0:k0 + CHUNK, n0:n0 + nb], zb[..., n0:n0 + nb] if zb.ndim else zb)
                block += np.matmul(pa, pb).astype(np.int32)
    if vec_b:
        acc = acc[..., 0]
    if vec_a:
        acc = acc[..., 0] if vec_b else acc[..., 0, :]
    return acc


def _float32(part, zp):
    """A block as centered float32, in one pass (a float32 block is centered already)."""
    if part.dtype == np.float32:
        return part
    return np.subtract(part, zp, dtype=np.float32) if zp.ndim or zp else part.astype(np.float32)


def _rows(z, m):
    """A zero point of a's rows as float32, broadcasting against a: () or (..., m, 1)."""
    z = np.zeros((), np.float32) if z is None else np.asarray(z, np.float32)
    return z.reshape(()) if z.size == 1 else z.reshape(m, 1) if z.ndim == 1 else z


def _cols(z, n):
    """A zero point of b's columns as float32, broadcasting against b: () or (..., 1, n)."""
    z = np.zeros((), np.float32) if z is None else np.asarray(z, np.float32)
    return z.reshape(()) if z.size == 1 else z


def _is_int8(dt) -> bool:
    return dt.kind in "iu" and dt.itemsize == 1


def _wide(a, za, b, zb):
    """Other data (16-bit integers for MatMulInteger16, float8): one float64 GEMM, exact for
    integers while the sums stay below 2**53 (the callers check), wrapped to int32."""
    f = np.float64
    acc = np.matmul(a.astype(f) - (0 if za is None else np.asarray(za, f)), b.astype(f) - (0 if zb is None else np.asarray(zb, f)))
    return np.asarray(acc).astype(np.int64).astype(np.int32)
