"""ai.onnx.ml operators: encoders, scalers, linear models and tree ensembles.

Where the spec leaves details open (binary classifiers, scores of classes no tree voted
for, post transforms), the kernels follow onnxruntime, which is what models exported by
skl2onnx and friends are validated against.
"""
from __future__ import annotations

import re

import numpy as np

from ... import dtypes
from ..registry import kernel
from ..buffers import computed_aside
from ._jit import jit, use_compiled
from ._util import PerShape
from .norm import softmax

ML = "ai.onnx.ml"
STRING = dtypes.STRING
NUMBERS = [np.float32, np.float64, np.int64, np.int32]


def _rows(x):
    """A 2-D [N, C] view: a 1-D input is one row."""
    if x.ndim == 1:
        return x.reshape(1, -1)
    if x.ndim != 2:
        raise ValueError(f"expected a [N, C] tensor, got shape {list(x.shape)}")
    return x


# ---------------------------------------------------------------- post transforms (onnxruntime's)


def _logistic(v):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-v))


def _logistic_to_float32(v):
    """_logistic of float64 scores whose caller casts the result to float32 (a linear
    classifier's): e^-v with -v at most 709, as e^709.79 overflows float64 with a warning
    that an errstate would cost ~1 us a call to hide. Beyond that 1 / (1 + e^-v) is below
    1.2e-308, 0 in float32 as _logistic's 0 is; the same bits everywhere else, NaN
    included. In place: four NumPy calls."""
    if not (isinstance(v, np.ndarray) and v.dtype == np.float64):
        return _logistic(v)
    t = np.minimum(-v, 709.0)
    np.exp(t, out=t)
    t += 1.0
    return np.reciprocal(t, out=t)


def _probit(v):
    # sqrt(2) * erfinv(2v - 1), with the same closed-form erfinv approximation
    # (Winitzki, a = 0.147) as onnxruntime and onnx's reference.
    # Computed in float32 like onnxruntime: near 0 and 1 the result is steep.
    f = np.float32
    x = f(2) * np.asarray(v, f) - f(1)
    sgn = np.where(x < 0, f(-1), f(1))
    with np.errstate(divide="ignore", invalid="ignore"):
        ln = np.log((f(1) - x) * (f(1) + x))
        a = f(2 / (np.pi * 0.147)) + f(0.5) * ln
        return f(np.sqrt(2)) * sgn * np.sqrt(-a + np.sqrt(a * a - ln / f(0.147)))


def _softmax(s):
    return softmax(s, axis=1)


def _softmax_zero(s):
    # Scores that are exactly (nearly) zero stay zero.
    zero = np.abs(s) <= 1e-7
    e = np.where(zero, 0.0, np.exp(s - s.max(axis=1, keepdims=True)))
    with np.errstate(invalid="ignore", divide="ignore"):
        return e / e.sum(axis=1, keepdims=True)


_TRANSFORMS = {"NONE": lambda s: s, "LOGISTIC": _logistic, "SOFTMAX": _softmax,
               "SOFTMAX_ZERO": _softmax_zero, "PROBIT": _probit}
_TRANSFORM_CODES = ["NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT"]  # TreeEnsemble's ints


def _transform(name):
    if name not in _TRANSFORMS:
        raise ValueError(f"unknown post_transform {name!r}")
    return _TRANSFORMS[name]


def _scores_transform(s, post_transform):
    """Scores [N, K] after the post transform, for K >= 2 (or a regression target per column)."""
    if s.shape[1] == 1 and post_transform in ("SOFTMAX", "SOFTMAX_ZERO"):
        return s  # onnxruntime leaves a single score as is
    return _transform(post_transform)(s)


# ---------------------------------------------------------------- simple transformers


@kernel("Binarizer", out=True, domain=ML, dtypes=NUMBERS)
@computed_aside
def binarizer(x, *, threshold=0.0):
    return (x > threshold).astype(x.dtype)


@kernel("Scaler", out=True, domain=ML, dtypes=NUMBERS, bind=True, attrs=["offset", "scale"])
@computed_aside(bind=True)
def scaler(ctx):
    # (both given: the meta refuses a Scaler without either, as onnxruntime does)
    off = np.asarray(ctx.attrs["offset"], np.float32)
    sc = np.asarray(ctx.attrs["scale"], np.float32)

    def step(x):
        c = x.shape[-1] if x.ndim else 1
        for name, v in (("offset", off), ("scale", sc)):
            if v.size not in (1, c):
                raise ValueError(f"Scaler {name} has {v.size} values for {c} features")
        y = x.astype(np.float32)
        y -= off
        y *= sc
        return y

    return step


@kernel("Normalizer", out=True, domain=ML, dtypes=NUMBERS, bind=True, attrs=["norm"])
@computed_aside(bind=True)
def normalizer(ctx):
    norm = ctx.attrs.get("norm", "MAX")
    if norm not in ("MAX", "L1", "L2"):
        raise ValueError(f"unknown norm {norm!r} (MAX, L1 or L2)")

    def step(x):
        r = _rows(x).astype(np.float32)
        if norm == "MAX":
            d = r.max(axis=1, keepdims=True)
        elif norm == "L1":
            d = np.abs(r).sum(axis=1, keepdims=True)
        else:
            d = np.sqrt((r * r).sum(axis=1, keepdims=True))
        if not d.all():  # a zero norm leaves the row as it is
            d[d == 0] = 1
        with np.errstate(invalid="ignore", divide="ignore"):  # (an inf or a NaN in a row: NaNs, quietly)
            np.divide(r, d, out=r)
        return r.reshape(x.shape)

    return step


@kernel("Imputer", out=True, domain=ML, dtypes=NUMBERS)
@computed_aside
def imputer(x, *, imputed_value_floats=None, imputed_value_int64s=None, replaced_value_float=0.0,
            replaced_value_int64=0):
    if x.dtype.kind == "f":
        values, replaced = imputed_value_floats, replaced_value_float
    else:
        values, replaced = imputed_value_int64s, replaced_value_int64
    if not values:
        raise ValueError(f"Imputer has no imputed values for a {dtypes.name(x.dtype)} input")
    values = np.asarray(values).astype(x.dtype)
    c = x.shape[-1] if x.ndim else 1
    if values.size not in (1, c):
        raise ValueError(f"Imputer has {values.size} imputed values for {c} features")
    missing = np.isnan(x) if x.dtype.kind == "f" and np.isnan(replaced) else x == x.dtype.type(replaced)
    return np.where(missing, values, x).astype(x.dtype)


@kernel("ArrayFeatureExtractor", out=True, domain=ML, dtypes=NUMBERS + [STRING], bind=True, attrs=[])
@computed_aside(bind=True)
def array_feature_extractor(ctx):
    const = ctx.const(1)
    fixed = None if const is None else np.asarray(const).reshape(-1).astype(np.int64)
    checked = set()  # last-axis sizes the constant indices were checked against

    def step(x, indices):
        n = x.shape[-1]
        idx = fixed
        if idx is None or n not in checked:
            idx = indices.reshape(-1) if idx is None else idx
            if idx.size == 1:  # (a classifier's label for one row: no reductions for one index)
                if not 0 <= int(idx[0]) < n:
                    raise IndexError(f"index {int(idx[0])} is out of range for the last axis of size {n}")
            elif not idx.size:  # (onnxruntime refuses it too)
                raise ValueError("no indices to extract")
            elif idx.min() < 0 or idx.max() >= n:
                raise IndexError(f"index {idx[(idx < 0) | (idx >= n)][0]} is out of range for the last axis of size {n}")
            if fixed is not None:
                checked.add(n)
        y = x.take(idx, axis=-1)
        return y.reshape(1, -1) if x.ndim == 1 else y

    return step


