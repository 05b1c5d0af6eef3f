"""The `glassrt` command line: run, explain, profile, check."""
from __future__ import annotations

import statistics
import sys
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import click
import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import dtypes
from .errors import GlassrtError
from .runtime.providers import DEFAULT as _DEFAULT
from .tools import inputs as made_up
from .tools.compare import ATOL, RTOL

DEFAULT_PROVIDERS = ",".join(_DEFAULT)

console = Console()


def _parse_pairs(items, what):
    out = {}
    for item in items:
        if "=" not in item:
            raise click.BadParameter(f"expected NAME=VALUE, got {item!r}", param_hint=what)
        k, v = item.split("=", 1)
        out[k] = v
    return out


def _parse_dims(items) -> dict[str, int]:
    dims = {}
    for k, v in _parse_pairs(items, "--dim").items():
        try:
            dims[k] = int(v)
        except ValueError:
            raise click.BadParameter(f"dim {k} must be an integer, got {v!r}", param_hint="--dim") from None
    return dims


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="glassrt")
def main():
    """glassrt — an ONNX inference runtime that shows every decision it makes."""


@contextmanager
def _progress(description: str, total: int | None = None, counted: bool = False):
    """A transient progress bar while a long step runs, on a terminal only: piped output
    (a log, a test, `| grep`) gets nothing, not even the blank line a non-terminal rich
    Live leaves. Yields update(completed, total=None); `counted` shows "done/total"."""
    if not console.is_terminal:
        yield lambda completed, total=None: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn()]
    columns += [MofNCompleteColumn()] if counted else []
    with Progress(*columns, TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda completed, total=None: bar.update(task, completed=completed, **({"total": total} if total else {}))


def _creating(source):
    """Session creation of a big model (loading, passes, placement) takes seconds: say so."""
    return _progress(f"creating the session for {Path(str(source)).name}")


def _options(threads, nan_handling="auto"):
    from . import SessionOptions

    return SessionOptions(intra_op_num_threads=threads, nan_handling=nan_handling)


threads_option = click.option("--threads", default=0, show_default=True,
                              help="intra_op_num_threads (0: every CPU this process may use).")


def _session(source, providers, fallback="warn", threads=0, unsupported="error"):
    """A session whose fallback warnings are left to the report (explain/profile show them)."""
    from . import InferenceSession

    with warnings.catch_warnings(), _creating(source):
        warnings.simplefilter("ignore")
        return InferenceSession(source, providers=providers.split(","), fallback=fallback,
                                sess_options=_options(threads), unsupported=unsupported)


def _model_arg(model):
    """(model source, name of the embedded default or None)."""
    if model:
        return model, None
    from .tools import light_models

    return str(light_models.path(light_models.DEFAULT)), light_models.DEFAULT


@main.command()
@click.argument("model", required=False)
@click.option("--input", "inputs", multiple=True, metavar="NAME=FILE.npy", help="Feed an input from a .npy file.")
@click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE", help="Bind a symbolic dim for generated inputs.")
@click.option("--providers", default=DEFAULT_PROVIDERS, show_default=True, help="Provider priority list.")
@click.option("--strict", is_flag=True, help="Fail if any node would fall back (fallback='error').")
@click.option("--save", type=click.Path(file_okay=False), help="Write each output to DIR/NAME.npy.")
@click.option("--runs", default=5, show_default=True, help="Timed runs after the first (latency is their median).")
@click.option("--detect-anomaly", is_flag=True,
              help="Name the first node that produced a NaN or an Inf instead: `glassrt nan` (PyTorch's name).")
@click.option("--nan-handling", type=click.Choice(["auto", "exact", "fast"]), default="auto", show_default=True,
              help="SessionOptions.nan_handling: auto (inputs holding a NaN or an Inf run on kernels that keep "
                   "them), exact (always those kernels), fast (never checked).")
@threads_option
def run(model, inputs, dims, providers, strict, save, runs, threads, detect_anomaly, nan_handling):
    """Run MODEL (default: the embedded light_resnet50 from the onnx package) and report."""
    from . import InferenceSession
    from .session import FallbackWarning

    if detect_anomaly:
        ctx = click.get_current_context()
        given = [f"--{p.replace('_', '-')}" for p in ("strict", "save", "runs", "threads", "nan_handling")
                 if ctx.get_parameter_source(p) == click.core.ParameterSource.COMMANDLINE]
        if given:
            raise click.UsageError(f"--detect-anomaly runs `glassrt nan`, which has no {', '.join(given)}")
        return ctx.invoke(nan, model=model, inputs=inputs, dims=dims, providers=providers)
    source, default_name = _model_arg(model)
    try:
        with warnings.catch_warnings(), _creating(source):
            warnings.simplefilter("always", FallbackWarning)
            t0 = time.perf_counter()
            sess = InferenceSession(source, providers=providers.split(","), fallback="error" if strict else "warn",
                                    sess_options=_options(threads, nan_handling))
            created = time.perf_counter() - t0
        feeds = _load_inputs(sess, inputs, _parse_dims(dims), default_name)
        t0 = time.perf_counter()
        outputs = sess.run(None, feeds)
        first = time.perf_counter() - t0
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            sess.run(None, feeds)
            times.append(time.perf_counter() - t0)
    except GlassrtError as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", markup=True, highlight=False)
        sys.exit(1)

    console.print(f"[bold]{escape(Path(source).name)}[/]  created in {created * 1e3:.0f} ms", highlight=False)
    table = Table(title="outputs", title_justify="left")
    for col in ("name", "shape", "dtype", "values"):
        table.add_column(col)
    for arg, value in zip(sess.get_outputs(), outputs):
        if isinstance(value, np.ndarray):
            flat = value.reshape(-1)[:5]
            table.add_row(escape(arg.name), escape(str(list(value.shape))), dtypes.name(value.dtype),
                          np.array2string(flat, precision=4, separator=", ") + (" ..." if value.size > 5 else ""))
        else:
            table.add_row(escape(arg.name), "-", type(value).__name__, escape(repr(value)[:60]))
    console.print(table)
    lat = statistics.median(times) if times else first
    console.print(f"latency: first run {first * 1e3:.1f} ms (plan built; on a fresh install also Numba's one-time "
                  f"compile, cached on disk), then median {lat * 1e3:.2f} ms over {len(times)} runs "
                  f"({sess.options.intra_op_num_threads or 'all'} thread(s) requested)")
    counts = sess.placement.counts()
    console.print("nodes per provider: " + ", ".join(f"{p}={n}" for p, n in counts.items())
                  + f"  (graph passes rewrote {len(sess.pass_log)} place(s); {len(sess.folded)} node(s) folded)",
                  highlight=False)
    if sess.runner.nan_runs:
        console.print(f"NaN/Inf in the inputs: the runs took the plan of kernels that keep them "
                      f"(nan_handling={nan_handling}; `glassrt nan` names the first node that made one)",
                      highlight=False)
    plan = sess.runner.plans.get(sess.runner.signature(sess._check_feeds(feeds), None))
    if plan is not None:
        from .tools.explain import fmt_bytes

        m = plan.memory
        console.print(f"memory: arena {fmt_bytes(m.arena_bytes)} (lower bound {fmt_bytes(m.lower_bound_bytes)}, "
                      f"every intermediate in its own buffer: {fmt_bytes(m.naive_bytes)})", highlight=False)
    if sess.fallbacks:
        console.print(f"[yellow]fallbacks: {len(sess.fallbacks)}[/]")
        for f in sess.fallbacks:
            console.print(f"  {escape(str(f))}", highlight=False)
    else:
        console.print("fallbacks: 0")
    if default_name:
        from .tools import light_models

        expected = light_models.expected_output(default_name)
        diff = float(np.max(np.abs(outputs[0].astype(np.float64) - expected)))
        ok = np.allclose(outputs[0], expected, rtol=1e-3, atol=1e-7)
        console.print(f"expected output (shipped with onnx): max |diff| = {diff:.3g} -> "
                      + ("[green]match[/]" if ok else "[red]MISMATCH[/]"))
        if not ok:
            sys.exit(1)
    if save:
        Path(save).mkdir(parents=True, exist_ok=True)
        for arg, value in zip(sess.get_outputs(), outputs):
            if isinstance(value, np.ndarray):
                np.save(Path(save) / f"{arg.name.replace('/', '_')}.npy", value)
        console.print(f"saved outputs to {save}/")


@main.command()
@click.argument("model", required=False)
@click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE", help="Bind a symbolic dim (e.g. batch=64).")
@click.option("--providers", default=DEFAULT_PROVIDERS, show_default=True)
@click.option("--json", "json_file", type=click.Path(dir_okay=False), help="Also write the report as JSON.")
@click.option("--width", default=70, show_default=True,
              help="Cut reasons in the table to this many characters (the --json report has them whole).")
def explain(model, dims, providers, json_file, width):
    """Show every decision for MODEL without running it: placement, kernels, memory plan."""
    import json

    from .tools.explain import explain as build_report
    from .tools.explain import render

    source, _ = _model_arg(model)
    try:
        # a node no provider runs is explained with its reason, the rest as usual
        sess = _session(source, providers, unsupported="mark")
        dims = _parse_dims(dims)
        made_up.check_dims(sess, dims)
        report = build_report(sess, dims)
    except GlassrtError as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        sys.exit(1)
    render(report, console, width)
    if json_file:
        Path(json_file).write_text(json.dumps(report, indent=1, default=str))
        console.print(f"wrote {json_file}")


@main.command()
@click.argument("model", required=False)
@click.option("--runs", default=10, show_default=True)
@click.option("--trace", type=click.Path(dir_okay=False), help="Write a Chrome trace (chrome://tracing, Perfetto).")
@click.option("--top", default=15, show_default=True, help="Rows in each table.")
@click.option("--html", "html_file", type=click.Path(dir_okay=False),
              help="Also write one self-contained HTML page: time per op, node timeline, arena picture, explain.")
@click.option("--input", "inputs", multiple=True, metavar="NAME=FILE.npy")
@click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE")
@click.option("--providers", default=DEFAULT_PROVIDERS, show_default=True)
@threads_option
def profile(model, runs, trace, top, html_file, inputs, dims, providers, threads):
    """Run MODEL several times and show where the time goes, per op type and per node."""
    from .tools.profile import profile_session, render

    source, default_name = _model_arg(model)
    try:
        sess = _session(source, providers, threads=threads)
        feeds = _load_inputs(sess, inputs, _parse_dims(dims), default_name)
        with _progress("profiling (the first, untimed run builds the plan)", total=runs, counted=True) as update:
            prof = profile_session(sess, feeds, runs, warmup=1, progress=update)
    except GlassrtError as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        sys.exit(1)
    render(prof, console, top)
    if trace:
        prof.write_trace(trace)
        console.print(f"wrote {trace} ({len(prof.records)} node events over {len(prof.runs)} runs)")
    if html_file:
        from .tools.html_report import write_html

        try:
            data = write_html(sess, prof, feeds, html_file, Path(str(source)).name)
        except (GlassrtError, OSError) as e:
            console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
            sys.exit(1)
        console.print(f"wrote {escape(html_file)} ({len(data['rows'])} nodes, {data['arena_values']} arena values)",
                      highlight=False)


@main.command()
@click.argument("model")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="The optimized model to write.")
@click.option("--level", type=click.Choice(["none", "basic", "extended", "all"]), default="all", show_default=True,
              help="Which graph passes run (as SessionOptions.graph_optimization_level).")
