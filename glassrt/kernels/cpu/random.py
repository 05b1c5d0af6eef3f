"""Random ops: RandomUniform/Normal(Like), Bernoulli, Multinomial, and Dropout.

With a `seed` attribute every run draws from a fresh generator seeded with it, so a
seeded node gives the same values on every run. The generator is NumPy's legacy
MT19937 (np.random.RandomState), the one onnx's reference implementation and its test
data use: a seeded node then agrees with the reference provider value for value.
Without a seed, draws come from one process-wide PCG64 generator.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from ...ir import TensorType
from ..registry import kernel
from ._util import as_out


@lru_cache(maxsize=1)
def _unseeded():
    # Made on first use: numpy.random's import (hashlib, OpenSSL's libcrypto) is 15 ms and
    # 3 MiB that a model without random ops should not pay.
    return np.random.default_rng()


def _rng(seed):
    if seed is None:
        return _unseeded()
    return np.random.RandomState(int(seed) % 2**32)


def _uniform(rng, shape):
    return rng.random(shape) if isinstance(rng, np.random.Generator) else rng.rand(*shape)


def _normal(rng, shape):
    return rng.standard_normal(shape) if isinstance(rng, np.random.Generator) else rng.randn(*shape)


def _out_dtype(ctx, fallback):
    t = ctx.output_types[0] if ctx.output_types else None
    return t.dtype if isinstance(t, TensorType) else np.dtype(fallback)


def _affine(draw, scale, shift, dtype):
    """draw * scale + shift computed in the output dtype, as the reference does (float32 for
    the narrow float types NumPy has no arithmetic for)."""
    work = dtype if np.dtype(dtype) in (np.float16, np.float32, np.float64) else np.float32
    y = np.asarray(draw).astype(work)
    y *= scale
    y += shift
    return y.astype(dtype)


@kernel(["RandomUniform", "RandomUniformLike"], out=True, bind=True)
def random_uniform(ctx):
    a = ctx.attrs
    low, high, seed = float(a.get("low", 0.0)), float(a.get("high", 1.0)), a.get("seed")
    dtype = _out_dtype(ctx, np.float32)
    shape = tuple(int(d) for d in a["shape"]) if ctx.node.op_type == "RandomUniform" else None

    def step(x=None, *, out=None):
        u = _uniform(_rng(seed), shape if shape is not None else x.shape)
        return as_out(_affine(u, high - low, low, dtype), out)

    return step


@kernel(["RandomNormal", "RandomNormalLike"], out=True, bind=True)
def random_normal(ctx):
    a = ctx.attrs
    mean, scale, seed = float(a.get("mean", 0.0)), float(a.get("scale", 1.0)), a.get("seed")
    dtype = _out_dtype(ctx, np.float32)
    shape = tuple(int(d) for d in a["shape"]) if ctx.node.op_type == "RandomNormal" else None

    def step(x=None, *, out=None):
        return as_out(_affine(_normal(_rng(seed), shape if shape is not None else x.shape), scale, mean, dtype), out)

    return step


@kernel("Bernoulli", out=True, bind=True)
def bernoulli(ctx):
    seed = ctx.attrs.get("seed")
    dtype = _out_dtype(ctx, ctx.dtype(0) or np.float32)

    def step(x, *, out=None):
        p = x.astype(np.float64)
        if p.size and not ((p >= 0) & (p <= 1)).all():
            raise ValueError("Bernoulli probabilities must lie in [0, 1]")
        return as_out(np.asarray(_rng(seed).binomial(1, p), dtype=dtype), out)  # binomial gives a Python int for 0-d p

    return step


@kernel("Multinomial", out=True, bind=True)
def multinomial(ctx):
    seed = ctx.attrs.get("seed")
    n = int(ctx.attrs.get("sample_size", 1))
    dtype = _out_dtype(ctx, np.int32)

    def step(x, *, out=None):
        if x.ndim != 2:
            raise ValueError(f"Multinomial takes [batch, classes] log-probabilities, got shape {list(x.shape)}")
        logits = x.astype(np.float64)
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        cdf = np.cumsum(p, axis=1)
        cdf /= cdf[:, -1:]
        # Inverse-CDF sampling: the class whose cumulative probability first exceeds u.
        u = _uniform(_rng(seed), (x.shape[0], n))
        idx = (cdf[:, None, :] <= u[:, :, None]).sum(axis=-1)
        return as_out(np.minimum(idx, x.shape[1] - 1).astype(dtype), out)

    return step


def _dropout(x, ratio, seed, want_mask, mask_dtype):
    """Training-mode dropout: keep each element with probability 1 - ratio, scaled up."""
    if not 0 <= ratio < 1:
        raise ValueError(f"dropout ratio must be in [0, 1), got {ratio}")
    if ratio == 0:
        return x, (np.ones(x.shape, mask_dtype) if want_mask else None)
    keep = _uniform(_rng(seed), x.shape) >= ratio
    y = (x.astype(np.float32 if x.dtype.itemsize < 4 else x.dtype) * keep * (1 / (1 - ratio))).astype(x.dtype)
    return y, (keep.astype(mask_dtype) if want_mask else None)


@kernel("Dropout", versions=(12, None), alias=True, multi=True, bind=True)
def dropout(ctx):
    seed = ctx.attrs.get("seed")
    want_mask = len(ctx.node.outputs) > 1 and bool(ctx.node.outputs[1])

    def step(x, ratio=None, training_mode=None):
        training = training_mode is not None and bool(np.asarray(training_mode).reshape(-1)[0])
        if not training:  # inference: the identity, every element kept
            return x, (np.ones(x.shape, np.bool_) if want_mask else None)
        r = 0.5 if ratio is None else float(np.asarray(ratio, np.float64).reshape(-1)[0])
        return _dropout(x, r, seed, want_mask, np.bool_)

    return step


@kernel("Dropout", versions=(1, 11), alias=True, multi=True, bind=True, name="dropout_v1")
def dropout_v1(ctx):
    """Opsets 1-11: ratio is an attribute; before 7 `is_test=0` (the default) means training."""
    ratio = float(ctx.attrs.get("ratio", 0.5))
    training = ctx.since_version < 7 and not int(ctx.attrs.get("is_test", 0))
    t = ctx.output_types[1] if len(ctx.output_types) > 1 else None
    mask_dtype = t.dtype if isinstance(t, TensorType) else (np.bool_ if ctx.since_version >= 10 else None)
    want_mask = len(ctx.node.outputs) > 1 and bool(ctx.node.outputs[1])

    def step(x):
        md = mask_dtype or x.dtype  # the mask had the data's type before opset 10
        if not training:
            return x, (np.ones(x.shape, md) if want_mask else None)
        return _dropout(x, ratio, None, want_mask, md)

    return step