@kernel("FeatureVectorizer", out=True, domain=ML, dtypes=NUMBERS)
@computed_aside
def feature_vectorizer(*xs, inputdimensions=None):
    dims = list(inputdimensions or [])
    if len(dims) != len(xs):
        raise ValueError(f"FeatureVectorizer has {len(dims)} inputdimensions for {len(xs)} inputs")
    rows = [x.reshape(1, -1) if x.ndim < 2 else x.reshape(x.shape[0], -1) for x in xs]  # [C] is [1, C]
    n = rows[0].shape[0]
    if any(r.shape[0] != n for r in rows):
        raise ValueError(f"inputs have different batch sizes {[r.shape[0] for r in rows]}")
    y = np.zeros((n, sum(dims)), np.float32)
    at = 0
    for r, d in zip(rows, dims):
        k = min(d, r.shape[1])  # longer inputs are cut, shorter ones padded with zeros
        y[:, at:at + k] = r[:, :k]
        at += d
    return y


@kernel("OneHotEncoder", out=True, domain=ML, dtypes=NUMBERS + [STRING], bind=True)
@computed_aside(bind=True)
def one_hot_encoder(ctx):
    strings = ctx.dtype(0) == STRING
    cats = ctx.attrs.get("cats_strings") if strings else ctx.attrs.get("cats_int64s")
    if not cats:
        raise ValueError(f"OneHotEncoder needs {'cats_strings' if strings else 'cats_int64s'} for this input")
    zeros = int(ctx.attrs.get("zeros", 1))
    index = {c: i for i, c in enumerate(cats)}
    ordered = np.asarray(sorted(index), dtype=np.int64) if not strings else None
    column = np.asarray([index[c] for c in sorted(index)], np.int64) if not strings else None

    def step(x):
        if strings:
            pos = np.array([index.get(v, -1) for v in x.reshape(-1)], np.int64).reshape(x.shape)
        else:
            v = x.astype(np.int64)  # floats are truncated to integer categories
            k = np.clip(np.searchsorted(ordered, v), 0, len(ordered) - 1)
            pos = np.where(ordered[k] == v, column[k], -1)
        if not zeros and (pos < 0).any():
            raise ValueError(f"value {x.reshape(-1)[np.flatnonzero(pos.reshape(-1) < 0)[0]]!r} is not a category "
                             f"and zeros=0")
        return ((pos[..., None] == np.arange(len(cats))) & (pos[..., None] >= 0)).astype(np.float32)

    return step


# ---------------------------------------------------------------- LabelEncoder


def _lookup_table(keys, values, default, key_dtype):
    """A function mapping an array of keys to values (default for the unknown ones)."""
    values = np.asarray(values)
    if key_dtype == STRING:
        table = dict(zip(keys, values.tolist()))
        out_dtype = values.dtype if values.dtype != object and values.dtype.kind != "U" else object
        default = default.item() if isinstance(default, np.generic) else default

        def by_dict(x):
            out = np.array([table.get(k, default) for k in x.reshape(-1)], dtype=out_dtype)
            return out.reshape(x.shape)

        return by_dict
    k = np.asarray(keys).astype(key_dtype)
    # The last of duplicate keys wins, as in a dict; NaN keys are matched separately.
    nan_value = None
    if k.dtype.kind == "f" and np.isnan(k).any():
        nan_value = values[np.flatnonzero(np.isnan(k))[-1]]
        keep = ~np.isnan(k)
        k, values = k[keep], values[keep]
    uk, first = np.unique(k[::-1], return_index=True)
    uv = values[::-1][first]
    out_dtype = object if uv.dtype.kind == "U" else uv.dtype

    def by_search(x):
        out = np.empty(x.shape, dtype=out_dtype)
        out[...] = default
        if uk.size:
            pos = np.clip(np.searchsorted(uk, x), 0, uk.size - 1)
            hit = uk[pos] == x
            out[hit] = uv[pos[hit]]
        if nan_value is not None:
            out[np.isnan(x)] = nan_value
        return out

    return by_search


@kernel("LabelEncoder", out=True, domain=ML, versions=(1, 1), dtypes=[STRING, np.int64], bind=True,
        name="label_encoder_v1")
@computed_aside(bind=True)
def label_encoder_v1(ctx):
    """Opset 1: strings → their index in classes_strings, int64 → the class string."""
    classes = list(ctx.attrs.get("classes_strings") or [])
    if ctx.dtype(0) == STRING:
        return _lookup_table(classes, np.arange(len(classes), dtype=np.int64),
                             np.int64(ctx.attrs.get("default_int64", -1)), STRING)
    return _lookup_table(np.arange(len(classes)), np.array(classes, dtype=object),
                         ctx.attrs.get("default_string", "_Unused"), np.dtype(np.int64))


@kernel("LabelEncoder", out=True, domain=ML, versions=(2, None), bind=True)
@computed_aside(bind=True)
def label_encoder(ctx):
    a = ctx.attrs
    key_dtype = ctx.dtype(0)

    def first(*names):
        for n in names:
            v = a.get(n)
            if v is not None:
                return n, v
        return None, None

    kname, keys = first("keys_tensor", "keys_strings", "keys_int64s", "keys_floats")
    vname, values = first("values_tensor", "values_strings", "values_int64s", "values_floats")
    if keys is None or values is None:
        raise ValueError("LabelEncoder needs keys_* and values_* attributes")
    keys = np.asarray(keys).reshape(-1).tolist() if kname == "keys_tensor" else list(keys)
    if vname == "values_tensor":
        vt = np.asarray(values)
        values = vt.reshape(-1)
        out_dtype = vt.dtype
        d = a.get("default_tensor")
        if d is not None:
            default = np.asarray(d).reshape(-1)[0]
        elif out_dtype == object:
            default = "_Unused"
        elif out_dtype.kind == "f":
            default = -0.0
        else:
            default = -1
        default = default if out_dtype == object else np.asarray(default).astype(out_dtype)
    elif vname == "values_strings":
        values, out_dtype = np.array(values, dtype=object), np.dtype(object)
        default = a.get("default_string", "_Unused")
    elif vname == "values_int64s":
        values, out_dtype = np.asarray(values, np.int64), np.dtype(np.int64)
        default = np.int64(a.get("default_int64", -1))
    else:
        values, out_dtype = np.asarray(values, np.float32), np.dtype(np.float32)
        default = np.float32(a.get("default_float", -0.0))
    if len(keys) != len(values):
        raise ValueError(f"LabelEncoder has {len(keys)} keys but {len(values)} values")
    if out_dtype == object:
        values = np.array(list(values), dtype=object)
    fn = _lookup_table(keys, values, default, key_dtype if key_dtype is not None else np.dtype(np.float32))

    def step(x):
        y = fn(x)
        return y if y.dtype == out_dtype else y.astype(out_dtype)

    return step


