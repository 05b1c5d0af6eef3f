"""Kernel selection: which kernels of a provider can run a node, which one is best for
the concrete shapes of a plan, and binding it.

Placement asks `provider_verdict` once per node on the symbolic types ("can this provider
run it at all, and with which candidates?"); a plan asks `choose_kernel` per input-shape
signature ("which candidate for these shapes, and why?") and `bind_kernel` to get the step
it replays. Constant folding uses the same two to evaluate a node once.
"""
from __future__ import annotations

import numpy as np

from .. import dtypes
from ..errors import GlassrtError, NodeExecutionError, describe_node
from ..ir import TensorType
from ..kernels.registry import BindContext, Kernel, stand_in
from . import nan_handling

# Attributes that never change what an op computes (opsets 1-5's memory hint).
NO_EFFECT_ATTRS = {"consumed_inputs"}
_MISSING = object()


def kernel_reason(k: Kernel, ctx: BindContext, *, shapes: bool = True) -> str | None:
    """None if the kernel can run the node, else why not. shapes=False skips what depends on
    the shapes: the kernel's own predicate and its need of concrete shapes (selection
    re-checks both per plan)."""
    return _shape_free_reason(k, ctx) or (_shape_reason(k, ctx) if shapes else None)


def _shape_free_reason(k: Kernel, ctx: BindContext) -> str | None:
    """What refuses the node whatever its shapes: the op's version, its outputs, the dtype,
    attributes the kernel does not know, the kernel's own `applies`."""
    since = ctx.since_version
    if not k.covers_version(since):
        lo, hi = k.versions
        return f"{k.name} covers {ctx.node.op_type} versions {lo}..{hi or 'latest'}, node needs version {since}"
    n_out = max((i + 1 for i, o in enumerate(ctx.node.outputs) if o), default=0)
    if n_out > 1 and not k.multi:
        return f"{k.name} computes one output; the node asks for {n_out}"
    if k.dtypes is not None:
        dt = _key_dtype(ctx)
        if dt is not None and dt not in k.dtypes:
            return f"dtype {dtypes.name(dt)} not covered (covers {', '.join(sorted(dtypes.name(d) for d in k.dtypes))})"
    if k.attrs is not None:
        defaults = ctx.contract.attr_defaults if ctx.contract else {}
        for a, v in ctx.node.attrs.items():
            if a not in k.attrs and a not in NO_EFFECT_ATTRS and not _same(defaults.get(a, _MISSING), v):
                return f"attribute {a}={_short(v)} not supported by {k.name}"
    if k.applies is not None:
        return _predicate(k, k.applies, ctx)
    return None


def _shape_reason(k: Kernel, ctx: BindContext) -> str | None:
    """What refuses the node at these shapes: symbolic ones where the kernel binds concrete
    shapes, and the kernel's own predicate."""
    if k.static_only and not is_static(ctx):
        return f"{k.name} is bound to concrete shapes, and this node's are symbolic here"
    return _predicate(k, k.accepts, ctx) if k.accepts is not None else None


def _predicate(k: Kernel, predicate, ctx: BindContext) -> str | None:
    try:
        why = predicate(ctx)
    except Exception as e:  # a predicate that can't decide on symbolic shapes says no
        why = f"{k.name} cannot decide on these shapes ({type(e).__name__}: {e})"
    if why:
        return why if isinstance(why, str) else f"{k.name} does not accept this node"
    return None


def _same(a, b):
    try:
        return bool(np.all(np.asarray(a) == np.asarray(b))) and np.shape(a) == np.shape(b)
    except Exception:
        return False


def _short(v):
    s = repr(v)
    return s if len(s) < 40 else s[:37] + "..."


def _key_dtype(ctx: BindContext):
    """The dtype kernels are chosen by: the first given input's (unknown when its producer's
    type is: judging by a later input, e.g. a float scale, would give a misleading reason),
    or the first output's for nodes without inputs."""
    given = [t for name, t in zip(ctx.node.inputs, ctx.input_types) if name]
    if given:
        return given[0].dtype if isinstance(given[0], TensorType) else None
    for t in ctx.output_types:
        if isinstance(t, TensorType):
            return t.dtype
    return None


