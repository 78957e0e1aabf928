"""Exact-arithmetic nullity at integer points."""

import pytest
import sympy as sp

from attnid import toy
from attnid.symbolic import exact_nullity, matrix_symbols


def test_product_has_nullity_one() -> None:
    a, b = sp.symbols("a b")
    assert exact_nullity([a * b], [a, b], seed=1) == 1


def test_independent_outputs_have_nullity_zero() -> None:
    a, b = sp.symbols("a b")
    assert exact_nullity([a + b, a - 2 * b], [a, b], seed=1) == 0


@pytest.mark.parametrize("shape", [(2, 1, 3), (3, 2, 3), (2, 3, 2), (3, 4, 2)])
def test_factored_product_matches_the_formula(shape: tuple[int, int, int]) -> None:
    a = matrix_symbols("A", shape[0], shape[1])
    b = matrix_symbols("B", shape[1], shape[2])
    assert exact_nullity(list(a * b), list(a) + list(b), seed=3) == toy.FactoredCount(*shape).unidentified


def test_bad_arguments_are_rejected() -> None:
    a = sp.Symbol("a")
    with pytest.raises(ValueError, match="variables is empty"):
        exact_nullity([a], [], seed=0)
    with pytest.raises(ValueError, match="outputs is empty"):
        exact_nullity([], [a], seed=0)
    with pytest.raises(ValueError, match="bound must be"):
        exact_nullity([a], [a], seed=0, bound=0)
    with pytest.raises(ValueError, match="matrix shape must be positive"):
        matrix_symbols("M", 0, 2)
