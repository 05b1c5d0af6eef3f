"""glassrt's compiled loops load from Numba's disk cache without Numba's set-up of its whole
CPU target (kernels/cpu/_jit.py: _set_up_for_cache_loads, _load_cached)."""
import subprocess
import sys

import pytest

from glassrt.kernels.cpu import _jit

_CODE = """
import math, sys, numpy as np
from glassrt.contrib import microsoft_quant as mq
from glassrt.kernels.cpu import erf
from glassrt.kernels.cpu._jit import compiled
rng = np.random.default_rng(0)
a, b = (rng.integers(0, 256, 4096, dtype=np.uint8) for _ in range(2))
consts = mq._qlinear_add_constants(np.dtype(np.uint8), np.float32(0.02), 128, np.float32(0.03), 120,
                                   np.float32(0.04), 125)
loop = compiled(mq._qlinear_add_loop)  # (the float64 steps: on any CPU)
out = np.empty_like(a)
loop(a, b, *consts, out)
twin = mq._qlinear_add(a, np.float32(0.02), np.uint8(128), b, np.float32(0.03), np.uint8(120), np.float32(0.04),
                       np.uint8(125))
registries = "numba.np.arraymath" in sys.modules
x = np.linspace(-3, 3, 7)
erf64 = erf.erf(x)  # a vectorize: built with Numba's whole target
print(np.array_equal(out, twin), dict(loop.stats.cache_misses), registries,
      np.array_equal(erf64, [math.erf(v) for v in x]))
"""


def test_a_cached_loop_loads_without_numbas_registries_and_computes_as_its_twin():
    """The second process finds the loop in the cache (the first may compile it): it loads
    with no registry of Numba's implementations imported (their import was 0.6 s of a 0.9 s
    load), and gives the NumPy twin's bytes; a vectorize made after still builds."""
    run = [sys.executable, "-c", _CODE]
    subprocess.run(run, capture_output=True, text=True, timeout=300, check=True)
    out = subprocess.run(run, capture_output=True, text=True, timeout=300, check=True).stdout.strip()
    assert out == "True {} False True", out


def test_a_failed_light_load_refreshes_the_target_and_loads_as_numba_does():
    calls = []

    class Target:
        def refresh(self):
            calls.append("refresh")

    class Cache:
        import contextlib

        _guard_against_spurious_io_errors = staticmethod(contextlib.nullcontext)

        def _load_overload(self, sig, target):
            calls.append("load")
            if "refresh" not in calls:
                raise KeyError("a symbol only a registry defines")
            return "loaded"

    assert _jit._load_cached(Cache(), ("sig",), Target()) == "loaded"
    assert calls == ["load", "refresh", "load"]


_DLOPEN_CODE = """
import sys
from glassrt.kernels.cpu import _jit
_jit._dlopen_llvmlite()
mapped = any(line.rstrip().endswith("libllvmlite.so") for line in open("/proc/self/maps"))
imported = "llvmlite" in sys.modules
_jit.numba_warmup(); _jit.wait_for_numba()
from llvmlite.binding import ffi
maps = [line.split()[-1] for line in open("/proc/self/maps") if line.rstrip().endswith("libllvmlite.so")]
print(mapped, imported, _jit.numba_loaded(), len(set(maps)), ffi.lib._name.endswith("libllvmlite.so"))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the early dlopen is Linux's")
def test_llvmlites_library_is_mapped_before_numbas_import_and_then_used_by_it():
    """The background load maps llvmlite's library through libc's dlopen (the GIL released)
    before it imports anything; llvmlite's own load then takes that same mapping."""
    out = subprocess.run([sys.executable, "-c", _DLOPEN_CODE], capture_output=True, text=True, timeout=300,
                         check=True).stdout.strip()
    assert out == "True False True 1 True", out
