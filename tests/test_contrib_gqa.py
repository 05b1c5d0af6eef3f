"""com.microsoft::GroupQueryAttention (glassrt/contrib/microsoft_gqa.py) against onnxruntime.

Every case builds a one-node model, runs it in onnxruntime's CPU provider and in glassrt with
native kernels only (providers=["cpu"], fallback="error"), and compares:

- output: every row, except where onnxruntime's own loops disagree (a padding row of the first
  prompt under a sliding window, which its float32 fast loop and its general loop answer
  differently; the real rows are compared then), and the padding rows of query_seqlens, which
  onnxruntime leaves unspecified (it writes whatever its buffer held);
- present_key/present_value: for each entry the rows onnxruntime writes (its past rows, then
  this step's rows: all sequence_length rows in the first prompt, padding included), and that
  glassrt's rows after them are zeros (onnxruntime's CPU kernel zero-fills them too, but calls
  them unspecified);
- output_qk: every value.
"""
from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
from onnx import helper

import glassrt

ort = pytest.importorskip("onnxruntime")

from tests.test_contrib_microsoft import _glassrt, _ort  # noqa: E402 - the same harness as the other contrib ops

MS = "com.microsoft"
F16, F32 = np.float16, np.float32
NAMES = ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
         "sin_cache", "position_ids", "attention_bias", "head_sink", "k_scale", "v_scale", "q_norm_weight",
         "k_norm_weight", "query_seqlens")
OUTS = ("y", "present_key", "present_value")


@functools.lru_cache(maxsize=None)
def _ort_schema_names():
    from onnxruntime.capi import onnxruntime_pybind11_state as c

    schema = next((s for s in c.get_all_operator_schema() if s.name == "GroupQueryAttention"), None)
    return frozenset() if schema is None else frozenset({i.name for i in schema.inputs} | set(schema.attributes))


def _ort_has(*names):
    """Skip unless this onnxruntime's GroupQueryAttention has these inputs/attributes (1.32 has them all)."""
    missing = [n for n in names if n not in _ort_schema_names()]
    return pytest.mark.skipif(bool(missing), reason=f"onnxruntime {ort.__version__} lacks {missing}")


# ---------------------------------------------------------------- harness