# ---------------------------------------------------------------- linear models


def _coefs(coefficients, n_out, c):
    w = np.asarray(coefficients, np.float64)
    if w.size != n_out * c:
        raise ValueError(f"{w.size} coefficients do not make {n_out} rows of {c} features")
    return w.reshape(n_out, c)


@kernel("LinearRegressor", out=True, domain=ML, dtypes=NUMBERS, bind=True,
        attrs=["coefficients", "intercepts", "targets", "post_transform"])
@computed_aside(bind=True)
def linear_regressor(ctx):
    a = ctx.attrs
    coefficients, targets = a.get("coefficients"), int(a.get("targets", 1))
    post_transform = a.get("post_transform", "NONE")
    intercepts = np.asarray(a["intercepts"], np.float64) if a.get("intercepts") else None
    if targets < 1 or (intercepts is not None and intercepts.size != targets):
        raise ValueError(f"{0 if intercepts is None else intercepts.size} intercepts for {targets} targets: "
                         "one per target (or none), at least one target")
    # onnxruntime transforms a single target only with PROBIT
    transform = None if targets == 1 and post_transform != "PROBIT" else _transform(post_transform)
    weights = PerShape(lambda c: np.ascontiguousarray(_coefs(coefficients, targets, c).T))

    def step(x):
        r = _rows(x).astype(np.float64)
        y = r @ weights(r.shape[1])
        if intercepts is not None:
            y += intercepts
        return (y if transform is None else transform(y)).astype(np.float32)

    return step


@kernel("LinearClassifier", out=True, domain=ML, dtypes=NUMBERS, multi=True, bind=True,
        attrs=["coefficients", "intercepts", "classlabels_ints", "classlabels_strings", "multi_class",
               "post_transform"])
@computed_aside(bind=True)
def linear_classifier(ctx):
    a = ctx.attrs
    strings = a.get("classlabels_strings")
    labels = strings if strings else a.get("classlabels_ints")
    if not labels:
        raise ValueError("LinearClassifier needs classlabels_ints or classlabels_strings")
    labels_arr = np.array(labels, dtype=object if strings else np.int64)
    n_classes = len(labels)
    coefs = np.asarray(a.get("coefficients") or [], np.float64).ravel()
    intercepts = a.get("intercepts")
    b = np.asarray(intercepts, np.float64) if intercepts else None
    post_transform = a.get("post_transform", "NONE")
    _transform(post_transform)  # (an unknown one is refused here, not at the first run)

    def rows_of(c):
        # As onnxruntime (and the meta): one score row per intercept, the coefficients read as
        # [rows, C] from their start. onnxruntime's own logreg_iris.onnx has 12 coefficients
        # for 3 intercepts over its declared 2 features; onnxruntime uses the first 6.
        n_rows = len(intercepts) if intercepts else coefs.size // max(c, 1)
        if coefs.size < n_rows * c:
            raise ValueError(f"{coefs.size} coefficients do not make {n_rows} rows (one per intercept) of {c} features")
        if n_rows == 1 and n_classes != 2:
            raise ValueError(f"one row of coefficients (a binary classifier) for {n_classes} class labels")
        if not intercepts and (n_rows == 0 or coefs.size % max(c, 1)):
            raise ValueError(f"{coefs.size} coefficients do not make whole rows of {c} features (no intercepts "
                             f"say how many rows)")
        return np.ascontiguousarray(coefs[:n_rows * c].reshape(n_rows, c).T)

    weights = PerShape(rows_of)
    one_score = {"LOGISTIC": _logistic, "PROBIT": _probit}.get(post_transform, lambda v: v)
    transform = _logistic_to_float32 if post_transform == "LOGISTIC" else _transform(post_transform)

    def step(x):
        r = _rows(x).astype(np.float64)
        s = r @ weights(r.shape[1])
        if b is not None:
            s += b
        if s.shape[1] == 1:
            # One score per row: the positive class when it is > 0 (onnxruntime).
            pos = s[:, 0] > 0
            if n_classes == 2:
                # [1 - p, p] with p the (transformed) score of the positive class, as onnxruntime writes it.
                label = np.where(pos, labels_arr[1], labels_arr[0])
                p = one_score(s[:, 0])
                z = np.stack([1 - p, p], axis=1)
            else:
                label = np.where(pos, 1, 0).astype(labels_arr.dtype) if not strings else \
                    np.where(pos, "1", "0").astype(object)
                z = _scores_transform(s, post_transform)
        else:
            label = labels_arr[s.argmax(axis=1)]
            z = transform(s)
        return np.asarray(label, dtype=labels_arr.dtype), z.astype(np.float32)

    return step


# ---------------------------------------------------------------- tree ensembles

_LEQ, _LT, _GTE, _GT, _EQ, _NEQ, _MEMBER = range(7)
_OLD_MODES = {"BRANCH_LEQ": _LEQ, "BRANCH_LT": _LT, "BRANCH_GTE": _GTE, "BRANCH_GT": _GT, "BRANCH_EQ": _EQ,
              "BRANCH_NEQ": _NEQ}
_COMPARE = [np.less_equal, np.less, np.greater_equal, np.greater, np.equal, np.not_equal]


class _Forest:
    """Decision trees flattened into arrays, evaluated for all (row, tree) pairs at once.

    Internal nodes are 0..n_nodes-1; a child index >= n_nodes is leaf (index - n_nodes).
    Each step of `leaves` moves every pair still on an internal node one level down,
    so a batch costs about (tree depth) vectorized steps.
    """

    def __init__(self, feature, threshold, mode, missing_true, true_next, false_next, roots, members=None):
        self.feature = np.asarray(feature, np.int64)
        self.threshold = np.asarray(threshold, np.float64)
        self.mode = np.asarray(mode, np.int64)
        self.missing_true = np.asarray(missing_true, bool)
        self.true_next = np.asarray(true_next, np.int64)
        self.false_next = np.asarray(false_next, np.int64)
        self.roots = np.asarray(roots, np.int64)
        self.n_nodes = len(self.feature)
        for name, v in (("thresholds", self.threshold), ("modes", self.mode), ("missing flags", self.missing_true),
                        ("true children", self.true_next), ("false children", self.false_next)):
            if len(v) != self.n_nodes:
                raise ValueError(f"{len(v)} {name} for {self.n_nodes} branch nodes")
        if self.n_nodes and self.feature.min() < 0:
            raise ValueError(f"a node reads feature {self.feature.min()}")
        self.modes = sorted(set(self.mode.tolist()))
        self.any_missing = bool(self.missing_true.any())
        self.max_feature = int(self.feature.max()) if self.n_nodes else -1  # (checked against X every run)
        # Set membership: one boolean row per MEMBER node over all member values.
        self.member_row = np.full(self.n_nodes, -1, np.int64)
        if members:
            self.values = np.unique(np.concatenate([np.asarray(sorted(s), np.float64) for s in members.values()]))
            if not self.values.size:  # every set empty: one value nothing equals (NaN), in no set
                self.values = np.array([np.nan])
            self.member = np.zeros((len(members), len(self.values)), bool)
            for r, (node, s) in enumerate(members.items()):
                self.member_row[node] = r
                self.member[r, np.searchsorted(self.values, sorted(s))] = True

    def leaves(self, x):
        """Leaf index reached in every tree: [N, n_trees]."""
        x = np.asarray(x, np.float64)
        n, t = x.shape[0], len(self.roots)
        if x.shape[1] <= self.max_feature:
            raise ValueError(f"the trees read feature {self.max_feature} but X has {x.shape[1]} features")
        cur = np.tile(self.roots, n)
        row = np.repeat(np.arange(n), t)
        act = np.flatnonzero(cur < self.n_nodes)
        for _ in range(self.n_nodes + 1):
            if not act.size:
                return (cur - self.n_nodes).reshape(n, t)
            nd = cur[act]
            v = x[row[act], self.feature[nd]]
            cur[act] = np.where(self._go_true(v, nd), self.true_next[nd], self.false_next[nd])
            act = act[cur[act] < self.n_nodes]
        raise ValueError("the tree ensemble has a cycle")

    def _go_true(self, v, nd):
        th = self.threshold[nd]
        if len(self.modes) == 1 and self.modes[0] != _MEMBER:
            go = _COMPARE[self.modes[0]](v, th)
        else:
            m = self.mode[nd]
            go = np.zeros(len(nd), bool)
            for code in self.modes:
                sel = m == code
                if code == _MEMBER:
                    go[sel] = self._is_member(v[sel], nd[sel])
                else:
                    go[sel] = _COMPARE[code](v[sel], th[sel])
        if self.any_missing:
            go |= self.missing_true[nd] & np.isnan(v)
        return go

    def _is_member(self, v, nd):
        pos = np.clip(np.searchsorted(self.values, v), 0, len(self.values) - 1)
        return (self.values[pos] == v) & self.member[self.member_row[nd], pos]


