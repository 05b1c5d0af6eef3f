"""Compile: a Placement + concrete input types → a Plan (flat list of bound steps).

Everything decided per input-shape signature happens here, once: concrete shape
inference, constant folding, kernel selection, the memory plan, arena views, binding.
`run_plan` then only replays the steps: no inference, no lookup, no intermediate
allocation (the CPU analogue of capturing and replaying a CUDA graph).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

import numpy as np

from .. import dtypes, pages, symbolic
from ..errors import (GlassrtError, InvalidArgumentError, KernelContractError, MemoryLimitError,
                      NodeExecutionError, describe_node)
from ..ir import TensorType
from ..kernels.registry import BindContext, before_first_run
from ..ops.registry import get_contract
from . import folding, nan_handling, run_guard, straight
from .infer import infer, subgraph_memo
from .gc_pause import gc_paused
from .inline import inline_known_branches
from .placement import Fallback
from .layout import channels_last_view
from .memory import MemoryPlan, StepIO, allocate_arena, plan_memory
from .select import bind_kernel, choose_kernel, is_static, kernel_reason
from .shape_formula import ShapeFormula, ValuesFromShapes


class Step:
    __slots__ = ("fn", "ins", "outs", "bufs", "fresh", "multi", "uses_out", "node", "kernel",
                 "provider", "free", "give_back", "expect", "reason")

    def describe(self, args) -> str:
        shapes = ", ".join(
            f"'{n}': {dtypes.name(a.dtype)}{list(a.shape)}" if isinstance(a, np.ndarray) else f"'{n}': {type(a).__name__}"
            for n, a in zip(self.node.inputs, args) if n)
        return f"{describe_node(self.node)} on {self.kernel.name} with inputs ({shapes})"


# Plain runs before a plan's steps are compiled into one function (straight.py). Compiling
# costs ~85 us per step once (Python's compiler: 19-25 ms for BERT-base's or densenet's ~240
# steps) and saves ~2.5 us per step per run, so it pays after ~35 runs: a plan that has run
# 16 times is taken to be one that keeps running (a served model, a decoding loop), and one
# that runs a few times per shape never pays the compile.
STRAIGHT_AFTER = 16


@dataclass
class Selection:
    node: str
    op: str
    provider: str
    kernel: str
    reason: str


@dataclass
class Plan:
    signature: tuple
    steps: list
    slots: dict  # value name -> slot index
    template: list  # slot contents at the start of a run (constants)
    inputs: list  # (name, slot)
    outputs: list  # (name, slot, copy?)
    memory: MemoryPlan
    arena: np.ndarray | None
    types: dict
    folded: list  # names of nodes evaluated at plan time
    selections: list  # Selection per executed node
    build_seconds: float = 0.0
    step_io: list = field(default_factory=list)
    pool: object = None  # BufferPool for values sized at run time
    free_at_end: tuple = ()  # slots released after the outputs are taken
    threads: object = None  # threads.ThreadChoice: the thread count this plan runs fastest with now
    layouts: dict = field(default_factory=dict)  # value -> "nhwc" in this plan (not a moved node's values)
    runs: int = 0  # plain runs (no guard, no profile) so far
    executed: bool = False  # has run once: its kernels have made their primitives and buffers
    uses_blas: bool | None = None  # a step may call NumPy's BLAS (runner.py; None: not worked out yet)
    straight: object = None  # the steps as one compiled function (straight.py), after STRAIGHT_AFTER runs
    moved: tuple = ()  # nodes whose placed provider refused this plan's shapes (they run on the alternative)
    fallbacks: tuple = ()  # placement.Fallback of those that passed a complete provider (see _select_or_fold)
    dynamic_steps: int = 0  # steps bound per run (shapes known only then: _DynamicStep)
    inlined: tuple = ()  # (If node, branch): Ifs this plan runs as the branch its shapes take (inline.py)
    pooled: frozenset = frozenset()  # slots that may hold a buffer of the pool (_pooled_slots)
    drops_nan: tuple = ()  # (node, why) whose kernel loses a NaN or an Inf (runtime/nan_handling.py)
    # nodes not run: their outputs follow from the input shapes ({node: the values, as text}),
    # and (ValuesFromShapes, their slots) computes those that steps read as a run starts
    from_shapes: dict = field(default_factory=dict)
    shape_values: tuple | None = None


@gc_paused()
@subgraph_memo()
def compile_plan(placement, input_types: dict, options, make_runner, pool=None, retain: bool = False) -> Plan:
    """retain=True keeps every intermediate value alive and readable after the run (no
    arena reuse, nothing freed): what gradients and `compare` need."""
    t0 = time.perf_counter()
    inf = infer(placement.graph, input_types, strict=True, reuse=placement.inference)
    placement, inf, inlined = inline_known_branches(placement, input_types, inf)
    graph = placement.graph
    consts = {k: v for k, v in graph.initializers.items() if k not in input_types}
    for name, v in inf.values.items():  # values inference already knows (Shape of a static tensor...)
        t = inf.types.get(name)
        if name in input_types or not isinstance(t, TensorType):
            continue
        if v.dtype == t.dtype and v.dtype != object:
            consts[name] = v
        elif v.dtype == object and t.dtype.kind in "iu" and all(type(e) is int for e in v.flat):
            consts[name] = np.array(v.tolist(), t.dtype)  # (a symbolic plan's value whose elements are all known)
    layouts, known = placement.layouts, dict(consts)  # folding adds to known
    executed, folded, selections, moved = _select_or_fold(placement, layouts, inf.types, known, set(input_types),
                                                          options, make_runner)
    learned = {}
    for _ in range(3):  # each round may fold what makes the next round's values (rarely more than one)
        new = _learned_by_folding(known, inf, executed)
        if not new:
            break
        learned.update(new)
        # Folding computed small values inference had no rule for (a Pad's pads made by
        # Concat, Slice and Transpose of constants, as exporters write them): shapes that
        # depend on them were left symbolic, and every step downstream would bind per run.
        # Infer once more knowing them, then select again (what was folded stays folded).
        inf = infer(graph, input_types, strict=True, outer_values=learned, reuse=inf)
        inf.values.update(learned)
        executed, folded_again, selections, moved = _select_or_fold(placement, layouts, inf.types, known,
                                                                    set(input_types), options, make_runner)
        folded = folded + [n for n in folded_again if n not in folded]
    for _ in range(3):
        # A node went to a later provider for these shapes: the values it reads and writes
        # are plain NCHW (the NHWC choice assumed the placed providers), the others keep
        # theirs, their oneDNN producers and readers taking plain values at its edges.
        # (A whole plan plain instead sent nudenet-320n's 64 convs through reorders for one
        # small Transpose that moved.) Rarely a second round: a node moved for the layouts.
        moved_here = {name for name, _ in moved}
        touched = {v for node, _, _, _ in executed if node.name in moved_here for v in (*node.inputs, *node.outputs)}
        kept = {v: layout for v, layout in layouts.items() if v not in touched}
        if kept == layouts:
            break
        layouts, known = kept, dict(consts)
        executed, folded, selections, moved = _select_or_fold(placement, layouts, inf.types, known,
                                                              set(input_types), options, make_runner)
    else:
        layouts, known = {}, dict(consts)
        executed, folded, selections, moved = _select_or_fold(placement, layouts, inf.types, known,
                                                              set(input_types), options, make_runner)
    consts = known
    keep = set(graph.output_names())
    from_shapes, shape_values, checked = {}, None, {}
    if not retain:
        executed, from_shapes, shape_values, checked = _values_from_shapes(executed, inf, input_types, keep)
        selections = [sel for sel in selections if sel.node not in from_shapes]
    if retain:
        keep |= {o for node, _, _, _ in executed for o in node.outputs if o}
        copied = frozenset()
    else:
        # (only a step bound once for its static shapes writes a planned buffer every run)
        copied = frozenset(o for node, kern, ctx, _ in executed if kern.out and not kern.alias and is_static(ctx)
                           for o, t in zip(node.outputs, ctx.output_types)
                           if o in keep and 0 < _nbytes(t) <= COPIED_OUTPUT_BYTES)
    fresh = keep - copied  # the outputs a kernel writes into a new array every run, handed over as it is
    step_io = [_step_io(node, kern, ctx) for node, kern, ctx, _ in executed]
    memory = plan_memory(step_io, fresh, copied)
    fresh_bytes = sum(_nbytes(t) for node, kern, ctx, _ in executed if kern.out
                      for o, t in zip(node.outputs, ctx.output_types) if o in fresh and _nbytes(t))
    limit = options.memory_limit()
    if memory.arena_bytes + fresh_bytes > limit:
        raise MemoryLimitError(f"the plan for {_sig_str(input_types) or 'a model without inputs'} needs a "
                               f"{memory.arena_bytes:,}-byte arena and {fresh_bytes:,} bytes of outputs, over the "
                               f"session's memory limit of {limit:,} bytes; the largest values: "
                               f"{_largest_values(executed)} (SessionOptions.memory_limit_bytes sets the limit)")
    arena = allocate_arena(memory.arena_bytes)

    slots: dict[str, int] = {}
    shape_names = shape_values.names if shape_values is not None else ()
    for name in [*input_types, *(o for node, _, _, _ in executed for o in node.outputs if o), *consts, *keep,
                 *shape_names]:
        slots.setdefault(name, len(slots))
    steps = [_make_step(k, entry, memory, arena, fresh, slots, selections[k].reason, options, make_runner, placement,
                        layouts, pool) for k, entry in enumerate(executed)]
    for st in steps:
        if st.node.name in checked:  # (a Shape still run, its output checked against the value computed)
            st.ins = [*st.ins, slots[checked[st.node.name]]]
            st.fn = _CheckedShape(st.fn, st.node)
    free_at_end = _free_lists(steps, step_io, memory, slots, keep | set(consts) | set(input_types) | set(shape_names))
    pooled = _pooled_slots(steps)
    for st in steps:
        st.give_back = pooled.intersection(st.free)  # (freeing the others is only dropping them)

    template = [None] * len(slots)
    for name, v in consts.items():
        template[slots[name]] = v
    # Returned values must not be views of the arena, of constants or of the caller's inputs.
    owned = {o for node, kern, _, _ in executed if not kern.alias for o in node.outputs if o and
             (memory.values.get(o) is None or memory.values[o].offset is None)}
    outputs = [(name, slots[name], name not in owned) for name in graph.output_names()]
    plan = Plan(signature=(), steps=steps, slots=slots, template=template,
                inputs=[(n, slots[n]) for n in input_types], outputs=outputs, memory=memory, arena=arena, pool=pool,
                types=inf.types, folded=folded, selections=selections, step_io=step_io, free_at_end=free_at_end,
                layouts=layouts, moved=tuple(name for name, _ in moved), inlined=tuple(inlined),
                from_shapes=from_shapes,
                shape_values=None if shape_values is None else (shape_values, [slots[n] for n in shape_names]),
                fallbacks=tuple(replace(f, shapes=_sig_str(input_types)) for _, f in moved if f),
                dynamic_steps=sum(isinstance(st.fn, _DynamicStep) for st in steps), pooled=pooled,
                drops_nan=tuple((node.name, why) for node, kern, ctx, _ in executed
                                if (why := nan_handling.drop_reason(kern, ctx))))
    plan.build_seconds = time.perf_counter() - t0
    return plan


# Graph outputs of at most this many bytes are written into the plan's arena, like the
# values between steps, and copied into a new array for the caller when the run returns,
# rather than written into a new array every run: the step then writes where it wrote the
# run before, inline in a replayed plan (runtime/straight.py), and a oneDNN primitive's
# output memory is not re-pointed (~3-4 us a run: the address of a new array alone is ~2 us
# in NumPy), where copying 16 KiB takes ~1 us. A small model's score or logits, every run.
COPIED_OUTPUT_BYTES = 16 << 10


def _learned_by_folding(known: dict, inf, executed) -> dict:
    """Small values folding computed that inference did not know, when some step's output
    shape is still symbolic (else there is nothing to learn from them)."""
    if all(isinstance(t, TensorType) and t.is_static or not isinstance(t, TensorType)
           for _, _, ctx, _ in executed for t in ctx.output_types):
        return {}
    return {k: v for k, v in known.items() if k not in inf.values and isinstance(v, np.ndarray)
            and v.dtype.kind in "iub" and v.size <= 64}


def _nbytes(t) -> int:
    """Bytes of a static, non-string tensor type; 0 for anything else."""
    if isinstance(t, TensorType) and t.is_static and t.dtype != object:
        return math.prod(t.shape) * t.dtype.itemsize
    return 0


def _select_or_fold(placement, layouts, types, consts, feeds, options, make_runner):
    """Per node: fold it if its outputs are known or computable now, else pick its kernel.
    A node whose placed provider refuses these shapes goes to the decision's alternative.
    Returns ([(node, kernel, ctx, decision)] to execute, [folded node names], [Selection],
    [(name, Fallback or None) of each node that went to the alternative: a Fallback where
    that passes a complete provider, as placement counts fallbacks; None where a partial
    provider refused the shapes, as it may by design])."""
    executed, folded, selections, moved = [], [], [], []
    limit = options.memory_limit()
    for node in placement.graph.nodes:
        decision = placement.decisions[node.name]
        contract = get_contract(node.domain, node.op_type, node.opset)
        outs = [o for o in node.outputs if o]
        foldable = folding.may_fold(node)
        if foldable and outs and all(o in consts for o in outs):
            folded.append(node.name)
            continue
        ctx = BindContext(node, contract.attrs_with_defaults(node), [types.get(i) if i else None for i in node.inputs],
                          [types.get(o) if o else None for o in node.outputs],
                          [consts.get(i) if i else None for i in node.inputs], contract=contract,
                          layouts=layouts, memory_limit=limit)
        if decision.verdicts is not None and decision.node is node:  # (placement's, for these types)
            ctx.verdicts = decision.verdicts
        subgraphs = placement.subgraphs.get(node.name)
        if decision.earlier and is_static(ctx):
            decision = _earlier_provider(decision, ctx) or decision
        try:
            kern, why, decision, refused = _choose(decision, ctx, options, make_runner, subgraphs)
        except NodeExecutionError:
            if not nan_handling.exact(options):
                raise
            # no kernel of either provider keeps NaN here: the fast one (the plan says so: drops_nan)
            kern, why, decision, refused = _choose(decision, ctx, replace(options, nan_handling="fast"),
                                                   make_runner, subgraphs)
        if refused is not None:
            placed = placement.decisions[node.name].provider
            why = f"{why} [{placed} for these shapes: {refused}]"
            moved.append((node.name, Fallback(node.name, node.op_type, decision.provider, f"{placed}: {refused}")
                          if decision.fallback else None))
        if (foldable and options.constant_folding and all(i in consts for i in node.inputs if i)
                and not (set(node.inputs) & feeds) and folding.within_limit(ctx.output_types, options)):
            for o, r in zip(node.outputs, folding.evaluate(kern, ctx, make_runner, subgraphs)):
                if o and isinstance(r, np.ndarray):
                    consts[o] = r
            if all(o in consts for o in outs):
                folded.append(node.name)
                continue
        executed.append((node, kern, ctx, decision))
        selections.append(Selection(node.name, node.op_type, decision.provider, kern.name, why))
    return executed, folded, selections, moved


def _choose(decision, ctx, options, make_runner, subgraphs):
    """(kernel, why, the decision it belongs to, what the placed provider refused or None):
    the placed provider's best kernel for these shapes, else the decision's alternative's."""
    try:
        return (*choose_kernel(decision, ctx, options, make_runner, subgraphs), decision, None)
    except NodeExecutionError as e:
        if decision.alternative is None:
            raise
        refused = str(e).split(": ", 1)[-1]
        return (*choose_kernel(decision.alternative, ctx, options, make_runner, subgraphs), decision.alternative,
                refused)


