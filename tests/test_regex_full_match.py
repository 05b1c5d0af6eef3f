"""RegexFullMatch runs on RE2 (google-re2, onnxruntime's engine): its syntax, and time linear
in the text. Python's re, which it ran on before, backtracks: a model's "(a+)+$" hung its
session. Where RE2 is missing, the patterns are translated for re (_translate_re2)."""
from __future__ import annotations

import time

import numpy as np
import pytest
from onnx import TensorProto, helper

import glassrt
from glassrt.errors import GlassrtError
from glassrt.kernels.cpu import strings


def _model(pattern):
    node = helper.make_node("RegexFullMatch", ["x"], ["y"], name="match", pattern=pattern)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.STRING, [None])],
                          [helper.make_tensor_value_info("y", TensorProto.BOOL, [None])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    m.ir_version = 9
    return m.SerializeToString()


def _match(pattern, texts):
    return glassrt.InferenceSession(_model(pattern)).run(None, {"x": np.array(texts, dtype=object)})[0].tolist()


@pytest.mark.parametrize("pattern, text", [("(a+)+$", "a" * 40 + "!"), ("(x+x+)+y", "x" * 40)])
def test_a_backtracking_pattern_takes_linear_time(pattern, text):
    t = time.perf_counter()
    assert _match(pattern, [text]) == [False]
    assert time.perf_counter() - t < 5  # (Python's re: minutes)


@pytest.mark.parametrize("pattern", ["a{1001}", r"a\Z", r"(a)\1", "(?=a)a", "a**"])
def test_what_re2_refuses_fails_naming_the_node(pattern):
    with pytest.raises(GlassrtError, match="'match'.*invalid regex"):
        _match(pattern, ["a"])


CASES = [(r"\d+", ["123", "12a", "١٢"]), (r"[[:alpha:]]+\s?", ["abc ", "ab1"]), (r"(?i)hello", ["HeLLo", "help"]),
         (r"\Qa.b\E", ["a.b", "axb"]), (r"(?P<y>\d{4})-\d{2}", ["2024-01", "24-01"]), (r"\w+@\w+\.com", ["a@b.com", "a@b.org"])]


@pytest.mark.parametrize("pattern, texts", CASES)
def test_re_on_translated_patterns_agrees_with_re2(monkeypatch, pattern, texts):
    """The fallback where google-re2 has no wheel gives RE2's answers on RE2 syntax it can express."""
    pytest.importorskip("re2")
    want = _match(pattern, texts)
    monkeypatch.setattr(strings, "_re2_fullmatch", lambda pattern: None)
    assert _match(pattern, texts) == want
