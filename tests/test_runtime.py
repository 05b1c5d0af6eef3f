"""The runtime's decisions, made and shown: placement, kernel choice, memory plan, plans, profile."""
from __future__ import annotations

import gc
import json
import tracemalloc
import warnings

import numpy as np
import onnx
import pytest
from onnx import helper

import glassrt
from glassrt.runtime.plan import STRAIGHT_AFTER
from glassrt.kernels import registry
from glassrt.tools import light_models as lm
from tests.helpers import add_model, model, tensor, transformer_encoder


def _check_plan_valid(report):
    """No two values live at the same step overlap in the arena (read from the explain JSON)."""
    vals = [v for v in report["values"] if v["offset"] is not None]
    assert vals, "nothing was planned into the arena"
    by_offset = sorted(vals, key=lambda v: v["offset"])
    for i, a in enumerate(by_offset):
        for b in by_offset[i + 1:]:
            if b["offset"] >= a["offset"] + max(a["bytes"], 1):
                break
            same_buffer = a["offset"] == b["offset"] and (a.get("shares_with") == b["name"] or
                                                           b.get("shares_with") == a["name"])
            overlap_in_time = a["first_step"] <= b["last_step"] and b["first_step"] <= a["last_step"]
            if same_buffer:  # in-place reuse: the input dies exactly where the output is born
                assert min(a["last_step"], b["last_step"]) <= max(a["first_step"], b["first_step"])
                continue
            assert not overlap_in_time, f"{a['name']} and {b['name']} overlap in the arena while both live"
    s = report["summary"]
    assert s["arena_bytes"] >= s["lower_bound_bytes"] > 0
    assert s["naive_bytes"] >= s["arena_bytes"]


def _explain(source, dims=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sess = glassrt.InferenceSession(source)
    report = sess.explain(dims)
    json.dumps(report, default=str)  # the report is plain data
    return report


@pytest.mark.parametrize("name", lm.NAMES)
def test_memory_plan_of_light_models(name):
    report = _explain(lm.path(name))
    _check_plan_valid(report)
    s = report["summary"]
    assert s["arena_bytes"] <= 1.10 * s["lower_bound_bytes"], s


def test_memory_plan_of_transformer_encoder():
    report = _explain(transformer_encoder(d_model=128, heads=4, d_ff=512, layers=3), {"batch": 4, "seq": 64})
    _check_plan_valid(report)
    s = report["summary"]
    assert s["arena_bytes"] <= 1.10 * s["lower_bound_bytes"], s
    # batch/seq were bound: every shape is concrete and no node waits for run time.
    assert all(isinstance(d, int) for n in report["nodes"] for o in n["outputs"] for d in (o["shape"] or []))


def test_explain_keeps_symbols_when_unbound():
    report = _explain(transformer_encoder())
    shapes = {o["name"]: o["shape"] for n in report["nodes"] for o in n["outputs"]}
    assert shapes["l0_q_split"] == ["batch", "seq", 4, 16]  # Reshape via Shape/Gather/Concat keeps symbols
    assert shapes["y"] == ["batch", "seq", 64]
    assert report["summary"]["arena_bytes"] is None and report["summary"]["unbound_dims"] == ["batch", "seq"]
    assert "batch" in str(report["summary"]["flops"]) and "seq" in str(report["summary"]["flops"])


def test_explain_without_dims_shows_the_kernels_a_batch_1_plan_binds():
    """A symbolic batch: each node's kernel is what a plan at batch 1 binds (placement keeps
    every candidate that passes the shape-free checks, best first: the first of them, a 1x1
    convolution's gemm kernel, is not what a 3x3 convolution runs). On a partial provider
    that refuses those shapes, the node shows on the provider the plan moves it to."""
    from glassrt.kernels.registry import Kernel
    from glassrt.runtime.providers import Provider

    rng = np.random.default_rng(0)
    inits = [helper.make_tensor(n, onnx.TensorProto.FLOAT, s, rng.standard_normal(s).astype(np.float32).ravel())
             for n, s in (("w3", (8, 3, 3, 3)), ("w1", (8, 8, 1, 1)))]
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w3"], ["c3"], pads=[1, 1, 1, 1], name="conv3x3"),
             helper.make_node("Conv", ["c3", "w1"], ["y"], name="conv1x1")]
    m = model(nodes, [tensor("x", ["batch", 3, 16, 16])], [tensor("y", None)], initializers=inits)

    def relu(ctx):
        return lambda x, *, out: np.maximum(x, 0, out=out)

    class BigBatches(Provider):  # partial: takes Relu from a batch of 40 up
        name, partial = "big", True

        def kernels(self, domain, op_type, opset):
            if op_type != "Relu":
                return []
            return [Kernel("big.Relu", "big", "", "Relu", relu, out=True, builder=True, static_only=True,
                           accepts=lambda ctx: None if ctx.shape(0)[0] >= 40 else "a batch under 40")]

    for providers in (["cpu"], [BigBatches(), "cpu"]):
        sess = glassrt.InferenceSession(m, providers=providers)
        unbound = {n["name"]: n for n in sess.explain()["nodes"]}
        planned = {n["name"]: n for n in sess.explain({"batch": 1})["nodes"]}
        for name in ("conv3x3", "conv1x1", "relu"):
            assert (unbound[name]["provider"], unbound[name]["kernel"]) == \
                (planned[name]["provider"], planned[name]["kernel"]), (name, unbound[name], planned[name])
        assert unbound["conv3x3"]["kernel"] != unbound["conv1x1"]["kernel"]
    assert sess.placement.decisions["relu"].provider == "big" and unbound["relu"]["provider"] == "cpu"
    assert "a plan at batch 1 runs it on cpu: a batch under 40" in unbound["relu"]["reason"]


