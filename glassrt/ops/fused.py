"""Ops glassrt's own passes create: a contract each, with the decomposition that
defines it in plain ONNX (so every provider can run it, and `check` verifies the fused
kernels against it).

  glassrt::FusedConv(X, W, B?, Z?, q_scale?, q_zero_point?) — Conv, plus a residual Z when
  given (ResNet's skip connection), then `activation` (one of CONV_ACTIVATIONS, "" for none)
  with `activation_params`; written by passes/fuse_conv.py. With q_scale, the result is
  then quantized and dequantized with that one scale and zero point (QuantizeLinear then
  DequantizeLinear: a QDQ model's fake-quantized activation), written by
  passes/fuse_conv_qdq.py.
  glassrt::FusedBatchNormalization(X, scale, B, mean, var) — inference BatchNormalization
  followed by `activation`, likewise (pre-activation nets: DenseNet, ResNet v2).
  glassrt::FusedMatMul(A, B, bias?, Z?) — act(alpha·(A @ B) + bias + Z): MatMul with what
  follows it in transformers (a scale, the bias Add, a residual or mask Add, an activation
  such as Gelu); written by passes/fuse_matmul.py. bias broadcasts along the last dim, Z
  into the product's shape (never enlarging it). perm_a / perm_b read A and B transposed,
  perm_y writes the result transposed: attention's head Transposes folded in by
  passes/fold_transposes.py.
  glassrt::ScaledDotProductAttention(Q, K, V, keep?, mask?) — softmax(where(keep,
  scale·Q·Kᵀ, fill) + mask)·V over the last two axes (keep and mask optional, each
  broadcast into the scores); written by passes/fuse_attention.py for attention over a
  KV cache, where one query row per run makes the five ops' per-node costs the bulk.
  glassrt::ChannelShuffle(X) — ShuffleNet's channel shuffle, Reshape(N, g, C/g, ...) →
  Transpose(0, 2, 1, ...) → Reshape(N, C, ...), as one op (`group` = g); written by
  passes/fuse_shuffle.py, so it can run in a layout region (oneDNN's shuffle reads and
  writes NHWC) instead of breaking it.
  glassrt::CacheConcat(past, new) — Concat(past, new) along `axis`, where `past` is a graph
  input and the result a graph output (a KV cache fed back each decode step); written by
  passes/cache_concat.py so that the kernel may append `new` into spare room behind the
  rows of a past it handed out itself, instead of copying the whole cache every step.
  glassrt::CenteredQLinearConv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale,
  y_zero_point, B?) — QLinearConv whose x (`x_centered`) and/or y (`y_centered`) is a
  float32 tensor holding the 8-bit codes minus their zero point: two 8-bit convs in a row
  (a QOperator CNN's expand, depthwise and project convs) hand each other the float32 values
  the first computes and the second convolves, instead of 8-bit bytes converted on the way
  out and back in (passes/center_qlinear_convs.py).
  glassrt::Transfer(X) — X copied from `src_device` to `dst_device`; inserted by placement
  where a value crosses between providers on different devices (primitive: the provider
  on the device side runs it).
"""
from __future__ import annotations

import math

import numpy as np

from .contract import COMPOSITE, PRIMITIVE, OpContract
from .custom_schema import CustomSchema
from .meta.nn import conv as conv_meta
from .meta.nn import conv_shape, matmul_shape
from .meta.shape import concat as concat_meta
from .registry import register_custom

DOMAIN = "glassrt"

_CONV_ATTRS = {"auto_pad": ("str", "NOTSET"), "dilations": ("int[]", []), "group": ("int", 1),
               "kernel_shape": ("int[]", []), "pads": ("int[]", []), "strides": ("int[]", [])}
FUSED_CONV = CustomSchema(DOMAIN, "FusedConv", [("X", False), ("W", False), ("B", True), ("Z", True),
                                                 ("q_scale", True), ("q_zero_point", True)],
                          {**_CONV_ATTRS, "activation": ("str", "Relu"), "activation_params": ("float[]", [])},
                          ["Y"], "glassrt::FusedConv(Tensor X, Tensor W, Tensor? B, Tensor? Z, Tensor? q_scale, "
                                 "Tensor? q_zero_point, str activation, float[] activation_params, "
                                 "<Conv attributes>) -> Tensor")


_BN_ATTRS = {"epsilon": ("float", 1e-5), "momentum": ("float", 0.9)}
FUSED_BATCH_NORM = CustomSchema(DOMAIN, "FusedBatchNormalization",
                                [("X", False), ("scale", False), ("B", False), ("mean", False), ("var", False)],
                                {**_BN_ATTRS, "activation": ("str", "Relu"), "activation_params": ("float[]", [])},
                                ["Y"], "glassrt::FusedBatchNormalization(Tensor X, Tensor scale, Tensor B, Tensor mean, "
                                       "Tensor var, float epsilon, str activation, float[] activation_params) -> Tensor")