@click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE", help="Bind a symbolic input dim before the passes.")
@click.option("--external-data", is_flag=True, help="Write initializers to OUTPUT.data, aligned so they can be mapped.")
@click.option("--size-threshold", default=1024, show_default=True, metavar="BYTES",
              help="With --external-data: smaller initializers stay inside the model.")
@click.option("--providers", default=DEFAULT_PROVIDERS, show_default=True,
              help="Providers the passes ask (which composites they can run whole).")
@click.option("--json", "json_file", type=click.Path(dir_okay=False), help="Also write the report as JSON.")
def optimize(model, output, level, dims, external_data, size_threshold, providers, json_file):
    """Run glassrt's graph passes on MODEL once and save the result as a standard ONNX model."""
    import json

    from .tools import optimize as tool

    try:
        with _progress(f"optimizing {Path(model).name}"):
            report = tool.optimize(model, output, level=level, dims=_parse_dims(dims), external_data=external_data,
                                   size_threshold=size_threshold, providers=providers.split(","))
    except GlassrtError as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        sys.exit(1)
    tool.render(report, console)
    if json_file:
        Path(json_file).write_text(json.dumps(report.to_json(), indent=1))


@main.command()
@click.option("--op", "op_filter", help="Check only this op (e.g. Conv or my_ops::swish).")
@click.option("--module", "modules", multiple=True, metavar="PY_MODULE",
              help="Import this module (dotted name or .py file) first, so its custom ops register.")
