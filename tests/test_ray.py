"""glassrt on Ray Data: glassrt.ray.Predictor and `glassrt batch` against in-process sessions.

One local Ray runtime (2 CPUs, no dashboard, a small object store) serves the whole module;
the tests that need Ray skip where the `ray` extra is missing (CI installs it). The
no-Ray test runs everywhere: it blocks the import of ray in a subprocess.
"""
from __future__ import annotations

import re

import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper

import glassrt
import glassrt.ray  # imports no ray (checked below)
from glassrt.cli import main

from .helpers import init, model, tensor

try:
    import ray
    import ray.data
except ImportError:
    ray = None

needs_ray = pytest.mark.skipif(ray is None, reason="the `ray` extra is not installed (pip install 'glassrt[ray]')")
ROWS = 512
W = (np.arange(12, dtype=np.float32).reshape(4, 3) - 6) / 10


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=96 << 20, log_to_driver=False,
             configure_logging=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    yield ray
    ray.shutdown()


def two_output_model():
    """y = tanh(x @ W) [n, 3] and total = sum(x, axis 1) [n], symbolic batch n."""
    return model([helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                  helper.make_node("Tanh", ["h"], ["y"], name="tanh"),
                  helper.make_node("ReduceSum", ["x", "axes"], ["total"], name="sum", keepdims=0)],
                 [tensor("x", ["n", 4])], [tensor("y", ["n", 3]), tensor("total", ["n"])],
                 [init("w", W), init("axes", np.array([1], np.int64))])


def falling_back_model():
    """sin(x @ W): run with the cpu provider told to leave Sin alone, Sin falls back to reference."""
    return model([helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                  helper.make_node("Sin", ["h"], ["y"], name="sin")],
                 [tensor("x", ["n", 4])], [tensor("y", ["n", 3])], [init("w", W)])


FALLBACK_PROVIDERS = [("cpu", {"exclude_ops": ["Sin"]}), "reference"]


def features(rows=ROWS, seed=0):
    return np.random.default_rng(seed).standard_normal((rows, 4)).astype(np.float32)


def dataset(x, blocks):
    return ray.data.from_items([{"id": i, "feat": x[i]} for i in range(len(x))], override_num_blocks=blocks)


def by_id(rows):
    return sorted(rows, key=lambda r: r["id"])


@needs_ray
def test_map_batches_in_two_actors_equals_one_in_process_session(local_ray):
    x = features()
    m = two_output_model()
    # 8 blocks of 64 rows and batch_size 64: every batch is a block, the same rows the
    # in-process session gets below, so the outputs must be equal bit for bit.
    out = dataset(x, 8).map_batches(
        glassrt.ray.Predictor, batch_format="numpy", batch_size=64, compute=ray.data.ActorPoolStrategy(size=2),
        fn_constructor_kwargs={"model": glassrt.ray.model_ref(m), "providers": ["cpu"], "inputs": {"feat": "x"},
                               "outputs": {"y": "pred", "total": "total"}, "run": "equal"}).take_all()
    sess = glassrt.InferenceSession(m, providers=["cpu"])
    expected = [sess.run(None, {"x": x[i:i + 64]}) for i in range(0, ROWS, 64)]
    rows = by_id(out)
    assert [r["id"] for r in rows] == list(range(ROWS))
    np.testing.assert_array_equal(np.stack([r["pred"] for r in rows]), np.concatenate([e[0] for e in expected]))
    np.testing.assert_array_equal(np.array([r["total"] for r in rows]), np.concatenate([e[1] for e in expected]))
    np.testing.assert_array_equal(np.stack([r["feat"] for r in rows]), x)  # the input columns are kept
    np.testing.assert_allclose(np.stack([r["pred"] for r in rows]), np.tanh(x @ W), rtol=1e-5, atol=1e-6)

    reports = glassrt.ray.Predictor.stats("equal")
    # Ray starts 2 actors but does not wait for the second before handing out batches: on
    # a busy machine the first may have taken them all (and the second reported 0 rows, or
    # been stopped before its report). Each report is its own process's.
    assert 1 <= len(reports) <= 2 and len({r["pid"] for r in reports}) == len(reports)
    assert sum(r["rows"] for r in reports) == ROWS and sum(r["batches"] for r in reports) == 8
    for r in reports:
        # one session per actor, its one plan replayed for every batch after the first
        assert r["plans_built"] == (1 if r["batches"] else 0) and r["plans_cached"] == r["plans_built"]
        assert r["fallbacks"] == [] and r["providers"] == ["cpu"] and r["threads"] == 1
        assert r["model"].startswith("sha256:") and not r["row_by_row"]


