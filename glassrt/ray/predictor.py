"""glassrt.ray.Predictor: one glassrt session per Ray Data actor, batches in, columns out.

    ds.map_batches(glassrt.ray.Predictor, batch_format="numpy", batch_size=64, concurrency=2,
                   fn_constructor_kwargs={"model": glassrt.ray.model_ref("m.onnx"),
                                          "inputs": {"pixels": "x"}})

Ray Data builds the class once per actor and calls it per batch, so the session (and its
plans, one per input-shape signature) lives as long as the actor: every batch of a shape
already seen only replays its plan. A model whose inputs all have a static leading dim of
1 (exported for one row) is run row by row on a batch, its per-row outputs stacked.
"""
from __future__ import annotations

import os
import time
from collections.abc import Mapping

import numpy as np

from .. import dtypes
from ..errors import GlassrtError, InputError, InputTypeError, InvalidArgumentError
from . import stats as stats_mod


class BatchColumnError(InputError):
    """A column of a batch cannot feed the model input it is mapped to."""


class BatchOutputError(GlassrtError):
    """A model output cannot become a column (not a tensor, or not one row per input row)."""


class Predictor:
    """Predictor(model, providers=None, inputs=None, outputs=None, *, threads=None,
    fallback="warn", keep_inputs=True, run="default", name=None)

    model: an ObjectRef from glassrt.ray.model_ref (the way on a cluster), bytes, a
    ModelProto or a path readable on every node. providers: the session's provider list
    (names or (name, options) pairs). inputs: {column: model input}; default: each model
    input from the column of the same name. outputs: None (every output, as a column of
    its own name), a list of output names, or {output: column}. threads: the session's
    intra_op_num_threads; default: the CPUs Ray assigned to the actor (map_batches'
    num_cpus, 1 unless given). keep_inputs: keep the columns fed to the model in the
    output batch (other columns are always kept). run: the key this actor's report is
    filed under (see stats.py); name: the model's name in it.
    """

    def __init__(self, model, providers=None, inputs: Mapping | None = None, outputs=None, *,
                 threads: int | None = None, fallback: str = "warn", keep_inputs: bool = True,
                 run: str = "default", name: str | None = None):
        import ray

        from ..api import InferenceSession
        from ..runtime.options import SessionOptions
        from .model import resolve

        data, default_name = resolve(model)
        if threads is None:
            threads = max(1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1)))
        t0 = time.perf_counter()
        self.session = InferenceSession(data, providers=list(providers) if providers else None, fallback=fallback,
                                        sess_options=SessionOptions(intra_op_num_threads=threads))
        created = time.perf_counter() - t0
        self.columns = column_map(self.session, inputs)
        self.outputs = output_map(self.session, outputs)
        self.keep_inputs = keep_inputs
        self.row_by_row = one_row_model(self.session)
        self._run = run
        self._actor = ray.get_runtime_context().get_actor_id() or f"pid-{os.getpid()}"
        self._collector = stats_mod.collector()
        self._report = {
            "actor": self._actor, "node": ray.util.get_node_ip_address(), "pid": os.getpid(),
            "model": name or default_name, "providers": self.session.get_providers(), "threads": threads,
            "row_by_row": self.row_by_row, "session_seconds": round(created, 4),
            "fallbacks": [{"node": f.node, "op": f.op, "provider": f.provider, "reason": f.reason}
                          for f in self.session.fallbacks],
            "rows": 0, "batches": 0, "run_seconds": 0.0}
        self._send()

    def __call__(self, batch):
        if not isinstance(batch, Mapping):
            raise InvalidArgumentError(f"glassrt.ray.Predictor takes numpy batches (map_batches(..., "
                                       f"batch_format='numpy')), got a {type(batch).__name__}")
        feeds, rows = self._feeds(batch)
        t0 = time.perf_counter()
        try:
            results = self._predict(feeds, rows)
        except InputError as e:  # a check of the session's: say which columns fed it
            raise BatchColumnError(f"{e} (inputs fed from columns: "
                                   + ", ".join(f"'{c}' -> '{i}'" for c, i in self.columns.items()) + ")") from e
        elapsed = time.perf_counter() - t0
        out = {k: v for k, v in batch.items() if self.keep_inputs or k not in self.columns}
        for output, column in self.outputs.items():
            if column in out:
                raise BatchColumnError(f"output '{output}' would overwrite the batch's column '{column}'; "
                                       f"map it to another name (outputs={{'{output}': 'new_name'}})")
            out[column] = results[output]
        self._report["rows"] += rows
        self._report["batches"] += 1
        self._report["run_seconds"] = round(self._report["run_seconds"] + elapsed, 4)
        self._send()
        return out

    @staticmethod
    def stats(run: str = "default") -> list[dict]:
        """Every actor's latest report for `run` (read on the driver, after the dataset ran):
        actor, node, pid, model, providers, threads, fallbacks [{node, op, provider,
        reason}], plans_built/plans_cached/plans_evicted, rows, batches, run_seconds."""
        return stats_mod.collected(run)

    # ------------------------------------------------------------------ internals

    def _send(self):
        import ray

        memory = self.session.memory_stats()
        self._report.update(plans_built=memory["plans_built"], plans_cached=memory["plans_cached"],
                            plans_evicted=memory["plans_evicted"])
        ray.get(self._collector.record.remote(self._run, self._actor, dict(self._report)))

    def _feeds(self, batch) -> tuple[dict, int]:
        declared = {a.name: a for a in self.session.get_inputs()}
        feeds, rows = {}, None
        for column, name in self.columns.items():
            if column not in batch:
                raise BatchColumnError(f"model input '{name}' reads column '{column}', which the batch lacks; "
                                       f"its columns: {sorted(batch)}")
            value = as_tensor(column, batch[column])
            want = declared[name]
            if value.ndim == 0:
                raise BatchColumnError(f"column '{column}' holds one value, not a column of rows")
            rows = rows if rows is not None else len(value)
            if self.row_by_row:
                # per row: [1, ...] as the model declares it
                value_rank = value.ndim
                if want.shape is not None and value_rank != len(want.shape):
                    raise BatchColumnError(f"column '{column}' -> input '{name}': the model takes one row at "
                                           f"a time, shape {want.shape}; rows of this column have shape "
                                           f"{list(value.shape[1:])}")
            elif want.shape is not None and value.ndim != len(want.shape):
                raise BatchColumnError(f"column '{column}' -> input '{name}': expected rank {len(want.shape)} "
                                       f"{want.shape} (rows first), got rank {value.ndim} {list(value.shape)}")
            got = dtypes.ort_type_string(value.dtype) if value.dtype.kind not in "OUS" else "tensor(string)"
            if got != want.type and want.type.startswith("tensor("):
                raise BatchColumnError(f"column '{column}' -> input '{name}': expected {want.type}, got {got} "
                                       f"(cast the column, e.g. in a map_batches before this one)")
            feeds[name] = value
        return feeds, rows or 0

    def _predict(self, feeds: dict, rows: int) -> dict:
        names = list(self.outputs)
        if not self.row_by_row:
            results = dict(zip(names, self.session.run(names, feeds)))
            for output, value in results.items():
                check_rows(output, value, rows)
            return results
        per_row = [self.session.run(names, {k: v[i:i + 1] for k, v in feeds.items()}) for i in range(rows)]
        results = {}
        for j, output in enumerate(names):
            values = [r[j] for r in per_row]
            for v in values:
                check_rows(output, v, None)
            # [1, ...] per row (the model's own batch dim) is joined on it; otherwise stacked
            lead_one = all(v.ndim >= 1 and v.shape[0] == 1 for v in values)
            results[output] = np.concatenate(values) if lead_one else np.stack(values)
        return results


