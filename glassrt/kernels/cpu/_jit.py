"""Numba, compiled lazily: the one way the cpu kernels get compiled loops.

    from ._jit import jit

    @jit(error_model="numpy")
    def _loop(x, out): ...

`_loop` stays a plain module-level function until it is first called; importing glassrt
imports no Numba (a quarter of a second) and compiles nothing. The first call compiles it
with numba.njit(cache=True, nogil=True, **options) — machine code cached on disk beside the
module, so a later process only loads it; single-threaded on purpose: the threads belong to
BLAS (see conv.py). The exception is onednn/row_panels.py's loop (parallel=True), which runs
on OpenMP's pool through Numba's omp threading layer. Compiled functions may call each other: Numba reads a callee from the
caller's module globals when it compiles the caller, so the first compilation in a module
puts the dispatchers of all of that module's lazy functions in those globals (dispatchers
compile their own code only when first called, so this costs nothing; a vectorize is made
on its own first call). A dispatcher's first call loads its machine code from the cache
without Numba's set-up of its whole CPU target (_load_cached). Functions must be
module-level, not closures: Numba's disk cache misses every time for a closure over other
compiled functions.

When Numba cannot be imported, `numba_missing()` says why — kernels that need it refuse a
node with that reason at placement — and calling a lazy function raises it.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.util
import os
import sys
import threading
import time

_REASON: list = []  # [None] once Numba is found (or imported), [reason] when it cannot be
_threads: list = []  # [n]: the thread limit to give Numba when it is imported


def numba_missing() -> str | None:
    """Why Numba is unavailable, or None when it is installed. Placement asks this of every
    kernel that needs Numba, also where another provider takes the node: so it only looks
    for the package (importing Numba costs 0.3 s or more, more still beside SciPy, which it
    probes for BLAS). An installed Numba that fails to import fails the first kernel that
    compiles, with the reason (`_compile_module`)."""
    if not _REASON:
        try:
            found = importlib.util.find_spec("numba") is not None
        except (ImportError, ValueError) as e:  # pragma: no cover - a broken installation
            found, why = False, f"{type(e).__name__}: {e}"
        else:
            why = "the numba package is not installed"
        _REASON.append(None if found else f"numba unavailable ({why})")
    return _REASON[0]


_CALLS: dict = {}
_FIRST_RUN: dict = {}  # path -> the session run in which it was first asked
_RUNS = [0]  # session runs started in this process (session.py counts them: run_started)


def run_started() -> None:
    _RUNS[0] += 1


def use_compiled(path: str, after: int = 64) -> bool:
    """Whether an optional compiled loop (one whose NumPy twin gives the same bits) should
    run now: Numba is installed and loaded (imported, its CPU target set up). Where it is
    not, the NumPy twin runs, and Numba starts loading on another thread (numba_warmup)
    once this path is asked in a later session run than the one that first asked it, or
    `after` times in all: a process that runs a model once never loads it, and one that
    keeps running it gets the compiled loops once the load is done, its runs meanwhile on
    the twins. (The second run used to import Numba itself: 0.5-1.1 s for a quantized
    MobileNetV2, whose runs take 2-5 ms; and before that the sixth.)"""
    if numba_missing() is not None:
        return False
    if numba_loaded():
        return True
    first = _FIRST_RUN.setdefault(path, _RUNS[0])
    _CALLS[path] = _CALLS.get(path, 0) + 1
    if _CALLS[path] > after or _RUNS[0] > first:
        numba_warmup()
    return False


_warmup: threading.Thread | None = None
_warmup_lock = threading.Lock()
_warm = threading.Event()  # set once Numba is imported and its CPU target set up


def numba_loaded() -> bool:
    """Numba imported whole (by numba_warmup, a kernel that needs it, or the caller): not
    merely in sys.modules, where it is from the start of its import on."""
    if _warm.is_set():
        return True
    mod = sys.modules.get("numba")
    return mod is not None and not getattr(getattr(mod, "__spec__", None), "_initializing", False) \
        and (_warmup is None or not _warmup.is_alive())


def numba_warmup() -> None:
    """Load Numba on a thread of its own, once per process: its import and its CPU target's
    set-up (the registries its first compilation or cache load reads; with SciPy installed,
    Numba imports it there) take 0.5-1 s, which a run would otherwise stall for. Runs go on
    meanwhile, slower while the two share the GIL and the cores (measured on 2 cores, a
    quantized MobileNetV2 in a loop: runs of 3-177 ms for ~0.6 s, against one run of
    0.5-1.1 s). A fork, and the interpreter's exit, wait for it (a child forked mid-import
    would find the import's locks held by a thread it does not have)."""
    global _warmup
    if _warmup is not None:
        return
    with _warmup_lock:
        if _warmup is not None:
            return
        _warmup = threading.Thread(target=_load_numba, name="glassrt-load-numba")  # (not a daemon: joined at exit)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(before=wait_for_numba)
        _warmup.start()


