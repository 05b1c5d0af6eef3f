"""Resize's compiled passes and their NumPy twins (kernels/cpu/resize.py) give the same
bits: a model's first run uses the twins (no Numba import there), later runs the loops."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

import glassrt
from glassrt.kernels.cpu import resize

CASES = [
    ({"mode": "nearest"}, (1, 3, 5, 7), [1, 1, 2, 2], np.float32),
    ({"mode": "nearest", "nearest_mode": "floor", "coordinate_transformation_mode": "asymmetric"}, (2, 3, 8, 6),
     [1, 1, 0.5, 1.7], np.uint8),
    ({"mode": "nearest"}, (2, 4, 6), [1, 1.5, 1], np.float16),
    ({"mode": "nearest"}, (3, 9), [1, 2.5], np.int64),
    ({"mode": "linear"}, (1, 3, 5, 7), [1, 1, 2, 2], np.float32),
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, (2, 2, 9, 4), [1, 1, 0.6, 3.3],
     np.float64),
    ({"mode": "linear"}, (2, 5, 7), [1, 2.2, 0.8], np.float32),
    ({"mode": "linear"}, (4, 10), [1, 1.7], np.float32),
    ({"mode": "cubic"}, (1, 2, 6, 5), [1, 1, 1.8, 2.4], np.float32),
    ({"mode": "cubic", "exclude_outside": 1}, (1, 2, 6, 5), [1, 1, 0.7, 1.3], np.float32),
    ({"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": -3.0},
     (1, 2, 6, 5), [1, 1, 1.5, 2.0], np.float32),
    ({"mode": "nearest"}, (1, 3, 5, 7), [1, 1, 2, 2], np.bool_),
]


def _model(attrs, shape, scales, dtype):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = [numpy_helper.from_array(np.asarray(scales, np.float32), "scales")]
    roi = ""
    if attrs.get("coordinate_transformation_mode") == "tf_crop_and_resize":
        r = len(shape)
        inits.append(numpy_helper.from_array(np.array([0] * (r - 2) + [0.1, 0.2] + [1] * (r - 2) + [0.8, 0.9],
                                                      np.float32), "roi"))
        roi = "roi"
    node = helper.make_node("Resize", ["x", roi, "scales"], ["y"], **attrs)
    return helper.make_model(helper.make_graph([node], "g", [helper.make_tensor_value_info("x", elem, shape)],
                                               [helper.make_tensor_value_info("y", elem, None)], inits),
                             opset_imports=[helper.make_opsetid("", 19)])


@pytest.mark.parametrize("attrs, shape, scales, dtype", CASES)
def test_numpy_twins_are_the_compiled_passes_bit_for_bit(monkeypatch, attrs, shape, scales, dtype):
    pytest.importorskip("numba")
    rng = np.random.default_rng(len(shape) * 31 + int(sum(scales) * 10))
    x = (rng.random(shape) * 200 - 50).astype(dtype) if dtype is not np.bool_ else rng.random(shape) > 0.5
    m = _model(attrs, shape, scales, dtype)
    got = {}
    compiled_loops = resize._COMPILED

    def refuse(*args):
        raise AssertionError("a compiled pass ran where its NumPy twin should")

    for compiled in (False, True):
        monkeypatch.setattr(resize, "use_compiled", lambda path, c=compiled: c)
        monkeypatch.setattr(resize, "_COMPILED", compiled_loops if compiled else (refuse,) * len(compiled_loops))
        sess = glassrt.InferenceSession(m.SerializeToString(), providers=["cpu"])
        assert sess.explain()["nodes"][0]["kernel"] == "cpu.Resize"
        got[compiled] = sess.run(None, {"x": x})[0]
    assert got[False].dtype == got[True].dtype and got[False].shape == got[True].shape
    assert got[False].tobytes() == got[True].tobytes()


def test_a_model_run_once_imports_no_numba(tmp_path):
    """A process that creates a session of a model with Resize and runs it once (an OCR
    detector's first run) does not import Numba: ~0.45 s against onnxruntime's 7 ms."""
    import os
    import subprocess
    import sys

    m = _model({"mode": "linear"}, (1, 3, 5, 7), [1, 1, 2, 2], np.float32)
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    code = f"""
import sys, numpy as np, glassrt
s = glassrt.InferenceSession({str(path)!r}, providers=["cpu"])
y = s.run(None, {{"x": np.ones((1, 3, 5, 7), np.float32)}})[0]
assert y.shape == (1, 3, 10, 14) and np.allclose(y, 1)
print("numba imported:", "numba" in sys.modules)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "GLASSRT_CACHE_DIR": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    assert "numba imported: False" in r.stdout, r.stdout
