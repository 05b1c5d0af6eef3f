"""Weights mapped from their files instead of copied, and the accounting explain prints.

An initializer stored as external data, or a large one inside a file `glassrt optimize`
wrote (aligned there: model_file.align_raw_data), is a read-only view of a `numpy.memmap`
of its file (onnx_io._Parser._mapped, _read_raw): nothing is read until a kernel touches it, the pages are
the page cache's (shared by every process that maps the file, dropped and re-read by the
kernel under memory pressure rather than swapped), and a kernel that tried to write into a
weight would fail loudly (read-only) instead of corrupting every later run. One mapping per
file, shared by every tensor in it and by the sessions of this process.

A file that is mapped must not be truncated or rewritten while a session uses it (reading
a page cut off from the file ends the process with SIGBUS, as in every runtime that maps
weights, onnxruntime included); export.write_model refuses to write over a file mapped here.

`account(sess)` sorts the weight bytes of a session: *mapped* (views of a file), *copied*
(read into memory as the file has them: raw_data inside the model, external data at an
offset the dtype cannot be read at), *transformed* (computed from weights: constants the
passes folded, BatchNormalization folded into conv weights, oneDNN's reordered copies).
"""
from __future__ import annotations

import mmap
import os
import weakref

import numpy as np

_MAPS: dict = {}  # (real path, inode, size, mtime) -> weakref to the file's np.memmap


def map_file(path: str) -> np.memmap:
    """The whole file mapped read-only (one mapping per file while any view of it lives)."""
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns)
    ref = _MAPS.get(key)
    mm = ref() if ref is not None else None
    if mm is None:
        mm = np.memmap(path, dtype=np.uint8, mode="r")
        _MAPS[key] = weakref.ref(mm)
        for k in [k for k, r in _MAPS.items() if r() is None]:  # forget files no array maps any more
            del _MAPS[k]
    return mm


def mapped_paths() -> set[str]:
    """Real paths of the files this process maps weights from now."""
    return {k[0] for k, r in _MAPS.items() if r() is not None}


def is_mapped(arr) -> bool:
    """A view of a file mapping (a memmap's slices and reshapes stay memmaps sharing its _mmap;
    arithmetic on one gives a plain array)."""
    return isinstance(arr, np.memmap) and getattr(arr, "_mmap", None) is not None


def release_pages(arr, start: int = 0, stop: int | None = None) -> int:
    """Drop this process's hold on the file pages under a mapped weight (madvise
    MADV_DONTNEED on the whole pages inside its bytes [start, stop), default all of them);
    bytes released, 0 for an array that is not a file mapping. For a weight a plan copied
    into a layout of its own (oneDNN's packed weights), whose file pages would otherwise
    stay resident beside the copy: the pages stay in the page cache (clean, reclaimable),
    and a later read faults them back in from it, unchanged (the mapping is read-only)."""
    if not is_mapped(arr) or not arr.flags.c_contiguous or arr.nbytes == 0:
        return 0
    stop = arr.nbytes if stop is None else min(int(stop), arr.nbytes)
    region = arr._mmap
    base = np.frombuffer(region, dtype=np.uint8, count=1).ctypes.data
    offset = arr.ctypes.data - base
    first = -(-(offset + max(int(start), 0)) // mmap.PAGESIZE) * mmap.PAGESIZE
    end = (offset + stop) // mmap.PAGESIZE * mmap.PAGESIZE
    if end <= first or not hasattr(mmap, "MADV_DONTNEED"):
        return 0
    try:
        region.madvise(mmap.MADV_DONTNEED, first, end - first)
    except (OSError, ValueError):
        return 0
    return end - first


def _initializers(graph):
    for g in [graph, *(s for n in graph.walk() for s in n.subgraphs())]:
        yield from g.initializers.values()


def as_loaded(graph) -> weakref.WeakValueDictionary:
    """The arrays the model file had (id -> array, weakly: a folded-away weight is not kept)."""
    out = weakref.WeakValueDictionary()
    for arr in _initializers(graph):
        if isinstance(arr, np.ndarray):
            out[id(arr)] = arr
    return out


def _packed_bytes(constants: list) -> int:
    """Bytes of oneDNN's reordered copies of these constants (kernels/onednn, made when plans bind)."""
    import sys

    kernels = sys.modules.get("glassrt.kernels.onednn.kernels")
    if kernels is None:
        return 0
    where = {a.__array_interface__["data"][0] for a in constants}  # (packed_weights knows weights so too)
    seen, total = set(), 0
    for entry in list(kernels._PACKED.values()):
        if entry.source.__array_interface__["data"][0] in where and id(entry) not in seen:
            seen.add(id(entry))
            total += int(entry.memory.nbytes)
    return total


def account(graph, loaded) -> dict:
    """{"mapped_bytes", "copied_bytes", "transformed_bytes", "mapped_tensors"} for a graph
    after its passes; `loaded` is as_loaded() of the graph as it was read."""
    out = {"mapped_bytes": 0, "copied_bytes": 0, "transformed_bytes": 0, "mapped_tensors": 0}
    # arrays are known by where their bytes lie: a view of another initializer (a tied twin)
    # holds nothing more, and is as read when the bytes it views were read
    where = lambda a: (a.__array_interface__["data"][0], a.nbytes)  # noqa: E731
    read = {where(a) for a in (loaded.values() if loaded is not None else ())}
    seen, constants = set(), []
    for arr in _initializers(graph):
        key = where(arr) if isinstance(arr, np.ndarray) else None
        if key is None or key in seen:
            continue
        seen.add(key)
        constants.append(arr)
        if is_mapped(arr):
            out["mapped_bytes"] += int(arr.nbytes)
            out["mapped_tensors"] += 1
        elif key in read:
            out["copied_bytes"] += int(arr.nbytes)
        else:
            out["transformed_bytes"] += int(arr.nbytes)
    out["transformed_bytes"] += _packed_bytes(constants)
    return out
