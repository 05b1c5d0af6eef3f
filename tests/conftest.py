"""Test isolation for glassrt's one process-wide background job that outlives a test: Numba's
load on its own thread (kernels/cpu/_jit.py), which a session starts when its kernels will
want compiled loops. While that load is running, `numba_loaded()` is false and kernels take
their NumPy twins; a test that imported Numba to see the compiled loops run would then see
the twins if an earlier test on the same worker had started the load. Each test waits for a
load it started, so the next one starts with Numba either loaded or not being loaded."""
import pytest


@pytest.fixture(autouse=True)
def _numba_load_finished():
    yield
    from glassrt.kernels.cpu import _jit

    _jit.wait_for_numba()
