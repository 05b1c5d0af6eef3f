"""The `onednn` provider's matrix products: MatMul, Gemm and glassrt::FusedMatMul on
oneDNN's matmul primitive, for products with constant weights (a layer's B).

What it gains over a BLAS call: FusedMatMul's epilogue (scale, bias, residual or mask,
activation; passes/fuse_matmul.py) runs as post-ops while each tile of the product is
still in cache, with no pass over memory of its own (BERT-base: the bias Adds and the Gelu
were 12% of a run). The weights are offered to oneDNN in any layout; where it prefers a
blocked one (its brgemm kernels on AVX-512) they are reordered once, shared by every plan
(kernels.packed_weights). On AVX2 oneDNN 3.2's matmul reads them as they are and packs them
anew at every call (sgemm); there a product of 1 to INNER_ROWS - 1 rows runs on its inner
product instead, whose brgemm kernel reads them packed once (the `inner_product` kernel),
plans of other row counts (a prompt's and a decode step's) sharing one packed copy. A
(..., M, K) input is one (rows, K) product.

Products of two computed values (attention's Q·Kᵀ and P·V) run on a second kernel: the
batch dims of A and B broadcast by oneDNN, the epilogue (the scale and the mask) as
post-ops. Both kernels are bound to a plan's concrete shapes. A plan whose dims stay
symbolic (one shared by several sequence lengths) takes matmul_rows.py's kernels instead,
which make a primitive per shape at run time, shared by the nodes of that shape; a decode
step's one-row attention products stay with cpu there (its cache grows at every step).

At one row (a decode step), once the plan has run a few times, the matmul primitive's
packed weights are read by row_panels.py's compiled loop instead, which streams them
faster, where they lie in 64-column panels (its brgemm's layout on AVX-512; on AVX2 the
one-row product is the inner product's, whose brgemm streams its own layout at ~24 GB/s,
faster than that loop over it).

Weights larger than `_PACK_LIMIT` are read where they lie (plain layout) rather than
copied: a packed copy doubles what a 400 MB classifier layer holds in memory (unless they
are mapped from their file: the file's pages are released as the copy is made, so those
are packed whatever their size). At one row
(batch-1 classifiers, a decode step's vocabulary projection) such a product runs on a third
kernel, `gemv`: oneDNN's sgemm, whose matrix-vector path reads plain weights at close to
memory bandwidth where the matmul primitive does not (measured on the 2-core AVX-512
machine, medians of 15 alternating calls: 1 x 768 @ 768 x 50257 matmul primitive 10.3 ms,
sgemm 5.6 ms; 1 x 25088 @ (4096 x 25088)ᵀ 17.1 vs 12.8 ms; from 4 rows on the primitive
is as fast or faster: 4 rows 12.4 vs 16.0 ms, 8 rows 23.2 vs 46.1 ms).
"""
from __future__ import annotations

import math

import numpy as np

from ... import pages
from ...ops.fused import MATMUL_ACTIVATIONS, PERM_ATTRS
from ...weights import is_mapped
from ..registry import kernel
from . import capi, dnnl
from .capi import ARG_ATTR_SCALES
from .dnnl import ARG_BIAS, ARG_DST, ARG_SRC, ARG_WEIGHTS, MemoryDesc
from .kernels import (F32, SMALL_PRODUCT, ContiguousViews, _PerThreads, _unavailable, activation_drops_nan,
                      packed_layouts, packed_weights, run_alone, shared_pd)

_PACK_LIMIT = 64 << 20
_SLOW = ("ref",)  # oneDNN's reference matmul: a loop nest, far slower than BLAS
# implementations whose binary post-ops add a broadcast operand slowly (_batched_primitive)
_SLOW_BROADCAST_POST_OPS = ("gemm",)

# FusedMatMul's activations as oneDNN eltwise post-ops: (name, params -> (alpha, beta)).
_POST = {"Relu": ("relu", lambda p: (0.0, 0.0)), "LeakyRelu": ("relu", lambda p: (p[0] if p else 0.01, 0.0)),
         "Clip": ("clip", lambda p: (p[0], p[1])), "Sigmoid": ("logistic", lambda p: (0.0, 0.0)),
         "Tanh": ("tanh", lambda p: (0.0, 0.0)), "Gelu": ("gelu_erf", lambda p: (0.0, 0.0)),
         "GeluTanh": ("gelu_tanh", lambda p: (0.0, 0.0))}
assert set(_POST) == set(MATMUL_ACTIVATIONS) - {""}


