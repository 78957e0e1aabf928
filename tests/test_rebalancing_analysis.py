"""attnid.train.rebalancing and its report: the stability rule, the tuned rate and the paired comparisons, on tables built
by hand."""

from __future__ import annotations

import pytest

from attnid.train import rebalancing as RB
from attnbook.reports import rebalancing as R

SETTINGS = {"IMBALANCES": [1.0], "RATES": {"sgd": [0.1, 0.2, 0.4]}, "SEEDS": 10, "BALANCE_EVERY": 25}


def row(lr: float, variant: str, seed: int, final: float | None, ratio: float = 1.0, diverged: str = "") -> dict:
    return {"imbalance": "1.0", "optimiser": "sgd", "lr": str(lr), "variant": variant, "seed": str(seed),
            "first_loss": "1", "final_loss": "" if final is None else str(final), "max_loss_ratio": str(ratio),
            "diverged_at": diverged}


def table(plain: dict[float, list[float | None]], balance: dict[float, list[float]]) -> list[dict]:
    rows = [row(lr, "none", s, f, diverged="" if f is not None else "7") for lr, fs in plain.items() for s, f in enumerate(fs)]
    rows += [row(lr, "balance", s, f) for lr, fs in balance.items() for s, f in enumerate(fs)]
    return rows


def test_the_tuned_rate_is_the_stable_one_with_the_lowest_median():
    plain = {0.1: [0.5] * 10, 0.2: [0.3] * 10, 0.4: [0.1] * 9 + [None]}  # 0.4 has one divergent seed: not stable
    balance = {0.1: [0.4] * 10, 0.2: [0.35] * 10, 0.4: [0.2] * 10}
    runs = RB.group_runs(table(plain, balance))
    rates = RB.tuned_rates(runs, SETTINGS)
    assert rates == {(1.0, "sgd", "none"): 0.2, (1.0, "sgd", "balance"): 0.4}
    assert RB.stability_edge(runs, 1.0, "sgd", SETTINGS["RATES"]["sgd"]) == 0.2
    assert R.edges(runs, SETTINGS) == {(1.0, "sgd"): (0.2, 0.4)}


def test_a_loss_spike_counts_as_unstable():
    assert RB.is_unstable(row(0.1, "none", 0, 0.1, ratio=RB.SPIKE * 1.01))
    assert not RB.is_unstable(row(0.1, "none", 0, 0.1, ratio=RB.SPIKE))


def test_comparisons_pair_by_seed_and_correct_per_family():
    plain = {lr: [1.0 + s for s in range(10)] for lr in (0.1, 0.2, 0.4)}
    balance = {0.1: [0.5 + s for s in range(10)],              # lower on every seed
               0.2: [1.0 + s + (-1) ** s * 0.01 for s in range(10)],  # half lower, half higher
               0.4: [1.0 + s for s in range(10)]}             # level: all ties
    grid = R.grid_comparisons(RB.group_runs(table(plain, balance)), SETTINGS)
    by_rate = {c.lr: c for c in grid}
    assert by_rate[0.1].test.p_value == pytest.approx(R.smallest_p(10))
    assert by_rate[0.1].holm_p == pytest.approx(3 * R.smallest_p(10))  # three tests in the balance family
    assert by_rate[0.1].significant() and not by_rate[0.2].significant()
    assert by_rate[0.4].summary.ties == 10 and by_rate[0.4].test.p_value == 1.0
    counts = R.interval_counts(grid, "balance")
    assert counts["balance-stable-settings"] == 3 and counts["balance-better"] == 1 and counts["balance-holm"] == 1
    assert by_rate[0.1].relative == pytest.approx(-0.5 / 5.5)
    # the largest single-seed gap, absolute and relative to the baseline's final loss (seed 0 at 0.1: 0.5 of 1.0)
    assert by_rate[0.1].largest_seed_difference == pytest.approx(0.5)
    assert by_rate[0.1].largest_seed_relative == pytest.approx(0.5)
    assert by_rate[0.4].largest_seed_difference == 0.0 and by_rate[0.2].largest_seed_difference == pytest.approx(0.01)


def test_a_divergent_arm_is_not_compared():
    plain = {0.1: [1.0] * 9 + [None], 0.2: [1.0] * 10, 0.4: [1.0] * 10}
    balance = {lr: [0.9] * 10 for lr in plain}
    grid = R.grid_comparisons(RB.group_runs(table(plain, balance)), SETTINGS)
    assert sorted(c.lr for c in grid) == [0.2, 0.4]


def test_tuned_comparisons_use_each_arms_own_rate():
    evaluation = RB.group_runs(table({0.2: [1.0 + s for s in range(10)]}, {0.4: [0.8 + s for s in range(10)]}))
    rates = {(1.0, "sgd", "none"): 0.2, (1.0, "sgd", "balance"): 0.4, (1.0, "sgd", "project"): None}
    (c,) = R.tuned_comparisons(evaluation, rates)
    assert (c.lr, c.baseline_lr, c.variant) == (0.4, 0.2, "balance") and c.summary.median_difference == pytest.approx(-0.2)