def _earlier_provider(decision, ctx):
    """The decision of a provider placement passed over only because it could not see the
    node's shapes (see Decision.earlier), where its kernels take this plan's; else None."""
    node = decision.node
    for p in decision.earlier:
        ks = [k for k in p.kernels(node.domain, node.op_type, node.opset) if kernel_reason(k, ctx) is None]
        if ks:
            ks.sort(key=lambda k: -k.priority)
            rejected = [(name, why) for name, why in decision.rejected if name != p.name]
            return replace(decision, provider=p.name, kernels=ks, rejected=rejected, fallback=False, earlier=(),
                           reason=f"{p.name} has {node.op_type} kernel(s) for these shapes (placement could not "
                                  f"see them: {decision.provider} was chosen there)")
    return None


def _step_io(node, kern, ctx) -> StepIO:
    """What the memory planner needs to know about one step."""
    sizes = {o: _nbytes(t) for o, t in zip(node.outputs, ctx.output_types) if o and kern.out and _nbytes(t)}
    inplace, aliases = {}, {}
    if kern.alias and node.inputs and node.inputs[0]:
        aliases = {o: node.inputs[0] for o in (node.outputs if kern.multi else node.outputs[:1]) if o}
    elif kern.inplace and node.inputs and node.inputs[0] and node.outputs[0] in sizes:
        t_in, t_out = ctx.input_types[0], ctx.output_types[0]
        if isinstance(t_in, TensorType) and t_in.is_static and t_in.dtype == t_out.dtype \
                and tuple(t_in.shape) == tuple(t_out.shape):
            inplace[node.outputs[0]] = node.inputs[0]
    ws = int(kern.workspace(ctx)) if kern.workspace and is_static(ctx) else 0
    return StepIO([i for i in [*node.inputs, *node.implicit_inputs] if i], [o for o in node.outputs if o],
                  sizes, inplace, aliases, ws)


