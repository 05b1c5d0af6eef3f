"""One row against packed weights, streamed by a compiled loop: a decode step's products.

At one row a product reads each weight once for one multiply-add: memory bound. oneDNN's
brgemm kernel reads its own packed layout (`BA16a64b` on AVX-512: 64-column panels, each
panel's rows one after another) slower than the panels allow. Measured on the 2-core
AVX-512 machine, GPT-2's 48 layer products (340 MB) at one row, one thread: the matmul
primitive 22.2-23.3 ms, onnxruntime's MLAS 18.2-19.9, a prototype of this loop 16.6; two
threads, four alternating rounds: primitive 12.5-18.1 ms, MLAS 12.0-14.6, the prototype
8.5-12.6. In a GPT-2 decode step, per product (c_attn, attn c_proj, c_fc, mlp c_proj):
246 / 93 / 347 / 320 us against the primitive's 325 / 147 / 427 / 431 and onnxruntime's
243 / 92 / 322 / 327; whole steps, alternating processes, 22.3 -> 21.0, 22.1 -> 20.4,
24.7 -> 21.9 ms (onnxruntime 19.3, 18.0, 20.4).

The loop reads the same packed copy the primitive does (no second copy of the weights),
one 64-column panel per iteration, each thread a block of whole panels: Numba's
`omp` threading layer runs on the same GNU OpenMP pool as oneDNN's primitives, so no
second pool spins beside it. FusedMatMul's epilogue (scale, bias, residual, activation)
is applied by each thread to its block of sums once its panels are done.

When a product takes it: a one-row product (rows == 1, not small enough to run alone) whose
plan has run AFTER_RUNS times (a plan that keeps running: a decoding loop, a served model)
and only where Numba is already loaded by the process (importing it costs ~0.2 s, more than
a classifier's one-row layer would ever gain); not in a forked child (Numba's OpenMP layer
ends a process forked after it ran), and not with another Numba threading layer (its own
threads would spin against OpenMP's). `stats` counts the products that took it and why
the others did not; explain prints them.
"""
from __future__ import annotations

import math
import os
import sys
from collections import Counter

import numpy as np

from ..cpu._jit import compiled, jit, numba_loaded, numba_threads
from . import capi
from .dnnl import ARG_WEIGHTS
from .kernels import ContiguousViews

AFTER_RUNS = 16  # as runtime/plan.py's STRAIGHT_AFTER: a plan that has run this often keeps running
PANEL = 64  # the column block of the packed layout this loop reads (BA{k}a64b)

# activation codes of the loop, by FusedMatMul's activation names
_ACT = {"": 0, "Relu": 1, "LeakyRelu": 2, "Clip": 3, "Sigmoid": 4, "Tanh": 5, "Gelu": 6, "GeluTanh": 7}

stats: Counter = Counter()  # "streamed" and the reasons products kept the primitive

prange = range  # numba.prange once Numba is imported (_compile)


# tanh and erf in the loop below are rational approximations (MLAS's tanh, as onnxruntime
# computes it and kernels/mlas_math.py reproduces it; Eigen's erf, its sibling), within 6
# ulp of the true functions: a loop calling libm runs one element at a time (GPT-2's c_fc,
# 3,072 GeluTanh per product: ~35 us of a 320 us product in a decode step), arithmetic
# alone vectorizes. Clamps written as selects keep NaN.
_TANH_P = (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11,
           5.12229709037114e-08, 1.48572235717979e-05, 6.37261928875436e-04, 4.89352455891786e-03)
_TANH_Q = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03)
# Eigen's float erf (the same family: odd/even rational, |x| clamped to 4, where erf is 1 in float32)
_ERF_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
          -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
_ERF_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
          -1.42647390514189e-02)


@jit(inline="always", fastmath={"contract"})
def _rational32(x, bound, p, q):  # pragma: no cover - compiled
    """x·P(x²)/Q(x²) in float32 (coefficients highest first), x clamped to ±bound."""
    f = np.float32
    v = f(bound) if x > f(bound) else x
    v = f(-bound) if v < f(-bound) else v
    s = v * v
    num, den = f(p[0]), f(q[0])
    for i in range(1, len(p)):
        num = num * s + f(p[i])
    for i in range(1, len(q)):
        den = den * s + f(q[i])
    return num * v / den


