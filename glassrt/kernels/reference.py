"""The `reference` provider: the onnx package's reference implementations, as a fallback.

Always last in the priority list. Ops where onnx.reference is known to be wrong are
refused here with the reason, so a node never silently falls back to a wrong answer.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..onnx_io import node_to_proto, to_type_proto
from .registry import Kernel

# (op, lowest schema version, highest schema version, predicate or None, reason)
KNOWN_WRONG = [
    ("BatchNormalization", 9, 13, None,
     "onnx.reference uses batch statistics for BatchNormalization opsets 9-13 (inference needs running statistics)"),
    ("GlobalMaxPool", 1, None, lambda ctx: ctx.shape(0) is not None and len(ctx.shape(0)) == 3,
     "onnx.reference's GlobalMaxPool is wrong on 3-D input"),
    ("Softmax", 1, 12, None, "onnx.reference's Softmax below opset 13 ignores the flatten-to-2-D semantics"),
    ("LogSoftmax", 1, 12, None, "onnx.reference's LogSoftmax below opset 13 ignores the flatten-to-2-D semantics"),
    ("Hardmax", 1, 12, None, "onnx.reference's Hardmax below opset 13 ignores the flatten-to-2-D semantics"),
    # ai.onnx.ml SVMClassifier, against onnxruntime (what skl2onnx's models are checked with);
    # tests/test_ml_svm.py runs each case on both.
    ("SVMClassifier", 1, None, lambda ctx: _svm_classes(ctx) > 2 and _svm_svc(ctx) and _svm_proba(ctx),
     "onnx.reference's SVMClassifier couples the pairwise probabilities of 3 or more classes wrongly "
     "(a dot product where libsvm multiplies elementwise): probabilities off by 0.02 to 0.2"),
    ("SVMClassifier", 1, None, lambda ctx: not _svm_svc(ctx),
     "onnx.reference's SVMClassifier gives wrong labels for a linear model (no support vectors)"),
    ("SVMClassifier", 1, None, lambda ctx: _svm_classes(ctx) == 2 and _svm_svc(ctx) and not _svm_proba(ctx) and (
        ctx.attrs.get("post_transform", "NONE") in ("SOFTMAX", "SOFTMAX_ZERO") or _svm_all_positive(ctx)),
     "onnx.reference's two-class SVMClassifier without probabilities writes other scores (SOFTMAX, SOFTMAX_ZERO) "
     "or labels (all coefficients >= 0) than onnxruntime"),
    ("SVMClassifier", 1, None, lambda ctx: ctx.attrs.get("post_transform", "NONE") == "PROBIT",
     "onnx.reference's SVMClassifier with PROBIT gives 0 where onnxruntime's probit is infinite, and one score "
     "column for two classes where onnxruntime writes two"),
    ("SVMClassifier", 1, None, lambda ctx: bool(ctx.attrs.get("classlabels_strings")),
     "onnx.reference's SVMClassifier fails on string class labels"),
    ("SVMRegressor", 1, None, lambda ctx: ctx.attrs.get("post_transform", "NONE") != "NONE",
     "onnx.reference's SVMRegressor raises on a post_transform other than NONE (onnxruntime ignores it)"),
    ("DictVectorizer", 1, None, None,
     "onnx.reference's DictVectorizer returns a float64 [V] vector where onnxruntime returns [1, V] of the "
     "map's value type"),
]


def _svm_classes(ctx):
    return len(ctx.attrs.get("classlabels_strings") or ctx.attrs.get("classlabels_ints") or [])


def _svm_svc(ctx):
    return sum(int(v) for v in ctx.attrs.get("vectors_per_class") or []) > 0


def _svm_proba(ctx):
    return bool(ctx.attrs.get("prob_a"))


def _svm_all_positive(ctx):
    return all(v >= 0 for v in ctx.attrs.get("coefficients") or [])


# Ops whose reference implementation needs the reference evaluator's own graph context.
NEEDS_EVALUATOR = {"If", "Loop", "Scan", "SequenceMap"}


def _loader(domain):
    if domain == "":
        from onnx.reference.ops import load_op
    elif domain == "ai.onnx.ml":
        from onnx.reference.ops.aionnxml import load_op
    elif domain == "ai.onnx.preview.training":
        from onnx.reference.ops.aionnx_preview_training import load_op
    elif domain == "ai.onnx.preview":
        from onnx.reference.ops.aionnx_preview import load_op
    elif domain == "experimental":
        from onnx.reference.ops.experimental import load_op
    else:
        return None
    return load_op


@lru_cache(maxsize=None)
def implements(domain: str, op_type: str, opset: int) -> bool:
    load_op = _loader(domain)
    if load_op is None or op_type in NEEDS_EVALUATOR:
        return False
    from onnx.reference.op_run import RuntimeContextError

    try:
        load_op(domain, op_type, opset)
        return True
    except RuntimeContextError:
        return True  # a function op: built at bind time from the node's input types
    except Exception:
        return False


def _accepts(ctx):
    for op, lo, hi, pred, reason in KNOWN_WRONG:
        since = ctx.since_version
        if ctx.node.op_type == op and since >= lo and (hi is None or since <= hi) and (pred is None or pred(ctx)):
            return reason
    return None


def _bind(ctx):
    node = ctx.node
    load_op = _loader(node.domain)
    proto = node_to_proto(node)
    from onnx.reference.op_run import RuntimeContextError

    try:
        cls = load_op(node.domain, node.op_type, node.opset)
    except RuntimeContextError:
        types = [to_type_proto(t) for t in ctx.input_types]
        from onnx.reference import ReferenceEvaluator

        cls = load_op(node.domain, node.op_type, node.opset, node=proto, input_types=types,
                      evaluator_cls=ReferenceEvaluator)
    run_params = {"log": lambda *a: None, "opsets": {node.domain: node.opset, "": ctx.node.opset if node.domain == "" else 21},
                  "verbose": 0, "new_ops": None, "existing_functions": {}, "evaluator_cls": None}
    from onnx.reference import ReferenceEvaluator

    run_params["evaluator_cls"] = ReferenceEvaluator
    impl = cls(proto, run_params)
    n_out = len(node.outputs)

    def step(*inputs):
        res = impl.run(*inputs)
        res = [np.asarray(r) if isinstance(r, (np.generic, float, int, bool)) else r for r in res]
        return tuple(res) + (None,) * (n_out - len(res))

    return step


def reference_kernel(domain: str, op_type: str) -> Kernel:
    return Kernel(name=f"reference.{op_type}", provider="reference", domain=domain, op_type=op_type,
                  fn=_bind, builder=True, multi=True, accepts=_accepts,
                  doc="onnx.reference implementation (pure Python/NumPy, slow)")
