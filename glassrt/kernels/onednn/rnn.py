"""The `onednn` provider's LSTM: oneDNN's RNN primitive runs the whole sequence in one call.

glassrt's cpu LSTM loops over the time steps in Python: each step one product of the state
with R and a few NumPy passes for the gates, the product on NumPy's BLAS, which a session
with OpenMP's pool holds at one thread. ddddocr's recognizer (a bidirectional LSTM of hidden
512 over 20 steps, batch 1) spent 8.9 ms there of a 12.4 ms run, where onnxruntime's LSTM
takes 2.2; oneDNN's primitive (its brgemm kernels on the session's OpenMP threads) takes 1.9
alone, 6.4 on one thread (the 2-core AVX-512 machine).

The node runs here when oneDNN's LSTM computes what ONNX's does: float32, constant W and R
(and B, P: reordered once, when the plan is built), the default activations (Sigmoid, Tanh,
Tanh), no clip, input_forget=0, time-major. sequence_lens may be given: a run in which some
entry is shorter than the sequence runs cpu's kernel (oneDNN runs every batch entry the
whole length). The numbers are oneDNN's logistic and tanh and its order of sums: within a
few float32 roundings of cpu's kernel (tests/test_onednn_rnn.py).
"""
from __future__ import annotations

import weakref

import numpy as np

from ..registry import kernel
from . import dnnl
from .capi import (ARG_BIAS, ARG_DST, ARG_DST_1, ARG_DST_2, ARG_SRC, ARG_SRC_1, ARG_SRC_2, ARG_WEIGHTS,
                   ARG_WEIGHTS_1, ARG_WEIGHTS_2, query_exec_arg_md)
from .dnnl import MemoryDesc, plain_tag
from .kernels import F32, ContiguousViews, _PerThreads, _unavailable, packed_weights, shared_pd

_GATES = [0, 2, 3, 1]  # ONNX's gate blocks i, o, f, c in oneDNN's order i, f, c, o
_PEEPHOLES = [0, 2, 1]  # ONNX's P blocks i, o, f in oneDNN's order i, f, o
_DEFAULT_ACTIVATIONS = ["sigmoid", "tanh", "tanh"]


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _lstm_reason(ctx):
    """Why oneDNN's LSTM cannot compute this node as ONNX defines it, or None."""
    why = _unavailable(ctx)
    if why:
        return why
    a = ctx.attrs
    x = ctx.shape(0)
    if x is None or len(x) != 3:
        return "X has no static 3-D shape"
    if int(a.get("layout", 0) or 0):
        return "layout=1 (batch-major): the primitive here reads time-major sequences"
    if a.get("clip") is not None:
        return "clip: oneDNN's LSTM does not clip its gates"
    if int(a.get("input_forget", 0) or 0):
        return "input_forget=1: oneDNN's LSTM has no coupled input and forget gates"
    direction = _text(a.get("direction", "forward"))
    if direction not in dnnl.RNN_DIRECTIONS:
        return f"direction {direction!r}"
    dirs = 2 if direction == "bidirectional" else 1
    names = [_text(n).lower() for n in (a.get("activations") or [])]
    if names and names not in (_DEFAULT_ACTIVATIONS, _DEFAULT_ACTIVATIONS * dirs):
        return f"activations {names}: oneDNN's LSTM computes Sigmoid, Tanh, Tanh only"
    consts = {}
    for i, what in ((1, "W"), (2, "R"), (3, "B"), (7, "P")):
        if not ctx.has(i):
            continue
        v = ctx.const(i)
        if v is None:
            return f"{what} is computed at run time (weights are reordered once, when the plan is built)"
        if v.dtype != np.float32:
            return f"{what} is {v.dtype}, not float32"
        consts[what] = v
    w, r = consts["W"], consts["R"]
    if r.ndim != 3 or w.ndim != 3:
        return "W or R is not 3-D"
    hidden = r.shape[-1]
    shapes = {"W": (dirs, 4 * hidden, x[2]), "R": (dirs, 4 * hidden, hidden), "B": (dirs, 8 * hidden),
              "P": (dirs, 3 * hidden)}
    for what, v in consts.items():
        if v.shape != shapes[what]:
            return f"{what} has shape {list(v.shape)}, not {list(shapes[what])}"  # cpu's kernel says what is wrong
    if a.get("hidden_size") is not None and int(a["hidden_size"]) != hidden:
        return f"hidden_size={a['hidden_size']} but R has {hidden} columns"
    if 0 in x or hidden == 0:
        return "an empty sequence, batch, input or hidden size"
    for i, what in ((5, "initial_h"), (6, "initial_c")):
        if ctx.has(i) and tuple(ctx.shape(i) or ()) != (dirs, x[1], hidden):
            return f"{what} is not a static ({dirs}, {x[1]}, {hidden})"
    return None


