"""Inputs generated from declared shapes, for `glassrt run`, `profile` and `bench`."""
from __future__ import annotations

import numpy as np


def random_value(rng, shape, dtype) -> np.ndarray | None:
    """Random floats in [0, 1), small non-negative ints (valid as indices and sizes), random
    booleans; None for a dtype nothing sensible can be made up for (strings...)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return rng.random(shape).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, 10, shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) > 0.5
    return None
