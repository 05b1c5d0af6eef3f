"""String ops and TfIdfVectorizer.

String tensors are NumPy object arrays of Python str. Per-element work on Python
strings has no vectorized NumPy form, so these loop over elements (NumPy's object
ufuncs such as np.add still do the broadcasting).
"""
from __future__ import annotations

import re

import numpy as np

from ... import dtypes
from ..registry import kernel
from ..buffers import computed_aside

STRING = [dtypes.STRING]


def _strings(values, shape):
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out.reshape(shape)


# ---------------------------------------------------------------- StringConcat, StringSplit


@kernel("StringConcat", dtypes=STRING)
def string_concat(x, y):
    # np.add on object arrays applies str.__add__ with NumPy broadcasting.
    return np.asarray(np.add(x, y), dtype=object)


@kernel("StringSplit", dtypes=STRING, multi=True)
def string_split(x, *, delimiter=None, maxsplit=None):
    # An empty or absent delimiter splits on runs of whitespace, trimmed (str.split(None)).
    sep = delimiter or None
    limit = -1 if maxsplit is None else int(maxsplit)
    parts = [s.split(sep, limit) for s in x.reshape(-1)]
    counts = np.array([len(p) for p in parts], dtype=np.int64).reshape(x.shape)
    width = int(counts.max(initial=0))
    y = np.full((len(parts), width), "", dtype=object)
    for i, p in enumerate(parts):
        y[i, :len(p)] = p
    return y.reshape(*x.shape, width), counts


# ---------------------------------------------------------------- StringNormalizer


@kernel("StringNormalizer", dtypes=STRING)
def string_normalizer(x, *, case_change_action="NONE", is_case_sensitive=0, locale=None, stopwords=None):
    """Drop the elements that are stop words, then change case (ONNX/onnxruntime semantics:
    a stop word is a whole element; comparison ignores case unless is_case_sensitive)."""
    if x.ndim == 2 and x.shape[0] != 1 or x.ndim not in (1, 2):
        raise ValueError(f"StringNormalizer takes a [C] or [1, C] tensor, got shape {list(x.shape)}")
    if case_change_action not in ("NONE", "LOWER", "UPPER"):
        raise ValueError(f"unknown case_change_action {case_change_action!r}")
    words = list(x.reshape(-1))
    if stopwords:
        if is_case_sensitive:
            stops = set(stopwords)
            words = [w for w in words if w not in stops]
        else:
            stops = {s.casefold() for s in stopwords}
            words = [w for w in words if w.casefold() not in stops]
    if case_change_action == "LOWER":
        words = [w.lower() for w in words]
    elif case_change_action == "UPPER":
        words = [w.upper() for w in words]
    if not words:  # all dropped: one empty string
        words = [""]
    return _strings(words, (len(words),) if x.ndim == 1 else (1, len(words)))


# ---------------------------------------------------------------- RegexFullMatch

# RE2 POSIX classes ([[:alpha:]]) as ranges Python's re understands inside [...].
_POSIX = {"alnum": "0-9A-Za-z", "alpha": "A-Za-z", "ascii": "\\x00-\\x7f", "blank": "\\t ",
          "cntrl": "\\x00-\\x1f\\x7f", "digit": "0-9", "graph": "!-~", "lower": "a-z", "print": " -~",
          "punct": "!-/:-@\\[-`{-~", "space": "\\t\\n\\v\\f\\r ", "upper": "A-Z", "word": "0-9A-Za-z_",
          "xdigit": "0-9A-Fa-f"}
_QUANT_END = set("*+?}")


def _unsupported(pattern, what):
    return ValueError(f"regex {pattern!r}: {what} is not supported (RegexFullMatch implements the "
                      f"subset of RE2 syntax that Python's re can express)")


def _not_re2(pattern, what):
    return ValueError(f"regex {pattern!r}: {what} is not RE2 syntax")


