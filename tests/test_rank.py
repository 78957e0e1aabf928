"""The rank-decision rule on matrices whose rank is known by construction."""

import math

import pytest
import torch

import importlib
import re
from pathlib import Path

import attnid.certify
import attnid.symmetry
from attnid.jacobian import flatten
from attnid.rank import (
    COMMUTANT_TOL,
    DEFAULT_MIN_GAP,
    DEFAULT_ZERO_TOL,
    FLOAT64_EPS,
    GRAM_FLOOR,
    INVERTIBLE_REL_TOL,
    counts_as_zero,
    decide_rank,
    is_invertible,
    numerical_rank,
)


def matrix_with_spectrum(values: list[float], rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    """U diag(values) V^T with random orthonormal U, V: singular values exactly `values` (up to round-off)."""
    u, _ = torch.linalg.qr(torch.randn(rows, len(values), generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(cols, len(values), generator=gen, dtype=torch.float64))
    return u @ torch.diag(torch.tensor(values, dtype=torch.float64)) @ v.T


@pytest.mark.parametrize("true_rank", [1, 5, 11])
def test_rank_of_constructed_low_rank_matrix(true_rank: int, gen: torch.Generator) -> None:
    rows, cols = 30, 12
    values = torch.logspace(0, -4, true_rank, dtype=torch.float64).tolist()
    m = matrix_with_spectrum(values, rows, cols, gen)
    d = decide_rank(torch.linalg.svdvals(m), rows, cols)
    assert d.rank == true_rank
    assert d.nullity == cols - true_rank
    assert d.clear
    assert d.smallest_kept == pytest.approx(1e-4 if true_rank > 1 else 1.0, rel=1e-8)
    assert d.largest_dropped < 1e-13


def test_full_rank_is_clear_and_has_no_dropped_value(gen: torch.Generator) -> None:
    m = torch.randn(20, 6, generator=gen, dtype=torch.float64)
    d = decide_rank(torch.linalg.svdvals(m), 20, 6)
    assert d.rank == 6 and d.nullity == 0 and d.clear
    assert math.isnan(d.largest_dropped)
    assert d.gap == pytest.approx(d.smallest_kept / FLOAT64_EPS)


def test_wide_matrix_pads_with_zeros(gen: torch.Generator) -> None:
    # 4 rows, 9 columns: at most 4 singular values, 5 implicit zeros.
    m = matrix_with_spectrum([1.0, 0.5, 0.1], 4, 9, gen)
    d = decide_rank(torch.linalg.svdvals(m), 4, 9)
    assert d.relative.shape == (9,)
    assert d.rank == 3 and d.nullity == 6 and d.clear


def test_smoothly_decaying_spectrum_is_not_clear(gen: torch.Generator) -> None:
    # No gap anywhere: values fall by one decade per step through the tolerance.
    values = [10.0**-i for i in range(14)]
    m = matrix_with_spectrum(values, 20, 14, gen)
    d = decide_rank(torch.linalg.svdvals(m), 20, 14)
    assert not d.clear
    with pytest.raises(ValueError, match="no clear singular-value gap"):
        d.require_clear()


def test_rank_capped_by_rows_is_not_clear(gen: torch.Generator) -> None:
    m = torch.randn(3, 10, generator=gen, dtype=torch.float64)
    d = decide_rank(torch.linalg.svdvals(m), 3, 10)
    assert d.rank == 3 and not d.rows_sufficient and not d.clear
    with pytest.raises(ValueError, match="equals the number of Jacobian rows"):
        d.require_clear()


def test_zero_matrix_has_rank_zero() -> None:
    d = decide_rank(torch.zeros(4, dtype=torch.float64), 4, 4)
    assert d.rank == 0 and d.nullity == 4 and d.clear


def test_threshold_sits_at_zero_tol() -> None:
    s = torch.tensor([1.0, 2 * DEFAULT_ZERO_TOL, 0.5 * DEFAULT_ZERO_TOL], dtype=torch.float64)
    d = decide_rank(s, 3, 3)
    assert d.rank == 2
    assert not d.clear  # a gap of 4 is far below DEFAULT_MIN_GAP
    assert DEFAULT_MIN_GAP > 4


@pytest.mark.parametrize(
    ("values", "rows", "cols", "kwargs", "message"),
    [
        ([[1.0]], 1, 1, {}, "must be 1-D"),
        ([1.0, 0.5, 0.1], 2, 5, {}, "at most 2"),
        ([1.0, float("nan")], 2, 2, {}, "NaN or inf"),
        ([1.0], 1, 1, {"zero_tol": 0.0}, "zero_tol"),
        ([1.0], 1, 1, {"zero_tol": 1.5}, "zero_tol"),
        ([1.0], 1, 1, {"min_gap": 0.5}, "min_gap"),
    ],
)
def test_bad_input_is_rejected(values: list, rows: int, cols: int, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decide_rank(torch.tensor(values, dtype=torch.float64), rows, cols, **kwargs)


# ------------------------------------------------------------------------------------------------
# numerical_rank, counts_as_zero, is_invertible: rule 2 on its own. Expected values follow from the
# rule (count the values strictly above rel_tol times the largest), worked out in the comments.
# ------------------------------------------------------------------------------------------------


def f64(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_numerical_rank_of_nothing_and_of_zeros_is_zero() -> None:
    assert numerical_rank(f64([])) == 0  # no values: nothing to keep
    assert numerical_rank(f64([0.0, 0.0, 0.0])) == 0  # largest is 0: everything counts as zero


def test_numerical_rank_with_a_clear_gap() -> None:
    # threshold 1e-10 * 3 = 3e-10: 3 and 2 are above it, 1e-13 and 0 are not
    assert numerical_rank(f64([3.0, 2.0, 1e-13, 0.0])) == 2


def test_numerical_rank_straddling_the_tolerance() -> None:
    # Powers of two so the threshold is exact: rel_tol 2^-20 times largest 4 = 2^-18.
    tol, t = 2.0**-20, 2.0**-18
    assert numerical_rank(f64([4.0, t * (1 + 2**-10), t, t * (1 - 2**-10)]), tol) == 2  # only the value above t
    assert numerical_rank(f64([4.0, t]), tol) == 1  # exactly at the threshold counts as zero (strict >)
    # the default: 1.01e-10 is above 1e-10 * 1, 0.99e-10 is below
    assert numerical_rank(f64([1.0, 1.01 * DEFAULT_ZERO_TOL, 0.99 * DEFAULT_ZERO_TOL])) == 2


def test_numerical_rank_is_relative_and_order_free() -> None:
    values = [1.0, 1e-3, 1e-6]
    assert numerical_rank(f64(values), 1e-4) == 2  # 1e-3 > 1e-4, 1e-6 is not
    assert numerical_rank(f64(values) * 1e-200, 1e-4) == 2  # only ratios matter
    assert numerical_rank(f64(values[::-1]), 1e-4) == 2  # ascending, as eigh returns them
    # eigenvalues of a singular Gram: round-off negatives and tiny positives count as zero
    assert numerical_rank(f64([-1e-17, 1e-17, 2.0])) == 1


def test_decide_rank_uses_the_same_rule() -> None:
    s = f64([1.0, 1.01 * DEFAULT_ZERO_TOL, 0.99 * DEFAULT_ZERO_TOL, 0.0])
    assert decide_rank(s, 4, 4).rank == numerical_rank(s) == 2


@pytest.mark.parametrize(
    ("values", "kwargs", "message"),
    [([[1.0]], {}, "must be 1-D"), ([1.0, float("inf")], {}, "NaN or inf"), ([1.0], {"rel_tol": 0.0}, "rel_tol"),
     ([1.0], {"rel_tol": 1.0}, "rel_tol")],
)
def test_numerical_rank_rejects_bad_input(values: list, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        numerical_rank(f64(values), **kwargs)


def test_counts_as_zero_matches_numerical_rank() -> None:
    tol, t = 2.0**-20, 2.0**-18  # threshold for largest 4 is exactly t
    assert counts_as_zero(t, 4.0, tol)  # at the threshold: dropped
    assert not counts_as_zero(t * (1 + 2**-10), 4.0, tol)  # just above: kept
    assert counts_as_zero(0.5e-10, 1.0) and not counts_as_zero(2e-10, 1.0)  # the default 1e-10
    assert counts_as_zero(1.0, 0.0)  # largest 0: everything is zero, as in numerical_rank
    with pytest.raises(ValueError, match="finite"):
        counts_as_zero(float("nan"), 1.0)


def test_is_invertible_per_matrix() -> None:
    assert is_invertible(f64([[1.0, 0.5], [2.0, 1.0]]))  # condition numbers 2 and 2
    # condition 1e13 > 1 / INVERTIBLE_REL_TOL = 1e12: 1e-13 is at most 1e-12 * 1, so not invertible
    assert not is_invertible(f64([[1.0, 1e-13]]))
    assert is_invertible(f64([[1.0, 1e-11]]))  # condition 1e11: 1e-11 > 1e-12
    assert not is_invertible(f64([[1.0, 1.0], [1.0, 1e-13]]))  # one singular matrix in the batch is enough
    # each matrix is judged on its own scale: a tiny but well-conditioned matrix is invertible
    assert is_invertible(f64([[1e-20, 1e-20], [1.0, 1.0]]))
    assert not is_invertible(f64([[0.0, 0.0]]))  # the zero matrix
    assert not is_invertible(f64([[float("nan"), 1.0]]))  # a non-finite matrix
    assert is_invertible(torch.zeros(3, 0, dtype=torch.float64))  # 0 x 0 matrices
    assert is_invertible(f64([[1.0, 1e-3]]), rel_tol=1e-4) and not is_invertible(f64([[1.0, 1e-3]]), rel_tol=1e-2)


def test_tolerances_are_ordered_as_their_reasons_say() -> None:
    assert 0 < INVERTIBLE_REL_TOL < DEFAULT_ZERO_TOL < GRAM_FLOOR < 1
    assert FLOAT64_EPS < COMMUTANT_TOL < 1
    # the certificate gives up above the zero tolerance with room for its power-iteration error
    assert GRAM_FLOOR / DEFAULT_ZERO_TOL >= 1e5


def test_other_modules_take_their_tolerances_from_rank() -> None:
    assert attnid.certify.GRAM_FLOOR is GRAM_FLOOR
    assert attnid.symmetry.COMMUTANT_TOL is COMMUTANT_TOL
    # no literal tolerance (1e-10, 1e12, 0.5e-6 ...) left in the modules whose decisions moved here
    literal = re.compile(r"\b\d+(?:\.\d+)?e[-+]?\d+\b")
    for name in ("attnid.symmetry", "attnid.verification", "attnid.certify"):
        found = literal.findall(Path(importlib.import_module(name).__file__).read_text())
        assert not found, f"{name} has literal tolerances {found}; name them in attnid.rank"


def test_orthonormal_span_keeps_the_numerical_rank(gen: torch.Generator) -> None:
    # d1, d2 and d1 + d2 span a plane: two columns, orthonormal, spanning both.
    params = {"W_Q": torch.randn(3, 4, generator=gen, dtype=torch.float64)}
    d1 = {"W_Q": torch.randn(3, 4, generator=gen, dtype=torch.float64)}
    d2 = {"W_Q": torch.randn(3, 4, generator=gen, dtype=torch.float64)}
    basis = attnid.symmetry.orthonormal_span([d1, d2, {"W_Q": d1["W_Q"] + d2["W_Q"]}], params)
    assert basis.shape == (12, 2)
    assert torch.allclose(basis.T @ basis, torch.eye(2, dtype=torch.float64), atol=1e-12)
    for d in (d1, d2):
        v = flatten(d)
        assert (v - basis @ (basis.T @ v)).norm() < 1e-12 * v.norm()
    assert attnid.symmetry.orthonormal_span([d1, d2], params).shape == (12, 2)  # independent: all kept
    assert attnid.symmetry.orthonormal_span([], params).shape == (12, 0)