class _Product:
    """The geometry of a product with constant B: rows × K @ K × N (+ the epilogue)."""

    def __init__(self, ctx):
        op = ctx.node.op_type
        a, b = list(ctx.shape(0)), [int(d) for d in ctx.shape(1)]
        self.trans_a = op == "Gemm" and bool(ctx.attrs.get("transA", 0))
        gemm_trans_b = op == "Gemm" and bool(ctx.attrs.get("transB", 0))
        self.k = int(a[-2] if self.trans_a else a[-1])
        lead = a[-1:] if self.trans_a else a[:-1]
        # None where A's leading dims are symbolic (a plan shared by several lengths: any_rows)
        self.rows = math.prod(lead) if all(isinstance(d, int) for d in lead) else None
        self.n = b[0] if gemm_trans_b else b[1]
        # the weights as they lie: b (C-contiguous), trans_b where it holds them (N, K)
        self.b, self.trans_b = _storage(ctx.const(1), gemm_trans_b)
        # too large to hold twice: read as they lie (mapped weights are not held twice)
        self.unpacked = self.k * self.n * 4 > _PACK_LIMIT and not is_mapped(self.b)
        self.alpha = float(ctx.attrs.get("alpha", 1.0))
        self.bias = self.z = None  # constant (N,) bias / a value added into the product
        self.z_shape = None
        if op == "Gemm":
            beta = float(ctx.attrs.get("beta", 1.0))
            c = ctx.const(2) if ctx.has(2) else None
            if c is not None and beta != 0.0:
                self.bias = (np.broadcast_to(c.astype(np.float32).reshape(-1), (self.n,)) * np.float32(beta)).reshape(1, -1)
            self.act, self.params = "", []
        else:
            if ctx.has(2):
                self.bias = np.ascontiguousarray(ctx.const(2), np.float32).reshape(1, -1)
                if self.bias.shape[1] != self.n:
                    self.bias = np.broadcast_to(self.bias, (1, self.n)).copy()
            if ctx.has(3):
                self.z_shape = list(ctx.shape(3))
            self.act = ctx.attrs.get("activation", "") if op == "FusedMatMul" else ""
            self.params = [float(v) for v in ctx.attrs.get("activation_params") or []]

    def z_dims(self, y_shape):
        """Z as the 2-D operand oneDNN reads: (rows, N), (1, N), (rows, 1) or (1, 1)."""
        z = [1] * (len(y_shape) - len(self.z_shape)) + self.z_shape
        lead = math.prod(z[:-1])
        return (self.rows if lead == self.rows else 1, z[-1])

    def post_ops(self, z_dims):
        """(post-ops, the bias's argument if it is a post-op, Z's argument): the bias is the
        primitive's own unless a scale comes first (alpha·(A @ B) + bias). z_dims: Z as the
        primitive reads it (z_dims()), None without Z."""
        post = dnnl.PostOps()
        bias_arg = z_arg = None
        if self.alpha != 1.0:
            post.eltwise("linear", self.alpha, 0.0)
            if self.bias is not None:
                post.binary("add", MemoryDesc.create((1, self.n), np.float32, "ab"))
                bias_arg = post.binary_arg()
        if z_dims is not None:
            post.binary("add", MemoryDesc.create(z_dims, np.float32, "ab"))
            z_arg = post.binary_arg()
        if self.act:
            name, params = _POST[self.act]
            post.eltwise(name, *params(self.params))
        return post, bias_arg, z_arg


def _storage(b: np.ndarray, transposed: bool) -> tuple[np.ndarray, bool]:
    """(B's storage as a C-contiguous float32 array, whether it holds the product's K x N
    matrix transposed). A constant laid out in Fortran order (a view of its transposed
    twin: passes/tied_weights.py) is read where it lies, transposed, not copied."""
    if not b.flags.c_contiguous and b.ndim == 2 and b.T.flags.c_contiguous:
        b, transposed = b.T, not transposed
    if b.dtype != np.float32 or not b.flags.c_contiguous:
        b = np.ascontiguousarray(b, np.float32)  # (asarray would also turn a file mapping into a plain array)
    return b, transposed


def _z_reason(z_shape, y_shape):
    """None if Z broadcasts into (rows, N) in a way oneDNN reads: whole, one row, or one column."""
    z = [1] * (len(y_shape) - len(z_shape)) + list(z_shape)
    lead = math.prod(z[:-1])
    rows = math.prod(y_shape[:-1])
    if lead not in (1, rows) or (lead == rows and z[:-1] != list(y_shape[:-1])):
        return f"Z of shape {list(z_shape)} broadcasts over some leading dims of {list(y_shape)} only"
    return None


