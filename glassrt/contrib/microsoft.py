"""onnxruntime's contrib operators (domain `com.microsoft`), run natively.

Models that went through onnxruntime's graph optimizers, `onnxruntime.transformers` or an
exporter targeting onnxruntime carry these fused ops. Each one is defined here with the
public custom-op API, exactly as a user would define their own op: a schema string, a meta
(shapes and dtypes, symbolic dims kept), a NumPy kernel for the cpu provider and, where the
op is a composition of standard ONNX ops, a decomposition (so `glassrt check` can compare
the two, and any provider can run the op).

The behaviour followed is onnxruntime's CPU provider's, down to its quirks (which are named
where they matter): onnxruntime is what users move from, so the same model must give the same
numbers. Half-precision inputs are computed in float32 and rounded once at the end, as
onnxruntime's kernels do; float64 stays float64.

The ops register when `glassrt` is imported (the user's code imports glassrt; a model never
causes an import). Kernels import glassrt's own cpu kernels only when they first run, so the
import stays cheap.

Kernels whose output shapes follow from their input shapes register with out=True and write
into the plan's memory arena: elementwise ones tile by tile (`write_elementwise`), the
normalizations a block of rows at a time, the matmuls straight from BLAS into the buffer.
"""
from __future__ import annotations

import math

import numpy as np

from ..ir import TensorType as Meta
from ..kernels.buffers import TILE_ELEMENTS, as_out, new_out, tiles, write_elementwise
from ..kernels.custom import custom_op
from ..ops.geometry import broadcast_shapes, matmul_shape, normalize_axis

MS = "com.microsoft"
F32, F16, F64 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.float64)
FLOATS = [F32, F16, F64]
F32_F16 = [F32, F16]


# Half the cpu kernels' tile: the GELU and norm steps keep several temporaries per element, and
# a replayed run should stay within a megabyte of scratch (tests/test_replay_memory.py).
_TILE = TILE_ELEMENTS // 2


# ====================================================================== shared helpers


def _work(dt) -> np.dtype:
    """The dtype arithmetic runs in: float64 stays, everything narrower runs in float32."""
    return F64 if np.dtype(dt) == F64 else F32


def _w(x):
    """x in its work dtype (no copy when it already is)."""
    return x.astype(_work(x.dtype), copy=False)


def _erf(x):
    # glassrt's own vectorized erf (Numba); imported on first use so `import glassrt` stays light.
    from ..kernels.cpu.erf import erf

    return erf(x)


def _gelu_erf(x):
    """0.5·x·(1 + erf(x/√2)) in x's dtype (a work dtype)."""
    return x * x.dtype.type(0.5) * (1 + _erf(x * x.dtype.type(1 / math.sqrt(2))))


def _like(t, shape=None):
    """A meta with t's dtype, and t's shape unless one is given."""
    return Meta(t.dtype, t.shape if shape is None else tuple(shape))


def _c(g, value, like):
    """A scalar constant of `like`'s dtype, inside a decomposition (made in float64 so that a
    float64 graph gets the exact value and narrower types one rounding)."""
    return g.CastLike(g.constant(value, np.float64), like)


def _require(cond, message):
    """ValueError(message) unless cond; the message a string or, where it names values, a
    function that formats it (an f-string naming a dtype costs ~5 us, and the checks run on
    every inference: an int8 BERT-base's 73 MatMulIntegerToFloat metas made ~440 of them)."""
    if not cond:
        raise ValueError(message() if callable(message) else message)


def _per_feature(x, params, what="hidden size") -> None:
    """Each of params ({name: Meta or None}) one value per feature of x's last dim (or a
    scalar), where both are known: onnxruntime refuses a gamma, beta or bias of another
    shape, which NumPy would broadcast (a gamma of [1] scaled every feature alike)."""
    if x.shape is None or not x.shape or not isinstance(x.shape[-1], int):
        return
    for name, m in params.items():
        if m is not None and m.shape and all(isinstance(d, int) for d in m.shape):  # (a scalar: every feature alike)
            _require(tuple(m.shape) == (x.shape[-1],),
                     lambda: f"{name} {list(m.shape)} must be 1-D, one value per feature ({what} {x.shape[-1]})")


def _buffers(out, n):
    """The n output buffers of a multi-output kernel (None: none planned for that output)."""
    return (tuple(out) + (None,) * n)[:n] if out is not None else (None,) * n