FUSED_MATMUL = CustomSchema(DOMAIN, "FusedMatMul", [("A", False), ("B", False), ("bias", True), ("Z", True)],
                             {"alpha": ("float", 1.0), "activation": ("str", ""), "activation_params": ("float[]", []),
                              "perm_a": ("int[]", []), "perm_b": ("int[]", []), "perm_y": ("int[]", [])},
                             ["Y"], "glassrt::FusedMatMul(Tensor A, Tensor B, Tensor? bias, Tensor? Z, float alpha, "
                                    "str activation, float[] activation_params, int[] perm_a, int[] perm_b, "
                                    "int[] perm_y) -> Tensor")
# perm_a / perm_b / perm_y: A and B read transposed by these perms, the result written
# transposed by perm_y ([]: as they are), for Transposes folded in (passes/fold_transposes.py)
PERM_ATTRS = ("perm_a", "perm_b", "perm_y")
# The activations FusedConv and FusedBatchNormalization apply, with their parameters: LeakyRelu
# (alpha; 0.01 when omitted), Clip (lo, hi), HardSigmoid (alpha, beta: clamp(alpha·y + beta, 0, 1)),
# Swish (y·Sigmoid(y), SiLU) and HardSwish (alpha, beta: y·HardSigmoid(y); the HardSwish op is
# alpha 1/6, beta 1/2).
CONV_ACTIVATIONS = {"": 0, "Relu": 0, "LeakyRelu": (0, 1), "Clip": 2, "Sigmoid": 0, "HardSigmoid": 2, "Swish": 0,
                    "HardSwish": 2}
# The activations FusedMatMul applies (Gelu: the exact, erf form; GeluTanh: Gelu with
# approximate="tanh").
MATMUL_ACTIVATIONS = ("", "Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh", "Gelu", "GeluTanh")


def _fused_decomposition(op_type, own_attrs, opset):
    """Decomposition of a fused node: `op_type` with its own attributes, then the activation."""

    def decompose(node, input_types, visible):
        return _with_activation(node, op_type, {k: v for k, v in node.attrs.items() if k in own_attrs},
                                input_types, visible, opset)

    return decompose


def _with_activation(node, op_type, op_attrs, input_types, visible, opset):
    from onnx import helper, numpy_helper

    from ..onnx_io import nodes_from_protos

    act = node.attrs.get("activation", "" if op_type == "MatMul" else "Relu")  # (each schema's default)
    params = list(node.attrs.get("activation_params") or [])
    mid = f"{node.name}/{op_type.lower()}_out"
    inputs, residual, quantize = list(node.inputs), None, []
    if op_type == "Conv" and len(inputs) > 3:
        inputs, residual, quantize = inputs[:3], inputs[3] or None, [i for i in inputs[4:6] if i]
    protos, outputs = [], list(node.outputs)
    if quantize:  # the activation's output, then QuantizeLinear and DequantizeLinear
        outputs = [f"{mid}/activated"]
    if op_type == "MatMul":
        inputs, bias, residual = inputs[:2], (inputs + ["", ""])[2], (inputs + ["", ""])[3] or None
        alpha = float(node.attrs.get("alpha", 1.0))
        for i, which in enumerate(("perm_a", "perm_b")):
            if node.attrs.get(which):
                protos.append(helper.make_node("Transpose", [inputs[i]], [f"{mid}/{which}"], name=f"{node.name}/{which}",
                                               perm=list(node.attrs[which])))
                inputs[i] = f"{mid}/{which}"
        if node.attrs.get("perm_y"):
            outputs = [f"{mid}/unpermuted"]
        protos.append(helper.make_node("MatMul", inputs, [mid], name=f"{node.name}/matmul"))
        if alpha != 1.0:
            dt = input_types[0].dtype if input_types and input_types[0] is not None else np.float32
            protos.append(helper.make_node("Constant", [], [mid + "/alpha"], name=f"{node.name}/alpha",
                                           value=numpy_helper.from_array(np.array(alpha, dtype=dt))))
            protos.append(helper.make_node("Mul", [mid, mid + "/alpha"], [mid + "*alpha"], name=f"{node.name}/scale"))
            mid += "*alpha"
        if bias:
            protos.append(helper.make_node("Add", [mid, bias], [mid + "+bias"], name=f"{node.name}/bias"))
            mid += "+bias"
    else:
        protos.append(helper.make_node(op_type, inputs, [mid], name=f"{node.name}/{op_type.lower()}", **op_attrs))
    if residual:
        protos.append(helper.make_node("Add", [mid, residual], [mid + "+z"], name=f"{node.name}/residual"))
        mid += "+z"
    if not act:
        protos.append(helper.make_node("Identity", [mid], outputs, name=f"{node.name}/out"))
    elif act == "Clip":
        lo, hi = (f"{node.name}/clip_min", f"{node.name}/clip_max")
        dt = input_types[0].dtype if input_types and input_types[0] is not None else np.float32
        for name, v in ((lo, params[0]), (hi, params[1])):
            protos.append(helper.make_node("Constant", [], [name], name=name,
                                           value=numpy_helper.from_array(np.array(v, dtype=dt))))
        protos.append(helper.make_node("Clip", [mid, lo, hi], outputs, name=f"{node.name}/act"))
    elif act == "GeluTanh":
        protos.append(helper.make_node("Gelu", [mid], outputs, name=f"{node.name}/act", approximate="tanh"))
    elif act in ("HardSigmoid", "HardSwish"):
        gate = outputs if act == "HardSigmoid" else [f"{mid}/gate"]
        protos.append(helper.make_node("HardSigmoid", [mid], gate, name=f"{node.name}/gate", alpha=params[0],
                                       beta=params[1]))
        if act == "HardSwish":
            protos.append(helper.make_node("Mul", [mid, gate[0]], outputs, name=f"{node.name}/act"))
    elif act == "Swish":
        protos.append(helper.make_node("Sigmoid", [mid], [f"{mid}/gate"], name=f"{node.name}/gate"))
        protos.append(helper.make_node("Mul", [mid, f"{mid}/gate"], outputs, name=f"{node.name}/act"))
    else:
        extra = {"alpha": params[0]} if act == "LeakyRelu" and params else {}
        protos.append(helper.make_node(act, [mid], outputs, name=f"{node.name}/act", **extra))
    if quantize:
        protos.append(helper.make_node("QuantizeLinear", [outputs[0], *quantize], [f"{mid}/q"], name=f"{node.name}/quantize"))
        protos.append(helper.make_node("DequantizeLinear", [f"{mid}/q", *quantize], list(node.outputs),
                                       name=f"{node.name}/dequantize"))
    elif outputs != list(node.outputs):
        protos.append(helper.make_node("Transpose", outputs, list(node.outputs), name=f"{node.name}/perm_y",
                                       perm=list(node.attrs["perm_y"])))
    return nodes_from_protos(protos, {"": opset}, visible, f"expanded from {node.op_type} '{node.name}'")