def constant_weights_reason(ctx, b):
    """None if the product's B (of shape `b`) is a constant and its epilogue is one these
    kernels apply (Gemm's C a constant row; FusedMatMul's bias a constant, its activation a
    post-op, nothing transposed), else why not. Z is each kernel's own question."""
    if ctx.const(1) is None:
        return "B is computed at run time (only constant weights are prepacked here)"
    if ctx.node.op_type == "Gemm" and ctx.has(2):
        c = ctx.const(2)
        n = int(b[0] if ctx.attrs.get("transB", 0) else b[1])
        if c is None or c.size not in (1, n) or (c.ndim == 2 and c.shape[0] != 1):
            return "C is not a constant row (N,) or (1, N)"
    if ctx.node.op_type == "FusedMatMul":
        if any(ctx.attrs.get(p) for p in PERM_ATTRS):
            return "an operand or the result is transposed (perm_a / perm_b / perm_y: the batched kernel's)"
        if ctx.has(2) and ctx.const(2) is None:
            return "the bias is not a constant"
        if ctx.attrs.get("activation", "") not in MATMUL_ACTIVATIONS:
            return f"activation {ctx.attrs.get('activation')} has no oneDNN post-op here"
    return None


def _operands_reason(ctx):
    """None if the node is a product with constant weights that oneDNN can take, else why not."""
    why = _unavailable(ctx)
    if why:
        return why
    a, b = ctx.shape(0), ctx.shape(1)
    if a is None or b is None or len(b) != 2 or len(a) < 2 or (ctx.node.op_type == "Gemm" and len(a) != 2):
        return "B is not a matrix or A has rank < 2 (matrix-vector products stay with cpu)"
    why = constant_weights_reason(ctx, b)
    if why:
        return why
    if ctx.node.op_type == "FusedMatMul":
        y = ctx.out_shape(0)
        if ctx.has(3):
            why = _z_reason([int(d) for d in ctx.shape(3)], [int(d) for d in y])
            if why:
                return why
    if min(int(d) for d in list(a) + list(b)) == 0:
        return "an empty product"
    return None


def _reason(ctx):
    why = _operands_reason(ctx)
    if why:
        return why
    p = _Product(ctx)
    impl = _product_pd(ctx, p).impl
    if impl.startswith(_SLOW):
        return f"oneDNN has only its reference matmul ({impl}) for this product"
    return None


def _product_pd(ctx, p):
    """The node's primitive descriptor, shared by every product of the same geometry and
    epilogue (kernels.shared_pd): expanding composites, placing nodes and binding each ask
    for it, and one takes ~0.3 ms to make."""
    y = [int(d) for d in ctx.out_shape(0)]
    return rows_pd(p, p.rows, p.z_dims(y) if p.z_shape is not None else None)


def rows_pd(p, rows: int, z_dims, ahead: bool = True):
    """The shared descriptor of product `p` over `rows` rows, Z read as `z_dims` (or None);
    ahead: its primitive made before the next first run (kernels.shared_pd)."""
    key = ("weights", rows, p.k, p.n, p.trans_a, p.trans_b, p.unpacked, p.alpha, p.bias is not None, z_dims,
           p.act, tuple(p.params))
    return shared_pd(key, lambda: _primitive(p, rows, z_dims), ahead=ahead)


def _weights_md(p):
    """B as the constant lies: (K, N), or (N, K) read transposed (Gemm's transB)."""
    if p.trans_b:
        return MemoryDesc.create((p.n, p.k), np.float32, "ab").permute_axes((1, 0))
    return MemoryDesc.create((p.k, p.n), np.float32, "ab")


def _primitive(p, rows: int, z_dims):
    """The primitive descriptor for product `p` over `rows` rows (weights 'any', so oneDNN
    picks its packed layout, unless they are too large to copy)."""
    post, bias_arg, _ = p.post_ops(z_dims)
    src = MemoryDesc.create((p.k, rows), np.float32, "ab").permute_axes((1, 0)) if p.trans_a \
        else MemoryDesc.create((rows, p.k), np.float32, "ab")
    weights = _weights_md(p) if p.unpacked else MemoryDesc.any((p.k, p.n))
    bias = MemoryDesc.create((1, p.n), np.float32, "ab") if p.bias is not None and bias_arg is None else None
    return dnnl.matmul(src, weights, MemoryDesc.create((rows, p.n), np.float32, "ab"), bias, attr=post)


# A product takes the inner product (when oneDNN's matmul has only its sgemm) for rows in
# [1, INNER_ROWS): measured on the 2-core AVX2 EPYC, two threads, medians of up to 200
# calls, inner product / matmul over BERT's and GPT-2's four weight shapes: at 256 and 512
# rows (two processes) 0.82-1.03 and 0.72-1.06, at 128 and 1024 (three) 0.43-1.16 and
# 0.96-1.14 (sgemm's per-call packing is paid off over many rows); at 1, 4 and 16 rows (one)
# 0.82-1.22, 0.49-0.91, 0.64-1.00. One row alone, GPT-2's 48 layer products cycled (340 MB,
# no post-ops): 13.6-14.3 ms against 15.2-15.4; in its decode step, where the matmul applies
# bias, residual and GeluTanh after its sgemm, 15.5-15.9 ms against 17.4-17.8 (the step
# 27.5-28.6 -> 24.7-25.4 ms, four alternating processes).
INNER_ROWS = 512
_REPACKS = ("gemm",)  # oneDNN's matmul implementations that pack B anew at every call (its sgemm)


