"""The `onednn` provider's LSTM, GRU and RNN: oneDNN's RNN primitives run the whole sequence
in one call.

glassrt's cpu kernels loop over the time steps in Python: each step one product of the state
with R and a few NumPy passes for the gates, the product on NumPy's BLAS, which a session
with OpenMP's pool holds at one thread. ddddocr's recognizer (a bidirectional LSTM of hidden
512 over 20 steps, batch 1) spent 8.9 ms there of a 12.4 ms run, where onnxruntime's LSTM
takes 2.2; oneDNN's primitive (its brgemm kernels on the session's OpenMP threads) takes 1.9
alone, 6.4 on one thread; one step of hidden 128 (a streaming VAD's) 7-8 us against the cpu
kernel's 21 (the 2-core AVX-512 machine).

A node runs here when oneDNN's cell computes what ONNX's does: float32, constant W and R
(and B, P: rearranged and reordered once, when the plan is built), the default activations
(LSTM: Sigmoid, Tanh, Tanh; GRU: Sigmoid, Tanh; RNN: Tanh, Relu or Sigmoid, the same in both
directions), no clip, LSTM's input_forget=0, time-major. ONNX's gate blocks are rearranged
into oneDNN's order (LSTM i, o, f, c -> i, f, c, o; GRU z, r, h is oneDNN's u, r, o), and its
two biases summed per gate but for GRU's linear_before_reset, whose candidate gate keeps
them apart (oneDNN's lbr_gru: Rbh inside the reset). sequence_lens may be given: a run in
which some entry is shorter than the sequence runs cpu's kernel (oneDNN runs every batch
entry the whole length). The numbers are oneDNN's logistic and tanh and its order of sums:
within a few float32 roundings of cpu's kernels (tests/test_onednn_rnn.py).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from ..cpu import rnn as cpu_rnn
from ..registry import kernel
from . import dnnl
from .capi import (ARG_BIAS, ARG_DST, ARG_DST_1, ARG_DST_2, ARG_SRC, ARG_SRC_1, ARG_SRC_2, ARG_WEIGHTS,
                   ARG_WEIGHTS_1, ARG_WEIGHTS_2, query_exec_arg_md)
from .dnnl import MemoryDesc, plain_tag
from .kernels import F32, ContiguousViews, _PerThreads, _unavailable, packed_weights, shared_pd

# the node's inputs and outputs by position (ONNX's LSTM; GRU and RNN stop at initial_h and Y_h)
X, W, R, B, SEQUENCE_LENS, INITIAL_H, INITIAL_C, P = range(8)
_STATE_IN = {INITIAL_H: ARG_SRC_1, INITIAL_C: ARG_SRC_2}
_STATE_OUT = (ARG_DST_1, ARG_DST_2)  # Y_h, Y_c
_RNN_ACTIVATIONS = {"tanh": "eltwise_tanh", "relu": "eltwise_relu", "sigmoid": "eltwise_logistic"}


@dataclass(frozen=True)
class _Cell:
    op: str
    gates: int
    order: tuple  # ONNX's gate blocks in oneDNN's order
    activations: tuple  # the activations oneDNN's cell computes, per direction (RNN: one of _RNN_ACTIVATIONS)
    states: int  # h and c (LSTM), or h

    @property
    def inputs(self):
        return (X, W, R, B, SEQUENCE_LENS, INITIAL_H) + ((INITIAL_C, P) if self.states == 2 else ())


_LSTM = _Cell("LSTM", 4, (0, 2, 3, 1), ("sigmoid", "tanh", "tanh"), 2)
_GRU = _Cell("GRU", 3, (0, 1, 2), ("sigmoid", "tanh"), 1)
_RNN = _Cell("RNN", 1, (0,), ("tanh",), 1)
_PEEPHOLES = [0, 2, 1]  # ONNX's P blocks i, o, f in oneDNN's order i, f, o


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _activation(cell: _Cell, attrs, dirs: int):
    """The cell's activation (RNN: its eltwise algorithm; the others: None), or a reason."""
    names = [_text(n).lower() for n in (attrs.get("activations") or [])]
    if cell is _RNN:
        names = names or ["tanh"]  # (the schema's default lists Tanh twice, whatever the directions)
        if len(set(names)) != 1 or names[0] not in _RNN_ACTIVATIONS:
            return None, f"activations {names}: oneDNN's RNN computes one of Tanh, Relu, Sigmoid in both directions"
        return _RNN_ACTIVATIONS[names[0]], None
    if names and names not in (list(cell.activations), list(cell.activations) * dirs):
        wanted = ", ".join(a.capitalize() for a in cell.activations)
        return None, f"activations {names}: oneDNN's {cell.op} computes {wanted} only"
    return None, None


