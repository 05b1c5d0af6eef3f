"""A weight stored twice, once as the transpose of the other, is kept once.

Language models tie their output projection to the token embedding; an exporter that
folds the transpose writes the embedding (vocab, hidden) for the Gather and its transpose
(hidden, vocab) for the last MatMul as two initializers (torch.onnx.export of GPT-2:
'transformer.wte.weight' and 'onnx::MatMul_…', 154 MB each). Here the second becomes a
transposed view of the first: the same values, one copy in memory. The products that read
it see a weight laid out (N, K) and read it by rows (kernels/onednn/matmul.py), which at
one row streams faster than the (K, N) copy did.

Only 2-D float initializers of at least MIN_BYTES are compared, and only pairs whose first
row and first column already match (each array's are read once); a pair is tied only when
every element is equal (bitwise, so NaNs and signed zeros too). The one that becomes a view
is read by nothing but MatMuls, as their B (whose kernels read a transposed view where it
lies; any other kernel, a custom op's, gets its arrays as they were); initializers a caller
may feed instead (graph inputs) are left alone, and a symmetric matrix is not its own twin.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..weights import release_pages

MIN_BYTES = 1 << 20
_BLOCK_ROWS = 256  # rows of the (N, K) twin compared at a time: both sides stay in cache


def _edges(a: np.ndarray) -> tuple:
    """What a twin must match first: shape, dtype, first row and first column (bytes)."""
    return a.shape, a.dtype.str, a[0].tobytes(), a[:, 0].tobytes()


def _transposed_edges(a: np.ndarray) -> tuple:
    """_edges(a.T), read from a."""
    return a.shape[::-1], a.dtype.str, a[:, 0].tobytes(), a[0].tobytes()


def _same_transposed(a: np.ndarray, b: np.ndarray) -> bool:
    """b == a.T, bitwise, compared a block of a's rows at a time."""
    a_bits, b_bits = (x.view(f"u{x.dtype.itemsize}") for x in (a, b))
    for lo in range(0, a.shape[0], _BLOCK_ROWS):
        if not np.array_equal(a_bits[lo:lo + _BLOCK_ROWS].T, b_bits[:, lo:lo + _BLOCK_ROWS]):
            return False
    return True


def tie_transposed_weights(graph, ctx=None):
    over = graph.overridable()
    big = {name: a for name, a in graph.initializers.items()
           if name not in over and isinstance(a, np.ndarray) and a.ndim == 2 and a.dtype.kind == "f"
           and a.dtype.itemsize in (2, 4, 8)
           and a.nbytes >= MIN_BYTES and a.flags.c_contiguous and min(a.shape) > 0}
    if len(big) < 2:
        return graph, []
    # The view is a weight read only as a MatMul's B (K, N), whose kernels read it where it
    # lies; its twin keeps the storage, which the product then reads by rows (N, K).
    readers = graph.consumers()
    outputs = set(graph.output_names())
    as_weight = [name for name in big if name not in outputs and readers.get(name) and all(
        n.op_type == "MatMul" and not n.domain and len(n.inputs) == 2 and n.inputs[1] == name and n.inputs[0] != name
        for n in readers[name])]
    if not as_weight:  # (a CNN's large weights are Gemm's: no column of theirs is read)
        return graph, []
    by_edges: dict = {}
    for name, a in big.items():
        by_edges.setdefault(_edges(a), []).append(name)
    inits, changes, tied = dict(graph.initializers), [], set()
    for name in as_weight:
        if name in tied:
            continue
        a = big[name]
        for twin in by_edges.get(_transposed_edges(a), []):
            if twin == name or twin in tied or not _same_transposed(big[twin], a):
                continue
            inits[name] = big[twin].T
            release_pages(a)  # a copy mapped from its file: the pages the comparison read go back
            tied.update((name, twin))
            changes.append(f"'{name}' {list(a.shape)} is '{twin}' transposed: read as a view of it "
                           f"({a.nbytes / 2**20:,.1f} MiB not held twice)")
            break
    if not changes:
        return graph, []
    return replace(graph, initializers=inits), changes