def _inner_reason(ctx):
    why = _operands_reason(ctx)
    if why:
        return why
    p = _Product(ctx)
    if p.trans_a:
        return "A is read transposed (an inner product reads A's rows as they lie)"
    if p.unpacked:
        return "B is too large to pack: the matmul primitive reads it where it lies"
    return _inner_instead(p.rows, lambda: _product_pd(ctx, p), lambda: _inner_pd(ctx, p))[1]


def _inner_instead(rows: int, matmul_pd, inner_pd):
    """(the inner product's descriptor, None) where it should run a product instead of the
    matmul, else (None, why not); matmul_pd() and inner_pd() make the two descriptors."""
    if not 1 <= rows < INNER_ROWS:
        return None, f"A has {rows} rows (the inner product pays up to {INNER_ROWS - 1})"
    impl = matmul_pd().impl
    if not impl.startswith(_REPACKS):
        return None, f"oneDNN's matmul packs the weights itself here ({impl})"
    inner = inner_pd()
    if not inner.impl.startswith("brgemm"):
        return None, f"oneDNN's inner product has no packed kernel here ({inner.impl})"
    return inner, None


def _inner_pd(ctx, p):
    """The inner product's descriptor for the product: weights 'any' (packed for brgemm),
    or a layout the same weights lie packed in already where brgemm reads that too. oneDNN's
    choice depends on the rows (GPT-2's: AB8b24a at 1 to 4 rows, AB8b16a at 8 to 64), so a
    prompt plan and a decode plan would each pack a copy (340 MB each for GPT-2)."""
    y = [int(d) for d in ctx.out_shape(0)]
    key = ("inner", p.rows, p.k, p.n, p.alpha, p.bias is not None, p.z_dims(y) if p.z_shape is not None else None,
           p.act, tuple(p.params))

    def make(weights):
        post, bias_arg, _ = p.post_ops(p.z_dims(y) if p.z_shape is not None else None)
        bias = MemoryDesc.create((p.n,), np.float32, "a") if p.bias is not None and bias_arg is None else None
        return dnnl.inner_product(MemoryDesc.create((p.rows, p.k), np.float32, "ab"), weights,
                                  MemoryDesc.create((p.rows, p.n), np.float32, "ab"), bias, attr=post)
    for packed in packed_layouts(p.b, _inner_user_md(p)):
        pd = shared_pd((*key, packed), lambda: _pd_or_none(make, packed))
        if pd is not None and pd.impl.startswith("brgemm"):
            pd.make_ahead()
            return pd
    return shared_pd(key, lambda: make(MemoryDesc.any((p.n, p.k))), ahead=True)


def _inner_user_md(p):
    """The weights as they lie, as the inner product reads them: (N, K)."""
    return _weights_md(p).permute_axes((1, 0))


def _pd_or_none(make, weights):
    try:
        return make(weights)
    except capi.DnnlError:  # (no implementation reads that layout at these rows)
        return None


def constant_weights_pd(rows: int, k: int, n: int, post_ops=None, key=()):
    """(descriptor, inner) of a float32 (rows, K) @ constant (K, N) -> (rows, N) with
    `post_ops()`'s post-ops (`key` tells them apart): oneDNN's inner product where the
    inner_product kernel would take the product (packed once where the matmul repacks at
    every call), else its matmul with B in any layout. The weights it packs are read as
    `constant_weights_md(k, n, inner)`. For products other kernels build (int8_float_matmul.py)."""
    src, dst = MemoryDesc.create((rows, k), np.float32, "ab"), MemoryDesc.create((rows, n), np.float32, "ab")

    def attr():
        return None if post_ops is None else dnnl.Attr(post_ops=post_ops())
    def matmul_pd():
        return shared_pd(("constant weights", rows, k, n, key),
                         lambda: dnnl.matmul(src, MemoryDesc.any((k, n)), dst, attr=attr()), ahead=True)

    def inner_pd():
        return shared_pd(("constant weights, inner", rows, k, n, key),
                         lambda: dnnl.inner_product(src, MemoryDesc.any((n, k)), dst, attr=attr()), ahead=True)
    inner, _ = _inner_instead(rows, matmul_pd, inner_pd)
    return (inner, True) if inner is not None else (matmul_pd(), False)


