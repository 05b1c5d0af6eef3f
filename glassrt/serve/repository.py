"""Which models a server loads, under which names and versions.

- `MODEL` arguments: a file (named after its stem: `resnet50.onnx` -> `resnet50`) or
  `NAME=PATH`; each is version 1.
- `--model-repository DIR`, laid out as Triton lays it out: `DIR/NAME/VERSION/model.onnx`,
  VERSION a positive integer. Every version found is loaded; a request without a version
  gets the highest (Triton's default policy serves the latest). Other files in the folders
  (Triton's config.pbtxt, a README) are left alone.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import GlassrtError

_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")  # a name that fits in a URL path segment as is


@dataclass(frozen=True)
class ModelSource:
    name: str
    version: str
    path: Path
    # The model's bytes when they came another way than the file (Ray Serve replicas get them
    # from the object store, serve/on_ray.py); `path` then still names where they came from,
    # and its folder is where external data is looked for.
    data: bytes | None = field(default=None, repr=False, compare=False)


def _check_name(name: str, where: str) -> str:
    if not _NAME.match(name):
        raise GlassrtError(f"{where}: model name {name!r} may hold only letters, digits, '_', '.' and '-'")
    return name


def from_args(args) -> list[ModelSource]:
    """MODEL arguments (`PATH` or `NAME=PATH`) -> sources, each version 1."""
    sources = []
    for arg in args:
        name, sep, path = arg.partition("=")
        if not sep:
            name, path = Path(arg).stem, arg
        p = Path(path)
        if not p.is_file():
            raise GlassrtError(f"model {arg!r}: no such file {path!r}")
        sources.append(ModelSource(_check_name(name, f"model {arg!r}"), "1", p))
    _no_duplicates(sources)
    return sources


def scan(folder) -> list[ModelSource]:
    """Every DIR/NAME/VERSION/model.onnx of a Triton-style model repository."""
    root = Path(folder)
    if not root.is_dir():
        raise GlassrtError(f"model repository {str(folder)!r} is not a folder")
    sources = []
    for model_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        versions = sorted((v for v in model_dir.iterdir() if v.is_dir() and v.name.isdigit() and int(v.name) > 0),
                          key=lambda v: int(v.name))
        found = [v for v in versions if (v / "model.onnx").is_file()]
        if not found:
            raise GlassrtError(f"model repository: {model_dir} has no VERSION/model.onnx (e.g. "
                               f"{model_dir / '1' / 'model.onnx'})")
        for v in found:
            sources.append(ModelSource(_check_name(model_dir.name, f"model repository {model_dir}"), str(int(v.name)),
                                       v / "model.onnx"))
    if not sources:
        raise GlassrtError(f"model repository {str(folder)!r} holds no models (expected NAME/VERSION/model.onnx)")
    return sources


def _no_duplicates(sources):
    seen = {}
    for s in sources:
        key = (s.name, s.version)
        if key in seen:
            raise GlassrtError(f"two models are named {s.name!r} ({seen[key]} and {s.path}): "
                               f"use NAME=PATH to name one otherwise")
        seen[key] = s.path


def resolve(models) -> list[ModelSource]:
    """ModelSources as given, MODEL argument strings parsed, or a repository folder scanned
    when `models` is a single folder path."""
    if isinstance(models, (str, Path)) and Path(models).is_dir():
        return scan(models)
    if isinstance(models, (str, Path)):
        models = [models]
    out = [m if isinstance(m, ModelSource) else from_args([str(m)])[0] for m in models]
    _no_duplicates(out)
    if not out:
        raise GlassrtError("no models to serve: give MODEL files or --model-repository DIR")
    return out
