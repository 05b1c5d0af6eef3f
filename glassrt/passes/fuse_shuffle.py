"""ShuffleNet's channel shuffle written as three nodes — Reshape X (N, C, H, W) to
(N, g, C/g, H, W), Transpose(0, 2, 1, 3, 4), Reshape back to (N, C, H, W) — becomes one
glassrt::ChannelShuffle(group=g).

Why: the three nodes are layout-bound (a Reshape reads NCHW order), so each shuffle split a
oneDNN NHWC region: the conv before it reordered its output to NCHW, the Transpose copied,
the conv after reordered back (shufflenet: 16 shuffles, 32 reorders and 16 copies). One
ChannelShuffle is a single pass of oneDNN's shuffle primitive in NHWC, or one copy on cpu.

Fires when the shapes are known to be exactly those (from type inference: dims equal or
the same symbols), the intermediates have one reader each and are not graph outputs.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import Node
from ._rewrite import Readers, known_shape, origin, producers


def fuse_channel_shuffle(graph, ctx):
    changes = []
    nodes = _fuse(graph, list(graph.nodes), ctx.types, changes)
    return (replace(graph, nodes=nodes), changes) if changes else (graph, [])


def _plain(n, op):
    return n is not None and n.op_type == op and not n.domain


def _fuse(graph, nodes, types, log):
    readers = Readers(graph, nodes)
    producer = producers(nodes)
    replaced, dropped = {}, set()
    for t in nodes:
        if not _plain(t, "Transpose") or list(t.attrs.get("perm") or []) != [0, 2, 1, 3, 4]:
            continue
        split, merge = producer.get(t.inputs[0]), readers.single(t.outputs[0])
        if not (_plain(split, "Reshape") and _plain(merge, "Reshape")) or readers.single(split.outputs[0]) is not t:
            continue
        x = split.inputs[0]
        xs, gs, ys = known_shape(types, x), known_shape(types, split.outputs[0]), known_shape(types, merge.outputs[0])
        if xs is None or gs is None or ys is None or len(xs) != 4 or len(gs) != 5:
            continue
        n, c, h, w = xs
        g = gs[1]
        if not (isinstance(c, int) and isinstance(g, int) and g > 0 and c % g == 0):
            continue
        if gs != (n, g, c // g, h, w) or ys != xs:
            continue
        chain = [split, t, merge]
        replaced[merge.name] = Node("ChannelShuffle", "glassrt", [x], list(merge.outputs), {"group": g}, merge.name, 1,
                                    [], origin=origin(merge, "channel shuffle written as " +
                                                      ", ".join(f"{m.op_type} '{m.name}'" for m in chain)))
        dropped.update((split.name, t.name))
        log.append(f"fuse Reshape '{split.name}', Transpose '{t.name}', Reshape '{merge.name}' into "
                   f"ChannelShuffle (group {g})")
    return [replaced.get(m.name, m) for m in nodes if m.name not in dropped]
