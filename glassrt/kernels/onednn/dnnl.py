"""A small Pythonic layer over `capi`: engine, streams, memory descriptors, zero-copy memory
objects over NumPy buffers, primitive descriptors for CNN ops, and bound steps.

The life of a kernel:

    pd = conv(x_shape, w_shape, ..., src_format="any")      # oneDNN picks the layouts
    pd.impl                                                   # "brg:avx2", "jit:avx2", "gemm:jit", ...
    pd.src_md().format, pd.weights_md().size                  # "aBcd8b", bytes
    w = prepack(weights, user_md, pd.weights_md())            # one reorder, kept
    step = pd.primitive().bind({ARG_SRC: None, ARG_WEIGHTS: w, ARG_DST: None})
    step.run({ARG_SRC: x, ARG_DST: y})                        # set_data_handle + execute + wait

Ownership and lifetimes. Every handle is destroyed by its owner's `__del__` (`_Owned`) when
the Python object dies (never at interpreter exit: the engine may already be gone then). Memory
descriptors passed to a primitive descriptor's constructor are copied by oneDNN and can
die afterwards; memory descriptors returned by queries are owned by the primitive
descriptor, so `PrimitiveDesc.query_md` clones them. A `Memory` keeps a reference to the
NumPy array it wraps (and to the engine); a `Step` keeps its primitive and memories.

Threads. Streams are per thread (`stream()`). Primitive attributes default to the *user*
scratchpad mode: oneDNN 3.2's library mode shares one scratchpad among all primitives of a
thread and requires executing a primitive in the thread that created it; with user mode
each `Step` owns its scratchpad, so a primitive may be created in one thread and stepped in
another, and two Steps of one primitive may run at once in two threads. One Step must not
run in two threads at once. OpenMP thread counts are per calling thread in libgomp: see
`capi.set_num_threads`.
"""
from __future__ import annotations

import atexit
import ctypes
import functools
import math
import threading
from ctypes import byref, c_char_p, c_int, c_int32, c_void_p

import numpy as np

from ...pages import HUGE_PAGE, carve, os_buffer
from . import ahead, capi
from .capi import (  # noqa: F401
    ALG,
    ARG_ATTR_MULTIPLE_POST_OP,
    ARG_BIAS,
    ARG_DST,
    ARG_FROM,
    ARG_MEAN,
    ARG_MULTIPLE_SRC,
    ARG_SCALE,
    ARG_SCRATCHPAD,
    ARG_SHIFT,
    ARG_SRC,
    ARG_SRC_0,
    ARG_SRC_1,
    ARG_TO,
    ARG_VARIANCE,
    ARG_WEIGHTS,
    ARG_WORKSPACE,
    DnnlError,
    ExecArg,
    dims,
)

UNAVAILABLE = capi.UNAVAILABLE

_NP2DT = {np.dtype(np.float32): capi.f32, np.dtype(np.float16): capi.f16, np.dtype(np.int32): capi.s32,
          np.dtype(np.int8): capi.s8, np.dtype(np.uint8): capi.u8, np.dtype(np.float64): capi.f64,
          np.dtype(np.bool_): capi.boolean}
_DT2NP = {v: k for k, v in _NP2DT.items()}
ALIGN = 64


def data_type(dtype) -> int:
    """dnnl_data_type_t of a NumPy dtype (or 'bf16' / an int, which pass through)."""
    if isinstance(dtype, int):
        return dtype
    if isinstance(dtype, str) and dtype in capi.DATA_TYPES:
        return capi.DATA_TYPES[dtype]
    return _NP2DT[np.dtype(dtype)]


def _lib():
    return capi.require()


_exiting = [False]  # (a list: destructors keep it, see _Owned.__del__)


@atexit.register
def _at_exit():
    _exiting[0] = True  # handles still alive at exit are left to the OS


class _Owned:
    """Owns the oneDNN handle in `self.handle` and destroys it (with the class's
    `_destroy`, a dnnl_*_destroy name) when the object goes. __del__ rather than a
    weakref.finalize per object: binding a plan makes thousands of handles, and the
    finalizer cost more than making the handle."""

    __slots__ = ()
    _destroy = ""

    def __del__(self, _exiting=_exiting, _capi=capi):
        # (the module's state as default arguments: an object in a reference cycle is
        # destroyed by the interpreter's last collection, after module globals are cleared)
        try:
            h = getattr(self, "handle", None)
            if h is not None and h.value and not _exiting[0] and _capi.lib is not None:
                getattr(_capi.lib, self._destroy)(h)
        except Exception:  # nothing a destructor could report to
            pass


def _new_handle(create, *args) -> c_void_p:
    h = c_void_p()
    create(byref(h), *args)
    return h


def empty_aligned(nbytes: int, align: int = ALIGN, zero: bool = True) -> np.ndarray:
    """A uint8 array of nbytes whose data pointer is aligned; zeroed (blocked layouts
    with padded channels assume the padding holds zeros). From a huge page up the buffer
    is mapped from the OS (glassrt.pages: 2 MiB aligned, moved onto huge pages once a plan keeps running)."""
    if align <= HUGE_PAGE and zero:
        return os_buffer(nbytes) if nbytes >= HUGE_PAGE else carve(nbytes, align)
    raw = (np.zeros if zero else np.empty)(max(int(nbytes), 1) + align, np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off:off + int(nbytes)]


# --------------------------------------------------------------------------- engine, stream


class Engine(_Owned):
    _destroy = "dnnl_engine_destroy"

    def __init__(self, kind: int = capi.cpu, index: int = 0):
        lib = _lib()
        self.handle = _new_handle(lib.dnnl_engine_create, kind, index)
        self.kind, self.index = kind, index


class Stream(_Owned):
    _destroy = "dnnl_stream_destroy"

    def __init__(self, eng: Engine | None = None, flags: int = capi.stream_default_flags):
        lib = _lib()
        self.engine = eng or engine()
        self.handle = _new_handle(lib.dnnl_stream_create, self.engine.handle, flags)
        self.thread = threading.get_ident()

    def wait(self) -> None:
        _lib().dnnl_stream_wait(self.handle)


_engine: Engine | None = None
_engine_lock = threading.Lock()
_local = threading.local()


def engine() -> Engine:
    """The CPU engine (index 0), created once per process."""
    global _engine
    if _engine is None:
        with _engine_lock:
            if _engine is None:
                _engine = Engine()
    return _engine


def stream() -> Stream:
    """This thread's stream on the CPU engine."""
    s = getattr(_local, "stream", None)
    if s is None:
        s = _local.stream = Stream(engine())
    return s


# --------------------------------------------------------------------------- memory descriptors


def _memo(fn):
    """A MemoryDesc property computed once: a descriptor never changes after it is made, and
    binding a plan asks the same few questions of each one many times (thousands of ctypes
    queries for densenet121's primitives)."""
    name = fn.__name__

    def get(self):
        try:
            return self._memo[name]
        except KeyError:
            value = self._memo[name] = fn(self)
            return value

    return property(get, doc=fn.__doc__)