def _reason(cell: _Cell, ctx):
    """Why oneDNN's cell cannot compute this node as ONNX defines it, or None."""
    why = _unavailable(ctx)
    if why:
        return why
    a = ctx.attrs
    x = ctx.shape(X)
    if x is None or len(x) != 3:
        return "X has no static 3-D shape"
    if int(a.get("layout", 0) or 0):
        return "layout=1 (batch-major): the primitive here reads time-major sequences"
    if a.get("clip") is not None:
        return f"clip: oneDNN's {cell.op} does not clip its gates"
    if int(a.get("input_forget", 0) or 0):
        return "input_forget=1: oneDNN's LSTM has no coupled input and forget gates"
    direction = _text(a.get("direction", "forward"))
    if direction not in dnnl.RNN_DIRECTIONS:
        return f"direction {direction!r}"
    dirs = 2 if direction == "bidirectional" else 1
    why = _activation(cell, a, dirs)[1]
    if why:
        return why
    consts = {}
    for i, what in ((W, "W"), (R, "R"), (B, "B"), (P, "P")):
        if i not in cell.inputs or not ctx.has(i):
            continue
        v = ctx.const(i)
        if v is None:
            return f"{what} is computed at run time (weights are reordered once, when the plan is built)"
        if v.dtype != np.float32:
            return f"{what} is {v.dtype}, not float32"
        consts[what] = v
    if consts["W"].ndim != 3 or consts["R"].ndim != 3:
        return "W or R is not 3-D"
    hidden, g = consts["R"].shape[-1], cell.gates
    shapes = {"W": (dirs, g * hidden, x[2]), "R": (dirs, g * hidden, hidden), "B": (dirs, 2 * g * hidden),
              "P": (dirs, 3 * hidden)}
    for what, v in consts.items():
        if v.shape != shapes[what]:
            return f"{what} has shape {list(v.shape)}, not {list(shapes[what])}"  # cpu's kernel says what is wrong
    if a.get("hidden_size") is not None and int(a["hidden_size"]) != hidden:
        return f"hidden_size={a['hidden_size']} but R has {hidden} columns"
    if 0 in x or hidden == 0:
        return "an empty sequence, batch, input or hidden size"
    for i, what in ((INITIAL_H, "initial_h"), (INITIAL_C, "initial_c")):
        if i in cell.inputs and ctx.has(i) and tuple(ctx.shape(i) or ()) != (dirs, x[1], hidden):
            return f"{what} is not a static ({dirs}, {x[1]}, {hidden})"
    return None


class _Derived:
    """Weights rearranged for oneDNN, and the constant they came from (kept alive with them)."""

    __slots__ = ("__weakref__", "array", "source")

    def __init__(self, source, array):
        self.source, self.array = source, array


_DERIVED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _derived(source: np.ndarray, kind, make) -> _Derived:
    """make(source), shared by every kernel that rearranges the same constant the same way:
    each plan of a session (one per sequence length) binds its own kernel, and the packed
    copy (kernels.packed_weights) is shared only when its source is the same array."""
    key = (source.__array_interface__["data"][0], source.shape, source.strides, source.dtype.str, kind)
    hit = _DERIVED.get(key)
    if hit is None:
        hit = _DERIVED[key] = _Derived(source, make(source))
    return hit


