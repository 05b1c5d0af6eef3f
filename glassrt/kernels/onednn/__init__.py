"""oneDNN (libdnnl 3.2) through ctypes, for a provider of blocked-layout CNN kernels.

`capi` is the raw C API: it finds and loads the library (the `onednn-cpu-gomp` wheel puts
it under sys.prefix/lib), declares the function signatures and the enum values of
oneDNN 3.2, and turns non-success statuses into `DnnlError`. When the library cannot be
loaded, `capi.UNAVAILABLE` holds the reason and nothing raises at import.

`dnnl` is the Pythonic layer over it: engine and per-thread streams, memory descriptors
and zero-copy memory objects over NumPy buffers, primitive descriptors for the CNN ops
(convolution with post-ops, reorder, matmul, inner product, pooling, eltwise, binary,
concat, batch/layer normalization, LRN, softmax) and bound steps whose run costs only
set_data_handle + execute + stream wait.

Neither module is imported by `glassrt.kernels`; import them explicitly. The kernel modules
are imported per op by the provider (FAMILIES below).
"""
from __future__ import annotations

from pathlib import Path

from ..families import KernelFamilies

# The modules that register the onednn provider's kernels, imported per op as the cpu
# provider's are (kernels/families.py); `kernels` first, as every other one imports it.
FAMILIES = KernelFamilies(__name__, Path(__file__).parent,
                          ("kernels", "gelu", "int8", "int8_float", "int8_float_matmul", "matmul", "matmul_rows", "quantize", "rnn", "rows", "transpose"), "onednn")
