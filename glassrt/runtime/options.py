"""Session options: the knobs a user can turn, with their defaults in one place."""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import InvalidArgumentError


def _default_memory_limit() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 0.8)
    except (ValueError, OSError, AttributeError):
        return 16 << 30


# onnxruntime's SessionOptions that glassrt does not have, and why (or what to use instead).
_NOT_HERE = {
    "execution_mode": "glassrt runs nodes in order (ORT_SEQUENTIAL)",
    "log_severity_level": "glassrt reports through Python warnings and explain, not log levels",
    "log_verbosity_level": "glassrt reports through Python warnings and explain, not log levels",
    "logid": "glassrt has no logger ids",
    "enable_cpu_mem_arena": "glassrt always plans an arena per plan (memory_limit_bytes caps it)",
    "enable_mem_pattern": "glassrt's memory plan is always on",
    "enable_mem_reuse": "glassrt's memory plan is always on",
    "use_deterministic_compute": "see adaptive_threads (False: bit-identical runs)",
    "profile_file_prefix": "end_profiling(path) takes the file name",
    "execution_order": "glassrt runs nodes in the model's topological order",
}


NAN_HANDLING = ("auto", "exact", "fast")


@dataclass
class SessionOptions:
    # Threads for BLAS and Numba (0: leave the process's setting alone). Process-wide.
    intra_op_num_threads: int = 0
    # Let each plan run on one thread instead while that is measured faster (another process
    # holds the cores; runtime/threads.py). oneDNN's products and convolutions may sum in
    # another order on another thread count, so outputs can then differ in the last bits
    # from one run to the next; False: always intra_op_num_threads, bit-identical runs.
    adaptive_threads: bool = True
    # Compiled plans kept per session, one per input-shape signature (least recently used
    # evicted first), so that varying shapes cannot grow memory without bound.
    plan_cache_size: int = 8
    # ...and at most this many arena bytes among the cached plans (the newest plan is
    # always kept, however big). 0: no byte limit.
    plan_cache_bytes: int = 1 << 30
    # After this many distinct input shapes of one structure (a KV cache growing per decode
    # step, variable sequence lengths), a new shape runs on a plan compiled once with the
    # varying dims symbolic instead of a plan compiled for it; a shape seen twice still
    # gets its own plan. 0: always compile per shape.
    generalize_after: int = 3
    # Time every eligible kernel on the first plan for a shape and keep the fastest.
    autotune: bool = False
    autotune_cache: str | None = None  # JSON file that keeps autotune winners across runs
    # Which graph passes run (passes/__init__.py): "none" (only what the graph needs to run
    # at all), "basic" (dead code, constant folding, BatchNorm/Mul/Add into Conv weights),
    # "extended" (+ fusions into glassrt's fused ops), "all" (+ layout passes). onnxruntime's
    # GraphOptimizationLevel names and numbers are accepted too.
    graph_optimization_level: str = "all"
    # Evaluate nodes whose inputs are all known: once per session for constants, once per
    # plan for values that follow from the input shapes.
    constant_folding: bool = True
    # The folding and fusion passes of the "basic" and "extended" levels that rewrite ops.
    fusion: bool = True
    # The largest value constant folding materialises (a folded value lives as long as the
    # session or plan); bigger ones are computed when the plan runs.
    fold_limit_bytes: int = 1 << 30
    # Refuse a plan whose arena, or a tensor, would exceed this many bytes.
    memory_limit_bytes: int = 0  # 0: 80% of physical memory
    # Check every output a kernel allocates itself against its op's meta (shape, dtype).
    check_outputs: bool = True
    # Record a per-node timing profile on every run (see Session.profile()).
    enable_profiling: bool = False
    # Write the graph after the passes to this path at session creation (export.py): standard
    # ONNX, glassrt's fused ops as model-local functions; "" writes nothing. The model's own
    # path is refused. `glassrt optimize` does the same with more choices (external data, dims).
    optimized_model_filepath: str = ""
    # onnxruntime's: glassrt runs one node at a time, so 0 (default) or 1 only.
    inter_op_num_threads: int = 0
    # NaN and Inf as the reference computes them. Some fast kernels lose them (oneDNN's relu
    # and clip are max/min instructions that turn NaN into the bound; Winograd's transforms
    # turn one Inf into a tile of NaN): Kernel.drops_nan. "auto": a run whose float inputs
    # hold a NaN or an Inf runs on a plan without such kernels (built when first needed; a
    # fused op's kernel there binds without the activation, which NumPy applies after it:
    # runtime/nan_handling.py), others on the fast one; a NaN made inside the model from
    # finite inputs (0/0, an overflow) can still be lost. "exact": never such kernels.
    # "fast": always the fast kernels, inputs unchecked.
    nan_handling: str = "auto"

    def __setattr__(self, name, value):
        # Every option works or is refused by name: a setting that silently did nothing
        # (onnxruntime's optimized_model_filepath, say) would mislead.
        if name not in self.__dataclass_fields__:
            why = _NOT_HERE.get(name, "no such option")
            raise InvalidArgumentError(f"SessionOptions has no option {name!r}: {why}; the options are "
                                       f"{', '.join(self.__dataclass_fields__)}")
        if name == "nan_handling" and value not in NAN_HANDLING:
            raise InvalidArgumentError(f"nan_handling={value!r}: one of {', '.join(NAN_HANDLING)}")
        if name == "inter_op_num_threads" and int(value) > 1:
            raise InvalidArgumentError(f"inter_op_num_threads={value}: glassrt runs one node at a time (0 or 1); "
                                       f"intra_op_num_threads sets the threads each node uses")
        object.__setattr__(self, name, value)

    def memory_limit(self) -> int:
        return self.memory_limit_bytes or _default_memory_limit()


