"""NaN and Inf as the reference computes them, without paying for it on finite inputs.

Some of the fastest kernels lose a NaN or an Inf: oneDNN's relu, clip and hard-sigmoid are
max/min instructions, which return the bound where the value is NaN (a Conv + Relu fed one
NaN pixel gives 0 where the reference and onnxruntime give NaN); its softmax takes the
row's maximum the same way; a Winograd convolution adds and subtracts neighbouring inputs,
so one Inf becomes a tile of NaN. Such a kernel says so (Kernel.drops_nan) and keeps its
speed on finite inputs, which are nearly all inputs. (Max pooling is not among them:
onnxruntime and the ONNX reference lose a NaN in the window too, each depending on where
in the window it lies.)

SessionOptions.nan_handling:
  "auto"  (default) a run checks its float feeds when its plan holds such a kernel (one
          reduction per feed, all_finite). A run with a NaN or an Inf runs on a second
          plan, built when first needed, that chooses per node the best kernel that keeps
          them: where a fused op's kernel loses NaN only in its activation, the same kernel
          without it, the activation applied after in NumPy (without_activation); else the
          provider's next kernel, or a later provider's.
  "exact" every plan is that second kind.
  "fast"  no check: the fast kernels always.
"auto" cannot see a NaN made inside the model from finite inputs (0/0, an overflow);
"exact" keeps those too (what `glassrt nan` runs with).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..kernels.cache_views import buffer_behind
from ..ops.fused import fused_conv_quantizes

_CHECKED_KINDS = "fc"  # float and complex feeds (and ml_dtypes' floats); integers, bools, strings hold no NaN


def drop_reason(kernel, ctx) -> str | None:
    """Why `kernel` loses a NaN or an Inf on this node, or None where it keeps them."""
    why = kernel.drops_nan
    if why is None or isinstance(why, str):
        return why
    return why(ctx)


def exact(options) -> bool:
    return getattr(options, "nan_handling", "auto") == "exact"


def checks_feeds(options) -> bool:
    return getattr(options, "nan_handling", "auto") == "auto"


def all_finite(feeds: dict) -> bool:
    """No NaN or Inf in any float feed. One reduction per feed that a NaN or an Inf survives,
    read once without a boolean copy: BLAS's dot of the feed with itself where it is a
    contiguous float32/float64 array (19-23 us for a 224x224 RGB image here, NumPy's sum 40-48;
    it overflows beyond 1.8e19, float32, which only sends the run to the exact plan); BLAS's
    row sums where it is a KV cache's present fed back (the leading rows of its buffer,
    kernels/cpu/cache.py: NumPy's sum of such a strided view took 20 us against the dot's 6
    for 12 heads x 48 rows, 116 against 45 at 512 rows); else the sum (Inf plus -Inf is NaN)."""
    for v in feeds.values():
        if not isinstance(v, np.ndarray) or not v.size:
            continue
        if v.dtype in _BLAS and v.flags.c_contiguous:
            flat = v.reshape(-1)
            total = np.dot(flat, flat)
        elif v.dtype in _BLAS and (base := buffer_behind(v)) is not None:
            n = v.shape[-2] * v.shape[-1]  # (per leading index, its rows are the first n of the buffer's)
            total = np.dot(base.reshape(-1, base.shape[-2] * base.shape[-1])[:, :n], _ones(n, v.dtype)).sum()
        elif v.dtype.kind in _CHECKED_KINDS:
            total = np.add.reduce(v, axis=None)
        elif v.dtype.kind == "V" and v.dtype.name.startswith(("bfloat", "float")):
            # ml_dtypes' bfloat16 and 8-bit floats (a sum of float8 overflows at 448): elementwise
            total = np.float32(0) if np.isfinite(v).all() else np.float32(np.nan)
        else:
            continue  # integers, bools, strings: no NaN
        if not np.isfinite(total):
            return False
    return True


_BLAS = (np.dtype(np.float32), np.dtype(np.float64))
_ONES: dict = {}  # dtype -> ones, grown as needed (a run's check would allocate them per cache)


def _ones(n: int, dt) -> np.ndarray:
    ones = _ONES.get(dt)
    if ones is None or ones.size < n:
        ones = _ONES[dt] = np.ones(max(n, 2 * (0 if ones is None else ones.size)), dt)
        ones.flags.writeable = False
    return ones[:n]


def without_activation(ctx):
    """ctx of a fused op (FusedConv, FusedMatMul, FusedBatchNormalization) with its activation
    taken off, to be applied after the kernel by NumPy (then_activate; np.maximum and
    np.clip keep NaN), or None where the op has no such activation or quantizes after it."""
    from ..kernels.cpu._util import ACTIVATIONS

    act = ctx.attrs.get("activation", "")
    if not ctx.node.op_type.startswith("Fused") or act not in ACTIVATIONS:
        return None
    if fused_conv_quantizes(ctx.node):
        return None  # (its quantization comes after the activation: the activation cannot move past it)
    split = replace(ctx, attrs={**ctx.attrs, "activation": "", "activation_params": []})
    split.after = (act, tuple(float(v) for v in ctx.attrs.get("activation_params") or ()))
    return split


def then_activate(step, activation: str, params: tuple):
    """`step`, then the activation in place on its output."""
    from ..kernels.cpu._util import ACTIVATIONS

    apply = ACTIVATIONS[activation]

    def step_then_activation(*args, **kwargs):
        y = step(*args, **kwargs)
        apply(y, params)
        return y

    return step_then_activation
