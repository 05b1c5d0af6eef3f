"""The onnx package's backend test suite, run through `glassrt.backend` (onnx's Backend API).

Four of its five categories: node (one operator per model), simple (small graphs),
pytorch-converted and pytorch-operator (models PyTorch exported). The fifth, real, downloads
its models when it runs (no network here), so it is left out. The CUDA twin of every case
is left out too: glassrt runs on the CPU (`supports_device("CUDA")` is False, tested below).
Every case that does not pass is listed in KNOWN_FAILURES with the reason.

Pass counts per category (the README's figures):

    python -m tests.test_onnx_backend
"""
from __future__ import annotations

import re
import warnings

import numpy as np
import onnx
import onnx.backend.test
import pytest
from onnx import TensorProto, helper
from onnx.backend.test.loader import load_model_tests

import glassrt
import glassrt.backend as backend
from tests.conformance.node_cases import assert_similar

KINDS = {"node": "OnnxBackendNodeModelTest", "simple": "OnnxBackendSimpleModelTest",
         "pytorch-converted": "OnnxBackendPyTorchConvertedModelTest",
         "pytorch-operator": "OnnxBackendPyTorchOperatorModelTest"}

_BERNOULLI = "expected values come from an unseeded random generator (onnx's own reference fails them too)"
_GRADIENT = ("ai.onnx.preview.training Gradient: a training op, not implemented (no provider has it; "
             "sess.gradients computes gradients of a model)")
KNOWN_FAILURES = {
    "test_bernoulli": _BERNOULLI, "test_bernoulli_double": _BERNOULLI, "test_bernoulli_seed": _BERNOULLI,
    "test_bernoulli_expanded": _BERNOULLI, "test_bernoulli_double_expanded": _BERNOULLI,
    "test_bernoulli_seed_expanded": _BERNOULLI,
    # onnx's Runner.assert_similar_outputs treats each element of a sequence output as a
    # list of outputs and calls len() on it, which a 0-d tensor does not have; glassrt's
    # result is right (test_loop16_seq_none_is_right_where_onnx_cannot_compare, below).
    "test_loop16_seq_none": "onnx's runner cannot compare a sequence of 0-d tensors (len() of unsized object)",
    "test_gradient_of_add": _GRADIENT, "test_gradient_of_add_and_mul": _GRADIENT,
}

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    backend_test = onnx.backend.test.BackendTest(backend, __name__)
    CASES = {kind: [t.name for t in load_model_tests(kind=kind)] for kind in KINDS}
    REAL = [t.name for t in load_model_tests(kind="real")]

for _name in REAL:  # downloaded at run time
    backend_test.exclude(f"^{_name}_(cpu|cuda)$")
backend_test.exclude(r"_cuda$")  # glassrt runs on the CPU
for _name in KNOWN_FAILURES:
    backend_test.exclude(f"^{re.escape(_name)}_cpu$")

globals().update({name: case for name, case in backend_test.test_cases.items() if name in KINDS.values()})


# ---------------------------------------------------------------- the list of failures stays true


def test_every_known_failure_is_a_case_of_the_suite():
    every = {n for names in CASES.values() for n in names}
    assert not set(KNOWN_FAILURES) - every, "KNOWN_FAILURES names cases the onnx suite no longer has"


def test_loop16_seq_none_is_right_where_onnx_cannot_compare():
    case = next(t for t in load_model_tests(kind="node") if t.name == "test_loop16_seq_none")
    rep = backend.prepare(case.model)
    for inputs, expected in case.data_sets:
        outputs = rep.run([onnx.numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else x for x in inputs])
        assert any(isinstance(o, list) and o and np.ndim(o[0]) == 0 for o in outputs)
        assert_similar(expected, outputs, case.rtol, case.atol)  # element by element


def test_gradient_is_refused_by_name():
    case = next(t for t in load_model_tests(kind="simple") if t.name == "test_gradient_of_add")
    import os

    with pytest.raises(glassrt.UnsupportedOperatorError, match="Gradient node"):
        backend.prepare(onnx.load(os.path.join(case.model_dir, "model.onnx")))


# ---------------------------------------------------------------- the backend API itself


def _add_model():
    g = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "g",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n"]),
                           helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_prepare_takes_a_model_bytes_a_path_a_session_or_a_rep(tmp_path):
    m = _add_model()
    a, b = np.arange(3, dtype=np.float32), np.ones(3, np.float32)
    path = tmp_path / "add.onnx"
    onnx.save(m, path)
    for model in (m, m.SerializeToString(), str(path), glassrt.InferenceSession(m)):
        rep = backend.prepare(model)
        np.testing.assert_array_equal(rep.run([a, b])[0], a + b)
        np.testing.assert_array_equal(rep.run({"b": b, "a": a})[0], a + b)
        assert backend.prepare(rep) is rep
    np.testing.assert_array_equal(backend.run_model(m, [a, b])[0], a + b)
    np.testing.assert_array_equal(backend.run(m, (a, b))[0], a + b)


