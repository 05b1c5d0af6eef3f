"""8-bit products with a constant B as exact float32 ones on oneDNN
(kernels/onednn/int8_float_matmul.py): MatMulInteger and com.microsoft::MatMulIntegerToFloat
where the CPU has no VNNI or AMX. The int8 kernels are made to refuse here (as they do on
such a CPU), so these run on any CPU. MatMulInteger is checked against int64 arithmetic;
MatMulIntegerToFloat (what quantize_dynamic's layers fuse into) against the unfused chain on
cpu's exact kernels, bit for bit (not against onnxruntime: on a CPU without VNNI its own
u8 x s8 products saturate with full-range weights, off by up to ~9 here); the inner dimension cut into parts where a column's sums
could pass 2**24; refused past MAX_PARTS."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import glassrt
from glassrt.kernels.onednn import capi

from .helpers import init, model, op_types, tensor

pytestmark = pytest.mark.skipif(capi.UNAVAILABLE is not None, reason="oneDNN unavailable")
RNG = np.random.default_rng(31)
TYPES = {np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8}


@pytest.fixture(autouse=True)
def no_vnni(monkeypatch):
    """As on an AVX2 CPU: oneDNN's 8-bit products refuse."""
    from glassrt.kernels.onednn import int8

    monkeypatch.setattr(int8, "exact_reason", lambda: "no VNNI (this test)")


def _limit(monkeypatch, limit):
    """float32's exact range made `limit`, for both modules that read it."""
    from glassrt.kernels.onednn import int8_float, int8_float_matmul

    monkeypatch.setattr(int8_float, "EXACT_LIMIT", limit)
    monkeypatch.setattr(int8_float_matmul, "EXACT_LIMIT", limit)


def _full_range(dt, shape):
    info = np.iinfo(dt)
    return RNG.integers(info.min, info.max + 1, shape).astype(dt)


def _matmul_integer(a_dt, b_dt, k, n, a_shape, zb, runtime_za=True):
    b = _full_range(b_dt, (k, n))
    za = np.array(RNG.integers(0, 90), a_dt)
    inits = [init("b", b), init("zb", np.asarray(zb, b_dt))]
    inputs = [tensor("a", list(a_shape), TYPES[a_dt])]
    if runtime_za:
        inputs.append(tensor("za", [], TYPES[a_dt]))
    else:
        inits.append(init("za", za))
    m = model([helper.make_node("MatMulInteger", ["a", "b", "za", "zb"], ["y"], name="p")], inputs,
              [tensor("y", None, TensorProto.INT32)], inits, opset=13)
    return m, b, za


def _run(m, feeds, providers=("onednn", "cpu")):
    s = glassrt.InferenceSession(m.SerializeToString(), providers=list(providers))
    return s, s.run(None, feeds)[0]


def _kernel(s, name):
    return next(n for n in s.explain()["nodes"] if n["name"] == name)


@pytest.mark.parametrize("a_dt, b_dt", [(np.uint8, np.int8), (np.int8, np.int8), (np.uint8, np.uint8),
                                        (np.int8, np.uint8)])
@pytest.mark.parametrize("a_shape", [(2, 9, 70), (1, 70), (300, 70)])
def test_matmul_integer_equals_int64_sums(a_dt, b_dt, a_shape):
    """Full-range operands, zero points on both sides (B's one per column), 1 to 300 rows."""
    zb = _full_range(b_dt, (33,))
    m, b, za = _matmul_integer(a_dt, b_dt, 70, 33, a_shape, zb)
    a = _full_range(a_dt, a_shape)
    s, y = _run(m, {"a": a, "za": za})
    assert _kernel(s, "p")["kernel"] == "onednn.MatMulInteger.float32"
    ref = (a.astype(np.int64) - int(za)) @ (b.astype(np.int64) - zb.astype(np.int64))
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, ref)


