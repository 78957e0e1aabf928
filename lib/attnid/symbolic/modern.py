"""Exact checks behind chapter 7b's modern layers: the output gate, ALiBi and the relative position bias.

One gated head on two tokens in closed form (``gated_row``): with equal tokens the row is the sum of
gated ramps, a diagonal value move keeps the elementwise-gated row, and a shear of the values changes
it to first order unless the gate is one scalar per head. ALiBi's offsets leave the key bias dead; a
common shift of a relative-bias table changes no row, a single entry does. Each check returns a list
of ``Identity``.
"""

from __future__ import annotations

import sympy as sp

from attnid.symbolic.identity import Identity, is_zero, zero_identity

__all__ = ["alibi_key_bias_dead", "gated_constant_inputs", "gated_row", "gated_value_moves", "relative_bias_shift"]


def _mat(name: str, rows: int, cols: int) -> sp.Matrix:
    """A rows x cols matrix of real symbols {name}{i}{j}."""
    return sp.Matrix(rows, cols, lambda i, j: sp.Symbol(f"{name}{i}{j}", real=True))


def _logistic(m: sp.Matrix) -> sp.Matrix:
    """The logistic function 1 / (1 + e^-z), entry by entry."""
    return m.applyfunc(lambda z: 1 / (1 + sp.exp(-z)))


def gated_row(x: sp.Matrix, wv: sp.Matrix, wo: sp.Matrix, bv: sp.Matrix, headwise: bool = False) -> sp.Matrix:
    """Row 0 of a one-head gated layer (d = d_v = 2, d_k = 1) on the two tokens (rows) of ``x``, in closed form.

    Query and key weights q, k (2 x 1), gate weights w (2 x 2) and gate bias c (1 x 2) are the symbols
    q00.., k00.., w00.., c00..; the value path is ``wv``, ``bv`` and ``wo``. Softmax over both keys, then
    the gate sigma(x_0 w + c) elementwise, or (``headwise``) its first entry as one scalar, then W_O.
    """
    gq, gk, gw, gbg = _mat("q", 2, 1), _mat("k", 2, 1), _mat("w", 2, 2), _mat("c", 1, 2)
    weights = [sp.exp((x[0, :] * gq * (x[j, :] * gk).T)[0]) for j in range(2)]
    o = sum((weights[j] * (x[j, :] * wv + bv) for j in range(2)), sp.zeros(1, 2)) / sum(weights)
    gate = _logistic(x[0, :] * gw[:, :1] + gbg[:, :1])[0] * sp.ones(1, 2) if headwise else _logistic(x[0, :] * gw + gbg)
    return o.multiply_elementwise(gate) * wo


def gated_constant_inputs() -> list[Identity]:
    """With two equal tokens u the gated row is sum_c (u v_c + b_c) sigma(u w_c + c_c) o_c (b_O aside).

    Chapter 7b, the step "constant inputs" of the proof of ``thm-output-gate``: the softmax drops out
    and the row is the sum of gated ramps the proof starts from.
    """
    gv, go, gw = _mat("v", 2, 2), _mat("o", 2, 2), _mat("w", 2, 2)
    gbv, gbg = _mat("b", 1, 2), _mat("c", 1, 2)
    gu = _mat("u", 1, 2)
    constant = gated_row(sp.Matrix.vstack(gu, gu), gv, go, gbv)
    ramps = sum(
        ((gu * gv[:, c] + gbv[:, c])[0] * _logistic(gu * gw[:, c] + gbg[:, c])[0] * go[c, :] for c in range(2)),
        sp.zeros(1, 2),
    )
    return [zero_identity("equal tokens: row - sum_c (u v_c + b_c) sigma(u w_c + c_c) o_c = 0", constant - ramps)]


