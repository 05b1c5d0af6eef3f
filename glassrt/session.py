"""Session: the flow for one model, with onnxruntime's API shape.

load → passes → infer → place happen once, at creation; a plan per input-shape signature
is compiled on first use (select → plan memory → bind) and replayed afterwards. The
stages are runtime/ and passes/; this module only strings them together. The public
`glassrt.InferenceSession` (api.py) adds the glass-box views on top (`explain`,
`profile`), which live in tools/ and read what this class built.
"""
from __future__ import annotations

import logging
import os
import time
import warnings
from dataclasses import dataclass, field, replace

import numpy as np

from . import dtypes, onnx_io, symbolic, weights
from .errors import (FallbackError, GlassrtError, InputShapeError, InputTypeError, InvalidArgumentError,
                      MissingInputError, UnknownInputError, UnknownOutputError, UnsupportedOperatorError)
from .ir import MapType, OptionalType, SequenceType, TensorType
from .kernels.cpu._jit import run_started, warm_numba_soon
from .kernels.onednn import preload as onednn_preload
from .passes import run_passes
from .passes.cache_concat import cache_inputs
from .runtime import providers as providers_mod
from .runtime.infer import infer_symbolic, subgraph_memo
from .runtime.gc_pause import gc_paused
from .io_binding import IOBinding
from .runtime import run_guard
from .runtime.options import RunOptions, SessionOptions
from .runtime.placement import place, unsupported_error
from .runtime.profiling import Profile
from .runtime.runner import GraphRunner
from .runtime.validate import check_nodes

log = logging.getLogger("glassrt")


class FallbackWarning(UserWarning):
    """A node runs on a later provider than the first in the priority list."""


@dataclass
class NodeArg:
    """Like onnxruntime's NodeArg: name, shape (ints, strings for symbolic dims, None), type."""

    name: str
    shape: list
    type: str

    def __repr__(self):
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


def _node_arg(name, t) -> NodeArg:
    if isinstance(t, TensorType):
        shape = None if t.shape is None else [
            d if isinstance(d, int) else (None if str(d).startswith("unk__") else str(d)) for d in t.shape]
        return NodeArg(name, shape, dtypes.ort_type_string(t.dtype))
    if isinstance(t, SequenceType):
        inner = _node_arg(name, t.elem).type if t.elem is not None else "unknown"
        return NodeArg(name, [], f"seq({inner})")
    if isinstance(t, OptionalType):
        inner = _node_arg(name, t.elem).type if t.elem is not None else "unknown"
        return NodeArg(name, [], f"optional({inner})")
    if isinstance(t, MapType):
        # onnxruntime: map(int64,tensor(float)), the key as a bare element type.
        inner = _node_arg(name, t.value).type if t.value is not None else "unknown"
        return NodeArg(name, [], f"map({dtypes.ort_type_string(t.key)[len('tensor('):-1]},{inner})")
    return NodeArg(name, None, "unknown")


def _refine(declared, inferred):
    if declared is None:
        return inferred
    if not isinstance(declared, TensorType) or not isinstance(inferred, TensorType) or inferred.dtype != declared.dtype:
        return declared
    if declared.shape is None:
        return inferred
    if inferred.shape is None or len(inferred.shape) != len(declared.shape):
        return declared
    unnamed = lambda d: not isinstance(d, int) and str(d).startswith("unk__")  # noqa: E731
    return TensorType(declared.dtype, tuple(i if unnamed(d) else d for d, i in zip(declared.shape, inferred.shape)))


class _Unrunnable:
    """The runner of a session made with unsupported="mark" that holds a node no provider
    runs: whatever needs to run it (run, profile, memory stats) gets the creation error."""

    def __init__(self, error: UnsupportedOperatorError):
        self._message = str(error)

    def __getattr__(self, name):
        raise UnsupportedOperatorError(self._message)


@dataclass(frozen=True)
class ModelMeta:
    """The model's metadata, as onnxruntime's ModelMetadata has it."""
    producer_name: str = ""
    graph_name: str = ""
    domain: str = ""
    description: str = ""
    graph_description: str = ""
    version: int = 0
    custom_metadata_map: dict = field(default_factory=dict)


