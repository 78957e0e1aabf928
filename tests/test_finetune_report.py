"""attnbook.reports.finetune (chapter 14's fine-tuning section) on tables built by hand, whose answers are
known without the code under test."""

from __future__ import annotations

import pytest

from attnbook.reports import finetune as FT


def tuning_rows(best: dict[str, str]) -> list[dict[str, str]]:
    grid = {"adamw": ["3e-05", "0.0001", "0.0003"], "sgd": ["0.01", "0.03", "0.1"]}
    return [{"optimiser": o, "lr": lr, "score": str(1.0 + i / 10), "tuned": "yes" if best[o] == lr else "no"}
            for o, rates in grid.items() for i, lr in enumerate(rates)]


def test_the_tuned_rate_is_the_one_the_experiment_marked_and_an_edge_is_named() -> None:
    rows = tuning_rows({"adamw": "0.0001", "sgd": "0.1"})
    assert FT.tuned_rates(rows) == {"adamw": "0.0001", "sgd": "0.1"}
    assert FT.edge_of_grid(rows) == ["sgd"]
    assert "| adamw | 0.0001 | 1.100 | tuned |" in FT.tuning_table(rows)


def test_two_tuned_rates_for_one_optimiser_are_refused() -> None:
    rows = tuning_rows({"adamw": "0.0001", "sgd": "0.1"})
    rows[0]["tuned"] = "yes"
    with pytest.raises(ValueError, match="exactly one tuned rate"):
        FT.tuned_rates(rows)


def run_rows(values: dict[tuple[str, int], float]) -> list[dict[str, str]]:
    return [{"phase": "main", "optimiser": "adamw", "lr": "0.0001", "arm": arm, "seed": str(seed), "step": str(step),
             "train_loss": "1", "val_loss": str(value + (step == 50)), "val_accuracy": "0.5"}
            for (arm, seed), value in values.items() for step in (50, 100)]


def share_rows(values: dict[tuple[str, int], float]) -> list[dict[str, str]]:
    parts = dict.fromkeys(FT.PARTS, "0")
    return [{"optimiser": "adamw", "arm": arm, "seed": str(seed), "update": "step", "step": str(step), "layer": "5",
             **parts, "total": str(value)} for (arm, seed), value in values.items() for step in (0, 10)]


def test_a_balanced_start_lower_on_every_seed_gets_the_smallest_exact_p() -> None:
    seeds = range(8)
    losses = {(arm, s): 1.0 + s / 100 for arm in FT.ARMS_SHOWN for s in seeds}  # equal: no difference
    shares = {**{("original", s): 0.2 + s / 100 for s in seeds}, **{("balanced", s): 0.1 + s / 100 for s in seeds}}
    comparisons = FT.rebalance_comparisons(run_rows(losses), share_rows(shares), level=0.95, resamples=200)
    by = {c.metric: c for c in comparisons}
    assert set(by) == set(FT.METRICS)
    step = by["step_share"]
    assert step.summary.wins == 8 and step.p_value == pytest.approx(2 / 2**8)
    assert step.adjusted == pytest.approx(len(comparisons) * 2 / 2**8)  # Holm: the smallest p times the tests
    assert step.summary.median_difference == pytest.approx(-0.1)
    assert by["val_loss"].summary.ties == 8 and not FT.significant(by["val_loss"])
    assert FT.plateau(run_rows(losses))[("adamw", "original")][1] == pytest.approx(-1.0)  # the last step minus step 50


def test_the_balance_change_pairs_each_group_with_itself() -> None:
    def row(when: str, group: str, qk: float) -> dict[str, str]:
        return {"optimiser": "sgd", "arm": "original", "seed": "0", "layer": "5", "group": group, "when": when,
                "qk_ratio": str(qk), "vo_ratio": "1"}

    # two groups swap their ratios: the ranges stay the same, but each group moved by 0.5
    rows = [row("start", "0", 1.0), row("start", "1", 1.5), row("end", "0", 1.5), row("end", "1", 1.0)]
    assert FT.balance_change(rows) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="without an end row"):
        FT.balance_change(rows[:3])
