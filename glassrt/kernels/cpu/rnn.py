"""LSTM, GRU, RNN: X·Wᵀ for every time step in one GEMM, then a loop over time steps only.

All directions run in the same time loop: the state is stacked (num_directions, batch, hidden)
and the recurrent product is one batched matmul per step. A reverse direction reads its
input steps back to front (per batch entry, within its sequence_lens), so every direction is
a plain forward recurrence in "processing order"; its outputs are put back in time order at
the end. With sequence_lens, steps past a batch entry's length keep its state and write zeros
to Y (onnxruntime's semantics; the onnx reference ignores sequence_lens).
"""
from __future__ import annotations

import numpy as np

from ..registry import kernel
from ._util import FLOATS_BF16, as_out

# ---------------------------------------------------------------- activations (in place)

# How many of activation_alpha / activation_beta each function consumes, and its defaults
# (onnxruntime's table: the alpha/beta lists are consumed in order, across all directions).
_PARAMS = {"affine": (2, 1.0, 0.0), "leakyrelu": (1, 0.01, 0.0), "thresholdedrelu": (1, 1.0, 0.0),
           "scaledtanh": (2, 1.0, 1.0), "hardsigmoid": (2, 0.2, 0.5), "elu": (1, 1.0, 0.0)}


# The time loops run these under np.errstate(over="ignore"): exp overflowing to inf gives the right limits.


def _sigmoid(x, a, b):
    np.negative(x, out=x)
    np.exp(x, out=x)  # overflow to inf gives the right 0
    x += 1
    return np.reciprocal(x, out=x)


def _tanh(x, a, b):
    return np.tanh(x, out=x)


def _relu(x, a, b):
    return np.maximum(x, 0, out=x)


def _affine(x, a, b):
    x *= a
    x += b
    return x


def _leaky_relu(x, a, b):
    np.copyto(x, x * a, where=x < 0)
    return x


def _thresholded_relu(x, a, b):
    x[x <= a] = 0
    return x


def _scaled_tanh(x, a, b):
    x *= b
    np.tanh(x, out=x)
    x *= a
    return x


def _hard_sigmoid(x, a, b):
    x *= a
    x += b
    return np.clip(x, 0, 1, out=x)


def _elu(x, a, b):
    np.copyto(x, np.expm1(x) * a, where=x < 0)
    return x


def _softsign(x, a, b):
    x /= 1 + np.abs(x)
    return x


def _softplus(x, a, b):
    return np.logaddexp(x, 0, out=x)


_ACTS = {"sigmoid": _sigmoid, "tanh": _tanh, "relu": _relu, "affine": _affine, "leakyrelu": _leaky_relu,
         "thresholdedrelu": _thresholded_relu, "scaledtanh": _scaled_tanh, "hardsigmoid": _hard_sigmoid,
         "elu": _elu, "softsign": _softsign, "softplus": _softplus}