def _make_step(k, entry, memory, arena, fresh_outputs, slots, reason, options, make_runner, placement, layouts,
               pool) -> Step:
    """Bind one kernel: arena views for its outputs, its workspace, slots for its values.
    fresh_outputs: the graph outputs written into a new array every run (not the arena's copied ones)."""
    node, kern, ctx, decision = entry
    bufs, fresh = [], []
    for o, t in zip(node.outputs, ctx.output_types):
        pv = memory.values.get(o) if o else None
        if pv is not None and pv.offset is not None:
            buf = arena[pv.offset:pv.offset + _nbytes(t)].view(t.dtype)
            if layouts.get(o) == "nhwc":  # the same bytes, NHWC-strided (layout.py)
                bufs.append(channels_last_view(buf, t.shape))
            else:
                bufs.append(buf.reshape(t.shape))
            fresh.append(None)
        else:  # a graph output: a new array per run, handed to the caller
            bufs.append(None)
            f = (tuple(t.shape), t.dtype) if o in fresh_outputs and kern.out and _nbytes(t) else None
            # A kept NHWC value (a plan that retains every value, for compare and nan) is
            # NHWC-strided like its arena view would be: the kernel writes NHWC bytes.
            fresh.append(f + ("nhwc",) if f and layouts.get(o) == "nhwc" else f)
    ws = memory.values.get(f"<workspace {k}>")
    ctx.workspace = arena[ws.offset:ws.offset + ws.bytes] if ws is not None else None
    st = Step()
    subgraphs = placement.subgraphs.get(node.name)
    if is_static(ctx) and _all_empty(ctx.output_types, node.outputs):
        st.fn = _empty_step(ctx.output_types, kern.multi)  # no element to compute: the kernel never runs
    elif is_static(ctx) or _shape_free(kern, ctx):
        st.fn = bind_kernel(kern, ctx, make_runner, subgraphs)
    else:
        # Pool buffers only for values freed during the run: a graph output goes to the caller.
        to_caller = [o in fresh_outputs for o in node.outputs]
        st.fn = _DynamicStep(kern, ctx, lambda c: bind_kernel(kern, c, make_runner, subgraphs),
                             pool, options.memory_limit(), to_caller, arena)
    st.ins = tuple(slots[i] if i else -1 for i in node.inputs) + tuple(slots[i] for i in node.implicit_inputs)
    st.outs = tuple(slots[o] if o else -1 for o in node.outputs)
    st.bufs = bufs if kern.multi else bufs[0]
    st.fresh = fresh if any(f is not None for f in fresh) else None
    st.multi, st.uses_out = kern.multi, kern.out
    st.node, st.kernel, st.provider, st.reason = node, kern, decision.provider, reason
    st.expect = [(slots[o], tuple(t.shape), t.dtype) for o, t in zip(node.outputs, ctx.output_types)
                 if o and options.check_outputs and isinstance(t, TensorType) and t.is_static
                 and (memory.values.get(o) is None or memory.values[o].offset is None)]
    return st


