"""Weights in external data are mapped from their file, read-only, instead of copied; the
side file `glassrt optimize --external-data` writes is aligned so that they can be; the
external-data path checks still refuse what they refused."""
from __future__ import annotations

import io
import os
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from rich.console import Console

import glassrt
from glassrt import weights
from glassrt.export import ALIGN, OptimizeError, write_model
from glassrt.onnx_io import load
from glassrt.tools import optimize as tool
from glassrt.tools.explain import explain, fmt_bytes, render
from tests.helpers import init, model, smaps_kib, tensor

RNG = np.random.default_rng(0)


def _mlp():
    """MatMul + bias + Relu + MatMul, and an int64 Gather table (two dtypes, one tiny bias)."""
    rng = np.random.default_rng(1)  # the same weights on every call
    w1 = rng.standard_normal((16, 32)).astype(np.float32)
    w2 = rng.standard_normal((32, 8)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["table", "idx"], ["g"]), helper.make_node("Cast", ["g"], ["gf"], to=1),
             helper.make_node("Add", ["x", "gf"], ["xg"]), helper.make_node("MatMul", ["xg", "w1"], ["h"]),
             helper.make_node("Add", ["h", "b1"], ["hb"]), helper.make_node("Relu", ["hb"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    return model(nodes, [tensor("x", ["n", 16]), tensor("idx", ["n"], TensorProto.INT64)], [tensor("y", ["n", 8])],
                 [init("w1", w1), init("w2", w2), init("b1", np.full(32, 0.1, np.float32)),
                  init("table", rng.integers(-3, 3, (10, 16)).astype(np.int64))], opset=17)


FEEDS = {"x": RNG.standard_normal((4, 16)).astype(np.float32), "idx": np.array([0, 3, 9, 3], np.int64)}


def _ort(path):
    return ort.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"]).run(None, FEEDS)[0]


@pytest.fixture
def written(tmp_path):
    src = tmp_path / "mlp.onnx"
    onnx.save(_mlp(), src)
    out = tmp_path / "mlp.opt.onnx"
    report = tool.optimize(src, out, level="none", external_data=True, size_threshold=256)
    return src, out, report


def test_external_data_is_aligned_and_mapped_read_only(written):
    src, out, report = written
    data = out.parent / "mlp.opt.onnx.data"
    assert report.written.data_path == os.fspath(data) and report.written.external_tensors == 3  # not the bias
    saved = onnx.load(out, load_external_data=False)
    onnx.checker.check_model(out, full_check=True)
    external = {t.name: {e.key: e.value for e in t.external_data} for t in saved.graph.initializer
                if t.data_location == TensorProto.EXTERNAL}
    assert set(external) == {"w1", "w2", "table"}
    assert all(int(e["offset"]) % ALIGN == 0 and e["location"] == "mlp.opt.onnx.data" for e in external.values())

    graph = load(out)
    original = {t.name: onnx.numpy_helper.to_array(t) for t in _mlp().graph.initializer}
    for name in external:
        arr = graph.initializers[name]
        assert isinstance(arr, np.memmap) and weights.is_mapped(arr)
        assert os.path.realpath(arr.filename) == os.path.realpath(data)
        assert not arr.flags.writeable
        np.testing.assert_array_equal(arr, original[name])
        with pytest.raises(ValueError, match="read-only"):
            arr[...] = 0  # a kernel that wrote into a weight would fail here, loudly
    assert not isinstance(graph.initializers["b1"], np.memmap)  # under the threshold: inside the model
    # one mapping of the file serves every tensor in it
    assert len({id(graph.initializers[n]._mmap) for n in external}) == 1


def test_mapped_weights_compute_what_onnxruntime_computes(written):
    src, out, _ = written
    expected = _ort(src)
    for providers in (None, ["cpu"]):
        sess = glassrt.InferenceSession(out, providers=providers)
        np.testing.assert_allclose(sess.run(None, FEEDS)[0], expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(sess.run(None, FEEDS)[0], expected, rtol=1e-5, atol=1e-5)  # replayed plan
    np.testing.assert_allclose(_ort(out), expected, rtol=1e-5, atol=1e-5)


def test_explain_counts_mapped_copied_and_transformed_bytes(written, tmp_path):
    src, out, _ = written
    sess = glassrt.InferenceSession(out, providers=["cpu"])
    w = explain(sess)["summary"]["weights"]
    mapped = 16 * 32 * 4 + 32 * 8 * 4 + 10 * 16 * 8
    assert w == {"mapped_bytes": mapped, "mapped_tensors": 3, "copied_bytes": 32 * 4, "transformed_bytes": 0}
    console = Console(file=io.StringIO(), width=200)
    render(explain(sess), console)
    text = console.file.getvalue()
    assert f"weights: {fmt_bytes(mapped)} mapped from the file (3 tensors), {fmt_bytes(128)} copied" in text

    embedded = glassrt.InferenceSession(src, providers=["cpu"])  # raw_data inside the model: copied
    assert explain(embedded)["summary"]["weights"]["copied_bytes"] == mapped + 128


def test_folded_and_packed_weights_count_as_transformed(tmp_path):
    """BatchNormalization folded into a conv's weights is computed at load; oneDNN's reordered
    copy of them is made when the plan binds: both transformed, the mapped source stays mapped."""
    c = 8
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"])]
    m = model(nodes, [tensor("x", [1, c, 8, 8])], [tensor("y", [1, c, 8, 8])],
              [init("w", RNG.standard_normal((c, c, 3, 3)).astype(np.float32))] +
              [init(k, RNG.uniform(0.5, 1.5, c).astype(np.float32)) for k in "sbmv"], opset=17)
    src, out = tmp_path / "cbn.onnx", tmp_path / "cbn.ext.onnx"
    onnx.save(m, src)
    tool.optimize(src, out, level="none", external_data=True, size_threshold=0)
    sess = glassrt.InferenceSession(out, providers=["cpu"])
    w = explain(sess)["summary"]["weights"]
    assert w["mapped_bytes"] == 0 and w["transformed_bytes"] == (c * c * 9 + c) * 4  # folded: w' and b'
    plain = glassrt.InferenceSession(out, glassrt.SessionOptions(graph_optimization_level="none"), providers=["cpu"])
    w = explain(plain)["summary"]["weights"]
    assert w["mapped_bytes"] == (c * c * 9 + 4 * c) * 4 and w["transformed_bytes"] == 0


@pytest.mark.parametrize("location, error", [
    ("../secret.bin", "climbs out"), ("/etc/passwd", "absolute"), ("link.bin", "outside the model's folder")])
def test_hostile_external_data_is_still_refused(tmp_path, location, error):
    inner = tmp_path / "model"
    inner.mkdir()
    (tmp_path / "secret.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes() * 1024)
    os.symlink(tmp_path / "secret.bin", inner / "link.bin")
    t = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4])
    t.data_location = TensorProto.EXTERNAL
    for k, v in {"location": location, "offset": "4096", "length": "16"}.items():
        e = t.external_data.add()
        e.key, e.value = k, v
    p = inner / "m.onnx"
    onnx.save(model([helper.make_node("Add", ["x", "w"], ["y"])], [tensor("x", [4])], [tensor("y", [4])], [t]), p)
    with pytest.raises(glassrt.UnsafeModelError, match=error):
        glassrt.InferenceSession(p)


@pytest.mark.parametrize("length, offset, error", [
    (12, 0, "holds 12 bytes, but its type FLOAT and shape \\[4\\] need 16"),
    (16, 4090, "lies outside 'w.bin'")])
def test_external_data_of_the_wrong_size_is_refused(tmp_path, length, offset, error):
    (tmp_path / "w.bin").write_bytes(b"\0" * 4096)
    t = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4])
    t.data_location = TensorProto.EXTERNAL
    for k, v in {"location": "w.bin", "offset": str(offset), "length": str(length)}.items():
        e = t.external_data.add()
        e.key, e.value = k, v
    p = tmp_path / "m.onnx"
    onnx.save(model([helper.make_node("Add", ["x", "w"], ["y"])], [tensor("x", [4])], [tensor("y", [4])], [t]), p)
    with pytest.raises(glassrt.InvalidModelError, match=error):
        glassrt.InferenceSession(p)


