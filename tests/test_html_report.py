"""`glassrt profile --html`: one self-contained page, every model string escaped, and the
pictures drawn from the real plan. The browser tests load the page in Debian's headless
Chromium through Playwright (no browser download) and skip where either is missing."""
from __future__ import annotations

import os
import re
import shutil
import warnings

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper

import glassrt
from glassrt.cli import main
from glassrt.runtime.providers import DEFAULT
from glassrt.tools import light_models as lm
from glassrt.tools.explain import explain
from glassrt.tools.html_report import render_html, report_data
from glassrt.tools.profile import profile_session
from tests.helpers import init, model, tensor

pytest.importorskip("jinja2")

HOSTILE = "<script>alert(1)</script>"
HOSTILE_VALUE = '"><img src=x onerror="window.__xss=1">'
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _session(m, providers=("cpu",)):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return glassrt.InferenceSession(m, providers=list(providers))


def _hostile_model():
    """Node and value names an attacker chose: markup in text and an attribute breakout."""
    nodes = [helper.make_node("Mul", ["x", "two"], [HOSTILE_VALUE], name=HOSTILE),
             helper.make_node("Relu", [HOSTILE_VALUE], ["r"], name="relu</td></tr><tr><td>"),
             helper.make_node("Add", ["r", "two"], ["y"], name="add")]
    return model(nodes, [tensor("x", [1, 3, 32, 32])], [tensor("y", [1, 3, 32, 32])],
                 [init("two", np.array(2.0, np.float32))])


def _page(sess, feeds, runs=2):
    prof = profile_session(sess, feeds, runs=runs)
    data = report_data(sess, prof, feeds, "model.onnx")
    return prof, data, render_html(data)


def test_model_strings_are_escaped_everywhere():
    sess = _session(_hostile_model())
    _, data, page = _page(sess, {"x": np.ones((1, 3, 32, 32), np.float32)})
    assert HOSTILE not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<img" not in page and "onerror=&#34;" in page  # the attribute breakout stays inside its quotes
    assert "relu</td>" not in page
    assert page.count("<script>") == 1  # the page's own script, and only it
    assert len(data["rows"]) == 3


def test_the_pictures_follow_the_plan_and_the_profile():
    m = onnx.load(lm.path("squeezenet"))
    sess = _session(m)
    x = lm.reference_input((1, 3, 224, 224))
    prof, data, page = _page(sess, {"data_0": x})
    report = explain(sess)
    arena = [v for v in report["values"] if v["offset"] is not None]
    assert data["arena_values"] == len(arena) > 10
    assert len(re.findall(r'<rect class="value ', page)) == len(arena)
    run = data["timeline"]["run"]
    assert len(re.findall(r'<rect class="node"', page)) == sum(r.run == run for r in prof.records)
    assert [b["op"] for b in data["bars"]] == [r["key"] for r in prof.by_op()]
    # one rectangle per value, at its offset and over its lifetime, in the picture's scale
    sx, sy = (1100 - 70) / (max(n["step"] for n in report["nodes"] if n["step"] is not None) + 1), \
        360 / report["summary"]["arena_bytes"]
    first = min(arena, key=lambda v: (v["first_step"], v["offset"]))
    rect = data["arena"]["values"][0]
    assert rect["tip"].startswith(first["name"] + "\n")
    assert rect["x"] == pytest.approx(70 + first["first_step"] * sx, abs=0.01)
    assert rect["y"] == pytest.approx(first["offset"] * sy, abs=0.01)
    assert rect["w"] == pytest.approx((first["last_step"] - first["first_step"] + 1) * sx, abs=0.01)
    assert "http://" not in page and "https://" not in page and "src=" not in page.replace("src=x", "")


def test_cli_writes_the_page(tmp_path):
    out = tmp_path / "report.html"
    r = CliRunner().invoke(main, ["profile", "--runs", "1", "--providers", "cpu", "--html", str(out)])
    assert r.exit_code == 0, r.output
    assert "wrote" in r.output and out.read_text().startswith("<!DOCTYPE html>")


@pytest.fixture
def browser(tmp_path):
    """A page factory: loads a file in headless Chromium and records every console message,
    page error, dialog and network request."""
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=CHROMIUM, args=FLAGS,
                                                   headless=True, viewport={"width": 1400, "height": 900})
        seen = {"console": [], "errors": [], "dialogs": [], "requests": []}

        def open_page(path):
            page = ctx.new_page()
            page.on("console", lambda m: seen["console"].append((m.type, m.text)))
            page.on("pageerror", lambda e: seen["errors"].append(str(e)))
            page.on("dialog", lambda d: (seen["dialogs"].append(d.message), d.dismiss()))
            page.on("request", lambda r: seen["requests"].append(r.url))
            page.goto(path.as_uri())
            page.wait_for_load_state("load")
            return page
        yield open_page, seen
        ctx.close()


def test_light_resnet50_report_renders_in_chromium(tmp_path, browser):
    open_page, seen = browser
    out = tmp_path / "report.html"
    r = CliRunner().invoke(main, ["profile", str(lm.path("resnet50")), "--runs", "2", "--html", str(out)])
    assert r.exit_code == 0, r.output
    sess = _session(str(lm.path("resnet50")), DEFAULT)  # the providers the command used: the same plan
    arena = sorted((v for v in explain(sess)["values"] if v["offset"] is not None),
                   key=lambda v: (v["first_step"], v["offset"]))  # the order the page draws them in
    page = open_page(out)
    assert seen["console"] == [] and seen["errors"] == []
    assert seen["requests"] == [out.as_uri()]  # self-contained: nothing else was fetched
    assert page.locator("#arena rect.value").count() == len(arena) > 20
    assert page.locator("#nodes tbody tr").count() == len(explain(sess)["nodes"])
    assert page.locator("#timeline rect.node").count() >= 50
    assert page.locator("#ops .op-bar").count() >= 3
    # the script ran: hovering a value shows its name; the legend picks out an op type
    page.locator("#arena rect.value").first.hover()
    assert page.locator("#tip").is_visible() and page.locator("#tip").inner_text().startswith(arena[0]["name"])
    page.locator(".legend button").first.click()
    assert page.locator("svg rect.dim").count() > 0
    page.fill("#filter", "MaxPool")
    assert page.locator("#nodes tbody tr:not([hidden])").count() == 1
    assert seen["console"] == [] and seen["errors"] == []


def test_hostile_names_do_not_run_in_chromium(tmp_path, browser):
    open_page, seen = browser
    sess = _session(_hostile_model())
    _, _, html = _page(sess, {"x": np.ones((1, 3, 32, 32), np.float32)})
    out = tmp_path / "hostile.html"
    out.write_text(html, encoding="utf-8")
    page = open_page(out)
    assert seen["dialogs"] == [] and seen["errors"] == [] and seen["console"] == []
    assert page.evaluate("window.__xss") is None
    assert page.locator("img").count() == 0
    names = page.locator("#nodes tbody td.name").all_inner_texts()
    assert HOSTILE in names and "relu</td></tr><tr><td>" in names