def test_matmul_integer_in_parts_of_k(monkeypatch):
    """A limit that 25 full-range inputs pass: K = 200 is cut into parts, each exact, summed."""
    _limit(monkeypatch, 25 * 255 * 128)
    m, b, za = _matmul_integer(np.uint8, np.int8, 200, 17, (5, 200), np.zeros(17, np.int8), runtime_za=False)
    from glassrt.kernels.onednn.int8_float_matmul import FloatWeights

    assert len(FloatWeights(b, None, 255).parts) >= 4
    a = _full_range(np.uint8, (5, 200))
    s, y = _run(m, {"a": a})
    assert _kernel(s, "p")["kernel"] == "onednn.MatMulInteger.float32"
    np.testing.assert_array_equal(y, (a.astype(np.int64) - int(za)) @ b.astype(np.int64))


def test_matmul_integer_refused_past_its_parts(monkeypatch):
    """A limit one input's products already pass: no parts would do; explain says why and
    cpu's exact path answers."""
    _limit(monkeypatch, 1000)
    m, b, za = _matmul_integer(np.uint8, np.int8, 40, 9, (3, 40), np.zeros(9, np.int8))
    a = _full_range(np.uint8, (3, 40))
    s, y = _run(m, {"a": a, "za": za})
    row = _kernel(s, "p")
    assert row["kernel"] == "cpu.MatMulInteger" and "past 2**24" in row["reason"]
    np.testing.assert_array_equal(y, (a.astype(np.int64) - int(za)) @ b.astype(np.int64))


X = (RNG.standard_normal((2, 7, 48)) * 2).astype(np.float32)


