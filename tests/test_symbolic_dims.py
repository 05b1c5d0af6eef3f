"""glassrt.symbolic: the dim algebra that replaced SymPy.

A differential test of the algebra against plain Python ints, the comparison rules
(decided for every positive value of the symbols, TypeError when that depends on them),
canonical equality, the SymPy-compatible text, and explain's strings on symbolic models.
"""
from __future__ import annotations

import copy
import operator
import pickle
import random
import re
import subprocess
import sys

import numpy as np
import pytest
from onnx import helper

import glassrt
from glassrt import symbolic
from glassrt.symbolic import Dim, maximum, minimum, symbol

from .helpers import init, model, tensor

NAMES = ("batch", "seq", "past")
B, S, P = (symbol(n) for n in NAMES)


# ---------------------------------------------------------------- the differential test


def _leaf(rng, names):
    if rng.random() < 0.6:
        n = rng.choice(names)
        return symbol(n), lambda env, n=n: env[n]
    k = rng.randint(-3, 6)
    return k, lambda env, k=k: k


def _tree(rng, depth, names):
    """(dim, f) with f(env) the same expression computed on Python ints."""
    if depth == 0 or rng.random() < 0.25:
        return _leaf(rng, names)
    op = rng.choice(["+", "-", "*", "//", "%", "max", "min", "neg"])
    a, fa = _tree(rng, depth - 1, names)
    if op == "neg":
        return -a, lambda env: -fa(env)
    if op in ("//", "%") and rng.random() < 0.7:
        k = rng.choice([2, 3, 4, 8, 768, -2])
        b, fb = k, lambda env, k=k: k
    else:
        b, fb = _tree(rng, depth - 1, names)
    if op in ("max", "min"):
        pick = maximum if op == "max" else minimum
        py = max if op == "max" else min
        return pick(a, b), lambda env: py(fa(env), fb(env))
    fn = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv, "%": operator.mod}[op]
    return fn(a, b), lambda env: fn(fa(env), fb(env))


def _trees(seed, count, names=NAMES, depth=4):
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        try:
            out.append(_tree(rng, depth, names))
        except ZeroDivisionError:  # a constant divisor of 0: Python ints raise too
            continue
    return out


def _bindings(rng, names=NAMES, n=4):
    return [{k: rng.choice([1, 1, 2, 3, 5, 7, 12, 64]) for k in names} for _ in range(n)]


@pytest.mark.parametrize("seed", range(4))
def test_dims_evaluate_like_python_ints(seed):
    rng = random.Random(1000 + seed)
    for d, f in _trees(seed, 250):
        compiled = symbolic.compile_dims(NAMES, (d,))
        for env in _bindings(rng):
            try:
                want = f(env)
            except ZeroDivisionError:
                continue
            got = symbolic.evaluate(d, env)
            assert type(got) is int and got == want, (str(d), env, got, want)
            assert compiled(*(env[n] for n in NAMES)) == [want], (str(d), env)


@pytest.mark.parametrize("seed", range(3))
def test_decided_comparisons_hold_for_every_binding(seed):
    """A comparison that answers must be right for every positive binding; one that
    depends on the values raises TypeError."""
    rng = random.Random(2000 + seed)
    trees = _trees(50 + seed, 120, depth=3)
    answered = 0
    for (x, fx), (y, fy) in zip(trees, trees[1:]):
        for op in (operator.lt, operator.le, operator.gt, operator.ge):
            try:
                verdict = op(x, y)
            except TypeError:
                continue
            answered += 1
            assert type(verdict) is bool
            for env in _bindings(rng, n=6):
                try:
                    assert verdict == op(fx(env), fy(env)), (str(x), op.__name__, str(y), env)
                except ZeroDivisionError:
                    pass
    assert answered > 50