class _Ensemble:
    """A forest plus what each leaf adds to which output column, and the aggregation."""

    def __init__(self, forest, n_leaves, n_out, leaf, column, weight, aggregate="SUM"):
        self.forest, self.n_out, self.aggregate = forest, n_out, aggregate
        self._walk_kept = False  # (_walk: not made yet)
        leaf, column = np.asarray(leaf, np.int64), np.asarray(column, np.int64)
        weight = np.asarray(weight, np.float64)
        if column.size and (column.min() < 0 or column.max() >= n_out):
            raise ValueError(f"a leaf targets column {column.max()} of {n_out}")
        # every root and child is a branch node or a leaf of this ensemble, every weight a
        # leaf's: the compiled pass (_forest_sums) indexes with them unchecked
        reach = forest.n_nodes + n_leaves
        for name, v in (("a tree root", forest.roots), ("a node's true child", forest.true_next),
                        ("a node's false child", forest.false_next)):
            if v.size and (v.min() < 0 or v.max() >= reach):
                raise ValueError(f"{name} is node {v.max() if v.max() >= reach else v.min()}, of "
                                 f"{forest.n_nodes} branch nodes and {n_leaves} leaves")
        if leaf.size and (leaf.min() < 0 or leaf.max() >= n_leaves):
            raise ValueError(f"a weight is for leaf {leaf.max()} of {n_leaves}")
        self.has = np.zeros((n_leaves, n_out), bool)
        self.has[leaf, column] = True
        if aggregate in ("SUM", "AVERAGE"):
            self.w = np.zeros((n_leaves, n_out))
            np.add.at(self.w, (leaf, column), weight)
        elif aggregate in ("MIN", "MAX"):
            self.w = np.full((n_leaves, n_out), np.inf if aggregate == "MIN" else -np.inf)
            (np.minimum if aggregate == "MIN" else np.maximum).at(self.w, (leaf, column), weight)
        else:
            raise ValueError(f"unknown aggregate_function {aggregate!r}")

    def scores(self, x):
        """(scores [N, n_out], has [N, n_out]): aggregated leaf values, and which columns got any."""
        if self.aggregate in ("SUM", "AVERAGE") and use_compiled("TreeEnsemble"):
            return self._compiled_scores(x)
        lv = self.forest.leaves(x)
        n, t = lv.shape
        has = np.zeros((n, self.n_out), bool)
        if self.aggregate in ("SUM", "AVERAGE"):
            s = np.zeros((n, self.n_out))
            for j in range(t):  # one tree at a time keeps memory at [N, n_out]
                s += self.w[lv[:, j]]
                has |= self.has[lv[:, j]]
            if self.aggregate == "AVERAGE" and t:
                s /= t
        else:
            pick = np.minimum if self.aggregate == "MIN" else np.maximum
            s = np.full((n, self.n_out), np.inf if self.aggregate == "MIN" else -np.inf)
            for j in range(t):
                s = pick(s, self.w[lv[:, j]])
                has |= self.has[lv[:, j]]
            s = np.where(has, s, 0.0)  # a column no tree voted for scores 0
        return s, has


    def _compiled_scores(self, x):
        """scores' sums in one compiled pass: each row down each tree, its leaf's row added, in
        tree order from 0 (the same additions as the NumPy loop, so the same bits). The NumPy
        loop is a few dozen array calls a tree level and two a tree: a 100-tree forest's one
        row took ~0.4 ms, onnxruntime's ~10 us."""
        f = self.forest
        x = np.ascontiguousarray(x, np.float64)
        n, t = x.shape[0], len(f.roots)
        if x.shape[1] <= f.max_feature:
            raise ValueError(f"the trees read feature {f.max_feature} but X has {x.shape[1]} features")
        s, has = np.zeros((n, self.n_out)), np.zeros((n, self.n_out), bool)
        walk = self._walk()
        if walk is not None:
            records, threshold, depth = walk
            _forest_sums_interleaved(x, f.roots, depth, records, threshold, f.modes[0], f.any_missing, f.n_nodes,
                                     self.w, self.has, s, has)
        else:
            values, member = (f.values, f.member) if hasattr(f, "values") else (_NO_VALUES, _NO_MEMBER)
            if not _forest_sums(x, f.roots, f.feature, f.threshold, f.mode, f.missing_true, f.true_next,
                                f.false_next, f.member_row, values, member, self.w, self.has, s, has):
                raise ValueError("the tree ensemble has a cycle")
        if self.aggregate == "AVERAGE" and t:
            s /= t
        return s, has

    def _walk(self):
        """What _forest_sums_interleaved walks, made on first use: (records, thresholds, each
        tree's depth), or None where it does not apply (_interleaved_walk)."""
        if self._walk_kept is False:
            self._walk_kept = _interleaved_walk(self.forest)
        return self._walk_kept


_INTERLEAVE_FROM = 4096  # branch nodes from which the walks are interleaved (see _interleaved_walk)


