"""`glassrt bench` and the benchmark suite's model builders (glassrt/tools/bench*.py)."""
from __future__ import annotations

import collections
import json
import os
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import helper

import glassrt
from glassrt.cli import main
from glassrt.tools import bench
from glassrt.tools import bench_models as bm
from tests.helpers import init, model, tensor


def _bench(*args):
    """The CLI's console was made when glassrt.cli was imported, at whatever width this
    process had then (xdist workers have none): set the width the tables need here."""
    from glassrt import cli

    width = cli.console.width
    cli.console.width = 250
    try:
        return CliRunner().invoke(main, ["bench", *args], env={"COLUMNS": "250"})
    finally:
        cli.console.width = width


def _tiny_model():
    """y = relu(x @ w + b), z = sum(y): two outputs, a symbolic batch."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["pre"]),
             helper.make_node("Relu", ["pre"], ["y"]), helper.make_node("ReduceSum", ["y"], ["z"], keepdims=0)]
    return model(nodes, [tensor("x", ["batch", 16])], [tensor("y", ["batch", 8]), tensor("z", [])],
                 [init("w", rng.standard_normal((16, 8)).astype(np.float32)), init("b", np.zeros(8, np.float32))])


def _alive(pid: int) -> bool:
    """Whether pid is still one of bench's busy processes (a reused pid runs something else)."""
    try:
        return bench.BUSY_MARK.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def test_bench_against_onnxruntime_writes_every_measure(tmp_path):
    path = tmp_path / "tiny.onnx"
    onnx.save(_tiny_model(), path)
    out = tmp_path / "bench.json"
    res = _bench(str(path), "--vs", "onnxruntime", "--runs", "3", "--warmup", "1", "--dim", "batch=4",
                 "--busy", "1", "--json", str(out))
    assert res.exit_code == 0, res.output
    assert "tiny.onnx batch=4" in res.output and "1 busy process" in res.output and "agree" in res.output
    report = json.loads(out.read_text())
    (m,) = report["models"]
    assert m["error"] is None and m["inputs"] == {"x": {"shape": [4, 16], "dtype": "float32"}}
    assert set(m["runtimes"]) == {"glassrt", "onnxruntime"}
    for rt, r in m["runtimes"].items():
        assert len(r["latencies_ms"]) == 3 and 0 < r["median_ms"] <= r["p90_ms"], rt
        assert r["create_s"] > 0 and r["create_and_first_run_s"] >= r["create_s"]
        assert r["peak_rss_bytes"] > 10 * 2**20 and r["blas"] and isinstance(r["threadpools"], list)
        # the other worker's CPU time during each of this runtime's turns (Linux): a turn of 3 runs
        if sys.platform.startswith("linux"):
            assert len(r["others_cpu_s_per_turn"]) == 1 and r["others_cpu_s_per_turn"][0] >= 0, rt
    assert any(p["user_api"] == "blas" for p in m["runtimes"]["glassrt"]["threadpools"])
    # which thread count glassrt's plan ended on, and what each count ran in lately
    (choice,) = m["runtimes"]["glassrt"]["thread_choice"]
    assert choice["now"] in (1, 2) and choice["runs"] >= 3 and m["runtimes"]["onnxruntime"]["thread_choice"] == []
    medians = {rt: r["median_ms"] for rt, r in m["runtimes"].items()}
    assert m["ratio"] == pytest.approx(medians["glassrt"] / medians["onnxruntime"])
    agreement = m["agreement"]
    assert agreement["agree"] and [o["name"] for o in agreement["outputs"]] == ["y", "z"]
    assert all(o["max_abs"] < 1e-4 and o["max_rel"] < 1e-5 for o in agreement["outputs"])
    env = report["environment"]
    assert env["cpu_count"] >= 1 and env["packages"]["onnxruntime"] and "openblas_coretype" in env
    assert report["settings"]["busy"] == 1 and len(m["busy_pids"]) == 1
    assert not _alive(m["busy_pids"][0])  # stopped once the timed runs were over


def test_creation_is_the_median_of_the_starts_asked_for(tmp_path):
    """--starts N: N fresh processes per runtime time the session's creation and first run
    (the timed runs' worker and N - 1 more, one at a time); the report gives each start's
    sum and the medians."""
    onnx.save(_tiny_model(), tmp_path / "tiny.onnx")
    out = tmp_path / "starts.json"
    res = _bench(str(tmp_path / "tiny.onnx"), "--vs", "onnxruntime", "--runs", "2", "--warmup", "0",
                 "--dim", "batch=2", "--starts", "3", "--json", str(out))
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert report["settings"]["starts"] == 3
    for rt, r in report["models"][0]["runtimes"].items():
        every = r["create_and_first_run_all_s"]
        assert len(every) == 3 and all(s > 0 for s in every), rt
        assert r["create_and_first_run_s"] == pytest.approx(sorted(every)[1])
    assert _bench(str(tmp_path / "tiny.onnx"), "--starts", "0").exit_code == 2


