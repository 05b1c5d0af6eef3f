"""Input ranks the ONNX spec fixes but onnx's schemas do not encode.

Checked before an op's meta rule, so that a scalar where a list of axes is due, or a
scalar where an op needs an axis to work along, is refused with a message that names the
node, the input and the rank expected (as onnxruntime refuses them), not with whatever a
rule or kernel happens to trip over.
"""
from __future__ import annotations

# op -> {input index: the ranks allowed}. Inputs a node does not give are not checked;
# an index an older opset does not have as an input (an attribute there) is never given.
_ONE_D = (1,)
_SCALAR_OR_1D = (0, 1)
EXACT = {
    "Reshape": {1: _ONE_D}, "Expand": {1: _ONE_D}, "Tile": {1: _ONE_D}, "ConstantOfShape": {0: _ONE_D},
    "Slice": {1: _ONE_D, 2: _ONE_D, 3: _ONE_D, 4: _ONE_D}, "Pad": {1: _ONE_D, 3: _ONE_D},
    "Squeeze": {1: _SCALAR_OR_1D}, "Unsqueeze": {1: _SCALAR_OR_1D}, "Split": {1: _ONE_D},
    "Resize": {1: _ONE_D, 2: _ONE_D, 3: _ONE_D}, "Upsample": {1: _ONE_D}, "CenterCropPad": {1: _ONE_D},
    "Col2Im": {1: _ONE_D, 2: _ONE_D}, "STFT": {0: (3,), 1: _SCALAR_OR_1D, 2: _ONE_D, 3: _SCALAR_OR_1D},
    **{r: {1: _ONE_D} for r in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                                "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")},
}
# op -> {input index (or "all"): the least rank}
AT_LEAST = {
    "Concat": {"all": 1}, "Split": {0: 1}, "Gather": {0: 1}, "GatherElements": {0: 1, 1: 1}, "GatherND": {0: 1, 1: 1},
    "ScatterElements": {0: 1, 1: 1, 2: 1}, "Scatter": {0: 1, 1: 1, 2: 1}, "ScatterND": {0: 1, 1: 1},
    "GlobalAveragePool": {0: 3}, "GlobalMaxPool": {0: 3}, "GlobalLpPool": {0: 3},
    "ArrayFeatureExtractor": {0: 1},
}
_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")


def check(ctx):
    """Fail ctx's node if an input of known rank breaks the tables above."""
    node = ctx.node
    if node.domain not in _DOMAINS:
        return
    for i, allowed in EXACT.get(node.op_type, {}).items():
        r = ctx.rank(i) if ctx.has(i) else None
        if r is not None and r not in allowed:
            want = " or ".join({0: "a scalar", 1: "a 1-D tensor"}.get(a, f"rank {a}") for a in allowed)
            ctx.fail(f"input {i} '{node.inputs[i]}' must be {want}, got rank {r}")
    for i, least in AT_LEAST.get(node.op_type, {}).items():
        for j in range(len(node.inputs)) if i == "all" else [i]:
            r = ctx.rank(j) if ctx.has(j) else None
            if r is not None and r < least:
                ctx.fail(f"input {j} '{node.inputs[j]}' must have rank >= {least}, got rank {r}")
