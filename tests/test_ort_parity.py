"""Models and calls onnxruntime accepts that glassrt must accept the same way (issue 9)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import glassrt

from .helpers import init, model, tensor

ort = pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("axis", [3, -3, 0, 2, -1])
def test_flatten_axis_may_equal_the_rank(axis):
    """The range is [-r, r]; axis == r gives [prod(dims), 1] (a sentence-transformer's mask)."""
    m = model([helper.make_node("Flatten", ["x"], ["y"], axis=axis)], [tensor("x", [2, 3, 4])], [tensor("y", None)],
              opset=13)
    x = np.random.default_rng(0).random((2, 3, 4)).astype(np.float32)
    got = glassrt.InferenceSession(m).run(None, {"x": x})[0]
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_flatten_axis_beyond_the_rank_is_a_clear_error():
    m = model([helper.make_node("Flatten", ["x"], ["y"], name="flat", axis=4)], [tensor("x", [2, 3, 4])],
              [tensor("y", None)], opset=13)
    with pytest.raises(glassrt.GlassrtError, match="flat"):
        glassrt.InferenceSession(m).run(None, {"x": np.zeros((2, 3, 4), np.float32)})


def test_an_input_declared_with_dim_value_minus_one_is_dynamic():
    """Paddle's exporter writes dim_value: -1 for a dynamic dim; onnxruntime runs any size."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3])
    m = model([helper.make_node("Relu", ["x"], ["y"])], [x], [tensor("y", None)], opset=17)
    sess = glassrt.InferenceSession(m)
    for n in (1, 5):
        a = np.linspace(-1, 1, n * 3, dtype=np.float32).reshape(n, 3)
        np.testing.assert_array_equal(sess.run(None, {"x": a})[0], np.maximum(a, 0))


def test_run_with_a_string_or_an_unknown_output_name_says_so():
    m = model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [2])], [tensor("y", None)], opset=17)
    sess = glassrt.InferenceSession(m)
    x = np.zeros(2, np.float32)
    with pytest.raises(glassrt.InvalidArgumentError, match=r"not the string 'y' \(did you mean \['y'\]\?\)"):
        sess.run("y", {"x": x})
    with pytest.raises(glassrt.UnknownOutputError, match=r"unknown output name\(s\) \['z'\].*outputs are \['y'\]"):
        sess.run(["z"], {"x": x})
    assert sess.run(["y"], {"x": x})[0].shape == (2,)


def test_provider_lists_written_for_onnxruntime():
    m = model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [2])], [tensor("y", None)], opset=17)
    with pytest.warns(UserWarning, match="CUDAExecutionProvider is onnxruntime's"):
        sess = glassrt.InferenceSession(m, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert sess.get_providers() == ["cpu"]
    assert any("CUDAExecutionProvider" in n for n in sess.explain()["summary"]["notes"])
    sess = glassrt.InferenceSession(m, providers=[("CPUExecutionProvider", {})])
    assert sess.get_providers() == ["cpu"]
    with pytest.raises(glassrt.GlassrtError, match="provider 'cpu' has no option 'arena_extend_strategy'; its options: "
                                                   "ops: .*; exclude_ops"):
        glassrt.InferenceSession(m, providers=[("cpu", {"arena_extend_strategy": "kSameAsRequested"})])
    with pytest.raises(glassrt.GlassrtError, match="unknown provider 'gpu'"):
        glassrt.InferenceSession(m, providers=["gpu"])
    with pytest.warns(UserWarning), pytest.raises(glassrt.GlassrtError, match="no provider left"):
        glassrt.InferenceSession(m, providers=["CUDAExecutionProvider"])


def test_session_options_work_or_are_refused_by_name():
    so = glassrt.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = 2, 1  # what onnxruntime users set
    so.graph_optimization_level = "ORT_ENABLE_BASIC"
    with pytest.raises(glassrt.InvalidArgumentError, match="no option 'execution_mode': glassrt runs nodes in order"):
        so.execution_mode = 1
    with pytest.raises(glassrt.InvalidArgumentError, match="no option 'enable_magic': no such option"):
        so.enable_magic = True
    with pytest.raises(glassrt.InvalidArgumentError, match="inter_op_num_threads=4: glassrt runs one node at a time"):
        so.inter_op_num_threads = 4
    m = model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [2])], [tensor("y", None)], opset=17)
    assert glassrt.InferenceSession(m, so).run(None, {"x": np.ones(2, np.float32)})[0].tolist() == [1.0, 1.0]


def test_onnxruntimes_run_options_object_is_refused_not_ignored():
    """glassrt.RunOptions works (tests/test_run_options.py); onnxruntime's own object is refused."""
    m = model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [2])], [tensor("y", None)], opset=17)
    with pytest.raises(glassrt.InvalidArgumentError, match="must be a glassrt.RunOptions"):
        glassrt.InferenceSession(m).run(None, {"x": np.ones(2, np.float32)}, ort.RunOptions())


def test_model_metadata_session_and_provider_options_as_onnxruntime_reports_them():
    m = model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [2])], [tensor("y", None)], opset=17)
    m.producer_name, m.model_version, m.doc_string, m.domain = "pytorch", 3, "a relu", "ai.example"
    m.graph.doc_string = "the graph"
    helper.set_model_props(m, {"author": "me", "license": "MIT"})
    sess = glassrt.InferenceSession(m, providers=["cpu"])
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).get_modelmeta()
    got = sess.get_modelmeta()
    for key in ("producer_name", "graph_name", "domain", "description", "graph_description", "version",
                "custom_metadata_map"):
        assert getattr(got, key) == getattr(want, key), key
    assert sess.get_session_options() is sess.options
    assert sess.get_provider_options() == {"cpu": {}}


