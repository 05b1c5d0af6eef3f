"""A provider's kernel modules ("families"), imported when a node first needs one of their
ops, not all at once: the cpu provider's 27 take ~15 ms and ~1 MiB at a session's creation,
oneDNN's eight ~5 ms, and a model uses a few families.

Which module registers kernels for which op is read once from the modules themselves (all
imported, the registry diffed) and kept as a small JSON file in glassrt's cache folder,
keyed by the modules' files (a changed or new module rebuilds it); where there is no cache
folder, or an op is not in the map, every module is imported, as before.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from zlib import crc32

FORMAT = 1


class KernelFamilies:
    """The kernel modules `modules` of package `package` (a folder of .py files) that
    register `provider`'s kernels. Registration order: where two modules register kernels
    for one op (cpu's BatchNormalization: norm, normalization), they are imported in the
    order of `modules`, so their kernels list the same whichever op was asked for first."""

    def __init__(self, package: str, folder: Path, modules: tuple, provider: str):
        self.package, self.folder, self.modules, self.provider = package, Path(folder), tuple(modules), provider
        self._map: dict | None = None  # "domain\top" -> [module, ...] in `modules` order
        self._shared: list | None = None
        self._done: set = set()  # ops whose modules are imported
        self.all_loaded = False

    def load_all(self) -> None:
        """Import every module (what `glassrt check`, tests and listings need)."""
        if not self.all_loaded:
            for m in self.modules:
                importlib.import_module(f"{self.package}.{m}")
            self.all_loaded = True

    def load_for(self, domain: str, op_type: str) -> None:
        """Import the modules that register kernels for (domain, op_type)."""
        key = f"{domain}\t{op_type}"
        if self.all_loaded or key in self._done:
            return
        modules = self.op_map().get(key)
        if modules is None:
            # no module registers it (a contrib or custom op, or none at all): nothing to
            # import, unless the map could not be read; then, as before, every module
            if not self._map:
                self.load_all()
        else:
            for m in self._with_companions(modules):
                importlib.import_module(f"{self.package}.{m}")
        self._done.add(key)

    def _with_companions(self, modules) -> list:
        """`modules` and every module that registers kernels for an op one of them also
        registers, in `modules` order: a group is always imported together and in order."""
        want = set(modules)
        grew = True
        while grew:
            grew = False
            for mods in self._shared_ops():
                if want.intersection(mods) and not want.issuperset(mods):
                    want.update(mods)
                    grew = True
        return [m for m in self.modules if m in want]

    def _shared_ops(self) -> list:
        """The module lists of the ops more than one module registers kernels for."""
        if self._shared is None:
            self._shared = [mods for mods in self.op_map().values() if len(mods) > 1]
        return self._shared

    def op_map(self) -> dict:
        if self._map is None:
            self._map = self._load_map()
        return self._map

    def _stamp(self) -> str:
        """Names this set of modules: the sizes and times of the folder's files (helpers
        included: a kernel could be registered from one)."""
        parts = [str(self.folder), str(FORMAT)]
        for f in sorted(self.folder.glob("*.py")):
            st = f.stat()
            parts.append(f"{f.name}|{st.st_size}|{st.st_mtime_ns}")
        return f"{crc32('|'.join(parts).encode()):08x}"

    def _load_map(self) -> dict:
        from ..cache import cache_dir, read_or_build

        folder = cache_dir()
        try:
            stamp = self._stamp()
        except OSError:  # modules not on disk as files (a zip import): no map, import them all
            return {}
        path = folder / f"{self.provider}-kernels-{stamp}.json" if folder is not None else None
        data = read_or_build(path, lambda d: self._valid(d, stamp),
                             lambda: {"format": FORMAT, "stamp": stamp, "ops": self.build_map()},
                             f"{self.provider} kernel map")
        return data["ops"]

    def _valid(self, data, stamp) -> bool:
        if not (isinstance(data, dict) and data.get("format") == FORMAT and data.get("stamp") == stamp):
            return False
        ops = data.get("ops")
        return isinstance(ops, dict) and all(
            isinstance(k, str) and isinstance(v, list) and v and all(m in self.modules for m in v)
            for k, v in ops.items())

    def build_map(self) -> dict:
        """{"domain\\top": [modules registering kernels for it]}: every module imported (in
        order), each kernel attributed to the module whose code it runs, or else to the
        module whose import registered it."""
        from . import registry

        seen = {id(k) for k in registry.all_kernels(self.provider)}
        ops: dict = {}

        def attribute(kernels, module):
            for k in kernels:
                owner = getattr(k.fn, "__module__", "") or ""
                name = owner.rsplit(".", 1)[-1] if owner.startswith(f"{self.package}.") else None
                if name not in self.modules:  # a helper module's function, a lambda: whoever registered it
                    name = module
                if name in self.modules:
                    mods = ops.setdefault(f"{k.domain}\t{k.op_type}", [])
                    if name not in mods:
                        mods.append(name)

        attribute(registry.all_kernels(self.provider), None)  # registered before (by a module another imported)
        for m in self.modules:
            importlib.import_module(f"{self.package}.{m}")
            new = [k for k in registry.all_kernels(self.provider) if id(k) not in seen]
            seen.update(id(k) for k in new)
            attribute(new, m)
        self.all_loaded = True
        order = {m: i for i, m in enumerate(self.modules)}
        return {k: sorted(v, key=order.__getitem__) for k, v in ops.items()}