def _interleaved_walk(f):
    """The interleaved walk pays where a forest's nodes do not all stay in the caches, so
    that each walk waits on memory: it overlaps those waits. A forest small enough to stay
    there (a few hundred nodes of shallow boosted trees) walks faster row by row on the
    general pass (compiled pass alone, min of 5, us: 100 trees of 8 levels, 6,625 nodes, 64
    rows 202 -> 161-169; 100 trees of 10 levels, 19,261 nodes, 575 -> 250; 100 trees of 3
    levels, 698 nodes, 112 -> 124 interleaved). None where it does not apply: nodes of more
    than one comparison or set membership, a small forest, a tree that cycles (the general
    pass reports it)."""
    if len(f.modes) != 1 or f.modes[0] == _MEMBER or f.n_nodes < _INTERLEAVE_FROM \
            or max(f.n_nodes, f.max_feature) >= 2 ** 31 - 2 ** 30:
        return None
    n_leaves = max(int(f.true_next.max(initial=-1)), int(f.false_next.max(initial=-1)), int(f.roots.max(initial=-1)),
                   f.n_nodes - 1) + 1 - f.n_nodes
    # a node's integers in one 16-byte record (its feature, the missing-value flag, its false
    # and true children), then one record per leaf whose children are itself: a row that has
    # reached its leaf stays there for the rest of the walk (its threshold NaN, no flag)
    leaf_ids = np.arange(f.n_nodes, f.n_nodes + n_leaves)
    records = np.empty((f.n_nodes + n_leaves, 4), np.int32)
    records[:f.n_nodes] = np.stack([f.feature, f.missing_true.astype(np.int64), f.false_next, f.true_next], axis=1)
    records[f.n_nodes:] = np.stack([np.zeros(n_leaves, np.int64), np.zeros(n_leaves, np.int64), leaf_ids, leaf_ids],
                                   axis=1)
    threshold = np.concatenate([f.threshold, np.full(n_leaves, np.nan)])
    depth, acyclic = _tree_depths(f.roots, records, f.n_nodes)
    return (records, threshold, depth) if acyclic else None


_NO_VALUES, _NO_MEMBER = np.zeros(1), np.zeros((1, 1), bool)


@jit(error_model="numpy")
def _tree_depths(roots, records, n_nodes):  # pragma: no cover - compiled
    """(each tree's depth, the branch nodes on its longest path; False where a tree cycles):
    one depth-first pass over the nodes, each node's depth worked out once however many
    paths reach it (trees may share nodes)."""
    state = np.zeros(n_nodes, np.int8)  # 0 not reached, 1 on the current path, 2 done
    below = np.zeros(n_nodes, np.int64)
    stack = np.empty(2 * n_nodes + 1, np.int64)  # (a node is pushed at most once per parent)
    out = np.zeros(roots.shape[0], np.int64)
    for t in range(roots.shape[0]):
        root = roots[t]
        if root >= n_nodes:
            continue
        stack[0] = root
        top = 1
        while top:
            nd = stack[top - 1]
            if state[nd] == 0:
                state[nd] = 1
                for j in range(2, 4):
                    c = records[nd, j]
                    if c < n_nodes:
                        if state[c] == 1:
                            return out, False
                        if state[c] == 0:
                            stack[top] = c
                            top += 1
            else:
                top -= 1
                if state[nd] == 1:
                    d = 0
                    for j in range(2, 4):
                        c = records[nd, j]
                        if c < n_nodes:
                            d = max(d, below[c])
                    below[nd] = d + 1
                    state[nd] = 2
        out[t] = below[root]
    return out, True


@jit(error_model="numpy")
def _compare(m, v, th):  # pragma: no cover - compiled
    """Whether a value goes a branch node's true way: its mode's comparison (_LEQ ... _NEQ)."""
    if m == 0:
        return v <= th
    if m == 1:
        return v < th
    if m == 2:
        return v >= th
    if m == 3:
        return v > th
    if m == 4:
        return v == th
    return v != th


_GROUP = 8  # (row, tree) walks interleaved: independent chains of loads the CPU overlaps


@jit(error_model="numpy")
def _forest_sums_interleaved(x, roots, depth, records, threshold, mode, missing, n_nodes, w, w_has, s,
                             has):  # pragma: no cover - compiled
    """_forest_sums where every node compares alike (scikit-learn's, LightGBM's and XGBoost's
    trees): the (tree, row) pairs in order, tree by tree, walked _GROUP at a time, one level
    of all of them per step, the child picked by index. One walk is a chain of dependent
    loads (the node, the feature's value, the child) that a branch on the data stalls; eight
    at once keep the CPU's loads busy (100 trees of depth 10 over 64 rows: 11 -> ~4 ns a node).
    Each s[r, c] adds its trees' leaves in tree order: the same bits as _forest_sums."""
    n = x.shape[0]
    n_out = w.shape[1]
    n_trees = roots.shape[0]
    nd = np.empty(_GROUP, np.int64)
    row = np.empty(_GROUP, np.int64)
    t = r = 0  # the next pair (counted on, not divided out: a shallow tree's walk is a few loads)
    while t < n_trees and n:
        count = levels = 0
        while count < _GROUP and t < n_trees:
            row[count] = r
            nd[count] = roots[t]
            levels = max(levels, depth[t])
            count += 1
            r += 1
            if r == n:
                r = 0
                t += 1
        for _ in range(levels):
            for g in range(count):
                k = nd[g]
                v = x[row[g], records[k, 0]]
                go = _compare(mode, v, threshold[k])
                if missing:
                    go |= records[k, 1] == 1 and v != v
                nd[g] = records[k, 2 + go]
        for g in range(count):
            leaf = nd[g] - n_nodes
            at = row[g]
            for c in range(n_out):
                s[at, c] += w[leaf, c]
                if w_has[leaf, c]:
                    has[at, c] = True


@jit(error_model="numpy")
def _forest_sums(x, roots, feature, threshold, mode, missing_true, true_next, false_next, member_row, values,
                 member, w, w_has, s, has):
    """_Ensemble.scores for SUM / AVERAGE (before the division): False where a tree cycles."""
    n_nodes = feature.shape[0]
    n_out = w.shape[1]
    for r in range(x.shape[0]):
        for t in range(roots.shape[0]):
            nd = roots[t]
            steps = 0
            while nd < n_nodes:
                steps += 1
                if steps > n_nodes:
                    return False
                v = x[r, feature[nd]]
                m = mode[nd]
                if m == _MEMBER:
                    pos = min(np.searchsorted(values, v), values.shape[0] - 1)
                    go = values[pos] == v and member[member_row[nd], pos]
                else:
                    go = _compare(m, v, threshold[nd])
                if v != v and missing_true[nd]:
                    go = True
                nd = true_next[nd] if go else false_next[nd]
            leaf = nd - n_nodes
            for c in range(n_out):
                s[r, c] += w[leaf, c]
                if w_has[leaf, c]:
                    has[r, c] = True
    return True


