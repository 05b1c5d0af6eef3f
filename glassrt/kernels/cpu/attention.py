"""Attention-family ops: Attention, FlexAttention (ai.onnx.preview), RotaryEmbedding,
LinearAttention, CausalConvWithState, SwiGLU.

Arithmetic runs in float32 (float64 for float64 inputs) with BLAS matmuls; for half types the
values are rounded back to the op's type where the ONNX function body casts (after the
scaled Q·K product, after the softmax, at the end), so the results track the reference
within one rounding. Grouped-query attention never materializes repeated K/V: the query
heads that share a K/V head are stacked along the sequence axis of one batched GEMM.
"""
from __future__ import annotations

import math
import sys

import numpy as np

from ... import dtypes
from .. import run_threads
from ..cache_views import buffer_behind
from ..registry import kernel
from ._jit import jit, numba_missing
from ._util import FLOATS_BF16, as_out, new_out, write_elementwise

_HALF = FLOATS_BF16 - {np.dtype(np.float32), np.dtype(np.float64)}


def _work(dt):
    return np.dtype(np.float64) if np.dtype(dt) == np.float64 else np.dtype(np.float32)


def _round_to(a, dt):
    """`a` rounded through dtype `dt` when that is a half type (what a cast in the function body does)."""
    return a.astype(dt).astype(a.dtype) if np.dtype(dt) in _HALF else a


def _outputs(out, n):
    """The op's n output buffers (None where the node has fewer outputs or none was planned)."""
    out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    return (out + (None,) * n)[:n]


def _into(value, buf, cast=False):
    """`value` in its planned buffer (already there when the kernel computed it in place)."""
    return value if value is buf else as_out(value, buf, cast)


def _present(past, new, buf):
    """The KV cache after this step, [past | new] along the sequence axis, built in `buf`
    when it was planned (outputs never alias the inputs)."""
    shape = new.shape[:2] + (new.shape[2] + (past.shape[2] if past is not None else 0),) + new.shape[3:]
    fits = buf is not None and buf.shape == shape and all(a.dtype == buf.dtype for a in (past, new) if a is not None)
    if past is None:
        if fits:
            np.copyto(buf, new)
            return buf
        return np.array(new)
    if fits:
        return np.concatenate([past, new], axis=2, out=buf)
    return np.concatenate([past, new], axis=2)