class MemoryDesc(_Owned):
    """An owned dnnl_memory_desc_t handle (opaque in 3.x) and what queries tell about it."""

    __slots__ = ("__weakref__", "_memo", "handle")
    _destroy = "dnnl_memory_desc_destroy"

    def __init__(self, handle: c_void_p):
        self.handle = handle
        self._memo = {}

    # construction
    @classmethod
    def create(cls, shape, dtype=np.float32, format="any") -> MemoryDesc:
        """From a shape, a dtype and a format tag: a name ('nchw', 'nChw8c', 'abcd', 'any',
        see capi.FORMAT_TAGS / FORMAT_TAG_ALIASES) or a dnnl_format_tag_t value."""
        shape = tuple(int(s) for s in shape)
        return cls(_new_handle(_lib().dnnl_memory_desc_create_with_tag, len(shape), dims(shape),
                               data_type(dtype), capi.format_tag(format)))

    @classmethod
    def any(cls, shape, dtype=np.float32) -> MemoryDesc:
        return cls.create(shape, dtype, "any")

    @classmethod
    def with_strides(cls, shape, dtype=np.float32, strides=None) -> MemoryDesc:
        """Strides in elements; None means C-contiguous."""
        shape = tuple(int(s) for s in shape)
        if strides is None:
            strides, acc = [], 1
            for s in reversed(shape):
                strides.append(acc)
                acc *= max(s, 1)
            strides = strides[::-1]
        return cls(_new_handle(_lib().dnnl_memory_desc_create_with_strides, len(shape), dims(shape),
                               data_type(dtype), dims(strides)))

    @classmethod
    def from_array(cls, a: np.ndarray) -> MemoryDesc:
        """The plain layout of a NumPy array (its strides; 0-d becomes shape (1,))."""
        return cls.plain(a.shape, a.strides, a.dtype)

    @classmethod
    def plain(cls, shape, strides, dtype) -> MemoryDesc:
        """The layout of an array of that shape, strides (in bytes) and dtype; 0-d becomes (1,)."""
        dtype = np.dtype(dtype)
        if not shape:
            return cls.with_strides((1,), dtype, (1,))
        isz = dtype.itemsize
        if any(s % isz for s in strides):
            raise ValueError("array strides are not multiples of its item size")
        return cls.with_strides(shape, dtype, [s // isz for s in strides])

    @classmethod
    def clone_of(cls, ptr) -> MemoryDesc | None:
        """An owned copy of a borrowed const_dnnl_memory_desc_t (None for NULL)."""
        if not ptr:
            return None
        return cls(_new_handle(_lib().dnnl_memory_desc_clone, ptr))

    # queries
    def _q(self, what: str, ctype):
        out = ctype()
        _lib().dnnl_memory_desc_query(self.handle, capi.QUERY[what], byref(out))
        return out.value if hasattr(out, "value") else out

    def _q_dims(self, what: str) -> tuple:
        p = ctypes.POINTER(capi.Dims)()
        _lib().dnnl_memory_desc_query(self.handle, capi.QUERY[what], byref(p))
        return tuple(p.contents[: self.ndims])

    @_memo
    def ndims(self) -> int:
        return self._q("ndims_s32", c_int32)

    @_memo
    def dims(self) -> tuple:
        return self._q_dims("dims")

    shape = dims

    @_memo
    def padded_dims(self) -> tuple:
        return self._q_dims("padded_dims")

    @_memo
    def data_type(self) -> int:
        return self._q("data_type", c_int)

    @property
    def dtype(self) -> np.dtype | None:
        return _DT2NP.get(self.data_type)

    @_memo
    def format_kind(self) -> str:
        return capi.FORMAT_KINDS.get(self._q("format_kind", c_int), "?")

    @_memo
    def strides(self) -> tuple:
        return self._q_dims("strides") if self.format_kind == "blocked" else ()

    @_memo
    def inner_blocks(self) -> list[tuple[int, int]]:
        """[(block size, logical dim index), ...], outermost first."""
        if self.format_kind != "blocked":
            return []
        n = self._q("inner_nblks_s32", c_int32)
        if not n:
            return []
        p = ctypes.POINTER(capi.Dims)()
        _lib().dnnl_memory_desc_query(self.handle, capi.QUERY["inner_blks"], byref(p))
        blks = tuple(p.contents[:n])
        _lib().dnnl_memory_desc_query(self.handle, capi.QUERY["inner_idxs"], byref(p))
        return list(zip(blks, p.contents[:n]))

    @_memo
    def size(self) -> int:
        """Bytes the layout needs, padding included (dnnl_memory_desc_get_size)."""
        return _lib().dnnl_memory_desc_get_size(self.handle)

    @property
    def is_zero(self) -> bool:
        return self.ndims == 0

    @_memo
    def format(self) -> str:
        """The layout in oneDNN's tag notation: 'abcd' (nchw), 'acdb' (nhwc), 'aBcd8b'
        (nChw8c), 'ABcd8b8a', ...; 'any' / 'opaque' (e.g. Winograd weights) / 'undef'."""
        kind = self.format_kind
        if kind != "blocked":
            return kind
        nd, strides, blocks = self.ndims, self.strides, self.inner_blocks
        letters = "abcdefghijkl"
        blocked_dims = {i for _, i in blocks}
        order = sorted(range(nd), key=lambda i: (-strides[i], i))
        tag = "".join(letters[i].upper() if i in blocked_dims else letters[i] for i in order)
        return tag + "".join(f"{b}{letters[i]}" for b, i in blocks)

    @_memo
    def is_plain(self) -> bool:
        """Blocked with no inner blocks and C-contiguous strides (a NumPy array's layout)."""
        if self.format_kind != "blocked" or self.inner_blocks:
            return False
        acc, ok = 1, True
        for d, s in zip(reversed(self.dims), reversed(self.strides)):
            if d != 1 and s != acc:
                ok = False
            acc *= d
        return ok

    def reshape(self, shape) -> MemoryDesc:
        shape = tuple(int(s) for s in shape)
        return MemoryDesc(_new_handle(_lib().dnnl_memory_desc_reshape, self.handle, len(shape), dims(shape)))

    def submemory(self, shape, offsets) -> MemoryDesc:
        """The part of this layout that starts at `offsets` and spans `shape` (a memory over
        the whole buffer with this descriptor reads and writes only that part)."""
        shape, offsets = tuple(int(s) for s in shape), tuple(int(o) for o in offsets)
        return MemoryDesc(_new_handle(_lib().dnnl_memory_desc_create_submemory, self.handle, dims(shape), dims(offsets)))

    def permute_axes(self, perm) -> MemoryDesc:
        arr = (c_int * len(perm))(*perm)
        return MemoryDesc(_new_handle(_lib().dnnl_memory_desc_permute_axes, self.handle, arr))

    def __eq__(self, other):
        if self is other:  # (shared descriptors: vector_desc, prepack's plain ones)
            return True
        if not isinstance(other, MemoryDesc):
            return NotImplemented
        return bool(_lib().dnnl_memory_desc_equal(self.handle, other.handle))

    def __hash__(self):
        # Equal descriptors have equal dims and type; the layout is left to __eq__ (the
        # format string takes a dozen queries, and descriptors key the packed-weights cache).
        return hash((self.dims, self.data_type))

    def __repr__(self):
        if self.is_zero:
            return "MemoryDesc(zero)"
        dt = self.dtype.name if self.dtype is not None else self.data_type
        return f"MemoryDesc({'x'.join(map(str, self.dims))}, {dt}, {self.format}, {self.size} B)"


def md(shape, dtype=np.float32, format="any") -> MemoryDesc:
    return MemoryDesc.create(shape, dtype, format)


@functools.lru_cache(maxsize=256)
def vector_desc(n: int, dtype: str) -> MemoryDesc:
    """The (shared, unchanging) descriptor of n values of `dtype` (its .str) in a row: a
    primitive's run-time scales, zero points and bias, four memories of each 8-bit
    convolution a plan binds (a memory with a descriptor of its own took 9.0 us to make,
    one on this shared one 4.7)."""
    return MemoryDesc.create((n,), np.dtype(dtype), "a")


def vector(a: np.ndarray) -> Memory:
    """A memory over the 1-D array `a` (vector_desc)."""
    return Memory(vector_desc(a.shape[0], a.dtype.str), a)


# --------------------------------------------------------------------------- memory


class Memory(_Owned):
    """A dnnl_memory_t over a buffer it does not copy: a NumPy array passed in (kept alive
    here), an aligned zeroed buffer it allocates (`allocate=True`), or nothing
    (DNNL_MEMORY_NONE) until `set` points it at one."""

    __slots__ = ("__weakref__", "_desc", "_engine", "_ptr", "array", "handle", "nbytes")
    _destroy = "dnnl_memory_destroy"

    def __init__(self, desc: MemoryDesc | int, buffer: np.ndarray | None = None, *, allocate: bool | None = None,
                 eng: Engine | None = None, nbytes: int | None = None):
        """desc: a MemoryDesc, or the address of a descriptor oneDNN owns (a primitive
        descriptor's query: the memory copies it, so binding makes no MemoryDesc of its own;
        `nbytes`, its size, where the caller knows it)."""
        lib = _lib()
        if isinstance(desc, MemoryDesc):
            self._desc, md, self.nbytes = desc, desc.handle, desc.size
        else:
            self._desc, md = None, desc
            self.nbytes = lib.dnnl_memory_desc_get_size(desc) if nbytes is None else nbytes
            if isinstance(buffer, np.ndarray) and not buffer.flags.c_contiguous:
                self._desc = MemoryDesc.clone_of(desc)  # _check asks a strided buffer's layout now
        self._engine = eng or engine()
        if buffer is None and (allocate or allocate is None):
            buffer = empty_aligned(self.nbytes)
        ptr = self._check(buffer) if buffer is not None else None
        self.array, self._ptr = buffer, ptr
        self.handle = _new_handle(lib.dnnl_memory_create, md, self._engine.handle, ptr)

    @property
    def desc(self) -> MemoryDesc:
        if self._desc is None:  # a copy of the memory's own descriptor, made when first asked
            p = c_void_p()
            _lib().dnnl_memory_get_memory_desc(self.handle, byref(p))
            self._desc = MemoryDesc.clone_of(p)
        return self._desc

    def _check(self, a: np.ndarray) -> int:
        if not isinstance(a, np.ndarray):
            raise TypeError(f"expected a NumPy array, got {type(a).__name__}")
        if a.nbytes < self.nbytes:
            raise ValueError(f"buffer of {a.nbytes} B is smaller than the {self.nbytes} B that {self.desc} needs")
        # (is_plain is asked only of a strided buffer: a handful of queries per memory,
        # and binding a plan makes hundreds of memories)
        if not a.flags.c_contiguous and self.desc.is_plain:
            raise ValueError("buffer for a plain layout must be C-contiguous")
        return a.ctypes.data

    def set(self, a: np.ndarray) -> None:
        """Point the memory at another buffer (dnnl_memory_set_data_handle); checked."""
        ptr = self._check(a)
        capi.check("dnnl_memory_set_data_handle", capi._set_handle(self.handle, ptr))
        self.array, self._ptr = a, ptr

    @property
    def data_ptr(self) -> int | None:
        return self._ptr

    def numpy(self) -> np.ndarray:
        """The buffer as an array of the logical shape (plain layouts only)."""
        if not self.desc.is_plain:
            raise ValueError(f"{self.desc.format} is not a plain layout; reorder it first (to_numpy)")
        n = math.prod(self.desc.dims)
        return self.array.reshape(-1).view(np.uint8)[: n * self.desc.dtype.itemsize].view(self.desc.dtype) \
            .reshape(self.desc.dims)

    def __repr__(self):
        return f"Memory({self.desc!r}, ptr={self._ptr:#x})" if self._ptr else f"Memory({self.desc!r}, no buffer)"


# --------------------------------------------------------------------------- attributes, post-ops

ELTWISE = {
    # name: (alg, default alpha, default beta); ONNX names map onto oneDNN's algorithms
    "relu": ("eltwise_relu", 0.0, 0.0), "leaky_relu": ("eltwise_relu", 0.01, 0.0),
    "clip": ("eltwise_clip", 0.0, 6.0), "clip_v2": ("eltwise_clip_v2", 0.0, 6.0),
    "sigmoid": ("eltwise_logistic", 0.0, 0.0), "logistic": ("eltwise_logistic", 0.0, 0.0),
    "tanh": ("eltwise_tanh", 0.0, 0.0), "elu": ("eltwise_elu", 1.0, 0.0),
    "hard_sigmoid": ("eltwise_hardsigmoid", 0.2, 0.5), "hardsigmoid": ("eltwise_hardsigmoid", 0.2, 0.5),
    "hard_swish": ("eltwise_hardswish", 1 / 6, 0.5), "hardswish": ("eltwise_hardswish", 1 / 6, 0.5),
    "swish": ("eltwise_swish", 1.0, 0.0), "silu": ("eltwise_swish", 1.0, 0.0),
    "gelu": ("eltwise_gelu_erf", 0.0, 0.0), "gelu_erf": ("eltwise_gelu_erf", 0.0, 0.0),
    "gelu_tanh": ("eltwise_gelu_tanh", 0.0, 0.0), "softplus": ("eltwise_soft_relu", 1.0, 0.0),
    "soft_relu": ("eltwise_soft_relu", 1.0, 0.0), "mish": ("eltwise_mish", 0.0, 0.0),
    "abs": ("eltwise_abs", 0.0, 0.0), "sqrt": ("eltwise_sqrt", 0.0, 0.0), "exp": ("eltwise_exp", 0.0, 0.0),
    "log": ("eltwise_log", 0.0, 0.0), "square": ("eltwise_square", 0.0, 0.0),
    "linear": ("eltwise_linear", 1.0, 0.0), "round": ("eltwise_round", 0.0, 0.0),
    "pow": ("eltwise_pow", 1.0, 1.0),
}


def eltwise_alg(name: str, alpha=None, beta=None) -> tuple[int, float, float]:
    alg, a, b = ELTWISE[name] if name in ELTWISE else (name, 0.0, 0.0)
    alg = alg if alg.startswith("eltwise_") else "eltwise_" + alg
    return ALG[alg], float(a if alpha is None else alpha), float(b if beta is None else beta)


class PostOps(_Owned):
    """dnnl_post_ops_t: a chain applied to a primitive's result in its epilogue.

    eltwise('relu'), eltwise('leaky_relu', alpha), eltwise('clip', lo, hi), eltwise('sigmoid'), ...
    sum(scale): dst = result + scale * (what dst held before execution): a residual add in place.
    binary('add', md): dst = result (op) src1, src1 given at run time as
    ARG_ATTR_MULTIPLE_POST_OP(index) | ARG_SRC_1 (see `binary_arg`).
    """

    _destroy = "dnnl_post_ops_destroy"

    def __init__(self, spec=()):
        lib = _lib()
        self.handle = _new_handle(lib.dnnl_post_ops_create)
        self.ops: list[tuple] = []
        for op in spec:
            name, *rest = op if isinstance(op, (tuple, list)) else (op,)
            if name == "sum":
                self.sum(*rest)
            elif name.startswith("binary_") or name in ("add", "mul", "max", "min", "sub", "div"):
                self.binary(name, *rest)
            else:
                self.eltwise(name, *rest)

    def eltwise(self, name: str, alpha=None, beta=None) -> PostOps:
        alg, a, b = eltwise_alg(name, alpha, beta)
        _lib().dnnl_post_ops_append_eltwise(self.handle, alg, a, b)
        self.ops.append(("eltwise", name, a, b))
        return self

    def sum(self, scale: float = 1.0) -> PostOps:
        _lib().dnnl_post_ops_append_sum(self.handle, float(scale), 0, capi.data_type_undef)
        self.ops.append(("sum", float(scale)))
        return self

    def binary(self, alg: str, src1: MemoryDesc) -> PostOps:
        alg = alg if alg.startswith("binary_") else "binary_" + alg
        _lib().dnnl_post_ops_append_binary(self.handle, ALG[alg], src1.handle)
        self.ops.append(("binary", alg, src1))
        return self

    def binary_arg(self, index: int | None = None) -> int:
        """The execution argument of a binary post-op's src1 (default: the last one)."""
        if index is None:
            index = max(i for i, op in enumerate(self.ops) if op[0] == "binary")
        return ARG_ATTR_MULTIPLE_POST_OP(index) | ARG_SRC_1

    def __len__(self):
        return _lib().dnnl_post_ops_len(self.handle)


class Attr(_Owned):
    """dnnl_primitive_attr_t: post-ops, scratchpad mode ('user' by default, see the module
    docstring), fpmath mode (None: strict f32)."""

    _destroy = "dnnl_primitive_attr_destroy"

    def __init__(self, post_ops: PostOps | list | tuple | None = None, scratchpad: str = "user",
                 fpmath: int | None = None, scales: dict | None = None, zero_points: dict | None = None):
        """scales / zero_points: {DNNL_ARG_*: mask} of the arguments given them at run time
        (as memories bound to ARG_ATTR_SCALES | arg, ARG_ATTR_ZERO_POINTS | arg)."""
        lib = _lib()
        self.handle = _new_handle(lib.dnnl_primitive_attr_create)
        self.scratchpad = scratchpad
        lib.dnnl_primitive_attr_set_scratchpad_mode(
            self.handle, capi.scratchpad_mode_user if scratchpad == "user" else capi.scratchpad_mode_library)
        if fpmath is not None:
            lib.dnnl_primitive_attr_set_fpmath_mode(self.handle, fpmath)
        if post_ops is not None and not isinstance(post_ops, PostOps):
            post_ops = PostOps(post_ops)
        self.post_ops = post_ops
        if post_ops is not None and len(post_ops):
            lib.dnnl_primitive_attr_set_post_ops(self.handle, post_ops.handle)
        for arg, mask in (scales or {}).items():
            lib.dnnl_primitive_attr_set_scales_mask(self.handle, arg, mask)
        for arg, mask in (zero_points or {}).items():
            lib.dnnl_primitive_attr_set_zero_points_mask(self.handle, arg, mask)


_DEFAULT_ATTR: list = []  # [the Attr() of every descriptor made without one]


def _attr(attr) -> Attr:
    if attr is None:
        # one shared default (oneDNN copies a descriptor's attributes as it makes it): a
        # first run makes a reorder per weight, each an Attr (two foreign calls) otherwise
        if not _DEFAULT_ATTR:
            _DEFAULT_ATTR.append(Attr())
        return _DEFAULT_ATTR[0]
    if isinstance(attr, Attr):
        return attr
    return Attr(post_ops=attr)  # a PostOps or a spec list


# --------------------------------------------------------------------------- primitive descriptors


class PrimitiveDesc(_Owned):
    """A dnnl_primitive_desc_t: the implementation oneDNN chose and the layouts it wants."""

    _destroy = "dnnl_primitive_desc_destroy"

    def __init__(self, handle: c_void_p, kind: str, attr: Attr | None = None, keep=()):
        self.handle, self.kind, self.attr = handle, kind, attr
        self._keep = keep  # descs/attrs that built it (oneDNN copied them; kept for repr/debugging)
        self._prim = None
        self._ahead = None  # the job making its primitive on another thread (ahead.py)
        # (query, index) -> (descriptor address or None, its bytes): every binding of a shared
        # descriptor asks the same handful (two foreign calls each, and one for the size)
        self._mds: dict = {}
        self._clones: dict = {}  # (query, index) -> query_md's MemoryDesc (descriptors never change)

    def query_md(self, what: int | str, index: int = 0) -> MemoryDesc | None:
        """An owned clone of a queried memory descriptor; None when the argument is unused.
        One clone per query, kept: a first run asks each conv's weights layout twice (to pack
        them, to find them packed), and a fresh clone knows nothing of itself (its hash is
        three more queries)."""
        try:
            return self._clones[(what, index)]
        except KeyError:
            ptr = self._query_ptr(what, index)
            clone = self._clones[(what, index)] = None if ptr is None else MemoryDesc.clone_of(ptr)
            return clone

    def _query_ptr(self, what: int | str, index: int = 0) -> int | None:
        """The address of a queried descriptor (the primitive descriptor owns it), or None
        where the argument is unused (a zero descriptor)."""
        return self._query_sized(what, index)[0]

    def _query_sized(self, what: int | str, index: int = 0) -> tuple[int | None, int]:
        """(_query_ptr, the descriptor's size in bytes), asked of oneDNN once."""
        hit = self._mds.get((what, index))
        if hit is not None:
            return hit
        w = capi.QUERY[what + "_md" if not what.endswith("_md") else what] if isinstance(what, str) else what
        lib = _lib()
        ptr = lib.dnnl_primitive_desc_query_md(self.handle, w, index)
        if ptr:
            n = c_int32()
            lib.dnnl_memory_desc_query(ptr, capi.QUERY["ndims_s32"], byref(n))
            ptr = ptr if n.value else None
        hit = self._mds[(what, index)] = (ptr, lib.dnnl_memory_desc_get_size(ptr) if ptr else 0)
        return hit

    def src_md(self, i: int = 0) -> MemoryDesc | None:
        return self.query_md(capi.query_src_md, i)

    def weights_md(self, i: int = 0) -> MemoryDesc | None:
        return self.query_md(capi.query_weights_md, i)

    def dst_md(self, i: int = 0) -> MemoryDesc | None:
        return self.query_md(capi.query_dst_md, i)

    def scratchpad_md(self) -> MemoryDesc | None:
        return self.query_md(capi.query_scratchpad_md)

    def workspace_md(self) -> MemoryDesc | None:
        return self.query_md(capi.query_workspace_md)

    def arg_md(self, arg: int) -> MemoryDesc | None:
        """The descriptor of execution argument `arg` (dnnl_query_exec_arg_md)."""
        return self.query_md(capi.query_exec_arg_md, arg)

    @property
    def impl(self) -> str:
        """The implementation's name: 'brg:avx2', 'jit:avx2', 'gemm:jit', 'ref:any', ..."""
        s = c_char_p()
        st = _lib().dnnl_primitive_desc_query(self.handle, capi.query_impl_info_str, 0, byref(s))
        capi.check("dnnl_primitive_desc_query(impl_info_str)", st)
        return s.value.decode()

    def next_impl(self) -> bool:
        """Move to the next implementation in oneDNN's list; False when there is none."""
        made = self._take_ahead()  # (first: the worker may be reading the descriptor)
        if made is not None:
            Primitive(self, made)  # the implementation before's: destroyed with this object
        st = _lib().dnnl_primitive_desc_next_impl(self.handle)
        if st == capi.last_impl_reached:
            return False
        capi.check("dnnl_primitive_desc_next_impl", st)
        self._prim = None
        self._mds.clear()  # another implementation: other layouts
        self._clones.clear()
        return True

    def primitive(self) -> Primitive:
        if self._prim is None:
            self._prim = Primitive(self, self._take_ahead())
        return self._prim

    def make_ahead(self) -> None:
        """Have the primitive made on another thread meanwhile (ahead.py): for a descriptor
        made well before its primitive is needed."""
        if self._prim is None and self._ahead is None:
            self._ahead = ahead.submit(self)

    def _take_ahead(self):
        job, self._ahead = self._ahead, None
        return None if job is None else ahead.claim(job)

    def describe(self) -> dict:
        out = {"kind": self.kind, "impl": self.impl}
        for name, m in (("src", self.src_md()), ("weights", self.weights_md()), ("dst", self.dst_md()),
                        ("scratchpad", self.scratchpad_md())):
            if m is not None:
                out[name] = {"format": m.format, "bytes": m.size} if name != "scratchpad" else m.size
        return out

    def __repr__(self):
        return f"PrimitiveDesc({self.kind}, {self.impl})"


class Primitive(_Owned):
    _destroy = "dnnl_primitive_destroy"

    def __init__(self, pd: PrimitiveDesc, handle: c_void_p | None = None):
        self.pd = pd
        self.handle = handle if handle is not None else _new_handle(_lib().dnnl_primitive_create, pd.handle)

    def bind(self, args: dict) -> Step:
        return Step(self, args)

    def execute(self, args: dict, strm: Stream | None = None) -> Step:
        """Bind and run once (tests, one-off reorders)."""
        step = Step(self, args)
        step.run(strm=strm)
        return step


class Step:
    """A primitive with its execution arguments fixed: the dnnl_exec_arg_t array is built
    once; `run` only re-points memories whose buffer changed, executes and waits.

    args maps DNNL_ARG_* to a Memory, a NumPy array (wrapped, no copy) or None (a memory
    with no buffer yet: pass it to `run`). The scratchpad (user mode) and a workspace, if
    the primitive needs them and they are not given, are allocated here."""

    def __init__(self, prim: Primitive, args: dict):
        self.prim, self.pd = prim, prim.pd
        mems: dict[int, Memory] = {}
        for arg, v in args.items():
            if isinstance(v, Memory):
                mems[arg] = v
                continue
            d, size = self.pd._query_sized(capi.query_exec_arg_md, arg)
            if d is None:
                raise ValueError(f"{self.pd.kind} ({self.pd.impl}) takes no argument {arg}")
            mems[arg] = Memory(d, v, allocate=False, nbytes=size)
        attr = self.pd.attr
        if ARG_SCRATCHPAD not in mems and attr is not None and attr.scratchpad == "user":
            d, size = self.pd._query_sized(capi.query_scratchpad_md)
            if d is not None:
                mems[ARG_SCRATCHPAD] = Memory(d, allocate=True, nbytes=size)
        if ARG_WORKSPACE not in mems:
            d, size = self.pd._query_sized(capi.query_workspace_md)
            if d is not None:
                mems[ARG_WORKSPACE] = Memory(d, allocate=True, nbytes=size)
        self.mems = mems
        self._args = (ExecArg * len(mems))(*[ExecArg(a, m.handle.value) for a, m in mems.items()])
        self._nargs = len(mems)
        self._prim_h = prim.handle.value

    def __getitem__(self, arg: int) -> Memory:
        return self.mems[arg]

    def set(self, arg: int, a: np.ndarray) -> None:
        self.mems[arg].set(a)

    def run(self, buffers: dict | None = None, strm: Stream | None = None) -> None:
        """Point args at `buffers` ({arg: array}, checked), execute and wait."""
        if buffers:
            for arg, a in buffers.items():
                m = self.mems[arg]
                if a is not m.array:
                    m.set(a)
        s = strm or stream()
        st = capi._execute(self._prim_h, s.handle, self._nargs, self._args)
        if st:
            raise DnnlError(f"dnnl_primitive_execute({self.pd.kind}, {self.pd.impl})", st)
        if not capi.BLOCKING:
            st = capi._wait(s.handle)
            if st:
                raise DnnlError("dnnl_stream_wait", st)

    def run_ptrs(self, ptrs, strm_handle) -> None:
        """The leanest run: ptrs is [(memory handle, data pointer)], unchecked; for a
        runtime that computed the pointers itself."""
        sh = capi._set_handle
        for mh, p in ptrs:
            sh(mh, p)
        st = capi._execute(self._prim_h, strm_handle, self._nargs, self._args)
        if st:
            raise DnnlError(f"dnnl_primitive_execute({self.pd.kind})", st)
        if not capi.BLOCKING:
            capi._wait(strm_handle)


# --------------------------------------------------------------------------- constructors


def _pd(kind: str, create, attr: Attr, *args, keep=()) -> PrimitiveDesc:
    h = c_void_p()
    create(byref(h), *args)
    return PrimitiveDesc(h, kind, attr, keep)


def _h(m: MemoryDesc | None):
    return None if m is None else m.handle


def convolution(src: MemoryDesc, weights: MemoryDesc, dst: MemoryDesc, bias: MemoryDesc | None = None, *,
                strides, padding_l, padding_r, dilations=None, attr=None, alg: str = "convolution_direct",
                prop: int = capi.forward_inference) -> PrimitiveDesc:
    """dnnl_convolution_forward_primitive_desc_create. dilations are oneDNN's: 0 = dense
    (ONNX's dilation minus 1). Groups: weights of shape (G, OC/G, IC/G, *kernel)."""
    nsp = len(strides)
    dil = dilations if dilations is not None else [0] * nsp
    a = _attr(attr)
    return _pd("convolution", _lib().dnnl_convolution_forward_primitive_desc_create, a, engine().handle, prop,
               ALG[alg], src.handle, weights.handle, _h(bias), dst.handle, dims(strides), dims(dil),
               dims(padding_l), dims(padding_r), a.handle)


def conv_output_shape(x_shape, w_shape, strides, dilations, pads) -> tuple:
    """ONNX Conv output shape (dilations are ONNX's, pads begin..., end...)."""
    n, nsp = x_shape[0], len(x_shape) - 2
    out = [n, w_shape[0]]
    for i in range(nsp):
        k_eff = (w_shape[2 + i] - 1) * dilations[i] + 1
        out.append((x_shape[2 + i] + pads[i] + pads[nsp + i] - k_eff) // strides[i] + 1)
    return tuple(out)


def plain_tag(ndims: int) -> str:
    return "abcdefghijkl"[:ndims]


def conv(x_shape, w_shape, *, group: int = 1, strides=None, dilations=None, pads=None, bias: bool = True,
         dtype=np.float32, src_format="plain", weights_format="any", dst_format=None, post_ops=None,
         attr=None, alg: str = "convolution_direct") -> PrimitiveDesc:
    """A convolution from ONNX Conv attributes: w_shape is ONNX's (M, C/group, *kernel);
    dilations are ONNX's (1 = dense); pads are (begin..., end...). src_format/dst_format:
    'plain' (nchw), 'any' (oneDNN chooses, blocked on AVX2) or a tag; dst_format defaults to
    src_format. Weights default to 'any' (pre-pack with `prepack` into `pd.weights_md()`)."""
    x_shape, w_shape = tuple(x_shape), tuple(w_shape)
    nd, nsp = len(x_shape), len(x_shape) - 2
    strides = list(strides or [1] * nsp)
    dilations = list(dilations or [1] * nsp)
    pads = list(pads or [0] * (2 * nsp))
    y_shape = conv_output_shape(x_shape, w_shape, strides, dilations, pads)
    dst_format = src_format if dst_format is None else dst_format
    fmt = lambda f, n: plain_tag(n) if f == "plain" else f
    src = MemoryDesc.create(x_shape, dtype, fmt(src_format, nd))
    dst = MemoryDesc.create(y_shape, dtype, fmt(dst_format, nd))
    wshape = grouped_weights_shape(w_shape, group)
    weights = MemoryDesc.create(wshape, dtype, fmt(weights_format, len(wshape)))
    b = MemoryDesc.create((w_shape[0],), dtype, "a") if bias else None
    if attr is None and post_ops is not None:
        attr = Attr(post_ops)
    return convolution(src, weights, dst, b, strides=strides, dilations=[d - 1 for d in dilations],
                       padding_l=pads[:nsp], padding_r=pads[nsp:], attr=attr, alg=alg)


def grouped_weights_shape(w_shape, group: int) -> tuple:
    """ONNX weights (M, C/g, *k) as oneDNN wants them: unchanged for g = 1, else (g, M/g, C/g, *k)."""
    w_shape = tuple(w_shape)
    if group == 1:
        return w_shape
    return (group, w_shape[0] // group) + w_shape[1:]


def reorder(src: MemoryDesc, dst: MemoryDesc, attr=None) -> PrimitiveDesc:
    a = _attr(attr)
    e = engine().handle
    return _pd("reorder", _lib().dnnl_reorder_primitive_desc_create, a, src.handle, e, dst.handle, e, a.handle)


# dnnl_rnn_direction_t by ONNX's direction attribute (bidirectional: both directions' outputs
# concatenated along the channels of dst_layer)
RNN_DIRECTIONS = {"forward": 1, "reverse": 2, "bidirectional": 3}


def lstm(src_layer: MemoryDesc, src_iter: MemoryDesc | None, src_iter_c: MemoryDesc | None,
         weights_layer: MemoryDesc, weights_iter: MemoryDesc, weights_peephole: MemoryDesc | None,
         bias: MemoryDesc | None, dst_layer: MemoryDesc, dst_iter: MemoryDesc | None,
         dst_iter_c: MemoryDesc | None, *, direction: str, attr=None,
         prop: int = capi.forward_inference) -> PrimitiveDesc:
    """dnnl_lstm_forward_primitive_desc_create (no projection). oneDNN's shapes: src_layer /
    dst_layer (T, N, C) with dst's C the directions' hidden states side by side; iter states
    (layers, directions, N, H); weights (layers, directions, input, gates, H) with gates in
    oneDNN's order i, f, c, o; peepholes (layers, directions, 3, H) in order i, f, o; bias
    (layers, directions, gates, H). A None descriptor is oneDNN's zero one: no initial state
    (zeros), no peepholes, no bias, no final state wanted."""
    a = _attr(attr)
    return _pd("rnn", _lib().dnnl_lstm_forward_primitive_desc_create, a, engine().handle, prop,
               RNN_DIRECTIONS[direction], _h(src_layer), _h(src_iter), _h(src_iter_c), _h(weights_layer),
               _h(weights_iter), _h(weights_peephole), None, _h(bias), _h(dst_layer), _h(dst_iter),
               _h(dst_iter_c), 0, a.handle)


def gru(src_layer: MemoryDesc, src_iter: MemoryDesc | None, weights_layer: MemoryDesc, weights_iter: MemoryDesc,
        bias: MemoryDesc | None, dst_layer: MemoryDesc, dst_iter: MemoryDesc | None, *, direction: str,
        linear_before_reset: bool, attr=None, prop: int = capi.forward_inference) -> PrimitiveDesc:
    """dnnl_gru_forward_primitive_desc_create, or with linear_before_reset its lbr_gru (the
    reset gate applied after the recurrent product: a fourth bias block, that product's).
    Gates u, r, o (ONNX's z, r, h); shapes as `lstm`'s."""
    a = _attr(attr)
    create = _lib().dnnl_lbr_gru_forward_primitive_desc_create if linear_before_reset else \
        _lib().dnnl_gru_forward_primitive_desc_create
    return _pd("rnn", create, a, engine().handle, prop, RNN_DIRECTIONS[direction], _h(src_layer), _h(src_iter),
               _h(weights_layer), _h(weights_iter), _h(bias), _h(dst_layer), _h(dst_iter), 0, a.handle)


def vanilla_rnn(src_layer: MemoryDesc, src_iter: MemoryDesc | None, weights_layer: MemoryDesc,
                weights_iter: MemoryDesc, bias: MemoryDesc | None, dst_layer: MemoryDesc,
                dst_iter: MemoryDesc | None, *, direction: str, activation: str, attr=None,
                prop: int = capi.forward_inference) -> PrimitiveDesc:
    """dnnl_vanilla_rnn_forward_primitive_desc_create: h = activation(W x + U h + b), the
    activation an eltwise algorithm ('eltwise_tanh', 'eltwise_relu', 'eltwise_logistic')."""
    a = _attr(attr)
    return _pd("rnn", _lib().dnnl_vanilla_rnn_forward_primitive_desc_create, a, engine().handle, prop,
               ALG[activation], RNN_DIRECTIONS[direction], _h(src_layer), _h(src_iter), _h(weights_layer),
               _h(weights_iter), _h(bias), _h(dst_layer), _h(dst_iter), 0, 0.0, 0.0, a.handle)


def prepack(a: np.ndarray, user: MemoryDesc | None, target: MemoryDesc, make_reorder=None, *,
            slab_bytes: int = 0, done=None) -> Memory:
    """Copy `a` (laid out as `user`, default: its own plain layout) into a new buffer laid
    out as `target` (e.g. the weights format a convolution chose): one reorder, done once
    (`make_reorder(src, dst)` makes its descriptor: a provider may share them).

    With `done(start, stop)`, a source larger than two `slab_bytes` is reordered in slabs of
    about that size along its outermost dimension in memory, `done` told the byte range of
    `a` each slab has finished reading: a caller that can drop those pages (weights mapped
    from a file) then never holds a large weight twice, only a slab of it. Where oneDNN
    cannot cut the layouts there (a slab that splits its blocks), one reorder does it all."""
    a = np.ascontiguousarray(a)
    if user is None:
        user = _plain_desc(a.shape, a.strides, a.dtype.str, target.dims)
    elif user.dims != target.dims:  # e.g. grouped weights: same bytes, 5-D view
        user = user.reshape(target.dims)
    out = Memory(target, allocate=True)
    if user == target:
        out.array[:] = a.reshape(-1).view(np.uint8)[: out.nbytes]
        return out
    make_reorder = make_reorder or reorder
    if done is not None and slab_bytes and a.nbytes > 2 * slab_bytes and _reorder_in_slabs(
            a, user, target, out, make_reorder, slab_bytes, done):
        return out
    make_reorder(user, target).primitive().execute({ARG_FROM: Memory(user, a), ARG_TO: out})
    return out


@functools.lru_cache(maxsize=512)
def _plain_desc(shape: tuple, strides: tuple, dtype: str, dims: tuple) -> MemoryDesc:
    """MemoryDesc.from_array of an array of that shape, strides (bytes) and dtype, seen as
    `dims` (grouped weights: the same bytes as a 5-D view). Shared: a model's weights come in
    a few shapes (shufflenet's 50 in 12), and making the two descriptors took ~55 us of each
    weight's packing."""
    desc = MemoryDesc.plain(shape, strides, dtype)
    return desc if desc.dims == tuple(dims) else desc.reshape(dims)


def _reorder_in_slabs(a, user: MemoryDesc, target: MemoryDesc, out: Memory, make_reorder, slab_bytes: int,
                      done) -> bool:
    """prepack's reorder as a series of reorders of slabs along the source's outermost
    dimension; False (having written nothing `out` keeps) where the layouts do not allow it.

    Every slab of one size is the same reorder: the first slab's part of each layout
    (submemory at offset 0), run with both memories pointed at the slab's first element
    (the offset oneDNN gives the slab's submemory), so that a weight is one or two
    descriptors, shared by the weights of its shape, not one per slab. The source's slab
    starts at its rows' first byte: its layout is plain, that dimension outermost."""
    strides = user.strides
    if len(strides) != user.ndims or user.inner_blocks or a.nbytes != user.size:
        return False  # not a dense plain source
    axis = max(range(len(strides)), key=lambda i: strides[i])
    shape, row_bytes = list(user.dims), strides[axis] * a.itemsize
    align = math.prod(size for size, dim in target.inner_blocks if dim == axis)
    step = max(align, slab_bytes // row_bytes // align * align)
    if step >= shape[axis]:
        return False
    slabs = [(lo, min(step, shape[axis] - lo)) for lo in range(0, shape[axis], step)]
    reorders = {}  # slab rows -> (reorder, source memory, destination memory)
    try:
        for rows in {rows for _, rows in slabs}:  # all made before any runs: a refusal leaves nothing half done
            part = list(shape)
            part[axis] = rows
            src, dst = user.submemory(part, [0] * len(shape)), target.submemory(part, [0] * len(shape))
            reorders[rows] = (make_reorder(src, dst).primitive(), Memory(src, allocate=False),
                              Memory(dst, allocate=False))
    except DnnlError:
        return False  # e.g. a last slab that ends inside a block of the packed layout
    for lo, rows in slabs:
        prim, src_mem, dst_mem = reorders[rows]
        part, at = list(shape), [0] * len(shape)
        part[axis], at[axis] = rows, lo
        first = target.submemory(part, at)._q("submemory_offset_s64", ctypes.c_int64) * a.itemsize
        for mem, address in ((src_mem, a.ctypes.data + lo * row_bytes), (dst_mem, out.data_ptr + first)):
            capi.check("dnnl_memory_set_data_handle", capi._set_handle(mem.handle, address))
        prim.execute({ARG_FROM: src_mem, ARG_TO: dst_mem})
        done(lo * row_bytes, (lo + rows) * row_bytes)
    return True


def to_numpy(mem: Memory) -> np.ndarray:
    """A new plain (C-order) array with the contents of a memory in any layout."""
    d = mem.desc
    out = np.empty(d.dims, d.dtype)
    if d.is_plain:
        out[...] = mem.numpy()
        return out
    plain = MemoryDesc.create(d.dims, d.dtype, plain_tag(d.ndims))
    reorder(d, plain).primitive().execute({ARG_FROM: mem, ARG_TO: Memory(plain, out)})
    return out


def from_numpy(a: np.ndarray, target: MemoryDesc) -> Memory:
    """A new memory in `target`'s layout holding array a (plain C-order)."""
    return prepack(a, None, target)


def matmul(src: MemoryDesc, weights: MemoryDesc, dst: MemoryDesc, bias: MemoryDesc | None = None,
           attr=None) -> PrimitiveDesc:
    """dnnl_matmul_primitive_desc_create: dst (..., M, N) = src (..., M, K) @ weights (..., K, N)
    (+ bias broadcast, e.g. (1, N)). Weights 'any' lets oneDNN pre-pack them."""
    a = _attr(attr)
    return _pd("matmul", _lib().dnnl_matmul_primitive_desc_create, a, engine().handle, src.handle, weights.handle,
               _h(bias), dst.handle, a.handle)


def inner_product(src: MemoryDesc, weights: MemoryDesc, dst: MemoryDesc, bias: MemoryDesc | None = None,
                  attr=None, prop: int = capi.forward_inference) -> PrimitiveDesc:
    """dst (N, OC) = src (N, IC[, spatial]) . weights (OC, IC[, spatial])^T + bias (OC)."""
    a = _attr(attr)
    return _pd("inner_product", _lib().dnnl_inner_product_forward_primitive_desc_create, a, engine().handle, prop,
               src.handle, weights.handle, _h(bias), dst.handle, a.handle)


POOL_ALGS = {"max": "pooling_max", "avg": "pooling_avg_exclude_padding",
             "avg_exclude_padding": "pooling_avg_exclude_padding",
             "avg_include_padding": "pooling_avg_include_padding"}


def pooling(src: MemoryDesc, dst: MemoryDesc, alg: str, *, kernel, strides, padding_l, padding_r,
            dilation=None, attr=None, prop: int = capi.forward_inference) -> PrimitiveDesc:
    """alg: 'max', 'avg_exclude_padding' (ONNX count_include_pad=0), 'avg_include_padding'.
    dilation is oneDNN's (0 = dense)."""
    a = _attr(attr)
    nsp = len(kernel)
    return _pd("pooling", _lib().dnnl_pooling_forward_primitive_desc_create, a, engine().handle, prop,
               ALG[POOL_ALGS.get(alg, alg)], src.handle, dst.handle, dims(strides), dims(kernel),
               dims(dilation or [0] * nsp), dims(padding_l), dims(padding_r), a.handle)


def pool(x_shape, kernel, *, strides=None, pads=None, alg="max", ceil_mode=False, dtype=np.float32,
         src_format="plain", dst_format=None, attr=None) -> PrimitiveDesc:
    """A pooling from ONNX MaxPool/AveragePool attributes (no dilation). ceil_mode widens
    the right padding so the last window fits; with 'avg_include_padding' that extra padding
    counts in the divisor, which differs from ONNX, so it is refused. The source needs a
    concrete layout ('plain', 'nChw8c', 'nhwc'...); dst_format 'any' follows it."""
    x_shape = tuple(x_shape)
    nd, nsp = len(x_shape), len(x_shape) - 2
    strides = list(strides or [1] * nsp)
    pads = list(pads or [0] * (2 * nsp))
    pl, pr = pads[:nsp], pads[nsp:]
    out = list(x_shape[:2])
    for i in range(nsp):
        span = x_shape[2 + i] + pl[i] + pr[i] - kernel[i]
        # (a window overrunning the padded input by less than a stride: one output, as in
        # onnx's shape inference; its overrun is right padding, as ceil_mode's)
        o = (-(-span // strides[i]) if ceil_mode or span < 0 else span // strides[i]) + 1
        if ceil_mode and (o - 1) * strides[i] >= x_shape[2 + i] + pl[i]:
            o -= 1  # the last window must start inside the input or left padding
        extra = (o - 1) * strides[i] + kernel[i] - (x_shape[2 + i] + pl[i] + pr[i])
        if extra > 0:
            if alg == "avg_include_padding":
                raise ValueError("ceil_mode with avg_include_padding: divisors would differ from ONNX")
            pr[i] += extra
        out.append(o)
    dst_format = src_format if dst_format is None else dst_format
    fmt = lambda f: plain_tag(nd) if f == "plain" else f
    return pooling(MemoryDesc.create(x_shape, dtype, fmt(src_format)), MemoryDesc.create(out, dtype, fmt(dst_format)),
                   alg, kernel=kernel, strides=strides, padding_l=pl, padding_r=pr, attr=attr)


def eltwise(src: MemoryDesc, dst: MemoryDesc | None, name: str, alpha=None, beta=None, attr=None,
            prop: int = capi.forward_inference) -> PrimitiveDesc:
    """dst = f(src); dst None means src's desc (in place is allowed: pass one buffer twice)."""
    alg, a_, b_ = eltwise_alg(name, alpha, beta)
    a = _attr(attr)
    return _pd("eltwise", _lib().dnnl_eltwise_forward_primitive_desc_create, a, engine().handle, prop, alg,
               src.handle, (dst or src).handle, a_, b_, a.handle)


def binary(src0: MemoryDesc, src1: MemoryDesc, dst: MemoryDesc, alg: str = "add", attr=None) -> PrimitiveDesc:
    """dst = src0 (op) src1 with src1 broadcast over dims of size 1 (same ndims)."""
    alg = alg if alg.startswith("binary_") else "binary_" + alg
    a = _attr(attr)
    return _pd("binary", _lib().dnnl_binary_primitive_desc_create, a, engine().handle, ALG[alg], src0.handle,
               src1.handle, dst.handle, a.handle)


def concat(srcs: list[MemoryDesc], axis: int, dst: MemoryDesc | None = None, attr=None) -> PrimitiveDesc:
    """Sources bind as ARG_MULTIPLE_SRC + i. dst None lets oneDNN choose (it follows the sources)."""
    a = _attr(attr)
    arr = (c_void_p * len(srcs))(*[s.handle.value for s in srcs])
    return _pd("concat", _lib().dnnl_concat_primitive_desc_create, a, engine().handle, _h(dst), len(srcs), axis,
               arr, a.handle, keep=(srcs,))


def sum_(srcs: list[MemoryDesc], scales=None, dst: MemoryDesc | None = None, attr=None) -> PrimitiveDesc:
    """dst = sum_i scales[i] * src_i (ARG_MULTIPLE_SRC + i)."""
    a = _attr(attr)
    scales = scales or [1.0] * len(srcs)
    sc = (ctypes.c_float * len(srcs))(*scales)
    arr = (c_void_p * len(srcs))(*[s.handle.value for s in srcs])
    return _pd("sum", _lib().dnnl_sum_primitive_desc_create, a, engine().handle, _h(dst), len(srcs), sc, arr,
               a.handle, keep=(srcs,))


def batch_norm(src: MemoryDesc, dst: MemoryDesc | None = None, epsilon: float = 1e-5, *, scale: bool = True,
               shift: bool = True, global_stats: bool = True, fuse_relu: bool = False, attr=None,
               prop: int = capi.forward_inference) -> PrimitiveDesc:
    """Inference batch norm: ARG_MEAN, ARG_VARIANCE (C,), ARG_SCALE, ARG_SHIFT (C,)."""
    flags = ((capi.use_global_stats if global_stats else 0) | (capi.use_scale if scale else 0)
             | (capi.use_shift if shift else 0) | (capi.fuse_norm_relu if fuse_relu else 0))
    a = _attr(attr)
    return _pd("batch_normalization", _lib().dnnl_batch_normalization_forward_primitive_desc_create, a,
               engine().handle, prop, src.handle, (dst or src).handle, float(epsilon), flags, a.handle)


def layer_norm(src: MemoryDesc, dst: MemoryDesc | None = None, epsilon: float = 1e-5, *, scale: bool = True,
               shift: bool = True, stat: MemoryDesc | None = None, attr=None,
               prop: int = capi.forward_inference) -> PrimitiveDesc:
    """Normalizes over the last dim; ARG_SCALE, ARG_SHIFT are (C,). Mean/variance (shape
    src[:-1]) are computed; the primitive may want them as arguments (see Step)."""
    flags = (capi.use_scale if scale else 0) | (capi.use_shift if shift else 0)
    a = _attr(attr)
    return _pd("layer_normalization", _lib().dnnl_layer_normalization_forward_primitive_desc_create, a,
               engine().handle, prop, src.handle, (dst or src).handle, _h(stat), float(epsilon), flags, a.handle)


def lrn(src: MemoryDesc, dst: MemoryDesc | None = None, *, size: int, alpha: float = 1e-4, beta: float = 0.75,
        k: float = 1.0, alg: str = "lrn_across_channels", attr=None,
        prop: int = capi.forward_inference) -> PrimitiveDesc:
    """dst = src / (k + alpha / size * sum_{window} src^2)^beta (ONNX LRN's formula, bias = k)."""
    a = _attr(attr)
    return _pd("lrn", _lib().dnnl_lrn_forward_primitive_desc_create, a, engine().handle, prop, ALG[alg],
               src.handle, (dst or src).handle, int(size), float(alpha), float(beta), float(k), a.handle)


def softmax(src: MemoryDesc, dst: MemoryDesc | None = None, axis: int = -1, *, log: bool = False, attr=None,
            prop: int = capi.forward_inference) -> PrimitiveDesc:
    a = _attr(attr)
    axis = axis % src.ndims
    return _pd("softmax", _lib().dnnl_softmax_forward_primitive_desc_create, a, engine().handle, prop,
               ALG["softmax_log" if log else "softmax_accurate"], src.handle, (dst or src).handle, axis, a.handle)


def shuffle(src: MemoryDesc, dst: MemoryDesc | None = None, axis: int = 1, group_size: int = 1, attr=None,
            prop: int = capi.forward_inference) -> PrimitiveDesc:
    """Channel shuffle. group_size is the channels per group: ShuffleNet's
    Reshape(N, g, C/g, H, W) + Transpose(0, 2, 1, 3, 4) is group_size = C // g."""
    a = _attr(attr)
    return _pd("shuffle", _lib().dnnl_shuffle_forward_primitive_desc_create, a, engine().handle, prop, src.handle,
               (dst or src).handle, axis, int(group_size), a.handle)
