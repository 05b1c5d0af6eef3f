"""NaN and Inf in the inputs come out where the reference puts them (runtime/nan_handling.py).

oneDNN's relu, clip, hard-sigmoid and softmax and glassrt's Winograd convolution lose a NaN
or an Inf; a run fed one moves to a plan of kernels
that keep them, a run with finite inputs keeps the fast kernels."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import glassrt
from glassrt.errors import InvalidArgumentError
from glassrt.kernels.onednn import capi
from glassrt.runtime import nan_handling

C = 16
_rng = np.random.default_rng(0)
_W3 = numpy_helper.from_array(_rng.standard_normal((C, C, 3, 3)).astype(np.float32), "W3")
_W1 = numpy_helper.from_array(_rng.standard_normal((C, C, 1, 1)).astype(np.float32), "W1")
_WD = numpy_helper.from_array(_rng.standard_normal((C, 1, 3, 3)).astype(np.float32), "WD")
_B = numpy_helper.from_array(_rng.standard_normal(C).astype(np.float32), "B")
_M = numpy_helper.from_array(_rng.standard_normal((12, 12)).astype(np.float32), "M")
_BN = [numpy_helper.from_array(np.abs(_rng.standard_normal(C)).astype(np.float32) + 0.1, n) for n in "sbmv"]
_BOUNDS = [numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")]


def _model(nodes, inits):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _activation(op):
    return (["lo", "hi"], _BOUNDS) if op == "Clip" else ([], [])


def _after(producer, inits, op):
    extra, bounds = _activation(op)
    return _model([producer, helper.make_node(op, ["c", *extra], ["y"])], inits + bounds)


def _cases():
    cases = {}
    for op in ("Relu", "Clip", "HardSigmoid", "LeakyRelu", "Sigmoid"):
        extra, bounds = _activation(op)
        cases[op] = _model([helper.make_node(op, ["x", *extra], ["y"])], bounds)
        cases[f"Conv3x3+{op}"] = _after(helper.make_node("Conv", ["x", "W3", "B"], ["c"], pads=[1] * 4), [_W3, _B], op)
        cases[f"Conv1x1+{op}"] = _after(helper.make_node("Conv", ["x", "W1", "B"], ["c"]), [_W1, _B], op)
        cases[f"Depthwise+{op}"] = _after(helper.make_node("Conv", ["x", "WD", "B"], ["c"], pads=[1] * 4, group=C),
                                          [_WD, _B], op)
        cases[f"MatMul+{op}"] = _after(helper.make_node("MatMul", ["x", "M"], ["c"]), [_M], op)
    cases["BatchNormalization+Relu"] = _after(helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["c"]),
                                              _BN, "Relu")
    cases["Conv3x3"] = _model([helper.make_node("Conv", ["x", "W3", "B"], ["y"], pads=[1] * 4)], [_W3, _B])
    # (no max pooling: onnxruntime and the ONNX reference both lose a NaN in the window,
    # each depending on where in the window it lies; oneDNN's and glassrt's kernels do too)
    cases["Softmax"] = _model([helper.make_node("Softmax", ["x"], ["y"])], [])
    return cases


CASES = _cases()


def _poisoned():
    x = _rng.standard_normal((1, C, 12, 12)).astype(np.float32) * 3
    x[0, 0, 2, 2], x[0, 1, 7, 7], x[0, 2, 10, 3] = np.nan, np.inf, -np.inf
    return x


X = _poisoned()


def _same_as_reference(y, ref):
    for mask in (np.isnan, np.isposinf, np.isneginf):
        assert np.array_equal(mask(y), mask(ref)), f"{mask.__name__}: {int(mask(y).sum())} vs {int(mask(ref).sum())}"
    finite = np.isfinite(ref)
    np.testing.assert_allclose(y[finite], ref[finite], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("providers", [None, ["cpu"]], ids=["default", "cpu"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_nan_and_inf_where_the_reference_puts_them(name, providers):
    model = CASES[name]
    ref = ReferenceEvaluator(model).run(None, {"x": X})[0]
    sess = glassrt.InferenceSession(model.SerializeToString(), providers=providers, fallback="silent")
    _same_as_reference(sess.run(None, {"x": X})[0], ref)
    finite = np.nan_to_num(X, nan=0.5, posinf=2.0, neginf=-2.0)  # the fast plan, unchanged
    np.testing.assert_allclose(sess.run(None, {"x": finite})[0], ReferenceEvaluator(model).run(None, {"x": finite})[0],
                               rtol=1e-4, atol=1e-4)


def _onednn_session(name, **options):
    if capi.UNAVAILABLE is not None:
        pytest.skip(f"oneDNN: {capi.UNAVAILABLE}")
    opts = glassrt.SessionOptions(**options)
    return glassrt.InferenceSession(CASES[name].SerializeToString(), opts, providers=["onednn", "cpu"],
                                    fallback="silent")


def test_finite_runs_keep_the_fast_kernel_and_explain_says_what_it_loses():
    sess = _onednn_session("Conv3x3+Relu")
    finite = np.ones_like(X)
    sess.run(None, {"x": finite})
    assert sess.runner._nan_runner is None  # no exact plan built for finite inputs
    node = next(n for n in sess.explain()["nodes"] if n["op"] == "FusedConv")
    assert node["kernel"] == "onednn.FusedConv.conv"
    assert "NaN becomes 0" in node["drops_nan"]
    summary = sess.explain()["summary"]["nan_handling"]
    assert summary == {"policy": "auto", "nodes_losing_nan": 1, "exact_plans": 0, "runs_with_nan": 0}

    sess.run(None, {"x": X})  # a NaN: the exact plan, built now and kept
    exact = sess.runner.nan_runner()
    assert len(exact.plans) == 1
    plan = next(iter(exact.plans.values()))
    assert plan.drops_nan == ()
    # the same oneDNN conv without its relu post-op, the relu applied after it in NumPy
    (selection,) = plan.selections
    assert selection.kernel == "onednn.FusedConv.conv" and "Relu applied after it, in NumPy" in selection.reason
    assert sess.explain()["summary"]["nan_handling"]["exact_plans"] == 1
    assert sess.explain()["summary"]["nan_handling"]["runs_with_nan"] == 1
    assert sess.memory_stats()["runs_with_nan"] == 1  # (glassrt_nan_runs_total in the metrics)
    hits = exact.plan_hits
    sess.run(None, {"x": finite})  # finite again: the fast plan
    assert exact.plan_hits == hits


def test_fast_loses_nan_exact_never_chooses_such_a_kernel():
    fast = _onednn_session("Conv3x3+Relu", nan_handling="fast")
    assert not np.isnan(fast.run(None, {"x": X})[0]).any()  # what "fast" trades away, on oneDNN 3.2
    exact = _onednn_session("Conv3x3+Relu", nan_handling="exact")
    y = exact.run(None, {"x": X})[0]
    _same_as_reference(y, ReferenceEvaluator(CASES["Conv3x3+Relu"]).run(None, {"x": X})[0])
    node = next(n for n in exact.explain()["nodes"] if n["op"] == "FusedConv")
    assert node["drops_nan"] is None and "applied after it, in NumPy, which keeps NaN" in node["reason"]
    relu = _onednn_session("Relu", nan_handling="exact")  # the op itself: another kernel
    node = relu.explain()["nodes"][0]
    assert node["drops_nan"] is None and "eltwise: loses NaN or Inf" in node["reason"]


def test_a_chain_of_fused_convs_keeps_nan_in_channels_last_values():
    """Conv+Clip twice (MobileNet's ReLU6 blocks): values between oneDNN convs are NHWC; the
    exact plan's clip, applied after each conv in NumPy, works on those views."""
    w = numpy_helper.from_array(_rng.standard_normal((C, C, 3, 3)).astype(np.float32), "W3b")
    nodes = [helper.make_node("Conv", ["x", "W3", "B"], ["c1"], pads=[1] * 4),
             helper.make_node("Clip", ["c1", "lo", "hi"], ["r1"]),
             helper.make_node("Conv", ["r1", "W3b", "B"], ["c2"], pads=[1] * 4),
             helper.make_node("Clip", ["c2", "lo", "hi"], ["y"])]
    model = _model(nodes, [_W3, w, _B, *_BOUNDS])
    sess = glassrt.InferenceSession(model.SerializeToString(), fallback="silent")
    _same_as_reference(sess.run(None, {"x": X})[0], ReferenceEvaluator(model).run(None, {"x": X})[0])


def test_the_option_is_checked():
    with pytest.raises(InvalidArgumentError, match="nan_handling"):
        glassrt.SessionOptions(nan_handling="sometimes")


@pytest.mark.parametrize("poison", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.complex64])
def test_all_finite_sees_every_non_finite_value(poison, dtype):
    v = np.ones((4, 6), dtype)
    assert nan_handling.all_finite({"v": v, "ids": np.array([1, 2])})
    v[3, 5] = poison
    assert not nan_handling.all_finite({"v": v})
    assert not nan_handling.all_finite({"v": v.T})  # not contiguous: the sum


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_all_finite_sees_nan_in_ml_dtypes_floats(name):
    import ml_dtypes

    v = np.full(600, 400, np.float32).astype(getattr(ml_dtypes, name))  # (its sum overflows float8)
    assert nan_handling.all_finite({"v": v})
    v[7] = np.nan
    assert not nan_handling.all_finite({"v": v})


def test_all_finite_ignores_integers_and_empty_feeds():
    assert nan_handling.all_finite({"ids": np.arange(5), "mask": np.ones(3, bool), "e": np.empty((0, 3), np.float32)})