@jit(inline="always", fastmath={"contract"})
def _tanh32(x):  # pragma: no cover - compiled
    return _rational32(x, 9.0, _TANH_P, _TANH_Q)


@jit(inline="always", fastmath={"contract"})
def _erf32(x):  # pragma: no cover - compiled
    return _rational32(x, 4.0, _ERF_P, _ERF_Q)


@jit(parallel=True, fastmath={"contract"}, boundscheck=False)
def _row_panels(a, w, k, y, alpha, bias, z, act, p0, p1, threads):  # pragma: no cover - compiled
    """y = act(alpha·(a @ W) + bias + z) for W packed as (panels, K padded, 64): each of
    `threads` blocks of whole panels streamed by one thread, which stores the panels' sums
    and then applies the epilogue to its block of y at once. The epilogue after each panel
    instead (a few vector operations on 64 values, ~20 ns) held up the thread's weight
    stream once a panel. Measured on the 2-core Xeon: GPT-2's c_fc (768 x 3072, bias,
    GeluTanh), weights on huge pages cycled through 755 MB, 342 us a product against 385
    (faster in 60 of 60 passes); in a decode step (in-process rounds alternating the two
    loops) 0.42 ms a token faster in 10 of 10 rounds, 1.3 ms in 5 of 6 beside a busy process."""
    panels, _, p = w.shape
    n = y.shape[0]
    per = (panels + threads - 1) // threads
    for t in prange(threads):
        q0, q1 = t * per, min(panels, t * per + per)
        for q in range(q0, q1):
            acc = np.zeros(p, np.float32)
            for i in range(k):
                ai = a[i]
                for j in range(p):
                    acc[j] += ai * w[q, i, j]
            c0 = q * p
            for j in range(min(p, n - c0)):
                y[c0 + j] = acc[j]
        _epilogue(y, q0 * p, min(q1 * p, n), alpha, bias, z, act, p0, p1)


@jit(inline="always", fastmath={"contract"}, boundscheck=False)
def _epilogue(y, lo, hi, alpha, bias, z, act, p0, p1):  # pragma: no cover - compiled
    """y[lo:hi] = act(alpha·y + bias + z), a vector loop per step (the activation's branch
    taken once for the block, not per element). The steps work on a copy of the block: on
    y itself, LLVM cannot tell y from bias or z and leaves the loops scalar (the rational
    tanh of GeluTanh then cost ~15 us of a 3,072-wide product)."""
    f = np.float32
    n = y.shape[0]
    nb, nz = bias.shape[0], z.shape[0]
    v = y[lo:hi].copy()
    for j in range(v.shape[0]):
        v[j] *= alpha
    if nb:
        for j in range(v.shape[0]):
            v[j] += bias[lo + j]
    if nz == n:
        for j in range(v.shape[0]):
            v[j] += z[lo + j]
    elif nz == 1:
        for j in range(v.shape[0]):
            v[j] += z[0]
    if act == 1:
        for j in range(v.shape[0]):
            x = v[j]
            v[j] = f(0.0) if x < f(0.0) else x
    elif act == 2:
        for j in range(v.shape[0]):
            x = v[j]
            v[j] = x if x >= f(0.0) else x * f(p0)
    elif act == 3:
        for j in range(v.shape[0]):
            x = v[j]
            x = f(p0) if x < f(p0) else x
            v[j] = f(p1) if x > f(p1) else x
    elif act == 4:
        for j in range(v.shape[0]):  # exact: logistic's rational form loses digits below ~1e-3
            v[j] = f(1.0) / (f(1.0) + math.exp(-v[j]))
    elif act == 5:
        for j in range(v.shape[0]):
            v[j] = _tanh32(v[j])
    elif act == 6:
        for j in range(v.shape[0]):
            x = v[j]
            v[j] = f(0.5) * x * (f(1.0) + _erf32(x * f(0.7071067811865476)))
    elif act == 7:
        for j in range(v.shape[0]):
            x = v[j]
            v[j] = f(0.5) * x * (f(1.0) + _tanh32(f(0.7978845608028654) * (x + f(0.044715) * x * x * x)))
    y[lo:hi] = v


