"""The dim expression type: polynomials with integer coefficients over atoms.

An atom is a named symbol (a positive integer: ``batch``) or an opaque term the
polynomial treats as a variable: ``floor(n/d)``, ``Mod(n, d)``, ``Max(...)``, ``Min(...)``.
A `Dim` keeps its polynomial expanded, as ``{monomial: coefficient}`` with a monomial a
frozenset of ``(atom, exponent)`` pairs, so equal polynomials are equal objects
(``batch*2 == 2*batch``, ``(batch + 1)*2 - 2 == 2*batch``) and hash alike. A constant
is never a Dim: every operation hands back a Python ``int`` when the result is one.

Comparisons decide what holds for every positive value of the symbols (``batch > 0``,
``batch + 1 > batch``) and raise TypeError when the answer depends on the values
(``batch > 3``), as SymPy's relationals do; ``==`` is structural (``batch == 1`` is False).
"""
from __future__ import annotations

import math
import operator
from numbers import Integral

from .bounds import atom_bounds, decide, pbounds
from .poly import ONE, mdiv, mgcd, padd, pdiv, pmul, pscale


class Atom:
    """A variable of the polynomial. kind "sym": args (name,); "floor", "mod": (numerator,
    denominator), each an int or a Dim; "max", "min": a frozenset of ints and Dims."""

    __slots__ = ("kind", "args", "_hash", "_bounds", "_key")

    def __init__(self, kind: str, args: tuple):
        self.kind, self.args = kind, args
        self._hash = hash((kind, args))
        self._bounds = self._key = None

    def __eq__(self, other):
        return self is other or (type(other) is Atom and self._hash == other._hash and self.kind == other.kind
                                 and self.args == other.args)

    def __hash__(self):
        return self._hash

    def __reduce__(self):
        return Atom, (self.kind, self.args)

    @property
    def key(self):
        """A total order on atoms (any fixed one serves): polynomial division needs one."""
        if self._key is None:
            self._key = ("sym floor mod max min".split().index(self.kind), str(atom_dim(self)))
        return self._key


class Dim:
    """A symbolic dim. Immutable; build one with `glassrt.symbolic.symbol` and arithmetic."""

    __slots__ = ("_p", "_hash", "_str", "_names", "_shown")

    def __init__(self, p: dict):
        self._p = p  # {monomial: nonzero int}; never empty, never only a constant
        self._hash = self._str = self._names = None
        # for str() only: how it was built, as summands each a tuple of factors, when a
        # product of sums is among them, so that batch*(past + 1) prints as that rather than
        # batch*past + batch (as SymPy kept it). Not part of the value: == and hash ignore it.
        self._shown = None

    # ------------------------------------------------------------ identity
    def __eq__(self, other):
        if type(other) is Dim:
            return self is other or self._p == other._p
        if isinstance(other, Integral) and not isinstance(other, bool):
            return False  # a Dim is never a constant
        return NotImplemented

    def __ne__(self, other):
        r = self.__eq__(other)
        return r if r is NotImplemented else not r

    def __hash__(self):
        if self._hash is None:
            self._hash = hash(frozenset(self._p.items()))
        return self._hash

    def __str__(self):
        if self._str is None:
            from .printing import to_str

            self._str = to_str(self)
        return self._str

    __repr__ = __str__

    def __reduce__(self):
        return _from_items, (tuple(self._p.items()), self._shown)

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    # ------------------------------------------------------------ arithmetic
    def __add__(self, other):
        q = _poly(other)
        if q is None:
            return NotImplemented
        if not q:
            return self
        return _shown_sum(_make(padd(self._p, q)), self, other, 1)

    __radd__ = __add__

    def __sub__(self, other):
        q = _poly(other)
        if q is None:
            return NotImplemented
        if not q:
            return self
        return _shown_sum(_make(padd(self._p, pscale(q, -1))), self, other, -1)

    def __rsub__(self, other):
        q = _poly(other)
        return NotImplemented if q is None else _shown_sum(_make(padd(q, pscale(self._p, -1))), other, self, -1)

    def __mul__(self, other):
        q = _poly(other)
        if q is None:
            return NotImplemented
        r = _make(pmul(self._p, q))
        if type(r) is Dim and (self._shown is not None or len(self._p) > 1 or len(q) > 1
                               or (type(other) is Dim and other._shown is not None)):
            factors = _factors(self) + _factors(other)
            dims = [f for f in factors if type(f) is Dim]
            if len(dims) > 1 or len(dims[0]._p) == 1:
                r._shown = (factors,)
            elif self._shown is not None:  # SymPy distributes a number over a sum
                r._shown = tuple((q[ONE],) + t for t in self._shown)
        return r

    __rmul__ = __mul__

    def __neg__(self):
        r = Dim(pscale(self._p, -1))
        if self._shown is not None:
            r._shown = _summands(self, -1)
        return r

    def __pos__(self):
        return self

    def __pow__(self, k):
        if not isinstance(k, Integral) or isinstance(k, bool) or k < 0:
            return NotImplemented
        out = 1
        for _ in range(int(k)):
            out = out * self
        return out

    def __floordiv__(self, other):
        return NotImplemented if _poly(other) is None else floordiv(self, other)

    def __rfloordiv__(self, other):
        return NotImplemented if _poly(other) is None else floordiv(other, self)

    def __mod__(self, other):
        return NotImplemented if _poly(other) is None else mod(self, other)

    def __rmod__(self, other):
        return NotImplemented if _poly(other) is None else mod(other, self)

    def __abs__(self):
        r = decide(self._p, 0)  # self >= 0
        if r is None:
            raise TypeError(f"cannot determine the sign of {self}: it depends on the values of the symbols")
        return self if r else -self

    def __int__(self):
        raise TypeError(f"cannot convert the symbolic dim {self} to int")

    def __float__(self):
        raise TypeError(f"cannot convert the symbolic dim {self} to float")

    # ------------------------------------------------------------ order
    def __gt__(self, other):
        return _compare(self, other, ">")

    def __ge__(self, other):
        return _compare(self, other, ">=")

    def __lt__(self, other):
        return _compare(self, other, "<")

    def __le__(self, other):
        return _compare(self, other, "<=")


