"""The kernel registry: implementations registered against an op's contract, per provider.

A kernel states the op (domain, type, schema-version range), the dtypes it covers, the
attributes it understands (read from its signature), and optionally a predicate on
shapes/attributes. Placement asks "can any kernel of this provider run this node?";
selection asks "which eligible kernel is best for these concrete shapes?".

Two ways to write one:
  * a plain function ``fn(*inputs, out=None, **attrs)`` — attributes arrive as keyword
    arguments (schema defaults filled in); with ``out=True`` the kernel writes into the
    output buffer it is handed (a slice of the memory arena) and returns it;
  * a builder (``bind=True``) ``fn(ctx) -> step`` that does per-plan work once (weight
    packing, index maps) and returns ``step(*inputs, out=None)``.
A kernel returns one array, or a tuple of outputs for multi-output ops (a list is a
sequence value).
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from .. import symbolic
from ..dtypes import DTypeSet
from ..ir import TensorType


# What a provider does as a plan's first run begins, before any step (onednn: the primitives
# whose descriptors placement and selection made, made on two threads at once: onednn/ahead.py)
before_first_run: list[Callable[[], None]] = []


_VERDICTS_PER_NODE = 32  # (the oldest verdict on a node goes first)


@dataclass
class BindContext:
    """What a kernel sees when it is bound into a plan (shapes concrete when known)."""

    node: Any
    attrs: dict
    input_types: list
    output_types: list
    const_inputs: list  # values known at plan time (initializers, folded), else None
    contract: Any = None
    session: Any = None
    workspace: Any = None  # a uint8 slice of the arena when the kernel asked for scratch
    # value name -> "nhwc" where not plain NCHW (runtime/layout.py); None where layouts are
    # not chosen yet (placement judging the node): every value reads as plain then
    layouts: dict | None = None
    # (activation, params) the plan applies after the kernel, in NumPy: a fused op's activation
    # taken off a kernel whose own form of it loses NaN (runtime/nan_handling.py)
    after: tuple | None = None
    # the session's memory limit in bytes, where a plan binds the kernel (None when placement
    # judges it): a kernel that allocates for shapes only known at run time checks against it
    memory_limit: int | None = None
    # what a kernel worked out from this context, kept for its binding with the same one (a
    # plan asks a kernel's reason, then binds it): not copied by dataclasses.replace
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    # the kernels' verdicts on this node (`verdict`), shared by the contexts made from this one
    # with dataclasses.replace (placement's stand-ins) and handed on to plans (runtime/plan.py)
    verdicts: dict = field(default_factory=dict, repr=False, compare=False)

    def cached(self, key, make):
        """make()'s result, made once per context and key."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def verdict(self, key, make):
        """make()'s result (a kernel's reason: a value, never an object a binding runs, which
        plans must not share), made once per key for these types and these very constants,
        whichever context of the node asks: placement asks a kernel three times and each plan
        once more. The constants are kept with it, so that their ids stay theirs."""
        k = (key, tuple(self.input_types), tuple(self.output_types), tuple(map(id, self.const_inputs)))
        try:
            hit = self.verdicts.get(k)
        except TypeError:  # a type that cannot be a key: reached each time
            return make()
        if hit is None:
            if len(self.verdicts) >= _VERDICTS_PER_NODE:  # (a model run at ever new shapes)
                self.verdicts.pop(next(iter(self.verdicts)))
            hit = self.verdicts[k] = (make(), tuple(self.const_inputs))
        return hit[0]

    def layout(self, name) -> str:
        return self.layouts.get(name, "nchw") if name and self.layouts else "nchw"

    @property
    def opset(self):
        return self.node.opset

    @property
    def since_version(self):
        return self.contract.since_version if self.contract is not None else self.node.opset

    def shape(self, i):
        t = self.input_types[i] if i < len(self.input_types) else None
        return t.shape if isinstance(t, TensorType) else None

    def dtype(self, i):
        t = self.input_types[i] if i < len(self.input_types) else None
        return t.dtype if isinstance(t, TensorType) else None

    def out_shape(self, i=0):
        t = self.output_types[i] if i < len(self.output_types) else None
        return t.shape if isinstance(t, TensorType) else None

    def has(self, i):
        return i < len(self.node.inputs) and bool(self.node.inputs[i])

    def const(self, i):
        return self.const_inputs[i] if i < len(self.const_inputs) else None


