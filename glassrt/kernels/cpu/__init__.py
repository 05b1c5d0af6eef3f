"""The cpu provider: NumPy (BLAS) and Numba kernels, one module per op family."""
from . import (attention, control, conv, elementwise, image, indexing, matmul, ml, norm,  # noqa: F401
               normalization, pool, quantize, random, reduce, rnn, sequence, shape, signal,
               strings, training, vision)
