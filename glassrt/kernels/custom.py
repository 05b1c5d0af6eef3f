"""Custom operators defined in Python: a schema string, then meta, kernels, decomposition,
backward registered against it.

    swish = glassrt.custom_op("my_ops::swish(Tensor x, float beta=1.0) -> Tensor", dtypes=[np.float32])
    swish.register_meta(lambda x, beta: x)
    swish.register_kernel("cpu", lambda x, beta: x / (1 + np.exp(-beta * x)))

A node of domain `my_ops` and type `swish` then runs through placement, planning and
fallback like any built-in op. Nothing here ever runs because a model asked for it: only
code the user registered is called. A custom op is a contract (ops/custom_schema.py,
registered in the ops registry) and kernels (registered here, beside the built-in ones).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import GlassrtError, ShapeInferenceError, describe_node
from ..ir import TensorType
from ..ops.contract import COMPOSITE, CUSTOM, OpContract
from ..ops.custom_schema import REQUIRED, CustomSchema, GraphBuilder, SchemaError, coerce_attr, parse_schema  # noqa: F401
from ..ops.registry import register_custom, unregister_custom
from .registry import BindContext, Kernel, register, unregister


@dataclass
class CustomOp:
    schema: CustomSchema
    dtypes: list
    differentiable: bool = False
    meta_fn: object = None
    kernels: dict = field(default_factory=dict)  # provider -> fn
    decomposition_fn: object = None
    backward_fn: object = None
    example_fn: object = None

    @property
    def domain(self):
        return self.schema.domain

    @property
    def name(self):
        return self.schema.name

    def __call__(self, fn):
        """Used as a decorator: the function becomes the op's cpu kernel."""
        return self.register_kernel("cpu", fn)

    # -------------------------------------------------------- registration

    def register_meta(self, fn):
        """fn(*input_metas, **attrs) -> meta or tuple of metas (glassrt.TensorMeta: .dtype, .shape)."""
        self.meta_fn = fn
        self._publish()
        return fn

    def register_kernel(self, provider, fn=None, *, dtypes=None, bind=False, out=False, layouts=(), blas=True):
        """fn(*inputs, **attrs) -> array or tuple of arrays, for `provider` ("cpu"...).

        With bind=True, fn(ctx) is called once per compiled plan and returns
        step(*inputs): ctx.const(i) is input i's value when it is known before the run (a
        weight), ctx.shape(i) / ctx.dtype(i) its type, ctx.attrs the attributes — the place
        for work that should not be redone on every run (repacking, dequantizing weights).

        With out=True the kernel writes into the plan's memory arena: fn(*inputs, out=...,
        **attrs) (step(*inputs, out=...) with bind=True) is handed the output's buffer, a
        view already of the output's shape and dtype, fills it and returns it. An op with
        several outputs gets a tuple with one entry per output of the schema. An entry (or
        `out` itself) is None where there is no buffer to fill — the shape is only known
        at run time, the node leaves that output unused, or the kernel is called directly
        (`glassrt check`) — and the kernel then returns a new array as without out=True.

        layouts=("nhwc",): the kernel computes the same on channels-last values (3-D and 4-D
        arrays whose bytes lie (N, *spatial, C): kernels/buffers.py's memory_order), so a
        value between it and oneDNN's convolutions need not change layout.

        blas=False: the kernel never calls NumPy's BLAS (a plan of such kernels alone leaves
        BLAS's thread count as it is; left True, glassrt sets it to the session's first)."""
        if fn is None:
            return lambda f: self.register_kernel(provider, f, dtypes=dtypes, bind=bind, out=out, layouts=layouts,
                                                  blas=blas)

        unregister(provider, self.domain, self.name)
        n_out = len(self.schema.outputs)
        multi = n_out > 1
        if bind:
            call = fn if not multi else (lambda ctx, _fn=fn: _as_tuple(_fn(ctx), n_out, out))
        else:
            call = fn if not multi else _as_tuple(fn, n_out, out)
        declared = dtypes or self.dtypes
        register(Kernel(name=f"{provider}.{self.domain + '::' if self.domain else ''}{self.name}", provider=provider,
                        domain=self.domain, op_type=self.name, fn=call, multi=multi, builder=bind, out=out,
                        dtypes=frozenset(np.dtype(d) for d in declared) if declared else None,
                        attrs=None, doc=(fn.__doc__ or "").strip().split("\n")[0] or "user kernel",
                        layouts=frozenset(layouts), blas=blas))
        self.kernels[provider] = fn if not bind else _Bound(fn)
        self._publish()
        return self

    def register_decomposition(self, fn):
        """fn(g, *input_names, **attrs) -> output name(s), built with g.Op(...) calls on
        existing ops (see glassrt.ops.custom_schema.GraphBuilder; g.input_types has the inputs'
        types); any provider can then run it."""
        self.decomposition_fn = fn
        self._publish()
        return fn

    def register_backward(self, fn):
        """fn(ctx, *grad_outputs) -> [grad per input] (ctx.inputs, ctx.outputs, ctx.attrs)."""
        self.backward_fn = fn
        self.differentiable = True
        self._publish()
        return fn

    def register_example(self, fn):
        """fn(dtype) -> list of input arrays, or (inputs, {attribute: value}): sample inputs
        for `glassrt check` when the generated ones (every input of shape (batch, 3, 4),
        attributes at their defaults) do not suit the op. For the symbolic-batch check,
        inputs whose first dim equals the first input's (the first one that is not a
        scalar) are lengthened with the batch."""
        self.example_fn = fn
        return fn

    def unregister(self):

        for p in list(self.kernels):
            unregister(p, self.domain, self.name)
        unregister_custom(self.domain, self.name)
        if OPS.get((self.domain, self.name)) is self:
            del OPS[(self.domain, self.name)]

    # -------------------------------------------------------- the contract

    def _publish(self):
        register_custom(OpContract(
            domain=self.domain, op_type=self.name, since_version=1, custom_schema=self.schema,
            meta=self._meta, category=COMPOSITE if self.decomposition_fn else CUSTOM,
            decomposition=self._decompose if self.decomposition_fn else None,
            backward=self.backward_fn, differentiable=self.differentiable,
            notes=[f"custom op {self.schema.text}"]))

    def attrs_of(self, node) -> dict:
        out = {}
        for name, (typ, default) in self.schema.attributes.items():
            if name in node.attrs:
                out[name] = coerce_attr(typ, node.attrs[name], f"{describe_node(node)} attribute '{name}'")
            elif default is REQUIRED:
                raise ShapeInferenceError(f"{describe_node(node)}: required attribute '{name}' ({typ}) is missing")
            else:
                out[name] = default
        unknown = set(node.attrs) - set(self.schema.attributes)
        if unknown:
            raise ShapeInferenceError(f"{describe_node(node)}: unknown attribute(s) {sorted(unknown)} for "
                                      f"{self.schema.text}")
        return out

    def _meta(self, ctx):
        node = ctx.node
        n_req = sum(1 for _, opt in self.schema.inputs if not opt)
        given = len([i for i in node.inputs])
        if given < n_req or (given > len(self.schema.inputs) and not self.schema.variadic):
            span = f"at least {n_req}" if self.schema.variadic else f"{n_req}..{len(self.schema.inputs)}"
            ctx.fail(f"{self.schema.text} takes {span} inputs, the node has {given}")
        if len(node.outputs) > len(self.schema.outputs):
            ctx.fail(f"{self.schema.text} has {len(self.schema.outputs)} output(s), the node has {len(node.outputs)}")
        if self.meta_fn is None:
            return [None] * len(node.outputs)  # shapes decided at run time
        metas = [ctx.type(i) if ctx.has(i) else None for i in range(max(len(self.schema.inputs), given))]
        try:
            res = self.meta_fn(*metas, **self.attrs_of(node))
        except GlassrtError:
            raise
        except Exception as e:
            ctx.fail(f"meta function of {self.schema.text} raised {type(e).__name__}: {e}")
        res = list(res) if isinstance(res, (tuple, list)) else [res]
        for k, r in enumerate(res):
            if r is not None and not isinstance(r, TensorType):
                ctx.fail(f"meta function of {self.schema.text} returned {type(r).__name__} for output {k}; "
                         "expected glassrt.TensorMeta(dtype, shape)")
        return [TensorType(np.dtype(r.dtype), tuple(r.shape) if r.shape is not None else None) if r is not None else None
                for r in res]

    def _decompose(self, node, input_types, visible):
        g = GraphBuilder(node, visible, input_types)
        names = [i if i else None for i in node.inputs]
        names += [None] * (len(self.schema.inputs) - len(names))
        outs = self.decomposition_fn(g, *names, **self.attrs_of(node))
        outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        return g.finish(outs)


