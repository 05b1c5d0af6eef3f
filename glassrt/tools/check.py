"""`glassrt check`: validate operator contracts, built-in and custom.

Per op, five checks, each a row with a precise message on failure:
  meta_vs_real   the meta's output shapes and dtypes equal the kernel's real outputs
  dynamic_dims   with a symbolic batch, the meta keeps the symbol where the real size follows it
  dtype_coverage every declared dtype runs (built-ins: a table of schema dtypes vs kernels, info only)
  decomposition  a composite's fused kernel agrees with its decomposition
  backward       the backward matches central finite differences in float64; an op declared
                 differentiable without a backward is a failure
Built-in ops take their sample inputs from the ONNX node test cases that ship in the
`onnx` package; custom ops get generated ones (or their `register_example`).
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import dtypes, symbolic
from ..errors import GlassrtError, UnsupportedOperatorError
from ..ir import TensorType
from ..ops.backward import GradContext
from ..runtime.options import SessionOptions

PASS, FAIL, WARN, SKIP, INFO = "pass", "fail", "warn", "skip", "info"
CHECKS = ("meta_vs_real", "dynamic_dims", "dtype_coverage", "decomposition", "backward")


@dataclass
class Row:
    op: str
    check: str
    status: str
    message: str = ""


def load_module(spec: str) -> None:
    """Import a module by dotted name or file path (so its custom ops register)."""
    path = Path(spec)
    if path.suffix == ".py" and path.exists():
        mod_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[path.stem] = module
        mod_spec.loader.exec_module(module)
    else:
        importlib.import_module(spec)


def _fmt(t) -> str:
    if isinstance(t, TensorType):
        return f"{dtypes.name(t.dtype)}{symbolic.shape_str(t.shape)}"
    if isinstance(t, np.ndarray):
        return f"{dtypes.name(t.dtype)}{list(t.shape)}"
    return repr(t)


def _tol(dt):
    """(rtol, atol as a fraction of the largest magnitude): a few units in the last place."""
    dt = np.dtype(dt)
    if dt == np.float64:
        return 1e-9, 1e-12
    if dt == np.float32:
        return 1e-5, 1e-6
    return 2e-2, 1e-2  # float16, bfloat16 (8 significant bits), float8...


# ==================================================================== custom ops


def _generated(op, dt, batch=2):
    """(sample inputs, attributes) for a custom op: its example, or generated ones."""
    attrs = dict(op.schema.defaults)
    if op.example_fn is not None:
        ex = op.example_fn(np.dtype(dt))
        xs, extra = (ex if isinstance(ex, tuple) and len(ex) == 2 and isinstance(ex[1], dict) else (ex, {}))
        xs = [np.asarray(x) if x is not None else None for x in xs]
        attrs.update(extra)
        # The batch is the first dim of the first input that has one (a leading scalar, such
        # as QLinearConcat's output scale, has none).
        first = next((x for x in xs if isinstance(x, np.ndarray) and x.ndim), None)
        if batch != 2 and first is not None:
            b0 = first.shape[0]  # only inputs that share that input's batch follow it
            xs = [np.concatenate([x] * (batch // 2 + 1), axis=0)[:max(batch * b0 // 2, 1)]
                  if isinstance(x, np.ndarray) and x.ndim and x.shape[0] == b0 else x for x in xs]
        return xs, attrs
    rng = np.random.default_rng(0)
    dt = np.dtype(dt)
    out = []
    for name, optional in op.schema.inputs:
        if optional:
            out.append(None)
        elif dt.kind == "f" or dt.kind == "V":
            out.append(rng.standard_normal((batch, 3, 4)).astype(dt))
        elif dt.kind in "iu":
            out.append(rng.integers(1, 5, (batch, 3, 4)).astype(dt))
        elif dt.kind == "b":
            out.append(rng.random((batch, 3, 4)) > 0.5)
        else:
            out.append(np.full((batch, 3, 4), "a", dtype=object))
    return out, attrs


def _call(fn, inputs, attrs):
    res = fn(*inputs, **attrs)
    return list(res) if isinstance(res, (tuple, list)) else [res]


def check_custom(op) -> list[Row]:
    name = f"{op.domain}::{op.name}"
    rows = []
    from ..ops.custom_schema import REQUIRED

    required = [a for a, (_, d) in op.schema.attributes.items() if d is REQUIRED]
    if required and op.example_fn is None:
        return [Row(name, c, SKIP, f"attributes {required} have no default; register_example to check") for c in CHECKS]
    dts = [np.dtype(d) for d in (op.dtypes or [np.float32])]
    attrs = _generated(op, dts[0])[1]

    # meta_vs_real and dtype_coverage, per kernel and declared dtype
    problems, coverage, compared = [], [], 0
    if op.meta_fn is None:
        rows.append(Row(name, "meta_vs_real", FAIL, "no meta registered (register_meta): shapes cannot be planned"))
    for dt in dts:
        ran = False
        for provider, fn in op.kernels.items():
            xs, attrs = _generated(op, dt)
            try:
                real = _call(fn, xs, attrs)
                ran = True
            except Exception as e:  # noqa: BLE001
                coverage.append(f"declared dtype {dtypes.name(dt)}: kernel '{provider}' raised "
                                f"{type(e).__name__}: {e} (inputs {', '.join(_fmt(x) for x in xs if x is not None)})")
                continue
            if op.meta_fn is None:
                continue
            try:
                meta = _call(op.meta_fn, [TensorType(x.dtype, x.shape) if x is not None else None for x in xs], attrs)
            except Exception as e:  # noqa: BLE001
                problems.append(f"meta raised {type(e).__name__}: {e}")
                continue
            compared += 1
            if len(meta) != len(real):
                problems.append(f"meta gives {len(meta)} outputs, kernel '{provider}' returns {len(real)}")
                continue
            for k, (m, r) in enumerate(zip(meta, real)):
                r = np.asarray(r)
                if m is None or tuple(m.shape) != r.shape or np.dtype(m.dtype) != r.dtype:
                    problems.append(f"output {k}: meta says {_fmt(m)}, kernel '{provider}' returned {_fmt(r)} "
                                    f"for inputs {', '.join(_fmt(x) for x in xs if x is not None)}")
        if not ran and not op.kernels:
            coverage.append(f"declared dtype {dtypes.name(dt)}: no kernel registered")
    if op.meta_fn is not None:
        if not problems and not compared:
            rows.append(Row(name, "meta_vs_real", SKIP, "no kernel ran on the sample inputs (see dtype_coverage; "
                                                        "register_example gives inputs that suit the op)"))
        else:
            rows.append(Row(name, "meta_vs_real", FAIL if problems else PASS, "; ".join(dict.fromkeys(problems))))
    rows.append(Row(name, "dtype_coverage", FAIL if coverage else PASS,
                    "; ".join(coverage) or f"{', '.join(dtypes.name(d) for d in dts)} run"))
    if problems:  # the symbolic check only means something once concrete shapes are right
        rows.append(Row(name, "dynamic_dims", SKIP, "skipped: meta_vs_real fails"))
    else:
        rows.append(_custom_dynamic(op, name, attrs, dts[0]))
    rows.append(_custom_decomposition(op, name, attrs, dts))
    rows.append(_custom_backward(op, name, attrs))
    return rows


def _custom_dynamic(op, name, attrs, dt):
    if op.meta_fn is None or not op.kernels:
        return Row(name, "dynamic_dims", SKIP, "needs a meta and a kernel")
    fn = next(iter(op.kernels.values()))
    batch = symbolic.symbol("batch")
    try:
        (xs2, attrs), (xs3, _) = _generated(op, dt, 2), _generated(op, dt, 3)
        r2, r3 = _call(fn, xs2, attrs), _call(fn, xs3, attrs)
        sym_in = [TensorType(x.dtype, (batch,) + tuple(x.shape[1:])) if isinstance(x, np.ndarray) and x.ndim else
                  (TensorType(x.dtype, x.shape) if x is not None else None) for x in xs2]
        meta = _call(op.meta_fn, sym_in, attrs)
    except Exception as e:  # noqa: BLE001
        return Row(name, "dynamic_dims", FAIL, f"with a symbolic batch: {type(e).__name__}: {e}")
    bad = []
    for k, (m, a, b) in enumerate(zip(meta, r2, r3)):
        a, b = np.asarray(a), np.asarray(b)
        if m is None or m.shape is None or len(m.shape) != a.ndim:
            bad.append(f"output {k}: meta gives {_fmt(m)} for a symbolic batch, the kernel returns rank {a.ndim}")
            continue
        for j, (md, da, db) in enumerate(zip(m.shape, a.shape, b.shape)):
            follows = da != db
            has_batch = "batch" in symbolic.free_names(md)
            if follows and not has_batch:
                bad.append(f"output {k} dim {j}: meta gives {md} for input batch 'batch', but the real size follows "
                           f"the batch ({da} at batch 2, {db} at batch 3)")
            elif not follows and has_batch:
                bad.append(f"output {k} dim {j}: meta gives {md}, but the real size stays {da} when the batch changes")
            elif not follows and isinstance(md, int) and md != da:
                bad.append(f"output {k} dim {j}: meta gives {md}, the kernel returns {da}")
    return Row(name, "dynamic_dims", FAIL if bad else PASS, "; ".join(bad))


def _custom_decomposition(op, name, attrs, dts):
    if op.decomposition_fn is None:
        return Row(name, "decomposition", SKIP, "no decomposition registered")
    if not op.kernels:
        return Row(name, "decomposition", SKIP, "no fused kernel to compare with")
    import onnx
    from onnx import helper

    from ..ops.custom_schema import GraphBuilder
    from ..session import Session as InferenceSession

    bad = []
    for dt in dts:
        xs, attrs = _generated(op, dt)
        names = [n for (n, _), x in zip(op.schema.inputs, xs)]
        names += [f"{names[-1]}_{k}" for k in range(1, len(xs) - len(names) + 1)]  # a variadic input's others
        node = type("N", (), {"name": "decomposition", "outputs": op.schema.outputs, "domain": op.domain,
                              "opset": 1, "op_type": op.name})()
        g = GraphBuilder(node, set(names))
        outs = op.decomposition_fn(g, *[n if x is not None else None for n, x in zip(names, xs)], **attrs)
        outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        vis = [helper.make_tensor_value_info(n, dtypes.elem_type(x.dtype), list(x.shape)) for n, x in zip(names, xs)
               if x is not None]
        model = helper.make_model(helper.make_graph(g.protos, "decomposition", vis,
                                                    [onnx.ValueInfoProto(name=o) for o in outs]),
                                  opset_imports=[helper.make_opsetid("", 21)])
        try:
            got = InferenceSession(model, providers=["cpu", "reference"], fallback="silent").run(
                None, {n: x for n, x in zip(names, xs) if x is not None})
        except GlassrtError as e:
            return Row(name, "decomposition", FAIL, f"the decomposition does not run: {e}")
        for provider, fn in op.kernels.items():
            fused = _call(fn, xs, attrs)
            rtol, atol = _tol(dt)
            for k, (a, b) in enumerate(zip(fused, got)):
                a, b = np.asarray(a), np.asarray(b)
                if a.shape != b.shape:
                    bad.append(f"output {k}: kernel '{provider}' gives shape {list(a.shape)}, decomposition {list(b.shape)}")
                    continue
                bf = b.astype(np.float64)  # np.abs of an int8 -128 would wrap
                scale = float(np.max(np.abs(bf))) or 1.0
                err = np.abs(a.astype(np.float64) - bf)
                if not np.all(err <= atol * scale + rtol * np.abs(bf)):
                    i = np.unravel_index(np.argmax(err), err.shape)
                    bad.append(f"output {k} ({dtypes.name(dt)}): kernel '{provider}' differs from the decomposition by "
                               f"up to {float(err.max()):.3g} (at {tuple(int(v) for v in i)}: {a[i]} vs {b[i]}; "
                               f"tolerance rtol={rtol}, atol={atol}·max|y|)")
    return Row(name, "decomposition", FAIL if bad else PASS, "; ".join(bad))


def _numeric_vjp(fn, xs, attrs, k_out, g, i, eps=1e-6):
    base = xs[i]
    out = np.zeros(base.shape)
    for idx in np.ndindex(base.shape):
        vals = []
        for d in (eps, -eps):
            x = base.copy()
            x[idx] += d
            vals.append(np.sum(np.asarray(_call(fn, [*xs[:i], x, *xs[i + 1:]], attrs)[k_out]) * g))
        out[idx] = (vals[0] - vals[1]) / (2 * eps)
    return out


def _custom_backward(op, name, attrs):
    if op.backward_fn is None:
        if op.differentiable:
            return Row(name, "backward", FAIL, "declared differentiable, but no backward is registered "
                                               "(register_backward)")
        return Row(name, "backward", SKIP, "not differentiable")
    if not op.kernels:
        return Row(name, "backward", SKIP, "no kernel to differentiate")
    fn = next(iter(op.kernels.values()))
    xs, attrs = _generated(op, np.float64)
    xs = [x.astype(np.float64) if isinstance(x, np.ndarray) and x.dtype.kind == "f" else x for x in xs]
    ys = _call(fn, xs, attrs)
    rng = np.random.default_rng(1)
    gys = [rng.standard_normal(np.shape(y)) for y in ys]
    node = type("N", (), {"name": name, "op_type": op.name, "domain": op.domain})()
    try:
        grads = op.backward_fn(GradContext(node, attrs, xs, ys, 1), *gys)
    except Exception as e:  # noqa: BLE001
        return Row(name, "backward", FAIL, f"backward raised {type(e).__name__}: {e}")
    bad = []
    for i, ((in_name, _), x) in enumerate(zip(op.schema.inputs, xs)):
        if x is None or x.dtype.kind != "f":
            continue
        g = grads[i] if i < len(grads) else None
        if g is None:
            bad.append(f"input '{in_name}': backward returns no gradient")
            continue
        numeric = sum(_numeric_vjp(fn, xs, attrs, k, gy, i) for k, gy in enumerate(gys))
        g = np.asarray(g, dtype=np.float64)
        if g.shape != numeric.shape:
            bad.append(f"input '{in_name}': gradient shape {list(g.shape)}, input shape {list(numeric.shape)}")
            continue
        err = np.abs(g - numeric)
        if not np.all(err <= 1e-6 + 1e-4 * np.abs(numeric)):
            j = np.unravel_index(np.argmax(err), err.shape)
            bad.append(f"input '{in_name}': backward differs from central differences by up to {float(err.max()):.3g} "
                       f"(at {tuple(int(v) for v in j)}: backward {g[j]:.6g}, numeric {numeric[j]:.6g})")
    return Row(name, "backward", FAIL if bad else PASS, "; ".join(bad))


# ==================================================================== built-in ops


def _samples_by_op(limit=3):
    from onnx import numpy_helper
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = sorted(collect_testcases(), key=lambda c: c.name)
    out = defaultdict(list)
    for c in cases:
        nodes = [n for n in c.model.graph.node]
        if len(nodes) != 1 or c.name.endswith("_expanded") or not c.data_sets:
            continue
        inputs, _ = c.data_sets[0]
        inputs = [numpy_helper.to_array(x) if hasattr(x, "SerializeToString") else x for x in inputs]
        if not all(isinstance(x, np.ndarray) for x in inputs):
            continue  # sequences and optionals: covered by the conformance suite
        key = (nodes[0].domain or "", nodes[0].op_type)
        if len(out[key]) < limit:
            out[key].append((c, inputs))
    return out


def _native_session(model, fusion=True):
    """A cpu-only session, its warnings kept out of the check's report. fusion=False: the
    fusion passes off (a decomposition must stay decomposed, not be fused back)."""
    from ..session import Session as InferenceSession

    options = SessionOptions()
    options.fusion = fusion
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return InferenceSession(model, options, providers=["cpu"], fallback="silent")


def _run(sess, inputs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sess.run(None, dict(zip([i.name for i in sess.get_inputs()], inputs)))


def _builtin_rows(key, samples, with_backward=True):
    from ..kernels.cpu import load_for
    from ..kernels.registry import kernels_for
    from ..ops.registry import get_contract

    domain, op = key
    name = f"{domain + '::' if domain else ''}{op}"
    rows = []
    meta_bad, dyn_bad, dyn_warn, ran = [], [], [], 0
    for case, inputs in samples:
        try:
            sess = _native_session(case.model)
            feeds = dict(zip([i.name for i in sess.get_inputs()], inputs))
            outs = _run(sess, inputs)
        except GlassrtError:
            continue
        ran += 1
        meta_bad += _builtin_meta_vs_real(case, sess, feeds, outs)
        d = _builtin_dynamic(case, sess, inputs, outs)
        if d:
            (dyn_bad if d[0] == FAIL else dyn_warn).append(f"{case.name}: {d[1]}")
    if not ran:
        return [Row(name, c, SKIP, "no sample runs natively") for c in ("meta_vs_real", "dynamic_dims")]
    rows.append(Row(name, "meta_vs_real", FAIL if meta_bad else PASS, "; ".join(meta_bad) or f"{ran} sample(s)"))
    rows.append(Row(name, "dynamic_dims", FAIL if dyn_bad else (WARN if dyn_warn else PASS), "; ".join(dyn_bad or dyn_warn)))
    contract = get_contract(domain, op, samples[0][0].model.opset_import[0].version if not domain else 1)
    if domain == "glassrt" and contract is not None:  # internal ops: their decomposition is their definition
        rows.append(_builtin_decomposition(name, key, samples))
        return rows
    load_for(domain, op)
    if contract is not None and contract.category == "composite" and kernels_for("cpu", domain, op):
        rows.append(_builtin_decomposition(name, key, samples))
    if with_backward and contract is not None and contract.backward is not None:
        rows.append(_builtin_backward(name, samples))
    return rows


def _builtin_meta_vs_real(case, sess, feeds, outs):
    """The meta, told every input's shape and value (so data-steered shapes are known),
    against the kernel's real outputs. A dim the meta leaves open is right only for ops
    whose output shape depends on input values (NonZero, Unique...)."""
    from ..ops.registry import get_contract
    from ..runtime.infer import infer
    from ..ir import type_of_value

    graph = sess.placement.graph
    types = {n: type_of_value(v) for n, v in feeds.items()}
    try:
        inf = infer(graph, types, outer_values=dict(feeds), strict=True)
    except GlassrtError as e:
        return [f"{case.name}: meta fails on the sample's inputs: {e}"]
    node = graph.nodes[0] if graph.nodes else None
    contract = get_contract(node.domain, node.op_type, node.opset) if node is not None else None
    data_dependent = contract is not None and contract.data_dependent
    bad = []
    for o, v in zip(sess.graph.output_names(), outs):
        t = inf.types.get(o)
        if not isinstance(v, np.ndarray) or not isinstance(t, TensorType):
            continue
        if t.dtype != v.dtype or (t.shape is not None and len(t.shape) != v.ndim):
            bad.append(f"{case.name}: output '{o}': meta says {_fmt(t)}, kernel returned {_fmt(v)}")
            continue
        if t.shape is None:
            if not data_dependent:
                bad.append(f"{case.name}: output '{o}': meta leaves the rank open, kernel returned {_fmt(v)}")
            continue
        for md, d in zip(t.shape, v.shape):
            if (isinstance(md, int) and md != d) or (not isinstance(md, int) and not data_dependent):
                bad.append(f"{case.name}: output '{o}': meta says {_fmt(t)}, kernel returned {_fmt(v)}")
                break
    return bad


def _builtin_dynamic(case, sess, inputs, outs):
    """Double input 0's batch (dim 0) and compare with the meta for a symbolic batch."""
    from ..runtime.infer import infer

    if not inputs:
        return None
    x = inputs[0]
    if not isinstance(x, np.ndarray) or x.ndim < 2 or x.dtype.kind not in "fiu" or x.shape[0] < 1:
        return None
    bigger = [np.concatenate([x, x], axis=0)] + list(inputs[1:])
    try:
        outs2 = _run(sess, bigger)
    except GlassrtError:
        return None  # doubling the batch is not valid for this op: nothing to say
    batch = symbolic.symbol("batch")
    types = {vi.name: TensorType(a.dtype, ((batch,) + tuple(a.shape[1:])) if k == 0 else tuple(a.shape))
             for k, (vi, a) in enumerate(zip(sess._inputs, inputs))}
    try:
        inf = infer(sess.placement.graph, types, strict=False)
    except GlassrtError as e:
        return FAIL, f"meta fails for a symbolic batch: {e}"
    for o, a, b in zip(sess.graph.output_names(), outs, outs2):
        if not isinstance(a, np.ndarray):
            continue
        t = inf.types.get(o)
        if not isinstance(t, TensorType) or t.shape is None:
            return WARN, f"output '{o}': rank unknown for a symbolic batch"
        for j, (md, da, db) in enumerate(zip(t.shape, a.shape, b.shape)):
            if da != db:
                if isinstance(md, int):
                    return FAIL, (f"output '{o}' dim {j}: meta gives {md} for a symbolic batch, but the real size "
                                  f"follows it ({da} → {db} when the batch doubles)")
                if "batch" not in symbolic.free_names(md):
                    return WARN, f"output '{o}' dim {j}: meta gives '{md}', losing the batch symbol"
    return None


