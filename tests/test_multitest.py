"""The exact signed-rank test and Holm's correction, against values counted by hand and by brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from attnid.train.multitest import holm, signed_rank_test


def brute_force_p(diff: np.ndarray) -> float:
    """Two-sided p of W+ by listing all 2^m sign patterns (ties in |d| get average ranks)."""
    d = diff[diff != 0]
    mags = np.abs(d)
    ranks = np.array([np.mean([1 + k for k, v in enumerate(sorted(mags)) if v == m]) for m in mags])
    observed = ranks[d > 0].sum()
    centre = ranks.sum() / 2
    hits = sum(abs(ranks[list(s)].sum() - centre) >= abs(observed - centre) - 1e-12
               for k in range(d.size + 1) for s in itertools.combinations(range(d.size), k))
    return hits / 2 ** d.size


def test_all_one_sign_gives_the_smallest_p():
    t = signed_rank_test(np.arange(10) + 1.0, np.zeros(10))
    assert t.p_value == pytest.approx(2 / 1024)
    assert t.positive_rank_sum == 55 and t.nonzero == 10


def test_known_table_value():
    # n = 10, W- = 8 (ranks 1 and 7 negative): P(W <= 8) = 25/1024, two-sided 50/1024 (Wilcoxon's table)
    d = np.arange(1.0, 11.0)
    d[[0, 6]] *= -1
    assert signed_rank_test(d, np.zeros(10)).p_value == pytest.approx(50 / 1024)


@pytest.mark.parametrize("seed", range(6))
def test_matches_brute_force_with_ties_and_zeros(seed):
    rng = np.random.default_rng(seed)
    d = rng.integers(-3, 4, size=9).astype(float)  # many ties and zeros
    t = signed_rank_test(d, np.zeros_like(d))
    assert t.nonzero == int((d != 0).sum())
    assert t.p_value == pytest.approx(brute_force_p(d)) if t.nonzero else t.p_value == 1.0


def test_ties_within_the_tolerance_are_dropped():
    b = np.array([1.0, 2.0, 3.0, 4.0])
    a = b * (1 + np.array([1e-12, -1e-12, 0.5, 0.25]))
    t = signed_rank_test(a, b, tie=1e-9, relative_tie=True)
    assert t.nonzero == 2 and t.p_value == pytest.approx(0.5)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="same length"):
        signed_rank_test([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="finite"):
        signed_rank_test([1.0, np.nan], [1.0, 2.0])
    with pytest.raises(ValueError, match="tie"):
        signed_rank_test([1.0], [2.0], tie=-1)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        holm([0.5, 1.5])


def test_holm_by_hand():
    # sorted p: 0.01, 0.02, 0.03, 0.5 -> 4*0.01, max(0.04, 3*0.02), max(0.06, 2*0.03), max(0.06, 0.5)
    assert holm([0.03, 0.5, 0.01, 0.02]) == pytest.approx([0.06, 0.5, 0.04, 0.06])
    assert holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []


def test_holm_is_monotone_and_never_below_the_raw_p():
    rng = np.random.default_rng(1)
    p = rng.uniform(size=30)
    adjusted = np.array(holm(p))
    assert (adjusted >= p).all() and (adjusted <= 1).all()
    order = np.argsort(p)
    assert (np.diff(adjusted[order]) >= 0).all()
