"""`glassrt bench`: latency of glassrt, alone or against onnxruntime, one process per runtime.

For each model and runtime a worker process (glassrt.tools.bench_worker) loads the model,
creates the session, runs once and warms up; the parent then asks the workers for
blocks of timed runs in turn (glassrt, onnxruntime, onnxruntime, glassrt, ...) so that
noise from a busy machine hits both alike. Both get the same inputs, generated once
here, and the same thread count. The report per model and runtime: median and p90
latency, the ratio of medians, session creation + first run (in a fresh process), the
worker's peak RSS, the BLAS it runs on, and whether the outputs agree.

From Python: `bench_case(case, settings)` for one model, `bench_generation(...)` for a
greedy decoding loop; benchmarks/suite.py runs the suite models this way.
"""
from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from ..runtime.providers import DEFAULT as DEFAULT_PROVIDERS
from .inputs import random_value

RUNTIMES = ("glassrt", "onnxruntime")
RTOL, ATOL = 1e-3, 1e-4  # outputs "differ" beyond np.allclose(glassrt, onnxruntime, RTOL, ATOL)
BUSY_MARK = "glassrt-bench-busy"  # in each busy process's command line, so it can be found


class BenchError(Exception):
    """A problem the user can act on: reported as one line, no traceback."""


@dataclass
class Settings:
    runtimes: tuple = ("glassrt",)
    runs: int = 20  # timed runs kept per runtime
    warmup: int = 2  # untimed runs after the first, in each worker
    threads: int = 2  # intra_op_num_threads for both (onnxruntime: inter_op_num_threads=1)
    busy: int = 0  # CPU-bound processes running during the timed runs
    providers: tuple = tuple(DEFAULT_PROVIDERS)  # glassrt's
    block: int = 5  # timed runs per turn before the other runtime's turn
    # Before each turn: a pause, and one untimed run. The other worker's threads spin for up
    # to ~0.1 s after its turn (onnxruntime's pool, OpenBLAS's) and would take this one's cores.
    settle_s: float = 0.2
    # Fresh processes per runtime whose session creation + first run are timed (the timed
    # runs' workers are the first; the others start one after the other, alternating
    # runtimes, once those are gone): the report gives their median. On a VM whose first
    # touches of memory cost 2-9 us a page, one start per runtime swings by 2-5x.
    starts: int = 1


@dataclass
class Case:
    """One model with its inputs: what one row pair of the report measures."""

    label: str
    path: str  # the model file the workers load
    feeds: dict
    dims: dict = field(default_factory=dict)
    # outputs agree within np.allclose(glassrt, onnxruntime, rtol, atol): RTOL / ATOL unless
    # the case says (an 8-bit model agrees to within its quantization, not to float rounding)
    tolerance: tuple | None = None


# ---------------------------------------------------------------- models and inputs


def resolve(model: str, dims: dict, workdir: str, seed: int = 0, given: dict | None = None) -> Case:
    """A Case for MODEL: a path to an .onnx file, or else a built-in name (bench_models.SUITE)
    whose model is built and saved into workdir. `given`: inputs from --input files (the
    others are made up)."""
    from . import bench_models

    builtin = None if Path(model).exists() else bench_models.lookup(model)
    case = _builtin_case(builtin, dims, workdir, seed, given) if builtin is not None \
        else _file_case(model, dims, seed, given)
    unknown = sorted(set(given or {}) - set(case.feeds) - _input_names(case.path))
    if unknown:  # (a built-in model's own feeds are not checked by generate_feeds)
        raise BenchError(f"--input {', '.join(unknown)}: {case.label} has no such input")
    case.feeds.update(given or {})
    return case


def _input_names(path: str) -> set:
    import onnx

    return {vi.name for vi in _graph_inputs(onnx.load(path, load_external_data=False))}


