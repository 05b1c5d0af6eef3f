"""Optional ops: their types when the optional's type is only known from the value.

At plan time a fed optional is typed by its value: a tensor or a sequence when present,
unknown (None) when empty, which onnx's own inference does not accept.
"""
from __future__ import annotations

import numpy as np

from ... import symbolic
from ...ir import MapType, OptionalType, SequenceType
from ..registry import meta


@meta("Optional")
def optional(ctx):
    t = ctx.type(0) if ctx.has(0) else None
    if isinstance(t, OptionalType):
        ctx.fail("the input of Optional must be a tensor or a sequence, not an optional")
    return [OptionalType(t if t is not None else ctx.attrs.get("type"))]


@meta("OptionalHasElement")
def optional_has_element(ctx):
    return [ctx.tensor(np.bool_, ())]


@meta("OptionalGetElement")
def optional_get_element(ctx):
    t = ctx.type(0)
    return [t.elem if isinstance(t, OptionalType) else t]


# ---------------------------------------------------------------- ai.onnx.ml
# onnx infers nothing for these (or a wrong [N, 0] for LinearClassifier on a [C] input);
# the rules mirror the cpu kernels in kernels/cpu/ml.py.

ML = "ai.onnx.ml"


def _batch(ctx):
    """N of a [N, C] input ([C] is one row), or None when the rank is unknown."""
    s = ctx.shape(0)
    if s is None:
        return None
    return 1 if len(s) < 2 else s[0]


@meta(["Scaler", "Normalizer"], domain=ML)
def ml_float_like(ctx):
    return [ctx.tensor(np.float32, ctx.shape(0))]


@meta("Imputer", domain=ML)
def ml_imputer(ctx):
    return [ctx.tensor(ctx.dtype(0), ctx.shape(0))]


@meta("LinearRegressor", domain=ML)
def ml_linear_regressor(ctx):
    n = _batch(ctx)
    return [ctx.tensor(np.float32, None if n is None else (n, int(ctx.attr("targets", 1))))]


@meta("LinearClassifier", domain=ML)
def ml_linear_classifier(ctx):
    n = _batch(ctx)
    strings = bool(ctx.attrs.get("classlabels_strings"))
    n_classes = len(ctx.attrs.get("classlabels_strings") or ctx.attrs.get("classlabels_ints") or [])
    s = ctx.shape(0)
    c = s[-1] if s else None
    coefs = len(ctx.attrs.get("coefficients") or [])
    rows = len(ctx.attrs["intercepts"]) if ctx.attrs.get("intercepts") else (
        coefs // c if isinstance(c, int) and c else None)
    if rows == 1 and n_classes == 2:
        rows = 2  # one score, written as [1 - p, p]
    label = ctx.tensor(object if strings else np.int64, None if n is None else (n,))
    scores = ctx.tensor(np.float32, None if n is None or rows is None else (n, rows))
    return [label, scores]


@meta("FeatureVectorizer", domain=ML)
def ml_feature_vectorizer(ctx):
    n = _batch(ctx)
    dims = ctx.attrs.get("inputdimensions") or []
    return [ctx.tensor(np.float32, None if n is None else (n, int(sum(dims))))]


def zipmap_labels(ctx):
    """ZipMap's class labels and their key dtype; exactly one of the two lists (as onnxruntime)."""
    ints, strings = ctx.attrs.get("classlabels_int64s"), ctx.attrs.get("classlabels_strings")
    if bool(ints) == bool(strings):
        ctx.fail("needs exactly one of classlabels_int64s and classlabels_strings, "
                 + ("got both" if ints else "got neither"))
    return (list(strings), np.dtype(object)) if strings else (list(ints), np.dtype(np.int64))


@meta("ZipMap", domain=ML)
def ml_zipmap(ctx):
    """seq(map(int64 or string, float)): one map per row of a [N, C] input ([C] is one row),
    C the number of class labels."""
    labels, key = zipmap_labels(ctx)
    ctx.dtype(0)  # a tensor (the schema's type check has made it float)
    s = ctx.shape(0)
    if s is not None:
        if len(s) not in (1, 2):
            ctx.fail(f"input 0 '{ctx.node.inputs[0]}' must be [N, C] or [C], got rank {len(s)} "
                     f"{symbolic.shape_str(s)}")
        if isinstance(s[-1], int) and s[-1] != len(labels):
            ctx.fail(f"input 0 '{ctx.node.inputs[0]}' has {s[-1]} columns (shape {symbolic.shape_str(s)}), "
                     f"but the node has {len(labels)} class labels: one score per class is expected")
    return [SequenceType(MapType(key, ctx.tensor(np.float32, ())))]