def constant_weights_md(k: int, n: int, inner: bool, dtype=np.float32) -> MemoryDesc:
    """A C-contiguous (K, N) matrix as the matmul (K x N) or the inner product (N x K) reads it."""
    md = MemoryDesc.create((k, n), dtype, "ab")
    return md.permute_axes((1, 0)) if inner else md


@kernel(["MatMul", "Gemm"], provider="onednn", dtypes=F32, out=True, bind=True, accepts=_reason, static_only=True,
        name="matmul")
def matmul(ctx):
    """oneDNN matmul over A's rows, B reordered once; FusedMatMul's epilogue as post-ops."""
    return _bound_product(ctx, inner=False)


kernel(["FusedMatMul"], provider="onednn", domain="glassrt", dtypes=F32, out=True, bind=True, accepts=_reason,
       static_only=True, name="matmul", drops_nan=activation_drops_nan)(matmul)


@kernel(["MatMul", "Gemm"], provider="onednn", dtypes=F32, out=True, bind=True, accepts=_inner_reason,
        static_only=True, priority=5, name="inner_product")
def inner_product(ctx):
    """oneDNN inner product over A's rows, B packed once (oneDNN's matmul here packs B again at every call).

    Its brgemm kernel reads B packed once, where oneDNN's matmul has only its sgemm (oneDNN
    3.2 on AVX2), which packs B at every call; the epilogue is the matmul kernel's."""
    return _bound_product(ctx, inner=True)


kernel(["FusedMatMul"], provider="onednn", domain="glassrt", dtypes=F32, out=True, bind=True,
       accepts=_inner_reason, static_only=True, priority=5, name="inner_product",
       drops_nan=activation_drops_nan)(inner_product)


def _bound_product(ctx, inner: bool):
    """The step of a product with constant B on oneDNN's matmul primitive, or its inner
    product (which reads B as (N, K): the same weights' md transposed)."""
    p = _Product(ctx)
    y = [int(d) for d in ctx.out_shape(0)]
    z_dims = p.z_dims(y) if p.z_shape is not None else None
    b = p.b
    packed = {}

    def build():
        pd = (_inner_pd if inner else _product_pd)(ctx, p)
        post, bias_arg, z_arg = p.post_ops(z_dims)
        wmd = pd.weights_md()
        user = _inner_user_md(p) if inner else _weights_md(p)
        if wmd not in packed:
            # the holder of shared packed weights stays referenced here, or the sharing ends;
            # weights the primitive reads where they lie move onto huge pages with its buffers
            if wmd == user:
                packed[wmd] = np.ascontiguousarray(b, np.float32)
                pages.promote_with_the_rest(packed[wmd])
            else:
                packed[wmd] = packed_weights(b, user, wmd)
        w = packed[wmd]
        args = {ARG_SRC: None, ARG_WEIGHTS: w if isinstance(w, np.ndarray) else w.memory, ARG_DST: None}
        if p.bias is not None:
            args[bias_arg if bias_arg is not None else ARG_BIAS] = p.bias
        if z_arg is not None:
            args[z_arg] = None
        return pd.primitive().bind(args), z_arg

    prims = _PerThreads(build)
    view = ContiguousViews()  # Z in the primitive's dims (the same object: no re-pointing)
    alone = p.rows * p.k * p.n <= SMALL_PRODUCT  # see kernels.SMALL_PRODUCT
    # one row, in a plan that keeps running: after AFTER_RUNS runs the weights are streamed
    # by row_panels' loop (runs: None once decided; streamed: None where it cannot)
    runs, streamed = [0 if p.rows == 1 and not alone else None], [None]

    def step(a, b_=None, c=None, z=None, *, out):
        if streamed[0] is not None and streamed[0](a, z, out) is not None:
            return out
        prim, z_arg = prims.get()
        if runs[0] is not None:  # (None once streamed[0] is decided)
            runs[0] += 1
            from . import row_panels  # (imported by one-row products, a decoding loop's, not by every model)

            if runs[0] >= row_panels.AFTER_RUNS:
                streamed[0], runs[0] = row_panels.stream(prim, p), None
        buffers = {ARG_SRC: a if a.flags.c_contiguous else np.ascontiguousarray(a), ARG_DST: out}
        if z_arg is not None:
            buffers[z_arg] = view("z", z, z_dims)
        run_alone(prim, buffers, alone)
        return out

    return step


def _gemv_reason(ctx):
    why = _operands_reason(ctx)
    if why:
        return why
    p = _Product(ctx)
    if p.rows != 1:
        return f"A has {p.rows} rows (from a few rows on the matmul primitive is as fast or faster)"
    if not p.unpacked:
        return ("B is packed (small enough, or mapped from its file, whose pages are released as it is): "
                "the matmul primitive takes it")
    if p.trans_a:
        return "A is read transposed"
    if p.z_shape is not None:
        return "the residual needs the matmul primitive's post-ops"
    return None