@needs_ray
def test_a_model_that_falls_back_reports_its_fallbacks_from_the_actors(local_ray):
    x = features(256, seed=1)
    m = falling_back_model()
    with pytest.warns(glassrt.FallbackWarning):
        sess = glassrt.InferenceSession(m, providers=FALLBACK_PROVIDERS)
    (local,) = sess.fallbacks
    out = dataset(x, 4).map_batches(
        glassrt.ray.Predictor, batch_format="numpy", batch_size=64, compute=ray.data.ActorPoolStrategy(size=2),
        fn_constructor_kwargs={"model": glassrt.ray.model_ref(m.SerializeToString()), "providers": FALLBACK_PROVIDERS,
                               "inputs": {"feat": "x"}, "keep_inputs": False, "run": "fallback", "name": "sin"},
    ).take_all()
    rows = by_id(out)
    assert set(rows[0]) == {"id", "y"}  # keep_inputs=False drops the column fed to the model
    np.testing.assert_array_equal(np.stack([r["y"] for r in rows]),
                                  np.concatenate([sess.run(None, {"x": x[i:i + 64]})[0] for i in range(0, 256, 64)]))
    reports = glassrt.ray.Predictor.stats("fallback")
    assert 1 <= len(reports) <= 2 and sum(r["rows"] for r in reports) == 256
    expected = [{"node": "sin", "op": "Sin", "provider": "reference", "reason": local.reason}]
    assert "exclude_ops=['Sin']" in local.reason
    for r in reports:
        assert r["fallbacks"] == expected and r["model"] == "sin" and r["providers"] == ["cpu", "reference"]
    total = glassrt.ray.summarize(reports)
    assert total["rows"] == 256 and total["fallbacks"] == [{**expected[0], "actors": len(reports)}]


@needs_ray
def test_a_column_of_the_wrong_dtype_is_an_error_naming_the_column(local_ray):
    ds = ray.data.from_items([{"feat": np.ones(4)} for _ in range(8)])  # float64, the model takes float
    with pytest.raises(Exception) as info:
        ds.map_batches(glassrt.ray.Predictor, batch_format="numpy", batch_size=4,
                       compute=ray.data.ActorPoolStrategy(size=1),
                       fn_constructor_kwargs={"model": two_output_model(), "inputs": {"feat": "x"}}).take_all()
    from glassrt.ray.batch import glassrt_error

    message = "column 'feat' -> input 'x': expected tensor(float), got tensor(double)"
    assert f"BatchColumnError: {message}" in str(info.value)  # what Ray shows
    found = glassrt_error(info.value)  # what `glassrt batch` shows
    assert isinstance(found, glassrt.ray.predictor.BatchColumnError) and isinstance(found, glassrt.InputError)
    assert str(found).startswith(message)


@needs_ray
def test_a_one_row_model_runs_a_batch_row_by_row(local_ray):
    """An export with a static batch of 1 ([1, 4]): each row runs alone, one plan for all."""
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [tensor("x", [1, 4])],
              [tensor("y", [1, 3])], [init("w", W)])
    x = features(96, seed=2)
    out = dataset(x, 3).map_batches(
        glassrt.ray.Predictor, batch_format="numpy", batch_size=32, compute=ray.data.ActorPoolStrategy(size=1),
        fn_constructor_kwargs={"model": glassrt.ray.model_ref(m), "inputs": {"feat": "x"}, "run": "rows"}).take_all()
    sess = glassrt.InferenceSession(m)
    expected = np.concatenate([sess.run(None, {"x": x[i:i + 1]})[0] for i in range(96)])
    np.testing.assert_array_equal(np.stack([r["y"] for r in by_id(out)]), expected)
    (report,) = glassrt.ray.Predictor.stats("rows")
    assert report["row_by_row"] and report["rows"] == 96 and report["plans_built"] == 1


def _parquet(path, x, as_list=False):
    import pyarrow as pa
    import pyarrow.parquet as pq

    flat = pa.array(x.reshape(-1))
    # a fixed-size list column, as pandas/pyarrow users write feature vectors; Ray hands it
    # to the Predictor as an object array of rows, which it stacks
    column = pa.FixedSizeListArray.from_arrays(flat, x.shape[1]) if not as_list else pa.array(list(x))
    pq.write_table(pa.table({"id": np.arange(len(x)), "feat": column}), path)


