"""ONNX's protobuf messages (ModelProto, TensorProto, ...) without importing the onnx package.

Loading, placing and running a model needs the messages only: the classes protoc generated
from onnx-ml.proto, which the onnx package ships as `onnx/onnx_ml_pb2.py`. Importing them
the usual way (`from onnx import ModelProto`) imports the whole package first: its C++
extension, the checker, the helpers, the version converter, the reference runtime's
registry of dtypes... 11.7 MiB resident and ~100 ms, against 2.3 MiB for the messages.

So this module loads that one generated file by path, registered as `onnx.onnx_ml_pb2`
in `sys.modules`: a later `import onnx` (by glassrt's slower paths or by the user) finds it
there and reuses it, so there is one set of message classes and `isinstance` holds across
both. Where onnx is already imported, its module is used as is. Code that needs onnx's
functions (shape inference, the checker, helpers that build protos) imports onnx where it
uses them.
"""
from __future__ import annotations

import functools
import importlib
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

_NAME = "onnx.onnx_ml_pb2"


@functools.cache
def onnx_folder() -> Path:
    """The installed onnx package's folder, found without importing it."""
    spec = importlib.util.find_spec("onnx")  # a top-level name: found, not imported
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("glassrt needs the onnx package (pip install onnx)")
    return Path(next(iter(spec.submodule_search_locations)))


def _load():
    if _NAME in sys.modules:
        return sys.modules[_NAME]
    if "onnx" in sys.modules:  # the package is there: its own module, loaded as usual
        return importlib.import_module(_NAME)
    path = onnx_folder() / "onnx_ml_pb2.py"
    file_spec = importlib.util.spec_from_file_location(_NAME, path)
    module = importlib.util.module_from_spec(file_spec)
    sys.modules[_NAME] = module
    try:
        file_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[_NAME]
        raise
    sys.meta_path.insert(0, _AttachWhenImported(module))
    return module


class _AttachWhenImported:
    """A meta path finder (not an importlib.abc subclass: importing that module imports
    tempfile, shutil, bz2, lzma and random, ~0.5 MiB). When the onnx package is imported
    later, it sets the package's `onnx_ml_pb2` attribute to the module loaded here (Python
    sets a package's attribute for a submodule only when it loads the submodule itself, and
    this one is already in sys.modules), then leaves sys.meta_path."""

    def __init__(self, module):
        self.module = module

    def find_spec(self, name, path=None, target=None):
        if name != "onnx":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)  # onnx's own spec, as found without us
        if spec is None or spec.loader is None:
            return None
        run, module_pb, finder = spec.loader.exec_module, self.module, self

        def exec_module(package):
            package.onnx_ml_pb2 = module_pb
            if finder in sys.meta_path:
                sys.meta_path.remove(finder)
            run(package)

        spec.loader.exec_module = exec_module
        return spec


_pb = _load()

AttributeProto = _pb.AttributeProto
FunctionProto = _pb.FunctionProto
GraphProto = _pb.GraphProto
ModelProto = _pb.ModelProto
NodeProto = _pb.NodeProto
OperatorSetIdProto = _pb.OperatorSetIdProto
SparseTensorProto = _pb.SparseTensorProto
StringStringEntryProto = _pb.StringStringEntryProto
TensorProto = _pb.TensorProto
TensorShapeProto = _pb.TensorShapeProto
TypeProto = _pb.TypeProto
ValueInfoProto = _pb.ValueInfoProto