def test_explain_answers_memory_for_a_batch_size_before_running():
    sess = glassrt.InferenceSession(transformer_encoder())
    small = sess.explain({"batch": 1, "seq": 32})["summary"]["arena_bytes"]
    big = sess.explain({"batch": 64, "seq": 32})["summary"]["arena_bytes"]
    assert big >= 32 * small


def test_replay_allocates_no_intermediates():
    name = "resnet50"
    m = onnx.load(lm.path(name))
    x_name, shape = lm.input_shape(m)
    sess = glassrt.InferenceSession(lm.path(name), providers=["cpu"])
    feeds = {x_name: lm.reference_input(shape)}
    for _ in range(STRAIGHT_AFTER):  # builds and caches the plan, then compiles its steps (straight.py)
        out = sess.run(None, feeds)
    assert sess.runner.plans[next(iter(sess.runner.plans))].straight is not None
    out_bytes = sum(o.nbytes for o in out)
    tracemalloc.start()
    try:
        sess.run(None, feeds)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= 2 * out_bytes + (1 << 20), f"replay peak {peak} bytes"
    assert sess.runner.plans_built == 1


def test_plan_cache_is_bounded_and_evicts():
    opts = glassrt.SessionOptions(plan_cache_size=3, generalize_after=0)  # a plan per shape
    sess = glassrt.InferenceSession(add_model(), sess_options=opts)
    for b in range(1, 11):
        y = sess.run(None, {"x": np.ones((b, 3), np.float32)})[0]
        assert y.shape == (b, 3)
    stats = sess.memory_stats()
    assert stats["plans_cached"] == 3 and stats["plans_built"] == 10 and stats["plans_evicted"] == 7
    sess.run(None, {"x": np.ones((10, 3), np.float32)})  # still cached: no new plan
    assert sess.memory_stats()["plans_built"] == 10


@pytest.fixture
def cpu_without_tanh():
    """A cpu provider that lacks Tanh (an op with no ONNX function body to expand into)."""
    glassrt.runtime._load_cpu_kernels()  # else a session would import Tanh's module after this
    saved = list(registry.kernels_for("cpu", "", "Tanh"))
    registry.unregister("cpu", "", "Tanh")
    yield
    for k in saved:
        registry.register(k)


