"""str() of a dim, written as SymPy's printer writes the same expression.

Explain reports, error messages and ONNX dim_params show dims as text, and that text
stayed SymPy's when glassrt stopped using SymPy: ``2*batch``, ``past + 1``,
``floor(H/2 - 3/2) + 1``, ``Mod(batch, 2)``, ``Max(range__1, sequence)``. The dim is
first turned into the tree SymPy would hold (numbers, symbols, Add, Mul, Pow, functions),
then printed by the rules of SymPy's StrPrinter: its term order (lex on the generators,
sorted by SymPy's sort key), its factor order, its precedences and parentheses.

A dim is kept expanded, but one made by multiplying a sum prints as the product it was
made from (``batch*(past + 1)``, as SymPy kept it), and sums of such products as that sum
(``b*(p + 1) + s``, like terms combined), unless the expanded polynomial has no more terms
(``b*(p + 1) - b*p`` prints ``b``, where SymPy wrote ``-b*p + b*(p + 1)``).
"""
from __future__ import annotations

from fractions import Fraction

from .expr import Dim

# SymPy's precedences and class keys
_ADD, _MUL, _POW, _FUNC, _ATOM = 40, 50, 60, 70, 1000
_CLASS = {"sym": (2, 0, "Symbol"), "mul": (3, 0, "Mul"), "add": (3, 1, "Add"), "floor": (4, 10000, "floor"),
          "Mod": (4, 10000, "Mod"), "Max": (5, 0, "Max"), "Min": (5, 0, "Min")}
_NUMBER = (1, 0, "Number")
_FN = {"floor": "floor", "mod": "Mod", "max": "Max", "min": "Min"}


def to_str(d) -> str:
    return _print(_view(d))


# ---------------------------------------------------------------- the SymPy-shaped tree


def _view(x, scale=Fraction(1)):
    """x * scale as a tree: ("num", Fraction), ("sym", name), ("add", terms),
    ("mul", factors), ("pow", base, int), ("fn", name, args)."""
    if type(x) is int:
        return ("num", x * scale)
    if x._shown is not None and scale == 1:
        shown = _shown(x)
        if shown is not None:
            return shown
    terms = _expanded(x, scale)
    return terms[0] if len(terms) == 1 else ("add", tuple(terms))


def _expanded(x, scale=Fraction(1)):
    return _ordered_terms([_term(c * scale, m) for m, c in x._p.items()])


def _shown(x):
    """x as the sum of products it was built from (SymPy's Add of Muls: products of the
    same factors combined), or None when the expanded polynomial is no longer."""
    combined = {}
    for factors in x._shown:
        product = _product(factors)
        if product is not None:
            nodes = [product]
        elif all(type(f) is int for f in factors):
            c = 1
            for f in factors:
                c *= f
            nodes = [("num", Fraction(c))]
        else:
            value = 1
            for f in factors:
                value = value * f
            nodes = [] if value == 0 else [("num", Fraction(value))] if type(value) is int else _expanded(value)
        for node in nodes:
            c, rest = (node[1], None) if node[0] == "num" else _coeff_rest(node)
            combined[rest] = combined.get(rest, 0) + c
    terms = [("num", Fraction(c)) if rest is None else _mul(c, list(rest[1]) if rest[0] == "mul" else [rest])
             for rest, c in combined.items() if c]
    if not terms or len(terms) >= len(x._p):
        return None
    terms = _ordered_terms(terms)
    return terms[0] if len(terms) == 1 else ("add", tuple(terms))


def _product(factors):
    """The product of these dims as SymPy's Mul holds it: numbers into the coefficient,
    equal bases into powers, sums kept as factors; None when SymPy would have expanded it
    (a number times one sum: 2*(b + 1) is 2*b + 2)."""
    coeff, powers = Fraction(1), {}
    for f in factors:
        if type(f) is int:
            coeff *= f
        elif len(f._p) == 1:
            (m, c), = f._p.items()
            coeff *= c
            for a, e in m:
                node = _atom(a)
                powers[node] = powers.get(node, 0) + e
        else:
            node = _view(f)
            if node[0] != "add":
                return None
            powers[node] = powers.get(node, 0) + 1
    sums = [b for b, e in powers.items() if b[0] == "add"]
    if coeff == 0 or not sums or (len(powers) == 1 and powers[sums[0]] == 1):
        return None
    return _mul(coeff, _ordered_factors([b if e == 1 else ("pow", b, e) for b, e in powers.items()]))


