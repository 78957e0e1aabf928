"""Exact checks of the head layouts: scales, RoPE's commutant, shared group elements and share ratios.

The functions back chapters 4 (no layout is identified; the smallest share of a standard layout),
6 (RoPE: the commutant of the rotations and the full-RoPE ratio) and 7 (grouped-query attention:
the shared group element and the GQA ratio). Each returns a list of ``Identity`` whose ``holds`` is
SymPy's own answer; the chapter shows the list and asserts that every entry holds.

The *share ratio* of a layout is its unidentified dimension over its parameter count, in the
standard layout ``d_k = d_v = d/H`` with ``H`` query heads, ``G`` key/value heads and width ``d``.
"""

from __future__ import annotations

import sympy as sp

from attnid.symbolic.identity import Identity, is_zero, zero_identity

__all__ = ["gqa_ratio", "gqa_shared_group_element", "rope_commutant", "rope_ratio", "scaled_rotated_scores",
           "smallest_standard_ratio"]


def _rotation(angle: sp.Expr) -> sp.Matrix:
    """The 2 x 2 rotation by ``angle``."""
    return sp.Matrix([[sp.cos(angle), -sp.sin(angle)], [sp.sin(angle), sp.cos(angle)]])


def _sign_identity(statement: str, derivative: sp.Expr, expected: sp.Expr, sign: int) -> Identity:
    """``derivative == expected``, and its factored form has the sign ``sign`` (+1 or -1) for positive symbols."""
    factored = sp.factor(derivative)
    signed = factored.is_positive if sign > 0 else factored.is_negative
    return Identity(statement, str(factored), is_zero(derivative - expected) and signed is True)


def scaled_rotated_scores() -> list[Identity]:
    """A scale ``c`` moved from the keys to the queries leaves every rotated score unchanged.

    Backs the query/key step of chapter 4's ``thm-never``: with 2 tokens of width 2, a rotation
    ``R(theta)`` (the identity's stand-in without RoPE) and ``c != 0``,
    ``(X c W_Q) R (X W_K / c)^T = (X W_Q) R (X W_K)^T``, because ``R`` commutes with a scalar.
    """
    c = sp.symbols("c", nonzero=True)
    xs, wq, wk = (sp.Matrix(2, 2, sp.symbols(f"{n}0:4")) for n in ("X", "Q", "K"))
    rotation = _rotation(sp.symbols("theta"))
    scaled = (xs * c * wq) * rotation * (xs * wk / c).T
    return [zero_identity("rotated scores unchanged by (c W_Q, W_K / c): residual",
                          scaled - xs * wq * rotation * (xs * wk).T)]


def smallest_standard_ratio() -> list[Identity]:
    """Where the share ratio of a standard layout is smallest, without and with full RoPE.

    Backs chapter 4's section 'The smallest ratio a standard layout reaches': the GQA ratio
    ``G/(H(H+G))`` decreases in ``H`` and increases in ``G``, so its minimum is ``1/(d(d+1))`` at
    ``H = d``, ``G = 1``, which tends to 0 but is positive, a factor ``2/(d+1)`` below the multi-head
    minimum ``1/(2d)``; the full-RoPE ratio ``G(1 + d/H)/(2d(H+G))`` is monotone the same way, so its
    minimum is at ``H = d/2``, ``G = 1``: ``3/(d(d+2))``, which exceeds ``1/(d(d+1))`` by
    ``(2d+1)/(d(d+1)(d+2)) > 0``.
    """
    d, h, g = sp.symbols("d H G", positive=True)
    ratio = g / (h * (h + g))
    smallest = ratio.subs({h: d, g: 1})
    limit = sp.limit(smallest, d, sp.oo)
    rope = g * (1 + d / h) / (2 * d * (h + g))  # full RoPE, d_k = d_v = d/H
    smallest_rope = sp.factor(rope.subs({h: d / 2, g: 1}))
    gap = sp.factor(smallest_rope - smallest)
    against_mha = sp.simplify(smallest / (1 / (2 * d)))
    return [
        _sign_identity("d/dH of G/(H(H+G)) = -G(2H+G)/(H^2 (H+G)^2), negative",
                       sp.diff(ratio, h), -(2 * h + g) * g / (h**2 * (h + g) ** 2), -1),
        _sign_identity("d/dG of G/(H(H+G)) = 1/(H+G)^2, positive", sp.diff(ratio, g), 1 / (h + g) ** 2, 1),
        Identity("smallest standard ratio (H = d, G = 1) = 1/(d(d+1))", str(smallest),
                 is_zero(smallest - 1 / (d * (d + 1)))),
        Identity("its limit as d -> oo is 0", str(limit), limit == 0),
        Identity("that minimum against the MHA minimum 1/(2d) = 2/(d+1)", str(against_mha),
                 is_zero(against_mha - 2 / (d + 1))),
        _sign_identity("d/dH of the full-RoPE ratio G(1 + d/H)/(2d(H+G)) = -G(H^2 + 2dH + dG)/(2dH^2 (H+G)^2), "
                       "negative", sp.diff(rope, h),
                       -g * (h**2 + 2 * d * h + d * g) / (2 * d * h**2 * (h + g) ** 2), -1),
        _sign_identity("d/dG of the full-RoPE ratio = (1 + d/H) H/(2d(H+G)^2), positive",
                       sp.diff(rope, g), (1 + d / h) * h / (2 * d * (h + g) ** 2), 1),
        Identity("smallest full-RoPE ratio (H = d/2, G = 1) = 3/(d(d+2))", str(smallest_rope),
                 is_zero(smallest_rope - 3 / (d * (d + 2)))),
        Identity("it minus the no-RoPE minimum = (2d+1)/(d(d+1)(d+2)), positive", str(gap),
                 is_zero(gap - (2 * d + 1) / (d * (d + 1) * (d + 2))) and gap.is_positive is True),
    ]


