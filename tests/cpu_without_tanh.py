"""Importing this module takes the cpu provider's Tanh kernel away for the rest of the
process, so that a Tanh node falls back to `reference` (glassrt's cpu provider runs every
ONNX op: a fallback has to be made). For `glassrt serve --module tests.cpu_without_tanh`
in tests/test_serve.py; never import it into the test process itself."""
from __future__ import annotations

from glassrt.kernels import registry
from glassrt.runtime import _load_cpu_kernels

_load_cpu_kernels()  # loaded later, the kernel modules would register Tanh again
registry.unregister("cpu", "", "Tanh")
