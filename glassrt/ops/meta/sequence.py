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
    if not ctx.has(0) and ctx.attrs.get("type") is None:
        ctx.fail("an Optional with no input needs its type attribute (the type of the empty optional)")
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
    # (here, not only in the kernel: an empty input's output is known without running it)
    if ctx.node.op_type == "Scaler" and (not ctx.attrs.get("offset") or not ctx.attrs.get("scale")):
        ctx.fail("Scaler needs both offset and scale")
    return [ctx.tensor(np.float32, ctx.shape(0))]


@meta("Imputer", domain=ML)
def ml_imputer(ctx):
    return [ctx.tensor(ctx.dtype(0), ctx.shape(0))]


@meta("LinearRegressor", domain=ML)
def ml_linear_regressor(ctx):
    n, targets = _batch(ctx), int(ctx.attr("targets", 1))
    if targets < 1:
        ctx.fail(f"targets is {targets}: at least one")
    return [ctx.tensor(np.float32, None if n is None else (n, targets))]


@meta(["TreeEnsembleRegressor", "TreeEnsemble"], domain=ML)
def ml_tree_ensemble_regressor(ctx):
    """onnx's rule, once n_targets is at least 1 (an output of no columns is known without
    running the node: its kernel, which checks the trees, would never be asked)."""
    n_targets = int(ctx.attr("n_targets", 1))
    if n_targets < 1:
        ctx.fail(f"n_targets is {n_targets}: at least one")
    from ..onnx_meta import onnx_meta

    return onnx_meta(ctx)


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


@meta("ArrayFeatureExtractor", domain=ML)
def ml_array_feature_extractor(ctx):
    """X's dims but the last, then one per index (X of one dim: [1, indices]), as the kernel's
    X.take(indices, axis=-1) writes it; onnx infers the type alone."""
    x, i = ctx.shape(0), ctx.shape(1)
    if not x or i is None or not all(isinstance(d, int) for d in i):
        return [ctx.tensor(ctx.dtype(0), None)]
    k = int(np.prod(i, dtype=np.int64))
    return [ctx.tensor(ctx.dtype(0), (1, k) if len(x) == 1 else (*x[:-1], k))]


@meta("TreeEnsembleClassifier", domain=ML)
def ml_tree_ensemble_classifier(ctx):
    """label [N] and scores [N, classes], as the kernel writes them (two classes: [1 - p, p]
    or the two scores); onnx infers their types alone, and a plan whose output shapes are
    unknown binds the step at every run."""
    n = _batch(ctx)
    strings = ctx.attrs.get("classlabels_strings") is not None
    k = len(ctx.attrs.get("classlabels_strings") if strings else ctx.attrs.get("classlabels_int64s") or [])
    label = ctx.tensor(object if strings else np.int64, None if n is None else (n,))
    # (fewer than two labels: the kernel refuses the node when it binds)
    scores = ctx.tensor(np.float32, None if n is None or k < 2 else (n, k))
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


@meta("SVMClassifier", domain=ML)
def ml_svm_classifier(ctx):
    """label [N]; scores [N, C]: C the classes, except a one-vs-one model without
    probabilities, which writes its pairwise decision values (K(K-1)/2 of them, and two
    columns for two classes), as onnxruntime does."""
    n = _batch(ctx)
    strings = bool(ctx.attrs.get("classlabels_strings"))
    k = len(ctx.attrs.get("classlabels_strings") or ctx.attrs.get("classlabels_ints") or [])
    if not k:
        ctx.fail("needs classlabels_strings or classlabels_ints")
    svc = sum(int(v) for v in ctx.attrs.get("vectors_per_class") or []) > 0
    if svc and not ctx.attrs.get("prob_a"):
        cols = k * (k - 1) // 2 if k > 2 else 2
    else:
        cols = k
    label = ctx.tensor(object if strings else np.int64, None if n is None else (n,))
    return [label, ctx.tensor(np.float32, None if n is None else (n, cols))]


@meta("SVMRegressor", domain=ML)
def ml_svm_regressor(ctx):
    """[N, 1]: one target whatever n_targets says (onnxruntime)."""
    n = _batch(ctx)
    return [ctx.tensor(np.float32, None if n is None else (n, 1))]


@meta("CategoryMapper", domain=ML)
def ml_category_mapper(ctx):
    """strings → int64, int64 → strings; the shape kept."""
    dt = ctx.dtype(0)
    if dt not in (np.dtype(object), np.dtype(np.int64)):
        ctx.fail(f"input 0 '{ctx.node.inputs[0]}' must be string or int64, got {dt}")
    return [ctx.tensor(np.int64 if dt == np.dtype(object) else object, ctx.shape(0))]


_CAST_TO = {"TO_FLOAT": np.float32, "TO_INT64": np.int64, "TO_STRING": object}


@meta("CastMap", domain=ML)
def ml_cast_map(ctx):
    """[1, C]: C the map's size (known only from its value) for DENSE, max_map for SPARSE."""
    cast_to = ctx.attr("cast_to", "TO_FLOAT")
    if cast_to not in _CAST_TO:
        ctx.fail(f"unknown cast_to {cast_to!r} (TO_FLOAT, TO_STRING or TO_INT64)")
    t = ctx.type(0)
    if t is not None and not isinstance(t, MapType):
        ctx.fail(f"input 0 '{ctx.node.inputs[0]}' must be a map, got {t}")
    if ctx.attr("map_form", "DENSE") == "SPARSE":
        width = int(ctx.attr("max_map", 1))
        if width <= 0:
            ctx.fail(f"max_map must be > 0 when map_form is SPARSE, got {width}")
    else:
        width = symbolic.fresh("map_size")
    return [ctx.tensor(_CAST_TO[cast_to], (1, width))]


@meta("DictVectorizer", domain=ML)
def ml_dict_vectorizer(ctx):
    """[1, V] of the map's value type, V the vocabulary of the map's key type (onnxruntime
    takes one map, not a sequence of them)."""
    t = ctx.type(0)
    if t is not None and not isinstance(t, MapType):
        ctx.fail(f"input 0 '{ctx.node.inputs[0]}' must be a map, got {t}")
    strings = ctx.attrs.get("string_vocabulary")
    ints = ctx.attrs.get("int64_vocabulary")
    if t is not None:
        want = "string_vocabulary" if t.key == np.dtype(object) else "int64_vocabulary"
        vocab = strings if want == "string_vocabulary" else ints
        if not vocab:
            ctx.fail(f"a map with {'string' if want == 'string_vocabulary' else 'int64'} keys needs {want}")
    else:
        vocab = strings or ints or []
    value = getattr(t, "value", None)
    if value is None:
        return [None]
    return [ctx.tensor(value.dtype, (1, len(vocab)))]
