"""Custom ops: the README example, the machinery, and `glassrt check` on broken contracts."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import glassrt
from glassrt.tools import check as checks

ROOT = Path(__file__).resolve().parent.parent


def _readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- custom-op-example -->\s*```python\n(.*?)```", text, re.S)
    assert m, "the README's custom op example is missing"
    return m.group(1)


def test_readme_example_runs_in_a_fresh_process(tmp_path):
    code = _readme_example()
    assert len(code.strip().splitlines()) <= 16
    script = tmp_path / "example.py"
    script.write_text(code)
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "array(" in res.stdout


def _model(op, domain, inputs, outputs, **attrs):
    node = helper.make_node(op, [i[0] for i in inputs], [o[0] for o in outputs], domain=domain, name="custom", **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(domain, 1)])


@pytest.fixture
def good_ops():
    from tests.custom_ops import good_ops

    for op in (good_ops.swish, good_ops.affine_sum):
        op._publish()
    yield good_ops


def test_custom_op_runs_through_placement_planning_and_explain(good_ops):
    m = _model("swish", "good", [("x", ["batch", 4])], [("y", ["batch", 4])], beta=0.5)
    sess = glassrt.InferenceSession(m, providers=["cpu"], fallback="error")
    x = np.linspace(-3, 3, 8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], x / (1 + np.exp(-0.5 * x)), rtol=1e-6)
    report = sess.explain({"batch": 2})
    (row,) = report["nodes"]
    assert row["kernel"] == "cpu.good::swish" and row["outputs"][0]["shape"] == [2, 4]
    assert report["values"] == [] or all(v["name"] != "y" or v["offset"] is None for v in report["values"])
    assert sess.get_outputs()[0].shape == ["batch", 4]  # the user's meta kept the symbol


def test_custom_op_multi_output_optional_input_list_attr(good_ops):
    node = helper.make_node("affine_sum", ["x"], ["y", "t"], domain="good", scale=3.0, axes=[0, 2])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("good", 1)])
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    y, t = glassrt.InferenceSession(m).run(None, {"x": x})
    np.testing.assert_allclose(y, 3 * x)
    np.testing.assert_allclose(t, (3 * x).sum(axis=(0, 2)))


def test_custom_op_decomposition_runs_where_no_kernel_exists(good_ops):
    from glassrt.kernels import registry

    saved = list(registry.kernels_for("cpu", "good", "swish"))
    registry.unregister("cpu", "good", "swish")
    try:
        m = _model("swish", "good", [("x", [3])], [("y", [3])], beta=1.0)
        sess = glassrt.InferenceSession(m, providers=["cpu"], fallback="error")
        x = np.array([-1.0, 0.0, 2.0], np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], x / (1 + np.exp(-x)), rtol=1e-6)
        assert sess.explain()["summary"]["expansions"][0]["op"] == "swish"
    finally:
        for k in registry.kernels_for("cpu", "good", "swish") + saved:
            registry.register(k) if k in saved else None


def test_custom_op_gradients(good_ops):
    m = _model("swish", "good", [("x", [5])], [("y", [5])], beta=1.5)
    from onnx import TensorProto as T

    for vi in [*m.graph.input, *m.graph.output]:
        vi.type.tensor_type.elem_type = T.DOUBLE
    sess = glassrt.InferenceSession(m)
    from glassrt.tools.gradcheck import gradcheck

    ok, worst, msg = gradcheck(sess, {"x": np.linspace(-2, 2, 5)}, "y", ["x"])
    assert ok, msg


def test_loading_a_model_never_imports_code_it_names():
    # A node whose domain looks like a Python module: nothing is imported, the op is unknown.
    m = _model("system", "os", [("x", [1])], [("y", [1])])
    with pytest.raises(glassrt.UnsupportedOperatorError, match="os"):
        glassrt.InferenceSession(m)
    assert "tests.custom_ops.never_imported" not in sys.modules


@pytest.mark.parametrize("bad", ["my_ops::swish(Tensor x", "swish(Tensor x) -> Tensor",
                                 "d::op(Tensor x=1) -> Tensor", "d::op(int k=1.5) -> Tensor",
                                 "d::op(float beta, Tensor x) -> Tensor", "d::op(Tensor x) -> int"])
def test_schema_errors_are_precise(bad):
    with pytest.raises(glassrt.GlassrtError, match="schema|must|default|before|unknown|parse"):
        glassrt.custom_op(bad)


def test_check_names_every_defect_of_the_broken_ops():
    from tests.custom_ops import broken_ops  # noqa: F401

    for op in (broken_ops.wrong_meta, broken_ops.batch_one, broken_ops.bad_dtype, broken_ops.off_fused,
               broken_ops.wrong_grad, broken_ops.no_grad):
        op._publish()
    rows = [r for r in checks.run_checks(builtins=False) if r.op.startswith("broken::")]
    failures = {(r.op, r.check): r.message for r in rows if r.status == "fail"}
    assert re.search(r"meta says float.*\[2, 3\].*returned float.*\[2, 3, 4\]",
                     failures[("broken::wrong_meta", "meta_vs_real")])
    assert "follows the batch" in failures[("broken::batch_one", "dynamic_dims")]
    assert re.search(r"declared dtype int64: kernel 'cpu' raised TypeError: only floats",
                     failures[("broken::bad_dtype", "dtype_coverage")])
    assert "differs from the decomposition" in failures[("broken::off_fused", "decomposition")]
    assert "differs from central differences" in failures[("broken::wrong_grad", "backward")]
    assert "no backward" in failures[("broken::no_grad", "backward")]
    # One precise failure per defect, nothing else flagged.
    assert len(failures) == 6, failures


def test_check_passes_good_ops(good_ops):
    rows = [r for r in checks.run_checks(builtins=False) if r.op.startswith("good::")]
    assert rows and not [r for r in rows if r.status == "fail"], [r for r in rows if r.status == "fail"]
    assert {(r.op, r.check) for r in rows if r.status == "pass"} >= {
        ("good::swish", "meta_vs_real"), ("good::swish", "dynamic_dims"), ("good::swish", "decomposition"),
        ("good::swish", "backward"), ("good::affine_sum", "backward")}


def test_check_cli_exit_status(tmp_path):
    out = tmp_path / "rows.json"
    res = subprocess.run([sys.executable, "-m", "glassrt.cli", "check", "--custom-only", "--module",
                          str(ROOT / "tests/custom_ops/broken_ops.py"), "--json", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr
    rows = json.loads(out.read_text())
    assert len([r for r in rows if r["status"] == "fail"]) == 6
    res = subprocess.run([sys.executable, "-m", "glassrt.cli", "check", "--custom-only", "--module",
                          str(ROOT / "tests/custom_ops/good_ops.py")], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr


def test_default_domain_custom_ops_cannot_shadow_standard_ops():
    with pytest.raises(glassrt.GlassrtError, match="standard ONNX op"):
        glassrt.custom_op("ai.onnx::Relu(Tensor x) -> Tensor")
    op = glassrt.custom_op("ai.onnx::MyOwnNorm(Tensor x) -> Tensor", dtypes=[np.float32])
    try:
        assert op.domain == ""
        op.register_meta(lambda x: x)
        op.register_kernel("cpu", lambda x: x / np.abs(x).max())
        node = helper.make_node("MyOwnNorm", ["x"], ["y"])
        g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
        sess = glassrt.InferenceSession(m, providers=["cpu"])
        np.testing.assert_allclose(sess.run(None, {"x": np.array([1, -4, 2], np.float32)})[0], [0.25, -1, 0.5])
        assert sess.explain()["nodes"][0]["kernel"] == "cpu.MyOwnNorm"
    finally:
        op.unregister()


def test_register_example_may_set_attributes():
    op = glassrt.custom_op("ex::scale(Tensor x, float k) -> Tensor", dtypes=[np.float64])
    try:
        op.register_meta(lambda x, k: x)
        op.register_kernel("cpu", lambda x, k: x * k)
        op.register_example(lambda dt: ([np.ones((2, 3), dt)], {"k": 3.0}))
        rows = [r for r in checks.run_checks("ex::scale", builtins=False)]
        assert {r.check: r.status for r in rows}["meta_vs_real"] == "pass"
        assert {r.check: r.status for r in rows}["dynamic_dims"] == "pass"
    finally:
        op.unregister()


def test_bound_kernel_prepares_constant_inputs_once():
    """register_kernel(..., bind=True): per-plan work on weights known before the run."""
    op = glassrt.custom_op("bind::scaled_matmul(Tensor x, Tensor w, float k=1.0) -> Tensor", dtypes=[np.float32])
    prepared = []
    try:
        op.register_meta(lambda x, w, k: glassrt.TensorMeta(x.dtype, tuple(x.shape[:-1]) + (w.shape[1],)))

        @op.register_kernel("cpu", bind=True)
        def _bound(ctx):
            w = ctx.const(1)
            scaled = None if w is None else (w * ctx.attrs["k"]).astype(np.float32)
            prepared.append(scaled is not None)
            return lambda x, w: x @ (scaled if scaled is not None else w * np.float32(ctx.attrs["k"]))

        w = np.arange(6, dtype=np.float32).reshape(3, 2)
        node = helper.make_node("scaled_matmul", ["x", "w"], ["y"], domain="bind", k=2.0)
        g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])],
                              [onnx.numpy_helper.from_array(w, "w")])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("bind", 1)])
        sess = glassrt.InferenceSession(m, providers=["cpu"])
        x = np.ones((4, 3), np.float32)
        for _ in range(3):
            np.testing.assert_allclose(sess.run(None, {"x": x})[0], x @ (2 * w))
        assert prepared == [True]  # bound once for the plan, with the weight already known
        rows = {r.check: r.status for r in checks.run_checks("bind::scaled_matmul", builtins=False)}
        assert rows["meta_vs_real"] == "skip"  # the generated (2, 3, 4) inputs do not multiply
        op.register_example(lambda dt: [np.ones((2, 3), dt), np.ones((3, 5), dt)])
        rows = {r.check: r.status for r in checks.run_checks("bind::scaled_matmul", builtins=False)}
        assert rows["meta_vs_real"] == "pass" and rows["dtype_coverage"] == "pass"
    finally:
        op.unregister()
