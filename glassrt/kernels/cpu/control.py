"""Control flow: If, Loop, Scan, SequenceMap run their bodies through nested GraphRunners.

A body is a placed graph with its own plan cache, so a Loop whose iterations keep the
same shapes replays one compiled plan per iteration. Values the body reads from the
enclosing graph arrive as the node's implicit inputs (after its declared inputs).
"""
from __future__ import annotations

import numpy as np

from ..registry import kernel
from . import scan_batched


def _split_outer(ctx, args):
    n = len(ctx.node.inputs)
    return list(args[:n]), dict(zip(ctx.node.implicit_inputs, args[n:]))


@kernel("If", bind=True, multi=True)
def if_(ctx):
    # each branch's plan held by this step while its feeds keep their shapes (runtime/runner.HeldPlan)
    then_b, else_b = ctx.session.held("then_branch"), ctx.session.held("else_branch")

    def step(*args):
        (cond,), outer = _split_outer(ctx, args)
        if cond is None or np.size(cond) != 1:
            raise ValueError(f"If condition must hold exactly one element, got shape {np.shape(cond)}")
        branch = then_b if bool(np.asarray(cond).reshape(-1)[0]) else else_b
        return tuple(branch.run({n: outer[n] for n in branch.runner.outer_names if n in outer}))

    return step


def _empty_scan_output(ctx, body_type, leading):
    t = body_type
    shape = (0,) + tuple(d if isinstance(d, int) else 0 for d in (t.shape or ())) if t is not None else (0,)
    return np.empty(shape, t.dtype if t is not None else np.float32)


@kernel("Loop", bind=True, multi=True)
def loop(ctx):
    runner = ctx.session.runner("body")
    body = runner.placement.graph
    names = [v.name for v in body.inputs]
    n_carried = len(ctx.node.inputs) - 2
    body_types = runner.placement.inference.types

    def step(*args):
        ins, outer = _split_outer(ctx, args)
        trip, cond = ins[0], ins[1]
        carried = ins[2:]
        max_trip = int(np.asarray(trip).reshape(-1)[0]) if trip is not None else None
        going = bool(np.asarray(cond).reshape(-1)[0]) if cond is not None else True
        scans = None
        i = 0
        with runner.repeated(outer) as run_body:
            while going and (max_trip is None or i < max_trip):
                feeds = {names[0]: np.array(i, dtype=np.int64), names[1]: np.array(going, dtype=np.bool_)}
                feeds.update(zip(names[2:], carried))
                outs = run_body(feeds)
                going = bool(np.asarray(outs[0]).reshape(-1)[0])
                carried = outs[1:1 + n_carried]
                if scans is None:
                    scans = [[] for _ in outs[1 + n_carried:]]
                for acc, v in zip(scans, outs[1 + n_carried:]):
                    acc.append(v)
                i += 1
        n_scan = len(ctx.node.outputs) - n_carried
        if scans is None:
            scan_names = [v.name for v in body.outputs[1 + n_carried:]]
            stacked = [_empty_scan_output(ctx, body_types.get(n), 0) for n in scan_names]
        else:
            stacked = [np.stack(acc) if acc and isinstance(acc[0], np.ndarray) else acc for acc in scans]
        return tuple(list(carried) + stacked[:n_scan])

    return step


def _scan_attrs(ctx):
    """(states, scan inputs, scan outputs, their axes and directions) of a Scan (opset 9 on)."""
    n_scan = int(ctx.attrs["num_scan_inputs"])
    n_state = len(ctx.node.inputs) - n_scan
    n_out_scan = len(ctx.node.outputs) - n_state
    return (n_state, n_scan, n_out_scan, list(ctx.attrs.get("scan_input_axes") or [0] * n_scan),
            list(ctx.attrs.get("scan_input_directions") or [0] * n_scan),
            list(ctx.attrs.get("scan_output_axes") or [0] * n_out_scan),
            list(ctx.attrs.get("scan_output_directions") or [0] * n_out_scan))


@kernel("Scan", bind=True, multi=True, versions=(9, None))
def scan(ctx):
    runner = ctx.session.runner("body")
    body = runner.placement.graph
    names = [v.name for v in body.inputs]
    n_state, _, n_out_scan, in_axes, in_dirs, out_axes, out_dirs = _scan_attrs(ctx)
    body_types = runner.placement.inference.types
    out_names = [v.name for v in body.outputs[n_state:]]

    def step(*args):
        ins, outer = _split_outer(ctx, args)
        states, xs = list(ins[:n_state]), ins[n_state:]
        axes = [a + x.ndim if a < 0 else a for a, x in zip(in_axes, xs)]
        for j, (x, a) in enumerate(zip(xs, axes)):
            if not 0 <= a < x.ndim:
                raise ValueError(f"scan input {j} has rank {x.ndim}: no scan axis {in_axes[j]}")
        lengths = {x.shape[a] for x, a in zip(xs, axes)}
        if len(lengths) != 1:
            raise ValueError(f"scan inputs disagree on the sequence length: {sorted(lengths)}")
        seq_len = lengths.pop()
        collected = [[] for _ in range(n_out_scan)]
        with runner.repeated(outer) as run_body:
            for t in range(seq_len):
                feeds = dict(zip(names[:n_state], states))
                for j, (x, a) in enumerate(zip(xs, axes)):
                    feeds[names[n_state + j]] = x.take(seq_len - 1 - t if in_dirs[j] else t, axis=a)
                outs = run_body(feeds)
                states = outs[:n_state]
                for acc, v in zip(collected, outs[n_state:]):
                    acc.append(v)
        results = []
        for j, acc in enumerate(collected):
            if out_dirs[j]:
                acc = acc[::-1]
            if not acc:  # (no iteration: the shape and dtype one would have given, with 0 rows)
                empty = _empty_scan_output(ctx, body_types.get(out_names[j]), 0)
                results.append(np.moveaxis(empty, 0, out_axes[j] + empty.ndim if out_axes[j] < 0 else out_axes[j]))
                continue
            r = acc[0].ndim + 1
            a = out_axes[j] + r if out_axes[j] < 0 else out_axes[j]
            results.append(np.stack(acc, axis=a))
        return tuple(list(states) + results)

    return step


