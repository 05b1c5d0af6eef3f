"""`glassrt batch`: a model over a Parquet dataset or a folder of .npy files, on Ray Data.

Input: a Parquet file, a folder of Parquet files (or a URL Ray Data reads: s3://...), or a
folder of NAME.npy files, one per column, rows along the first axis (what `glassrt run
--save` writes). Output: Parquet (Ray writes a folder of files) or a folder of NAME.npy,
one per column. Row i of the output is row i of the input (order is preserved). Ray's
own progress bar runs while the actors work; a summary follows (rows, rows/s, actors,
plan-cache counts, fallbacks, each actor's share).
"""
from __future__ import annotations

import re
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import GlassrtError, InvalidArgumentError
from ..onnx_io import read_model


@dataclass
class Settings:
    columns: dict = field(default_factory=dict)  # {column: model input}
    batch_size: int = 64
    concurrency: int = 1  # actors
    threads: int = 1  # per actor: its session's intra_op_num_threads and the CPUs Ray reserves for it
    providers: list | None = None
    fallback: str = "warn"
    address: str | None = None
    output_format: str = "parquet"
    keep_inputs: bool = False


@dataclass
class Result:
    rows: int
    seconds: float  # from the first read to the last write (Ray's start not included)
    startup_seconds: float
    reports: list  # each actor's (stats.py)
    output: str

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("nan")


def run(model: str, input_path: str, output_path: str, settings: Settings) -> Result:
    from . import Predictor, model_ref, require_ray

    ray = require_ray("glassrt batch")
    check_settings(model, settings)
    t0 = time.perf_counter()
    started_here = not ray.is_initialized()
    if started_here:
        # address None: RAY_ADDRESS if set, else a local Ray on this machine
        ray.init(address=settings.address, include_dashboard=False, log_to_driver=True)
    startup = time.perf_counter() - t0
    context = ray.data.DataContext.get_current()
    saved = _configure(context)
    try:
        t0 = time.perf_counter()
        ds = read(ray, input_path)
        rows = ds.count()  # Parquet metadata, .npy headers: no data read
        run_key = f"batch-{uuid.uuid4().hex[:12]}"
        out = ds.map_batches(
            Predictor, batch_format="numpy", batch_size=settings.batch_size,
            compute=ray.data.ActorPoolStrategy(size=settings.concurrency), num_cpus=settings.threads,
            fn_constructor_kwargs={"model": model_ref(model), "providers": settings.providers,
                                   "inputs": settings.columns or None, "threads": settings.threads,
                                   "fallback": settings.fallback, "keep_inputs": settings.keep_inputs,
                                   "run": run_key, "name": Path(model).name})
        rows = write(out, output_path, settings.output_format, rows)
        seconds = time.perf_counter() - t0
        from .stats import clear, collected

        reports = collected(run_key)
        clear(run_key)
    except Exception as e:  # Ray wraps an actor's error in its own types: show glassrt's own
        found = glassrt_error(e)
        if found is not None and found is not e:
            raise found from None
        raise
    finally:
        context.execution_options.preserve_order = saved.pop("preserve_order")
        for name, value in saved.items():
            setattr(context, name, value)
        if started_here:
            ray.shutdown()
    return Result(rows, seconds, startup, reports, output_path)


def _configure(context) -> dict:
    """Set what `glassrt batch` needs on Ray Data's context; returns the old values."""
    saved = {"preserve_order": context.execution_options.preserve_order}
    context.execution_options.preserve_order = True  # row i out is row i in (the .npy output relies on it)
    if hasattr(context, "enable_rich_progress_bars"):  # Ray's bars drawn with rich (a glassrt dependency)
        saved["enable_rich_progress_bars"] = context.enable_rich_progress_bars
        context.enable_rich_progress_bars = True
    if hasattr(context, "use_datasource_v2"):
        # Ray 2.5x's file reader v2 lists the files in a task of 1 CPU that cannot start while
        # the actors hold every CPU (2 actors on 2 CPUs: the run hangs, measured with Ray
        # 2.60); the v1 reader has no such step, and its reads take no CPU (_no_cpu).
        saved["use_datasource_v2"] = context.use_datasource_v2
        context.use_datasource_v2 = False
    return saved