def _all_empty(types, names) -> bool:
    """Every output is a tensor with zero elements (a batch of 0, an empty sequence axis)."""
    outs = [t for t, n in zip(types, names) if n]
    return bool(outs) and all(isinstance(t, TensorType) and t.is_static and 0 in t.shape for t in outs)


def _empty_step(types, multi):
    empties = [np.empty(t.shape, t.dtype) if isinstance(t, TensorType) else None for t in types]

    def step(*args, out=None):
        return tuple(empties) if multi else empties[0]

    return step


def _free_lists(steps, step_io, memory, slots, never) -> tuple:
    """After each step, drop the values nobody reads any more (arena values need no
    freeing; the rest may be big, and pool buffers go back to the pool). A view keeps its
    base alive: memory.values' last_step already covers the views of a value. Returns the
    slots to drop once the run's outputs are taken (bases of outputs that are views)."""
    last = {}
    for k, s in enumerate(step_io):
        for r in s.reads:
            last[r] = k
    for n, pv in memory.values.items():
        last[n] = max(last.get(n, -1), pv.last_step)
    at_step: dict = {}  # step -> the slots it drops, in the order of `last` (a pass over all per step was quadratic)
    for n, at in last.items():
        if n in slots and n not in never and (memory.values.get(n) is None or memory.values[n].offset is None):
            at_step.setdefault(min(at, len(steps)), []).append(slots[n])
    for k, st in enumerate(steps):
        st.free = tuple(at_step.get(k, ()))
    return tuple(at_step.get(len(steps), ()))