@functools.lru_cache(maxsize=4096)
def _stand_in_dim(d, value: int, ones: frozenset | tuple = ()) -> int:
    """A symbolic dim with every symbol bound to `value`, those in `ones` to 1 (a dim the
    binding leaves non-positive or undefined becomes `value`). Cached: a model's nodes
    share a few dims (batch, sequence, batch*sequence)."""
    try:
        v = symbolic.evaluate(d, {n: 1 if n in ones else value for n in symbolic.free_names(d)})
        return v if isinstance(v, int) and v > 0 else value
    except (TypeError, ValueError, ZeroDivisionError):
        return value


def stand_in(ctx, value: int, ones: frozenset | tuple = ()):
    """ctx with every symbolic dim bound to `value`, the symbols in `ones` to 1 (see _stand_in_dim):
    what placement judges a kernel bound to concrete shapes on (runtime/select.py), and a
    kernel judging its own implementation at a stand-in size (onednn/matmul_rows.py)."""
    def bind(t):
        if not isinstance(t, TensorType) or t.shape is None or t.is_static:
            return t
        return TensorType(t.dtype, tuple(d if isinstance(d, int) else _stand_in_dim(d, value, ones) for d in t.shape))
    return replace(ctx, input_types=[bind(t) for t in ctx.input_types], output_types=[bind(t) for t in ctx.output_types])


@dataclass
class Kernel:
    name: str
    provider: str
    domain: str
    op_type: str
    fn: Callable
    versions: tuple = (1, None)  # range of the op schema's since_version
    dtypes: frozenset | None = None  # dtypes of the first tensor input; None: any
    out: bool = False  # writes into the output buffers it is handed
    alias: bool = False  # output 0 may be a view of input 0 (Reshape...)
    inplace: bool = False  # output 0 may share input 0's buffer (elementwise)
    builder: bool = False
    multi: bool = False  # takes and returns a tuple of outputs (multi-output ops)
    accepts: Callable | None = None  # (BindContext) -> None if OK, else a reason
    # (BindContext) -> None or a reason that holds whatever the shapes (attributes, constants):
    # asked with the other shape-free checks, so a node it refuses is not judged again on
    # each stand-in binding of its symbolic dims (select.py)
    applies: Callable | None = None
    workspace: Callable | None = None  # (BindContext) -> bytes of scratch memory
    priority: int = 0
    attrs: frozenset | _SignatureAttrs | None = None  # attribute names understood (`in`); None: any
    # Layouts besides plain NCHW the kernel reads and writes ("nhwc"): a 4-D value whose
    # producer and readers all take one lives in it (runtime/layout.py).
    layouts: frozenset = frozenset()
    # Takes any of `layouts` but asks for none (elementwise NumPy: a channels-last view is as
    # good as a plain array): its values share one layout, that of the region around it
    # (runtime/layout.py), so it never starts a region nor changes a layout itself.
    follows_layout: bool = False
    # Bound only to concrete shapes: refused where placement sees symbolic dims.
    static_only: bool = False
    # A builder whose step works for inputs of any shape (its binding reads attributes and
    # constants only) and also without `out` (then it allocates): a plan whose shapes change
    # per run (a decode step's growing KV cache) binds it once instead of once per shape.
    any_shape: bool = False
    # A static_only kernel for dims of 1 (a decode step's one-row products): placement judges
    # it with the symbolic dims bound to 1, where other kernels are judged at a larger stand-in.
    one_row: bool = False
    # May call NumPy's BLAS, whose thread count is then set before a run (runner.py): not an
    # alias or elementwise kernel, nor one declared blas=False (threadpoolctl's import and
    # scan cost a first run ~4 ms that a plan without BLAS need not pay)
    blas: bool = True
    # Compiles with Numba for some inputs that have no NumPy twin of the same bits (a decode
    # step's one-row attention loop): a session whose placement chose it starts loading
    # Numba on its own thread as its creation ends, so that the run that first needs the
    # loop (a prompt's next run) does not wait for the import (0.4-0.8 s)
    warms_numba: bool = False
    # Where its result differs from the reference's when an input holds a NaN or an Inf
    # (oneDNN's relu is max(x, 0), which turns NaN into 0): a reason string, or a function
    # (BindContext) -> reason or None. A run fed a NaN or an Inf moves such nodes to kernels
    # that keep them, or binds the same kernel without a fused activation, applied after it
    # (SessionOptions.nan_handling, runtime/nan_handling.py).
    drops_nan: str | Callable | None = None
    doc: str = ""
    extra: dict = field(default_factory=dict)

    def covers_version(self, since_version: int) -> bool:
        lo, hi = self.versions
        return since_version >= lo and (hi is None or since_version <= hi)

    def bind(self, ctx: BindContext):
        """A callable step(inputs: list, out) for this node, ready for the hot loop."""
        if self.builder:
            step = self.fn(ctx)
        else:
            kwargs = {k: v for k, v in ctx.attrs.items() if self.attrs is None or k in self.attrs}
            step = functools.partial(self.fn, **kwargs) if kwargs else self.fn
        return step


