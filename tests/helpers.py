"""Small model builders shared by the tests."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def model(nodes, inputs, outputs, initializers=(), opset=18, domains=None, ir_version=9):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in (domains or {}).items()]
    return helper.make_model(graph, opset_imports=opsets, ir_version=ir_version)


def tensor(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def add_model(shape=("batch", 3)):
    """y = x + 1 (float), with a symbolic batch dim."""
    return model([helper.make_node("Add", ["x", "one"], ["y"], name="add")],
                 [tensor("x", list(shape))], [tensor("y", list(shape))],
                 [init("one", np.ones(shape[-1], np.float32))])


def expose(m: onnx.ModelProto, names) -> onnx.ModelProto:
    """A copy of m with extra graph outputs (values of unknown type are allowed by ORT too)."""
    out = onnx.ModelProto()
    out.CopyFrom(m)
    for n in names:
        out.graph.output.append(onnx.ValueInfoProto(name=n))
    return out
