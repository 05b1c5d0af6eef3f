"""What a dim's value can be, for every positive value of its symbols: interval bounds,
sharpened by linear bounds of floor, Max and Min terms and by letting a positive term
absorb a negative one it dominates. Sound, not complete: `decide` answers True or False
only when that holds everywhere, else None (and the comparison raises TypeError)."""
from __future__ import annotations

import math
import random
from fractions import Fraction

from .poly import ONE, mdiv, padd, pscale

INF = math.inf


def as_poly(x):
    """An int or a Dim as a polynomial dict."""
    if type(x) is int:
        return {ONE: x} if x else {}
    return x._p


def _imul(a, b):
    def m(x, y):
        return 0 if x == 0 or y == 0 else x * y
    ps = (m(a[0], b[0]), m(a[0], b[1]), m(a[1], b[0]), m(a[1], b[1]))
    return min(ps), max(ps)


def _ipow(iv, e):
    out = (1, 1)
    for _ in range(e):
        out = _imul(out, iv)
    return out


def _bounds(x):
    if type(x) is int:
        return x, x
    return pbounds(x._p)


def pbounds(p):
    """Interval arithmetic over the terms (sound, not tight)."""
    lo = hi = 0
    for m, c in p.items():
        ml, mh = 1, 1
        for a, e in m:
            iv = atom_bounds(a)
            ml, mh = _imul((ml, mh), iv if e == 1 else _ipow(iv, e))
        if c > 0:
            lo, hi = lo + (c * ml if ml else 0), hi + (c * mh if mh else 0)
        else:
            lo, hi = lo + (c * mh if mh else 0), hi + (c * ml if ml else 0)
    return lo, hi


def atom_bounds(a):
    if a._bounds is None:
        a._bounds = _atom_bounds(a)
    return a._bounds


