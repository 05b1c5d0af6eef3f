"""Helpers the rewriting passes share: who reads a value, where a node came from."""
from __future__ import annotations

from dataclasses import replace

import numpy as np


class Readers:
    """Who reads each value, indexed once per node list (scanning all nodes per candidate
    would be quadratic on a 5,000-node transformer).

    The index of the latest node list is kept (`_last`) while the passes run (run_pipeline
    drops it): most passes find nothing to rewrite and hand the next one the same nodes,
    and each indexed them again (fifteen times in an 8-bit MobileNetV2's pipeline, 0.12 ms
    each). It is reused for the same node objects in the same order (the list may be
    another, or one a pass changed in place), read-only as every pass treats it."""

    _last = None  # (node ids, graph output names, by_value, the nodes: kept, so their ids stay theirs)

    def __init__(self, graph, nodes):
        self.outputs = set(graph.output_names())
        ids = [id(n) for n in nodes]
        last = Readers._last
        if last is not None and last[0] == ids and last[1] == self.outputs:
            self.by_value = last[2]
            return
        self.by_value = {}
        for n in nodes:
            for i in {*n.inputs, *n.implicit_inputs}:
                self.by_value.setdefault(i, []).append(n)
        Readers._last = (ids, self.outputs, self.by_value, tuple(nodes))

    @staticmethod
    def forget() -> None:
        Readers._last = None

    def single(self, value):
        """The one node reading `value`; None if several, none, or it is a graph output."""
        found = self.by_value.get(value, [])
        return found[0] if len(found) == 1 and value not in self.outputs else None


# The dtypes glassrt's fused float kernels take (FusedMatMul, ScaledDotProductAttention).
FUSED_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def known_shape(types, name):
    """The value's shape as a tuple (dims may be symbolic), or None when unknown."""
    from ..ir import TensorType

    t = types.get(name)
    return tuple(t.shape) if isinstance(t, TensorType) and t.shape is not None else None


def scalar_constant(consts, name, dtype):
    """A one-element constant of `dtype` (rank 0 or 1) as a float, else None."""
    c = consts.get(name) if name else None
    return float(c.reshape(-1)[0]) if c is not None and c.size == 1 and c.ndim <= 1 and c.dtype == dtype else None


def rebuild(nodes, replaced: dict, dropped: set) -> list:
    """The node list after a rewrite: `replaced` {id(node): [its replacements]} put in the
    node's place, the nodes whose ids are in `dropped` left out."""
    out = []
    for n in nodes:
        if id(n) not in dropped:
            out.extend(replaced.get(id(n), [n]))
    return out


def bias_add(readers, consts, value, n):
    """(the Add that alone reads `value` and adds a constant float32 bias, one value per
    column [n], the bias's name), or (None, ""): a layer's bias an integer product takes in."""
    add = readers.single(value)
    if add is None or add.op_type != "Add" or add.domain or len(add.inputs) != 2:
        return None, ""
    other = add.inputs[1] if add.inputs[0] == value else add.inputs[0]
    c = consts.get(other)
    if c is None or c.dtype != np.float32 or c.shape != (n,):
        return None, ""
    return add, other


def drop_unread(nodes, graph, values) -> list:
    """`nodes` without those whose first output is one of `values` and is read by none of
    them nor by the graph's outputs (what a rewrite left behind: a scale product, a
    DequantizeLinear every reader of which was fused)."""
    read = {i for n in nodes for i in (*n.inputs, *n.implicit_inputs)} | set(graph.output_names())
    return [n for n in nodes if not (n.outputs and n.outputs[0] in values and n.outputs[0] not in read)]


def producers(nodes) -> dict:
    return {o: n for n in nodes for o in n.outputs if o}


def origin(node, what) -> str:
    return f"{node.origin + '; ' if node.origin else ''}{what}"


def activation_of(n, consts):
    """(name, params) of an activation node a fused kernel can apply to its output, or None:
    Relu, LeakyRelu (alpha), Clip (constant float bounds), Sigmoid, Tanh, Gelu (exact),
    GeluTanh (Gelu with approximate="tanh"), HardSigmoid (alpha, beta) and HardSwish (as
    alpha 1/6, beta 1/2: x·HardSigmoid(x))."""
    if n is None or n.domain or len(n.outputs) != 1:
        return None
    if n.op_type in ("Relu", "Sigmoid", "Tanh"):
        return n.op_type, []
    if n.op_type == "HardSigmoid":
        return "HardSigmoid", [float(n.attrs.get("alpha", 0.2)), float(n.attrs.get("beta", 0.5))]
    if n.op_type == "HardSwish":
        return "HardSwish", [1 / 6, 0.5]
    if n.op_type == "Gelu":
        return ("GeluTanh" if n.attrs.get("approximate", "none") == "tanh" else "Gelu"), []
    if n.op_type == "LeakyRelu":
        return "LeakyRelu", [float(n.attrs.get("alpha", 0.01))]
    if n.op_type != "Clip":
        return None
    if n.opset < 11:
        return "Clip", [float(n.attrs.get("min", -3.4e38)), float(n.attrs.get("max", 3.4e38))]
    names = (n.inputs[1:3] + ["", ""])[:2]
    bounds = [consts.get(x) if x else None for x in names]
    if any(x and b is None for x, b in zip(names, bounds)):
        return None  # bounds known only at run time
    if any(b is not None and (b.size != 1 or b.dtype.kind != "f") for b in bounds):
        return None  # not one float each (onnxruntime takes shape (1,) too): the Clip kernel judges
    return "Clip", [float(bounds[0].reshape(-1)[0]) if bounds[0] is not None else -np.inf,
                    float(bounds[1].reshape(-1)[0]) if bounds[1] is not None else np.inf]


def per_channel(c, rank, channels):
    """c as a float64 vector over axis 1 of a rank-`rank` tensor, or None if it broadcasts otherwise."""
    if c.ndim == 0 or c.size == 1:
        return np.full(channels, c.reshape(-1)[0], dtype=np.float64)
    shape = (1,) * (rank - c.ndim) + c.shape
    if len(shape) != rank or shape[1] != channels or any(d != 1 for i, d in enumerate(shape) if i != 1):
        return None
    return c.reshape(-1).astype(np.float64)


def finish(graph, nodes, initializers, changes):
    """The rewritten graph, without initializers nothing reads any more."""
    if not changes:
        return graph, []
    read = {i for n in nodes for i in [*n.inputs, *n.implicit_inputs]} | set(graph.output_names()) | \
        {v.name for v in graph.inputs}
    return replace(graph, nodes=nodes, initializers={k: v for k, v in initializers.items() if k in read}), changes
