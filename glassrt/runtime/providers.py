"""Execution providers: where a node can run, and with which kernels.

`cpu` is glassrt's own NumPy/Numba kernels; `reference` wraps onnx.reference and is the
fallback of last resort. A provider names the device its tensors live on, so placement
can insert (and count) transfers between providers that keep data in different places.
"""
from __future__ import annotations

from ..kernels import reference as ref
from ..kernels.registry import Kernel, kernels_for


def _is_op_type(name: str) -> bool:
    """An op type some domain defines (ONNX's, ai.onnx.ml, com.microsoft, glassrt's)."""
    from onnx import defs

    from ..ops import registry

    return any(defs.has(name, d) for d in ("", "ai.onnx.ml")) or any(
        c.op_type == name for c in registry.custom_contracts())


class Provider:
    name = "?"
    device = "cpu"  # where this provider's tensors live; "cpu" is the host (NumPy arrays)
    openmp_pool = False  # its kernels run on OpenMP's threads: runs then use that pool alone (threads.py)
    numpy_blas = True  # its kernels may call NumPy's BLAS, whose thread count a run then sets (threads.py)
    partial = False  # takes only some nodes by design: passing it is not a fallback (placement.py)
    # Options every provider takes (as onnxruntime's (name, {options}) pairs): op types it
    # may take ("ops": only these) or must leave to the next provider ("exclude_ops").
    OPTIONS = {"ops": "op types this provider may take (others go to the next provider)",
               "exclude_ops": "op types this provider leaves to the next provider"}
    options: dict = {}

    def kernels(self, domain: str, op_type: str, opset: int) -> list[Kernel]:
        raise NotImplementedError

    def configure(self, options: dict) -> None:
        """Take onnxruntime-style provider options; an unknown one is refused by name."""
        from ..errors import InvalidArgumentError

        unknown = [k for k in options if k not in self.OPTIONS]
        if unknown:
            raise InvalidArgumentError(
                f"provider '{self.name}' has no option {', '.join(map(repr, unknown))}; its options: " +
                "; ".join(f"{k}: {v}" for k, v in self.OPTIONS.items()))
        for k in ("ops", "exclude_ops"):
            v = options.get(k)
            if v is not None and (isinstance(v, str) or not all(isinstance(o, str) for o in v)):
                raise InvalidArgumentError(f"provider '{self.name}' option {k!r} is a list of op type names, got {v!r}")
            unknown_ops = [o for o in v or [] if not _is_op_type(o)]
            if unknown_ops:
                raise InvalidArgumentError(f"provider '{self.name}' option {k!r}: no op type "
                                           f"{', '.join(map(repr, unknown_ops))} (names as a model writes them: "
                                           f"Conv, MatMul, ...)")
        self.options = {k: (list(v) if k in ("ops", "exclude_ops") else v) for k, v in options.items()}

    def excluded(self, op_type: str) -> str | None:
        """Why the options keep this provider off an op type, or None."""
        ops, exclude = self.options.get("ops"), self.options.get("exclude_ops") or []
        if ops is not None and op_type not in ops:
            return f"{op_type} is not in provider '{self.name}''s option ops={ops}"
        if op_type in exclude:
            return f"provider '{self.name}''s option exclude_ops={exclude} leaves {op_type} to the next provider"
        return None

    # A provider on another device says how its data comes and goes: placement inserts a
    # glassrt::Transfer step wherever a value crosses, run by the device-side provider.
    def to_device(self, array):
        raise NotImplementedError(f"provider '{self.name}' cannot copy host arrays to '{self.device}'")

    def to_host(self, value):
        raise NotImplementedError(f"provider '{self.name}' cannot copy '{self.device}' values to the host")

    def transfer_kernel(self, src_device: str, dst_device: str) -> Kernel | None:
        """The kernel of a glassrt::Transfer between the host and this provider's device."""
        if src_device == "cpu" and dst_device == self.device:
            fn, what = self.to_device, "host → device"
        elif src_device == self.device and dst_device == "cpu":
            fn, what = self.to_host, "device → host"
        else:
            return None
        return Kernel(f"{self.name}.Transfer", self.name, "glassrt", "Transfer", lambda x, **_: fn(x), doc=what)