def _str(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def _activations(attrs, defaults, num_dir):
    """[(fn, alpha, beta) per function] per direction, from activations/activation_alpha/_beta."""
    per = len(defaults)
    names = [_str(n) for n in (attrs.get("activations") or [])] or list(defaults) * num_dir
    if len(names) == per and num_dir == 2:
        names = names * 2
    if len(names) < per * num_dir:
        raise ValueError(f"activations {names} must list {per} function(s) per direction ({num_dir})")
    names = names[:per * num_dir]  # RNN's schema default ["Tanh", "Tanh"] for one direction
    alphas = list(attrs.get("activation_alpha") or [])
    betas = list(attrs.get("activation_beta") or [])
    parsed = []
    for n in names:
        key = n.lower()
        if key not in _ACTS:
            raise ValueError(f"unsupported activation {n!r}")
        uses, a, b = _PARAMS.get(key, (0, 0.0, 0.0))
        if uses >= 1 and alphas:
            a = float(alphas.pop(0))
        if uses >= 2 and betas:
            b = float(betas.pop(0))
        parsed.append((_ACTS[key], a, b))
    return [parsed[d * per:(d + 1) * per] for d in range(num_dir)]


def _apply(acts, k, x):
    """Activation k of each direction, in place on x (num_directions, batch, n)."""
    if all(a[k] == acts[0][k] for a in acts):
        fn, a, b = acts[0][k]
        return fn(x, a, b)
    for d, act in enumerate(acts):
        fn, a, b = act[k]
        fn(x[d], a, b)
    return x


# ---------------------------------------------------------------- the shared driver


class _Spec:
    """What every step needs from the node's attributes."""

    def __init__(self, ctx, defaults):
        a = ctx.attrs
        self.direction = _str(a.get("direction", "forward"))
        if self.direction not in ("forward", "reverse", "bidirectional"):
            raise ValueError(f"unknown direction {self.direction!r}")
        self.num_dir = 2 if self.direction == "bidirectional" else 1
        self.reverse = [False, True] if self.num_dir == 2 else [self.direction == "reverse"]
        self.hidden = a.get("hidden_size")
        self.layout = int(a.get("layout", 0) or 0)
        clip = a.get("clip")
        self.clip = None if clip is None else float(clip)
        self.acts = _activations(a, defaults, self.num_dir)
        self.wanted = [bool(o) for o in ctx.node.outputs]

    def clip_(self, x):
        if self.clip is not None:
            np.clip(x, -self.clip, self.clip, out=x)
        return x


def _compute_dtype(dt):
    dt = np.dtype(dt)
    return dt if dt in (np.dtype(np.float32), np.dtype(np.float64)) else np.dtype(np.float32)


def _check(spec, X, W, R, gates):
    if X.ndim != 3 or W.ndim != 3 or R.ndim != 3:
        raise ValueError(f"X, W, R must be 3-D, got {X.shape}, {W.shape}, {R.shape}")
    hidden = R.shape[-1]
    if spec.hidden is not None and int(spec.hidden) != hidden:
        raise ValueError(f"hidden_size={spec.hidden} but R has shape {R.shape}")
    if W.shape[0] != spec.num_dir or W.shape[1] != gates * hidden or W.shape[2] != X.shape[-1]:
        raise ValueError(f"W shape {W.shape} does not match {spec.num_dir} direction(s), {gates} gates, "
                         f"hidden {hidden}, input size {X.shape[-1]}")
    if R.shape != (spec.num_dir, gates * hidden, hidden):
        raise ValueError(f"R shape {R.shape} does not match {spec.num_dir} direction(s), {gates} gates, "
                         f"hidden {hidden}")
    return hidden


class _Sequence:
    """The input in processing order, the step masks and the way back to time order."""

    def __init__(self, spec, X, sequence_lens):
        self.X = X.swapaxes(0, 1) if spec.layout else X  # (T, N, I)
        T, N = self.X.shape[:2]
        self.T, self.N = T, N
        lens = None
        if sequence_lens is not None:
            lens = np.asarray(sequence_lens).reshape(-1).astype(np.int64)
            if lens.shape != (N,):
                raise ValueError(f"sequence_lens has {lens.size} entries for a batch of {N}")
            if (lens < 0).any() or (lens > T).any():
                raise ValueError(f"sequence_lens {lens.tolist()} out of range [0, {T}]")
            if (lens == T).all():
                lens = None
        self.lens = lens
        self.spec = spec
        if lens is not None:
            t = np.arange(T)[:, None]
            # Reverse processing step t reads time step L-1-t (t < L); past L it stays put, so the
            # map is an involution: the same gather restores time order.
            self.rev_idx = np.where(t < lens[None, :], lens[None, :] - 1 - t, t)
            self.cols = np.arange(N)[None, :]
            self.masks = (t < lens[None, :])[:, None, :, None]  # (T, 1, N, 1)

    def order(self, a, d):
        """a (T, N, ...) of direction d in processing order."""
        if not self.spec.reverse[d]:
            return a
        return a[::-1] if self.lens is None else a[self.rev_idx, self.cols]

    def project(self, W, bias, dt):
        """X·Wᵀ + bias for all steps and directions: (T, D, N, G*H), each direction in processing order."""
        T, N, I = self.X.shape
        D, GH = W.shape[:2]
        xw = np.matmul(self.X.reshape(T * N, I), W.reshape(D * GH, I).T).reshape(T, N, D, GH)
        if bias is not None:
            xw += bias
        out = np.empty((T, D, N, GH), dt)
        for d in range(D):
            out[:, d] = self.order(xw[:, :, d], d)
        return out

    def step_state(self, t, new, old):
        """The state after step t: new where the step is inside the sequence, else old."""
        if self.lens is None:
            return new
        return np.where(self.masks[t], new, old)

    def emit(self, Y, t, h):
        if Y is not None:
            if self.lens is None:
                Y[t] = h
            else:  # zeros past the sequence end (whatever padding the input held there)
                np.copyto(Y[t], np.where(self.masks[t], h, 0))

    def finish(self, Y, states, dt):
        """Y back in time order and the requested layout; final states (D, N, H) likewise."""
        if Y is not None:
            for d in range(Y.shape[1]):
                if self.spec.reverse[d]:
                    Y[:, d] = self.order(Y[:, d], d).copy()
            Y = Y.astype(dt, copy=False)
            if self.spec.layout:
                Y = np.ascontiguousarray(Y.transpose(2, 0, 1, 3))  # (N, T, D, H)
        out = []
        empty = None if self.lens is None else self.lens == 0
        for s in states:
            s = s.astype(dt)
            if empty is not None and empty.any():  # an empty sequence has zero final state (onnxruntime)
                s[:, empty] = 0
            out.append(np.ascontiguousarray(s.swapaxes(0, 1)) if self.spec.layout else s)
        return Y, out


def _initial(spec, v, seq, hidden, dt):
    if v is None:
        return np.zeros((spec.num_dir, seq.N, hidden), dt)
    v = v.astype(dt, copy=False)
    v = v.swapaxes(0, 1) if spec.layout else v
    if v.shape != (spec.num_dir, seq.N, hidden):
        raise ValueError(f"initial state has shape {v.shape}, expected {(spec.num_dir, seq.N, hidden)} (time-major)")
    return np.array(v)


def _weights(ctx, idx, prep):
    """prep(*weights) once at bind time when all weight inputs are constants, else per call."""
    if all(ctx.const(i) is not None or not ctx.has(i) for i in idx):
        pre = prep(*[ctx.const(i) if ctx.has(i) else None for i in idx])
        return lambda *args: pre
    return prep


def _bias_rows(B, D, n, dt):
    """(D, n) Wb and Rb halves of B (zeros when absent)."""
    if B is None:
        z = np.zeros((D, n), dt)
        return z, z
    if B.shape != (D, 2 * n):
        raise ValueError(f"B has shape {list(B.shape)}, expected [{D}, {2 * n}] (directions, 2 x gates x hidden)")
    B = B.astype(dt, copy=False)
    return B[:, :n], B[:, n:]


def _results(values, wanted, out):
    """The wanted outputs, copied into their planned buffers (the recurrence itself runs in
    per-step scratch and a time-major Y that is reordered at the end)."""
    bufs = (tuple(out) + (None,) * len(values))[:len(values)]
    return tuple(as_out(v, b) if w else None for v, w, b in zip(values, wanted, bufs))


# ---------------------------------------------------------------- LSTM


@kernel("LSTM", dtypes=FLOATS_BF16, out=True, bind=True, multi=True)
def lstm(ctx):
    """LSTM (gates i, o, f, c; peepholes i, o, f), all directions in one time loop."""
    spec = _Spec(ctx, ("Sigmoid", "Tanh", "Tanh"))
    input_forget = bool(int(ctx.attrs.get("input_forget", 0) or 0))
    cdt = _compute_dtype(ctx.dtype(0) or np.float32)

    def prep(W, R, B=None, P=None):
        W, R = W.astype(cdt, copy=False), R.astype(cdt, copy=False)
        D, H = R.shape[0], R.shape[-1]
        wb, rb = _bias_rows(B, D, 4 * H, cdt)
        bias = wb + rb
        RT = np.ascontiguousarray(R.transpose(0, 2, 1))  # (D, H, 4H)
        peep = None
        if P is not None:
            if P.shape != (D, 3 * H):
                raise ValueError(f"P has shape {list(P.shape)}, expected [{D}, {3 * H}] (directions, 3 x hidden)")
            P = P.astype(cdt, copy=False).reshape(D, 3, 1, H)
            peep = (P[:, 0], P[:, 1], P[:, 2]) if P.any() else None
        return W, RT, bias, peep

    weights = _weights(ctx, (1, 2, 3, 7), prep)
    plain = (spec.num_dir == 1 and not spec.reverse[0] and not spec.layout and spec.clip is None
             and not input_forget and spec.acts[0] == _DEFAULT_LSTM_ACTS)

    def step(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, *, out=(None,)):
        H = _check(spec, X, W, R, 4)
        dt = X.dtype
        W_, RT, bias, peep = weights(W, R, B, P)
        if plain and peep is None and full_length(sequence_lens, X.shape[0]):
            return _plain_lstm(X.astype(cdt, copy=False), W_, RT, bias, initial_h, initial_c, H, spec.wanted, dt,
                               out)
        seq = _Sequence(spec, X.astype(cdt, copy=False), sequence_lens)
        xw = seq.project(W_, bias, cdt)
        h = _initial(spec, initial_h, seq, H, cdt)
        c = _initial(spec, initial_c, seq, H, cdt)
        Y = np.empty((seq.T, spec.num_dir, seq.N, H), cdt) if spec.wanted[0] else None
        g = np.empty((spec.num_dir, seq.N, 4 * H), cdt)
        acts = spec.acts
        i, o, f, cc = g[..., :H], g[..., H:2 * H], g[..., 2 * H:3 * H], g[..., 3 * H:]
        with np.errstate(over="ignore", invalid="ignore"):  # exp overflow to inf is fine
            for t in range(seq.T):
                np.matmul(h, RT, out=g)
                g += xw[t]
                if peep is None:  # i, o, f are adjacent: one activation call for all three
                    _apply(acts, 0, spec.clip_(g[..., :3 * H]))
                else:
                    i += peep[0] * c
                    f += peep[2] * c
                    _apply(acts, 0, spec.clip_(i))
                    _apply(acts, 0, spec.clip_(f))
                if input_forget:
                    np.subtract(1, i, out=f)
                _apply(acts, 1, spec.clip_(cc))
                c_new = f * c
                c_new += i * cc
                if peep is not None:
                    o += peep[1] * c_new
                    _apply(acts, 0, spec.clip_(o))
                h_new = _apply(acts, 2, c_new.copy())
                h_new *= o
                seq.emit(Y, t, h_new)
                h = seq.step_state(t, h_new, h)
                c = seq.step_state(t, c_new, c)
        Y, (yh, yc) = seq.finish(Y, (h, c), dt)
        return _results((Y, yh, yc), spec.wanted, out)

    return step


_DEFAULT_LSTM_ACTS = [(_sigmoid, 0.0, 0.0), (_tanh, 0.0, 0.0), (_tanh, 0.0, 0.0)]


def full_length(sequence_lens, T) -> bool:
    """Whether every batch entry runs all T steps (no sequence_lens, or all equal to T)."""
    return sequence_lens is None or bool((np.asarray(sequence_lens) == T).all())


def _plain_lstm(X, W, RT, bias, initial_h, initial_c, H, wanted, dt, out):
    """The LSTM most models export (one forward direction, the default activations, no
    peepholes, clip or sequence_lens, time-major) without the general driver's machinery:
    the same arithmetic in the same order, step by step, without the driver's setup
    (directions reordered, states stacked, results reordered). One step of hidden 128 (a
    streaming VAD's decoder, run every 32 ms of audio): 22.8 -> 18.0 us alone; in Silero VAD
    v6's plan 57 -> 42 us (one process each)."""
    T, N, _ = X.shape
    cdt = X.dtype
    xw = np.matmul(X.reshape(T * N, -1), W[0].T).reshape(T, N, 4 * H)
    xw += bias[0]
    h = np.zeros((N, H), cdt) if initial_h is None else np.array(initial_h[0], cdt)
    c = np.zeros((N, H), cdt) if initial_c is None else np.array(initial_c[0], cdt)
    if h.shape != (N, H) or c.shape != (N, H):
        raise ValueError(f"initial state has shape {h.shape} / {c.shape}, expected {(1, N, H)} (time-major)")
    Y = np.empty((T, 1, N, H), cdt) if wanted[0] else None
    g = np.empty((N, 4 * H), cdt)
    ifo, cc = g[:, :3 * H], g[:, 3 * H:]
    i, o, f = g[:, :H], g[:, H:2 * H], g[:, 2 * H:3 * H]
    with np.errstate(over="ignore", invalid="ignore"):  # exp overflow to inf is fine
        for t in range(T):
            np.matmul(h, RT[0], out=g)
            g += xw[t]
            _sigmoid(ifo, 0.0, 0.0)
            np.tanh(cc, out=cc)
            c = f * c
            c += i * cc
            h = np.tanh(c)
            h *= o
            if Y is not None:
                Y[t, 0] = h
    values = (None if Y is None else Y.astype(dt, copy=False), h[None].astype(dt, copy=False),
              c[None].astype(dt, copy=False))
    return _results(values, wanted, out)


# ---------------------------------------------------------------- GRU


@kernel("GRU", dtypes=FLOATS_BF16, out=True, bind=True, multi=True)
def gru(ctx):
    """GRU (gates z, r, h), linear_before_reset or not, all directions in one time loop."""
    spec = _Spec(ctx, ("Sigmoid", "Tanh"))
    linear = bool(int(ctx.attrs.get("linear_before_reset", 0) or 0))
    cdt = _compute_dtype(ctx.dtype(0) or np.float32)

    def prep(W, R, B=None):
        W, R = W.astype(cdt, copy=False), R.astype(cdt, copy=False)
        D, H = R.shape[0], R.shape[-1]
        wb, rb = _bias_rows(B, D, 3 * H, cdt)
        RT = np.ascontiguousarray(R.transpose(0, 2, 1))  # (D, H, 3H)
        bias = wb.copy()
        bias[:, :2 * H] += rb[:, :2 * H]
        if linear:  # Rbh goes inside r * (H·Rhᵀ + Rbh)
            return W, RT, bias, rb[:, None, 2 * H:].copy()
        bias[:, 2 * H:] += rb[:, 2 * H:]
        return W, (np.ascontiguousarray(RT[..., :2 * H]), np.ascontiguousarray(RT[..., 2 * H:])), bias, None

    weights = _weights(ctx, (1, 2, 3), prep)

    def step(X, W, R, B=None, sequence_lens=None, initial_h=None, *, out=(None,)):
        H = _check(spec, X, W, R, 3)
        dt = X.dtype
        W_, RT, bias, rbh = weights(W, R, B)
        seq = _Sequence(spec, X.astype(cdt, copy=False), sequence_lens)
        xw = seq.project(W_, bias, cdt)
        h = _initial(spec, initial_h, seq, H, cdt)
        Y = np.empty((seq.T, spec.num_dir, seq.N, H), cdt) if spec.wanted[0] else None
        acts = spec.acts
        with np.errstate(over="ignore", invalid="ignore"):  # exp overflow to inf is fine
            for t in range(seq.T):
                x = xw[t]
                if linear:
                    hr = np.matmul(h, RT)
                    hr[..., 2 * H:] += rbh
                    zr = hr[..., :2 * H]
                    zr += x[..., :2 * H]
                else:
                    zr = np.matmul(h, RT[0])
                    zr += x[..., :2 * H]
                _apply(acts, 0, spec.clip_(zr))
                z, r = zr[..., :H], zr[..., H:]
                if linear:
                    hh = r * hr[..., 2 * H:]
                else:
                    hh = np.matmul(r * h, RT[1])
                hh += x[..., 2 * H:]
                _apply(acts, 1, spec.clip_(hh))
                # (1 - z) * hh + z * h
                h_new = h - hh
                h_new *= z
                h_new += hh
                seq.emit(Y, t, h_new)
                h = seq.step_state(t, h_new, h)
        Y, (yh,) = seq.finish(Y, (h,), dt)
        return _results((Y, yh), spec.wanted, out)

    return step


# ---------------------------------------------------------------- RNN


@kernel("RNN", dtypes=FLOATS_BF16, out=True, bind=True, multi=True)
def rnn(ctx):
    """Simple RNN: H = f(X·Wᵀ + H·Rᵀ + Wb + Rb), all directions in one time loop."""
    spec = _Spec(ctx, ("Tanh",))
    cdt = _compute_dtype(ctx.dtype(0) or np.float32)

    def prep(W, R, B=None):
        W, R = W.astype(cdt, copy=False), R.astype(cdt, copy=False)
        D, H = R.shape[0], R.shape[-1]
        wb, rb = _bias_rows(B, D, H, cdt)
        return W, np.ascontiguousarray(R.transpose(0, 2, 1)), wb + rb

    weights = _weights(ctx, (1, 2, 3), prep)

    def step(X, W, R, B=None, sequence_lens=None, initial_h=None, *, out=(None,)):
        H = _check(spec, X, W, R, 1)
        dt = X.dtype
        W_, RT, bias = weights(W, R, B)
        seq = _Sequence(spec, X.astype(cdt, copy=False), sequence_lens)
        xw = seq.project(W_, bias, cdt)
        h = _initial(spec, initial_h, seq, H, cdt)
        Y = np.empty((seq.T, spec.num_dir, seq.N, H), cdt) if spec.wanted[0] else None
        with np.errstate(over="ignore", invalid="ignore"):  # exp overflow to inf is fine
            for t in range(seq.T):
                h_new = np.matmul(h, RT)
                h_new += xw[t]
                _apply(spec.acts, 0, spec.clip_(h_new))
                seq.emit(Y, t, h_new)
                h = seq.step_state(t, h_new, h)
        Y, (yh,) = seq.finish(Y, (h,), dt)
        return _results((Y, yh), spec.wanted, out)

    return step