class _Derived:
    """Weights rearranged for oneDNN, and the constant they came from (kept alive with them)."""

    __slots__ = ("__weakref__", "array", "source")

    def __init__(self, source, array):
        self.source, self.array = source, array


_DERIVED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _derived(source: np.ndarray, kind: str, make) -> _Derived:
    """make(source), shared by every kernel that rearranges the same constant the same way:
    each plan of a session (one per sequence length) binds its own kernel, and the packed
    copy (kernels.packed_weights) is shared only when its source is the same array."""
    key = (source.__array_interface__["data"][0], source.shape, source.strides, source.dtype.str, kind)
    hit = _DERIVED.get(key)
    if hit is None:
        hit = _DERIVED[key] = _Derived(source, make(source))
    return hit


def _gates_ldigo(w: np.ndarray, dirs: int, hidden: int) -> np.ndarray:
    """ONNX's (D, 4H, K) weights as oneDNN's (1, D, K, 4, H), gates in oneDNN's order."""
    k = w.shape[-1]
    return np.ascontiguousarray(w.reshape(dirs, 4, hidden, k)[:, _GATES].transpose(0, 3, 1, 2))[None]


def _full_length(sequence_lens, steps: int) -> bool:
    return sequence_lens is None or bool((np.asarray(sequence_lens) == steps).all())


@kernel("LSTM", provider="onednn", dtypes=F32, out=True, bind=True, multi=True, accepts=_lstm_reason,
        static_only=True)
