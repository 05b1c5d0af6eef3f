"""oneDNN's library loaded on another core while a session reads its model.

The first session of a process loads libdnnl, a 40 MB C++ library: its relocations and
page faults took 3-5 ms here (more with a cold page cache), charged to that session's
creation. ctypes.CDLL holds the GIL through dlopen, so `start` asks libc's dlopen as a
plain foreign call instead (ctypes releases the GIL around those), on a thread, and the
session reads and parses its model meanwhile; capi's own CDLL of the same path then finds
the library loaded (dlopen of a loaded library only counts a reference). Only the paths a
pip install leaves (or $GLASSRT_ONEDNN_LIBRARY) are tried, nothing is searched; capi still
checks the library's version and names, and one it refuses merely stays mapped.

A fork waits for the load to end: a child forked while another thread holds the dynamic
loader's lock would hang in its own first dlopen.
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading

_thread: threading.Thread | None = None
_lock = threading.Lock()


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
