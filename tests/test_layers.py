"""The layers of the code, checked: an import goes down, never up.

ir, ops (contracts) → kernels (implementations) → runtime (the stages) → passes →
session → tools → api, cli. Every import counts, including those inside functions (a lazy
import is still a dependency), and no module reaches for another package's private
(underscore) names.
"""
from __future__ import annotations

import ast
from pathlib import Path

import glassrt

ROOT = Path(glassrt.__file__).parent
ORDER = ["ir", "ops", "kernels", "contrib", "runtime", "passes", "session", "tools", "api", "cli"]
# Leaf modules every layer may use.
BASE = {"errors", "dtypes", "symbolic", "onnx_io", "ir", "__init__"}


def _imports():
    """(importing module, imported module, imported names) for every import in glassrt."""
    out = []
    for f in ROOT.rglob("*.py"):
        parts = list(f.relative_to(ROOT.parent).with_suffix("").parts)
        package = parts[:-1] if f.name != "__init__.py" else parts[:-1]
        module = ".".join(parts if f.name != "__init__.py" else parts[:-1])
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else [])) if node.level else (node.module or "")
                if target.startswith("glassrt"):
                    for alias in node.names:
                        sub = f"{target}.{alias.name}"
                        is_module = (ROOT.parent / Path(*sub.split("."))).with_suffix(".py").exists() or \
                            (ROOT.parent / Path(*sub.split("."))).is_dir()
                        out.append((module, sub if is_module else target, alias.name))
            elif isinstance(node, ast.Import):
                out += [(module, a.name, "") for a in node.names if a.name.startswith("glassrt")]
    return out


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_imports_go_down_the_layers():
    upward = []
    for src, dst, name in _imports():
        a, b = _layer(src), _layer(dst)
        if a == b or b in BASE or a in ("__init__",) or a not in ORDER or b not in ORDER:
            continue
        if ORDER.index(b) > ORDER.index(a):
            upward.append(f"{src} imports {dst} ({name})")
    assert not upward, "imports that go up a layer:\n" + "\n".join(sorted(upward))


def test_no_private_names_across_packages():
    private = [f"{src} imports {name} from {dst}" for src, dst, name in _imports()
               if name.startswith("_") and not name.startswith("__") and _layer(src) != _layer(dst)]
    assert not private, "\n".join(sorted(private))