ROWS = 16  # weight rows per iteration of the dot-product loop (48 KB at K = 768)


@jit(parallel=True, fastmath={"reassoc", "contract"}, boundscheck=False)
def _row_dots(a, w, y, alpha, bias):  # pragma: no cover - compiled
    """y = alpha·(W @ a) + bias for weights laid out (N, K): each output the dot product of
    one of W's rows, the rows shared out in blocks of ROWS (reassociation lets the dot
    product run on vector registers; no fast-math assumptions about NaN or infinity)."""
    n, k = w.shape
    nb = bias.shape[0]
    for q in prange((n + ROWS - 1) // ROWS):
        for r in range(q * ROWS, min(n, q * ROWS + ROWS)):
            s = np.float32(0.0)
            for i in range(k):
                s += a[i] * w[r, i]
            v = s * alpha
            if nb:
                v += bias[r]
            y[r] = v


def _compile():
    """Numba imported (already loaded: see the module's doc), the OpenMP layer asked for where
    nobody chose one, and the loop compiled (from the disk cache after the first time);
    None, or why not."""
    numba = sys.modules["numba"]
    if "NUMBA_THREADING_LAYER" not in os.environ and numba.config.THREADING_LAYER == "default":
        try:
            numba.threading_layer()  # raises until the first parallel launch picks one
        except ValueError:
            numba.config.THREADING_LAYER = "omp"
    globals()["prange"] = numba.prange
    fn = compiled(_row_panels)
    one = np.zeros((1, 1, PANEL), np.float32)
    # (the argument types `stream` passes: one compiled signature, cached on disk)
    fn(np.zeros(1, np.float32), one, 1, np.zeros(1, np.float32), np.float32(1.0), np.zeros(0, np.float32),
       np.zeros(0, np.float32), 0, 0.0, 0.0, 1)
    layer = numba.threading_layer()
    return None if layer == "omp" else f"Numba's threading layer is {layer}, not omp (OpenMP's pool)"


_READY: list = []  # [None] once compiled, [reason] when it cannot be
_forked = [False]  # this process is a fork's child

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _forked.__setitem__(0, True))


def why_not_here() -> str | None:
    """Why this process cannot stream products (None: it can)."""
    if _forked[0]:
        return "a forked process (Numba's OpenMP layer ends a child forked after it ran)"
    if not numba_loaded():  # (in sys.modules from the start of its import: a load under way is not loaded)
        return "Numba is not loaded (importing it for this costs more than it gains)"
    if not _READY:
        try:
            _READY.append(_compile())
        except Exception as e:  # noqa: BLE001 - a Numba that cannot do this: the primitive runs
            _READY.append(f"the loop failed to compile: {type(e).__name__}: {e}")
    return _READY[0]


