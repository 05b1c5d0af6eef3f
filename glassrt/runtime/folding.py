"""The constant folder: evaluates a node whose inputs are all known, once.

One folder, used twice: by the `fold_constants` graph pass at session creation (nodes
whose inputs are initializers: their results become initializers every plan shares), and
by each plan (values that follow from the input shapes, like Shape → Gather → Reshape
chains, known only once the shapes are). Both obey the same rules: nothing random, no
control flow, and no value above `SessionOptions.fold_limit_bytes`.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import GlassrtError, NodeExecutionError, describe_node
from ..ir import TensorType
from ..kernels.registry import BindContext
from .select import bind_kernel, choose_kernel, provider_verdict

NONDETERMINISTIC = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                    "Multinomial", "Bernoulli", "Dropout"}


def may_fold(node) -> bool:
    """Folding this node now gives what running it later would: deterministic, no subgraph."""
    return not any(node.subgraphs()) and node.op_type not in NONDETERMINISTIC and any(node.outputs)


def fold_limit(options) -> int:
    """A folded value is held for the session's (or plan's) whole life: at most this many bytes."""
    return min(options.fold_limit_bytes, options.memory_limit())


def within_limit(types, options) -> bool | None:
    """True when the outputs' sizes are known and within fold_limit_bytes, False when
    known and over it, None when a size is only known once the node has run."""
    total = 0
    for t in types:
        if t is None or (isinstance(t, TensorType) and t.dtype == object):
            continue
        if not isinstance(t, TensorType) or not t.is_static:
            return None
        total += math.prod(t.shape) * t.dtype.itemsize
    return total <= fold_limit(options)


def evaluate(kern, ctx, make_runner=None, subgraphs=None) -> list:
    """Run one node on its constant inputs (ctx.const_inputs) with kernel `kern`."""
    ctx.workspace = None
    fn = bind_kernel(kern, ctx, make_runner, subgraphs)
    args = [c if n else None for c, n in zip(ctx.const_inputs, ctx.node.inputs)]
    # Kernels that write into their outputs get real buffers here too, where shapes are known.
    bufs = [np.empty(t.shape, t.dtype) if o and isinstance(t, TensorType) and t.is_static and t.dtype != object
            else None for o, t in zip(ctx.node.outputs, ctx.output_types)]
    try:
        r = fn(*args, out=tuple(bufs) if kern.multi else bufs[0]) if kern.out else fn(*args)
    except GlassrtError:
        raise
    except Exception as e:
        raise NodeExecutionError(f"{describe_node(ctx.node)} failed while folding constants on {kern.name}: "
                                 f"{type(e).__name__}: {e}") from e
    rs = list(r) if kern.multi else [r]
    return [np.asarray(x) if isinstance(x, (np.generic, int, float, bool)) else x for x in rs]


def fold_with_providers(node, contract, types, consts, providers, options) -> list | None:
    """The node's outputs computed now with the first provider that can run it, or None
    when it should stay a node (too big, no provider, a result that is not a tensor)."""
    if not may_fold(node):
        return None
    inputs = [i for i in [*node.inputs, *node.implicit_inputs] if i]
    if not all(i in consts for i in inputs):
        return None
    out_types = [types.get(o) if o else None for o in node.outputs]
    fits = within_limit(out_types, options)
    if fits is False:
        return None
    in_types = [TensorType(consts[i].dtype, consts[i].shape) if i else None for i in node.inputs]
    ctx = BindContext(node, contract.attrs_with_defaults(node), in_types, out_types,
                      [consts.get(i) if i else None for i in node.inputs], contract=contract)
    for p in providers:
        ks, _ = provider_verdict(p, node, contract, ctx)
        if ks:
            from .placement import Decision

            kern, _ = choose_kernel(Decision(node, p.name, ks, ""), ctx, options)
            results = evaluate(kern, ctx)
            if not all(isinstance(r, np.ndarray) for o, r in zip(node.outputs, results) if o):
                return None
            if fits is None and sum(r.nbytes for o, r in zip(node.outputs, results) if o) > fold_limit(options):
                return None  # a data-dependent size (NonZero of a constant...) that came out too big
            return results
    return None
