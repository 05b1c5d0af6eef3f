"""ai.onnx.ml SVMClassifier and SVMRegressor, as onnxruntime computes them.

skl2onnx writes scikit-learn's SVC, NuSVC, SVR, NuSVR and OneClassSVM as these two ops
and checks them against onnxruntime, so where the spec is silent (which class a pairwise
score votes for, what a two-class model writes in its second score column, how the
Platt-scaled pairwise probabilities are coupled) the kernels do what onnxruntime's
svmclassifier.cc / svmregressor.cc do. An SVM's decision value is a sum of kernel values
times coefficients of both signs that largely cancel, so the float32 rounding of every
kernel value shows in the result (1.7e-3 on an SVR of scaled digits, summed in another
order); the kernels therefore also round as onnxruntime does, and agree with it to the
bit (tests/test_ml_svm.py):

  * the input is rounded to float32 first, whatever its type;
  * dot products (LINEAR, POLY, SIGMOID kernels; linear models; the SVR's sum of kernel
    values) are chains of float32 multiply-adds in MLAS's order: fused, in blocks of its K
    stride (or, for one row, its 8-lane M=1 kernel); RBF sums squared float32 differences
    in feature order; exp is C's expf, tanh and the LOGISTIC transform MLAS's rational
    approximations;
  * a pairwise decision value sums float32 products coefficient * kernel in float64,
    then is rounded to float32; its sign (in float64) is the vote;
  * probabilities: 1 - logistic(score * A + B) in float32, clipped to [1e-7, 1 - 1e-7],
    coupled by libsvm's `multiclass_probability` iteration (Wu, Lin and Weng 2004) in
    float32 in onnxruntime's order of operations: each row stops at its own iteration.

The exceptions: SOFTMAX over 5 or more score columns, where onnxruntime calls MLAS's
softmax (its own exp: 2e-7 apart), and MLAS's multi-threaded split of a product with more
than 128 features (a unit in the last place). The loops that set the order run compiled
by Numba (NumPy without it, same numbers); everything else is vectorized over the rows.
"""
from __future__ import annotations

import math

import numpy as np

from ..buffers import computed_aside
from ..registry import kernel
from .. import mlas_math
from ._jit import jit, numba_missing, use_compiled
from .ml import _rows

ML = "ai.onnx.ml"
F32 = np.float32
_KERNELS = ("LINEAR", "POLY", "RBF", "SIGMOID")
_POSTS = ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT")


def _floats(a, name):
    v = a.get(name)
    return np.asarray(v if v is not None else [], F32).reshape(-1)


def _expf(v):
    """exp in float32 as C's expf computes it (onnxruntime's std::exp on a float): Numba's
    float32 exp calls the same libm; without Numba, exp in float64 rounded to float32 (the
    correctly rounded value, which expf misses about once in a thousand). NumPy's own
    float32 exp is a unit in the last place off for about a third of arguments."""
    v = np.ascontiguousarray(v, F32)
    if numba_missing() is None:
        out = np.empty_like(v)
        _expf_jit(v.reshape(-1), out.reshape(-1))
        return out
    return np.exp(v.astype(np.float64)).astype(F32)


@jit(error_model="numpy")
def _expf_jit(v, out):
    for i in range(v.shape[0]):
        out[i] = math.exp(v[i])


_TILE = 1 << 15  # elements of a [rows, V] tile (NumPy fallbacks): stays in cache


