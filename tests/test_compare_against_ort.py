"""`glassrt compare --against onnxruntime`, and `glassrt run --detect-anomaly`.

The divergence test needs a node on which the two runtimes genuinely disagree:
Resize, linear, coordinate_transformation_mode="align_corners", downsampling by a scale
whose output length is rounded down (8 * 0.6 = 4.8 -> 4 wide). The ONNX spec maps
output x to x * (length_original - 1) / (length_resized - 1) with length_resized the
unrounded output width (input * scale): that is the expected output of ONNX's own
conformance case test_resize_downsample_scales_linear_align_corners ([[1, 3.142857]] for
[[1, 2, 3, 4], [5, 6, 7, 8]] at scale 0.6), and the spec's authors confirmed it
(onnx/onnx#2462). onnxruntime divides by the rounded width and answers [[1, 4]];
onnx.reference and glassrt answer 3.142857.
"""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper
from onnx.reference import ReferenceEvaluator

import glassrt
from glassrt.cli import main
from glassrt.kernels.onednn import capi
from glassrt.tools.against_ort import first_divergence
from glassrt.tools.compare import all_values, first_disagreement
from tests.helpers import init, model, tensor

ort = pytest.importorskip("onnxruntime")

# The conformance case's data, reached through a producer: Conv 1x1 (w=2, b=1) of X.
X = ((np.arange(1, 9, dtype=np.float32) - 1) / 2).reshape(1, 1, 2, 4)
CONFORMANCE_EXPECTED = np.array([[[[1.0, 3.142857]]]], np.float32)  # ONNX's expected Resize output


def _conv_resize_relu(mode="align_corners", scales=(1, 1, 0.6, 0.6)):
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv"),
             helper.make_node("Resize", ["c", "roi", "scales"], ["r"], name="resize", mode="linear",
                              coordinate_transformation_mode=mode),
             helper.make_node("Relu", ["r"], ["y"], name="relu")]
    inits = [init("w", np.full((1, 1, 1, 1), 2, np.float32)), init("b", np.ones(1, np.float32)),
             init("roi", np.zeros(0, np.float32)), init("scales", np.array(scales, np.float32))]
    return model(nodes, [tensor("x", [1, 1, 2, 4])], [tensor("y", None)], inits, opset=19)


def _resize_outputs(m):
    """Resize's output 'r' from onnx.reference, onnxruntime (no graph optimization) and glassrt."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(m)
    exposed.graph.output.append(onnx.ValueInfoProto(name="r"))
    ref = ReferenceEvaluator(exposed).run(["r"], {"x": X})[0]
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    theirs = ort.InferenceSession(exposed.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        ["r"], {"x": X})[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env, _ = all_values(glassrt.InferenceSession(m, providers=["cpu"]), {"x": X})
    return ref, theirs, env["r"]


def test_the_resize_defect_is_real():
    """The premise: the spec's conformance output, onnx.reference and glassrt agree; onnxruntime does not."""
    ref, theirs, ours = _resize_outputs(_conv_resize_relu())
    np.testing.assert_allclose(ref, CONFORMANCE_EXPECTED, rtol=1e-6)
    np.testing.assert_allclose(ours, CONFORMANCE_EXPECTED, rtol=1e-6)
    np.testing.assert_array_equal(theirs, [[[[1.0, 4.0]]]])


def test_names_the_resize_node_not_its_producer():
    result = first_divergence(_conv_resize_relu(), {"x": X}, ["cpu"])
    d = result.found
    assert (d.node, d.op, d.value) == ("resize", "Resize", "r")
    assert result.compared == 2  # conv's output agreed first, then Resize's differed
    assert d.kernel_a.startswith("cpu.Resize")
    assert "onnxruntime" in d.kernel_b and "ORT_DISABLE_ALL" in d.kernel_b
    assert d.where == (0, 0, 0, 1)
    assert d.a == pytest.approx(3.142857, abs=1e-6) and d.b == 4.0
    assert d.max_abs == pytest.approx(4.0 - 3.142857, abs=1e-6)
    assert d.max_rel == pytest.approx((4.0 - 3.142857) / 4.0, abs=1e-6)
    assert d.unchecked_inputs == ()  # its data input was compared; roi and scales are initializers


def test_agrees_where_both_runtimes_follow_the_spec():
    """The same graph with half_pixel: no divergence, every value compared (the test above is not
    a tool that always blames Resize)."""
    result = first_divergence(_conv_resize_relu("half_pixel"), {"x": X}, ["cpu"])
    assert result.found is None and result.compared == 3


