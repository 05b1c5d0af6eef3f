"""onnxruntime's GroupQueryAttention (domain `com.microsoft`), run natively.

The attention op of the LLMs that onnxruntime-genai's model builder and optimum export for
onnxruntime (Phi-3, Llama, Mistral, Qwen): query heads share key/value heads in groups of
num_heads / kv_num_heads, the K/V cache is a pair of BNSH buffers (B, kv_num_heads, L, D), and
every batch entry has its own length (seqlens_k[b] = its total length - 1). The first prompt,
a later prompt chunk, token generation and a right-padded batch are all this one op.

onnxruntime's CPU kernel is the contract (see microsoft.py); what it does, as run:

- Each entry b has `total` = seqlens_k[b] + 1 tokens after the step and `past` before it: 0 in
  the first prompt (sequence_length == total_sequence_length, whatever the entry's length),
  total - sequence_length otherwise, total - query_seqlens[b] when that input is given. Query
  row s sits at position p = past + s and sees keys (p - local_window_size, p] (from 0 without a
  window; all `total` keys with causal=0). A padding row of the first prompt (p >= total) sees
  what the entry's last token sees: what onnxruntime's general loop does, the one it runs for
  float16, softcap, smooth_softmax, head_sink or output_qk. (Its float32 fast loop slides such
  a row's window on past the real keys, to none at all and an output of 0. No consumer reads
  those rows.)
- present_key/present_value hold max(total_sequence_length, past buffer length) rows: the entry's
  `past` rows of past_key, then this step's keys (all sequence_length rows, padding included; only
  query_seqlens[b] rows with that input), then zeros. The past buffer is either the cache so far
  (total_sequence_length = its length + sequence_length) or a fixed-size buffer at least
  total_sequence_length long (onnxruntime's buffer sharing; the present is then as long).
- Rotary positions: position_ids[b, s] when given, except in the first prompt, where onnxruntime
  reads position_ids[0, 0] alone and counts up from it for every entry; else past + s.
- Scores: scale·QKᵀ, then softcap·tanh(·/softcap), then + attention_bias; a softmax over the keys
  a row sees, with head_sink[n] (smooth_softmax: 0) as one more logit in the denominator.
  output_qk is those scores (qk_output=1) or the probabilities (2), 0 where a key is not seen.

Refused, with the reason named when the session is created: sliding_window_cache=1 (the windowed
cache layout and eviction), a quantized KV cache (k_scale/v_scale, kv_cache_bit_width, the quant
types), q_norm_weight/k_norm_weight (onnxruntime's CPU kernel refuses them too), causal=0 with a
window or with query_seqlens, as onnxruntime does; an output_qk output without qk_output (which
onnxruntime refuses too) when the node is first run. Unlike onnxruntime, any head size and any even rotary dim run (its kernel wants multiples
of 8), and a later prompt chunk may have a batch (onnxruntime allows one only with query_seqlens).

No decomposition into standard ops: the per-entry lengths decide both where each entry's keys
land in the cache and which keys each query sees, which a graph would rebuild with per-entry
scatters and masks. The NumPy kernel works in float32 (half inputs rounded once at the end, as in
microsoft.py; the caches are rounded before attention reads them, as onnxruntime's are), with
matmuls batched over entries and heads, a block of query rows at a time (a long prompt's scores
stay small); only the cache copy loops over the entries.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import MemoryLimitError, describe_node
from ..ir import TensorType as Meta
from ..kernels.buffers import as_out, new_out
from ..kernels.custom import custom_op
from ..symbolic import fresh
from .microsoft import F32, F32_F16, MS, _buffers, _require, rotary_embedding

# Scores a block of query rows may hold (float32 elements; three such arrays are alive at once).
_SCORES = 1 << 22

# The inputs in onnxruntime 1.32's order; a node gives a prefix of them, "" where one is absent.
_INPUTS = ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
           "sin_cache", "position_ids", "attention_bias", "head_sink", "k_scale", "v_scale", "q_norm_weight",
           "k_norm_weight", "query_seqlens")

group_query_attention = custom_op(
    f"{MS}::GroupQueryAttention(" + ", ".join(
        f"Tensor{'' if name in ('query', 'seqlens_k', 'total_sequence_length') else '?'} {name}" for name in _INPUTS)
    + ", int num_heads, int kv_num_heads, float scale=0.0, float softcap=0.0, int local_window_size=-1, "
    "int do_rotary=0, int rotary_interleaved=0, int smooth_softmax=-1, int causal=1, int qk_output=0, "
    "int sliding_window_cache=0, int kv_cache_bit_width=0, str k_quant_type='NONE', str v_quant_type='NONE', "
    "float qk_norm_epsilon=1e-6, float q_norm_epsilon=0.0, float k_norm_epsilon=0.0) "
    "-> (Tensor output, Tensor present_key, Tensor present_value, Tensor output_qk)", dtypes=F32_F16)


# ====================================================================== what is refused


def _check_attributes(num_heads, kv_num_heads, causal, local_window_size, qk_output, sliding_window_cache,
                      kv_cache_bit_width, k_quant_type, v_quant_type, **_):
    _require(num_heads > 0 and kv_num_heads > 0,
             lambda: f"num_heads ({num_heads}) and kv_num_heads ({kv_num_heads}) must be positive")
    _require(num_heads % kv_num_heads == 0,
             lambda: f"num_heads ({num_heads}) must be a multiple of kv_num_heads ({kv_num_heads})")
    _require(causal in (0, 1), lambda: f"causal must be 0 or 1, got {causal}")
    _require(causal or local_window_size == -1, "causal=0 with a local_window_size is not supported "
                                                 "(onnxruntime's cpu kernel neither: the window is causal)")
    _require(qk_output in (0, 1, 2), lambda: f"qk_output must be 0, 1 or 2, got {qk_output}")
    _require(not sliding_window_cache, "sliding_window_cache=1 (a window-sized, self-evicting KV cache) "
                                       "is not supported")
    _require(not kv_cache_bit_width and k_quant_type == "NONE" and v_quant_type == "NONE",
             "a quantized KV cache (kv_cache_bit_width, k_quant_type, v_quant_type) is not supported")


def _check_inputs(given, causal):
    """given: the names of the inputs the node has."""
    _require(("key" in given) == ("value" in given), "key and value go together (both absent: packed QKV)")
    _require(not {"k_scale", "v_scale"} & given, "k_scale / v_scale (a quantized KV cache) are not supported")
    _require(not {"q_norm_weight", "k_norm_weight"} & given,
             "q_norm_weight / k_norm_weight are not supported (onnxruntime's cpu kernel neither)")
    _require(("past_key" in given) == ("past_value" in given), "past_key and past_value go together")
    _require("query_seqlens" not in given or "past_key" in given, "query_seqlens needs past_key and past_value")
    _require("query_seqlens" not in given or causal, "query_seqlens needs causal=1")


def _given(*inputs):
    return {name for name, x in zip(_INPUTS, inputs) if x is not None}


# ====================================================================== meta


def _known(*dims):
    return all(isinstance(d, int) for d in dims)


@group_query_attention.register_meta
def _gqa_meta(query, key=None, value=None, past_key=None, past_value=None, seqlens_k=None, total_sequence_length=None,
              cos_cache=None, sin_cache=None, position_ids=None, attention_bias=None, head_sink=None, k_scale=None,
              v_scale=None, q_norm_weight=None, k_norm_weight=None, query_seqlens=None, *, num_heads, kv_num_heads,
              **attrs):
    inputs = (query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache, sin_cache,
              position_ids, attention_bias, head_sink, k_scale, v_scale, q_norm_weight, k_norm_weight, query_seqlens)
    _check_attributes(num_heads, kv_num_heads, **attrs)
    _check_inputs(_given(*inputs), attrs["causal"])
    _require(not attrs["do_rotary"] or (cos_cache is not None and sin_cache is not None),
             "do_rotary=1 needs cos_cache and sin_cache")
    for name, m in (("seqlens_k", seqlens_k), ("total_sequence_length", total_sequence_length),
                    ("query_seqlens", query_seqlens)):
        if m is not None and m.dtype is not None:
            _require(np.dtype(m.dtype) == np.int32, lambda: f"{name} must be int32, got {np.dtype(m.dtype)}")
    dt = query.dtype
    if past_key is not None and past_key.dtype is not None:
        _require(np.dtype(past_key.dtype) == np.dtype(dt),
                 lambda: f"past_key must be query's {np.dtype(dt)} (a quantized "
                         f"cache is not supported), got {np.dtype(past_key.dtype)}")
    q = query.shape
    if q is not None:
        _require(len(q) == 3, lambda: f"query must be 3-D (batch, sequence, hidden), got {list(q)}")
    if q is None or (key is not None and key.shape is None):
        return Meta(dt, None), Meta(dt, None), Meta(dt, None), Meta(dt, None)
    b, s, hidden = q
    if key is None:  # packed QKV: (num_heads + 2·kv_num_heads) heads along the last dim
        heads = num_heads + 2 * kv_num_heads
        _require(not _known(hidden) or hidden % heads == 0,
                 lambda: f"packed QKV's hidden size {hidden} is not a multiple of num_heads + 2·kv_num_heads = "
                         f"{heads}")
        head = hidden // heads if _known(hidden) else None
        out_hidden = num_heads * head if head is not None else fresh("hidden")
    else:
        _require(not _known(hidden) or hidden % num_heads == 0,
                 lambda: f"query's hidden size {hidden} is not a multiple of num_heads {num_heads}")
        head = hidden // num_heads if _known(hidden) else None
        for name, m in (("key", key), ("value", value)):
            if m.shape is not None:
                want = (b, s, kv_num_heads * head if head is not None else None)
                _require(len(m.shape) == 3 and all(not _known(x, y) or x == y for x, y in zip(m.shape, want)),
                         lambda: f"{name} must be (batch, sequence, kv_num_heads·head_size) = {list(want)}, "
                                 f"got {list(m.shape)}")
        out_hidden = hidden
    for name, m in (("past_key", past_key), ("past_value", past_value)):
        if m is not None and m.shape is not None:
            want = (b, kv_num_heads, None, head)
            _require(len(m.shape) == 4 and all(not _known(x, y) or x == y for x, y in zip(m.shape, want)),
                     lambda: f"{name} must be (batch, kv_num_heads, past, head_size) = "
                             f"[{b}, {kv_num_heads}, past, {head}], got {list(m.shape)}")
    if past_key is None:
        total = s  # total_sequence_length is the sequence length then
    elif past_key.shape is not None and len(past_key.shape) == 4:
        total = fresh("present")  # past + sequence, or the past buffer's length: set by total_sequence_length
    else:
        total = None
    head = head if head is not None else fresh("head")
    present = Meta(dt, (b, kv_num_heads, total, head)) if total is not None else Meta(dt, None)
    # output_qk has total_sequence_length columns (the sequence length without a past); none
    # without qk_output, when no node reads it.
    columns = 0 if not attrs["qk_output"] else s if past_key is None else fresh("total")
    return Meta(dt, (b, s, out_hidden)), present, present, Meta(dt, (b, num_heads, s, columns))


# ====================================================================== the kernel


@group_query_attention.register_kernel("cpu", bind=True, out=True)
def _gqa_bind(ctx):
    """Grouped-query attention with a per-entry KV cache, causal/sliding-window masks, rotary
    embedding, softcap and attention sinks, as onnxruntime's cpu kernel computes it."""
    attrs = dict(ctx.attrs)
    for name, (_, default) in group_query_attention.schema.attributes.items():
        attrs.setdefault(name, default)
    _check_attributes(**attrs)
    outputs = list(getattr(ctx.node, "outputs", ()))
    wants_qk = len(outputs) > 3 and bool(outputs[3])
    _require(not wants_qk or attrs["qk_output"], "the output_qk output needs qk_output=1 or 2")
    limit, node = ctx.memory_limit, ctx.node

    def step(*inputs, out=None):
        inputs = inputs + (None,) * (len(_INPUTS) - len(inputs))
        return _gqa(*inputs, out=out, attrs=attrs, limit=limit, node=node)

    return step


