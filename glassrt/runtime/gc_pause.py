"""Python's cyclic garbage collector paused while glassrt builds long-lived structures.

Creating a session or compiling a plan allocates tens of thousands of small objects (nodes,
types, decisions, steps, primitive handles) that live as long as the session. Each burst
of allocations triggers collections that walk them all again to find nothing: measured
with gc.callbacks, 31.6 ms of densenet121's 425 ms creation + first run (70 collections)
and 29.3 of inception_v2's 323. The collector is off for the duration and on again after,
if it was on (nested and concurrent pauses count: the last one out switches it back on);
reference counting still frees everything that is not part of a cycle meanwhile.
"""
from __future__ import annotations

import gc
import threading
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextmanager
def gc_paused():
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