def _row_blocks(shape, axis=-1):
    """Index tuples over the rows of an array of `shape` — a row is the dims from `axis` on,
    whose statistics a norm takes — about a tile of elements each, every row whole."""
    a = axis % len(shape) if shape else 0
    row = int(np.prod(shape[a:], dtype=np.int64))
    rows = max(1, _TILE // max(row, 1))
    return [idx + (slice(None),) * (len(shape) - a) for idx in tiles(shape[:a], rows)]


# ====================================================================== FusedMatMul


fused_matmul = custom_op(
    f"{MS}::FusedMatMul(Tensor A, Tensor B, float alpha=1.0, int transA=0, int transB=0, "
    "int transBatchA=0, int transBatchB=0) -> Tensor Y", dtypes=FLOATS)


def _fmm_perm(rank, trans, trans_batch):
    """The axes order FusedMatMul reads an operand in. transBatch moves dim 0 to just before the
    last dim ([d0, d1..dn-2, dn-1] -> [d1..dn-2, d0, dn-1], what onnxruntime does); trans then
    swaps the last two. Both are ignored for a 1-D operand, as onnxruntime's helper does."""
    perm = list(range(rank))
    if trans_batch and rank >= 3:
        perm = perm[1:-1] + [0, rank - 1]
    if trans and rank >= 2:
        perm[-2], perm[-1] = perm[-1], perm[-2]
    return perm


@fused_matmul.register_meta
def _fused_matmul_meta(a, b, alpha, transA, transB, transBatchA, transBatchB):
    if a.shape is None or b.shape is None:
        return Meta(a.dtype, None)
    sa = [a.shape[i] for i in _fmm_perm(len(a.shape), transA, transBatchA)]
    sb = [b.shape[i] for i in _fmm_perm(len(b.shape), transB, transBatchB)]
    return Meta(a.dtype, matmul_shape(sa, sb))


@fused_matmul.register_kernel("cpu", out=True)
def _fused_matmul(a, b, *, out=None, alpha=1.0, transA=0, transB=0, transBatchA=0, transBatchB=0):
    """alpha · op(A) @ op(B), op a transpose of the batch and/or matrix axes (one BLAS call,
    into the output buffer when A is float32/float64)."""
    a = a.transpose(_fmm_perm(a.ndim, transA, transBatchA))
    b = b.transpose(_fmm_perm(b.ndim, transB, transBatchB))
    direct = out is not None and out.ndim > 0 and a.dtype == b.dtype == _work(a.dtype) == out.dtype
    y = np.matmul(a, b, out=out) if direct else np.matmul(_w(a), _w(b))
    if alpha != 1.0:
        y *= y.dtype.type(alpha)
    return y if direct else as_out(np.asarray(y).astype(a.dtype, copy=False), out)


@fused_matmul.register_decomposition
def _fused_matmul_decomposition(g, a, b, alpha, transA, transB, transBatchA, transBatchB):
    # The batch transposes need the rank, which a decomposition does not see: those nodes
    # run on the kernel only. Einsum swaps the last two axes at any rank.
    if transBatchA or transBatchB:
        raise NotImplementedError("FusedMatMul with transBatchA/transBatchB has no rank-free decomposition")
    if transA:
        a = g.Einsum(a, equation="...ij->...ji")
    if transB:
        b = g.Einsum(b, equation="...ij->...ji")
    y = g.MatMul(a, b)
    return g.Mul(y, _c(g, alpha, y)) if alpha != 1.0 else y


@fused_matmul.register_example
def _fused_matmul_example(dt):
    rng = np.random.default_rng(0)
    return [rng.standard_normal((2, 3, 4)).astype(dt), rng.standard_normal((2, 4, 5)).astype(dt)]


# ====================================================================== the GELU family


gelu = custom_op(f"{MS}::Gelu(Tensor X) -> Tensor Y", dtypes=FLOATS)
gelu.register_meta(lambda x: x)


@gelu.register_kernel("cpu", out=True)
def _gelu(x, *, out=None):
    """Exact GELU, 0.5·x·(1 + erf(x/√2))."""
    return write_elementwise(out, lambda v: _gelu_erf(_w(v)).astype(v.dtype, copy=False), x, limit=_TILE)


def _gelu_decomposition(g, x):
    return g.Mul(g.Mul(x, _c(g, 0.5, x)), g.Add(_c(g, 1.0, x), g.Erf(g.Mul(x, _c(g, 1 / math.sqrt(2), x)))))


gelu.register_decomposition(_gelu_decomposition)


# FastGelu: the tanh approximation, with an optional bias added first (onnxruntime wants a 1-D
# bias of the last dim's size; any broadcastable bias is accepted here).
fast_gelu = custom_op(f"{MS}::FastGelu(Tensor X, Tensor? bias) -> Tensor Y", dtypes=FLOATS)
_SQRT_2_OVER_PI, _GELU_CUBIC = math.sqrt(2 / math.pi), 0.044715


@fast_gelu.register_meta
def _fast_gelu_meta(x, bias):
    _per_feature(x, {"bias": bias}, "last dim")
    return _like(x, shape=broadcast_shapes(x.shape, bias.shape) if bias is not None else None)


@fast_gelu.register_kernel("cpu", out=True)
def _fast_gelu(x, bias=None, *, out=None):
    """0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) of x + bias."""

    def fn(x, bias=None):
        v = _w(x) + _w(bias) if bias is not None else _w(x).copy()
        t = np.tanh(v * (v.dtype.type(_SQRT_2_OVER_PI) + v.dtype.type(_SQRT_2_OVER_PI * _GELU_CUBIC) * v * v))
        return (v * v.dtype.type(0.5) * (1 + t)).astype(x.dtype, copy=False)

    return write_elementwise(out, fn, *([x] if bias is None else [x, bias]), limit=_TILE)


@fast_gelu.register_decomposition
def _fast_gelu_decomposition(g, x, bias):
    v = g.Add(x, bias) if bias else x
    inner = g.Mul(v, g.Add(_c(g, _SQRT_2_OVER_PI, v), g.Mul(_c(g, _SQRT_2_OVER_PI * _GELU_CUBIC, v), g.Mul(v, v))))
    return g.Mul(g.Mul(v, _c(g, 0.5, v)), g.Add(_c(g, 1.0, v), g.Tanh(inner)))


@fast_gelu.register_example
def _fast_gelu_example(dt):
    # The bias is a scalar here only because `glassrt check` grows every input's first axis
    # with the batch; the tests run the real 1-D bias against onnxruntime.
    rng = np.random.default_rng(0)
    return [rng.standard_normal((2, 3, 4)).astype(dt), np.asarray(rng.standard_normal(), dt)]


bias_gelu = custom_op(f"{MS}::BiasGelu(Tensor A, Tensor B) -> Tensor C", dtypes=FLOATS)
@bias_gelu.register_meta
def _bias_gelu_meta(a, b):
    _per_feature(a, {"B": b}, "last dim")
    return _like(a, shape=broadcast_shapes(a.shape, b.shape))


@bias_gelu.register_kernel("cpu", out=True)
def _bias_gelu(a, b, *, out=None):
    """Exact GELU of A + B (B is the bias, broadcast over A)."""
    return write_elementwise(out, lambda u, v: _gelu_erf(_w(u) + _w(v)).astype(u.dtype, copy=False), a, b,
                             limit=_TILE)


bias_gelu.register_decomposition(lambda g, a, b: _gelu_decomposition(g, g.Add(a, b)))


@bias_gelu.register_example
def _bias_gelu_example(dt):
    # B is one value per feature (or, here, one for all: as FastGelu's example, for `glassrt check`)
    rng = np.random.default_rng(0)
    return [rng.standard_normal((2, 3, 4)).astype(dt), np.asarray(rng.standard_normal(), dt)]


quick_gelu = custom_op(f"{MS}::QuickGelu(Tensor X, float alpha=1.702) -> Tensor Y", dtypes=FLOATS)
quick_gelu.register_meta(lambda x, alpha: x)


@quick_gelu.register_kernel("cpu", out=True)
def _quick_gelu(x, *, out=None, alpha=1.702):
    """x · sigmoid(alpha · x)."""
    a = _work(x.dtype).type(np.float32(alpha))  # an ONNX float attribute is float32, the default too

    def fn(x):
        v = _w(x)
        with np.errstate(over="ignore"):  # exp overflow gives the right 0
            return (v / (1 + np.exp(-a * v))).astype(x.dtype, copy=False)

    return write_elementwise(out, fn, x, limit=_TILE)


quick_gelu.register_decomposition(
    lambda g, x, alpha: g.Mul(x, g.Sigmoid(g.Mul(x, g.CastLike(g.constant(alpha), x)))))


# ====================================================================== BiasAdd


# X + bias + skip (the residual add after a convolution in diffusion UNets). onnxruntime has
# only a CUDA kernel; the math is the whole contract.
bias_add = custom_op(f"{MS}::BiasAdd(Tensor X, Tensor bias, Tensor skip) -> Tensor Y", dtypes=F32_F16)
bias_add.register_meta(lambda x, bias, skip: _like(x, shape=broadcast_shapes(x.shape, bias.shape, skip.shape)))


@bias_add.register_kernel("cpu", out=True)
def _bias_add(x, bias, skip, *, out=None):
    """(X + bias) + skip, rounded once."""

    def fn(x, bias, skip):
        y = _w(x) + _w(bias)
        y += _w(skip)
        return y.astype(x.dtype, copy=False)

    return write_elementwise(out, fn, x, bias, skip, limit=_TILE)


bias_add.register_decomposition(lambda g, x, bias, skip: g.Add(g.Add(x, bias), skip))


# ====================================================================== Skip(Simplified)LayerNormalization


def _skip_norm(x, skip, bias, out, norm):
    """The skip norms' four outputs (output, mean, inv_std_var, input_skip_bias_sum): h =
    input + skip (+ bias) in the work dtype, normalized by norm(h) -> (y, mean, inv_std)
    over the last axis, a block of rows at a time into the planned buffers. skip may be
    (B, S, H), (1, S, H) or (S, H)."""
    _require(skip.shape[-1] == x.shape[-1] and skip.ndim <= x.ndim,
             lambda: f"skip {list(skip.shape)} does not match input {list(x.shape)}")
    parts = [x, skip] + ([bias] if bias is not None else [])
    shape = np.broadcast_shapes(*(p.shape for p in parts))
    stat = shape[:-1] + (1,)
    y_out, mean_out, inv_out, sum_out = _buffers(out, 4)
    y, total = new_out(y_out, shape, x.dtype), new_out(sum_out, shape, x.dtype)
    mean, inv = new_out(mean_out, stat, F32), new_out(inv_out, stat, F32)
    views = [np.broadcast_to(p, shape) for p in parts]
    for idx in _row_blocks(shape):
        h = _w(views[0][idx]) + _w(views[1][idx])
        if bias is not None:
            h += _w(views[2][idx])
        y[idx], mean[idx], inv[idx] = norm(h)
        total[idx] = h
    return y, mean, inv, total


def _skip_metas(x, skip, **params):
    """output, mean, inv_std_var, input_skip_bias_sum: statistics are float32 with a kept last axis.
    skip is input's shape, or that without its batch (onnxruntime: (B, S, H), (1, S, H), (S, H))."""
    _per_feature(x, params)
    if x.shape is not None and skip.shape is not None and len(x.shape) == 3 and all(
            isinstance(d, int) for d in (*x.shape, *skip.shape)):
        b, s_, h = x.shape
        _require(tuple(skip.shape) in ((b, s_, h), (1, s_, h), (s_, h)),
                 lambda: f"skip {list(skip.shape)} must be input's {list(x.shape)}, [1, {s_}, {h}] or [{s_}, {h}]")
    stat = None if x.shape is None else tuple(x.shape[:-1]) + (1,)
    shape = x.shape if skip.shape is None or x.shape is None else broadcast_shapes(x.shape, skip.shape)
    return _like(x, shape), Meta(F32, stat), Meta(F32, stat), _like(x, shape)


def _norm_affine(n, gamma, beta, dt):
    """Scale and shift the normalized values in the work dtype; round once to dt."""
    y = n * _w(gamma)
    if beta is not None:
        y += _w(beta)
    return y.astype(dt, copy=False)


skip_layer_norm = custom_op(
    f"{MS}::SkipLayerNormalization(Tensor input, Tensor skip, Tensor gamma, Tensor? beta, Tensor? bias, "
    "float epsilon=1e-12) -> (Tensor output, Tensor mean, Tensor inv_std_var, Tensor input_skip_bias_sum)",
    dtypes=F32_F16)
skip_layer_norm.register_meta(lambda x, skip, gamma, beta, bias, epsilon: _skip_metas(x, skip, gamma=gamma, beta=beta,
                                                                                      bias=bias))


@skip_layer_norm.register_kernel("cpu", out=True)
def _skip_layer_norm(x, skip, gamma, beta=None, bias=None, *, out=None, epsilon=1e-12):
    """LayerNorm over the last axis of input + skip (+ bias); the sum is an output too."""

    def norm(h):
        mean = h.mean(axis=-1, keepdims=True)
        d = h - mean
        inv = 1 / np.sqrt(np.mean(d * d, axis=-1, keepdims=True) + h.dtype.type(epsilon))
        return _norm_affine(d * inv, gamma, beta, x.dtype), mean, inv

    return _skip_norm(x, skip, bias, out, norm)


@skip_layer_norm.register_decomposition
def _skip_layer_norm_decomposition(g, x, skip, gamma, beta, bias, epsilon):
    h = g.Add(x, skip)
    if bias:
        h = g.Add(h, bias)
    y, mean, inv = g.op("LayerNormalization", h, gamma, beta, outputs=3, axis=-1, epsilon=epsilon)
    return y, mean, inv, h


def _skip_ln_example(n_params):
    def example(dt):
        # Scalars for gamma/beta/bias: `glassrt check` grows every input's first axis with the
        # batch, which a per-channel parameter cannot follow (the tests use real 1-D ones).
        rng = np.random.default_rng(0)
        x, skip = (rng.standard_normal((2, 3, 8)).astype(dt) for _ in range(2))
        return [x, skip] + [np.asarray(rng.standard_normal() + 1, dt) for _ in range(n_params)]
    return example


skip_layer_norm.register_example(_skip_ln_example(3))


skip_simplified_layer_norm = custom_op(
    f"{MS}::SkipSimplifiedLayerNormalization(Tensor input, Tensor skip, Tensor gamma, Tensor? bias, "
    "float epsilon=1e-12) -> (Tensor output, Tensor mean, Tensor inv_std_var, Tensor input_skip_bias_sum)",
    dtypes=F32_F16)
skip_simplified_layer_norm.register_meta(lambda x, skip, gamma, bias, epsilon: _skip_metas(x, skip, gamma=gamma,
                                                                                            bias=bias))


@skip_simplified_layer_norm.register_kernel("cpu", out=True)
def _skip_simplified_layer_norm(x, skip, gamma, bias=None, *, out=None, epsilon=1e-12):
    """RMSNorm over the last axis of input + skip (+ bias); `mean` is all zeros, as onnxruntime
    writes it (an RMSNorm has no mean)."""

    def norm(h):
        inv = 1 / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + h.dtype.type(epsilon))
        return _norm_affine(h * inv, gamma, None, x.dtype), 0, inv

    return _skip_norm(x, skip, bias, out, norm)


