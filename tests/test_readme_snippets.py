"""Every ```python block of README.md runs, each in a fresh process (custom ops and
Prometheus metrics register globally), in a folder holding the `model.onnx` the snippets
name. A block that is deliberately not runnable has `<!-- not-run: reason -->` right before it."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.helpers import init, model, tensor

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(<!--\s*not-run:\s*(?P<why>.*?)\s*-->\s*)?```python\n(?P<code>.*?)```", re.S)


def blocks(text: str) -> list[tuple[int, str, str | None]]:
    """(line of the ```python fence, code, why it is not run or None) per block."""
    return [(text.count("\n", 0, m.start("code")), m["code"], m["why"]) for m in BLOCK.finditer(text)]


def snippets() -> list:
    return [pytest.param(code, id=f"README.md:{line}",
                         marks=[pytest.mark.skip(reason=f"README marks it not-run: {why}")] if why else [])
            for line, code, why in blocks((ROOT / "README.md").read_text())]


def test_not_run_marks_only_the_next_block():
    text = "a\n<!-- not-run: needs a GPU -->\n```python\nx = 1\n```\n\n```python\ny = 2\n```\n"
    assert blocks(text) == [(3, "x = 1\n", "needs a GPU"), (7, "y = 2\n", None)]


def _model_onnx() -> onnx.ModelProto:
    """The `model.onnx` of the snippets: input x [batch, 3, 224, 224], as the README prints it."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["y"], name="pool")]
    return model(nodes, [tensor("x", ["batch", 3, 224, 224])], [tensor("y", ["batch", 4, 1, 1])],
                 [init("w", rng.standard_normal((4, 3, 3, 3)).astype(np.float32))])


# The metrics recipe serves on port 9100; here it serves on a free port and the test scrapes
# it, so the check is that the documented recipe really serves glassrt's metrics.
SERVE_ON_A_FREE_PORT = """
import prometheus_client, prometheus_client.exposition
_servers = []
def _free_port_server(port, *args, **kwargs):
    _servers.append(prometheus_client.exposition.start_http_server(0, "127.0.0.1"))
    return _servers[-1]
prometheus_client.start_http_server = _free_port_server
"""
SCRAPE = """
import urllib.request
for server, _ in _servers:
    print(urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10).read().decode())
"""


def test_readme_has_snippets():
    assert len(snippets()) >= 4


@pytest.mark.parametrize("code", snippets())
def test_readme_snippet_runs(code, tmp_path):
    onnx.save(_model_onnx(), tmp_path / "model.onnx")
    serves = "start_http_server" in code
    script = tmp_path / "snippet.py"
    script.write_text((SERVE_ON_A_FREE_PORT if serves else "") + code + (SCRAPE if serves else ""))
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    if serves:
        assert 'glassrt_runs_total{model="resnet50"} 1.0' in res.stdout
