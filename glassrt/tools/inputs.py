"""Inputs generated from declared shapes, for `glassrt run`, `profile`, `compare`, `nan` and `bench`."""
from __future__ import annotations

import numpy as np

from .. import dtypes, symbolic
from ..errors import GlassrtError
from ..ir import TensorType


def random_value(rng, shape, dtype) -> np.ndarray | None:
    """Random floats in [0, 1), small non-negative ints (valid as indices and sizes), random
    booleans; None for a dtype nothing sensible can be made up for (strings...)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return rng.random(shape).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, 10, shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) > 0.5
    return None


ACCEPTED = "a .npy file as numpy.save writes it (one array; numeric, bool or string dtype)"


def load_npy(name: str, path: str) -> np.ndarray:
    """An --input file. Only the .npy format, never pickle: NumPy's own message for a text
    file ("contains pickled data ... allow_pickle=") would point the user at unpickling an
    input, which runs code from it, so anything else is refused here, by kind."""
    where = f"--input {name}={path}"
    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except OSError as e:
        raise GlassrtError(f"cannot read {where}: {e.strerror or e}") from e
    if head != b"\x93NUMPY":
        kind = "a .npz archive (several arrays)" if head.startswith(b"PK") else "not a .npy file"
        raise GlassrtError(f"{where}: '{path}' is {kind}; expected {ACCEPTED}. From text: "
                           "numpy.save('x.npy', numpy.loadtxt('x.txt', dtype='float32'))")
    try:
        value = np.load(path, allow_pickle=False)
    except ValueError as e:
        why = ("holds Python objects (dtype object), which only pickle can load; glassrt never unpickles an input"
               if "allow_pickle" in str(e) else f"is a damaged .npy file ({e})")
        raise GlassrtError(f"{where}: '{path}' {why}; expected {ACCEPTED}") from e
    return value


def _unnamed(name: str) -> bool:
    """A dim the model leaves without a name (no dim_param): glassrt calls it unk__N."""
    return name.startswith("unk__")


def model_dims(sess) -> list[str]:
    """The named symbolic dims of the model's inputs: what --dim may bind."""
    names = set()
    for vi in sess._inputs:
        if isinstance(vi.type, TensorType) and vi.type.shape is not None:
            names.update(n for d in vi.type.shape for n in symbolic.free_names(d) if not _unnamed(n))
    return sorted(names)


def check_dims(sess, dims: dict) -> None:
    """A --dim the model does not have binds nothing: most likely a typo, so refuse it by name."""
    known = model_dims(sess)
    unknown = sorted(set(dims) - set(known))
    if unknown:
        has = f"its inputs' dims are: {', '.join(known)}" if known else "its inputs have no named symbolic dims"
        which = "no dim of that name" if len(unknown) == 1 else "no dims of those names"
        raise GlassrtError(f"--dim {', '.join(unknown)}: the model has {which}; {has}")


def _dims_of_given(sess, given: dict, dims: dict) -> dict:
    """Bindings the supplied inputs fix: x of shape (3, 7) declared [batch, seq] binds both."""
    bound = {}
    for vi in sess._inputs:
        value = given.get(vi.name)
        t = vi.type
        if not isinstance(value, np.ndarray) or not isinstance(t, TensorType) or t.shape is None \
                or value.ndim != len(t.shape):
            continue  # the run itself reports a wrong rank, with the input's name
        for d, got in zip(t.shape, value.shape):
            sym = symbolic.symbol_name(d)
            if sym is None or _unnamed(sym) or sym in bound:
                continue
            if sym in dims and dims[sym] != got:
                raise GlassrtError(f"--dim {sym}={dims[sym]}, but --input {vi.name} has {sym}={got}")
            bound[sym] = int(got)
    return bound


