"""DynamicQuantizeLinear on oneDNN's OpenMP pool (glassrt/kernels/onednn/quantize.py): the
codes shared out over the threads, cpu's kernel's bytes."""
from __future__ import annotations

import numpy as np
import pytest

from glassrt.kernels.onednn import capi

pytestmark = pytest.mark.skipif(capi.UNAVAILABLE is not None, reason=str(capi.UNAVAILABLE))
pytest.importorskip("numba")  # loaded in this process, as a quantized model's other kernels load it

from glassrt.kernels.cpu import quantize as cpu  # noqa: E402
from glassrt.kernels.onednn import quantize  # noqa: E402

RNG = np.random.default_rng(5)


def _not_called(*args, **kwargs):
    raise AssertionError("cpu's kernel ran where the threaded pass should have")


def _cases():
    big = quantize.SHARED_FROM * 3 + 7  # (blocks of unequal sizes)
    x = RNG.standard_normal(big).astype(np.float32) * 3
    yield "random", x
    yield "one sign", np.abs(x) + 0.5
    yield "negative", -np.abs(x)
    yield "zeros", np.zeros(big, np.float32)
    special = x.copy()
    special[[0, 5, big - 1]] = [np.inf, -np.inf, 1e30]
    yield "inf", special
    nan = x.copy()
    nan[big // 2] = np.nan
    yield "nan", nan
    yield "ties", (np.arange(big, dtype=np.float32) % 512 - 255.5) / 2  # (codes on rounding ties)
    yield "small", x[:100]


@pytest.mark.parametrize("case", [c for c, _ in _cases()])
@pytest.mark.parametrize("threads", [2, 3])
def test_threaded_codes_are_cpus_bytes(case, threads, monkeypatch):
    x = dict(_cases())[case].reshape(1, -1)
    if quantize._why_not() is not None:
        pytest.skip(quantize._why_not())
    monkeypatch.setattr(capi, "get_max_threads", lambda: threads)
    want = cpu.dynamic_quantize_linear(x)
    if x.size >= quantize.SHARED_FROM:  # (the threaded pass must run, not cpu's kernel as its fallback)
        monkeypatch.setattr(cpu, "dynamic_quantize_linear", _not_called)
    got = quantize.dynamic_quantize_linear_threads(x, out=(np.empty(x.shape, np.uint8), None, None))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
        assert g.dtype == w.dtype and g.shape == w.shape


@pytest.mark.parametrize("kernel", ["threads", "cpu"])
def test_channels_last_values_give_the_same_codes(kernel, monkeypatch):
    """DynamicQuantizeLinear takes channels-last views (a quantize_dynamic CNN's activations
    between its convolutions): the codes of each element land in its place, the same bytes
    as for plain arrays; every mix of layouts."""
    from glassrt.runtime.layout import channels_last_view

    shape = (1, 24, 30, 40)  # (28,800 values: the threaded path's size)
    x = RNG.standard_normal(shape).astype(np.float32) * 4
    if kernel == "threads":
        if quantize._why_not() is not None:
            pytest.skip(quantize._why_not())
        monkeypatch.setattr(capi, "get_max_threads", lambda: 2)
        fn = quantize.dynamic_quantize_linear_threads
    else:
        monkeypatch.setattr(cpu, "use_compiled", lambda path, after=64: True)
        fn = cpu.dynamic_quantize_linear
    real = cpu.dynamic_quantize_linear
    want = real(x)

    def nhwc(a, dt):
        return channels_last_view(np.ascontiguousarray(a.transpose(0, 2, 3, 1)).reshape(-1).astype(dt), a.shape)

    for xs in (x, nhwc(x, np.float32)):
        for y in (np.empty(shape, np.uint8), nhwc(np.zeros(shape), np.uint8), None):
            # the threaded pass must run (not cpu's kernel as its fallback) but for plain values
            # into channels-last codes, which it leaves to cpu's tile path
            falls_back = xs is x and y is not None and not y.flags.c_contiguous
            monkeypatch.setattr(cpu, "dynamic_quantize_linear",
                                _not_called if kernel == "threads" and not falls_back else real)
            got = fn(xs, out=(y, None, None))
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)
