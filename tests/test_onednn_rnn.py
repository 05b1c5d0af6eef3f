"""The onednn provider's LSTM, GRU and RNN (kernels/onednn/rnn.py): oneDNN's RNN primitives for
the whole sequence, against cpu's kernels and onnxruntime; what they refuse, each with its
reason; and the runs they hand to cpu's kernel (a sequence_lens shorter than the sequence)."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import glassrt
from glassrt.kernels.onednn import capi

pytestmark = pytest.mark.skipif(capi.UNAVAILABLE is not None, reason="oneDNN unavailable")

F = TensorProto.FLOAT


GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _lstm_model(steps, batch, width, hidden, *, op="LSTM", direction="forward", bias=True, peepholes=False,
                initial=False, outputs=None, attrs=None, seq_lens=None, weights_as_inputs=False, seed=0):
    """One LSTM (GRU, RNN) node: X (and initial_h / initial_c, sequence_lens) fed, W, R, B, P
    initializers. seq_lens: None, "const" (every entry the full length, an initializer) or "fed"."""
    rng = np.random.default_rng(seed)
    dirs = 2 if direction == "bidirectional" else 1
    gates = GATES[op]
    outputs = outputs or (("y", "y_h", "y_c") if op == "LSTM" else ("y", "y_h"))
    consts = {"W": rng.uniform(-0.4, 0.4, (dirs, gates * hidden, width)),
              "R": rng.uniform(-0.4, 0.4, (dirs, gates * hidden, hidden))}
    if bias:
        consts["B"] = rng.uniform(-0.5, 0.5, (dirs, 2 * gates * hidden))
    if peepholes:
        consts["P"] = rng.uniform(-0.5, 0.5, (dirs, 3 * hidden))
    consts = {k: v.astype(np.float32) for k, v in consts.items()}
    inputs = [helper.make_tensor_value_info("x", F, [steps, batch, width])]
    inits = []
    names = ["x", "W", "R", "B" if bias else "", "", "", "", "P" if peepholes else ""]
    if seq_lens == "const":
        inits.append(numpy_helper.from_array(np.full(batch, steps, np.int32), "lens"))
        names[4] = "lens"
    elif seq_lens == "fed":
        inputs.append(helper.make_tensor_value_info("lens", TensorProto.INT32, [batch]))
        names[4] = "lens"
    if initial:
        for i, n in ((5, "h0"), (6, "c0"))[:2 if op == "LSTM" else 1]:
            inputs.append(helper.make_tensor_value_info(n, F, [dirs, batch, hidden]))
            names[i] = n
    for k, v in consts.items():
        if weights_as_inputs:
            inputs.append(helper.make_tensor_value_info(k, F, list(v.shape)))
        else:
            inits.append(numpy_helper.from_array(v, k))
    while names and not names[-1]:
        names.pop()
    node = helper.make_node(op, names, list(outputs), name="lstm", direction=direction, hidden_size=hidden,
                            **(attrs or {}))
    g = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info(o, F, None) for o in outputs if o],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    m.ir_version = 8
    feeds = {"x": rng.standard_normal((steps, batch, width)).astype(np.float32)}
    if initial:
        feeds["h0"] = rng.standard_normal((dirs, batch, hidden)).astype(np.float32)
        if op == "LSTM":
            feeds["c0"] = rng.standard_normal((dirs, batch, hidden)).astype(np.float32)
    if weights_as_inputs:
        feeds.update(consts)
    if seq_lens == "fed":
        feeds["lens"] = np.full(batch, steps, np.int32)
    return m, feeds


def _explained(sess):
    return {r["name"]: r for r in sess.explain()["nodes"]}["lstm"]


def _assert_close(got, want):
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == np.float32
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-6)


def _run_both(model, feeds):
    """(onednn session's outputs, cpu's, the onednn session)."""
    sess = glassrt.InferenceSession(model.SerializeToString(), fallback="silent")
    cpu = glassrt.InferenceSession(model.SerializeToString(), providers=["cpu"])
    return sess.run(None, feeds), cpu.run(None, feeds), sess


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("bias,peepholes,initial", [(True, False, False), (False, False, True), (True, True, True)])
def test_lstm_matches_cpu(direction, batch, bias, peepholes, initial):
    m, feeds = _lstm_model(7, batch, 5, 6, direction=direction, bias=bias, peepholes=peepholes, initial=initial)
    got, want, sess = _run_both(m, feeds)
    assert _explained(sess)["kernel"] == "onednn.LSTM"
    _assert_close(got, want)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("linear_before_reset", [0, 1])
@pytest.mark.parametrize("bias,initial", [(True, False), (False, True)])
def test_gru_matches_cpu(direction, batch, linear_before_reset, bias, initial):
    m, feeds = _lstm_model(6, batch, 5, 4, op="GRU", direction=direction, bias=bias, initial=initial,
                           attrs={"linear_before_reset": linear_before_reset})
    got, want, sess = _run_both(m, feeds)
    assert _explained(sess)["kernel"] == "onednn.GRU"
    _assert_close(got, want)


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("activation", [None, "Tanh", "Relu", "Sigmoid"])
def test_rnn_matches_cpu(direction, activation):
    dirs = 2 if direction == "bidirectional" else 1
    attrs = {} if activation is None else {"activations": [activation] * dirs}
    m, feeds = _lstm_model(6, 2, 5, 4, op="RNN", direction=direction, initial=True, attrs=attrs)
    got, want, sess = _run_both(m, feeds)
    assert _explained(sess)["kernel"] == "onednn.RNN"
    _assert_close(got, want)


def test_rnn_with_two_activations_goes_to_cpu():
    m, feeds = _lstm_model(4, 1, 3, 4, op="RNN", direction="bidirectional", attrs={"activations": ["Tanh", "Relu"]})
    got, want, sess = _run_both(m, feeds)
    assert _explained(sess)["kernel"] == "cpu.RNN" and "both directions" in _explained(sess)["reason"]
    np.testing.assert_array_equal(got[0], want[0])


@pytest.mark.parametrize("op", ["GRU", "RNN"])
def test_gru_and_rnn_match_onnxruntime(op):
    ort = pytest.importorskip("onnxruntime")
    attrs = {"linear_before_reset": 1} if op == "GRU" else {}
    m, feeds = _lstm_model(12, 2, 16, 32, op=op, direction="bidirectional", initial=True, attrs=attrs)
    got = glassrt.InferenceSession(m.SerializeToString()).run(None, feeds)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("outputs", [("y",), ("", "y_h"), ("", "", "y_c"), ("y", "", "y_c")])
def test_lstm_returns_the_outputs_asked_for(outputs):
    m, feeds = _lstm_model(4, 2, 3, 5, direction="bidirectional", outputs=outputs, initial=True)
    got, want, sess = _run_both(m, feeds)
    assert _explained(sess)["kernel"] == "onednn.LSTM"
    assert len(got) == len([o for o in outputs if o])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-6)


def test_lstm_runs_repeatedly_into_its_planned_buffers():
    """A plan's later runs (buffers reused, the compiled straight-line plan) give the same
    results, and changing inputs change them."""
    m, feeds = _lstm_model(6, 1, 4, 8, direction="bidirectional", initial=True)
    sess = glassrt.InferenceSession(m.SerializeToString())
    cpu = glassrt.InferenceSession(m.SerializeToString(), providers=["cpu"])
    rng = np.random.default_rng(3)
    for _ in range(20):
        f = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in feeds.items()}
        for g, w in zip(sess.run(None, f), cpu.run(None, f)):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-6)


def test_lstm_matches_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    m, feeds = _lstm_model(20, 1, 64, 64, direction="bidirectional", initial=True, peepholes=True)
    got = glassrt.InferenceSession(m.SerializeToString()).run(None, feeds)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_lstm_explicit_default_activations_are_taken():
    acts = {"activations": ["Sigmoid", "Tanh", "Tanh"] * 2}
    m, feeds = _lstm_model(3, 2, 4, 4, direction="bidirectional", attrs=acts)
    got, want, sess = _run_both(m, feeds)
    assert _explained(sess)["kernel"] == "onednn.LSTM"
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("kwargs,reason", [
    ({"attrs": {"clip": 2.0}}, "clip"),
    ({"attrs": {"input_forget": 1}}, "input_forget"),
    ({"attrs": {"activations": ["HardSigmoid", "Tanh", "Tanh"]}}, "activations"),
    ({"weights_as_inputs": True}, "computed at run time"),
])
def test_lstm_refusals_go_to_cpu_with_their_reason(kwargs, reason):
    m, feeds = _lstm_model(5, 2, 3, 4, **kwargs)
    got, want, sess = _run_both(m, feeds)
    row = _explained(sess)
    assert row["kernel"] == "cpu.LSTM"
    assert reason in row["reason"]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_lstm_batch_major_layout_goes_to_cpu():
    m, feeds = _lstm_model(5, 2, 3, 4, attrs={"layout": 1})
    m.graph.input[0].CopyFrom(helper.make_tensor_value_info("x", F, [2, 5, 3]))
    feeds["x"] = np.ascontiguousarray(feeds["x"].transpose(1, 0, 2))
    got, want, sess = _run_both(m, feeds)
    assert _explained(sess)["kernel"] == "cpu.LSTM" and "layout=1" in _explained(sess)["reason"]
    np.testing.assert_array_equal(got[0], want[0])


def test_lstm_sequence_lens():
    """Constant full lengths run on oneDNN; fed lengths run there when every entry is full
    and on cpu's kernel (zeros past each end, states held) when one is shorter."""
    m, feeds = _lstm_model(6, 3, 4, 5, direction="bidirectional", seq_lens="const")
    got, want, sess = _run_both(m, feeds)
    assert _explained(sess)["kernel"] == "onednn.LSTM"
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=2e-6)

    m, feeds = _lstm_model(6, 3, 4, 5, direction="bidirectional", seq_lens="fed", initial=True)
    sess = glassrt.InferenceSession(m.SerializeToString())
    cpu = glassrt.InferenceSession(m.SerializeToString(), providers=["cpu"])
    assert _explained(sess)["kernel"] == "onednn.LSTM"
    for lens in ([6, 6, 6], [6, 2, 0], [6, 6, 6]):
        f = {**feeds, "lens": np.array(lens, np.int32)}
        for g, w in zip(sess.run(None, f), cpu.run(None, f)):
            if lens == [6, 6, 6]:
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-6)
            else:  # cpu's own kernel ran it
                np.testing.assert_array_equal(g, w)
    with pytest.raises(glassrt.GlassrtError, match="sequence_lens"):
        sess.run(None, {**feeds, "lens": np.array([6, 9, 1], np.int32)})