def _builtin_case(builtin, dims: dict, workdir: str, seed: int, given=None) -> Case:
    import onnx

    bound = {**builtin.dims, **dims}
    try:
        proto = builtin.build(bound)
    except Exception as e:  # noqa: BLE001 - e.g. the onnx package without its light models
        raise BenchError(f"cannot build '{builtin.name}': {type(e).__name__}: {e}") from None
    with tempfile.NamedTemporaryFile(dir=workdir, prefix=builtin.name.replace(":", "_") + "-", suffix=".onnx",
                                     delete=False) as f:
        path = f.name
    onnx.save(proto, path)
    feeds = builtin.feeds(bound, seed) if builtin.feeds else generate_feeds(proto, bound, seed, given)
    # the label names the dims that shape this run (a light model's batch is fixed in the file)
    shown = _free_dims(proto) | {"batch"}
    return Case(builtin.name + "".join(f" {k}={v}" for k, v in bound.items() if k in shown), path, feeds, bound)


def _file_case(model: str, dims: dict, seed: int, given=None) -> Case:
    import onnx

    path = Path(model)
    if not path.is_file():
        raise BenchError(f"no model file '{model}', and no built-in model of that name "
                         "(light:NAME, mobilenet, bert-base, gpt2-step)")
    try:
        proto = onnx.load(str(path), load_external_data=False)  # for the declared inputs only
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise BenchError(f"cannot read model '{model}': {type(e).__name__}: {e}") from None
    feeds = generate_feeds(proto, dims, seed, given)
    label = path.name + "".join(f" {k}={v}" for k, v in dims.items() if k in _free_dims(proto))
    return Case(label, str(path.resolve()), feeds, dict(dims))


def _graph_inputs(model) -> list:
    inits = {t.name for t in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


def _free_dims(model) -> set:
    return {d.dim_param for vi in _graph_inputs(model) for d in vi.type.tensor_type.shape.dim if d.dim_param}


def generate_feeds(model, dims: dict, seed: int = 0, given: dict | None = None) -> dict:
    """Inputs from the model's declared input shapes, as `glassrt run` makes them: random
    floats in [0, 1), integers in [0, 10), random booleans; --dim binds symbolic dims, and a
    dim with neither value nor name is 1. Inputs in `given` (--input files) are not made:
    each must name an input of the model, of its declared element type."""
    from onnx import helper

    rng = np.random.default_rng(seed)
    feeds, given = {}, given or {}
    declared = {vi.name: vi for vi in _graph_inputs(model)}
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise BenchError(f"--input {', '.join(unknown)}: the model has no such input; its inputs are {list(declared)}")
    for vi in declared.values():
        t = vi.type.tensor_type
        if vi.name in given:
            want = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type)) if vi.type.HasField("tensor_type") else None
            if want is not None and given[vi.name].dtype != want:
                raise BenchError(f"--input {vi.name}: the file holds {given[vi.name].dtype}, the model declares {want}")
            continue
        if not vi.type.HasField("tensor_type") or not t.HasField("shape"):
            raise BenchError(f"input '{vi.name}' has no declared tensor shape: cannot generate it")
        shape = []
        for d in t.shape.dim:
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            elif d.dim_param and d.dim_param not in dims:
                raise BenchError(f"input '{vi.name}' has symbolic dim '{d.dim_param}'; "
                                 f"bind it with --dim {d.dim_param}=N")
            else:
                shape.append(dims.get(d.dim_param, 1))
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type))
        feeds[vi.name] = random_value(rng, shape, dtype)
        if feeds[vi.name] is None:
            raise BenchError(f"cannot generate input '{vi.name}' of type {dtype}")
    return feeds


# ---------------------------------------------------------------- worker processes