def _check_activation(ctx):
    """FusedConv's and FusedBatchNormalization's activation is one they define, with its
    number of parameters."""
    act = ctx.attr("activation", "Relu")
    n = len(ctx.attr("activation_params", []) or [])
    if act not in CONV_ACTIVATIONS:
        ctx.fail(f"activation '{act}' is not one of {', '.join(a for a in CONV_ACTIVATIONS if a)}")
    want = CONV_ACTIVATIONS[act]
    if n not in (want if isinstance(want, tuple) else (want,)):
        ctx.fail(f"activation {act} takes {' or '.join(map(str, want)) if isinstance(want, tuple) else want} "
                 f"activation_params, got {n}")


def fused_conv_quantizes(node) -> bool:
    """Whether a glassrt::FusedConv quantizes its output (its q_scale, input 4, is given)."""
    return node.op_type == "FusedConv" and node.domain == DOMAIN and len(node.inputs) > 4 and bool(node.inputs[4])


def _fused_bn_meta(ctx):
    _check_activation(ctx)
    return _same_as_x(ctx)


def _fused_conv_meta(ctx):
    """Conv's rule; a residual Z must be exactly the output (the kernels add it without
    broadcasting); q_scale and q_zero_point are QuantizeDequantize's (one value each), the
    zero point only with a scale."""
    _check_activation(ctx)
    if ctx.has(5) and not ctx.has(4):
        ctx.fail("q_zero_point is given without q_scale")
    if ctx.has(4):
        if ctx.dtype(0) is not None and ctx.dtype(0) != np.float32:
            ctx.fail(f"X must be float32 to be quantized (q_scale), got {ctx.dtype(0)}")
        _check_quantize_params(ctx, 4, 5, "q_")
    out = conv_meta(ctx)
    if ctx.has(3):
        y, z = out[0], ctx.type(3)
        if ctx.dtype(3) != y.dtype:
            ctx.fail(f"residual input Z must have the output's dtype {y.dtype}, got {ctx.dtype(3)}")
        if y.shape is not None and z.shape is not None and (
                len(z.shape) != len(y.shape)
                or any(isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(y.shape, z.shape))):
            ctx.fail(f"residual input Z must have the output's shape {list(y.shape)}, got {list(z.shape)}")
    return out


def _fused_matmul_meta(ctx):
    """MatMul's rule on A and B as their perms read them; bias broadcasts along the last dim
    only, Z into the product's shape; Y is the product transposed by perm_y."""
    a, b = (_permuted(ctx, ctx.shape(i), ctx.attr(which, []), which) for i, which in ((0, "perm_a"), (1, "perm_b")))
    y = matmul_shape(ctx, a, b)
    out = [ctx.tensor(ctx.dtype(0), _permuted(ctx, y, ctx.attr("perm_y", []), "perm_y"))]
    act = ctx.attr("activation", "")
    if act not in MATMUL_ACTIVATIONS:
        ctx.fail(f"activation '{act}' is not one of {', '.join(a for a in MATMUL_ACTIVATIONS if a)}")
    for i, what in ((2, "bias"), (3, "residual input Z")):
        if not ctx.has(i):
            continue
        if ctx.dtype(i) != out[0].dtype:
            ctx.fail(f"{what} must have the output's dtype {out[0].dtype}, got {ctx.dtype(i)}")
        s = ctx.shape(i)
        if s is None or y is None:
            continue
        if i == 2 and not bias_fits(s, y):
            ctx.fail(f"bias must broadcast along the last dim only, got shape {list(s)}")
        if not fits_into(s, y):
            ctx.fail(f"{what} of shape {list(s)} must broadcast into the product's shape {list(y)}")
    return out


