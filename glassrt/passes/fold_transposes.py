"""Fold the Transposes around a product of two computed values into the product: attention's

    Q: Reshape → Transpose(0, 2, 1, 3) ─┐
    K: Reshape → Transpose(0, 2, 3, 1) ─┴→ MatMul (→ scale, mask: FusedMatMul) → Softmax ─┐
    V: Reshape → Transpose(0, 2, 1, 3) ──────────────────────────────────────────────── MatMul → Transpose(0, 2, 1, 3)

becomes glassrt::FusedMatMul nodes with perm_a / perm_b / perm_y: the kernels read the
operands through the permuted strides and write the result likewise (oneDNN's matmul takes
any strides: measured on the 2-core AVX-512 machine, BERT-base's Q·Kᵀ 67 -> 70 us and P·V
65 -> 77 us that way, where the four copies they replace took ~180 us a layer in a run).

A Transpose is folded when the product is its only reader (and it is no graph output); the
Transpose after a product when it is the product's only reader and the product adds no bias
or Z. Products with a constant
operand are left alone (their weights kernels read B packed, A by rows), and only float32 /
float64 products (the fused kernels' types).
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import Node, TensorType
from ._rewrite import FUSED_FLOATS, Readers, origin, producers


def fold_transposes(graph, ctx):
    changes = []
    nodes = _fold(graph, list(graph.nodes), graph.constants(), ctx.types, changes)
    return (replace(graph, nodes=nodes), changes) if changes else (graph, [])


def _is_product(n) -> bool:
    return (n.op_type == "MatMul" and not n.domain and len(n.inputs) == 2) or \
        (n.op_type == "FusedMatMul" and n.domain == "glassrt")


def _transpose_perm(n, types) -> list | None:
    """A plain Transpose's perm (its default, the dims reversed, where the input's rank is known)."""
    if n is None or n.op_type != "Transpose" or n.domain or len(n.outputs) != 1:
        return None
    t = types.get(n.inputs[0])
    if not isinstance(t, TensorType) or t.shape is None:
        return None  # (its rank unknown: nothing to check a perm against)
    rank = len(t.shape)
    perm = [int(p) for p in n.attrs["perm"]] if n.attrs.get("perm") is not None else list(range(rank))[::-1]
    return perm if sorted(perm) == list(range(rank)) else None  # (a bad perm stays, for its node to report)


def _then(first: list, second: list) -> list:
    """The perm of transposing by `first`, then by `second` ([]: none)."""
    if not first:
        return list(second)
    return [first[q] for q in second] if second else list(first)


def _fold(graph, nodes, consts, types, log):
    readers, made = Readers(graph, nodes), producers(nodes)
    replaced, dropped = {}, set()
    for mm in nodes:
        if not _is_product(mm) or mm.name in dropped:
            continue
        t = types.get(mm.outputs[0])
        if not isinstance(t, TensorType) or t.dtype not in FUSED_FLOATS:
            continue
        a, b = mm.inputs[0], mm.inputs[1]
        if not a or not b or a in consts or b in consts:
            continue
        attrs = dict(mm.attrs) if mm.op_type == "FusedMatMul" else {"alpha": 1.0, "activation": "",
                                                                   "activation_params": []}
        inputs, folded = list(mm.inputs), []
        for i, which in ((0, "perm_a"), (1, "perm_b")):
            tr = made.get(inputs[i])
            perm = _transpose_perm(tr, types)
            if perm is None or readers.single(inputs[i]) is not mm or tr.name in dropped:
                continue
            # the product reads transpose(transpose(x, perm), own) = transpose(x, perm then own)
            attrs[which] = _then(perm, list(attrs.get(which) or []))
            inputs[i] = tr.inputs[0]
            folded.append(tr)
        outputs = list(mm.outputs)
        after = readers.single(mm.outputs[0])
        perm = _transpose_perm(after, types)
        # (not after a product that adds a bias or Z: oneDNN cannot add them to a result it
        # writes transposed, and the product would leave it for the slower cpu kernel)
        if perm is not None and after.inputs[0] == mm.outputs[0] and after.name not in dropped \
                and len([i for i in inputs[2:] if i]) == 0:
            attrs["perm_y"] = _then(list(attrs.get("perm_y") or []), perm)
            outputs = list(after.outputs)
            folded.append(after)
        if not folded:
            continue
        what = ", ".join(f"Transpose '{n.name}'" for n in folded)
        replaced[mm.name] = Node("FusedMatMul", "glassrt", inputs, outputs, attrs, mm.name,
                                 mm.opset if mm.domain == "glassrt" else 1, [], origin=origin(mm, f"{what} folded in"))
        dropped.update(n.name for n in folded)
        log.append(f"fold {what} into {mm.op_type} '{mm.name}'")
    return [replaced.get(n.name, n) for n in nodes if n.name not in dropped]
