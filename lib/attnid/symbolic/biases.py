"""Exact checks of the biases: why softmax cannot see the key bias, and where it comes back.

The functions back chapter 5: ``dead_key_bias`` the parts of ``thm-biases`` that make ``b_K`` dead
under softmax, ``key_bias_alive`` the two mechanisms of ``prop-bias-alive`` that bring it back (a
sink, RoPE applied after the bias). Each returns a list of ``Identity`` whose ``holds`` is SymPy's own
answer; the chapter shows the list and asserts that every entry holds.
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy as sp

from attnid.symbolic.identity import Identity

__all__ = ["dead_key_bias", "key_bias_alive"]


def _softmax(scores: Sequence[sp.Expr]) -> list[sp.Expr]:
    """The softmax of ``scores``, entry by entry."""
    return [sp.exp(x) / sum(sp.exp(y) for y in scores) for x in scores]


def dead_key_bias() -> list[Identity]:
    """Softmax ignores a shift of its row, and the key bias only shifts rows.

    Backs part (1) of chapter 5's ``thm-biases``: ``softmax(s + a) = softmax(s)`` for three scores
    ``s`` and any ``a``; and in the score ``(x W_Q + b_Q)(y W_K + b_K)^T`` of a query token ``x`` and a
    key token ``y`` (width 2, ``d_k = 2``), the terms with ``b_K``, ``(x W_Q + b_Q) b_K^T``, do not
    involve ``y``: the same for every key of a row.
    """
    s, a = sp.symbols("s1:4"), sp.symbols("a")
    residuals = [sp.simplify(u - w) for u, w in zip(_softmax([x + a for x in s]), _softmax(s), strict=True)]
    x, y = sp.Matrix([sp.symbols("x1:3")]), sp.Matrix([sp.symbols("y1:3")])
    wq, wk = sp.Matrix(2, 2, sp.symbols("q1:5")), sp.Matrix(2, 2, sp.symbols("k1:5"))
    bq, bk = sp.Matrix([sp.symbols("bq1:3")]), sp.Matrix([sp.symbols("bk1:3")])
    score = ((x * wq + bq) * (y * wk + bk).T)[0]
    key_independent = sp.expand(score - ((x * wq + bq) * (y * wk).T)[0])
    return [
        Identity("softmax(s + a) - softmax(s) = 0, entry by entry", str(residuals), all(r == 0 for r in residuals)),
        Identity("the score terms with b_K do not involve the key token y", str(sp.factor(key_independent)),
                 not key_independent.free_symbols & set(y)),
    ]


def key_bias_alive() -> list[Identity]:
    """A sink logit, or RoPE after the bias, makes the key bias visible.

    Backs parts 1 and 3 of chapter 5's ``prop-bias-alive``: with a sink (logit 0 here), the weight
    ``e^(s_1 + a) / (1 + sum_k e^(s_k + a))`` depends on a row shift ``a`` (its derivative in ``a`` is not
    zero); and with RoPE after the bias, the term ``q R((j - i) theta) b_K^T`` of the score depends on
    the key position ``j``, so it no longer shifts a whole row.
    """
    s, a = sp.symbols("s1:4"), sp.symbols("a")
    sink_weight = sp.exp(s[0] + a) / (1 + sum(sp.exp(v + a) for v in s))
    sink_slope = sp.simplify(sp.diff(sink_weight, a))
    theta, i, j = sp.symbols("theta i j", real=True)
    angle = (j - i) * theta
    rotation = sp.Matrix([[sp.cos(angle), -sp.sin(angle)], [sp.sin(angle), sp.cos(angle)]])
    q, bk = sp.Matrix([sp.symbols("u1:3")]), sp.Matrix([sp.symbols("bk1:3")])
    rope_slope = sp.simplify(sp.diff((q * rotation * bk.T)[0], j))
    return [
        Identity("sink weight depends on a row shift a: d/da is non-zero", str(sink_slope), sink_slope != 0),
        Identity("RoPE bias term q R((j - i) theta) b_K^T depends on the key position j: d/dj is non-zero",
                 str(rope_slope), rope_slope != 0),
    ]