def test_busy_processes_run_inside_the_block_only():
    with bench.busy_processes(2) as pids:
        assert len(pids) == 2 and all(_alive(p) for p in pids)
    assert not any(_alive(p) for p in pids)


def test_glassrt_alone_has_no_ratio(tmp_path):
    onnx.save(_tiny_model(), tmp_path / "tiny.onnx")
    out = tmp_path / "alone.json"
    res = _bench(str(tmp_path / "tiny.onnx"), "--runs", "2", "--warmup", "0", "--dim", "batch=2", "--json", str(out))
    assert res.exit_code == 0, res.output
    (m,) = json.loads(out.read_text())["models"]
    assert list(m["runtimes"]) == ["glassrt"] and m["ratio"] is None and m["agreement"] is None
    assert m["error"] is None and len(m["runtimes"]["glassrt"]["latencies_ms"]) == 2


def test_a_session_error_is_reported_per_model(tmp_path):
    """A model onnx parses but a runtime refuses: its row says why in one line, the other
    models are still measured, and the exit status is 1. (onnxruntime alone: its worker
    starts in a fraction of glassrt's time; glassrt's errors take the same path.)"""
    import io

    from rich.console import Console

    onnx.save(_tiny_model(), tmp_path / "tiny.onnx")
    bad = model([helper.make_node("NoSuchOp", ["x"], ["y"])], [tensor("x", [2])], [tensor("y", [2])])
    onnx.save(bad, tmp_path / "bad.onnx")
    out = io.StringIO()
    settings = bench.Settings(runtimes=("onnxruntime",), runs=1, warmup=0, settle_s=0.0)
    code = bench.run_command([str(tmp_path / "bad.onnx"), str(tmp_path / "tiny.onnx")], {"batch": 1}, settings,
                             str(tmp_path / "r.json"), Console(file=out, width=250))
    refused, tiny = json.loads((tmp_path / "r.json").read_text())["models"]
    assert code == 1 and "NoSuchOp" in out.getvalue()
    assert refused["error"].startswith("onnxruntime: ") and "NoSuchOp" in refused["error"]
    assert "\n" not in refused["error"]
    assert tiny["error"] is None and tiny["runtimes"]["onnxruntime"]["runs"] == 1


def test_errors_are_one_line_without_a_traceback(tmp_path, monkeypatch):
    res = _bench(str(tmp_path / "missing.onnx"))
    assert res.exit_code == 1 and res.output.startswith("error: no model file") and res.output.count("\n") == 1
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x00\x01not a model")
    res = _bench(str(garbage))
    assert res.exit_code == 1 and "cannot read model" in res.output and "Traceback" not in res.output
    onnx.save(_tiny_model(), tmp_path / "tiny.onnx")
    res = _bench(str(tmp_path / "tiny.onnx"))
    assert res.exit_code == 1 and "--dim batch=N" in res.output
    real_find_spec = bench.importlib.util.find_spec
    monkeypatch.setattr(bench.importlib.util, "find_spec",
                        lambda name, *a: None if name == "onnxruntime" else real_find_spec(name, *a))
    res = _bench(str(tmp_path / "tiny.onnx"), "--vs", "onnxruntime", "--dim", "batch=1")
    assert res.exit_code == 1 and "onnxruntime is not installed" in res.output


def test_agreement_marks_outputs_that_differ():
    ref = np.array([1.0, 2.0, 4.0], np.float32)
    close = bench.agreement(["a"], [ref + 1e-5], [ref])
    far = bench.agreement(["a"], [ref * 1.01], [ref])
    assert close["agree"] and not far["agree"]
    assert far["outputs"][0]["max_abs"] == pytest.approx(0.04, rel=1e-4)
    assert far["outputs"][0]["max_rel"] == pytest.approx(0.01, rel=1e-4)
    assert not bench.agreement(["a"], [ref[:2]], [ref])["agree"]  # shapes differ


# ---------------------------------------------------------------- the suite's builders