def _old_forest(a):
    """TreeEnsembleRegressor/Classifier attributes → a _Forest, a leaf index per (tree, node)."""
    tree_ids = list(a["nodes_treeids"])
    node_ids = list(a["nodes_nodeids"])
    modes = list(a["nodes_modes"])
    values = a.get("nodes_values_as_tensor")
    values = np.asarray(values).reshape(-1) if values is not None else np.asarray(a.get("nodes_values") or
                                                                                   [0.0] * len(tree_ids), np.float32)
    n = len(tree_ids)
    for name in ("nodes_nodeids", "nodes_modes", "nodes_featureids", "nodes_truenodeids", "nodes_falsenodeids"):
        if len(a.get(name) or []) != n:
            raise ValueError(f"{name} has {len(a.get(name) or [])} entries for {n} nodes")
    missing = list(a.get("nodes_missing_value_tracks_true") or [0] * n)
    if len(values) != n or len(missing) != n:
        raise ValueError(f"{len(values)} node values and {len(missing)} missing-value flags for {n} nodes")
    if len(set(zip(tree_ids, node_ids))) != n:
        raise ValueError("two nodes have the same tree and node id")
    is_leaf = np.array([m == "LEAF" for m in modes])
    for m in modes:
        if m != "LEAF" and m not in _OLD_MODES:
            raise ValueError(f"unknown node mode {m!r}")
    internal = np.flatnonzero(~is_leaf)
    leaves = np.flatnonzero(is_leaf)
    slot = np.empty(n, np.int64)
    slot[internal] = np.arange(len(internal))
    slot[leaves] = len(internal) + np.arange(len(leaves))
    where = {(t, i): k for k, (t, i) in enumerate(zip(tree_ids, node_ids))}

    def child(k, ids):
        key = (tree_ids[k], ids[k])
        if key not in where:
            raise ValueError(f"node {node_ids[k]} of tree {tree_ids[k]} points to missing node {ids[k]}")
        return slot[where[key]]

    tn, fn = a["nodes_truenodeids"], a["nodes_falsenodeids"]
    roots, seen = [], set()
    for k, t in enumerate(tree_ids):  # a tree's root is its first node
        if t not in seen:
            seen.add(t)
            roots.append((t, slot[k]))
    roots = [r for _, r in sorted(roots)]
    forest = _Forest([a["nodes_featureids"][k] for k in internal], values[internal].astype(np.float64),
                     [_OLD_MODES[modes[k]] for k in internal], [missing[k] for k in internal],
                     [child(k, tn) for k in internal], [child(k, fn) for k in internal], roots)
    leaf_of = {(tree_ids[k], node_ids[k]): j for j, k in enumerate(leaves)}
    return forest, len(leaves), leaf_of


def _old_leaf_weights(a, prefix, leaf_of):
    tids, nids = a.get(f"{prefix}_treeids") or [], a.get(f"{prefix}_nodeids") or []
    w = a.get(f"{prefix}_weights_as_tensor")
    w = np.asarray(w).reshape(-1) if w is not None else np.asarray(a.get(f"{prefix}_weights") or [], np.float32)
    ids = a.get(f"{prefix}_ids") or []
    if not len(tids) == len(nids) == len(ids) == len(w):  # (one entry each per weight: none broadcast)
        raise ValueError(f"{prefix}_treeids, {prefix}_nodeids, {prefix}_ids and {prefix}_weights have "
                         f"{len(tids)}, {len(nids)}, {len(ids)} and {len(w)} entries: one each per weight")
    leaf = []
    for t, i in zip(tids, nids):
        if (t, i) not in leaf_of:
            raise ValueError(f"{prefix} weight for node {i} of tree {t}, which is not a leaf")
        leaf.append(leaf_of[(t, i)])
    return leaf, w.astype(np.float64)


def _base_values(a):
    b = a.get("base_values_as_tensor")
    b = np.asarray(b).reshape(-1) if b is not None else np.asarray(a.get("base_values") or [], np.float32)
    return b.astype(np.float64)


@kernel("TreeEnsembleRegressor", out=True, domain=ML, dtypes=NUMBERS, bind=True)
@computed_aside(bind=True)
def tree_ensemble_regressor(ctx):
    a = ctx.attrs
    forest, n_leaves, leaf_of = _old_forest(a)
    leaf, w = _old_leaf_weights(a, "target", leaf_of)
    n_targets = int(a["n_targets"])  # (at least 1: the meta's check)
    ens = _Ensemble(forest, n_leaves, n_targets, leaf, a.get("target_ids") or [], w, a.get("aggregate_function", "SUM"))
    base = _base_values(a)
    if base.size not in (0, n_targets):
        raise ValueError(f"{base.size} base_values for {n_targets} targets")
    post = a.get("post_transform", "NONE")
    _transform(post)

    def step(x):
        s, has = ens.scores(_rows(x))
        if base.size:
            s = s + np.where(has, base, 0.0)  # onnxruntime: a target no tree voted for stays 0
        if n_targets == 1 and post != "PROBIT":
            return s.astype(np.float32)  # onnxruntime transforms a single target only with PROBIT
        return _scores_transform(s, post).astype(np.float32)

    return step


@kernel("TreeEnsembleClassifier", out=True, domain=ML, dtypes=NUMBERS, multi=True, bind=True)
@computed_aside(bind=True)
def tree_ensemble_classifier(ctx):
    a = ctx.attrs
    strings = a.get("classlabels_strings") is not None
    labels = np.array(a["classlabels_strings"], dtype=object) if strings else \
        np.asarray(a.get("classlabels_int64s") or [], np.int64)
    n_classes = len(labels)
    if n_classes < 2:
        raise ValueError("TreeEnsembleClassifier needs at least two class labels")
    forest, n_leaves, leaf_of = _old_forest(a)
    leaf, w = _old_leaf_weights(a, "class", leaf_of)
    class_ids = list(a.get("class_ids") or [])
    ens = _Ensemble(forest, n_leaves, n_classes, leaf, class_ids, w, "SUM")
    base = _base_values(a)
    if base.size not in (0, n_classes) and not (n_classes == 2 and base.size == 1):
        raise ValueError(f"{base.size} base_values for {n_classes} classes")
    post = a.get("post_transform", "NONE")
    transform = _logistic_to_float32 if post == "LOGISTIC" else _transform(post)  # (scores of 3+ columns)
    binary = n_classes == 2 and len(set(class_ids)) == 1
    all_positive = bool((w >= 0).all())

    def step(x):
        s, has = ens.scores(_rows(x))
        if n_classes > 2:
            if base.size:  # (one per class: every class has a score then)
                s += base
                label = labels[s.argmax(axis=1)]
            else:  # a class no tree voted for is never the label
                label = labels[np.where(has, s, -np.inf).argmax(axis=1)]
            return label, transform(s).astype(np.float32)
        return _binary_classifier(s, has, base, labels, binary, all_positive, post)

    return step


def _binary_classifier(s, has, base, labels, binary, all_positive, post):
    """Two classes, the way onnxruntime decides them (TreeAggregatorClassifier)."""
    s0, s1 = s[:, 0].copy(), s[:, 1].copy()
    h0, h1 = has[:, 0], has[:, 1]
    add_second = np.full(len(s), -1)
    # Base values are only added to classes some tree voted for (onnxruntime 1.2x+).
    if base.size == 2:
        s1 = np.where(h1, base[1] + s0, s1)
        s0 = np.where(h1, -s1, np.where(h0, s0 + base[0], s0))
    elif base.size == 1:
        s0 = np.where(h0, s0 + base[0], s0)
    else:
        add_second[:] = 3
    single = ~h1 if base.size != 2 else np.zeros(len(s), bool)  # only one score: the second is derived
    pos_w = np.where(h1, s1, np.where(h0, s0, 0.0))
    if binary:
        positive = pos_w > 0.5 if all_positive else pos_w > 0
        add_second[:] = np.where(positive, 0, 1) if all_positive else np.where(positive, 2, 3)
    else:
        positive = pos_w > 0
    label = np.where(positive, labels[1], labels[0]).astype(labels.dtype)
    z = _scores_transform(np.stack([s0, s1], axis=1), post)
    if single.any():
        one = s0[single]
        add = add_second[single]
        if post == "PROBIT":
            zs = np.stack([_probit(one), np.zeros_like(one)], axis=1)
        else:
            zs = np.stack([one, np.zeros_like(one)], axis=1)  # no second class: as written
            flip = (add == 0) | (add == 1)
            p = _logistic(one[flip]) if post == "LOGISTIC" else one[flip]
            zs[flip] = np.stack([1 - p, p], axis=1)
            neg = (add == 2) | (add == 3)
            zs[neg] = (np.stack([_logistic(-one[neg]), _logistic(one[neg])], axis=1) if post == "LOGISTIC"
                       else np.stack([-one[neg], one[neg]], axis=1))
        z[single] = zs
    return label, z.astype(np.float32)


