"""ONNX's backend API (`onnx.backend.base.Backend`) on glassrt, as `onnxruntime.backend` does
for onnxruntime: tools written against that API (the onnx package's backend test suite,
converters' checks) run on glassrt by passing this module where they take a backend.

    import glassrt.backend as backend
    rep = backend.prepare(model)                       # a BackendRep around an InferenceSession
    outputs = rep.run([x])                             # inputs in the model's input order
    outputs = backend.run_model(model, [x])
    outputs = backend.run_node(onnx.helper.make_node("Relu", ["x"], ["y"]), [x])

Only the public session API is used. `prepare` takes SessionOptions fields by name
(`intra_op_num_threads=2`), `providers=` and `fallback=` as keyword arguments; an option
glassrt does not have is refused by name, as InferenceSession refuses it. Fallbacks to
the `reference` provider are silent here by default (this API is mostly driven by test
suites), and listed in `rep.session.fallbacks`; `fallback="warn"` or `"error"` as for a
session.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType

from .api import InferenceSession
from .errors import InvalidArgumentError
from .runtime.options import RunOptions, SessionOptions

_SESSION_KWARGS = ("providers", "fallback")
# onnx's test runner passes a case's tolerances (its test_kwargs) on to prepare: not options.
_RUNNER_KWARGS = ("rtol", "atol")


class GlassrtBackendRep(BackendRep):
    """A prepared model: `run(inputs)` with a list (the model's input order), a dict (by
    name) or a single array (a model with one input); returns a list of outputs."""

    def __init__(self, session: InferenceSession):
        self.session = session

    def run(self, inputs, **kwargs) -> list:
        """kwargs: RunOptions fields (terminate, time_budget_s, log_severity_level, ...), as
        onnxruntime.backend takes them; an unknown one is refused by name."""
        run_options = None
        if kwargs:
            run_options = RunOptions()
            for k, v in kwargs.items():
                setattr(run_options, k, v)
        names = [i.name for i in self.session.get_inputs()]
        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
        elif isinstance(inputs, (list, tuple)):
            if len(inputs) != len(names):
                raise InvalidArgumentError(f"{len(inputs)} inputs given, the model takes {len(names)}: {names}")
            feeds = dict(zip(names, inputs))
        else:
            if len(names) != 1:
                raise InvalidArgumentError(f"one input given, the model takes {len(names)}: {names}")
            feeds = {names[0]: inputs}
        # NumPy scalars (a 0-d result of an indexing) are fed as 0-d arrays, as onnxruntime's backend does.
        feeds = {k: np.asarray(v) if isinstance(v, np.generic) else v for k, v in feeds.items()}
        return self.session.run(None, feeds, run_options)


class GlassrtBackend(Backend):
    @classmethod
    def supports_device(cls, device: str) -> bool:
        """glassrt runs on the CPU ("CPU", "CPU:0"); not on "CUDA"."""
        try:
            return Device(device).type == DeviceType.CPU
        except Exception:  # noqa: BLE001 — a device string onnx cannot parse is not one we run on
            return False

    @classmethod
    def is_compatible(cls, model, device: str = "CPU", **kwargs) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs) -> GlassrtBackendRep:
        """model: an onnx.ModelProto, serialized bytes, a path, an InferenceSession or a
        GlassrtBackendRep (returned as it is)."""
        if isinstance(model, GlassrtBackendRep):
            return model
        if device is not None and not cls.supports_device(device):
            raise InvalidArgumentError(f"device {device!r}: glassrt runs on the CPU only")
        if isinstance(model, InferenceSession):
            return GlassrtBackendRep(model)
        for k in _RUNNER_KWARGS:
            kwargs.pop(k, None)
        session_kwargs = {k: kwargs.pop(k) for k in _SESSION_KWARGS if k in kwargs}
        session_kwargs.setdefault("fallback", "silent")
        options = SessionOptions()
        for k, v in kwargs.items():
            setattr(options, k, v)  # an option glassrt does not have is refused by name
        return GlassrtBackendRep(InferenceSession(model, sess_options=options, **session_kwargs))

    @classmethod
    def run_model(cls, model, inputs, device: str = "CPU", **kwargs) -> list:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs, device: str = "CPU", outputs_info=None, **kwargs) -> list:
        """Run one node on `inputs`, one per input name of the node, in order (an omitted
        optional input, '', takes none; a name the node reads twice, one). outputs_info: optional (dtype, shape) per output.
        opset_version: the opset of the node's domain (default: the newest onnx knows)."""
        opset = kwargs.pop("opset_version", None)
        names = list(dict.fromkeys(n for n in node.input if n))  # a name read twice is fed once
        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
        else:
            inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
            if len(inputs) != len(names):
                raise InvalidArgumentError(f"{len(inputs)} inputs given, {node.op_type} node "
                                           f"'{node.name}' names {len(names)}: {names}")
            feeds = dict(zip(names, inputs))
        graph_inputs = [_value_info(name, feeds[name]) for name in names if name in feeds]
        graph_outputs = []
        for k, name in enumerate(o for o in node.output if o):
            if outputs_info is not None and k < len(outputs_info):
                dtype, shape = outputs_info[k]
                graph_outputs.append(helper.make_tensor_value_info(
                    name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), list(shape)))
            else:
                graph_outputs.append(onnx.ValueInfoProto(name=name))  # the type comes from inference
        domain = node.domain if node.domain != "ai.onnx" else ""
        if opset is None:
            opset = onnx.defs.onnx_opset_version() if domain == "" else \
                onnx.defs.get_schema(node.op_type, domain=domain).since_version
        opsets = [helper.make_opsetid(domain, int(opset))]
        if domain != "":
            opsets.append(helper.make_opsetid("", onnx.defs.onnx_opset_version()))
        graph = helper.make_graph([node], f"{node.op_type}_node", graph_inputs, graph_outputs)
        model = helper.make_model(graph, opset_imports=opsets)
        rep = cls.prepare(model, device, **kwargs)
        return rep.run(feeds)


def _value_info(name, value) -> onnx.ValueInfoProto:
    """The graph input type of a value fed to run_node: a tensor, or a sequence of tensors."""
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, np.ndarray) for v in value):
        elem = helper.make_tensor_type_proto(helper.np_dtype_to_tensor_dtype(value[0].dtype), None)
        return helper.make_value_info(name, helper.make_sequence_type_proto(elem))
    a = np.asarray(value)
    elem = onnx.TensorProto.STRING if a.dtype.kind in "OUS" else helper.np_dtype_to_tensor_dtype(a.dtype)
    return helper.make_tensor_value_info(name, elem, list(a.shape))


# The module is a backend too, as onnxruntime.backend is: onnx's BackendTest(glassrt.backend, ...).
is_compatible = GlassrtBackend.is_compatible
prepare = GlassrtBackend.prepare
run = GlassrtBackend.run_model
run_model = GlassrtBackend.run_model
run_node = GlassrtBackend.run_node
supports_device = GlassrtBackend.supports_device
