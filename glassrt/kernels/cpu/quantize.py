"""Quantization: (De)QuantizeLinear, DynamicQuantizeLinear and the integer / QLinear products.

Integer products (MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv) run as float32
GEMMs over slices of the inner dimension (kernels/int_gemm.py): every slice's sums of 8-bit
products are exact there, so BLAS gives the integer result without NumPy's slow integer
matmul (float8 QLinearMatMul stays a float64 GEMM).

(De)QuantizeLinear run tile by tile into their planned buffers; the integer products are
computed whole (int32) and copied into theirs.
"""
from __future__ import annotations

import functools

import numpy as np

from ... import dtypes
from ..int_gemm import int_matmul, wrap
from ..registry import kernel
from ..buffers import NHWC, memory_order, same_layout
from ._jit import jit, use_compiled
from ._util import as_out, norm_axis, pad_spatial, spatial_pads, windows, write_elementwise

# DTypeSets: the ml_dtypes members (int4, float8...) are named, so that an 8-bit model's
# first run does not import ml_dtypes (~7 ms) for types it never meets
_INT_QUANT = dtypes.DTypeSet([np.int8, np.uint8, np.int16, np.uint16]) | dtypes.SMALL_INTS
_FLOAT8 = dtypes.FLOAT8 - dtypes.DTypeSet((), ["FLOAT8E8M0"])
_QUANT_FLOATS = _FLOAT8 | dtypes.FLOAT4  # float8 / float6 / float4 targets (no integer rounding)
_QUANT_TYPES = _INT_QUANT | _QUANT_FLOATS
_I8 = [np.int8, np.uint8]
_STANDARD_INTS = frozenset(map(np.dtype, (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32)))


def _np(elem_type):
    return dtypes.np_dtype(int(elem_type))


@functools.lru_cache(maxsize=None)
def _int_range(dt):
    """(min, max) of an integer type (np.iinfo costs ~10 us a call; placement asks it of
    every quantizing conv several times)."""
    if dt in dtypes.SMALL_INTS:
        import ml_dtypes  # (loaded already: the dtype is one of its)

        info = ml_dtypes.iinfo(dt)
    else:
        info = np.iinfo(dt)
    return int(info.min), int(info.max)


