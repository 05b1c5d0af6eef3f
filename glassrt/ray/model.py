"""A model's bytes, read once on the driver and shared through Ray's object store.

Every actor that builds a session needs the whole model. Reading a path in each actor
would need the file on every node (and read it once per actor); shipping the bytes inside
the actor's constructor arguments would copy them into every actor creation task. An
ObjectRef made once with `model_ref` is the cheap way: the object store holds one copy
per node, and each actor resolves the ref when it starts.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import onnx

from ..errors import ModelLoadError
from ..onnx_io import read_model


def model_bytes(model) -> tuple[bytes, str]:
    """(self-contained ONNX bytes, a name for reports) of a path, bytes or ModelProto."""
    if isinstance(model, onnx.ModelProto):
        return model.SerializeToString(), model.graph.name or "model"
    if isinstance(model, (bytes, bytearray, memoryview)):
        data = bytes(model)
        return data, f"sha256:{hashlib.sha256(data).hexdigest()[:12]}"
    if isinstance(model, (str, os.PathLike)):
        proto, _ = read_model(model)  # the same checks (exists, is a file, parses) a session makes
        # (a subgraph's external tensor, rarer, fails in the actor's session with its own error)
        if any(onnx.external_data_helper.uses_external_data(t) for t in proto.graph.initializer):
            # The actors get bytes, not the folder: its external files would not be there.
            raise ModelLoadError(f"'{model}' keeps tensors in external data files; glassrt.ray ships one "
                                 "self-contained model (save it with onnx.save(..., save_as_external_data=False))")
        return Path(model).read_bytes(), Path(model).name
    raise ModelLoadError(f"model: expected a path, bytes, onnx.ModelProto or a ray.ObjectRef of bytes, "
                         f"got {type(model).__name__}")


def model_ref(model):
    """Put the model's bytes in Ray's object store once (on the driver); pass the returned
    ObjectRef as the Predictor's `model`, so that actors never read the file themselves."""
    from . import require_ray

    ray = require_ray("glassrt.ray.model_ref")
    data, _ = model_bytes(model)
    return ray.put(data)


def resolve(model) -> tuple[bytes, str]:
    """In an actor: (bytes, name) of what the Predictor was given, fetching an ObjectRef."""
    import ray

    if isinstance(model, ray.ObjectRef):
        data = ray.get(model)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ModelLoadError(f"model: the ObjectRef holds a {type(data).__name__}, not the model's bytes "
                                 "(make it with glassrt.ray.model_ref)")
        return model_bytes(data)
    return model_bytes(model)