@click.option("--json", "json_file", type=click.Path(dir_okay=False), help="Write every row as JSON.")
@click.option("--custom-only", is_flag=True, help="Skip the built-in ops.")
def check(op_filter, modules, json_file, custom_only):
    """Validate operator contracts: meta vs real outputs, symbolic batch, dtype coverage,
    decomposition vs fused kernel, backward vs finite differences. Exit 1 on any failure."""
    import json
    from dataclasses import asdict

    from rich.table import Table

    from .tools import check as checks

    for m in modules:
        try:
            checks.load_module(m)
        except Exception as e:  # noqa: BLE001 — the user's module: report, do not crash
            console.print(f"[bold red]error:[/] cannot import --module {m}: {type(e).__name__}: {escape(str(e))}", highlight=False)
            sys.exit(2)
    with _progress("checking operator contracts", counted=True) as update:
        rows = checks.run_checks(op_filter, builtins=not custom_only, progress=lambda i, n: update(i, n))
    from .kernels.custom import OPS

    custom = {f"{d}::{n}" for d, n in OPS}
    shown = [r for r in rows if r.status in ("fail", "warn") or op_filter or r.op in custom]
    t = Table(title="contract checks", title_justify="left")
    for c in ("op", "check", "status", "message"):
        t.add_column(c, overflow="fold")
    style = {"pass": "green", "fail": "bold red", "warn": "yellow", "skip": "dim", "info": "cyan"}
    for r in shown:
        if r.status == "info" and not op_filter:
            continue
        t.add_row(escape(r.op), r.check, f"[{style[r.status]}]{r.status}[/]", escape(r.message))
    console.print(t)
    s = checks.summarize(rows)
    for name in checks.CHECKS:
        counts = s.get(name, {})
        console.print(f"{name:15} " + "  ".join(f"{k}={v}" for k, v in sorted(counts.items())), highlight=False)
    if not op_filter:
        for r in rows:
            if r.op == "(built-ins)":
                console.print(f"[cyan]note:[/] {escape(r.message)}", highlight=False)
    if json_file:
        Path(json_file).write_text(json.dumps([asdict(r) for r in rows], indent=1))
        console.print(f"wrote {json_file}")
    failed = [r for r in rows if r.status == "fail"]
    if failed:
        console.print(f"[bold red]{len(failed)} check(s) failed[/]")
        sys.exit(1)