def _translate_re2(p: str) -> str:
    """RE2 syntax → Python re syntax; raises for what RE2 rejects or re cannot express."""
    out, i, n = [], 0, len(p)
    prev_quant = False
    while i < n:
        c = p[i]
        quant = False
        if c == "\\":
            if i + 1 >= n:
                raise _unsupported(p, "a trailing backslash")
            e = p[i + 1]
            if e in "123456789":
                raise _not_re2(p, "a backreference")
            if e in "pP":
                raise _unsupported(p, "a Unicode class (\\p, \\P)")
            if e == "C":
                raise _unsupported(p, "\\C")
            if e == "Q":  # \Q...\E: literal text
                end = p.find("\\E", i + 2)
                end = n if end < 0 else end
                out.append(re.escape(p[i + 2:end]))
                i = end + 2
                prev_quant = False
                continue
            out.append("\\Z" if e == "z" else c + e)
            i += 2
        elif c == "[":
            j = i + 1
            cls = ["["]
            if j < n and p[j] == "^":
                cls.append("^")
                j += 1
            if j < n and p[j] == "]":  # a leading ] is literal
                cls.append("\\]")
                j += 1
            while j < n and p[j] != "]":
                if p[j] == "\\" and j + 1 < n:
                    if p[j + 1] in "pP":
                        raise _unsupported(p, "a Unicode class (\\p, \\P)")
                    cls.append(p[j:j + 2])
                    j += 2
                elif p.startswith("[:", j):
                    end = p.find(":]", j + 2)
                    name = p[j + 2:end] if end > 0 else ""
                    if name not in _POSIX:
                        raise _unsupported(p, f"the class [:{name}:]")
                    cls.append(_POSIX[name])
                    j = end + 2
                else:
                    cls.append("\\[" if p[j] == "[" else p[j])
                    j += 1
            if j >= n:
                raise ValueError(f"regex {p!r}: missing ]")
            out.append("".join(cls) + "]")
            i = j + 1
        elif c == "(" and p.startswith("(?", i):
            rest = p[i + 2:i + 4]
            if rest[:1] in ("=", "!") or rest in ("<=", "<!"):
                raise _not_re2(p, "a lookaround assertion")
            if rest[:1] == ">":
                raise _not_re2(p, "an atomic group")
            if rest == "P=":
                raise _not_re2(p, "a backreference")
            if rest[:1] == "<":  # (?<name>...) is (?P<name>...) in Python
                out.append("(?P<")
                i += 3
                continue
            flags = re.match(r"[a-zA-Z-]*", p[i + 2:]).group()
            if "U" in flags:
                raise _unsupported(p, "the ungreedy flag (?U)")
            out.append("(?")
            i += 2
        else:
            if c == "+" and prev_quant:
                raise _not_re2(p, "a possessive quantifier")
            quant = c in _QUANT_END
            out.append(c)
            i += 1
        prev_quant = quant
    return "".join(out)


def _re2_fullmatch(pattern: str):
    """RE2's fullmatch of `pattern` (google-re2, the engine onnxruntime runs: its syntax, and
    time linear in the text, where Python's re backtracks: "(a+)+$" against 32 a's and a "!"
    ran for minutes, a model's pattern hanging its session), or None without the package."""
    try:
        import re2
    except ImportError:
        return None
    options = re2.Options()
    options.log_errors = False  # (the error is raised here, not also printed by RE2)
    try:
        return re2.compile(pattern, options).fullmatch
    except re2.error as e:
        why = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        raise ValueError(f"invalid regex {pattern!r}: {why}") from None


@kernel("RegexFullMatch", out=True, dtypes=STRING, bind=True)
@computed_aside(bind=True)
def regex_full_match(ctx):
    pattern = ctx.attrs.get("pattern")
    if pattern is None:
        raise ValueError("RegexFullMatch needs a pattern")
    match = _re2_fullmatch(pattern)
    if match is None:  # (no RE2 for this platform: Python's re, the syntax translated)
        try:
            # RE2's \d, \w, \s and \b are ASCII-only.
            match = re.compile(_translate_re2(pattern), re.ASCII).fullmatch
        except re.error as e:
            raise ValueError(f"invalid regex {pattern!r}: {e}") from e

    def step(x):
        return np.fromiter((match(s) is not None for s in x.reshape(-1)), dtype=np.bool_,
                           count=x.size).reshape(x.shape)

    return step


# ---------------------------------------------------------------- TfIdfVectorizer