def _int32(x, name):
    _require(x.dtype == np.int32, lambda: f"{name} must be int32, got {x.dtype}")
    return x.reshape(-1).astype(np.int64)


def _split_heads(query, key, value, n, n_kv):
    """query (B, S, N·D) (or packed (B, S, (N + 2·Nkv)·D) without key and value) ->
    float32 q (B, N, S, D), k and v (B, Nkv, S, D)."""
    _require(query.ndim == 3, lambda: f"query must be 3-D (batch, sequence, hidden), got {list(query.shape)}")
    b, s, hidden = query.shape
    if key is None:
        _require(value is None, "value given without key")
        heads = n + 2 * n_kv
        _require(hidden % heads == 0, lambda: f"packed QKV's hidden size {hidden} is not a multiple of "
                                              f"num_heads + 2·kv_num_heads = {heads}")
        d = hidden // heads
        qkv = query.reshape(b, s, heads, d).transpose(0, 2, 1, 3).astype(F32)
        return qkv[:, :n], qkv[:, n:n + n_kv], qkv[:, n + n_kv:]
    _require(value is not None, "key given without value")
    _require(hidden % n == 0, lambda: f"query's hidden size {hidden} is not a multiple of num_heads {n}")
    d = hidden // n
    for name, x in (("key", key), ("value", value)):
        _require(x.shape == (b, s, n_kv * d), lambda: f"{name} must be (batch, sequence, kv_num_heads·head_size) = "
                                                      f"{[b, s, n_kv * d]}, got {list(x.shape)}")
    return tuple(x.reshape(b, s, -1, d).transpose(0, 2, 1, 3).astype(F32, copy=False) for x in (query, key, value))


