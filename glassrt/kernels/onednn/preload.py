"""oneDNN's library loaded on another core while a session reads its model.

The first session of a process loads libdnnl, a 40 MB C++ library: its relocations and
page faults took 4 ms here with the file in the page cache, 12 without, charged to that session's
creation. ctypes.CDLL holds the GIL through dlopen, so `start` asks libc's dlopen as a
plain foreign call instead (ctypes releases the GIL around those), on a thread, and the
session reads and parses its model meanwhile; capi's own CDLL of the same path then finds
the library loaded (dlopen of a loaded library only counts a reference). Only the paths a
pip install leaves (or $GLASSRT_ONEDNN_LIBRARY) are tried, nothing is searched; capi still
checks the library's version and names, and one it refuses merely stays mapped.

A fork waits for the load to end: a child forked while another thread holds the dynamic
loader's lock would hang in its own first dlopen.

The library brings GNU OpenMP (libgomp), whose idle workers spin GOMP_SPINCOUNT times
before they sleep, 300,000 by default: milliseconds after every parallel region, in which
a machine busy with other processes loses a core to the spinning (`benchmarks/suite.py
--busy 3`, glassrt / onnxruntime: densenet121, inception_v1, shufflenet and squeezenet at
batch 1 and 8, two alternating rounds each way, geometric means 1.02 and 0.94 with libgomp's
default, 0.85 and 0.83 with SPINCOUNT; the nine light models at both batches, one run each,
1.09 and 0.85). SPINCOUNT is 30,000 since stop 28: on the 2-core Xeon a worker woke for
free after a gap of up to ~100 us with 10,000 and ~250 us with 30,000 (48 one-row products
with a busy-wait between: +3.3 ms at 150 us gaps with 10,000, none with 30,000), and a
decode step's attention block is such a gap before every layer's next product (GPT-2, four
alternating rotations: 22.2-23.5 ms a token against 23.0-25.1 with 10,000; with OpenBLAS
pinned, 21.6-23.0 against 23.1-23.5); with 3 busy
processes the light suite stayed at 0.88x (batch 1) and 0.76x (batch 8). Where the user set
neither GOMP_SPINCOUNT nor OMP_WAIT_POLICY and libgomp is not loaded yet, the load runs
with GOMP_SPINCOUNT=SPINCOUNT in the environment (libgomp reads it once, as it loads), and
the variable is taken out again afterwards, so that child processes do not inherit it;
`spin_policy` says which of these happened (explain prints it).
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading

_thread: threading.Thread | None = None
_lock = threading.Lock()

SPINCOUNT = 30_000  # ~0.25-0.3 ms of spinning on the 2-core Xeon (the default 300,000: milliseconds), then a futex sleep
spin_policy: str | None = None  # how OpenMP's workers wait, once glassrt has loaded the library
_spin_set = False  # GOMP_SPINCOUNT is in the environment for the load and must come out after it


def turned_off() -> bool:
    return os.environ.get("GLASSRT_ONEDNN", "1").lower() in ("0", "off", "no", "false")


def wheel_paths():
    """The library paths a pip install leaves, best first ($GLASSRT_ONEDNN_LIBRARY first)."""
    env = os.environ.get("GLASSRT_ONEDNN_LIBRARY")
    if env:
        yield env
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix, sys.exec_prefix)):
        for name in ("libdnnl.so.3", "libdnnl.so"):
            yield os.path.join(prefix, "lib", name)


def _libgomp_loaded() -> bool:
    try:
        ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return False
    return True


def spin_env_for_load() -> None:
    """Before the library (and with it libgomp) loads: GOMP_SPINCOUNT where nobody chose
    how OpenMP waits (see the module's doc); `spin_policy` says what holds."""
    global spin_policy, _spin_set
    if spin_policy is not None:
        return
    chosen = [f"{v}={os.environ[v]}" for v in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY") if v in os.environ]
    if chosen:
        spin_policy = f"OpenMP's workers wait as the environment says ({', '.join(chosen)})"
    elif _libgomp_loaded():
        spin_policy = ("GNU OpenMP was loaded before glassrt: its workers wait as it was set up then (its "
                       "default: 300,000 spins, milliseconds, after each parallel region)")
    else:
        os.environ["GOMP_SPINCOUNT"] = str(SPINCOUNT)
        _spin_set = True
        spin_policy = (f"OpenMP's workers spin {SPINCOUNT:,} times, then sleep (GOMP_SPINCOUNT for libgomp's "
                       "load, set by glassrt: its default 300,000 spins held a busy machine's cores for "
                       "milliseconds after each parallel region)")


def restore_env() -> None:
    """After the load: GOMP_SPINCOUNT out of the environment again, if glassrt put it there."""
    global _spin_set
    if _spin_set:
        os.environ.pop("GOMP_SPINCOUNT", None)
        _spin_set = False


def start() -> None:
    """Begin loading the library in the background, once per process (Linux; nothing to do
    once capi has loaded it)."""
    global _thread
    if _thread is not None or "glassrt.kernels.onednn.capi" in sys.modules or turned_off() \
            or not sys.platform.startswith("linux"):
        return
    with _lock:
        if _thread is not None:
            return
        path = next((p for p in wheel_paths() if os.path.isfile(p)), None)
        try:
            dlopen = ctypes.CDLL(None).dlopen
        except (OSError, AttributeError):  # pragma: no cover - a libc without dlopen exported
            path = None
        if path is None:
            _thread = threading.Thread(target=lambda: None)  # (nothing to load: capi will say why)
        else:
            spin_env_for_load()
            dlopen.argtypes, dlopen.restype = [ctypes.c_char_p, ctypes.c_int], ctypes.c_void_p
            # the flags ctypes.CDLL uses, so that its dlopen finds this load as it would its own
            _thread = threading.Thread(target=dlopen, args=(os.fsencode(path), os.RTLD_NOW | os.RTLD_LOCAL),
                                       name="glassrt-load-onednn", daemon=True)
            os.register_at_fork(before=wait)
        _thread.start()


def wait() -> None:
    """Until the background load (if one was started) has ended."""
    t = _thread
    if t is not None and t.is_alive() and t is not threading.current_thread():
        t.join()
    if t is not None and not t.is_alive():
        restore_env()