# ---------------------------------------------------------------- building dims


def _from_items(items, shown=None):
    d = Dim(dict(items))
    d._shown = shown
    return d


def _factors(x) -> tuple:
    """x as factors for a product's _shown."""
    if type(x) is Dim:
        return x._shown[0] if x._shown is not None and len(x._shown) == 1 else (x,)
    return (operator.index(x),)


def _summands(x, sign=1) -> tuple:
    """x as summands for a sum's _shown."""
    if type(x) is not Dim:
        x = operator.index(x)
        return ((sign * x,),) if x else ()
    s = x._shown if x._shown is not None else ((x,),)
    return s if sign == 1 else tuple((-1,) + t for t in s)


def _shown_sum(r, a, b, sign):
    """r = a + sign*b, remembering the summands when one of them is a shown product."""
    if type(r) is Dim and ((type(a) is Dim and a._shown is not None) or (type(b) is Dim and b._shown is not None)):
        r._shown = _summands(a) + _summands(b, sign)
    return r


def _poly(x):
    """x as a {monomial: coefficient} dict; None when x is not an integer or a Dim."""
    if type(x) is Dim:
        return x._p
    if type(x) is int:
        return {ONE: x} if x else {}
    if isinstance(x, Integral) and not isinstance(x, bool):  # numpy integers
        x = operator.index(x)
        return {ONE: x} if x else {}
    return None


def _make(p: dict):
    if not p:
        return 0
    if len(p) == 1 and ONE in p:
        return p[ONE]
    return Dim(p)


def norm(x):
    """An int or a Dim; TypeError for anything else (numpy integers become ints)."""
    if type(x) is int or type(x) is Dim:
        return x
    if isinstance(x, Integral) and not isinstance(x, bool):
        return operator.index(x)
    raise TypeError(f"not a dimension: {x!r}")


def atom_dim(atom: Atom) -> Dim:
    return Dim({frozenset(((atom, 1),)): 1})


def single_atom(x):
    """The atom when x is one atom (coefficient 1, exponent 1), else None."""
    if type(x) is Dim and len(x._p) == 1:
        (m, c), = x._p.items()
        if c == 1 and len(m) == 1:
            (a, e), = m
            if e == 1:
                return a
    return None


def exact_div(n, d):
    """n / d when it is exact (an int or a Dim with integer coefficients), else None."""
    n, d = norm(n), norm(d)
    if type(d) is int:
        if d == 0:
            return None
        if type(n) is int:
            return n // d if n % d == 0 else None
    if n == 0:
        return 0
    q = pdiv(_poly(n), d._p if type(d) is Dim else {ONE: d})
    return None if q is None else _make(q)


# ---------------------------------------------------------------- floor, Mod, Max, Min