def _permuted(ctx, shape, perm, which):
    """shape transposed by perm ([]: as it is); a perm that is not one of its dims fails."""
    if not perm or shape is None:
        return shape
    if sorted(int(p) for p in perm) != list(range(len(shape))):
        ctx.fail(f"{which} {list(perm)} is not a permutation of the {len(shape)} dims of {list(shape)}")
    return tuple(shape[int(p)] for p in perm)


def fits_into(s, y) -> bool:
    """Shape s broadcasts into shape y without enlarging it (every dim 1 or y's own)."""
    if len(s) > len(y):
        return False
    return all((isinstance(d, int) and d == 1) or d == e for d, e in zip(s, y[len(y) - len(s):]))


def may_fit_into(s, y) -> bool:
    """fits_into where it can be told from the shapes; a symbolic dim against another dim
    may fit (a causal mask's length `t` against the scores' `past + s`): the kernel's
    broadcast checks it at run time."""
    if len(s) > len(y):
        return False
    return all((isinstance(d, int) and d == 1) or d == e or not (isinstance(d, int) and isinstance(e, int))
               for d, e in zip(s, y[len(y) - len(s):]))


def bias_fits(s, y) -> bool:
    """Shape s is a bias: ones, then the product's last dim (or 1)."""
    return fits_into(s, y) and all(isinstance(d, int) and d == 1 for d in s[:-1])


def _same_as_x(ctx):
    return [ctx.tensor(ctx.dtype(0), ctx.shape(0))]


register_custom(OpContract(DOMAIN, "FusedConv", 1, FUSED_CONV, meta=_fused_conv_meta, category=COMPOSITE,
                           decomposition=_fused_decomposition("Conv", _CONV_ATTRS, 13),
                           notes=["Conv [+ residual] + activation [+ QuantizeLinear, DequantizeLinear], fused by "
                                  "passes/fuse_conv.py and passes/fuse_conv_qdq.py"]))
register_custom(OpContract(DOMAIN, "FusedMatMul", 1, FUSED_MATMUL, meta=_fused_matmul_meta, category=COMPOSITE,
                           decomposition=_fused_decomposition("MatMul", (), 20),
                           notes=["MatMul + scale + bias + residual + activation, fused by passes/fuse_matmul.py"]))
register_custom(OpContract(DOMAIN, "FusedBatchNormalization", 1, FUSED_BATCH_NORM, meta=_fused_bn_meta, category=COMPOSITE,
                           decomposition=_fused_decomposition("BatchNormalization", ("epsilon",), 15),
                           notes=["inference BatchNormalization + activation, fused by passes/fuse_conv.py"]))


SDPA = CustomSchema(DOMAIN, "ScaledDotProductAttention",
                    [("Q", False), ("K", False), ("V", False), ("keep", True), ("mask", True)],
                    {"scale": ("float", 1.0), "fill": ("float", 0.0)}, ["Y"],
                    "glassrt::ScaledDotProductAttention(Tensor Q, Tensor K, Tensor V, Tensor? keep, Tensor? mask, "
                    "float scale, float fill) -> Tensor")


def _sdpa_meta(ctx):
    """Q (..., S, D), K (..., T, D), V (..., T, Dv) with the same leading dims -> (..., S, Dv);
    keep (bool) and mask (Q's dtype) broadcast into the scores (..., S, T) without enlarging them."""
    q, k, v = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    dt = ctx.dtype(0)
    for i, what in ((1, "K"), (2, "V")):
        if ctx.dtype(i) != dt:
            ctx.fail(f"{what} must have Q's dtype {dt}, got {ctx.dtype(i)}")
    if q is None or k is None or v is None:
        return [ctx.tensor(dt, None)]
    if not (len(q) == len(k) == len(v) >= 2):
        ctx.fail(f"Q, K and V must have one rank >= 2, got {list(q)}, {list(k)}, {list(v)}")

    def differ(a, b):
        return isinstance(a, int) and isinstance(b, int) and a != b

    if any(differ(a, b) or differ(a, c) for a, b, c in zip(q[:-2], k[:-2], v[:-2])):
        ctx.fail(f"Q, K and V must have the same leading dims, got {list(q)}, {list(k)}, {list(v)}")
    if differ(q[-1], k[-1]) or differ(k[-2], v[-2]):
        ctx.fail(f"Q's last dim must be K's and K's rows V's, got {list(q)}, {list(k)}, {list(v)}")
    scores = tuple(q[:-1]) + (k[-2],)
    for i, what, want in ((3, "keep", np.dtype(np.bool_)), (4, "mask", dt)):
        if not ctx.has(i):
            continue
        if ctx.dtype(i) != want:
            ctx.fail(f"{what} must be {want}, got {ctx.dtype(i)}")
        s = ctx.shape(i)
        if s is not None and not may_fit_into(s, scores):
            ctx.fail(f"{what} of shape {list(s)} must broadcast into the scores' shape {list(scores)}")
    return [ctx.tensor(dt, tuple(q[:-1]) + (v[-1],))]


