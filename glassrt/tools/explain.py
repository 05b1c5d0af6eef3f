"""`glassrt explain`: every decision for a model, without running it.

Per node: provider, kernel and why, output shapes (symbolic where dims are not bound),
and for each output its arena offset, size and lifetime. Summary: nodes per provider,
fallbacks with reasons, FLOPs, and the memory plan's naive / arena / lower-bound bytes.
The JSON form (`--json`) holds the same data; see README "explain JSON".
"""
from __future__ import annotations

import sys

from .. import dtypes, pages, symbolic, weights
from ..errors import GlassrtError
from ..ir import OptionalType, SequenceType, TensorType
from ..ops.flops import node_flops
from ..ops.registry import get_contract
from ..runtime.placement import batch_symbols


def _type_json(name, t, dims):
    if isinstance(t, TensorType):
        shape = None if t.shape is None else [_dim(d, dims) for d in t.shape]
        return {"name": name, "dtype": dtypes.name(t.dtype), "shape": shape}
    if isinstance(t, (SequenceType, OptionalType)):
        return {"name": name, "dtype": str(t), "shape": None}
    return {"name": name, "dtype": None, "shape": None}


def _dim(d, dims):
    d = symbolic.evaluate(d, dims) if dims and not isinstance(d, int) else d
    return d if isinstance(d, int) else str(d)


def bound_input_types(sess, dims: dict):
    """The session's input types with --dim values substituted (may stay symbolic)."""
    out = {}
    for vi in sess._inputs:
        t = vi.type
        if isinstance(t, TensorType) and t.shape is not None:
            shape = []
            for d in t.shape:
                if isinstance(d, int):
                    shape.append(d)
                    continue
                v = symbolic.evaluate(d, dims)
                if not isinstance(v, int) and all(n.startswith("unk__") for n in symbolic.free_names(v)):
                    v = 1  # a dim nobody named: the smallest real case
                shape.append(v)
            t = TensorType(t.dtype, tuple(shape))
        out[vi.name] = t
    return out


def _made_up(sess, dims) -> bool:
    """Whether bound_input_types took a dim nobody named as 1."""
    return any(not isinstance(d, int) and not isinstance(symbolic.evaluate(d, dims), int)
               for vi in sess._inputs if isinstance(vi.type, TensorType) and vi.type.shape is not None
               for d in vi.type.shape)


def _types_str(types) -> str:
    return ", ".join(f"{n}: {list(t.shape)}" for n, t in types.items() if isinstance(t, TensorType) and t.shape is not None)


def _as_placed(node, d, types, values=None, batch=frozenset()):
    """(output types, FLOPs, provider, kernel, reason) of a node as placement decided it, the
    kernel the one a plan binds (_plan_kernel; values None: the first candidate, for a
    caller that has the plan's own choice)."""
    contract = get_contract(node.domain, node.op_type, node.opset)
    attrs = contract.attrs_with_defaults(node) if contract else node.attrs
    in_t = [types.get(i) if i else None for i in node.inputs]
    out_t = [types.get(o) if o else None for o in node.outputs]
    flops = node_flops(node, attrs, in_t, out_t)
    if d.provider is None:
        return out_t, flops, None, None, f"no provider can run it: {d.reason}"
    reason = "fallback: " + d.skipped() if d.fallback else d.reason + (f" [{d.skipped()}]" if d.rejected else "")
    provider, kernel = d.provider, d.kernels[0].name if d.kernels else None
    if d.kernels and contract is not None and values is not None:
        picked = _plan_kernel(node, contract, d, types, values, batch or frozenset())
        if picked is not None:
            provider, kernel, moved = picked
            if moved:
                reason = f"{reason} [a plan at batch 1 runs it on {provider}: {moved}]"
    return out_t, flops, provider, kernel, reason