def _layout(b, s, past_len, seqlens_k, total_sequence_length, query_seqlens):
    """Per entry: where this step's keys start in the cache (`past`), how many of its rows go
    in (`new`) and the entry's length after it (`total`); and the present's length. Checked
    against the shapes, so that no fed number sizes an allocation or reads outside a buffer."""
    total = _int32(seqlens_k, "seqlens_k") + 1
    _require(total.size == b, lambda: f"seqlens_k must have batch_size ({b}) elements, got {total.size}")
    _require(total_sequence_length.size == 1,
             lambda: f"total_sequence_length must have one element, got {list(total_sequence_length.shape)}")
    t = int(_int32(total_sequence_length, "total_sequence_length")[0])
    _require(t >= max(s, 1),
             lambda: f"total_sequence_length ({t}) must be positive and at least the sequence length ({s})")
    if past_len is None:
        _require(t == s, lambda: f"without past_key, total_sequence_length ({t}) must be the sequence length ({s})")
    elif query_seqlens is not None:  # only a bound then; onnxruntime's present would grow with it, unfilled
        _require(t <= past_len + s,
                 lambda: f"total_sequence_length ({t}) exceeds past_key's length + the sequence length "
                         f"({past_len} + {s})")
    else:
        _require(t == past_len + s or t <= past_len,
                 lambda: f"total_sequence_length ({t}) must be past_key's length + the sequence length "
                         f"({past_len} + {s}) or at most past_key's length ({past_len}, a shared buffer)")
    length = t if past_len is None else max(t, past_len)
    _require(b == 0 or (total.min() >= 1 and total.max() <= length),
             lambda: f"seqlens_k holds {total.min() - 1 if b else 0}..{total.max() - 1 if b else 0}: each must be in "
                     f"[0, {length}) (the present's length)")
    if query_seqlens is not None:
        new = _int32(query_seqlens, "query_seqlens")
        _require(new.size == b, lambda: f"query_seqlens must have batch_size ({b}) elements, got {new.size}")
        past = total - new
        for i in range(b):
            _require(total[i] <= t, lambda: f"seqlens_k[{i}] + 1 = {total[i]} exceeds total_sequence_length ({t})")
            _require(0 <= new[i] <= min(s, total[i]),
                     lambda: f"query_seqlens[{i}] = {new[i]} must be in [0, min(sequence length, seqlens_k + 1)] = "
                             f"[0, {min(s, total[i])}]")
            _require(past[i] <= past_len and past[i] + s <= length,
                     lambda: f"query_seqlens[{i}] = {new[i]} leaves {past[i]} cached tokens: past_key has "
                             f"{past_len} rows, and the cache of {length} rows must hold them and the whole "
                             f"chunk of {s}")
    elif s == t:  # the first prompt: every entry starts at 0 and all its rows (padding too) go in
        past, new = np.zeros(b, np.int64), np.full(b, s)
    else:
        past, new = total - s, np.full(b, s)
        for i in range(b):
            _require(past[i] >= 0, lambda: f"seqlens_k[{i}] = {total[i] - 1} is too small for the sequence length {s}")
    return past, new, total, t, length