class Session:
    """Session(model, sess_options_or_providers=None, providers=None, *, fallback="warn", sess_options=None)

    model: a path, bytes or onnx.ModelProto. The second argument is onnxruntime's
    sess_options (a SessionOptions) or a providers list. providers: priority list, default
    providers.DEFAULT (onednn where installed, cpu, reference). fallback: "warn" (a node
    that passes the complete cpu provider runs on a later one: warn once per node, count
    it), "error" (raise FallbackError at creation listing every such node) or "silent" (as
    "warn", without the warnings: the fallbacks are still in sess.fallbacks). A node can
    also fall back in a plan, when the complete provider placement chose refuses the plan's
    concrete shapes (a partial one, onednn, refusing them is its design, as at placement):
    warned of and listed in sess.fallbacks when the plan is made; with "error" that run
    raises FallbackError.
    unsupported: "error" (a node no provider can run raises UnsupportedOperatorError at
    creation) or "mark" (for explain: the session is made, that node is explained with the
    reason, and running the session raises the error instead).
    """

    @gc_paused()  # (see runtime/gc_pause.py)
    @subgraph_memo()  # (bodies' inferred types kept while the session is made: runtime/infer.py)
    def __init__(self, model, options_or_providers=None, providers=None, *, fallback: str = "warn",
                 sess_options: SessionOptions | None = None, base_dir: str | None = None,
                 unsupported: str = "error", provider_options: list | None = None):
        # The second positional argument is onnxruntime's sess_options or glassrt's providers.
        if isinstance(options_or_providers, SessionOptions):
            if sess_options is not None:
                raise InvalidArgumentError("SessionOptions given twice (second argument and sess_options=)")
            sess_options = options_or_providers
        elif options_or_providers is not None:
            if providers is not None:
                raise InvalidArgumentError("providers given twice (second argument and providers=)")
            providers = options_or_providers
        if providers is not None and not isinstance(providers, (list, tuple)):
            raise GlassrtError(f"providers must be a list of provider names, got {type(providers).__name__} "
                               "(glassrt takes glassrt.SessionOptions, not onnxruntime's)")
        if provider_options is not None:  # onnxruntime's parallel list: one options dict per provider
            if providers is None or len(provider_options) != len(providers) or \
                    any(isinstance(p, tuple) for p in providers):
                raise InvalidArgumentError("provider_options must be a list with one options dict per entry of "
                                           "providers (names, not (name, options) pairs), as onnxruntime takes it")
            providers = [(p, o) for p, o in zip(providers, provider_options)]
        if fallback not in ("warn", "error", "silent"):
            raise InvalidArgumentError(f"fallback must be 'warn', 'error' or 'silent', got {fallback!r}")
        if unsupported not in ("error", "mark"):
            raise InvalidArgumentError(f"unsupported must be 'error' or 'mark', got {unsupported!r}")
        self.options = sess_options or SessionOptions()
        self.notes: list[str] = []  # what explain should say about this session's setup
        _apply_threads(self.options.intra_op_num_threads, self.notes)
        if providers_mod.wants_onednn(providers):
            onednn_preload.start()  # oneDNN's library loads on another core while the model is read
        t0 = time.perf_counter()
        self.graph = onnx_io.load(model, base_dir)
        check_nodes(self.graph)
        self._loaded_weights = weights.as_loaded(self.graph)  # for explain: mapped / copied / transformed
        self._source = (model, base_dir)
        self.timings = {"load": time.perf_counter() - t0}
        self.providers = providers_mod.make(providers, self.notes)
        # passes → infer → place: each stage a function of the one before (see DESIGN.md).
        t0 = time.perf_counter()
        self.graph, found, self.passes = run_passes(self.graph, self.options, self.providers, infer_symbolic)
        self.timings["passes"] = time.perf_counter() - t0
        self.pass_log = [c for r in self.passes for c in r.changes]
        if self.options.optimized_model_filepath:
            from .export import write_model

            write_model(self.graph, self.options.optimized_model_filepath, passes=self.passes,
                        level=self.options.graph_optimization_level,
                        source=str(model) if isinstance(model, (str, os.PathLike)) else None)
        self.expansions, self.folded = found.expansions, found.folded
        self._expansion_failures = found.expansion_failures
        t0 = time.perf_counter()
        inference = found.final_inference or infer_symbolic(self.graph, reuse=found.first_inference)
        self.notes += list(inference.problems.values())
        self.placement = place(self.graph, inference, self.providers, expansion_failures=self._expansion_failures,
                               mark_unsupported=unsupported == "mark")
        self.timings["infer_and_place"] = time.perf_counter() - t0
        self._fallback = fallback
        self._placed_fallbacks, self._plan_fallbacks = self.placement.fallbacks, {}
        if self._placed_fallbacks and fallback == "error":
            raise FallbackError(
                f"{len(self._placed_fallbacks)} node(s) would fall back from '{self.providers[0].name}':\n"
                + "\n".join(f"  {f}" for f in self._placed_fallbacks))
        if fallback == "warn":
            for f in self._placed_fallbacks:
                warnings.warn(f"glassrt fallback: {f}", FallbackWarning, stacklevel=2)
        openmp_pool = any(p.openmp_pool for p in self.providers)
        if openmp_pool:
            self.notes.append("threads: OpenMP's pool alone (oneDNN's kernels, and the cpu kernels' float32 "
                              "matrix products through oneDNN's sgemm); NumPy's BLAS is held at 1 thread "
                              "during runs of plans that may call it, so that two pools of spinning workers "
                              "do not share the cores (a plan of oneDNN's kernels alone leaves it as it is)"
                              + (f"; {onednn_preload.spin_policy}" if onednn_preload.spin_policy else ""))
        if self.placement.unsupported:  # unsupported="mark": explainable, not runnable
            self.runner = _Unrunnable(unsupported_error(self.placement.unsupported, self.providers))
        else:
            self.runner = GraphRunner(self.placement, self.options, adapt_threads=True, openmp_pool=openmp_pool,
                                      blas_providers=frozenset(p.name for p in self.providers if p.numpy_blas),
                                      on_fallbacks=self._plan_fell_back)
        if any(k.warms_numba for d in self.placement.all_decisions() if d.provider for k in d.kernels):
            warm_numba_soon()  # (a kernel that will need Numba: its load starts now, on its thread: _jit)
        self._inputs = [v for v in self.graph.inputs if v.name not in self.graph.initializers]
        # what each run checks its feeds against, worked out once (a decode step feeds 25
        # tensors: per dim, a fixed size, a named symbol or nothing to check)
        self._declared = {v.name: v for v in self._inputs}
        self._overridable = self.graph.overridable()
        self._dims = {v.name: _dim_checks(v.type) for v in self._inputs}
        # {name: (dtype, dims)} where every input is a tensor of known rank: feeds that are
        # plain arrays of those types pass in one pass (_as_declared); None: the full checks
        self._plain = {v.name: (v.type.dtype, self._dims[v.name]) for v in self._inputs} if all(
            self._dims[v.name] is not None and v.type.dtype != object for v in self._inputs) else None
        # inputs a run takes strided (a KV cache's past: a view of the buffer the kernel
        # appends into, passes/cache_concat.py); every other input is made C-contiguous
        self._strided = cache_inputs(self.placement.graph)
        self._lowered = None
        self._profile = Profile()

    @property
    def fallbacks(self) -> list:
        """Every node that runs on a later provider than the first that could run it
        (placement.Fallback): those placement found at creation, then those plans found since,
        where the provider placement chose refused a plan's shapes (a node once per provider,
        with the first plan's shapes)."""
        return [*self._placed_fallbacks, *self._plan_fallbacks.values()]

    def _plan_fell_back(self, plan, shared: bool) -> bool:
        """The runner's on_fallbacks: a new plan runs nodes on a later provider than placement
        chose, the chosen one refusing its shapes. Counted and warned of as placement's
        fallbacks are; with fallback="error" a plan for one shape raises FallbackError (the
        run fails, the session stays usable for other shapes), and a plan shared by several
        shapes is refused, each shape then getting a plan of its own (where the placed
        providers may take every node)."""
        if self._fallback == "error":
            if shared:
                return False
            raise FallbackError(
                f"{len(plan.fallbacks)} node(s) would fall back from the provider placement chose for "
                f"{plan.fallbacks[0].shapes or 'these inputs'} (fallback='error'):\n"
                + "\n".join(f"  {f}" for f in plan.fallbacks))
        new = [f for f in plan.fallbacks if (f.node, f.provider) not in self._plan_fallbacks]
        for f in new:
            self._plan_fallbacks[(f.node, f.provider)] = f
        if new and self._fallback == "warn":
            shown = "".join(f"\n  {replace(f, shapes='')}" for f in new[:5])
            more = f"\n  ... and {len(new) - 5} more (sess.fallbacks lists them)" if len(new) > 5 else ""
            warnings.warn(f"glassrt fallback: {len(new)} node(s) run on a later provider than placement chose, "
                          f"in the plan {'shared by shapes like' if shared else 'for'} {new[0].shapes}:{shown}{more}",
                          FallbackWarning, stacklevel=2)
        return True

    def lowered_placement(self):
        """The model placed after only the passes it needs to run (level "none"): every node
        as the model wrote it, nothing folded or fused, for gradients. Built on first use
        from the model as given (reloaded, so the session does not hold two copies)."""
        if self._lowered is None:
            from dataclasses import replace

            model, base_dir = self._source
            options = replace(self.options, graph_optimization_level="none")
            graph, found, _ = run_passes(onnx_io.load(model, base_dir), options, self.providers, infer_symbolic)
            self._lowered = place(graph, infer_symbolic(graph), self.providers,
                                  expansion_failures=found.expansion_failures)
        return self._lowered

    # ---------------------------------------------------------------- onnxruntime API

    def get_inputs(self) -> list[NodeArg]:
        return [_node_arg(v.name, v.type) for v in self._inputs]

    def get_outputs(self) -> list[NodeArg]:
        """Declared output types, completed by inference where the model leaves them open."""
        types = self.placement.inference.types
        return [_node_arg(v.name, _refine(v.type, types.get(v.name))) for v in self.graph.outputs]

    @property
    def transfers(self) -> list:
        """Values copied between providers that keep data on different devices."""
        return self.placement.transfers

    def get_modelmeta(self) -> ModelMeta:
        """As onnxruntime's: producer_name, graph_name, domain, description,
        graph_description, version, custom_metadata_map."""
        return ModelMeta(**self.graph.meta)

    def get_session_options(self) -> SessionOptions:
        return self.options

    def get_provider_options(self) -> dict:
        """{provider: the options it was given} (see each provider's OPTIONS)."""
        return {p.name: dict(p.options) for p in self.providers}

    def get_providers(self) -> list[str]:
        return [p.name for p in self.providers]

    def run(self, output_names, input_feed: dict, run_options: RunOptions | None = None) -> list:
        return self._run(output_names, input_feed, run_options)

    def io_binding(self) -> IOBinding:
        """onnxruntime's IOBinding: inputs bound once, outputs written into arrays the caller
        owns (or kept for copy_outputs_to_cpu); run it with run_with_iobinding."""
        return IOBinding(self)

    def run_with_iobinding(self, binding: IOBinding, run_options: RunOptions | None = None) -> None:
        if not isinstance(binding, IOBinding) or binding.session is not self:
            raise InvalidArgumentError("run_with_iobinding takes an IOBinding made by this session's io_binding()")
        names = binding.output_names() or None
        outs = self._run(names, binding.inputs(), run_options, into=binding.bound_arrays())
        binding.set_outputs(names or self.graph.output_names(), outs)

    def _run(self, output_names, input_feed, run_options, into=None) -> list:
        if run_options is not None and not isinstance(run_options, RunOptions):
            raise InvalidArgumentError(f"run_options must be a glassrt.RunOptions, got {type(run_options).__name__}")
        names = self.graph.output_names()
        if isinstance(output_names, (str, bytes)):
            raise InvalidArgumentError(f"output_names must be a list of names or None, not the string "
                                       f"{output_names!r} (did you mean [{output_names!r}]?); the model's "
                                       f"outputs are {names}")
        missing = [n for n in output_names or [] if n not in names]
        if missing:
            raise UnknownOutputError(f"unknown output name(s) {missing}; the model's outputs are {names}")
        feeds = self._check_feeds(input_feed)
        run_started()  # (a second run of a model is when Numba starts loading for its optional compiled loops: _jit)
        if run_options is None and not self.options.enable_profiling:
            outs = self.runner.run(feeds, into=into)  # (no guard: the context manager costs ~1 us a run)
            return outs if not output_names else [outs[names.index(n)] for n in output_names]
        with run_guard.guarded(run_options):
            if self.options.enable_profiling:
                steps, start = [], time.perf_counter()
                outs = self.runner.run(feeds, profile=steps, into=into)
                self._profile.add_run(steps, start, time.perf_counter())
            else:
                outs = self.runner.run(feeds, into=into)
        if not output_names:
            return outs
        return [outs[names.index(n)] for n in output_names]

    # ---------------------------------------------------------------- glass box

    def end_profiling(self, path: str | None = None) -> str:
        """Like onnxruntime's: write the Chrome trace of the runs recorded with
        SessionOptions(enable_profiling=True) and return its path."""
        path = path or f"glassrt_profile_{time.strftime('%Y-%m-%d_%H-%M-%S')}.json"
        self._profile.write_trace(path)
        self._profile = Profile()
        return path

    def gradients(self, input_feed: dict, output: str, wrt: list, grad_output=None) -> list:
        """The gradient of sum(output * grad_output) with respect to each name in `wrt`
        (graph inputs or initializers): a vector-Jacobian product. grad_output defaults to ones."""
        from .runtime.autodiff import gradients

        return gradients(self, input_feed, output, list(wrt), grad_output)

    def memory_stats(self) -> dict:
        return {"plans_cached": len(self.runner.plans), "plans_built": self.runner.plans_built,
                "plans_evicted": self.runner.plans_evicted, "plan_hits": self.runner.plan_hits,
                "runs_with_nan": self.runner.nan_runs,  # (runtime/nan_handling.py)
                "arena_bytes": {str(sig): p.memory.arena_bytes for sig, p in self.runner.plans.items()},
                "pool": self.runner.pool.stats()}

    # ---------------------------------------------------------------- validation

    def _check_feeds(self, input_feed) -> dict:
        if self._plain is not None and _as_declared(input_feed, self._plain, self._strided):
            return dict(input_feed)  # (a copy: the runner may replace entries)
        if not isinstance(input_feed, dict):
            raise InputTypeError(f"feeds must be a dict of input name to array, got {type(input_feed).__name__}")
        declared, overridable = self._declared, self._overridable
        unknown = [n for n in input_feed if n not in declared and n not in overridable]
        if unknown:
            raise UnknownInputError(f"unexpected input name(s) {unknown}; the model's inputs are {list(declared)}")
        missing = [n for n in declared if n not in input_feed]
        if missing:
            raise MissingInputError(f"missing input(s) {missing}: " + ", ".join(
                f"'{n}' ({_node_arg(n, declared[n].type).type} {symbolic.shape_str(getattr(declared[n].type, 'shape', None))})"
                for n in missing))
        feeds, bound = {}, {}
        for name, value in input_feed.items():
            t = declared[name].type if name in declared else TensorType(self.graph.initializers[name].dtype,
                                                                        self.graph.initializers[name].shape)
            feeds[name] = _check_value(name, value, t, bound, self._dims.get(name), name in self._strided)
        return feeds


