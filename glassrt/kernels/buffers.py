"""Writing results into the output buffers a plan hands its kernels (`out=`).

A kernel registered with `out=True` receives a view into the plan's memory arena (shape and
dtype already those of the op's meta) and must fill it; it receives None where the output
shape is only known at run time, and then allocates. These helpers keep such kernels short:

  * `new_out(out, shape, dtype)` — the planned buffer, or a fresh array when there is none;
  * `as_out(result, out)` — a result computed elsewhere, copied in (for kernels whose math
    cannot avoid a full-size temporary: the value still lives in the arena afterwards;
    `cast=True` converts a wider accumulator on the way);
  * `@computed_aside` — a kernel (or, with bind=True, a builder's step) whose results are
    computed by a library that allocates them (FFTs, tree ensembles...), copied in;
  * `write_elementwise(out, fn, *inputs)` — an elementwise expression evaluated tile by tile
    straight into `out`, so that its temporaries are a tile in size, not the tensor's.
    Every element is computed by the same NumPy operations as `fn(*inputs)` on the whole
    arrays, so the numbers are the same to the last bit;
  * `memory_order(a)` — a channels-last value's bytes as one flat array (a kernel that takes
    the NHWC layout and computes each element on its own works on those); `same_layout`
    those of several same-shape arrays, when their elements line up.

They know nothing of a provider: the cpu kernels and custom ops (glassrt/contrib, a
user's own) use them alike, and importing them costs nothing but NumPy.
"""
from __future__ import annotations

import math

import functools

import numpy as np

# Elements per tile: 256 KiB of float32, so that the few temporaries of a tile stay in L2 cache
# and below the megabyte a replayed run may allocate, while a tile is long enough that NumPy's
# per-call overhead (some microseconds per operation) stays small against the work.
TILE_ELEMENTS = 1 << 16

# The layout a kernel declares it takes (`layouts=(NHWC,)`) where it computes the same on
# channels-last values: 3-D and 4-D arrays of logical shape (N, C, *spatial) whose bytes lie
# (N, *spatial, C) (runtime/layout.py chooses which values).
NHWC = "nhwc"
NHWC_RANKS = (3, 4)  # the ranks a value may be channels-last at


def memory_order(a):
    """A 1-D view of a channels-last array's bytes in memory order; None for any other array
    (a C-contiguous one included: it needs no such view)."""
    if a.ndim not in NHWC_RANKS or a.flags.c_contiguous:
        return None
    m = a.transpose(0, *range(2, a.ndim), 1)
    return m.reshape(-1) if m.flags.c_contiguous else None


def same_layout(*arrays):
    """1-D views of same-shape arrays' elements in one order (their bytes' memory order:
    all C-contiguous, or all channels-last), or None where their layouts differ."""
    if all(a.flags.c_contiguous for a in arrays):
        return [a.reshape(-1) for a in arrays]
    flat = [memory_order(a) for a in arrays]
    return flat if all(f is not None for f in flat) else None


def new_out(out, shape, dtype):
    """`out` when the plan handed a buffer, else a new array of that shape and dtype."""
    return np.empty(shape, dtype) if out is None else out


def as_out(result, out, cast: bool = False):
    """Put `result` into `out` when a buffer was handed over; return what holds the value.
    A result whose shape (or, unless `cast`, dtype) is not the buffer's contradicts the op's
    meta: an error, never silently broadcast or converted."""
    if out is None:
        return result if isinstance(result, np.ndarray) else np.asarray(result)
    result = np.asarray(result)
    _check_fits(result, out, cast)
    np.copyto(out, result, casting="unsafe")
    return out


def _check_fits(result, out, cast):
    if result.shape != out.shape:
        raise ValueError(f"the result has shape {list(result.shape)}, the planned output {list(out.shape)}")
    if not cast and result.dtype != out.dtype:
        raise ValueError(f"the result has type {result.dtype}, the planned output {out.dtype}")


def tiles(shape, limit: int = TILE_ELEMENTS):
    """Index tuples that cover an array of `shape` in row-major blocks of at most `limit`
    elements (one block, `...`, when the whole array fits). A block is whole inner axes
    and a run of one outer axis, so it is contiguous in a C-ordered array."""
    shape = tuple(int(d) for d in shape)
    if math.prod(shape) <= limit:
        yield (Ellipsis,)
        return
    k, inner = len(shape) - 1, 1
    while k > 0 and inner * shape[k] <= limit:  # the innermost axes that fit whole
        inner *= shape[k]
        k -= 1
    step = max(1, limit // inner)
    for lead in np.ndindex(*shape[:k]):
        for start in range(0, shape[k], step):
            yield lead + (slice(start, min(start + step, shape[k])),)


def broadcast_inputs(out_shape, *inputs):
    """The inputs as read-only views broadcast to `out_shape`; raises when they do not
    broadcast to exactly that shape (a planned buffer is never filled by stretching)."""
    shapes = [np.shape(a) for a in inputs]
    try:
        got = np.broadcast_shapes(*shapes)
    except ValueError:
        raise ValueError(f"inputs of shapes {[list(s) for s in shapes]} do not broadcast") from None
    if tuple(got) != tuple(out_shape):
        raise ValueError(f"inputs of shapes {[list(s) for s in shapes]} broadcast to {list(got)}, "
                         f"not to the planned output {list(out_shape)}")
    return [np.broadcast_to(a, out_shape) for a in inputs]


def write_elementwise(out, fn, *inputs, limit: int = TILE_ELEMENTS):
    """fn(*inputs) — an elementwise function of arrays that broadcast together — written
    into `out` a tile at a time (returned as computed when `out` is None)."""
    if out is None:
        return fn(*inputs)
    views = broadcast_inputs(out.shape, *inputs)
    for idx in tiles(out.shape, limit):
        part = out[idx]
        got = np.asarray(fn(*(v[idx] for v in views)))
        _check_fits(got, part, cast=False)
        np.copyto(part, got)
    return out


def _put_all(result, out):
    """One result into out, or each of a tuple of results into its buffer."""
    if not isinstance(result, tuple):
        return as_out(result, out)
    bufs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    bufs = (bufs + (None,) * len(result))[:len(result)]
    return tuple(r if r is None else as_out(r, b) for r, b in zip(result, bufs))


def computed_aside(fn=None, *, bind=False):
    """Register-side adapter for kernels that compute their result aside: the kernel gets an
    `out=` keyword and its result (or each of its results) is copied into the planned buffer.
    With bind=True `fn` is a builder and the step it returns is adapted."""
    if fn is None:
        return functools.partial(computed_aside, bind=bind)

    def adapt(compute):
        @functools.wraps(compute)
        def into_out(*args, out=None, **attrs):
            return _put_all(compute(*args, **attrs), out)
        return into_out

    if not bind:
        return adapt(fn)

    @functools.wraps(fn)
    def builder(ctx):
        return adapt(fn(ctx))

    return builder
