"""The thread count the runtime gives the current runs (runtime/threads.use_threads sets it;
1 before any run and in a forked child), for a kernel that splits its own work outside the
libraries' pools: com.microsoft's DynamicQuantizeLSTM runs a bidirectional node's two
compiled recurrences side by side only where runs have two threads."""
from __future__ import annotations

count = 1
