"""`glassrt optimize`: the graph after glassrt's passes saved as standard ONNX.

Oracle: onnxruntime runs the original model and the optimized file (which it can only run
by inlining the model-local functions glassrt wrote for its fused ops); glassrt runs the
optimized file with its fused kernels. The nine light CNNs (random weights) and a small
BERT-shaped encoder (the same builder as the benchmark's BERT-base)."""
from __future__ import annotations

import json
import os
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import helper

import glassrt
from glassrt.cli import main
from glassrt.export import OptimizeError
from glassrt.passes import PIPELINE
from glassrt.tools import bench_models, light_models
from glassrt.tools import optimize as tool
from glassrt.tools.explain import explain
from tests.helpers import init, model, tensor

MODELS = [*light_models.NAMES, "bert"]
RTOL, ATOL = 1e-4, 1e-5
# Their fully connected layers hold 240-550 MB: random weights for them would take most of a
# minute to make and write on a busy 2-core machine, so they keep the weights they ship
# with (ConstantOfShape(0.02) nodes, which the passes fold into initializers) and are
# written with external data.
AS_SHIPPED = {"bvlc_alexnet", "vgg19", "zfnet512"}


def _build(name):
    if name == "bert":
        m = bench_models.bert(layers=2, hidden=64, heads=4, intermediate=128, vocab=200, max_positions=64)
        return m, bench_models.bert_feeds(2, 16, vocab=200)
    m = onnx.load(light_models.path(name)) if name in AS_SHIPPED else bench_models.light(name)
    x, shape = light_models.input_shape(m)
    return m, {x: light_models.reference_input(shape)}


