"""The thread count the runtime gives the current runs (runtime/threads.use_threads sets it;
1 before any run and in a forked child), for a kernel that splits its own work outside the
libraries' pools: com.microsoft's DynamicQuantizeLSTM runs a bidirectional node's two
compiled recurrences side by side, and fused attention over many rows two halves of its
heads, only where runs have two threads."""
from __future__ import annotations

import threading

count = 1

_second: list = []
_lock = threading.Lock()


def second_thread():
    """The one-thread pool such a kernel runs its second half of work on (made when first
    needed; its work releases the GIL and touches no library's thread pool)."""
    if not _second:
        with _lock:
            if not _second:
                from concurrent.futures import ThreadPoolExecutor

                _second.append(ThreadPoolExecutor(1, thread_name_prefix="glassrt-second"))
    return _second[0]