def _shape_free(kern, ctx) -> bool:
    """A plain kernel (not a builder, no workspace) whose outputs have known shapes even
    though an input's does not (Shape of a KV cache, attention weights @ V): it is bound
    once and writes into planned buffers; a wrong run-time shape fails in the kernel."""
    return not kern.builder and not kern.workspace and \
        all(isinstance(t, TensorType) and t.is_static for t, o in zip(ctx.output_types, ctx.node.outputs) if o)


class _DynamicStep:
    """A node whose shapes are only known at run time (downstream of NonZero, Loop...).

    Per distinct input signature it re-runs the op's meta on the real input shapes,
    binds the kernel for them, and hands it output buffers of those shapes: from the
    plan's buffer pool for values the run frees again, freshly allocated for graph
    outputs (they go to the caller). The general case stays correct, and the static case
    keeps its zero-overhead path.
    """

    MAX_CACHED = 16

    def __init__(self, kern, ctx, bind, pool, limit, to_caller, arena=None):
        self.kern, self.ctx, self.bind = kern, ctx, bind
        self.pool, self.limit = pool, limit
        # The plan's arena: a result that is a view into it (a Slice of a static value) is
        # copied out, as the memory plan frees that value's bytes after its last reader
        # and does not know of views a dynamic step makes (they would be overwritten while
        # still read: a causal mask sliced per decode step, then a fused attention's output)
        self.arena = arena if arena is not None and arena.size else None
        self.to_caller = to_caller  # per output: handed to the caller (never a pool buffer)
        self.cache = {}
        self.plain = None  # the bound step of a kernel that is not a builder
        # In a plan with symbolic dims, a plain kernel's output shapes are formulas of its
        # input shapes: evaluated per run, no meta rule needed (shape_formula.py).
        # A builder bound once that allocates its output itself (CacheConcat, which appends
        # into room behind its past) needs no shapes: its step runs as it is, below, and checks
        # what it allocates against ctx.memory_limit itself (the formula's evaluation and the
        # limit check here cost its decode step 68 us a call against 38 for the kernel).
        n_in = len(ctx.node.inputs)
        bound_once = not kern.builder or (kern.any_shape and kern.out)
        self.formula = ShapeFormula.build(ctx.input_types[:n_in], ctx.output_types) if bound_once else None
        self.out_dtypes = [t.dtype for t in ctx.output_types] if self.formula is not None else None
        # one output written into the buffer given (a KV cache's Concat, per decode step): _run_one
        self.single = self.formula is not None and kern.out and not kern.multi and len(self.out_dtypes) == 1

    def __call__(self, *args, out=None):
        if self.formula is not None:
            shapes = self.formula.evaluate(args)
            if shapes is not None:
                if self.plain is None:
                    self.plain = self.bind(self.ctx)
                if self.single:
                    return self._run_one(args, shapes[0])
                self._check_limit(args, zip(shapes, self.out_dtypes))
                return self._run(self.plain, args, list(zip(shapes, self.out_dtypes)))
        if self.kern.any_shape and not self.kern.multi:
            # Output shapes that follow from input values (a Slice's starts and ends): the
            # step, bound once, allocates its output itself (no meta re-run per shape).
            if self.plain is None:
                self.plain = self.bind(self.ctx)
            return self._detach(self.plain(*args))
        # Small integer inputs (shapes, axes, starts) and a few floats (Range's bounds, Resize's
        # scales) steer output shapes: part of the key, and given to the meta, whose shapes
        # the memory limit is checked against before the kernel allocates (_prepare).
        floats = self.ctx.node.op_type in _SHAPED_BY_FLOATS
        key = tuple(((a.shape, a.dtype.str, a.tobytes() if _steers(a, floats) else None)
                     if isinstance(a, np.ndarray) else type(a).__name__) for a in args)
        entry = self.cache.get(key)
        if entry is None:
            entry = self._prepare(args)
            if len(self.cache) >= self.MAX_CACHED:
                self.cache.pop(next(iter(self.cache)))
            self.cache[key] = entry
        fn, alloc = entry
        return self._run(fn, args, alloc)

    def _run(self, fn, args, alloc):
        if alloc and all(shape is not None and 0 in shape for shape, _ in alloc):
            empties = tuple(np.empty(shape, dt) for shape, dt in alloc)  # nothing to compute
            return empties if self.kern.multi else empties[0]
        if not self.kern.out:
            return self._detach(fn(*args))
        bufs = [self._buffer(shape, dt, k) if shape is not None else None for k, (shape, dt) in enumerate(alloc)]
        r = self._detach(fn(*args, out=tuple(bufs) if self.kern.multi else bufs[0]))
        if self.pool is not None:
            for buf, res in zip(bufs, r if self.kern.multi else (r,)):
                if buf is not None and res is not buf:  # the kernel answered elsewhere
                    self.pool.hand_over(buf, res)
        return r

    def _run_one(self, args, shape):
        """_run for one output of a known shape, without its generality (a decode step runs
        two dozen of these, each in caches a streamed product has just emptied): the buffer
        handed out and returned as is needs no check against the arena (it is not in it)."""
        dt = self.out_dtypes[0]
        if math.prod(shape) * dt.itemsize > self.limit:
            self._check_limit(args, [(shape, dt)])  # raises, naming the node
        if 0 in shape:
            return np.empty(shape, dt)  # nothing to compute
        buf = self._buffer(shape, dt, 0)
        r = self.plain(*args, out=buf)
        if r is buf:
            return r
        r = self._detach(r)
        if self.pool is not None:
            self.pool.hand_over(buf, r)
        return r

    def _detach(self, r):
        arena = self.arena
        if arena is None:
            return r
        if self.kern.multi:
            return tuple(x.copy() if isinstance(x, np.ndarray) and np.may_share_memory(x, arena) else x for x in r)
        return r.copy() if isinstance(r, np.ndarray) and np.may_share_memory(r, arena) else r

    def _buffer(self, shape, dt, k):
        if self.pool is None or (k < len(self.to_caller) and self.to_caller[k]):
            return np.empty(shape, dt)
        return self.pool.empty(shape, dt)

    def _check_limit(self, args, shapes_dtypes):
        need = sum(math.prod(sh) * dt.itemsize for sh, dt in shapes_dtypes if sh is not None)
        if need > self.limit:
            raise MemoryLimitError(f"{describe_node(self.ctx.node)} would allocate {need:,} bytes for inputs "
                                   f"{[getattr(a, 'shape', None) for a in args]}, over the session's memory "
                                   f"limit of {self.limit:,} bytes")

    def _prepare(self, args):
        from dataclasses import replace

        from ..ir import type_of_value
        from .infer import infer_node

        node = self.ctx.node
        n_in = len(node.inputs)
        types = {name: type_of_value(a) for name, a in zip(node.inputs, args[:n_in]) if name}
        types.update({name: type_of_value(a) for name, a in zip(node.implicit_inputs, args[n_in:])})
        values = {name: c for name, c in zip(node.inputs, self.ctx.const_inputs) if name and c is not None}
        floats = node.op_type in _SHAPED_BY_FLOATS
        for name, a in zip(node.inputs, args[:n_in]):  # small inputs (shapes, axes, bounds) steer meta
            if name and isinstance(a, np.ndarray) and _steers(a, floats):
                values[name] = a
        infer_node(None, node, types, values, {}, True)
        out_types = [types.get(o) if o else None for o in node.outputs]
        alloc = [((tuple(t.shape), t.dtype) if isinstance(t, TensorType) and t.is_static and t.dtype != object
                  else (None, None)) for t in out_types]
        self._check_limit(args, alloc)
        if not self.kern.builder:  # a plain function of the inputs: bound once, whatever the shapes
            if self.plain is None:
                self.plain = self.bind(self.ctx)
            return self.plain, alloc
        ctx = replace(self.ctx, input_types=[types.get(i) if i else None for i in node.inputs], output_types=out_types)
        ctx.workspace = None
        return self.bind(ctx), alloc


