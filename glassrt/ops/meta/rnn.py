"""Signal ops whose onnx shape inference is incomplete."""
from __future__ import annotations

from ... import symbolic
from ..registry import meta


@meta("STFT")
def stft(ctx):
    """[batch, frames, bins, 2]; bins = L//2 + 1 when onesided, L = frame_length or the window's length."""
    x = ctx.shape(0)
    step = ctx.const(1)
    window = ctx.shape(2) if ctx.has(2) else None
    length = ctx.const(3) if ctx.has(3) else None
    L = int(length.reshape(-1)[0]) if length is not None else (window[0] if window is not None else None)
    if x is None or step is None or L is None:
        return [ctx.tensor(ctx.dtype(0), (x[0] if x else symbolic.fresh(), symbolic.fresh("stft"),
                                          symbolic.fresh("stft"), 2))]
    frames = (x[1] - L) // int(step.reshape(-1)[0]) + 1
    bins = L // 2 + 1 if int(ctx.attr("onesided", 1)) else L
    return [ctx.tensor(ctx.dtype(0), (x[0], symbolic.normalize(frames) if not isinstance(frames, int) else frames,
                                      bins, 2))]