def _worker_env() -> dict:
    """The parent's environment, with this glassrt first on the path (the worker must import
    the same glassrt as the parent, installed or not)."""
    root = str(Path(__file__).absolute().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


class Worker:
    """A bench_worker process running one runtime on one model; started once per (model, runtime)."""

    def __init__(self, runtime: str, case: Case, settings: Settings):
        self.runtime = runtime
        self._stderr = tempfile.TemporaryFile()
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        script = str(Path(__file__).with_name("bench_worker.py"))
        self.proc = subprocess.Popen([sys.executable, script], stdin=to_child_r, stdout=from_child_w,
                                     stderr=self._stderr, env=_worker_env(), close_fds=True)
        os.close(to_child_r)
        os.close(from_child_w)
        self._out = Connection(to_child_w, readable=False)
        self._in = Connection(from_child_r, writable=False)
        try:
            self.started = self._call({"runtime": runtime, "model": case.path, "threads": settings.threads,
                                       "providers": list(settings.providers), "feeds": case.feeds,
                                       "warmup": settings.warmup})
        except BenchError:
            self.close()  # the caller never gets this worker to close
            raise

    def _call(self, msg):
        try:
            self._out.send(msg)
            status, payload = self._in.recv()
        except (EOFError, OSError):
            raise BenchError(f"{self.runtime} worker died: {self._last_words()}") from None
        if status == "error":
            raise BenchError(f"{self.runtime}: {payload}")
        return payload

    def _last_words(self) -> str:
        code = self.proc.wait(timeout=30)
        self._stderr.seek(0)
        lines = [ln for ln in self._stderr.read().decode(errors="replace").splitlines() if ln.strip()]
        if code < 0:
            why = " (killed: out of memory?)" if code == -9 else ""
            return f"exited on signal {-code}{why}" + (f"; {lines[-1].strip()}" if lines else "")
        return lines[-1].strip() if lines else f"exit status {code}"

    def run(self, n: int) -> list[float]:
        return self._call(("run", n))

    def generate(self, feeds: dict, steps: int, cache: dict) -> dict:
        return self._call(("generate", feeds, steps, cache))

    def info(self) -> dict:
        return self._call(("info",))

    def close(self):
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self._out.send(("stop",))
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()
        self._in.close()
        self._stderr.close()


@contextlib.contextmanager
def _workers(case: Case, settings: Settings, status):
    """One worker per runtime, started one after the other so that each session's creation
    time is measured with the other worker idle; all stopped on the way out."""
    workers = {}
    try:
        for rt in settings.runtimes:
            status(f"{case.label}: {rt} session")
            read_through(case.path)
            workers[rt] = Worker(rt, case, settings)
        yield workers
    finally:
        for w in workers.values():
            w.close()


def read_through(path: str) -> None:
    """Read a file once, so that what is timed next finds it in the page cache. The bench
    reads the model before each worker starts, so that both runtimes' creation times start
    alike (the first worker used to meet a file just written or evicted)."""
    try:
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass
    except OSError:
        pass  # the worker reports a file it cannot read


_BUSY_LOOP = """
import os, sys
parent = os.getppid()
sys.stdout.write("r"); sys.stdout.flush()
while os.getppid() == parent:  # orphaned (the parent died): stop
    for _ in range(1_000_000):
        pass
"""


@contextlib.contextmanager
def busy_processes(k: int):
    """K processes spinning a pure-Python loop, for a run on a loaded machine; yields their
    pids once every one is running, stops and reaps them on the way out."""
    procs = []
    try:
        for _ in range(k):
            procs.append(subprocess.Popen([sys.executable, "-c", _BUSY_LOOP, BUSY_MARK], stdout=subprocess.PIPE))
        for p in procs:
            p.stdout.read(1)  # "r": it is running its loop
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            p.stdout.close()


# ---------------------------------------------------------------- measuring


def alternate(workers: dict, settings: Settings, progress, others_cpu: dict | None = None) -> dict[str, list[float]]:
    """settings.runs timed runs from each worker, in turns of settings.block runs; the turn
    order flips every round so that neither runtime always follows the other. others_cpu,
    if given, gets per runtime the CPU seconds the other workers used during each of its
    turns (Linux; a worker idle between its turns uses none, one whose threads still spin
    takes the cores the turn measures)."""
    times = {rt: [] for rt in workers}
    order = list(workers)
    while any(len(t) < settings.runs for t in times.values()):
        for rt in order:
            n = min(settings.block, settings.runs - len(times[rt]))
            if n <= 0:
                continue
            time.sleep(settings.settle_s)
            others = [w.proc.pid for other, w in workers.items() if other != rt]
            before = [cpu_seconds(pid) for pid in others]
            times[rt] += workers[rt].run(n + 1)[1:]  # the first run of a turn is the settling run
            after = [cpu_seconds(pid) for pid in others]
            if others_cpu is not None and None not in before + after:
                others_cpu.setdefault(rt, []).append(round(sum(after) - sum(before), 3))
            progress(n)
        order.reverse()
    return times


def cpu_seconds(pid: int) -> float | None:
    """A process's CPU time so far, all its threads (Linux /proc; None elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def latency_stats(seconds: list[float]) -> dict:
    ms = np.asarray(seconds) * 1e3
    return {"median_ms": float(np.median(ms)), "p90_ms": float(np.percentile(ms, 90)), "mean_ms": float(ms.mean()),
            "min_ms": float(ms.min()), "max_ms": float(ms.max()),
            "stdev_ms": float(ms.std(ddof=1)) if len(ms) > 1 else 0.0, "runs": len(ms),
            "latencies_ms": [round(float(x), 4) for x in ms]}


def agreement(names: list, ours: list, theirs: list, tolerance: tuple | None = None) -> dict:
    """Each output of glassrt against onnxruntime's: max |a - b|, that over max |b| (relative
    to the output's scale, not per element, which explodes near zero), and whether
    np.allclose(a, b, rtol, atol) holds (RTOL, ATOL unless `tolerance` gives them)."""
    rtol, atol = tolerance or (RTOL, ATOL)
    rows = [_compare_output(name, np.asarray(a), np.asarray(b), rtol, atol) for name, a, b in zip(names, ours, theirs)]
    return {"rtol": rtol, "atol": atol, "agree": all(r["agree"] for r in rows), "outputs": rows}


def _compare_output(name: str, a: np.ndarray, b: np.ndarray, rtol: float = RTOL, atol: float = ATOL) -> dict:
    if a.shape != b.shape:
        return {"name": name, "max_abs": None, "max_rel": None, "agree": False,
                "note": f"shapes differ: {list(a.shape)} vs {list(b.shape)}"}
    if a.dtype.kind not in "biuf" or b.dtype.kind not in "biuf":  # strings, objects: equal or not
        same = bool(np.array_equal(a, b))
        return {"name": name, "max_abs": None, "max_rel": None, "agree": same}
    if a.size == 0:
        return {"name": name, "max_abs": 0.0, "max_rel": 0.0, "agree": True}
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    max_abs = float(np.nan_to_num(np.abs(a64 - b64), nan=np.inf).max())
    scale = float(np.nan_to_num(np.abs(b64)).max())
    max_rel = max_abs / scale if scale else (0.0 if max_abs == 0 else math.inf)
    return {"name": name, "max_abs": max_abs, "max_rel": max_rel,
            "agree": bool(np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True))}


def more_starts(case: Case, settings: Settings, runtimes, status=lambda text: None) -> dict[str, list[dict]]:
    """settings.starts - 1 more fresh workers per runtime, one at a time, the runtimes'
    order flipping each round: each one's timings of its session creation and first run."""
    quiet = replace(settings, warmup=0)
    order, starts = list(runtimes), {rt: [] for rt in runtimes}
    for i in range(settings.starts - 1):
        for rt in order:
            status(f"{case.label}: {rt} start {i + 2} of {settings.starts}")
            read_through(case.path)
            worker = Worker(rt, case, quiet)
            worker.close()
            starts[rt].append(_start_times(worker.started))
        order.reverse()
    return starts


def _start_times(started: dict) -> dict:
    return {k: started[k] for k in ("import_s", "create_s", "first_run_s")}


def _with_starts(report: dict, starts: list[dict]) -> dict:
    """The report's creation figures as medians over every start (its own worker's first)."""
    every = [_start_times(report)] + starts
    sums = [s["create_s"] + s["first_run_s"] for s in every]
    return {**report, "create_s": statistics.median(s["create_s"] for s in every),
            "first_run_s": statistics.median(s["first_run_s"] for s in every),
            "create_and_first_run_s": statistics.median(sums), "create_and_first_run_all_s": sums}


def _runtime_report(worker: Worker, seconds: list[float]) -> dict:
    s, info = worker.started, worker.info()
    return {**latency_stats(seconds), "import_s": s["import_s"], "create_s": s["create_s"],
            "first_run_s": s["first_run_s"], "create_and_first_run_s": s["create_s"] + s["first_run_s"],
            "create_and_first_run_all_s": [s["create_s"] + s["first_run_s"]],
            "fallbacks": s["fallbacks"], "peak_rss_bytes": info["peak_rss_bytes"],
            "rss_after_start_bytes": s["rss_after_start_bytes"], "threadpools": info["threadpools"],
            "blas": blas_summary(worker.runtime, info["threadpools"]), "openblas_coretype": info["openblas_coretype"],
            "thread_choice": info.get("thread_choice", [])}


def blas_summary(runtime: str, threadpools: list) -> str:
    """One line: what does the matrix products. onnxruntime's are its own MLAS kernels (the
    BLAS threadpoolctl finds in its worker is NumPy's, unused by onnxruntime)."""
    if runtime == "onnxruntime":
        return "MLAS (built in)"
    blas = [p for p in threadpools if p.get("user_api") == "blas"]
    return "; ".join(" ".join(str(x) for x in (p["internal_api"], p["version"], p.get("architecture"),
                                                f"x{p['num_threads']}") if x) for p in blas) or "none found"


def bench_case(case: Case, settings: Settings, status=lambda text: None, progress=lambda n: None) -> dict:
    """Measure one model on settings.runtimes; a dict as in the --json report's "models"."""
    result = {"model": case.label, "path": case.path, "dims": case.dims,
              "inputs": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in case.feeds.items()},
              "runtimes": {}, "ratio": None, "agreement": None, "busy_pids": [], "error": None}
    try:
        with _workers(case, settings, status) as workers:
            status(f"{case.label}: timing")
            with busy_processes(settings.busy) as pids:
                result["busy_pids"] = pids
                others_cpu = {}
                times = alternate(workers, settings, progress, others_cpu)
            for rt, w in workers.items():
                result["runtimes"][rt] = _runtime_report(w, times[rt])
                result["runtimes"][rt]["others_cpu_s_per_turn"] = others_cpu.get(rt, [])
            if "glassrt" in workers and "onnxruntime" in workers:
                g, o = workers["glassrt"].started, workers["onnxruntime"].started
                result["agreement"] = agreement(o["output_names"], g["outputs"], o["outputs"], case.tolerance)
                result["ratio"] = _ratio(result["runtimes"])
        for rt, starts in more_starts(case, settings, result["runtimes"], status).items():
            result["runtimes"][rt] = _with_starts(result["runtimes"][rt], starts)
    except BenchError as e:
        result["error"] = str(e)
    return result


