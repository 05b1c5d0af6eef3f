"""Layouts: which 4-D (and 3-D) values live channels-last (NHWC, NWC) instead of plain NCHW.

A provider's kernels may read and write layouts besides NCHW (`Kernel.layouts`): oneDNN's
convolutions are fastest with NHWC activations. A value takes NHWC when its producer and
every reader can: it then never changes layout on its way, and a value that any other
kernel reads stays NCHW. So layout changes happen only at the edges of a region, inside
the kernel there (a oneDNN conv reorders an NCHW input it reads, or reorders its result
into an NCHW output), and explain lists those edges. Graph inputs and outputs, values a
subgraph reads and values computed from constants alone (folded when a plan is built)
stay NCHW.

The plan gives an NHWC value an NHWC-strided view of its logical NCHW shape (same bytes in
the arena), so code that reads it as an array still reads the right numbers. A 3-D value
(a 1-D signal: N, C, W) is channels-last the same way (N, W, C bytes) between kernels that
take it so (oneDNN's convolutions, which run a 1-D conv as a 2-D one of height 1): an
audio model's chain of convs then reorders at its two ends, not around every conv. A
kernel's `layouts` speak for every rank it accepts. Values are float32 activations and the
8-bit ones of a quantized CNN (between QLinearConvs, their table activations and adds).
Elementwise NumPy kernels follow (Kernel.follows_layout): inside a region they read and
write its layout, but a node of theirs never sits at an edge nor makes a region alone.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir import TensorType
from ..kernels.buffers import NHWC  # the layout's name, as kernels declare it
from ..kernels.buffers import NHWC_RANKS as RANKS  # values that may be channels-last
# float32 activations, and the 8-bit ones of a quantized CNN (QLinearConv to QLinearConv)
DTYPES = (np.dtype(np.float32), np.dtype(np.uint8), np.dtype(np.int8))


def channels_last_view(buf, shape):
    """The logical (N, C, *spatial) array over `buf`, whose bytes are (N, *spatial, C)."""
    n, c, *spatial = shape
    nd = len(shape)
    return buf.reshape(n, *spatial, c).transpose(0, nd - 1, *range(1, nd - 1))


@dataclass
class LayoutEdge:
    value: str
    node: str  # the node at the edge of a region
    kind: str  # "read" (the node reads an NCHW value) or "write" (it writes NCHW for readers elsewhere)


def _takes(decision, layout) -> bool:
    return bool(decision.kernels) and all(layout in k.layouts for k in decision.kernels)


def _follows(decision) -> bool:
    return bool(decision.kernels) and all(k.follows_layout for k in decision.kernels)


def _ranked(t) -> bool:
    """A value of a rank that may be channels-last (of any dtype: a bool result stays plain)."""
    return isinstance(t, TensorType) and t.shape is not None and len(t.shape) in RANKS


def choose_layouts(graph, decisions, types) -> tuple[dict, list]:
    """({value: "nhwc"}, [LayoutEdge]) for a placed graph."""
    producer = {o: n for n in graph.nodes for o in n.outputs if o}
    readers: dict[str, list] = {}
    implicit = set()
    for n in graph.nodes:
        for i in n.inputs:
            if i:
                readers.setdefault(i, []).append(n)
        implicit.update(n.implicit_inputs)
    outputs = set(graph.output_names())
    constant = set(graph.initializers)
    layouts = {}
    for name, node in producer.items():
        t = types.get(name)
        if not (isinstance(t, TensorType) and t.shape is not None and len(t.shape) in RANKS
                and t.dtype in DTYPES) or name in outputs or name in implicit or not readers.get(name):
            continue
        if all(i in constant for i in node.inputs if i):
            continue  # folded when a plan is built, by whatever kernel: keep it plain
        if _takes(decisions[node.name], NHWC) and all(_takes(decisions[r.name], NHWC) for r in readers[name]):
            layouts[name] = NHWC
    _keep_followers_within(graph, decisions, types, layouts, constant)
    edges = []
    for n in graph.nodes:
        if not _takes(decisions[n.name], NHWC) or _follows(decisions[n.name]):
            continue
        for i in n.inputs:
            t = types.get(i)
            if i and i not in layouts and i not in constant and isinstance(t, TensorType) and t.rank in RANKS:
                edges.append(LayoutEdge(i, n.name, "read"))
        for o in n.outputs:
            t = types.get(o)
            if o and o not in layouts and isinstance(t, TensorType) and t.rank in RANKS:
                edges.append(LayoutEdge(o, n.name, "write"))
    return layouts, edges


def _keep_followers_within(graph, decisions, types, layouts, constant) -> None:
    """Plain again every value of a node whose kernels follow a layout (elementwise NumPy,
    Kernel.follows_layout) and whose values do not all share one: such a node sits inside a
    region (the Max(x, -0.4) after each convolution of openWakeWord's embedding model stays
    in NHWC instead of taking two reorders: 1.37 -> 0.91-0.95 ms a run), never at its edge,
    where NumPy would change the layout element by element and oneDNN's reorder is the
    faster; nor does a chain of them alone make a region. Until nothing changes (a value
    made plain may break its neighbour's)."""
    followers = [n for n in graph.nodes if _follows(decisions[n.name])]
    changed = True
    while changed:
        changed = False
        for n in followers:
            values = [v for v in list(n.inputs) + list(n.outputs) if v and v not in constant and _ranked(types.get(v))]
            if any(v in layouts for v in values) and not all(v in layouts for v in values):
                for v in values:
                    changed |= layouts.pop(v, None) is not None