def gated_value_moves() -> list[Identity]:
    """Value moves under an output gate: a diagonal one keeps the row; a shear is seen by an elementwise gate only.

    Chapter 7b, ``thm-output-gate``: W_V -> W_V P, b_V -> b_V P, W_O -> P^-1 W_O with P = diag(p1, p2)
    leaves the elementwise-gated row unchanged; for the shear P = I + t E_12 the first-order change
    at t = 0 is 0 under a headwise gate and, under an elementwise gate, non-zero at a rational point
    (its largest entry is shown to 2 significant digits; it must exceed 1e-3).
    """
    gv, go, gbv = _mat("v", 2, 2), _mat("o", 2, 2), _mat("b", 1, 2)
    gx = _mat("x", 2, 2)
    p1, p2, t = sp.symbols("p1 p2 t", positive=True)
    scale = sp.diag(p1, p2)
    diagonal = gated_row(gx, gv * scale, scale.inv() * go, gbv * scale) - gated_row(gx, gv, go, gbv)
    shear = sp.eye(2) + t * sp.Matrix([[0, 1], [0, 0]])
    first_order = {
        hw: sp.diff(gated_row(gx, gv * shear, shear.inv() * go, gbv * shear, hw), t).subs(t, 0) for hw in (False, True)
    }
    symbols = sorted(first_order[False].free_symbols, key=str)
    point = {s: sp.Rational((7 * i) % 11 - 5, 4) for i, s in enumerate(symbols)}
    shear_change = max(abs(float(e.subs(point).evalf(30))) for e in first_order[False])
    return [
        zero_identity("diagonal value move, elementwise gate: change of the row = 0", diagonal),
        zero_identity("shear of the values, headwise gate: first-order change = 0", first_order[True]),
        Identity(
            "shear of the values, elementwise gate: largest first-order change at a rational point > 1e-3",
            f"{shear_change:.2g}",
            shear_change > 1e-3,
        ),
    ]


def alibi_key_bias_dead() -> list[Identity]:
    """With ALiBi's offsets the key bias is still dead: d(row)/d(b_K) = 0 exactly.

    Chapter 7b, ``thm-alibi`` (the dead key bias): row 1 of one causal head of width one on two tokens,
    query weight 3/5, key weight -2/7, key bias b_k and slope 1/4 (offset -slope (1 - j) for key j).
    """
    x_sym, bk = sp.symbols("x1:3", real=True), sp.symbols("b_k", real=True)
    q_sym, k_sym, slope = sp.Rational(3, 5), sp.Rational(-2, 7), sp.Rational(1, 4)
    scores_sym = [q_sym * x_sym[1] * (k_sym * x_sym[j] + bk) - slope * (1 - j) for j in range(2)]
    row_sym = sum(sp.exp(s) * x_sym[j] for j, s in enumerate(scores_sym)) / sum(sp.exp(s) for s in scores_sym)
    return [zero_identity("ALiBi: d(row)/d(b_K) = 0", sp.diff(row_sym, bk))]


def relative_bias_shift() -> list[Identity]:
    """A common shift of a head's relative-bias table leaves the row unchanged; one entry alone does not.

    Chapter 7b, ``thm-relative-bias``: row 1 of one bidirectional head of width one on two tokens
    (query/key product weight 2/3), key 0 one step behind (bucket tau1) and key 1 itself (bucket
    tau0). Adding c to both scores changes nothing; d(row)/d(tau1) is not 0 (it has the factor x0 - x1).
    """
    tau0, tau1, shift = sp.symbols("tau0 tau1 c", real=True)
    x_rel, w_rel = sp.symbols("x0 x1", real=True), sp.Rational(2, 3)
    scores_rel = [w_rel * x_rel[1] * x_rel[0] + tau1, w_rel * x_rel[1] ** 2 + tau0]

    def row_rel(scores: list[sp.Expr]) -> sp.Expr:
        """The softmax-weighted mean of the two tokens under ``scores``."""
        return sum(sp.exp(v) * x_rel[j] for j, v in enumerate(scores)) / sum(sp.exp(v) for v in scores)

    one_entry = sp.simplify(sp.diff(row_rel(scores_rel), tau1))
    return [
        zero_identity(
            "a common shift c of the table: change of the row = 0",
            row_rel([v + shift for v in scores_rel]) - row_rel(scores_rel),
        ),
        Identity("one entry alone: d(row)/d(tau1) != 0", str(sp.factor(one_entry)), not is_zero(one_entry)),
    ]