def _builtin_decomposition(name, key, samples):
    from ..kernels import registry

    from ..runtime.folding import NONDETERMINISTIC

    domain, op = key
    if op in NONDETERMINISTIC:
        return Row(name, "decomposition", SKIP, "random: the two draw different numbers")
    bad, compared = [], 0
    for case, inputs in samples:
        try:
            fused = _run(_native_session(case.model), inputs)
            saved = list(registry.kernels_for("cpu", domain, op))  # loaded by now
            registry.unregister("cpu", domain, op)
            try:
                expanded = _run(_native_session(case.model, fusion=False), inputs)
            finally:
                for k in saved:
                    registry.register(k)
        except GlassrtError as e:
            if isinstance(e, UnsupportedOperatorError) and f"{op} node" in str(e):
                continue  # the function body cannot be built for these inputs: nothing to compare
            bad.append(f"{case.name}: {e}")
            continue
        for k, (a, b) in enumerate(zip(fused, expanded)):
            if not isinstance(a, np.ndarray):
                continue
            compared += 1
            rtol, atol = _tol(a.dtype) if a.dtype.kind in "fV" else (0, 0)
            finite = np.abs(b.astype(np.float64))[np.isfinite(b.astype(np.float64))] if b.size else np.zeros(0)
            scale = float(finite.max()) if finite.size else 1.0
            if a.shape != b.shape or not np.allclose(a.astype(np.float64), b.astype(np.float64),
                                                     rtol=max(rtol, 1e-4), atol=max(atol, 1e-5) * max(scale, 1.0),
                                                     equal_nan=True):
                bad.append(f"{case.name}: output {k}: fused kernel and decomposition disagree "
                           f"(max |diff| {float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.shape == b.shape else 'shape'})")
    if not compared and not bad:
        return Row(name, "decomposition", SKIP, "no sample to compare")
    return Row(name, "decomposition", FAIL if bad else PASS, "; ".join(bad) or f"{compared} output(s) agree")


