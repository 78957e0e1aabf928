"""Exact paired tests over seeds, and the Holm correction for a family of such tests.

A training experiment compares a variant with its baseline on the same seeds, in many settings at
once (starts, optimisers, learning rates). ``signed_rank_test`` is Wilcoxon's signed-rank test with
its exact null distribution: under the null hypothesis each non-zero paired difference is equally
likely to have either sign, so the statistic W+ (the sum of the ranks of |d_i| over the positive d_i)
is the sum of a random subset of the ranks, and its distribution is counted exactly over all 2^m sign
patterns (a dynamic programme over the rank sums, with tied |d_i| given their average rank). Pairs
within the tie tolerance count as zero differences and are dropped, as in Wilcoxon's convention. The
p-value is two-sided and exact: no normal approximation, whatever m and whatever ties.

``holm`` turns the p-values of a family of tests into Holm's step-down adjusted p-values, which
control the family-wise error rate (the chance of any false rejection) at the level they are compared
with, under any dependence between the tests (Holm 1979).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SignedRankTest:
    """Exact two-sided signed-rank test of a - b over n pairs (m of them non-zero)."""

    n: int
    nonzero: int
    positive_rank_sum: float  # W+, the sum of the ranks of |d| over the pairs with a > b
    p_value: float


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..m of ``values`` (ascending), ties given the average of the ranks they span."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(values.size)
    sorted_values = values[order]
    start = 0
    while start < values.size:
        stop = start
        while stop + 1 < values.size and sorted_values[stop + 1] == sorted_values[start]:
            stop += 1
        ranks[order[start:stop + 1]] = (start + stop) / 2 + 1
        start = stop + 1
    return ranks


def _rank_sum_counts(doubled_ranks: Sequence[int]) -> np.ndarray:
    """counts[w] = number of sign patterns whose positive doubled ranks sum to w (exact integers)."""
    counts = np.zeros(sum(doubled_ranks) + 1, dtype=object)
    counts[0] = 1
    for r in doubled_ranks:
        counts[r:] = counts[r:] + counts[:counts.size - r].copy()
    return counts


def signed_rank_test(a: Sequence[float], b: Sequence[float], *, tie: float = 0.0,
                     relative_tie: bool = False) -> SignedRankTest:
    """Exact two-sided Wilcoxon signed-rank test of the paired differences a_i - b_i.

    A pair is a zero difference when |a_i - b_i| <= tie (times |b_i| when ``relative_tie``); zero
    differences are dropped. With no non-zero difference the p-value is 1.
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.ndim != 1 or x.shape != y.shape:
        raise ValueError(f"a and b must be 1-d and of the same length, got shapes {x.shape} and {y.shape}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("a and b must be finite (report divergent runs separately)")
    if tie < 0:
        raise ValueError(f"tie must be >= 0, got {tie!r}")
    diff = x - y
    tol = tie * np.abs(y) if relative_tie else np.full_like(diff, tie)
    d = diff[np.abs(diff) > tol]
    if d.size == 0:
        return SignedRankTest(n=int(x.size), nonzero=0, positive_rank_sum=0.0, p_value=1.0)
    doubled = [int(round(2 * r)) for r in _average_ranks(np.abs(d))]
    observed = sum(r for r, v in zip(doubled, d) if v > 0)
    counts = _rank_sum_counts(doubled)
    total = sum(doubled)  # W+ + W- in doubled ranks; the null distribution is symmetric about total / 2
    distance = abs(2 * observed - total)
    extreme = sum(int(c) for w, c in enumerate(counts) if abs(2 * w - total) >= distance)
    p_value = extreme / 2 ** d.size
    return SignedRankTest(n=int(x.size), nonzero=int(d.size), positive_rank_sum=observed / 2, p_value=float(p_value))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: reject test i at level alpha when adjusted_i <= alpha."""
    p = np.asarray(p_values, dtype=float)
    if p.ndim != 1:
        raise ValueError(f"p_values must be a 1-d list, got shape {p.shape}")
    if p.size and (not np.isfinite(p).all() or p.min() < 0 or p.max() > 1):
        raise ValueError("p-values must lie in [0, 1]")
    m = p.size
    order = np.argsort(p, kind="stable")
    adjusted = np.empty(m)
    running = 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (m - k) * p[i]))
        adjusted[i] = running
    return [float(v) for v in adjusted]