def test_symbols_are_positive_integers_in_comparisons():
    assert B > 0 and B >= 1 and not (B < 1) and not (B <= 0)
    assert B + 1 > B and 2 * B > B and B * S >= B and B - 1 >= 0
    assert B // 2 < B and B // 2 >= 0 and (B - 1) // 2 >= 0 and B % 3 < 3 and -B < 0
    assert B > 0.5 and B < float("inf") and B >= -2.5 and not (B < 0.5) and B + 2**62 > 2**62
    assert max(B, B + 1) == B + 1 and min(B, 2 * B) == B
    for undecidable in (lambda: B > 1, lambda: B > 3, lambda: B < S, lambda: B - S >= 0, lambda: max(B, 3),
                        lambda: B // 2 > 1, lambda: B * B - 2 * B > 0, lambda: maximum(B, S) > S):
        with pytest.raises(TypeError, match="cannot determine truth value"):
            undecidable()


def test_equality_is_structural_on_the_canonical_polynomial():
    assert B * 2 == 2 * B and hash(B * 2) == hash(2 * B)
    assert (B + 1) * (S + 2) == B * S + 2 * B + S + 2
    assert hash((B + 1) * (S + 2)) == hash(S * B + S + 2 * B + 2)
    assert (B + 1) * 2 - 2 == 2 * B and B + S - B == S
    assert 768 * B // 768 == B and B * S // S == B
    assert (B == 1) is False and (B != 1) is True and B != S and B - B == 0 and type(B - B) is int
    assert {2 * B: "x"}[B * 2] == "x" and len({B + S, S + B, B * 1 + S}) == 1
    rng = random.Random(7)
    for _ in range(50):  # the same sum of products, in shuffled orders
        terms = [(rng.randint(-5, 5), [rng.choice((B, S, P)) for _ in range(rng.randint(0, 3))]) for _ in range(4)]
        total = []
        for order in range(2):
            rng.shuffle(terms)
            acc = 0
            for c, factors in terms:
                t = c
                for f in rng.sample(factors, len(factors)):
                    t = t * f
                acc = acc + t
            total.append(acc)
        assert total[0] == total[1] and hash(total[0]) == hash(total[1])


def test_simplifications_sympy_made_and_a_few_more():
    H = symbol("H")
    assert (2 * B + 1) // 2 == B and (2 * B + 2) // 2 == B + 1 and B // 1 == B and B % 1 == 0
    assert (2 * B) % 2 == 0 and (B * S + S) // S == B + 1 and (B * S * 64) // (B * 4) == 16 * S
    assert (H + 2 - 3) // 1 + 1 == H and (B % 4) // 4 == 0 and (B % 4) % 8 == B % 4
    assert 3 // (B + 3) == 0 and B % (B + 1) == B
    assert maximum(B, 1) == B and maximum(maximum(B, S), S) == maximum(B, S) and maximum(3, 5) == 5
    assert maximum(B, minimum(B, 5)) == B and maximum(B, B + S) == B + S and minimum(B, 1) == 1
    assert symbolic.exact_div(768 * B * S, 12 * B) == 64 * S
    assert symbolic.exact_div(B * P * 768 + B * 768, 64 * P + 64) == 12 * B  # (past + 1) cancels
    assert symbolic.exact_div(B, 2) is None and symbolic.exact_div(6, B) is None


@pytest.mark.parametrize("expr, text", [
    (lambda: B * 2, "2*batch"),
    (lambda: S * B, "batch*seq"),
    (lambda: B * S * 768, "768*batch*seq"),
    (lambda: 1 + P, "past + 1"),
    (lambda: S + P, "past + seq"),
    (lambda: 1 - B, "1 - batch"),
    (lambda: -B, "-batch"),
    (lambda: B * B * S + B + 1, "batch**2*seq + batch + 1"),
    (lambda: (symbol("H") - 3) // 2 + 1, "floor(H/2 - 3/2) + 1"),
    (lambda: (4 * B + 2) // 6, "floor(2*batch/3 + 1/3)"),
    (lambda: -(-B // 768), "-floor(-batch/768)"),
    (lambda: B - B // 3, "batch - floor(batch/3)"),
    (lambda: B // (2 * S), "floor(batch/(2*seq))"),
    (lambda: B % 2, "Mod(batch, 2)"),
    (lambda: (B + S) % 2, "Mod(batch + seq, 2)"),
    (lambda: 2 * (B % 2), "2*(Mod(batch, 2))"),
    (lambda: maximum(S, symbol("range__1")), "Max(range__1, seq)"),
    (lambda: P + maximum(S, B), "past + Max(batch, seq)"),
    (lambda: maximum(B, 3), "Max(3, batch)"),
    (lambda: 128 * B * (P + maximum(S, B)) * maximum(S, B), "128*batch*(past + Max(batch, seq))*Max(batch, seq)"),
    (lambda: (B + 1) * (B + 1), "(batch + 1)**2"),
    (lambda: 2 * (B + 1), "2*batch + 2"),
])
def test_text_is_sympys(expr, text):
    d = expr()
    assert str(d) == text and repr(d) == text


def test_numpy_integers_pickling_and_conversions():
    assert B * np.int64(3) == 3 * B and np.int64(3) * B == 3 * B and B + np.int32(2) == B + 2
    assert symbolic.normalize(np.int64(4)) == 4 and type(symbolic.normalize(np.int64(4))) is int
    assert symbolic.prod([B, np.int64(2), 3]) == 6 * B and symbolic.prod([2, np.int64(3)]) == 6
    values = np.array([B, 3], dtype=object)
    assert list(values * 2) == [2 * B, 6] and list(values // 2) == [B // 2, 1]
    for d in (B, 3 * B * (S + 1), maximum(B, S) // 2 + P % 3):
        assert pickle.loads(pickle.dumps(d)) == d and str(pickle.loads(pickle.dumps(d))) == str(d)
        assert copy.deepcopy(d) == d
    for bad in (lambda: int(B), lambda: float(B), lambda: [0][B], lambda: range(B), lambda: B / 2,
                lambda: B + 0.5, lambda: B + True):
        with pytest.raises(TypeError):
            bad()
    assert symbolic.free_names(B * S + maximum(P, 2)) == {"batch", "seq", "past"}
    assert symbolic.evaluate(B * S + P, {"batch": np.int64(2)}) == 2 * S + P
    assert symbolic.shifted_symbol(P + 1) == ("past", 1) and symbolic.shifted_symbol(P) == ("past", 0)
    assert symbolic.shifted_symbol(2 * P) is None and symbolic.shifted_symbol(P + S) is None
    assert symbolic.is_symbol(B) and not symbolic.is_symbol(B + 1) and symbolic.symbol_name(S) == "seq"
    assert isinstance(B, Dim) and symbolic.symbol("batch") is B


# ---------------------------------------------------------------- explain on symbolic models


def _shapes(report):
    return {o["name"]: o["shape"] for n in report["nodes"] for o in n["outputs"]}


def test_explain_strings_on_symbolic_models():
    from glassrt.tools import bench_models as bm

    bert = glassrt.InferenceSession(bm.bert(layers=1, hidden=64, heads=4, intermediate=128, vocab=100))
    report = bert.explain()
    assert report["inputs"][0]["shape"] == ["batch", "sequence"]
    shapes = [s for s in _shapes(report).values() if s and any(isinstance(d, str) for d in s)]
    assert ["batch", "sequence", 64] in shapes and ["batch", 4, "sequence", "sequence"] in shapes
    # (FusedMatMul counts its bias and mask adds, one per output each, as Gemm counts its C)
    assert report["summary"]["flops"] == "260*batch*sequence**2 + 66112*batch*sequence + 8256*batch"

    gpt2 = glassrt.InferenceSession(bm.gpt2(layers=1, hidden=64, heads=4, vocab=100, max_positions=64))
    report = gpt2.explain()
    texts = {str(d) for s in _shapes(report).values() if s for d in s}
    assert any(re.fullmatch(r"Max\(range__\d+, sequence\)", t) for t in texts)
    assert any(re.fullmatch(r"past_sequence \+ Max\(range__\d+, sequence\)", t) for t in texts)
    flops = {n["op"]: n["flops"] for n in report["nodes"] if isinstance(n["flops"], str)}
    # the attention (fused over the KV cache): 2 * 4 heads * 16 wide * (Q·Kᵀ + P·V) per query and key
    assert re.fullmatch(r"256\*batch\*\(past_sequence \+ Max\(range__(\d+), sequence\)\)"
                        r"\*Max\(range__\1, sequence\)", flops["ScaledDotProductAttention"])

    w = init("w", np.ones((4, 3, 3, 3), np.float32))
    conv = model([helper.make_node("Conv", ["x", "w"], ["c"], strides=[2, 2], pads=[0, 1, 0, 1]),
                  helper.make_node("Flatten", ["c"], ["y"], axis=1)],
                 [tensor("x", ["batch", 3, "H", "W"])], [tensor("y", None)], [w], opset=17)
    report = glassrt.InferenceSession(conv, providers=["cpu"]).explain()
    assert _shapes(report)["c"] == ["batch", 4, "floor(H/2 - 3/2) + 1", "floor(W/2 - 1/2) + 1"]
    assert _shapes(report)["y"] == ["batch", "(4*floor(H/2 - 3/2) + 4)*(floor(W/2 - 1/2) + 1)"]  # as SymPy wrote it
    assert report["summary"]["flops"] == "216*batch*(floor(H/2 - 3/2) + 1)*(floor(W/2 - 1/2) + 1)"
    bound = glassrt.InferenceSession(conv, providers=["cpu"]).explain({"batch": 2, "H": 9, "W": 8})
    assert _shapes(bound)["c"] == [2, 4, 4, 4]


def test_glassrt_never_imports_sympy():
    """The point of the algebra: a session, a run, explain and a KV-cache decode without
    SymPy in the process (a fresh one: onnxruntime in the test process may import it)."""
    code = """if True:
        import sys
        import glassrt
        from glassrt.tools import bench_models as bm
        s = glassrt.InferenceSession(bm.bert(layers=1, hidden=64, heads=4, intermediate=128, vocab=100))
        s.run(None, bm.bert_feeds(2, 5, vocab=100))
        s.explain()
        g = glassrt.InferenceSession(bm.gpt2(layers=1, hidden=64, heads=4, vocab=100, max_positions=64))
        feeds = bm.gpt2_feeds(1, 0, layers=1, heads=4, head_dim=16, vocab=100, sequence=3)
        names = [o.name for o in g.get_outputs()]
        for _ in range(3):
            out = dict(zip(names, g.run(None, feeds)))
            feeds = {"input_ids": out["logits"][:, -1:].argmax(-1),
                     **{k: out[k.replace("past_key_values", "present")] for k in feeds if k != "input_ids"}}
        print("sympy" in sys.modules)
    """
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize("seed", range(2))
def test_the_sampled_shortcut_changes_no_decision(seed, monkeypatch):
    """bounds._both_sides answers None where values on both sides of the comparison are
    found; the full search must agree on every comparison (it can never decide one that
    holds only for some values)."""
    from glassrt.symbolic import bounds
    from glassrt.symbolic.expr import _poly

    trees = _trees(90 + seed, 120, depth=3)
    pairs = [(x, y) for (x, _), (y, _) in zip(trees, trees[1:])]
    with_shortcut = [bounds.decide(_poly(x - y), t) for x, y in pairs for t in (0, 1)]
    monkeypatch.setattr(bounds, "_both_sides", lambda p, t: False)
    assert with_shortcut == [bounds.decide(_poly(x - y), t) for x, y in pairs for t in (0, 1)]


def test_independent_symbols_are_undecided_without_the_search(monkeypatch):
    """A YOLOv8's broadcast compares products of Range and Resize lengths (independent
    symbols): values on both sides are found by evaluating, not by the relaxations' search
    (~9 ms a comparison, 0.1 s of that model's session creation)."""
    from glassrt.symbolic import bounds
    from glassrt.symbolic.expr import _poly

    r = [symbolic.symbol(f"range__{i}") for i in range(4)]
    h, w = symbolic.symbol("resize__0"), symbolic.symbol("resize__1")
    d = r[0] * r[1] + r[2] * r[3] - h * w - (h // 2) * (w // 2) - 2
    monkeypatch.setattr(bounds, "_lower", lambda p: pytest.fail("searched"))
    assert bounds.decide(_poly(d), 0) is None and bounds.decide(_poly(-d), 0) is None
    with pytest.raises(TypeError, match="cannot determine truth value"):
        bool(d >= 0)