# onnxruntime's RunOptions that glassrt does not have, and why.
_RUN_NOT_HERE = {
    "only_execute_path_to_fetches": "glassrt's plan computes what its outputs need once per plan; a run "
                                    "of part of a plan would need a plan of its own (run with output_names "
                                    "to receive fewer outputs)",
    "training_mode": "glassrt runs inference; Session.gradients computes gradients",
}


@dataclass
class RunOptions:
    """Options for one run (Session.run(..., run_options)), as onnxruntime's RunOptions.

    terminate: set it (from any thread) to stop the runs using these options: each stops
    before its next node (and before each iteration of a Loop's body) with
    RunTerminatedError; runs started while it is set stop at once. A kernel already running
    finishes first.
    time_budget_s: glassrt's own: a run that takes longer stops the same way, with
    RunTimeoutError naming the node it reached (0: no budget). Stops a runaway Loop.
    log_severity_level: 0 verbose ... 4 fatal, as onnxruntime's. 0 logs each node as it
    runs (logger "glassrt.run", with logid; log_verbosity_level >= 1 adds the shapes);
    3 and 4 silence NumPy's floating-point warnings (overflow, invalid value) for the run.
    """

    terminate: bool = False
    time_budget_s: float = 0.0
    log_severity_level: int = 2
    log_verbosity_level: int = 0
    logid: str = ""

    def __setattr__(self, name, value):
        if name not in self.__dataclass_fields__:
            why = _RUN_NOT_HERE.get(name, "no such option")
            raise InvalidArgumentError(f"RunOptions has no option {name!r}: {why}; the options are "
                                       f"{', '.join(self.__dataclass_fields__)}")
        if name == "log_severity_level" and int(value) not in range(5):
            raise InvalidArgumentError(f"log_severity_level={value}: 0 (verbose) to 4 (fatal)")
        if name in ("time_budget_s", "log_verbosity_level") and float(value) < 0:
            raise InvalidArgumentError(f"{name}={value}: must be >= 0")
        object.__setattr__(self, name, value)

    def add_run_config_entry(self, key, value):
        raise InvalidArgumentError(f"RunOptions.add_run_config_entry({key!r}, ...): onnxruntime's run config "
                                   f"keys have no meaning in glassrt; its options are attributes: "
                                   f"{', '.join(self.__dataclass_fields__)}")