@main.command()
@click.argument("model", required=False)
@click.option("--a", "prov_a", default="cpu", show_default=True, help="First provider list.")
@click.option("--b", "prov_b", default="reference,cpu", show_default=True,
              help="Second provider list (reference first; cpu where the reference is known wrong).")
@click.option("--input", "inputs", multiple=True, metavar="NAME=FILE.npy")
@click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE")
@click.option("--against", metavar="onnxruntime|PROVIDERS",
              help="Compare with onnxruntime (every intermediate by its ONNX name), or with a provider list "
                   "(the same as --b).")
@click.option("--rtol", default=RTOL, show_default=True, help="Relative tolerance (float32 end to end).")
@click.option("--atol", default=ATOL, show_default=True, help="Absolute tolerance.")
@threads_option
def compare(model, prov_a, prov_b, against, inputs, dims, rtol, atol, threads):
    """Run MODEL on two provider lists, or in glassrt and onnxruntime (--against onnxruntime),
    and name the first node where they disagree. Exit 1 when they do."""
    from .tools.compare import first_disagreement, verdict

    if against and click.get_current_context().get_parameter_source("prov_b") == click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError("give --against or --b, not both (--against PROVIDERS is --b PROVIDERS)")
    if against and against.lower() != "onnxruntime":
        prov_b = against
    source, default_name = _model_arg(model)
    try:
        sess = _session(source, prov_a, threads=threads)
        feeds = _load_inputs(sess, inputs, _parse_dims(dims), default_name)
        if against and against.lower() == "onnxruntime":
            from .tools import against_ort

            with _progress(f"running in glassrt on {prov_a} and in onnxruntime, keeping every value"):
                result = against_ort.first_divergence(source, feeds, prov_a.split(","), rtol, atol,
                                                      sess_options=_options(threads), threads=threads)
            against_ort.render(result, console, rtol, atol)
            sys.exit(1 if result.found is not None else 0)
        with _progress(f"running on {prov_a} and on {prov_b}, keeping every value"):
            found, n = first_disagreement(source, feeds, prov_a.split(","), prov_b.split(","), rtol, atol,
                                          sess_options=_options(threads))
    except GlassrtError as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        sys.exit(1)
    console.print(verdict(found, n, rtol, atol), style="green" if found is None else "bold red", highlight=False,
                  markup=False)
    if found is not None:
        sys.exit(1)


