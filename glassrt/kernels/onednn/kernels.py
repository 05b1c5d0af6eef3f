"""The `onednn` provider's kernels: convolutions (bias, residual and activation fused as
post-ops), pooling, concat, activations, batch normalization, LRN and Add, float32, 2-D.

Layouts. oneDNN's fastest convolutions on AVX2 read and write NHWC activations. A 4-D value
whose producer and every reader are these kernels lives in NHWC: placement decides it
(runtime/layout.py), the plan hands kernels NHWC-strided views of the logical NCHW shape,
and `ctx.layouts` tells a kernel which of its values are NHWC when it binds. A conv whose
input is plain NCHW (a graph input, a cpu node's output) reorders it into its workspace
first (reading NCHW while writing NHWC, oneDNN 3.2 has
only its reference implementation); a conv whose output is read elsewhere writes NHWC into
its workspace and reorders it into the NCHW output. Pooling, concat and the elementwise kernels read and
write either layout directly.

Weights and biases are constants, reordered once into the layout the primitive chose. A conv
for which oneDNN has only its generic im2col+GEMM or reference code is left to the cpu
provider (`_SLOW_IMPLS`).

Threads: the kernels run on OpenMP's threads; a session with this provider runs everything
on that one pool (the cpu kernels' matrix products through oneDNN's sgemm, kernels/gemm.py).

Threads. A oneDNN primitive runs with the OpenMP thread count that was current when it
was made; each kernel keeps one set of primitives per thread count and runs the set of
the count the run asked for (runtime/threads.py sets it per run).
"""
from __future__ import annotations

import collections
import functools
import math
import threading
import weakref

import numpy as np

from ...ops.fused import fused_conv_quantizes
from ...ops.geometry import spatial_pads
from ...weights import is_mapped, release_pages
from ..buffers import NHWC
from ..registry import before_first_run, kernel
from . import ahead, capi, dnnl
from .dnnl import ARG_BIAS, ARG_DST, ARG_FROM, ARG_MEAN, ARG_MULTIPLE_SRC, ARG_SCALE, ARG_SHIFT, ARG_SRC, \
    ARG_SRC_0, ARG_SRC_1, ARG_TO, ARG_VARIANCE, ARG_WEIGHTS, MemoryDesc

F32 = [np.float32]
LAYOUTS = (NHWC,)


def _fmt(layout: str) -> str:
    return "acdb" if layout == NHWC else "abcd"


def _buffer(a: np.ndarray, layout: str) -> np.ndarray:
    """What oneDNN reads or writes for value `a`: the (N, H, W, C) buffer behind an
    NHWC-strided view, or a C-contiguous NCHW array."""
    if layout == NHWC:  # (N, H, W, C), or (N, W, C) for a 1-D signal
        return a.transpose(0, *range(2, a.ndim), 1)
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


class KeptViews:
    """Per argument slot, what make(a, *args) gives for array a (a view of it: a layout's
    buffer, a reshape), kept while the same array object comes back: a plan hands its kernels
    the same arena views every run, so a run makes no new view, and a bound oneDNN memory
    sees an unchanged argument and is not re-pointed (a checked set costs ~10 µs, as much as
    a small primitive: 1.4 ms of shufflenet's 8). Only views are kept: a copy (a strided
    array made dense, another dtype) holds the values of the run that made it, so it is made
    again every run."""

    __slots__ = ("last", "make")

    def __init__(self, make):
        self.last, self.make = {}, make

    def kept(self, slot, a) -> bool:
        """Whether the last call for `slot` was for `a` and kept a view of it (not a copy)."""
        hit = self.last.get(slot)
        return hit is not None and hit[0] is a

    def __call__(self, slot, a: np.ndarray, *args) -> np.ndarray:
        hit = self.last.get(slot)
        if hit is not None and hit[0] is a:
            return hit[1]
        v = self.make(a, *args)
        if np.may_share_memory(v, a):
            self.last[slot] = a, v
        else:
            self.last.pop(slot, None)
        return v


class _Views(KeptViews):
    """views(slot, a, layout): `_buffer` of a value in its layout, kept (KeptViews)."""

    __slots__ = ()

    def __init__(self):
        super().__init__(_buffer)