def test_cli_exit_code_and_report(tmp_path):
    path = tmp_path / "resize.onnx"
    onnx.save(_conv_resize_relu(), path)
    np.save(tmp_path / "x.npy", X)
    r = CliRunner().invoke(main, ["compare", str(path), "--against", "onnxruntime", "--input",
                                  f"x={tmp_path / 'x.npy'}"], terminal_width=200)
    assert r.exit_code == 1, r.output
    flat = " ".join(r.output.split())  # rich wraps at the console's width
    assert "Resize node 'resize' output 'r'" in flat
    assert "ORT_DISABLE_ALL" in flat and "graph_optimization_level=none" in flat
    onnx.save(_conv_resize_relu("half_pixel"), path)
    r = CliRunner().invoke(main, ["compare", str(path), "--against", "onnxruntime"], terminal_width=200)
    assert r.exit_code == 0, r.output
    assert "agree: 3 values compared" in r.output


def test_against_a_provider_list_is_b(tmp_path):
    path = tmp_path / "resize.onnx"
    onnx.save(_conv_resize_relu(), path)
    r = CliRunner().invoke(main, ["compare", str(path), "--against", "reference,cpu"], terminal_width=200)
    assert r.exit_code == 0, r.output  # glassrt's cpu and onnx.reference both follow the spec
    assert "agree: 3 values compared" in r.output
    r = CliRunner().invoke(main, ["compare", str(path), "--against", "cpu", "--b", "cpu"])
    assert r.exit_code == 2 and "not both" in r.output


def test_a_model_onnxruntime_cannot_load_is_a_clear_error(tmp_path):
    """glassrt's own ops (glassrt::ChannelShuffle) run in glassrt, not in onnxruntime: a
    GlassrtError that says which runtime failed and quotes it, exit 1, no traceback."""
    from glassrt.tools.against_ort import OnnxruntimeError

    m = model([helper.make_node("ChannelShuffle", ["x"], ["y"], name="shuffle", domain="glassrt", group=2)],
              [tensor("x", [1, 4, 2, 2])], [tensor("y", None)], domains={"glassrt": 1})
    x = np.arange(16, dtype=np.float32).reshape(1, 4, 2, 2)
    with pytest.raises(OnnxruntimeError, match="onnxruntime .* cannot load the model: .*glassrt"):
        first_divergence(m, {"x": x}, ["cpu"])
    onnx.save(m, tmp_path / "m.onnx")
    r = CliRunner().invoke(main, ["compare", str(tmp_path / "m.onnx"), "--against", "onnxruntime"])
    assert r.exit_code == 1 and "cannot load the model" in " ".join(r.output.split())
    assert r.exception is None or isinstance(r.exception, SystemExit)


@pytest.mark.skipif(capi.UNAVAILABLE is not None, reason=f"oneDNN: {capi.UNAVAILABLE}")
def test_nhwc_values_are_read_in_their_layout():
    """A plan that keeps every value hands NHWC values (between oneDNN kernels) out as
    NHWC-strided arrays of their NCHW shape, so onednn and cpu agree value by value (they
    differed at the first conv when the kept array was plain NCHW holding NHWC bytes)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    m = model(nodes, [tensor("x", [1, 8, 12, 12])], [tensor("y", None)],
              [init("w1", rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.2),
               init("w2", rng.standard_normal((8, 16, 3, 3)).astype(np.float32) * 0.2)])
    feeds = {"x": rng.standard_normal((1, 8, 12, 12)).astype(np.float32)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = glassrt.InferenceSession(m, providers=["onednn", "cpu"])
    assert fast.explain()["summary"]["layouts"]["nhwc_values"] >= 1
    found, n = first_disagreement(m, feeds, ["onednn", "cpu"], ["cpu"])
    assert found is None and n == 2  # conv1 with relu1 fused in, then conv2
    assert first_divergence(m, feeds, ["onednn", "cpu"]).found is None


def _nan_model():
    nodes = [helper.make_node("Sub", ["x", "one"], ["d"], name="shift"),
             helper.make_node("Sqrt", ["d"], ["s"], name="root"),
             helper.make_node("Add", ["s", "one"], ["y"], name="plus")]
    return model(nodes, [tensor("x", [4])], [tensor("y", [4])], [init("one", np.array(1.0, np.float32))])


@pytest.mark.parametrize("x, code", [([0.5, 2, 3, 4], 1), ([1.5, 2, 3, 4], 0)])
def test_run_detect_anomaly_is_nan(tmp_path, x, code):
    path = tmp_path / "m.onnx"
    onnx.save(_nan_model(), path)
    np.save(tmp_path / "x.npy", np.array(x, np.float32))
    args = [str(path), "--input", f"x={tmp_path / 'x.npy'}", "--providers", "cpu"]
    nan = CliRunner().invoke(main, ["nan", *args], terminal_width=200)
    alias = CliRunner().invoke(main, ["run", *args, "--detect-anomaly"], terminal_width=200)
    assert (alias.exit_code, alias.output) == (nan.exit_code, nan.output)
    assert nan.exit_code == code, nan.output
    if code:
        assert "Sqrt node 'root' output 's': 1 of 4 values are NaN, produced here" in " ".join(nan.output.split())
    else:
        assert "no NaN or Inf" in nan.output