def _term(c, m):
    factors = _ordered_factors([_atom(a) if e == 1 else ("pow", _atom(a), e) for a, e in m])
    if not factors:
        return ("num", c)
    return _mul(c, factors)


def _mul(c, factors):
    if c == 0:
        return ("num", c)
    if c == 1 and len(factors) == 1:
        return factors[0]
    return ("mul", ((("num", c),) if c != 1 else ()) + tuple(factors))


def _atom(a):
    if a.kind == "sym":
        return ("sym", a.args[0])
    name = _FN[a.kind]
    if a.kind in ("max", "min"):
        return ("fn", name, tuple(sorted((_view(x) for x in a.args), key=_key)))
    n, d = a.args
    if a.kind == "mod":
        return ("fn", name, (_view(n), _view(d)))
    return ("fn", name, (_quotient(n, d),))


def _quotient(n, d):
    """n/d as SymPy holds it: an int denominator distributes over the terms
    (H/2 - 3/2); a one-term denominator joins the numerator's product with negative
    exponents (batch/(2*sequence)); a sum stays a factor to the power -1."""
    if type(d) is int:
        return _view(n, Fraction(1, d))
    if len(d._p) == 1:
        (dm, dc), = d._p.items()
        inv = [("pow", _atom(a), -e) for a, e in dm]
        if type(n) is int or len(n._p) == 1:
            (nm, nc), = ({(): n}.items() if type(n) is int else n._p.items())
            num = [_atom(a) if e == 1 else ("pow", _atom(a), e) for a, e in nm]
            return _mul(Fraction(nc, dc), _ordered_factors(num + inv))
        return _mul(Fraction(1, dc), _ordered_factors([_view(n)] + inv))
    inv = [("pow", _view(d), -1)]
    if type(n) is not int and len(n._p) == 1:
        (nm, nc), = n._p.items()
        return _mul(Fraction(nc), _ordered_factors([_atom(a) if e == 1 else ("pow", _atom(a), e) for a, e in nm] + inv))
    if type(n) is int:
        return _mul(Fraction(n), inv)
    return _mul(Fraction(1), _ordered_factors([_view(n)] + inv))


# ---------------------------------------------------------------- SymPy's orders


def _coeff_rest(node):
    """(rational coefficient, the rest) as SymPy's as_coeff_Mul splits them."""
    if node[0] == "mul":
        nums = [f for f in node[1] if f[0] == "num"]
        rest = tuple(f for f in node[1] if f[0] != "num")
        c = nums[0][1] if nums else 1
        return c, rest[0] if len(rest) == 1 else ("mul", rest)
    return 1, node


def _one_key(e):
    return (_NUMBER, (0, ()), (), e)


def _key(node):
    """SymPy's Expr.sort_key."""
    if node[0] == "num":
        return _one_key(node[1])
    c, rest = _coeff_rest(node)
    exp = 1
    if rest[0] == "pow":
        rest, exp = rest[1], rest[2]
    kind = rest[0]
    if kind == "sym":
        args = (rest[1],)
    elif kind == "add":
        args = tuple(_key(t) for t in _ordered_terms(rest[1]))
    elif kind == "mul":
        args = tuple(_key(f) for f in _ordered_factors(rest[1]))
    else:
        args = tuple(_key(a) for a in _fn_args(rest))
    cls = _CLASS[kind] if kind != "fn" else _CLASS[rest[1]]
    return (cls, (len(args), args), _one_key(exp), c)


def _fn_args(node):
    if node[1] in ("Max", "Min"):
        return sorted(node[2], key=_key)
    return node[2]


def _ordered_factors(factors):
    return sorted(factors, key=_key)