@kernel(["MatMul", "Gemm"], provider="onednn", dtypes=F32, out=True, bind=True, accepts=_gemv_reason,
        static_only=True, one_row=True, priority=10, name="gemv")
def gemv(ctx):
    """One row against weights too large to pack, read where they lie, by oneDNN's sgemm
    (its matrix-vector path; see the module's doc); a constant bias is written into the
    output first and accumulated onto (beta = 1), a FusedMatMul's activation applied after,
    in place, as the cpu kernel applies it (one pass over the row)."""
    from ..cpu.matmul import activate

    p = _Product(ctx)
    b = p.b  # mapped float32 weights, or a view of a tied twin: no copy
    sgemm = capi.require().dnnl_sgemm
    bias = None if p.bias is None else p.bias.reshape(-1)
    beta = 0.0 if bias is None else 1.0
    pages.promote_with_the_rest(b)  # read where it lies at every run: onto huge pages once the plan keeps running
    # weights lying (N, K), in a plan that keeps running: after AFTER_RUNS runs they are read
    # by row_panels' dot-product loop (runs: None once decided; rows: None where it cannot)
    runs, rows = [0 if p.trans_b else None], [None]

    def step(a, b_=None, c=None, *, out):
        if rows[0] is not None:
            if rows[0](a, out) is not None:
                return activate(out, p.act, p.params)
        elif runs[0] is not None:
            runs[0] += 1
            from . import row_panels

            if runs[0] >= row_panels.AFTER_RUNS:
                rows[0], runs[0] = row_panels.stream_rows(b, p), None
        a = a if a.flags.c_contiguous else np.ascontiguousarray(a)
        flat = out.reshape(-1)
        if bias is not None:
            flat[...] = bias
        if p.trans_b:  # B lies (N, K): the row a · Bᵀ
            sgemm(b"N", b"T", 1, p.n, p.k, p.alpha, a.ctypes.data, p.k, b.ctypes.data, p.k, beta, flat.ctypes.data,
                  p.n)
        else:
            # B lies (K, N): asked as the column Bᵀ · aᵀ, which oneDNN's sgemm reads ~25% faster
            # than the row a · B (measured on the 2-core AVX2 EPYC, 1 x 768 @ 768 x 50257, two
            # threads, medians of 20 calls in four processes: 6.8-7.6 ms against 9.3-10.1)
            sgemm(b"T", b"N", p.n, 1, p.k, p.alpha, b.ctypes.data, p.n, a.ctypes.data, 1, beta, flat.ctypes.data, 1)
        return activate(out, p.act, p.params)

    return step


kernel(["FusedMatMul"], provider="onednn", domain="glassrt", dtypes=F32, out=True, bind=True, accepts=_gemv_reason,
       static_only=True, one_row=True, priority=10, name="gemv")(gemv)


# ---------------------------------------------------------------- products of two computed values


def _padded(shape, rank):
    return [1] * (rank - len(shape)) + [int(d) for d in shape]


def _perms(ctx) -> tuple:
    """(perm_a, perm_b, perm_y) as tuples (() where the operand is read as it is)."""
    fused = ctx.node.op_type == "FusedMatMul"
    return tuple(tuple(int(p) for p in (ctx.attrs.get(w) or [])) if fused else () for w in PERM_ATTRS)


def _strided_md(shape, perm, rank, inverse=False) -> MemoryDesc:
    """A C-contiguous array of `shape` as the product sees it: its dims transposed by `perm`
    (with inverse=True, the array is the product transposed by `perm`: the output), padded
    with leading ones to `rank`. oneDNN's matmul reads and writes through any strides."""
    shape = [int(d) for d in shape]
    strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
    if perm and inverse:
        dims, st = [0] * len(shape), [0] * len(shape)
        for i, p in enumerate(perm):  # the array's dim i is the product's dim perm[i]
            dims[p], st[p] = shape[i], strides[i]
        shape, strides = dims, st
    elif perm:
        shape, strides = [shape[p] for p in perm], [strides[p] for p in perm]
    pad = rank - len(shape)
    return MemoryDesc.with_strides([1] * pad + shape, np.float32, [max(1, math.prod(shape))] * pad + strides)


def _product_dims(ctx) -> tuple[list, list, list]:
    """A's, B's and the product's dims as the product sees them (the perms applied)."""
    perm_a, perm_b, perm_y = _perms(ctx)
    a, b, y = ([int(d) for d in s] for s in (ctx.shape(0), ctx.shape(1), ctx.out_shape(0)))
    a = [a[p] for p in perm_a] if perm_a else a
    b = [b[p] for p in perm_b] if perm_b else b
    if perm_y:
        unpermuted = [0] * len(y)
        for i, p in enumerate(perm_y):
            unpermuted[p] = y[i]
        y = unpermuted
    return a, b, y


