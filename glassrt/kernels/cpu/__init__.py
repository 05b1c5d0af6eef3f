"""The cpu provider: NumPy (BLAS) and Numba kernels, one module per op family.

The modules are imported when a node first needs one of their ops (kernels/families.py).
"""
from __future__ import annotations

from pathlib import Path

from ..families import KernelFamilies

# Registration order: where two modules register kernels for one op (BatchNormalization:
# norm, normalization), they are imported in this order, so their kernels list the same.
MODULES = ("attention", "cache", "control", "conv", "conv_transpose", "deform_conv", "elementwise", "grid_sample", "image",
           "indexing", "matmul", "ml", "nms", "norm", "normalization", "pool", "quantize", "random", "reduce",
           "resize", "rnn", "roi", "sequence", "shape", "signal", "strings", "svm", "training")

FAMILIES = KernelFamilies(__name__, Path(__file__).parent, MODULES, "cpu")
load_all, load_for, build_map = FAMILIES.load_all, FAMILIES.load_for, FAMILIES.build_map
_op_map = FAMILIES.op_map
