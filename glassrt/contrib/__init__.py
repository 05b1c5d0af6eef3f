"""Operators outside the ONNX standard that real models carry, defined with glassrt's public
custom-op API (`glassrt.custom_op`) and registered on import.

- `microsoft`: onnxruntime's contrib ops (domain `com.microsoft`, plus SimplifiedLayerNormalization,
  which onnxruntime registers in the default domain), as left in models by onnxruntime's graph
  optimizers, `onnxruntime.transformers` and exporters that target onnxruntime.
"""
from . import microsoft  # noqa: F401