def _builtin_backward(name, samples):
    from onnx import defs

    from .gradcheck import gradcheck

    bad, done = [], 0
    rng = np.random.default_rng(0)
    for case, inputs in samples[:2]:
        model = _as_float64(case.model)
        if model is None:
            continue
        node = case.model.graph.node[0]
        schema = defs.get_schema(node.op_type, case.model.opset_import[0].version, node.domain)
        D = defs.OpSchema.DifferentiationCategory.Differentiable
        xs = []
        for x in inputs:
            if x.dtype.kind == "f":
                # Off the kinks (relu at 0, ties in max): a tiny random nudge.
                x = x.astype(np.float64) * (1 + 1e-3 * rng.standard_normal(x.shape)) + 1e-4 * rng.standard_normal(x.shape)
            xs.append(x)
        try:
            sess = _native_session(model)
            names = [i.name for i in sess.get_inputs()]
            diff = []
            for k, (n, x) in enumerate(zip(names, xs)):
                formal = schema.inputs[min(k, len(schema.inputs) - 1)] if schema.inputs else None
                if x.dtype == np.float64 and (formal is None or formal.differentiation_category == D):
                    diff.append(n)
            out_name = sess.get_outputs()[0].name
            if not diff:
                continue
            ok, worst, msg = gradcheck(sess, dict(zip(names, xs)), out_name, diff, max_elems=16)
            done += 1
            if not ok:
                bad.append(f"{case.name}: {msg} (worst relative error {worst:.3g})")
        except GlassrtError as e:
            if "no backward" in str(e) or "does not cover" in str(e) or "not covered" in str(e):
                continue
            bad.append(f"{case.name}: {e}")
    if not done and not bad:
        return Row(name, "backward", SKIP, "no float64 sample")
    return Row(name, "backward", FAIL if bad else PASS, "; ".join(bad) or f"{done} sample(s) match central differences")


