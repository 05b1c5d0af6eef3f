"""A dynamically quantized layer as one integer product to float:
MatMulInteger(a_q, W_q, a_zp, w_zp) -> Cast(to float) -> Mul(·, a_scale · w_scale) [-> Add bias],
W_q a constant int8 matrix whose zero point is 0, becomes one com.microsoft
MatMulIntegerToFloat(a_q, W_q, a_scale, w_scale, a_zp, w_zp[, bias]): what onnxruntime's
MatMulIntegerToFloat fusion makes of them.

onnxruntime.quantization.quantize_dynamic writes every MatMul of a model this way (each
activation quantized by a DynamicQuantizeLinear, shared by the products that read it): the
int8 transformers published for CPU inference. Left alone, each layer is four passes over
its output (the int32 sums written, cast, scaled, biased); fused, oneDNN scales and biases
the exact sums as it writes them (kernels/onednn/int8.py; a BERT-base layer's products
1 x 128 x 768 x 3072).

The numbers are the same: MatMulIntegerToFloat is defined as that chain (its decomposition,
contrib/microsoft_quant.py: the int32 product, cast, times the float32 product of the two
scales, plus the bias), and float multiplication and addition commute.

It fires only where one of the onednn provider's exact kernels will take the node (W int8
with zero point 0, its scale one value or one per column, A's scale and zero point one value
each): its int8 kernel (VNNI or AMX), or without them its float32 one where the product's
sums stay exact in float32 (kernels/onednn/int8_float_matmul.py: per column of W, in parts
of K at most); elsewhere cpu's MatMulIntegerToFloat would convert the weights to float at
every call, slower than MatMulInteger's own kernel. Convolutions are fused for the int8
kernel only.

A quantize_dynamic convolution likewise: ConvInteger(x_q, W_q, x_zp, w_zp) [-> Add(int32
bias: older versions quantize the bias at run time)] -> Cast -> Mul(scale) [-> Add(float
bias)] becomes one glassrt::ConvIntegerToFloat (ops/fused.py: its decomposition is that
chain), the scale and biases one value or one per output channel, W a constant 4-D 8-bit
tensor. On oneDNN (kernels/onednn/int8.py) the convolution scales and biases its exact sums
as it writes them (int8 weights, zero point 0, no int32 bias), or the exact sums are
corrected and the chain's steps applied in one compiled pass; the chain's bits either way,
channels-last between the model's convolutions (its DynamicQuantizeLinears take NHWC too).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..ir import Node, TensorType
from ..ops.geometry import per_channel_size
from ._rewrite import Readers, bias_add, drop_unread, known_shape, origin, producers, rebuild
from .fuse_qdq_matmul import MS, int8_engine_reason, onednn_reason

_F32 = np.dtype(np.float32)


def _one_value(types, consts, name) -> bool:
    c = consts.get(name)
    if c is not None:
        return c.size == 1 and c.ndim <= 1
    t = types.get(name)
    return isinstance(t, TensorType) and t.shape is not None and tuple(t.shape) in ((), (1,))


def _float_exact(w, w_zp, a_type, a_zp, consts) -> bool:
    """Whether the float32 kernel takes this product: its sums stay exact (in parts of K at most)."""
    from ..kernels.onednn.int8_float_matmul import weights_for

    dt = getattr(a_type, "dtype", None)
    if dt not in (np.dtype(np.uint8), np.dtype(np.int8)):
        return False
    return weights_for(w, consts.get(w_zp) if w_zp else None, dt, bool(a_zp), consts.get(a_zp) if a_zp else None).why \
        is None


def fuse_matmul_integer(graph, ctx):
    if not any(n.op_type in ("MatMulInteger", "ConvInteger") for n in graph.nodes):
        return graph, []
    # the int8 engine (VNNI, AMX) takes every such product, convolutions too; the float32 one
    # (no VNNI: oneDNN's 8-bit products saturate) the products whose sums it holds exactly
    int8 = int8_engine_reason(ctx.providers) is None
    if not int8 and onednn_reason(ctx.providers):
        return graph, []
    consts, types = graph.constants(), ctx.types
    readers = Readers(graph, graph.nodes)
    producer = producers(graph.nodes)
    replaced, dropped, changes = {}, set(), []
    products = set()  # the scale products the fused nodes read in their two scales' place

    def scales(s, n):
        """(a_scale, w_scale) multiplied into `s`: a one-value scale and a constant float32
        one (one value or one per column of W), or None."""
        mul = producer.get(s)
        if mul is None or mul.op_type != "Mul" or mul.domain or len(mul.inputs) != 2:
            return None
        for a, w in (mul.inputs, mul.inputs[::-1]):
            c = consts.get(w)
            if c is not None and c.dtype == _F32 and (c.size == 1 and c.ndim <= 1 or c.shape == (n,)) \
                    and _one_value(types, consts, a) and getattr(types.get(a), "dtype", None) == _F32:
                return a, w
        return None

    def chain(node):
        """(Cast, Mul, the scale) where node's int32 output is cast to float32 and multiplied by
        one other value, each read by the next alone; else None."""
        cast = readers.single(node.outputs[0])
        if cast is None or cast.op_type != "Cast" or cast.domain or int(cast.attrs.get("to", 0)) != 1:
            return None
        mul = readers.single(cast.outputs[0])
        if mul is None or mul.op_type != "Mul" or mul.domain or len(mul.inputs) != 2:
            return None
        s = mul.inputs[1] if mul.inputs[0] == cast.outputs[0] else mul.inputs[0]
        return None if s == cast.outputs[0] else (cast, mul, s)

    def sums_bias(node, m):
        """(the Add, the int32 bias) where node's sums are read by one Add of an int32 value of
        one per channel (older quantize_dynamic models add the bias to the sums, quantized at
        run time in x's scale), else (None, "")."""
        add = readers.single(node.outputs[0])
        if add is None or add.op_type != "Add" or add.domain or len(add.inputs) != 2:
            return None, ""
        other = add.inputs[1] if add.inputs[0] == node.outputs[0] else add.inputs[0]
        if other == node.outputs[0] or getattr(types.get(other), "dtype", None) != np.int32 \
                or per_channel_size(known_shape(types, other), m) is None:
            return None, ""
        return add, other

    for conv in graph.nodes if int8 else ():
        if conv.op_type != "ConvInteger" or conv.domain or len(conv.inputs) < 2:
            continue
        w = consts.get(conv.inputs[1])
        w_zp = conv.inputs[3] if len(conv.inputs) > 3 else ""
        x_shape = types.get(conv.inputs[0])
        if w is None or w.ndim != 4 or w.dtype not in (np.int8, np.uint8) or (w_zp and w_zp not in consts) \
                or not isinstance(x_shape, TensorType) or x_shape.rank != 4:
            continue
        m = w.shape[0]
        sums_add, b_sums = sums_bias(conv, m)
        found = chain(sums_add or conv)
        if found is None:
            continue
        cast, mul, s = found
        if getattr(types.get(s), "dtype", None) != _F32 or per_channel_size(known_shape(types, s), m) is None:
            continue
        add, bias = readers.single(mul.outputs[0]), ""
        if add is not None and add.op_type == "Add" and not add.domain and len(add.inputs) == 2:
            other = add.inputs[1] if add.inputs[0] == mul.outputs[0] else add.inputs[0]
            c = consts.get(other)
            if c is not None and c.dtype == _F32 and per_channel_size(c.shape, m) is not None:
                bias = other
        if not bias:
            add = None
        last = add or mul
        why = origin(conv, f"ConvInteger '{conv.name}'" + (f", int32 bias Add '{sums_add.name}'" if b_sums else "")
                     + f", Cast '{cast.name}' and Mul '{mul.name}'" + (f" and bias Add '{add.name}'" if bias else ""))
        inputs = [conv.inputs[0], conv.inputs[1], conv.inputs[2] if len(conv.inputs) > 2 else "", w_zp, s, bias,
                  b_sums]
        while not inputs[-1]:
            inputs.pop()
        attrs = {k: v for k, v in conv.attrs.items() if k in ("auto_pad", "dilations", "group", "kernel_shape", "pads",
                                                             "strides")}
        replaced[id(last)] = [Node("ConvIntegerToFloat", "glassrt", inputs, [last.outputs[0]], attrs, conv.name, 1,
                                   origin=why)]
        dropped.update(id(x) for x in (conv, sums_add, cast, mul) if x is not None and x is not last)
        changes.append(f"ConvInteger '{conv.name}'{' + int32 bias' if b_sums else ''} + Cast + Mul"
                       f"{' + bias' if bias else ''} -> glassrt::ConvIntegerToFloat (w {w.dtype}{list(w.shape)})")

    for mmi in graph.nodes:
        if mmi.op_type != "MatMulInteger" or mmi.domain or len(mmi.inputs) < 2:
            continue
        a_q, w_q = mmi.inputs[0], mmi.inputs[1]
        a_zp = mmi.inputs[2] if len(mmi.inputs) > 2 else ""
        w_zp = mmi.inputs[3] if len(mmi.inputs) > 3 else ""
        w = consts.get(w_q)
        if w is None or w.ndim != 2 or w.dtype != np.int8 or w.size == 0:
            continue
        n = w.shape[1]
        if w_zp and (w_zp not in consts or consts[w_zp].any()):
            continue  # (a nonzero zero point needs MatMulInteger's corrections)
        if a_zp and not _one_value(types, consts, a_zp):
            continue
        found = chain(mmi)
        if found is None:
            continue
        cast, mul, s = found
        found = scales(s, n)
        if found is None or not int8 and not _float_exact(w, w_zp, types.get(a_q), a_zp, consts):
            continue
        a_scale, w_scale = found
        products.add(s)
        add, bias = bias_add(readers, consts, mul.outputs[0], n)
        last = add or mul
        out = last.outputs[0]
        why = origin(mmi, f"MatMulInteger '{mmi.name}', Cast '{cast.name}' and Mul '{mul.name}'"
                          + (f" and bias Add '{add.name}'" if bias else ""))
        inputs = [a_q, w_q, a_scale, w_scale, a_zp, w_zp, bias]
        while not inputs[-1]:
            inputs.pop()
        # where the chain ends: every input is computed by then (the scale product is read there)
        replaced[id(last)] = [Node("MatMulIntegerToFloat", MS, inputs, [out], {}, mmi.name, 1, origin=why)]
        dropped.update(id(x) for x in (mmi, cast, mul) if x is not last)
        changes.append(f"MatMulInteger '{mmi.name}' + Cast + Mul{' + bias' if bias else ''} -> "
                       f"MatMulIntegerToFloat (w int8{list(w.shape)})")
    if not changes:
        return graph, []
    # a scale product nothing reads any more (each layer's a_scale · w_scale) goes too
    nodes = drop_unread(rebuild(graph.nodes, replaced, dropped), graph, products)
    return replace(graph, nodes=nodes, opsets={MS: 1, "glassrt": 1, **graph.opsets}), changes