def _ordered_terms(terms):
    """SymPy's Add.as_ordered_terms: a positive number and a negated product of one factor
    print number first (1 - batch); otherwise lex order of the exponent vectors over the
    generators (the factors' bases, sorted by sort key), the largest first."""
    if len(terms) == 2:
        nums = [t for t in terms if t[0] == "num"]
        muls = [t for t in terms if t[0] == "mul"]
        if len(nums) == 1 and len(muls) == 1 and nums[0][1] > 0 and len(muls[0][1]) == 2:
            coeffs = [f for f in muls[0][1] if f[0] == "num"]
            if coeffs and coeffs[0][1] < 0:
                return [nums[0], muls[0]]
    split = []
    gens = {}
    for t in terms:
        if t[0] == "num":
            split.append((t, t[1], {}))
            continue
        c, rest = _coeff_rest(t)
        exps = {}
        for f in (rest[1] if rest[0] == "mul" else (rest,)):
            base, e = (f[1], f[2]) if f[0] == "pow" else (f, 1)
            exps[base] = exps.get(base, 0) + e
            gens[base] = None
        split.append((t, c, exps))
    order = sorted(gens, key=_key)
    keyed = [(tuple(-exps.get(g, 0) for g in order), c, i) for i, (_, c, exps) in enumerate(split)]
    return [split[i][0] for *_, i in sorted(keyed)]


# ---------------------------------------------------------------- SymPy's StrPrinter


def _prec(node) -> int:
    kind = node[0]
    if kind == "num":
        v = node[1]
        return _ADD if v < 0 else (_ATOM if v.denominator == 1 else _MUL)
    if kind == "sym":
        return _ATOM
    if kind == "add":
        return _ADD
    if kind == "mul":
        return _ADD if _coeff_rest(node)[0] < 0 else _MUL
    if kind == "pow":
        return _POW
    return {"floor": _FUNC, "Mod": _MUL}.get(node[1], _ATOM)


def _paren(node, level) -> str:
    s = _print(node)
    return f"({s})" if _prec(node) <= level else s


def _print(node) -> str:
    kind = node[0]
    if kind == "num":
        return str(Fraction(node[1]))
    if kind == "sym":
        return node[1]
    if kind == "fn":
        return f"{node[1]}({', '.join(_print(a) for a in _fn_args(node))})"
    if kind == "pow":
        base, e = node[1], node[2]
        if e == -1:
            return f"1/{_paren(base, _POW)}"
        return f"{_paren(base, _POW)}**{e if e > 0 else f'({e})'}"
    if kind == "add":
        return _print_add(node)
    return _print_mul(node)


def _print_add(node) -> str:
    out = []
    for t in _ordered_terms(node[1]):
        s = _print(t)
        sign = "+"
        if s.startswith("-"):
            sign, s = "-", s[1:]
        out += [sign, f"({s})" if _prec(t) < _ADD else s]
    sign = out.pop(0)
    return ("" if sign == "+" else sign) + " ".join(out)


def _print_mul(node) -> str:
    prec = _prec(node)
    c, rest = _coeff_rest(node)
    sign = ""
    if c < 0:
        c, sign = -c, "-"
    factors = list(rest[1]) if rest[0] == "mul" else [rest]
    items = ([("num", Fraction(c))] if c != 1 else []) + _ordered_factors(factors)
    num, den = [], []
    for it in items:
        if it[0] == "pow" and it[2] < 0:
            den.append(it[1] if it[2] == -1 else ("pow", it[1], -it[2]))
        elif it[0] == "num":
            v = Fraction(it[1])
            if v.numerator != 1:
                num.append(("num", Fraction(v.numerator)))
            if v.denominator != 1:
                den.append(("num", Fraction(v.denominator)))
        else:
            num.append(it)
    num = num or [("num", Fraction(1))]
    num_s = [_paren(x, prec) for x in num]
    den_s = [_paren(x, prec) for x in den]
    if not den:
        return sign + "*".join(num_s)
    if len(den) == 1:
        return sign + "*".join(num_s) + "/" + den_s[0]
    return sign + "*".join(num_s) + "/(" + "*".join(den_s) + ")"


__all__ = ["to_str", "Dim"]