def lstm(ctx):
    """The whole sequence in one oneDNN LSTM primitive (all directions)."""
    a = ctx.attrs
    direction = _text(a.get("direction", "forward"))
    dirs = 2 if direction == "bidirectional" else 1
    steps, batch, width = (int(d) for d in ctx.shape(0))
    hidden = ctx.const(2).shape[-1]
    w_layer = _derived(ctx.const(1), "lstm", lambda w: _gates_ldigo(w, dirs, hidden))
    w_iter = _derived(ctx.const(2), "lstm", lambda r: _gates_ldigo(r, dirs, hidden))
    b = ctx.const(3) if ctx.has(3) else None
    # oneDNN adds one bias per gate: ONNX's Wb + Rb
    bias = np.zeros((1, dirs, 4, hidden), np.float32) if b is None else np.ascontiguousarray(
        (b[:, :4 * hidden] + b[:, 4 * hidden:]).reshape(dirs, 4, hidden)[:, _GATES])[None]
    p = ctx.const(7) if ctx.has(7) else None
    peep = None if p is None else np.ascontiguousarray(p.reshape(dirs, 3, hidden)[:, _PEEPHOLES])[None]
    has_h0, has_c0 = ctx.has(5), ctx.has(6)
    outputs = list(ctx.node.outputs)
    wanted = [i < len(outputs) and bool(outputs[i]) for i in range(3)]

    def md(shape, fmt=None):
        return MemoryDesc.create(shape, np.float32, fmt or plain_tag(len(shape)))

    state = (1, dirs, batch, hidden)

    def make_pd():
        return dnnl.lstm(md((steps, batch, width)), md(state) if has_h0 else None, md(state) if has_c0 else None,
                         md(w_layer.array.shape, "any"), md(w_iter.array.shape, "any"),
                         None if peep is None else md(peep.shape), md(bias.shape), md((steps, batch, dirs * hidden)),
                         md(state), md(state), direction=direction)

    def build():
        pd = shared_pd(("lstm", direction, steps, batch, width, hidden, has_h0, has_c0, peep is not None), make_pd)
        packed = (packed_weights(w_layer.array, None, pd.query_md(query_exec_arg_md, ARG_WEIGHTS)),
                  packed_weights(w_iter.array, None, pd.query_md(query_exec_arg_md, ARG_WEIGHTS_1)))
        args = {ARG_SRC: None, ARG_WEIGHTS: packed[0].memory, ARG_WEIGHTS_1: packed[1].memory, ARG_BIAS: bias,
                ARG_DST: None, ARG_DST_1: None, ARG_DST_2: None}
        if has_h0:
            args[ARG_SRC_1] = None
        if has_c0:
            args[ARG_SRC_2] = None
        if peep is not None:
            args[ARG_WEIGHTS_2] = peep
        return pd.primitive().bind(args), packed  # (the packed weights live as long as the primitive)

    prims = _PerThreads(build)
    views = ContiguousViews()
    # oneDNN writes the directions side by side, (T, N, D*H); ONNX's Y is (T, D, N, H): the
    # same bytes for one direction or a batch of one, else Y is copied out of this scratch
    y_direct = dirs == 1 or batch == 1
    scratch = {}  # buffers for what oneDNN writes that the node does not return as it lies
    fallback = []  # cpu's kernel, made when a run's sequence_lens first needs it

    def buffer(name, shape):
        if name not in scratch:
            scratch[name] = np.empty(shape, np.float32)
        return scratch[name]

    def step(X, W=None, R=None, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, *,
             out=(None,)):
        if not _full_length(sequence_lens, steps):
            if not fallback:
                from ..cpu.rnn import lstm as cpu_lstm

                fallback.append(cpu_lstm(ctx))
            return fallback[0](X, W, R, B, sequence_lens, initial_h, initial_c, P, out=out)
        outs = (tuple(out) if isinstance(out, (tuple, list)) else (out,)) + (None,) * 3
        results = []  # where oneDNN writes each wanted output: its planned buffer where it can
        for i, shape in enumerate(((steps, dirs, batch, hidden), (dirs, batch, hidden), (dirs, batch, hidden))):
            o = outs[i] if wanted[i] else None
            if wanted[i] and (o is None or o.dtype != np.float32 or not o.flags.c_contiguous):
                o = np.empty(shape, np.float32)
            results.append(o)
        y, y_h, y_c = results
        dst = views("y", y, (steps, batch, dirs * hidden)) if y is not None and y_direct \
            else buffer("y", (steps, batch, dirs * hidden))
        buffers = {ARG_SRC: views("x", X, (steps, batch, width)), ARG_DST: dst,
                   ARG_DST_1: buffer("h", state) if y_h is None else views("y_h", y_h, state),
                   ARG_DST_2: buffer("c", state) if y_c is None else views("y_c", y_c, state)}
        if has_h0:
            buffers[ARG_SRC_1] = views("h0", initial_h, state)
        if has_c0:
            buffers[ARG_SRC_2] = views("c0", initial_c, state)
        prims.get()[0].run(buffers)
        if y is not None and not y_direct:
            np.copyto(y, dst.reshape(steps, batch, dirs, hidden).transpose(0, 2, 1, 3))
        for i, o in enumerate(results):
            if o is not None and outs[i] is not None and o is not outs[i]:  # a planned buffer it could not write
                np.copyto(outs[i], o)
                results[i] = outs[i]
        return tuple(results)

    return step