def warm_numba_soon() -> None:
    """numba_warmup where Numba is installed and not loaded yet: a session whose kernels will
    need it on some inputs with no NumPy twin (Kernel.warms_numba) calls this as its creation
    ends, so that the load overlaps what comes before that run (a prompt's run, a server's
    wait for its first request) instead of stalling it. A process that ends before the load
    does waits for it at exit."""
    if numba_missing() is None and not numba_loaded():
        numba_warmup()


def _load_numba() -> None:
    """numba_warmup's thread. The runs going on meanwhile share the GIL with the import, which
    gives way to them between its modules (_GiveWayToRuns). One part of it need not hold the
    GIL: llvmlite's library, whose dlopen through ctypes.CDLL does (llvmlite's import and
    load measured 35-42 ms; 17-20 after an early dlopen of 6-17 ms). libc's dlopen is asked
    first, as a plain foreign call that releases the GIL; llvmlite's CDLL then finds the
    library loaded."""
    finder = _GiveWayToRuns(threading.current_thread())
    sys.meta_path.insert(0, finder)
    try:
        # (started by a kernel, in a run, which runs on ungated: the load begins once the
        # run after it has ended, or after GIVE_WAY_S)
        with _run_ended:
            _run_ended.wait(timeout=GIVE_WAY_S)
        _dlopen_llvmlite()
        _load()
    except Exception as e:  # noqa: BLE001 - an installed Numba that cannot load: the twins stay
        _REASON[:] = [f"numba unavailable (its import failed: {type(e).__name__}: {e})"]
    finally:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(finder)


# A run that starts while Numba loads shares the GIL with the import: each time the run lets
# go of it (every foreign call: a oneDNN primitive's execution, a NumPy loop) the import
# takes it, and the run gets it back only when the interpreter's switch interval (5 ms) makes
# the import let go. A quantized MobileNetV2's 2 ms runs took 26-51 ms each (median; the
# slowest 66-158) for the ~0.3 s of the load, in a loop or 10 ms apart; a 20 us switch
# interval: 19-20 (95-100). So the import takes turns with a run that comes after a pause
# (a server's request): at a module it is about to import (~500 for Numba) while such a run
# goes on, it waits for a run to end (GIVE_WAY_S at most), then imports for LOAD_TURN_S
# before it looks again. Runs 10 ms apart: 6 ms each (the slowest 30-32: a module's or
# Numba's runtime's set-up, which has no import to stop at), the load 0.38-0.40 s. Runs back
# to back (a loop: less than BACK_TO_BACK_S between them) get no turns: there every turn
# costs hand-overs of the GIL, and the load's 0.3 s in one piece costs the loop least
# (measured with 10 ms turns: runs of 14-15 ms for 0.4-0.48 s, the first 100 runs 12% longer).
GIVE_WAY_S = 0.05
LOAD_TURN_S = 0.01
BACK_TO_BACK_S = 0.001
_runs = [0, 0, 0.0]  # runs after a pause going on now, runs ended, when the last one ended
_run_ended = threading.Condition()


@contextlib.contextmanager
def run_before_load():
    """Around a run that starts while Numba loads (runtime/runner.py): the load waits for it
    when it comes after a pause."""
    with _run_ended:
        paced = time.perf_counter() - _runs[2] >= BACK_TO_BACK_S
        _runs[0] += paced
    try:
        yield
    finally:
        with _run_ended:
            _runs[0] -= paced
            _runs[1] += 1
            _runs[2] = time.perf_counter()
            _run_ended.notify_all()


