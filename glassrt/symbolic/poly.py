"""Polynomials as dicts: {monomial: coefficient}, a monomial a frozenset of (atom,
exponent) pairs (ONE, the empty one, for the constant term). The arithmetic under `Dim`;
no zero coefficients are kept, and no dict is changed once made."""
from __future__ import annotations

ONE = frozenset()


def padd(p, q):
    if not q:
        return p
    if not p:
        return q
    r = dict(p)
    for m, c in q.items():
        c += r.get(m, 0)
        if c:
            r[m] = c
        else:
            del r[m]
    return r


def pscale(p, k):
    if k == 1:
        return p
    return {m: c * k for m, c in p.items()} if k else {}


def mmul(m1, m2):
    if not m1:
        return m2
    if not m2:
        return m1
    d = dict(m1)
    for a, e in m2:
        d[a] = d.get(a, 0) + e
    return frozenset(d.items())


def pmul(p, q):
    if len(q) == 1 and ONE in q:
        return pscale(p, q[ONE])
    if len(p) == 1 and ONE in p:
        return pscale(q, p[ONE])
    r = {}
    for m1, c1 in p.items():
        for m2, c2 in q.items():
            m = mmul(m1, m2)
            r[m] = r.get(m, 0) + c1 * c2
    return {m: c for m, c in r.items() if c}


def mdiv(m, d):
    """Monomial m / d, or None when d does not divide m."""
    if not d:
        return m
    out = dict(m)
    for a, e in d:
        left = out.get(a, 0) - e
        if left < 0:
            return None
        if left:
            out[a] = left
        else:
            del out[a]
    return frozenset(out.items())


def mgcd(monomials):
    """The largest monomial dividing all of these."""
    it = iter(monomials)
    common = dict(next(it))
    for m in it:
        if not common:
            break
        md = dict(m)
        common = {a: min(e, md[a]) for a, e in common.items() if a in md}
    return frozenset(common.items())


def mkey(m):
    """Sort key of a lex monomial order: the largest monomial sorts first."""
    return tuple(sorted((0, a.key, -e) for a, e in m)) + ((1,),)


def pdiv(p, d):
    """p / d when d divides p exactly (integer coefficients), else None. Multivariate
    division by the leading term; the quotient is checked by multiplying back."""
    if len(d) == 1:
        (dm, dc), = d.items()
        q = {}
        for m, c in p.items():
            qm = mdiv(m, dm)
            if qm is None or c % dc:
                return None
            q[qm] = c // dc
        return q
    lead = min(d, key=mkey)
    lc = d[lead]
    rest, q = dict(p), {}
    for _ in range(64 + 4 * len(p)):
        if not rest:
            return q if pmul(q, d) == p else None
        m = min(rest, key=mkey)
        qm = mdiv(m, lead)
        if qm is None or rest[m] % lc:
            return None
        t = {qm: rest[m] // lc}
        q = padd(q, t)
        rest = padd(rest, pscale(pmul(t, d), -1))
    return None
