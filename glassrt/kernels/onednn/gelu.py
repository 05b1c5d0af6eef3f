"""Gelu on oneDNN's eltwise primitive (gelu_erf, or gelu_tanh for approximate="tanh"): one
vectorized pass on the session's OpenMP threads, any rank, the values' bytes as they lie.

A Gelu stands alone where no product's epilogue takes it: after a quantized layer
(MatMulIntegerToFloat's output), a convolution's, a standalone bias Add. glassrt's cpu
kernel is exact (MLAS's erf) in three single-threaded passes. Measured on the 2-core
machine, 128 x 3072 values (a BERT-base FFN's), each kernel in its own process, alternating:
this step 103-110 us on two threads (its max check included), cpu's 430-467 us. oneDNN's gelu_erf is within ~1 ulp of the exact function (1.1e-6
against cpu's 4.5e-7 at values up to ~12) — what the FusedMatMul epilogue computes too.

One difference oneDNN has: it forms x·(1 + erf) before halving, so above ~1.7e38 (and at
+inf) it overflows to inf or NaN where Gelu(x) is x. Those inputs are found by one max
over x (~40 us of 393,216 values) and their outputs written as x, as onnxruntime gives them.
"""
from __future__ import annotations

import numpy as np

from ..registry import kernel
from . import dnnl
from .dnnl import ARG_DST, ARG_SRC, MemoryDesc
from .kernels import F32, SMALL_ELEMENTS, ContiguousViews, _PerThreads, _unavailable, run_alone

HUGE = np.float32(1e38)  # above this oneDNN's gelu_erf may overflow (x·2 > float32's max)
LINEAR_FROM = np.float32(8.0)  # Gelu(x) == x in float32 from here on (erf(x/√2) rounds to 1)


def _reason(ctx):
    why = _unavailable(ctx)
    if why:
        return why
    shape = ctx.shape(0)
    if shape is None or not all(isinstance(d, int) for d in shape):
        return "X's shape is not known when the plan is built"
    if 0 in shape:
        return "an empty input"
    if ctx.attrs.get("approximate", "none") not in ("none", "tanh"):
        return f"approximate={ctx.attrs.get('approximate')!r} is neither 'none' nor 'tanh'"
    return None


@kernel("Gelu", provider="onednn", dtypes=F32, out=True, bind=True, accepts=_reason, static_only=True,
        versions=(20, None), name="eltwise")
def gelu(ctx):
    """Gelu (opset 20), float32, any rank, on oneDNN's eltwise primitive (see the module doc)."""
    size = int(np.prod(ctx.shape(0)))
    tanh = ctx.attrs.get("approximate", "none") == "tanh"
    md = MemoryDesc.create((size,), np.float32, "a")
    prims = _PerThreads(lambda: dnnl.eltwise(md, md, "gelu_tanh" if tanh else "gelu_erf").primitive().bind(
        {ARG_SRC: None, ARG_DST: None}))
    alone = size <= SMALL_ELEMENTS  # see kernels.SMALL_ELEMENTS
    flat = ContiguousViews()  # the same view objects each run: no re-pointing

    def step(x, *, out):
        xf = flat("x", x, (size,))
        direct = out.flags.c_contiguous  # (a strided output is written through a copy)
        yf = flat("y", out, (size,)) if direct else np.empty(size, np.float32)
        run_alone(prims.get(), {ARG_SRC: xf, ARG_DST: yf}, alone)
        if not tanh and not xf.max() <= HUGE:  # (a NaN max fails the test too: rare, and harmless)
            np.copyto(yf, xf, where=xf > LINEAR_FROM)
        if not direct:
            np.copyto(out, yf.reshape(out.shape))
        return out

    return step
