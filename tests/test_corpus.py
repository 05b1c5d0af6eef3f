"""The corpus: real models shipped inside PyPI wheels (corpus/manifest.py), each run through
glassrt and onnxruntime on the same inputs and compared output by output.

The models come from `python -m corpus.fetch` (into $GLASSRT_CORPUS or
~/.cache/glassrt-corpus); nothing here downloads anything. Without that cache the model
tests skip, saying so; the tests of the corpus's own machinery and of what it found run
regardless.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto, helper

from corpus.compare import compare_model, compare_outputs, compare_varying, make_feeds, varied_dims
from corpus.fetch import cache_dir, find_wheel, model_path, present, select
from corpus.manifest import MODELS, Feed, Model

ML = "ai.onnx.ml"

# What glassrt gets wrong on the corpus today, matched on the error it raises (any other
# error still fails the test). See README, "Real models from PyPI wheels".
KNOWN: dict = {}  # none today (rapidocr-cls's '?' dims and oww-hey-jarvis's branch Gemm are fixed)


# ---------------------------------------------------------------- the manifest and its tools


def test_manifest_is_well_formed():
    ids = [m.id for m in MODELS]
    assert len(ids) == len(set(ids)), "duplicate ids"
    for m in MODELS:
        assert re.fullmatch(r"[0-9a-f]{64}", m.sha256), m.id
        assert re.fullmatch(r"[0-9][0-9A-Za-z.]*", m.version), f"{m.id}: pin an exact version"
        assert m.member.endswith(".onnx"), m.id
        assert all(f.kind in ("uniform", "int", "zeros", "const") for f in m.feeds.values()), m.id
    # distinct models only: the same bytes from two wheels are listed once
    assert len({m.sha256 for m in MODELS}) == len(MODELS)
    assert {m.id for m in select()} == {m.id for m in MODELS if not m.large}


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("GLASSRT_CORPUS", str(tmp_path))
    assert cache_dir() == tmp_path
    assert present() == []
    assert model_path(MODELS[0]) == tmp_path / "models" / f"{MODELS[0].id}.onnx"
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "rapidocr_onnxruntime-1.4.4-py3-none-any.whl").write_bytes(b"")
    (wheels / "rapidocr-1.4.4-py3-none-any.whl").write_bytes(b"")
    assert find_wheel(wheels, "rapidocr-onnxruntime", "1.4.4").name.startswith("rapidocr_onnxruntime-")
    assert find_wheel(wheels, "rapidocr-onnxruntime", "1.4.3") is None


def test_feeds_follow_the_hints():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    ids = helper.make_tensor_value_info("ids", TensorProto.INT32, ["batch", 5])
    sr = helper.make_tensor_value_info("sr", TensorProto.INT64, [])
    bare = helper.make_tensor_value_info("s", TensorProto.FLOAT, [0])
    bare.type.tensor_type.shape.dim[0].Clear()  # no value, no name (spox's exports)
    g = helper.make_graph([], "g", [x, ids, sr, bare], [])
    m = Model("t", "p", "1", "t.onnx", "0" * 64, "test", "test", dims={"batch": 2},
              feeds={"x": Feed(kind="uniform", low=-1, high=1), "ids": Feed(kind="int", low=0, high=256),
                     "sr": Feed(shape=(), kind="const", value=16000), "s": Feed(shape=(4,), kind="zeros")})
    feeds = make_feeds(m, helper.make_model(g))
    assert feeds["x"].dtype == np.float32 and feeds["x"].shape == (2, 3) and np.abs(feeds["x"]).max() <= 1
    assert feeds["ids"].dtype == np.int32 and feeds["ids"].min() >= 0 and feeds["ids"].max() <= 256
    assert feeds["sr"].dtype == np.int64 and feeds["sr"].shape == () and feeds["sr"] == 16000
    assert feeds["s"].shape == (4,) and not feeds["s"].any()
    again = make_feeds(m, helper.make_model(g))
    assert all(np.array_equal(feeds[k], again[k]) for k in feeds)  # seeded per model and input
    with pytest.raises(ValueError, match="no name and no value"):
        make_feeds(Model("t", "p", "1", "t.onnx", "0" * 64, "test", "test", dims={"batch": 2}),
                   helper.make_model(g))


def test_varied_dims_keep_multiples_of_eight_and_stay_positive():
    assert varied_dims({"image_width": 160, "sequence": 3}, 1.5) == {"image_width": 240, "sequence": 4}
    assert varied_dims({"image_width": 160, "sequence": 3}, 0.01) == {"image_width": 8, "sequence": 1}


def test_a_model_without_symbolic_dims_is_not_varied():
    m = Model("t", "p", "1", "t.onnx", "0" * 64, "test", "test")
    assert compare_varying(m, path="/nonexistent.onnx")["skipped"] == "no symbolic dims in the manifest"


def test_compare_outputs():
    a = np.array([1.0, 2.0, np.nan], np.float32)
    ok = compare_outputs(["y"], [a], [a + np.float32(1e-6)], 1e-3, 1e-4)
    assert ok["mismatch"] is None and 0 < ok["max_abs"] < 1e-5
    bad = compare_outputs(["y"], [a], [a * 1.1], 1e-3, 1e-4)
    assert "out of tolerance" in bad["mismatch"] and bad["max_rel"] > 0.05
    assert "nan" in compare_outputs(["y"], [a], [np.zeros(3, np.float32)], 1e-3, 1e-4)["mismatch"]
    assert "values differ" in compare_outputs(["l"], [np.array([1, 2])], [np.array([1, 3])], 1e-3, 1e-4)["mismatch"]
    zm = [{0: 0.25, 1: 0.75}, {0: 0.5, 1: 0.5}]
    assert compare_outputs(["p"], [zm], [[dict(d) for d in zm]], 1e-3, 1e-4)["mismatch"] is None
    assert compare_outputs(["p"], [zm], [[{0: 0.25, 1: 0.75}, {0: 0.4, 1: 0.6}]], 1e-3, 1e-4)["mismatch"]
    assert "shape" in compare_outputs(["y"], [a], [a[:2]], 1e-3, 1e-4)["mismatch"]


# ---------------------------------------------------------------- what the corpus found


def test_timings_are_taken_after_the_warmup_each_runtime_back_to_back():
    """compare's latencies: `warmup` untimed runs, then `runs` timed ones, of one runtime at a
    time (alternating run by run, each found the other's weights evicted, and glassrt's plan
    was not yet replayed as straight-line code); milliseconds to three significant digits."""
    from corpus.compare import _ms, _timed

    calls = []
    times = _timed(lambda: calls.append(1), runs=5, warmup=7)
    assert len(calls) == 12 and len(times) == 5 and all(t >= 0 for t in times)
    assert [_ms(v) for v in (27.4512, 0.04123, 123.4, 5.0, None)] == ["27.5", "0.0412", "123", "5.00", ""]


def test_linear_classifier_reads_one_row_per_intercept():
    """onnxruntime's own logreg_iris.onnx: 3 classes, 3 intercepts, 12 coefficients, a
    declared [3, 2] input. onnxruntime reads the coefficients as [3 intercepts, 2 features]
    from their start; glassrt made 6 rows of them and failed to add the 3 intercepts."""
    ort = pytest.importorskip("onnxruntime")
    import glassrt

    rng = np.random.default_rng(0)
    coefs = rng.standard_normal(12).astype(np.float32).tolist()
    node = helper.make_node("LinearClassifier", ["x"], ["label", "scores"], domain=ML, name="lc",
                            classlabels_ints=[0, 1, 2], coefficients=coefs, intercepts=[0.25, 0.5, -0.75],
                            multi_class=0, post_transform="LOGISTIC")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2])],
                          [helper.make_tensor_value_info("label", TensorProto.INT64, [3]),
                           helper.make_tensor_value_info("scores", TensorProto.FLOAT, [3, 3])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(ML, 1)])
    model.ir_version = 8
    data = model.SerializeToString()
    x = rng.uniform(0, 8, (3, 2)).astype(np.float32)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = glassrt.InferenceSession(data, providers=["cpu"]).run(None, {"x": x})
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)
    w = np.asarray(coefs, np.float32)[:6].reshape(3, 2)
    np.testing.assert_allclose(got[1], 1 / (1 + np.exp(-(x @ w.T + [0.25, 0.5, -0.75]))), rtol=1e-5)

    # fewer coefficients than intercepts x features: refused, naming the counts
    coefficients = next(a for a in model.graph.node[0].attribute if a.name == "coefficients")
    coefficients.CopyFrom(helper.make_attribute("coefficients", coefs[:5]))
    with pytest.raises(glassrt.GlassrtError, match="5 coefficients do not make 3 rows"):
        glassrt.InferenceSession(model.SerializeToString(), providers=["cpu"]).run(None, {"x": x})


# ---------------------------------------------------------------- the models themselves

_PRESENT = {m.id for m in present()}


@pytest.mark.parametrize("m", MODELS, ids=[m.id for m in MODELS])
def test_model_matches_onnxruntime(m):
    pytest.importorskip("onnxruntime")
    if not _PRESENT:
        pytest.skip(f"no corpus models in {cache_dir() / 'models'} (python -m corpus.fetch downloads them; "
                    "set GLASSRT_CORPUS to use another folder)")
    if m.id not in _PRESENT:
        pytest.skip(f"{m.id} is not in the corpus cache" + (" (python -m corpus.fetch --large)" if m.large else ""))
    r = compare_model(m, runs=0, threads=0)
    if r["status"] == "fails" and m.id in KNOWN:
        kind, pattern, why = KNOWN[m.id]
        if r["error_type"] == kind and re.search(pattern, r["error_full"]):
            pytest.xfail(f"known: {why}")
    assert r["status"] == "passes", (f"{m.id}: {r['status']}: {r.get('error_type', '')} "
                                     f"{r.get('error') or r.get('mismatch')}\n{r.get('traceback', '')}")
    assert r["tol_used"] <= 1