# Ops whose float inputs set their output shapes: Range's bounds, Resize's and Upsample's
# scales (a fed 1e6 made a 4 MB range under a 1 MiB memory limit, its size unknown to the meta)
_SHAPED_BY_FLOATS = frozenset({"Range", "Resize", "Upsample"})


def _steers(a: np.ndarray, floats: bool) -> bool:
    """A run-time input that may set a dynamic step's output shapes: a small integer tensor
    (a shape, axes, starts), or with `floats` (_SHAPED_BY_FLOATS) a few floats. (Not the
    floats of other ops: small data would key a plan per value.)"""
    return (a.dtype.kind in "iu" and a.size <= 64) or (floats and a.dtype.kind == "f" and a.size <= 8)


def _pooled_slots(steps) -> frozenset:
    """The slots that may hold an array from the plan's pool: outputs of steps bound per run
    (_DynamicStep, the only ones handed pool buffers), and of alias or in-place steps reading
    one (the same buffer under another name). Freeing any other slot is only dropping it (a
    release call, its lock and lookup: ~1.7 us a value, 47 us of a 205 us run of Silero's VAD,
    whose If body freed 26 views a run, none from the pool)."""
    pooled: set = set()
    for st in steps:
        if isinstance(st.fn, _DynamicStep) or ((st.kernel.alias or st.kernel.inplace)
                                               and any(i in pooled for i in st.ins)):
            pooled.update(o for o in st.outs if o >= 0)
    return frozenset(pooled)


def _new_output(fresh):
    """A new array for an output: (shape, dtype) or (shape, dtype, "nhwc")."""
    if len(fresh) == 2:
        return np.empty(fresh[0], fresh[1])
    return channels_last_view(np.empty(math.prod(fresh[0]), fresh[1]), fresh[0])


def run_plan(plan: Plan, feeds: dict, outer=None, profile=None, keep_env: bool = False, into=None,
             nested: bool = False):
    """The outputs in graph order; with keep_env, (outputs, {value name: value}). `into`:
    {output name: array} the caller owns, written instead of a new array (io_binding).
    nested: a body's run inside a run already going on (a Loop's iteration)."""
    if nested:
        return _run_plan(plan, feeds, outer, profile, keep_env, into)
    pages.run_began()  # (huge pages move only while no run goes on: pages.promote_when_idle)
    try:
        return _run_plan(plan, feeds, outer, profile, keep_env, into)
    finally:
        pages.run_ended()