def provider_verdict(provider, node, contract, ctx) -> tuple[list, str]:
    """(candidate kernels best first, reason). The provider can run the node when at
    least one kernel passes every check on the symbolic shapes; the candidates are all
    kernels that pass the shape-independent checks, for selection to choose from per plan."""
    candidates, why, _, _ = provider_verdict_checked(provider, node, contract, ctx)
    return candidates, why


def provider_verdict_checked(provider, node, contract, ctx, batch=frozenset()) -> tuple[list, str, bool, bool]:
    """provider_verdict, whether a candidate passed every check on these very types (not
    only on a stand-in binding of symbolic dims), and whether some kernel passed the checks
    that do not depend on the shapes: placement asks, and the checks were made here already.
    `batch`: the symbols a stand-in binding takes as 1 first (see STAND_IN_DIM)."""
    why_not = provider.excluded(node.op_type) if hasattr(provider, "excluded") else None
    if why_not:
        return [], why_not, False, False
    ks = provider.kernels(node.domain, node.op_type, node.opset)
    if not ks:
        why_not = getattr(provider, "unavailable", None)
        if why_not:
            return [], f"{provider.name} is unavailable: {why_not}", False, False
        where = f" (domain {node.domain})" if node.domain else ""
        return [], f"no {provider.name} kernel for {node.op_type}{where}", False, False
    candidates, ok, why, shape_free, passed = [], [], [], False, False
    for k in sorted(ks, key=lambda k: -k.priority):
        r = _shape_free_reason(k, ctx)
        if r:
            why.append(r)
            continue
        shape_free = True
        if passed:
            # A better kernel passed (on these shapes or a stand-in binding): a plan asks
            # this one only where that one refuses the plan's shapes, and judges it then
            # (choose_kernel: the candidates in order). Not judged here, since some
            # predicates build what they judge: QLinearConv's float32 kernel beside VNNI's
            # int8 one made its weights' float32 copy and a descriptor, 25 ms of an 8-bit
            # MobileNetV2's placement over its 52 convolutions, for no plan to bind.
            candidates.append(k)
            continue
        r = _shape_reason(k, ctx)
        if r and k.static_only and not is_static(ctx):
            # A kernel bound per concrete shape judges a stand-in binding of the symbolic
            # dims (ranks, channels and kernel sizes are what its predicate looks at); each
            # plan re-checks its own shapes and moves the node on if it refuses them. (A
            # stand-in changes no dtype, attribute or output: only the shape checks again.
            # One stand-in context per binding, shared by the node's kernels and providers,
            # so that what a kernel works out from it is worked out once.)
            bindings = [(1, ())] if k.one_row else \
                [(STAND_IN_DIM, batch)] * bool(batch) + [(STAND_IN_DIM, ()), (STAND_IN_LARGE, ())]
            for value, ones in bindings:
                r = _shape_reason(k, ctx.cached(("stand-in", value, ones), lambda: stand_in(ctx, value, ones)))
                if not r:
                    break
            if r:
                why.append(r)
                continue
            r = f"{k.name} is bound to concrete shapes: each plan binds it for its own"
            passed = True  # (on a stand-in binding)
        passed = passed or not r
        candidates.append(k)
        (why.append(r) if r else ok.append(k))
    if ok or (candidates and not _all_static(ctx)):  # (best first: judged in that order)
        names = ", ".join(k.name for k in candidates)
        return candidates, f"{provider.name} has {node.op_type} kernel(s): {names}", bool(ok), shape_free
    return [], "; ".join(dict.fromkeys(why)), False, shape_free


STAND_IN_DIM = 32  # what a symbolic dim is taken to be when judging a static_only kernel
# ... but first with the model's batch symbols (placement.batch_symbols) at 1, the size a
# served model runs most: a kernel that makes its oneDNN descriptor to judge then makes the
# one a batch-1 plan binds (shared_pd), not one for 32 never run (a MobileNetV2's 52
# convolutions: 3.5-4.5 ms of its first plan's compilation) ...
# ... and, where a kernel refuses that, once more: sizes that small can be what it refuses
# (Silero VAD's STFT, a 256-wide conv over `samples + 128`, has no output at 32 samples)
STAND_IN_LARGE = 1024


def _all_static(ctx) -> bool:
    return all(t is None or not isinstance(t, TensorType) or t.is_static for t in ctx.input_types)


