"""Attention over a KV cache, written as five to seven nodes, becomes one
glassrt::ScaledDotProductAttention:

    K = Concat(past_K, k_new)          (the cache: a graph input, grown along the rows)
    S = MatMul(Q, Transpose(K))        (the last two axes swapped)
    [S = S * c  or  S / c]             (a scalar constant)
    [S = Where(keep, S, fill)]         (a bool mask, a scalar constant fill: GPT-2's causal mask)
    [S = S + mask]                     (an additive mask)
    Y = MatMul(Softmax(S, last axis), V)

Why: while decoding, each run has one query row, so the product, the masking and the
softmax are a few microseconds of arithmetic each, and the run pays their per-node costs
instead: a copy of the whole cache for Transpose(K), a shape bound per run for every node
downstream of the cache's length, and each small kernel running with caches cold after
the layer's weights streamed through them (GPT-2: ~0.25 ms per layer for ~0.02 ms of
work). The fused kernel reads K as it is and keeps the scores of one row in registers.

It fires only there (K a Concat onto a graph input): over a whole sequence (BERT's encoder,
a prompt without a cache) the scores are a (sequence x sequence) product per head, which
the batched GEMM kernels do better. The intermediates must have one reader each and not be
graph outputs; Q, K and V float32/float64 of one rank with the same leading dims. Dividing
by c becomes scale = 1/c: within an ulp, as in fuse_matmul.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..ir import Node, TensorType
from ..ops.fused import may_fit_into
from ._rewrite import FUSED_FLOATS, Readers, known_shape, origin, producers, scalar_constant


def fuse_attention(graph, ctx):
    changes = []
    nodes = _fuse(graph, list(graph.nodes), graph.constants(), ctx.types, changes)
    return (replace(graph, nodes=nodes), changes) if changes else (graph, [])


def _plain(n, op, arity=None):
    return n is not None and n.op_type == op and not n.domain and (arity is None or len(n.inputs) == arity) \
        and len(n.outputs) == 1 and "broadcast" not in n.attrs


def _last_axis_softmax(sm, rank) -> bool:
    axis = sm.attrs.get("axis", -1 if sm.opset >= 13 else 1)
    # below opset 13 Softmax flattens at `axis`: at the last axis that is the same softmax
    return axis + (rank if axis < 0 else 0) == rank - 1


def _is_cache(k_node, graph_inputs, rank) -> bool:
    """K is a Concat along the rows (axis -2) with a graph input (the past) among its inputs."""
    if not _plain(k_node, "Concat"):
        return False
    axis = k_node.attrs.get("axis")
    return axis in (-2, rank - 2) and any(i in graph_inputs for i in k_node.inputs)


def _fuse(graph, nodes, consts, types, log):
    readers = Readers(graph, nodes)
    producer = producers(nodes)
    graph_inputs = {v.name for v in graph.inputs}
    replaced, dropped = {}, set()
    for sm in nodes:
        if not _plain(sm, "Softmax", 1) or sm.name in dropped:
            continue
        pv = readers.single(sm.outputs[0])
        if not _plain(pv, "MatMul", 2) or pv.inputs[0] != sm.outputs[0]:
            continue
        # back from the softmax's input: [Add mask] <- [Where keep] <- [Mul/Div scale] <- MatMul
        cur, chain = sm.inputs[0], []
        scale, keep, fill, mask = 1.0, "", 0.0, ""
        node = producer.get(cur)
        if readers.single(cur) is not sm:
            continue
        t = types.get(cur)
        if not isinstance(t, TensorType) or t.dtype not in FUSED_FLOATS or t.shape is None:
            continue
        dt, scores = t.dtype, tuple(t.shape)
        if _plain(node, "Add", 2):
            a, b = node.inputs
            for inner, other in ((a, b), (b, a)):
                ti = types.get(other)
                src = producer.get(inner)
                if (src is not None and src.op_type in ("Where", "Mul", "Div", "MatMul") and not src.domain
                        and isinstance(ti, TensorType) and ti.dtype == dt and ti.shape is not None
                        and may_fit_into(ti.shape, scores) and readers.single(inner) is node):
                    mask, chain, cur, node = other, [node], inner, src
                    break
        if _plain(node, "Where", 3) and node.inputs[1] != node.inputs[0]:
            c, x, f = node.inputs
            tc, v = types.get(c), scalar_constant(consts, f, dt)
            if (isinstance(tc, TensorType) and tc.dtype == np.bool_ and tc.shape is not None
                    and may_fit_into(tc.shape, scores) and v is not None and readers.single(x) is node):
                keep, fill, chain, cur, node = c, v, [node] + chain, x, producer.get(x)
        if _plain(node, "Mul", 2) or _plain(node, "Div", 2):
            a, b = node.inputs
            for x, c in ([(a, b)] if node.op_type == "Div" else [(a, b), (b, a)]):
                v = scalar_constant(consts, c, dt)
                if v is not None and x != c and (node.op_type == "Mul" or v != 0.0) and readers.single(x) is node:
                    scale = v if node.op_type == "Mul" else 1.0 / v
                    chain, cur, node = [node] + chain, x, producer.get(x)
                    break
        qk = node
        if not _plain(qk, "MatMul", 2) or readers.single(cur) is not (chain[0] if chain else sm):
            continue
        q, kt = qk.inputs
        tr = producer.get(kt)
        k = tr.inputs[0] if _plain(tr, "Transpose", 1) else None
        qs, ks, vs = known_shape(types, q), known_shape(types, k) if k else None, known_shape(types, pv.inputs[1])
        if k is None or qs is None or ks is None or vs is None or readers.single(kt) is not qk:
            continue
        rank = len(ks)
        if not (rank == len(qs) == len(vs) >= 3 and qs[:-2] == ks[:-2] == vs[:-2]):
            continue
        if list(tr.attrs.get("perm") or []) != list(range(rank - 2)) + [rank - 1, rank - 2]:
            continue
        if not (_last_axis_softmax(sm, rank) and _is_cache(producer.get(k), graph_inputs, rank)):
            continue
        if any(types.get(x) is None or types[x].dtype != dt for x in (q, k, pv.inputs[1])):
            continue
        fused = [tr, qk] + chain + [sm, pv]
        inputs = [q, k, pv.inputs[1], keep, mask]
        while inputs[-1] == "":
            inputs.pop()
        replaced[pv.name] = Node("ScaledDotProductAttention", "glassrt", inputs, list(pv.outputs),
                                 {"scale": scale, "fill": fill}, pv.name, 1, [],
                                 origin=origin(pv, "attention over a KV cache written as " +
                                               ", ".join(f"{n.op_type} '{n.name}'" for n in fused)))
        dropped.update(n.name for n in fused if n is not pv)
        log.append(f"fuse {', '.join(f'{n.op_type} {n.name!r}' for n in fused)} into ScaledDotProductAttention")
    return [replaced.get(n.name, n) for n in nodes if n.name not in dropped]