def _tanh_model():
    return model([helper.make_node("Neg", ["x"], ["a"], name="neg"), helper.make_node("Tanh", ["a"], ["y"], name="tanh")],
                 [tensor("x", ["n"])], [tensor("y", ["n"])])


def test_forced_fallback_is_shown_counted_and_can_be_refused(cpu_without_tanh):
    with pytest.warns(glassrt.FallbackWarning, match="tanh.*reference.*no cpu kernel for Tanh"):
        sess = glassrt.InferenceSession(_tanh_model())
    assert [(f.node, f.provider) for f in sess.fallbacks] == [("tanh", "reference")]
    report = sess.explain({"n": 4})
    row = next(n for n in report["nodes"] if n["name"] == "tanh")
    assert row["provider"] == "reference" and row["fallback"] and "no cpu kernel for Tanh" in row["reason"]
    assert report["summary"]["fallback_count"] == 1
    x = np.array([1.0, -2.0], np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], np.tanh(-x), rtol=1e-6)
    with pytest.raises(glassrt.FallbackError, match="tanh.*no cpu kernel for Tanh"):
        glassrt.InferenceSession(_tanh_model(), fallback="error")
    with pytest.raises(glassrt.UnsupportedOperatorError, match="tanh"):
        glassrt.InferenceSession(_tanh_model(), providers=["cpu"])


def test_composite_without_kernel_is_expanded_not_fallen_back(cpu_without_tanh):
    # Relu (opset 14+) has an ONNX function body: with no cpu kernel it is expanded into
    # primitives the cpu provider runs, and explain says so — no fallback.
    glassrt.runtime._load_cpu_kernels()
    saved = list(registry.kernels_for("cpu", "", "Relu"))
    registry.unregister("cpu", "", "Relu")
    try:
        m = model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [tensor("x", ["n"])], [tensor("y", ["n"])])
        sess = glassrt.InferenceSession(m, providers=["cpu"], fallback="error")
        np.testing.assert_array_equal(sess.run(None, {"x": np.array([1.0, -2.0], np.float32)})[0], [1.0, 0.0])
        (exp,) = sess.explain()["summary"]["expansions"]
        assert exp["node"] == "relu" and exp["op"] == "Relu" and "no cpu kernel for Relu" in exp["because"]
    finally:
        for k in saved:
            registry.register(k)


def test_kernel_choice_is_recorded():
    report = glassrt.InferenceSession(lm.path("squeezenet"), providers=["cpu"]).explain()
    convs = [n for n in report["nodes"] if n["op"] == "FusedConv"]  # Conv + Relu, fused
    kernels = {n["kernel"] for n in convs}
    assert "cpu.FusedConv.gemm_1x1" in kernels and len(kernels) >= 2  # 1x1 and 3x3 convs differ
    other = next(n for n in convs if n["kernel"] != "cpu.FusedConv.gemm_1x1")
    # The reason names the winner and why the faster 1x1 kernel was passed over.
    assert "gemm_1x1: not a 1x1" in other["reason"] and other["kernel"].split(".")[-1] in other["reason"]


def test_autotune_times_candidates_and_caches_winners(tmp_path):
    cache = tmp_path / "tune.json"
    opts = glassrt.SessionOptions(autotune=True, autotune_cache=str(cache))
    sess = glassrt.InferenceSession(lm.path("squeezenet"), providers=["cpu"], sess_options=opts)
    report = sess.explain()
    tuned = [n for n in report["nodes"] if n["reason"].startswith("autotuned")]
    assert tuned and all("ms" in n["reason"] for n in tuned)
    saved = json.loads(cache.read_text())
    assert len(saved) >= 1 and all(v["winner"] in v["ms"] for v in saved.values())
    again = glassrt.InferenceSession(lm.path("squeezenet"), providers=["cpu"], sess_options=opts).explain()
    assert any(n["reason"].startswith("autotuned (cached)") for n in again["nodes"])


