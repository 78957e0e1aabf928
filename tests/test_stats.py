"""attnid.train.stats: paired bootstrap summaries and the chance level of a share."""

from __future__ import annotations

import numpy as np
import pytest

from attnid.train import stats
from attnid.train.stats import chance_share, paired_summary


def test_a_clear_shift_gives_an_interval_that_excludes_zero() -> None:
    rng = np.random.default_rng(1)
    b = rng.normal(size=12)
    a = b - 1.0 + 0.1 * rng.normal(size=12)      # a is lower by about 1 in every pair
    s = paired_summary(a, b, n_boot=2000, seed=0)
    assert s.n == 12 and s.wins == 12 and s.ties == 0 and s.losses == 0
    assert s.high < 0 and s.excludes_zero
    assert s.low <= s.median_difference <= s.high
    assert abs(s.median_difference + 1.0) < 0.2


def test_pure_noise_gives_an_interval_that_includes_zero() -> None:
    rng = np.random.default_rng(2)
    b = rng.normal(size=15)
    a = b + np.array([-1.0, 1.0] * 7 + [0.0]) * rng.uniform(0.5, 1.5, size=15)  # symmetric differences
    s = paired_summary(a, b, n_boot=2000, seed=0)
    assert s.low < 0 < s.high and not s.excludes_zero
    assert s.wins == 7 and s.losses == 7 and s.ties == 1


def test_ties_use_the_stated_tolerance_and_the_result_is_seeded() -> None:
    a, b = [1.0, 2.0, 3.0, 4.0], [1.0 + 1e-12, 2.5, 3.0, 3.0]
    s = paired_summary(a, b, tie=1e-9)
    assert (s.wins, s.ties, s.losses) == (1, 2, 1)
    assert paired_summary(a, b, tie=1e-9, relative_tie=True).ties == 2
    assert paired_summary(a, b, seed=3) == paired_summary(a, b, seed=3)
    # the seed is really used: with few resamples (where the quantiles still move) another seed differs
    x = np.random.default_rng(5).normal(size=40)
    y = x + np.random.default_rng(6).normal(size=40)
    one, other = (paired_summary(x, y, n_boot=100, seed=k) for k in (3, 4))
    assert (one.low, one.high) != (other.low, other.high)


@pytest.mark.parametrize("bad", [dict(a=[1.0], b=[2.0]), dict(a=[1.0, 2.0], b=[1.0]), dict(a=[1.0, np.nan], b=[1.0, 2.0])])
def test_bad_input_is_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        paired_summary(bad["a"], bad["b"])
    with pytest.raises(ValueError, match="level"):
        paired_summary([1.0, 2.0], [1.0, 2.0], level=1.5)


@pytest.mark.parametrize("u,p", [(1, 2), (3, 10), (12, 48), (40, 128)])
def test_chance_share_matches_monte_carlo(u: int, p: int) -> None:
    mean, mean_square = chance_share(u, p)
    assert mean_square == u / p
    x = np.random.default_rng(u * p).normal(size=(200_000, p))
    share = np.linalg.norm(x[:, :u], axis=1) / np.linalg.norm(x, axis=1)
    assert abs(share.mean() - mean) < 4 * share.std() / np.sqrt(len(share))
    assert mean < np.sqrt(u / p)  # Jensen: E[share] < sqrt(E[share^2])
    with pytest.raises(ValueError, match="0 < u < p"):
        chance_share(p, p)


def test_median_interval_brackets_the_median_and_is_reproducible() -> None:
    low, high = stats.median_interval(np.arange(101.0))
    assert low < 50 < high and high - low < 30
    assert stats.median_interval(np.arange(101.0)) == (low, high)  # seeded
    few = np.random.default_rng(2).normal(size=30)  # and the seed is used (few resamples: the quantiles move)
    assert stats.median_interval(few, n_boot=50, seed=0) != stats.median_interval(few, n_boot=50, seed=1)
    assert stats.median_interval([3.0, 3.0, 3.0]) == (3.0, 3.0)
    with pytest.raises(ValueError, match="at least 2 values"):
        stats.median_interval([1.0])


def test_round_up_gives_a_printed_bound_that_holds() -> None:
    from attnid.train.stats import round_up

    for x, digits, printed in ((8.44e-9, 1, "9e-09"), (0.004521, 2, "0.0046"), (1.44e-11, 1, "2e-11"), (3e-5, 1, "3e-05")):
        bound = round_up(x, digits)
        assert bound >= x and f"{bound:.{digits - 1}e}" == f"{float(printed):.{digits - 1}e}", (x, bound)
    assert round_up(0.0) == 0.0
    with pytest.raises(ValueError):
        round_up(-1.0)