@skip_simplified_layer_norm.register_decomposition
def _skip_simplified_layer_norm_decomposition(g, x, skip, gamma, bias, epsilon):
    h = g.Add(x, skip)
    if bias:
        h = g.Add(h, bias)
    # Statistics in float32 (onnxruntime's U): squares of float16 values overflow float16.
    h32 = g.Cast(h, to=1)
    ms = g.ReduceMean(g.Mul(h32, h32), g.constant([-1], np.int64), keepdims=1)
    inv = g.Reciprocal(g.Sqrt(g.Add(ms, g.constant(epsilon))))
    y = g.CastLike(g.Mul(g.Mul(h32, inv), g.Cast(gamma, to=1)), x)
    return y, g.Mul(inv, g.constant(0.0)), inv, h


skip_simplified_layer_norm.register_example(_skip_ln_example(2))


# ====================================================================== SimplifiedLayerNormalization


# onnxruntime's RMSNorm (Llama-style models after its optimizer), registered by onnxruntime in
# the default domain. Y has the scale's dtype; inv_std_var is float32 (stash_type 1).
simplified_layer_norm = custom_op(
    "ai.onnx::SimplifiedLayerNormalization(Tensor X, Tensor scale, int axis=-1, float epsilon=1e-5, "
    "int stash_type=1) -> (Tensor Y, Tensor inv_std_var)", dtypes=FLOATS)


@simplified_layer_norm.register_meta
def _simplified_layer_norm_meta(x, scale, axis, epsilon, stash_type):
    _require(stash_type == 1, lambda: f"stash_type {stash_type} is not supported (onnxruntime's cpu kernels take 1)")
    if x.shape is None:
        return Meta(scale.dtype, None), Meta(F32, None)
    a = normalize_axis(axis, len(x.shape))
    return Meta(scale.dtype, x.shape), Meta(F32, tuple(x.shape[:a]) + (1,) * (len(x.shape) - a))