def _ratio(runtimes: dict) -> float | None:
    if "glassrt" in runtimes and "onnxruntime" in runtimes:
        return runtimes["glassrt"]["median_ms"] / runtimes["onnxruntime"]["median_ms"]
    return None


def bench_generation(case: Case, settings: Settings, new_tokens: int, cache: dict, rounds: int,
                     status=lambda text: None, progress=lambda n: None) -> dict:
    """Greedy decoding with a KV cache: case.feeds is the prompt (its past inputs empty),
    `cache` maps each present output to the past input it feeds. Each round decodes
    new_tokens tokens on every runtime in turn; reports ms per one-token step and tokens/s,
    the prompt's time, and whether every runtime produced the same tokens. With
    settings.warmup, each runtime first decodes one untimed round (as the latency runs
    have untimed runs: a process's first generation makes its plans, the steady state is
    what a long decode sees); its steps are reported apart ("cold_median_ms")."""
    result = {"model": case.label, "path": case.path, "new_tokens": new_tokens, "rounds": rounds,
              "runtimes": {}, "ratio": None, "same_tokens": None, "busy_pids": [], "error": None}
    batch = next(iter(case.feeds.values())).shape[0]
    try:
        with _workers(case, settings, status) as workers:
            status(f"{case.label}: decoding")
            generations = {rt: [] for rt in workers}
            order = list(workers)
            cold = {rt: (workers[rt].generate(case.feeds, new_tokens - 1, cache) if settings.warmup else None)
                    for rt in order}
            with busy_processes(settings.busy) as pids:
                result["busy_pids"] = pids
                for _ in range(rounds):
                    for rt in order:
                        time.sleep(settings.settle_s)
                        generations[rt].append(workers[rt].generate(case.feeds, new_tokens - 1, cache))
                        progress(1)
                    order.reverse()
            for rt, w in workers.items():
                result["runtimes"][rt] = _decode_report(w, generations[rt], batch)
                result["runtimes"][rt]["cold_median_ms"] = (
                    float(np.median(cold[rt]["step_s"]) * 1e3) if cold[rt] is not None else None)
        for rt, starts in more_starts(case, settings, result["runtimes"], status).items():
            result["runtimes"][rt] = _with_starts(result["runtimes"][rt], starts)
        tokens = [r["tokens"] for r in result["runtimes"].values()]
        result["same_tokens"] = all(t == tokens[0] for t in tokens)
        result["ratio"] = _ratio(result["runtimes"])
    except BenchError as e:
        result["error"] = str(e)
    return result