def _split_heads(x, heads, what):
    """(B, S, H*D) -> (B, H, S, D)."""
    b, s, hd = x.shape
    if heads is None or heads <= 0 or hd % heads:
        raise ValueError(f"{what} hidden size {hd} is not divisible by its number of heads ({heads})")
    return x.reshape(b, s, heads, hd // heads).transpose(0, 2, 1, 3)


def _gqa_matmul(a, b, hq):
    """a (B, Hq, L, X) @ b (B, Hkv, X, Y) with query head h using K/V head h // (Hq // Hkv)."""
    bsz, hkv = b.shape[:2]
    if hkv == hq:
        return np.matmul(a, b)
    if hkv <= 0 or hq % hkv:
        raise ValueError(f"q_num_heads ({hq}) must be a multiple of kv_num_heads ({hkv})")
    g, ln = hq // hkv, a.shape[2]
    r = np.matmul(a.reshape(bsz, hkv, g * ln, a.shape[3]), b)
    return r.reshape(bsz, hq, ln, r.shape[-1])


def _softmax_last(x, dt=None):
    """Softmax over the last axis; an all -inf row gives zeros (no NaN, no warning).
    With a half type `dt`, every step is rounded to it, as a softmax computed in `dt` would be."""
    rnd = (lambda v: _round_to(v, dt)) if dt is not None and np.dtype(dt) in _HALF else (lambda v: v)
    m = x.max(axis=-1, keepdims=True)
    m[np.isneginf(m)] = 0
    with np.errstate(invalid="ignore"):  # inf - inf in rows the caller zeroes anyway
        e = rnd(np.exp(rnd(x - m)))
    s = rnd(e.sum(axis=-1, keepdims=True))
    s[s == 0] = 1
    e /= s
    return rnd(e)


# ---------------------------------------------------------------- Attention


def _attention_bias(attn_mask, is_causal, left, right, nonpad, past_len, b, sq, skv, wd):
    """The additive bias (broadcastable to (B, Hq, Sq, Skv)): float mask where allowed, -inf where
    the boolean mask, the causal frontier, the sliding window or the padding disallow a key."""
    allowed, add = None, None
    if attn_mask is not None:
        m = attn_mask
        if not 1 <= m.ndim <= 4 or (m.ndim >= 2 and m.shape[-2] not in (1, sq)) or \
                (m.ndim == 4 and m.shape[0] not in (1, b)):
            raise ValueError(f"attn_mask {list(m.shape)} must be 1-D to 4-D and broadcast to "
                             f"(batch {b}, heads, {sq} queries, {skv} keys)")
        if m.shape[-1] < skv:  # a mask shorter than the keys masks the rest out
            if m.dtype != np.bool_:
                m = m.astype(wd)
            fill = False if m.dtype == np.bool_ else -np.inf
            m = np.concatenate([m, np.full(m.shape[:-1] + (skv - m.shape[-1],), fill, m.dtype)], axis=-1)
        elif m.shape[-1] > skv:
            raise ValueError(f"attn_mask last dim {attn_mask.shape[-1]} exceeds the key length {skv}")
        if m.dtype == np.bool_:
            allowed = m
        else:
            add = m.astype(wd, copy=False)
    if is_causal or left >= 0 or right >= 0:
        # Offset of the query block inside the keys: cached keys, or the valid ones (per batch).
        if past_len is not None:
            offset = np.int64(past_len)
        elif nonpad is not None:
            offset = nonpad.reshape(-1, 1, 1, 1).astype(np.int64) - sq
        else:
            offset = np.int64(0)
        diff = (np.arange(sq).reshape(sq, 1) + offset) - np.arange(skv)  # query position - key index
        ok = np.ones(np.shape(diff), bool)
        if is_causal:
            ok &= diff >= 0
        if left >= 0:
            ok &= diff <= left
        if right >= 0:
            ok &= -diff <= right
        allowed = ok if allowed is None else allowed & ok
    if nonpad is not None:
        if nonpad.shape != (b,):
            raise ValueError(f"nonpad_kv_seqlen must have shape ({b},), got {nonpad.shape}")
        ok = np.arange(skv) < nonpad.reshape(-1, 1, 1, 1)
        allowed = ok if allowed is None else allowed & ok
    if allowed is None:
        return add
    zero = add if add is not None else wd.type(0)
    return np.where(allowed, zero, wd.type(-np.inf))


@kernel("Attention", versions=(23, None), dtypes=FLOATS_BF16, out=True, bind=True, multi=True)
def attention(ctx):
    """Scaled dot-product attention with masks, KV cache, GQA, softcap and the debug output."""
    a = ctx.attrs
    is_causal = int(a.get("is_causal", 0))
    mode = int(a.get("qk_matmul_output_mode", 0))
    softcap = float(a.get("softcap", 0.0) or 0.0)
    scale_attr = a.get("scale")
    hq_attr, hkv_attr = a.get("q_num_heads"), a.get("kv_num_heads")
    sp = a.get("softmax_precision")
    left, right = int(a.get("left_window_size", -1)), int(a.get("right_window_size", -1))
    outs = ctx.node.outputs
    want_qk = len(outs) > 3 and bool(outs[3])
    want_present = any(outs[1:3])

    def step(q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *, out=(None,)):
        y_out, key_out, value_out, qk_buf = _outputs(out, 4)
        t1 = q.dtype
        three_d = q.ndim == 3
        if three_d:
            if hq_attr is None or hkv_attr is None:
                raise ValueError("3-D Q/K/V need the q_num_heads and kv_num_heads attributes")
            qh = _split_heads(q, int(hq_attr), "Q")
            kh, vh = _split_heads(k, int(hkv_attr), "K"), _split_heads(v, int(hkv_attr), "V")
        elif q.ndim == 4 and k.ndim == 4 and v.ndim == 4:
            qh, kh, vh = q, k, v
        else:
            raise ValueError(f"Q, K, V must all be 3-D or all 4-D, got {q.shape}, {k.shape}, {v.shape}")
        if (past_key is None) != (past_value is None):
            raise ValueError("past_key and past_value must be given together")
        if nonpad_kv_seqlen is not None and past_key is not None:
            raise ValueError("nonpad_kv_seqlen cannot be combined with past_key / past_value")
        if past_key is not None or want_present:
            kh, vh = _present(past_key, kh, key_out), _present(past_value, vh, value_out)
        bsz, hq, sq, d = qh.shape
        skv = kh.shape[2]
        if kh.shape[3] != d:
            raise ValueError(f"Q head size {d} differs from K head size {kh.shape[3]}")
        wd = _work(t1)
        # The softmax runs in softmax_precision, else in T1 (spec).
        sd_true = dtypes.np_dtype(int(sp)) if sp else t1
        sd = _work(sd_true)

        # Q and K are each scaled by sqrt(scale), cast to T1 like the function body does.
        s = float(scale_attr) if scale_attr is not None else 1.0 / math.sqrt(d)
        root = t1.type(math.sqrt(s))
        qs = _round_to(qh.astype(wd, copy=False) * wd.type(root), t1)
        ks = _round_to(kh.astype(wd, copy=False) * wd.type(root), t1)
        scores = _round_to(_gqa_matmul(qs, ks.transpose(0, 1, 3, 2), hq), t1)
        qk = scores if want_qk and mode == 0 else None
        if softcap > 0:
            scores = _round_to(np.tanh(scores / wd.type(softcap)) * wd.type(softcap), t1)
        if want_qk and mode == 1:
            qk = scores
        bias = _attention_bias(attn_mask, is_causal, left, right, nonpad_kv_seqlen,
                               past_key.shape[2] if past_key is not None else None, bsz, sq, skv, wd)
        if bias is not None:
            scores = _round_to(scores + bias, t1)
        if want_qk and mode == 2:
            qk = np.broadcast_to(scores, (bsz, hq, sq, skv))
        probs = _softmax_last(scores.astype(sd, copy=False), sd_true)
        if bias is not None:
            # A row whose bias disallows every key is a zero row (decided on the bias, so NaN
            # logits in such a row cannot leak).
            dead = np.isneginf(bias.max(axis=-1, keepdims=True))
            if dead.any():
                probs = np.where(dead, sd.type(0), probs)
        if want_qk and mode == 3:
            qk = probs
        probs = _round_to(probs.astype(wd, copy=False), t1)
        y = _gqa_matmul(probs, vh.astype(wd, copy=False), hq)
        if three_d:
            y = y.transpose(0, 2, 1, 3)  # (B, Sq, Hq, D): rounded to T1 as it is written
            if y_out is not None and y_out.size == y.size:
                np.copyto(y_out.reshape(y.shape), y, casting="unsafe")
                y = y_out
            else:
                y = y.astype(t1).reshape(bsz, sq, -1)
        elif y_out is None:
            y = y.astype(t1)
        if qk is None:
            qk_out = None
        elif qk_buf is None:
            qk_out = np.ascontiguousarray(qk).astype(t1, copy=False)
        else:
            qk_out = as_out(qk, qk_buf, cast=True)
        return _into(y, y_out, cast=True), _into(kh, key_out), _into(vh, value_out), qk_out

    return step


# ---------------------------------------------------------------- FlexAttention (ai.onnx.preview)


@kernel("FlexAttention", domain="ai.onnx.preview", dtypes=FLOATS_BF16, out=True, bind=True)
def flex_attention(ctx):
    """Attention whose scores / probabilities pass through user subgraphs (score_mod, prob_mod)."""
    a = ctx.attrs
    scale_attr, sp = a.get("scale"), a.get("softmax_precision")
    mods = {}
    for name in ("score_mod", "prob_mod"):
        if a.get(name) is not None:
            r = ctx.session.runner(name)
            mods[name] = (r, r.placement.graph.inputs[0].name)
    def run_mod(name, x, outer):
        if name not in mods:
            return x
        r, inp = mods[name]
        res = r.run({inp: x}, outer)
        if len(res) != 1:
            raise ValueError(f"{name} must produce exactly one output, got {len(res)}")
        out = np.asarray(res[0])
        if out.shape != x.shape:
            raise ValueError(f"{name} changed the shape {x.shape} to {out.shape}")
        return out.astype(x.dtype, copy=False)

    def step(q, k, v, *implicit, out=None):
        outer = dict(zip(ctx.node.implicit_inputs, implicit))
        if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
            raise ValueError(f"FlexAttention needs rank-4 Q, K, V, got {q.shape}, {k.shape}, {v.shape}")
        if k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2] or k.shape[3] != q.shape[3]:
            raise ValueError(f"incompatible Q {q.shape}, K {k.shape}, V {v.shape}")
        t1 = q.dtype
        wd = _work(t1)
        if sp:
            cd = dtypes.np_dtype(int(sp))
        else:
            cd = np.dtype(np.float64) if t1 == np.float64 else np.dtype(np.float32)
        s = float(scale_attr) if scale_attr is not None else 1.0 / math.sqrt(q.shape[3])
        root = t1.type(np.sqrt(np.float32(s)))
        qs = _round_to(q.astype(wd, copy=False) * wd.type(root), t1)
        ks = _round_to(k.astype(wd, copy=False) * wd.type(root), t1)
        scores = _round_to(_gqa_matmul(qs, ks.transpose(0, 1, 3, 2), q.shape[1]), t1).astype(cd)
        scores = run_mod("score_mod", scores, outer)
        sw = _work(cd)
        x = scores.astype(sw, copy=False)
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        probs = (e / e.sum(axis=-1, keepdims=True)).astype(cd, copy=False)
        probs = run_mod("prob_mod", probs, outer)
        y = _gqa_matmul(probs.astype(sw, copy=False), v.astype(cd).astype(sw, copy=False), q.shape[1])
        return as_out(y.astype(cd).astype(v.dtype), out)

    return step