def test_inputs_that_do_not_fit_and_options_glassrt_lacks_are_refused_by_name():
    rep = backend.prepare(_add_model(), intra_op_num_threads=1, providers=["cpu"], rtol=1e-3)  # rtol: onnx's runner
    assert rep.session.get_providers() == ["cpu"]
    with pytest.raises(glassrt.GlassrtError, match=r"1 inputs given, the model takes 2: \['a', 'b'\]"):
        rep.run([np.ones(3, np.float32)])
    with pytest.raises(glassrt.GlassrtError, match="one input given, the model takes 2"):
        rep.run(np.ones(3, np.float32))
    with pytest.raises(glassrt.GlassrtError, match="SessionOptions has no option 'enable_mem_pattern'"):
        backend.prepare(_add_model(), enable_mem_pattern=False)
    with pytest.raises(glassrt.GlassrtError, match="CPU only"):
        backend.prepare(_add_model(), "CUDA")
    assert rep.run([np.ones(3, np.float32)] * 2, logid="x", time_budget_s=5.0)[0].tolist() == [2.0] * 3
    with pytest.raises(glassrt.GlassrtError, match="RunOptions has no option 'only_execute_path_to_fetches'"):
        rep.run([np.ones(3, np.float32)] * 2, only_execute_path_to_fetches=True)


def test_devices():
    assert backend.supports_device("CPU") and backend.supports_device("CPU:0")
    assert not backend.supports_device("CUDA") and not backend.supports_device("TPU")
    assert backend.is_compatible(_add_model()) and not backend.is_compatible(_add_model(), "CUDA")


def test_a_single_array_feeds_a_one_input_model_and_numpy_scalars_are_arrays():
    g = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [])],
                          [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    (y,) = backend.prepare(m).run(np.float64(2.5))
    assert y.shape == () and y == -2.5


def test_run_node():
    x = np.array([[-1.0, 2.0], [3.0, -4.0]], np.float32)
    np.testing.assert_array_equal(backend.run_node(helper.make_node("Relu", ["x"], ["y"]), [x])[0], np.maximum(x, 0))
    # An omitted optional input takes no value; an input named twice is fed once.
    clip = helper.make_node("Clip", ["x", "", "hi"], ["y"])
    np.testing.assert_array_equal(backend.run_node(clip, [x, np.float32(1.5)])[0], np.minimum(x, 1.5))
    np.testing.assert_array_equal(backend.run_node(helper.make_node("Mul", ["x", "x"], ["y"]), [x])[0], x * x)
    # Opset of the node's domain, declared output types, other domains.
    (y,) = backend.run_node(helper.make_node("Softmax", ["x"], ["y"], axis=0), [x], opset_version=11,
                            outputs_info=[(np.float32, (2, 2))])
    np.testing.assert_allclose(y, np.exp(x) / np.exp(x).sum(), rtol=1e-6)  # before 13: over the flattened [1, 4]
    (y,) = backend.run_node(helper.make_node("Binarizer", ["x"], ["y"], domain="ai.onnx.ml", threshold=0.5), [x])
    np.testing.assert_array_equal(y, (x > 0.5).astype(np.float32))
    (seq,) = backend.run_node(helper.make_node("SequenceConstruct", ["a", "b"], ["s"]), [x, x + 1])
    assert isinstance(seq, list) and len(seq) == 2
    (n,) = backend.run_node(helper.make_node("SequenceLength", ["s"], ["n"]), [[x, x, x]])
    assert n == 3
    with pytest.raises(glassrt.GlassrtError, match=r"1 inputs given, Add node '' names 2"):
        backend.run_node(helper.make_node("Add", ["a", "b"], ["y"]), [x])


# ---------------------------------------------------------------- per-category counts


def _counts() -> dict:
    """{kind: (passed, failed, excluded, total)}, running each category once."""
    import io
    import unittest

    out = {}
    for kind, cls_name in KINDS.items():
        case = backend_test.test_cases[cls_name]
        suite = unittest.defaultTestLoader.loadTestsFromTestCase(case)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            np.seterr(all="ignore")
            result = unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(suite)
        bad = len(result.failures) + len(result.errors)
        ran = suite.countTestCases() - len(result.skipped)
        names = set(CASES[kind]) - set(REAL)
        out[kind] = (ran - bad, bad, len(names & set(KNOWN_FAILURES)), len(names))
    return out


if __name__ == "__main__":
    for kind, (passed, failed, excluded, total) in _counts().items():
        print(f"{kind:18} {passed:5} of {total:5} pass  ({failed} fail, {excluded} known failures excluded)")
