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


# Outputs per recurrent op: Y, Y_h (and LSTM's Y_c).
_RECURRENT_OUTPUTS = {"LSTM": 3, "GRU": 2, "RNN": 2}


@meta(["LSTM", "GRU", "RNN"])
def recurrent(ctx):
    """Y [seq, directions, batch, hidden] and Y_h (Y_c) [directions, batch, hidden]; with
    layout=1 batch first: Y [batch, seq, directions, hidden], Y_h [batch, directions, hidden].
    (A meta of its own: onnx's generic inference, the fallback, imports the onnx package,
    ~30 ms of a fresh process's first session: Silero VAD's.)"""
    x = ctx.shape(0)
    for i, what in ((0, "X"), (1, "W"), (2, "R")):
        r = ctx.rank(i)
        if r is not None and r != 3:
            ctx.fail(f"{what} must be 3-D, got rank {r}")
    direction = ctx.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        ctx.fail(f"direction must be forward, reverse or bidirectional, got {direction!r}")
    dirs = 2 if direction == "bidirectional" else 1
    hidden, r_shape = ctx.attr("hidden_size", None), ctx.shape(2)
    if hidden is not None:
        hidden = int(hidden)
    else:  # (onnx leaves it unknown; R [directions, gates·hidden, hidden] says it)
        hidden = r_shape[2] if r_shape is not None else symbolic.fresh("hidden")
    batch_first = int(ctx.attr("layout", 0)) == 1
    if x is None:
        seq, batch = symbolic.fresh("seq"), symbolic.fresh("batch")
    else:
        seq, batch = (x[1], x[0]) if batch_first else (x[0], x[1])
    y = (batch, seq, dirs, hidden) if batch_first else (seq, dirs, batch, hidden)
    state = (batch, dirs, hidden) if batch_first else (dirs, batch, hidden)
    dt = ctx.dtype(0)
    outs = [ctx.tensor(dt, y)] + [ctx.tensor(dt, state)] * (_RECURRENT_OUTPUTS[ctx.node.op_type] - 1)
    return outs[:max(1, len(ctx.node.outputs))]
