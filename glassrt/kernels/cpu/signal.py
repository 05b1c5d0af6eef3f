"""Signal processing: DFT, STFT (numpy.fft), the window generators and MelWeightMatrix.

Complex values travel as a trailing dim of 2 (real, imaginary); a trailing dim of 1 is a real
signal. float32/float64 are transformed in their own precision (NumPy >= 2 keeps complex64),
float16/bfloat16 through float32. The FFTs allocate their results; the kernels copy them
into the planned buffers.
"""
from __future__ import annotations

import numpy as np

from ... import dtypes
from ..registry import kernel
from ._util import FLOATS_BF16, as_out

_SIZE_INTS = [np.int32, np.int64]

_COMPLEX = {np.dtype(np.float32): np.dtype(np.complex64), np.dtype(np.float64): np.dtype(np.complex128)}


def _real_dtype(dt):
    dt = np.dtype(dt)
    return dt if dt in _COMPLEX else np.dtype(np.float32)


def _to_signal(x):
    """(signal without the trailing dim, is_real) from a [..., 1] or [..., 2] tensor."""
    if x.ndim < 2 or x.shape[-1] not in (1, 2):
        raise ValueError(f"the last dim must be 1 (real) or 2 (complex), got shape {list(x.shape)}")
    rdt = _real_dtype(x.dtype)
    x = x.astype(rdt, copy=False)
    if x.shape[-1] == 1:
        return x[..., 0], True
    return np.ascontiguousarray(x).view(_COMPLEX[rdt])[..., 0], False


def _from_complex(y, dt):
    """[..., 2] (real, imaginary) of complex y, in dtype dt."""
    y = np.ascontiguousarray(y)
    rdt = np.float32 if y.dtype == np.complex64 else np.float64
    return y.view(rdt).reshape(y.shape + (2,)).astype(dt, copy=False)


def _scalar(v, what):
    v = np.asarray(v)
    if v.size != 1:
        raise ValueError(f"{what} must be a scalar, got shape {list(v.shape)}")
    return int(v.reshape(-1)[0])