class CpuProvider(Provider):
    name = "cpu"

    def kernels(self, domain, op_type, opset):
        from . import _load_cpu_kernels

        _load_cpu_kernels(domain, op_type)
        return kernels_for("cpu", domain, op_type)


class ReferenceProvider(Provider):
    name = "reference"

    def __init__(self):
        self._cache = {}

    def kernels(self, domain, op_type, opset):
        if domain == "" and op_type in ref.NEEDS_EVALUATOR:
            # Control flow is structure, not arithmetic: glassrt's own runners execute the
            # bodies, whose nodes are placed on this provider list like any others.
            from . import _load_cpu_kernels

            _load_cpu_kernels(domain, op_type)
            return kernels_for("cpu", domain, op_type)
        if not ref.implements(domain, op_type, opset):
            return []
        key = (domain, op_type)
        if key not in self._cache:
            self._cache[key] = ref.reference_kernel(domain, op_type)
        return [self._cache[key]]


class OnednnProvider(Provider):
    """oneDNN's CPU primitives (kernels/onednn/): convolutions with fused post-ops, pooling,
    concat, activations, normalization, in NHWC between its own nodes. Needs the
    `onednn-cpu-gomp` package; without it every node says so and goes to the next provider."""

    name = "onednn"
    partial = True
    numpy_blas = False  # (its products are oneDNN's)

    def __init__(self):
        from ..kernels.onednn import capi

        self.unavailable = capi.UNAVAILABLE
        self.openmp_pool = not self.unavailable
        if not self.unavailable:  # (its kernel modules are imported per op: kernels())
            from . import threads

            threads.refresh()  # its OpenMP library joins the thread pools set per run

    OPTIONS = {**Provider.OPTIONS,
               "nhwc": "True (default): values between its own nodes live in NHWC, oneDNN's fast layout; "
                       "False: every value stays plain NCHW"}

    def kernels(self, domain, op_type, opset):
        if self.unavailable:
            return []
        from . import _load_kernels

        _load_kernels("onednn", domain, op_type)
        ks = kernels_for("onednn", domain, op_type)
        if self.options.get("nhwc", True) is False:
            from dataclasses import replace

            ks = [replace(k, layouts=frozenset()) for k in ks]
        return ks

    def configure(self, options: dict) -> None:
        from ..errors import InvalidArgumentError

        super().configure(options)
        if "nhwc" in options and not isinstance(options["nhwc"], bool):
            raise InvalidArgumentError(f"provider 'onednn' option 'nhwc' is True or False, got {options['nhwc']!r}")


def cuda_device() -> tuple[object | None, str]:
    """(CuPy's current device, its description) or (None, why there is none). Never part of
    the default provider list: a GPU is asked for by name."""
    try:
        import cupy
    except Exception as e:  # ImportError, or a CuPy built for a CUDA this machine lacks
        return None, f"CuPy cannot be imported ({type(e).__name__}: {e}); pip install cupy-cuda12x or cupy-cuda13x"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver, no device
        return None, f"CUDA reports no device ({type(e).__name__}: {e})"
    if count == 0:
        return None, "CUDA reports 0 devices"
    dev = cupy.cuda.Device()
    return dev, f"CUDA device {dev.id} of {count}"


class CudaProvider(Provider):
    """The GPU provider of issue 13, not built yet: its kernels, device arena and graph replay
    need a machine with a GPU to be written and checked on, and none was lent so far. Asking
    for it says which of the two is missing here, the GPU or the kernels, rather than
    running everything on the CPU unannounced."""

    name = "cuda"
    device = "cuda"

    def __init__(self):
        from ..errors import GlassrtError

        dev, what = cuda_device()
        if dev is None:
            raise GlassrtError(f"provider 'cuda': no GPU found: {what}. Use providers=['onednn', 'cpu'] "
                               f"(the default) on this machine")
        raise GlassrtError(f"provider 'cuda': {what} found, but this glassrt has no GPU kernels yet; "
                           f"use the CPU providers (the default)")


