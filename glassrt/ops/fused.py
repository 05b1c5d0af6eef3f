"""Ops glassrt's own passes create: a contract each, with the decomposition that
defines it in plain ONNX (so every provider can run it, and `check` verifies the fused
kernels against it).

  glassrt::FusedConv(X, W, B?, Z?) — Conv, plus a residual Z when given (ResNet's skip
  connection), then `activation` (Relu, LeakyRelu, Clip, Sigmoid, or "" for none) with
  `activation_params`; written by passes/fusion.py.
  glassrt::FusedBatchNormalization(X, scale, B, mean, var) — inference BatchNormalization
  followed by `activation`, likewise (pre-activation nets: DenseNet, ResNet v2).
  glassrt::Transfer(X) — X copied from `src_device` to `dst_device`; inserted by placement
  where a value crosses between providers on different devices (primitive: the provider
  on the device side runs it).
"""
from __future__ import annotations

from onnx import helper, numpy_helper

import numpy as np

from .contract import COMPOSITE, PRIMITIVE, OpContract
from .custom_schema import CustomSchema
from .meta.nn import conv as conv_meta
from .registry import register_custom

DOMAIN = "glassrt"

_CONV_ATTRS = {"auto_pad": ("str", "NOTSET"), "dilations": ("int[]", []), "group": ("int", 1),
               "kernel_shape": ("int[]", []), "pads": ("int[]", []), "strides": ("int[]", [])}
FUSED_CONV = CustomSchema(DOMAIN, "FusedConv", [("X", False), ("W", False), ("B", True), ("Z", True)],
                          {**_CONV_ATTRS, "activation": ("str", "Relu"), "activation_params": ("float[]", [])},
                          ["Y"], "glassrt::FusedConv(Tensor X, Tensor W, Tensor? B, Tensor? Z, str activation, "
                                 "float[] activation_params, <Conv attributes>) -> Tensor")


_BN_ATTRS = {"epsilon": ("float", 1e-5), "momentum": ("float", 0.9)}
FUSED_BATCH_NORM = CustomSchema(DOMAIN, "FusedBatchNormalization",
                                [("X", False), ("scale", False), ("B", False), ("mean", False), ("var", False)],
                                {**_BN_ATTRS, "activation": ("str", "Relu"), "activation_params": ("float[]", [])},
                                ["Y"], "glassrt::FusedBatchNormalization(Tensor X, Tensor scale, Tensor B, Tensor mean, "
                                       "Tensor var, float epsilon, str activation, float[] activation_params) -> Tensor")


def _fused_decomposition(op_type, own_attrs, opset):
    """Decomposition of a fused node: `op_type` with its own attributes, then the activation."""

    def decompose(node, input_types, visible):
        return _with_activation(node, op_type, {k: v for k, v in node.attrs.items() if k in own_attrs},
                                input_types, visible, opset)

    return decompose


def _with_activation(node, op_type, op_attrs, input_types, visible, opset):
    from ..onnx_io import nodes_from_protos

    act = node.attrs.get("activation", "Relu")
    params = list(node.attrs.get("activation_params") or [])
    mid = f"{node.name}/{op_type.lower()}_out"
    inputs, residual = list(node.inputs), None
    if op_type == "Conv" and len(inputs) > 3:
        inputs, residual = inputs[:3], inputs[3] or None
    protos = [helper.make_node(op_type, inputs, [mid], name=f"{node.name}/{op_type.lower()}", **op_attrs)]
    if residual:
        protos.append(helper.make_node("Add", [mid, residual], [mid + "+z"], name=f"{node.name}/residual"))
        mid += "+z"
    if not act:
        protos.append(helper.make_node("Identity", [mid], list(node.outputs), name=f"{node.name}/out"))
    elif act == "Clip":
        lo, hi = (f"{node.name}/clip_min", f"{node.name}/clip_max")
        dt = input_types[0].dtype if input_types and input_types[0] is not None else np.float32
        for name, v in ((lo, params[0]), (hi, params[1])):
            protos.append(helper.make_node("Constant", [], [name], name=name,
                                           value=numpy_helper.from_array(np.array(v, dtype=dt))))
        protos.append(helper.make_node("Clip", [mid, lo, hi], list(node.outputs), name=f"{node.name}/act"))
    else:
        extra = {"alpha": params[0]} if act == "LeakyRelu" and params else {}
        protos.append(helper.make_node(act, [mid], list(node.outputs), name=f"{node.name}/act", **extra))
    return nodes_from_protos(protos, {"": opset}, visible, f"expanded from {node.op_type} '{node.name}'")


def _fused_conv_meta(ctx):
    """Conv's rule; a residual Z must be exactly the output (the kernels add it without
    broadcasting)."""
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


def _same_as_x(ctx):
    return [ctx.tensor(ctx.dtype(0), ctx.shape(0))]


register_custom(OpContract(DOMAIN, "FusedConv", 1, FUSED_CONV, meta=_fused_conv_meta, category=COMPOSITE,
                           decomposition=_fused_decomposition("Conv", _CONV_ATTRS, 13),
                           notes=["Conv [+ residual] + activation, fused by passes/fusion.py"]))
register_custom(OpContract(DOMAIN, "FusedBatchNormalization", 1, FUSED_BATCH_NORM, meta=_same_as_x, category=COMPOSITE,
                           decomposition=_fused_decomposition("BatchNormalization", ("epsilon",), 15),
                           notes=["inference BatchNormalization + activation, fused by passes/fusion.py"]))


TRANSFER = CustomSchema(DOMAIN, "Transfer", [("X", False)], {"src_device": ("str", "cpu"), "dst_device": ("str", "cpu")},
                        ["Y"], "glassrt::Transfer(Tensor X, str src_device, str dst_device) -> Tensor")
register_custom(OpContract(DOMAIN, "Transfer", 1, TRANSFER, meta=lambda ctx: [ctx.type(0)], category=PRIMITIVE,
                           notes=["a copy between devices, inserted by placement (runtime/placement.py)"]))