def column_map(session, inputs: Mapping | None) -> dict:
    """{column: model input}, every model input fed exactly once."""
    names = [a.name for a in session.get_inputs()]
    if inputs is None:
        return {n: n for n in names}
    if not isinstance(inputs, Mapping):
        raise InvalidArgumentError(f"inputs must map column names to model inputs, got {type(inputs).__name__}")
    unknown = [i for i in inputs.values() if i not in names]
    if unknown:
        raise InvalidArgumentError(f"inputs maps columns to {unknown}, which the model does not have; "
                                   f"its inputs: {names}")
    fed = list(inputs.values())
    twice = sorted({i for i in fed if fed.count(i) > 1})
    if twice:
        raise InvalidArgumentError(f"model input(s) {twice} mapped from more than one column")
    # inputs not named in the mapping read the column of their own name
    return {**dict(inputs), **{n: n for n in names if n not in fed}}


def output_map(session, outputs) -> dict:
    """{model output: column}."""
    names = [a.name for a in session.get_outputs()]
    if outputs is None:
        mapping = {n: n for n in names}
    elif isinstance(outputs, Mapping):
        mapping = dict(outputs)
    elif isinstance(outputs, (list, tuple)):
        mapping = {n: n for n in outputs}
    else:
        raise InvalidArgumentError(f"outputs must be None, a list of output names or {{output: column}}, got "
                                   f"{type(outputs).__name__}")
    unknown = [n for n in mapping if n not in names]
    if unknown:
        raise InvalidArgumentError(f"outputs names {unknown}, which the model does not have; its outputs: {names}")
    return mapping


def one_row_model(session) -> bool:
    """Every input has a static leading dim of 1: the model takes one row per run."""
    shapes = [a.shape for a in session.get_inputs()]
    return bool(shapes) and all(s and s[0] == 1 for s in shapes)


def as_tensor(column: str, value) -> np.ndarray:
    """A batch column as one array: Ray gives a list-typed Parquet column (each row an array)
    as an object array of arrays; rows of one shape are stacked, ragged rows are refused."""
    value = np.asarray(value)
    if value.dtype == object and value.size and isinstance(value.flat[0], np.ndarray):
        shapes = {v.shape for v in value}
        if len(shapes) > 1:
            raise BatchColumnError(f"column '{column}': its rows have different shapes {sorted(shapes)[:4]}; a "
                                   f"model input needs one shape per batch")
        dts = {v.dtype for v in value}
        if len(dts) > 1:
            raise InputTypeError(f"column '{column}': its rows have different dtypes {sorted(map(str, dts))}")
        value = np.stack(list(value))
    return value


def check_rows(output: str, value, rows: int | None) -> None:
    if not isinstance(value, np.ndarray):
        raise BatchOutputError(f"output '{output}' is a {type(value).__name__}; only tensor outputs become columns "
                           f"(leave it out with outputs=[...])")
    if rows is not None and (value.ndim == 0 or value.shape[0] != rows):
        raise BatchOutputError(f"output '{output}' has shape {list(value.shape)}, not one row per input row "
                              f"({rows}): it cannot become a column")
