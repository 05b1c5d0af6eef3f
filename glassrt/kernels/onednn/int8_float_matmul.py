"""8-bit products with a constant B (MatMulInteger, com.microsoft::MatMulIntegerToFloat)
exact on oneDNN's float32 products, for CPUs whose 8-bit products saturate.

Without VNNI or AMX, int8.py's kernels refuse (oneDNN's u8 x s8 products pass through a
saturating 16-bit add there) and cpu's exact path runs: float32 GEMMs over slices of 256 of
the inner dimension, B converted to float32 again at every call (kernels/int_gemm.py).
Measured on a 2-core AVX2 EPYC (Zen 1), BERT-base through quantize_dynamic: 863 of its
908 ms in its 73 MatMulIntegers, against onnxruntime's 335 ms for the whole model.

As int8_float.py's convolutions: (a - za) and (B - zb) are integers, and where every
partial sum stays within 2**24 in magnitude float32 holds each exactly, in whatever order
the kernel adds them. Checked once per column of the constant B, with the largest |a - za|
A's type (and a constant zero point) allows:
    max|a - za| * sum_k |B[k, n] - zb[n]| <= 2**24
Where a column reaches past it, the inner dimension is cut into runs that each stay within
it (int8_float._channel_parts), one product a run, their sums added in float64. So B is
centered as float32 and packed once for the product's primitive (the inner product's
brgemm on AVX2 up to INNER_ROWS rows: matmul.constant_weights_pd; the packed float32 copy
is four times B's bytes), and each call converts A (a - za, one pass) and runs one
primitive per run of K.

MatMulIntegerToFloat's float32 steps, y = float32(acc) · (a_scale · b_scale) + bias (its
decomposition), run as the product's post-ops on the exact sums: a multiply by the scales
per column, an add of the bias, each rounded once as the chain rounds it. In parts, they
run in NumPy after the sums are added.
"""
from __future__ import annotations

import weakref

import numpy as np

from ..buffers import as_out
from ..registry import kernel
from . import capi, dnnl
from .dnnl import ARG_DST, ARG_SRC, ARG_WEIGHTS, MemoryDesc
from .int8 import _I8, constant_b_reason
from .int8_float import EXACT_LIMIT, MAX_PARTS, _channel_parts
from .kernels import _unavailable, shared_reorder
from .matmul import constant_weights_md, constant_weights_pd

_STEPS_MAX = 16  # (threads, rows) bindings kept per node (a classifier's sequence lengths)


def reach(a_dtype, a_zero_point) -> int:
    """The largest |a - za| an 8-bit A can have: za a constant (an array), absent (None: 0),
    or computed at run time (False: any value of A's type)."""
    lo, hi = (-128, 127) if np.dtype(a_dtype) == np.int8 else (0, 255)
    if a_zero_point is False:
        return hi - lo
    z = 0 if a_zero_point is None else int(np.asarray(a_zero_point).reshape(-1)[0])
    return max(z - lo, hi - z)