def test_unaligned_external_data_is_copied_not_misread(tmp_path):
    """onnx.save packs tensors back to back: a float32 tensor at an odd offset cannot be a
    float32 view of the mapping, so it is read (copied) instead; an aligned one is mapped."""
    raw = np.arange(6, dtype=np.float32)
    (tmp_path / "w.bin").write_bytes(b"\0" + raw.tobytes() + b"\0\0\0" + raw.tobytes())
    inits = []
    for name, offset in (("odd", 1), ("even", 28)):
        t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=[6])
        t.data_location = TensorProto.EXTERNAL
        for k, v in {"location": "w.bin", "offset": str(offset), "length": "24"}.items():
            e = t.external_data.add()
            e.key, e.value = k, v
        inits.append(t)
    p = tmp_path / "m.onnx"
    nodes = [helper.make_node("Add", ["odd", "even"], ["y"])]
    onnx.save(model(nodes, [], [tensor("y", [6])], inits), p)
    graph = load(p)
    assert not isinstance(graph.initializers["odd"], np.memmap) and isinstance(graph.initializers["even"], np.memmap)
    np.testing.assert_array_equal(glassrt.InferenceSession(p).run(None, {})[0], raw * 2)


def test_a_mapped_file_is_never_written_over(written, tmp_path):
    """Truncating a file a session maps would crash the process (SIGBUS) on its next read."""
    src, out, _ = written
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sess = glassrt.InferenceSession(out)
    before = (out.parent / "mlp.opt.onnx.data").read_bytes()
    # the model file is new, but its side file would be the one the session maps
    with pytest.raises(OptimizeError, match="the external data file .* holds its weights"):
        write_model(sess.graph, out.parent / "mlp.opt.onnx", external_data=True)
    assert (out.parent / "mlp.opt.onnx.data").read_bytes() == before
    np.testing.assert_allclose(sess.run(None, FEEDS)[0], _ort(src), rtol=1e-5, atol=1e-5)