@main.command()
@click.argument("model", required=False)
@click.option("--input", "inputs", multiple=True, metavar="NAME=FILE.npy")
@click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE")
@click.option("--providers", default=DEFAULT_PROVIDERS, show_default=True)
def nan(model, inputs, dims, providers):
    """Run MODEL and name the first node that produced a NaN or an Inf."""
    from .tools.compare import first_anomaly

    source, default_name = _model_arg(model)
    try:
        sess = _session(source, providers)
        found = first_anomaly(sess, _load_inputs(sess, inputs, _parse_dims(dims), default_name))
    except GlassrtError as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        sys.exit(1)
    if found is None:
        console.print("[green]no NaN or Inf[/] in any intermediate value")
        return
    console.print(f"[bold red]first non-finite value:[/] {escape(str(found))}", highlight=False)
    sys.exit(1)


@main.command()
@click.argument("models", nargs=-1, required=True, metavar="MODEL...")
@click.option("--vs", "versus", type=click.Choice(["onnxruntime"]), help="Also run this runtime, in its own process.")
@click.option("--runs", default=20, show_default=True, help="Timed runs per runtime (their median and p90 are reported).")
@click.option("--warmup", default=2, show_default=True, help="Untimed runs after the first, per runtime.")
@click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE", help="Bind a symbolic dim for generated inputs.")
@click.option("--input", "inputs", multiple=True, metavar="NAME=FILE.npy",
              help="Feed an input from a .npy file (every model given; the other inputs are made up).")
@click.option("--threads", default=2, show_default=True, help="intra_op_num_threads for every runtime.")
@click.option("--busy", default=0, show_default=True, help="Run K CPU-bound processes during the timed runs.")
@click.option("--starts", default=1, show_default=True,
              help="Fresh processes per runtime timed for session creation + first run (the median is reported).")