def _as_float64(model):
    """The sample model computing in float64 (None if it has no float input)."""
    from onnx import TensorProto

    from .gradcheck import model_to_float64

    if not any(vi.type.tensor_type.elem_type in (TensorProto.FLOAT, TensorProto.FLOAT16) for vi in model.graph.input):
        return None
    return model_to_float64(model)


def coverage_table():
    """Per built-in op with a cpu kernel: dtypes the schema allows vs dtypes kernels cover."""
    from onnx import defs

    from ..kernels.cpu import load_all
    from ..kernels.registry import all_kernels

    load_all()
    by_op = defaultdict(set)
    for k in all_kernels("cpu"):
        by_op[(k.domain, k.op_type)] |= set(k.dtypes) if k.dtypes is not None else {"any"}
    rows = []
    for (domain, op), covered in sorted(by_op.items()):
        try:
            schema = defs.get_schema(op, domain=domain)
        except defs.SchemaError:
            continue
        allowed = set()
        if schema.type_constraints and schema.inputs:
            first = schema.inputs[0].type_str
            for tc in schema.type_constraints:
                if tc.type_param_str == first:
                    allowed = {s[len("tensor("):-1] for s in tc.allowed_type_strs if s.startswith("tensor(")}
        names = {"any"} if "any" in covered else {dtypes.name(d) for d in covered}
        missing = sorted(allowed - names) if "any" not in names else []
        rows.append(Row(f"{domain + '::' if domain else ''}{op}", "dtype_coverage", INFO,
                        ("schema dtypes without a cpu kernel: " + ", ".join(missing)) if missing else "all schema dtypes"))
    return rows