def _layer(n=20, per_column=False, bias=True):
    """x -> DynamicQuantizeLinear -> MatMulInteger(., W) -> Cast -> Mul(., a_scale · w_scale)
    [-> Add bias], as onnxruntime.quantization.quantize_dynamic writes a MatMul."""
    w = _full_range(np.int8, (X.shape[-1], n))
    w_scale = (RNG.uniform(0.002, 0.02, n) if per_column else np.array(0.01)).astype(np.float32)
    inits = [init("w", w), init("w_s", w_scale), init("w_z", np.zeros(w_scale.shape, np.int8)),
             init("b", RNG.standard_normal(n).astype(np.float32))]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], name="dql"),
             helper.make_node("MatMulInteger", ["xq", "w", "xz", "w_z"], ["acc"], name="mmi"),
             helper.make_node("Cast", ["acc"], ["accf"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("Mul", ["xs", "w_s"], ["s"], name="scales"),
             helper.make_node("Mul", ["accf", "s"], ["mm" if bias else "y"], name="scale")]
    if bias:
        nodes.append(helper.make_node("Add", ["mm", "b"], ["y"], name="bias"))
    return model(nodes, [tensor("x", list(X.shape))], [tensor("y", None)], inits, opset=17)


@pytest.mark.parametrize("per_column, bias", [(False, True), (True, True), (True, False)])
def test_a_quantize_dynamic_layer_fuses_and_keeps_the_chains_bits(per_column, bias):
    m = _layer(per_column=per_column, bias=bias)
    sess = glassrt.InferenceSession(m)
    ops = op_types(sess)
    assert "MatMulIntegerToFloat" in ops and "MatMulInteger" not in ops and "Cast" not in ops
    assert _kernel(sess, "mmi")["kernel"] == "onednn.MatMulIntegerToFloat.float32"
    got = sess.run(None, {"x": X})[0]
    chain = glassrt.InferenceSession(m, providers=["cpu"])  # (cpu's exact MatMulInteger, unfused)
    assert "MatMulInteger" in op_types(chain)
    np.testing.assert_array_equal(got, chain.run(None, {"x": X})[0])


def test_the_fused_layer_in_parts_of_k_keeps_the_chains_bits(monkeypatch):
    _limit(monkeypatch, 12 * 255 * 128)
    m = _layer(per_column=True)
    sess = glassrt.InferenceSession(m)
    assert _kernel(sess, "mmi")["kernel"] == "onednn.MatMulIntegerToFloat.float32"
    chain = glassrt.InferenceSession(m, providers=["cpu"])
    np.testing.assert_array_equal(sess.run(None, {"x": X})[0], chain.run(None, {"x": X})[0])


def test_no_fusion_where_the_float_kernel_would_refuse(monkeypatch):
    """Sums that no parts keep exact: the layer stays a chain (cpu's MatMulInteger, exact)."""
    _limit(monkeypatch, 1000)
    m = _layer()
    sess = glassrt.InferenceSession(m)
    assert "MatMulIntegerToFloat" not in op_types(sess) and "MatMulInteger" in op_types(sess)
    assert _kernel(sess, "mmi")["kernel"] == "cpu.MatMulInteger"


def test_no_fusion_without_the_onednn_provider():
    assert "MatMulIntegerToFloat" not in op_types(glassrt.InferenceSession(_layer(), providers=["cpu"]))


def test_a_call_into_its_own_buffer_after_one_into_the_callers():
    """The sums written into the caller's buffer, then into the binding's own: the second
    call must not write into the first caller's buffer (the primitive keeps the last one)."""
    from glassrt.kernels.onednn.int8_float_matmul import FloatWeights, _Products

    b = _full_range(np.int8, (24, 10))
    products = _Products(FloatWeights(b, None, 255), scaled=False, bias=False)
    a1, a2 = _full_range(np.uint8, (3, 24)), _full_range(np.uint8, (3, 24))
    mine = np.empty((3, 10), np.float32)
    assert products.sums(a1, None, dst=mine) is mine
    kept = mine.copy()
    got = products.sums(a2, None)
    np.testing.assert_array_equal(mine, kept)
    np.testing.assert_array_equal(got, a2.astype(np.int64) @ b.astype(np.int64))


def test_a_closed_sessions_weights_are_not_kept():
    """The exactness checks of each constant B are cached for as long as B lives, not longer:
    they held B itself, and every session made kept its 8-bit weights alive for good (an int8
    BERT-base: ~90 MB more per session, made and closed)."""
    import gc

    from glassrt.kernels.onednn import int8_float_matmul

    m, b, za = _matmul_integer(np.uint8, np.int8, 70, 33, (4, 70), _full_range(np.int8, (33,)))
    before = set(int8_float_matmul._WEIGHTS)
    s, y = _run(m, {"a": _full_range(np.uint8, (4, 70)), "za": za})
    assert _kernel(s, "p")["kernel"] == "onednn.MatMulInteger.float32"
    assert set(int8_float_matmul._WEIGHTS) - before, "the session's B was not cached"
    del s
    gc.collect()
    assert not set(int8_float_matmul._WEIGHTS) - before
    w = _full_range(np.int8, (40, 8))
    made = int8_float_matmul.float_weights(w, None, 255)
    assert made.centered(0, 40).tolist() == w.astype(np.float32).tolist()
    del w
    gc.collect()
    with pytest.raises(RuntimeError, match="freed"):
        made.centered(0, 40)


@pytest.mark.parametrize("ta, tb", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
@pytest.mark.parametrize("quantized, c_shape", [(True, None), (True, (6,)), (False, (5, 1)), (True, (1, 6))])
@pytest.mark.parametrize("in_parts", [False, True])
def test_qgemm_sums_as_float32_products_are_cpus_bytes(monkeypatch, ta, tb, quantized, c_shape, in_parts):
    """com.microsoft QGemm with a constant B (transposed or not, zero points per tensor or per
    column, A transposed too): its int32 sums as exact float32 products, then cpu's own
    float32 steps, so the output is cpu's to the byte; in parts of K too."""
    from tests.test_contrib_quant import _model, _qgemm_inputs

    if in_parts:
        _limit(monkeypatch, 1 << 18)
    rng = np.random.default_rng([7, int(quantized), int(in_parts), len(c_shape or ())])
    for trans_a, trans_b, per_column, alpha in [(0, 1, True, 1.0), (1, 0, False, 0.5), (0, 0, True, 2.0)]:
        ins = _qgemm_inputs(rng, ta, tb, 5, 70, 6, trans_a, trans_b, per_column, c_shape, quantized)
        consts = {i for i, x in enumerate(ins) if x is not None and i > 0}
        model, feeds = _model("QGemm", ins, consts=consts, alpha=alpha, transA=trans_a, transB=trans_b)
        s = glassrt.InferenceSession(model, providers=["onednn", "cpu"])
        assert _kernel(s, "node")["kernel"] == "onednn.QGemm.float32", str(_kernel(s, "node"))
        if in_parts:
            from glassrt.kernels.onednn import int8_float_matmul

            inits = s.graph.initializers  # (the kernel's own judgement: its A's zero point's reach)
            w = int8_float_matmul.weights_for(inits["in3"], inits["in5"], np.dtype(ta), True, inits["in2"],
                                              bool(trans_b))
            assert len(w.parts) > 1
        got = s.run(None, feeds)[0]
        want = glassrt.InferenceSession(model, providers=["cpu"]).run(None, feeds)[0]
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_qgemm_with_a_fed_zero_point_takes_any_value_of_a():
    """A's scale and zero point fed at run time: the exactness bound takes the widest |a - za|
    A's type allows, and each run's zero point is the one subtracted."""
    from tests.test_contrib_quant import _model, _qgemm_inputs

    rng = np.random.default_rng(5)
    ins = _qgemm_inputs(rng, np.uint8, np.int8, 3, 300, 40, 0, 1, True, (40,), True)
    model, feeds = _model("QGemm", ins, consts={3, 4, 5, 6, 7, 8}, transB=1)
    s = glassrt.InferenceSession(model, providers=["onednn", "cpu"])
    assert _kernel(s, "node")["kernel"] == "onednn.QGemm.float32"
    cpu = glassrt.InferenceSession(model, providers=["cpu"])
    for za in (feeds["in2"], np.asarray(0, np.uint8), np.asarray(255, np.uint8)):
        run = {**feeds, "in2": za}
        np.testing.assert_array_equal(s.run(None, run)[0], cpu.run(None, run)[0])


def test_packing_8_bit_weights_on_one_thread_leaves_the_runs_thread_count(monkeypatch):
    """B without a zero point is converted as oneDNN packs it, on one OpenMP thread (faster
    there); the calling thread's count is as it was after, and the sums stay exact."""
    from glassrt.kernels.onednn import dnnl, int8_float_matmul

    inside, around = [], []
    prepack, packed = dnnl.prepack, int8_float_matmul.FloatWeights.packed

    def count_around(self, *args):
        before = capi.query_max_threads()
        try:
            return packed(self, *args)
        finally:
            around.append((before, capi.query_max_threads()))

    monkeypatch.setattr(dnnl, "prepack", lambda *a, **k: inside.append(capi.query_max_threads()) or prepack(*a, **k))
    monkeypatch.setattr(int8_float_matmul.FloatWeights, "packed", count_around)
    m, b, za = _matmul_integer(np.uint8, np.int8, 700, 300, (64, 700), 0)
    s = glassrt.InferenceSession(m.SerializeToString(), glassrt.SessionOptions(intra_op_num_threads=2),
                                 providers=["onednn", "cpu"])
    a = _full_range(np.uint8, (64, 700))
    y = s.run(None, {"a": a, "za": za})[0]
    assert _kernel(s, "p")["kernel"] == "onednn.MatMulInteger.float32"
    assert inside == [1] and len(around) == 1 and around[0][0] == around[0][1] and around[0][0] >= 1
    np.testing.assert_array_equal(y, (a.astype(np.int64) - int(za)) @ b.astype(np.int64))


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("k", [1, 256, 257, 258, 771])
def test_column_magnitudes_are_the_exact_sums_of_abs(dtype, k):
    """The bound's column sums, taken 257 rows at a time in uint16: int8's -128 counts 128,
    every value at its type's extreme in a column of more rows than a block holds, a
    transposed B (Gemm's transB) read through its view."""
    from glassrt.kernels.onednn.int8_float_matmul import _column_magnitudes

    info = np.iinfo(dtype)
    b = RNG.integers(info.min, info.max + 1, (k, 5)).astype(dtype)
    b[:, 0] = info.min
    b[:, 1] = info.max
    want = np.abs(b.astype(np.int64)).sum(axis=0)
    np.testing.assert_array_equal(_column_magnitudes(b), want)
    np.testing.assert_array_equal(_column_magnitudes(np.ascontiguousarray(b.T).T), want)