class FloatWeights:
    """A constant 8-bit B (K, N) less its zero point, cut into runs of K whose float32 sums
    stay exact for products with an A of reach `reach_` (`why` says why not, where none do).
    Each run is centered as float32 when a binding packs it, from B itself, which this holds
    by a weak reference only: float_weights keeps these for as long as B lives, and a strong
    one kept every B alive for good (an int8 BERT-base's 85 MB more with each session made).
    A binding packs while its plan, which holds B, lives."""

    def __init__(self, b: np.ndarray, zb, reach_: int, transposed: bool = False):
        # (transposed: B stored (N, K), as Gemm's transB; the weak reference is to that array)
        self._b, self.transposed = weakref.ref(b), transposed
        b = b.T if transposed else b
        self.k, self.n = b.shape
        z = np.zeros(1, np.int32) if zb is None else np.asarray(zb).astype(np.int32).reshape(-1)
        self.z = None if not z.any() else np.float32(z[0]) if z.size == 1 else z.astype(np.float32)
        # per column, the most its products can add: reach * sum_k |B - zb|
        if self.z is None:
            magnitudes = None  # (made below only where the columns are cut into parts)
            bound = int(_column_magnitudes(b).max()) * reach_
        else:
            magnitudes = np.abs(b.astype(np.int16) - z.astype(np.int16))
            wide = np.uint32 if self.k < (1 << 24) else np.int64  # (|B - zb| <= 255: uint32 holds K < 2**24 of them)
            bound = int(magnitudes.sum(axis=0, dtype=wide).max()) * reach_
        self.why, self.parts = None, [(0, self.k)]
        if bound > EXACT_LIMIT:
            if magnitudes is None:
                magnitudes = _magnitudes(b)
            self.parts = _channel_parts(reach_ * magnitudes.T.astype(np.int64))
            if not self.parts or len(self.parts) > MAX_PARTS:
                self.why = (f"a column's sums can reach {bound:,} (|a - a_zero_point| up to {reach_} times "
                            f"its weights): past 2**24, where float32 stops holding integers exactly, and cut "
                            f"into parts of K that stay within it it would take over {MAX_PARTS}")

    @property
    def b(self) -> np.ndarray:
        """B as (K, N)."""
        b = self._b()
        if b is None:
            raise RuntimeError("the 8-bit weights were freed before their product was packed")
        return b.T if self.transposed else b

    def centered(self, k0: int, k1: int) -> np.ndarray:
        """B[k0:k1] - zb as float32 (exact: 8-bit integers)."""
        part = self.b[k0:k1]
        return part.astype(np.float32) if self.z is None else np.subtract(part, self.z, dtype=np.float32)

    def packed(self, k0: int, k1: int, inner: bool, target: MemoryDesc) -> dnnl.Memory:
        """Rows k0:k1 centered, as float32 in the layout `target`: one reorder from the bytes
        where B has no zero point (oneDNN converts as it packs), else from a centered copy."""
        if self.z is None:
            part = np.ascontiguousarray(self.b[k0:k1])
            # On one OpenMP thread: oneDNN's 8-bit to float32 reorder ran slower on two here
            # (768x3072: 3.5 against 5.4 ms, fresh output each time), and an int8 BERT-base's
            # first run packs 73 of them (its packing 245-294 -> 115-142 ms, four alternating pairs).
            n = capi.get_max_threads()
            capi.set_num_threads(1)
            try:
                return dnnl.prepack(part, constant_weights_md(k1 - k0, self.n, inner, part.dtype), target,
                                    make_reorder=shared_reorder)
            finally:
                capi.set_num_threads(n)
        return dnnl.prepack(self.centered(k0, k1), constant_weights_md(k1 - k0, self.n, inner), target,
                            make_reorder=shared_reorder)


def _magnitudes(b: np.ndarray) -> np.ndarray:
    """|B| of an 8-bit B in uint8 (int8's abs(-128) is -128: 128 as uint8)."""
    return b if b.dtype == np.uint8 else np.abs(b).view(np.uint8)


def _column_magnitudes(b: np.ndarray) -> np.ndarray:
    """Each column's sum of |B| of an 8-bit (K, N) B, as int64: 257 rows at a time in uint16
    (at most 257 x 255 = 65,535), then those added. NumPy's sum over axis 0 into a wider type
    casts every element on its way, and |B| whole is a fresh copy of B (an int8 BERT-base's
    73 weight matrices: 46 -> 34 ms of its session's creation)."""
    total = np.zeros(b.shape[1], np.int64)
    for k0 in range(0, b.shape[0], 257):
        total += _magnitudes(b[k0:k0 + 257]).sum(axis=0, dtype=np.uint16)
    return total


_WEIGHTS: dict = {}  # id(B) -> (a weak reference to B, {(zero point, reach, transposed): FloatWeights})


def float_weights(b: np.ndarray, zb, reach_: int, transposed: bool = False) -> FloatWeights:
    """FloatWeights of a constant, made once per constant, zero point and reach: the fusion
    pass asks, then placement (several times) and each plan; its bound is a pass over B."""
    key = (None if zb is None else np.asarray(zb).tobytes(), reach_, transposed)
    hit = _WEIGHTS.get(id(b))
    if hit is None or hit[0]() is not b:
        hit = _WEIGHTS[id(b)] = (weakref.ref(b, lambda _, i=id(b), held=_WEIGHTS: held.pop(i, None)), {})
    made = hit[1].get(key)
    if made is None:
        made = hit[1][key] = FloatWeights(b, zb, reach_, transposed)
    return made


def weights_for(b: np.ndarray, zb, a_dtype, a_zero_point_given: bool, a_zero_point,
                transposed: bool = False) -> FloatWeights:
    """float_weights for a product of an A of `a_dtype` whose zero point is absent, a
    constant, or (given, not a constant) computed at run time: the kernels' and the fusion
    pass's (passes/fuse_matmul_integer.py) one judgement."""
    fed = a_zero_point_given and a_zero_point is None
    return float_weights(b, zb, reach(a_dtype, False if fed else a_zero_point), transposed)


def _weights(ctx, zb_at: int) -> FloatWeights:
    return weights_for(ctx.const(1), ctx.const(zb_at) if ctx.has(zb_at) else None, ctx.dtype(0), ctx.has(2),
                       ctx.const(2) if ctx.has(2) else None)