# ==================================================================== driver


def run_checks(op_filter=None, *, builtins=True, progress=None) -> list[Row]:
    # The samples are edge cases on purpose (ONNX's node tests feed NaN, inf and values
    # outside an op's domain), so NumPy's "invalid value" warnings say nothing here and
    # would only bury the table. errstate is scoped to this call: user code keeps its warnings.
    from ..ops.registry import load_backward

    load_backward()  # (the formulas the backward rows check are imported when first needed)
    with np.errstate(all="ignore"):
        return _run_checks(op_filter, builtins, progress)


def _run_checks(op_filter, builtins, progress) -> list[Row]:
    from ..kernels.custom import OPS

    rows = []
    for op in list(OPS.values()):
        if op_filter and op_filter not in (op.name, f"{op.domain}::{op.name}"):
            continue
        try:
            rows += check_custom(op)
        except Exception as e:  # noqa: BLE001
            rows.append(Row(f"{op.domain}::{op.name}", "meta_vs_real", FAIL, f"checking raised {type(e).__name__}: {e}"))
    if builtins:
        samples = {**_samples_by_op(), **_internal_samples()}
        keys = [k for k in sorted(samples) if not op_filter or op_filter in (k[1], f"{k[0]}::{k[1]}")]
        for i, key in enumerate(keys):
            try:
                rows += _builtin_rows(key, samples[key])
            except Exception as e:  # noqa: BLE001 — a crash in one op's checks is that op's failure
                rows.append(Row(f"{key[0] + '::' if key[0] else ''}{key[1]}", "meta_vs_real", FAIL,
                                f"checking raised {type(e).__name__}: {e}"))
            if progress:
                progress(i + 1, len(keys))
        rows += [r for r in coverage_table() if not op_filter or r.op.split("::")[-1] == op_filter]
        rows += _differentiable_without_backward(op_filter)
    return rows