@simplified_layer_norm.register_kernel("cpu", out=True)
def _simplified_layer_norm(x, scale, *, out=None, axis=-1, epsilon=1e-5, stash_type=1):
    """X / sqrt(mean(X² over [axis, rank)) + eps) · scale, a block of rows at a time."""
    a = normalize_axis(axis, x.ndim)
    axes = tuple(range(a, x.ndim))
    y_out, inv_out = _buffers(out, 2)
    y = new_out(y_out, np.broadcast_shapes(x.shape, scale.shape), scale.dtype)
    inv = new_out(inv_out, x.shape[:a] + (1,) * (x.ndim - a), F32)
    # A scale with dims of its own beyond the normalized ones broadcasts over the rows: one block.
    blocks = _row_blocks(x.shape, a) if y.shape == x.shape else [...]
    for idx in blocks:  # inv has the rows' dims and ones: the same index selects a block's entries
        xw = _w(x[idx])
        ib = 1 / np.sqrt(np.mean(xw * xw, axis=axes, keepdims=True) + xw.dtype.type(epsilon))
        y[idx] = _norm_affine(xw * ib, scale, None, scale.dtype)
        inv[idx] = ib
    return y, inv


# ====================================================================== attention: shared pieces


_LOWEST = np.finfo(np.float32).min


def _ort_mask(mask, b, s, past, total, causal, filter_value):
    """The additive (B, S, T) float32 mask onnxruntime's cpu attention builds, or None.

    mask_index forms: (B, T) or (B, S, T) raw 0/1 masks (0 adds mask_filter_value); (B) end
    positions (keys at or after it are masked); (2B) end then start positions; (3B + 2) uses its
    first B entries as end positions (that is all the cpu kernel reads of it). Causal masking
    sets future keys to float32's lowest value for every query row but the last (the kernel's
    loop bound; only visible in cross attention with more keys than past + queries)."""
    if mask is None and not causal:
        return None
    m = np.zeros((b, s, total), F32)
    fv = F32.type(filter_value)
    if mask is not None:
        if mask.ndim == 3:
            _require(mask.shape == (b, s, total), lambda: f"3-D mask must be {(b, s, total)}, got {mask.shape}")
            m[:] = np.where(mask > 0, F32.type(0), fv)
        elif mask.ndim == 2:
            _require(mask.shape == (b, total),
                     lambda: f"2-D mask must be {(b, total)} (batch, total length), got {mask.shape}")
            m[:] = np.where(mask > 0, F32.type(0), fv)[:, None, :]
        elif mask.ndim == 1:
            _require(mask.shape[0] in (b, 2 * b, 3 * b + 2),
                     lambda: f"1-D mask must have {b}, {2 * b} or {3 * b + 2} entries, got {mask.shape[0]}")
            _require(mask.size == 0 or mask.min() >= 0,
                     lambda: f"mask_index holds {mask.min()}: positions are not negative")
            keys = np.arange(total)
            dead = keys[None, :] >= mask[:b, None]
            if mask.shape[0] == 2 * b:
                dead |= keys[None, :] < np.minimum(mask[b:2 * b], total)[:, None]
            m[:] = np.where(dead, fv, F32.type(0))[:, None, :]
        else:
            raise ValueError(f"a {mask.ndim}-D mask is not supported (onnxruntime's cpu kernel neither)")
    if causal:
        future = np.arange(total)[None, :] > np.arange(s)[:, None] + past
        future[s - 1:] = False
        m[:, future] = _LOWEST
    return m


