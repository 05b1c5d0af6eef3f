"""The cpu provider: NumPy (BLAS) and Numba kernels, one module per op family."""
from . import (conv, elementwise, matmul, norm, pool, reduce, shape)  # noqa: F401