def rope_commutant() -> list[Identity]:
    """The matrices that commute with RoPE's rotations: ``a I + b J`` per pair, and their dimension.

    Backs chapter 6's ``lem-commutant``: solving ``M R(theta) = R(theta) M`` for a 2 x 2 ``M`` gives
    ``M = a I + b J`` (``J`` the quarter turn); and for ``r = 4`` rotated coordinates of ``d_k = 5``
    (two pairs at different angles, with rational cosines and sines from the 3-4-5 and 5-12-13
    triangles so that the rank is exact, in the rotate-half layout, and one unrotated coordinate),
    the commutant has dimension ``r + (d_k - r)^2 = 5``.
    """
    theta = sp.symbols("theta", real=True)
    m = sp.Matrix(2, 2, sp.symbols("m0:4"))
    rotation = _rotation(theta)
    solution = sp.solve(list(m * rotation - rotation * m), list(m), dict=True)[0]
    forced = m.subs(solution)
    quarter_turn = sp.Matrix([[0, -1], [1, 0]])
    rope = sp.eye(5)
    for i, (cos, sin) in enumerate(((sp.Rational(3, 5), sp.Rational(4, 5)), (sp.Rational(5, 13), sp.Rational(12, 13)))):
        rope[i, i], rope[i, i + 2], rope[i + 2, i], rope[i + 2, i + 2] = cos, -sin, sin, cos
    big = sp.Matrix(5, 5, sp.symbols("n0:25"))
    free = len(big) - sp.Matrix(list(big * rope - rope * big)).jacobian(list(big)).rank()
    return [
        Identity("M R(theta) = R(theta) M forces M = a I + b J (J the quarter turn)", str(forced),
                 is_zero(forced - forced[0, 0] * sp.eye(2) - forced[1, 0] * quarter_turn)),
        Identity("dimension of the commutant for r = 4, d_k = 5 is r + (d_k - r)^2 = 5", str(free), free == 5),
    ]


def rope_ratio() -> list[Identity]:
    """The share ratio of the standard full-RoPE layout is ``1/(4H) + 1/(4d)``.

    Backs the last sentence of chapter 6's ``thm-rope``: with ``r = d_k = d_v = d/H`` and ``G = H``,
    ``H(d/H + (d/H)^2)/(4d^2) = 1/(4H) + 1/(4d)``.
    """
    d, h = sp.symbols("d H", positive=True)
    ratio = sp.simplify(h * (d / h + (d / h) ** 2) / (4 * d**2))
    return [Identity("standard full-RoPE ratio H(d/H + (d/H)^2)/(4d^2) = 1/(4H) + 1/(4d)", str(sp.apart(ratio, h)),
                     is_zero(ratio - (1 / (4 * h) + 1 / (4 * d))))]


def gqa_ratio() -> list[Identity]:
    """The share ratio of standard grouped-query attention is ``G/(H(H+G))``.

    Backs chapter 7's ``thm-gqa``: with ``d_k = d_v = d/H`` and ``P = d(H d_k + G d_k + G d_v + H d_v)``,
    ``G(d_k^2 + d_v^2)/P = G/(H(H+G))``; ``1/(H(H+1))`` for multi-query (``G = 1``) and ``1/(2H)`` for
    multi-head attention (``G = H``).
    """
    d, h, g = sp.symbols("d H G", positive=True)
    dk = dv = d / h
    total = d * (h * dk + g * dk + g * dv + h * dv)
    ratio = sp.simplify(g * (dk**2 + dv**2) / total)
    mqa, mha = sp.factor(ratio.subs(g, 1)), sp.simplify(ratio.subs(g, h))
    return [
        Identity("standard GQA ratio G(d_k^2 + d_v^2)/P = G/(H(H+G))", str(sp.factor(ratio)),
                 is_zero(ratio - g / (h * (h + g)))),
        Identity("MQA (G = 1): 1/(H(H+1))", str(mqa), is_zero(mqa - 1 / (h * (h + 1)))),
        Identity("MHA (G = H): 1/(2H)", str(mha), is_zero(mha - 1 / (2 * h))),
    ]


def gqa_shared_group_element() -> list[Identity]:
    """One ``M`` shared by a group keeps the scores of every query head of the group.

    Backs the symmetry of chapter 7's ``thm-gqa``: two query heads ``W_Q^1``, ``W_Q^2`` reading one
    key head ``W_K`` (2 tokens, width 2, ``d_k = 2``), moved by ``W_Q^h -> W_Q^h M`` and
    ``W_K -> W_K M^{-T}``, keep ``X W_Q^h (X W_K)^T`` for both heads.
    """
    xs = sp.Matrix(2, 2, sp.symbols("x0:4"))
    q1, q2, k = (sp.Matrix(2, 2, sp.symbols(f"{n}0:4")) for n in ("p", "q", "k"))
    m = sp.Matrix(2, 2, sp.symbols("m0:4"))
    k_moved = k * m.inv().T
    return [zero_identity(f"head {i}'s scores unchanged by a shared M: residual",
                          xs * q * m * (xs * k_moved).T - xs * q * (xs * k).T)
            for i, q in enumerate((q1, q2), start=1)]