def _batched_reason(ctx):
    """For a product whose B is computed at run time (attention's Q·Kᵀ and P·V), with the
    batch dims of A and B broadcast by oneDNN; shapes fixed per plan."""
    why = _unavailable(ctx)
    if why:
        return why
    if ctx.shape(0) is None or ctx.shape(1) is None or ctx.out_shape(0) is None:
        return "an operand's shape is not known"
    a, b, y = _product_dims(ctx)
    if len(a) < 2 or len(b) < 2:
        return "an operand of rank < 2 (matrix-vector products stay with cpu)"
    if ctx.const(1) is not None:
        return "B is a constant (the weights kernel takes it)"
    if min(int(d) for d in list(a) + list(b)) == 0:
        return "an empty product"
    if ctx.node.op_type == "FusedMatMul" and ctx.attrs.get("activation", "") not in MATMUL_ACTIVATIONS:
        return f"activation {ctx.attrs.get('activation')} has no oneDNN post-op here"
    if ctx.node.op_type == "FusedMatMul" and ctx.has(2) and ctx.const(2) is None:
        return "the bias is not a constant"
    if _perms(ctx)[2] and (ctx.has(2) or ctx.has(3)):
        # (oneDNN 3.2's brgemm matmul ended the process with SIGSEGV adding Z to a result
        # written through permuted strides; the bias is the same kind of post-op)
        return "a bias or Z added to a result written transposed (perm_y)"
    impl = _batched_pd(ctx).pd.impl
    if impl.startswith(_SLOW):
        return f"oneDNN has only its reference matmul ({impl}) for this product"
    return None


def _batched_pd(ctx):
    """_Batched: the descriptor and how its epilogue is fed, shared by products of the same
    shapes and epilogue (see _product_pd)."""
    a, b, y = ctx.shape(0), ctx.shape(1), ctx.out_shape(0)
    fused = ctx.node.op_type == "FusedMatMul"
    key = ("computed", tuple(a), tuple(b), tuple(y), _perms(ctx), fused, ctx.has(2) and fused,
           tuple(ctx.shape(3)) if fused and ctx.has(3) else None,
           float(ctx.attrs.get("alpha", 1.0)) if fused else 1.0, ctx.attrs.get("activation", "") if fused else "",
           tuple(float(v) for v in ctx.attrs.get("activation_params") or []) if fused else ())
    return shared_pd(key, lambda: _batched_primitive(ctx), ahead=True)


class _Batched:
    """A product of two computed values on oneDNN: its descriptor, and either the post-op
    arguments of its bias and Z (bias_arg, z_arg) or, where the product runs on oneDNN's
    sgemm, the scale and the prefill that replace those post-ops (see _batched_primitive)."""

    def __init__(self, pd, bias_arg=None, z_arg=None, alpha=None, prefill=False):
        self.pd, self.bias_arg, self.z_arg = pd, bias_arg, z_arg
        self.alpha = alpha  # a run-time scale of A (ARG_ATTR_SCALES | ARG_SRC) standing for alpha
        self.prefill = prefill  # the output holds bias + Z before the product adds onto it (a sum post-op)

    def make_ahead(self):  # (shared_pd's ahead=True: the descriptor's primitive, made ahead)
        self.pd.make_ahead()