def _squared_distances(x, vectors):
    """|x - v|^2 for every row and vector, [N, V] float32, summed as onnxruntime sums them:
    float32 differences squared and added in feature order. (The matmul form |x|^2 + |v|^2
    - 2 x.v, even in float64, rounds differently, and an SVR's cancelling sum of kernel
    values shows it: 2e-5 on scikit-learn's digits.)"""
    out = np.zeros((len(x), len(vectors)), F32)
    vt = np.ascontiguousarray(vectors.T)
    if numba_missing() is None:
        _squared_distances_jit(np.ascontiguousarray(x), vt, out)
        return out
    rows = max(1, _TILE // max(1, len(vectors)))  # NumPy: one feature at a time over a tile of rows
    tmp = np.empty((min(rows, len(x)), len(vectors)), F32)
    for r0 in range(0, len(x), rows):
        xs, acc = x[r0:r0 + rows], out[r0:r0 + rows]
        t = tmp[:len(xs)]
        for f in range(x.shape[1]):
            np.subtract(xs[:, f, None], vt[f], out=t)
            np.multiply(t, t, out=t)
            acc += t
    return out


@jit(error_model="numpy")
def _squared_distances_jit(x, vt, out):
    for n in range(x.shape[0]):
        for f in range(x.shape[1]):
            xv = x[n, f]
            for v in range(vt.shape[1]):
                d = xv - vt[f, v]
                out[n, v] += d * d


def _fma_matmul_nt(x, vectors):
    """x @ vectors.T in float32, each sum a chain of fused multiply-adds in feature order:
    what MLAS's sgemm kernels do within a block of K (checked against onnxruntime's Gemm
    for 1 to 200 rows and columns). A BLAS float32 product sums in another order, and the
    ulps it differs by show in an SVM's cancelling sums (1.7e-3 on an SVR of scaled digits)."""
    out = np.zeros((len(x), len(vectors)), F32)
    vt = np.ascontiguousarray(vectors.T)
    if numba_missing() is None:
        _fma_matmul_nt_jit(np.ascontiguousarray(x), vt, out)
        return out
    x64, vt64 = x.astype(np.float64), vt.astype(np.float64)
    rows = max(1, _TILE // max(1, len(vectors)))
    tmp = np.empty((min(rows, len(x)), len(vectors)), np.float64)
    for r0 in range(0, len(x), rows):
        xs, acc = x64[r0:r0 + rows], out[r0:r0 + rows]
        t = tmp[:len(xs)]
        for f in range(x.shape[1]):
            np.multiply(xs[:, f, None], vt64[f], out=t)
            t += acc
            acc[...] = t  # rounded to float32: one rounding of an exact product plus the sum
    return out


@jit(error_model="numpy")
def _fma_matmul_nt_jit(x, vt, out):
    for n in range(x.shape[0]):
        for f in range(x.shape[1]):
            xv = np.float64(x[n, f])
            for v in range(vt.shape[1]):
                # float32 * float32 is exact in float64: this rounds once, as an FMA does
                out[n, v] = np.float32(xv * np.float64(vt[f, v]) + np.float64(out[n, v]))


def _mlas_stride_k(n, k):
    """The K block MLAS's sgemm sums in one pass for an [M, K] x [K, n] product."""
    stride_n = stride_k = 128
    k = max(k, 1)
    if n >= k:
        while stride_k // 2 >= k:
            stride_n, stride_k = stride_n * 2, stride_k // 2
    else:
        while stride_n > 16 and stride_n // 2 >= n:
            stride_n, stride_k = stride_n // 2, stride_k * 2
    return stride_k


def _sgemm_m1(x, vectors, c):
    """One row, alpha 1: MLAS's AVX kernel for M=1 (MlasSgemmKernelM1TransposeBAvx). Each
    output sums its products (rounded, then added: no FMA) in 8 lanes, k mod 8, and adds
    the lanes in an order that depends on whether the column falls in a group of 4, 2 or
    1 of the columns."""
    n, k = len(vectors), x.shape[1]
    prods = np.zeros((n, -(-k // 8) * 8), F32)
    prods[:, :k] = vectors * x[0]
    lanes = np.add.reduce(prods.reshape(n, -1, 8), axis=1)  # in order along k, per lane
    lanes = [lanes[:, i] for i in range(8)]
    fours = ((lanes[0] + lanes[1]) + lanes[2]) + lanes[3] + (((lanes[4] + lanes[5]) + lanes[6]) + lanes[7])
    twos = ((lanes[0] + lanes[2]) + (lanes[4] + lanes[6])) + ((lanes[1] + lanes[3]) + (lanes[5] + lanes[7]))
    ones = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))
    col = np.arange(n)
    out = np.where(col < n // 4 * 4, fours, np.where((n % 4 >= 2) & (col < n // 4 * 4 + 2), twos, ones))
    return (out + c if c else out).reshape(1, n).astype(F32)


def _sgemm_nt(x, vectors, alpha, c):
    """alpha * x @ vectors.T + c in float32, as onnxruntime's Gemm (MLAS) computes it: the
    sum over features in blocks of MLAS's K stride, each block a chain of multiply-adds,
    folded into the output as block * alpha + output in one rounding. This is the order
    for one thread; where onnxruntime splits the columns over threads and there are more
    than 128 features, its blocks can differ (a unit in the last place of a kernel value)."""
    if len(x) == 1 and alpha == 1:
        return _sgemm_m1(x, vectors, c)
    k = x.shape[1]
    step = max(1, _mlas_stride_k(len(vectors), k))
    out = None if not c else np.full((len(x), len(vectors)), c, F32)
    for f0 in range(0, max(k, 1), step):
        block = _fma_matmul_nt(x[:, f0:f0 + step], vectors[:, f0:f0 + step])
        if out is None:
            out = block if alpha == 1 else block * alpha
        else:
            out = mlas_math.fma32(block, alpha, out)
    return out


class _KernelFn:
    """k(x, v) for every row x and support vector v: [N, V] float32."""

    def __init__(self, a, kind=None):
        kind = kind or a.get("kernel_type", "LINEAR")
        if kind not in _KERNELS:
            raise ValueError(f"unknown kernel_type {kind!r} (LINEAR, POLY, RBF or SIGMOID)")
        self.kind = kind
        params = _floats(a, "kernel_params")
        if params.size and params.size < 3:
            raise ValueError(f"kernel_params needs [gamma, coef0, degree], got {params.size} values")
        self.gamma, self.coef0, self.degree = (params[:3] if params.size else np.zeros(3, F32))

    def __call__(self, x, vectors, bias=F32(0)):
        """x [N, F] float32, vectors [V, F] float32. `bias` is added to a LINEAR kernel's
        values (the linear models' rho[0])."""
        if self.kind == "RBF":
            return _expf(-self.gamma * _squared_distances(x, vectors))
        if self.kind == "LINEAR":
            return _sgemm_nt(x, vectors, F32(1), bias)
        t = _sgemm_nt(x, vectors, self.gamma, self.coef0)
        if self.kind == "SIGMOID":
            return mlas_math.tanh(t)
        if self.degree == 2:
            return t * t
        if self.degree == 3:
            return t * t * t
        return np.power(t, self.degree)


# ---------------------------------------------------------------- score transforms (onnxruntime's)


def _logistic32(v):
    # 1 / (1 + exp(-|v|)), mirrored for negative v: no overflow, as onnxruntime's ComputeLogistic.
    with np.errstate(over="ignore"):
        e = F32(1) / (F32(1) + _expf(-np.abs(v)))
    return np.where(v < 0, F32(1) - e, e).astype(F32)


_PI_147 = F32(2) / (F32(np.pi) * F32(0.147))
_INV_147 = F32(1) / F32(0.147)


def _probit(v):
    """onnxruntime's ComputeProbit: sqrt(2) * erfinv(2v - 1) with Winitzki's closed form,
    in float32 and in its order of operations."""
    x = F32(2) * np.asarray(v, F32) - F32(1)
    sgn = np.where(x < 0, F32(-1), F32(1))
    with np.errstate(divide="ignore", invalid="ignore"):
        ln = np.log(((F32(1) - x) * (F32(1) + x)).astype(np.float64)).astype(F32)
        a = _PI_147 + F32(0.5) * ln
        return F32(np.sqrt(2)) * (sgn * np.sqrt(-a + np.sqrt(a * a - _INV_147 * ln)))


def _row_sums(e):
    """Sums along rows in column order, as onnxruntime's scalar loops add (NumPy sums 8 or
    more columns pairwise)."""
    total = np.zeros((e.shape[0], 1), F32)
    for j in range(e.shape[1]):
        total[:, 0] += e[:, j]
    return total


def _softmax32(s):
    # onnxruntime's ComputeSoftmax; from 5 columns on it calls MLAS's softmax, whose own exp
    # differs from this by up to 2 units in the last place.
    e = _expf(s - s.max(axis=1, keepdims=True))
    return e / _row_sums(e)


def _softmax_zero32(s):
    # Values within 1e-7 of zero are not exponentiated: they are scaled by exp(-max) instead.
    m = s.max(axis=1, keepdims=True)
    zero = (s <= F32(1e-7)) & (s >= F32(-1e-7))
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.where(zero, s * _expf(-m), _expf(s - m))
        return e / _row_sums(np.where(zero, F32(0), e))


def _transform_columns(s, post):
    """onnxruntime's batched_update_scores_inplace on [N, C] scores, C >= 2."""
    if post == "PROBIT":
        return _probit(s)
    if post == "LOGISTIC":
        return mlas_math.logistic(s)
    if post == "SOFTMAX":
        return _softmax32(s)
    if post == "SOFTMAX_ZERO":
        return _softmax_zero32(s)
    return s


def _check_post(post):
    if post not in _POSTS:
        raise ValueError(f"unknown post_transform {post!r} ({', '.join(_POSTS)})")
    return post


# ---------------------------------------------------------------- pairwise coupling


def multiclass_probability(r):
    """libsvm's pairwise coupling for every row at once: r [N, K, K] float32 with r[i, j] the
    probability of i against j; returns p [N, K] float32. Each row iterates (at most 100
    times) until its own stopping test passes, in onnxruntime's float32 order of operations.
    Once Numba is loaded, a compiled loop row by row (_coupling_rows: the same float32
    operations in the same order, so the same bits): this vectorized twin is a few dozen
    array calls an iteration, ~0.15 ms for one row of three classes, the loop ~2 us."""
    if use_compiled("SVMClassifier coupling"):
        p = np.empty(r.shape[:2], F32)
        _coupling_rows(np.ascontiguousarray(r, F32), p)
        return p
    n, k = r.shape[0], r.shape[1]
    q = np.zeros((n, k, k), F32)
    for i in range(k):
        for j in range(i):
            q[:, i, i] += r[:, j, i] * r[:, j, i]
            q[:, i, j] = q[:, j, i]
        for j in range(i + 1, k):
            q[:, i, i] += r[:, j, i] * r[:, j, i]
            q[:, i, j] = -r[:, j, i] * r[:, i, j]
    p = np.full((n, k), F32(1) / F32(k), F32)
    eps = F32(0.005) / F32(k)
    rows = np.arange(n)  # rows still iterating
    qa, pa = q, p.copy()
    with np.errstate(all="ignore"):
        for _ in range(100):
            if not rows.size:
                break
            prod = qa * pa[:, None, :]
            qp = prod[:, :, 0].copy()
            for j in range(1, k):  # summed in order, not pairwise: the stopping test sees the same rounding
                qp += prod[:, :, j]
            pqp = np.zeros(len(rows), F32)
            for i in range(k):
                pqp += pa[:, i] * qp[:, i]
            err = np.abs(qp - pqp[:, None])
            err[np.isnan(err)] = 0  # onnxruntime's `error > max_error` passes over NaN: a NaN row stops at once
            err = err.max(axis=1)
            done = err < eps
            if done.any():
                p[rows[done]] = pa[done]
                keep = ~done
                rows, qa, pa, qp, pqp = rows[keep], qa[keep], pa[keep], qp[keep], pqp[keep]
                if not rows.size:
                    break
            for i in range(k):
                qii = qa[:, i, i]
                diff = (-qp[:, i] + pqp) / qii
                pa[:, i] += diff
                one = F32(1) + diff
                pqp = (pqp + diff * (diff * qii + F32(2) * qp[:, i])) / one / one
                qp = (qp + diff[:, None] * qa[:, i, :]) / one[:, None]
                pa = pa / one[:, None]
        p[rows] = pa  # rows that used all 100 iterations
    return p


@jit(error_model="numpy")
def _coupling_rows(r, out):
    """multiclass_probability, one row at a time (float32 throughout, as its twin)."""
    n, k = r.shape[0], r.shape[1]
    one, two, zero = np.float32(1), np.float32(2), np.float32(0)
    eps = np.float32(0.005) / np.float32(k)
    q = np.zeros((k, k), np.float32)
    qp = np.zeros(k, np.float32)
    pa = np.zeros(k, np.float32)
    for row in range(n):
        rr = r[row]
        q[:, :] = zero
        for i in range(k):
            for j in range(i):
                q[i, i] += rr[j, i] * rr[j, i]
                q[i, j] = q[j, i]
            for j in range(i + 1, k):
                q[i, i] += rr[j, i] * rr[j, i]
                q[i, j] = -rr[j, i] * rr[i, j]
        for i in range(k):
            pa[i] = one / np.float32(k)
        for _ in range(100):
            for i in range(k):
                acc = q[i, 0] * pa[0]
                for j in range(1, k):
                    acc += q[i, j] * pa[j]
                qp[i] = acc
            pqp = zero
            for i in range(k):
                pqp += pa[i] * qp[i]
            err = zero
            for i in range(k):
                e = abs(qp[i] - pqp)
                if e != e:
                    e = zero  # (a NaN row stops at once, as onnxruntime's `error > max_error`)
                if e > err:
                    err = e
            if err < eps:
                break
            for i in range(k):
                qii = q[i, i]
                diff = (-qp[i] + pqp) / qii
                pa[i] += diff
                d1 = one + diff
                pqp = (pqp + diff * (diff * qii + two * qp[i])) / d1 / d1
                for j in range(k):
                    qp[j] = (qp[j] + diff * q[i, j]) / d1
                for j in range(k):
                    pa[j] = pa[j] / d1
        for i in range(k):
            out[row, i] = pa[i]


# ---------------------------------------------------------------- SVMClassifier


@jit(error_model="numpy")
def _decisions_jit(kv, take, coef, counts, rho, out):  # pragma: no cover - compiled
    """_SVMClassifier._decisions: per row and pair, the float32 products coefficient * kernel
    value added in table order into a float64 sum from 0, then rho (a 3-class RBF SVC over 64
    rows: 2,463 -> 420-586 us a run, its NumPy temporaries and np.add.accumulate gone)."""
    for r in range(kv.shape[0]):
        for p in range(take.shape[0]):
            acc = 0.0
            for q in range(1, 1 + counts[p]):
                acc += np.float64(np.float32(kv[r, take[p, q]] * coef[p, q]))
            out[r, p] = acc + rho[p]


_DECISION_CHUNK_BYTES = 8 << 20  # (temporaries of _SVMClassifier._decisions per chunk of rows)


class _SVMClassifier:
    def __init__(self, a):
        strings = bool(a.get("classlabels_strings"))
        if not strings and not a.get("classlabels_ints"):
            raise ValueError("SVMClassifier needs classlabels_strings or classlabels_ints")
        self.labels = np.array(list(a["classlabels_strings"]), dtype=object) if strings else \
            np.asarray(a["classlabels_ints"], np.int64)
        k = self.k = len(self.labels)
        self.post = _check_post(a.get("post_transform", "NONE"))
        self.coefs = _floats(a, "coefficients")
        self.rho = _floats(a, "rho")
        prob_a, prob_b = _floats(a, "prob_a"), _floats(a, "prob_b")
        if prob_a.size != prob_b.size:
            raise ValueError(f"prob_a has {prob_a.size} values and prob_b {prob_b.size}: they go in pairs")
        self.have_proba = prob_a.size > 0
        if not self.coefs.size:
            raise ValueError("SVMClassifier has no coefficients")
        per_class = [int(v) for v in (a.get("vectors_per_class") or [])]
        n_vectors = sum(per_class)
        self.n_pairs = k * (k - 1) // 2
        # Mixed-sign weights decide a linear two-class model's label differently (onnxruntime's ChooseClass).
        self.all_positive = bool((self.coefs >= 0).all())
        if n_vectors > 0:  # libsvm: support vectors, one-vs-one
            self.svc = True
            self.kernel = _KernelFn(a)
            if k < 2:
                raise ValueError(f"SVMClassifier with support vectors needs at least two classes, got {k}")
            if len(per_class) != k or min(per_class) < 0:
                raise ValueError(f"vectors_per_class {per_class} does not give a count for each of the {k} classes")
            sv = _floats(a, "support_vectors")
            if sv.size % n_vectors or not sv.size:
                raise ValueError(f"{sv.size} support_vectors values do not make {n_vectors} vectors")
            self.vectors = sv.reshape(n_vectors, -1)
            self.n_features = self.vectors.shape[1]
            if self.coefs.size < (k - 1) * n_vectors:
                raise ValueError(f"{self.coefs.size} coefficients for {k} classes and {n_vectors} support vectors "
                                 f"(needs {(k - 1) * n_vectors})")
            self.coefs = self.coefs[:(k - 1) * n_vectors].reshape(k - 1, n_vectors)
            if self.rho.size < self.n_pairs:
                raise ValueError(f"rho has {self.rho.size} values for {self.n_pairs} class pairs")
            if self.have_proba and prob_a.size < self.n_pairs:
                raise ValueError(f"prob_a and prob_b have {prob_a.size} values for {self.n_pairs} class pairs")
            start = np.concatenate([[0], np.cumsum(per_class)])
            # Pair (i, j): class i's vectors weighted by coefficient row j-1, class j's by row i.
            self.pairs = []
            for i in range(k):
                for j in range(i + 1, k):
                    si, sj = slice(start[i], start[i + 1]), slice(start[j], start[j + 1])
                    self.pairs.append((i, j, si, self.coefs[j - 1, si], sj, self.coefs[i, sj]))
            self.prob_a, self.prob_b = prob_a[:self.n_pairs], prob_b[:self.n_pairs]
            self._decision_tables()
        else:  # liblinear: one weight row per class, every score plus rho[0]
            self.svc = False
            self.kernel = _KernelFn(a, "LINEAR")
            if k < 1 or self.coefs.size % k:
                raise ValueError(f"{self.coefs.size} coefficients do not make one row per class for {k} classes")
            self.vectors = self.coefs.reshape(k, -1)
            self.n_features = self.vectors.shape[1]
            if not self.rho.size:
                raise ValueError("SVMClassifier needs rho")

    def _decision_tables(self):
        """Each pair's support vectors and coefficients as one row of a table (class i's
        then class j's, a leading 0 and trailing pads), for the decision values of every
        pair at once (_decisions), and the one-hot columns of each pair's two classes."""
        rows = [(np.r_[np.arange(si.start, si.stop), np.arange(sj.start, sj.stop)], np.r_[ci, cj])
                for _, _, si, ci, sj, cj in self.pairs]
        width = 1 + max(len(idx) for idx, _ in rows)
        self._take = np.zeros((self.n_pairs, width), np.intp)
        self._coef = np.zeros((self.n_pairs, width), F32)
        self._pad = np.ones((self.n_pairs, width), bool)
        for p, (idx, c) in enumerate(rows):
            self._take[p, 1:1 + len(idx)], self._coef[p, 1:1 + len(idx)], self._pad[p, 1:1 + len(idx)] = idx, c, False
        self._pad[:, 0] = False
        self._counts = np.array([len(idx) for idx, _ in rows], np.int64)
        self._rho64 = self.rho[:self.n_pairs].astype(np.float64)
        self._chunk_rows = max(1, _DECISION_CHUNK_BYTES // (24 * self._take.size))  # (rows _decisions takes at once)
        self._first = np.zeros((self.n_pairs, self.k), np.int64)
        self._second = np.zeros((self.n_pairs, self.k), np.int64)
        for p, (i, j, *_rest) in enumerate(self.pairs):
            self._first[p, i] = self._second[p, j] = 1
        self._pi = np.array([i for i, *_rest in self.pairs], np.intp)
        self._pj = np.array([j for _, j, *_rest in self.pairs], np.intp)

    def _decisions(self, kv):
        """Every pair's decision value [N, pairs] float64 as onnxruntime forms it: float32
        products of each coefficient and kernel value, added in order (class i's vectors,
        then class j's) into a float64 sum from 0, then rho. np.add.accumulate adds in that
        order (np.sum's pairwise order is another); the table's leading column is the 0 and
        its pads are -0.0, which leave any sum as it is. Rows a chunk at a time: the
        temporaries are ~24 bytes per row, pair and table column (a 10-class model's 45
        pairs of a few hundred vectors each: megabytes a row)."""
        if numba_missing() is None:  # (the same additions, one loop: no [N, pairs, vectors] temporaries)
            out = np.empty((kv.shape[0], self.n_pairs))
            _decisions_jit(np.ascontiguousarray(kv, F32), self._take, self._coef, self._counts, self._rho64, out)
            return out
        step = self._chunk_rows
        if kv.shape[0] > step:
            return np.concatenate([self._decisions(kv[lo:lo + step]) for lo in range(0, kv.shape[0], step)])
        prod = (kv[:, self._take] * self._coef).astype(np.float64)
        prod[:, self._pad] = -0.0
        prod[:, :, 0] = 0.0  # (the sum starts from +0, as onnxruntime's)
        return np.add.accumulate(prod, axis=2)[:, :, -1] + self._rho64

    def __call__(self, x):
        x = _rows(x).astype(F32)
        if x.shape[1] != self.n_features:
            raise ValueError(f"X has {x.shape[1]} features, the model {self.n_features}")
        if not self.svc:
            return self._linear(x)
        kv = self.kernel(x, self.vectors)
        n = len(x)
        decision = self._decisions(kv)
        win = (decision > 0).astype(np.int64)  # a positive decision value votes for the first class of the pair
        votes = win @ self._first + (1 - win) @ self._second
        label = self.labels[np.argmax(votes, axis=1)] if n else self.labels[:0]
        scores = decision.astype(F32)
        if self.have_proba:
            val = F32(1) - _logistic32(scores * self.prob_a + self.prob_b)
            val = np.minimum(np.maximum(val, F32(1e-7)), F32(1) - F32(1e-7))
            r = np.zeros((n, self.k, self.k), F32)
            r[:, self._pi, self._pj] = val
            r[:, self._pj, self._pi] = F32(1) - val
            return label, _transform_columns(multiclass_probability(r), self.post).astype(F32)
        if self.k > 2:
            return label, _transform_columns(scores, self.post).astype(F32)
        # Two classes, one decision value s: onnxruntime writes [-s, s] without a post
        # transform, [1 - p, p] with p = logistic(s) for LOGISTIC and p = s (untransformed)
        # for SOFTMAX and SOFTMAX_ZERO; PROBIT transforms s and leaves the second column
        # unwritten (0 here).
        s = scores[:, 0]
        if self.post == "NONE":
            z = np.stack([-s, s], axis=1)
        elif self.post == "PROBIT":
            z = np.stack([_probit(s), np.zeros_like(s)], axis=1)
        else:
            p = _logistic32(s) if self.post == "LOGISTIC" else s
            z = np.stack([F32(1) - p, p], axis=1)
        return label, z.astype(F32)

    def _linear(self, x):
        scores = self.kernel(x, self.vectors, bias=self.rho[0])
        n = len(x)
        if not n:
            return self.labels[:0], scores
        best = np.argmax(scores, axis=1)
        label = self.labels[best]
        if self.k == 2 and not self.have_proba:
            top = scores[np.arange(n), best]
            second = top >= 0.5 if self.all_positive else top > 0
            label = np.where(second, self.labels[1], label).astype(self.labels.dtype)
        if self.k >= 2:
            scores = _transform_columns(scores, self.post)
        elif self.post == "PROBIT":
            scores = _probit(scores)
        return label, scores.astype(F32)


@kernel("SVMClassifier", out=True, domain=ML, dtypes=[np.float32, np.float64, np.int64, np.int32], multi=True,
        bind=True)
@computed_aside(bind=True)
def svm_classifier(ctx):
    """One-vs-one SVM (or a linear model), label and scores as onnxruntime computes them."""
    return _SVMClassifier(ctx.attrs).__call__


# ---------------------------------------------------------------- SVMRegressor

@kernel("SVMRegressor", out=True, domain=ML, dtypes=[np.float32, np.float64, np.int64, np.int32], bind=True)
@computed_aside(bind=True)
def svm_regressor(ctx):
    """SVR / one-class SVM: [N, 1] float32. As in onnxruntime, post_transform changes
    nothing."""
    a = ctx.attrs
    coefs, rho = _floats(a, "coefficients"), _floats(a, "rho")
    if not coefs.size:
        raise ValueError("SVMRegressor has no coefficients")
    if not rho.size:
        raise ValueError("SVMRegressor needs rho")
    n_supports = int(a.get("n_supports", 0) or 0)
    one_class = bool(a.get("one_class", 0))
    if n_supports > 0:
        kfn = _KernelFn(a)
        sv = _floats(a, "support_vectors")
        if sv.size % n_supports or not sv.size:
            raise ValueError(f"{sv.size} support_vectors values do not make {n_supports} vectors")
        if coefs.size < n_supports:
            raise ValueError(f"{coefs.size} coefficients for {n_supports} support vectors")
        vectors = sv.reshape(n_supports, -1)
        weights = coefs[:n_supports].reshape(1, -1)
    else:
        kfn, vectors = None, coefs.reshape(1, -1)
        weights = vectors
    n_features = vectors.shape[1]

    def step(x):
        x = _rows(x).astype(F32)
        if x.shape[1] != n_features:
            raise ValueError(f"X has {x.shape[1]} features, the model {n_features}")
        # onnxruntime: Gemm(kernel values, coefficients) + rho[0], or the linear kernel with rho[0]
        y = _sgemm_nt(kfn(x, vectors) if n_supports > 0 else x, weights, F32(1), rho[0])[:, 0]
        if one_class:
            y = np.where(y > 0, F32(1), F32(-1))
        return y.reshape(-1, 1).astype(F32)

    return step

