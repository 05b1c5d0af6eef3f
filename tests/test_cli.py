"""The glassrt command line."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx

from tests.helpers import add_model, transformer_encoder


def _cli(*args, timeout=300):
    env = {**os.environ, "COLUMNS": "200"}  # wide enough that table cells do not wrap
    return subprocess.run([sys.executable, "-m", "glassrt.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_run_default_model_checks_the_shipped_output():
    res = _cli("run", "--runs", "1")
    assert res.returncode == 0, res.stderr
    assert "light_resnet50.onnx" in res.stdout and "match" in res.stdout and "fallbacks: 0" in res.stdout


def test_threads_option_on_run_profile_and_compare(tmp_path):
    p = tmp_path / "add.onnx"
    onnx.save(add_model(), p)
    res = _cli("run", str(p), "--runs", "1", "--threads", "1", "--dim", "batch=2")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "(1 thread(s) requested)" in " ".join(res.stdout.split())
    for cmd in (["profile", str(p), "--runs", "2"], ["compare", str(p)]):
        res = _cli(*cmd, "--threads", "1", "--dim", "batch=2")
        assert res.returncode == 0, res.stdout + res.stderr


def test_run_with_inputs_dims_save_and_strict(tmp_path):
    p = tmp_path / "enc.onnx"
    onnx.save(transformer_encoder(), p)
    res = _cli("run", str(p), "--dim", "batch=2", "--dim", "seq=5", "--save", str(tmp_path / "out"), "--strict",
               "--runs", "2")
    assert res.returncode == 0, res.stdout + res.stderr
    y = np.load(tmp_path / "out" / "y.npy")
    assert y.shape == (2, 5, 64) and "cpu=" in res.stdout
    x = np.ones((3, 7, 64), np.float32)
    np.save(tmp_path / "x.npy", x)
    res = _cli("run", str(p), "--input", f"x={tmp_path / 'x.npy'}", "--runs", "1")
    assert res.returncode == 0 and "[3, 7, 64]" in res.stdout


def test_run_nan_handling(tmp_path):
    """A NaN input on a Conv + Relu: kept (the run says it took the exact plan), or, with
    --nan-handling fast on oneDNN, lost as its relu loses it."""
    from onnx import TensorProto, helper

    w = onnx.numpy_helper.from_array(np.array([1, -1], np.float32).reshape(1, 2, 1, 1), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 2, 2])], [w])
    p = tmp_path / "conv.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), p)
    x = np.ones((1, 2, 2, 2), np.float32)
    x[0, 0, 0, 0] = np.nan
    np.save(tmp_path / "x.npy", x)
    args = ("run", str(p), "--input", f"x={tmp_path / 'x.npy'}", "--runs", "1", "--save", str(tmp_path / "out"))
    res = _cli(*args)
    assert res.returncode == 0, res.stdout + res.stderr
    assert np.isnan(np.load(tmp_path / "out" / "y.npy")[0, 0, 0, 0])
    if "onednn=" in res.stdout:
        assert "took the plan of kernels that keep them" in " ".join(res.stdout.split())
    res = _cli(*args, "--nan-handling", "sometimes")
    assert res.returncode == 2 and "sometimes" in res.stderr


def test_run_reports_errors_without_a_traceback(tmp_path):
    res = _cli("run", str(tmp_path / "missing.onnx"))
    assert res.returncode == 1 and "error:" in res.stdout and "Traceback" not in res.stderr
    p = tmp_path / "add.onnx"
    onnx.save(add_model(), p)
    res = _cli("run", str(p))
    assert res.returncode == 1 and "--dim batch=N" in res.stdout


def test_explain_json_and_symbolic_dims(tmp_path):
    p = tmp_path / "enc.onnx"
    onnx.save(transformer_encoder(), p)
    res = _cli("explain", str(p), "--json", str(tmp_path / "e.json"))
    assert res.returncode == 0, res.stderr
    report = json.loads((tmp_path / "e.json").read_text())
    assert report["summary"]["arena_bytes"] is None and "--dim batch=N" in res.stdout
    assert "float[batch,seq,64]" in res.stdout.replace(" ", "")  # printed as text, not taken for markup
    res = _cli("explain", str(p), "--dim", "batch=64", "--dim", "seq=32", "--json", str(tmp_path / "b.json"))
    summary = json.loads((tmp_path / "b.json").read_text())["summary"]
    assert summary["arena_bytes"] > 0 and "arena" in res.stdout and "lower bound" in res.stdout


def test_profile_writes_a_trace(tmp_path):
    res = _cli("profile", "--runs", "2", "--top", "3", "--trace", str(tmp_path / "t.json"))
    assert res.returncode == 0, res.stderr
    events = json.loads((tmp_path / "t.json").read_text())
    assert any(e["cat"] == "Node" for e in events) and "per op type" in res.stdout


def _two_inputs(x_shape=("batch", "seq"), m_shape=("batch", "seq")):
    from onnx import helper

    from tests.helpers import model, tensor

    return model([helper.make_node("Add", ["x", "m"], ["y"], name="add")],
                 [tensor("x", list(x_shape)), tensor("m", list(m_shape))], [tensor("y", ["batch", "seq"])])


def test_made_up_inputs_unbound_dims_in_one_error_and_given_inputs_bind_dims():
    import pytest

    import glassrt
    from glassrt.tools import inputs

    sess = glassrt.InferenceSession(_two_inputs())
    with pytest.raises(glassrt.GlassrtError) as e:
        inputs.generate(sess, {})
    msg = str(e.value)  # both dims, both inputs, in one message
    assert "'batch' (inputs x, m)" in msg and "'seq' (inputs x, m)" in msg and "--dim batch=N --dim seq=N" in msg
    # x supplied: its shape binds batch and seq, so m is made to match
    feeds, notes = inputs.generate(sess, {}, {"x": np.ones((3, 4), np.float32)})
    assert list(feeds) == ["m"] and feeds["m"].shape == (3, 4) and notes == []
    # x supplied but m needs a dim x does not carry: only m is blamed
    sess = glassrt.InferenceSession(_two_inputs(("batch",), ("batch", "seq")))
    with pytest.raises(glassrt.GlassrtError) as e:
        inputs.generate(sess, {}, {"x": np.ones((3,), np.float32)})
    assert "'seq' (input m)" in str(e.value) and "x" not in str(e.value).split("bind")[0]
    with pytest.raises(glassrt.GlassrtError, match="--dim batch=2, but --input x has batch=3"):
        inputs.generate(sess, {"batch": 2, "seq": 1}, {"x": np.ones((3,), np.float32)})


def test_made_up_indices_stay_inside_the_table_they_gather_from(tmp_path):
    """BERT's token_type_ids index a 2-row table: made-up indices in [0, 10) failed the run."""
    from onnx import TensorProto, helper

    import glassrt
    from glassrt.tools import inputs
    from tests.helpers import init, model, tensor

    nodes = [helper.make_node("Gather", ["types", "tt"], ["e"], name="g"),
             helper.make_node("Gather", ["words", "ids"], ["w"], name="gw"), helper.make_node("Add", ["e", "w"], ["y"])]
    m = model(nodes, [tensor("tt", ["batch", "seq"], TensorProto.INT64), tensor("ids", ["batch", "seq"], TensorProto.INT64)],
              [tensor("y", None)], [init("types", np.ones((2, 4), np.float32)), init("words", np.ones((50, 4), np.float32))])
    sess = glassrt.InferenceSession(m.SerializeToString())
    feeds, notes = inputs.generate(sess, {"batch": 3, "seq": 40})
    assert feeds["tt"].min() >= 0 and feeds["tt"].max() <= 1 and feeds["tt"].max() == 1
    assert feeds["ids"].max() > 1  # a table of 50: the usual [0, 10)
    assert notes == ["input 'tt' indexes a table of 2 along the gathered axis: values in [0, 1]"]
    sess.run(None, feeds)
    path = tmp_path / "emb.onnx"
    path.write_bytes(m.SerializeToString())
    r = _cli("profile", str(path), "--dim", "batch=2", "--dim", "seq=8", "--runs", "2")
    assert r.returncode == 0, r.stderr


