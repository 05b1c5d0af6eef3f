"""The cpu provider: NumPy (BLAS) and Numba kernels, one module per op family.

The modules are imported when a node first needs one of their ops, not all at once: all 27
take ~15 ms and ~1 MiB at a session's creation, and a model uses a few families. Which
modules register kernels for which op is read once from the modules themselves (all
imported, the registry diffed) and kept as a small JSON file in glassrt's cache folder,
keyed by the modules' files (a changed or new module rebuilds it); where there is no cache
folder, or an op is not in the map, every module is imported, as before.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from zlib import crc32

# Registration order: where two modules register kernels for one op (BatchNormalization:
# norm, normalization), they are imported in this order, so their kernels list the same.
MODULES = ("attention", "control", "conv", "conv_transpose", "deform_conv", "elementwise", "grid_sample", "image",
           "indexing", "matmul", "ml", "nms", "norm", "normalization", "pool", "quantize", "random", "reduce",
           "resize", "rnn", "roi", "sequence", "shape", "signal", "strings", "svm", "training")
FORMAT = 1

_map: dict | None = None  # "domain\top" -> [module, ...] in MODULES order
_shared: list | None = None
_done: set = set()  # ops whose modules are imported
_all_loaded = False


def load_all() -> None:
    """Import every kernel module (what `glassrt check`, tests and listings need)."""
    global _all_loaded
    if not _all_loaded:
        for m in MODULES:
            importlib.import_module(f"{__name__}.{m}")
        _all_loaded = True


def load_for(domain: str, op_type: str) -> None:
    """Import the modules that register cpu kernels for (domain, op_type)."""
    key = f"{domain}\t{op_type}"
    if _all_loaded or key in _done:
        return
    modules = _op_map().get(key)
    if modules is None:
        # no cpu module registers it (a contrib or custom op, or none at all): nothing to
        # import, unless the map could not be read; then, as before, every module
        if not _map:
            load_all()
    else:
        for m in _with_companions(modules):
            importlib.import_module(f"{__name__}.{m}")
    _done.add(key)


def _with_companions(modules) -> list:
    """`modules` and every module that registers kernels for an op one of them also
    registers (BatchNormalization: norm with normalization), in MODULES order: a group is
    always imported together and in order, so an op's kernels list the same whichever op
    was asked for first."""
    want = set(modules)
    grew = True
    while grew:
        grew = False
        for mods in _shared_ops():
            if want.intersection(mods) and not want.issuperset(mods):
                want.update(mods)
                grew = True
    return [m for m in MODULES if m in want]


def _shared_ops() -> list:
    """The module lists of the ops more than one module registers kernels for."""
    global _shared
    if _shared is None:
        _shared = [mods for mods in _op_map().values() if len(mods) > 1]
    return _shared


def _op_map() -> dict:
    global _map
    if _map is None:
        _map = _load_map()
    return _map


def _stamp() -> str:
    """Names this set of kernel modules: the sizes and times of the folder's files (helpers
    included: a kernel could be registered from one)."""
    folder = Path(__file__).parent
    parts = [str(folder), str(FORMAT)]
    for f in sorted(folder.glob("*.py")):
        st = f.stat()
        parts.append(f"{f.name}|{st.st_size}|{st.st_mtime_ns}")
    return f"{crc32('|'.join(parts).encode()):08x}"


def _load_map() -> dict:
    from ...cache import cache_dir, read_or_build

    folder = cache_dir()
    try:
        stamp = _stamp()
    except OSError:  # modules not on disk as files (a zip import): no map, import them all
        return {}
    path = folder / f"cpu-kernels-{stamp}.json" if folder is not None else None
    data = read_or_build(path, lambda d: _valid(d, stamp),
                         lambda: {"format": FORMAT, "stamp": stamp, "ops": build_map()}, "cpu kernel map")
    return data["ops"]


def _valid(data, stamp) -> bool:
    if not (isinstance(data, dict) and data.get("format") == FORMAT and data.get("stamp") == stamp):
        return False
    ops = data.get("ops")
    return isinstance(ops, dict) and all(
        isinstance(k, str) and isinstance(v, list) and v and all(m in MODULES for m in v) for k, v in ops.items())


def build_map() -> dict:
    """{"domain\\top": [modules registering cpu kernels for it]}: every module imported (in
    MODULES order), each cpu kernel attributed to the module whose code it runs, or else to
    the module whose import registered it."""
    from .. import registry

    seen = {id(k) for k in registry.all_kernels("cpu")}
    ops: dict = {}

    def attribute(kernels, module):
        for k in kernels:
            owner = getattr(k.fn, "__module__", "") or ""
            name = owner.rsplit(".", 1)[-1] if owner.startswith(f"{__name__}.") else None
            if name not in MODULES:  # a helper module's function, a lambda: whoever registered it
                name = module
            if name in MODULES:
                mods = ops.setdefault(f"{k.domain}\t{k.op_type}", [])
                if name not in mods:
                    mods.append(name)

    attribute(registry.all_kernels("cpu"), None)  # registered before (by a module another imported)
    for m in MODULES:
        importlib.import_module(f"{__name__}.{m}")
        new = [k for k in registry.all_kernels("cpu") if id(k) not in seen]
        seen.update(id(k) for k in new)
        attribute(new, m)
    global _all_loaded
    _all_loaded = True
    order = {m: i for i, m in enumerate(MODULES)}
    return {k: sorted(v, key=order.__getitem__) for k, v in ops.items()}