def _constants_reason(ctx, zb_at: int):
    """Why the node's B (input 1) cannot be made ready once, or its sums not held exactly, or None."""
    why = _unavailable(ctx) or constant_b_reason(ctx, zb_at)
    if why:
        return why
    if ctx.has(2) and ctx.shape(2) is not None and tuple(ctx.shape(2)) not in ((), (1,)):
        return "a_zero_point is not one value"
    return _weights(ctx, zb_at).why


class _Products:
    """The bound primitives of one node, per (OpenMP threads, rows): one per run of K, each
    reading its own converted A; `scaled`: MatMulIntegerToFloat's post-ops (a multiply by
    the scales, then, with `bias`, an add), where K is one run."""

    def __init__(self, w: FloatWeights, scaled: bool, bias: bool):
        self.w, self.scaled, self.bias = w, scaled and len(w.parts) == 1, bias
        self.bound, self.packed = {}, {}

    def _post_ops(self):
        post = dnnl.PostOps()
        post.binary("mul", MemoryDesc.create((1, self.w.n), np.float32, "ab"))
        if self.bias:
            post.binary("add", MemoryDesc.create((1, self.w.n), np.float32, "ab"))
        return post

    def get(self, rows: int):
        key = (capi.get_max_threads(), rows)
        hit = self.bound.get(key)
        if hit is None:
            if len(self.bound) >= _STEPS_MAX:
                self.bound.pop(next(iter(self.bound)))
            hit = self.bound[key] = [self._bind(rows, i) for i in range(len(self.w.parts))]
        return hit

    def _bind(self, rows: int, part: int):
        """(step, its A buffer, [its own output buffer, made when first needed], the post-ops'
        arguments) for run `part`."""
        k0, k1 = self.w.parts[part]
        n = self.w.n
        post = self._post_ops if self.scaled else None
        pd, inner = constant_weights_pd(rows, k1 - k0, n, post, key=("8-bit as float32", self.scaled, self.bias))
        wmd = pd.weights_md()
        if (part, wmd) not in self.packed:  # (one packed copy per layout, for every row count)
            self.packed[part, wmd] = self.w.packed(k0, k1, inner, wmd)
        a = np.empty((rows, k1 - k0), np.float32)
        args = {ARG_SRC: a, ARG_WEIGHTS: self.packed[part, wmd], ARG_DST: None}
        post_args = ()
        if self.scaled:
            p = self._post_ops()
            post_args = (p.binary_arg(0),) + ((p.binary_arg(1),) if self.bias else ())
            for arg in post_args:
                args[arg] = np.zeros((1, n), np.float32)
        return pd.primitive().bind(args), a, [None], post_args

    def sums(self, a: np.ndarray, za, scale=None, bias=None, dst=None):
        """The float32 sums of (a - za) @ B for a 2-D 8-bit a (scaled and biased where
        `scaled`), written into `dst` (a C-contiguous float32 (rows, N)) where given and K is
        one run, else into a buffer of this binding's (read it before the next call); in
        parts, their float64 total."""
        steps = self.get(a.shape[0])
        total = None
        for (k0, k1), (step, buf, own, post_args) in zip(self.w.parts, steps):
            part = a[:, k0:k1] if len(steps) > 1 else a
            if za is None:
                buf[...] = part
            else:
                np.subtract(part, za, out=buf, dtype=np.float32)
            if post_args:
                step[post_args[0]].array[...] = scale
                if bias is not None:
                    step[post_args[1]].array[...] = bias
            if len(steps) == 1 and dst is not None:
                step.run({ARG_DST: dst})
                return dst
            if own[0] is None:
                own[0] = np.empty((a.shape[0], self.w.n), np.float32)
            y = own[0]
            step.run({ARG_DST: y})
            if len(steps) == 1:
                return y
            total = y.astype(np.float64) if total is None else total + y
        return total


def _rows(a, k):
    if a.shape[-1] != k:
        raise ValueError(f"inner dimensions differ: A {list(a.shape)} @ B [{k}, ...]")
    return np.ascontiguousarray(a.reshape(-1, k))


def _zero_point(a_zero_point):
    if a_zero_point is None:
        return None
    za = np.asarray(a_zero_point)
    if za.size != 1:
        raise ValueError(f"a_zero_point has shape {list(za.shape)}; this kernel takes one value")
    return np.float32(za.reshape(()))


# ---------------------------------------------------------------- MatMulInteger


def _matmul_integer_reason(ctx):
    return _constants_reason(ctx, zb_at=3)