def _sdpa_decomposition(node, input_types, visible):
    """Transpose K, MatMul, Mul by scale, Where(keep, ., fill), Add mask, Softmax, MatMul."""
    from onnx import helper, numpy_helper

    from ..onnx_io import nodes_from_protos

    q, k, v, keep, mask = (list(node.inputs) + ["", ""])[:5]
    name = node.name
    rank = len(input_types[1].shape) if input_types[1] is not None and input_types[1].shape is not None else None
    if rank is None:
        raise ValueError("K's rank must be known to decompose ScaledDotProductAttention")
    dt = input_types[0].dtype
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    protos = [helper.make_node("Transpose", [k], [f"{name}/kt"], name=f"{name}/kt", perm=perm),
              helper.make_node("MatMul", [q, f"{name}/kt"], [f"{name}/qk"], name=f"{name}/qk")]
    cur = f"{name}/qk"

    def const(suffix, value):
        protos.append(helper.make_node("Constant", [], [f"{name}/{suffix}"], name=f"{name}/{suffix}",
                                       value=numpy_helper.from_array(np.array(value, dtype=dt))))
        return f"{name}/{suffix}"

    scale = float(node.attrs.get("scale", 1.0))
    if scale != 1.0:
        protos.append(helper.make_node("Mul", [cur, const("scale", scale)], [f"{name}/scaled"], name=f"{name}/scaled"))
        cur = f"{name}/scaled"
    if keep:
        fill = const("fill", float(node.attrs.get("fill", 0.0)))
        protos.append(helper.make_node("Where", [keep, cur, fill], [f"{name}/kept"], name=f"{name}/kept"))
        cur = f"{name}/kept"
    if mask:
        protos.append(helper.make_node("Add", [cur, mask], [f"{name}/masked"], name=f"{name}/masked"))
        cur = f"{name}/masked"
    protos += [helper.make_node("Softmax", [cur], [f"{name}/p"], name=f"{name}/softmax", axis=-1),
               helper.make_node("MatMul", [f"{name}/p", v], list(node.outputs), name=f"{name}/pv")]
    return nodes_from_protos(protos, {"": 13}, visible, f"expanded from ScaledDotProductAttention '{name}'")


register_custom(OpContract(DOMAIN, "ScaledDotProductAttention", 1, SDPA, meta=_sdpa_meta, category=COMPOSITE,
                           decomposition=_sdpa_decomposition,
                           notes=["Q·Kᵀ, scale, keep/mask, Softmax, ·V of attention over a KV cache, "
                                  "fused by passes/fuse_attention.py"]))


CHANNEL_SHUFFLE = CustomSchema(DOMAIN, "ChannelShuffle", [("X", False)], {"group": ("int", 1)}, ["Y"],
                               "glassrt::ChannelShuffle(Tensor X, int group) -> Tensor")


def _channel_shuffle_meta(ctx):
    x, g = ctx.shape(0), int(ctx.attr("group", 1))
    if g < 1:
        ctx.fail(f"group must be >= 1, got {g}")
    if x is not None:
        if len(x) < 2:
            ctx.fail(f"X must have a channel axis (rank >= 2), got rank {len(x)}")
        if isinstance(x[1], int) and x[1] % g:
            ctx.fail(f"{x[1]} channels do not split into {g} groups")
    return [ctx.tensor(ctx.dtype(0), x)]


