"""The nine small CNNs that ship inside the `onnx` package (onnx/backend/test/data/light).

Their weights are ConstantOfShape(0.02) nodes, which makes every output nearly uniform
and hides kernel bugs; `randomize_weights` swaps those for seeded random initializers.
`reference_input` builds the same input onnx's backend runner feeds when it produced the
expected outputs that ship beside each model.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

NAMES = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
         "squeezenet", "vgg19", "zfnet512"]
DEFAULT = "resnet50"


def folder() -> Path:
    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def path(name: str) -> Path:
    return folder() / f"light_{name}.onnx"


def expected_output(name: str) -> np.ndarray:
    t = onnx.TensorProto()
    t.ParseFromString((folder() / f"light_{name}_output_0.pb").read_bytes())
    return numpy_helper.to_array(t)


def reference_input(shape) -> np.ndarray:
    """arange(n)/n in the input's shape, as onnx's Runner.generate_dummy_data(random=False)."""
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


def input_shape(model: onnx.ModelProto) -> tuple[str, tuple]:
    inits = {i.name for i in model.graph.initializer}
    x = next(i for i in model.graph.input if i.name not in inits)
    return x.name, tuple(d.dim_value if d.HasField("dim_value") else 1 for d in x.type.tensor_type.shape.dim)


def randomize_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """Replace each ConstantOfShape weight by a random initializer of the same shape.

    Scales keep activations in range through deep nets: He-like for conv/gemm weights,
    near 1 for normalization scales and variances (which must stay positive)."""
    rng = np.random.default_rng(seed)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    shapes = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    role = {}
    for n in m.graph.node:
        for k, i in enumerate(n.input):
            role.setdefault(i, (n, k))
    keep = []
    for n in m.graph.node:
        if n.op_type == "ConstantOfShape" and n.input[0] in shapes:
            shape = tuple(int(s) for s in shapes[n.input[0]])
            user, k = role.get(n.output[0], (None, 0))
            value = _random_weight(rng, shape, user, k)
            m.graph.initializer.append(numpy_helper.from_array(value.astype(np.float32), n.output[0]))
        else:
            keep.append(n)
    del m.graph.node[:]
    m.graph.node.extend(keep)
    return m


def _random_weight(rng, shape, node, k):
    op = node.op_type if node is not None else ""
    if op == "BatchNormalization":
        if k in (1, 4):  # scale, variance
            return rng.uniform(0.5, 1.5, shape)
        return rng.normal(0, 0.1, shape)
    if op in ("Conv", "Gemm", "MatMul") and k == 1 and len(shape) >= 2:
        if op == "Conv":
            fan_in = int(np.prod(shape[1:]))
        else:
            trans_b = any(a.name == "transB" and a.i for a in node.attribute)
            fan_in = shape[1] if trans_b else shape[0]
        return rng.normal(0, np.sqrt(2.0 / max(fan_in, 1)), shape)
    if op == "Mul":
        return rng.uniform(0.5, 1.5, shape)
    return rng.normal(0, 0.1, shape)
