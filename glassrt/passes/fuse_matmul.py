"""Fuse what follows a MatMul in transformers into one glassrt::FusedMatMul:

    MatMul [→ Mul/Div by a scalar constant] [→ Add bias] [→ Add Z] [→ activation]

each step optional, in that order: attention scores (MatMul, Div by √d, Add the mask), the
projections (MatMul, Add bias [, Add the residual]), the feed-forward's first half (MatMul,
Add bias, Gelu). And a Gemm followed by an activation (a classifier's hidden layers, the
small MLPs of wake-word and voice models: Gemm → Relu → Gemm → Sigmoid), as onnxruntime's
FusedGemm:

    Gemm(A, B, C; alpha, beta, transB) → activation

becomes FusedMatMul(A, B or a transposed view of it, beta·C as bias or Z; alpha, activation),
for a constant B and A not transposed; beta·C is a constant made here where beta is not 1.
The fused kernels apply the steps as the product is written (oneDNN's post-ops) or in place
on it (cpu): no intermediate value, no extra pass over memory.

bias is a constant that broadcasts along the last dim only; Z any value that broadcasts into
the product's shape without enlarging it. Only float32 and float64 products are fused (the
fused kernels' types). Like the conv fusions, each rewrite keeps the output name, fires only
when every intermediate value has one reader and is not a graph output, and names the nodes
it replaced in the fused node's `origin`. Dividing by c becomes alpha = 1/c: within an ulp.
"""
from __future__ import annotations

from ..ir import Node, TensorType
from ..ops.fused import bias_fits, fits_into
from ._rewrite import FUSED_FLOATS, Readers, activation_of, finish, origin, scalar_constant

ACTIVATIONS = ("Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh", "Gelu", "GeluTanh")


def fuse_matmul(graph, ctx):
    changes = []
    consts = graph.constants()
    inits = dict(graph.initializers)
    nodes = _fuse(graph, list(graph.nodes), consts, ctx.types, changes)
    nodes = _fuse_gemm(graph, nodes, consts, inits, ctx.types, changes)
    return finish(graph, nodes, inits, changes)


def _plain(n, op, arity=2):
    return n is not None and n.op_type == op and not n.domain and len(n.inputs) == arity \
        and "broadcast" not in n.attrs


def _other(node, value):
    a, b = node.inputs
    return b if a == value else a if b == value else None


def _fuse(graph, nodes, consts, types, log):
    readers = Readers(graph, nodes)
    replaced, dropped = {}, set()
    for mm in nodes:
        if not _plain(mm, "MatMul") or mm.name in dropped:
            continue
        t = types.get(mm.outputs[0])
        if not isinstance(t, TensorType) or t.shape is None or t.dtype not in FUSED_FLOATS or len(t.shape) < 1:
            continue
        y, dt = tuple(t.shape), t.dtype
        cur, chain = mm.outputs[0], []
        alpha, bias, z, act, params = 1.0, "", "", "", []
        nxt = readers.single(cur)
        # a scale: Mul by a scalar constant (either side) or Div by one
        if _plain(nxt, "Mul") or (_plain(nxt, "Div") and nxt.inputs[0] == cur):
            c = _other(nxt, cur)
            v = scalar_constant(consts, c, dt) if c is not None and c != cur else None
            if v is not None and (nxt.op_type == "Mul" or v != 0.0):
                alpha = v if nxt.op_type == "Mul" else 1.0 / v
                chain.append(nxt)
                cur, nxt = nxt.outputs[0], readers.single(nxt.outputs[0])
        # the bias: a constant along the last dim
        if _plain(nxt, "Add"):
            c = _other(nxt, cur)
            v = consts.get(c) if c is not None and c != cur else None
            if v is not None and v.dtype == dt and bias_fits(v.shape, y):
                bias = c
                chain.append(nxt)
                cur, nxt = nxt.outputs[0], readers.single(nxt.outputs[0])
        # a residual or mask: any value that broadcasts into the product
        if _plain(nxt, "Add"):
            c = _other(nxt, cur)
            tz = types.get(c) if c is not None and c != cur else None
            if isinstance(tz, TensorType) and tz.dtype == dt and tz.shape is not None and fits_into(tz.shape, y):
                z = c
                chain.append(nxt)
                cur, nxt = nxt.outputs[0], readers.single(nxt.outputs[0])
        found = activation_of(nxt, consts) if nxt is not None and nxt.inputs[:1] == [cur] else None
        if found is not None and found[0] in ACTIVATIONS:
            act, params = found
            chain.append(nxt)
        if not chain:
            continue
        last = chain[-1]
        inputs = [mm.inputs[0], mm.inputs[1], bias, z]
        while inputs[-1] == "":
            inputs.pop()
        replaced[last.name] = Node("FusedMatMul", "glassrt", inputs, list(last.outputs[:1]),
                                   {"alpha": alpha, "activation": act, "activation_params": params}, mm.name, 1, [],
                                   origin=origin(mm, ", ".join(f"{n.op_type} '{n.name}'" for n in chain) +
                                                 " fused in"))
        dropped.update(n.name for n in [mm] + chain if n is not last)
        log.append(f"fuse {', '.join(f'{n.op_type} {n.name!r}' for n in chain)} into MatMul '{mm.name}'")
    return [replaced.get(n.name, n) for n in nodes if n.name not in dropped]