def test_unnamed_dim_defaults_to_one_with_a_note_and_misspelt_dims_are_refused():
    import pytest

    import glassrt
    from glassrt.tools import inputs

    sess = glassrt.InferenceSession(_two_inputs(("batch", None), ("batch", "seq")))
    feeds, notes = inputs.generate(sess, {"batch": 2, "seq": 3})
    assert feeds["x"].shape == (2, 1) and feeds["m"].shape == (2, 3)
    assert notes == ["input 'x' dim 1 has no name in the model: made it 1"]
    with pytest.raises(glassrt.GlassrtError, match="--dim btach: the model has no dim of that name; "
                                                   "its inputs' dims are: batch, seq"):
        inputs.generate(sess, {"btach": 2, "seq": 3})
    assert inputs.describe("x", np.array([[0.5, 2.0]], np.float32)) == "input 'x': float[1, 2], values in [0.5, 2]"


def test_cli_prints_made_up_inputs_and_refuses_a_misspelt_dim(tmp_path):
    p = tmp_path / "two.onnx"
    onnx.save(_two_inputs(), p)
    np.save(tmp_path / "x.npy", np.ones((3, 4), np.float32))
    res = _cli("run", str(p), "--runs", "1", "--input", f"x={tmp_path / 'x.npy'}")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "made up input 'm': float[3, 4], values in [" in res.stdout and "made up input 'x'" not in res.stdout
    res = _cli("run", str(p), "--runs", "1")
    assert res.returncode == 1 and res.stdout.count("error:") == 1 and "--dim batch=N --dim seq=N" in res.stdout
    for cmd in ("run", "explain"):
        res = _cli(cmd, str(p), "--dim", "btach=2")
        assert res.returncode == 1 and "its inputs' dims are: batch, seq" in res.stdout, res.stdout


