"""Ops glassrt's own passes create: a contract each, with the decomposition that
defines it in plain ONNX (so every provider can run it, and `check` verifies the fused
kernels against it).

  glassrt::FusedConv(X, W, B?) — Conv followed by `activation` (Relu, LeakyRelu, Clip,
  Sigmoid) with `activation_params`; written by passes/fusion.py.
"""
from __future__ import annotations

from onnx import helper, numpy_helper

import numpy as np

from .contract import COMPOSITE, OpContract
from .custom import CustomSchema
from .meta.nn import conv as conv_meta
from .registry import register_custom

DOMAIN = "glassrt"

_CONV_ATTRS = {"auto_pad": ("str", "NOTSET"), "dilations": ("int[]", []), "group": ("int", 1),
               "kernel_shape": ("int[]", []), "pads": ("int[]", []), "strides": ("int[]", [])}
FUSED_CONV = CustomSchema(DOMAIN, "FusedConv", [("X", False), ("W", False), ("B", True)],
                          {**_CONV_ATTRS, "activation": ("str", "Relu"), "activation_params": ("float[]", [])},
                          ["Y"], "glassrt::FusedConv(Tensor X, Tensor W, Tensor? B, str activation, "
                                 "float[] activation_params, <Conv attributes>) -> Tensor")


def _fused_conv_decomposition(node, input_types, visible):
    from ..onnx_io import nodes_from_protos

    conv_attrs = {k: v for k, v in node.attrs.items() if k in _CONV_ATTRS}
    act = node.attrs.get("activation", "Relu")
    params = list(node.attrs.get("activation_params") or [])
    mid = f"{node.name}/conv_out"
    protos = [helper.make_node("Conv", list(node.inputs), [mid], name=f"{node.name}/conv", **conv_attrs)]
    if act == "Clip":
        lo, hi = (f"{node.name}/clip_min", f"{node.name}/clip_max")
        dt = input_types[0].dtype if input_types and input_types[0] is not None else np.float32
        for name, v in ((lo, params[0]), (hi, params[1])):
            protos.append(helper.make_node("Constant", [], [name], name=name,
                                           value=numpy_helper.from_array(np.array(v, dtype=dt))))
        protos.append(helper.make_node("Clip", [mid, lo, hi], list(node.outputs), name=f"{node.name}/act"))
    else:
        extra = {"alpha": params[0]} if act == "LeakyRelu" and params else {}
        protos.append(helper.make_node(act, [mid], list(node.outputs), name=f"{node.name}/act", **extra))
    return nodes_from_protos(protos, {"": 13}, visible, f"expanded from FusedConv '{node.name}'")


register_custom(OpContract(DOMAIN, "FusedConv", 1, FUSED_CONV, meta=conv_meta, category=COMPOSITE,
                           decomposition=_fused_conv_decomposition,
                           notes=["Conv + activation, fused by passes/fusion.py"]))
