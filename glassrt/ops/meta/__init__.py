"""Hand-written meta rules, one module per op family.

Only ops where onnx's own inference loses symbolic dims, is slow, or needs value
propagation are here; every other op uses ops/onnx_meta.py.
"""
from . import control, elementwise, indexing, nn, nn_extra, quantize, reduce, rnn, sequence, shape, vision  # noqa: F401
