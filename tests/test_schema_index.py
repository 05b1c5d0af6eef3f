"""The schema table session creation reads instead of onnx's registry: the same answers as
onnx.defs for every op and opset, cached per onnx build, rebuilt when the file is bad."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from onnx import defs, helper

from glassrt.ops import schema_index


def _defaults_from_onnx(schema) -> dict:
    """The oracle, written apart from glassrt's decoding: onnx's default values, bytes as str."""
    out = {}
    for name, attr in schema.attributes.items():
        if attr.default_value.type:
            v = helper.get_attribute_value(attr.default_value)
            out[name] = v.decode() if isinstance(v, bytes) else [x.decode() if isinstance(x, bytes) else x for x in v] \
                if isinstance(v, list) else v
    return out


@pytest.fixture(scope="module")
def table():
    return schema_index.build_table()


def test_resolves_every_op_at_every_opset_as_onnx_defs_does(table):
    ix = schema_index.SchemaIndex(table)
    differentiable = defs.OpSchema.DifferentiationCategory.Differentiable
    checked = 0
    for domain, ops in table.items():
        newest = max(v[0] for versions in ops.values() for v in versions)
        for name in ops:
            for opset in range(0, newest + 2):
                facts = ix.resolve(name, opset, domain)
                try:
                    s = defs.get_schema(name, opset, domain)
                except defs.SchemaError:
                    assert facts is None, (domain, name, opset)
                    continue
                assert facts is not None and facts.since_version == s.since_version, (domain, name, opset)
                assert facts.deprecated == s.deprecated
                assert facts.composite == (s.has_function or s.has_context_dependent_function)
                assert facts.differentiable == (
                    any(p.differentiation_category == differentiable for p in s.inputs)
                    and any(p.differentiation_category == differentiable for p in s.outputs))
                assert facts.defaults == _defaults_from_onnx(s)
                checked += 1
    assert checked > 4000
    assert ix.has("Add") and not ix.has("Add", "ai.onnx") and not ix.has("NoSuchOp")
    assert ix.resolve("Add", 13, "ai.onnx") is None  # onnx.defs does not alias the domain either


def test_newest_lists_what_get_all_schemas_lists(table):
    ours = {(s.domain, s.name, s.since_version) for s in schema_index.SchemaIndex(table).newest()}
    assert ours == {(s.domain, s.name, s.since_version) for s in defs.get_all_schemas()}


def test_written_once_then_read_and_rebuilt_when_damaged(tmp_path):
    first = schema_index.load_index(tmp_path)
    files = list(tmp_path.glob("onnx-schemas-*.json"))
    assert len(files) == 1 and not list(tmp_path.glob("*.tmp"))
    data = json.loads(files[0].read_text())
    assert data["format"] == schema_index.FORMAT
    assert schema_index.load_index(tmp_path).resolve("Conv", 21).defaults == first.resolve("Conv", 21).defaults

    # A damaged or foreign file is not trusted: it is rebuilt, and the answers stay right.
    for bad in ("{not json", json.dumps({**data, "onnx": "0.0-other"}),
                json.dumps({**data, "ops": {"": {"Add": [[7, "x", {}]]}}}), json.dumps([1, 2])):
        files[0].write_text(bad)
        assert schema_index.load_index(tmp_path).resolve("Add", 13).since_version == 13
        assert json.loads(files[0].read_text())["ops"] == data["ops"]


def test_unwritable_or_disabled_cache_still_answers(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the folder should be
    assert schema_index.load_index(blocked / "glassrt").resolve("Relu", 14).since_version == 14
    monkeypatch.setenv("GLASSRT_CACHE_DIR", "")
    assert schema_index.cache_dir() is None
    monkeypatch.setenv("GLASSRT_CACHE_DIR", str(tmp_path / "c"))
    assert schema_index.cache_dir() == tmp_path / "c"


def test_a_session_with_a_cached_table_does_not_build_onnx_registry(tmp_path):
    """A second process creates and runs a session without onnx's schema registry (the
    Python OpSchema lookups are counted; none happens)."""
    m = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Softmax", ["r"], ["y"], axis=-1)], "g",
        [helper.make_tensor_value_info("x", 1, [2, 3])], [helper.make_tensor_value_info("y", 1, [2, 3])]),
        opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    code = f"""
import numpy as np, onnx.defs as d
calls = []
for n in ("get_schema", "has", "get_all_schemas", "get_all_schemas_with_history"):
    f = getattr(d, n)
    setattr(d, n, lambda *a, f=f, n=n, **k: calls.append(n) or f(*a, **k))
import glassrt
s = glassrt.InferenceSession({str(path)!r})
y = s.run(None, {{"x": np.array([[1, -2, 3], [0, 1, 2]], np.float32)}})[0]
assert np.allclose(y.sum(-1), 1)
print(len(calls))
"""
    env = {**os.environ, "GLASSRT_CACHE_DIR": str(tmp_path / "cache")}
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
            for _ in range(2)]
    assert int(runs[0].stdout.split()[-1]) > 0  # the first builds the table
    assert int(runs[1].stdout.split()[-1]) == 0, runs[1].stdout