@kernel("TfIdfVectorizer", out=True, dtypes=dtypes.INTS | {dtypes.STRING}, bind=True)
@computed_aside(bind=True)
def tfidf_vectorizer(ctx):
    """Counts of the pool's n-grams (with skips) per row, weighted by mode.

    Every token is mapped to its index in the pool's vocabulary; an n-gram of token ids is
    then one int64 key (mixed radix), so matching windows against the pool is a sorted
    search instead of a trie walk per position.
    """
    a = ctx.attrs
    min_n, max_n, max_skip = int(a["min_gram_length"]), int(a["max_gram_length"]), int(a["max_skip_count"])
    mode = a["mode"]
    if mode not in ("TF", "IDF", "TFIDF"):
        raise ValueError(f"unknown mode {mode!r}")
    counts_at = list(a["ngram_counts"])
    indexes = np.asarray(a["ngram_indexes"], dtype=np.int64)
    strings = a.get("pool_strings") is not None
    pool = list(a["pool_strings"]) if strings else [int(v) for v in a.get("pool_int64s") or []]
    weights = a.get("weights")
    weights = None if weights is None or len(weights) == 0 else np.asarray(weights, np.float32)
    size = int(indexes.max()) + 1 if indexes.size else 0
    if weights is not None:
        # weights[i] scales the i-th n-gram of the pool, i.e. output column ngram_indexes[i].
        if len(weights) < len(indexes):
            raise ValueError(f"{len(weights)} weights for {len(indexes)} n-grams")
        col_w = np.ones(size, np.float32)
        col_w[indexes] = weights[:len(indexes)]
        weights = col_w

    vocab = sorted(set(pool))
    vocab_id = {t: k for k, t in enumerate(vocab)}
    base = len(vocab) + 1
    # (n, sorted keys, output column of each key) for each n-gram size in [min_n, max_n].
    grams, gram_id = [], 0
    for k, start in enumerate(counts_at):
        n = k + 1
        end = counts_at[k + 1] if k + 1 < len(counts_at) else len(pool)
        m = max(0, end - start) // n
        if min_n <= n <= max_n and m:
            if base ** n >= 2**62:
                raise ValueError(f"{n}-grams over a vocabulary of {len(vocab)} do not fit int64 keys")
            ids = np.array([vocab_id[t] for t in pool[start:start + m * n]], np.int64).reshape(m, n)
            keys = ids @ (base ** np.arange(n, dtype=np.int64))
            cols = indexes[gram_id:gram_id + m]
            # A repeated n-gram keeps its last column (as a map insert would).
            keys_r, first = np.unique(keys[::-1], return_index=True)
            grams.append((n, keys_r, cols[::-1][first]))
        gram_id += m

    def token_ids(x):
        if strings:
            return np.array([vocab_id.get(t, -1) for t in x.reshape(-1)], np.int64).reshape(x.shape)
        v = np.asarray(vocab, np.int64)
        pos = np.clip(np.searchsorted(v, x), 0, max(len(v) - 1, 0))
        return np.where(v[pos] == x, pos, -1) if len(v) else np.full(x.shape, -1, np.int64)

    def step(x):
        if x.ndim > 2 or x.ndim == 2 and x.shape[0] < 1:
            raise ValueError(f"TfIdfVectorizer takes a [C] or [B, C] tensor, got shape {list(x.shape)}")
        rows = x.reshape(1, -1) if x.ndim < 2 else x
        b, c = rows.shape
        freq = np.zeros((b, size), np.int64)
        if rows.size:
            ids = token_ids(rows)
            for n, keys, cols in grams:
                # Unigrams do not depend on the skip: count them once.
                for skip in range(max_skip + 1 if n > 1 else 1):
                    d = skip + 1
                    span = (n - 1) * d
                    if span >= c:
                        break
                    w = np.stack([ids[:, j * d:c - span + j * d] for j in range(n)], axis=-1)
                    valid = (w >= 0).all(-1)
                    key = w @ (base ** np.arange(n, dtype=np.int64))
                    pos = np.clip(np.searchsorted(keys, key), 0, len(keys) - 1)
                    hit = valid & (keys[pos] == key)
                    r, _ = np.nonzero(hit)
                    np.add.at(freq, (r, cols[pos[hit]]), 1)
        if mode == "TF":
            y = freq.astype(np.float32)
        elif mode == "IDF":
            y = (freq > 0).astype(np.float32) * (weights if weights is not None else np.float32(1))
        else:
            y = freq.astype(np.float32) * (weights if weights is not None else np.float32(1))
        return y.astype(np.float32).reshape(size) if x.ndim < 2 else y.astype(np.float32)

    return step