def _model(inputs: dict, outputs=OUTS, **attrs):
    names = [n if inputs.get(n) is not None else "" for n in NAMES]
    while not names[-1]:
        names.pop()
    node = helper.make_node("GroupQueryAttention", names, list(outputs), domain=MS, name="gqa", **attrs)
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(inputs[n].dtype), list(inputs[n].shape))
           for n in names if n]
    model = helper.make_model(helper.make_graph([node], "g", vis, [onnx.ValueInfoProto(name=o) for o in outputs]),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    return model, {n: inputs[n] for n in names if n}


def _close(got, ref, what):
    assert got.dtype == ref.dtype, f"{what}: dtype {got.dtype} vs onnxruntime {ref.dtype}"
    assert got.shape == ref.shape, f"{what}: shape {got.shape} vs onnxruntime {ref.shape}"
    tol = 2e-3 if got.dtype == F16 else 1e-5
    g, e = got.astype(np.float64), ref.astype(np.float64)
    scale = max(1.0, float(np.abs(e).max())) if e.size else 1.0
    err = np.abs(g - e)
    assert (err <= tol * scale + tol * np.abs(e)).all(), \
        f"{what}: max error {err.max():.3g} at {np.unravel_index(np.argmax(err), err.shape)}"


def compare(inputs, outputs=OUTS, real_rows_only=False, **attrs):
    """Run both; compare as the module docstring says. Returns glassrt's outputs."""
    model, feeds = _model(inputs, outputs, **attrs)
    got, ref = _glassrt(model, feeds), _ort(model, feeds)
    assert len(got) == len(outputs)
    b, s = inputs["query"].shape[:2]
    total = inputs["seqlens_k"].reshape(-1).astype(int) + 1
    first_prompt = inputs.get("query_seqlens") is None and s == int(inputs["total_sequence_length"].reshape(-1)[0])
    if inputs.get("query_seqlens") is not None:
        new = inputs["query_seqlens"].astype(int)
        written = total
    else:
        new = np.full(b, s)
        written = new if first_prompt else total
    for name, g, r in zip(outputs, got, ref):
        if name == "y" and (real_rows_only or inputs.get("query_seqlens") is not None):
            real = np.minimum(total, s) if first_prompt else new
            for i in range(b):
                _close(g[i, :real[i]], r[i, :real[i]], f"{name}[{i}] rows < {real[i]}")
        elif name.startswith("present"):
            assert g.shape == r.shape, f"{name}: shape {g.shape} vs onnxruntime {r.shape}"
            for i in range(b):
                _close(g[i, :, :written[i]], r[i, :, :written[i]], f"{name}[{i}] rows < {written[i]}")
                assert not g[i, :, written[i]:].any(), f"{name}[{i}]: rows from {written[i]} on are not zero"
        else:
            _close(g, r, name)
    return got


def rand(*shape, seed, dtype=F32, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


def i32(*values):
    return np.array(values, np.int32)


# The steps of generation, per entry: seqlens_k (its total length - 1); past: the past buffer's
# length (None: no past inputs); total: total_sequence_length (default: past + sequence).
STEPS = {
    "prompt": dict(b=2, s=5, past=None, seqlens=[4, 4]),
    "padded_prompt": dict(b=3, s=5, past=None, seqlens=[4, 1, 2]),  # right-padded entries of 5, 2, 3 tokens
    "prompt_into_buffer": dict(b=2, s=4, past=8, total=4, seqlens=[3, 1]),  # a fixed-size (shared) cache
    "token": dict(b=2, s=1, past=6, seqlens=[6, 3]),  # entries of 7 and 4 tokens in a cache of 7 rows
    "token_in_buffer": dict(b=3, s=1, past=8, total=7, seqlens=[6, 2, 4]),
    "chunk": dict(b=1, s=3, past=5, seqlens=[7]),  # a later prompt chunk
}


def gqa_inputs(step, *, n=4, n_kv=2, head=8, dt=F32, packed=False, seed=0, rotary=None, max_pos=16):
    """The inputs of one STEPS entry; rotary: the rotary dim (cos/sin caches of max_pos rows)."""
    st = STEPS[step]
    b, s, past = st["b"], st["s"], st["past"]
    q, k, v = (rand(b, s, h * head, seed=seed + i, dtype=dt) for i, h in enumerate((n, n_kv, n_kv)))
    inputs = {"query": np.concatenate([q, k, v], axis=-1) if packed else q, "key": None if packed else k,
              "value": None if packed else v, "seqlens_k": i32(*st["seqlens"]),
              "total_sequence_length": np.array(st.get("total", s + (past or 0)), np.int32)}
    if past is not None:
        inputs["past_key"] = rand(b, n_kv, past, head, seed=seed + 3, dtype=dt)
        inputs["past_value"] = rand(b, n_kv, past, head, seed=seed + 4, dtype=dt)
    if rotary:
        inputs["cos_cache"], inputs["sin_cache"] = rope_caches(rotary, max_pos, dt)
    return inputs


def rope_caches(rotary, max_pos=16, dt=F32):
    """cos and sin caches (max_pos, rotary / 2), as the model builder makes them."""
    angles = np.arange(max_pos)[:, None] * 10000.0 ** (-np.arange(rotary // 2) / (rotary // 2))
    return np.cos(angles).astype(dt), np.sin(angles).astype(dt)


# ---------------------------------------------------------------- steps, layouts, head groups


@pytest.mark.parametrize("step", sorted(STEPS))
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("n, n_kv", [(4, 1), (4, 2), (8, 4), (4, 4)])
def test_steps_layouts_and_groups(step, packed, n, n_kv):
    compare(gqa_inputs(step, n=n, n_kv=n_kv, packed=packed), num_heads=n, kv_num_heads=n_kv)


def test_padded_prompt_rows_see_their_entry_only():
    """The compare is not vacuous: the entries' lengths change the output."""
    inputs = gqa_inputs("padded_prompt")
    y = compare(inputs, num_heads=4, kv_num_heads=2)[0]
    inputs["seqlens_k"] = i32(4, 4, 4)
    y_full = _glassrt(*_model(inputs, num_heads=4, kv_num_heads=2))[0]
    assert np.allclose(y[0], y_full[0]) and not np.allclose(y[1, 2:], y_full[1, 2:])


@pytest.mark.parametrize("step", ["padded_prompt", "token"])
def test_scale(step):
    compare(gqa_inputs(step), num_heads=4, kv_num_heads=2, scale=0.3)


# ---------------------------------------------------------------- rotary embedding


@pytest.mark.parametrize("step", ["padded_prompt", "token", "token_in_buffer", "chunk"])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rotary", [32, 16])  # the whole head, or its first half
def test_rotary(step, interleaved, rotary):
    compare(gqa_inputs(step, head=32, rotary=rotary), num_heads=4, kv_num_heads=2, do_rotary=1,
            rotary_interleaved=interleaved)


def test_rotary_packed_qkv():
    compare(gqa_inputs("padded_prompt", head=32, rotary=16, packed=True), num_heads=4, kv_num_heads=2, do_rotary=1)


@_ort_has("position_ids")
@pytest.mark.parametrize("step", ["token", "chunk", "padded_prompt"])
def test_rotary_position_ids(step):
    # In the first prompt onnxruntime reads position_ids[0, 0] only and counts up from it, for
    # every entry; later, each entry's ids as given.
    inputs = gqa_inputs(step, head=32, rotary=16)
    b, s = inputs["query"].shape[:2]
    inputs["position_ids"] = np.random.default_rng(5).integers(0, 16 - s, (b, s)).astype(np.int64)
    got = compare(inputs, num_heads=4, kv_num_heads=2, do_rotary=1)
    del inputs["position_ids"]
    assert not np.allclose(got[0], _glassrt(*_model(inputs, num_heads=4, kv_num_heads=2, do_rotary=1))[0])


# ---------------------------------------------------------------- masks and score transforms


@pytest.mark.parametrize("step", ["prompt", "token", "token_in_buffer", "chunk"])
@pytest.mark.parametrize("window", [1, 2, 4])
def test_local_window(step, window):
    compare(gqa_inputs(step), num_heads=4, kv_num_heads=2, local_window_size=window)


@pytest.mark.parametrize("general_loop", [False, True])
def test_local_window_padded_prompt(general_loop):
    # A padding row sees what its entry's last token sees, as in onnxruntime's general loop
    # (float16, softcap, smooth_softmax, head_sink, output_qk); its float32 fast loop slides
    # the window on past the real keys, so only the real rows are compared there.
    attrs = {"smooth_softmax": 1} if general_loop else {}
    compare(gqa_inputs("padded_prompt"), real_rows_only=not general_loop, num_heads=4, kv_num_heads=2,
            local_window_size=2, **attrs)


@pytest.mark.parametrize("step", ["padded_prompt", "token", "chunk"])
@pytest.mark.parametrize("attrs", [{"softcap": 0.5, "scale": 3.0}, {"softcap": 30.0}, {"smooth_softmax": 1},
                                   {"smooth_softmax": 1, "softcap": 1.0, "local_window_size": 2}])
def test_softcap_and_smooth_softmax(step, attrs):
    compare(gqa_inputs(step), num_heads=4, kv_num_heads=2, **attrs)


@_ort_has("head_sink")
@pytest.mark.parametrize("step", ["padded_prompt", "token"])
@pytest.mark.parametrize("smooth_softmax", [0, 1])
def test_head_sink(step, smooth_softmax):
    inputs = gqa_inputs(step)
    inputs["head_sink"] = rand(4, seed=9, scale=2.0)
    compare(inputs, num_heads=4, kv_num_heads=2, smooth_softmax=smooth_softmax)


@_ort_has("attention_bias")
@pytest.mark.parametrize("step", ["padded_prompt", "token", "token_in_buffer"])
@pytest.mark.parametrize("batch, heads", [(1, 1), ("b", 1), (1, "n"), ("b", "n")])
def test_attention_bias(step, batch, heads):
    inputs = gqa_inputs(step)
    b, s = inputs["query"].shape[:2]
    t = int(inputs["total_sequence_length"])
    inputs["attention_bias"] = rand(b if batch == "b" else 1, 4 if heads == "n" else 1, s, t, seed=7)
    compare(inputs, num_heads=4, kv_num_heads=2, softcap=2.0)  # (added after the softcap)


@_ort_has("causal")
@pytest.mark.parametrize("step", ["padded_prompt", "token", "chunk"])
def test_not_causal(step):
    compare(gqa_inputs(step), num_heads=4, kv_num_heads=2, causal=0)


@_ort_has("qk_output")
@pytest.mark.parametrize("qk_output", [1, 2])
@pytest.mark.parametrize("step", ["padded_prompt", "token_in_buffer", "chunk"])
def test_qk_output(qk_output, step):
    inputs = gqa_inputs(step)
    b, s = inputs["query"].shape[:2]
    inputs["attention_bias"] = rand(1, 4, s, int(inputs["total_sequence_length"]), seed=3)
    qk = compare(inputs, OUTS + ("qk",), num_heads=4, kv_num_heads=2, qk_output=qk_output, softcap=1.0)[3]
    if qk_output == 2:  # probabilities: each row sums to 1
        np.testing.assert_allclose(qk.sum(axis=-1), 1, rtol=1e-5)


@_ort_has("qk_output", "attention_bias")
@pytest.mark.parametrize("qk_output", [1, 2])
def test_query_rows_in_blocks(monkeypatch, qk_output):
    """A long prompt's scores are made a block of query rows at a time: blocks of one and two
    rows give onnxruntime's numbers, the bias, window and output_qk taken per block."""
    from glassrt.contrib import microsoft_gqa

    inputs = gqa_inputs("padded_prompt")
    inputs["attention_bias"] = rand(3, 1, 5, 5, seed=4)
    for rows in (1, 2):
        monkeypatch.setattr(microsoft_gqa, "_SCORES", rows * 3 * 4 * 5)  # batch · heads · keys per row
        compare(inputs, OUTS + ("qk",), num_heads=4, kv_num_heads=2, local_window_size=3, softcap=2.0,
                qk_output=qk_output)


# ---------------------------------------------------------------- float16


@pytest.mark.parametrize("step", ["padded_prompt", "token", "chunk"])
@pytest.mark.parametrize("attrs", [{}, {"do_rotary": 1, "local_window_size": 2}, {"softcap": 1.0, "smooth_softmax": 1}])
def test_float16(step, attrs):
    inputs = gqa_inputs(step, head=32, dt=F16, rotary=16 if attrs.get("do_rotary") else None)
    compare(inputs, num_heads=4, kv_num_heads=2, **attrs)


# ---------------------------------------------------------------- query_seqlens, chunks of a batch


@_ort_has("query_seqlens")
@pytest.mark.parametrize("rotary", [None, 16])
def test_query_seqlens(rotary):
    # Right-padded chunks of 3, 1 and 0 (an idle entry) tokens after 4, 2 and 3 cached ones.
    n, head = 4, 32 if rotary else 8
    q, k, v = (rand(3, 3, h * head, seed=i) for i, h in enumerate((n, 2, 2)))
    inputs = {"query": q, "key": k, "value": v, "past_key": rand(3, 2, 5, head, seed=3),
              "past_value": rand(3, 2, 5, head, seed=4), "seqlens_k": i32(6, 2, 2),
              "total_sequence_length": np.array(8, np.int32), "query_seqlens": i32(3, 1, 0)}
    if rotary:
        inputs["cos_cache"], inputs["sin_cache"] = rope_caches(rotary)
    compare(inputs, num_heads=n, kv_num_heads=2, local_window_size=3, do_rotary=int(bool(rotary)))


@_ort_has("query_seqlens")
def test_chunk_of_a_batch_matches_query_seqlens():
    """onnxruntime takes a later chunk of several entries only with query_seqlens; glassrt
    takes it without, as the same chunk with every row real."""
    b, s = 2, 3
    q, k, v = (rand(b, s, h * 8, seed=i) for i, h in enumerate((4, 2, 2)))
    inputs = {"query": q, "key": k, "value": v, "past_key": rand(b, 2, 5, 8, seed=3),
              "past_value": rand(b, 2, 5, 8, seed=4), "seqlens_k": i32(7, 4),
              "total_sequence_length": np.array(8, np.int32)}
    got = _glassrt(*_model(inputs, num_heads=4, kv_num_heads=2))
    ref = _ort(*_model(dict(inputs, query_seqlens=i32(s, s)), num_heads=4, kv_num_heads=2))
    for name, g, r in zip(OUTS, got, ref):
        _close(g, r, name)


# ---------------------------------------------------------------- a decode loop with symbolic dims


def test_decode_loop_with_symbolic_dims():
    """Prompt, then tokens, each step fed the presents of the one before, in one session with
    symbolic batch/sequence/past dims (as onnxruntime-genai's models declare them)."""
    from onnx import TensorProto, numpy_helper

    n, n_kv, head = 4, 2, 16
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("q", f, ["batch", "seq", n * head]),
              helper.make_tensor_value_info("k", f, ["batch", "seq", n_kv * head]),
              helper.make_tensor_value_info("v", f, ["batch", "seq", n_kv * head]),
              helper.make_tensor_value_info("pk", f, ["batch", n_kv, "past", head]),
              helper.make_tensor_value_info("pv", f, ["batch", n_kv, "past", head]),
              helper.make_tensor_value_info("sl", TensorProto.INT32, ["batch"]),
              helper.make_tensor_value_info("t", TensorProto.INT32, [])]
    cos, sin = rope_caches(head, max_pos=32)
    node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "pk", "pv", "sl", "t", "cos", "sin"],
                            ["a", "ck", "cv"], domain=MS, num_heads=n, kv_num_heads=n_kv, do_rotary=1)
    graph = helper.make_graph([node, helper.make_node("Relu", ["a"], ["y"])], "g", inputs,
                              [onnx.ValueInfoProto(name=o) for o in ("y", "ck", "cv")],
                              [numpy_helper.from_array(cos, "cos"), numpy_helper.from_array(sin, "sin")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    sess = glassrt.InferenceSession(model, providers=["cpu"], fallback="error")
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    b, s = 2, 5
    pk = np.zeros((b, n_kv, 0, head), F32)
    feeds = {"pk": pk, "pv": pk, "sl": i32(4, 2), "t": np.array(s, np.int32)}  # a padded prompt
    for step in range(4):
        feeds.update(q=rand(b, s, n * head, seed=step), k=rand(b, s, n_kv * head, seed=10 + step),
                     v=rand(b, s, n_kv * head, seed=20 + step))
        got, want = sess.run(None, feeds), ref.run(None, feeds)
        for name, g, r in zip(("y", "present_key", "present_value"), got, want):
            _close(g, r, f"step {step} {name}")
        s = 1
        feeds.update(pk=want[1], pv=want[2], sl=feeds["sl"] + 1, t=np.array(want[1].shape[2] + 1, np.int32))


# ---------------------------------------------------------------- errors


def _session(inputs, outputs=OUTS, **attrs):
    return glassrt.InferenceSession(_model(inputs, outputs, **attrs)[0], providers=["cpu"], fallback="error")


def _run_error(inputs, match, **attrs):
    model, feeds = _model(inputs, **attrs)
    with pytest.raises(glassrt.GlassrtError, match=match):
        _glassrt(model, feeds)


@pytest.mark.parametrize("change, match", [
    (dict(num_heads=3), r"num_heads \(3\) must be a multiple of kv_num_heads \(2\)"),
    (dict(kv_num_heads=0), "must be positive"),
    (dict(query=rand(5, 32, seed=0)), "query must be 3-D"),
    (dict(key=rand(2, 4, 16, seed=0)), r"key must be \(batch, sequence, kv_num_heads·head_size\) = \[2, 5, 16\]"),
    (dict(value=rand(2, 5, 12, seed=0)), r"value must be .* = \[2, 5, 16\], got \[2, 5, 12\]"),
    (dict(value=None), "key and value go together"),
    (dict(query=rand(2, 5, 30, seed=0)), "hidden size 30 is not a multiple of num_heads 4"),
    (dict(query=rand(2, 5, 68, seed=0), key=None, value=None), "packed QKV's hidden size 68"),
    (dict(past_key=rand(2, 1, 6, 8, seed=0), past_value=rand(2, 1, 6, 8, seed=0)), r"past_key must be .*\[2, 2, past, 8\]"),
    (dict(past_value=None), "past_key and past_value go together"),
    (dict(seqlens_k=np.array([4, 4], np.int64)), "seqlens_k must be int32"),
    (dict(sliding_window_cache=1, local_window_size=2), "sliding_window_cache=1 .* not supported"),
    (dict(causal=0, local_window_size=2), "causal=0 with a local_window_size"),
    (dict(do_rotary=1), "do_rotary=1 needs cos_cache and sin_cache"),
    (dict(q_norm_weight=rand(8, seed=0), k_norm_weight=rand(8, seed=0)), "q_norm_weight / k_norm_weight"),
    (dict(k_scale=np.ones(1, F32), v_scale=np.ones(1, F32)), "k_scale / v_scale"),
    (dict(kv_cache_bit_width=8), "quantized KV cache"),
    (dict(qk_output=3), "qk_output must be 0, 1 or 2"),
])
def test_refused_at_session_creation(change, match):
    """Wrong shapes and types, and what glassrt does not run, name the node and the problem
    before any run."""
    inputs = gqa_inputs("prompt")
    attrs = {"num_heads": 4, "kv_num_heads": 2}
    for key, value in change.items():
        (inputs if key in NAMES else attrs)[key] = value
    if "past_value" in change and change["past_value"] is None:
        inputs["past_key"] = rand(2, 2, 6, 8, seed=0)
    with pytest.raises(glassrt.GlassrtError, match=match) as err:
        _session(inputs, **attrs)
    assert "gqa" in str(err.value)  # the node


def test_output_qk_needs_qk_output():
    model, feeds = _model(gqa_inputs("prompt"), OUTS + ("qk",), num_heads=4, kv_num_heads=2)
    with pytest.raises(glassrt.GlassrtError, match="output_qk output needs qk_output"):
        _glassrt(model, feeds)


@pytest.mark.parametrize("step, change, match", [
    ("prompt", dict(seqlens_k=i32(4, 5)), r"seqlens_k holds 4\.\.5: each must be in \[0, 5\)"),
    ("token", dict(seqlens_k=i32(7, 3)), r"seqlens_k holds 3\.\.7: each must be in \[0, 7\)"),
    ("token", dict(seqlens_k=i32(-1, 3)), r"seqlens_k holds -1\.\.3"),
    ("token", dict(seqlens_k=i32(6, 3, 2)), r"seqlens_k must have batch_size \(2\) elements, got 3"),
    ("chunk", dict(seqlens_k=i32(1)), r"seqlens_k\[0\] = 1 is too small for the sequence length 3"),
    # a past buffer too short for total_sequence_length (a token after 6 cached rows of 4)
    ("token", dict(total_sequence_length=np.array(8, np.int32)), r"total_sequence_length \(8\) must be past_key's"),
    ("prompt", dict(total_sequence_length=np.array(4, np.int32)), r"total_sequence_length \(4\) must be positive and "
                                                                   r"at least the sequence length \(5\)"),
    ("token", dict(total_sequence_length=i32(7, 7)), "total_sequence_length must have one element"),
    ("token", dict(head_sink=rand(3, seed=0)), r"head_sink must be \(num_heads,\) = \[4\], got \[3\]"),
    ("token", dict(attention_bias=rand(2, 4, 1, 6, seed=0)), r"attention_bias must be .* = \[2, 4, 1, 7\]"),
])
def test_refused_at_run(step, change, match):
    inputs = gqa_inputs(step)
    inputs.update(change)
    _run_error(inputs, match, num_heads=4, kv_num_heads=2)


def test_huge_total_sequence_length_allocates_nothing():
    """A fed total_sequence_length is checked against the shapes before anything is sized by it."""
    inputs = gqa_inputs("token")
    inputs["total_sequence_length"] = np.array(2 ** 31 - 1, np.int32)
    _run_error(inputs, r"total_sequence_length \(2147483647\) must be past_key's length \+ the sequence length",
               num_heads=4, kv_num_heads=2)


def test_memory_limit():
    """What the kernel allocates (the caches, the scores) is checked against the session's
    memory limit before it is allocated: a token after 60000 cached rows needs 15 MB of caches."""
    inputs = gqa_inputs("token")
    small = glassrt.SessionOptions(memory_limit_bytes=4 << 20)
    model, feeds = _model(inputs, num_heads=4, kv_num_heads=2)
    glassrt.InferenceSession(model, small, providers=["cpu"], fallback="error").run(None, feeds)  # a small one runs
    inputs["past_key"] = inputs["past_value"] = np.zeros((2, 2, 60000, 8), F32)
    inputs["seqlens_k"], inputs["total_sequence_length"] = i32(60000, 5), np.array(60001, np.int32)
    model, feeds = _model(inputs, num_heads=4, kv_num_heads=2)
    with pytest.raises(glassrt.GlassrtError, match="over the session's memory limit"):
        glassrt.InferenceSession(model, small, providers=["cpu"], fallback="error").run(None, feeds)


def test_rotary_positions_outside_the_caches():
    inputs = gqa_inputs("token", head=32, rotary=16, max_pos=7)  # rows for positions 0..6: the cache's 7
    _run_error(dict(inputs, position_ids=np.array([[9], [2]], np.int64)), "outside the caches' 7 rows",
               num_heads=4, kv_num_heads=2, do_rotary=1)
    _run_error(gqa_inputs("token", head=32, rotary=16, max_pos=6), "cos_cache has 6 rows, fewer than "
               r"total_sequence_length \(7\)", num_heads=4, kv_num_heads=2, do_rotary=1)
    _run_error(gqa_inputs("token", head=8, rotary=16), r"rotary dim 2·cos_cache.shape\[1\] = 16 must be in "
               r"\(0, head_size 8\]", num_heads=4, kv_num_heads=2, do_rotary=1)


@_ort_has("query_seqlens")
def test_query_seqlens_refusals():
    inputs = gqa_inputs("chunk")
    _run_error(dict(inputs, query_seqlens=i32(4)), r"query_seqlens\[0\] = 4 must be in \[0, min\(sequence length, "
               r"seqlens_k \+ 1\)\] = \[0, 3\]", num_heads=4, kv_num_heads=2)
    _run_error(dict(inputs, query_seqlens=i32(1)), r"query_seqlens\[0\] = 1 leaves 7 cached tokens: past_key has 5",
               num_heads=4, kv_num_heads=2)
    with pytest.raises(glassrt.GlassrtError, match="query_seqlens needs past_key and past_value"):
        _session(dict(gqa_inputs("prompt"), query_seqlens=i32(5, 5)), num_heads=4, kv_num_heads=2)


# ---------------------------------------------------------------- glassrt check


def test_glassrt_check_passes():
    from glassrt.tools import check as checks

    rows = checks.run_checks("GroupQueryAttention", builtins=False)
    assert {r.check for r in rows if r.status == "pass"} >= {"meta_vs_real", "dtype_coverage", "dynamic_dims"}
    assert not [(r.check, r.message) for r in rows if r.status == "fail"]
