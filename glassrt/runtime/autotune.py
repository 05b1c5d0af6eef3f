"""Autotuning: time every eligible kernel for a node's concrete shapes, keep the fastest.

Like `torch.backends.cudnn.benchmark`: done on the first plan for a shape, cached per
(op, attributes, input shapes and dtypes) in memory and, optionally, in a JSON file so
the next process starts with the winners.
"""
from __future__ import annotations

import json
import os
import time

import numpy as np

from ..ir import TensorType

_MEMORY: dict[str, dict] = {}
_LOADED_FILES: set[str] = set()


def key_of(ctx) -> str:
    node = ctx.node
    shapes = [(str(t.dtype), list(t.shape)) if isinstance(t, TensorType) else None for t in ctx.input_types]
    attrs = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in sorted(ctx.attrs.items())
             if not hasattr(v, "nodes")}
    return json.dumps([node.domain, node.op_type, ctx.since_version, attrs, shapes], default=str, sort_keys=True)


def _load(path):
    if path and path not in _LOADED_FILES and os.path.exists(path):
        try:
            _MEMORY.update(json.loads(open(path).read()))
        except (OSError, ValueError):
            pass  # a broken cache file only costs a re-tune
        _LOADED_FILES.add(path)


def _save(path):
    if path:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(_MEMORY, f, indent=1)
        os.replace(tmp, path)


def _synthetic_inputs(ctx):
    rng = np.random.default_rng(0)
    args = []
    for i, t in enumerate(ctx.input_types):
        c = ctx.const(i)
        if c is not None or not ctx.has(i):
            args.append(c)
        elif isinstance(t, TensorType) and t.is_static:
            if t.dtype.kind == "f":
                args.append(rng.standard_normal(t.shape).astype(t.dtype))
            else:
                args.append(np.zeros(t.shape, t.dtype))
        else:
            return None
    return args


def choose(candidates, ctx, bind, options):
    """(winner, reason) among `candidates` (kernels eligible for ctx), or None if it can't time them."""
    _load(options.autotune_cache)
    key = key_of(ctx)
    by_name = {k.name: k for k in candidates}
    known = _MEMORY.get(key)
    if known and known["winner"] in by_name:
        return by_name[known["winner"]], f"autotuned (cached): {_times(known['ms'])}"
    args = _synthetic_inputs(ctx)
    if args is None:
        return None
    timings = {}
    for k in candidates:
        try:
            fn = bind(k)
            out_shapes = [t for t in ctx.output_types]
            best = float("inf")
            for _ in range(3):
                out = None
                if k.out:
                    bufs = [np.empty(t.shape, t.dtype) if isinstance(t, TensorType) and t.is_static else None
                            for t in out_shapes]
                    out = tuple(bufs) if k.multi else bufs[0]
                t0 = time.perf_counter()
                fn(*args, out=out) if k.out else fn(*args)
                best = min(best, time.perf_counter() - t0)
            timings[k.name] = best * 1e3
        except Exception:  # noqa: BLE001 — a kernel that fails here simply does not win
            continue
    if not timings:
        return None
    winner = min(timings, key=timings.get)
    _MEMORY[key] = {"winner": winner, "ms": timings}
    _save(options.autotune_cache)
    return by_name[winner], f"autotuned: {_times(timings)}"


def _times(ms: dict) -> str:
    return ", ".join(f"{n} {t:.3f} ms" for n, t in sorted(ms.items(), key=lambda x: x[1]))
