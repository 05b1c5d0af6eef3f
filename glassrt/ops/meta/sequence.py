"""Optional ops: their types when the optional's type is only known from the value.

At plan time a fed optional is typed by its value: a tensor or a sequence when present,
unknown (None) when empty, which onnx's own inference does not accept.
"""
from __future__ import annotations

import numpy as np

from ...ir import OptionalType
from ..registry import meta


@meta("Optional")
def optional(ctx):
    t = ctx.type(0) if ctx.has(0) else None
    if isinstance(t, OptionalType):
        ctx.fail("the input of Optional must be a tensor or a sequence, not an optional")
    return [OptionalType(t if t is not None else ctx.attrs.get("type"))]


@meta("OptionalHasElement")
def optional_has_element(ctx):
    return [ctx.tensor(np.bool_, ())]


@meta("OptionalGetElement")
def optional_get_element(ctx):
    t = ctx.type(0)
    return [t.elem if isinstance(t, OptionalType) else t]
