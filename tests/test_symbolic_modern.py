"""The exact checks of chapters 7b and 7c (attnid.symbolic.norms, .latent, .modern) hold, and can fail."""

from __future__ import annotations

import sympy as sp

from attnid.symbolic import failed
from attnid.symbolic.latent import mla_orbit_dimension
from attnid.symbolic.modern import (
    gated_row,
    gated_value_moves,
    relative_bias_shift,
)
from attnid.symbolic.norms import (
    logistic_pole_laurent,
    qk_tangent_offsets,
    qk_weight_trade,
    rms_normalise,
)


def test_laurent_coefficients_are_the_residue_and_its_square() -> None:
    # sigma(S) = 1 / (1 + e^-S) has a simple pole where S = i pi; with S = i pi + s1 tau + ..., the
    # residue in tau is 1/S'(0) = 1/s1, and sigma' = sigma (1 - sigma) has the double-pole coefficient -1/s1^2.
    results = [c.result for c in logistic_pole_laurent()]
    assert results == ["1/s1", "-1/s1**2"]
    # an odd multiple of i pi is a pole as well
    assert not failed(logistic_pole_laurent(3 * sp.I * sp.pi))


def test_laurent_check_fails_away_from_a_pole() -> None:
    # S(0) = 0 is no pole: sigma(0) = 1/2, so tau sigma -> 0, not 1/s1
    checks = logistic_pole_laurent(sp.Integer(0))
    assert len(failed(checks)) == 2
    assert checks[0].result == "0"


def test_step4_needs_weights_with_distinct_squared_products() -> None:
    # products gamma_q gamma_k = 1, 1, 65: the first two coincide, and K = K' = b J on the pair is a solution
    checks = qk_tangent_offsets(gamma_q=(1, 1, 5), gamma_k=(1, 1, 13))
    assert "weighted: one family of solutions, with K = K' = 0" in failed(checks)
    # (2, 3, 5) x (7, 11, 13) has products 14, 33, 65 (distinct squares): the check holds
    assert not failed(qk_tangent_offsets(gamma_q=(2, 3, 5), gamma_k=(7, 11, 13)))


def test_weight_trade_changes_the_off_diagonal_by_the_difference_on_the_pair() -> None:
    # (G_q D R D^-1 G_k - G_q R G_k)[0, 1] = g_q1 g_k2 (-sin theta)(d1/d2 - 1) = g_q1 g_k2 (d2 - d1) sin(theta) / d2
    results = {c.statement: c.result for c in qk_weight_trade()}
    g_q1, g_k2, d1, d2, theta = sp.symbols("g_q1 g_k2 d1 d2 theta")
    entry = sp.sympify(results["the trade changes M[0, 1] by g_q1 g_k2 (d2 - d1) sin(theta) / d2"])
    assert sp.simplify(entry - g_q1 * g_k2 * (d2 - d1) * sp.sin(theta) / d2) == 0
    assert results["M unchanged forces d2 = d1 (angle outside pi Z)"] == "[{d2: d1}]"


def test_mla_count_formula() -> None:
    # dim O(c) + c = c(c + 1)/2 per latent, d_n^2 + d_v^2 per head, d_r from the commutant
    (check,) = mla_orbit_dimension()
    c, cq, h, dn, dv, dr = sp.symbols("c cq H d_n d_v d_r")
    expected = c * (c + 1) / 2 + cq * (cq + 1) / 2 + h * (dn**2 + dv**2) + dr
    shown = sp.sympify(check.result.replace("c'", "cq"), locals={"c": c, "cq": cq, "H": h})
    assert sp.simplify(shown - expected) == 0


def test_rms_normalise_has_root_mean_square_k() -> None:
    # N_0(u) = u / sqrt(|u|^2 / k): its mean square is 1
    u = sp.Matrix([sp.symbols("u1:4", positive=True)])
    n = rms_normalise(u, 0)
    assert sp.simplify((n * n.T)[0] / 3) == 1


def test_gated_row_shear_is_seen_only_by_an_elementwise_gate() -> None:
    shear_row = next(c for c in gated_value_moves() if "elementwise gate: largest" in c.statement)
    assert 1e-3 < float(shear_row.result) < 10  # two significant digits, a clear non-zero
    # the same at a hand-picked point: a non-diagonal value move changes the elementwise-gated row once the
    # two gate entries differ (with equal gate entries the gate acts as one scalar and the move is invisible)
    x = sp.Matrix([[1, 2], [-1, 1]])
    wv, wo, bv = sp.Matrix([[1, 0], [2, 1]]), sp.Matrix([[1, -1], [0, 2]]), sp.Matrix([[1, 1]])
    mix = sp.Matrix([[1, 1], [0, 1]])
    moved = gated_row(x, wv * mix, mix.inv() * wo, bv * mix) - gated_row(x, wv, wo, bv)
    symbols = sorted(moved.free_symbols, key=str)
    same_gates = {s: sp.Rational(1, 2) for s in symbols}
    distinct = {s: sp.Rational(i + 1, 3) for i, s in enumerate(symbols)}
    assert max(abs(float(e.subs(same_gates))) for e in moved) < 1e-12
    assert max(abs(float(e.subs(distinct))) for e in moved) > 1e-3


def test_relative_bias_entry_derivative_has_the_token_difference() -> None:
    # d(row)/d(tau1) = p0 p1 (x0 - x1) with p_j the softmax weights: zero only for equal tokens
    (_, one_entry) = relative_bias_shift()
    assert one_entry.result.startswith("(x0 - x1)*")
