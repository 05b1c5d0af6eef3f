"""glassrt's cache folder, and the small JSON tables kept there: facts derived once from
installed code (onnx's operator schemas, which kernel module registers which op), read by
later processes instead of being derived again.

The folder is $GLASSRT_CACHE_DIR, else $XDG_CACHE_HOME/glassrt, else ~/.cache/glassrt;
GLASSRT_CACHE_DIR set empty turns caching off. A file is data only (JSON, checked by its
reader's `valid` before use); one that does not parse or does not check is rebuilt, and one
that cannot be written is only logged (the caller gets the data it built either way).
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Callable

log = logging.getLogger("glassrt")


def cache_dir() -> Path | None:
    """glassrt's cache folder, or None when caching is turned off (GLASSRT_CACHE_DIR='')."""
    env = os.environ.get("GLASSRT_CACHE_DIR")
    if env is not None:
        return Path(env) if env else None
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        home = os.path.expanduser("~")
        if home.startswith("~"):  # no home folder known: no cache, rather than a "~" folder here
            return None
        base = os.path.join(home, ".cache")
    return Path(base) / "glassrt"


def read_or_build(path: Path | None, valid: Callable[[object], bool], build: Callable[[], dict], what: str):
    """The JSON in `path` if `valid(data)`; else `build()`'s data, written to `path` for later
    processes (whole or not at all: a process that reads it meanwhile sees the old file or
    the new one). `path` None: built each time."""
    if path is not None:
        try:
            data = json.loads(path.read_text())
            if valid(data):
                return data
            log.info("rebuilding %s: not a %s of this installation", path, what)
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as e:
            log.info("rebuilding %s: %s", path, e)
    data = build()
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, separators=(",", ":")))
            os.replace(tmp, path)
        except OSError as e:
            log.info("%s not cached in %s: %s", what, path.parent, e)
    return data