def _run_plan(plan: Plan, feeds: dict, outer, profile, keep_env: bool, into):
    guard = run_guard.current()
    if guard is not None:
        guard.check()
    env = plan.template[:]
    for name, s in plan.inputs:
        env[s] = feeds[name]
    if plan.shape_values is not None:
        _fill_shape_values(plan, env)
    if outer:
        slots = plan.slots
        for name, v in outer.items():
            if name in slots:
                env[slots[name]] = v
    pool = plan.pool
    if guard is None and profile is None and plan.straight is not None:
        plan.straight(env)
    else:
        if guard is None and profile is None:
            plan.runs += 1
            if plan.runs == STRAIGHT_AFTER:  # a plan that is replayed: worth compiling its steps
                plan.straight = straight.compile_steps(plan.steps, pool, execute_step, node_error, check_outputs,
                                                       {i for i, v in enumerate(plan.template) if v is not None})
                pages.promote_when_idle()  # and its arena and packed weights worth moving onto huge pages (pages.py)
        if plan.executed:
            for st in plan.steps:
                execute_step(st, env, pool, guard, profile)
        else:
            # The first run makes the kernels' primitives, memories and packed weights: the
            # collector paused, as for compiling the plan (gc_pause.py; measured with
            # gc.callbacks: 2.8 ms of inception_v1's first run, 5.5 of densenet121's)
            with gc_paused():
                for prepare in before_first_run:
                    prepare()
                for st in plan.steps:
                    execute_step(st, env, pool, guard, profile)
            plan.executed = True
            pages.release_slab_tail()  # its kernels have made their buffers (packed weights, scratchpads)
    res = []
    for name, s, copy in plan.outputs:
        v = env[s]
        if into is not None and name in into:
            res.append(_write_into(into[name], v, name))
            continue
        res.append(v.copy() if copy and isinstance(v, np.ndarray) else v)
    if pool is not None and not keep_env:
        for s in plan.free_at_end:
            v, env[s] = env[s], None
            if s in plan.pooled and isinstance(v, np.ndarray):
                pool.release(v)
    if keep_env:
        return res, {name: env[s] for name, s in plan.slots.items()}
    return res


def _fill_shape_values(plan, env) -> None:
    """The values a symbolic plan computes from its input shapes (Plan.shape_values) into env."""
    evaluate, slots = plan.shape_values
    try:
        values = evaluate([env[s] for _, s in plan.inputs])
    except ValueError as e:  # (the runner matched the inputs to the plan: not expected)
        raise InvalidArgumentError(f"{e}: inputs of shapes {[getattr(env[s], 'shape', None) for _, s in plan.inputs]}"
                                   ) from e
    for s, v in zip(slots, values):
        env[s] = v


# The ops whose outputs a plan may compute from the input shapes instead of running them
# (_values_from_shapes): those whose value rules in inference are exact for small integer
# vectors, given their other inputs (Gather's indices, Slice's bounds) as constants.
_EXACT_VALUE_OPS = frozenset({"Gather", "Unsqueeze", "Squeeze", "Concat", "Cast", "Identity", "Reshape", "Add", "Sub",
                              "Mul", "Slice"})
_CONSTANT_PARAMS = {"Gather": (1,), "Slice": (1, 2, 3, 4)}


def _values_from_shapes(executed, inf, input_types, keep) -> tuple:
    """In a plan with symbolic dims: (executed without the nodes whose outputs follow from
    the input shapes, {such a node: its values as text}, a ValuesFromShapes for the values a
    remaining step reads or the graph returns, {Shape node kept to check its real output:
    the name its expected value takes}). A Shape of a plan input is exact; a Shape of a
    computed value rests on inference's shape for it (a Slice taken to lie within its data),
    so it still runs, and its output is checked against the value computed (_CheckedShape)."""
    if all(not isinstance(t, TensorType) or t.is_static for t in input_types.values()):
        return executed, {}, None, {}
    symbolic_values = {}
    for node, _, _, _ in executed:
        outs = [o for o in node.outputs if o]
        vals = [inf.values.get(o) for o in outs]
        if outs and folding.may_fold(node) and all(isinstance(v, np.ndarray) and v.dtype == object for v in vals):
            symbolic_values.update(zip(outs, vals))
    if not symbolic_values:
        return executed, {}, None, {}
    _, taken = ValuesFromShapes.build(list(input_types.values()), symbolic_values, inf.types)
    taken = set(taken)
    dropped, checked, known = {}, {}, set()  # known: values the dropped and checked nodes stand for
    for node, _, ctx, _ in executed:
        outs = [o for o in node.outputs if o]
        if not outs or not all(o in taken for o in outs):
            continue
        if node.op_type == "Shape":
            (checked if node.inputs[0] not in input_types else dropped)[node.name] = node
        elif node.op_type in _EXACT_VALUE_OPS and _computed_from(node, ctx, known):
            dropped[node.name] = node
        else:
            continue
        known.update(outs)
    if not dropped:
        return executed, {}, None, {}
    kept = [e for e in executed if e[0].name not in dropped]
    made = {o for node, _, _, _ in kept for o in node.outputs if o}
    read = {i for node, _, _, _ in kept for i in (*node.inputs, *node.implicit_inputs) if i} | keep
    needed = {n: symbolic_values[n] for n in known if n in read and n not in made}
    types = dict(inf.types)
    expected = {}
    for name, node in checked.items():
        alias = f"{node.outputs[0]}\x00expected"  # (no model value has a NUL in its name)
        expected[name] = alias
        needed[alias], types[alias] = symbolic_values[node.outputs[0]], inf.types[node.outputs[0]]
    values = ValuesFromShapes.build(list(input_types.values()), needed, types)[0] if needed else None
    if values is None:  # (cannot happen: a subset of what build took)
        return executed, {}, None, {}
    text = {node_name: ", ".join(f"{o} = {symbolic.shape_str(inf.values[o].reshape(-1).tolist())}"
                                 for o in node.outputs if o) for node_name, node in dropped.items()}
    return kept, text, values, expected