def _plan_kernel(node, contract, d, types, values, batch):
    """(provider, kernel name, why it moved or "") a plan binds: the first candidate, best
    first, whose checks pass on these types, symbolic dims bound as placement binds them to
    judge a kernel (the batch symbols at 1, the others at STAND_IN_DIM): what a plan at
    batch 1 binds. (The candidates are all kernels that pass the shape-free checks: the
    first can be one the shapes refuse, a 1x1 convolution's kernel for a 3x3 convolution.)
    Where none passes there, a plan moves the node to the next providers' choice (a partial
    provider's refusal, GPT-2's small Transposes); None where that has none either."""
    from ..runtime.placement import node_context
    from ..runtime.select import STAND_IN_DIM, stand_in, is_static, kernel_reason

    ctx = node_context(node, contract, types, values)
    judged = ctx if is_static(ctx) else stand_in(ctx, STAND_IN_DIM, batch)
    why = []
    for k in d.kernels:
        r = kernel_reason(k, judged)
        if r is None:
            return d.provider, k.name, ""
        why.append(r)
    alt = d.alternative
    if alt is None or not alt.kernels:
        return None
    k = next((k for k in alt.kernels if kernel_reason(k, judged) is None), None)
    return (alt.provider, k.name, "; ".join(dict.fromkeys(why))) if k is not None else None


def _body_rows(bodies: dict, parent: str, depth: int, dims: dict, outer_types: dict) -> list:
    """Rows for the nodes of an If/Loop/Scan's bodies (`parent`'s), as placed: provider,
    kernel, reason, output types and FLOPs per run of the body (a Loop runs it per
    iteration, so they are not added to the model's total). Bodies are planned when they
    run, so they have no arena offsets here; their output bytes are the types'."""
    rows = []
    for attr, subs in bodies.items():
        for k, sub in enumerate(subs if isinstance(subs, list) else [subs]):
            types = {**outer_types, **sub.inference.types}  # a body reads the enclosing graph's values
            for node in sub.graph.nodes:
                d = sub.decisions[node.name]
                out_t, flops, provider, kernel, reason = _as_placed(node, d, types, sub.inference.values)
                rows.append({
                    "name": node.name, "op": node.op_type, "domain": node.domain, "opset": node.opset,
                    "provider": provider, "kernel": kernel, "reason": reason, "fallback": d.fallback,
                    "unsupported": d.provider is None, "origin": node.origin or None, "step": None,
                    "parent": parent, "body": attr + (f"[{k}]" if isinstance(subs, list) else ""), "depth": depth,
                    "outputs": [_type_json(o, t, dims) for o, t in zip(node.outputs, out_t) if o],
                    "output_bytes": sum(t.nbytes() for t in out_t if isinstance(t, TensorType) and t.is_static),
                    "flops_per_body_run": _dim(flops, dims) if flops is not None else None, "flops": None,
                })
                rows += _body_rows(sub.subgraphs.get(node.name) or {}, node.name, depth + 1, dims, types)
    return rows