def test_profile_trace_is_chrome_trace_with_one_event_per_node_per_run(tmp_path):
    sess = glassrt.InferenceSession(transformer_encoder())
    x = np.random.default_rng(0).standard_normal((2, 8, 64)).astype(np.float32)
    prof = sess.profile({"x": x}, runs=3)
    path = prof.write_trace(tmp_path / "trace.json")
    events = json.loads(open(path).read())
    node_events = [e for e in events if e["cat"] == "Node"]
    executed = len(next(iter(sess.runner.plans.values())).steps)
    assert len(node_events) == 3 * executed
    for e in node_events:
        assert e["ph"] == "X" and e["dur"] >= 0 and {"op_name", "provider", "input_type_shape",
                                                      "output_type_shape"} <= set(e["args"])
    assert len([e for e in events if e["name"] == "model_run"]) == 3
    ops = {r["key"] for r in prof.by_op()}
    # Node times are parts of run times: together at most 100% of the runs.
    assert {"MatMul", "FusedMatMul"} & ops and 0 < sum(r["percent"] for r in prof.by_op()) <= 100.001


def test_session_option_profiling_like_onnxruntime(tmp_path):
    sess = glassrt.InferenceSession(add_model(), sess_options=glassrt.SessionOptions(enable_profiling=True))
    for _ in range(2):
        sess.run(None, {"x": np.ones((2, 3), np.float32)})
    path = sess.end_profiling(str(tmp_path / "p.json"))
    events = json.loads(open(path).read())
    assert len([e for e in events if e["cat"] == "Node"]) == 2


def test_fusions_are_logged_shown_and_exact():
    name = "inception_v2"  # Conv -> BatchNormalization -> Mul -> Add -> Relu chains
    m = lm.randomize_weights(onnx.load(lm.path(name)), seed=0)
    x_name, shape = lm.input_shape(m)
    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    fused = glassrt.InferenceSession(m, providers=["cpu"])
    plain = glassrt.InferenceSession(m, providers=["cpu"], sess_options=glassrt.SessionOptions(fusion=False))
    assert any(line.startswith("fold BatchNormalization") for line in fused.pass_log)
    assert any(line.startswith("fuse Relu") for line in fused.pass_log)
    assert len(fused.placement.graph.nodes) < len(plain.placement.graph.nodes)
    np.testing.assert_allclose(fused.run(None, {x_name: x})[0], plain.run(None, {x_name: x})[0], rtol=1e-4, atol=1e-6)
    rows = fused.explain()["nodes"]
    conv = next(r for r in rows if r["op"] == "FusedConv")
    assert "BatchNormalization" in conv["origin"] and "Relu" in conv["origin"]


def test_varying_batch_sizes_keep_memory_bounded():
    """40 batch sizes, twice: the second pass must not peak higher than the first (the plan
    cache evicts, and evicted arenas go back to the OS). The full-size version on
    light_squeezenet is benchmarks/memory_growth.py."""
    from tests.test_hostile import _small_cnn

    def rss():
        import os
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    m = _small_cnn()
    m.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 64
    m.graph.input[0].type.tensor_type.shape.dim[3].dim_value = 64
    fc = next(t for t in m.graph.initializer if t.name == "fc")
    fc.CopyFrom(onnx.numpy_helper.from_array(np.zeros((4 * 32 * 32, 5), np.float32), "fc"))
    sess = glassrt.InferenceSession(m, sess_options=glassrt.SessionOptions(plan_cache_size=4))
    peaks = []
    for _ in range(2):
        gc.collect()  # what earlier tests left behind is not this session's growth
        peak = 0
        for b in range(1, 41):
            sess.run(None, {"x": np.ones((b, 3, 64, 64), np.float32)})
            peak = max(peak, rss())
        peaks.append(peak)
    assert sess.memory_stats()["plans_cached"] <= 4
    # A leak of one plan or arena per batch size would be tens of MiB; allow the allocator's
    # few MiB of slack (in a 1.8 GiB test worker it once measured 2.05 MiB).
    assert peaks[1] <= peaks[0] + (4 << 20), [p >> 20 for p in peaks]


