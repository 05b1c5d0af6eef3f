"""The `onednn` provider's Transpose: one oneDNN reorder from the input read through permuted
strides into the plain output (a JIT-compiled copy run on the session's OpenMP threads).

NumPy's strided copy is fast while the innermost dim stays innermost (it copies whole rows)
and slow where it moves: each element then lands at its own stride. Measured on the 2-core
AVX-512 Xeon, hot, oneDNN against np.copyto(out, x.transpose(perm)):

    (1, 128, 12, 64) by (0, 2, 3, 1)  (BERT's keys)       12.1 vs  84 us
    (1, 12, 128, 128) by (0, 1, 3, 2)                     20.5 vs  95 us
    (1, 56, 56, 64) by (0, 3, 1, 2)   (NHWC to NCHW)      22.1 vs 190 us
    (1024, 1024) by (1, 0)                                 269 vs 6,487 us
    (1, 16, 16, 32) by (0, 2, 3, 1)                        2.8 vs 2.9 us
    (1, 8, 8, 16) by (0, 2, 3, 1)                          2.7 vs 1.1 us
    (1, 128, 12, 64) by (0, 2, 1, 3)  (rows of 64 move)   16.5 vs 11.2 us
    (1, 512, 12, 64) by (0, 2, 1, 3)                      59.9 vs 88.5 us

So this kernel takes a transpose that moves the innermost dim (dims of size 1 aside, and
dims that stay neighbours counted as one) from MIN_ELEMENTS on, and any other from
MIN_ROWS_ELEMENTS on (where the second thread pays); NumPy's copy (cpu.Transpose) does the
rest, and a transpose that only moves dims of size 1 is a view (cpu.Transpose.view).
"""
from __future__ import annotations

import math

import numpy as np

from ..cpu.shape import _perm  # (Transpose's perm as its meta reads it)
from ..registry import kernel
from . import dnnl
from .dnnl import ARG_FROM, ARG_TO, MemoryDesc
from .kernels import F32, ContiguousViews, _PerThreads, _unavailable

MIN_ELEMENTS = 1 << 12  # below, NumPy's copy is faster (1.1 vs 2.7 us at 1,024; even at 8,192)
MIN_ROWS_ELEMENTS = 1 << 18  # rows that stay whole: NumPy's copy is faster below (11.2 vs 16.5 us at 98,304)


def reduced(shape, perm) -> tuple[tuple, tuple]:
    """(shape, perm) of the same transpose with dims of size 1 dropped and input dims that
    stay neighbours, in order, merged into one: (1, 128, 12, 64) by (0, 2, 3, 1) is
    (128, 768) by (1, 0)."""
    order = [d for d in perm if shape[d] != 1]  # the kept input dims in output order
    groups: list[list[int]] = []
    for d in order:
        if groups and groups[-1][-1] + 1 == d:
            groups[-1].append(d)
        else:
            groups.append([d])
    by_input = sorted(groups, key=lambda g: g[0])
    sizes = tuple(math.prod(shape[d] for d in g) for g in by_input)
    index = {g[0]: i for i, g in enumerate(by_input)}
    return sizes, tuple(index[g[0]] for g in groups)


def _reason(ctx):
    why = _unavailable(ctx)
    if why:
        return why
    shape = ctx.shape(0)
    if shape is None:
        return "the input's shape is not known"
    shape = [int(d) for d in shape]
    perm = [int(p) for p in _perm(ctx.attrs.get("perm"), len(shape))]
    if sorted(perm) != list(range(len(shape))):
        return f"perm {perm} is not a permutation of the input's {len(shape)} dims"
    sizes, rperm = reduced(shape, perm)
    n = math.prod(shape)
    if rperm == tuple(range(len(rperm))):
        return "it moves only dims of size 1 (a view: cpu.Transpose.view)"
    if rperm[-1] == len(rperm) - 1 and n < MIN_ROWS_ELEMENTS:
        return (f"the innermost dim stays innermost and {n:,} elements are under {MIN_ROWS_ELEMENTS:,}: "
                "NumPy's copy of whole rows is as fast")
    if n < MIN_ELEMENTS:
        return f"{n:,} elements, under {MIN_ELEMENTS:,}: NumPy's copy is faster"
    return None


@kernel("Transpose", provider="onednn", dtypes=F32, out=True, bind=True, accepts=_reason, static_only=True)
def transpose(ctx):
    """A oneDNN reorder reading the input through permuted strides."""
    shape = [int(d) for d in ctx.shape(0)]
    perm = [int(p) for p in _perm(ctx.attrs.get("perm"), len(shape))]
    sizes, rperm = reduced(shape, perm)
    strides = [math.prod(sizes[d + 1:]) for d in range(len(sizes))]
    out_sizes = [sizes[p] for p in rperm]
    src = MemoryDesc.with_strides(out_sizes, np.float32, [strides[p] for p in rperm])
    dst = MemoryDesc.with_strides(out_sizes, np.float32)
    prims = _PerThreads(lambda: dnnl.reorder(src, dst).primitive().bind({ARG_FROM: None, ARG_TO: None}))
    flat = ContiguousViews()  # (the same views each run: the primitive's memories keep their pointers)
    out_shape = tuple(shape[p] for p in perm)

    def step(x, *, out=None):
        if out is None:
            out = np.empty(out_shape, np.float32)
        if not out.flags.c_contiguous:  # (the plan's buffers are; a caller's may not be)
            np.copyto(out, np.transpose(x, perm))
            return out
        prims.get().run({ARG_FROM: flat(0, x), ARG_TO: flat(1, out)})
        return out

    return step
