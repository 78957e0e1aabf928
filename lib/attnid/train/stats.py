"""Statistics for the training experiments: paired comparisons over seeds, and chance levels of shares.

``median_interval`` is the seeded percentile bootstrap interval of a median, the one bootstrap
every experiment uses. ``paired_summary`` compares two measurements taken on the same seeds (a variant against its
baseline): the median of the per-seed differences, a percentile bootstrap interval for that
median, and how many seeds the variant won, tied or lost. ``chance_share`` is the share of a
random update that lies in a fixed subspace: for an isotropic vector in R^P and a subspace of
dimension u, share^2 ~ Beta(u/2, (P - u)/2), so E[share^2] = u/P exactly and
E[share] = Gamma((u+1)/2) Gamma(P/2) / (Gamma(u/2) Gamma((P+1)/2)).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

Row = Mapping[str, str]


def group_by(table: Iterable[Row], fields: Sequence[str], order: str = "seed") -> dict[tuple[str, ...], list[Row]]:
    """The rows of a CSV table grouped by ``fields`` (in order of first appearance), each group sorted by the
    integer column ``order``: the seeds a paired comparison is taken over."""
    groups: dict[tuple[str, ...], list[Row]] = {}
    for r in table:
        groups.setdefault(tuple(r[f] for f in fields), []).append(r)
    return {k: sorted(v, key=lambda r: int(r[order])) for k, v in groups.items()}


@dataclass(frozen=True)
class PairedSummary:
    """Paired comparison of ``a`` against ``b`` over the same n seeds (difference = a - b)."""

    n: int
    median_difference: float
    low: float          # percentile bootstrap interval for the median difference
    high: float
    level: float        # its coverage, e.g. 0.95
    wins: int           # seeds with a - b < -tie (a lower: a win when lower is better)
    ties: int           # |a - b| <= tie
    losses: int         # a - b > tie
    tie: float          # the tolerance used, absolute

    @property
    def excludes_zero(self) -> bool:
        """True when the interval lies entirely on one side of 0."""
        return self.low > 0 or self.high < 0


def paired_summary(a: Sequence[float], b: Sequence[float], *, n_boot: int = 10_000, seed: int = 0,
                   level: float = 0.95, tie: float = 0.0, relative_tie: bool = False) -> PairedSummary:
    """Median of the paired differences a_i - b_i, its percentile bootstrap interval and wins/ties/losses.

    The bootstrap resamples the n differences with replacement ``n_boot`` times (numpy generator
    seeded with ``seed``, so the interval is reproducible) and takes the (1 - level)/2 and
    (1 + level)/2 quantiles of the resampled medians. A pair is a tie when |a_i - b_i| <= tie
    (times |b_i| when ``relative_tie``). Wins count a_i below b_i (lower is better, as for a loss).
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.ndim != 1 or x.shape != y.shape:
        raise ValueError(f"a and b must be 1-d and of the same length, got shapes {x.shape} and {y.shape}")
    if x.size < 2:
        raise ValueError(f"a paired comparison needs at least 2 pairs, got {x.size}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("a and b must be finite (report divergent runs separately)")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    if n_boot < 100:
        raise ValueError(f"n_boot must be at least 100, got {n_boot!r}")
    if tie < 0:
        raise ValueError(f"tie must be >= 0, got {tie!r}")
    diff = x - y
    low, high = median_interval(diff, level=level, n_boot=n_boot, seed=seed)
    tol = tie * np.abs(y) if relative_tie else np.full_like(diff, tie)
    ties = np.abs(diff) <= tol
    return PairedSummary(n=int(diff.size), median_difference=float(np.median(diff)), low=float(low), high=float(high),
                         level=level, wins=int(((diff < 0) & ~ties).sum()), ties=int(ties.sum()),
                         losses=int(((diff > 0) & ~ties).sum()), tie=float(tie))


def median_interval(values: Sequence[float], *, level: float = 0.95, n_boot: int = 10_000,
                    seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval at ``level`` for the median of ``values`` (resampled ``n_boot`` times, seeded)."""
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1 or arr.size < 2:
        raise ValueError(f"need a 1-d list of at least 2 values, got shape {arr.shape}")
    if not 0 < level < 1 or n_boot < 1:
        raise ValueError(f"need 0 < level < 1 and n_boot >= 1; got {level!r}, {n_boot!r}")
    rng = np.random.default_rng(seed)
    medians = np.median(arr[rng.integers(0, arr.size, size=(n_boot, arr.size))], axis=1)
    low, high = np.quantile(medians, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def chance_share(u: int, p: int) -> tuple[float, float]:
    """(E[share], E[share^2]) of an isotropic random vector in R^p on a fixed u-dimensional subspace.

    share^2 = |P x|^2 / |x|^2 ~ Beta(u/2, (p - u)/2): E[share^2] = u/p, and
    E[share] = E[Beta^(1/2)] = Gamma((u+1)/2) Gamma(p/2) / (Gamma(u/2) Gamma((p+1)/2)).
    """
    if not (isinstance(u, int) and isinstance(p, int)) or not 0 < u < p:
        raise ValueError(f"need integers 0 < u < p, got u={u!r}, p={p!r}")
    log_mean = math.lgamma((u + 1) / 2) + math.lgamma(p / 2) - math.lgamma(u / 2) - math.lgamma((p + 1) / 2)
    return math.exp(log_mean), u / p


def round_up(x: float, digits: int = 1) -> float:
    """x > 0 rounded up to ``digits`` significant digits, so that "at most" or "below" it stays true when printed.

    For example round_up(8.44e-9) = 9e-9 and round_up(0.004521, 2) = 0.0046. Zero stays zero.
    """
    if not math.isfinite(x) or x < 0 or digits < 1:
        raise ValueError(f"round_up needs a finite x >= 0 and digits >= 1, got {x!r}, {digits!r}")
    if x == 0:
        return 0.0
    unit = 10.0 ** (math.floor(math.log10(x)) - digits + 1)
    return math.ceil(x / unit) * unit