def panel_view(memory, md) -> np.ndarray | None:
    """The packed weights as (panels, K padded, 64) float32, when their layout is oneDNN's
    BA{k}a64b (64-column panels of whole padded columns), else None."""
    if md.format_kind != "blocked" or len(md.dims) != 2:
        return None
    (kb, d0), (pb, d1) = md.inner_blocks if len(md.inner_blocks) == 2 else ((0, -1), (0, -1))
    kp, np_ = md.padded_dims
    if (d0, d1, pb) != (0, 1, PANEL) or md.strides != (kb * PANEL, kp * PANEL) or kp % kb or np_ % PANEL:
        return None
    return memory.array.view(np.float32)[: kp * np_].reshape(np_ // PANEL, kp, PANEL)


def stream(prim, product):
    """A function (a, z, out) -> out running `product` (matmul.py's _Product) on the loop over
    the primitive's packed weights (None from it in a forked child), or None (stats says why)."""
    # (the layout first: where it is not panels, as the inner product's on AVX2, Numba's loop
    # is not compiled for nothing)
    w = panel_view(prim[ARG_WEIGHTS], prim.pd.weights_md())
    why = f"the packed layout is not 64-column panels ({prim.pd.weights_md()})" if w is None else why_not_here()
    if why is None and (product.trans_a or product.act not in _ACT):
        why = "A read transposed" if product.trans_a else f"activation {product.act}"
    if why:
        stats[why] += 1
        return None
    fn = compiled(_row_panels)
    k, alpha = product.k, np.float32(product.alpha)
    bias = np.zeros(0, np.float32) if product.bias is None else np.ascontiguousarray(product.bias, np.float32).reshape(-1)
    act = _ACT[product.act]
    params = list(product.params) + [0.0, 0.0]
    p0 = float(params[0] if product.act != "LeakyRelu" or product.params else 0.01)
    p1 = float(params[1])
    none = np.zeros(0, np.float32)
    stats["streamed"] += 1

    flat = ContiguousViews()
    last = [None]  # (a, z, out, threads, the loop's arguments) of the latest call

    def run(a, z, out):
        """out, or None in a forked child or for an output that is a strided view (the caller
        runs its primitive there)."""
        threads = max(1, capi.get_max_threads())  # as many as OpenMP's count for the plan (threads.py)
        numba_threads(threads)  # (per thread; another session may have set its own since)
        h = last[0]
        # A plan's replay passes the same arena buffers every run: the loop's arguments are
        # then those of the call before (each Python step skipped is ~1 us in a decode step,
        # whose caches the products keep emptying)
        if h is not None and h[0] is a and h[1] is z and h[2] is out and h[3] == threads and not _forked[0]:
            fn(*h[4])
            return out
        if _forked[0] or not out.flags.c_contiguous:
            return None
        args = (flat(0, a), w, k, flat(1, out), alpha, bias, none if z is None else flat(2, z), act, p0, p1, threads)
        fn(*args)
        # kept only where the arguments are views of the arrays (a copy would go stale)
        last[0] = (a, z, out, threads, args) if all(
            x is None or (x.flags.c_contiguous and x.dtype == np.float32) for x in (a, z)) else None
        return out

    return run


def stream_rows(w, product):
    """A function (a, out) -> out running a one-row `product` (matmul.py's _Product: its
    scale and bias; an activation is the caller's, applied after) whose weights `w` lie
    (N, K), C-contiguous, on the dot-product loop; None
    where the loop cannot run here (stats says why). Each row of W is read once, in order,
    one stream per thread: measured on the 2-core AVX-512 machine, 1 x 768 @ (50257 x 768)ᵀ
    (GPT-2's vocabulary projection over its tied embedding), medians of 60 calls in eight
    alternating processes (OpenBLAS pinned and not): this loop 3.5-4.9 ms, oneDNN's sgemm
    over the (768, 50257) copy 4.5-6.3, sgemm over the same rows 5.7-7.2; the loop was the
    fastest in every process."""
    why = why_not_here()
    if why is None and (product.trans_a or product.z_shape is not None):
        why = "a residual or A read transposed (the rows loop has neither)"
    if why:
        stats[why] += 1
        return None
    fn = compiled(_row_dots)
    alpha = np.float32(product.alpha)
    bias = np.zeros(0, np.float32) if product.bias is None else np.ascontiguousarray(product.bias, np.float32).reshape(-1)
    fn(np.zeros(w.shape[1], np.float32), w[:1], np.zeros(1, np.float32), alpha, bias[:1])  # compiled (or loaded) now
    stats["streamed"] += 1

    flat = ContiguousViews()

    def run(a, out):
        if _forked[0] or not out.flags.c_contiguous:
            return None
        numba_threads(capi.get_max_threads())  # as many as OpenMP's count for the plan (threads.py)
        fn(flat(0, a), w, flat(1, out), alpha, bias)
        return out

    return run
