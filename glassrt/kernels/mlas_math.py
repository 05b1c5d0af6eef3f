"""onnxruntime's MLAS float32 math, reproduced bit for bit where onnxruntime's numbers must
be matched exactly (quantized lookup tables, SVM decision values).

MLAS's tanh and logistic are Eigen's rational approximations, their Horner steps fused
multiply-adds (its AVX2 and AVX-512 kernels): off the true functions by up to 3e-7, which
a requantized table or an SVM's cancelling sums of kernel values show.
"""
from __future__ import annotations

import numpy as np

F32, F64 = np.float32, np.float64

_TANH = (F32(9), [F32(v) for v in (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11,
                                   5.12229709037114e-08, 1.48572235717979e-05, 6.37261928875436e-04,
                                   4.89352455891786e-03)],
         [F32(v) for v in (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03)])
_LOGISTIC = (F32(18), [F32(v) for v in (4.37031012579801e-11, 1.15627324459942e-07, 6.08574864600143e-05,
                                        8.51377133304701e-03, 2.48287947061529e-01)],
             [F32(v) for v in (6.10247389755681e-13, 5.76102136993427e-09, 6.29106785017040e-06,
                               1.70198817374094e-03, 1.16817656904453e-01, 9.93151921023180e-01)])


def fma32(a, b, c):
    """float32 a·b + c rounded once, as an FMA instruction rounds it. The product of two
    float32 (or of a float32 and an 8-bit integer) is exact in float64; the float64 sum,
    rounded to float32, differs from a single rounding only if it was itself rounded (its
    addends some 30 binary orders of magnitude apart) onto a point exactly halfway between
    two float32 values."""
    return (np.asarray(a, F64) * np.asarray(b, F64) + np.asarray(c, F64)).astype(F32)


def _rational(x, consts):
    bound, pc, qc = consts
    v = np.clip(np.asarray(x, F32), -bound, bound)
    v2 = v * v
    p = fma32(v2, pc[0], pc[1])
    for c in pc[2:]:
        p = fma32(p, v2, c)
    q = fma32(v2, qc[0], qc[1])
    for c in qc[2:]:
        q = fma32(q, v2, c)
    return (p * v) / q


def tanh(x):
    """MlasComputeTanh."""
    return _rational(x, _TANH)


def logistic(x):
    """MlasComputeLogistic; the result clamped to [0, 1] as onnxruntime's kernels clamp it
    (the approximation dips below 0 near -18)."""
    return np.clip(_rational(x, _LOGISTIC) + F32(0.5), F32(0), F32(1))