def generate(sess, dims: dict, given: dict | None = None, seed: int = 0) -> tuple[dict, list[str]]:
    """({name: value} for every input not in `given`, notes on what was assumed).

    Symbolic dims are bound by `dims` (--dim) or by the shapes of the given inputs; a dim
    the model leaves unnamed is 1 (noted). Every input that cannot be made is reported in
    one error, so a user fixes the command line once, not once per try.
    """
    given = given or {}
    check_dims(sess, dims)
    bindings = {**_dims_of_given(sess, given, dims), **dims}
    rng = np.random.default_rng(seed)
    feeds, notes, problems = {}, [], []
    unbound: dict[str, list[str]] = {}  # dim -> the inputs that need it
    for arg, vi in zip(sess.get_inputs(), sess._inputs):
        if arg.name in given:
            continue
        t = vi.type
        if not isinstance(t, TensorType) or t.shape is None:
            problems.append(f"input '{arg.name}' ({arg.type}) has no declared shape: pass it with "
                            f"--input {arg.name}=FILE.npy")
            continue
        shape, missing = [], []
        for axis, d in enumerate(t.shape):
            if isinstance(d, int):
                shape.append(d)
                continue
            free = symbolic.free_names(d)
            if free and all(_unnamed(n) for n in free):
                notes.append(f"input '{arg.name}' dim {axis} has no name in the model: made it 1")
                shape.append(1)
                continue
            v = symbolic.evaluate(d, bindings)
            if isinstance(v, int):
                shape.append(v)
            else:
                missing += sorted(n for n in symbolic.free_names(v) if not _unnamed(n))
        for n in dict.fromkeys(missing):
            unbound.setdefault(n, []).append(arg.name)
        if missing:
            continue
        bound = _index_bound(sess, arg.name) if np.dtype(t.dtype).kind in "iu" else None
        if bound is not None and bound < 10:
            value = rng.integers(0, bound, shape).astype(t.dtype)
            notes.append(f"input '{arg.name}' indexes a table of {bound} along the gathered axis: values in "
                         f"[0, {bound - 1}]")
        else:
            value = random_value(rng, shape, t.dtype)
        if value is None:
            problems.append(f"cannot make up input '{arg.name}' of type {arg.type}: pass it with "
                            f"--input {arg.name}=FILE.npy")
            continue
        feeds[arg.name] = value
    if unbound:
        which = "; ".join(f"'{d}' (input{'s' if len(ins) > 1 else ''} {', '.join(ins)})" for d, ins in unbound.items())
        problems.insert(0, f"unbound symbolic dim{'s' if len(unbound) > 1 else ''} {which}: bind "
                           + " ".join(f"--dim {d}=N" for d in unbound)
                           + " or pass the input" + ("s" if len({i for v in unbound.values() for i in v}) > 1 else "")
                           + " with --input NAME=FILE.npy")
    if problems:
        raise GlassrtError(("cannot make up the inputs: " + problems[0]) if len(problems) == 1
                           else "cannot make up the inputs:\n  " + "\n  ".join(problems))
    return feeds, notes


def _index_bound(sess, name: str) -> int | None:
    """The size of the smallest table the input indexes directly (the indices of a Gather
    or GatherElements whose data has a static size along the axis), or None: made-up
    indices stay below it (BERT's token_type_ids index a table of 2 rows)."""
    placement = getattr(sess, "placement", None)
    types = placement.inference.types if placement is not None else {}
    bound = None
    for node in sess.graph.walk():
        if node.domain or node.op_type not in ("Gather", "GatherElements") or node.inputs[1:2] != [name]:
            continue
        t = types.get(node.inputs[0])
        axis = node.attrs.get("axis", 0)
        if not isinstance(t, TensorType) or t.shape is None or not -len(t.shape) <= int(axis) < len(t.shape):
            continue
        size = t.shape[int(axis)]
        if isinstance(size, int) and size > 0:
            bound = size if bound is None else min(bound, size)
    return bound


def describe(name: str, value, how: str = "") -> str:
    """One line per made-up input: name, dtype, shape and the range of its values."""
    if not isinstance(value, np.ndarray):
        return f"input '{name}': {type(value).__name__}"
    kind = dtypes.name(value.dtype)
    if value.size == 0:
        span = "empty"
    elif value.dtype.kind == "b":
        span = f"{int(value.sum())} of {value.size} True"
    else:
        lo, hi = value.min(), value.max()
        span = f"values in [{lo:.4g}, {hi:.4g}]" if value.dtype.kind == "f" else f"values in [{lo}, {hi}]"
    return f"input '{name}': {kind}{list(value.shape)}, {span}" + (f" ({how})" if how else "")