# ---------------------------------------------------------------- RotaryEmbedding


@kernel("RotaryEmbedding", versions=(23, None), dtypes=FLOATS_BF16, out=True)
def rotary_embedding(x, cos_cache, sin_cache, position_ids=None, *, out=None, interleaved=0, num_heads=0,
                     rotary_embedding_dim=0):
    """Rotate the first `rotary_embedding_dim` features of every head by position-dependent angles."""
    if x.ndim == 4:
        xv = x.transpose(0, 2, 1, 3)  # (B, S, H, D)
    elif x.ndim == 3:
        if not num_heads or x.shape[2] % num_heads:
            raise ValueError(f"3-D input needs num_heads dividing its hidden size {x.shape[2]} (got {num_heads})")
        xv = x.reshape(x.shape[0], x.shape[1], num_heads, -1)
    else:
        raise ValueError(f"input must be 3-D or 4-D, got shape {x.shape}")
    d = xv.shape[3]
    r = int(rotary_embedding_dim) or d
    if r % 2 or r > d:
        raise ValueError(f"rotary_embedding_dim {r} must be even and at most the head size {d}")
    if cos_cache.shape != sin_cache.shape:
        raise ValueError(f"cos_cache {list(cos_cache.shape)} and sin_cache {list(sin_cache.shape)} differ in shape")
    b, s = xv.shape[:2]
    if position_ids is not None:
        if cos_cache.ndim != 2:
            raise ValueError(f"with position_ids the caches must be (max_position, {r // 2}), got "
                             f"{list(cos_cache.shape)}")
        if position_ids.shape != (b, s):
            raise ValueError(f"position_ids must be (batch, sequence) = {[b, s]}, got {list(position_ids.shape)}")
        n = cos_cache.shape[0]
        if position_ids.size and (position_ids.min() < 0 or position_ids.max() >= n):
            raise ValueError(f"position_ids must lie in [0, {n}) (the caches' length), got "
                             f"[{position_ids.min()}, {position_ids.max()}]")
        cos, sin = cos_cache[position_ids], sin_cache[position_ids]  # (B, S, r/2)
    else:
        if cos_cache.ndim != 3 or cos_cache.shape[:2] != (b, s):
            raise ValueError(f"without position_ids the caches must be (batch, sequence, {r // 2}) = "
                             f"{[b, s, r // 2]}, got {list(cos_cache.shape)}")
        cos, sin = cos_cache, sin_cache
    if cos.shape[-1] != r // 2:
        raise ValueError(f"cos/sin caches have last dim {cos.shape[-1]}, expected {r // 2}")
    wd = _work(x.dtype)
    cos = cos.astype(wd)[:, :, None, :]
    sin = sin.astype(wd)[:, :, None, :]
    if interleaved:
        x1, x2 = xv[..., 0:r:2], xv[..., 1:r:2]
    else:
        x1, x2 = xv[..., :r // 2], xv[..., r // 2:r]
    x1, x2 = x1.astype(wd, copy=False), x2.astype(wd, copy=False)
    y = new_out(out, x.shape, x.dtype)
    np.copyto(y, x)  # the features past the rotary dims pass through
    ov = y.transpose(0, 2, 1, 3) if x.ndim == 4 else y.reshape(xv.shape)
    if interleaved:
        ov[..., 0:r:2] = cos * x1 - sin * x2
        ov[..., 1:r:2] = sin * x1 + cos * x2
    else:
        ov[..., :r // 2] = cos * x1 - sin * x2
        ov[..., r // 2:r] = sin * x1 + cos * x2
    return y


# ---------------------------------------------------------------- SwiGLU


@kernel("SwiGLU", versions=(1, None), dtypes=FLOATS_BF16, out=True)
def swiglu(a, b, *, out=None, alpha=1.0):
    """Y = Swish_alpha(A) * B = A * sigmoid(alpha * A) * B (no broadcasting)."""
    if a.shape != b.shape:
        raise ValueError(f"A {a.shape} and B {b.shape} must have the same shape")
    wd = _work(a.dtype)

    def fn(a, b):
        af = a.astype(wd, copy=False)
        with np.errstate(over="ignore"):
            gate = af / (1 + np.exp(-wd.type(alpha) * af))
        gate = _round_to(gate, a.dtype)  # the body's Swish output is a T tensor
        return (gate * b.astype(wd, copy=False)).astype(a.dtype)

    return write_elementwise(out, fn, a, b)


# ---------------------------------------------------------------- CausalConvWithState


@kernel("CausalConvWithState", versions=(1, None), dtypes=FLOATS_BF16, out=True, multi=True)
def causal_conv_with_state(x, weight, bias=None, past_state=None, *, out=(None,), activation="none"):
    """Depthwise causal conv over [past_state | x] (one multiply-add per tap), optional SiLU,
    and the last k-1 positions as the new state."""
    if activation not in ("none", "silu", "swish"):
        raise ValueError(f"activation must be 'none', 'silu' or 'swish', got {activation!r}")
    if x.ndim != 3 or weight.ndim != 3 or weight.shape[1] != 1 or weight.shape[0] != x.shape[1]:
        raise ValueError(f"input (B, C, L) {x.shape} and weight (C, 1, k) {weight.shape} do not match")
    bsz, c, length = x.shape
    k = weight.shape[2]
    if past_state is None:
        past_state = np.zeros((bsz, c, k - 1), x.dtype)
    elif past_state.shape != (bsz, c, k - 1):
        raise ValueError(f"past_state shape {past_state.shape} must be {(bsz, c, k - 1)}")
    padded = np.concatenate([past_state.astype(x.dtype, copy=False), x], axis=2)
    wd = _work(x.dtype)
    pw = padded.astype(wd, copy=False)
    w = weight[:, 0, :].astype(wd)
    y = np.zeros((bsz, c, length), wd)
    for j in range(k):
        y += pw[:, :, j:j + length] * w[:, j:j + 1]
    if bias is not None:
        y += bias.astype(wd).reshape(1, c, 1)
    y = _round_to(y, x.dtype)  # the conv's output is a T tensor
    if activation != "none":
        with np.errstate(over="ignore"):
            y = y / (1 + np.exp(-y))
    present = padded[:, :, padded.shape[2] - (k - 1):]
    y_out, state_out = _outputs(out, 2)
    return as_out(y.astype(x.dtype), y_out), np.ascontiguousarray(present) if state_out is None else \
        as_out(present, state_out)


# ---------------------------------------------------------------- LinearAttention


@kernel("LinearAttention", versions=(1, None), dtypes=FLOATS_BF16, out=True, multi=True)
def linear_attention(query, key, value, past_state=None, decay=None, beta=None, *, out=(None,), q_num_heads=None,
                     kv_num_heads=None, update_rule="gated_delta", scale=0.0, chunk_size=64):
    """Recurrent linear attention (linear / gated / delta / gated_delta), one state update per token,
    batched over (batch, kv head); GQA reads each K/V head's state for its group of query heads."""
    if update_rule not in ("linear", "gated", "delta", "gated_delta"):
        raise ValueError(f"unsupported update_rule {update_rule!r}")
    if not q_num_heads or not kv_num_heads or q_num_heads % kv_num_heads:
        raise ValueError(f"q_num_heads ({q_num_heads}) must be a positive multiple of kv_num_heads ({kv_num_heads})")
    gated, delta = update_rule in ("gated", "gated_delta"), update_rule in ("delta", "gated_delta")
    if gated != (decay is not None):
        raise ValueError(f"update_rule {update_rule!r} {'requires' if gated else 'forbids'} the decay input")
    if delta != (beta is not None):
        raise ValueError(f"update_rule {update_rule!r} {'requires' if delta else 'forbids'} the beta input")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.ndim != 3:
            raise ValueError(f"{name} must be 3-D (B, T, H*D), got {t.shape}")
    hq, hkv = int(q_num_heads), int(kv_num_heads)
    g = hq // hkv
    f32 = np.float32
    q4 = _split_heads(query, hq, "query").astype(f32)  # (B, Hq, T, dk)
    k4 = _split_heads(key, hkv, "key").astype(f32)
    v4 = _split_heads(value, hkv, "value").astype(f32)
    b, _, t, dk = q4.shape
    dv = v4.shape[3]
    if k4.shape[3] != dk:
        raise ValueError(f"query head size {dk} differs from key head size {k4.shape[3]}")
    q5 = q4.reshape(b, hkv, g, t, dk)
    if gated:
        if decay.ndim != 3 or decay.shape[2] not in (hkv, hkv * dk):
            raise ValueError(f"decay must be (B, T, {hkv}) or (B, T, {hkv * dk}), got {decay.shape}")
        gexp = np.exp(decay.reshape(b, t, hkv, -1).transpose(0, 2, 1, 3).astype(f32))  # (B, Hkv, T, 1|dk)
    if delta:
        if beta.ndim != 3 or beta.shape[2] not in (hkv, 1):
            raise ValueError(f"beta must be (B, T, {hkv}) or (B, T, 1), got {beta.shape}")
        bt = beta.reshape(b, t, -1, 1).transpose(0, 2, 1, 3).astype(f32)  # (B, Hkv|1, T, 1)
    if past_state is not None:
        if past_state.shape != (b, hkv, dk, dv):
            raise ValueError(f"past_state shape {past_state.shape} must be {(b, hkv, dk, dv)}")
        state = past_state.astype(f32)
        state_dt = past_state.dtype
    else:
        state = np.zeros((b, hkv, dk, dv), f32)
        state_dt = query.dtype
    sc = f32(scale) if scale else f32(1.0 / np.sqrt(dk))
    acc = np.empty((b, hkv, g, t, dv), f32)
    for i in range(t):
        kt, vt = k4[:, :, i], v4[:, :, i]  # (B, Hkv, dk), (B, Hkv, dv)
        if gated:
            state *= gexp[:, :, i][..., None]  # decay per head or per key dim
        if delta:
            retrieved = np.matmul(kt[:, :, None, :], state)[:, :, 0]  # S^T k
            vt = bt[:, :, i] * (vt - retrieved)
        state += kt[..., :, None] * vt[..., None, :]
        acc[:, :, :, i] = np.matmul(q5[:, :, :, i], state)  # (B, Hkv, G, dv)
    acc *= sc
    y = acc.reshape(b, hq, t, dv).transpose(0, 2, 1, 3).reshape(b, t, hq * dv)
    y_out, state_out = _outputs(out, 2)
    return as_out(y.astype(query.dtype), y_out), as_out(state.astype(state_dt), state_out)


# ---------------------------------------------------------------- glassrt::ScaledDotProductAttention

# Query rows per head up to which the compiled row loop runs (one decode step has 1; a
# prompt more): beyond, the scores are a real product per head and BLAS does it better.
SDPA_ROW_LOOP_ROWS = 8


# Keys from which a one-row attention splits its heads between threads (Numba's prange on
# OpenMP's pool, as onednn/row_panels.py's loop): a decode step's K and V come in cold, after
# the products' weight streams, and one thread reads them at its own memory bandwidth.
# Measured on the 2-core AVX2 EPYC, 12 heads of 64 with the caches emptied before each
# call, one thread / two: 64 keys 148-154 / 204-219 us, 128 keys 203-216 / 234-251, 256
# keys 292-348 / 273-297, 528 keys 500-530 / 407-429; in GPT-2's decode after a 512-token
# prompt, 460 -> 340 us a call.
SDPA_PARALLEL_KEYS = 256
prange = range  # numba.prange once Numba is imported (_parallel_threads)

_SDPA_MATH = {"reassoc", "nsz", "contract"}


@jit(error_model="numpy", fastmath=_SDPA_MATH)
def _scores(qi, kh, t_len, scale, zero, s):  # pragma: no cover - compiled
    """s[t] = scale·(qi · kh[t]) for the first t_len rows of one head's keys (a function of
    its own, so that LLVM sees two C-contiguous arrays and vectorizes the dot products)."""
    d = qi.shape[0]
    for t in range(t_len):
        acc = zero
        for j in range(d):
            acc += qi[j] * kh[t, j]
        s[t] = acc * scale


@jit(error_model="numpy", fastmath=_SDPA_MATH)
def _weighted_rows(s, inv, vh, t_len, yi):  # pragma: no cover - compiled
    """yi = Σ_t s[t]·inv·vh[t]: one head's values weighted, four rows a pass (yi read and
    written once a pass, not once a row) in a function of its own, where LLVM vectorizes
    along the row. In the caller's loop over 4-D indexing it did not; 12 heads x 528 rows,
    hot: 4-D 299 us for the whole attention, one row a pass 64 us for this part, four 48."""
    dv = yi.shape[0]
    for j in range(dv):
        yi[j] = 0
    t = 0
    while t + 4 <= t_len:
        p0, p1, p2, p3 = s[t] * inv, s[t + 1] * inv, s[t + 2] * inv, s[t + 3] * inv
        for j in range(dv):
            yi[j] += p0 * vh[t, j] + p1 * vh[t + 1, j] + p2 * vh[t + 2, j] + p3 * vh[t + 3, j]
        t += 4
    while t < t_len:
        p = s[t] * inv
        for j in range(dv):
            yi[j] += p * vh[t, j]
        t += 1


@jit(error_model="numpy", fastmath=_SDPA_MATH)
def _sdpa_head(q, k, v, t_len, b, h, scale, keep, use_keep, fill, mask, use_mask, zero, one, out,
               s):  # pragma: no cover - compiled
    """One (batch, head): per query row, the scores against the first t_len keys, kept/masked,
    softmaxed and applied to V, the row's scores in `s`. A NaN score makes its row NaN, an
    all -inf row too (inf - inf), as the op-by-op softmax gives."""
    kb, mb = min(b, keep.shape[0] - 1), min(b, mask.shape[0] - 1)
    kh, mh = min(h, keep.shape[1] - 1), min(h, mask.shape[1] - 1)
    for i in range(q.shape[2]):
        ki, mi = min(i, keep.shape[2] - 1), min(i, mask.shape[2] - 1)
        _scores(q[b, h, i], k[b, h], t_len, scale, zero, s)
        mx = -one / zero
        for t in range(t_len):
            x = s[t]
            if use_keep and not keep[kb, kh, ki, min(t, keep.shape[3] - 1)]:
                x = fill
            if use_mask:
                x += mask[mb, mh, mi, min(t, mask.shape[3] - 1)]
            s[t] = x
            if x > mx or x != x:
                mx = x
        total = zero
        for t in range(t_len):
            e = np.exp(s[t] - mx)
            s[t] = e
            total += e
        _weighted_rows(s, one / total, v[b, h], t_len, out[b, h, i])


@jit(error_model="numpy", fastmath=_SDPA_MATH)
def _sdpa_rows(q, k, v, t_len, scale, keep, use_keep, fill, mask, use_mask, zero, one, out,
               s):  # pragma: no cover - compiled
    """Every (batch, head) on this thread. q (B, H, S, D), k (B, H, >= T, D), v (B, H, >= T,
    Dv), out (B, H, S, Dv); keep/mask 4-D with 1 where they broadcast; zero and one come in
    Q's dtype, so that float32 stays float32 throughout."""
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            _sdpa_head(q, k, v, t_len, b, h, scale, keep, use_keep, fill, mask, use_mask, zero, one, out, s)


@jit(parallel=True, error_model="numpy", fastmath=_SDPA_MATH)
def _sdpa_rows_parallel(q, k, v, t_len, scale, keep, use_keep, fill, mask, use_mask, zero, one, out, s,
                        threads):  # pragma: no cover - compiled
    """_sdpa_rows with the (batch, head) pairs split into `threads` blocks, one a thread,
    each with its row of scores in s (threads, >= T)."""
    nh = q.shape[1]
    pairs = q.shape[0] * nh
    per = (pairs + threads - 1) // threads
    for w in prange(threads):
        for p in range(w * per, min(pairs, w * per + per)):
            _sdpa_head(q, k, v, t_len, p // nh, p % nh, scale, keep, use_keep, fill, mask, use_mask, zero, one, out,
                       s[w])


def _parallel_threads(pairs: int, t_len: int) -> int:
    """How many threads a one-row attention of `pairs` heads over `t_len` keys splits into:
    1 below SDPA_PARALLEL_KEYS, or where Numba's OpenMP layer cannot run here (onednn's
    row_panels decides that for both loops: a forked child, Numba not loaded, another layer)."""
    if t_len < SDPA_PARALLEL_KEYS or pairs < 2:
        return 1
    try:
        from ..onednn import row_panels
    except ImportError:  # pragma: no cover - no oneDNN: its OpenMP pool is not there to share
        return 1
    if row_panels.why_not_here() is not None:
        return 1
    numba = sys.modules["numba"]
    globals()["prange"] = numba.prange
    return max(1, min(pairs, numba.get_num_threads()))


@kernel("ScaledDotProductAttention", domain="glassrt", dtypes=[np.float32, np.float64], out=True, warms_numba=True)
def scaled_dot_product_attention(q, k, v, keep=None, mask=None, *, out=None, scale=1.0, fill=0.0):
    """softmax(where(keep, scale·Q·Kᵀ, fill) + mask)·V (passes/fuse_attention.py). A plain
    function of its inputs: in a decode plan the cache length is symbolic, and the output
    shape follows from the inputs' without re-binding."""
    dt = q.dtype
    y = out if out is not None else np.empty(q.shape[:-1] + (v.shape[-1],), dt)
    if q.ndim == 4 and q.shape[2] <= SDPA_ROW_LOOP_ROWS and numba_missing() is None:
        # (lean: a decode step calls this a dozen times with its caches cold, where each
        # Python-level step costs several times its hot price; 138 -> 96 us a call so, the
        # loop alone 84: GPT-2's 12 heads x 40 keys with the caches emptied before each call)
        consts = _SDPA_CONSTS.get((dt, scale, fill))
        if consts is None:
            if len(_SDPA_CONSTS) > 256:  # (a NaN scale is never found again: no unbounded growth)
                _SDPA_CONSTS.clear()
            consts = _SDPA_CONSTS[(dt, scale, fill)] = (dt.type(scale), dt.type(fill), dt.type(0), dt.type(1))
        t_len = k.shape[-2]
        scores = (q.shape[0], q.shape[1], q.shape[2], t_len)
        keep4 = _NO_KEEP if keep is None else _as_4d(keep, scores)
        mask4 = _NO_MASK[dt] if mask is None else _as_4d(mask, scores)
        y4 = y if y.flags.c_contiguous else np.empty(y.shape, dt)
        scale_, fill_, zero, one = consts
        args = (q if q.flags.c_contiguous else np.ascontiguousarray(q), _rows_buffer(k), _rows_buffer(v), t_len,
                scale_, keep4, keep is not None, fill_, mask4, mask is not None, zero, one, y4)
        threads = _parallel_threads(q.shape[0] * q.shape[1], t_len)
        if threads > 1:
            _sdpa_rows_parallel(*args, np.empty((threads, t_len), dt), threads)
        else:
            _sdpa_rows(*args, np.empty(t_len, dt))
        if y4 is not y:
            y[...] = y4
        return y
    if q.ndim == 4 and q.shape[1] >= 2 and run_threads.count >= 2 \
            and q.shape[0] * q.shape[1] * q.shape[2] * k.shape[-2] >= SDPA_SPLIT_SCORES:
        # many rows (a prompt): the heads in two halves, the second on a helper thread (BLAS
        # and NumPy's passes release the GIL; NumPy's BLAS is held at one thread in a run)
        scores = (q.shape[0], q.shape[1], q.shape[2], k.shape[-2])
        keep4 = None if keep is None else _as_4d(keep, scores)
        mask4 = None if mask is None else _as_4d(mask, scores)
        half = q.shape[1] // 2

        def part(lo, hi):
            def heads(a):
                return None if a is None else (a if a.shape[1] == 1 else a[:, lo:hi])
            _sdpa_products(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], heads(keep4), heads(mask4), y[:, lo:hi], scale, fill)

        other = run_threads.second_thread().submit(part, half, q.shape[1])
        part(0, half)
        other.result()
        return y
    return _sdpa_products(q, k, v, keep, mask, y, scale, fill)


# Scores (batch x heads x query rows x keys) from which the product path splits its heads
# between two threads, where a run has two (a 512-token prompt of GPT-2: 12 x 512 x 512;
# one thread spent 57 ms a layer there, 16 in Q·Kᵀ, 14 in ·V and 26 in NumPy's softmax passes)
SDPA_SPLIT_SCORES = 1 << 20


def _sdpa_products(q, k, v, keep, mask, y, scale, fill):
    """softmax(where(keep, scale·Q·Kᵀ, fill) + mask)·V into y, as BLAS products and NumPy passes."""
    dt = q.dtype
    s = np.matmul(q, np.swapaxes(k, -1, -2))
    if scale != 1.0:
        s *= dt.type(scale)
    if keep is not None:
        if np.broadcast_shapes(keep.shape, s.shape) == s.shape:
            np.copyto(s, dt.type(fill), where=~keep)  # (in place: no second array of scores)
        else:
            s = np.where(keep, s, dt.type(fill))  # (a keep that enlarges the scores)
    if mask is not None:
        s += mask
    with np.errstate(invalid="ignore", over="ignore"):
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
    return np.matmul(s, v, out=y)


def _rows_buffer(a):
    """A C-contiguous array whose leading rows (axis -2) are `a`: `a` itself, or the buffer a
    KV cache's present is the leading rows of (kernels/cpu/cache.py), read in place; else a copy.
    (Numba's loop reading 12 heads x 48 rows strided took 117 us, against 31 from the buffer.)"""
    if a.flags.c_contiguous:
        return a
    base = buffer_behind(a)
    return base if base is not None else np.ascontiguousarray(a)


def _as_4d(a, scores):
    """A keep/mask as a C-contiguous 4-D array whose dims are the scores' or 1 (the loop
    reads index 0 along a 1); one that does not broadcast so fails here, with its shapes."""
    a4 = a if a.ndim == 4 and a.flags.c_contiguous else np.ascontiguousarray(a).reshape((1,) * (4 - a.ndim) + a.shape)
    s4 = a4.shape
    if (s4[0] != 1 and s4[0] != scores[0]) or (s4[1] != 1 and s4[1] != scores[1]) \
            or (s4[2] != 1 and s4[2] != scores[2]) or (s4[3] != 1 and s4[3] != scores[3]):
        raise ValueError(f"operands could not be broadcast together: {list(a.shape)} into the scores' "
                         f"{list(scores)}")
    return a4


_SDPA_CONSTS: dict = {}  # (dtype, scale, fill) -> the loop's scalars in that dtype


# What the row loop reads where a node has no keep or mask (never read: use_keep/use_mask False)
_NO_KEEP = np.ones((1, 1, 1, 1), np.bool_)
_NO_MASK = {np.dtype(t): np.zeros((1, 1, 1, 1), t) for t in (np.float32, np.float64)}
