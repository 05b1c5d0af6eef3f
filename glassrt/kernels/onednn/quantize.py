"""DynamicQuantizeLinear on oneDNN's OpenMP pool: a quantize_dynamic model quantizes every
activation that feeds an integer product (a BERT-base: 49 a pass, 128 x 768 or 128 x 3072
floats each), and cpu's kernel does it on one thread: its range (min and max) and then
its codes (a float32 division each: the exact x / scale onnxruntime's kernel divides by;
a reorder that multiplies by the reciprocal gives other codes). Here each of OpenMP's
threads takes a block of the values for the codes, cpu's compiled loop on its block, run
on Numba's `omp` layer, the pool oneDNN's primitives run on (row_panels.py: no second pool
spinning beside it): the same bytes. The range stays NumPy's min and max (vector code
already; a compiled min/max that keeps NaN did not vectorize: 10x slower, measured).

Only where the loops can run (Numba already loaded by the process, OpenMP's layer, not a
forked child: row_panels.why_not_here), on values and codes laid out alike (plain or
channels-last) and large enough to share out; otherwise each call is cpu's kernel.
"""
from __future__ import annotations

import numpy as np

from ..buffers import NHWC, as_out
from ..cpu._jit import compiled, jit, numba_threads
from ..registry import kernel
from . import capi, row_panels
from .kernels import _unavailable

SHARED_FROM = 16384  # values: below this one thread's pass is a few microseconds

prange = range  # numba.prange once the loops are compiled (_why_not)
_quantize8 = None  # cpu's loop, bound when the loops are compiled (cpu's module loads ml_dtypes: not before)


@jit(parallel=True, boundscheck=False)
def _codes(x, s, z, out, threads):  # pragma: no cover - compiled
    """cpu's codes (its compiled loop, _quantize8) of each thread's block of x."""
    n = x.size
    for t in prange(threads):
        a, b = n * t // threads, n * (t + 1) // threads
        _quantize8(x[a:b], s, z, np.float32(0), np.float32(255), out[a:b])


_READY: list = []  # [None] once compiled, [reason] when the loops cannot run


def _why_not() -> str | None:
    why = row_panels.why_not_here()  # (Numba loaded, its OpenMP layer, not a forked child)
    if why is None and not _READY:
        try:
            import numba

            from ..cpu import quantize as cpu

            globals()["prange"], globals()["_quantize8"] = numba.prange, compiled(cpu._quantize8)
            compiled(_codes)(np.zeros(1, np.float32), np.float32(1), np.float32(0), np.zeros(1, np.uint8), 1)
            _READY.append(None)
        except Exception as e:  # noqa: BLE001 - a Numba that cannot compile them: cpu's kernel runs
            _READY.append(f"the loops failed to compile: {type(e).__name__}: {e}")
    return why or (_READY[0] if _READY else None)


def _reason(ctx):
    return _unavailable(ctx)


@kernel("DynamicQuantizeLinear", provider="onednn", dtypes=[np.float32], multi=True, out=True,
        accepts=_reason, name="threads", layouts=(NHWC,))
def dynamic_quantize_linear_threads(x, *, out=(None, None, None)):
    """cpu's DynamicQuantizeLinear, its codes shared out over OpenMP's threads (see the
    module's doc). A quantize_dynamic BERT-base (49 calls a pass): 28.5 -> 27.5 ms a run,
    medians of a four-round A/B of this kernel alone (its calls 5.7 -> 5.1-5.3 ms)."""
    from ..cpu.quantize import codes_pair, data_range, dynamic_quantize_linear, dynamic_range_params

    y_out, scale_out, zp_out = (tuple(out) + (None,) * 3)[:3]
    threads = max(1, capi.get_max_threads())
    flat = None if threads == 1 or x.size < SHARED_FROM or _why_not() else codes_pair(x, y_out)
    if flat is None:
        return dynamic_quantize_linear(x, out=out)
    numba_threads(threads)  # (per thread; another session may have set its own since)
    scale, zp = dynamic_range_params(*data_range(x))  # (NumPy's reductions: vector code already)
    compiled(_codes)(flat[0], scale, zp, flat[1], threads)
    y = flat[2]
    return y, as_out(np.asarray(scale, np.float32), scale_out), as_out(np.asarray(zp, np.uint8), zp_out)