@kernel("TreeEnsemble", out=True, domain=ML, versions=(5, None), dtypes=[np.float32, np.float64, np.float16], bind=True)
@computed_aside(bind=True)
def tree_ensemble(ctx):
    a = ctx.attrs
    splits = np.asarray(a["nodes_splits"]).reshape(-1).astype(np.float64)
    modes = np.asarray(a["nodes_modes"]).reshape(-1).astype(np.int64)
    n = len(splits)
    feature = list(a["nodes_featureids"])
    tn, fn = np.asarray(a["nodes_truenodeids"], np.int64), np.asarray(a["nodes_falsenodeids"], np.int64)
    tl, fl = np.asarray(a["nodes_trueleafs"], bool), np.asarray(a["nodes_falseleafs"], bool)
    for name, v in (("nodes_modes", modes), ("nodes_featureids", feature), ("nodes_truenodeids", tn),
                    ("nodes_falsenodeids", fn), ("nodes_trueleafs", tl), ("nodes_falseleafs", fl)):
        if len(v) != n:
            raise ValueError(f"{name} has {len(v)} entries for {n} nodes")
    if ((modes < 0) | (modes > _MEMBER)).any():
        raise ValueError(f"unknown node mode {modes[(modes < 0) | (modes > _MEMBER)][0]}")
    missing = a.get("nodes_missing_value_tracks_true")
    missing = np.zeros(n, bool) if missing is None else np.asarray(missing, bool)
    # Members of each MEMBER node's set, in node order, NaN-separated.
    members = {}
    if (modes == _MEMBER).any():
        mv = a.get("membership_values")
        if mv is None:
            raise ValueError("MEMBER nodes need membership_values")
        groups, cur = [], []
        for v in np.asarray(mv, np.float64).reshape(-1):
            if np.isnan(v):
                groups.append(cur)
                cur = []
            else:
                cur.append(v)
        if cur:
            groups.append(cur)
        member_nodes = np.flatnonzero(modes == _MEMBER)
        if len(groups) < len(member_nodes):
            raise ValueError(f"membership_values has {len(groups)} sets for {len(member_nodes)} MEMBER nodes")
        members = {int(k): set(g) for k, g in zip(member_nodes, groups)}
    weights = np.asarray(a["leaf_weights"]).reshape(-1).astype(np.float64)
    targets = list(a["leaf_targetids"])
    roots = np.asarray(a["tree_roots"], np.int64).reshape(-1)
    if len(targets) != len(weights):
        raise ValueError(f"leaf_targetids has {len(targets)} entries for {len(weights)} leaf_weights")
    # a root is a node; a child is a node (< n) or, flagged a leaf, a weight (< len(weights))
    for name, ids, leafs in (("tree_roots", roots, np.zeros(len(roots), bool)), ("nodes_truenodeids", tn, tl),
                             ("nodes_falsenodeids", fn, fl)):
        bound = np.where(leafs, len(weights), n)
        bad = (ids < 0) | (ids >= bound)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{name}[{k}] is {int(ids[k])}, not a {'leaf' if leafs[k] else 'node'} of the "
                             f"{int(bound[k])} there are")
    forest = _Forest(feature, splits, modes, missing, np.where(tl, n + tn, tn), np.where(fl, n + fn, fn),
                     list(roots), members)
    agg_code, post_code = int(a.get("aggregate_function", 1)), int(a.get("post_transform", 0))
    if not 0 <= agg_code <= 3 or not 0 <= post_code < len(_TRANSFORM_CODES):
        raise ValueError(f"aggregate_function {agg_code} (0-3) or post_transform {post_code} "
                         f"(0-{len(_TRANSFORM_CODES) - 1}) is not one of the spec's")
    agg = ["AVERAGE", "SUM", "MIN", "MAX"][agg_code]
    n_targets = int(a["n_targets"])  # (at least 1: the meta's check)
    ens = _Ensemble(forest, len(weights), n_targets, np.arange(len(weights)), targets, weights, agg)
    post = _TRANSFORM_CODES[post_code]

    def step(x):
        s, _ = ens.scores(_rows(x))
        if n_targets == 1 and post != "PROBIT":
            return s.astype(x.dtype)
        return _scores_transform(s, post).astype(x.dtype)

    return step


# ---------------------------------------------------------------- ZipMap


@kernel("ZipMap", domain=ML, dtypes=[np.float32], bind=True, attrs=["classlabels_int64s", "classlabels_strings"])
def zip_map(ctx):
    """A list of dicts, one per row, label -> score; keys Python ints or strs and values
    Python floats, as onnxruntime returns them (the float32 scores widened exactly, keys in
    onnxruntime's order)."""
    ints, strings = ctx.attrs.get("classlabels_int64s"), ctx.attrs.get("classlabels_strings")
    if bool(ints) == bool(strings):
        raise ValueError("ZipMap needs exactly one of classlabels_int64s and classlabels_strings")
    keys = [str(k) for k in strings] if strings else [int(k) for k in ints]
    # onnxruntime builds each map as a std::map: keys in sorted order (strings by their UTF-8
    # bytes, which is code point order), a repeated label keeping its last column.
    last = {k: i for i, k in enumerate(keys)}
    order = sorted(last)
    columns = [last[k] for k in order]
    in_order = columns == list(range(len(keys)))

    def step(x):
        if x.ndim not in (1, 2):
            raise ValueError(f"ZipMap takes a [N, C] or [C] tensor, got shape {list(x.shape)}")
        r = x.reshape(1, -1) if x.ndim == 1 else x
        if r.shape[1] != len(keys):
            raise ValueError(f"the input has {r.shape[1]} columns (shape {list(x.shape)}) for {len(keys)} class "
                             "labels: one score per class is expected")
        return [dict(zip(order, row)) for row in (r if in_order else r[:, columns]).tolist()]

    return step


# ---------------------------------------------------------------- maps: CastMap, DictVectorizer; CategoryMapper


@kernel("CategoryMapper", out=True, domain=ML, dtypes=[STRING, np.int64], bind=True)
@computed_aside(bind=True)
def category_mapper(ctx):
    """strings → int64 by cats_strings/cats_int64s, or back; unknown values get the default.
    A repeated category keeps its last pairing (onnxruntime fills its hash maps in order)."""
    strings = list(ctx.attrs.get("cats_strings") or [])
    ints = [int(v) for v in ctx.attrs.get("cats_int64s") or []]
    if len(strings) != len(ints) or not strings:
        raise ValueError(f"CategoryMapper has {len(strings)} cats_strings and {len(ints)} cats_int64s: "
                         "one pairing each, at least one")
    if ctx.dtype(0) == STRING:
        fn = _lookup_table(strings, np.asarray(ints, np.int64), np.int64(ctx.attrs.get("default_int64", -1)), STRING)
        out_dtype = np.dtype(np.int64)
    else:
        fn = _lookup_table(ints, np.array(strings, dtype=object), ctx.attrs.get("default_string", "_Unused"),
                           np.dtype(np.int64))
        out_dtype = np.dtype(object)

    def step(x):
        y = fn(x)
        return y if y.dtype == out_dtype else y.astype(out_dtype)

    return step