def test_large_raw_data_is_read_straight_into_its_array(tmp_path):
    """Weights inside the model file: the large ones are read from the file into their arrays
    (model_file.py) rather than copied out of a parsed message; same values, read-only."""
    from glassrt import model_file

    big = np.random.default_rng(2).standard_normal((128, 256)).astype(np.float32)  # 128 KiB
    half = big[:64].astype(np.float16)
    nodes = [helper.make_node("MatMul", ["x", "big"], ["h"]), helper.make_node("Cast", ["half"], ["hf"], to=1),
             helper.make_node("ReduceSum", ["hf"], ["s"], keepdims=0), helper.make_node("Add", ["h", "s"], ["y"])]
    m = model(nodes, [tensor("x", [2, 128])], [tensor("y", [2, 256])],
              [init("big", big), init("half", half), init("small", np.ones(3, np.float32))], opset=17)
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    data, raw = model_file.strip(os.fspath(p))
    assert set(raw) == {"big"}  # half is 32 KiB: under MIN_BYTES, parsed as usual
    offset, length = raw["big"]
    assert len(data) < p.stat().st_size - length + 16  # the rest of the file, lengths re-encoded
    assert p.read_bytes()[offset:offset + length] == big.tobytes()
    graph = load(p)
    arr = graph.initializers["big"]
    np.testing.assert_array_equal(arr, big)
    assert not arr.flags.writeable and not isinstance(arr, np.memmap)
    np.testing.assert_array_equal(graph.initializers["half"], half)
    x = np.random.default_rng(3).standard_normal((2, 128)).astype(np.float32)
    expected = ort.InferenceSession(os.fspath(p), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(glassrt.InferenceSession(p).run(None, {"x": x})[0], expected, rtol=1e-4, atol=1e-4)


def test_a_truncated_model_file_is_still_refused_by_name(tmp_path):
    big = np.ones((128, 256), np.float32)
    m = model([helper.make_node("MatMul", ["x", "big"], ["y"])], [tensor("x", [2, 128])], [tensor("y", [2, 256])],
              [init("big", big)], opset=17)
    p = tmp_path / "cut.onnx"
    p.write_bytes(m.SerializeToString()[:-5000])  # the end of the weights and the graph's inputs cut off
    from glassrt import model_file

    assert model_file.strip(os.fspath(p)) is None
    with pytest.raises(glassrt.ModelLoadError, match="cut.onnx: not a valid ONNX model"):
        glassrt.InferenceSession(p)


def test_mutated_model_files_never_break_the_walk(tmp_path):
    """Random byte flips and cuts: the wire walk answers None or offsets inside the file,
    and whatever it answers, loading ends in a result or a glassrt error."""
    from glassrt import model_file

    big = np.random.default_rng(5).standard_normal((128, 256)).astype(np.float32)
    m = model([helper.make_node("MatMul", ["x", "big"], ["y"])], [tensor("x", [2, 128])], [tensor("y", [2, 256])],
              [init("big", big)], opset=17)
    data = m.SerializeToString()
    head = len(data) - big.nbytes  # flips land in the structure, not in the weights' bytes
    rng = np.random.default_rng(6)
    for k in range(150):
        b = bytearray(data)
        if k % 3 == 0:
            b = b[: int(rng.integers(1, len(b)))]
        else:
            for at in rng.integers(0, head + 64, size=int(rng.integers(1, 4))):
                b[int(at) % len(b)] = int(rng.integers(0, 256))
        p = tmp_path / f"m{k}.onnx"
        p.write_bytes(bytes(b))
        got = model_file.strip(os.fspath(p))
        if got is not None:
            assert all(0 <= off and off + n <= len(b) for off, n in got[1].values())
        try:
            glassrt.InferenceSession(p)
        except glassrt.GlassrtError:
            pass


def test_a_hostile_length_in_the_model_file_is_not_allocated(tmp_path):
    """A raw_data or field length of 2**60 must not become a 2**60-byte read."""
    from glassrt import model_file

    big = np.ones((128, 256), np.float32)
    m = model([helper.make_node("MatMul", ["x", "big"], ["y"])], [tensor("x", [2, 128])], [tensor("y", [2, 256])],
              [init("big", big)], opset=17)
    data = m.SerializeToString()
    lie = data.replace(model_file._encode_varint(big.nbytes), model_file._encode_varint(2**60), 1)
    p = tmp_path / "lie.onnx"
    p.write_bytes(lie)
    assert model_file.strip(os.fspath(p)) is None
    with pytest.raises(glassrt.ModelLoadError, match="lie.onnx: not a valid ONNX model"):
        glassrt.InferenceSession(p)


def _big_model():
    """Three tensors above model_file.MIN_BYTES (one with a doc_string of its own), one below."""
    rng = np.random.default_rng(4)
    w1, w2 = rng.standard_normal((128, 160)).astype(np.float32), rng.standard_normal((160, 130)).astype(np.float32)
    w3 = rng.standard_normal((130, 129)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h1"]), helper.make_node("MatMul", ["h1", "w2"], ["h2"]),
             helper.make_node("MatMul", ["h2", "w3"], ["h3"]), helper.make_node("Add", ["h3", "b"], ["y"])]
    m = model(nodes, [tensor("x", ["n", 128])], [tensor("y", ["n", 129])],
              [init("w1", w1), init("w2", w2), init("w3", w3), init("b", np.full(129, 0.5, np.float32))], opset=17)
    m.graph.initializer[2].doc_string = "the user's own words"
    return m


def test_aligned_raw_data_parses_to_the_same_model():
    """align_raw_data moves each large raw_data to a 64-byte offset with a doc_string of spaces
    before it; protobuf reads the same tensors, and a tensor with its own doc_string is kept."""
    from glassrt import model_file

    m = _big_model()
    for extra in range(70):  # the tensors start at every offset mod 64 as the name grows
        m.graph.name = "g" * extra
        data = m.SerializeToString()
        aligned = model_file.align_raw_data(data)
        back = onnx.ModelProto()
        back.ParseFromString(aligned)
        for a, b in zip(m.graph.initializer, back.graph.initializer):
            assert (a.name, a.raw_data, list(a.dims), a.data_type) == (b.name, b.raw_data, list(b.dims), b.data_type)
        assert back.graph.initializer[2].doc_string == "the user's own words"
        assert [t.doc_string.strip(" ") for t in back.graph.initializer] == ["", "", "the user's own words", ""]
        back.ClearField("graph")
        m2 = onnx.ModelProto()
        m2.CopyFrom(m)
        m2.ClearField("graph")
        assert back == m2
        for name, n in (("w1", 128 * 160 * 4), ("w2", 160 * 130 * 4)):
            at = aligned.find(np.asarray(onnx.numpy_helper.to_array(
                next(t for t in m.graph.initializer if t.name == name))).tobytes())
            assert at % 64 == 0, (extra, name, at)
    assert model_file.align_raw_data(b"\xff\xff not protobuf") == b"\xff\xff not protobuf"


def test_an_optimized_files_weights_are_mapped_where_they_lie(tmp_path):
    """`glassrt optimize` aligns the weights inside its one file, and glassrt maps them on load
    (explain counts them as mapped); onnxruntime and onnx.checker read the file as usual. The
    same file without glassrt's metadata is read, not mapped."""
    from glassrt import model_file

    src, out = tmp_path / "big.onnx", tmp_path / "big.opt.onnx"
    onnx.save(_big_model(), src)
    tool.optimize(src, out, level="none")
    onnx.checker.check_model(os.fspath(out), full_check=True)
    x = RNG.standard_normal((3, 128)).astype(np.float32)
    expected = ort.InferenceSession(os.fspath(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got_ort = ort.InferenceSession(os.fspath(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    tol = 1e-5 * np.abs(expected).max()  # (three products of random weights: outputs ~1e3, a few near 0)
    np.testing.assert_allclose(got_ort, expected, rtol=1e-5, atol=tol)
    graph = load(out)
    for name in ("w1", "w2", "w3"):  # (the written tensors carry no doc_string of their own)
        w = graph.initializers[name]
        assert weights.is_mapped(w) and not w.flags.writeable and w.ctypes.data % 64 == 0
    assert not weights.is_mapped(graph.initializers["b"])  # small: inside the parsed message
    assert os.path.realpath(out) in weights.mapped_paths()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sess = glassrt.InferenceSession(out)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], expected, rtol=1e-4, atol=tol)
    assert weights.account(sess.graph, sess._loaded_weights)["mapped_tensors"] == 3
    # Without glassrt's metadata (another tool's file that happens to be aligned): read.
    other = onnx.load(os.fspath(out))
    del other.metadata_props[:]
    plain = tmp_path / "plain.onnx"
    plain.write_bytes(model_file.align_raw_data(other.SerializeToString()))
    assert not any(weights.is_mapped(a) for a in load(plain).initializers.values())


def test_writing_an_optimized_file_replaces_it_rather_than_rewriting_it(tmp_path):
    """Another process may map the previous version: the new one is a new file under the name."""
    src, out = tmp_path / "big.onnx", tmp_path / "big.opt.onnx"
    onnx.save(_big_model(), src)
    tool.optimize(src, out, level="none")
    inode = out.stat().st_ino
    keep = open(out, "rb")  # as a mapping in another process would, it holds the old file
    try:
        tool.optimize(src, out, level="basic")
        assert out.stat().st_ino != inode
        assert os.fstat(keep.fileno()).st_ino == inode and os.fstat(keep.fileno()).st_size > 0
    finally:
        keep.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.onnx", "big.opt.onnx"]  # no temporary left


def test_a_packed_weights_file_pages_are_released_and_read_again_unchanged(tmp_path):
    """Once a plan has its own copy of a mapped weight (oneDNN's packed layout) the file's
    pages need not stay resident beside it: released, they come back from the page cache,
    the same bytes, when something reads the weight again."""
    data = np.random.default_rng(3).standard_normal(1 << 21).astype(np.float32)  # 8 MiB
    path = tmp_path / "w.bin"
    data.tofile(path)
    arr = weights.map_file(str(path))[4096:].view(np.float32)  # starts mid-file, on a page
    assert float(arr.sum(dtype=np.float64)) == pytest.approx(float(data[1024:].sum(dtype=np.float64)))
    before = smaps_kib(arr.ctypes.data, "Rss:")
    released = weights.release_pages(arr)
    assert released == arr.nbytes  # whole pages: the view starts and ends on page boundaries
    after = smaps_kib(arr.ctypes.data, "Rss:")
    if before is not None:
        assert after < before - 7 * 1024  # ~8 MiB fewer resident
    np.testing.assert_array_equal(arr, data[1024:])
    assert weights.release_pages(np.ones(10, np.float32)) == 0  # not a mapping: nothing to do