def _broadcast_param(v, x_shape, axis, block_size, what):
    """Scale / zero point reshaped to broadcast against x: per tensor, per axis or blocked."""
    if v.ndim == 0 or v.size == 1 and block_size <= 0:
        return v.reshape(())
    rank = len(x_shape)
    a = norm_axis(axis, rank)
    if not 0 <= a < rank:
        raise ValueError(f"axis {axis} out of range for input of rank {rank}")
    if block_size <= 0:
        if v.ndim != 1 or v.shape[0] != x_shape[a]:
            raise ValueError(f"{what} of shape {v.shape} must be a scalar or a 1-D tensor of length "
                             f"{x_shape[a]} (input dim {a})")
        return v.reshape((1,) * a + (-1,) + (1,) * (rank - a - 1))
    # Blocked: one value per block of `block_size` consecutive elements along `axis`.
    want = tuple(-(-d // block_size) if i == a else d for i, d in enumerate(x_shape))
    if v.shape != want:
        raise ValueError(f"{what} of shape {v.shape} does not match input {tuple(x_shape)} blocked by "
                         f"{block_size} along axis {a} (expected {want})")
    return np.repeat(v, block_size, axis=a)[(slice(None),) * a + (slice(0, x_shape[a]),)]


def _same_shape(zp, scale, name):
    # A scalar and a one-element vector both mean per-tensor.
    if zp.shape != scale.shape and not (zp.size == 1 and scale.size == 1):
        raise ValueError(f"{name}_zero_point shape {zp.shape} differs from {name}_scale shape {scale.shape}")


def _float_of(dt):
    """A NumPy float dtype that can compute in `dt`'s precision (float8 scales compute in float32)."""
    return np.dtype(dt) if np.dtype(dt) in dtypes.FLOATS_BF16 else np.dtype(np.float32)


def _saturate_float(v, dt, saturate):
    """Cast to a float8/float4 type; with `saturate`, out-of-range values (and ±inf) clamp to ±max."""
    if saturate or dt in dtypes.FLOAT4:
        import ml_dtypes  # (loaded already: the dtype is one of its)

        m = float(ml_dtypes.finfo(dt).max)
        v = np.clip(v, -m, m)  # NaN stays NaN
    return v.astype(dt)


# ---------------------------------------------------------------- QuantizeLinear


@kernel("QuantizeLinear", versions=(10, None), dtypes=dtypes.FLOATS_BF16 | {np.dtype(np.int32)}, out=True, blas=False,
        layouts=(NHWC,))
def quantize_linear(x, y_scale, y_zero_point=None, *, out=None, axis=1, saturate=1, block_size=0, output_dtype=0,
                    precision=0):
    """y = saturate(round_half_even(x / y_scale) + y_zero_point), per tensor, per axis or blocked."""
    if y_zero_point is not None:
        out_dt = y_zero_point.dtype
        if output_dtype and _np(output_dtype) != out_dt:
            raise ValueError(f"output_dtype {dtypes.name(_np(output_dtype))} contradicts the zero point's type "
                             f"{dtypes.name(out_dt)}")
    else:
        out_dt = _np(output_dtype) if output_dtype else np.dtype(np.uint8)
    if out_dt not in _QUANT_TYPES:
        raise ValueError(f"QuantizeLinear cannot produce {dtypes.name(out_dt)}")
    if y_zero_point is not None:
        _same_shape(y_zero_point, y_scale, "y")
    fast = _per_tensor_8bit(x, y_scale, out_dt, block_size, precision) and (
        out is None or (out.shape == x.shape and out.dtype == out_dt)) and use_compiled("QuantizeLinear")
    y = (np.empty(x.shape, out_dt) if out is None else out) if fast else None
    if fast:
        z = 0 if y_zero_point is None else int(y_zero_point.reshape(-1)[0])
        lo, hi = _int_range(out_dt)
        params = np.float32(y_scale.reshape(-1)[0]), np.float32(z), np.float32(lo), np.float32(hi)
        flat = memory_order(y) if x.ndim == 4 and x.shape[1] == 3 and x.flags.c_contiguous else None
        if flat is not None:
            # an RGB image into a quantized CNN's channels-last input: the codes written
            # interleaved as they are made (the float32 transpose first, then the codes: 190
            # us for 3x224x224; this 47)
            _quantize8_rgb_to_nhwc(x.reshape(-1), *params, flat, x.shape[2] * x.shape[3])
            return y
        pair = _flat_pair(x, y)
        if pair is not None:
            # one compiled pass (a QDQ model quantizes every activation that feeds an integer
            # product: smart-turn's 18 took 10 ms of a run as the NumPy steps below, 2.6 as this)
            _quantize8(pair[0], *params, pair[1])
            return y
    scale = _broadcast_param(y_scale, x.shape, axis, block_size, "y_scale")
    # The division runs in `precision` when given, else in the scale's type (spec).
    work = _np(precision) if precision else _float_of(y_scale.dtype)
    params = [scale]
    if y_zero_point is not None:
        params.append(_broadcast_param(y_zero_point, x.shape, axis, block_size, "y_zero_point"))

    lo, hi = _int_range(out_dt) if out_dt not in _QUANT_FLOATS else (None, None)

    def quantize(x, scale, zero_point=None):
        # asarray: on 0-d operands NumPy returns a scalar, which cannot be written in place below
        q = np.asarray(np.divide(x.astype(work, copy=False), scale.astype(work, copy=False)))
        if out_dt in _QUANT_FLOATS:
            q = q.astype(np.float32) if q.dtype != np.float64 else q
            if zero_point is not None:
                q = q + zero_point.astype(q.dtype)
            return np.asarray(_saturate_float(q, out_dt, saturate))
        # Rounded values plus a (16-bit at most) zero point are exact in float32 up to 2**24,
        # and anything beyond saturates anyway; half precision would round the sum, so widen it.
        q = np.rint(q, out=q) if q.dtype in (np.float32, np.float64) else np.rint(q).astype(np.float32)
        if zero_point is not None:
            q += zero_point.astype(q.dtype)
        np.clip(q, lo, hi, out=q)
        return q.astype(out_dt)

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return write_elementwise(out, quantize, x, *params)


def _flat_pair(x, out):
    """(x's elements, out's) as 1-D arrays in out's memory order, out's a view to write
    through: out C-contiguous or channels-last (the plan's NHWC values; these kernels take
    any layout, each element on its own), x read in that order (a view where its layout is
    out's, else a copy). None for any other out."""
    if out.flags.c_contiguous:
        return np.ascontiguousarray(x).reshape(-1), out.reshape(-1)
    flat = memory_order(out)
    if flat is None:
        return None
    xm = memory_order(x)
    return (xm if xm is not None else np.ascontiguousarray(x.transpose(0, *range(2, x.ndim), 1)).reshape(-1)), flat


def _per_tensor_8bit(x, y_scale, out_dt, block_size, precision) -> bool:
    return (x.dtype == np.float32 and y_scale.dtype == np.float32 and y_scale.size == 1 and not block_size
            and precision in (0, None, 1) and out_dt in (np.dtype(np.uint8), np.dtype(np.int8)))


@jit(error_model="numpy")
def _code(v, s, z, lo, hi):  # pragma: no cover - compiled
    """clip(rint(v / s) + z, lo, hi) in float32; NaN as 0, as the NumPy path's float ->
    integer conversion gives it."""
    q = np.rint(v / s) + z
    q = lo if q < lo else q
    q = hi if q > hi else q
    return np.float32(0.0) if q != q else q


@jit(error_model="numpy")
def _quantize8(x, s, z, lo, hi, out):  # pragma: no cover - compiled
    """QuantizeLinear per tensor: the codes stored as 8-bit integers."""
    for i in range(x.size):
        out[i] = _code(x[i], s, z, lo, hi)


@jit(error_model="numpy")
def _quantize8_rgb_to_nhwc(x, s, z, lo, hi, out, hw):  # pragma: no cover - compiled
    """QuantizeLinear per tensor of (N, 3, H, W) x into out's channels-last bytes (N, H, W, 3).
    The three channels are spelled out: with a constant stride the compiler writes them as
    one interleaved vector store (a stride known only at run time is a byte at a time)."""
    for a in range(x.size // (3 * hw)):
        base = a * 3 * hw
        for p in range(hw):
            out[base + 3 * p] = _code(x[base + p], s, z, lo, hi)
            out[base + 3 * p + 1] = _code(x[base + hw + p], s, z, lo, hi)
            out[base + 3 * p + 2] = _code(x[base + 2 * hw + p], s, z, lo, hi)


# ---------------------------------------------------------------- DequantizeLinear


@jit(error_model="numpy")
def _dequantize8(x, s, z, out):  # pragma: no cover - compiled
    for i in range(x.size):
        out[i] = (np.float32(x[i]) - z) * s


@kernel("DequantizeLinear", versions=(10, None),
        dtypes=_INT_QUANT | {np.dtype(np.int32)} | _QUANT_FLOATS, out=True, layouts=(NHWC,), blas=False)
def dequantize_linear(x, x_scale, x_zero_point=None, *, out=None, axis=1, block_size=0, output_dtype=0):
    """y = (x - x_zero_point) * x_scale, in the output type's precision (float32 for half types)."""
    out_dt = _np(output_dtype) if output_dtype else x_scale.dtype
    if out_dt not in dtypes.FLOATS_BF16:
        raise ValueError(f"DequantizeLinear cannot produce {dtypes.name(out_dt)}; set output_dtype")
    if x_zero_point is not None:
        if x_zero_point.dtype != x.dtype:
            raise ValueError(f"x_zero_point type {dtypes.name(x_zero_point.dtype)} differs from x type "
                             f"{dtypes.name(x.dtype)}")
        _same_shape(x_zero_point, x_scale, "x")
    fast = out_dt == np.float32 and x.dtype in (np.dtype(np.uint8), np.dtype(np.int8)) and x_scale.size == 1 \
        and not block_size and (out is None or (out.shape == x.shape and out.dtype == out_dt)) \
        and use_compiled("DequantizeLinear")
    y = (np.empty(x.shape, out_dt) if out is None else out) if fast else None
    pair = _flat_pair(x, y) if fast else None
    if pair is not None:
        # one compiled pass: (x - z) * s in float32, as the NumPy steps below (their three
        # passes 30-48 us on (1, 400, 384), this 18-26)
        z = 0 if x_zero_point is None else int(x_zero_point.reshape(-1)[0])
        _dequantize8(pair[0], np.float32(x_scale.reshape(-1)[0]), np.float32(z), pair[1])
        return y
    work = np.float64 if out_dt == np.float64 else np.float32
    scale = _broadcast_param(x_scale, x.shape, axis, block_size, "x_scale").astype(work)
    narrow = x.dtype in _QUANT_FLOATS or x.dtype.itemsize <= 2
    params = [scale]
    if x_zero_point is not None:
        zp = x_zero_point if narrow else x_zero_point.astype(np.int64)
        params.append(_broadcast_param(zp, x.shape, axis, block_size, "x_zero_point"))
    if out_dt == work and x.dtype in _STANDARD_INTS and (out is None or out.shape == x.shape):
        # Straight into y, in place: the tiled steps below copy each tile twice more (into a
        # temporary, then out) and cost ~75 us a call in broadcasting alone (a QDQ model folds
        # a DequantizeLinear per weight and per bias at session creation: 106 in a
        # MobileNetV2, 25 ms -> 13-14, ~8 of it the first touch of what it writes). The same
        # steps, so the same bits: 8/16-bit x - z exact in float32 (a 32-bit one in int64,
        # then converted), one rounding in the multiply.
        y = np.empty(x.shape, work) if out is None else out
        if narrow:
            np.copyto(y, x)
            if x_zero_point is not None:
                np.subtract(y, params[1].astype(work), out=y)
        else:
            np.copyto(y, x if x_zero_point is None else np.subtract(x, params[1], dtype=np.int64))
        return np.multiply(y, scale, out=y)

    def dequantize(x, scale, zero_point=None):
        if narrow:
            # float8/4 values and integers of at most 16 bits (and their differences) are exact in float32.
            d = x.astype(work)
            if zero_point is not None:
                d -= zero_point.astype(work)
        else:
            # Integer difference first (exact), then one conversion.
            d = x.astype(np.int64)
            if zero_point is not None:
                d -= zero_point
            d = d.astype(work)
        d *= scale
        return d.astype(out_dt, copy=False)

    return write_elementwise(out, dequantize, x, *params)


# ---------------------------------------------------------------- DynamicQuantizeLinear


def data_range(x) -> tuple[float, float]:
    """DynamicQuantizeLinear's (min, max) of x: NaN left out, as onnxruntime's MLAS leaves it
    out (all NaN or empty: (0, 0), so the range is [0, 0])."""
    if not x.size:
        return 0.0, 0.0
    lo, hi = float(np.fmin.reduce(x, axis=None)), float(np.fmax.reduce(x, axis=None))
    return (0.0, 0.0) if lo != lo else (lo, hi)


def codes_pair(x, y_out):
    """(x's elements, the codes' buffer, as 1-D arrays in one order, and y) for a pass element
    by element: y_out (or a new array) and x laid out alike (C-contiguous or channels-last),
    or a C-contiguous y_out and x read into that order; None for any other y_out."""
    y = np.empty(x.shape, np.uint8) if y_out is None else y_out
    if y.shape != x.shape:
        return None
    flat = same_layout(x, y)
    if flat is not None:
        return flat[0], flat[1], y
    return (np.ascontiguousarray(x).reshape(-1), y.reshape(-1), y) if y.flags.c_contiguous else None


def dynamic_range_params(x_min: float, x_max: float):
    """DynamicQuantizeLinear's (scale, zero point) as float32, from the data's range."""
    f32 = np.float32
    hi = f32(max(0.0, x_max))
    lo = f32(min(0.0, x_min))
    scale = f32(1.0) / f32(255) if hi == lo else f32(hi - lo) / f32(255)
    # round_half_even(max(0, min(255, 0 - lo / scale))) in float32, in onnxruntime's order:
    # its std::min keeps 255 where the value is NaN (an infinite range: -inf / inf), and
    # Python's min does too. Python's min/max and round (half to even, as rint) on the exact
    # float value: NumPy's clip and rint on one scalar cost ~10 us a call (a quantized
    # BERT-base runs 49 of these a pass)
    with np.errstate(invalid="ignore"):
        initial = float(f32(0) - lo / scale)
    zp = f32(round(max(0.0, min(255.0, initial))))
    return scale, zp


@kernel("DynamicQuantizeLinear", dtypes=[np.float32], multi=True, out=True, layouts=(NHWC,), blas=False)
def dynamic_quantize_linear(x, *, out=(None, None, None)):
    """uint8 quantization with scale / zero point taken from the data range (which always includes 0).
    Any layout (a range, then each element on its own): a quantize_dynamic CNN's activations
    stay channels-last between its convolutions."""
    f32 = np.float32
    scale, zp = dynamic_range_params(*data_range(x))

    def quantize(v):
        with np.errstate(invalid="ignore"):
            y = np.asarray(np.rint(v / scale) + zp)  # an array even for 0-d x (clipped in place below)
        np.fmax(y, 0, out=y)  # (NaN -> 0, as the compiled loop and onnxruntime's MLAS write it)
        np.minimum(y, 255, out=y)
        return y.astype(np.uint8)

    y_out, scale_out, zp_out = (tuple(out) + (None,) * 3)[:3]
    flat = codes_pair(x, y_out) if use_compiled("DynamicQuantizeLinear") else None
    if flat is not None:
        # the same float32 steps in one compiled pass (QuantizeLinear's loop)
        _quantize8(flat[0], f32(scale), f32(zp), f32(0), f32(255), flat[1])
        y = flat[2]
    else:
        y = write_elementwise(y_out, quantize, x)
    return (y, as_out(np.asarray(scale, dtype=np.float32), scale_out), as_out(np.asarray(zp, dtype=np.uint8), zp_out))


# ---------------------------------------------------------------- integer products


def _centered(v, zp):
    """v - zero point as float64 (exact for 8-bit data); float8 data likewise."""
    d = v.astype(np.float64)
    if zp is not None:
        d -= zp.astype(np.float64)
    return d


def _centered32(v, zp):
    """v - zero point as float32: exact for 8-bit data (what int_gemm's GEMMs take)."""
    d = v.astype(np.float32)
    if zp is not None:
        d -= zp.astype(np.float32)
    return d


def _row_param(p, a_shape, what):
    """A parameter of `a`: per tensor (one value) or per row ([M] or [..., M, 1]), shaped to
    broadcast against a's rows. Anything else is refused: it would broadcast along K."""
    if p.size == 1:
        return p.reshape(())
    m = a_shape[-2] if len(a_shape) >= 2 else None
    if p.ndim == 1 and p.shape[0] == m:
        return p.reshape(-1, 1)
    if m is not None and p.ndim == len(a_shape) and p.shape[-2:] == (m, 1):
        return p
    raise ValueError(f"{what} has shape {list(p.shape)}; for A {list(a_shape)} it must be one value or one per "
                     f"row ([{m}])")


def _col_param(p, b_shape, what):
    """A parameter of `b` or of the output: per tensor or per column ([N] or [..., 1, N])."""
    if p.size == 1:
        return p.reshape(())
    n = b_shape[-1] if len(b_shape) >= 2 else None
    if p.ndim == 1 and p.shape[0] == n or p.ndim == len(b_shape) >= 2 and p.shape[-2:] == (1, n):
        return p
    raise ValueError(f"{what} has shape {list(p.shape)}; for B {list(b_shape)} it must be one value or one per "
                     f"column ([{n}])")


@kernel("MatMulInteger", dtypes=_I8, out=True)
def matmul_integer(a, b, a_zero_point=None, b_zero_point=None, *, out=None):
    """int32 (A - a_zp) @ (B - b_zp); a_zp per tensor or per row, b_zp per tensor or per column."""
    az = _row_param(a_zero_point, a.shape, "a_zero_point") if a_zero_point is not None else None
    bz = _col_param(b_zero_point, b.shape, "b_zero_point") if b_zero_point is not None else None
    acc = int_matmul(a, az, b, bz)
    return acc if out is None else as_out(acc, out, cast=True)


def _requantize(acc, mult, y_zero_point, fallback_dt):
    """acc * mult + y_zp rounded half to even and saturated to the output type."""
    out_dt = y_zero_point.dtype if y_zero_point is not None else np.dtype(fallback_dt)
    r = np.array(acc * mult, dtype=np.float64)  # an ndarray even for a 1-D @ 1-D product
    if y_zero_point is not None:
        r += y_zero_point.astype(np.float64)
    if out_dt in _FLOAT8:
        return np.asarray(_saturate_float(r, out_dt, True))
    lo, hi = _int_range(out_dt)
    np.rint(r, out=r)
    return np.clip(r, lo, hi, out=r).astype(out_dt)


@kernel("QLinearMatMul", versions=(10, None), dtypes=dtypes.DTypeSet(_I8) | _FLOAT8, out=True)
def qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point=None, *, out=None):
    """Quantized matmul: exact integer product, then one requantization to y's scale/zero point."""
    az = _row_param(a_zero_point, a.shape, "a_zero_point") if a_zero_point is not None else None
    bz = _col_param(b_zero_point, b.shape, "b_zero_point")
    acc = int_matmul(a, az, b, bz) if a.dtype.kind in "iu" else np.matmul(_centered(a, az), _centered(b, bz))
    # The multiplier is formed in the scales' own type, as the spec's formula does.
    mult = (_row_param(a_scale, a.shape, "a_scale") * _col_param(b_scale, b.shape, "b_scale")
            / _col_param(y_scale, b.shape, "y_scale")).astype(np.float64)
    yz = _col_param(y_zero_point, b.shape, "y_zero_point") if y_zero_point is not None else None
    return as_out(_requantize(acc, mult, yz, a.dtype), out)


def _conv_geometry(x, w, kernel_shape, strides, dilations, pads, auto_pad):
    if x.ndim < 3 or w.ndim != x.ndim:
        raise ValueError(f"conv input {x.shape} and weight {w.shape} must have the same rank >= 3")
    k = list(kernel_shape) if kernel_shape else list(w.shape[2:])
    return spatial_pads(list(x.shape[2:]), k, strides, dilations, pads, auto_pad) + (k,)


def _int_conv(xd, wd, group, kernel_shape, strides, dilations, pads, auto_pad):
    """N-d grouped conv of zero-point-centered 8-bit data (float32: exact) via im2col and
    int_gemm's exact float32 GEMMs; int32."""
    begin, end, out_sp, strides, dil, k = _conv_geometry(xd, wd, kernel_shape, strides, dilations, pads, auto_pad)
    n, c = xd.shape[:2]
    m = wd.shape[0]
    if c % group or m % group or wd.shape[1] * group != c:
        raise ValueError(f"channels {c} / filters {m} do not fit group={group} with weight {wd.shape}")
    cg, mg = c // group, m // group
    xp = pad_spatial(xd, begin, end, 0.0)  # the centered data pads with 0 == the zero point
    view = windows(xp, k, strides, dil, out_sp)  # (N, C, *k, *out)
    pix = int(np.prod(out_sp))
    kk = cg * int(np.prod(k))
    out = np.empty((n, m, pix), np.int32)
    wm = wd.reshape(m, kk)
    for g in range(group):
        cols = np.ascontiguousarray(view[:, g * cg:(g + 1) * cg].reshape(n, kk, pix), np.float32)
        out[:, g * mg:(g + 1) * mg] = int_matmul(wrap(wm[g * mg:(g + 1) * mg]), None, wrap(cols), None)
    return out.reshape((n, m) + tuple(out_sp))


def _per_filter(p, ndim):
    """A per-output-channel parameter ([M]) shaped to broadcast against (N, M, ...)."""
    p = np.asarray(p)
    if p.ndim == 1 and p.size > 1:
        return p.reshape((1, -1) + (1,) * (ndim - 2))
    return p.reshape(())


def _weight_centered(w, w_zero_point):
    wd = w.astype(np.float32)  # exact for 8-bit data (int_gemm.py)
    if w_zero_point is not None:
        z = np.asarray(w_zero_point)
        wd -= z.reshape((-1,) + (1,) * (w.ndim - 1)) if z.ndim == 1 and z.size > 1 else z.reshape(())
    return wd


@kernel("ConvInteger", dtypes=_I8, out=True)
def conv_integer(x, w, x_zero_point=None, w_zero_point=None, *, out=None, auto_pad="NOTSET", dilations=None, group=1,
                 kernel_shape=None, pads=None, strides=None):
    """int32 conv of (x - x_zp) with (w - w_zp); w_zp per tensor or per output channel."""
    xd = _centered32(x, None if x_zero_point is None else np.asarray(x_zero_point).reshape(()))
    acc = _int_conv(xd, _weight_centered(w, w_zero_point), int(group), kernel_shape, strides, dilations, pads,
                    auto_pad)
    return acc if out is None else as_out(acc, out, cast=True)


@kernel("ConvIntegerToFloat", domain="glassrt", dtypes=_I8, out=True)
def conv_integer_to_float(x, w, x_zero_point=None, w_zero_point=None, scale=None, b=None, b_sums=None, *, out=None,
                          auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """float32(ConvInteger(x, w, ...) [+ b_sums]) · scale [+ b]: the chain's steps (its
    decomposition; the int32 sum wraps as onnxruntime's int32 Add does)."""
    acc = conv_integer(x, w, x_zero_point, w_zero_point, auto_pad=auto_pad, dilations=dilations, group=group,
                       kernel_shape=kernel_shape, pads=pads, strides=strides)
    if b_sums is not None:
        acc = acc + b_sums  # (int32 + int32: NumPy wraps)
    y = acc.astype(np.float32) * scale
    if b is not None:
        y = y + b
    return as_out(y, out)


@kernel("QLinearConv", dtypes=_I8, out=True)
def qlinear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, b=None, *, out=None,
                 auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """Quantized conv: exact integer conv (+ int32 bias), then requantization to y's scale/zero point."""
    xd = _centered32(x, np.asarray(x_zero_point).reshape(()))
    acc = _int_conv(xd, _weight_centered(w, w_zero_point), int(group), kernel_shape, strides, dilations, pads,
                    auto_pad)
    return qlinear_conv_output(acc, x, x_scale, w, w_scale, y_scale, y_zero_point, b, out)


@kernel("CenteredQLinearConv", domain="glassrt", dtypes=[np.float32, *_I8], out=True)
def centered_qlinear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, b=None, *,
                          out=None, x_centered=0, y_centered=0, **conv):
    """glassrt::CenteredQLinearConv: QLinearConv, its x given as float32 x - x_zero_point and/or
    its y wanted as float32 y - y_zero_point (the onednn kernel's float32 hand-over; this is
    its plain form: the codes made bytes, the conv, the bytes made float32)."""
    xz = np.asarray(x_zero_point)
    if int(x_centered):
        lo, hi = _int_range(xz.dtype)
        v = np.asarray(x, np.float32) + np.float32(xz.reshape(-1)[0])
        x = np.clip(np.nan_to_num(v), lo, hi).astype(xz.dtype)  # (whole numbers in range: exact)
    y = qlinear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, b, **conv)
    if int(y_centered):
        y = np.subtract(y, np.float32(np.asarray(y_zero_point).reshape(-1)[0]), dtype=np.float32)
    return as_out(y, out)


def qlinear_conv_output(acc, x, x_scale, w, w_scale, y_scale, y_zero_point, b=None, out=None):
    """QLinearConv's output from its exact int32 conv `acc` (N, M, ...): + the int32 bias,
    requantized to y's scale and zero point (shared with the onednn provider's kernel)."""
    acc = acc.astype(np.float64)
    if b is not None:
        acc += b.astype(np.float64).reshape((1, -1) + (1,) * (acc.ndim - 2))
    ws = np.asarray(w_scale)
    if ws.size > 1 and ws.size != w.shape[0]:
        raise ValueError(f"w_scale has {ws.size} elements, expected 1 or {w.shape[0]} (output channels)")
    mult = (x_scale.reshape(()) * _per_filter(ws, acc.ndim) / y_scale.reshape(())).astype(np.float64)
    return as_out(_requantize(acc, mult, y_zero_point, x.dtype), out)


# ---------------------------------------------------------------- glassrt::QuantizeDequantize


@kernel("QuantizeDequantize", domain="glassrt", dtypes=[np.float32], out=True, bind=True, layouts=(NHWC,), blas=False)
def quantize_dequantize(ctx):
    """QuantizeLinear then DequantizeLinear with one scale and zero point, in one pass:
    (clip(rint(x / s) + z, lo, hi) - z) * s, every step in float32 as the two kernels take
    it (a NaN quantizes to 0, as their float -> integer conversion gives). A QDQ model runs
    one pair per activation: smart-turn's 78 pairs cost 67 ms of its 100 as two kernels.

    Each element on its own, so any layout: between a QDQ CNN's convolutions the values stay
    channels-last (runtime/layout.py) and the pass runs over their bytes in memory order.
    Measured on a QDQ MobileNetV2 (quantize_static), 52 convs each between two such pairs:
    otherwise every conv reorders its input and its output."""
    zp_dtype = ctx.dtype(2) if ctx.has(2) else np.dtype(np.uint8)
    lo, hi = (float(v) for v in _int_range(np.dtype(zp_dtype)))

    # constants (as the fusion makes them): read once, at bind time
    fixed = fake_quant_params(ctx.const(1), ctx.const(2)) if ctx.const(1) is not None and (
        not ctx.has(2) or ctx.const(2) is not None) else None

    def step(x, scale, zero_point=None, *, out=None):
        s, z = fixed or fake_quant_params(scale, zero_point)
        y = np.empty(x.shape, np.float32) if out is None else out
        if y.shape != x.shape:
            raise ValueError(f"the output {list(y.shape)} is not the input's shape {list(x.shape)}")
        return fake_quantize(x, s, z, lo, hi, y)

    return step


def fake_quant_params(scale, zero_point) -> tuple:
    """(scale, zero point) of a per-tensor QuantizeDequantize as float32 scalars."""
    return (np.float32(np.asarray(scale).reshape(-1)[0]),
            np.float32(0 if zero_point is None else np.asarray(zero_point).reshape(-1)[0]))


def fake_quantize(x, s, z, lo, hi, y):
    """y = (clip(rint(x / s) + z, lo, hi) - z) * s, element by element (y may be x: a fused
    conv's output quantized in place). The compiled loop once the process has Numba loaded
    (this path running again starts it: _jit.use_compiled; a QDQ model's first run then does
    not import Numba, ~0.4 s of it), in the output's memory order (plain or channels-last);
    NumPy tile by tile otherwise."""
    pair = _flat_pair(np.asarray(x, np.float32), y) if use_compiled("QuantizeDequantize") else None
    if pair is not None and pair[0].ctypes.data == pair[1].ctypes.data and pair[0].strides == pair[1].strides:
        # in place: one array, so the loop vectorizes (two that overlap fail LLVM's alias
        # check, and it ran one element at a time: the QDQ MobileNetV2 on cpu 41.6 ms a run
        # with its convs' quantization fused, 27.1 without; with this loop 25.3 against 25.0)
        _fake_quant_in_place(pair[1], s, z, np.float32(lo), np.float32(hi))
    elif pair is not None:
        _fake_quant(pair[0], s, z, np.float32(lo), np.float32(hi), pair[1])
    else:
        write_elementwise(y, lambda v: _fake_quant_numpy(v, s, z, lo, hi), x)
    return y


@jit(error_model="numpy")
def _fake_quant(x, s, z, lo, hi, out):  # pragma: no cover - compiled
    for i in range(x.size):
        out[i] = (_code(x[i], s, z, lo, hi) - z) * s


@jit(error_model="numpy")
def _fake_quant_in_place(y, s, z, lo, hi):  # pragma: no cover - compiled
    for i in range(y.size):
        y[i] = (_code(y[i], s, z, lo, hi) - z) * s


def _fake_quant_numpy(v, s, z, lo, hi):
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        q = np.rint(np.divide(v, s, dtype=np.float32)) + z
    np.clip(q, lo, hi, out=q)
    q[np.isnan(q)] = 0
    q -= z
    q *= s
    return q


# ---------------------------------------------------------------- glassrt::LookupTable


def lookup_bytes(x, table, out):
    """out = table[byte of x] in one compiled pass, where x and out (same shape) share a
    layout and the path keeps running (_jit.use_compiled); None otherwise (the caller's
    NumPy path). An 8-bit activation of a quantized model through a 256-entry table."""
    flat = same_layout(x, out) if x.shape == out.shape else None
    if flat is None or not use_compiled("lookup table"):
        return None
    _gather_bytes(flat[0].view(np.uint8), table, flat[1])
    return out


@jit(error_model="numpy")
def _gather_bytes(x, table, out):  # pragma: no cover - compiled
    for i in range(x.size):
        out[i] = table[x[i]]


@kernel("LookupTable", domain="glassrt", dtypes=[np.uint8, np.int8], out=True, layouts=(NHWC,), blas=False)
def lookup_table(x, table, *, out=None):
    """Y = table[byte of X] (a 256-entry table; any layout: each byte on its own)."""
    if table.shape != (256,):
        raise ValueError(f"the table must hold 256 values, one per byte, got shape {list(table.shape)}")
    if out is not None and lookup_bytes(x, table, out) is not None:
        return out
    return write_elementwise(out, lambda v: table[v.view(np.uint8)], x)