def _computed_from(node, ctx, known) -> bool:
    """Whether every input of `node` is a constant or a value `known` from the input shapes,
    its parameters (_CONSTANT_PARAMS) constants."""
    params = _CONSTANT_PARAMS.get(node.op_type, ())
    for k, (i, c) in enumerate(zip(node.inputs, ctx.const_inputs)):
        if i and c is None and (k in params or i not in known):
            return False
    return True


class _CheckedShape:
    """A Shape step whose output a plan also computes from the input shapes (for the nodes
    after it, which do not run): its real output must be the computed one, else inference's
    shape of its input (a Slice taken to lie within its data) does not hold for these inputs,
    and the values computed from it would be wrong. Fails loudly, naming the node."""

    __slots__ = ("fn", "node")

    def __init__(self, fn, node):
        self.fn, self.node = fn, node

    def __call__(self, *args, **kwargs):
        *ins, expected = args
        r = self.fn(*ins, **kwargs)
        if not np.array_equal(r, expected):
            raise NodeExecutionError(
                f"{describe_node(self.node)}: its input's shape is {np.asarray(r).tolist()} at run time, where the "
                f"plan for these input shapes took it to be {np.asarray(expected).tolist()} (a slice past its data's "
                f"end, or another shape the model's inputs do not give)")
        return r


def execute_step(st, env, pool, guard=None, profile=None):
    """One step of a run: its inputs from the slots, the kernel, its outputs into the slots,
    the values nobody reads any more dropped (pool buffers back to the pool)."""
    args = [env[i] if i >= 0 else None for i in st.ins]
    if guard is not None:
        guard.check(st, args)
    out = st.bufs
    if st.fresh is not None:
        if st.multi:
            out = [_new_output(f) if f is not None else b for f, b in zip(st.fresh, out)]
        else:
            out = _new_output(st.fresh[0])
    if profile is not None:
        t0 = time.perf_counter()
    try:
        r = st.fn(*args, out=tuple(out) if st.multi else out) if st.uses_out else st.fn(*args)
    except GlassrtError:
        raise
    except Exception as e:
        raise node_error(st, args, e) from e
    if profile is not None:
        profile.append((st, t0, time.perf_counter(), _shapes(args), _shapes(r if st.multi else (r,))))
    if st.multi:
        for s, v in zip(st.outs, r):
            if s >= 0:
                env[s] = straight.as_value(v)
    else:
        env[st.outs[0]] = straight.as_value(r)
    if st.expect:
        check_outputs(st, env, args)
    for s in st.free:
        v = env[s]
        env[s] = None
        if pool is not None and s in st.give_back and isinstance(v, np.ndarray):
            pool.release(v)


def check_outputs(st, env, args=None) -> None:
    """The step's outputs that its kernel allocated itself against the op's meta (shape and
    dtype): a KernelContractError naming the first that differs."""
    for s, shape, dt in st.expect:
        v = env[s]
        if isinstance(v, np.ndarray) and (v.shape != shape or v.dtype != dt):
            if args is None:
                args = [env[i] if i >= 0 else None for i in st.ins]
            raise KernelContractError(
                f"{st.describe(args)}: output {st.node.outputs[st.outs.index(s)]!r} is "
                f"{dtypes.name(v.dtype)}{list(v.shape)} but the op's meta says {dtypes.name(dt)}{list(shape)}")


def node_error(st, args, e) -> NodeExecutionError:
    return NodeExecutionError(f"{st.describe(args)} failed: {type(e).__name__}: {e}")


def _shapes(values):
    return [(dtypes.name(v.dtype), list(v.shape)) if isinstance(v, np.ndarray) else None for v in values]


def signature_of(feeds: dict) -> tuple:
    return tuple((n, getattr(v, "shape", None), getattr(v, "dtype", type(v))) for n, v in feeds.items())


def _sig_str(input_types) -> str:
    return ", ".join(f"input {n}: {symbolic.shape_str(getattr(t, 'shape', None))}" for n, t in input_types.items())


def _largest_values(executed, most: int = 3) -> str:
    """The biggest outputs of a plan's nodes, to find what a memory limit is about."""
    sized = [(_nbytes(t), o, t, node) for node, _, ctx, _ in executed
             for o, t in zip(node.outputs, ctx.output_types) if o and _nbytes(t)]
    sized.sort(key=lambda e: -e[0])
    return "; ".join(f"'{o}' {dtypes.name(t.dtype)}{list(t.shape)} ({n:,} bytes) from {node.op_type} "
                     f"'{node.name}'" for n, o, t, node in sized[:most]) or "none sized"


def _write_into(dst, v, name):
    """Output `name` written into the caller's array `dst` (same dtype and shape)."""
    if not isinstance(v, np.ndarray) or v.shape != dst.shape or v.dtype != dst.dtype:
        got = f"{dtypes.name(v.dtype)}{list(v.shape)}" if isinstance(v, np.ndarray) else type(v).__name__
        raise InvalidArgumentError(f"output {name!r} is {got} this run, but the array bound to it is "
                                   f"{dtypes.name(dst.dtype)}{list(dst.shape)}; bind one of that shape and dtype, "
                                   f"or bind the output without an array")
    np.copyto(dst, v)
    return dst
