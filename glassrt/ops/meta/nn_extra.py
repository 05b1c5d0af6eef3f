"""Meta rules for normalization / attention ops whose onnx inference is missing or refuses."""
from __future__ import annotations

from ..registry import meta


@meta("GroupNormalization")
def group_normalization(ctx):
    # onnx refuses to infer the (deprecated) opset-18 schema at all; Y is X's type either way.
    return [ctx.tensor(ctx.dtype(0), ctx.shape(0))]