def _ort(path, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(os.fspath(path), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _session(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return glassrt.InferenceSession(os.fspath(path))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("optimize")


@pytest.mark.parametrize("name", MODELS)
def test_optimized_model_is_standard_onnx_and_computes_the_same(name, folder):
    m, feeds = _build(name)
    src, out = folder / f"{name}.onnx", folder / f"{name}.opt.onnx"
    onnx.save(m, src)
    report = tool.optimize(src, out, external_data=name in AS_SHIPPED)
    assert report.ops_after != report.ops_before  # the passes did rewrite it

    saved = onnx.load(out, load_external_data=False)
    onnx.checker.check_model(out, full_check=True)  # by path: the checker reads external data from there
    props = {p.key: p.value for p in saved.metadata_props}
    assert props["glassrt.version"] == glassrt.__version__ and props["glassrt.level"] == "all"
    assert [p["name"] for p in json.loads(props["glassrt.passes"])] == [r.name for r in report.passes]
    calls = [n for n in saved.graph.node if n.domain == "glassrt"]
    assert calls, "every model here has fused ops"
    functions = {(f.domain, f.name, f.overload) for f in saved.functions}
    assert all(("glassrt", n.op_type, n.overload) in functions for n in calls)

    expected = _ort(src, feeds)
    sess = _session(out)
    for got in (_ort(out, feeds), sess.run(None, feeds)):
        for e, g in zip(expected, got, strict=True):
            np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL)

    # glassrt runs its fused kernels on the functions it wrote, rather than inlining them
    fused = [n for n in explain(sess)["nodes"] if n["domain"] == "glassrt"]
    assert len(fused) == len(calls)
    assert all(n["kernel"] and n["op"] in n["kernel"] and "expanded" not in (n["reason"] or "") for n in fused)
    # glassrt does not run its optional passes again on a file it optimized itself...
    assert {r.name for r in sess.passes if r.skipped} == {p.name for p in PIPELINE if p.level != "required" and p.persists}
    # ...which is safe because they would find nothing: run them all on the same graph
    # with the metadata saying another glassrt version wrote it.
    again = onnx.load(out)
    for p in again.metadata_props:
        if p.key == "glassrt.version":
            p.value = "0.0.0-another"
    sess = glassrt.InferenceSession(again, base_dir=str(folder))
    assert not any(r.skipped for r in sess.passes)
    assert all(r.changes == [] for r in sess.passes), "the optimized graph gives the passes nothing left to do"


def test_level_none_keeps_the_node_list(folder):
    m, _ = _build("squeezenet")
    src, out = folder / "sq.onnx", folder / "sq.none.onnx"
    onnx.save(m, src)
    tool.optimize(src, out, level="none")
    saved = onnx.load(out)
    onnx.checker.check_model(saved, full_check=True)
    def key(n):
        return n.op_type, list(n.input), list(n.output), sorted(a.name for a in n.attribute)
    assert [key(n) for n in saved.graph.node] == [key(n) for n in m.graph.node]
    assert not saved.functions
    basic = folder / "sq.basic.onnx"
    tool.optimize(src, basic, level="basic")
    assert not any(n.domain == "glassrt" for n in onnx.load(basic).graph.node)  # fusions are "extended"


def test_dims_fold_shape_arithmetic(folder):
    m, feeds = _build("bert")
    src, out = folder / "bert_dims.onnx", folder / "bert_dims.opt.onnx"
    onnx.save(m, src)
    free = tool.optimize(src, folder / "bert_free.onnx")
    bound = tool.optimize(src, out, dims={"batch": 2, "sequence": 16})
    assert bound.ops_after.get("Shape", 0) < free.ops_after.get("Shape", 0)
    np.testing.assert_allclose(_ort(out, feeds)[0], _ort(src, feeds)[0], rtol=RTOL, atol=ATOL)
    with pytest.raises(glassrt.InvalidArgumentError, match="--dim batchh.*batch, sequence"):
        tool.optimize(src, folder / "x.onnx", dims={"batchh": 2})


def test_refuses_to_overwrite_its_input(folder):
    m, _ = _build("squeezenet")
    src = folder / "self.onnx"
    onnx.save(m, src)
    before = src.read_bytes()
    with pytest.raises(OptimizeError, match="is the model being optimized"):
        tool.optimize(src, src)
    link = folder / "self_link.onnx"
    os.symlink(src, link)
    with pytest.raises(OptimizeError, match="is the model being optimized"):
        tool.optimize(link, folder / "." / "self.onnx")
    assert src.read_bytes() == before
    result = CliRunner().invoke(main, ["optimize", str(src), "-o", str(src)])
    assert result.exit_code == 1 and "is the model being optimized" in " ".join(result.output.split())


def test_cli_prints_what_changed(folder):
    src, out = light_models.path("resnet50"), folder / "r.opt.onnx"
    result = CliRunner().invoke(main, ["optimize", str(src), "-o", str(out), "--json", str(folder / "r.json")])
    assert result.exit_code == 0, result.output
    report = json.loads((folder / "r.json").read_text())
    assert report["ops_before"]["BatchNormalization"] == 53 and "BatchNormalization" not in report["ops_after"]
    assert report["ops_after"]["glassrt::FusedConv"] == report["function_calls"]["FusedConv"] == 49
    lines = {ln.split("│")[1].strip(): ln for ln in result.output.splitlines() if ln.count("│") >= 4}
    assert "53" in lines["BatchNormalization"] and "-53" in lines["BatchNormalization"]
    assert "weight bytes" in lines


def test_session_option_writes_the_optimized_model(folder):
    m, feeds = _build("shufflenet")
    src, out = folder / "s.onnx", folder / "s.session.onnx"
    onnx.save(m, src)
    so = glassrt.SessionOptions()
    so.optimized_model_filepath = os.fspath(out)
    glassrt.InferenceSession(src, so)
    saved = onnx.load(out)
    onnx.checker.check_model(saved, full_check=True)
    assert {n.op_type for n in saved.graph.node if n.domain == "glassrt"} == {"FusedConv", "ChannelShuffle"}
    np.testing.assert_allclose(_ort(out, feeds)[0], _ort(src, feeds)[0], rtol=RTOL, atol=ATOL)
    so.optimized_model_filepath = os.fspath(src)
    with pytest.raises(OptimizeError, match="is the model being optimized"):
        glassrt.InferenceSession(src, so)


def test_gelu_in_an_opset_17_function_is_written_in_erf_form(folder):
    """Gelu exists from opset 20: a FusedMatMul(activation=Gelu) in an opset-17 model gets its
    ONNX function body (Erf) inside the function, valid at the model's opset."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Div", ["a", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["p"]), helper.make_node("Mul", ["a", "p"], ["q"]),
             helper.make_node("Mul", ["q", "half"], ["y"])]
    m = model(nodes, [tensor("x", ["n", 8])], [tensor("y", ["n", 4])],
              [init("w", rng.standard_normal((8, 4)).astype(np.float32)), init("b", np.ones(4, np.float32)),
               init("sqrt2", np.float32(np.sqrt(2))), init("one", np.float32(1)), init("half", np.float32(0.5))],
              opset=17)
    src, out = folder / "gelu.onnx", folder / "gelu.opt.onnx"
    onnx.save(m, src)
    tool.optimize(src, out)
    saved = onnx.load(out)
    onnx.checker.check_model(saved, full_check=True)
    (fn,) = saved.functions
    assert "Erf" in {n.op_type for n in fn.node} and "Gelu" not in {n.op_type for n in fn.node}
    feeds = {"x": rng.standard_normal((3, 8)).astype(np.float32)}
    np.testing.assert_allclose(_ort(out, feeds)[0], _ort(src, feeds)[0], rtol=RTOL, atol=ATOL)
    assert [n.op_type for n in _session(out).graph.nodes] == ["FusedMatMul"]


def test_optimized_file_is_inferred_once(folder, monkeypatch):
    """On a file glassrt optimized, the required passes change nothing, so the types they
    inferred are the session's: one inference, not two."""
    import glassrt.session as session_mod

    m, feeds = _build("squeezenet")
    src, out = folder / "sq1.onnx", folder / "sq1.opt.onnx"
    onnx.save(m, src)
    tool.optimize(src, out)
    calls = []
    real = session_mod.infer_symbolic
    monkeypatch.setattr(session_mod, "infer_symbolic", lambda g, **kw: calls.append(g) or real(g, **kw))
    for path, runs in ((out, 1), (src, 2)):  # the original's passes rewrite it: inferred again after
        calls.clear()
        sess = _session(path)
        assert len(calls) == runs, path
        np.testing.assert_allclose(sess.run(None, feeds)[0], _ort(src, feeds)[0], rtol=RTOL, atol=ATOL)