def _positions(past, s, position_ids, first_prompt):
    """(B, S) rotary positions."""
    if position_ids is None:
        return past[:, None] + np.arange(s)[None]
    b = past.size
    _require(position_ids.dtype.kind in "iu", lambda: f"position_ids must be integers, got {position_ids.dtype}")
    _require(position_ids.shape == (b, s), lambda: f"position_ids must be (batch, sequence) = {[b, s]}, "
                                                   f"got {list(position_ids.shape)}")
    if first_prompt and b * s:  # (onnxruntime reads only the first one in the first prompt)
        return np.broadcast_to(int(position_ids[0, 0]) + np.arange(s)[None], (b, s))
    return position_ids.astype(np.int64)


def _rotate(x, pos, cos_cache, sin_cache, interleaved):
    """x (B, n, S, D) float32, rotated in the first 2·cos_cache.shape[1] features of each head."""
    d = x.shape[3]
    _require(cos_cache.ndim == 2 and cos_cache.shape == sin_cache.shape,
             lambda: f"cos_cache {list(cos_cache.shape)} and sin_cache {list(sin_cache.shape)} must be 2-D and alike")
    rotary = 2 * cos_cache.shape[1]
    _require(0 < rotary <= d, lambda: f"the rotary dim 2·cos_cache.shape[1] = {rotary} must be in (0, head_size {d}]")
    rotate = rotary_embedding.kernels["cpu"]  # RotaryEmbedding's kernel: (B, n, S, D) in, (B, n, S, D) out
    return rotate(x, pos, cos_cache, sin_cache, num_heads=x.shape[1], rotary_embedding_dim=rotary,
                  interleaved=interleaved)