# Reading Parquet/.npy and writing Parquet are I/O next to the model's compute: they take
# no CPU from Ray's budget, which then goes whole to the actors (and cannot starve them).
def _no_cpu(fn) -> dict:
    """fn's keyword for 0 CPUs: num_cpus= where it has one (Ray 2.5x deprecates
    ray_remote_args there), else ray_remote_args= (older Ray)."""
    import inspect

    return {"num_cpus": 0} if "num_cpus" in inspect.signature(fn).parameters else {"ray_remote_args": {"num_cpus": 0}}


def check_settings(model: str, settings: Settings) -> None:
    """What can be refused before Ray starts: the model's inputs and the column mapping."""
    if settings.batch_size < 1 or settings.concurrency < 1 or settings.threads < 1:
        raise InvalidArgumentError("--batch-size, --concurrency and --threads must be at least 1")
    if settings.output_format not in ("parquet", "npy"):
        raise InvalidArgumentError(f"output format must be 'parquet' or 'npy', got {settings.output_format!r}")
    proto, _ = read_model(model)
    initializers = {t.name for t in proto.graph.initializer}
    names = [i.name for i in proto.graph.input if i.name not in initializers]
    unknown = [i for i in settings.columns.values() if i not in names]
    if unknown:
        raise InvalidArgumentError(f"--input-column names model input(s) {unknown}, which the model does not "
                                   f"have; its inputs: {names}")


def read(ray, path: str):
    """A Ray dataset of the Parquet or .npy input."""
    if "://" in path:
        return ray.data.read_parquet(path, **_no_cpu(ray.data.read_parquet))
    p = Path(path)
    if not p.exists():
        raise InvalidArgumentError(f"--input '{path}' does not exist")
    if p.is_dir():
        npys = sorted(p.glob("*.npy"))
        if npys and not any(p.glob("*.parquet")):
            return read_npy_folder(ray, npys)
        if not any(p.rglob("*.parquet")):
            raise InvalidArgumentError(f"--input folder '{path}' holds neither .npy nor .parquet files")
    elif p.suffix == ".npy":
        return read_npy_folder(ray, [p])
    return ray.data.read_parquet(str(p), **_no_cpu(ray.data.read_parquet))