def test_check_output_holds_no_numpy_warnings():
    # Acosh and Pow's ONNX samples hold values outside their domain: NaN is the expected answer
    for op in ("Acosh", "Pow"):
        res = _cli("check", "--op", op)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "RuntimeWarning" not in res.stdout + res.stderr, res.stderr


def _cli_on_a_terminal(*args, timeout=300) -> str:
    """Run the CLI with its stdout on a pseudo-terminal, as a user at a shell sees it."""
    import pty
    import select

    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE")}
    proc = subprocess.Popen([sys.executable, "-m", "glassrt.cli", *args], stdout=slave, stderr=slave,
                            env={**env, "COLUMNS": "120", "TERM": "xterm"})
    os.close(slave)
    out = b""
    while True:
        ready, _, _ = select.select([master], [], [], timeout)
        if not ready:
            proc.kill()
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    proc.wait(timeout=timeout)
    os.close(master)
    return out.decode("utf-8", "replace")


def test_progress_bars_on_a_terminal_and_nothing_extra_when_piped(tmp_path):
    p = tmp_path / "enc.onnx"
    onnx.save(transformer_encoder(), p)
    args = ("profile", str(p), "--runs", "2", "--top", "1", "--dim", "batch=1", "--dim", "seq=4")
    shown = _cli_on_a_terminal(*args)
    assert "creating the session for enc.onnx" in shown and "profiling" in shown and "per op type" in shown
    assert "checking operator contracts" in _cli_on_a_terminal("check", "--op", "Relu")
    piped = _cli(*args)
    assert piped.returncode == 0 and "creating the session" not in piped.stdout and "profiling" not in piped.stdout
    assert not piped.stdout.startswith("\n") and "\n\n" not in piped.stdout and "\x1b" not in piped.stdout