def _channel_shuffle_decomposition(node, input_types, visible):
    """Reshape(N, g, C/g, rest) → Transpose(0, 2, 1, 3) → Reshape back to X's shape."""
    from onnx import helper, numpy_helper

    from ..onnx_io import nodes_from_protos

    g = int(node.attrs.get("group", 1))
    x, y, name = node.inputs[0], node.outputs[0], node.name
    c = input_types[0].shape[1] if input_types and input_types[0] is not None and input_types[0].shape else None
    if not isinstance(c, int):
        raise ValueError("the channel count must be known to decompose ChannelShuffle")
    protos = [helper.make_node("Constant", [], [f"{name}/split"], name=f"{name}/split_shape",
                               value=numpy_helper.from_array(np.array([0, g, c // g, -1], np.int64))),
              helper.make_node("Reshape", [x, f"{name}/split"], [f"{name}/groups"], name=f"{name}/split"),
              helper.make_node("Transpose", [f"{name}/groups"], [f"{name}/swapped"], name=f"{name}/swap",
                               perm=[0, 2, 1, 3]),
              helper.make_node("Shape", [x], [f"{name}/shape"], name=f"{name}/shape"),
              helper.make_node("Reshape", [f"{name}/swapped", f"{name}/shape"], [y], name=f"{name}/merge")]
    return nodes_from_protos(protos, {"": 14}, visible, f"expanded from ChannelShuffle '{name}'")


register_custom(OpContract(DOMAIN, "ChannelShuffle", 1, CHANNEL_SHUFFLE, meta=_channel_shuffle_meta,
                           category=COMPOSITE, decomposition=_channel_shuffle_decomposition,
                           notes=["Reshape + Transpose + Reshape of a channel shuffle, fused by passes/fuse_shuffle.py"]))


CACHE_CONCAT = CustomSchema(DOMAIN, "CacheConcat", [("past", False), ("new", False)], {"axis": ("int", 0)},
                            ["present"], "glassrt::CacheConcat(Tensor past, Tensor new, int axis) -> Tensor")


def _cache_concat_decomposition(node, input_types, visible):
    """One Concat of the same inputs along the same axis."""
    from onnx import helper

    from ..onnx_io import nodes_from_protos

    protos = [helper.make_node("Concat", list(node.inputs), list(node.outputs), name=node.name,
                               axis=int(node.attrs.get("axis", 0)))]
    return nodes_from_protos(protos, {"": 13}, visible, f"expanded from CacheConcat '{node.name}'")


register_custom(OpContract(DOMAIN, "CacheConcat", 1, CACHE_CONCAT, meta=concat_meta, category=COMPOSITE,
                           decomposition=_cache_concat_decomposition,
                           notes=["a KV cache's Concat (graph input + new rows -> graph output), marked by "
                                  "passes/cache_concat.py"]))


TRANSFER = CustomSchema(DOMAIN, "Transfer", [("X", False)], {"src_device": ("str", "cpu"), "dst_device": ("str", "cpu")},
                        ["Y"], "glassrt::Transfer(Tensor X, str src_device, str dst_device) -> Tensor")
register_custom(OpContract(DOMAIN, "Transfer", 1, TRANSFER, meta=lambda ctx: [ctx.type(0)], category=PRIMITIVE,
                           notes=["a copy between devices, inserted by placement (runtime/placement.py)"]))


QUANTIZE_DEQUANTIZE = CustomSchema(DOMAIN, "QuantizeDequantize", [("X", False), ("scale", False), ("zero_point", True)],
                                   {}, ["Y"], "glassrt::QuantizeDequantize(Tensor X, Tensor scale, Tensor? zero_point) "
                                              "-> Tensor")


def _quantize_dequantize_meta(ctx):
    if ctx.dtype(0) is not None and ctx.dtype(0) != np.float32:
        ctx.fail(f"X must be float32, got {ctx.dtype(0)}")
    _check_quantize_params(ctx, 1, 2)
    return [ctx.tensor(np.float32, ctx.shape(0))]


def _check_quantize_params(ctx, scale: int, zero: int, prefix: str = ""):
    """A per-tensor quantization's scale and zero point, inputs `scale` and `zero`: one
    value each, float32 and 8-bit."""
    for i, what in ((scale, "scale"), (zero, "zero_point")):
        shape = ctx.shape(i) if ctx.has(i) else None
        if shape is not None and math.prod(d if isinstance(d, int) else 2 for d in shape) != 1:
            ctx.fail(f"{prefix}{what} must hold one value (per-tensor quantization), got shape {list(shape)}")
    if ctx.has(scale) and ctx.dtype(scale) not in (None, np.float32):
        ctx.fail(f"{prefix}scale must be float32, got {ctx.dtype(scale)}")
    if ctx.has(zero) and ctx.dtype(zero) not in (None, np.uint8, np.int8):
        ctx.fail(f"{prefix}zero_point must be uint8 or int8, got {ctx.dtype(zero)}")


def _quantize_dequantize_decomposition(node, input_types, visible):
    """QuantizeLinear, then DequantizeLinear with the same scale and zero point."""
    from onnx import helper

    from ..onnx_io import nodes_from_protos

    x, name = node.inputs[0], node.name
    params = [i for i in node.inputs[1:3] if i]
    protos = [helper.make_node("QuantizeLinear", [x, *params], [f"{name}/q"], name=f"{name}/quantize"),
              helper.make_node("DequantizeLinear", [f"{name}/q", *params], [node.outputs[0]], name=f"{name}/dequantize")]
    return nodes_from_protos(protos, {"": 13}, visible, f"expanded from QuantizeDequantize '{name}'")


register_custom(OpContract(DOMAIN, "QuantizeDequantize", 1, QUANTIZE_DEQUANTIZE, meta=_quantize_dequantize_meta,
                           category=COMPOSITE, decomposition=_quantize_dequantize_decomposition,
                           notes=["QuantizeLinear then DequantizeLinear with the same per-tensor scale and zero "
                                  "point (a QDQ model's activations), fused by passes/fuse_qdq.py"]))


CENTERED_QLINEAR_CONV = CustomSchema(
    DOMAIN, "CenteredQLinearConv",
    [("x", False), ("x_scale", False), ("x_zero_point", False), ("w", False), ("w_scale", False),
     ("w_zero_point", False), ("y_scale", False), ("y_zero_point", False), ("B", True)],
    {**_CONV_ATTRS, "x_centered": ("int", 0), "y_centered": ("int", 0)}, ["y"],
    "glassrt::CenteredQLinearConv(Tensor x, Tensor x_scale, Tensor x_zero_point, Tensor w, Tensor w_scale, "
    "Tensor w_zero_point, Tensor y_scale, Tensor y_zero_point, Tensor? B, int x_centered, int y_centered, "
    "<Conv attributes>) -> Tensor")


def _centered_qlinear_conv_meta(ctx):
    """QLinearConv's rule, but a centered x is float32 and a centered y float32."""
    for i, what in ((2, "x_zero_point"), (7, "y_zero_point")):
        if ctx.dtype(i) is not None and ctx.dtype(i) not in (np.uint8, np.int8):
            ctx.fail(f"{what} must be uint8 or int8, got {ctx.dtype(i)}")
    want_x = np.dtype(np.float32) if int(ctx.attr("x_centered", 0)) else ctx.dtype(2)
    if ctx.dtype(0) is not None and want_x is not None and ctx.dtype(0) != want_x:
        why = "x_centered: x - x_zero_point" if want_x == np.float32 else "x_zero_point's type"
        ctx.fail(f"x must be {want_x} ({why}), got {ctx.dtype(0)}")
    y_dt = np.dtype(np.float32) if int(ctx.attr("y_centered", 0)) else ctx.dtype(7)
    return [ctx.tensor(y_dt, conv_shape(ctx, 0, 3, 8))]


def _centered_qlinear_conv_decomposition(node, input_types, visible):
    """x = Cast(x + x_zero_point) where x is centered; QLinearConv; y - y_zero_point in float32
    where y is centered."""
    from onnx import TensorProto, helper

    from ..dtypes import elem_type
    from ..onnx_io import nodes_from_protos

    name, inputs = node.name, list(node.inputs)
    conv_attrs = {k: v for k, v in node.attrs.items() if k in _CONV_ATTRS}
    protos, out = [], list(node.outputs)
    if int(node.attrs.get("x_centered", 0)):
        xz_type = elem_type(input_types[2].dtype) if input_types and input_types[2] is not None else TensorProto.UINT8
        protos += [helper.make_node("Cast", [inputs[2]], [f"{name}/xz"], name=f"{name}/xz", to=TensorProto.FLOAT),
                   helper.make_node("Add", [inputs[0], f"{name}/xz"], [f"{name}/x+xz"], name=f"{name}/uncenter"),
                   helper.make_node("Cast", [f"{name}/x+xz"], [f"{name}/x"], name=f"{name}/x", to=xz_type)]
        inputs[0] = f"{name}/x"
    y_centered = int(node.attrs.get("y_centered", 0))
    protos.append(helper.make_node("QLinearConv", inputs, [f"{name}/y"] if y_centered else out, name=f"{name}/conv",
                                   **conv_attrs))
    if y_centered:
        protos += [helper.make_node("Cast", [f"{name}/y"], [f"{name}/yf"], name=f"{name}/yf", to=TensorProto.FLOAT),
                   helper.make_node("Cast", [inputs[7]], [f"{name}/yz"], name=f"{name}/yz", to=TensorProto.FLOAT),
                   helper.make_node("Sub", [f"{name}/yf", f"{name}/yz"], out, name=f"{name}/center")]
    return nodes_from_protos(protos, {"": 13}, visible, f"expanded from CenteredQLinearConv '{name}'")


register_custom(OpContract(DOMAIN, "CenteredQLinearConv", 1, CENTERED_QLINEAR_CONV, meta=_centered_qlinear_conv_meta,
                           category=COMPOSITE, decomposition=_centered_qlinear_conv_decomposition,
                           notes=["QLinearConv reading and/or writing its 8-bit codes minus their zero point as "
                                  "float32 (two 8-bit convs in a row), written by passes/center_qlinear_convs.py"]))


LOOKUP_TABLE = CustomSchema(DOMAIN, "LookupTable", [("X", False), ("table", False)], {}, ["Y"],
                            "glassrt::LookupTable(Tensor X, Tensor table) -> Tensor")


def _lookup_table_meta(ctx):
    if ctx.dtype(0) is not None and ctx.dtype(0) not in (np.uint8, np.int8):
        ctx.fail(f"X must be uint8 or int8 (its byte indexes the table), got {ctx.dtype(0)}")
    table = ctx.shape(1)
    if table is not None and tuple(table) != (256,):
        ctx.fail(f"table must hold 256 values, one per byte, got shape {list(table)}")
    return [ctx.tensor(ctx.dtype(1), ctx.shape(0))]


def _lookup_table_decomposition(node, input_types, visible):
    """Gather(table, X as int64): an int8 X's negative values index from the end, which is
    where their bytes' entries lie (byte = x + 256)."""
    from onnx import TensorProto, helper

    from ..onnx_io import nodes_from_protos

    x, table = node.inputs[0], node.inputs[1]
    name = node.name
    protos = [helper.make_node("Cast", [x], [f"{name}/index"], name=f"{name}/index", to=TensorProto.INT64),
              helper.make_node("Gather", [table, f"{name}/index"], [node.outputs[0]], name=f"{name}/gather", axis=0)]
    return nodes_from_protos(protos, {"": 13}, visible, f"expanded from LookupTable '{name}'")


register_custom(OpContract(DOMAIN, "LookupTable", 1, LOOKUP_TABLE, meta=_lookup_table_meta, category=COMPOSITE,
                           decomposition=_lookup_table_decomposition,
                           notes=["Y = table[byte of X]: an 8-bit elementwise chain of one input as one table "
                                  "(a quantized SiLU), fused by passes/fuse_lookup.py"]))


CONV_INTEGER_TO_FLOAT = CustomSchema(
    DOMAIN, "ConvIntegerToFloat",
    [("X", False), ("W", False), ("x_zero_point", True), ("w_zero_point", True), ("scale", False), ("B", True),
     ("B_sums", True)],
    dict(_CONV_ATTRS), ["Y"], "glassrt::ConvIntegerToFloat(Tensor X, Tensor W, Tensor? x_zero_point, "
                              "Tensor? w_zero_point, Tensor scale, Tensor? B, Tensor? B_sums, <Conv attributes>) "
                              "-> Tensor")


def _conv_integer_to_float_meta(ctx):
    """ConvInteger's output shape, float32; the scale, B and B_sums must broadcast into it (one
    value, or one per output channel, laid along axis 1)."""
    if ctx.dtype(0) is not None and ctx.dtype(0) not in (np.uint8, np.int8):
        ctx.fail(f"X must be uint8 or int8, got {ctx.dtype(0)}")
    shape = conv_shape(ctx, 0, 1, None)
    for i, what, dt in ((4, "scale", np.float32), (5, "B", np.float32), (6, "B_sums", np.int32)):
        if not ctx.has(i):
            continue
        if ctx.dtype(i) not in (None, dt):
            ctx.fail(f"{what} must be {np.dtype(dt).name}, got {ctx.dtype(i)}")
        s = ctx.shape(i)
        if shape is not None and s is not None and (len(s) > len(shape) or any(
                isinstance(a, int) and isinstance(b, int) and a not in (1, b) for a, b in zip(s[::-1], shape[::-1]))):
            ctx.fail(f"{what} {list(s)} does not broadcast into the output {list(shape)} (it would change its shape)")
    return [ctx.tensor(np.float32, shape)]


def _conv_integer_to_float_decomposition(node, input_types, visible):
    """ConvInteger [-> Add(B_sums)] -> Cast(float) -> Mul(scale) [-> Add(B)]: the chain a
    quantize_dynamic model writes after each ConvInteger (older ones add an int32 bias to
    the sums, newer ones a float32 bias to the scaled result)."""
    from onnx import TensorProto, helper

    from ..onnx_io import nodes_from_protos

    x, w, xz, wz, scale, b, b_sums = (node.inputs + [""] * 7)[:7]
    name, y = node.name, node.outputs[0]
    attrs = {k: v for k, v in node.attrs.items() if k in _CONV_ATTRS}
    ints = [x, w, xz, wz]
    while not ints[-1]:
        ints.pop()
    protos = [helper.make_node("ConvInteger", ints, [f"{name}/sums"], name=f"{name}/conv", **attrs)]
    sums = f"{name}/sums"
    if b_sums:
        protos.append(helper.make_node("Add", [sums, b_sums], [f"{name}/biased"], name=f"{name}/bias_sums"))
        sums = f"{name}/biased"
    protos += [helper.make_node("Cast", [sums], [f"{name}/float"], name=f"{name}/cast", to=TensorProto.FLOAT),
               helper.make_node("Mul", [f"{name}/float", scale], [f"{name}/scaled" if b else y], name=f"{name}/scale")]
    if b:
        protos.append(helper.make_node("Add", [f"{name}/scaled", b], [y], name=f"{name}/bias"))
    return nodes_from_protos(protos, {"": 13}, visible, f"expanded from ConvIntegerToFloat '{name}'")


register_custom(OpContract(DOMAIN, "ConvIntegerToFloat", 1, CONV_INTEGER_TO_FLOAT, meta=_conv_integer_to_float_meta,
                           category=COMPOSITE, decomposition=_conv_integer_to_float_decomposition,
                           notes=["float32(ConvInteger(X, W, x_zero_point, w_zero_point) + B_sums) * scale + B: a "
                                  "dynamically quantized convolution (quantize_dynamic's chain), fused by "
                                  "passes/fuse_matmul_integer.py"]))