def _fuse_gemm(graph, nodes, consts, inits, types, log):
    """Gemm → activation as one FusedMatMul (see the module's doc): the activation no longer
    a step of its own (at one row, a step costs as much as the activation)."""
    readers = Readers(graph, nodes)
    replaced, dropped = {}, set()
    for g in nodes:
        if g.op_type != "Gemm" or g.domain or len(g.inputs) < 2 or int(g.attrs.get("transA", 0)):
            continue
        t = types.get(g.outputs[0])
        b = consts.get(g.inputs[1])
        if not isinstance(t, TensorType) or t.shape is None or len(t.shape) != 2 or t.dtype not in FUSED_FLOATS \
                or b is None or b.ndim != 2 or b.dtype != t.dtype:
            continue
        act_node = readers.single(g.outputs[0])
        found = activation_of(act_node, consts) if act_node is not None and act_node.inputs[:1] == g.outputs[:1] \
            else None
        if found is None or found[0] not in ACTIVATIONS:
            continue
        y = tuple(t.shape)
        beta = float(g.attrs.get("beta", 1.0))
        c_name = g.inputs[2] if len(g.inputs) > 2 else ""
        bias = z = ""
        if c_name and beta != 0.0:
            c = consts.get(c_name)
            tc = types.get(c_name)
            c_shape = tuple(c.shape) if c is not None else tuple(tc.shape) if isinstance(tc, TensorType) and \
                tc.shape is not None else None
            if c_shape is None or not fits_into(c_shape, y) or (c is None and beta != 1.0) or \
                    (c is not None and c.dtype != t.dtype):
                continue  # (C computed and scaled, or not broadcasting into Y as fused kernels read it)
            if c is not None and beta != 1.0:
                c_name = f"{g.name}/beta_C"
                inits[c_name] = consts[c_name] = (c * c.dtype.type(beta)).astype(c.dtype)
            if c is not None and bias_fits(c_shape, y):
                bias = c_name
            else:
                z = c_name
        b_name = g.inputs[1]
        if int(g.attrs.get("transB", 0)):
            # B as the product's K x N matrix: a view (no copy) that the fused kernels read
            # transposed, as the Gemm kernels read B itself (kernels/onednn/matmul._storage)
            b_name = f"{g.name}/B_transposed"
            inits[b_name] = consts[b_name] = b.T
        inputs = [g.inputs[0], b_name, bias, z]
        while inputs[-1] == "":
            inputs.pop()
        act, params = found
        replaced[act_node.name] = Node("FusedMatMul", "glassrt", inputs, list(act_node.outputs[:1]),
                                       {"alpha": float(g.attrs.get("alpha", 1.0)), "activation": act,
                                        "activation_params": params}, g.name, 1, [],
                                       origin=origin(g, f"{act_node.op_type} '{act_node.name}' fused in"))
        dropped.add(g.name)
        log.append(f"fuse {act_node.op_type} {act_node.name!r} into Gemm '{g.name}'")
    return [replaced.get(n.name, n) for n in nodes if n.name not in dropped]