def _independent_iterations(ctx):
    """None where the Scan's iterations can run at once (scan_batched.py), else why not."""
    why = scan_batched.why_not(ctx.attrs.get("body"), _scan_attrs(ctx)[0])
    return None if why is None else f"iterations run one by one: {why}"


@kernel("Scan", bind=True, multi=True, versions=(9, None), accepts=_independent_iterations, priority=1,
        name="all_at_once")
def scan_all_at_once(ctx):
    """A Scan whose iterations are independent (its states pass through unchanged), its body
    run once over every iteration's slice (scan_batched.py); the loop where it cannot be."""
    loop = scan(ctx)
    body = ctx.session.runner("body").placement.graph
    n_state, _, _, in_axes, in_dirs, out_axes, out_dirs = _scan_attrs(ctx)

    def step(*args):
        ins, outer = _split_outer(ctx, args)
        xs = ins[n_state:]
        if all(type(x) is np.ndarray for x in xs) and all(-x.ndim <= a < x.ndim for x, a in zip(xs, in_axes)):
            axes = [a + x.ndim if a < 0 else a for x, a in zip(xs, in_axes)]
            done = scan_batched.run(body, n_state, ins[:n_state], xs, axes, in_dirs, out_axes, out_dirs, outer)
            if done is not None:
                return done
        return loop(*args)

    return step


@kernel("Scan", bind=True, multi=True, versions=(8, 8), name="scan_v8")
def scan_v8(ctx):
    """Opset 8: a leading batch axis, the sequence on axis 1, optional sequence_lens."""
    runner = ctx.session.runner("body")
    names = [v.name for v in runner.placement.graph.inputs]
    n_scan = int(ctx.attrs["num_scan_inputs"])
    n_state = len(ctx.node.inputs) - 1 - n_scan
    dirs = list(ctx.attrs.get("directions") or [0] * n_scan)
    n_out_scan = len(ctx.node.outputs) - n_state

    def step(*args):
        ins, outer = _split_outer(ctx, args)
        seq_lens, states0, xs = ins[0], ins[1:1 + n_state], ins[1 + n_state:]
        for j, x in enumerate(xs):
            if x.ndim < 2 or x.shape[0] != xs[0].shape[0] or x.shape[1] != xs[0].shape[1]:
                raise ValueError(f"scan input {j} must be (batch, sequence, ...) like scan input 0 "
                                 f"{list(xs[0].shape)}, got {list(x.shape)}")
        batch, max_len = xs[0].shape[0], xs[0].shape[1]
        for j, st in enumerate(states0):
            if st.ndim < 1 or st.shape[0] != batch:
                raise ValueError(f"state input {j} must have the batch size {batch} first, got {list(st.shape)}")
        if seq_lens is not None and (seq_lens.shape != (batch,) or (seq_lens < 0).any() or (seq_lens > max_len).any()):
            raise ValueError(f"sequence_lens must be {batch} lengths in [0, {max_len}], got {seq_lens.tolist()}")
        final_states = [[] for _ in range(n_state)]
        scans = [[] for _ in range(n_out_scan)]
        for b in range(batch):
            length = int(seq_lens[b]) if seq_lens is not None else max_len
            states = [s[b] for s in states0]
            per_step = [[] for _ in range(n_out_scan)]
            with runner.repeated(outer) as run_body:
                for t in range(length):
                    feeds = dict(zip(names[:n_state], states))
                    for j, x in enumerate(xs):
                        feeds[names[n_state + j]] = x[b, length - 1 - t if dirs[j] else t]
                    outs = run_body(feeds)
                    states = outs[:n_state]
                    for acc, v in zip(per_step, outs[n_state:]):
                        acc.append(v)
            for acc, s in zip(final_states, states):
                acc.append(s)
            for acc, steps in zip(scans, per_step):
                acc.append(np.stack(steps))
        return tuple([np.stack(s) for s in final_states] + [np.stack(s) for s in scans])

    return step


@kernel("SequenceMap", bind=True, multi=True)
def sequence_map(ctx):
    runner = ctx.session.runner("body")
    names = [v.name for v in runner.placement.graph.inputs]
    n_out = len(ctx.node.outputs)

    def step(*args):
        ins, outer = _split_outer(ctx, args)
        seq = ins[0]
        results = [[] for _ in range(n_out)]
        with runner.repeated(outer) as run_body:
            for i in range(len(seq)):
                feeds = {names[0]: seq[i]}
                for name, extra in zip(names[1:], ins[1:]):
                    feeds[name] = extra[i] if isinstance(extra, list) else extra
                for acc, v in zip(results, run_body(feeds)):
                    acc.append(v)
        return tuple(results)

    return step