def _dft(x, dft_length, axis, inverse, onesided):
    r = x.ndim
    if not (-r <= axis <= -2 or 0 <= axis <= r - 2):
        raise ValueError(f"axis {axis} out of range for rank {r} (the last dim holds real/imaginary)")
    a = axis % r
    sig, real = _to_signal(x)
    if dft_length is None:
        n = 2 * (x.shape[a] - 1) if inverse and onesided else x.shape[a]
    else:
        n = _scalar(dft_length, "dft_length")
    if n < 1:
        raise ValueError(f"dft_length must be positive, got {n}")
    if inverse and onesided:  # IRFFT: one-sided spectrum -> real signal
        return np.fft.irfft(sig, n, axis=a)[..., None].astype(x.dtype, copy=False)
    if inverse:
        y = np.fft.ifft(sig, n, axis=a)
    elif onesided and real:
        y = np.fft.rfft(sig, n, axis=a)
    else:
        y = np.fft.fft(sig, n, axis=a)
        if onesided:
            y = y[(slice(None),) * a + (slice(0, n // 2 + 1),)]
    return _from_complex(y, x.dtype)


@kernel("DFT", dtypes=FLOATS_BF16, versions=(17, 19), out=True, bind=True)
def dft_17(ctx):
    """DFT-17: the axis is an attribute (default 1)."""
    axis = int(ctx.attrs.get("axis", 1))
    inverse, onesided = bool(ctx.attrs.get("inverse", 0)), bool(ctx.attrs.get("onesided", 0))

    def step(x, dft_length=None, *, out=None):
        return as_out(_dft(x, dft_length, axis, inverse, onesided), out)

    return step


@kernel("DFT", dtypes=FLOATS_BF16, versions=(20, None), out=True, bind=True)
def dft_20(ctx):
    """DFT-20: the axis is an optional input (default -2)."""
    inverse, onesided = bool(ctx.attrs.get("inverse", 0)), bool(ctx.attrs.get("onesided", 0))

    def step(x, dft_length=None, axis=None, *, out=None):
        return as_out(_dft(x, dft_length, -2 if axis is None else _scalar(axis, "axis"), inverse, onesided), out)

    return step


@kernel("STFT", dtypes=FLOATS_BF16, versions=(17, None), out=True)
def stft(signal, frame_step, window=None, frame_length=None, *, out=None, onesided=1):
    """Frames as a strided view of the signal, windowed, one batched FFT over all of them."""
    if signal.ndim != 3:
        raise ValueError(f"signal must be [batch][signal_length][1 or 2], got shape {list(signal.shape)}")
    sig, real = _to_signal(signal)  # (batch, length)
    length = sig.shape[1]
    step = _scalar(frame_step, "frame_step")
    if window is not None and window.ndim != 1:
        raise ValueError(f"window must be 1-D, got shape {list(window.shape)}")
    if frame_length is not None:
        fl = _scalar(frame_length, "frame_length")
        if window is not None and window.shape[0] != fl:
            raise ValueError(f"window length {window.shape[0]} != frame_length {fl}")
    else:
        fl = window.shape[0] if window is not None else length
    if step < 1 or fl < 1 or fl > length:
        raise ValueError(f"frame_step {step} / frame_length {fl} invalid for a signal of length {length}")
    frames = (length - fl) // step + 1
    view = np.lib.stride_tricks.sliding_window_view(sig, fl, axis=1)[:, ::step][:, :frames]
    if window is not None:
        view = view * window.astype(sig.real.dtype, copy=False)
    if onesided and real:
        y = np.fft.rfft(view, fl, axis=-1)
    else:
        y = np.fft.fft(view, fl, axis=-1)
        if onesided:
            y = y[..., :fl // 2 + 1]
    return as_out(_from_complex(y, signal.dtype), out)


# ---------------------------------------------------------------- windows


def _window(size, periodic, output_datatype, a0, a1, a2):
    """a0 - a1 cos(2πn/N) + a2 cos(4πn/N), N = size (periodic) or size - 1 (symmetric)."""
    n = _scalar(size, "size")
    if n < 0:
        raise ValueError(f"window size must be >= 0, got {n}")
    denom = n if periodic else n - 1
    k = np.arange(n, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        # A symmetric window of size 1 divides 0 by 0: NaN, as the spec's function body and onnxruntime give.
        ang = k * 2 * np.pi / denom
        w = a0 - a1 * np.cos(ang) + a2 * np.cos(2 * ang)
        return w.astype(dtypes.np_dtype(int(output_datatype)))


@kernel("HannWindow", dtypes=_SIZE_INTS, versions=(17, None), out=True)
def hann_window(size, *, out=None, periodic=1, output_datatype=1):
    return as_out(_window(size, periodic, output_datatype, 0.5, 0.5, 0.0), out)


@kernel("HammingWindow", dtypes=_SIZE_INTS, versions=(17, None), out=True)
def hamming_window(size, *, out=None, periodic=1, output_datatype=1):
    return as_out(_window(size, periodic, output_datatype, 25 / 46, 21 / 46, 0.0), out)


@kernel("BlackmanWindow", dtypes=_SIZE_INTS, versions=(17, None), out=True)
def blackman_window(size, *, out=None, periodic=1, output_datatype=1):
    return as_out(_window(size, periodic, output_datatype, 0.42, 0.5, 0.08), out)


# ---------------------------------------------------------------- MelWeightMatrix


@kernel("MelWeightMatrix", dtypes=_SIZE_INTS, versions=(17, None), out=True)
def mel_weight_matrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz, *, out=None,
                      output_datatype=1):
    """Triangular filters on the mel scale, [dft_length // 2 + 1, num_mel_bins] (onnxruntime's bin rule)."""
    mels, n_fft, rate = (_scalar(num_mel_bins, "num_mel_bins"), _scalar(dft_length, "dft_length"),
                         _scalar(sample_rate, "sample_rate"))
    if mels < 1 or n_fft < 1 or rate < 1:
        raise ValueError(f"num_mel_bins {mels}, dft_length {n_fft}, sample_rate {rate} must be positive")
    lo, hi = float(np.asarray(lower_edge_hertz).reshape(-1)[0]), float(np.asarray(upper_edge_hertz).reshape(-1)[0])
    lo_mel, hi_mel = 2595 * np.log1p(lo / 700) / np.log(10), 2595 * np.log1p(hi / 700) / np.log(10)
    # mels + 2 band edges, spaced by (range / (mels + 2)) as onnxruntime and the reference do.
    edges_mel = np.arange(mels + 2) * ((hi_mel - lo_mel) / (mels + 2)) + lo_mel
    hz = 700 * np.expm1(edges_mel / 2595 * np.log(10))
    bins = (((n_fft + 1) * hz) // rate).astype(np.int64)
    left, center, right = bins[:-2], bins[1:-1], bins[2:]
    j = np.arange(n_fft // 2 + 1, dtype=np.int64)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        rise = np.where(center > left, (j - left) / np.maximum(center - left, 1), 1.0)
        fall = (right - j) / np.maximum(right - center, 1)
    weights = np.zeros((j.shape[0], mels))
    weights = np.where((j >= left) & (j <= center), rise, weights)
    weights = np.where((j >= center) & (j < right), fall, weights)
    return as_out(weights.astype(dtypes.np_dtype(int(output_datatype))), out)