def _atom_bounds(a):
    if a.kind == "sym":
        return 1, INF
    if a.kind in ("max", "min"):
        bs = [_bounds(x) for x in a.args]
        f = max if a.kind == "max" else min
        return f(b[0] for b in bs), f(b[1] for b in bs)
    (nl, nh), (dl, dh) = _bounds(a.args[0]), _bounds(a.args[1])
    if dl < 1:
        return -INF, INF
    if a.kind == "mod":
        hi = dh - 1
        return 0, min(hi, nh) if nl >= 0 else hi
    if nl >= 0:
        return (0 if dh == INF else nl // dh), (INF if nh == INF else nh // dl)
    lo = -INF if nl == -INF else nl // dl
    if nh <= 0:
        return lo, ((-1 if nh < 0 else 0) if dh == INF else nh // dh)
    return lo, (INF if nh == INF else nh // dl)


def _relaxations(p, limit=16):
    """Polynomials with rational coefficients that are <= p for every value of the
    symbols, from linear bounds of its floor, Max and Min terms: floor(n/k) >= (n - k + 1)/k
    and <= n/k, Max(...) >= each argument, Min(...) <= each argument."""
    out = [{}]
    for m, c in p.items():
        options = [{m: c}]
        if len(m) == 1:
            (a, e), = m
            if e == 1 and a.kind == "floor" and type(a.args[1]) is int:
                n, k = as_poly(a.args[0]), a.args[1]
                scaled = {mm: Fraction(cc * c, k) for mm, cc in n.items()}
                options.append(padd(scaled, {ONE: Fraction(-(k - 1) * c, k)}) if c > 0 else scaled)
            elif e == 1 and (a.kind == "max") == (c > 0) and a.kind in ("max", "min"):
                options += [pscale(as_poly(x), c) for x in a.args]
        if len(options) > 1:
            out = [padd(r, o) for r in out for o in options][:limit]
        else:
            out = [padd(r, options[0]) for r in out]
    return out


def _absorbed(p):
    """p with positive terms moved down onto the negative terms they dominate, a
    polynomial <= p: c*m*q >= c*m when the atoms of q are >= 1 and those of m >= 0 (so
    15*b**2 - 15*b >= 0 and 4*p*s - 2*p >= 2*p)."""
    if not any(c < 0 for c in p.values()):
        return p
    out = dict(p)
    for m1 in sorted((m for m, c in p.items() if c > 0 and m), key=lambda m: -sum(e for _, e in m)):
        for m2 in [m for m, c in out.items() if c < 0 and m != m1]:
            q = mdiv(m1, m2)
            if q is None or any(atom_bounds(a)[0] < 1 for a, _ in q) or any(atom_bounds(a)[0] < 0 for a, _ in m2):
                continue
            move = min(out[m1], -out[m2])
            out[m1] -= move
            out[m2] += move
            out = {m: c for m, c in out.items() if c}
            if m1 not in out:
                break
    return out


def _lower(p) -> float:
    """A lower bound of p over all positive values of the symbols."""
    best = -INF
    for r in (p, *_relaxations(p)):
        for r2 in (r, *(_relaxations(r, limit=4) if r is not p else ())):
            lo = pbounds(_absorbed(r2))[0]
            if lo > best:
                best = lo
    return best


def decide(p, t):
    """p >= t (p an integer-valued polynomial dict, t an int): True, False, or None when
    it depends on the symbols' values."""
    lo, hi = pbounds(p)
    if lo >= t:
        return True
    if hi < t:
        return False
    if _both_sides(p, t):
        return None
    lo = _lower(p)
    if lo != -INF and math.ceil(lo) >= t:
        return True
    hi = -_lower(pscale(p, -1))
    if hi != INF and math.floor(hi) < t:
        return False
    return None


# Symbol values at which `_both_sides` evaluates a polynomial: every symbol the same value,
# then each symbol its own value, drawn (a fixed seed: the same points every process) from
# these; independent symbols (a Range's length against a Resize's) need the latter.
_SAMPLES = (1, 2, 3, 4, 5, 7, 8, 13, 16, 31, 32, 33, 64, 97, 224, 320, 641, 1024)
_MIXED = 24


def _both_sides(p, t) -> bool:
    """Whether p >= t at some positive values of the symbols and p < t at others: then
    neither answer holds everywhere and `decide` is None, proven without the relaxations'
    search (which took ~9 ms a call for a YOLOv8's broadcast of two 11-term dims, ~0.1 s
    of creating its session). False says only that no such pair was found here."""
    names = sorted({a.args[0] for m in p for a in _atoms_in(m) if a.kind == "sym"})
    above = below = False
    points = [dict.fromkeys(names, v) for v in _SAMPLES]
    if len(names) > 1:
        rng = random.Random(len(names))
        points += [{n: rng.choice(_SAMPLES) for n in names} for _ in range(_MIXED)]
    for env in points:
        try:
            v = _value(p, env)
        except (ZeroDivisionError, _Undefined):
            continue
        if v >= t:
            above = True
        else:
            below = True
        if above and below:
            return True
    return False


class _Undefined(Exception):
    pass


def _atoms_in(m):
    """The atoms of a monomial and, recursively, of their arguments."""
    for a, _ in m:
        yield a
        if a.kind != "sym":
            for x in a.args:
                if type(x) is not int:
                    for mm in x._p:
                        yield from _atoms_in(mm)


def _value(p, env) -> int:
    total = 0
    for m, c in p.items():
        term = c
        for a, e in m:
            term *= _atom_value(a, env) ** e
        total += term
    return total


def _atom_value(a, env) -> int:
    if a.kind == "sym":
        return env[a.args[0]]
    if a.kind in ("max", "min"):
        vals = [x if type(x) is int else _value(x._p, env) for x in a.args]
        return max(vals) if a.kind == "max" else min(vals)
    n, d = (x if type(x) is int else _value(x._p, env) for x in a.args)
    if d <= 0:
        raise _Undefined  # (a dim divided by a non-positive one: no value to compare)
    return n // d if a.kind == "floor" else n % d
