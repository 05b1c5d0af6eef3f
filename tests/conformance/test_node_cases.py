"""Every ONNX node test case, native-only and with the default providers.

Asserts the pass counts never drop below the committed floor, which was measured with
the onnx minor version it names (the case list changes between onnx releases), and that
no op passes fewer cases than the committed per-op table (RESULTS.md) says. The table of
this run is written outside the source tree (the test's temporary folder, or the path in
GLASSRT_RESULTS_OUT); `python -m tests.conformance.node_cases --results
tests/conformance/RESULTS.md` regenerates the committed one.

Under CI (CI=1, set by .ci/run) another onnx minor version is a failure, not a skip: the
floor would silently stop guarding anything.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import onnx
import pytest

from tests.conformance.node_cases import per_op_table, run_all, summarize

HERE = Path(__file__).parent
FLOOR = json.loads((HERE / "floor.json").read_text())
MARGIN = {m: FLOOR["measured"][m] - FLOOR[m] for m in ("native", "default")} if "measured" in FLOOR else \
    {"native": 3, "default": 3}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    res = run_all()
    out = Path(os.environ.get("GLASSRT_RESULTS_OUT") or tmp_path_factory.mktemp("conformance") / "RESULTS.md")
    out.write_text(per_op_table(res))
    return res


def _same_onnx_minor():
    return onnx.__version__.split(".")[:2] == FLOOR["onnx"].split(".")[:2]


def _require_same_onnx():
    if not _same_onnx_minor():
        message = f"floor measured with onnx {FLOOR['onnx']}, running {onnx.__version__}"
        if os.environ.get("CI"):
            pytest.fail(message + " (CI pins onnx==1.23.*: the floor would guard nothing)")
        pytest.skip(message)


def _per_op(table: str) -> dict:
    """{op: (native passed, default passed)} from a RESULTS.md table."""
    rows = {}
    for line in table.splitlines():
        m = re.match(r"^\| (\S[^|]*?) \| (\d+)/\d+[^|]* \| (\d+)/\d+[^|]* \|$", line)
        if m:
            rows[m.group(1)] = (int(m.group(2)), int(m.group(3)))
    return rows


def test_no_op_passes_fewer_cases_than_committed(results):
    _require_same_onnx()
    committed = _per_op((HERE / "RESULTS.md").read_text())
    measured = _per_op(per_op_table(results))
    assert committed, "could not read the committed RESULTS.md"
    for k, mode in enumerate(("native", "default")):
        lost = {op: (n[k], measured.get(op, (0, 0))[k]) for op, n in committed.items() if measured.get(op, (0, 0))[k] < n[k]}
        assert sum(a - b for a, b in lost.values()) <= MARGIN[mode], (
            f"{mode}: fewer passing cases than tests/conformance/RESULTS.md records, for {lost} (committed, now)")


@pytest.mark.parametrize("mode", ["native", "default"])
def test_pass_count_floor(results, mode):
    counts = summarize(results)
    _require_same_onnx()
    assert counts["total"] == FLOOR["total"], "the onnx case list changed: re-measure the floor"
    assert counts[mode] >= FLOOR[mode], (
        f"{mode}: {counts[mode]} of {counts['total']} node test cases pass, below the floor of {FLOOR[mode]}; "
        "see tests/conformance/RESULTS.md")


def _by_chance(name: str) -> bool:
    """Bernoulli cases without a seed: onnx's expected values came from an unseeded
    generator, so a run passes them by chance (about 1 in 300) in either mode."""
    return "bernoulli" in name and "seed" not in name


def test_default_never_worse_than_native(results):
    native = {n for n, (s, _) in results["native"].items() if s == "pass"}
    default = {n for n, (s, _) in results["default"].items() if s == "pass"}
    worse = {n for n in native - default if not _by_chance(n)}
    assert worse == set(), "cases that pass natively but fail once reference is allowed"
