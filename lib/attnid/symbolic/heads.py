"""Exact checks behind chapters 2 (one head) and 3 (many heads).

Chapter 2: the GL(d_k) x GL(d_v) moves keep the scores and the values, and the small-t expansion of one
head's first output row has the two terms its proof uses. Chapter 3: the unidentified share 1/(2H) of
the standard layout, the head moments in the expansion of two heads, and the residues of the logistic
ramps that the proofs of its two independence lemmas take at the poles.
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy as sp

from attnid.symbolic import matrix_symbols
from attnid.symbolic.identity import Identity, is_zero, zero_identity

__all__ = ["LOGISTIC_PAIRS", "SHIFTED_PAIRS", "logistic_ramp_residues", "many_heads_moments", "many_heads_ratio",
           "one_head_expansion", "one_head_gauge", "shifted_ramp_residues"]

# (a, l) pairs at which chapter 3 checks the residues: both signs of a, l zero and non-zero
LOGISTIC_PAIRS = ((sp.Integer(2), sp.Rational(1, 3)), (sp.Rational(-3, 2), sp.Integer(1)),
                  (sp.Integer(5), sp.Integer(0)))
SHIFTED_PAIRS = ((sp.Integer(2), sp.Rational(1, 3)), (sp.Rational(-3, 2), sp.Integer(1)))


def one_head_gauge() -> list[Identity]:
    """One head's moves keep its function (chapter 2, ``thm-one-head``), with symbolic 2 x 2 matrices.

    For invertible M and N: X (W_Q M)(X W_K M^-T)^T = X W_Q W_K^T X^T (the scores) and
    X (W_V N)(N^-1 W_O) = X W_V W_O (the values).
    """
    xs, wq, wk, wv, wo = (matrix_symbols(n, 2, 2) for n in ("X", "Q", "K", "V", "O"))
    m, n = matrix_symbols("M", 2, 2), matrix_symbols("N", 2, 2)
    scores_moved = xs * wq * m * (xs * wk * m.inv().T).T
    values_moved = xs * wv * n * n.inv() * wo
    return [zero_identity("scores unchanged: X W_Q M (X W_K M^-T)^T - X W_Q W_K^T X^T = 0",
                          scores_moved - xs * wq * wk.T * xs.T),
            zero_identity("values unchanged: X W_V N N^-1 W_O - X W_V W_O = 0", values_moved - xs * wv * wo)]


def one_head_expansion() -> list[Identity]:
    """The two terms of the small-t expansion in the proof of ``thm-one-head`` (chapter 2).

    One feature (d = 1), two tokens x1, x2, scalar B = b and C = c: the first output row of the head at
    the input t X has t^1 coefficient c (x1 + x2)/2 (c times the mean token) and t^3 coefficient
    b c x1 (x1 - x2)^2 / (4 sqrt(d_k)).
    """
    t, b, c, x1, x2, dk = sp.symbols("t b c x1 x2 d_k", positive=True)
    w = [sp.exp(t**2 * x1 * b * xj / sp.sqrt(dk)) for xj in (x1, x2)]
    first_row = (w[0] * t * x1 * c + w[1] * t * x2 * c) / (w[0] + w[1])
    series = sp.series(first_row, t, 0, 5).removeO()
    t1, t3 = sp.simplify(series.coeff(t, 1)), sp.factor(series.coeff(t, 3))
    return [Identity("t^1 coefficient = c (x1 + x2)/2", str(t1), is_zero(t1 - c * (x1 + x2) / 2)),
            Identity("t^3 coefficient = b c x1 (x1 - x2)^2 / (4 sqrt(d_k))", str(t3),
                     is_zero(t3 - b * c * x1 * (x1 - x2) ** 2 / (4 * sp.sqrt(dk))))]


def many_heads_ratio() -> list[Identity]:
    """The unidentified share in the standard layout (chapter 3, ``thm-many-heads``).

    With d_k = d_v = d/H, H (d_k^2 + d_v^2) / (4 d^2) simplifies to 1/(2H).
    """
    d, h = sp.symbols("d H", positive=True)
    dk = dv = d / h
    ratio = sp.simplify(h * (dk**2 + dv**2) / (4 * d**2))
    return [Identity("H (d_k^2 + d_v^2) / (4 d^2) = 1/(2H) at d_k = d_v = d/H", str(ratio),
                     is_zero(ratio - 1 / (2 * h)))]


def many_heads_moments() -> list[Identity]:
    """The head moments in the expansion of two heads (chapter 3, the symbolic check of ``thm-many-heads``).

    One feature, three tokens x1, x2, x3, two heads with scalar B_h = b_h and C_h = c_h: the t^1, t^3 and
    t^5 coefficients of the first output row at the input t X are sum_h c_h, sum_h b_h c_h and
    sum_h b_h^2 c_h times a non-zero function of the tokens alone.
    """
    t, x1, x2, x3 = sp.symbols("t x1 x2 x3", positive=True)
    tokens = (x1, x2, x3)
    b = sp.symbols("b1:3")
    c = sp.symbols("c1:3")
    row: sp.Expr = sp.Integer(0)  # first output row, two heads, scalar B_h = b_h and C_h = c_h
    for bh, ch in zip(b, c):
        w = [sp.exp(t**2 * x1 * bh * xj) for xj in tokens]
        row += sum(wj * t * xj * ch for wj, xj in zip(w, tokens)) / sum(w)
    series = sp.expand(sp.series(row, t, 0, 6).removeO())
    moments = {1: c[0] + c[1], 3: b[0] * c[0] + b[1] * c[1], 5: b[0] ** 2 * c[0] + b[1] ** 2 * c[1]}
    checks: list[Identity] = []
    for power, moment in moments.items():
        token_part = sp.factor(sp.simplify(series.coeff(t, power) / moment))
        checks.append(Identity(f"t^{power} coefficient = `{moment}` times a non-zero function of x1, x2, x3 alone",
                               f"({moment}) * {token_part}",
                               bool(token_part != 0 and token_part.free_symbols <= set(tokens))))
    return checks


def _pole(a: sp.Expr, ell: sp.Expr) -> sp.Expr:
    """The pole (i pi - l)/a of sigma(a lambda + l) = 1/(1 + exp(-a lambda - l)); a must not be 0."""
    if a == 0:
        raise ValueError("a = 0: sigma(l) is constant in lambda and has no pole")
    return (sp.I * sp.pi - ell) / a


def logistic_ramp_residues(pairs: Sequence[tuple[sp.Expr, sp.Expr]] = LOGISTIC_PAIRS) -> list[Identity]:
    """The residue of lambda sigma(a lambda + l) at its pole p = (i pi - l)/a is p/a, so never 0.

    Backs the proof of ``lem-logistic`` (chapter 3), checked by a limit at each (a, l) of ``pairs``.
    """
    lam = sp.symbols("lambda")
    checks: list[Identity] = []
    for a, ell in pairs:
        pole = _pole(a, ell)
        residue = sp.limit((lam - pole) * lam / (1 + sp.exp(-a * lam - ell)), lam, pole)
        expected = pole / a
        checks.append(Identity(f"residue of `lambda*sigma({a * lam + ell})` at its pole `p = {pole}` is "
                               f"`p/a = {expected}`", str(sp.simplify(residue)), is_zero(residue - expected)))
    return checks


def shifted_ramp_residues(pairs: Sequence[tuple[sp.Expr, sp.Expr]] = SHIFTED_PAIRS) -> list[Identity]:
    """The residue of (M lambda + N) sigma(a lambda + l) at its pole p = (i pi - l)/a is (M p + N)/a.

    Backs the proof of ``lem-shifted-ramps`` (chapter 3), for real symbols M and N, checked by a limit
    at each (a, l) of ``pairs``.
    """
    lam = sp.symbols("lambda")
    m, n = sp.symbols("M N", real=True)
    checks: list[Identity] = []
    for a, ell in pairs:
        pole = _pole(a, ell)
        residue = sp.limit((lam - pole) * (m * lam + n) / (1 + sp.exp(-a * lam - ell)), lam, pole)
        expected = sp.expand((m * pole + n) / a)
        checks.append(Identity(f"residue of `(M*lambda + N)*sigma({a * lam + ell})` at its pole `p = {pole}` is "
                               f"`(M*p + N)/a = {expected}`", str(sp.simplify(residue)), is_zero(residue - expected)))
    return checks
