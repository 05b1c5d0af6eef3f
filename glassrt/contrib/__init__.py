"""Operators outside the ONNX standard that real models carry, defined with glassrt's public
custom-op API (`glassrt.custom_op`) and registered on import.

- `microsoft`: onnxruntime's contrib ops (domain `com.microsoft`, plus SimplifiedLayerNormalization,
  which onnxruntime registers in the default domain), as left in models by onnxruntime's graph
  optimizers, `onnxruntime.transformers` and exporters that target onnxruntime.
- `microsoft_quant`: onnxruntime's quantized contrib ops (QLinearAdd, QGemm, QLinearSoftmax,
  QAttention, DynamicQuantizeLSTM...), as left by its quantization tool (QOperator format,
  dynamic quantization) and in the ONNX model zoo's int8 models.
- `microsoft_gqa`: onnxruntime's GroupQueryAttention, the KV-cached attention of the LLMs that
  onnxruntime-genai's model builder and optimum export (Phi-3, Llama, Mistral, Qwen).
"""
from . import microsoft  # noqa: F401
from . import microsoft_quant  # noqa: F401
from . import microsoft_gqa  # noqa: F401
