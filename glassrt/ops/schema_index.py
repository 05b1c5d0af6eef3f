"""The few facts session creation needs from ONNX's operator schemas, kept in a small table.

onnx builds its whole schema registry (every op at every version, with docs, type
constraints and function bodies: ~7 MiB resident and ~25 ms) on the first schema lookup.
Resolving a node's contract needs only a few facts per op version: which version a node
at opset N resolves to, whether the op is a composite (has a function body), whether it is
differentiable, its attributes' names, types and defaults, and how many inputs and outputs
it takes. This module reads those facts from the registry once, writes them as JSON into glassrt's cache folder (one file per onnx build), and later
processes read that file instead. The full `onnx.defs.OpSchema` is still fetched, and the
registry built, by what needs it: onnx's generic shape inference for ops without a glassrt
meta rule, decompositions, `glassrt check`.

The cache folder and the file's reading and writing are glassrt/cache.py's. Where it cannot
be written (or GLASSRT_CACHE_DIR is set empty), the table is built in memory from the
registry, as before. The file is data only (JSON, checked when read); a file that does not
parse, or was written for another onnx build, is rebuilt.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from pathlib import Path
from zlib import crc32

from ..cache import cache_dir, read_or_build

FORMAT = 3  # bump when what is stored changes
_DEPRECATED, _FUNCTION, _CONTEXT_FUNCTION, _DIFFERENTIABLE, _OTHER_DEFAULTS = 1, 2, 4, 8, 16
_PLAIN = (int, float, str)


@dataclass(frozen=True)
class SchemaFacts:
    """One version of one op, as the registry has it."""
    domain: str
    name: str
    since_version: int
    deprecated: bool
    has_function: bool
    has_context_dependent_function: bool
    differentiable: bool
    # attribute name -> default value (bytes decoded to str); None where a default is not a
    # number, string or list of them (none in onnx 1.23): the schema itself is asked then
    defaults: dict | None
    arity: tuple = (0, 1 << 31, 0, 1 << 31)  # (min inputs, max inputs, min outputs, max outputs)
    # every attribute the op takes: name -> its AttributeProto type (FLOAT, INTS, GRAPH...)
    attributes: dict = field(default_factory=dict, hash=False)

    @property
    def composite(self) -> bool:
        return self.has_function or self.has_context_dependent_function


class SchemaIndex:
    """(domain, op) -> its versions, looked up as `onnx.defs.get_schema` looks them up."""

    def __init__(self, table: dict):
        # {domain: {name: [[since, flags, defaults, arity, {attribute: type}], ...] sorted by since}}
        self._table = table
        self._versions = {}  # (domain, name) -> sorted since versions, made on first lookup

    def resolve(self, name: str, opset: int, domain: str = "") -> SchemaFacts | None:
        """The newest version of the op that is not newer than `opset` (what the registry
        returns for get_schema(name, opset, domain)), or None where it has none."""
        entries = self._table.get(domain, {}).get(name)
        if not entries:
            return None
        key = (domain, name)
        since = self._versions.get(key)
        if since is None:
            since = self._versions[key] = [e[0] for e in entries]
        i = bisect.bisect_right(since, opset) - 1
        if i < 0:
            return None
        v, flags, defaults, arity, attributes = entries[i]
        return SchemaFacts(domain, name, v, bool(flags & _DEPRECATED), bool(flags & _FUNCTION),
                           bool(flags & _CONTEXT_FUNCTION), bool(flags & _DIFFERENTIABLE),
                           None if flags & _OTHER_DEFAULTS else defaults, tuple(arity), attributes)

    def has(self, name: str, domain: str = "") -> bool:
        return bool(self._table.get(domain, {}).get(name))

    def newest(self) -> list[SchemaFacts]:
        """The newest version of every op, as onnx.defs.get_all_schemas lists them."""
        return [self.resolve(name, versions[-1][0], domain)
                for domain, ops in self._table.items() for name, versions in ops.items()]


def build_table() -> dict:
    """The facts of every schema version in the installed onnx (builds onnx's registry)."""
    from onnx import defs

    differentiable = defs.OpSchema.DifferentiationCategory.Differentiable
    table: dict = {}
    for s in defs.get_all_schemas_with_history():
        flags = (_DEPRECATED * s.deprecated | _FUNCTION * s.has_function
                 | _CONTEXT_FUNCTION * s.has_context_dependent_function
                 | _DIFFERENTIABLE * (any(p.differentiation_category == differentiable for p in s.inputs)
                                      and any(p.differentiation_category == differentiable for p in s.outputs)))
        defaults = attribute_defaults(s)
        if not all(_plain(v) for v in defaults.values()):
            flags, defaults = flags | _OTHER_DEFAULTS, {}
        arity = [s.min_input, s.max_input, s.min_output, s.max_output]
        table.setdefault(s.domain, {}).setdefault(s.name, []).append(
            [s.since_version, flags, defaults, arity, {name: int(a.type) for name, a in sorted(s.attributes.items())}])
    for ops in table.values():
        for versions in ops.values():
            versions.sort(key=lambda e: e[0])
    return table


def attribute_defaults(schema) -> dict:
    """An OpSchema's attribute defaults as Python values, strings decoded."""
    from onnx import helper

    out = {}
    for attr_name, attr in schema.attributes.items():
        if attr.default_value.type:
            v = helper.get_attribute_value(attr.default_value)
            if isinstance(v, bytes):
                v = v.decode()
            elif isinstance(v, list) and v and isinstance(v[0], bytes):
                v = [x.decode() for x in v]
            out[attr_name] = v
    return out


def _plain(v) -> bool:
    """JSON keeps it as it is: a number, a string or a list of them."""
    return isinstance(v, _PLAIN) or (isinstance(v, list) and all(isinstance(x, _PLAIN) for x in v))


def _onnx_build() -> str:
    """Names the installed onnx by its compiled extension (path, size and time: a rebuilt or
    upgraded onnx gets its own file), found without importing the onnx package."""
    from importlib.machinery import EXTENSION_SUFFIXES

    from ..proto import onnx_folder

    folder = onnx_folder()
    ext = next((p for p in (folder / f"onnx_cpp2py_export{s}" for s in EXTENSION_SUFFIXES) if p.is_file()), None)
    if ext is None:
        raise ImportError(f"onnx's compiled extension is not in {folder}")
    st = ext.stat()
    stamp = f"{ext}|{st.st_size}|{st.st_mtime_ns}|{FORMAT}"
    # crc32, not hashlib: the stamp is not a secret, and hashlib would load OpenSSL (3 MiB)
    return f"{crc32(stamp.encode()):08x}"


def _valid(data, build: str) -> bool:
    if not (isinstance(data, dict) and data.get("format") == FORMAT and data.get("onnx") == build):
        return False
    table = data.get("ops")
    if not isinstance(table, dict):
        return False
    for ops in table.values():
        if not isinstance(ops, dict):
            return False
        for versions in ops.values():
            if not isinstance(versions, list) or not versions:
                return False
            for e in versions:
                if not (isinstance(e, list) and len(e) == 5 and type(e[0]) is int and type(e[1]) is int
                        and isinstance(e[2], dict) and isinstance(e[3], list) and len(e[3]) == 4
                        and all(type(n) is int for n in e[3]) and isinstance(e[4], dict)
                        and all(type(t) is int for t in e[4].values())):
                    return False
            if any(a[0] >= b[0] for a, b in zip(versions, versions[1:])):
                return False
    return True


def load_index(folder: Path | None = None) -> SchemaIndex:
    """The table from the cache file of this onnx build, written first if missing or stale."""
    folder = cache_dir() if folder is None else folder
    if folder is None:
        return SchemaIndex(build_table())
    build = _onnx_build()
    data = read_or_build(folder / f"onnx-schemas-{build}.json", lambda d: _valid(d, build),
                         lambda: {"format": FORMAT, "onnx": build, "ops": build_table()}, "schema table")
    return SchemaIndex(data["ops"])


_INDEX: SchemaIndex | None = None


def index() -> SchemaIndex:
    global _INDEX
    if _INDEX is None:
        _INDEX = load_index()
    return _INDEX