def _cache(past_kv, new_kv, past, new, length, dt, out):
    """The present cache (B, Nkv, length, D) of dtype dt, in `out` when given: each entry's
    `past` rows of the past buffer, then its `new` rows of this step, then zeros."""
    b, n_kv, _, d = new_kv.shape
    present = new_out(out, (b, n_kv, length, d), dt)
    for i in range(b):  # (each row written once: a fixed-size cache is mostly the zeros)
        p, n = int(past[i]), int(new[i])
        if p:  # (no past_kv at all in a first prompt)
            present[i, :, :p] = past_kv[i, :, :p]
        present[i, :, p:p + n] = new_kv[i, :, :n]
        present[i, :, p + n:] = 0
    return present


def _seen(past, total, s, width, causal, window):
    """(B, 1, S, width) bool: the keys each query row sees. Causal: those up to the row's
    position, and the `window` last of them; a padding row of the first prompt (position past
    the entry's last token) sees what the entry's last token sees."""
    keys = np.arange(width)[None, None, :]
    if not causal:
        return np.broadcast_to(keys < total[:, None, None], (past.size, s, width))[:, None]
    last = np.minimum(past[:, None] + np.arange(s)[None], total[:, None] - 1)[:, :, None]
    seen = keys <= last
    if window > 0:
        seen &= keys > last - window
    return seen[:, None]