_PROVIDERS = {"cpu": CpuProvider, "reference": ReferenceProvider, "onednn": OnednnProvider, "cuda": CudaProvider}
ALIASES = {"CPUExecutionProvider": "cpu", "cpu": "cpu", "reference": "reference", "onednn": "onednn",
           "DnnlExecutionProvider": "onednn", "cuda": "cuda"}
# onnxruntime's other execution providers: named in a list written for onnxruntime, each is
# skipped with a warning (as onnxruntime skips one it was not built with).
ORT_ONLY = {"CUDAExecutionProvider", "TensorrtExecutionProvider", "ROCMExecutionProvider",
            "MIGraphXExecutionProvider", "OpenVINOExecutionProvider", "CoreMLExecutionProvider",
            "DmlExecutionProvider", "QNNExecutionProvider", "NnapiExecutionProvider", "XnnpackExecutionProvider",
            "ACLExecutionProvider", "ArmNNExecutionProvider", "CANNExecutionProvider", "AzureExecutionProvider",
            "WebGpuExecutionProvider", "VitisAIExecutionProvider", "JsExecutionProvider", "RknpuExecutionProvider",
            "TvmExecutionProvider", "SNPEExecutionProvider"}
# oneDNN first where it is installed (a dependency on Linux x86-64): it takes the convolutions,
# pooling and the like it is fast at, glassrt's cpu kernels everything else.
DEFAULT = ["onednn", "cpu", "reference"]


def wants_onednn(names) -> bool:
    """Whether a priority list (None: DEFAULT) names the onednn provider."""
    for entry in names or DEFAULT:
        n = entry[0] if isinstance(entry, tuple) and entry else entry
        if isinstance(entry, OnednnProvider) or (isinstance(n, str) and ALIASES.get(n, n) == "onednn"):
            return True
    return False


def make(names, notes: list | None = None) -> list[Provider]:
    """Provider objects for a priority list (None: DEFAULT). An entry is a name (glassrt's
    or onnxruntime's), a (name, options) pair as onnxruntime takes them, or a Provider
    object. A default provider that cannot load here (onednn without its library) is left
    out, with the reason in `notes`; one the caller named stays, and each node it cannot
    take says why. onnxruntime's providers glassrt does not have are skipped with a warning."""
    import warnings

    from ..errors import GlassrtError

    out = []
    for entry in names or DEFAULT:
        if isinstance(entry, Provider):  # a provider object of the caller's own (tests, experiments)
            out.append(entry)
            continue
        n, options = entry if isinstance(entry, tuple) and len(entry) == 2 else (entry, None)
        if not isinstance(n, str) or not (options is None or isinstance(options, dict)):
            raise GlassrtError(f"a provider is a name or a (name, options dict) pair, got {entry!r}")
        if n in ORT_ONLY:
            why = f"provider {n} is onnxruntime's; glassrt has no such provider and skips it"
            warnings.warn(why, UserWarning, stacklevel=4)
            if notes is not None:
                notes.append(why)
            continue
        key = ALIASES.get(n, n)
        if key not in _PROVIDERS:
            raise GlassrtError(f"unknown provider '{n}'; available: {', '.join(sorted(_PROVIDERS))} "
                               f"(or onnxruntime's names: {', '.join(sorted(k for k in ALIASES if k not in _PROVIDERS))})")
        p = _PROVIDERS[key]()
        if options:
            p.configure(options)
        if not names and getattr(p, "unavailable", None):
            if notes is not None:
                notes.append(f"provider {p.name} is not used: {p.unavailable}; glassrt's own kernels run "
                             f"every node")
            continue
        out.append(p)
    if not out:
        raise GlassrtError(f"no provider left to run on from {list(names)}")
    return out