def _as_tuple(step, n_out, takes_out):
    """A multi-output kernel's results as a tuple; with out=, its buffers padded to one per
    output of the schema (the plan hands one per output of the node, which may use fewer)."""
    if not takes_out:
        return lambda *args, **attrs: tuple(step(*args, **attrs))

    def call(*args, out=None, **attrs):
        bufs = tuple(out) if out is not None else ()
        return tuple(step(*args, out=(bufs + (None,) * n_out)[:n_out], **attrs))

    return call


class _Bound:
    """A bind=True kernel, callable like a plain one (for `glassrt check`): binds per call."""

    def __init__(self, builder):
        self.builder = builder

    def __call__(self, *inputs, **attrs):
        from ..ir import type_of_value

        node = type("CheckNode", (), {"inputs": ["x"] * len(inputs), "outputs": [], "opset": 1, "name": "check",
                                      "op_type": "", "domain": ""})()
        ctx = BindContext(node, attrs, [type_of_value(x) for x in inputs], [], list(inputs))
        return self.builder(ctx)(*inputs)


OPS: dict[tuple[str, str], CustomOp] = {}


def custom_op(schema: str, *, dtypes=None, differentiable: bool = False) -> CustomOp:
    """Define an op from a schema string; register meta/kernels/decomposition/backward on
    the returned object (or decorate the cpu kernel with it directly). `differentiable`
    declares that the op should have a backward (`glassrt check` reports it missing)."""
    op = CustomOp(parse_schema(schema), list(dtypes or []), differentiable)
    if op.domain == "":
        from ..ops.schema_index import index

        if index().has(op.name):
            raise SchemaError(f"{schema!r}: '{op.name}' is a standard ONNX op; a custom op of the default domain "
                              "would shadow it at every opset — use a domain of your own")
    if (op.domain, op.name) in OPS:
        OPS[(op.domain, op.name)].unregister()
    OPS[(op.domain, op.name)] = op
    op._publish()
    return op