def _same_outputs(proto, feeds, rtol=1e-4, atol=1e-5):
    onnx.checker.check_model(proto, full_check=True)
    data = proto.SerializeToString()
    ours = glassrt.InferenceSession(data, providers=["cpu"], fallback="error").run(None, feeds)
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    return ours


def test_light_model_batch_rewrite():
    proto = bm.light("shufflenet", batch=2)  # its channel shuffles reshape to 5-D with the batch in front
    targets = [onnx.numpy_helper.to_array(t) for t in proto.graph.initializer if t.name in
               {n.input[1] for n in proto.graph.node if n.op_type == "Reshape"}]
    assert targets and all(t[0] == 2 for t in targets)
    x = np.random.default_rng(0).random((2, 3, 224, 224), dtype=np.float32)
    (y,) = _same_outputs(proto, {"gpu_0/data_0": x})
    assert y.shape == (2, 1000)


def test_mobilenet_builder():
    proto = bm.mobilenet(width=0.35, resolution=64, classes=10)
    ops = collections.Counter(n.op_type for n in proto.graph.node)
    # 17 inverted residual blocks: 52 convolutions (17 depthwise), 35 ReLU6, 10 residual adds
    assert ops["Conv"] == 52 and ops["Clip"] == 35 and ops["Add"] == 10
    assert sum(1 for n in proto.graph.node if any(a.name == "group" and a.i > 1 for a in n.attribute)) == 17
    x = np.random.default_rng(0).random((2, 3, 64, 64), dtype=np.float32)
    (y,) = _same_outputs(proto, {"input": x})
    assert y.shape == (2, 10)
    full = sum(int(np.prod(t.dims)) for t in bm.mobilenet().graph.initializer)
    assert 3.4e6 < full < 3.6e6


# Node counts of torch.onnx.export (torch 2.13, TorchScript exporter, opset 17) of a
# transformers-free copy of Hugging Face's eager BertModel / GPT2LMHeadModel (nn.Linear for
# Conv1D), 2 layers, hidden 64, 4 heads, random parameters. The builders match these node
# for node (same op sequence); with equal weights their outputs equal the exports' exactly.
TORCH_BERT_2_LAYERS = {"Add": 22, "Cast": 1, "Concat": 8, "Constant": 64, "Div": 4, "Erf": 2, "Gather": 21,
                       "Gemm": 1, "LayerNormalization": 5, "MatMul": 16, "Mul": 5, "Reshape": 8, "Shape": 17,
                       "Slice": 1, "Softmax": 2, "Sub": 1, "Tanh": 1, "Transpose": 8, "Unsqueeze": 19}
TORCH_GPT2_2_LAYERS = {"Add": 20, "Cast": 4, "Concat": 12, "Constant": 115, "ConstantOfShape": 2, "Div": 2,
                       "Gather": 18, "LayerNormalization": 5, "MatMul": 13, "Mul": 8, "Pow": 4, "Range": 1,
                       "Reshape": 8, "Shape": 24, "Slice": 12, "Softmax": 2, "Split": 2, "Squeeze": 8, "Sub": 2,
                       "Tanh": 2, "Transpose": 10, "Unsqueeze": 23, "Where": 2}


def test_bert_builder_matches_the_exporter_and_onnxruntime():
    proto = bm.bert(layers=2, hidden=64, heads=4, intermediate=128, vocab=100, max_positions=32)
    assert collections.Counter(n.op_type for n in proto.graph.node) == TORCH_BERT_2_LAYERS
    for batch, seq in ((1, 16), (3, 9)):  # one model, symbolic batch and sequence
        last, pooled = _same_outputs(proto, bm.bert_feeds(batch, seq, vocab=100, seed=batch))
        assert last.shape == (batch, seq, 64) and pooled.shape == (batch, 64)


def test_gpt2_builder_decodes_like_onnxruntime():
    proto = bm.gpt2(layers=2, hidden=64, heads=4, vocab=100, max_positions=32)
    assert collections.Counter(n.op_type for n in proto.graph.node) == TORCH_GPT2_2_LAYERS
    prompt = bm.gpt2_feeds(2, 0, layers=2, heads=4, head_dim=16, vocab=100, sequence=5)  # empty past
    outs = _same_outputs(proto, prompt)
    assert outs[0].shape == (2, 5, 100) and outs[1].shape == (2, 4, 5, 16)
    step = bm.gpt2_feeds(2, 5, layers=2, heads=4, head_dim=16, vocab=100)
    step.update({f"past_key_values.{i // 2}.{('key', 'value')[i % 2]}": v for i, v in enumerate(outs[1:])})
    outs = _same_outputs(proto, step)
    assert outs[0].shape == (2, 1, 100) and outs[1].shape == (2, 4, 6, 16)