def explain(sess, dims: dict | None = None) -> dict:
    dims = dims or {}
    types = bound_input_types(sess, dims)
    placement = sess.placement
    static = all(isinstance(t, TensorType) and t.is_static for t in types.values())
    # a node no provider runs (session made with unsupported="mark"): explain all but the plan
    plan, plan_error = None, None
    if static and not placement.unsupported:
        try:
            plan = sess.runner.plan_for_types(types)
        except GlassrtError as e:
            # dims nobody named are taken as 1, which a model may refuse (a VAD's frame of
            # one sample): the decisions are still shown, the plan says why it is missing
            if not _made_up(sess, dims):
                raise
            plan_error = f"no plan for the inputs {_types_str(types)} (dims without a name taken as 1): {e}"
    inferred = plan.types if plan else placement.inference.types
    # without a plan, each node's kernel is judged as placement judges one (_plan_kernel)
    judge = (None, None) if plan else (placement.inference.values, batch_symbols(placement.graph))

    selection = {s.node: s for s in plan.selections} if plan else {}
    folded_in_plan = set(plan.folded) if plan else set()
    step_of = {st.node.name: k for k, st in enumerate(plan.steps)} if plan else {}
    drops_nan = dict(plan.drops_nan) if plan else {}
    nodes, total_flops = [], 0
    for node in placement.graph.nodes:
        d = placement.decisions[node.name]
        out_t, flops, provider, kernel, reason = _as_placed(node, d, inferred, *judge)
        if flops is not None and node.name not in folded_in_plan:
            total_flops = total_flops + flops
        if node.name in selection:  # the plan's choice: a later provider where these shapes need it
            provider, kernel, reason = selection[node.name].provider, selection[node.name].kernel, \
                selection[node.name].reason
        elif node.name in folded_in_plan:
            kernel, reason = "folded", "all inputs known when the plan was built: evaluated once, at plan time"
        nodes.append({
            "name": node.name, "op": node.op_type, "domain": node.domain, "opset": node.opset,
            "provider": provider, "kernel": kernel, "reason": reason, "fallback": d.fallback,
            "unsupported": d.provider is None,
            "origin": node.origin or None, "step": step_of.get(node.name),
            "outputs": [_type_json(o, t, dims) for o, t in zip(node.outputs, out_t) if o],
            "flops": _dim(flops, dims) if flops is not None else None,
            "drops_nan": drops_nan.get(node.name),  # why its kernel loses a NaN or an Inf (nan_handling)
        })
        nodes += _body_rows(placement.subgraphs.get(node.name) or {}, node.name, 1, dims, inferred)

    values, summary_mem = [], {}
    if plan:
        outside = {"count": 0, "bytes": 0, "unsized": 0}
        for pv in plan.memory.values.values():
            nbytes = pv.bytes
            if pv.offset is None and pv.kind in ("dynamic", "output"):
                # Not in the arena: the kernel allocates it per run (or it goes to the caller).
                t = plan.types.get(pv.name)
                nbytes = nbytes or (t.nbytes() if isinstance(t, TensorType) and t.is_static else None)
                outside["count"] += 1
                if isinstance(nbytes, int):
                    outside["bytes"] += nbytes
                else:
                    outside["unsized"] += 1
            values.append({"name": pv.name, "bytes": nbytes, "offset": pv.offset, "first_step": pv.first_step,
                           "last_step": pv.last_step, "kind": pv.kind, "shares_with": pv.shares_with,
                           "layout": plan.layouts.get(pv.name, "nchw") if placement.layouts else None})
        m = plan.memory
        summary_mem = {"naive_bytes": m.naive_bytes, "arena_bytes": m.arena_bytes,
                       "lower_bound_bytes": m.lower_bound_bytes, "arena_over_lower_bound": round(m.ratio, 4),
                       "values_outside_arena": outside["count"], "outside_arena_bytes": outside["bytes"],
                       "outside_arena_unsized": outside["unsized"]}
    else:
        summary_mem = {"naive_bytes": None, "arena_bytes": None, "lower_bound_bytes": None,
                       "arena_over_lower_bound": None,
                       "unbound_dims": sorted({n for t in types.values() if isinstance(t, TensorType) and t.shape
                                               for d in t.shape for n in symbolic.free_names(d)})}
    # (shapes: "" for placement's, the plan's inputs for one found when a plan was made)
    fallbacks = [{"node": f.node, "op": f.op, "provider": f.provider, "reason": f.reason, "shapes": f.shapes}
                 for f in sess.fallbacks]
    summary = {
        "nodes": sum(1 for n in nodes if not n.get("depth")), "body_nodes": sum(1 for n in nodes if n.get("depth")),
        "nodes_per_provider": placement.counts(), "fallback_count": len(fallbacks),
        "fallbacks": fallbacks, "folded_at_load": len(sess.folded), "folded_in_plan": len(folded_in_plan),
        "unsupported": [{"node": n.name, "op": n.op_type, "domain": n.domain, "reason": why}
                        for n, why in placement.unsupported],
        "expansions": [{"node": n, "op": op, "into_nodes": k, "because": why} for n, op, k, why in sess.expansions],
        "transfers": len(placement.transfers),
        "transfer_list": [{"value": t.value, "from": t.src, "to": t.dst, "consumer": t.consumer, "node": t.node,
                           "bytes": _dim(t.bytes, dims) if t.bytes is not None else None}
                          for t in placement.transfers],
        "notes": list(sess.notes),
        # the plan's layouts when there is one: a plan that moved a node to another provider keeps all NCHW
        "layouts": {"nhwc_values": len(plan.layouts if plan else placement.layouts),
                    "edges": [{"value": e.value, "node": e.node, "kind": e.kind} for e in placement.layout_edges]
                    if not plan or plan.layouts else []},
        "threads": plan.threads.to_json() if plan and plan.threads is not None else None,
        # kernels of the plan that lose a NaN or an Inf, and what a run fed one does (runtime/nan_handling.py)
        "nan_handling": {"policy": sess.options.nan_handling, "nodes_losing_nan": len(drops_nan),
                         "exact_plans": len(exact.plans) if (exact := vars(sess.runner).get("_nan_runner")) else 0,
                         "runs_with_nan": vars(sess.runner).get("nan_runs", 0)},
        "flops": _dim(total_flops, dims) if total_flops != 0 else 0,
        # weight bytes mapped from their file / copied into memory / computed from weights (weights.py)
        "weights": weights.account(placement.graph, getattr(sess, "_loaded_weights", None)),
        # large buffers (packed weights, arenas) of this process, those on huge pages from their
        # first touch, and what moved onto huge pages once a plan kept running (pages.py)
        "pages": {"transparent_huge_pages": pages.thp_mode(), "advice": pages.advice_enabled(),
                  "policy": pages.policy(),
                  "buffers": pages.stats.buffers, "mapped_bytes": pages.stats.mapped_bytes,
                  "huge_from_start_bytes": pages.stats.huge_from_start_bytes,
                  "advised_bytes": pages.stats.advised_bytes, "collapsed_bytes": pages.stats.collapsed_bytes,
                  "promote_ms": round(pages.stats.promote_seconds * 1e3, 1),
                  # plan arenas faulted in on another thread before their first run wrote them
                  "populated_bytes": pages.stats.populated_bytes,
                  "pending_bytes": pages.pending_bytes()},
        # one-row products (decode steps) streamed by row_panels' loop in this process, and why others were not
        "row_products": _row_products(),
        "row_norms": _row_norms(),
        **summary_mem,
        "plan_error": plan_error,
    }
    return {
        "inputs": [_type_json(n, t, dims) for n, t in types.items()],
        "dims": dims, "passes": [r.to_json() for r in sess.passes], "nodes": nodes, "values": values,
        "summary": summary,
    }