def test_nested_list_feeds_take_the_declared_dtype_where_no_kind_changes():
    m = model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [2, 2])], [tensor("y", None)], opset=17)
    sess = glassrt.InferenceSession(m)
    y = sess.run(None, {"x": [[1.5, -2.0], [3, -4]]})[0]
    assert y.dtype == np.float32 and y.tolist() == [[1.5, 0.0], [3.0, 0.0]]
    ids = model([helper.make_node("Neg", ["i"], ["o"])], [tensor("i", [2], TensorProto.INT64)], [tensor("o", None, TensorProto.INT64)],
                opset=17)
    assert glassrt.InferenceSession(ids).run(None, {"i": [1, 2]})[0].tolist() == [-1, -2]
    with pytest.raises(glassrt.InputTypeError, match="expected dtype tensor\\(int64\\), got tensor\\(double\\)"):
        glassrt.InferenceSession(ids).run(None, {"i": [1.5, 2.0]})  # floats into ints would lose the .5
    with pytest.raises(glassrt.InputTypeError, match="expected dtype tensor\\(float\\), got tensor\\(double\\)"):
        sess.run(None, {"x": np.ones((2, 2))})  # a NumPy array keeps its dtype, as in onnxruntime


def test_a_plan_over_the_memory_limit_names_its_largest_values():
    m = model([helper.make_node("Relu", ["x"], ["a"], name="r1"), helper.make_node("Neg", ["a"], ["b"], name="n1"),
               helper.make_node("Relu", ["b"], ["y"], name="r2")], [tensor("x", [512, 1024])], [tensor("y", None)],
              opset=17)
    sess = glassrt.InferenceSession(m, glassrt.SessionOptions(memory_limit_bytes=3 << 20), providers=["cpu"])
    with pytest.raises(glassrt.MemoryLimitError, match=r"the plan for input x: \[512, 1024\] needs .* the largest "
                                                       r"values: 'a' float\[512, 1024\] \(2,097,152 bytes\) from "
                                                       r"Relu 'r1'"):
        sess.run(None, {"x": np.ones((512, 1024), np.float32)})


def test_provider_options_take_effect_and_are_reported():
    from glassrt.kernels.onednn import capi

    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[2, 2], name="pool"),
             helper.make_node("Relu", ["p"], ["y"], name="relu")]  # after the pool: not fused into the conv
    m = model(nodes, [tensor("x", [1, 3, 8, 8])], [tensor("y", None)], [init("w", w)], opset=17)
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    want = glassrt.InferenceSession(m, providers=["cpu"]).run(None, {"x": x})[0]
    # cpu leaving MaxPool to the reference provider: a fallback it asked for, with the option named
    s = glassrt.InferenceSession(m, providers=[("cpu", {"exclude_ops": ["MaxPool"]}), "reference"],
                                 fallback="silent")
    rows = {n["name"]: n for n in s.explain()["nodes"]}
    assert rows["pool"]["provider"] == "reference" and "exclude_ops=['MaxPool']" in rows["pool"]["reason"]
    assert s.get_provider_options() == {"cpu": {"exclude_ops": ["MaxPool"]}, "reference": {}}
    np.testing.assert_allclose(s.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-5)
    same = glassrt.InferenceSession(m, providers=["cpu", "reference"],
                                    provider_options=[{"exclude_ops": ["MaxPool"]}, {}], fallback="silent")
    assert same.get_provider_options() == s.get_provider_options()  # onnxruntime's parallel list
    with pytest.raises(glassrt.InvalidArgumentError, match="one options dict per entry"):
        glassrt.InferenceSession(m, providers=["cpu"], provider_options=[{}, {}])
    with pytest.raises(glassrt.InvalidArgumentError, match="no op type 'Conv2'"):
        glassrt.InferenceSession(m, providers=[("cpu", {"ops": ["Conv2"]})])
    with pytest.raises(glassrt.InvalidArgumentError, match="list of op type names"):
        glassrt.InferenceSession(m, providers=[("cpu", {"ops": "Conv"})])
    if capi.UNAVAILABLE:
        return
    only_conv = glassrt.InferenceSession(m, providers=[("onednn", {"ops": ["Conv"]}), "cpu"])
    kinds = {n["name"]: n["provider"] for n in only_conv.explain()["nodes"]}
    assert kinds == {"conv": "onednn", "relu": "cpu", "pool": "cpu"}
    plain = glassrt.InferenceSession(m, providers=[("DnnlExecutionProvider", {"nhwc": False}), "cpu"])
    assert plain.explain()["summary"]["layouts"]["nhwc_values"] == 0
    nhwc = glassrt.InferenceSession(m, providers=["onednn", "cpu"])
    assert nhwc.explain()["summary"]["layouts"]["nhwc_values"] > 0
    for sess in (only_conv, plain, nhwc):
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-5)
    with pytest.raises(glassrt.InvalidArgumentError, match="'nhwc' is True or False"):
        glassrt.InferenceSession(m, providers=[("onednn", {"nhwc": "no"})])


def test_the_cuda_provider_says_what_is_missing_and_is_never_a_default():
    """Issue 13's provider: no GPU here (or no GPU kernels yet) is said by name, never a silent
    run on the CPU; the default provider list never includes it."""
    from glassrt.runtime import providers

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    assert "cuda" not in providers.DEFAULT
    device, what = providers.cuda_device()
    with pytest.raises(glassrt.GlassrtError, match="provider 'cuda'") as e:
        glassrt.InferenceSession(m, providers=["cuda", "cpu"])
    assert ("no GPU found" in str(e.value)) == (device is None) and what in str(e.value)
    assert "cuda" not in glassrt.InferenceSession(m).get_providers()
