"""The onednn provider's products of two computed values (attention's Q·Kᵀ and P·V) with
FusedMatMul's epilogue. Where oneDNN's matmul is its sgemm (AVX2), a bias or Z that
broadcasts is written into the output first and the product added onto it, alpha given as
A's run-time scale (matmul._batched_primitive). Equal to the cpu provider in every form of
the epilogue, with A and B read through perms as attention reads them; judged on any CPU
(`_SLOW_BROADCAST_POST_OPS` widened so that every implementation counts as sgemm's)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper

import glassrt
from glassrt.kernels.onednn import capi

from .helpers import init, model

pytestmark = pytest.mark.skipif(capi.UNAVAILABLE is not None, reason=f"oneDNN: {capi.UNAVAILABLE}")
RNG = np.random.default_rng(5)
S, H, D = 16, 3, 8


def _run(m, feeds, providers):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = glassrt.InferenceSession(m.SerializeToString(), providers=providers)
    return s, s.run(None, feeds)[0]


def _scores(alpha=0.125, z_shape=None, bias=False, act=""):
    """Q·Kᵀ over (1, S, H, D) inputs read as (1, H, S, D) and (1, H, D, S), as attention does."""
    attrs = dict(alpha=alpha, perm_a=[0, 2, 1, 3], perm_b=[0, 2, 3, 1])
    if act:
        attrs["activation"] = act
    inputs = ["q", "k", "b" if bias else "", "z" if z_shape else ""]
    while inputs[-1] == "":
        inputs.pop()
    node = helper.make_node("FusedMatMul", inputs, ["y"], name="qk", domain="glassrt", **attrs)
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, S, H, D]) for n in ("q", "k")]
    if z_shape:
        ins.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, list(z_shape)))
    inits = [init("b", RNG.standard_normal(S).astype(np.float32))] if bias else []
    m = model([node], ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits, opset=17,
              domains={"glassrt": 1})
    feeds = {"q": RNG.standard_normal((1, S, H, D), dtype=np.float32),
             "k": RNG.standard_normal((1, S, H, D), dtype=np.float32)}
    if z_shape:
        feeds["z"] = RNG.standard_normal(z_shape, dtype=np.float32)
    return m, feeds


def _made():
    from glassrt.kernels.onednn import kernels, matmul

    return [v for v in kernels._SHARED.values() if isinstance(v, matmul._Batched)]


@pytest.mark.parametrize("alpha, z_shape, bias, act", [
    (0.125, None, False, ""),  # alpha alone: A's run-time scale
    (0.125, (1, 1, 1, S), False, ""),  # a padding mask: prefilled
    (1.0, (1, 1, S, S), False, ""),  # a causal mask, alpha 1
    (0.5, (1, H, S, S), False, ""),  # a Z of the output's shape: a binary post-op still
    (0.25, (S,), True, "Relu"),  # bias and Z, then an activation
    (1.0, None, True, "Tanh"),  # a bias alone
])
def test_equal_to_cpu_with_every_epilogue(monkeypatch, alpha, z_shape, bias, act):
    from glassrt.kernels.onednn import kernels, matmul

    monkeypatch.setattr(matmul, "_SLOW_BROADCAST_POST_OPS", ("",))
    monkeypatch.setattr(kernels, "_SHARED", {})
    m, feeds = _scores(alpha, z_shape, bias, act)
    s, got = _run(m, feeds, ["onednn", "cpu"])
    _, want = _run(m, feeds, ["cpu"])
    kernel = {n["name"]: n.get("kernel") for n in s.explain()["nodes"]}["qk"]
    assert kernel == "onednn.FusedMatMul.batched_matmul"
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    got_again = s.run(None, feeds)[0]  # the prefill is written again at every run
    np.testing.assert_array_equal(got_again, got)
    broadcasts = bias or (z_shape is not None and list(z_shape) != [1, H, S, S])
    made = _made()  # (one per OpenMP thread count the product was judged or bound at)
    assert made and all(m.prefill == broadcasts and (m.alpha is not None) == (alpha != 1.0) for m in made)


def _assert_post_ops_kept():
    """The masked scores equal cpu's, every descriptor with the mask and alpha as post-ops."""
    m, feeds = _scores(0.125, (1, 1, 1, S))
    _, got = _run(m, feeds, ["onednn", "cpu"])
    _, want = _run(m, feeds, ["cpu"])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    made = _made()
    assert made and all(not m.prefill and m.alpha is None and m.z_arg is not None for m in made)


def test_other_implementations_keep_their_post_ops(monkeypatch):
    """Where the matmul is not sgemm's, the epilogue stays as post-ops (brgemm's run in its tiles)."""
    from glassrt.kernels.onednn import kernels, matmul

    monkeypatch.setattr(matmul, "_SLOW_BROADCAST_POST_OPS", ("no implementation is named this",))
    monkeypatch.setattr(kernels, "_SHARED", {})
    _assert_post_ops_kept()


def test_a_second_thread_count_binds_its_own_primitive(monkeypatch):
    """Each OpenMP thread count gets its own descriptor and primitive (oneDNN's kernels are
    built for one), the prefill and scale with it; results equal at both counts."""
    from glassrt.kernels.onednn import kernels, matmul

    monkeypatch.setattr(matmul, "_SLOW_BROADCAST_POST_OPS", ("",))
    monkeypatch.setattr(kernels, "_SHARED", {})
    m, feeds = _scores(0.125, (1, 1, 1, S))
    results = []
    for threads in (1, 2):
        options = glassrt.SessionOptions(intra_op_num_threads=threads)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            s = glassrt.InferenceSession(m.SerializeToString(), options, providers=["onednn", "cpu"])
        results.append(s.run(None, feeds)[0])
    _, want = _run(m, feeds, ["cpu"])
    for got in results:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert all(m.prefill and m.alpha is not None for m in _made())


def test_a_refused_prefill_keeps_the_post_ops(monkeypatch):
    """Where oneDNN has no implementation of the prefill's form (A's scale, a sum post-op),
    the product keeps its first descriptor, post-ops and all, and stays exact."""
    from glassrt.kernels.onednn import dnnl, kernels, matmul

    made_with = dnnl.matmul

    def refusing(*mds, attr=None, **kw):
        post = getattr(attr, "post_ops", None)
        if post is not None and any(op[0] == "sum" for op in post.ops):
            raise capi.DnnlError("dnnl_matmul_primitive_desc_create", capi.unimplemented)
        return made_with(*mds, attr=attr, **kw)

    monkeypatch.setattr(dnnl, "matmul", refusing)
    monkeypatch.setattr(matmul, "_SLOW_BROADCAST_POST_OPS", ("",))
    monkeypatch.setattr(kernels, "_SHARED", {})
    _assert_post_ops_kept()
