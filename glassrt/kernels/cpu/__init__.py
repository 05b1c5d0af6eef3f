"""The cpu provider: NumPy (BLAS) and Numba kernels, one module per op family."""
from . import (attention, control, conv, conv_transpose, deform_conv, elementwise, grid_sample, image,  # noqa: F401
               indexing, matmul, ml, nms, norm, normalization, pool, quantize, random, reduce, resize, rnn, roi,
               sequence, shape, signal, strings, svm, training)
