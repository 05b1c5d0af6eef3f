"""MatMul, Gemm and glassrt::FusedMatMul on BLAS (NumPy's, or oneDNN's sgemm on the OpenMP
pool: kernels/gemm.py)."""
from __future__ import annotations

import numpy as np

from .. import gemm as products
from ..registry import kernel
from ... import dtypes
from ._util import ACTIVATIONS, INTS, as_out
from .elementwise import _gelu_tanh as gelu_tanh
from .erf import erf
from .erf import gelu as gelu32
from ..buffers import tiles

MATMUL_TYPES = [np.float32, np.float64] + list(INTS)
HALF_TYPES = dtypes.DTypeSet([np.float16], ["BFLOAT16"])


def _bcast_rhs(ctx):
    a, b = ctx.shape(0), ctx.shape(1)
    return None if (a is not None and b is not None and len(b) == 2 and len(a) >= 2) else "rhs is not 2-D"


@kernel("MatMul", dtypes=MATMUL_TYPES, out=True, accepts=_bcast_rhs, priority=10, name="flattened_gemm")
def matmul_2d_rhs(a, b, *, out=None):
    """A (..., K) @ B (K, N) as one GEMM over all leading rows of A."""
    if out is None:
        out = np.empty(a.shape[:-1] + (b.shape[1],), np.result_type(a, b))
    if a.ndim == 2 or not a.flags.c_contiguous:
        return products.matmul(a, b, out)
    products.matmul(a.reshape(-1, a.shape[-1]), b, out.reshape(-1, b.shape[1]))
    return out


@kernel("MatMul", dtypes=MATMUL_TYPES, out=True)
def matmul(a, b, *, out=None):
    if out is None or a.ndim < 2 or b.ndim < 2:
        return np.matmul(a, b, out=out)
    return products.matmul(a, b, out)


@kernel("MatMul", dtypes=HALF_TYPES, out=True, name="half_via_float32")
def matmul_half(a, b, *, out=None):
    """float16/bfloat16 through float32 BLAS (NumPy has no half-precision GEMM)."""
    y = np.matmul(a.astype(np.float32), b.astype(np.float32))
    if out is None:
        return y.astype(a.dtype)
    np.copyto(out, y, casting="unsafe")
    return out


@kernel("Gemm", dtypes=HALF_TYPES, out=True, name="half_via_float32")
def gemm_half(a, b, c=None, *, out=None, alpha=1.0, beta=1.0, transA=0, transB=0, broadcast=0):
    """float16/bfloat16 through a float32 GEMM, rounded once into the output."""
    f = np.float32
    y = gemm(a.astype(f), b.astype(f), None if c is None else c.astype(f), alpha=alpha, beta=beta,
             transA=transA, transB=transB)
    return y.astype(a.dtype) if out is None else as_out(y, out, cast=True)


@kernel("Gemm", dtypes=MATMUL_TYPES, out=True)
def gemm(a, b, c=None, *, out=None, alpha=1.0, beta=1.0, transA=0, transB=0, broadcast=0):
    # broadcast (Gemm-1..6): C broadcasts to (M, N) either way, as NumPy does.
    a = a.T if transA else a
    b = b.T if transB else b
    y = np.matmul(a, b) if out is None else products.matmul(a, b, out)
    if alpha != 1.0:
        y *= y.dtype.type(alpha)
    if c is not None and beta != 0.0:
        if beta == 1.0:
            y += c
        else:  # beta * C a tile at a time: C may be a whole (M, N) matrix
            b = y.dtype.type(beta)
            cb = np.broadcast_to(c, y.shape)
            for idx in tiles(y.shape):
                y[idx] += cb[idx] * b
    return y


# ---------------------------------------------------------------- glassrt::FusedMatMul


# A plain function of its inputs, not a builder: in a plan with symbolic dims (decoding with
# a growing cache) a plain kernel's output shape is a formula evaluated per run, where a
# builder is re-bound, its meta re-run, for every new shape.
@kernel("FusedMatMul", domain="glassrt", dtypes=[np.float32, np.float64], out=True, name="gemm_then_epilogue")
def fused_matmul(a, b, bias=None, z=None, *, out=None, alpha=1.0, activation="", activation_params=(),
                 perm_a=(), perm_b=(), perm_y=()):
    """act(alpha·(A @ B) + bias + Z): the product (one GEMM over A's rows when B is 2-D),
    then each step in place on the output (passes/fuse_matmul.py); A and B read through
    perm_a / perm_b and the result transposed by perm_y where given (passes/fold_transposes.py)."""
    if perm_a:
        a = a.transpose(perm_a)
    if perm_b:
        b = b.transpose(perm_b)
    if perm_y:
        y = fused_matmul(a, b, bias, z, alpha=alpha, activation=activation, activation_params=activation_params)
        if out is None:
            return np.ascontiguousarray(y.transpose(perm_y))
        np.copyto(out, y.transpose(perm_y))
        return out
    if b.ndim == 2 and a.ndim >= 2:
        out = matmul_2d_rhs(a, b, out=out)
    else:
        out = matmul(a, b, out=out)
    if alpha != 1.0:
        out *= out.dtype.type(alpha)
    if bias is not None:
        out += bias
    if z is not None:
        out += z
    return activate(out, activation, activation_params)


def activate(out, activation: str, activation_params=()):
    """FusedMatMul's activation (ops/fused.MATMUL_ACTIVATIONS) in place on `out`; `out`."""
    if activation == "Gelu":
        if out.dtype == np.float32:
            return gelu32(out, out)
        out[...] = 0.5 * out * (1 + erf(out * np.sqrt(0.5)))
        return out
    if activation == "GeluTanh":
        out[...] = gelu_tanh(out)
        return out
    if activation == "Tanh":
        return np.tanh(out, out=out)
    return ACTIVATIONS[activation](out, [float(v) for v in activation_params]) if activation else out