def _map_value_dtype(ctx):
    """The dtype of the values of input 0, a map (from the graph's declared types)."""
    t = ctx.input_types[0] if ctx.input_types else None
    v = getattr(t, "value", None)
    return getattr(v, "dtype", None)


def _stof(s):
    """C++'s std::stof: a float at the start of the string (leading spaces skipped, the
    rest ignored); no number there, or one beyond float's range, is an error."""
    m = _FLOAT_PREFIX.match(s)
    if not m:
        raise ValueError(f"CastMap: {s!r} does not start with a number (TO_FLOAT)")
    text = m.group(1)
    v = float.fromhex(text) if "x" in text.lower() else float(text)
    with np.errstate(over="ignore"):
        f = np.float32(v)
    if np.isinf(f) and not np.isinf(v) or (v != 0 and f == 0):
        raise ValueError(f"CastMap: {s!r} is out of the range of float (TO_FLOAT)")
    return f


def _stoll(s):
    """C++'s std::stoll: a base-10 integer at the start of the string."""
    m = _INT_PREFIX.match(s)
    if not m:
        raise ValueError(f"CastMap: {s!r} does not start with an integer (TO_INT64)")
    v = int(m.group(1))
    if not -2 ** 63 <= v < 2 ** 63:
        raise ValueError(f"CastMap: {s!r} is out of the range of int64 (TO_INT64)")
    return v


def _to_string(v):
    """C++'s std::to_string(float): printf's %f of the value widened to double."""
    v = float(np.float32(v))
    if np.isnan(v):
        return "-nan" if np.signbit(v) else "nan"
    return "%f" % v


# What strtof reads: a decimal or hexadecimal float, inf/infinity or nan, after white space.
_FLOAT_PREFIX = re.compile(r"[ \t\n\v\f\r]*([+-]?(?:0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?\d+)?"
                           r"|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan))", re.IGNORECASE)
_INT_PREFIX = re.compile(r"[ \t\n\v\f\r]*([+-]?\d+)")


@kernel("CastMap", domain=ML, bind=True)
@computed_aside(bind=True)
def cast_map(ctx):
    """map(int64, string or float) → a [1, C] tensor of its values in key order (DENSE), or
    one column per key 0..max_map-1 with missing keys padded (SPARSE: 0, or the string
    "0.f", as onnxruntime pads), converted as C++ converts them (std::stof, std::stoll,
    std::to_string, truncation)."""
    cast_to = ctx.attrs.get("cast_to", "TO_FLOAT")
    form = ctx.attrs.get("map_form", "DENSE")
    max_map = int(ctx.attrs.get("max_map", 1))
    if cast_to not in ("TO_FLOAT", "TO_STRING", "TO_INT64"):
        raise ValueError(f"unknown cast_to {cast_to!r} (TO_FLOAT, TO_STRING or TO_INT64)")
    if form not in ("DENSE", "SPARSE"):
        raise ValueError(f"unknown map_form {form!r} (DENSE or SPARSE)")
    if form == "SPARSE" and max_map <= 0:
        raise ValueError(f"max_map must be > 0 when map_form is SPARSE, got {max_map}")
    out_dtype = {"TO_FLOAT": np.dtype(np.float32), "TO_INT64": np.dtype(np.int64), "TO_STRING": np.dtype(object)}[cast_to]
    pad = {"TO_FLOAT": np.float32(0), "TO_INT64": 0, "TO_STRING": "0.f"}[cast_to]

    def convert(values):
        if not values:
            return np.empty(0, out_dtype)
        strings = isinstance(values[0], str)
        if strings and any(not isinstance(v, str) for v in values) or not strings and any(
                isinstance(v, str) for v in values):
            raise TypeError("CastMap: the map's values must be all strings or all numbers")
        if cast_to == "TO_STRING":
            return np.array(values if strings else [_to_string(v) for v in values], dtype=object)
        if strings:
            conv = _stof if cast_to == "TO_FLOAT" else _stoll
            return np.array([conv(v) for v in values], out_dtype)
        f = np.asarray(values, np.float32)  # the map holds float32 values
        if cast_to == "TO_FLOAT":
            return f
        with np.errstate(invalid="ignore"):
            return f.astype(np.int64)  # truncation; NaN and out-of-range values as x86 converts them

    def step(x):
        if not isinstance(x, dict):
            raise TypeError(f"CastMap takes a map (dict), got {type(x).__name__}")
        keys = sorted(x)
        if form == "DENSE":
            return convert([x[k] for k in keys]).reshape(1, -1)
        if keys and keys[0] < 0:
            raise ValueError(f"CastMap: negative keys are not permitted in a SPARSE map; the first is {keys[0]}")
        keep = [k for k in keys if k < max_map]
        y = np.empty(max_map, out_dtype)
        y[...] = pad
        if keep:
            y[np.asarray(keep, np.int64)] = convert([x[k] for k in keep])
        return y.reshape(1, -1)

    return step


@kernel("DictVectorizer", domain=ML, bind=True)
@computed_aside(bind=True)
def dict_vectorizer(ctx):
    """A map → a [1, V] tensor: the value of each vocabulary key, zero (an empty string for
    string values) where the map lacks it; the vocabulary of the map's key type
    (string_vocabulary or int64_vocabulary). As onnxruntime: one map, not a sequence."""
    svocab, ivocab = ctx.attrs.get("string_vocabulary"), ctx.attrs.get("int64_vocabulary")
    t = ctx.input_types[0] if ctx.input_types else None
    key = getattr(t, "key", None)
    strings_key = key == np.dtype(object) if key is not None else bool(svocab)
    vocab = list(svocab or []) if strings_key else [int(v) for v in ivocab or []]
    if strings_key and not svocab or not strings_key and not ivocab:
        raise ValueError(f"DictVectorizer on {'string' if strings_key else 'int64'} keys needs "
                         f"{'string_vocabulary' if strings_key else 'int64_vocabulary'}")
    declared = _map_value_dtype(ctx)
    out_t = ctx.output_types[0] if ctx.output_types else None
    declared = declared if declared is not None else getattr(out_t, "dtype", None)

    def step(x):
        if not isinstance(x, dict):
            raise TypeError(f"DictVectorizer takes a map (dict), got {type(x).__name__}")
        dt = declared
        if dt is None:  # undeclared: as the values are
            some = next(iter(x.values()), 0.0)
            dt = np.dtype(object) if isinstance(some, str) else np.dtype(np.int64) if isinstance(
                some, (int, np.integer)) else np.dtype(np.float32)
        zero = "" if dt == object else 0
        vals = [x.get(k, zero) for k in vocab]
        if dt == object:
            y = np.array(vals, dtype=object)
        else:
            y = np.asarray(vals, dt)
        return y.reshape(1, -1)

    return step
