"""The exact facts behind prop-qk-width-one (QK-norm heads of width one, eps > 0)."""

import sympy as sp

from attnid.symbolic import failed
from attnid.symbolic.width_one import independence_determinant, width_one_identities


def test_every_width_one_identity_holds() -> None:
    checks = width_one_identities()
    assert len(checks) == 5 and not failed(checks)


def test_the_determinant_sees_a_repeated_point() -> None:
    # two equal rows: the evaluation matrix is singular, which the check must not call independent
    assert sp.simplify(independence_determinant((0, 1, 1, 2))) == 0
    assert sp.minimal_polynomial(independence_determinant(), sp.Symbol("x")) != sp.Symbol("x")


def test_eps_one_stands_for_every_eps() -> None:
    # the scaling s = v / sqrt(eps) maps the points 0, 1, 2, 3 at eps = 4 to 0, 1/2, 1, 3/2 at eps = 1:
    # the determinants differ by the factor sqrt(eps)^-1 that J carries
    at_four = independence_determinant((0, 2, 4, 6), sp.Integer(4))
    at_one = independence_determinant((0, 1, 2, 3), sp.Integer(1))
    assert sp.simplify(at_four - at_one / 2) == 0