@kernel("MatMulInteger", provider="onednn", dtypes=_I8, out=True, bind=True, accepts=_matmul_integer_reason,
        name="float32")
def matmul_integer(ctx):
    """int32 (A - a_zp) @ (B - b_zp) as an exact float32 product (B centered and packed once)."""
    w = _weights(ctx, 3)
    products = _Products(w, scaled=False, bias=False)

    def step(a, b, a_zero_point=None, b_zero_point=None, *, out=None):
        acc = products.sums(_rows(a, w.k), _zero_point(a_zero_point))
        shape = (*a.shape[:-1], w.n)
        if out is not None and out.shape == shape and out.dtype == np.int32:
            np.copyto(out.reshape(-1, w.n), acc, casting="unsafe")  # (whole numbers: exact)
            return out
        return as_out(acc.astype(np.int32).reshape(shape), out, cast=True)

    return step


# ---------------------------------------------------------------- MatMulIntegerToFloat
# (registered in contrib/microsoft_quant.py with the op's other kernels)


def matmul_integer_to_float_reason(ctx):
    """Why this kernel cannot run com.microsoft's MatMulIntegerToFloat node, or None."""
    why = _constants_reason(ctx, zb_at=5)
    if why:
        return why
    n = ctx.const(1).shape[1]
    if ctx.dtype(2) != np.float32 or ctx.dtype(3) != np.float32:
        return "the scales are not float32"
    if ctx.shape(2) is None or tuple(ctx.shape(2)) not in ((), (1,)):
        return "a_scale is not one value"
    if ctx.shape(3) is None or tuple(ctx.shape(3)) not in ((), (1,), (n,)):
        return f"b_scale is neither one value nor one per column ({n})"
    if ctx.has(6) and (ctx.dtype(6) != np.float32 or ctx.shape(6) is None or tuple(ctx.shape(6)) != (n,)):
        return f"the bias is not float32 of shape [{n}]"
    return None


def matmul_integer_to_float(ctx):
    """Y = (A - a_zp) @ (B - b_zp) · a_scale · b_scale + bias: the exact sums as a float32
    product, the scales and bias as its post-ops (in parts: NumPy after the sums)."""
    w = _weights(ctx, 5)
    products = _Products(w, scaled=True, bias=ctx.has(6))

    def step(a, b, a_scale, b_scale, a_zero_point=None, b_zero_point=None, bias=None, *, out=None):
        # the scale product as the decomposition forms it: Mul(a_scale, b_scale) in float32
        scale = np.multiply(a_scale, b_scale, dtype=np.float32).reshape(1, -1)
        shape = (*a.shape[:-1], w.n)
        direct = out is not None and out.dtype == np.float32 and out.shape == shape and out.flags.c_contiguous
        if products.scaled:
            y = products.sums(_rows(a, w.k), _zero_point(a_zero_point), scale, bias,
                              dst=out.reshape(-1, w.n) if direct else None)
            if direct:
                return out
            if out is None:
                y = y.copy()  # (the binding's buffer, written again by the next call)
        else:  # in parts: float32(acc) · scale (+ bias) in NumPy, as MLAS's output stage
            y = products.sums(_rows(a, w.k), _zero_point(a_zero_point)).astype(np.int32).astype(np.float32) * scale
            if bias is not None:
                y += bias
        return as_out(y.reshape(shape), out, cast=True)

    return step


# ---------------------------------------------------------------- com.microsoft QGemm
# (registered in contrib/microsoft_quant.py with the op's other kernels)


def _qgemm_weights(ctx) -> FloatWeights:
    """QGemm's B (input 3, stored (N, K) with transB) and its zero point (input 5)."""
    return weights_for(ctx.const(3), ctx.const(5), ctx.dtype(0), ctx.has(2), ctx.const(2) if ctx.has(2) else None,
                       transposed=bool(ctx.attrs.get("transB", 0)))


def qgemm_reason(ctx):
    """Why this module cannot hold a QGemm node's sums exactly, or None (its B and zero point
    constants checked by the caller: contrib/microsoft_quant._qgemm_b_reason)."""
    return _unavailable(ctx) or _qgemm_weights(ctx).why


def qgemm_product(ctx):
    """product(A (M, K), its zero point) -> the int32 sums (A - za) @ (B - zb), for the cpu
    kernel's float32 steps after them (contrib/microsoft_quant._qgemm)."""
    w = _qgemm_weights(ctx)
    products = _Products(w, scaled=False, bias=False)

    def product(a: np.ndarray, za) -> np.ndarray:
        # (whole numbers within 2**24 a run: exact as int32)
        return products.sums(_rows(a, w.k), _zero_point(None if not za else np.asarray(za))).astype(np.int32)

    return product