def _ldigo(w: np.ndarray, order: tuple, hidden: int) -> np.ndarray:
    """ONNX's (D, G*H, K) weights as oneDNN's (1, D, K, G, H), gate blocks in `order`."""
    dirs, gh, k = w.shape
    return np.ascontiguousarray(w.reshape(dirs, gh // hidden, hidden, k)[:, list(order)].transpose(0, 3, 1, 2))[None]


def _bias(cell: _Cell, b, dirs: int, hidden: int, lbr: bool) -> np.ndarray:
    """oneDNN's (1, D, gates, H) bias from ONNX's (D, 2*G*H) Wb and Rb (zeros without B): one
    per gate, Wb + Rb, but for lbr_gru's candidate gate: Wbh there and Rbh as a fourth block."""
    g = cell.gates
    if b is None:
        return np.zeros((1, dirs, g + lbr, hidden), np.float32)
    wb, rb = b[:, :g * hidden].reshape(dirs, g, hidden), b[:, g * hidden:].reshape(dirs, g, hidden)
    summed = (wb + rb)[:, list(cell.order)]
    if lbr:
        summed = np.concatenate([summed[:, :2], wb[:, 2:], rb[:, 2:]], axis=1)
    return np.ascontiguousarray(summed, np.float32)[None]


def _bind(cell: _Cell, ctx):
    """The step running `ctx`'s node on oneDNN's `cell` primitive (see the module's doc)."""
    a = ctx.attrs
    direction = _text(a.get("direction", "forward"))
    dirs = 2 if direction == "bidirectional" else 1
    steps, batch, width = (int(d) for d in ctx.shape(X))
    hidden = ctx.const(R).shape[-1]
    lbr = cell is _GRU and bool(int(a.get("linear_before_reset", 0) or 0))
    activation = _activation(cell, a, dirs)[0]
    w_layer = _derived(ctx.const(W), ("rnn", cell.order, hidden), lambda w: _ldigo(w, cell.order, hidden))
    w_iter = _derived(ctx.const(R), ("rnn", cell.order, hidden), lambda r: _ldigo(r, cell.order, hidden))
    bias = _bias(cell, ctx.const(B) if ctx.has(B) else None, dirs, hidden, lbr)
    p = ctx.const(P) if cell.states == 2 and ctx.has(P) else None
    peep = None if p is None else np.ascontiguousarray(p.reshape(dirs, 3, hidden)[:, _PEEPHOLES])[None]
    initial = [i for i in (INITIAL_H, INITIAL_C)[:cell.states] if ctx.has(i)]
    outputs = list(ctx.node.outputs)
    wanted = [i < len(outputs) and bool(outputs[i]) for i in range(1 + cell.states)]
    state = (1, dirs, batch, hidden)

    def md(shape, fmt=None):
        return MemoryDesc.create(shape, np.float32, fmt or plain_tag(len(shape)))

    def make_pd():
        src, dst = md((steps, batch, width)), md((steps, batch, dirs * hidden))
        wl, wi = md(w_layer.array.shape, "any"), md(w_iter.array.shape, "any")
        h0 = md(state) if INITIAL_H in initial else None
        if cell is _LSTM:
            return dnnl.lstm(src, h0, md(state) if INITIAL_C in initial else None, wl, wi,
                             None if peep is None else md(peep.shape), md(bias.shape), dst, md(state), md(state),
                             direction=direction)
        if cell is _GRU:
            return dnnl.gru(src, h0, wl, wi, md(bias.shape), dst, md(state), direction=direction,
                            linear_before_reset=lbr)
        return dnnl.vanilla_rnn(src, h0, wl, wi, md(bias.shape), dst, md(state), direction=direction,
                                activation=activation)

    def build():
        pd = shared_pd((cell.op, direction, lbr, activation, steps, batch, width, hidden, tuple(initial),
                        peep is not None), make_pd)
        packed = (packed_weights(w_layer.array, None, pd.query_md(query_exec_arg_md, ARG_WEIGHTS)),
                  packed_weights(w_iter.array, None, pd.query_md(query_exec_arg_md, ARG_WEIGHTS_1)))
        args = {ARG_SRC: None, ARG_WEIGHTS: packed[0].memory, ARG_WEIGHTS_1: packed[1].memory, ARG_BIAS: bias,
                ARG_DST: None, **{arg: None for arg in _STATE_OUT[:cell.states]},
                **{_STATE_IN[i]: None for i in initial}}
        if peep is not None:
            args[ARG_WEIGHTS_2] = peep
        return pd.primitive().bind(args), packed  # (the packed weights live as long as the primitive)

    prims = _PerThreads(build)
    views = ContiguousViews()
    # oneDNN writes the directions side by side, (T, N, D*H); ONNX's Y is (T, D, N, H): the
    # same bytes for one direction or a batch of one, else Y is copied out of scratch
    y_direct = dirs == 1 or batch == 1
    scratch = {}  # buffers for what oneDNN writes that the node does not return as it lies
    fallback = []  # cpu's kernel, made when a run's sequence_lens first needs it
    shapes = [(steps, dirs, batch, hidden)] + [(dirs, batch, hidden)] * cell.states

    def buffer(name, shape):
        if name not in scratch:
            scratch[name] = np.empty(shape, np.float32)
        return scratch[name]

    def step(*inputs, out=(None,)):
        inputs = inputs + (None,) * (len(cell.inputs) - len(inputs))
        if not cpu_rnn.full_length(inputs[SEQUENCE_LENS], steps):
            if not fallback:
                fallback.append(getattr(cpu_rnn, cell.op.lower())(ctx))
            return fallback[0](*inputs, out=out)
        outs = (tuple(out) if isinstance(out, (tuple, list)) else (out,)) + (None,) * 3
        results = []  # where oneDNN writes each wanted output: its planned buffer where it can
        for i, shape in enumerate(shapes):
            o = outs[i] if wanted[i] else None
            if wanted[i] and (o is None or o.dtype != np.float32 or not o.flags.c_contiguous):
                o = np.empty(shape, np.float32)
            results.append(o)
        y = results[0]
        dst = views("y", y, (steps, batch, dirs * hidden)) if y is not None and y_direct \
            else buffer("y", (steps, batch, dirs * hidden))
        buffers = {ARG_SRC: views("x", inputs[X], (steps, batch, width)), ARG_DST: dst}
        for k, arg in enumerate(_STATE_OUT[:cell.states]):
            o = results[1 + k]
            buffers[arg] = buffer(arg, state) if o is None else views(arg, o, state)
        for i in initial:
            buffers[_STATE_IN[i]] = views(i, inputs[i], state)
        prims.get()[0].run(buffers)
        if y is not None and not y_direct:
            np.copyto(y, dst.reshape(steps, batch, dirs, hidden).transpose(0, 2, 1, 3))
        for i, o in enumerate(results):
            if o is not None and outs[i] is not None and o is not outs[i]:  # a planned buffer it could not write
                np.copyto(outs[i], o)
                results[i] = outs[i]
        return tuple(results)

    return step


@kernel("LSTM", provider="onednn", dtypes=F32, out=True, bind=True, multi=True,
        accepts=lambda ctx: _reason(_LSTM, ctx), static_only=True)
def lstm(ctx):
    """The whole sequence in one oneDNN LSTM primitive (all directions)."""
    return _bind(_LSTM, ctx)


@kernel("GRU", provider="onednn", dtypes=F32, out=True, bind=True, multi=True,
        accepts=lambda ctx: _reason(_GRU, ctx), static_only=True)
def gru(ctx):
    """The whole sequence in one oneDNN GRU primitive (lbr_gru for linear_before_reset)."""
    return _bind(_GRU, ctx)


@kernel("RNN", provider="onednn", dtypes=F32, out=True, bind=True, multi=True,
        accepts=lambda ctx: _reason(_RNN, ctx), static_only=True)
def rnn(ctx):
    """The whole sequence in one oneDNN vanilla RNN primitive."""
    return _bind(_RNN, ctx)