def test_plan_cache_byte_budget():
    opts = glassrt.SessionOptions(plan_cache_size=100, plan_cache_bytes=1)  # only the newest plan fits
    sess = glassrt.InferenceSession(transformer_encoder(), sess_options=opts)
    for b in (1, 2, 3):
        sess.run(None, {"x": np.ones((b, 4, 64), np.float32)})
    assert sess.memory_stats()["plans_cached"] == 1 and sess.memory_stats()["plans_evicted"] == 2


def test_folding_a_conv_on_constants():
    rng = np.random.default_rng(0)
    x = onnx.numpy_helper.from_array(rng.standard_normal((1, 2, 5, 5)).astype(np.float32), "cx")
    w = onnx.numpy_helper.from_array(rng.standard_normal((2, 1, 3)).astype(np.float32), "cw")
    m = model([helper.make_node("Reshape", ["cx", "s"], ["x3"]),
               helper.make_node("Conv", ["x3", "cw"], ["c"], group=2, name="conv1d"),
               helper.make_node("Add", ["c", "y0"], ["y"])],
              [tensor("y0", [1, 2, 23])], [tensor("y", None)],
              [x, w, onnx.numpy_helper.from_array(np.array([1, 2, 25], np.int64), "s")])
    sess = glassrt.InferenceSession(m, providers=["cpu"])
    assert "conv1d" in sess.folded
    y = sess.run(None, {"y0": np.zeros((1, 2, 23), np.float32)})[0]
    xs = onnx.numpy_helper.to_array(x).reshape(2, 25)
    ws = onnx.numpy_helper.to_array(w).reshape(2, 3)
    expected = np.stack([np.correlate(xs[c], ws[c], "valid") for c in range(2)])[None]
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


def test_flops_count_fused_convs():
    # resnet50 is about 4 G multiply-adds: 8 GFLOP, fused or not.
    for fusion in (True, False):
        sess = glassrt.InferenceSession(lm.path("resnet50"), sess_options=glassrt.SessionOptions(fusion=fusion))
        assert 7.5e9 < sess.explain()["summary"]["flops"] < 8.5e9


class _OnDevice:
    """An array held by the test-only device: host code cannot use it by accident."""

    def __init__(self, data):
        self.data = data


class _FakeAccelerator:
    """A provider on another device ("fake0") that runs Neg, and Exp when asked to."""

    def __new__(cls, ops=("Neg",)):
        from glassrt.kernels.registry import Kernel
        from glassrt.runtime.providers import Provider

        class FakeAccelerator(Provider):
            name, device = "fake", "fake0"
            copies = []

            def kernels(self, domain, op_type, opset):
                if op_type in ops:
                    fn = {"Neg": np.negative, "Exp": np.exp}[op_type]
                    return [Kernel(f"fake.{op_type}", "fake", "", op_type, lambda x: _OnDevice(fn(_device_data(x))))]
                return []

            def to_device(self, array):
                self.copies.append("to device")
                return _OnDevice(np.array(array))

            def to_host(self, value):
                self.copies.append("to host")
                return np.array(_device_data(value))

        return FakeAccelerator()


def _device_data(x):
    assert isinstance(x, _OnDevice), f"a device kernel was handed a host value {type(x).__name__}"
    return x.data


