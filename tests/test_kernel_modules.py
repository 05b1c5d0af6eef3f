"""The cpu kernel modules are imported per op (glassrt/kernels/cpu/__init__.py): the cached
op -> module map is what importing every module registers, an op's kernels are the same
and in the same order whichever ops were asked for before it, and a session imports only
the families its nodes need."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from onnx import helper

# Every op's cpu kernels (names, in order) after the modules are imported op by op, in the
# given order of ops, or all at once.
_LISTING = """
import json, random, sys
from glassrt.kernels import cpu, registry
mode = sys.argv[1]
ops = sorted(cpu._op_map())
if mode == "all":
    cpu.load_all()
else:
    random.Random(int(mode)).shuffle(ops)
    for key in ops:
        cpu.load_for(*key.split("\\t"))
print(json.dumps({key: [k.name for k in registry.kernels_for("cpu", *key.split("\\t"))] for key in sorted(ops)}))
"""


def _run(code, cache, *args):
    env = {**os.environ, "GLASSRT_CACHE_DIR": str(cache)}
    r = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_map_is_written_once_and_matches_the_modules(tmp_path):
    _run("from glassrt.kernels import cpu; cpu.load_for('', 'Relu')", tmp_path)
    files = list(tmp_path.glob("cpu-kernels-*.json"))
    assert len(files) == 1 and not list(tmp_path.glob("*.tmp"))
    cached = json.loads(files[0].read_text())["ops"]
    fresh = json.loads(_run("import json; from glassrt.kernels import cpu; print(json.dumps(cpu.build_map()))",
                            tmp_path / "other"))
    assert cached == fresh
    assert cached["\tConv"] == ["conv"] and cached["\tBatchNormalization"] == ["norm", "normalization"]
    assert cached["glassrt\tFusedConv"] == ["conv"]  # registered by conv.py's loop, not a decorator


def test_an_ops_kernels_do_not_depend_on_the_order_ops_are_asked_for(tmp_path):
    _run("from glassrt.kernels import cpu; cpu.load_for('', 'Relu')", tmp_path)  # the map, cached
    everything = json.loads(_run(_LISTING, tmp_path, "all"))
    assert len(everything) > 200 and all(everything.values())
    for seed in (1, 2):
        assert json.loads(_run(_LISTING, tmp_path, str(seed))) == everything


def test_a_damaged_map_is_rebuilt(tmp_path):
    _run("from glassrt.kernels import cpu; cpu.load_for('', 'Relu')", tmp_path)
    path = next(tmp_path.glob("cpu-kernels-*.json"))
    good = json.loads(path.read_text())
    for bad in ("{not json", json.dumps({**good, "ops": {"\tRelu": ["no_such_module"]}}), json.dumps([1])):
        path.write_text(bad)
        _run("from glassrt.kernels import cpu, registry; cpu.load_for('', 'Relu'); "
             "assert registry.kernels_for('cpu', '', 'Relu')", tmp_path)
        assert json.loads(path.read_text()) == good


def test_a_session_imports_the_kernel_families_its_nodes_need(tmp_path):
    m = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Transpose", ["r"], ["y"], perm=[1, 0])], "g",
        [helper.make_tensor_value_info("x", 1, [2, 3])], [helper.make_tensor_value_info("y", 1, [3, 2])]),
        opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    code = f"""
import sys, numpy as np, glassrt
s = glassrt.InferenceSession({str(path)!r}, providers=["cpu"])
y = s.run(None, {{"x": np.array([[1, -2, 3], [-4, 5, 6]], np.float32)}})[0]
assert np.array_equal(y, np.maximum([[1, -2, 3], [-4, 5, 6]], 0).T)
print(sorted(m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("glassrt.kernels.cpu.")))
"""
    _run(code, tmp_path / "cache")  # writes the map
    loaded = eval(_run(code, tmp_path / "cache").strip().splitlines()[-1])
    families = set(loaded) - {"_util", "_jit", "erf", "rows"}  # helpers, not families
    assert families == {"elementwise", "shape"}, loaded


def test_onednns_kernel_modules_are_imported_per_op_too(tmp_path):
    """The onednn provider's modules come in as the cpu provider's: a Conv model imports
    oneDNN's convolution module, not its RNN, GELU or matmul ones; the cached map is what
    importing every module registers."""
    pytest.importorskip("glassrt.kernels.onednn.capi")
    from glassrt.kernels.onednn import capi

    if capi.UNAVAILABLE:
        pytest.skip(capi.UNAVAILABLE)
    m = helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "g",
        [helper.make_tensor_value_info("x", 1, [1, 8, 9, 9])], [helper.make_tensor_value_info("y", 1, [1, 4, 9, 9])],
        [helper.make_tensor("w", 1, [4, 8, 3, 3], [0.01] * 288)]), opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    code = f"""
import sys, numpy as np, glassrt
s = glassrt.InferenceSession({str(path)!r})
assert s.explain()["nodes"][0]["provider"] == "onednn"
s.run(None, {{"x": np.ones((1, 8, 9, 9), np.float32)}})
print(sorted(m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("glassrt.kernels.onednn.")))
"""
    _run(code, tmp_path / "cache")  # writes the maps
    loaded = set(eval(_run(code, tmp_path / "cache").strip().splitlines()[-1]))
    assert "kernels" in loaded and not loaded & {"rnn", "gelu", "matmul", "transpose", "rows"}, loaded
    cached = json.loads(next((tmp_path / "cache").glob("onednn-kernels-*.json")).read_text())["ops"]
    fresh = json.loads(_run("import json; from glassrt.kernels.onednn import FAMILIES; "
                            "print(json.dumps(FAMILIES.build_map()))", tmp_path / "other"))
    assert cached == fresh and cached["\tConv"] == ["kernels"] and cached["\tLSTM"] == ["rnn"]