class _GiveWayToRuns:
    """A sys.meta_path finder, first in line while numba_warmup's thread loads: asked for
    every module an import statement finds missing, it makes that thread wait while a run
    after a pause goes on, then lets the real finders find the module."""

    def __init__(self, loader: threading.Thread):
        self.loader = loader
        self.until = 0.0  # the end of the load's current turn (time.perf_counter)

    def find_spec(self, name, path=None, target=None):
        if _runs[0] and threading.current_thread() is self.loader and time.perf_counter() >= self.until:
            with _run_ended:
                ended = _runs[1]
                _run_ended.wait_for(lambda: not _runs[0] or _runs[1] != ended, timeout=GIVE_WAY_S)
            self.until = time.perf_counter() + LOAD_TURN_S
        return None


def _dlopen_llvmlite() -> None:
    """Map llvmlite's shared library with the GIL released (Linux; elsewhere, or where it is
    not found, Numba's import loads it as it would)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        spec = importlib.util.find_spec("llvmlite")
        folders = list(spec.submodule_search_locations or ()) if spec else []
        path = next((p for p in (os.path.join(f, "binding", "libllvmlite.so") for f in folders)
                     if os.path.isfile(p)), None)
        if path is None:
            return
        dlopen = ctypes.CDLL(None).dlopen
        dlopen.argtypes, dlopen.restype = [ctypes.c_char_p, ctypes.c_int], ctypes.c_void_p
    except (ImportError, ValueError, OSError, AttributeError):  # pragma: no cover - an odd installation
        return
    dlopen(os.fsencode(path), os.RTLD_NOW | os.RTLD_LOCAL)  # (ctypes.CDLL's flags: its own dlopen finds this)


def numba_loading() -> bool:
    """Whether numba_warmup's thread is loading Numba now (it holds a core: runtime/runner.py
    runs plans on one core fewer meanwhile)."""
    t = _warmup
    return t is not None and t.is_alive()


def wait_for_numba() -> None:
    """Until a background load of Numba (if one started) has ended."""
    t = _warmup
    if t is not None and t.is_alive() and t is not threading.current_thread():
        t.join()


_ready: list = []  # [True] once _set_up_for_cache_loads ran


def _load():
    """Numba imported and set up for loading compiled loops (on any thread)."""
    import numba

    _set_up_for_cache_loads()
    _warm.set()
    return numba


def _import_numba():
    try:
        numba = _load()
    except Exception as e:  # pragma: no cover - numba is a dependency
        raise RuntimeError(f"this kernel needs Numba, which failed to import: {type(e).__name__}: {e}") from e
    if _threads:
        numba_threads(_threads.pop())
    return numba


def _set_up_for_cache_loads() -> None:
    """What loading glassrt's compiled loops from Numba's disk cache needs of its CPU target,
    and no more: the runtime (NRT: loops that allocate call it) and the symbols the one
    registry module that adds any at import defines (hashing's). Numba's own cache load
    first refreshes the whole target, importing every registry of implementations (~120
    modules): 0.6 s of a 0.9 s load on a 2-core Zen 1, which a run had to share the GIL
    with. A compilation still refreshes it first (numba's CompilerBase), as before."""
    if _ready:
        return
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.registry import cpu_target
    from numba.core.runtime import nrt
    import numba.cpython.hashing  # noqa: F401 - adds the _numba_hashsecret_ symbols

    with global_compiler_lock:
        nrt.rtsys.initialize(cpu_target.target_context)
    _ready.append(True)


def _load_cached(cache, sig, target_context):
    """numba's Cache.load_overload without its refresh of the whole target (see
    _set_up_for_cache_loads); where the rebuild fails, it refreshes and tries as Numba does."""
    try:
        with cache._guard_against_spurious_io_errors():
            return cache._load_overload(sig, target_context)
    except Exception:  # noqa: BLE001 - Numba's own steps then report what is wrong
        target_context.refresh()
        with cache._guard_against_spurious_io_errors():
            return cache._load_overload(sig, target_context)


def _loads_without_refresh(dispatcher):
    """A jit dispatcher whose cache loads (on its first calls) go through _load_cached."""
    from numba.core.caching import Cache

    cache = getattr(dispatcher, "_cache", None)
    if isinstance(cache, Cache):
        cache.load_overload = functools.partial(_load_cached, cache)
    return dispatcher


def limit_threads(n: int) -> None:
    """Numba's thread limit (for parallel Numba code: glassrt's kernels are single-threaded
    but for row_panels' loops, a custom op's need not be). Applied now if Numba is imported
    (a custom op's module did), else when the first compiled kernel imports it: a session
    whose nodes need no Numba then never pays its import (0.3-0.5 s)."""
    if numba_loaded():
        numba_threads(n)
    else:
        _threads[:] = [n]


_set_here = threading.local()  # per thread: the count numba_threads last gave Numba


def numba_threads(n: int) -> None:
    """Numba's thread count for the calling thread (Numba keeps one per thread), set only
    when it differs from what this function last set here: numba.get_num_threads costs ~5 us
    a call where a decode step's 48 products each ask (a count set by other code directly
    through numba.set_num_threads is not seen)."""
    if getattr(_set_here, "n", None) != n:
        numba = sys.modules["numba"]
        # Numba's first launch of its OpenMP threading layer sets the calling thread's OpenMP
        # count to NUMBA_NUM_THREADS, and no later set_num_threads lowers it: oneDNN's
        # primitives made after ran on every core whatever the session asked (measured:
        # intra_op_num_threads=1 ran its 8-bit convolutions on two threads from the second
        # run, when Numba loads). So OpenMP's count is put back as it was.
        capi = sys.modules.get("glassrt.kernels.onednn.capi")
        openmp = capi.query_max_threads() if capi is not None and capi.lib is not None else None
        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
        if openmp is not None and capi.query_max_threads() != openmp:
            capi.set_num_threads(openmp)
        _set_here.n = n


class _Lazy:
    """A function compiled on its first call (see the module docstring)."""

    def __init__(self, fn, make, alone: bool = False):
        functools.update_wrapper(self, fn)
        self.fn, self.make = fn, make  # make(numba, fn) -> the compiled function
        self.alone = alone  # made on its own first use, not with its module's others
        self.compiled = None

    def __call__(self, *args, **kwargs):
        return self.dispatcher()(*args, **kwargs)

    def dispatcher(self):
        if self.compiled is None:
            _compile_module(self.fn.__globals__, self if self.alone else None)
        return self.compiled


def _compile_module(namespace, alone: _Lazy | None = None):
    """Makes the dispatchers of a module's lazy functions (or the one made `alone`)."""
    reason = numba_missing()
    if reason is not None:
        raise RuntimeError(f"this kernel needs Numba: {reason}")
    numba = _import_numba()

    for name, obj in list(namespace.items()):
        if obj is alone or (alone is None and isinstance(obj, _Lazy) and not obj.alone and obj.compiled is None):
            obj.compiled = obj.make(numba, obj.fn)
            namespace[name] = obj.compiled  # compiled callers find compiled callees


def compiled(fn):
    """The Numba dispatcher of a lazy function (a module's globals hold the dispatcher itself
    once the module compiled): for kernels that take it at bind time, which then also
    imports Numba, so that a run never does."""
    return fn.dispatcher() if isinstance(fn, _Lazy) else fn


def jit(**options):
    """Decorator: numba.njit(cache=True, nogil=True, **options) on first call."""
    opts = dict(cache=True, nogil=True, **options)
    return lambda fn: _Lazy(fn, lambda numba, f: _loads_without_refresh(numba.njit(**opts)(f)))


def vectorize(signatures, **options):
    """Decorator: numba.vectorize(signatures, cache=True, **options) on first call (a ufunc:
    broadcasting and out= included). Made on its own first call, not with its module's
    other functions: building the ufunc needs Numba's whole CPU target (0.6 s to set up)."""
    opts = dict(cache=True, **options)
    return lambda fn: _Lazy(fn, lambda numba, f: numba.vectorize(signatures, **opts)(f), alone=True)
