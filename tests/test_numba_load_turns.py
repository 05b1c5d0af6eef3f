"""Numba's background load takes turns with the runs that come after a pause
(kernels/cpu/_jit.py: _GiveWayToRuns, run_before_load): at a module it is about to import
while such a run goes on, the loading thread waits for a run to end, then imports for a turn.
Runs back to back get no turns."""
import subprocess
import sys
import threading
import time

import pytest

from glassrt.kernels.cpu import _jit


@pytest.fixture(autouse=True)
def _after_a_pause():
    _jit._runs[2] = 0.0  # (the last run ended long ago: the next comes after a pause)


def _loader_asking(finder_box, asked, name="some.module"):
    """A thread that, as the loader, asks the finder for a module; `asked` gets when it got its answer."""
    def ask():
        assert finder_box[0].find_spec(name) is None  # (the real finders find the module)
        asked.append(time.perf_counter())
    thread = threading.Thread(target=ask)
    finder_box.append(_jit._GiveWayToRuns(thread))
    return thread


def test_the_loader_waits_for_the_run_going_on_to_end():
    box, asked = [], []
    thread = _loader_asking(box, asked)
    with _jit.run_before_load():
        thread.start()
        time.sleep(0.02)
        ended = time.perf_counter()
    thread.join(5)
    assert asked and asked[0] >= ended


def test_after_waiting_the_loader_imports_for_a_turn_without_waiting_again():
    box, asked = [], []
    thread = _loader_asking(box, asked)
    with _jit.run_before_load():
        thread.start()
        time.sleep(0.01)
    thread.join(5)
    finder = box[0]
    assert finder.until > time.perf_counter() - 1  # a turn began when the run ended
    finder.until = time.perf_counter() + 60  # (a turn that lasts the test)
    _jit._runs[2] = 0.0  # (the run below comes after a pause: only the turn keeps the loader from waiting)
    with _jit.run_before_load():
        t0 = time.perf_counter()
        finder.loader = threading.current_thread()  # (this thread asks, as the loader, within its turn)
        finder.find_spec("another.module")
        assert time.perf_counter() - t0 < _jit.GIVE_WAY_S / 2


def test_a_run_that_never_ends_holds_the_loader_for_give_way_s_only():
    box, asked = [], []
    thread = _loader_asking(box, asked)
    with _jit.run_before_load():
        t0 = time.perf_counter()
        thread.start()
        thread.join(5)
        assert asked and _jit.GIVE_WAY_S * 0.9 <= asked[0] - t0 < 1.0


def test_a_run_right_after_another_gets_no_turn():
    """Back to back (a loop), the load goes on through the run: turns would cost both more."""
    box, asked = [], []
    thread = _loader_asking(box, asked)
    with _jit.run_before_load():
        pass
    with _jit.run_before_load():  # (within BACK_TO_BACK_S of the last run's end)
        t0 = time.perf_counter()
        thread.start()
        thread.join(5)
        assert asked and asked[0] - t0 < _jit.GIVE_WAY_S / 2


def test_other_threads_imports_never_wait():
    finder = _jit._GiveWayToRuns(threading.Thread(target=lambda: None))
    with _jit.run_before_load():
        t0 = time.perf_counter()
        assert finder.find_spec("some.module") is None
        assert time.perf_counter() - t0 < _jit.GIVE_WAY_S / 2


_CODE = """
import sys, numpy as np, onnx
from onnx import helper, TensorProto
import glassrt
from glassrt.kernels.cpu import _jit
# a QLinearAdd (an optional compiled loop, its NumPy twin until Numba has loaded)
q = lambda n, v, t: helper.make_tensor(n, t, [], [v])
node = helper.make_node("QLinearAdd", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"], domain="com.microsoft")
graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TensorProto.UINT8, [64, 1024]) for n in "ab"],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, [64, 1024])],
                          [q("sa", 0.02, TensorProto.FLOAT), q("za", 128, TensorProto.UINT8), q("sb", 0.03, TensorProto.FLOAT),
                           q("zb", 120, TensorProto.UINT8), q("sy", 0.04, TensorProto.FLOAT), q("zy", 125, TensorProto.UINT8)])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
s = glassrt.InferenceSession(model.SerializeToString())
rng = np.random.default_rng(0)
feeds = {n: rng.integers(0, 256, (64, 1024), dtype=np.uint8) for n in "ab"}
first = s.run(None, feeds)[0]
runs = 0
while runs < 20000 and not (_jit._warmup is not None and _jit.numba_loaded()):
    assert np.array_equal(s.run(None, feeds)[0], first)
    runs += 1
print(_jit.numba_loaded(), runs > 1, any(isinstance(f, _jit._GiveWayToRuns) for f in sys.meta_path),
      np.array_equal(s.run(None, feeds)[0], first))
"""


def test_numba_loads_while_a_model_runs_in_a_loop_and_the_finder_goes_away():
    """A process running back to back still loads Numba (a turn after each run), its runs
    meanwhile give the same bytes, and the finder is gone from sys.meta_path after."""
    out = subprocess.run([sys.executable, "-c", _CODE], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "True True False True", out.stdout + out.stderr