def test_lstm_weights_shared_between_plans(monkeypatch):
    """Two sequence lengths, two plans: the weights are packed once, not once per plan."""
    from glassrt.kernels.onednn import dnnl

    packs = []
    prepack = dnnl.prepack
    monkeypatch.setattr(dnnl, "prepack", lambda a, *args, **kw: packs.append(a.shape) or prepack(a, *args, **kw))
    m, feeds = _lstm_model(4, 1, 8, 16, direction="bidirectional")
    m.graph.input[0].CopyFrom(helper.make_tensor_value_info("x", F, ["T", 1, 8]))
    sess = glassrt.InferenceSession(m.SerializeToString(), sess_options=glassrt.SessionOptions(generalize_after=0))
    cpu = glassrt.InferenceSession(m.SerializeToString(), providers=["cpu"])
    for steps in (4, 9, 4):
        f = {"x": np.random.default_rng(steps).standard_normal((steps, 1, 8)).astype(np.float32)}
        np.testing.assert_allclose(sess.run(None, f)[0], cpu.run(None, f)[0], rtol=1e-5, atol=2e-6)
    assert len(sess.runner.plans) == 2
    assert sorted(packs) == [(1, 2, 8, 4, 16), (1, 2, 16, 4, 16)]  # W and R, each once


def test_placement_on_unknown_shapes_is_reconsidered_by_the_plan():
    """An LSTM whose input has no declared shape (as in an If body reading outer values):
    placement cannot judge oneDNN's kernel and places it on cpu; the plan, whose shapes are
    concrete, asks oneDNN again and runs it there."""
    m, feeds = _lstm_model(5, 2, 3, 4, direction="bidirectional", initial=True)
    m.graph.input[0].CopyFrom(helper.make_tensor_value_info("x", F, None))
    got, want, sess = _run_both(m, feeds)
    row = _explained(sess)
    assert row["kernel"] == "cpu.LSTM" and "onednn" in row["reason"]
    (plan,) = sess.runner.plans.values()
    assert [st.kernel.name for st in plan.steps if st.node.op_type == "LSTM"] == ["onednn.LSTM"]
    _assert_close(got, want)
