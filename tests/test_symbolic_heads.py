"""The exact checks behind chapters 1-3 (attnid.symbolic.identification and attnid.symbolic.heads)."""

import pytest
import sympy as sp

from attnid.symbolic import heads
from attnid.symbolic.identification import product_example


def test_product_example_shows_the_jacobian() -> None:
    # d(abx)/da = bx and d(abx)/db = ax; the origin is where both vanish
    results = [c.result for c in product_example()]
    assert results == ["0", "Matrix([[b*x, a*x]]), rank 1", "Matrix([[0]])", "rank 0"]


def test_one_head_expansion_coefficients() -> None:
    # softmax at t = 0 is uniform, so the t^1 term is c times the mean token; the t^3 term is
    # c b x1 times the tokens' population variance (x1 - x2)^2/4, over sqrt(d_k)
    b, c, x1, x2, dk = sp.symbols("b c x1 x2 d_k", positive=True)
    names = {str(v): v for v in (b, c, x1, x2, dk)}
    t1, t3 = (sp.sympify(r.result, locals=names) for r in heads.one_head_expansion())
    assert sp.simplify(t1 - c * (x1 + x2) / 2) == 0
    assert sp.simplify(t3 - b * c * x1 * (x1 - x2) ** 2 / 4 / sp.sqrt(dk)) == 0
    assert sp.simplify(t3 - b * c * x1 * (x1 - x2) ** 2 / 2 / sp.sqrt(dk)) != 0


def test_many_heads_ratio_is_one_over_2h() -> None:
    h = sp.Symbol("H", positive=True)
    (ratio,) = heads.many_heads_ratio()
    assert sp.simplify(sp.sympify(ratio.result, locals={"H": h}) - 1 / (2 * h)) == 0


def test_many_heads_moment_token_parts() -> None:
    # The first row is t c E_w[x] under the softmax weights w_j ~ exp(s x_j), s = t^2 x1 b: by the cumulant
    # expansion E_w[x] = k1 + k2 s + k3 s^2 / 2 + ..., so the token parts of t^1, t^3, t^5 are the mean,
    # x1 times the variance and x1^2 / 2 times the third central moment of the tokens.
    x1, x2, x3 = sp.symbols("x1 x2 x3", positive=True)
    tokens = (x1, x2, x3)
    mean = sum(tokens) / 3
    variance = sum((x - mean) ** 2 for x in tokens) / 3
    third = sum((x - mean) ** 3 for x in tokens) / 3
    names = {str(x): x for x in tokens}
    parts = [sp.sympify(c.result.split(") * ", 1)[1], locals=names) for c in heads.many_heads_moments()]
    assert len(parts) == 3
    assert sp.simplify(parts[0] - mean) == 0
    assert sp.simplify(parts[1] - x1 * variance) == 0
    assert sp.simplify(parts[2] - x1**2 * third / 2) == 0
    assert sp.simplify(parts[2] - x1**2 * third) != 0


def test_residues_at_known_poles() -> None:
    # sigma(2 lambda + 1/3) has a pole at p = (i pi - 1/3)/2; the residue of lambda sigma is p/2
    (first,) = heads.logistic_ramp_residues([(sp.Integer(2), sp.Rational(1, 3))])
    assert sp.simplify(sp.sympify(first.result) - (sp.I * sp.pi - sp.Rational(1, 3)) / 4) == 0
    m, n = sp.symbols("M N", real=True)
    (shifted,) = heads.shifted_ramp_residues([(sp.Integer(-1), sp.Integer(0))])
    # a = -1, l = 0: p = -i pi, residue (M p + N)/a = i pi M - N
    assert sp.simplify(sp.sympify(shifted.result, locals={"M": m, "N": n}) - (sp.I * sp.pi * m - n)) == 0
    assert shifted.holds


def test_a_zero_has_no_pole() -> None:
    with pytest.raises(ValueError, match="no pole"):
        heads.logistic_ramp_residues([(sp.Integer(0), sp.Integer(1))])
    with pytest.raises(ValueError, match="no pole"):
        heads.shifted_ramp_residues([(sp.Integer(0), sp.Integer(0))])
