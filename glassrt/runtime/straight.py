"""A plan's steps as one straight-line Python function: the replay loop without the loop.

`run_plan` replays a plan step by step: per step it builds the argument list, looks up a
dozen attributes, checks for fresh outputs, expected shapes and frees, and converts
scalars: ~3 µs before the kernel runs, against onnxruntime's ~0.5 µs per node, and the
whole latency of a small model or a decoding step's hundreds of tiny ops. A plan that is
replayed (plan.STRAIGHT_AFTER runs: compiling costs ~85 us per step once, so only a plan
that keeps running gains) gets its steps written out once as Python source and compiled:

    def run(env):
        k = 0
        r = F0(env[0], out=B0)
        env[1] = r if r.__class__ is ndarray else as_value(r)
        k = 1
        ...

Only integers (slot indices) and names of this module's own making go into the source;
the kernels, buffers and steps are bound as the function's globals, so nothing from the
model is ever compiled. Steps whose outputs are allocated per run (graph outputs, new
arrays for the caller each run) run through `execute_step`, the loop's own body; a kernel that allocates
its own output (a Reshape's view) has it checked inline against the op's meta. A kernel's error
is reported as the loop reports it (the node, its kernel and its inputs).
"""
from __future__ import annotations

import numpy as np

from ..errors import GlassrtError


def as_value(r):
    """What a run stores for a kernel's result: NumPy scalars (and Python numbers) become 0-d
    arrays; anything else (an array, a sequence, a device value) as is."""
    return np.asarray(r) if isinstance(r, (np.generic, int, float, bool)) else r


def _inline(st) -> bool:
    """Steps written out in full: all but those whose outputs are allocated per run (graph
    outputs) and single-output steps whose output nobody keeps."""
    return st.fresh is None and (st.multi or st.outs[0] >= 0)


def compile_steps(steps, pool, execute_step, node_error, check_outputs, constants=frozenset()):
    """run(env) executing `steps` in order, as run_plan's loop would without a guard or a
    profile: `execute_step` is the loop's body, `node_error` how it reports a kernel's error,
    `check_outputs(st, env)` its check of outputs a kernel allocated against the op's meta
    (called here only when one differs in class, shape or dtype from what the meta says).
    `constants`: the slots that hold constants (the same values every run). A freed value
    goes back to the pool only from the slots that may hold a pool buffer (Step.give_back).

    A view of the plan's own memory (an alias kernel's result: a Reshape, a Split into
    contiguous pieces, a Transpose moving dims of 1), whose other inputs are constants, is
    the same view every run while its input is the same array: it is made once and kept
    (`M{k}`: [input, result]); a new input object makes it again. Only for inputs written
    into the arena (or views of them), so no caller's array is held between runs. Measured
    in GPT-2's decode step: a Split into views 15 us a call there (cold caches, after a
    layer's weights streamed), a kept one well under 1."""
    scope = {"ndarray": np.ndarray, "as_value": as_value, "execute_step": execute_step, "pool": pool,
             "steps": steps, "GlassrtError": GlassrtError, "release": _releaser(pool), "node_error": node_error,
             "check_outputs": check_outputs}
    lines = ["def run(env):", "    k = -1", "    try:", "        pass"]  # (a plan may have no steps)
    arena = set()  # slots holding the arena buffer a step wrote, or a kept view of one
    for k, st in enumerate(steps):
        lines.append(f"        k = {k}")
        if not _inline(st):
            lines.append(f"        execute_step(steps[{k}], env, pool)")
            continue
        scope[f"F{k}"] = st.fn
        args = [f"env[{i}]" if i >= 0 else "None" for i in st.ins]
        if st.uses_out:
            scope[f"B{k}"] = tuple(st.bufs) if st.multi else st.bufs
            args.append(f"out=B{k}")
        if _kept_view(st, arena, constants):
            scope[f"M{k}"] = [None, None]
            lines += [f"        x = env[{st.ins[0]}]",
                      f"        if x is M{k}[0]:",
                      f"            r = M{k}[1]",
                      "        else:",
                      f"            r = F{k}({', '.join(args)})",
                      f"            M{k}[0] = x",
                      f"            M{k}[1] = r"]
            arena.update(s for s in st.outs if s >= 0)
        else:
            lines.append(f"        r = F{k}({', '.join(args)})")
            if st.uses_out and not st.multi and st.bufs is not None:
                arena.add(st.outs[0])
        # a multi-output kernel returns a sequence, one value per output (unused ones None)
        results = [(f"r[{j}]", s) for j, s in enumerate(st.outs) if s >= 0] if st.multi else [("r", st.outs[0])]
        for j, (value, s) in enumerate(results):
            if st.multi:
                lines.append(f"        v = {value}")
                value = "v"
            lines.append(f"        env[{s}] = {value} if {value}.__class__ is ndarray else as_value({value})")
            expect = [e for e in st.expect if e[0] == s]
            if expect:
                _, shape, dt = expect[0]
                scope[f"S{k}_{j}"], scope[f"D{k}_{j}"] = shape, dt
                lines.append(f"        if {value}.__class__ is not ndarray or {value}.shape != S{k}_{j} "
                             f"or {value}.dtype != D{k}_{j}:")
                lines.append(f"            check_outputs(steps[{k}], env)")
        for s in st.free:
            lines.append(f"        release(env, {s})" if pool is not None and s in st.give_back
                         else f"        env[{s}] = None")
    lines += ["    except GlassrtError:", "        raise",
              "    except Exception as e:",
              "        st = steps[k]",
              "        raise node_error(st, [env[i] if i >= 0 else None for i in st.ins], e) from e"]
    exec(compile("\n".join(lines), "<glassrt plan>", "exec"), scope)  # noqa: S102 - integers and our names only
    return scope["run"]


def _kept_view(st, arena, constants) -> bool:
    """Whether the step makes a view that can be kept between runs (see compile_steps)."""
    return bool(st.kernel.alias and st.ins and st.ins[0] in arena
                and all(i < 0 or i in constants for i in st.ins[1:]))


def _releaser(pool):
    def release(env, s):
        v = env[s]
        env[s] = None
        if pool is not None and isinstance(v, np.ndarray):
            pool.release(v)
    return release