def _monomial_parts(d):
    """(coefficient, monomial) when d is an int or a one-term Dim, else None."""
    if type(d) is int:
        return d, ONE
    if len(d._p) == 1:
        (m, c), = d._p.items()
        return c, m
    return None


def floordiv(n, d):
    """n // d, simplified where that is exact: (768*batch)//768 is batch, (b*s + s)//s is
    b + 1, (2*b + 1)//2 is b, (H - 3)//2 stays floor(H/2 - 3/2) as SymPy writes it."""
    n, d = norm(n), norm(d)
    if type(n) is int and type(d) is int:
        return n // d
    if d == 0:
        raise ZeroDivisionError("integer division or modulo by zero")
    if n == 0:
        return 0
    mono = _monomial_parts(d)
    if mono is None:
        if pbounds(d._p)[1] < 0:  # a negative denominator: floor(n/d) = floor(-n/-d)
            n, d = -n, -d
        if n == d:
            return 1
        q = pdiv(_poly(n), d._p)
        return _make(q) if q is not None else _make(_floor_atom(n, d))
    dc, dm = mono
    p = _poly(n)
    # cancel a common monomial and the integer content (the denominator ends positive)
    common = mgcd([dm, *p]) if dm else ONE
    g = math.gcd(dc, *p.values())
    if dc < 0:
        g = -g
    if common or g != 1:
        p = {mdiv(m, common): c // g for m, c in p.items()}
        dm, dc = mdiv(dm, common), dc // g
    if not dm and dc == 1:
        return _make(p)
    # terms the denominator divides come out of the floor: floor((d*w + r)/d) = w + floor(r/d)
    whole, rest = {}, {}
    for m, c in p.items():
        qm = mdiv(m, dm)
        if qm is not None and c % dc == 0:
            whole[qm] = c // dc
        else:
            rest[m] = c
    if not rest:
        return _make(whole)
    if not dm and len(rest) == 1 and ONE in rest:
        return _make(padd(whole, _poly(rest[ONE] // dc)))
    den = dc if not dm else Dim({dm: dc})
    return _make(padd(whole, _floor_atom(_make(rest), den)))


def _floor_atom(n, d):
    """floor(n/d) as a polynomial dict: 0 when 0 <= n < d, a constant when the bounds
    say so (floor(Mod(b, 4)/4) is 0), else the opaque term."""
    if type(d) is Dim and decide(_poly(n), 0) and decide(padd(d._p, pscale(_poly(n), -1)), 1):
        return {}
    p = _opaque("floor", (n, d))
    lo, hi = atom_bounds(next(iter(next(iter(p))))[0])
    return _poly(lo) if lo == hi else p


def mod(n, d):
    """n % d with Python's sign rule (the divisor's), reduced where that is exact."""
    n, d = norm(n), norm(d)
    if type(n) is int and type(d) is int:
        return n % d
    if d == 0:
        raise ZeroDivisionError("integer division or modulo by zero")
    if type(d) is int:
        if d < 0:
            return -mod(-n, -d)
        p = {m: c % d for m, c in _poly(n).items() if c % d}
        if not p:
            return 0
        if len(p) == 1 and ONE in p:
            return p[ONE]
        lo, hi = pbounds(p)
        if lo >= 0 and hi < d:  # already in [0, d): Mod(Mod(b, 4), 8) is Mod(b, 4)
            return _make(p)
        g = math.gcd(d, *p.values())
        if g > 1:  # Mod(2*b, 4) = 2*Mod(b, 2)
            return g * mod(_make({m: c // g for m, c in p.items()}), d // g)
        return _make(_opaque("mod", (_make(p), d)))
    if n == 0 or exact_div(n, d) is not None:
        return 0
    mono = _monomial_parts(d)
    if mono is not None:  # terms that are multiples of the divisor drop out
        dc, dm = mono
        p = {m: c for m, c in _poly(n).items() if mdiv(m, dm) is None or c % dc}
        n = _make(p)
    if decide(_poly(n), 0) and decide(padd(d._p, pscale(_poly(n), -1)), 1):  # 0 <= n < d
        return n
    return _make(_opaque("mod", (n, d)))


def _opaque(kind, args):
    return {frozenset(((Atom(kind, args), 1),)): 1}


def maximum(*args):
    """Max of dims, kept small: nested Maxes are flattened, repeats dropped, Min(x, n) next
    to x absorbed (x[:n] broadcast with x is x), ints folded, and any argument that another
    is provably at least as large dropped (Max(batch, 1) is batch)."""
    return _extremum("max", args)


def minimum(*args):
    return _extremum("min", args)


def _extremum(kind, args):
    if not args:
        raise ValueError(f"{kind} of no dims")
    other = "min" if kind == "max" else "max"
    flat = []
    for a in args:
        a = norm(a)
        at = single_atom(a)
        for x in (at.args if at is not None and at.kind == kind else (a,)):
            if x not in flat:
                flat.append(x)
    ints = [x for x in flat if type(x) is int]
    if len(ints) > 1:
        keep = max(ints) if kind == "max" else min(ints)
        flat = [x for x in flat if type(x) is not int or x == keep]
    if len(flat) > 1:
        def absorbed(x):
            at = single_atom(x)
            return at is not None and at.kind == other and any(y in at.args for y in flat if y is not x)
        flat = [x for x in flat if not absorbed(x)]
    if 1 < len(flat) <= 8:
        dropped = [False] * len(flat)
        for i, x in enumerate(flat):
            for j, y in enumerate(flat):
                if j != i and not dropped[j]:
                    diff = _poly(y - x if kind == "max" else x - y)
                    if decide(diff, 0) is True:
                        dropped[i] = True
                        break
        flat = [x for x, gone in zip(flat, dropped) if not gone]
    if len(flat) == 1:
        return flat[0]
    return _make(_opaque(kind, frozenset(flat)))


# ---------------------------------------------------------------- comparisons


def _compare(a: Dim, b, op: str):
    if isinstance(b, float):
        if math.isnan(b):
            return False
        if math.isinf(b):
            return (b > 0) == (op in ("<", "<="))
        if not b.is_integer():  # a is an integer: a > 2.5 is a > 2, a < 2.5 is a <= 2
            b, op = math.floor(b), {">": ">", ">=": ">", "<": "<=", "<=": "<="}[op]
        b = int(b)
    q = _poly(b)
    if q is None:
        return NotImplemented
    diff = padd(a._p, pscale(q, -1))  # a - b
    if op in ("<", "<="):
        diff = pscale(diff, -1)  # b - a
    r = decide(diff, 1 if op in (">", "<") else 0)
    if r is None:
        raise TypeError(f"cannot determine truth value of {a} {op} {b}: it depends on the values of the symbols")
    return r


# ---------------------------------------------------------------- substitution and names


def names(x) -> frozenset:
    if type(x) is int:
        return frozenset()
    if x._names is None:
        out = set()
        for m in x._p:
            for a, _ in m:
                out |= atom_names(a)
        x._names = frozenset(out)
    return x._names


def atom_names(a: Atom) -> frozenset:
    if a.kind == "sym":
        return frozenset(a.args)
    out = set()
    for x in a.args:
        out |= names(x)
    return frozenset(out)


def substitute(x, values: dict):
    """x with each symbol named in values replaced by its value (an int or a Dim)."""
    if type(x) is int:
        return x
    total = 0
    for m, c in x._p.items():
        t = c
        for a, e in m:
            v = _subst_atom(a, values)
            t = t * (v if e == 1 else v ** e)
        total = total + t
    return total


def _subst_atom(a: Atom, values):
    if a.kind == "sym":
        v = values.get(a.args[0])
        return atom_dim(a) if v is None else norm(v)
    if a.kind in ("max", "min"):
        return _extremum(a.kind, [substitute(x, values) for x in a.args])
    n, d = (substitute(x, values) for x in a.args)
    return floordiv(n, d) if a.kind == "floor" else mod(n, d)


def code(x, index: dict) -> str:
    """Python source computing x from parameters _0, _1, ... (index: symbol name -> k).
    Built from the expression tree alone: identifiers _k, int literals and operators."""
    if type(x) is int:
        return f"({x})"
    terms = []
    for m, c in x._p.items():
        factors = [repr(int(c))] if c != 1 or not m else []
        for a, e in m:
            f = _atom_code(a, index)
            factors.append(f if e == 1 else f"{f}**{int(e)}")
        terms.append("*".join(factors))
    return "(" + " + ".join(terms) + ")"


def _atom_code(a: Atom, index: dict) -> str:
    if a.kind == "sym":
        return f"_{int(index[a.args[0]])}"
    if a.kind in ("max", "min"):
        return f"{a.kind}({', '.join(code(x, index) for x in a.args)})"
    n, d = (code(x, index) for x in a.args)
    return f"({n}{'//' if a.kind == 'floor' else '%'}{d})"
