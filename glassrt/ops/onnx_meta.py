"""The default meta: onnx's own per-node shape inference (`infer_node_outputs`).

It knows every standard op's rules; glassrt converts its types to and from TypeProtos,
naming each symbolic dim by a placeholder so that expressions like `2*batch` survive
the round trip. Dims onnx cannot tell become fresh symbols (decided at run time).
"""
from __future__ import annotations


import onnx
from onnx import helper, numpy_helper, shape_inference

from .. import dtypes, symbolic
from ..ir import MapType, OptionalType, SequenceType, TensorType
from ..onnx_io import node_to_proto

_MAX_DATA = 4096  # only small constant inputs (shapes, axes) are worth sending


def onnx_meta(ctx):
    node, schema = ctx.node, ctx.contract.schema
    names: dict[str, object] = {}

    def to_proto(t):
        if t is None:
            return None
        if isinstance(t, TensorType):
            if t.shape is None:
                return helper.make_tensor_type_proto(dtypes.elem_type(t.dtype), None)
            dims = []
            for d in t.shape:
                if isinstance(d, int):
                    dims.append(d)
                else:
                    key = f"__gs{len(names)}"
                    for k, v in names.items():
                        if v == d:
                            key = k
                            break
                    names[key] = d
                    dims.append(key)
            tp = helper.make_tensor_type_proto(dtypes.elem_type(t.dtype), dims)
            tp.tensor_type.shape.SetInParent()  # rank 0 must read as a scalar, not as unknown rank
            return tp
        if isinstance(t, MapType):
            inner = to_proto(t.value)
            return None if inner is None else helper.make_map_type_proto(dtypes.elem_type(t.key), inner)
        inner = to_proto(t.elem)
        if inner is None:
            return None
        if isinstance(t, SequenceType):
            return helper.make_sequence_type_proto(inner)
        return helper.make_optional_type_proto(inner)

    input_types, input_data = {}, {}
    for i, name in enumerate(node.inputs):
        if not name:
            continue
        tp = to_proto(ctx.type(i))
        if tp is None:  # onnx's inference needs every input's type
            return [None] * len(node.outputs)
        input_types[name] = tp
        v = ctx.const(i)
        if v is not None and v.size <= _MAX_DATA and v.dtype != object:
            try:
                input_data[name] = numpy_helper.from_array(v.copy(order="C"), name)
            except Exception:
                pass
    try:
        proto = node_to_proto(node)
    except NotImplementedError:
        return [None] * len(node.outputs)
    opsets = [helper.make_opsetid(node.domain, node.opset)]
    if node.domain != "":
        opsets.append(helper.make_opsetid("", 21))
    try:
        out = shape_inference.infer_node_outputs(schema, proto, input_types, input_data, opset_imports=opsets)
    except (onnx.shape_inference.InferenceError, RuntimeError, ValueError) as e:
        ctx.fail(str(e).strip().splitlines()[-1] if str(e).strip() else repr(e))
    return [from_proto(out.get(o), names) if o else None for o in node.outputs]


def from_proto(tp, names):
    if tp is None:
        return None
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        tt = tp.tensor_type
        if tt.elem_type == 0:
            return None
        dt = dtypes.np_dtype(tt.elem_type)
        if not tt.HasField("shape"):
            return TensorType(dt, None)
        dims = []
        for d in tt.shape.dim:
            w = d.WhichOneof("value")
            if w == "dim_value":
                dims.append(int(d.dim_value))
            elif w == "dim_param" and d.dim_param:
                dims.append(names.get(d.dim_param) or symbolic.symbol(d.dim_param))
            else:
                dims.append(symbolic.fresh())
        return TensorType(dt, tuple(dims))
    if kind == "sequence_type":
        return SequenceType(from_proto(tp.sequence_type.elem_type, names))
    if kind == "optional_type":
        return OptionalType(from_proto(tp.optional_type.elem_type, names))
    if kind == "map_type":
        try:
            key = dtypes.np_dtype(tp.map_type.key_type)
        except KeyError:
            return None
        return MapType(key, from_proto(tp.map_type.value_type, names))
    return None