def _dim_checks(t) -> tuple | None:
    """Per dim of a tensor type's shape: its size (an int), the name of the symbol it is
    (inputs sharing one must agree), or None (an expression or an unnamed dim: unchecked)."""
    if not isinstance(t, TensorType) or t.shape is None:
        return None
    out = []
    for d in t.shape:
        sym = None if isinstance(d, int) else symbolic.symbol_name(d)
        out.append(d if isinstance(d, int) else (sym if sym is not None and not sym.startswith("unk__") else None))
    return tuple(out)


def _as_declared(feeds, plain: dict, strided=frozenset()) -> bool:
    """Whether `feeds` is a dict feeding exactly the declared inputs, each a C-contiguous
    array (any array, for the inputs in `strided`) of its dtype whose dims match (named
    symbols alike across inputs): what nearly every run feeds, checked in one pass (per run,
    so lean: a small model runs in tens of microseconds). False sends the feeds through
    _check_feeds' full checks, which convert what they may and name what is wrong."""
    if type(feeds) is not dict or len(feeds) != len(plain):
        return False
    bound = None
    for name, v in feeds.items():
        p = plain.get(name)
        if p is None or type(v) is not np.ndarray or v.dtype != p[0] or not (v.flags.c_contiguous or name in strided):
            return False
        dims = p[1]
        if len(dims) != v.ndim:
            return False
        for want, got in zip(dims, v.shape):
            if want is None or want == got:
                continue
            if type(want) is int:
                return False
            if bound is None:
                bound = {}
            if bound.setdefault(want, got) != got:
                return False
    return True