@click.option("--json", "json_file", type=click.Path(dir_okay=False), help="Write everything, per-run latencies too.")
@click.option("--providers", default=DEFAULT_PROVIDERS, show_default=True, help="glassrt's provider priority list.")
def bench(models, versus, runs, warmup, dims, inputs, threads, busy, starts, json_file, providers):
    """Time MODEL... (.onnx files or built-in names: light:resnet50, mobilenet, bert-base,
    gpt2-step), each runtime in its own process, against onnxruntime with --vs."""
    from .tools import bench as benchmark

    if runs < 1 or warmup < 0 or threads < 1 or busy < 0 or starts < 1:
        console.print("[bold red]error:[/] --runs, --threads and --starts must be at least 1, --warmup and --busy "
                      "at least 0")
        sys.exit(2)
    settings = benchmark.Settings(runtimes=("glassrt", versus) if versus else ("glassrt",), runs=runs, warmup=warmup,
                                  threads=threads, busy=busy, providers=tuple(providers.split(",")), starts=starts)
    try:
        given = {name: made_up.load_npy(name, file) for name, file in _parse_pairs(inputs, "--input").items()}
    except GlassrtError as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        sys.exit(2)
    try:
        code = benchmark.run_command(models, _parse_dims(dims), settings, json_file, console, given=given)
    except benchmark.BenchError as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        sys.exit(1)
    sys.exit(code)