def _workspace_views(ws, *sizes):
    """float32 buffers of `sizes` elements each, one after the other in the workspace."""
    out, at = [], 0
    for n in sizes:
        nbytes = -(-n * 4 // 64) * 64
        out.append(ws[at:at + n * 4].view(np.float32) if ws is not None else np.empty(n, np.float32))
        at += nbytes
    return out


def _ws_bytes(*sizes) -> int:
    return sum(-(-n * 4 // 64) * 64 for n in sizes)


def _same_memory(shape) -> bool:
    """NCHW and NHWC are the same bytes when there is one pixel or one channel."""
    return int(shape[2]) * int(shape[3]) == 1 or int(shape[1]) == 1


class _LayoutChange:
    """For a primitive that must write the layout it reads (oneDNN 3.2 has only reference
    implementations of pooling and elementwise ops that read one layout and write another):
    it writes into the workspace in its input's layout, and a reorder writes the output."""

    def __init__(self, ctx, in_layout, out_layout, y_shape):
        self.needed = in_layout != out_layout and not _same_memory(y_shape)
        self.dst_format = _fmt(in_layout) if self.needed or _same_memory(y_shape) else _fmt(out_layout)
        self.y, self.in_layout, self.out_layout = [int(d) for d in y_shape], in_layout, out_layout
        n = math.prod(self.y)
        self.buffer = _workspace_views(ctx.workspace, n)[0] if self.needed else None
        self.staged_view = self.staged() if self.needed else None

    @staticmethod
    def workspace(ctx, in_layout, out_layout, y_shape) -> int:
        return _ws_bytes(math.prod(y_shape)) if in_layout != out_layout and not _same_memory(y_shape) else 0

    def dst(self, out, views):
        """The array the primitive writes."""
        if self.needed:
            return self.staged_view
        return views("dst", out, self.in_layout if _same_memory(self.y) else self.out_layout)

    def staged(self):
        n, c, h, w = self.y
        return self.buffer.reshape(n, h, w, c) if self.in_layout == NHWC else self.buffer.reshape(n, c, h, w)

    def reorder(self):
        """A bound reorder from the staged result into the output's layout (None if not needed)."""
        if not self.needed:
            return None
        return shared_reorder(MemoryDesc.create(self.y, np.float32, _fmt(self.in_layout)),
                              MemoryDesc.create(self.y, np.float32, _fmt(self.out_layout))) \
            .primitive().bind({ARG_FROM: self.staged(), ARG_TO: None})

    def finish(self, reorder, out, views):
        if reorder is not None:
            reorder.run({ARG_TO: views("to", out, self.out_layout)})


def _contiguous32(a, shape=(-1,)):
    return np.ascontiguousarray(a, np.float32).reshape(shape)


class ContiguousViews(KeptViews):
    """views(slot, a[, shape]): the array as C-contiguous float32 of a given shape, kept
    (KeptViews: a view of a C-contiguous float32 array; anything else copied every run)."""

    __slots__ = ()

    def __init__(self):
        super().__init__(_contiguous32)


class _PerThreads:
    """One set of bound primitives per OpenMP thread count, made on first use."""

    def __init__(self, build):
        self.build, self.sets = build, {}

    def get(self):
        n = capi.get_max_threads()
        s = self.sets.get(n)
        if s is None:
            s = self.sets[n] = self.build()
        return s


_SHARED: dict = {}
_SHARED_LIMIT = 512
before_first_run.append(ahead.make_queued)


def shared_pd(key, make, ahead: bool = False):
    """The primitive descriptor `make()` gives, shared by every kernel whose primitive has the
    same `key` (what the descriptor is made from) at the same OpenMP thread count (oneDNN's
    kernels are built for it): a model's identical convolutions and reorders then make one
    descriptor and one primitive (shufflenet: 49 convolutions, 14 distinct; a descriptor takes
    ~0.15 ms, a primitive more) instead of one each. oneDNN's own primitive cache already
    shares the compiled kernel between equal descriptors, so sharing changes nothing about how
    they run; each kernel still binds its own memories. Bounded below oneDNN's own primitive
    cache (1,024 by default, ~130 KB of JIT code per convolution measured): what this keeps
    alive, oneDNN's cache keeps too.

    ahead=True: a descriptor that placement or plan selection makes to ask its implementation,
    before a first run binds it (a conv's, a matmul's): its primitive is queued, made on two
    threads as that run begins (ahead.py)."""
    key = (capi.get_max_threads(), key)
    pd = _SHARED.get(key)
    if pd is None:
        if len(_SHARED) >= _SHARED_LIMIT:
            _SHARED.pop(next(iter(_SHARED)))
        pd = _SHARED[key] = make()
        if ahead:  # (a maker may give the descriptor with what binding it needs)
            (pd[0] if isinstance(pd, tuple) else pd).make_ahead()
    return pd


def shared_reorder(src: MemoryDesc, dst: MemoryDesc):
    return shared_pd(("reorder", src, dst), lambda: dnnl.reorder(src, dst))


class _Packed:
    """Weights reordered for a primitive, and the constant they came from (kept alive with
    them, so that the constant's id cannot be reused while the entry exists)."""

    __slots__ = ("__weakref__", "memory", "source")

    def __init__(self, source, memory):
        self.source, self.memory = source, memory


_PACKED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
# the keys of _PACKED by the weights they were packed from (packed_layouts), oldest first;
# the weights whose copies are all gone are dropped once this outgrows _PACKED
_PACKED_BY_SOURCE: dict = {}


def _source_key(source: np.ndarray) -> tuple:
    return source.__array_interface__["data"][0], source.shape, source.strides, source.dtype.str


def packed_weights(source: np.ndarray, user, target) -> _Packed:
    """`source` (laid out as `user`) reordered into `target`, shared by every kernel that
    asks for the same constant in the same layout: each plan of a session binds its own
    kernels (a prompt plan and a decode plan; one plan per batch size), and a copy per
    plan would hold the model's weights once more each. Kept while a kernel holds it.
    Weights are known by where they lie (a tied weight's view, made again by each kernel,
    is the same weights); the entry keeps them alive, so no other array can take their place."""
    head = _source_key(source)
    key = (*head, target, user)
    hit = _PACKED.get(key)
    if hit is None:
        # weights mapped from their file: the copy is what runs read, so the file's pages
        # need not stay resident beside it (they stay in the page cache; weights.py), and
        # a large one is reordered a slab at a time, each slab's pages dropped once read,
        # so that creating a session never holds it twice (a process's peak memory)
        done = (lambda start, stop: release_pages(source, start, stop)) if is_mapped(source) else None
        hit = _Packed(source, dnnl.prepack(source, user, target, make_reorder=shared_reorder,
                                           slab_bytes=PACK_SLAB, done=done))
        _PACKED[key] = hit
        if len(_PACKED_BY_SOURCE) > 2 * len(_PACKED) + 64:
            # (a copy of the items: another thread's plan may be packing its weights meanwhile)
            for h, keys in list(_PACKED_BY_SOURCE.items()):
                if not any(k in _PACKED for k in keys):
                    _PACKED_BY_SOURCE.pop(h, None)
        _PACKED_BY_SOURCE.setdefault(head, []).append(key)
        release_pages(source)
    return hit


def packed_layouts(source: np.ndarray, user) -> list:
    """The layouts `source` (laid out as `user`) lies packed in already (packed_weights),
    oldest first: a kernel whose primitive can read one of them shares that copy rather than
    pack another (matmul.py's one-row inner products)."""
    head = _source_key(source)
    keys = _PACKED_BY_SOURCE.get(head)
    if not keys:
        return []
    live = [k for k in list(keys) if k in _PACKED]
    return [k[4] for k in live if k[5] == user]


# Bytes of a mapped weight reordered at a time (packed_weights): the most a weight is held
# twice while packed. Each slab is one more (cached) reorder descriptor to make.
PACK_SLAB = 256 << 10


# Work below which a primitive runs on the calling thread alone. oneDNN splits a primitive's
# work statically, one share per thread, so every parallel call waits for its slowest
# thread, and a fork/join costs a few microseconds: small row ops (SMALL_ELEMENTS) and
# small products (SMALL_PRODUCT multiply-adds) are faster on one thread. Above that even a
# vector-matrix product (decoding) gains from two: measured on the 2-core machine, oneDNN's
# packed gemm at one row, 1 vs 2 threads: 256x256 8 vs 13 us, 512x512 28 vs 28 us, 768x768
# 104 vs 47 us, 3072x768 754 vs 481 us, 768x3072 568 vs 599 us. (On a busy machine a
# share whose thread is switched out costs a time slice; the plan's ThreadChoice then runs
# everything on one thread.)
SMALL_ELEMENTS = 1 << 15
SMALL_PRODUCT = SMALL_ELEMENTS * 8


# Steps bound for shapes known only at run time (matmul_rows.py): one per (thread, OpenMP
# thread count, what the primitive is made from), shared by every node that asks for it, the
# least recently used dropped past _THREAD_STEPS_LIMIT
_THREAD_STEPS: collections.OrderedDict = collections.OrderedDict()
_THREAD_STEPS_LIMIT = 256
_thread_steps_lock = threading.Lock()


def thread_step(key, make):
    """make()'s bound step (a dnnl.Step, or a tuple holding one first) for `key`, shared by
    the kernels of this thread that ask with the same key: each call points its memories
    at its own arrays (run_and_let_go), so nodes of one geometry share one step, and a new
    shape costs one binding, not one per node. Not run by two threads at once: one per thread."""
    key = (threading.get_ident(), capi.get_max_threads(), key)
    with _thread_steps_lock:
        hit = _THREAD_STEPS.get(key)
        if hit is not None:
            _THREAD_STEPS.move_to_end(key)
            return hit
    hit = make()
    with _thread_steps_lock:
        _THREAD_STEPS[key] = hit
        while len(_THREAD_STEPS) > _THREAD_STEPS_LIMIT:
            _THREAD_STEPS.popitem(last=False)
    return hit


class NodeMemo:
    """What a node bound for a shape on this thread (a thread_step and its arguments), by
    (thread, OpenMP threads, key), so that a run asks the shared caches once per shape: the
    latest MEMO_PER_NODE shapes are kept (matmul_rows.py's products, rows.py's row ops)."""

    MEMO_PER_NODE = 64

    __slots__ = ("memo",)

    def __init__(self):
        self.memo = collections.OrderedDict()

    def get(self, key, make):
        """make()'s result for `key` on this thread, made on first use."""
        k = (threading.get_ident(), capi.get_max_threads(), key)
        hit = self.memo.get(k)
        if hit is None:
            hit = self.memo[k] = make()
            if len(self.memo) > self.MEMO_PER_NODE:
                self.memo.popitem(last=False)
        return hit


def run_and_let_go(step, buffers, alone: bool) -> None:
    """run_alone, then the shared step's memories let go of this call's arrays: a run's pool
    buffers go back to the pool only where nothing else holds them, and a node's weights must
    not outlive its session in a step other sessions share. (The next call points them again.)"""
    try:
        run_alone(step, buffers, alone)
    finally:
        for arg in buffers:
            step[arg].array = None


def run_alone(step, buffers, alone: bool = True):
    """step.run(buffers) on one OpenMP thread (the caller's) when `alone`, the count
    restored after; else as the step's primitive was made."""
    n = capi.get_max_threads() if alone else 1
    if n == 1:
        step.run(buffers)
        return
    capi.set_num_threads(1)
    try:
        step.run(buffers)
    finally:
        capi.set_num_threads(n)


# Elements of one tensor beyond which a node stays off oneDNN: its kernels index with 32-bit
# ints in places, and a descriptor for a declared batch of 2**40 (a hostile model) ended
# the process with SIGFPE inside dnnl_matmul_primitive_desc_create (brgemm, AVX-512).
MAX_ELEMENTS = (1 << 31) - 1


def _unavailable(ctx):
    """Why no oneDNN kernel can take the node whatever its op: the library is missing, or
    a tensor of the node is larger than oneDNN's kernels index. Every kernel asks this first."""
    if capi.UNAVAILABLE:
        return f"oneDNN is unavailable: {capi.UNAVAILABLE}"
    for t in (*ctx.input_types, *ctx.output_types):
        shape = getattr(t, "shape", None)
        if shape is not None and t.is_static and math.prod(shape) > MAX_ELEMENTS:
            return f"a tensor of {math.prod(shape):,} elements ({list(shape)}): more than oneDNN's kernels index"
    return None


def _static_4d(ctx, inputs=(0,)):
    for i in inputs:
        shape = ctx.shape(i)
        if shape is None or len(shape) != 4:
            return f"input {i} is not 4-D (these kernels are for 2-D images)"
    return None


# ---------------------------------------------------------------- convolution

_ACTIVATIONS = ("", "Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "Swish", "HardSwish")


def _conv_geometry(ctx):
    """(x, w, kernel, pads begin, pads end, y, strides, dilations) as lists of ints, always
    those of a 2-D conv (_geometry: a 1-D conv or a column is given as a row). Asked a dozen
    times per conv while placing and binding: computed once per distinct conv, and looked
    up once per context (the lists are shared: read them, do not change them)."""
    return ctx.cached("conv geometry", lambda: _conv_geometry_now(ctx))


def _conv_geometry_now(ctx):
    a = ctx.attrs
    opt = lambda name: None if a.get(name) is None else tuple(a[name])  # noqa: E731
    got = _geometry(tuple(ctx.shape(0)), tuple(ctx.shape(1)), opt("kernel_shape"), opt("strides"),
                    opt("dilations"), opt("pads"), a.get("auto_pad", "NOTSET"))
    return [list(v) for v in got]


@functools.lru_cache(maxsize=4096)
def _geometry(x, w, kernel_shape, strides, dilations, pads, auto_pad):
    x, w = [int(d) for d in x], [int(d) for d in w]
    k = [int(v) for v in (kernel_shape or w[2:])]
    begin, end, out, strides, dil = spatial_pads(x[2:], k, strides, dilations, pads, auto_pad)
    y = [x[0], w[0], *out]
    spatial = (x, w, y)
    if len(x) == 3:
        # A 1-D conv is the 2-D conv of height 1 over the same bytes (NCW as NC1W, NWC as
        # N1WC): oneDNN's kernels then take it (audio models: Silero VAD, wake-word nets).
        x, w, y = ([*v[:2], 1, v[2]] for v in spatial)
        k, begin, end, strides, dil = [1, *k], [0, *begin], [0, *end], [1, *strides], [1, *dil]
    elif k[1] == 1 and x[3] == 1 and begin[1] == end[1] == 0:
        # A column (width 1, a (k, 1) kernel) is the row of its transpose, the same bytes in
        # NCHW and NHWC alike. oneDNN's brgconv blocks along the width: magika's (1, 256, 512, 1)
        # conv with a (5, 1) kernel ran 6.5 ms as a column, 1.7 ms as a row.
        x, w, y = ([*v[:2], v[3], v[2]] for v in spatial)
        k, begin, end, strides, dil = (v[::-1] for v in (k, begin, end, strides, dil))
    return tuple(x), tuple(w), tuple(k), tuple(begin), tuple(end), tuple(y), tuple(strides), tuple(dil)


def _conv_common_reason(ctx):
    why = _unavailable(ctx)
    if why:
        return why
    shape = ctx.shape(0)
    if shape is None or len(shape) not in (3, 4):
        return "input 0 is not 3-D or 4-D (these kernels are for 1-D signals and 2-D images)"
    if ctx.const(1) is None:
        return "the weights are not a constant (they are reordered once, when the plan is built)"
    if ctx.has(2) and ctx.const(2) is None:
        return "the bias is not a constant"
    act = ctx.attrs.get("activation", "")
    if act not in _ACTIVATIONS:
        return f"activation {act} has no oneDNN post-op here"
    if _quantizes(ctx) and _quantize_spec(ctx) is None:
        return ("the fused quantization's scale or zero point is computed at run time or holds more than one "
                "value (the primitive fixes them)")
    if min(_conv_geometry(ctx)[5]) <= 0:
        return "an empty output"
    return None


def _grouped_impl(ctx, group: int) -> str:
    """oneDNN's implementation for the node's conv with its weights seen as `group` groups
    (1: the dense conv of block-diagonal weights), a residual read in NHWC as the region
    around the conv will have it (layouts are chosen after placement)."""
    return _conv_pd(ctx, group, z_layout=NHWC).impl


def _conv_pd(ctx, group: int, z_layout=None):
    """The primitive descriptor of the node's conv (NHWC, its bias and post-ops) with the
    weights seen as `group` groups: made once and shared (shared_pd) by the predicates that
    ask its implementation and the binding that runs it, and by identical convs; looked up
    once per context and OpenMP thread count (its reasons and its binding ask it four times;
    a descriptor is made for its thread count, shared_pd)."""
    return ctx.cached(("conv pd", group, z_layout, capi.get_max_threads()),
                      lambda: _conv_pd_now(ctx, group, z_layout))


def _conv_pd_now(ctx, group: int, z_layout):
    x, w, k, begin, end, y, strides, dil = _conv_geometry(ctx)
    w = (w[0], w[1] * int(ctx.attrs.get("group", 1)) // group, *w[2:])
    bias = ctx.has(2)
    key = ("conv", tuple(x), w, group, tuple(strides), tuple(dil), tuple(begin + end), bias,
           _post_spec(ctx, z_layout))
    return shared_pd(key, lambda: dnnl.conv(x, w, group=group, strides=strides, dilations=dil, pads=begin + end,
                                            bias=bias, src_format="acdb", dst_format="acdb",
                                            post_ops=_post_ops(ctx, y, z_layout)[0]), ahead=True)


def _conv_reason(ctx):
    why = _conv_common_reason(ctx)
    if why:
        return why
    group = int(ctx.attrs.get("group", 1))
    impl = _grouped_impl(ctx, group)
    if impl.startswith(_SLOW_IMPLS):
        return (f"oneDNN has only its generic implementation ({impl}) for this shape "
                f"(group {group}, {ctx.shape(1)[1]} input channels per group), slower than glassrt's kernels")
    return None


# oneDNN's fallbacks when no jit kernel fits a shape (e.g. a grouped conv with 6 channels per
# group): shufflenet's 24>112 group-4 1x1 conv ran 1.28 ms in x64:gemm:jit, 0.3 ms in cpu.gemm_1x1.
_SLOW_IMPLS = ("x64:gemm", "gemm:", "ref")

# A grouped conv runs as a dense one (`dense_groups`) only while that multiplies its FLOPs by
# at most this much and its block-diagonal weights stay small.
DENSE_GROUPS_MAX = 8
DENSE_WEIGHT_BYTES_MAX = 1 << 22


def _grouped(ctx):
    """dense_groups' `applies`: a conv of one group is not its case, whatever the shapes."""
    return None if int(ctx.attrs.get("group", 1)) > 1 else "not a grouped conv"


def _dense_groups_reason(ctx):
    why = _conv_common_reason(ctx) or _grouped(ctx)
    if why:
        return why
    group = int(ctx.attrs.get("group", 1))
    if not _grouped_impl(ctx, group).startswith(_SLOW_IMPLS):
        return "oneDNN has a jit kernel for the grouped conv itself"
    if group > DENSE_GROUPS_MAX:
        return f"group {group}: as a dense conv it would do {group}x the work (at most {DENSE_GROUPS_MAX}x here)"
    w = ctx.shape(1)
    dense_bytes = 4 * math.prod(w) * group
    if dense_bytes > DENSE_WEIGHT_BYTES_MAX:
        return f"its block-diagonal weights would take {dense_bytes} bytes (at most {DENSE_WEIGHT_BYTES_MAX} here)"
    impl = _grouped_impl(ctx, 1)
    if impl.startswith(_SLOW_IMPLS):
        return f"oneDNN has only its generic implementation ({impl}) for the dense conv too"
    return None


def _block_diagonal(weights: np.ndarray, group: int) -> np.ndarray:
    """[M, C/g, kh, kw] grouped weights as [M, C, kh, kw] dense ones, zero outside each group's
    block: the dense conv then computes exactly the grouped one (the zeros add exact zeros)."""
    m, cg = weights.shape[:2]
    mg = m // group
    dense = np.zeros((m, cg * group, *weights.shape[2:]), np.float32)
    for g in range(group):
        dense[g * mg:(g + 1) * mg, g * cg:(g + 1) * cg] = weights[g * mg:(g + 1) * mg]
    return dense


def _residual(ctx):
    return ctx.node.op_type == "FusedConv" and len(ctx.node.inputs) > 3 and bool(ctx.node.inputs[3])


def _conv_layouts(ctx):
    """(layout of the input, does the input need a reorder, layout of the output)."""
    in_layout, out_layout = ctx.layout(ctx.node.inputs[0]), ctx.layout(ctx.node.outputs[0])
    return in_layout, in_layout != NHWC, out_layout


def _conv_workspace(ctx):
    if _conv_common_reason(ctx):
        return 0
    x, w, k, begin, end, y, strides, dil = _conv_geometry(ctx)
    in_layout, reorder_in, out_layout = _conv_layouts(ctx)
    return _ws_bytes(math.prod(x) if reorder_in else 0, math.prod(y) if out_layout != NHWC else 0)


# oneDNN 3.2's relu (alpha 0), clip and hardsigmoid are max/min instructions against the
# bound, which return the bound where the value is NaN (a Conv + Relu fed one NaN pixel gave
# 0 where the reference gives NaN); its leaky relu, sigmoid, tanh and hardswish keep NaN.
_NAN_TO_BOUND = {"Relu": "0", "Clip": "a bound", "HardSigmoid": "a bound"}


def activation_drops_nan(ctx) -> str | None:
    """Kernel.drops_nan of a kernel that applies the node's activation (a fused op's
    `activation` attribute, or the op itself) as a oneDNN eltwise."""
    op = ctx.node.op_type
    act = ctx.attrs.get("activation", "") if op.startswith("Fused") else op
    if act in _NAN_TO_BOUND:
        return f"oneDNN's {act.lower()} is a max/min instruction: NaN becomes {_NAN_TO_BOUND[act]}"
    return None


def conv_drops_nan(ctx) -> str | None:
    """Kernel.drops_nan of the FusedConv kernels: the activation's, or the fused
    quantization's clip (quantize.py's QuantizeDequantize)."""
    why = activation_drops_nan(ctx)
    if why is None and _quantizes(ctx):
        from .quantize import _fake_quant_drops_nan

        why = _fake_quant_drops_nan(ctx, 4, 5)
    return why


def _quantizes(ctx) -> bool:
    """A FusedConv that quantizes its output (q_scale, input 4: passes/fuse_conv_qdq.py)."""
    return fused_conv_quantizes(ctx.node)


def _quantize_spec(ctx):
    """(scale, zero point, lo, hi) of a FusedConv's fused quantization, from its constants;
    None where it has none or they are not one constant value each."""
    from .quantize import _fake_quant_params

    # (asked half a dozen times per conv by its reasons, descriptor and epilogue: once per context)
    return ctx.cached("quantize_spec", lambda: _fake_quant_params(ctx, 4, 5)) if _quantizes(ctx) else None


def _post_spec(ctx, z_layout=None) -> tuple:
    """The epilogue as plain data: (the residual's layout or None, activation, its params,
    the quantization's (zero point, lo, hi) or None; its scale is an argument)."""
    z = (z_layout or ctx.layout(ctx.node.inputs[3])) if _residual(ctx) else None
    q = _quantize_spec(ctx)
    return z, ctx.attrs.get("activation", ""), tuple(float(v) for v in ctx.attrs.get("activation_params") or ()), \
        None if q is None else tuple(float(v) for v in q[1:])


_POST_ARGS: dict = {}  # (epilogue spec, rank) -> (the residual's argument, the scale's arguments)


def _post_args(ctx, y_shape) -> tuple:
    """_post_ops' arguments (the residual's, the quantization scale's) without its oneDNN
    post-ops: they follow from the epilogue's spec, and a model's convs share a few specs
    (making the post-ops to read them took ~40 us of binding each conv)."""
    key = (_post_spec(ctx), len(y_shape))
    hit = _POST_ARGS.get(key)
    if hit is None:
        if len(_POST_ARGS) >= 4096:  # (specs carry zero points: a process that loads model after model)
            _POST_ARGS.clear()
        _, z_arg, scale_args = _post_ops(ctx, y_shape)
        hit = _POST_ARGS[key] = (z_arg, scale_args)
    return hit


def _post_ops(ctx, y_shape, z_layout=None):
    """(post-ops, the residual's argument or None, the arguments that take the
    quantization's scale): residual add, activation, quantization, in that order."""
    post = dnnl.PostOps()
    z_arg = None
    z_layout, act, params, quantize = _post_spec(ctx, z_layout)
    if z_layout is not None:
        post.binary("add", MemoryDesc.create(y_shape, np.float32, _fmt(z_layout)))
        z_arg = post.binary_arg()
    if act == "Relu":
        post.eltwise("relu")
    elif act == "LeakyRelu":
        post.eltwise("relu", alpha=params[0] if params else 0.01)
    elif act == "Clip":
        post.eltwise("clip", alpha=params[0], beta=params[1])
    elif act == "Sigmoid":
        post.eltwise("sigmoid")
    elif act in ("HardSigmoid", "HardSwish"):  # oneDNN 3's hardswish takes alpha and beta too
        post.eltwise(act.lower(), alpha=params[0], beta=params[1])
    elif act == "Swish":
        post.eltwise("swish", alpha=1.0)
    scale_args = ()
    if quantize is not None:
        from .quantize import fake_quant_post_ops

        first = len(post.ops)
        fake_quant_post_ops(post, *quantize, MemoryDesc.create((1,) * len(y_shape), np.float32, "abcd"[:len(y_shape)]))
        scale_args = (post.binary_arg(first), post.binary_arg())  # (the division's and the multiply's)
    return post, z_arg, scale_args


@kernel(["Conv"], provider="onednn", dtypes=F32, out=True, bind=True, accepts=_conv_reason, layouts=LAYOUTS,
        static_only=True, workspace=_conv_workspace, name="conv", drops_nan=activation_drops_nan)
def conv(ctx):
    """oneDNN convolution, NHWC activations, weights in the layout the primitive chose."""
    return _conv(ctx, dense_groups=False)


@kernel(["Conv"], provider="onednn", dtypes=F32, out=True, bind=True, accepts=_dense_groups_reason,
        applies=_grouped, layouts=LAYOUTS, static_only=True, workspace=_conv_workspace, name="dense_groups")
def conv_dense_groups(ctx):
    """A grouped conv oneDNN has no jit kernel for (a few channels per group: ShuffleNet's
    first 1x1), as one dense oneDNN conv with block-diagonal weights: group x the FLOPs, but a
    jit kernel, no Numba, and the NHWC region around it left unbroken."""
    return _conv(ctx, dense_groups=True)


def _conv(ctx, dense_groups: bool):
    x, w, k, begin, end, y, strides, dil = _conv_geometry(ctx)
    group = int(ctx.attrs.get("group", 1))
    in_layout, reorder_in, out_layout = _conv_layouts(ctx)
    weights = ctx.const(1)
    if dense_groups:
        weights, group = _block_diagonal(np.asarray(weights, np.float32), group), 1
    bias = np.ascontiguousarray(ctx.const(2), np.float32) if ctx.has(2) else None
    z_layout = ctx.layout(ctx.node.inputs[3]) if _residual(ctx) else None
    quantize = _quantize_spec(ctx)  # (the scale: one value broadcast, bound to the primitive)
    q_scale = None if quantize is None else np.full((1,) * len(y), quantize[0], np.float32)
    src_ws, dst_ws = _workspace_views(ctx.workspace, math.prod(x) if reorder_in else 0,
                                      math.prod(y) if out_layout != NHWC else 0)
    packed = {}  # weights reordered once per layout a primitive chose

    def build():
        z_arg, scale_args = _post_args(ctx, y)
        pd = _conv_pd(ctx, group)
        wmd = pd.weights_md()
        if wmd not in packed:
            packed[wmd] = packed_weights(weights, None, wmd)
        args = {ARG_SRC: None, ARG_WEIGHTS: packed[wmd].memory, ARG_DST: None}
        if bias is not None:
            args[ARG_BIAS] = bias
        if z_arg is not None:
            args[z_arg] = None
        for arg in scale_args:
            args[arg] = q_scale
        main = pd.primitive().bind(args)
        to_nhwc = shared_reorder(MemoryDesc.create(x, np.float32, "abcd"), MemoryDesc.create(x, np.float32, "acdb")) \
            .primitive().bind({ARG_FROM: None, ARG_TO: src_ws.reshape(x[0], x[2], x[3], x[1])}) if reorder_in else None
        to_nchw = shared_reorder(MemoryDesc.create(y, np.float32, "acdb"), MemoryDesc.create(y, np.float32, "abcd")) \
            .primitive().bind({ARG_FROM: dst_ws.reshape(y[0], y[2], y[3], y[1]), ARG_TO: None}) \
            if out_layout != NHWC else None
        return main, z_arg, to_nhwc, to_nchw

    prims = _PerThreads(build)
    src_nhwc = src_ws.reshape(x[0], x[2], x[3], x[1]) if reorder_in else None
    dst_nhwc = dst_ws.reshape(y[0], y[2], y[3], y[1]) if out_layout != NHWC else None

    views = _Views()
    last = [None, None, None, None]  # the arrays and primitives of the last run (see _same_as_last)

    def step(xa, wa=None, ba=None, za=None, q_scale_in=None, q_zero_point_in=None, *, out):
        p = prims.get()
        main, z_arg, to_nhwc, to_nchw = p
        if _same_as_last(last, xa, out, za, p):
            if to_nhwc is not None:
                to_nhwc.run()
            main.run()
            if to_nchw is not None:
                to_nchw.run()
            return out
        if to_nhwc is not None:
            to_nhwc.run({ARG_FROM: views("x", xa, "nchw")})
            src = src_nhwc
        else:
            src = views("x", xa, in_layout)
        buffers = {ARG_SRC: src, ARG_DST: dst_nhwc if to_nchw is not None else views("y", out, NHWC)}
        if z_arg is not None:
            buffers[z_arg] = views("z", za, z_layout)
        main.run(buffers)
        if to_nchw is not None:
            to_nchw.run({ARG_TO: views("y", out, "nchw")})
        kept = views.kept("x", xa) and views.kept("y", out) and (z_arg is None or views.kept("z", za))
        last[:] = (xa, out, za, p) if kept else (None,) * 4
        return out

    return step


# The same kernel runs glassrt::FusedConv (bias, residual, activation and quantization as post-ops).
kernel(["FusedConv"], provider="onednn", domain="glassrt", dtypes=F32, out=True, bind=True, accepts=_conv_reason,
       layouts=LAYOUTS, static_only=True, workspace=_conv_workspace, name="conv",
       drops_nan=conv_drops_nan)(conv)
kernel(["FusedConv"], provider="onednn", domain="glassrt", dtypes=F32, out=True, bind=True,
       accepts=_dense_groups_reason, applies=_grouped, layouts=LAYOUTS, static_only=True,
       workspace=_conv_workspace, name="dense_groups", drops_nan=conv_drops_nan)(conv_dense_groups)


# ---------------------------------------------------------------- pooling


def _pool_reason(ctx):
    why = _unavailable(ctx) or _static_4d(ctx)
    if why:
        return why
    if len([o for o in ctx.node.outputs if o]) > 1:
        return "the Indices output is not computed here"
    if ctx.node.op_type in ("MaxPool", "AveragePool"):
        if any(int(d) != 1 for d in ctx.attrs.get("dilations") or []):
            return "dilated pooling"
        if int(ctx.attrs.get("storage_order", 0)):
            return "storage_order=1"
        if ctx.node.op_type == "AveragePool" and int(ctx.attrs.get("count_include_pad", 0)) \
                and (int(ctx.attrs.get("ceil_mode", 0)) or _overruns(ctx)):
            return ("a window past the padded input with count_include_pad (ceil_mode's, or a kernel larger than "
                    "the input: the overrun would count in the divisor)")
    return None


def _overruns(ctx) -> bool:
    """Whether some window of a pooling reaches past its padded input (a kernel larger than
    the input by less than a stride: ops/meta/nn.py)."""
    x, kernel, strides, pads, _ = _pool_geometry(ctx)
    n = len(kernel)
    return any(x[2 + i] + pads[i] + pads[i + n] < kernel[i] for i in range(n))


def _io_layouts(ctx):
    return ctx.layout(ctx.node.inputs[0]), ctx.layout(ctx.node.outputs[0])


def _change_workspace(ctx):
    if ctx.shape(0) is None or len(ctx.shape(0)) != 4 or ctx.out_shape(0) is None:
        return 0
    return _LayoutChange.workspace(ctx, *_io_layouts(ctx), ctx.out_shape(0))


def _single_primitive(ctx, y_shape, make_pd, params=None):
    """The step of one primitive from input 0 to output 0, in the layouts the values have:
    `make_pd(src_format, dst_format)` makes its descriptor; `params` are constant arguments.
    Where the primitive cannot write the output's layout it writes the input's, staged in
    the workspace, and a reorder writes the output."""
    in_layout, out_layout = _io_layouts(ctx)
    change = _LayoutChange(ctx, in_layout, out_layout, y_shape)

    def build():
        pd = make_pd(_fmt(in_layout), change.dst_format)
        return pd.primitive().bind({ARG_SRC: None, ARG_DST: None, **(params or {})}), change.reorder()

    prims = _PerThreads(build)
    views = _Views()
    last = [None, None, None, None]

    def step(xa, *rest, out):
        p = prims.get()
        main, reorder = p
        if _same_as_last(last, xa, out, None, p):
            main.run()
            if reorder is not None:
                reorder.run()
            return out
        main.run({ARG_SRC: views("x", xa, in_layout), ARG_DST: change.dst(out, views)})
        change.finish(reorder, out, views)
        kept = views.kept("x", xa) and (change.needed or views.kept("dst", out)) and (
            reorder is None or views.kept("to", out))
        last[:] = (xa, out, None, p) if kept else (None,) * 4
        return out

    return step


def _same_as_last(last: list, x, out, z, prims) -> bool:
    """Whether a step's arrays and bound primitives are the very objects of its last run,
    whose every argument was a kept view of them (a copy, made dense, holds that run's
    values: `last` is cleared then): its memories point at them already, and a replayed
    plan's step only executes (a conv's views, dict and checks were ~1 us of a small step)."""
    return last[0] is x and last[1] is out and last[2] is z and last[3] is prims and x is not None


def _pool_geometry(ctx):
    """(x shape, kernel, strides, pads begin + end, ceil_mode) of a pooling node."""
    x = [int(d) for d in ctx.shape(0)]
    if ctx.node.op_type.startswith("Global"):
        return x, x[2:], [1, 1], [0, 0, 0, 0], False
    kernel_shape = [int(v) for v in ctx.attrs["kernel_shape"]]
    ceil = bool(int(ctx.attrs.get("ceil_mode", 0)))
    begin, end, _, strides, _ = spatial_pads(x[2:], kernel_shape, ctx.attrs.get("strides"), None,
                                             ctx.attrs.get("pads"), ctx.attrs.get("auto_pad", "NOTSET"), ceil)
    return x, kernel_shape, list(strides), list(begin) + list(end), ceil


@kernel(["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"], provider="onednn", dtypes=F32, out=True,
        bind=True, accepts=_pool_reason, layouts=LAYOUTS, static_only=True, name="pool", workspace=_change_workspace)
def pool(ctx):
    op = ctx.node.op_type
    x, kernel_shape, strides, pads, ceil = _pool_geometry(ctx)
    if "Max" in op:
        alg = "max"
    else:
        alg = "avg_include_padding" if int(ctx.attrs.get("count_include_pad", 0)) else "avg_exclude_padding"

    return _single_primitive(ctx, ctx.out_shape(0), lambda src, dst: dnnl.pool(
        x, kernel_shape, strides=strides, pads=pads, alg=alg, ceil_mode=ceil, src_format=src, dst_format=dst))


def _max_pool8_pd(ctx, layout):
    x, kernel_shape, strides, pads, ceil = _pool_geometry(ctx)
    key = ("max pool 8-bit", tuple(x), tuple(kernel_shape), tuple(strides), tuple(pads), ceil, ctx.dtype(0).str, layout)
    return shared_pd(key, lambda: dnnl.pool(x, kernel_shape, strides=strides, pads=pads, alg="max", ceil_mode=ceil,
                                            dtype=ctx.dtype(0), src_format=_fmt(layout), dst_format=_fmt(layout)))


def _max_pool8_reason(ctx):
    why = _pool_reason(ctx)
    if why:
        return why
    try:
        impl = _max_pool8_pd(ctx, NHWC).impl
    except Exception as e:  # noqa: BLE001 - a geometry oneDNN refuses: cpu's kernel reports it
        return f"oneDNN refuses this pooling ({type(e).__name__}: {e})"
    return f"oneDNN has only its reference kernel ({impl}) for it" if impl.startswith("ref") else None


@kernel(["MaxPool", "GlobalMaxPool"], provider="onednn", dtypes=[np.uint8, np.int8], out=True, bind=True,
        accepts=_max_pool8_reason, layouts=LAYOUTS, static_only=True, name="pool8")
def max_pool8(ctx):
    """Max pooling of 8-bit values (a quantized CNN's, between QLinearConvs: channels-last),
    exact (a maximum of bytes; padding never wins, as in ONNX). Written in its input's layout;
    an output in the other layout is copied in."""
    in_layout, out_layout = _io_layouts(ctx)
    prims = _PerThreads(lambda: _max_pool8_pd(ctx, in_layout).primitive().bind({ARG_SRC: None, ARG_DST: None}))
    views = _Views()
    n, c, h, w = [int(d) for d in ctx.out_shape(0)]

    def step(xa, *, out):
        if in_layout == out_layout:
            dst = views("dst", out, out_layout)
        else:
            dst = np.empty((n, h, w, c) if in_layout == NHWC else (n, c, h, w), out.dtype)
        prims.get().run({ARG_SRC: views("x", xa, in_layout), ARG_DST: dst})
        if in_layout != out_layout:
            np.copyto(out, dst.transpose(0, 3, 1, 2) if in_layout == NHWC else dst)
        return out

    return step


# ---------------------------------------------------------------- concat, elementwise


def _concat_reason(ctx):
    why = _unavailable(ctx) or _static_4d(ctx, range(len(ctx.node.inputs)))
    if why:
        return why
    if int(ctx.attrs.get("axis", 1)) not in (1, -3):
        return "concat along an axis other than the channels"
    if not all(ctx.node.inputs):
        return "an omitted input"
    return None


@kernel(["Concat"], provider="onednn", dtypes=F32, out=True, bind=True, accepts=_concat_reason, layouts=LAYOUTS,
        static_only=True, name="concat", workspace=_change_workspace)
def concat(ctx):
    names = list(ctx.node.inputs)
    shapes = [[int(d) for d in ctx.shape(i)] for i in range(len(names))]
    layouts = [ctx.layout(n) for n in names]
    out_layout = ctx.layout(ctx.node.outputs[0])
    y = [int(d) for d in ctx.out_shape(0)]
    change = _LayoutChange(ctx, layouts[0], out_layout, y)

    def build():
        pd = dnnl.concat([MemoryDesc.create(s, np.float32, _fmt(lay)) for s, lay in zip(shapes, layouts)], 1,
                         MemoryDesc.create(y, np.float32, change.dst_format))
        main = pd.primitive().bind({**{ARG_MULTIPLE_SRC + i: None for i in range(len(names))}, ARG_DST: None})
        return main, change.reorder()

    prims = _PerThreads(build)
    views = _Views()

    def step(*xs, out):
        main, reorder = prims.get()
        buffers = {ARG_MULTIPLE_SRC + i: views(i, a, lay) for i, (a, lay) in enumerate(zip(xs, layouts))}
        buffers[ARG_DST] = change.dst(out, views)
        main.run(buffers)
        change.finish(reorder, out, views)
        return out

    return step


def _split_reason(ctx):
    why = _unavailable(ctx) or _static_4d(ctx)
    if why:
        return why
    if int(ctx.attrs.get("axis", 0)) not in (1, -3):
        return "a split along an axis other than the channels"
    if not all(ctx.node.outputs):
        return "an omitted output"
    shapes = [ctx.out_shape(i) for i in range(len(ctx.node.outputs))]
    if any(s is None or len(s) != 4 or not all(isinstance(d, int) for d in s) for s in shapes):
        return "the pieces' shapes are not known when the plan is built"
    return None


@kernel(["Split"], provider="onednn", dtypes=F32 + [np.uint8, np.int8], out=True, multi=True, bind=True,
        accepts=_split_reason, layouts=LAYOUTS, static_only=True, name="split")
def split(ctx):
    """Channel pieces (YOLOv8's C2f blocks split a conv's output in two), each copied into a
    buffer of its own in its value's layout: a channel slice of an NHWC value is strided, and
    the primitives reading the pieces want them dense. Left to cpu.Split (views of an NCHW
    input), the pieces came out NCHW between NHWC convs, and a residual Add of a piece and a
    conv output ran oneDNN's reference binary on the two layouts: 4 ms for (1, 16, 80, 80).
    The same for a quantized C2f's 8-bit values (a NumPy copy, no oneDNN call): cpu's views
    made the Split's input NCHW, and the table activation writing it, the QLinearAdds and
    QLinearConcats reading the pieces took their mixed-layout NumPy paths (a YOLOv8n-style
    QOperator model: 0.67 ms for one (1, 32, 80, 80) table activation, 0.9 for one Concat)."""
    shapes = [tuple(int(d) for d in ctx.out_shape(i)) for i in range(len(ctx.node.outputs))]
    starts = np.cumsum([0] + [s[1] for s in shapes[:-1]]).tolist()

    def step(x, sizes=None, *, out):
        pieces = []
        for y, lo, shape in zip(out, starts, shapes):
            y = np.empty(shape, x.dtype) if y is None else y
            np.copyto(y, x[:, lo:lo + shape[1]])
            pieces.append(y)
        return tuple(pieces)

    return step


def _eltwise_reason(ctx):
    why = _unavailable(ctx) or _static_4d(ctx)
    if why:
        return why
    if ctx.node.op_type == "Clip" and ctx.node.opset >= 11:
        for i in (1, 2):
            if ctx.has(i) and (ctx.const(i) is None or ctx.const(i).size != 1):
                return "Clip bounds that are not constants"
    return None


def _eltwise_args(ctx):
    op = ctx.node.op_type
    if op == "LeakyRelu":
        return "relu", float(ctx.attrs.get("alpha", 0.01)), 0.0
    if op == "Clip":
        if ctx.node.opset < 11:
            return "clip", float(ctx.attrs.get("min", -3.4e38)), float(ctx.attrs.get("max", 3.4e38))
        lo = float(ctx.const(1).reshape(-1)[0]) if ctx.has(1) else -3.4e38
        hi = float(ctx.const(2).reshape(-1)[0]) if ctx.has(2) else 3.4e38
        return "clip", lo, hi
    if op == "HardSigmoid":
        return "hardsigmoid", float(ctx.attrs.get("alpha", 0.2)), float(ctx.attrs.get("beta", 0.5))
    if op == "HardSwish":
        return "hardswish", 1 / 6, 0.5
    return {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh"}[op], None, None


@kernel(["Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish"], provider="onednn", dtypes=F32,
        out=True, bind=True, accepts=_eltwise_reason, layouts=LAYOUTS, static_only=True, name="eltwise",
        workspace=_change_workspace, drops_nan=activation_drops_nan)
def eltwise(ctx):
    x = [int(d) for d in ctx.shape(0)]
    name, alpha, beta = _eltwise_args(ctx)
    return _single_primitive(ctx, x, lambda src, dst: dnnl.eltwise(
        MemoryDesc.create(x, np.float32, src), MemoryDesc.create(x, np.float32, dst), name, alpha, beta))


def _shuffle_reason(ctx):
    why = _unavailable(ctx) or _static_4d(ctx)
    if why:
        return why
    if int(ctx.shape(0)[1]) % int(ctx.attrs.get("group", 1)):
        return "the channels do not split into the groups"
    return None


@kernel(["ChannelShuffle"], provider="onednn", domain="glassrt", dtypes=F32, out=True, bind=True,
        accepts=_shuffle_reason, layouts=LAYOUTS, static_only=True, name="shuffle", workspace=_change_workspace)
def shuffle(ctx):
    """oneDNN's channel shuffle, in the value's layout (ShuffleNet: NHWC, inside the region)."""
    x = [int(d) for d in ctx.shape(0)]
    per_group = x[1] // int(ctx.attrs.get("group", 1))
    return _single_primitive(ctx, x, lambda src, dst: dnnl.shuffle(
        MemoryDesc.create(x, np.float32, src), MemoryDesc.create(x, np.float32, dst), axis=1, group_size=per_group))


def _add_reason(ctx):
    why = _unavailable(ctx) or _static_4d(ctx, (0, 1))
    if why:
        return why
    if tuple(ctx.shape(0)) != tuple(ctx.shape(1)):
        return "operands of different shapes (no broadcasting here)"
    return None


def _add_order(ctx):
    """(the input read as src0, its layout, src1's layout, the output's layout). oneDNN 3.2's
    binary has jit kernels only where src0 and dst share a layout (NCHW + NCHW -> NHWC is
    its reference kernel: 7.2 ms against 13 us at (1, 24, 80, 112), rapidocr-det's FPN):
    the operand in the output's layout goes first (Add and Mul commute, bit for bit)."""
    layouts = [ctx.layout(n) for n in ctx.node.inputs[:2]]
    out_layout = ctx.layout(ctx.node.outputs[0])
    first = 1 if layouts[0] != out_layout and layouts[1] == out_layout else 0
    return first, layouts[first], layouts[1 - first], out_layout


def _add_workspace(ctx):
    if _add_reason(ctx):
        return 0
    _, src0, _, out_layout = _add_order(ctx)
    return _LayoutChange.workspace(ctx, src0, out_layout, ctx.shape(0))


@kernel(["Add", "Mul"], provider="onednn", dtypes=F32, out=True, bind=True, accepts=_add_reason, layouts=LAYOUTS,
        static_only=True, name="binary", workspace=_add_workspace)
def add(ctx):
    """oneDNN's binary add or mul of two same-shape values (a residual Add; a SiLU's x ·
    sigmoid(x) where the convolution before it is not fused with it: a quantize_dynamic
    CNN's); where neither input is in the output's layout (both NCHW, the output NHWC),
    it writes the inputs' layout into the workspace and a reorder the output. One IEEE
    operation per element, as NumPy's: the same bits."""
    x = [int(d) for d in ctx.shape(0)]
    first, src0, src1, out_layout = _add_order(ctx)
    change = _LayoutChange(ctx, src0, out_layout, x)
    alg = ctx.node.op_type.lower()

    def build():
        pd = dnnl.binary(MemoryDesc.create(x, np.float32, _fmt(src0)), MemoryDesc.create(x, np.float32, _fmt(src1)),
                         MemoryDesc.create(x, np.float32, change.dst_format), alg)
        return pd.primitive().bind({ARG_SRC_0: None, ARG_SRC_1: None, ARG_DST: None}), change.reorder()

    prims = _PerThreads(build)
    views = _Views()

    def step(a, b, *, out):
        if first:
            a, b = b, a
        main, reorder = prims.get()
        main.run({ARG_SRC_0: views(0, a, src0), ARG_SRC_1: views(1, b, src1), ARG_DST: change.dst(out, views)})
        change.finish(reorder, out, views)
        return out

    return step


def _broadcast_operand(ctx):
    """(index of the input the output has the shape of, the other's 4-D shape, the other as
    a 4-D float32 constant or None) for a Mul or Add of a 4-D value and an operand that
    broadcasts into it: a constant, or a computed value of one element per channel (or one
    in all: a squeeze-and-excitation's scales, whose NCHW and NHWC bytes are the same);
    else None."""
    shapes = [ctx.shape(i) for i in (0, 1)]
    y = getattr(ctx.output_types[0], "shape", None) if ctx.output_types else None
    for k in (0, 1):
        x, other, c = shapes[k], shapes[1 - k], ctx.const(1 - k)
        if x is None or len(x) != 4 or other is None or len(other) > 4 or (y is not None and tuple(y) != tuple(x)):
            continue
        o4 = (1,) * (4 - len(other)) + tuple(other)
        if tuple(o4) == tuple(x) or any(d not in (1, xd) for d, xd in zip(o4, x)):
            continue  # (same shapes: the binary kernel's; growing x: not this kernel)
        if c is not None:
            if c.dtype == np.float32:
                return k, o4, np.ascontiguousarray(c.reshape(o4))
        elif o4[2] == o4[3] == 1 and ctx.const(k) is None:
            return k, o4, None
    return None


def _broadcast_binary_reason(ctx):
    why = _unavailable(ctx)
    if why:
        return why
    found = _broadcast_operand(ctx)
    if found is None:
        return ("not a 4-D value and a float32 constant that broadcasts into it, or a computed one with a value "
                "per channel (same-shape Add or Mul: the binary kernel)")
    if ctx.layouts is not None and ctx.layout(ctx.node.inputs[found[0]]) != NHWC \
            and ctx.layout(ctx.node.outputs[0]) != NHWC:
        # (a plan's layouts are known: placement judged the node before they were chosen)
        return ("the value and the result are plain NCHW here (between cpu's nodes: no NHWC region to keep), "
                "where cpu's loop costs less than a oneDNN call")
    return None


def _broadcast_binary_workspace(ctx):
    if _broadcast_binary_reason(ctx):
        return 0
    k, _, _ = _broadcast_operand(ctx)
    return _LayoutChange.workspace(ctx, ctx.layout(ctx.node.inputs[k]), ctx.layout(ctx.node.outputs[0]),
                                   ctx.shape(k))


@kernel(["Mul", "Add"], provider="onednn", dtypes=F32, out=True, bind=True, accepts=_broadcast_binary_reason,
        layouts=LAYOUTS, static_only=True, name="broadcast", workspace=_broadcast_binary_workspace)
def broadcast_binary(ctx):
    """A value times (or plus) a scalar or a per-channel operand, broadcast by oneDNN's
    binary primitive: PP-LCNetV3's learnable affine blocks (x·a + b after each HardSwish, 60
    in rapidocr-det) and squeeze-and-excitation scales stay in the NHWC region between
    convolutions instead of leaving it for cpu, through two reorders each. x·c and x + c
    are IEEE's, the cpu kernels' bits."""
    k, o4, c = _broadcast_operand(ctx)
    x = [int(d) for d in ctx.shape(k)]
    in_layout, out_layout = ctx.layout(ctx.node.inputs[k]), ctx.layout(ctx.node.outputs[0])
    change = _LayoutChange(ctx, in_layout, out_layout, x)
    alg = "mul" if ctx.node.op_type == "Mul" else "add"

    def build():
        pd = dnnl.binary(MemoryDesc.create(x, np.float32, _fmt(in_layout)), MemoryDesc.create(o4, np.float32, "abcd"),
                         MemoryDesc.create(x, np.float32, change.dst_format), alg)
        return pd.primitive().bind({ARG_SRC_0: None, ARG_SRC_1: c, ARG_DST: None}), change.reorder()

    prims = _PerThreads(build)
    views = _Views()
    per_channel = ContiguousViews()  # (a computed operand's (N, C, 1, 1): the same bytes in either layout)

    def step(a, b, *, out):
        main, reorder = prims.get()
        xa, other = (a, b) if k == 0 else (b, a)
        buffers = {ARG_SRC_0: views(0, xa, in_layout), ARG_DST: change.dst(out, views)}
        if c is None:
            buffers[ARG_SRC_1] = per_channel("o", other, o4)
        main.run(buffers)
        change.finish(reorder, out, views)
        return out

    return step


# ---------------------------------------------------------------- normalization


def _bn_reason(ctx):
    why = _unavailable(ctx) or _static_4d(ctx)
    if why:
        return why
    if int(ctx.attrs.get("training_mode", 0)) or not int(ctx.attrs.get("spatial", 1)):
        return "training mode or non-spatial batch normalization"
    if len([o for o in ctx.node.outputs if o]) != 1:
        return "running statistics outputs"
    if any(ctx.const(i) is None for i in range(1, 5)):
        return "scale, bias, mean and variance are not constants"
    act = ctx.attrs.get("activation", "")
    if act not in _BN_ACTIVATIONS:
        return f"activation {act}: oneDNN's batch normalization takes a Relu or LeakyRelu post-op only"
    return None


# what dnnl_batch_normalization_forward_primitive_desc_create (3.2, bnorm_jit) accepts as a
# post-op: any other eltwise (clip, logistic, swish, ...) answers `unimplemented`
_BN_ACTIVATIONS = ("", "Relu", "LeakyRelu")


@kernel(["BatchNormalization"], provider="onednn", dtypes=F32, out=True, bind=True, accepts=_bn_reason,
        layouts=LAYOUTS, static_only=True, name="batch_norm", workspace=_change_workspace)
def batch_norm(ctx):
    x = [int(d) for d in ctx.shape(0)]
    scale, shift, mean, var = (np.ascontiguousarray(ctx.const(i), np.float32).reshape(-1) for i in range(1, 5))
    eps = float(ctx.attrs.get("epsilon", 1e-5))
    post = _post_ops(ctx, x)[0]

    def make(src, dst):
        return dnnl.batch_norm(MemoryDesc.create(x, np.float32, src), MemoryDesc.create(x, np.float32, dst), eps,
                               attr=dnnl.Attr(post) if len(post) else None)

    return _single_primitive(ctx, x, make, {ARG_SCALE: scale, ARG_SHIFT: shift, ARG_MEAN: mean, ARG_VARIANCE: var})


kernel(["FusedBatchNormalization"], provider="onednn", domain="glassrt", dtypes=F32, out=True, bind=True,
       accepts=_bn_reason, layouts=LAYOUTS, static_only=True, name="batch_norm", workspace=_change_workspace,
       drops_nan=activation_drops_nan)(batch_norm)


def _lrn_reason(ctx):
    return _unavailable(ctx) or _static_4d(ctx)


@kernel(["LRN"], provider="onednn", dtypes=F32, out=True, bind=True, accepts=_lrn_reason, layouts=LAYOUTS,
        static_only=True, name="lrn", workspace=_change_workspace)
def lrn(ctx):
    x = [int(d) for d in ctx.shape(0)]
    size = int(ctx.attrs["size"])
    alpha, beta, bias = (float(ctx.attrs.get(a, d)) for a, d in (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)))
    return _single_primitive(ctx, x, lambda src, dst: dnnl.lrn(
        MemoryDesc.create(x, np.float32, src), MemoryDesc.create(x, np.float32, dst), size=size, alpha=alpha,
        beta=beta, k=bias))