def _internal_samples():
    """Samples for the ops glassrt's own passes create (no ONNX node test covers them)."""
    from types import SimpleNamespace

    from onnx import helper

    from .gradcheck import single_node_model

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 9, 9)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    samples = []
    for act, params in (("Relu", []), ("LeakyRelu", [0.1]), ("LeakyRelu", [2.5]), ("Clip", [0.0, 6.0]),
                        ("Sigmoid", []), ("Swish", []), ("HardSwish", [1 / 6, 0.5]), ("HardSwish", [0.2, 0.25]),
                        ("HardSigmoid", [0.2, 0.5])):
        attrs = {"activation": act, "pads": [1, 1, 1, 1], "strides": [2, 1]}
        if params:
            attrs["activation_params"] = params
        m = single_node_model("FusedConv", [x, w, b], attrs, domain="glassrt", opset=21)
        m.graph.output[0].CopyFrom(helper.make_tensor_value_info("out0", 1, None))
        samples.append((SimpleNamespace(name=f"fused_conv_{act.lower()}{params}", model=m), [x, w, b]))
    z = rng.standard_normal((2, 4, 5, 9)).astype(np.float32)  # the residual (ResNet's skip connection)
    for act, (kernel, pads) in (("", ((3, 3), [1, 1, 1, 1])), ("Relu", ((3, 3), [1, 1, 1, 1])),
                                ("Relu", ((1, 1), [0, 0, 0, 0])), ("LeakyRelu", ((1, 1), [0, 0, 0, 0]))):
        wk = w if kernel == (3, 3) else w[:, :, :1, :1].copy()
        attrs = {"activation": act, "pads": pads, "strides": [2, 1]}
        if act == "LeakyRelu":
            attrs["activation_params"] = [0.1]
        m = single_node_model("FusedConv", [x, wk, b, z], attrs, domain="glassrt", opset=21)
        m.graph.output[0].CopyFrom(helper.make_tensor_value_info("out0", 1, None))
        samples.append((SimpleNamespace(name=f"fused_conv_residual_{act.lower() or 'none'}_{kernel[0]}x{kernel[1]}",
                                        model=m), [x, wk, b, z]))
    # quantized in the epilogue (a QDQ CNN's layer: passes/fuse_conv_qdq.py), uint8 and int8
    for act, res, zp in (("", False, np.array(128, np.uint8)), ("Relu", True, np.array(3, np.uint8)),
                         ("Clip", False, np.array(-5, np.int8))):
        attrs = {"activation": act, "pads": [1, 1, 1, 1], "strides": [2, 1]}
        if act == "Clip":
            attrs["activation_params"] = [0.0, 6.0]
        inputs = [x, w, b, z if res else None, np.array(0.05, np.float32), zp]
        m = single_node_model("FusedConv", inputs, attrs, domain="glassrt", opset=21)
        m.graph.output[0].CopyFrom(helper.make_tensor_value_info("out0", 1, None))
        samples.append((SimpleNamespace(name=f"fused_conv_quantized_{act.lower() or 'none'}_{zp.dtype}"
                                        f"{'_residual' if res else ''}", model=m), [i for i in inputs if i is not None]))
    bn_samples = []
    stats = [rng.uniform(0.5, 1.5, 3).astype(np.float32), rng.standard_normal(3).astype(np.float32),
             rng.standard_normal(3).astype(np.float32), rng.uniform(0.5, 1.5, 3).astype(np.float32)]
    for act, params in (("Relu", []), ("Clip", [-0.5, 0.5]), ("LeakyRelu", [0.2]), ("Sigmoid", []), ("Swish", []),
                        ("HardSwish", [1 / 6, 0.5])):
        attrs = {"activation": act, "epsilon": 1e-3}
        if params:
            attrs["activation_params"] = params
        m = single_node_model("FusedBatchNormalization", [x] + stats, attrs, domain="glassrt", opset=21)
        m.graph.output[0].CopyFrom(helper.make_tensor_value_info("out0", 1, None))
        bn_samples.append((SimpleNamespace(name=f"fused_batch_norm_{act.lower()}", model=m), [x] + stats))
    mm_samples = []
    a = rng.standard_normal((2, 5, 8)).astype(np.float32)
    wm = rng.standard_normal((8, 6)).astype(np.float32)
    bias, z = rng.standard_normal(6).astype(np.float32), rng.standard_normal((2, 1, 6)).astype(np.float32)
    for act, params, alpha, ins in (("", [], 1.0, [a, wm, bias]), ("Gelu", [], 1.0, [a, wm, bias]),
                                    ("GeluTanh", [], 1.0, [a, wm, bias]),
                                    ("", [], 0.125, [a, wm, bias, z]),
                                    ("Relu", [], 1.0, [a, wm, bias, z]), ("Tanh", [], 2.0, [a, wm]),
                                    ("Clip", [-0.5, 0.5], 1.0, [a, wm, bias]), ("LeakyRelu", [0.1], 1.0, [a, wm]),
                                    ("Sigmoid", [], 1.0, [a, wm, bias])):
        attrs = {"activation": act, "alpha": alpha}
        if params:
            attrs["activation_params"] = params
        m = single_node_model("FusedMatMul", ins, attrs, domain="glassrt", opset=21)
        m.graph.output[0].CopyFrom(helper.make_tensor_value_info("out0", 1, None))
        mm_samples.append((SimpleNamespace(name=f"fused_matmul_{act.lower() or 'none'}_{len(ins)}in_a{alpha}",
                                           model=m), ins))
    # read and written through perms (passes/fold_transposes.py: attention's head transposes)
    a4, b4 = rng.standard_normal((2, 5, 3, 4)).astype(np.float32), rng.standard_normal((2, 6, 3, 4)).astype(np.float32)
    z4 = rng.standard_normal((2, 1, 1, 6)).astype(np.float32)
    for name, attrs, ins in (
            ("heads", {"alpha": 0.5, "perm_a": [0, 2, 1, 3], "perm_b": [0, 2, 3, 1], "perm_y": [0, 2, 1, 3]},
             [a4, b4, None, z4]),
            ("b_only", {"activation": "Relu", "perm_b": [0, 2, 3, 1]}, [np.ascontiguousarray(a4.transpose(0, 2, 1, 3)), b4])):
        m = single_node_model("FusedMatMul", ins, attrs, domain="glassrt", opset=21)
        m.graph.output[0].CopyFrom(helper.make_tensor_value_info("out0", 1, None))
        mm_samples.append((SimpleNamespace(name=f"fused_matmul_perms_{name}", model=m), [x for x in ins if x is not None]))
    shuffle_samples = []
    for shape, g in (((2, 12, 3, 5), 3), ((1, 8, 4, 4), 2), ((2, 6, 7), 6)):
        xs = rng.standard_normal(shape).astype(np.float32)
        m = single_node_model("ChannelShuffle", [xs], {"group": g}, domain="glassrt", opset=21)
        m.graph.output[0].CopyFrom(helper.make_tensor_value_info("out0", 1, None))
        shuffle_samples.append((SimpleNamespace(name=f"channel_shuffle_{'x'.join(map(str, shape))}_g{g}", model=m),
                                [xs]))
    sdpa_samples = []
    for rows, keys, dt, extra in ((1, 7, np.float32, "keep"), (3, 5, np.float32, "mask"), (1, 6, np.float64, "both"),
                                  (12, 9, np.float32, "keep"), (2, 4, np.float32, "")):  # 12 rows: the BLAS path
        q, k, v = (rng.standard_normal(shape).astype(dt) for shape in ((2, 3, rows, 4), (2, 3, keys, 4), (2, 3, keys, 5)))
        keep = rng.random((1, 1, rows, keys)) < 0.7
        keep[..., 0] = True  # every row keeps a key (an all-filled row is a uniform softmax either way)
        mask = rng.standard_normal((2, 1, 1, keys)).astype(dt)
        ins = [q, k, v, keep if extra in ("keep", "both") else None, mask if extra in ("mask", "both") else None]
        m = single_node_model("ScaledDotProductAttention", ins, {"scale": 0.5, "fill": -1e9}, domain="glassrt", opset=21)
        m.graph.output[0].CopyFrom(helper.make_tensor_value_info("out0", 1 if dt == np.float32 else 11, None))
        ins = [x for x in ins if x is not None]
        sdpa_samples.append((SimpleNamespace(name=f"sdpa_{rows}x{keys}_{np.dtype(dt).name}_{extra or 'plain'}",
                                             model=m), ins))
    qdq_samples = []
    xq = np.concatenate([rng.standard_normal(60).astype(np.float32) * 5,
                         np.array([np.nan, np.inf, -np.inf, 2.5, -2.5, 0.0], np.float32)]).reshape(6, 11)
    for zp in (np.uint8(128), np.int8(-7), None):
        ins = [xq, np.array(0.04, np.float32)] + ([np.array(zp)] if zp is not None else [])
        m = single_node_model("QuantizeDequantize", ins, {}, domain="glassrt", opset=21)
        m.graph.output[0].CopyFrom(helper.make_tensor_value_info("out0", 1, None))
        qdq_samples.append((SimpleNamespace(name=f"quantize_dequantize_{np.dtype(type(zp)).name if zp is not None else 'no_zp'}",
                                            model=m), ins))
    lut_samples = []
    for x_dt, t_dt in ((np.uint8, np.uint8), (np.int8, np.int8), (np.int8, np.float32)):
        codes = np.arange(256, dtype=np.uint8).view(x_dt)
        ins = [rng.permutation(np.tile(codes, 2)).reshape(2, 8, 32), rng.permutation(codes).astype(t_dt)]
        m = single_node_model("LookupTable", ins, {}, domain="glassrt", opset=21)
        m.graph.output[0].CopyFrom(helper.make_tensor_value_info("out0", helper.np_dtype_to_tensor_dtype(
            np.dtype(t_dt)), None))
        lut_samples.append((SimpleNamespace(name=f"lookup_table_{np.dtype(x_dt).name}_{np.dtype(t_dt).name}",
                                            model=m), ins))
    cif_samples = []
    for x_dt, w_dt, per_channel, bias, attrs in (
            (np.uint8, np.int8, False, "float", {"pads": [1, 1, 1, 1]}),
            (np.uint8, np.int8, True, "", {"strides": [2, 2], "group": 2}),
            (np.int8, np.int8, True, "float", {"pads": [0, 1, 0, 1], "dilations": [2, 1]}),
            (np.uint8, np.uint8, False, "sums", {"pads": [1, 1, 1, 1]})):  # (older quantize_dynamic's)
        info, w_info = np.iinfo(x_dt), np.iinfo(w_dt)
        x = rng.integers(info.min, info.max + 1, (1, 4, 7, 9)).astype(x_dt)
        w = rng.integers(w_info.min, w_info.max + 1, (6, 4 // attrs.get("group", 1), 3, 3)).astype(w_dt)
        scale = rng.uniform(1e-4, 1e-2, (6, 1, 1) if per_channel else ()).astype(np.float32)
        ins = [x, w, np.array(3, x_dt), np.array(121 if w_dt == np.uint8 else 0, w_dt), scale]
        if bias == "float":
            ins.append(rng.standard_normal((6, 1, 1)).astype(np.float32))
        elif bias == "sums":
            ins += [None, rng.integers(-5000, 5000, (6, 1, 1)).astype(np.int32)]
        m = single_node_model("ConvIntegerToFloat", ins, attrs, domain="glassrt", opset=21)
        m.graph.output[0].CopyFrom(helper.make_tensor_value_info("out0", 1, None))
        cif_samples.append((SimpleNamespace(name=f"conv_integer_to_float_{np.dtype(x_dt).name}_{np.dtype(w_dt).name}_"
                                                 f"{'per_channel' if per_channel else 'per_tensor'}"
                                                 f"{'_' + bias + '_bias' if bias else ''}", model=m),
                            [v for v in ins if v is not None]))
    # QLinearConv reading / writing float32 codes minus the zero point (two 8-bit convs in a row)
    centered_samples = []
    for dt, xz, yz in ((np.uint8, 100, 7), (np.int8, -5, 3)):
        codes = rng.integers(np.iinfo(dt).min, np.iinfo(dt).max + 1, (1, 4, 7, 7))
        wq = rng.integers(-63, 64, (6, 4, 3, 3)).astype(np.int8)
        consts = [np.array(0.05, np.float32), np.array(xz, dt), wq, rng.uniform(0.002, 0.01, 6).astype(np.float32),
                  np.zeros(6, np.int8), np.array(0.1, np.float32), np.array(yz, dt),
                  rng.integers(-300, 300, 6).astype(np.int32)]
        for x_centered, y_centered in ((1, 0), (0, 1), (1, 1)):
            xq = (codes - xz).astype(np.float32) if x_centered else codes.astype(dt)
            attrs = {"x_centered": x_centered, "y_centered": y_centered, "pads": [1, 1, 1, 1]}
            inputs = [xq, *consts]
            m = single_node_model("CenteredQLinearConv", inputs, attrs, domain="glassrt", opset=21)
            m.graph.output[0].CopyFrom(helper.make_tensor_value_info("out0", 1 if y_centered else
                                                                     (2 if dt == np.uint8 else 3), None))
            centered_samples.append((SimpleNamespace(
                name=f"centered_qlinear_conv_{np.dtype(dt)}_x{x_centered}_y{y_centered}", model=m), inputs))
    return {("glassrt", "FusedConv"): samples, ("glassrt", "FusedBatchNormalization"): bn_samples,
            ("glassrt", "FusedMatMul"): mm_samples, ("glassrt", "ChannelShuffle"): shuffle_samples,
            ("glassrt", "ScaledDotProductAttention"): sdpa_samples, ("glassrt", "QuantizeDequantize"): qdq_samples,
            ("glassrt", "LookupTable"): lut_samples, ("glassrt", "ConvIntegerToFloat"): cif_samples,
            ("glassrt", "CenteredQLinearConv"): centered_samples}


def _differentiable_without_backward(op_filter):
    """Built-in ops the ONNX schema calls differentiable that have no backward in glassrt
    (information: the schema describes the math; glassrt's backward set is what it claims)."""
    from onnx import defs

    from ..ops.registry import get_contract

    missing = []
    for s in defs.get_all_schemas():
        if s.domain != "" or s.deprecated or (op_filter and s.name != op_filter):
            continue
        c = get_contract("", s.name, s.since_version)
        if c is not None and c.differentiable and c.backward is None:
            missing.append(s.name)
    if not missing:
        return []
    return [Row("(built-ins)", "backward", INFO, f"{len(missing)} ops are differentiable per their ONNX schema and have "
                                                  f"no glassrt backward: {', '.join(sorted(missing))}")]


def summarize(rows) -> dict:
    out = defaultdict(lambda: defaultdict(int))
    for r in rows:
        out[r.check][r.status] += 1
    return {k: dict(v) for k, v in out.items()}