def test_transfers_between_devices_are_steps_of_the_plan():
    """With only cpu and reference no copy is needed; a provider on another device gets a
    glassrt::Transfer step wherever a value crosses: the graph input goes to the device,
    the device's result comes back for the cpu node, and each copy is counted and sized."""
    m = model([helper.make_node("Neg", ["x"], ["a"], name="neg"), helper.make_node("Relu", ["a"], ["y"], name="relu")],
              [tensor("x", [3])], [tensor("y", [3])])
    fake = _FakeAccelerator()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sess = glassrt.InferenceSession(m, providers=[fake, "cpu"])
    assert [(t.value, t.src, t.dst, t.consumer, t.bytes) for t in sess.transfers] == [
        ("x", "host", "fake", "neg", 12), ("a", "fake", "cpu", "relu", 12)]
    report = sess.explain()
    summary = report["summary"]
    assert summary["transfers"] == 2 and summary["transfer_list"][1]["consumer"] == "relu"
    steps = [(n["op"], n["provider"]) for n in report["nodes"]]
    assert steps == [("Transfer", "fake"), ("Neg", "fake"), ("Transfer", "fake"), ("Relu", "cpu")]
    np.testing.assert_array_equal(sess.run(None, {"x": np.array([1, -2, 3], np.float32)})[0], [0, 2, 0])
    assert fake.copies == ["to device", "to host"]
    assert glassrt.InferenceSession(m).transfers == []  # cpu and reference share the host


def test_transfers_share_one_copy_and_bring_outputs_home():
    """Two device nodes reading one host value share its copy; a graph output computed on
    the device comes back to the host under its own name."""
    m = model([helper.make_node("Neg", ["x"], ["a"], name="neg"), helper.make_node("Exp", ["x"], ["b"], name="exp"),
               helper.make_node("Add", ["a", "b"], ["y"], name="add"), helper.make_node("Neg", ["y"], ["z"], name="neg2")],
              [tensor("x", [2])], [tensor("y", [2]), tensor("z", [2])])
    fake = _FakeAccelerator(("Neg", "Exp"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sess = glassrt.InferenceSession(m, providers=[fake, "cpu"])
    moves = [(t.value, t.src, t.dst) for t in sess.transfers]
    assert moves == [("x", "host", "fake"), ("a", "fake", "cpu"), ("b", "fake", "cpu"), ("y", "cpu", "fake"),
                     ("z@fake0", "fake", "host")]
    x = np.array([0.5, -1.0], np.float32)
    y, z = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, -x + np.exp(x), rtol=1e-6)
    np.testing.assert_allclose(z, -(-x + np.exp(x)), rtol=1e-6)
    assert isinstance(z, np.ndarray)


def test_concurrent_runs_from_threads_are_correct():
    """One session, several threads running at once (as a server would): each run gets a
    plan (and arena) no other thread is using. The thread count is fixed: oneDNN's GEMM may
    sum in another order on another count (SessionOptions.adaptive_threads)."""
    from concurrent.futures import ThreadPoolExecutor

    so = glassrt.SessionOptions()
    so.adaptive_threads = False
    sess = glassrt.InferenceSession(transformer_encoder(d_model=64, heads=4, d_ff=128, layers=2), so)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((2, 16, 64)).astype(np.float32) for _ in range(8)]
    expected = [sess.run(None, {"x": x})[0] for x in xs]
    with ThreadPoolExecutor(4) as pool:
        for _ in range(3):
            got = list(pool.map(lambda x: sess.run(None, {"x": x})[0], xs))
            for g, e in zip(got, expected):
                np.testing.assert_array_equal(g, e)


def test_empty_tensors_flow_through():
    """A batch of 0 or an empty sequence: nodes whose outputs have no element are not run
    (onnxruntime accepts such inputs too)."""
    sess = glassrt.InferenceSession(transformer_encoder())
    for shape in [(0, 4, 64), (2, 0, 64)]:
        assert sess.run(None, {"x": np.zeros(shape, np.float32)})[0].shape == shape
    from tests.test_hostile import _small_cnn

    y = glassrt.InferenceSession(_small_cnn()).run(None, {"x": np.zeros((0, 3, 8, 8), np.float32)})[0]
    assert y.shape == (0, 5)
