"""RunOptions (terminate from another thread, a time budget, log levels) and IOBinding
(outputs written into the caller's arrays), as onnxruntime's."""
from __future__ import annotations

import logging
import threading
import time
import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper

import glassrt

from .helpers import init, model, tensor


def _counting_loop():
    """y = x + trips (one Add per Loop iteration; `trips` is an input, so nothing folds)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["v_in", "one"], ["v_out"], name="step")],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [4])],
        [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])])
    loop = helper.make_node("Loop", ["trips", "cond", "x"], ["y"], name="loop", body=body)
    return model([loop], [tensor("trips", [], TensorProto.INT64), tensor("x", [4])], [tensor("y", [4])],
                 [init("cond", np.array(True))], opset=17)


def _feeds(trips):
    return {"trips": np.array(trips, np.int64), "x": np.zeros(4, np.float32)}


@pytest.fixture(scope="module")
def loop_session():
    return glassrt.InferenceSession(_counting_loop().SerializeToString(), providers=["cpu"])


def test_a_time_budget_stops_a_runaway_loop(loop_session):
    ro = glassrt.RunOptions()
    ro.time_budget_s = 0.2
    t0 = time.perf_counter()
    with pytest.raises(glassrt.RunTimeoutError, match=r"time_budget_s of 0.2 s") as e:
        loop_session.run(None, _feeds(10 ** 12), ro)
    assert time.perf_counter() - t0 < 5
    assert isinstance(e.value, TimeoutError)
    # within its budget the same options run to the end
    np.testing.assert_array_equal(loop_session.run(None, _feeds(10), ro)[0], np.full(4, 10, np.float32))


def test_terminate_from_another_thread_stops_the_run_and_clearing_it_runs_again(loop_session):
    ro = glassrt.RunOptions()
    ro.log_severity_level = 0  # each node logged as it runs: the test sets terminate once the loop is going
    errors, looping = [], threading.Event()

    class Watch(logging.Handler):
        def emit(self, record):
            if "Add node 'step'" in record.getMessage():
                looping.set()

    def runner():
        try:
            loop_session.run(None, _feeds(10 ** 12), ro)
        except glassrt.RunTerminatedError as e:
            errors.append(e)

    log = logging.getLogger("glassrt.run")
    handler, level = Watch(), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        t = threading.Thread(target=runner)
        t.start()
        assert looping.wait(30)
        ro.terminate = True
        t.join(30)
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    ro.log_severity_level = 2
    assert not t.is_alive() and len(errors) == 1
    assert "RunOptions.terminate is set" in str(errors[0]) and "Add node 'step'" in str(errors[0])
    with pytest.raises(glassrt.RunTerminatedError):  # still set: a new run stops at once
        loop_session.run(None, _feeds(3), ro)
    ro.terminate = False
    np.testing.assert_array_equal(loop_session.run(None, _feeds(3), ro)[0], np.full(4, 3, np.float32))
    np.testing.assert_array_equal(loop_session.run(None, _feeds(2))[0], np.full(4, 2, np.float32))


def _log_of_zero():
    return model([helper.make_node("Log", ["x"], ["y"], name="log")], [tensor("x", [3])], [tensor("y", [3])])


def test_log_levels(caplog):
    s = glassrt.InferenceSession(_log_of_zero().SerializeToString(), providers=["cpu"])
    x = {"x": np.array([0.0, 1.0, 2.0], np.float32)}
    quiet = glassrt.RunOptions()
    quiet.log_severity_level = 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning would raise here
        assert s.run(None, x, quiet)[0][0] == -np.inf
    with pytest.warns(RuntimeWarning):
        s.run(None, x)
    verbose = glassrt.RunOptions()
    verbose.log_severity_level, verbose.log_verbosity_level, verbose.logid = 0, 1, "req-7"
    with warnings.catch_warnings(), caplog.at_level(logging.INFO, logger="glassrt.run"):
        warnings.simplefilter("ignore")
        s.run(None, x, verbose)
    assert any("[req-7]" in r.message and "Log node 'log'" in r.message and "[3]" in r.message for r in caplog.records)


def test_run_options_refuse_what_they_do_not_have():
    ro = glassrt.RunOptions()
    with pytest.raises(glassrt.InvalidArgumentError, match="only_execute_path_to_fetches"):
        ro.only_execute_path_to_fetches = True
    with pytest.raises(glassrt.InvalidArgumentError, match="no such option"):
        ro.terminat = True
    with pytest.raises(glassrt.InvalidArgumentError, match="0 .verbose. to 4"):
        ro.log_severity_level = 7
    with pytest.raises(glassrt.InvalidArgumentError, match="run config"):
        ro.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    s = glassrt.InferenceSession(_log_of_zero().SerializeToString(), providers=["cpu"])
    with pytest.raises(glassrt.InvalidArgumentError, match="glassrt.RunOptions"):
        s.run(None, {"x": np.ones(3, np.float32)}, {"terminate": False})


# ---------------------------------------------------------------- IOBinding


def _two_outputs():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
             helper.make_node("Relu", ["y"], ["r"], name="relu")]
    w = np.arange(12, dtype=np.float32).reshape(4, 3) - 6
    return model(nodes, [tensor("x", ["n", 4])], [tensor("y", ["n", 3]), tensor("r", ["n", 3])], [init("w", w)],
                 opset=17), w


def test_outputs_are_written_into_the_callers_arrays_run_after_run():
    m, w = _two_outputs()
    s = glassrt.InferenceSession(m.SerializeToString())
    io = s.io_binding()
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    io.bind_cpu_input("x", x)
    mine = np.full((2, 3), np.nan, np.float32)
    io.bind_output("r", "cpu", 0, np.float32, [2, 3], array=mine)
    io.bind_output("y")
    for scale in (1, -1):
        x[...] *= scale  # the bound input is read at each run
        s.run_with_iobinding(io)
        r, y = io.get_outputs()
        assert r is mine
        np.testing.assert_allclose(mine, np.maximum(x @ w, 0), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(y, x @ w, rtol=1e-5, atol=1e-5)
    copies = io.copy_outputs_to_cpu()
    assert copies[0] is not mine and np.array_equal(copies[0], mine)
    io.synchronize_outputs()
    io.clear_binding_outputs()
    s.run_with_iobinding(io)  # nothing bound: every output
    assert len(io.get_outputs()) == 2


def test_io_binding_refuses_what_it_cannot_check():
    m, _ = _two_outputs()
    s = glassrt.InferenceSession(m.SerializeToString())
    io = s.io_binding()
    with pytest.raises(glassrt.UnknownInputError):
        io.bind_cpu_input("nope", np.ones((1, 4), np.float32))
    with pytest.raises(glassrt.UnknownOutputError):
        io.bind_output("nope")
    with pytest.raises(glassrt.InvalidArgumentError, match="raw"):
        io.bind_input("x", "cpu", 0, np.float32, [1, 4], 12345)
    with pytest.raises(glassrt.InvalidArgumentError, match="pointers"):
        io.bind_output("y", "cpu", 0, np.float32, [1, 3], 12345)
    with pytest.raises(glassrt.InvalidArgumentError, match="CPU"):
        io.bind_output("y", "cuda", 0)
    with pytest.raises(glassrt.InvalidArgumentError, match="shape"):
        io.bind_output("y", shape=[5, 3], array=np.empty((2, 3), np.float32))
    io.bind_cpu_input("x", np.ones((1, 4), np.float32))
    io.bind_output("y", array=np.empty((2, 3), np.float32))  # the run makes (1, 3)
    with pytest.raises(glassrt.InvalidArgumentError, match=r"output 'y' is float\[1, 3\] this run"):
        s.run_with_iobinding(io)
    other = glassrt.InferenceSession(m.SerializeToString()).io_binding()
    with pytest.raises(glassrt.InvalidArgumentError, match="this session"):
        s.run_with_iobinding(other)