def _heads(x, n):
    """(B, L, N·D) -> (B, N, L, D)."""
    b, length, hidden = x.shape
    _require(n > 0 and hidden % n == 0, lambda: f"hidden size {hidden} is not divisible by num_heads {n}")
    return x.reshape(b, length, n, hidden // n).transpose(0, 2, 1, 3)


def _sdpa(q, k, v, mask, attention_bias, scale):
    """softmax(scale·Q·Kᵀ + mask + attention_bias)·V, float32 (B, N, S, D) in, (B, S, N·Dv) out;
    also the pre-softmax scores (MultiHeadAttention's qk output)."""
    d = q.shape[-1]
    scale = F32.type(scale or 1 / math.sqrt(d))
    scores = np.matmul(q, k.transpose(0, 1, 3, 2))
    scores *= scale
    if mask is not None:
        scores += mask[:, None]
    if attention_bias is not None:
        _require(attention_bias.ndim == 4, lambda: f"attention_bias must be 4-D, got {list(attention_bias.shape)}")
        scores += attention_bias.astype(F32, copy=False)
    qk = scores.copy()
    from ..kernels.cpu.norm import softmax  # on first use: `import glassrt` imports no kernels

    y = np.matmul(softmax(scores, out=scores), v)
    b, n, s, dv = y.shape
    return y.transpose(0, 2, 1, 3).reshape(b, s, n * dv), qk


# ====================================================================== Attention


# BERT/GPT-2-style self attention with the Q/K/V projection packed in one weight.
attention = custom_op(
    f"{MS}::Attention(Tensor input, Tensor weights, Tensor? bias, Tensor? mask_index, Tensor? past, "
    "Tensor? attention_bias, Tensor? past_sequence_length, int num_heads, int unidirectional=0, "
    "float scale=0.0, float mask_filter_value=-10000.0, int[] qkv_hidden_sizes=[], int do_rotary=0, "
    "int past_present_share_buffer=0, int rotary_embedding_dim=0) -> (Tensor output, Tensor present)",
    dtypes=F32_F16)


def _qkv_sizes(total, qkv_hidden_sizes):
    if qkv_hidden_sizes:
        _require(len(qkv_hidden_sizes) == 3 and qkv_hidden_sizes[0] == qkv_hidden_sizes[1],
                 lambda: f"qkv_hidden_sizes must be [q, k, v] with q == k, got {list(qkv_hidden_sizes)}")
        return [int(v) for v in qkv_hidden_sizes]
    if isinstance(total, int):
        _require(total % 3 == 0,
                 lambda: f"weights' second dimension {total} is not divisible by 3 (set qkv_hidden_sizes)")
    return [total // 3] * 3


def _mask_rank_supported(mask):
    """A (B, 1, M, M) mask (Megatron GPT-2) is refused at session creation, as onnxruntime's cpu kernel does."""
    _require(mask is None or mask.shape is None or len(mask.shape) in (1, 2, 3),
             lambda: f"a {None if mask is None or mask.shape is None else len(mask.shape)}-D mask is not supported "
                     "(1-D lengths, 2-D or 3-D 0/1 masks are)")


def _attention_unsupported(do_rotary, past_present_share_buffer, past_sequence_length=None):
    # Refused where onnxruntime's cpu kernel refuses too (rotary) or is not reachable (buffer sharing).
    _require(not do_rotary, "do_rotary=1 is not supported (onnxruntime's cpu kernel neither: "
                            "fuse the model with MultiHeadAttention + RotaryEmbedding)")
    _require(not past_present_share_buffer and past_sequence_length is None,
             "past_present_share_buffer / past_sequence_length are not supported")


@attention.register_meta
def _attention_meta(x, weights, bias, mask_index, past, attention_bias, past_sequence_length, num_heads,
                    unidirectional, scale, mask_filter_value, qkv_hidden_sizes, do_rotary,
                    past_present_share_buffer, rotary_embedding_dim):
    _attention_unsupported(do_rotary, past_present_share_buffer, past_sequence_length)
    _mask_rank_supported(mask_index)
    _require(mask_index is None or mask_index.dtype is None or np.dtype(mask_index.dtype) == np.int32,
             lambda: f"mask_index must be int32, got {mask_index.dtype if mask_index is not None else None}")
    if x.shape is None or weights.shape is None:
        return Meta(x.dtype, None), Meta(x.dtype, None)
    b, s = x.shape[0], x.shape[1]
    hq, _, hv = _qkv_sizes(weights.shape[1], qkv_hidden_sizes)
    head = hq // num_heads
    total = s + past.shape[3] if past is not None and past.shape is not None else s
    return Meta(x.dtype, (b, s, hv)), Meta(x.dtype, (2, b, num_heads, total, head))


@attention.register_kernel("cpu", out=True)
def _attention(x, weights, bias=None, mask_index=None, past=None, attention_bias=None, past_sequence_length=None,
               *, out=None, num_heads, unidirectional=0, scale=0.0, mask_filter_value=-10000.0, qkv_hidden_sizes=(),
               do_rotary=0, past_present_share_buffer=0, rotary_embedding_dim=0):
    """Project the input with the packed Q/K/V weight, then masked multi-head attention;
    present = past K/V with this step's appended, stacked as (2, B, N, T, D)."""
    _attention_unsupported(do_rotary, past_present_share_buffer, past_sequence_length)
    _require(x.ndim == 3 and weights.ndim == 2 and weights.shape[0] == x.shape[2],
             lambda: f"input {list(x.shape)} and weights {list(weights.shape)} must be (B, S, H) and (H, Q+K+V)")
    hq, hk, hv = _qkv_sizes(weights.shape[1], qkv_hidden_sizes)
    _require(hq + hk + hv == weights.shape[1],
             lambda: f"qkv_hidden_sizes {[hq, hk, hv]} do not sum to {weights.shape[1]}")
    proj = np.matmul(x.astype(F32, copy=False), weights.astype(F32, copy=False))
    if bias is not None:
        proj += bias.astype(F32, copy=False)
    return attend(proj, hq, hk, x.dtype, mask_index, past, attention_bias, out, num_heads=num_heads,
                  unidirectional=unidirectional, scale=scale, mask_filter_value=mask_filter_value)


def attend(proj, hq, hk, dtype, mask_index, past, attention_bias, out, *, num_heads, unidirectional, scale,
           mask_filter_value):
    """What follows the Q/K/V projection in onnxruntime's cpu attention (AttentionCPUBase::
    ApplyAttention), shared by Attention and QAttention: proj (B, S, Q+K+V) float32 split
    into heads, past K/V prepended, masked softmax attention; returns the output (B, S, V)
    and present = K/V stacked as (2, B, N, T, D), both of `dtype`, in out's buffers when given."""
    q, k, v = (_heads(t, num_heads) for t in np.split(proj, [hq, hq + hk], axis=-1))
    n_past = 0
    if past is not None:
        want = (2,) + k.shape[:2] + ("P", k.shape[3])
        _require(past.ndim == 5 and past.shape[:3] == want[:3] and past.shape[4] == k.shape[3],
                 lambda: f"past must be (2, B, N, P, D) = {want}, got {list(past.shape)}")
        n_past = past.shape[3]
        k = np.concatenate([past[0].astype(F32, copy=False), k], axis=2)
        v = np.concatenate([past[1].astype(F32, copy=False), v], axis=2)
    b, s = proj.shape[:2]
    mask = _ort_mask(mask_index, b, s, n_past, k.shape[2], unidirectional, mask_filter_value)
    y, _ = _sdpa(q, k, v, mask, attention_bias, scale)
    y_out, present_out = _buffers(out, 2)
    present = new_out(present_out, (2,) + k.shape, dtype)
    if k.shape == v.shape:  # K and V stacked straight into the cache output, rounded to its type
        np.copyto(present[0], k, casting="unsafe")
        np.copyto(present[1], v, casting="unsafe")
    else:  # V's hidden size differs: no cache layout exists (onnxruntime allows no past then)
        present.fill(0)
    return as_out(y, y_out, cast=True) if y_out is not None else y.astype(dtype), present


def attention_graph(g, proj, batch, mask, mask_shape, past, *, num_heads, head_size, unidirectional, scale,
                    mask_filter_value):
    """`attend` written with standard ONNX ops, for decompositions: proj (B, S, 3·hidden)
    float32 -> output (B, S, hidden), present (2, B, N, T, D). The mask's form is read from
    its static shape when known: 1-D (B) end positions, (2B) ends then starts, (3B + 2) ends
    (its first B entries) need it and the batch size `batch`; a mask of any other or of
    unknown shape is a (B, T) or (B, S, T) 0/1 mask. head_size (None: unknown) gives the
    default scale as the kernel computes it, else it is computed in float32 (an ulp apart
    at most). (The kernel's causal quirk for the last query row needs no counterpart: with
    K and V from the input itself, no key lies beyond past + S.)"""
    i64 = lambda v: g.constant(v, np.int64)  # noqa: E731
    q, k, v = g.op("Split", proj, axis=2, num_outputs=3, outputs=3)
    heads = i64([0, 0, num_heads, -1])
    q, k, v = (g.Transpose(g.Reshape(t, heads), perm=[0, 2, 1, 3]) for t in (q, k, v))
    if past:
        k = g.Concat(g.Gather(past, i64(0), axis=0), k, axis=2)
        v = g.Concat(g.Gather(past, i64(1), axis=0), v, axis=2)
    present = g.Concat(g.Unsqueeze(k, i64([0])), g.Unsqueeze(v, i64([0])), axis=0)
    if scale or head_size:
        factor = g.constant(F32.type(scale or 1 / math.sqrt(head_size)), np.float32)
    else:
        factor = g.Reciprocal(g.Sqrt(g.Cast(g.Shape(q, start=3, end=4), to=1)))
    scores = g.Mul(g.MatMul(q, g.Transpose(k, perm=[0, 1, 3, 2])), factor)
    total = g.Squeeze(g.Shape(k, start=2, end=3), i64([0]))
    keys = g.Range(i64(0), total, i64(1))  # (T,)
    zero, filtered = g.constant(0.0, np.float32), g.constant(mask_filter_value, np.float32)
    add = None
    if mask and mask_shape is not None and len(mask_shape) == 1:
        n = mask_shape[0]
        if not (isinstance(batch, int) and isinstance(n, int) and n in (batch, 2 * batch, 3 * batch + 2)):
            raise NotImplementedError(f"a 1-D mask of {n} entries for a batch of {batch} has no decomposition "
                                      "(its form needs both known)")
        m = g.Cast(mask, to=7)  # int64, as the key positions
        dead = g.GreaterOrEqual(keys, g.Unsqueeze(g.Slice(m, i64([0]), i64([batch])), i64([1])))
        if n == 2 * batch:
            starts = g.Unsqueeze(g.Slice(m, i64([batch]), i64([2 * batch])), i64([1]))
            dead = g.Or(dead, g.Less(keys, starts))
        add = g.Unsqueeze(g.Where(dead, filtered, zero), i64([1, 2]))
    elif mask:  # 0/1, (B, T) or (B, S, T): 0 adds mask_filter_value; reshaped to (B, 1, 1 or S, T)
        add = g.Where(g.Greater(mask, g.constant(0, np.int32)), zero, filtered)
        dims = g.Shape(mask)
        add = g.Reshape(add, g.Concat(g.Slice(dims, i64([0]), i64([1])), i64([1, -1]),
                                      g.Slice(dims, i64([-1]), i64([2 ** 62])), axis=0))
    if unidirectional:
        length = g.Squeeze(g.Shape(q, start=2, end=3), i64([0]))
        rows = g.Unsqueeze(g.Range(i64(0), length, i64(1)), i64([1]))
        future = g.Greater(keys, g.Add(rows, g.Sub(total, length)))  # (S, T)
        add = g.Where(future, g.constant(_LOWEST, np.float32), add or zero)
    if add:
        scores = g.Add(scores, add)
    y = g.MatMul(g.Softmax(scores, axis=-1), v)
    return g.Reshape(g.Transpose(y, perm=[0, 2, 1, 3]), i64([0, 0, -1])), present


# ====================================================================== MultiHeadAttention


multi_head_attention = custom_op(
    f"{MS}::MultiHeadAttention(Tensor query, Tensor? key, Tensor? value, Tensor? bias, Tensor? key_padding_mask, "
    "Tensor? attention_bias, Tensor? past_key, Tensor? past_value, Tensor? past_sequence_length, "
    "Tensor? cache_indirection, int num_heads, int unidirectional=0, float scale=0.0, "
    "float mask_filter_value=-10000.0) -> (Tensor output, Tensor present_key, Tensor present_value, Tensor qk)",
    dtypes=F32_F16)


def _mha_layout(q, k, v):
    """Which of MultiHeadAttention's input layouts the shapes are (works on shapes or metas):
    'separate' Q (B,S,H), K (B,L,H), V (B,L,Hv); 'bnsh' K/V already (B,N,L,D) (cross attention
    with cached keys: no bias, no past); 'packed_kv' K (B,L,N,2,D); 'packed_qkv' Q (B,S,N,3,D)."""
    if len(q) == 5:
        _require(k is None and v is None, "with packed QKV (B, S, N, 3, D), key and value must be absent")
        _require(q[3] == 3, lambda: f"packed QKV must be (B, S, N, 3, D), got {list(q)}")
        return "packed_qkv"
    _require(len(q) == 3, lambda: f"query must be (B, S, H) or packed (B, S, N, 3, D), got {list(q)}")
    _require(k is not None, "key is required unless query is packed QKV")
    if len(k) == 5:
        _require(v is None and k[3] == 2, lambda: f"packed KV must be (B, L, N, 2, D) with no value, got {list(k)}")
        return "packed_kv"
    _require(v is not None and len(v) == len(k) and len(k) in (3, 4),
             lambda: f"key and value must both be (B, L, H) or both (B, N, L, D), got {list(k)}, "
                     f"{None if v is None else list(v)}")
    return "bnsh" if len(k) == 4 else "separate"


@multi_head_attention.register_meta
def _mha_meta(q, k, v, bias, key_padding_mask, attention_bias, past_key, past_value, past_sequence_length,
              cache_indirection, num_heads, unidirectional, scale, mask_filter_value):
    _mha_unsupported(past_sequence_length, cache_indirection)
    _mask_rank_supported(key_padding_mask)
    if q.shape is None or (k is not None and k.shape is None) or (v is not None and v.shape is None):
        return Meta(q.dtype, None), Meta(q.dtype, None), Meta(q.dtype, None), Meta(q.dtype, None)
    layout = _mha_layout(q.shape, None if k is None else k.shape, None if v is None else v.shape)
    b, s = q.shape[0], q.shape[1]
    if layout == "packed_qkv":
        n, d, dv, kv_len = q.shape[2], q.shape[4], q.shape[4], s
    elif layout == "packed_kv":
        n, d, dv, kv_len = k.shape[2], k.shape[4], k.shape[4], k.shape[1]
    elif layout == "bnsh":
        n, d, dv, kv_len = k.shape[1], k.shape[3], v.shape[3], k.shape[2]
    else:
        n, kv_len = num_heads, k.shape[1]
        d, dv = k.shape[2] // num_heads, v.shape[2] // num_heads
    total = kv_len + past_key.shape[2] if past_key is not None and layout != "bnsh" else kv_len
    return (Meta(q.dtype, (b, s, n * dv)), Meta(q.dtype, (b, n, total, d)), Meta(q.dtype, (b, n, total, dv)),
            Meta(q.dtype, (b, n, s, total)))


def _mha_unsupported(past_sequence_length, cache_indirection):
    _require(past_sequence_length is None and cache_indirection is None,
             "past_sequence_length / cache_indirection (buffer sharing, beam search) are not supported")


@multi_head_attention.register_kernel("cpu", out=True)
def _multi_head_attention(q, k=None, v=None, bias=None, key_padding_mask=None, attention_bias=None, past_key=None,
                          past_value=None, past_sequence_length=None, cache_indirection=None, *, out=None, num_heads,
                          unidirectional=0, scale=0.0, mask_filter_value=-10000.0):
    """Multi-head self/cross attention on projected Q/K/V (+ the projection bias), with key
    padding mask, attention bias, causal masking and a K/V cache. Packed QKV / KV layouts,
    which onnxruntime's cpu kernel refuses, are unpacked here."""
    _mha_unsupported(past_sequence_length, cache_indirection)
    dt = q.dtype
    layout = _mha_layout(q.shape, None if k is None else k.shape, None if v is None else v.shape)
    b, s = q.shape[:2]
    if layout == "packed_qkv":
        q, k, v = (q[:, :, :, i].reshape(b, s, -1) for i in range(3))
    elif layout == "packed_kv":
        k, v = (k[:, :, :, i].reshape(k.shape[0], k.shape[1], -1) for i in range(2))
    q = q.astype(F32)  # a copy: the bias is added in place
    hidden = q.shape[2]
    if bias is not None:
        q += bias[:hidden].astype(F32, copy=False)
    qh = _heads(q, num_heads)
    if layout == "bnsh":  # the keys are final (a cache from an earlier step): no bias, no past
        kh, vh = k.astype(F32, copy=False), v.astype(F32, copy=False)
    else:
        kf, vf = k.astype(F32), v.astype(F32)
        if bias is not None:
            kf += bias[hidden:2 * hidden].astype(F32, copy=False)
            vf += bias[2 * hidden:].astype(F32, copy=False)
        kh, vh = _heads(kf, num_heads), _heads(vf, num_heads)
        if past_key is not None or past_value is not None:
            _require(past_key is not None and past_value is not None, "past_key and past_value go together")
            kh = np.concatenate([past_key.astype(F32, copy=False), kh], axis=2)
            vh = np.concatenate([past_value.astype(F32, copy=False), vh], axis=2)
    total = kh.shape[2]
    n_past = total - k.shape[1] if layout != "bnsh" else 0
    mask = _ort_mask(key_padding_mask, b, s, n_past, total, unidirectional, mask_filter_value)
    y, qk = _sdpa(qh, kh, vh, mask, attention_bias, scale)
    # The float32 results rounded to the op's type as they are copied into their buffers.
    return tuple(v.astype(dt) if b is None else as_out(v, b, cast=True)
                 for v, b in zip((y, kh, vh, qk), _buffers(out, 4)))


# ====================================================================== RotaryEmbedding


# onnxruntime's RoPE: (input, position_ids, cos_cache, sin_cache), unlike ONNX's RotaryEmbedding-23
# (input, cos_cache, sin_cache, position_ids); a one-element position_ids is the first position.
rotary_embedding = custom_op(
    f"{MS}::RotaryEmbedding(Tensor input, Tensor position_ids, Tensor cos_cache, Tensor sin_cache, "
    "int num_heads=0, int rotary_embedding_dim=0, int interleaved=0, int is_packed_batching=0, "
    "float scale=1.0) -> Tensor output", dtypes=F32_F16)


@rotary_embedding.register_meta
def _rotary_meta(x, position_ids, cos_cache, sin_cache, num_heads, rotary_embedding_dim, interleaved,
                 is_packed_batching, scale):
    _require(not is_packed_batching, "is_packed_batching=1 is not supported")
    if cos_cache.shape is not None and sin_cache.shape is not None:
        _require(tuple(cos_cache.shape) == tuple(sin_cache.shape),
                 lambda: f"cos_cache {list(cos_cache.shape)} and sin_cache {list(sin_cache.shape)} must have one shape")
    if num_heads and x.shape is not None and len(x.shape) == 3 and isinstance(x.shape[2], int):
        _require(x.shape[2] % num_heads == 0,
                 lambda: f"hidden size {x.shape[2]} is not a multiple of num_heads {num_heads}")
    return x


@rotary_embedding.register_kernel("cpu", out=True)
def _rotary_embedding(x, position_ids, cos_cache, sin_cache, *, out=None, num_heads=0, rotary_embedding_dim=0,
                      interleaved=0, is_packed_batching=0, scale=1.0):
    """Rotate the first rotary_embedding_dim features of every head by its position's angle;
    4-D input is (B, N, S, D), 3-D is (B, S, N·D). `scale` is not applied (neither does onnxruntime)."""
    _require(not is_packed_batching, "is_packed_batching=1 is not supported")
    _require(not rotary_embedding_dim or num_heads, "rotary_embedding_dim needs num_heads")
    if x.ndim == 4:
        xv = x.transpose(0, 2, 1, 3)  # (B, S, N, D)
    else:
        _require(x.ndim == 3, lambda: f"input must be 3-D or 4-D, got {list(x.shape)}")
        head = x.shape[2] // num_heads if num_heads else 2 * cos_cache.shape[1]
        _require(head > 0 and x.shape[2] % head == 0,
                 lambda: f"hidden size {x.shape[2]} is not a multiple of the head size {head}")
        xv = x.reshape(x.shape[0], x.shape[1], -1, head)
    b, s, _, d = xv.shape
    r = int(rotary_embedding_dim) or d
    _require(r % 2 == 0 and r <= d and cos_cache.shape[1] * 2 >= r,
             lambda: f"rotary dim {r} must be even, at most the head size {d} and covered by cos_cache "
                     f"{list(cos_cache.shape)}")
    if position_ids.size == 1:  # the first position; the others follow it
        pos = int(position_ids.reshape(-1)[0]) + np.arange(s)[None]
    else:
        pos = position_ids.reshape(b, s)
    _require(pos.min() >= 0 and pos.max() < cos_cache.shape[0],
             lambda: f"position ids [{pos.min()}, {pos.max()}] are outside the caches' {cos_cache.shape[0]} rows")
    cos = cos_cache[pos][:, :, None, :r // 2].astype(F32)  # (B|1, S, 1, r/2)
    sin = sin_cache[pos][:, :, None, :r // 2].astype(F32)
    first, second = (slice(0, r, 2), slice(1, r, 2)) if interleaved else (slice(0, r // 2), slice(r // 2, r))
    x1, x2 = xv[..., first].astype(F32), xv[..., second].astype(F32)
    y = new_out(out, x.shape, x.dtype)
    np.copyto(y, x)  # the features past the rotary dims pass through
    ov = y.transpose(0, 2, 1, 3) if x.ndim == 4 else y.reshape(xv.shape)  # a view of y
    ov[..., first] = cos * x1 - sin * x2
    ov[..., second] = sin * x1 + cos * x2
    return y


@rotary_embedding.register_example
def _rotary_example(dt):
    rng = np.random.default_rng(0)
    # `glassrt check` grows every input's first axis with the batch (to 3 rows, for the caches):
    # a scalar start position and two tokens stay inside them.
    return [rng.standard_normal((2, 2, 8)).astype(dt), np.asarray(0, np.int64),
            rng.standard_normal((8, 4)).astype(dt), rng.standard_normal((8, 4)).astype(dt)]


# ====================================================================== MatMulNBits


# Y = A @ dequantize(B)ᵀ with B (N, K) quantized to `bits` bits in blocks of block_size along K,
# packed little-end first into bytes (N, k_blocks, blob). The LLM weight format of
# onnxruntime-genai and the int4 quantizers.
matmul_nbits = custom_op(
    f"{MS}::MatMulNBits(Tensor A, Tensor B, Tensor scales, Tensor? zero_points, Tensor? g_idx, Tensor? bias, "
    "int K, int N, int block_size, int bits=4, int accuracy_level=0, int weight_prepacked=0) -> Tensor Y",
    dtypes=F32_F16)


def _unpack_bits(packed, bits, count):
    """Unsigned `bits`-bit values packed low bits first along the last axis → the first `count` of them."""
    if bits == 8:
        vals = packed
    elif bits == 4:
        vals = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)
    else:  # any width: the byte stream as little-endian bits, regrouped
        stream = np.unpackbits(packed, axis=-1, bitorder="little")
        stream = stream[..., :stream.shape[-1] // bits * bits].reshape(*packed.shape[:-1], -1, bits)
        vals = (stream << np.arange(bits, dtype=np.uint8)).sum(axis=-1, dtype=np.uint8)
    return vals[..., :count]


def _nbits_weight(b, scales, zero_points, g_idx, k, n, block_size, bits):
    """The dequantized (N, K) float32 weight: (q - zero_point) · scale per block."""
    _require(bits in (2, 4, 8), lambda: f"bits={bits} is not supported (2, 4 or 8)")
    _require(block_size >= 16 and block_size & (block_size - 1) == 0,
             lambda: f"block_size {block_size} must be a power of 2 >= 16")
    k_blocks = -(-k // block_size)
    blob = block_size * bits // 8
    _require(b.dtype == np.uint8 and b.size == n * k_blocks * blob,
             lambda: f"B must be uint8 (N, k_blocks, blob) = ({n}, {k_blocks}, {blob}), got {b.dtype} {list(b.shape)}")
    q = _unpack_bits(b.reshape(n, k_blocks, blob), bits, block_size).reshape(n, k_blocks * block_size)[:, :k]
    _require(scales.size == n * k_blocks,
             lambda: f"scales must have N·k_blocks = {n * k_blocks} entries, got {scales.size}")
    scales = scales.reshape(n, k_blocks).astype(F32)
    if zero_points is None:
        zp = np.full((n, k_blocks), 2 ** (bits - 1), F32)
    elif zero_points.dtype == np.uint8:
        zp = _unpack_bits(zero_points.reshape(n, -1), bits, k_blocks).astype(F32)
        _require(zp.shape == (n, k_blocks),
                 lambda: f"packed zero_points {list(zero_points.shape)} do not cover {k_blocks} blocks")
    else:
        _require(zero_points.size == n * k_blocks, lambda: f"zero_points must have {n * k_blocks} entries")
        zp = zero_points.reshape(n, k_blocks).astype(F32)
    if g_idx is not None:
        # The deprecated act-order input: the block of column j is g_idx[j]. onnxruntime's cpu
        # kernel does not read zero points together with it; refuse rather than guess.
        _require(zero_points is None, "g_idx together with zero_points is not supported")
        group = g_idx.reshape(-1)[:k].astype(np.int64)
        _require(group.size == k and (not k or (group.min() >= 0 and group.max() < k_blocks)),
                 lambda: f"g_idx must give each of the {k} columns a block in [0, {k_blocks})")
    else:
        group = np.arange(k) // block_size
    return (q.astype(F32) - zp[:, group]) * scales[:, group]


@matmul_nbits.register_meta
def _matmul_nbits_meta(a, b, scales, zero_points, g_idx, bias, K, N, block_size, bits, accuracy_level,
                       weight_prepacked):
    _require(not weight_prepacked, "weight_prepacked (a CUDA layout) is not supported")
    return _like(a, shape=None if a.shape is None else tuple(a.shape[:-1]) + (N,))


@matmul_nbits.register_kernel("cpu", bind=True, out=True)
def _matmul_nbits(ctx):
    """Dequantize B block-wise and multiply in float32 (accuracy_level is a speed hint: A is
    never quantized here). With B, scales, zero points and g_idx known when the plan is
    built (the usual case: they are weights), the dequantized weight is made once per plan.
    An empty B is an omitted projection: zeros, plus the bias."""
    a = ctx.attrs
    k, n, block_size, bits = int(a["K"]), int(a["N"]), int(a["block_size"]), int(a.get("bits", 4))
    _require(not int(a.get("weight_prepacked", 0)), "weight_prepacked (a CUDA layout) is not supported")
    weights = [ctx.const(i) for i in range(1, 5)]
    cached = None
    if weights[0] is not None and weights[1] is not None and all(
            w is not None or i + 1 >= len(ctx.node.inputs) or not ctx.node.inputs[i + 1] for i, w in enumerate(weights)):
        if weights[0].size:
            cached = np.ascontiguousarray(_nbits_weight(*weights, k, n, block_size, bits).T)

    def step(x, b, scales, zero_points=None, g_idx=None, bias=None, *, out=None):
        _require(x.shape[-1] == k, lambda: f"A's last dim {x.shape[-1]} must be K={k}")
        shape = x.shape[:-1] + (n,)
        # float32 A: the GEMM (and the bias) write the output buffer itself.
        y = out if out is not None and x.dtype == F32 and out.dtype == F32 and out.shape == shape else None
        if b.size == 0:
            y = np.zeros(shape, F32) if y is None else y
            y.fill(0)
        else:
            w_t = cached if cached is not None else _nbits_weight(b, scales, zero_points, g_idx, k, n, block_size, bits).T
            y = np.matmul(x.astype(F32, copy=False), w_t, out=y)
        if bias is not None:
            y += bias.astype(F32, copy=False)
        return y if y is out else as_out(y.astype(x.dtype, copy=False), out)

    return step


# ====================================================================== EmbedLayerNormalization


# BERT's embedding block: word + position (+ segment) embeddings, LayerNorm, and the mask turned
# into per-sequence lengths (mask_index, for Attention). The first input is int32 token ids, so
# the op declares no dtype list: the embeddings' type (float32 or float16) follows through.
embed_layer_norm = custom_op(
    f"{MS}::EmbedLayerNormalization(Tensor input_ids, Tensor? segment_ids, Tensor word_embedding, "
    "Tensor position_embedding, Tensor? segment_embedding, Tensor gamma, Tensor beta, Tensor? mask, "
    "Tensor? position_ids, float epsilon=1e-12, int mask_index_type=1) "
    "-> (Tensor output, Tensor mask_index, Tensor embedding_sum)")


@embed_layer_norm.register_meta
def _embed_layer_norm_meta(ids, segment_ids, word, position, segment, gamma, beta, mask, position_ids, epsilon,
                           mask_index_type):
    dt = word.dtype
    if mask is not None and mask.shape is not None and ids.shape is not None:
        _require(tuple(mask.shape) == tuple(ids.shape), lambda: f"mask {list(mask.shape)} must have input_ids' shape "
                                                                f"{list(ids.shape)}")
    if ids.shape is None or word.shape is None:
        return Meta(dt, None), Meta(np.int32, None), Meta(dt, None)
    out = (ids.shape[0], ids.shape[1], word.shape[1])
    return Meta(dt, out), Meta(np.int32, (ids.shape[0],)), Meta(dt, out)


def _lookup(table, ids, what):
    _require(ids.dtype.kind in "iu", lambda: f"{what} must be integers, got {ids.dtype}")
    _require(ids.size == 0 or (ids.min() >= 0 and ids.max() < table.shape[0]),
             lambda: f"{what} out of range [0, {table.shape[0]})")
    return table[ids].astype(F32, copy=False)


@embed_layer_norm.register_kernel("cpu", out=True)
def _embed_layer_norm(ids, segment_ids, word, position, segment=None, gamma=None, beta=None, mask=None,
                      position_ids=None, *, out=None, epsilon=1e-12, mask_index_type=1):
    """LayerNorm(word[ids] + position[pos] (+ segment[seg])) · gamma + beta; mask_index counts
    each row's mask entries equal to 1 (zeros without a mask), as onnxruntime does."""
    _require(ids.ndim == 2, lambda: f"input_ids must be (B, S), got {list(ids.shape)}")
    b, s = ids.shape
    pos = np.arange(s)[None] if position_ids is None else np.broadcast_to(position_ids, (b, s))
    e = _lookup(word, ids, "input_ids") + _lookup(position, pos, "position ids")
    if segment_ids is not None and segment is not None:
        e += _lookup(segment, segment_ids, "segment_ids")
    mean = e.mean(axis=-1, keepdims=True)
    d = e - mean
    inv = 1 / np.sqrt(np.mean(d * d, axis=-1, keepdims=True) + F32.type(epsilon))
    y = _norm_affine(d * inv, gamma, beta, word.dtype)
    lengths = (mask == 1).sum(axis=1) if mask is not None else np.zeros(b)
    y_out, lengths_out, sum_out = _buffers(out, 3)
    return as_out(y, y_out), as_out(lengths.astype(np.int32), lengths_out), as_out(e.astype(word.dtype), sum_out)


@embed_layer_norm.register_decomposition
def _embed_layer_norm_decomposition(g, ids, segment_ids, word, position, segment, gamma, beta, mask, position_ids,
                                    epsilon, mask_index_type):
    if position_ids:
        pos = g.Gather(position, position_ids)
    else:  # rows 0..S-1 of the table, broadcast over the batch
        s = g.Shape(ids, start=1, end=2)
        pos = g.Slice(position, g.constant([0], np.int64), s, g.constant([0], np.int64))
    e = g.Add(g.Gather(word, ids), pos)
    if segment_ids and segment:
        e = g.Add(e, g.Gather(segment, segment_ids))
    y, _, _ = g.op("LayerNormalization", e, gamma, beta, outputs=3, axis=-1, epsilon=epsilon)
    if mask:  # entries equal to 1, counted per row
        lengths = g.ReduceSum(g.Cast(g.Equal(mask, g.constant(1, np.int32)), to=6), g.constant([1], np.int64),
                              keepdims=0)
    else:
        from onnx import numpy_helper

        lengths = g.ConstantOfShape(g.Shape(ids, end=1), value=numpy_helper.from_array(np.zeros(1, np.int32)))
    return y, lengths, e


@embed_layer_norm.register_example
def _embed_layer_norm_example(dt):
    rng = np.random.default_rng(0)
    # `glassrt check` grows every input's first axis with the batch, the tables' too (cut to 3
    # rows at batch 3): two tokens with ids below 2 stay inside them; gamma and beta are scalars.
    ids = np.array([[1, 0], [0, 1]], np.int32)
    segments = np.array([[0, 1], [1, 1]], np.int32)
    mask = np.array([[1, 1], [1, 0]], np.int32)
    return [ids, segments, rng.standard_normal((10, 8)).astype(dt), rng.standard_normal((16, 8)).astype(dt),
            rng.standard_normal((2, 8)).astype(dt), np.asarray(1.5, dt), np.asarray(0.25, dt), mask, None]