@needs_ray
def test_glassrt_batch_on_a_parquet_file_of_1000_rows(local_ray, tmp_path):
    import pyarrow.parquet as pq

    x = features(1000, seed=3)
    _parquet(tmp_path / "in.parquet", x)
    onnx.save(two_output_model(), tmp_path / "m.onnx")
    res = CliRunner().invoke(main, ["batch", str(tmp_path / "m.onnx"), "--input", str(tmp_path / "in.parquet"),
                                    "--output", str(tmp_path / "out"), "--input-column", "feat=x",
                                    "--batch-size", "100", "--concurrency", "2", "--providers", "cpu"])
    assert res.exit_code == 0, res.output
    # 2 actors are started; on a busy machine Ray may hand every batch to the first one ready
    assert "1000 rows in" in res.output and "fallbacks: 0" in res.output
    assert re.search(r"on [12] actor\(s\)", res.output), res.output
    table = pq.read_table(tmp_path / "out").to_pydict()
    assert set(table) == {"id", "y", "total"}  # the fed column is left out unless --keep-inputs
    order = np.argsort(table["id"])
    assert list(np.asarray(table["id"])[order]) == list(range(1000))
    # Ray may cut batches at its block edges: compare within float32 rounding of a matmul, not bits
    y, total = glassrt.InferenceSession(two_output_model(), providers=["cpu"]).run(None, {"x": x})
    np.testing.assert_allclose(np.asarray(table["y"], np.float32)[order], y, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(table["total"], np.float32)[order], total, rtol=1e-6, atol=1e-6)


@needs_ray
def test_glassrt_batch_npy_folder_in_and_out_keeps_row_order(local_ray, tmp_path):
    x = features(300, seed=4)
    (tmp_path / "in").mkdir()
    np.save(tmp_path / "in" / "x.npy", x)
    onnx.save(falling_back_model(), tmp_path / "m.onnx")
    res = CliRunner().invoke(main, ["batch", str(tmp_path / "m.onnx"), "--input", str(tmp_path / "in"),
                                    "--output", str(tmp_path / "out"), "--format", "npy", "--batch-size", "50",
                                    "--concurrency", "2",
                                    "--providers", "cpu,reference"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "300 rows in" in res.output and "fallbacks: 0" in res.output
    np.testing.assert_allclose(np.load(tmp_path / "out" / "y.npy"), np.sin(x @ W), rtol=1e-5, atol=1e-6)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["y.npy"]


@needs_ray
def test_glassrt_batch_refuses_an_unknown_input_before_starting(local_ray, tmp_path):
    onnx.save(two_output_model(), tmp_path / "m.onnx")
    _parquet(tmp_path / "in.parquet", features(10))
    res = CliRunner().invoke(main, ["batch", str(tmp_path / "m.onnx"), "--input", str(tmp_path / "in.parquet"),
                                    "--output", str(tmp_path / "out"), "--input-column", "feat=pixels"])
    assert res.exit_code == 1 and "model input(s) ['pixels']" in res.output and "its inputs: ['x']" in res.output


# Runs with or without Ray installed: the import of ray is blocked in a fresh interpreter.
NO_RAY = textwrap.dedent("""
    import sys
    sys.modules["ray"] = None  # `import ray` now raises ImportError, as on a core install
    import glassrt, glassrt.ray
    assert "ray" not in [m for m in sys.modules if sys.modules[m] is not None], "import glassrt imported ray"
    from glassrt.cli import main
    main(["batch", sys.argv[1], "--input", "in.parquet", "--output", "out"])
""")


def test_without_ray_glassrt_batch_says_how_to_install_the_extra(tmp_path):
    onnx.save(two_output_model(), tmp_path / "m.onnx")
    res = subprocess.run([sys.executable, "-c", NO_RAY, str(tmp_path / "m.onnx")], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    assert res.returncode == 1, res.stderr
    assert "glassrt batch needs Ray" in res.stdout and "pip install 'glassrt[ray]'" in res.stdout
    with pytest.raises(glassrt.ray.RayNotInstalledError, match=r"pip install 'glassrt\[ray\]'"):
        _blocked(glassrt.ray.model_ref, b"")


def _blocked(fn, *args):
    saved = {k: v for k, v in sys.modules.items() if k == "ray" or k.startswith("ray.")}
    for k in saved:
        del sys.modules[k]
    sys.modules["ray"] = None
    try:
        return fn(*args)
    finally:
        del sys.modules["ray"]
        sys.modules.update(saved)
