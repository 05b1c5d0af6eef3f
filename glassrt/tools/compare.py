"""Where two providers first disagree, and which node first produced a NaN or an Inf.

Both questions need every intermediate value, so the model runs once through a plan
that keeps them all (no arena reuse); values are then walked in execution order.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

import numpy as np

from ..runtime.plan import compile_plan, run_plan
from ..ir import type_of_value


def all_values(sess, feeds: dict, keep_nan: bool = False) -> tuple[dict, list]:
    """({value name: value} after one run, the executed steps in order). keep_nan: on
    kernels that keep NaN and Inf (nan_handling="exact"): a NaN made inside the model and
    turned into 0 by a fused relu would otherwise never be seen."""
    checked = sess._check_feeds(feeds)
    types = {n: type_of_value(v) for n, v in checked.items()}
    # Both tools look at every value themselves (finding the NaN is `nan`'s point), so
    # NumPy's RuntimeWarnings would repeat them, with kernel file paths, as noise. Scoped to
    # this plan and run (folding included): a user's own sess.run still warns.
    with np.errstate(all="ignore"):
        options = replace(sess.options, check_outputs=True, **({"nan_handling": "exact"} if keep_nan else {}))
        plan = compile_plan(sess.placement, types, options,
                            sess.runner.make_runner, retain=True)
        _, env = run_plan(plan, checked, keep_env=True)
    return env, plan.steps


@dataclass
class Disagreement:
    node: str
    op: str
    value: str
    kernel_a: str
    kernel_b: str
    max_abs: float
    max_rel: float
    where: tuple
    a: float
    b: float

    def __str__(self):
        return (f"{self.op} node '{self.node}' output '{self.value}': {self.kernel_a} and {self.kernel_b} differ by up "
                f"to {self.max_abs:.3g} (relative {self.max_rel:.3g}) at {self.where}: {self.a!r} vs {self.b!r}")


# Defaults for float32 models compared end to end, value by value. Two correct float32
# kernels differ by summation order (BLAS blocking, oneDNN's Winograd, fused epilogues):
# about sqrt(K) * 6e-8 relative for a K-term dot product, and more after tens of layers,
# so 1e-5..1e-4 absolute on O(1) activations is rounding, not a bug. onnxruntime's own
# tests draw the same line: its graph-optimizer tests compare a whole graph's outputs at
# 1e-4 absolute and 1e-4 relative, its onnx_test_runner compares model outputs at 1e-3 and
# 1e-3. rtol=1e-3 with atol=1e-4 sits between them: a kernel that is off by a real amount
# (1e-3 or more) is still caught, and values near zero are judged by atol.
RTOL = 1e-3
ATOL = 1e-4


def verdict(found, compared: int, rtol: float, atol: float) -> str:
    """The line `glassrt compare` prints, with the tolerances in effect (a verdict means
    nothing without them)."""
    tol = f"rtol={rtol:g}, atol={atol:g}"
    if found is None:
        return f"agree: {compared} values compared ({tol})"
    return f"first disagreement (after {compared} values compared, {tol}): {found}"


def first_disagreement(model, feeds: dict, providers_a, providers_b, rtol=RTOL, atol=ATOL, sess_options=None):
    """(the first value, in execution order, on which the two provider lists disagree, or
    None; the number of values compared)."""
    from ..session import Session as InferenceSession

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sa = InferenceSession(model, providers=providers_a, fallback="warn", sess_options=sess_options)
        sb = InferenceSession(model, providers=providers_b, fallback="warn", sess_options=sess_options)
    va, steps = all_values(sa, feeds)
    vb, steps_b = all_values(sb, feeds)
    kernel_b = {o: st.kernel.name for st in steps_b for o in st.node.outputs if o}
    compared = 0
    for st in steps:
        for o in st.node.outputs:
            if not o or o not in vb or not isinstance(va.get(o), np.ndarray) or not isinstance(vb[o], np.ndarray):
                continue
            compared += 1
            diff = value_difference(va[o], vb[o], rtol, atol)
            if diff is not None:
                return Disagreement(st.node.name, st.node.op_type, o, st.kernel.name, kernel_b.get(o, "?"),
                                    *diff), compared
    return None, compared


def value_difference(a: np.ndarray, b: np.ndarray, rtol=RTOL, atol=ATOL):
    """None where a and b agree (|a - b| <= atol + rtol * |b|, NaN meets NaN, integers and
    booleans exactly); else (max abs, max rel, index of the first bad element, a there, b there).
    A shape or dtype that differs is an infinite difference, its values the two types."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return float("inf"), float("inf"), (), f"{a.dtype}{list(a.shape)}", f"{b.dtype}{list(b.shape)}"
    if a.dtype.kind not in "fc" or a.size == 0:
        if np.array_equal(a, b):
            return None
        i = tuple(int(v) for v in np.argwhere(a != b)[0]) if a.shape else ()
        return 1.0, 1.0, i, a[i].item() if a.shape else a.item(), b[i].item() if b.shape else b.item()
    x, y = a.astype(np.float64), b.astype(np.float64)
    diff = np.abs(x - y)
    same = (x == y) | (np.isnan(x) & np.isnan(y))  # equal infinities and NaN meet NaN agree
    with np.errstate(invalid="ignore"):
        bad = ~same & ~(diff <= atol + rtol * np.abs(y))
    if not bad.any():
        return None
    i = tuple(int(v) for v in np.argwhere(bad)[0])
    rel = float(np.nanmax(np.where(bad, diff / np.maximum(np.abs(y), 1e-30), 0)))
    return float(np.nanmax(np.where(bad, diff, 0))), rel, i, float(x[i]), float(y[i])


@dataclass
class Anomaly:
    node: str
    op: str
    value: str
    kind: str  # "NaN" or "Inf"
    count: int
    size: int
    inputs_finite: bool  # False: it came in through an input (propagated), True: produced here

    def __str__(self):
        how = "produced here (every input was finite)" if self.inputs_finite else "carried in by a non-finite input"
        return f"{self.op} node '{self.node}' output '{self.value}': {self.count} of {self.size} values are {self.kind}, {how}"


def first_anomaly(sess, feeds: dict) -> Anomaly | None:
    """The first node, in execution order, whose output holds a NaN or an Inf."""
    env, steps = all_values(sess, feeds, keep_nan=True)

    def finite(v):
        return not isinstance(v, np.ndarray) or v.dtype.kind not in "fc" or bool(np.isfinite(v).all())

    for st in steps:
        for o in st.node.outputs:
            v = env.get(o) if o else None
            if isinstance(v, np.ndarray) and v.dtype.kind in "fc" and not finite(v):
                nan = int(np.isnan(v).sum())
                kind = "NaN" if nan else "Inf"
                count = nan or int(np.isinf(v).sum())
                ins_ok = all(finite(env.get(i)) for i in st.node.inputs if i)
                return Anomaly(st.node.name, st.node.op_type, o, kind, count, int(v.size), ins_ok)
    return None