@main.command()
@click.argument("models", nargs=-1, metavar="[MODEL|NAME=PATH]...")
@click.option("--model-repository", type=click.Path(exists=True, file_okay=False),
              help="A Triton-style folder: DIR/NAME/VERSION/model.onnx.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True)
@click.option("--max-batch-size", default=8, show_default=True,
              help="Rows per dynamically batched run (1: no batching).")
@click.option("--batch-timeout-ms", default=1.0, show_default=True,
              help="How long the oldest request waits for others to join its batch.")
@click.option("--max-body-bytes", default=64 << 20, show_default=True, help="Larger request bodies get 413.")
@click.option("--strict", is_flag=True, help="Refuse to load a model that would fall back (fallback='error').")
@click.option("--providers", default=DEFAULT_PROVIDERS, show_default=True, help="Provider priority list.")
@click.option("--module", "modules", multiple=True, metavar="PY_MODULE",
              help="Import this module (dotted name or .py file) first, so its custom ops register.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))
@click.option("--keep-alive", default=75, show_default=True, metavar="SECONDS",
              help="How long an idle client connection is kept open (uvicorn's default, 5 s, closes "
                   "connections that pooled clients such as tritonclient are about to reuse).")
@click.option("--ray", "on_ray", is_flag=True, help="Deploy on Ray Serve (one app per replica); needs glassrt[ray].")
@click.option("--replicas", type=int, help="With --ray: this many replicas (default 1).")
@click.option("--autoscale", metavar="MIN:MAX", help="With --ray: Ray Serve autoscales between MIN and MAX replicas.")
@click.option("--address", help="With --ray: the Ray cluster to use (else RAY_ADDRESS, else a local runtime).")
def serve(models, model_repository, host, port, max_batch_size, batch_timeout_ms, max_body_bytes, strict,
          providers, modules, log_level, keep_alive, on_ray, replicas, autoscale, address):
    """Serve models over the KServe / Triton v2 HTTP protocol (tritonclient.http works)."""
    try:
        import uvicorn

        from .serve.app import create_app
    except ImportError as e:
        raise click.ClickException(f"glassrt serve needs FastAPI and uvicorn ({e.name} is missing): "
                                   "pip install 'glassrt[serve]'") from None
    if bool(models) == bool(model_repository):
        raise click.UsageError("give MODEL files or --model-repository DIR (one of the two)")
    if not on_ray and (replicas is not None or autoscale or address):
        raise click.UsageError("--replicas, --autoscale and --address go with --ray")
    if on_ray:
        _serve_on_ray(model_repository or list(models), replicas, autoscale, address, host, port, modules,
                      dict(max_batch_size=max_batch_size, batch_timeout_ms=batch_timeout_ms,
                           max_body_bytes=max_body_bytes, strict=strict, providers=providers.split(",")))
        return
    from .tools.check import load_module

    for module in modules:
        try:
            load_module(module)
        except Exception as e:  # noqa: BLE001 — the user's module: report, do not crash
            console.print(f"[bold red]error:[/] cannot import --module {module}: {type(e).__name__}: "
                          f"{escape(str(e))}", highlight=False)
            sys.exit(1)
    try:
        app = create_app(model_repository or list(models), max_batch_size=max_batch_size,
                         batch_timeout_ms=batch_timeout_ms, max_body_bytes=max_body_bytes, strict=strict,
                         providers=providers.split(","))
    except GlassrtError as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        sys.exit(1)
    for name, versions in app.state.models.items():
        for v, m in versions.items():
            console.print(f"serving {name} version {v} ({m.source.path})"
                          + (", batched" if m.batcher else ""), highlight=False, markup=False)
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_keep_alive=keep_alive)


def _serve_on_ray(models, replicas, autoscale, address, host, port, modules, app_options):
    try:
        from .serve import on_ray
    except ImportError as e:
        raise click.ClickException(f"glassrt serve --ray needs Ray Serve ({e.name} is missing): "
                                   "pip install 'glassrt[ray]'") from None
    try:
        scaling = on_ray.parse_scaling(replicas, autoscale)
        on_ray.run_command(models, scaling=scaling, address=address, host=host, port=port, app_options=app_options,
                           modules=modules, console=console)
    except GlassrtError as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        sys.exit(1)


@main.command()
@click.argument("model")
@click.option("--input", "input_path", required=True, metavar="PATH",
              help="A Parquet file or folder (or a URL Ray reads), or a folder of NAME.npy files, one per column.")
@click.option("--output", "output_path", required=True, metavar="PATH", help="The folder to write.")
@click.option("--format", "output_format", type=click.Choice(["parquet", "npy"]), default="parquet",
              show_default=True, help="Parquet files, or one NAME.npy per column.")
@click.option("--input-column", "input_columns", multiple=True, metavar="COL=INPUT",
              help="Feed model input INPUT from column COL (default: the column of the input's name).")
@click.option("--batch-size", default=64, show_default=True, help="Rows per batch.")
@click.option("--concurrency", default=1, show_default=True, help="Actors, each holding one session.")
@click.option("--threads", default=1, show_default=True, help="Threads per actor (also the CPUs Ray reserves for it).")
@click.option("--providers", default=DEFAULT_PROVIDERS, show_default=True, help="Provider priority list.")
@click.option("--strict", is_flag=True, help="Fail if any node would fall back (fallback='error').")
@click.option("--keep-inputs", is_flag=True, help="Also write the columns fed to the model.")
@click.option("--address", help="A running Ray cluster (host:6379, ray://host:10001, auto); default: "
                                "$RAY_ADDRESS, else a local Ray.")
def batch(model, input_path, output_path, output_format, input_columns, batch_size, concurrency, threads, providers,
          strict, keep_inputs, address):
    """Run MODEL over a dataset on Ray Data (the `ray` extra) and summarize: rows/s, actors, fallbacks."""
    from .ray import batch as ray_batch

    settings = ray_batch.Settings(columns=_parse_pairs(input_columns, "--input-column"), batch_size=batch_size,
                                  concurrency=concurrency, threads=threads, providers=providers.split(","),
                                  fallback="error" if strict else "warn", address=address,
                                  output_format=output_format, keep_inputs=keep_inputs)
    try:
        result = ray_batch.run(model, input_path, output_path, settings)
    except GlassrtError as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        sys.exit(1)
    ray_batch.render(result, console)


def _load_inputs(sess, inputs, dims, default_name):
    """The --input files, and made-up values for every other input (each one printed: a
    result on invented data should say so)."""
    given = {name: made_up.load_npy(name, file) for name, file in _parse_pairs(inputs, "--input").items()}
    made_up.check_dims(sess, dims)
    if default_name and not given:
        from .tools import light_models

        (arg,) = sess.get_inputs()
        value = light_models.reference_input(arg.shape)
        console.print(made_up.describe(arg.name, value, "arange(n)/n, the input onnx's test runner makes"),
                      highlight=False, markup=False)
        return {arg.name: value}
    generated, notes = made_up.generate(sess, dims, given)
    for name, value in generated.items():
        console.print("made up " + made_up.describe(name, value), highlight=False, markup=False)
    for note in notes:
        console.print(f"note: {note}", highlight=False, markup=False)
    return {**given, **generated}


if __name__ == "__main__":
    main()
