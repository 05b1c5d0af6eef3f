"""The `onednn` provider's products over shapes known only at run time: a plan shared by
several input shapes (runner.py's ShapePattern: BERT served at any sequence length), where
matmul.py's kernels, bound to concrete shapes, cannot go.

`matmul_any_rows` (constant weights): bound once per node, with the product's geometry (K,
N, the epilogue) and its packed weights, the same copy the static plans read
(kernels.packed_weights). Per call the rows decide the primitive: one descriptor and one
primitive per (geometry, rows), shared by every node of that geometry (BERT-base's 72
products have four), with one bound step per thread (kernels.thread_step) whose memories
each call points at its own arrays. A new length costs four descriptors and primitives
(~0.5 ms each), not 72 bindings. Taken only where oneDNN's matmul packs the weights in a
layout that does not depend on the rows (its brgemm kernels, AVX-512): elsewhere (oneDNN
3.2 on AVX2 has only its sgemm, which repacks at every call) the node stays with cpu's BLAS.

`batched_matmul_any_shape` (attention's Q·Kᵀ and P·V): the same, a primitive per shape.
A decode step's one-row products stay with cpu (its cache grows at every step).

Measured on BERT-base, 2 threads, one process alternating a plan of each kind request by
request over lengths 61-100: 1.00-1.02x cpu's time at a length's first request (its
primitives made), 0.92-0.94x later (benchmarks/HISTORY.md, stop 61).
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ...errors import NodeExecutionError, describe_node
from ...ir import TensorType
from ..registry import kernel, stand_in
from . import dnnl
from . import matmul as _matmul
from .capi import ARG_ATTR_SCALES
from .dnnl import ARG_BIAS, ARG_DST, ARG_SRC, ARG_WEIGHTS
from .kernels import (F32, MAX_ELEMENTS, SMALL_PRODUCT, NodeMemo, _unavailable, activation_drops_nan,
                      packed_weights, run_and_let_go, thread_step)
from .matmul import _Product, _weights_md, constant_weights_reason, rows_pd

STAND_IN_ROWS = 32  # the rows placement judges the product at (its primitive's implementation)


def _z_rows(ctx):
    """Whether Z is added per row (True) or as one row to every row (False), or why it cannot
    be read as a 2-D (rows or 1, N or 1) operand."""
    z, y = list(ctx.shape(3)), list(ctx.out_shape(0))
    z = [1] * (len(y) - len(z)) + z
    if not isinstance(z[-1], int):
        return f"Z's last dim {z[-1]} is symbolic"
    if all(d == 1 for d in z[:-1]):
        return False
    if z[:-1] == y[:-1]:
        return True
    return f"Z of shape {z} broadcasts over some leading dims of {y} only"


def _reason(ctx):
    why = _unavailable(ctx)
    if why:
        return why
    op = ctx.node.op_type
    a, b = ctx.shape(0), ctx.shape(1)
    if a is None or b is None or len(b) != 2 or len(a) < 2 or (op == "Gemm" and len(a) != 2):
        return "B is not a matrix or A has rank < 2 (matrix-vector products stay with cpu)"
    if op == "Gemm" and ctx.attrs.get("transA", 0):
        return "A is read transposed"
    if not isinstance(a[-1], int) or not all(isinstance(d, int) for d in b):
        return "K or N is symbolic"
    why = constant_weights_reason(ctx, b)
    if why:
        return why
    if op == "FusedMatMul" and ctx.has(3) and isinstance(z := _z_rows(ctx), str):
        return z
    if min(a[-1], *b) == 0:
        return "an empty product"
    p = _Product(ctx)
    if p.unpacked:
        return "B is too large to pack (read where it lies, by the kernels of plans with concrete shapes)"
    z_dims = _z_dims(p, p.z_shape is not None and _z_rows(ctx), STAND_IN_ROWS)
    impl = rows_pd(p, STAND_IN_ROWS, z_dims, ahead=False).impl  # (asked, never run)
    if not impl.startswith("brg"):
        return (f"oneDNN's matmul here is {impl}, not its brgemm, whose packed weights serve every row "
                f"count (matrix products with symbolic rows stay with cpu)")
    return None


def _z_dims(p, per_row: bool, rows: int):
    """Z as the primitive reads it over `rows` rows: (rows or 1, N or 1); None without Z."""
    if p.z_shape is None:
        return None
    return (rows if per_row else 1, [1, *p.z_shape][-1])


@kernel(["MatMul", "Gemm"], provider="onednn", dtypes=F32, out=True, bind=True, accepts=_reason, any_shape=True,
        priority=-1, name="matmul_any_rows")
def matmul_any_rows(ctx):
    """oneDNN matmul over A's rows, however many a run brings: a primitive per row count,
    shared by the products of one geometry; B packed once (in a plan with symbolic dims)."""
    p = _Product(ctx)
    z_per_row = p.z_shape is not None and _z_rows(ctx)
    node = ctx.node
    held = {}  # the packed weights, by layout (held here, or their sharing ends)
    memo = NodeMemo()  # rows -> bound(rows), per thread

    def bound(rows):
        """(shared step, the bias's argument, Z's argument, Z's dims, the packed weights) for
        `rows` on this thread: looked up in the shared caches once per row count and thread,
        then kept here (a run asks again for each of its products)."""
        z_dims = _z_dims(p, z_per_row, rows)
        pd = rows_pd(p, rows, z_dims, ahead=False)  # (made now: the call needs it)
        wmd = pd.weights_md()
        if wmd not in held:
            held[wmd] = packed_weights(p.b, _weights_md(p), wmd)
        key = ("weights", rows, p.k, p.n, p.trans_b, p.alpha, p.bias is not None, z_dims, p.act, tuple(p.params))

        def make():
            _, bias_arg, z_arg = p.post_ops(z_dims)
            bias_arg = ARG_BIAS if bias_arg is None and p.bias is not None else bias_arg
            args = {ARG_SRC: None, ARG_WEIGHTS: None, ARG_DST: None}
            for arg in (bias_arg, z_arg):
                if arg is not None:
                    args[arg] = None
            return pd.primitive().bind(args), bias_arg, z_arg
        return (*thread_step(key, make), z_dims, held[wmd].memory.array)

    def step(a, b_=None, c=None, z=None, *, out=None):
        a = a if a.flags.c_contiguous else np.ascontiguousarray(a)
        rows = a.size // p.k
        if out is None:  # (a dynamic step whose output shape it could not work out: allocated here)
            out = np.empty((*a.shape[:-1], p.n), np.float32)
        if a.size > MAX_ELEMENTS or out.size > MAX_ELEMENTS:
            raise NodeExecutionError(f"{describe_node(node)}: A of shape {list(a.shape)} gives a tensor larger "
                                     f"than oneDNN's kernels index ({MAX_ELEMENTS:,} elements)")
        st, bias_arg, z_arg, z_dims, weights = memo.get(rows, lambda: bound(rows))
        buffers = {ARG_SRC: a, ARG_WEIGHTS: weights, ARG_DST: out}
        if bias_arg is not None:
            buffers[bias_arg] = p.bias
        if z_arg is not None:
            buffers[z_arg] = np.ascontiguousarray(z, np.float32).reshape(z_dims)
        run_and_let_go(st, buffers, rows * p.k * p.n <= SMALL_PRODUCT)
        return out

    return step


kernel(["FusedMatMul"], provider="onednn", domain="glassrt", dtypes=F32, out=True, bind=True, accepts=_reason,
       any_shape=True, priority=-1, name="matmul_any_rows", drops_nan=activation_drops_nan)(matmul_any_rows)


# ---------------------------------------------------------------- products of two computed values

def _concrete(ctx, arrays, out):
    """ctx with the shapes of this call's arrays (inputs in the node's order, the output)."""
    inputs = [TensorType(a.dtype, a.shape) if isinstance(a, np.ndarray) else t
              for a, t in zip(arrays, ctx.input_types)]
    return replace(ctx, input_types=inputs, output_types=[TensorType(out.dtype, out.shape), *ctx.output_types[1:]])


def _permuted(shape, perm):
    return [shape[p] for p in perm] if perm else list(shape)


def _product_shape(ctx, a, b) -> tuple:
    """The output shape of the product of arrays a and b as the node lays it out (its perms)."""
    perm_a, perm_b, perm_y = _matmul._perms(ctx)
    pa, pb = _permuted(a.shape, perm_a), _permuted(b.shape, perm_b)
    y = (*np.broadcast_shapes(tuple(pa[:-2]), tuple(pb[:-2])), pa[-2], pb[-1])
    return tuple(y[k] for k in perm_y) if perm_y else y


def _batched_reason(ctx):
    """For attention's Q·Kᵀ and P·V in a plan whose lengths are symbolic. A product of one
    row per matrix (a decode step's query against its cache) stays with cpu: the cache grows
    by one at every step, and each step would make a primitive for microseconds of work."""
    if any(ctx.shape(i) is None for i in range(2)) or ctx.out_shape(0) is None:
        return "an operand's shape is not known"
    perm_a = tuple(ctx.attrs.get("perm_a") or ()) if ctx.node.op_type == "FusedMatMul" else ()
    a = _permuted(list(ctx.shape(0)), perm_a)
    if len(a) >= 2 and a[-2] == 1:
        return "one row per matrix (a decode step's query): its cache's length changes at every step"
    return _matmul._batched_reason(stand_in(ctx, STAND_IN_ROWS))  # (judged as placement judges a static kernel)


@kernel(["MatMul"], provider="onednn", dtypes=F32, out=True, bind=True, accepts=_batched_reason, any_shape=True,
        priority=-1, name="batched_matmul_any_shape")
def batched_matmul_any_shape(ctx):
    """oneDNN matmul of two computed values over shapes known only at run time: a primitive
    per shape, shared by the products of those shapes (in a plan with symbolic dims)."""
    bias = np.ascontiguousarray(ctx.const(2), np.float32).reshape(-1) if ctx.has(2) else None
    node = ctx.node
    memo = NodeMemo()  # (A's, B's, Z's and the output's shapes) -> shapes_of(...), per thread

    def shapes_of(a, b, z, out):
        """(shared step, its descriptor's _Batched, whether it runs alone, Z's dims, the bias
        row) for these shapes on this thread: worked out once per shapes and thread."""
        cctx = _concrete(ctx, (a, b, None, z), out)
        made = _matmul._batched_pd(cctx)
        a_dims, _, product = _matmul._product_dims(cctx)
        z_dims = None if z is None else [1] * (len(product) - z.ndim) + list(z.shape)
        row = None if bias is None else np.ascontiguousarray(np.broadcast_to(bias, (product[-1],)))
        return bound(made), made, math.prod(product) * a_dims[-1] <= SMALL_PRODUCT, z_dims, row

    def bound(made):
        def make():
            args = {ARG_SRC: None, ARG_WEIGHTS: None, ARG_DST: None}
            for arg in (made.bias_arg, made.z_arg):
                if arg is not None:
                    args[arg] = None
            if made.alpha is not None:
                args[ARG_ATTR_SCALES | ARG_SRC] = dnnl.vector(np.array([made.alpha], np.float32))
            return made.pd.primitive().bind(args)
        return thread_step(("computed", made), make)

    def step(a, b, bias_=None, z=None, *, out=None):
        if out is None:  # (a dynamic step whose output shape it could not work out: allocated here)
            out = np.empty(_product_shape(ctx, a, b), np.float32)
        if a.size > MAX_ELEMENTS or b.size > MAX_ELEMENTS or out.size > MAX_ELEMENTS:
            raise NodeExecutionError(f"{describe_node(node)}: operands of shapes {list(a.shape)}, {list(b.shape)} "
                                     f"give a tensor larger than oneDNN's kernels index ({MAX_ELEMENTS:,} elements)")
        st, made, alone, z_dims, row = memo.get((a.shape, b.shape, None if z is None else z.shape, out.shape),
                                                lambda: shapes_of(a, b, z, out))
        buffers = {ARG_SRC: np.ascontiguousarray(a, np.float32), ARG_WEIGHTS: np.ascontiguousarray(b, np.float32),
                   ARG_DST: out}
        if made.prefill:  # (see matmul._batched_primitive; no perm_y here: the output is the product)
            if z is None:
                out[...] = row
            elif bias is None:
                np.copyto(out, z.reshape(z_dims))
            else:
                np.add(z.reshape(z_dims), row, out=out)
        else:
            if made.z_arg is not None:
                buffers[made.z_arg] = np.ascontiguousarray(z, np.float32).reshape(z_dims)
            if made.bias_arg is not None:
                buffers[made.bias_arg] = row
        run_and_let_go(st, buffers, alone)
        return out

    return step


kernel(["FusedMatMul"], provider="onednn", domain="glassrt", dtypes=F32, out=True, bind=True,
       accepts=_batched_reason, any_shape=True, priority=-1, name="batched_matmul_any_shape",
       drops_nan=activation_drops_nan)(batched_matmul_any_shape)
