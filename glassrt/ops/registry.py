"""The contract registry, keyed by (domain, op type, opset version).

Meta and value-propagation rules are registered per (domain, op) with an optional
version range; the contract for a node is resolved from the schema `onnx.defs` gives
for the node's opset (its facts read from ops/schema_index.py's table). Ops with no hand-written meta use onnx's own per-node inference
(ops/onnx_meta.py), which is correct but loses symbolic dims in a few places.
"""
from __future__ import annotations

from functools import lru_cache

from .contract import COMPOSITE, CUSTOM, PRIMITIVE, OpContract
from .schema_index import index

# Ops onnxruntime put in the default ONNX domain before ONNX itself defined them (at the
# version given): its transformer optimizers write LayerNormalization into opset 11-16 models.
ONNXRUNTIME_EARLY_OPS = {"LayerNormalization": 17}

_META: dict[tuple[str, str], list] = {}
_VALUES: dict[tuple[str, str], list] = {}
_BACKWARD: dict[tuple[str, str], list] = {}
_CUSTOM: dict[tuple[str, str], OpContract] = {}

# Output shapes that follow input values rather than input shapes.
DATA_DEPENDENT = {
    "NonZero", "Unique", "Compress", "NonMaxSuppression", "StringSplit", "TfIdfVectorizer", "CastMap",
    "Loop", "If", "Scan", "ImageDecoder", "Range", "ConstantOfShape", "Reshape", "Expand",
    "Tile", "Slice", "Resize", "Upsample", "Pad", "OneHot", "TopK", "CenterCropPad",
    "MelWeightMatrix", "Split", "SplitToSequence", "RandomUniformLike", "MaxUnpool", "StringNormalizer",
    "STFT", "DFT", "Col2Im", "ConstantOfShape", "EyeLike",
}


def _register(table, ops, domain, versions, fn):
    lo, hi = versions
    for op in [ops] if isinstance(ops, str) else ops:
        table.setdefault((domain, op), []).append((lo, hi, fn))
    return fn


def meta(ops, domain: str = "", versions=(1, None)):
    """Decorator: the shape/dtype rule for one or more ops (optionally a version range)."""
    return lambda fn: _register(_META, ops, domain, versions, fn)


def values(ops, domain: str = "", versions=(1, None)):
    """Decorator: how known (possibly symbolic) input values give output values."""
    return lambda fn: _register(_VALUES, ops, domain, versions, fn)


def backward(ops, domain: str = "", versions=(1, None)):
    """Decorator: the vector-Jacobian product of an op (see ops/backward/)."""
    return lambda fn: _register(_BACKWARD, ops, domain, versions, fn)


def _lookup(table, domain, op, version):
    for lo, hi, fn in reversed(table.get((domain, op), [])):
        if version >= lo and (hi is None or version <= hi):
            return fn
    return None


def register_custom(contract: OpContract) -> None:
    _CUSTOM[(contract.domain, contract.op_type)] = contract
    get_contract.cache_clear()


def unregister_custom(domain: str, op_type: str) -> None:
    _CUSTOM.pop((domain, op_type), None)
    get_contract.cache_clear()


def custom_contracts() -> list[OpContract]:
    return list(_CUSTOM.values())


def _onnx_meta(ctx):
    """onnx's generic shape inference, for ops without a glassrt meta rule (imports the onnx
    package and builds its schema registry when first needed, not for every model)."""
    from .onnx_meta import onnx_meta

    return onnx_meta(ctx)


def _onnx_decomposition(node, input_types, visible):
    """A composite's ONNX function body, inlined (imported when first needed, as above)."""
    from .decompose import onnx_decomposition

    return onnx_decomposition(node, input_types, visible)


@lru_cache(maxsize=4096)
def get_contract(domain: str, op_type: str, opset: int) -> OpContract | None:
    """The contract a node of (domain, op_type) at `opset` follows, or None if unknown."""
    _ensure_loaded()
    if (domain, op_type) in _CUSTOM:
        return _CUSTOM[(domain, op_type)]
    facts = index().resolve(op_type, opset, domain)
    if facts is None:
        if domain != "" or op_type not in ONNXRUNTIME_EARLY_OPS:
            return None
        # onnxruntime registered this op in the ONNX domain before ONNX defined it; the
        # models its optimizers write use it at older opsets with the later semantics.
        facts = index().resolve(op_type, ONNXRUNTIME_EARLY_OPS[op_type], domain)
        if facts is None:
            return None
    version = facts.since_version
    return OpContract(
        domain=domain,
        op_type=op_type,
        since_version=version,
        custom_schema=None,
        defaults=facts.defaults,
        arity=facts.arity,
        attributes=facts.attributes,
        meta=_lookup(_META, domain, op_type, version) or _onnx_meta,
        values=_lookup(_VALUES, domain, op_type, version),
        category=COMPOSITE if facts.composite else PRIMITIVE,
        decomposition=_onnx_decomposition if facts.composite else None,
        backward=_lookup(_BACKWARD, domain, op_type, version),
        differentiable=facts.differentiable,
        data_dependent=op_type in DATA_DEPENDENT,
    )


def all_onnx_contracts() -> list[OpContract]:
    """The newest contract of every op in the onnx package's schemas."""
    out = []
    for s in index().newest():
        if s.deprecated:
            continue
        c = get_contract(s.domain, s.name, s.since_version)
        if c is not None:
            out.append(c)
    return out


_loaded = False
_backward_loaded = False


def _ensure_loaded():
    """Import the modules whose decorators fill the meta and values tables."""
    global _loaded
    if not _loaded:
        _loaded = True
        from . import fused as _fused  # noqa: F401
        from . import meta as _meta  # noqa: F401


def load_backward() -> None:
    """Import the backward formulas (ops/backward/), once. Only gradients and `glassrt check`
    ask contracts for them, and importing them took ~1.6 ms of every process's first session
    creation; the contracts made before they were loaded are made again (the cache is
    cleared), so ask get_contract after calling this."""
    global _backward_loaded
    if not _backward_loaded:
        _backward_loaded = True
        from . import backward as _backward  # noqa: F401

        get_contract.cache_clear()


__all__ = ["meta", "values", "backward", "get_contract", "register_custom", "CUSTOM", "COMPOSITE", "PRIMITIVE"]