_KERNELS: dict[tuple[str, str, str], list[Kernel]] = {}


def register(k: Kernel) -> Kernel:
    _KERNELS.setdefault((k.provider, k.domain, k.op_type), []).append(k)
    return k


def kernels_for(provider: str, domain: str, op_type: str) -> list[Kernel]:
    return _KERNELS.get((provider, domain, op_type), [])


def all_kernels(provider: str | None = None) -> list[Kernel]:
    return [k for (p, _, _), ks in _KERNELS.items() if provider in (None, p) for k in ks]


def unregister(provider: str, domain: str, op_type: str) -> None:
    _KERNELS.pop((provider, domain, op_type), None)


class _SignatureAttrs:
    """The attributes a kernel function understands: its keyword-only parameters (any, where
    it takes **kwargs). Read from the signature when first asked: inspect.signature for each
    of the ~180 such kernels made every session's first import 7 ms slower."""

    __slots__ = ("fn", "names")

    def __init__(self, fn):
        self.fn, self.names = fn, None

    def __contains__(self, name) -> bool:
        if self.names is None:
            params = inspect.signature(self.fn).parameters.values()
            self.names = True if any(p.kind is p.VAR_KEYWORD for p in params) else \
                frozenset(p.name for p in params if p.kind is p.KEYWORD_ONLY and p.name != "out")
        return self.names is True or name in self.names


_DTYPE_SETS: dict = {}


def _dtype_set(dtypes) -> frozenset:
    """np.dtype of each, as a frozenset; the kernel modules pass a few shared sets (FLOATS,
    NUMERIC...) to ~260 kernels, and converting each anew was a third of their import."""
    if isinstance(dtypes, DTypeSet):  # already dtypes; iterating it would import ml_dtypes
        return dtypes
    key = id(dtypes)
    hit = _DTYPE_SETS.get(key)
    if hit is None or hit[0] is not dtypes:
        hit = _DTYPE_SETS[key] = (dtypes, frozenset(np.dtype(d) for d in dtypes))
    return hit[1]


def kernel(ops, *, provider: str = "cpu", domain: str = "", versions=(1, None), dtypes=None,
           out: bool = False, alias: bool = False, inplace: bool = False, bind: bool = False, multi: bool = False,
           accepts=None, workspace=None, priority: int = 0, name: str | None = None, attrs=None, layouts=(),
           static_only: bool = False, any_shape: bool = False, one_row: bool = False, blas: bool | None = None,
           warms_numba: bool = False, follows_layout: bool = False, drops_nan=None, applies=None):
    """Decorator registering `fn` as a kernel for one or more ops."""

    def deco(fn):
        kdtypes = None if dtypes is None else _dtype_set(dtypes)
        kattrs = frozenset(attrs) if attrs is not None else (None if bind else _SignatureAttrs(fn))
        for op in [ops] if isinstance(ops, str) else ops:
            kname = name or fn.__name__
            register(Kernel(
                name=f"{provider}.{op}.{kname}" if kname.replace("_", "").lower() != op.lower() else f"{provider}.{op}",
                provider=provider, domain=domain, op_type=op, fn=fn, versions=versions,
                dtypes=kdtypes,
                out=out, alias=alias, inplace=inplace, builder=bind, multi=multi, accepts=accepts,
                applies=applies, workspace=workspace, priority=priority, layouts=frozenset(layouts),
                static_only=static_only,
                any_shape=any_shape, one_row=one_row, blas=not (alias or inplace) if blas is None else blas,
                warms_numba=warms_numba, follows_layout=follows_layout, drops_nan=drops_nan,
                attrs=kattrs,
                doc=(fn.__doc__ or "").strip().split("\n")[0],
            ))
        return fn

    return deco