def is_static(ctx) -> bool:
    """Every tensor input and output shape known: the kernel can be bound for good. (Asked
    of a node's context by each of its kernels, at placement and again in plans: once each.)"""
    return ctx.cached("static", lambda: all(not isinstance(t, TensorType) or t.is_static
                                             for t in [*ctx.input_types, *ctx.output_types]))


def choose_kernel(decision, ctx, options, make_runner=None, subgraphs=None):
    """The best eligible kernel of the decision's provider for these concrete shapes, and why."""
    if options.autotune and len(decision.kernels) > 1 and is_static(ctx):
        # (a plan that keeps NaN times only kernels that keep it as they are; where fewer
        # than two do, the loop below may still bind one without its activation)
        eligible = [k for k in decision.kernels if kernel_reason(k, ctx) is None
                    and not (nan_handling.exact(options) and nan_handling.drop_reason(k, ctx))]
        if len(eligible) > 1:
            from . import autotune

            def bind(k):
                ctx.workspace = None
                return bind_kernel(k, ctx, make_runner, subgraphs)

            picked = autotune.choose(eligible, ctx, bind, options)
            if picked is not None:
                return picked
    rejected, keep_nan = [], nan_handling.exact(options)
    for k in decision.kernels:
        why, after = kernel_reason(k, ctx), ""
        if why is None and keep_nan and (drop := nan_handling.drop_reason(k, ctx)):
            split = nan_handling.without_activation(ctx)
            if split is not None and kernel_reason(k, split) is None and not nan_handling.drop_reason(k, split):
                ctx.attrs, ctx.after = split.attrs, split.after  # (bind_kernel applies it after the kernel)
                after = f" [its {split.after[0]} applied after it, in NumPy, which keeps NaN: {drop}]"
            else:
                why = f"loses NaN or Inf ({drop})"
        if why is not None:
            rejected.append(f"{algorithm(k)}: {why}")
            continue
        if decision.fallback:
            text = "fallback — " + decision.skipped()
        elif len(decision.kernels) == 1:
            text = k.doc or f"the only {decision.provider} kernel for {ctx.node.op_type}"
        else:
            text = f"{algorithm(k)} (priority {k.priority})"
            if rejected:
                text += " over " + "; ".join(rejected)
            if k.doc:
                text += f" — {k.doc}"
        if decision.rejected and not decision.fallback:  # passed a partial provider (onednn)
            text += f" [{decision.skipped()}]"
        return k, text + after
    raise NodeExecutionError(f"{describe_node(ctx.node)}: no {decision.provider} kernel accepts these "
                             f"input shapes: {'; '.join(rejected)}")


def algorithm(k) -> str:
    """'im2col_gemm' for 'cpu.Conv.im2col_gemm'."""
    return k.name.split(".", 2)[-1] if k.name.count(".") >= 2 else k.name


def bind_kernel(kern, ctx, make_runner=None, subgraphs=None):
    """The step the plan replays for this node. `subgraphs` ({attr: placement}) and
    `make_runner` let control-flow kernels run their bodies."""
    ctx.session = SubgraphAccess(make_runner, subgraphs or {})
    try:
        step = kern.bind(ctx)
        return step if ctx.after is None else nan_handling.then_activate(step, *ctx.after)
    except GlassrtError:
        raise
    except Exception as e:
        raise NodeExecutionError(f"{describe_node(ctx.node)}: kernel {kern.name} could not be prepared: "
                                 f"{type(e).__name__}: {e}") from e


class SubgraphAccess:
    """Given to control-flow kernels: builds runners for the node's (placed) subgraphs."""

    def __init__(self, make_runner, subs):
        self.make_runner, self.subs = make_runner, subs

    def runner(self, attr, index=None):
        if self.make_runner is None:
            raise GlassrtError("this node's subgraphs cannot run here (no runner was given)")
        p = self.subs[attr]
        return self.make_runner(p[index] if index is not None else p)

    def held(self, attr):
        """The body's runner as a runner.HeldPlan: for a node that runs the body once per run
        of its own plan (an If's branch), which keeps the body's plan checked out."""
        from .runner import HeldPlan

        return HeldPlan(self.runner(attr))