def _check_value(name, value, t, bound, dims=None, strided=False):
    if isinstance(t, TensorType):
        if not isinstance(value, np.ndarray):
            if isinstance(value, (list, tuple, int, float, bool, np.generic)):
                python_numbers = not isinstance(value, np.generic)
                value = np.asarray(value)
                # Python numbers (nested lists) take the declared dtype where that keeps
                # their kind (ints or floats into float32); floats into an int input stay an error.
                if (python_numbers and value.dtype != t.dtype and value.dtype.kind in "biuf"
                        and t.dtype.kind in "biuf" and np.can_cast(value.dtype, t.dtype, "same_kind")):
                    value = value.astype(t.dtype)
            else:
                raise InputTypeError(f"input '{name}': expected a NumPy array ({dtypes.ort_type_string(t.dtype)}), "
                                     f"got {type(value).__name__}")
        if value.dtype != t.dtype and not (value.dtype.kind in "US" and t.dtype == object):
            raise InputTypeError(f"input '{name}': expected dtype {dtypes.ort_type_string(t.dtype)}, got "
                                 f"{dtypes.ort_type_string(value.dtype) if value.dtype.kind not in 'V' else value.dtype}")
        if value.dtype.kind in "US":
            value = value.astype(object)
        if t.dtype == object and not all(type(v) is str for v in value.flat):
            # a string input fed bytes, numbers or None: each made its str(), as onnxruntime
            # makes it (kernels would meet them as they are: bytes matched by RegexFullMatch,
            # a TypeError from StringSplit, non-strings returned by Identity)
            value = np.vectorize(str, otypes=[object])(value) if value.size else value
        if t.shape is not None:
            if value.ndim != len(t.shape):
                raise InputShapeError(f"input '{name}': expected rank {len(t.shape)} {symbolic.shape_str(t.shape)}, "
                                      f"got rank {value.ndim} {list(value.shape)}")
            for axis, (want, got) in enumerate(zip(dims or _dim_checks(t), value.shape)):
                if want is None:
                    continue
                if type(want) is int:
                    if want != got:
                        raise InputShapeError(f"input '{name}': dim {axis} must be {want} "
                                              f"({symbolic.shape_str(t.shape)}), got {list(value.shape)}")
                else:  # a named symbol: every input that has it must agree
                    prev = bound.get(want)
                    if prev is not None and prev[0] != got:
                        raise InputShapeError(
                            f"input '{name}': dim {axis} is '{want}', which input '{prev[1]}' set to "
                            f"{prev[0]}; got {got}")
                    bound[want] = (got, name)
        if not value.flags.c_contiguous and not strided:
            value = value.copy(order="C")
        return value
    if isinstance(t, SequenceType):
        if not isinstance(value, (list, tuple)):
            raise InputTypeError(f"input '{name}': expected a sequence (list of arrays), got {type(value).__name__}")
        return [_check_value(f"{name}[{i}]", v, t.elem, {}) if t.elem is not None else v
                for i, v in enumerate(value)]
    if isinstance(t, OptionalType):
        if value is None:
            return None
        return _check_value(name, value, t.elem, bound) if t.elem is not None else value
    if isinstance(t, MapType):
        if not isinstance(value, dict):
            raise InputTypeError(f"input '{name}': expected a map (dict), got {type(value).__name__}")
        want = str if t.key == np.dtype(object) else (int, np.integer)
        bad = next((k for k in value if not isinstance(k, want) or isinstance(k, bool)), None)
        if bad is not None:
            raise InputTypeError(f"input '{name}': expected {'string' if want is str else 'int64'} keys, "
                                 f"got {type(bad).__name__} key {bad!r}")
        return value
    return value


_threads_applied = None


def _apply_threads(n: int, notes: list):
    """Numba's thread limit (process-wide; applied when Numba is imported, see
    kernels/cpu/_jit.py). BLAS and OpenMP threads are set per run, by the
    plan's thread choice (runtime/threads.py). A limit that cannot be applied is logged and
    noted for explain."""
    global _threads_applied
    if not n or n == _threads_applied:
        return
    _threads_applied = n
    try:
        from .kernels.cpu._jit import limit_threads

        limit_threads(n)
    except Exception as e:
        notes.append(f"intra_op_num_threads={n} not applied to Numba: {type(e).__name__}: {e}")
        log.warning(notes[-1])