def _softmax(x, seen, sink):
    """softmax of x (B, N, S, T) over the keys `seen`, with `sink` (N,) one more logit in
    each row's denominator (None: none); 0 for keys not seen, and rows that see none."""
    x = np.where(seen, x, -np.inf)
    top = x.max(axis=-1, keepdims=True)
    if sink is not None:
        sink = sink.reshape(1, -1, 1, 1)
        top = np.maximum(top, sink)
    top[~np.isfinite(top)] = 0  # a row that sees no key
    e = np.exp(x - top)
    den = e.sum(axis=-1, keepdims=True)
    if sink is not None:
        den += np.exp(sink - top)
    den[den == 0] = 1
    e /= den
    return e


def _gqa(query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache, sin_cache,
         position_ids, attention_bias, head_sink, k_scale, v_scale, q_norm_weight, k_norm_weight, query_seqlens, *,
         out, attrs, limit, node):
    n, n_kv = attrs["num_heads"], attrs["kv_num_heads"]
    _check_inputs(_given(query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache,
                         sin_cache, position_ids, attention_bias, head_sink, k_scale, v_scale, q_norm_weight,
                         k_norm_weight, query_seqlens), attrs["causal"])
    dt = query.dtype
    q, k, v = _split_heads(query, key, value, n, n_kv)
    b, _, s, d = q.shape
    past_len = None
    if past_key is not None:
        for name, x in (("past_key", past_key), ("past_value", past_value)):
            _require(x.ndim == 4 and x.shape[:2] == (b, n_kv) and x.shape[3] == d,
                     lambda: f"{name} must be (batch, kv_num_heads, past, head_size) = [{b}, {n_kv}, past, {d}], "
                             f"got {list(x.shape)}")
            _require(x.dtype == dt,
                     lambda: f"{name} must be {dt} like query (a quantized cache is not supported), got {x.dtype}")
        _require(past_value.shape == past_key.shape,
                 lambda: f"past_value {list(past_value.shape)} must have past_key's shape {list(past_key.shape)}")
        past_len = past_key.shape[2]
    past, new, total, t, length = _layout(b, s, past_len, seqlens_k, total_sequence_length, query_seqlens)
    first_prompt = query_seqlens is None and s == t
    if attention_bias is not None or attrs["qk_output"]:  # both have total_sequence_length columns
        _require(b == 0 or total.max() <= t,
                 lambda: f"seqlens_k + 1 (up to {total.max() if b else 0}) exceeds total_sequence_length ({t}), "
                         "the columns of attention_bias/output_qk")
    if attention_bias is not None:
        _require(attention_bias.ndim == 4 and attention_bias.shape[0] in (1, b) and attention_bias.shape[1] in (1, n)
                 and attention_bias.shape[2:] == (s, t),
                 lambda: f"attention_bias must be (batch or 1, num_heads or 1, sequence, total_sequence_length) = "
                         f"{[b, n, s, t]}, got {list(attention_bias.shape)}")
    sink = None  # head_sink, or smooth_softmax's 0: one more logit in each softmax's denominator
    if head_sink is not None:
        _require(head_sink.shape == (n,),
                 lambda: f"head_sink must be (num_heads,) = {[n]}, got {list(head_sink.shape)}")
        sink = head_sink.astype(F32)
    elif attrs["smooth_softmax"] == 1:
        sink = np.zeros(n, F32)
    # The keys any row can see (at least one, for empty shapes): no score is computed beyond them.
    width = max(int(total.max()) if b else 1, 1)
    if limit is not None:  # the caches, output_qk and a block of scores with its temporaries (float32 or less)
        scores = min(b * n * s * width, max(_SCORES, b * n * width))
        need = (2 * b * n_kv * length * d + b * n * s * t * bool(attrs["qk_output"]) + 3 * scores) * 4
        if need > limit:
            raise MemoryLimitError(f"{describe_node(node)} would allocate {need:,} bytes, over the session's memory "
                                   f"limit of {limit:,} bytes")
    if attrs["do_rotary"] and q.size:
        _require(cos_cache is not None and sin_cache is not None, "do_rotary=1 needs cos_cache and sin_cache")
        _require(cos_cache.shape[0] >= t, lambda: f"cos_cache has {cos_cache.shape[0]} rows, fewer than "
                                                  f"total_sequence_length ({t})")
        pos = _positions(past, s, position_ids, first_prompt)
        q = _rotate(q, pos, cos_cache, sin_cache, attrs["rotary_interleaved"])
        k = _rotate(k, pos, cos_cache, sin_cache, attrs["rotary_interleaved"])
    y_out, k_out, v_out, qk_out = _buffers(out, 4)
    present_key = _cache(past_key, k, past, new, length, dt, k_out)
    present_value = _cache(past_value, v, past, new, length, dt, v_out)
    seen = _seen(past, total, s, width, attrs["causal"], attrs["local_window_size"])
    qk = new_out(qk_out, (b, n, s, t if attrs["qk_output"] else 0), dt)  # (no columns when no node reads it)
    qk.fill(0)
    y = _attend(q, present_key[:, :, :width], present_value[:, :, :width], seen, attention_bias, sink, qk, attrs)
    y = as_out(y.transpose(0, 2, 1, 3).reshape(b, s, n * d).astype(dt, copy=False), y_out)
    return y, present_key, present_value, qk


