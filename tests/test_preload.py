"""oneDNN's library loaded on a thread while a session reads its model (kernels/onednn/preload.py).

Each case runs in a fresh interpreter: whether the library is loaded, and by whom, is
process state."""
import json
import os
import subprocess
import sys

import pytest

from glassrt.kernels.onednn import capi, preload

pytestmark = pytest.mark.skipif(capi.lib is None or not sys.platform.startswith("linux"),
                                reason=f"oneDNN unavailable: {capi.UNAVAILABLE}")

_PROBE = r"""
import json, sys
import numpy as np
from onnx import TensorProto, helper
import glassrt
from glassrt.kernels.onednn import preload

def mapped():
    return sorted({line.split()[-1] for line in open("/proc/self/maps") if "libdnnl" in line})

x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
w = helper.make_tensor("w", TensorProto.FLOAT, [3, 2, 1, 1], np.ones(6, np.float32))
model = helper.make_model(helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "g", [x], [y], [w]),
                          opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
out = {"after_import": mapped()}
providers = json.loads(sys.argv[1])
sess = glassrt.InferenceSession(model, providers=providers)
out["providers"] = sess.get_providers()
out["thread_started"] = preload._thread is not None
out["after_session"] = mapped()
y = sess.run(None, {"x": np.ones((1, 2, 4, 4), np.float32)})[0]
out["right"] = bool(np.allclose(y, 2.0))
if "glassrt.kernels.onednn.capi" in sys.modules:
    from glassrt.kernels.onednn import capi
    out["capi_path"] = capi.path
print(json.dumps(out))
"""


def _probe(providers, **env):
    run = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(providers)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, **env})
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_the_first_session_loads_the_library_it_runs_on():
    got = _probe(None)
    assert got["after_import"] == []  # importing glassrt loads nothing
    assert got["thread_started"] and got["providers"][0] == "onednn"
    assert len(got["after_session"]) == 1 and got["right"]
    assert os.path.realpath(got["capi_path"]) == os.path.realpath(got["after_session"][0])


def test_a_session_without_onednn_does_not_load_it():
    got = _probe(["cpu"])
    assert not got["thread_started"] and got["after_session"] == [] and got["right"]


def test_turned_off_by_the_environment():
    got = _probe(None, GLASSRT_ONEDNN="0")
    assert not got["thread_started"] and got["after_session"] == [] and got["right"]
    assert "onednn" not in got["providers"]


def test_a_fork_waits_for_the_load_and_the_child_runs():
    """A child forked right after the load began (the loader's lock possibly held by the
    loading thread) still loads libraries and runs a session."""
    code = r"""
import os, sys
import numpy as np
from onnx import TensorProto, helper
import glassrt
from glassrt.kernels.onednn import preload
preload.start()
pid = os.fork()
if pid == 0:
    import ctypes.util, decimal  # a dlopen in the child: would hang on a lock held at the fork
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    m = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    out = glassrt.InferenceSession(m, providers=["cpu"]).run(None, {"x": np.array([-1, 2], np.float32)})[0]
    os._exit(0 if out.tolist() == [0, 2] else 1)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]


_SPIN_PROBE = r"""
import ctypes, json, os, sys, time
import numpy as np
from onnx import TensorProto, helper
if sys.argv[1] == "libgomp-first":
    ctypes.CDLL("libgomp.so.1")
import glassrt
from glassrt.kernels.onednn import preload

x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32, 32])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
w = helper.make_tensor("w", TensorProto.FLOAT, [32, 16, 3, 3], np.full(32 * 16 * 9, 0.01, np.float32))
model = helper.make_model(helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "g", [x], [y], [w]),
                          opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
sess = glassrt.InferenceSession(model, sess_options=glassrt.SessionOptions(intra_op_num_threads=2))
feed = {"x": np.ones((1, 16, 32, 32), np.float32)}
sess.run(None, feed)

def cpu_ms():
    # CPU time of the process's threads but the main one (which only sleeps and reads these
    # files: its own time was most of what glassrt's setting measured), in ms: from schedstat
    # (nanoseconds) where the kernel keeps it, else from stat's clock ticks (10 ms each:
    # coarse against a spin of a fraction of a millisecond)
    total = 0.0
    for tid in os.listdir("/proc/self/task"):
        if tid == str(os.getpid()):
            continue
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0]) / 1e6
        except (OSError, ValueError, IndexError):
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) * 1000.0 / os.sysconf("SC_CLK_TCK")
    return total

burned = 0.0
for _ in range(20):  # a run, then 50 ms idle: what do OpenMP's idle workers burn meanwhile?
    sess.run(None, feed)
    before = cpu_ms()
    time.sleep(0.05)
    burned += cpu_ms() - before
print(json.dumps({"policy": preload.spin_policy, "env": os.environ.get("GOMP_SPINCOUNT"),
                  "wait_policy": os.environ.get("OMP_WAIT_POLICY"), "burned": burned}))
"""


def _spin_probe(mode="", **env):
    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    run = subprocess.run([sys.executable, "-c", _SPIN_PROBE, mode], capture_output=True, text=True, timeout=120,
                         env={**clean, **env})
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_openmp_workers_stop_spinning_soon_after_a_run():
    """glassrt loads libgomp with GOMP_SPINCOUNT where nobody chose how OpenMP waits, and
    takes the variable out of the environment again (children do not inherit it)."""
    ours = _spin_probe()
    assert f"{preload.SPINCOUNT:,}" in ours["policy"] and ours["env"] is None
    default = _spin_probe(GOMP_SPINCOUNT="300000")  # libgomp's own default, made explicit
    assert "environment" in default["policy"] and default["env"] == "300000"
    if default["burned"] < 40:  # (ms; one core, or a worker starved by a busy machine: nothing to compare)
        pytest.skip(f"libgomp's default burned only {default['burned']:.1f} ms here")
    assert ours["burned"] < default["burned"] / 2, (ours, default)


def test_the_users_openmp_settings_are_kept():
    got = _spin_probe(OMP_WAIT_POLICY="passive")
    assert "OMP_WAIT_POLICY=passive" in got["policy"] and got["wait_policy"] == "passive" and got["env"] is None


def test_libgomp_loaded_before_glassrt_is_left_as_it_is():
    got = _spin_probe("libgomp-first")
    assert "loaded before glassrt" in got["policy"] and got["env"] is None
