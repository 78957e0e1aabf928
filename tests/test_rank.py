"""The rank-decision rule on matrices whose rank is known by construction."""

import math

import pytest
import torch

from attnid.rank import DEFAULT_MIN_GAP, DEFAULT_ZERO_TOL, FLOAT64_EPS, decide_rank


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
