"""Every ONNX node test case, native-only and with the default providers.

Regenerates RESULTS.md (the per-op pass table) and asserts the pass counts never drop
below the committed floor, which was measured with the onnx minor version it names
(the case list changes between onnx releases).
"""
from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from tests.conformance.node_cases import per_op_table, run_all, summarize

HERE = Path(__file__).parent
FLOOR = json.loads((HERE / "floor.json").read_text())


@pytest.fixture(scope="module")
def results():
    res = run_all()
    (HERE / "RESULTS.md").write_text(per_op_table(res))
    return res


def _same_onnx_minor():
    return onnx.__version__.split(".")[:2] == FLOOR["onnx"].split(".")[:2]


@pytest.mark.parametrize("mode", ["native", "default"])
def test_pass_count_floor(results, mode):
    counts = summarize(results)
    if not _same_onnx_minor():
        pytest.skip(f"floor measured with onnx {FLOOR['onnx']}, running {onnx.__version__}")
    assert counts["total"] == FLOOR["total"], "the onnx case list changed: re-measure the floor"
    assert counts[mode] >= FLOOR[mode], (
        f"{mode}: {counts[mode]} of {counts['total']} node test cases pass, below the floor of {FLOOR[mode]}; "
        "see tests/conformance/RESULTS.md")


def test_default_never_worse_than_native(results):
    native = {n for n, (s, _) in results["native"].items() if s == "pass"}
    default = {n for n, (s, _) in results["default"].items() if s == "pass"}
    assert native - default == set(), "cases that pass natively but fail once reference is allowed"
