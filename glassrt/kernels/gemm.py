"""The matrix products of the cpu kernels: NumPy's BLAS, or oneDNN's sgemm when a run's
threads are OpenMP's.

A process has two pools of worker threads once oneDNN is loaded: OpenBLAS's (pthreads,
behind NumPy) and libgomp's (behind oneDNN, and Numba's `omp` layer). Each pool's workers
spin for a while after a parallel call, so two pools on the same cores take turns stealing
each other's time: resnet50 with the onednn provider ran 127 ms with OpenBLAS on 2 threads
and 66 ms with it held at 1 (onnxruntime 54 ms, this 2-core machine). So a run picks one
pool (runtime/threads.py): when it is OpenMP, BLAS is held at one thread and the float32
products below go to oneDNN's `dnnl_sgemm`, which runs on OpenMP's threads; other dtypes,
layouts it cannot express and machines without oneDNN keep NumPy's matmul.

`matmul(a, b, out)` is np.matmul(a, b, out=out) with either engine.
"""
from __future__ import annotations

import numpy as np

_F32 = np.dtype(np.float32)
_SMALL = 1 << 16  # multiply-adds per matrix of a stack below which NumPy runs the whole stack
_sgemm = None  # oneDNN's dnnl_sgemm while runs use the OpenMP pool, else None


def use_openmp(on: bool) -> None:
    """Route float32 products to oneDNN (on) or to NumPy's BLAS (off)."""
    global _sgemm
    if not on:
        _sgemm = None
        return
    from .onednn import capi

    _sgemm = capi.require().dnnl_sgemm


def engine() -> str:
    return "oneDNN sgemm (OpenMP)" if _sgemm is not None else "NumPy BLAS"


def _ld(m: np.ndarray):
    """(transposed, leading dimension) of a 2-D float32 matrix oneDNN can read in place,
    or None: row-major with unit column stride, or its transpose."""
    s0, s1 = m.strides
    if s1 == 4 and s0 >= 4 * max(1, m.shape[1]):
        return b"N", s0 // 4
    if s0 == 4 and s1 >= 4 * max(1, m.shape[0]):
        return b"T", s1 // 4
    if m.shape[0] == 1 and s1 == 4:  # one row: any row stride
        return b"N", max(1, m.shape[1])
    if m.shape[1] == 1 and s0 == 4:
        return b"T", max(1, m.shape[0])
    return None


def _sgemm2d(a, b, out) -> bool:
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0 or k == 0:
        return False
    la, lb = _ld(a), _ld(b)
    if la is None or lb is None or out.strides[1] != 4 or out.strides[0] < 4 * n:
        return False
    _sgemm(la[0], lb[0], m, n, k, 1.0, a.ctypes.data, la[1], b.ctypes.data, lb[1], 0.0, out.ctypes.data,
           out.strides[0] // 4)
    return True


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out[...] = a @ b (NumPy's broadcasting of stacked matrices)."""
    if (_sgemm is None or a.dtype != _F32 or b.dtype != _F32 or out.dtype != _F32 or a.ndim < 2 or b.ndim < 2
            or out.ndim < 2):
        return np.matmul(a, b, out=out)
    if out.ndim == 2 and a.ndim == 2 and b.ndim == 2:
        if not _sgemm2d(a, b, out):
            np.matmul(a, b, out=out)
        return out
    batch = out.shape[:-2]
    if a.shape[-2] * a.shape[-1] * b.shape[-1] < _SMALL:  # attention's per-head products: one NumPy
        return np.matmul(a, b, out=out)                    # call beats a ctypes call per matrix
    a = np.broadcast_to(a, batch + a.shape[-2:])
    b = np.broadcast_to(b, batch + b.shape[-2:])
    for idx in np.ndindex(*batch):
        if not _sgemm2d(a[idx], b[idx], out[idx]):
            np.matmul(a[idx], b[idx], out=out[idx])
    return out