def read_npy_folder(ray, files: list[Path]):
    """One column per NAME.npy (rows along axis 0). Row ids go out as in-memory blocks of
    ROWS_PER_BLOCK; a task of 0 CPUs (see _no_cpu) reads their rows from every file,
    memory-mapped. (Ray's read_numpy makes one dataset per file, to be zipped, and its
    read tasks take a CPU each.) On a cluster the folder must be on every node."""
    shapes = {f.stem: np.load(f, mmap_mode="r").shape for f in files}  # the headers only
    counts = {shape[0] if shape else None for shape in shapes.values()}
    if len(counts) != 1 or None in counts:
        raise InvalidArgumentError("the .npy files must hold the same number of rows (first dim): "
                                   + ", ".join(f"{n}.npy {list(s)}" for n, s in shapes.items()))
    (rows,) = counts
    paths = {f.stem: str(f.resolve()) for f in files}

    def load(batch):
        ids = batch["data"]
        return {name: np.asarray(np.load(path, mmap_mode="r")[ids]) for name, path in paths.items()}

    blocks = np.array_split(np.arange(rows), max(1, -(-rows // ROWS_PER_BLOCK)))
    return ray.data.from_numpy(blocks).map_batches(load, batch_format="numpy", batch_size=None, num_cpus=0)


ROWS_PER_BLOCK = 1024


def write(ds, path: str, output_format: str, rows: int) -> int:
    """Write the dataset of `rows` rows (as many as the input: the Predictor maps rows one
    to one); returns the rows written. Parquet: Ray's writer, a folder of files. npy: the
    batches streamed on the driver into one memory-mapped NAME.npy per column."""
    if output_format == "parquet":
        ds.write_parquet(path, **_no_cpu(ds.write_parquet))
        import pyarrow.parquet as pq

        return sum(pq.ParquetFile(f).metadata.num_rows for f in Path(path).rglob("*.parquet"))
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    files, done = {}, 0
    for batch in ds.iter_batches(batch_format="numpy", batch_size=None):
        n = 0
        for name, values in batch.items():
            if values.dtype == object:
                raise InvalidArgumentError(f"column '{name}' holds Python objects (strings, ragged rows), which "
                                           f"a .npy file cannot hold without pickle: use --format parquet")
            if name not in files:
                files[name] = np.lib.format.open_memmap(folder / f"{name.replace('/', '_')}.npy", mode="w+",
                                                        dtype=values.dtype, shape=(rows, *values.shape[1:]))
            n = len(values)
            files[name][done:done + n] = values
        done += n
    for f in files.values():
        f.flush()
    if done != rows:
        raise GlassrtError(f"wrote {done} rows, expected {rows} (one per input row)")
    return done


def glassrt_error(e: BaseException) -> GlassrtError | None:
    """The GlassrtError an actor raised, or None. Ray Data wraps a UDF's exception in a
    UserCodeException and sends it to the driver as a RayTaskError whose chain no longer
    holds the original (only its traceback text does, Ray 2.5x): so the chain is searched
    first, then the text for the last 'glassrt.module.SomeError: message' line, rebuilt as
    that class (looked up in glassrt's own modules only)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, GlassrtError) and not type(e).__module__.startswith("ray."):
            return e
        found = _from_text(str(e))
        if found is not None:
            return found
        e = getattr(e, "cause", None) or e.__cause__ or e.__context__
    return None


_RAISED = re.compile(r"^(glassrt(?:\.\w+)+)\.(\w+): (.*?)(?:\n\n|\Z)", re.M | re.S)


def _from_text(text: str) -> GlassrtError | None:
    found = _RAISED.findall(text)
    if not found:
        return None
    module, name, message = found[-1]
    cls = getattr(sys.modules.get(module), name, None)
    cls = cls if isinstance(cls, type) and issubclass(cls, GlassrtError) else GlassrtError
    try:
        return cls(message.strip())
    except TypeError:
        return GlassrtError(message.strip())


def render(result: Result, console) -> None:
    """The summary: totals, each actor's share, every distinct fallback."""
    from rich.markup import escape
    from rich.table import Table

    from .stats import summarize

    total = summarize(result.reports)
    console.print(f"[bold]{result.rows}[/] rows in {result.seconds:.2f} s: [bold]{result.rows_per_second:.1f}[/] "
                  f"rows/s on {total['actors']} actor(s), {total['batches']} batches, {total['plans_built']} "
                  f"plan(s) built (Ray started in {result.startup_seconds:.1f} s, not counted) -> "
                  f"{escape(result.output)}", highlight=False)
    # run s: time inside session.run; start s: the session's creation; plans: built (one per batch shape)
    table = Table(title="actors", title_justify="left")
    for col in ("actor", "node", "threads", "rows", "batches", "plans", "run s", "start s", "fallbacks"):
        table.add_column(col, justify="left" if col in ("actor", "node") else "right")
    for r in result.reports:
        table.add_row(r["actor"][:8], r["node"], str(r["threads"]), str(r["rows"]), str(r["batches"]),
                      str(r["plans_built"]), f"{r['run_seconds']:.2f}", f"{r['session_seconds']:.2f}",
                      str(len(r["fallbacks"])))
    console.print(table)
    if any(r["row_by_row"] for r in result.reports):
        console.print("note: the model's inputs have a static batch dim of 1: each actor ran its batches row by row")
    if total["fallbacks"]:
        console.print(f"[yellow]fallbacks: {len(total['fallbacks'])}[/]")
        for f in total["fallbacks"]:
            console.print(f"  {escape(f['op'])} node '{escape(f['node'])}' ran on {escape(f['provider'])} "
                          f"(in {f['actors']} actor(s)): {escape(f['reason'])}", highlight=False)
    else:
        console.print("fallbacks: 0")