def test_decoding_loop_produces_the_same_tokens(tmp_path):
    path = tmp_path / "gpt2.onnx"
    onnx.save(bm.gpt2(layers=1, hidden=32, heads=2, vocab=50, max_positions=32), path)
    feeds = bm.gpt2_feeds(1, 0, layers=1, heads=2, head_dim=16, vocab=50, sequence=4)
    case = bench.Case("tiny gpt2", str(path), feeds)
    settings = bench.Settings(runtimes=bench.RUNTIMES, warmup=0, settle_s=0.0)
    cache = {"present.0.key": "past_key_values.0.key", "present.0.value": "past_key_values.0.value"}
    r = bench.bench_generation(case, settings, new_tokens=6, cache=cache, rounds=1)
    assert r["error"] is None and r["same_tokens"]
    for x in r["runtimes"].values():
        assert len(x["tokens"][0]) == 6 and len(x["latencies_ms"]) == 5 and x["tokens_per_s"] > 0
        assert x["cold_median_ms"] is None  # no warm-up round asked for
    # with warm-up: one untimed round each first, reported apart; the timed rounds as many
    r = bench.bench_generation(case, bench.Settings(runtimes=bench.RUNTIMES, warmup=1, settle_s=0.0),
                               new_tokens=6, cache=cache, rounds=1)
    assert r["error"] is None and r["same_tokens"]
    for x in r["runtimes"].values():
        assert len(x["latencies_ms"]) == 5 and x["cold_median_ms"] > 0
    # creation + first run over two starts per runtime
    r = bench.bench_generation(case, bench.Settings(runtimes=bench.RUNTIMES, warmup=0, settle_s=0.0, starts=2),
                               new_tokens=3, cache=cache, rounds=1)
    assert r["error"] is None and all(len(x["create_and_first_run_all_s"]) == 2 for x in r["runtimes"].values())


def test_builtin_names_resolve(tmp_path):
    case = bench.resolve("light:squeezenet", {"batch": 2}, str(tmp_path))
    assert case.label == "light:squeezenet batch=2" and case.feeds["data_0"].shape == (2, 3, 224, 224)
    assert os.path.exists(case.path)
    assert bm.lookup("bert") is bm.SUITE["bert-base"] and bm.lookup("resnet50") is bm.SUITE["light:resnet50"]
    assert bm.lookup("nothing.onnx") is None


def test_suite_tables_give_an_error_row_as_many_cells_as_the_header():
    import importlib.util
    from pathlib import Path

    import sys

    spec = importlib.util.spec_from_file_location("benchmark_suite", Path(__file__).parents[1] / "benchmarks" / "suite.py")
    suite = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = suite  # (its dataclasses look their module up)
    spec.loader.exec_module(suite)
    failed = {"model": "m", "error": "boom", "runtimes": {}, "ratio": None}
    for table in (suite.latency_table, suite.decode_table):
        header, rule, row = table([failed])
        assert header.count("|") == rule.count("|") == row.count("|"), table.__name__


def test_inputs_from_files_replace_the_made_up_ones(tmp_path):
    """--input NAME=FILE.npy feeds the model that array (its shape then needs no --dim);
    a name the model lacks, or another element type, is a one-line error."""
    onnx.save(_tiny_model(), tmp_path / "tiny.onnx")
    x = np.linspace(-1, 1, 3 * 16, dtype=np.float32).reshape(3, 16)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "given.json"
    res = _bench(str(tmp_path / "tiny.onnx"), "--runs", "1", "--warmup", "0", "--input", f"x={tmp_path / 'x.npy'}",
                 "--json", str(out))
    assert res.exit_code == 0, res.output
    (m,) = json.loads(out.read_text())["models"]
    assert m["inputs"] == {"x": {"shape": [3, 16], "dtype": "float32"}}
    np.save(tmp_path / "wrong.npy", x.astype(np.float64))
    res = _bench(str(tmp_path / "tiny.onnx"), "--input", f"x={tmp_path / 'wrong.npy'}")
    assert res.exit_code == 1 and "holds float64, the model declares float32" in res.output
    res = _bench(str(tmp_path / "tiny.onnx"), "--dim", "batch=1", "--input", f"nope={tmp_path / 'x.npy'}")
    assert res.exit_code == 1 and "no such input" in res.output and res.output.count("\n") == 1