def _attend(q, keys, values, seen, attention_bias, sink, qk, attrs):
    """Attention of q (B, N, S, D) float32 on the caches' first `width` rows (B, Nkv, width, D),
    a block of query rows at a time (the scores of a long prompt stay within _SCORES elements);
    fills qk's first width columns as qk_output asks. Returns (B, N, S, D) float32."""
    b, n, s, d = q.shape
    n_kv, width = keys.shape[1], keys.shape[2]
    group = n // n_kv  # query heads g·group .. (g+1)·group - 1 share K/V head g
    kt = keys.astype(F32, copy=False).transpose(0, 1, 3, 2)
    vf = values.astype(F32, copy=False)
    scale = F32.type(attrs["scale"] or 1 / math.sqrt(d))
    y = np.empty((b, n, s, d), F32)
    block = max(1, _SCORES // max(1, b * n * width))
    for lo in range(0, s, block):
        rows = slice(lo, min(s, lo + block))
        m = rows.stop - lo
        scores = np.matmul(q[:, :, rows].reshape(b, n_kv, group * m, d), kt).reshape(b, n, m, width)
        scores *= scale
        if attrs["softcap"] > 0:
            cap = F32.type(attrs["softcap"])
            scores = np.tanh(scores / cap) * cap
        if attention_bias is not None:
            scores += attention_bias[:, :, rows, :width].astype(F32, copy=False)
        if attrs["qk_output"] == 1:
            qk[:, :, rows, :width] = np.where(seen[:, :, rows], scores, F32.type(0))
        probs = _softmax(scores, seen[:, :, rows], sink)
        if attrs["qk_output"] == 2:
            qk[:, :, rows, :width] = probs
        y[:, :, rows] = np.matmul(probs.reshape(b, n_kv, group * m, width), vf).reshape(b, n, m, d)
    return y


@group_query_attention.register_example
def _gqa_example(dt):
    # A padded first prompt of 2 entries (4 query heads on 2 K/V heads of 8 features) with
    # rotary embedding. `glassrt check` grows the batch: seqlens_k follows it, the caches'
    # 6 rows (not the batch) do not.
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 3, h)).astype(dt) for h in (32, 16, 16))
    cos, sin = (f(np.arange(6)[:, None] * np.array([[1.0, 0.1]])).astype(dt) for f in (np.cos, np.sin))
    return ([q, k, v, None, None, np.array([2, 1], np.int32), np.array(3, np.int32), cos, sin],
            {"num_heads": 4, "kv_num_heads": 2, "do_rotary": 1})