def test_input_that_is_not_npy_is_named_without_a_pickle_hint(tmp_path):
    import pytest

    import glassrt
    from glassrt.tools.inputs import load_npy

    text = tmp_path / "x.txt"
    text.write_text("1 2 3\n")
    objects = tmp_path / "obj.npy"
    np.save(objects, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    archive = tmp_path / "a.npz"
    np.savez(archive, x=np.ones(3))
    for path, says in ((text, "is not a .npy file"), (objects, "holds Python objects"), (archive, "is a .npz archive")):
        with pytest.raises(glassrt.GlassrtError) as e:
            load_npy("x", str(path))
        msg = str(e.value)
        assert f"'{path}' {says}" in msg and "expected a .npy file as numpy.save writes it" in msg
        assert "allow_pickle" not in msg and "pickled data" not in msg
    good = tmp_path / "x.npy"
    np.save(good, np.arange(3.0))
    assert load_npy("x", str(good)).tolist() == [0.0, 1.0, 2.0]
    p = tmp_path / "add.onnx"
    onnx.save(add_model(), p)
    res = _cli("run", str(p), "--input", f"x={text}")
    out = " ".join(res.stdout.split())  # long temporary paths may wrap
    assert res.returncode == 1 and "is not a .npy file" in out and "allow_pickle" not in out


def _long_names_model():
    """Relu chain with exporter-style node names (44+ characters) and an op no provider has."""
    from onnx import helper

    from tests.helpers import model, tensor

    names = [f"/encoder/layer.{i}/attention/self/query/Relu_{i}" for i in range(3)]
    nodes = [helper.make_node("Relu", ["x"], ["a"], name=names[0]),
             helper.make_node("Frobnicate", ["a"], ["b"], name="mystery", domain="acme"),
             helper.make_node("Relu", ["b"], ["c"], name=names[1]),
             helper.make_node("Relu", ["c"], ["y"], name=names[2])]
    return model(nodes, [tensor("x", ["batch", 4])], [tensor("y", ["batch", 4])], domains={"acme": 1}), names


def test_explain_at_80_columns_keeps_node_names_whole_and_json_reasons_whole(tmp_path):
    from onnx import helper

    from tests.helpers import model, tensor

    names = [f"/encoder/layer.{i}/attention/self/query/Relu_{i}" for i in range(3)]
    m = model([helper.make_node("Relu", [a], [b], name=n) for a, b, n in zip(["x", "a", "b"], ["a", "b", "y"], names)],
              [tensor("x", ["batch", 4])], [tensor("y", ["batch", 4])])
    p = tmp_path / "long.onnx"
    onnx.save(m, p)
    for dims in ([], ["--dim", "batch=2"]):
        res = subprocess.run([sys.executable, "-m", "glassrt.cli", "explain", str(p), *dims, "--json",
                              str(tmp_path / "e.json")], capture_output=True, text=True, timeout=300,
                             env={**os.environ, "COLUMNS": "80"})  # as piped into a file or less
        assert res.returncode == 0, res.stdout + res.stderr
        lines = res.stdout.splitlines()
        assert max(len(line) for line in lines) <= 80
        for name in names:
            assert any(name in line for line in lines), (name, res.stdout)
        report = json.loads((tmp_path / "e.json").read_text())
        reason = report["nodes"][0]["reason"]
        assert len(reason) > 70 and not reason.endswith("…")  # the table's --width cut is not the JSON's
        assert reason in " ".join(res.stdout.split())  # and the text shows it whole, below the table
    wide = _cli("explain", str(p))  # 200 columns: a reason column again
    assert "reason" in wide.stdout.split("\n")[2] and "why each node runs where" not in wide.stdout


def test_explain_marks_a_node_no_provider_runs_and_explains_the_rest(tmp_path):
    import pytest

    import glassrt

    m, names = _long_names_model()
    with pytest.raises(glassrt.UnsupportedOperatorError) as created:
        glassrt.InferenceSession(m)  # running sessions still refuse at creation
    sess = glassrt.InferenceSession(m, unsupported="mark")
    with pytest.raises(glassrt.UnsupportedOperatorError) as ran:
        sess.run(None, {"x": np.ones((1, 4), np.float32)})
    assert str(ran.value) == str(created.value)
    report = sess.explain({"batch": 1})
    by_name = {n["name"]: n for n in report["nodes"]}
    assert by_name["mystery"]["provider"] is None and by_name["mystery"]["unsupported"]
    assert "no provider can run it: no such operator" in by_name["mystery"]["reason"]
    assert all(by_name[n]["provider"] == "cpu" and not by_name[n]["unsupported"] for n in names)
    s = report["summary"]
    assert [u["node"] for u in s["unsupported"]] == ["mystery"] and s["arena_bytes"] is None
    assert s["nodes_per_provider"] == {"cpu": 3, "unsupported": 1}
    p = tmp_path / "unsup.onnx"
    onnx.save(m, p)
    res = _cli("explain", str(p))
    out = " ".join(res.stdout.split())
    assert res.returncode == 0, res.stdout + res.stderr
    assert "unsupported: Frobnicate node 'mystery': no provider can run it" in out and names[2] in out
    assert _cli("run", str(p), "--dim", "batch=1").returncode == 1  # run still refuses it


def test_unsupported_node_inside_a_branch_is_marked_too():
    import pytest
    from onnx import TensorProto, helper

    import glassrt
    from tests.helpers import model, tensor

    then = helper.make_graph([helper.make_node("Frobnicate", ["x"], ["t"], name="deep_mystery", domain="acme")],
                             "then", [], [tensor("t", ["batch", 4])])
    other = helper.make_graph([helper.make_node("Relu", ["x"], ["e"], name="r")], "else", [], [tensor("e", ["batch", 4])])
    m = model([helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then, else_branch=other)],
              [tensor("x", ["batch", 4]), tensor("c", [], TensorProto.BOOL)], [tensor("y", ["batch", 4])],
              domains={"acme": 1})
    sess = glassrt.InferenceSession(m, unsupported="mark")
    s = sess.explain()["summary"]
    assert [u["node"] for u in s["unsupported"]] == ["deep_mystery"] and s["nodes_per_provider"]["unsupported"] == 1
    with pytest.raises(glassrt.UnsupportedOperatorError, match="deep_mystery"):
        sess.run(None, {"x": np.ones((1, 4), np.float32), "c": np.array(False)})


def test_explain_shows_the_nodes_of_if_bodies_under_their_parent(tmp_path):
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((8, 4), np.float32), "W")
    then = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["t"], name="mm_then")], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Relu", ["x"], ["e0"], name="relu_else"),
                               helper.make_node("MatMul", ["e0", "W"], ["e"], name="mm_else")], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    g = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if")],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8]),
                                helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    p = tmp_path / "if.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), p)
    out = tmp_path / "e.json"
    res = _cli("explain", str(p), "--json", str(out))
    assert res.returncode == 0, res.stderr
    report = json.loads(out.read_text())
    rows = {n["name"]: n for n in report["nodes"]}
    assert report["summary"]["nodes"] == 1 and report["summary"]["body_nodes"] == 3
    assert rows["mm_then"]["parent"] == "if" and rows["mm_then"]["body"] == "then_branch" and rows["mm_then"]["depth"] == 1
    assert rows["mm_then"]["flops_per_body_run"] == 2 * 2 * 8 * 4 and rows["mm_then"]["output_bytes"] == 32
    assert rows["relu_else"]["provider"] in ("cpu", "onednn") and rows["relu_else"]["reason"]
    assert "└ then_branch: mm_then" in res.stdout and "└ else_branch: relu_else" in res.stdout