def _row_products() -> dict:
    rp = sys.modules.get("glassrt.kernels.onednn.row_panels")  # (not loaded: no oneDNN product ran)
    stats = dict(rp.stats) if rp is not None else {}
    return {"streamed": stats.pop("streamed", 0), "not_streamed": stats,
            "after_runs": rp.AFTER_RUNS if rp is not None else None}


def _row_norms() -> dict:
    """The onednn provider's one-row LayerNormalizations that moved to the cpu row loop."""
    rows = sys.modules.get("glassrt.kernels.onednn.rows")
    stats = dict(rows.stats) if rows is not None else {}
    return {"row_loop": stats.pop("row loop", 0), "not_moved": stats}


def fmt_bytes(n) -> str:
    if n is None:
        return "-"
    if not isinstance(n, (int, float)):
        return str(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def fmt_flops(f) -> str:
    if not isinstance(f, (int, float)):
        return str(f)
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if f >= scale:
            return f"{f / scale:.2f} {unit}FLOP"
    return f"{f} FLOP"


MIN_REASON_WIDTH = 24  # narrower, a reason column is a few words a line: list reasons below instead


def _top_level_index(nodes) -> list:
    """Each row's number among the graph's own nodes (None for a node of a body)."""
    out, k = [], 0
    for n in nodes:
        out.append(None if n.get("depth") else k)
        k += 0 if n.get("depth") else 1
    return out


def render(report: dict, console, max_reason: int = 70) -> None:
    """Names, shapes and reasons are data, not markup: "[batch,seq,64]" must print as is.

    Node names are never cut or folded (they are what a user greps for); columns no plan
    fills are left out, the reason column takes the width that is left, and below
    MIN_REASON_WIDTH (a pipe is 80 columns) the reasons follow the table one per line, whole."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    values = {v["name"]: v for v in report["values"]}
    rows = []  # (cells without the reason, reason, style)
    index = _top_level_index(report["nodes"])
    for n, i in zip(report["nodes"], index):
        outs = n["outputs"] or [{"name": "", "shape": None, "dtype": None}]
        for j, o in enumerate(outs):
            v = values.get(o["name"], {})
            shape = "?" if o["shape"] is None else "[" + ",".join(map(str, o["shape"])) + "]"
            life = f"{v['first_step']}..{v['last_step']}" if v else ""
            offset = "" if not v else (str(v["offset"]) if v["offset"] is not None else v["kind"])
            style = "red" if n.get("unsupported") else "yellow" if n["fallback"] else None
            first = j == 0
            kernel = n["kernel"] or ("none" if n.get("unsupported") else f"{n['provider']}.{n['op']}")
            depth = n.get("depth", 0)
            name = ("  " * depth + f"└ {n['body']}: " if depth else "") + n["name"]  # a body node under its parent
            nbytes = fmt_bytes(v.get("bytes")) if v else (fmt_bytes(n["output_bytes"]) if depth and first else "")
            cells = [(str(i) if i is not None else "") if first else "", escape(name) if first else "",
                     escape(kernel) if first else "", escape(f"{(o['dtype'] or '')}{shape}"),
                     offset or ("per body run" if depth and first else ""), nbytes, life]
            rows.append((cells, (n["reason"] or "") if first else "", style))

    columns = ["#", "node", "kernel", "outputs", "offset", "bytes", "life"]
    keep = [k for k, col in enumerate(columns) if col in ("#", "node", "kernel") or any(c[k] for c, _, _ in rows)]

    def node_table(compact: bool, reason_width: int | None = None):
        # compact (narrow consoles): no vertical rules and one space between columns
        title = "nodes (kernel = provider.op.algorithm" + (
            "; dims not bound: the kernels a plan at batch 1 binds, --dim for another plan's)"
            if report["summary"].get("unbound_dims") else ")")
        table = Table(title=title, title_justify="left",
                      **({"box": box.SIMPLE_HEAD, "pad_edge": False, "collapse_padding": True} if compact else {}))
        for k in keep:
            table.add_column(columns[k], no_wrap=columns[k] == "node", overflow="fold")
        if reason_width:
            table.add_column("reason", width=reason_width, overflow="fold")
        for cells, reason, style in rows:
            cut = reason if len(reason) <= max_reason else reason[: max_reason - 1] + "…"
            table.add_row(*(cells[k] for k in keep), *([escape(cut)] if reason_width else []), style=style)
        return table

    longest = max(6, min(max((len(r) for _, r, _ in rows), default=0), max_reason))
    natural = {compact: console.measure(node_table(compact), options=console.options.update_width(100_000)).maximum
               for compact in (False, True)}
    for compact in (False, True):
        free = console.width - natural[compact] - 3  # the reason column's rule and padding
        if free >= min(MIN_REASON_WIDTH, longest):
            console.print(node_table(compact, min(free, longest)))
            break
    else:  # a pipe's 80 columns: the names stay whole, the reasons follow whole
        console.print(node_table(compact=natural[False] > console.width))
        console.print("why each node runs where it does (the table is too narrow for them):", highlight=False,
                      markup=False)
        for n, i in zip(report["nodes"], index):
            where = f"{i}" if i is not None else f"  in {n['parent']}.{n['body']}:"
            console.print(f"  {where} {n['name']}: {n['reason']}", highlight=False, markup=False,
                          style="red" if n.get("unsupported") else "yellow" if n["fallback"] else None)
    passes = Table(title="graph passes, in order", title_justify="left")
    for col in ("pass", "level", "nodes", "ms", "changed"):
        passes.add_column(col, overflow="fold")
    for p in report["passes"]:
        changed = "; ".join(p["changes"][:3]) + (f" (+{len(p['changes']) - 3} more)" if len(p["changes"]) > 3 else "")
        passes.add_row(p["name"], p["level"], f"{p['nodes_before']} → {p['nodes_after']}", f"{p['ms']:.1f}",
                       escape(changed or (f"not run: {p['skipped']}" if p.get("skipped") else "nothing")))
    console.print(passes)
    s = report["summary"]
    per_provider = ", ".join(f"{p}={c}" for p, c in s["nodes_per_provider"].items())
    console.print(f"nodes: {s['nodes']}  per provider: {per_provider}  folded: {s['folded_at_load']} at load, "
                  f"{s['folded_in_plan']} in the plan", highlight=False, markup=False)
    if s["expansions"]:
        console.print(f"expanded composites: {len(s['expansions'])} (" + ", ".join(
            f"{e['op']} '{e['node']}' → {e['into_nodes']} nodes" for e in s["expansions"][:5]) + ")", highlight=False,
                      markup=False)
    for u in s["unsupported"]:
        console.print(f"unsupported: {u['op']} node '{u['node']}': no provider can run it ({u['reason']}); the "
                      "model cannot run until one can", style="red", highlight=False, markup=False)
    console.print(f"fallbacks: {s['fallback_count']}", style="yellow" if s["fallback_count"] else None)
    for f in s["fallbacks"]:
        shapes = f" for {f['shapes']}" if f["shapes"] else ""
        console.print(f"  {f['op']} '{f['node']}' → {f['provider']}{shapes}: {f['reason']}", highlight=False,
                      markup=False)
    console.print(f"FLOPs: {fmt_flops(s['flops'])}   transfers: {s['transfers']}", highlight=False, markup=False)
    for t in s["transfer_list"]:
        console.print(f"  '{t['value']}' {t['from']} → {t['to']} ({fmt_bytes(t['bytes'])}) for "
                      f"{t['consumer'] or 'the caller'}", highlight=False, markup=False)
    if s["layouts"]["nhwc_values"]:
        console.print(f"layouts: {s['layouts']['nhwc_values']} value(s) in NHWC between kernels that take it; "
                      f"{len(s['layouts']['edges'])} edge(s) where a region meets NCHW values (the kernel there "
                      "reorders)", highlight=False, markup=False)
    n = s["nan_handling"]
    if n["nodes_losing_nan"] or n["policy"] != "auto":
        then = {"auto": "runs fed a NaN or an Inf run on a plan of kernels that keep them "
                        f"({n['runs_with_nan']} so far, on {n['exact_plans']} such plan(s))",
                "exact": "kept only where no kernel keeps NaN", "fast": "inputs unchecked: NaN and Inf may be lost"}
        console.print(f"NaN/Inf: {n['nodes_losing_nan']} node(s) on a kernel that loses them (nan_handling="
                      f"{n['policy']}: {then[n['policy']]})", highlight=False, markup=False)
    for note in s["notes"]:
        console.print(f"note: {note}", style="yellow", highlight=False, markup=False)
    w = s["weights"]
    console.print(f"weights: {fmt_bytes(w['mapped_bytes'])} mapped from the file ({w['mapped_tensors']} tensors), "
                  f"{fmt_bytes(w['copied_bytes'])} copied into memory, {fmt_bytes(w['transformed_bytes'])} "
                  "transformed (folded by passes; reordered by oneDNN, which happens on a plan's first run)", highlight=False, markup=False)
    p = s["pages"]
    console.print(f"large buffers (this process): {p['buffers']} of {fmt_bytes(p['mapped_bytes'])}; on huge pages "
                  f"from their first touch: {fmt_bytes(p['huge_from_start_bytes'])}; moved onto huge "
                  f"pages once a plan kept running: {fmt_bytes(p['advised_bytes'])} ({fmt_bytes(p['collapsed_bytes'])} "
                  f"collapsed at once, {p['promote_ms']} ms), {fmt_bytes(p['pending_bytes'])} still on small pages; "
                  f"plan arenas faulted in ahead of their first run: {fmt_bytes(p['populated_bytes'])} "
                  f"(transparent huge pages: {p['transparent_huge_pages']}, GLASSRT_HUGE_PAGES policy "
                  f"{p['policy']}" + ("" if p["advice"] else ", advice off")
                  + ")", highlight=False, markup=False)
    r = s["row_products"]
    if r["streamed"] or r["not_streamed"]:
        console.print(f"one-row products (this process): {r['streamed']} streamed over their packed weights "
                      f"(row_panels, once a plan has run {r['after_runs']} times)" + "".join(
                          f"; {n} not: {why}" for why, n in r["not_streamed"].items()), highlight=False, markup=False)
    r = s["row_norms"]
    if r["row_loop"] or r["not_moved"]:
        console.print(f"one-row layer norms (this process): {r['row_loop']} on the cpu row loop (once a plan has "
                      f"run {s['row_products']['after_runs']} times)" + "".join(
                          f"; {n} {why}" for why, n in r["not_moved"].items()), highlight=False, markup=False)
    if s["unsupported"]:
        console.print("memory: no plan (a node no provider runs)", highlight=False, markup=False)
    elif s.get("plan_error"):
        console.print(f"memory: {s['plan_error']}", highlight=False, markup=False)
    elif s["arena_bytes"] is not None:
        console.print(f"memory: naive {fmt_bytes(s['naive_bytes'])}, arena {fmt_bytes(s['arena_bytes'])}, "
                      f"lower bound {fmt_bytes(s['lower_bound_bytes'])} (arena / lower bound = "
                      f"{s['arena_over_lower_bound']:.3f}); outside the arena: {s['values_outside_arena']} value(s), "
                      f"{fmt_bytes(s['outside_arena_bytes'])}" + (f" + {s['outside_arena_unsized']} sized at run time"
                                                                  if s["outside_arena_unsized"] else ""),
                      highlight=False)
    else:
        console.print("memory: bind " + ", ".join(f"--dim {d}=N" for d in s["unbound_dims"]) +
                      " to plan the arena", highlight=False, markup=False)