def _decode_report(worker: Worker, generations: list, batch: int) -> dict:
    stats = latency_stats([s for g in generations for s in g["step_s"]])
    info = worker.info()
    return {**stats, "tokens_per_s": batch / (stats["median_ms"] / 1e3),
            "prefill_ms": float(np.median([g["prefill_s"] for g in generations]) * 1e3),
            **_start_times(worker.started),
            "create_and_first_run_s": worker.started["create_s"] + worker.started["first_run_s"],
            "create_and_first_run_all_s": [worker.started["create_s"] + worker.started["first_run_s"]],
            "peak_rss_bytes": info["peak_rss_bytes"], "blas": blas_summary(worker.runtime, info["threadpools"]),
            "threadpools": info["threadpools"], "tokens": generations[0]["tokens"],
            "deterministic": all(g["tokens"] == generations[0]["tokens"] for g in generations)}


def geometric_mean(ratios) -> float | None:
    ratios = [r for r in ratios if r]
    return float(math.exp(statistics.fmean(math.log(r) for r in ratios))) if ratios else None


# ---------------------------------------------------------------- the environment


def environment() -> dict:
    """What the numbers depend on: CPU, cores, BLAS-related variables, package versions, load."""
    from importlib import metadata

    cpu, flags = None, set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():  # (the first CPU's lines)
            if line.startswith("model name") and cpu is None:
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    cpu = cpu or platform.processor()
    versions = {}
    for pkg in ("glassrt", "numpy", "onnx", "onnxruntime", "numba", "threadpoolctl", "scipy"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    prefixes = ("OPENBLAS_", "OMP_", "MKL_", "NUMBA_", "GOTO", "BLIS_")
    return {"cpu": cpu, "vector_isa": vector_isa(flags), "cpu_count": os.cpu_count(),
            "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(prefixes)},
            "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            "python": platform.python_version(), "platform": platform.platform(), "packages": versions}


def check_runtimes(runtimes) -> None:
    if "onnxruntime" in runtimes and importlib.util.find_spec("onnxruntime") is None:
        raise BenchError("onnxruntime is not installed (pip install onnxruntime), so --vs onnxruntime cannot run; "
                         "leave out --vs to measure glassrt alone")


def report(results: list, settings: Settings, env: dict, generation: list = ()) -> dict:
    """Everything, as the --json file holds it."""
    return {"settings": asdict(settings), "environment": env, "models": results, "generation": list(generation),
            "geomean_ratio": geometric_mean(r["ratio"] for r in results if not r["error"])}


# ---------------------------------------------------------------- the rich table


def fmt_bytes(n) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f} MiB"


def _agreement_cell(agr) -> str:
    if agr is None:
        return "-"
    worst_abs = max((r["max_abs"] for r in agr["outputs"] if r["max_abs"] is not None), default=0.0)
    worst_rel = max((r["max_rel"] for r in agr["outputs"] if r["max_rel"] is not None), default=0.0)
    text = f"abs {worst_abs:.1e} rel {worst_rel:.1e}"
    return f"[green]agree[/] ({text})" if agr["agree"] else f"[bold red]outputs differ[/] ({text})"


def title(settings: Settings) -> str:
    t = (f"median latency, {settings.threads} thread(s), {settings.runs} timed runs per runtime "
         f"in alternating turns of {settings.block}")
    t += f", with {settings.busy} busy process(es) running" if settings.busy else ""
    return t + (f"; creation + first run: median of {settings.starts} fresh processes each" if settings.starts > 1 else "")


def vector_isa(flags: set) -> str | None:
    """The CPU's widest vector instructions, and whether it adds 8-bit products exactly (VNNI,
    AMX): where it does not, onnxruntime's and oneDNN's u8 x s8 kernels saturate (vpmaddubsw),
    and the name alone ("AMD EPYC") does not tell a Zen 4 from a Zen 1."""
    if not flags:
        return None
    widest = next((name for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"), ("sse4_2", "SSE4.2"))
                   if flag in flags), "no AVX")
    exact = [name for flag, name in (("avx512_vnni", "VNNI"), ("avx_vnni", "AVX-VNNI"), ("amx_int8", "AMX")) if flag in flags]
    return f"{widest}, " + (" + ".join(exact) if exact else "no VNNI or AMX")


def machine_line(env: dict) -> str:
    load = f", load average {env['load_average'][0]:.1f} at start" if env["load_average"] else ""
    isa = f" ({env['vector_isa']})" if env.get("vector_isa") else ""
    return (f"{env['cpu']}{isa}, {env['usable_cpus']} usable CPUs, OPENBLAS_CORETYPE="
            f"{env['openblas_coretype'] or '(unset)'}{load}")


def render(full: dict, settings: Settings, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title(settings), title_justify="left", caption=escape(machine_line(full["environment"])),
                  caption_justify="left")
    for col, right in (("model", False), ("runtime", False), ("median ms", True), ("p90 ms", True),
                       ("glassrt / ort", True), ("create + 1st run", True), ("peak RSS", True), ("BLAS", False),
                       ("outputs vs ort", False)):
        table.add_column(col, justify="right" if right else "left", overflow="fold")
    for r in full["models"]:
        if r["error"]:
            table.add_row(escape(r["model"]), "", "", "", "", "", "", "", f"[bold red]error:[/] {escape(r['error'])}")
            continue
        for i, (rt, x) in enumerate(r["runtimes"].items()):
            first = i == 0
            ratio = f"{r['ratio']:.2f}x" if first and r["ratio"] else ""
            fallbacks = f" [yellow]({x['fallbacks']} fallback(s))[/]" if x.get("fallbacks") else ""
            table.add_row(escape(r["model"]) if first else "", rt + fallbacks,
                          f"{x['median_ms']:.2f}", f"{x['p90_ms']:.2f}",
                          ratio, f"{x['create_and_first_run_s'] * 1e3:,.0f} ms", fmt_bytes(x["peak_rss_bytes"]),
                          escape(x["blas"]), _agreement_cell(r["agreement"]) if first else "",
                          end_section=i == len(r["runtimes"]) - 1)
    console.print(table)
    compared = [r for r in full["models"] if r["ratio"]]
    if len(compared) > 1:
        console.print(f"geometric mean glassrt / onnxruntime over {len(compared)} models: {full['geomean_ratio']:.2f}x")
    differ = [r["model"] for r in full["models"] if r["agreement"] and not r["agreement"]["agree"]]
    if differ:
        console.print(f"[bold red]outputs differ[/] (beyond rtol={RTOL}, atol={ATOL}) on: {escape(', '.join(differ))}")


# ---------------------------------------------------------------- the command


def run_command(models, dims: dict, settings: Settings, json_file, console, given: dict | None = None) -> int:
    """`glassrt bench`: measure, print the table, write the JSON; the exit status."""
    import json

    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    check_runtimes(settings.runtimes)
    env = environment()
    results = []
    with tempfile.TemporaryDirectory(prefix="glassrt-bench-") as workdir:
        cases = [resolve(m, dims, workdir, given=given) for m in models]  # every model checked before anything runs
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, transient=True) as bar:
            for case in cases:
                task = bar.add_task(escape(case.label), total=settings.runs * len(settings.runtimes))
                status = lambda text, task=task: bar.update(task, description=escape(text))  # noqa: E731
                progress = lambda n, task=task: bar.advance(task, n)  # noqa: E731
                results.append(bench_case(case, settings, status, progress))
                bar.remove_task(task)
    full = report(results, settings, env)
    render(full, settings, console)
    if json_file:
        Path(json_file).write_text(json.dumps(full, indent=1, default=str))
        console.print(f"wrote {escape(str(json_file))}")
    return 1 if any(r["error"] for r in results) else 0