def _batched_primitive(ctx) -> _Batched:
    """The descriptor in the output's rank, the epilogue as post-ops: alpha as a linear
    eltwise, the bias and Z as binary adds, the activation as an eltwise.

    Where that descriptor is oneDNN's sgemm-based matmul (`gemm:*`: AVX2, oneDNN 3.2) and
    the bias or Z broadcasts, its binary post-ops add them at a fraction of a pass's speed:
    attention's scores, 12 x 128 x 128 with the mask (1, 1, 1, 128) added, 554-618 us a
    product against 359-371 with no epilogue (two threads, the 2-core AVX2 EPYC, five
    processes, pinned and not). There the output is filled with bias + Z first (one NumPy
    pass) and the product added onto it (a sum post-op: sgemm's beta = 1), alpha given as
    A's run-time scale (sgemm's alpha) rather than an eltwise: 435-456 us with the
    prefill's pass; in BERT-base, its 12 products 8.45-9.26 -> 7.90-8.39 ms a run (four
    alternating process pairs, one pinned). A Z of the output's own shape stays a binary
    post-op (as fast either way, 419-428 us against 421-429), as does everything where the
    matmul is not sgemm's (brgemm's post-ops run in its tiles)."""
    _, _, y = _product_dims(ctx)
    r = len(y)
    perm_a, perm_b, perm_y = _perms(ctx)
    fused = ctx.node.op_type == "FusedMatMul"
    alpha = float(ctx.attrs.get("alpha", 1.0)) if fused else 1.0
    bias, z = fused and ctx.has(2), fused and ctx.has(3)
    act = ctx.attrs.get("activation", "") if fused else ""
    mds = (_strided_md(ctx.shape(0), perm_a, r), _strided_md(ctx.shape(1), perm_b, r),
           _strided_md(ctx.out_shape(0), perm_y, r, inverse=True))

    def activation(post):
        if act:
            name, params = _POST[act]
            post.eltwise(name, *params([float(v) for v in ctx.attrs.get("activation_params") or []]))

    post = dnnl.PostOps()
    bias_arg = z_arg = None
    if alpha != 1.0:
        post.eltwise("linear", alpha, 0.0)
    if bias:
        post.binary("add", MemoryDesc.create([1] * (r - 1) + [y[-1]], np.float32, dnnl.plain_tag(r)))
        bias_arg = post.binary_arg()
    if z:
        post.binary("add", MemoryDesc.create(_padded(ctx.shape(3), r), np.float32, dnnl.plain_tag(r)))
        z_arg = post.binary_arg()
    activation(post)
    pd = dnnl.matmul(*mds, attr=post)
    broadcast = bias or (z and _padded(ctx.shape(3), r) != list(y))
    if not pd.impl.startswith(_SLOW_BROADCAST_POST_OPS) or not (broadcast or alpha != 1.0):
        return _Batched(pd, bias_arg, z_arg)
    post = dnnl.PostOps()
    if broadcast:
        post.sum()
    elif z:
        post.binary("add", MemoryDesc.create(y, np.float32, dnnl.plain_tag(r)))
        z_arg = post.binary_arg()
    activation(post)
    scales = {ARG_SRC: 0} if alpha != 1.0 else None
    try:
        gemm = dnnl.matmul(*mds, attr=dnnl.Attr(post_ops=post, scales=scales))
    except capi.DnnlError:  # (an implementation without A's scale or the sum post-op keeps the first)
        return _Batched(pd, bias_arg, z_arg)
    if gemm.impl.startswith(_SLOW):
        return _Batched(pd, bias_arg, z_arg)
    return _Batched(gemm, None, None if broadcast else z_arg, alpha if alpha != 1.0 else None, bool(broadcast))


@kernel(["MatMul"], provider="onednn", dtypes=F32, out=True, bind=True, accepts=_batched_reason,
        static_only=True, name="batched_matmul")
def batched_matmul(ctx):
    """oneDNN matmul of two computed values, the batch dims broadcast, the epilogue as post-ops
    (or, on oneDNN's sgemm, a bias or Z that broadcasts written into the output first)."""
    a_dims, _, product = _product_dims(ctx)
    r = len(product)
    shapes = {3: _padded(ctx.shape(3), r)} if ctx.has(3) else {}  # (A and B: flat, their mds say the layout)
    bias = np.ascontiguousarray(ctx.const(2), np.float32).reshape(-1) if ctx.has(2) else None

    def build():
        made = _batched_pd(ctx)  # (per OpenMP thread count, as every primitive: _PerThreads)
        args = {ARG_SRC: None, ARG_WEIGHTS: None, ARG_DST: None}
        if made.bias_arg is not None:
            args[made.bias_arg] = np.broadcast_to(bias, (product[-1],)).copy()
        if made.z_arg is not None:
            args[made.z_arg] = None
        if made.alpha is not None:
            args[ARG_ATTR_SCALES | ARG_SRC] = dnnl.vector(np.array([made.alpha], np.float32))
        return made.pd.primitive().bind(args), made

    prims = _PerThreads(build)
    view = ContiguousViews()  # slot -> A, B flat; Z in the padded rank (the same object: no re-pointing)
    alone = math.prod(product) * a_dims[-1] <= SMALL_PRODUCT  # see kernels.SMALL_PRODUCT

    def step(a, b, bias_=None, z=None, *, out):
        prim, made = prims.get()
        buffers = {ARG_SRC: view(0, a), ARG_WEIGHTS: view(1, b), ARG_DST: out}
        if made.prefill:  # (the output is no operand's buffer: the kernel is not in-place)
            filled = out.reshape(product)
            if z is None:
                filled[...] = bias
            elif bias is None:
                np.copyto(filled, z.reshape(shapes[3]))
            else:
                np.add(z.reshape(shapes[3]), bias, out=filled)
        elif made.z_arg is not None:
            buffers[made.z_arg] = view(3, z, shapes[3])
        run_alone(prim, buffers, alone)
        return out

    return step


kernel(["FusedMatMul"], provider="onednn", domain="glassrt", dtypes=F32, out=True, bind=True,
       accepts=_batched_reason, static_only=True, name="batched_matmul", drops_nan=activation_drops_nan)(batched_matmul)
