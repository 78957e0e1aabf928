"""Chapter 14's fine-tuning section: tables and findings from experiments/finetune.ipynb's data.

The runs (``attnid.train.finetune``) fine-tune all-MiniLM-L6-v2's top layer on SymPy docstrings. Here:
the rate tuning (as the experiment recorded it), whether the validation loss has levelled off, the
invisible shares of the updates against chance, the balance of the trained layer, and the balanced start against the trained one.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from attnbook.precision import below
from attnbook.tables import markdown_table
from attnid.train import stats
from attnid.train.multitest import holm, signed_rank_test

Row = Mapping[str, str]
ALPHA = 0.05
ARMS_SHOWN = ("original", "balanced")
PARTS = ("total", "query_key", "value_output", "key_bias", "value_bias")
METRICS = {"val_loss": "validation loss", "val_accuracy": "validation accuracy",
           "step_share": "invisible share of a step (median over the run)"}


def _final(rows: Sequence[Row], phase: str) -> dict[tuple[str, str, str, int], Row]:
    """(optimiser, lr, arm, seed) -> the run's last evaluation row."""
    last: dict[tuple[str, str, str, int], Row] = {}
    for r in rows:
        key = (r["optimiser"], r["lr"], r["arm"], int(r["seed"]))
        if r["phase"] == phase and (key not in last or int(r["step"]) > int(last[key]["step"])):
            last[key] = r
    return last


def tuned_rates(tuning: Sequence[Row]) -> dict[str, str]:
    """Per optimiser, the rate the experiment chose (finetune_tuning.csv's ``tuned`` column)."""
    chosen = [(r["optimiser"], r["lr"]) for r in tuning if r["tuned"] == "yes"]
    best = dict(chosen)
    if len(chosen) != len(best) or set(best) != {r["optimiser"] for r in tuning}:
        raise ValueError("finetune_tuning.csv: every optimiser needs exactly one tuned rate")
    return best


def tuning_table(tuning: Sequence[Row]) -> str:
    """Each optimiser's tuning score by rate (``attnid.train.finetune.tuning_score``; the median over the tuning
    seeds where there are several)."""
    best = tuned_rates(tuning)
    body = [[r["optimiser"], r["lr"], f"{float(r['score']):.3f}", "tuned" if best[r["optimiser"]] == r["lr"] else ""]
            for r in sorted(tuning, key=lambda r: (r["optimiser"], float(r["lr"])))]
    return markdown_table(["optimiser", "learning rate", "tuning score", ""], body, right=(1, 2))


def edge_of_grid(tuning: Sequence[Row]) -> list[str]:
    """The optimisers whose tuned rate is the smallest or largest of their grid (the tuning would want a wider grid)."""
    out = []
    for opt, lr in tuned_rates(tuning).items():
        grid = sorted((r["lr"] for r in tuning if r["optimiser"] == opt), key=float)
        if lr in (grid[0], grid[-1]):
            out.append(opt)
    return out


def plateau(rows: Sequence[Row], fraction: float = 0.75) -> dict[tuple[str, str], tuple[float, float]]:
    """(optimiser, arm) -> (median final validation loss, median change since ``fraction`` of the run) over the main seeds."""
    curves: dict[tuple[str, str, int], dict[int, float]] = {}
    for r in rows:
        if r["phase"] == "main":
            curves.setdefault((r["optimiser"], r["arm"], int(r["seed"])), {})[int(r["step"])] = float(r["val_loss"])
    out: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    for (opt, arm, _), curve in curves.items():
        steps = sorted(curve)
        earlier = min(steps, key=lambda s: abs(s - fraction * steps[-1]))
        finals, changes = out.setdefault((opt, arm), ([], []))
        finals.append(curve[steps[-1]])
        changes.append(curve[steps[-1]] - curve[earlier])
    return {k: (statistics.median(f), statistics.median(c)) for k, (f, c) in out.items()}


@dataclass(frozen=True)
class ShareSummary:
    """Per-step shares of one (optimiser, arm): the median over seeds of each run's median share, with its interval."""

    median: dict[str, float]
    low: float
    high: float
    net: float  # median over seeds of the whole run's share (total)


def share_summaries(rows: Sequence[Row], *, level: float, resamples: int) -> dict[tuple[str, str], ShareSummary]:
    per_run: dict[tuple[str, str], dict[int, dict[str, list[float]]]] = {}
    net: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        key = (r["optimiser"], r["arm"])
        if r["update"] == "run":
            net.setdefault(key, []).append(float(r["total"]))
            continue
        run = per_run.setdefault(key, {}).setdefault(int(r["seed"]), {p: [] for p in PARTS})
        for p in PARTS:
            run[p].append(float(r[p]))
    out = {}
    for key, runs in per_run.items():
        medians = {p: [statistics.median(run[p]) for run in runs.values()] for p in PARTS}
        low, high = stats.median_interval(medians["total"], level=level, n_boot=resamples)
        out[key] = ShareSummary({p: statistics.median(v) for p, v in medians.items()}, low, high,
                                statistics.median(net[key]))
    return out


def chance(orbit: Row) -> float:
    """E[share] of an isotropic random update of the layer (``stats.chance_share``) for the orbit's dimension at the point."""
    return stats.chance_share(int(orbit["unidentified_at_point"]), int(orbit["parameters"]))[0]


def share_table(summaries: Mapping[tuple[str, str], ShareSummary], orbit: Row) -> str:
    body = [[opt, arm, f"{s.median['total']:.3g} [{s.low:.3g}, {s.high:.3g}]",
             *(f"{s.median[p]:.3g}" for p in PARTS[1:]), f"{s.net:.3g}"]
            for (opt, arm), s in sorted(summaries.items())]
    body.append(["random direction", "", f"{chance(orbit):.3g}", "", "", "", "", ""])
    return markdown_table(["optimiser", "start", "share of a step [95% interval]", "query/key", "value/output",
                           "key bias", "value bias", "share of the whole run"], body, right=tuple(range(2, 8)))


@dataclass(frozen=True)
class Comparison:
    optimiser: str
    metric: str
    original: float
    balanced: float
    summary: Any
    p_value: float
    adjusted: float = 1.0


def step_shares(shares: Sequence[Row]) -> dict[tuple[str, str, int], float]:
    """(optimiser, arm, seed) -> the median over a run's measured steps of the share of the step's update."""
    by: dict[tuple[str, str, int], list[float]] = {}
    for r in shares:
        if r["update"] == "step":
            by.setdefault((r["optimiser"], r["arm"], int(r["seed"])), []).append(float(r["total"]))
    return {k: statistics.median(v) for k, v in by.items()}


def rebalance_comparisons(rows: Sequence[Row], shares: Sequence[Row], *, level: float, resamples: int) -> list[Comparison]:
    """Balanced start against the trained one, per optimiser and metric, paired by seed (the same batches and
    head); exact signed-rank p, and Holm's correction over all of them."""
    final, per_run = _final(rows, "main"), step_shares(shares)
    out = []
    for opt in sorted({k[0] for k in final}):
        seeds = sorted(k[3] for k in final if k[0] == opt and k[2] == "original")
        rates = {k[1] for k in final if k[0] == opt}
        if len(rates) != 1:
            raise ValueError(f"the main {opt} runs use {len(rates)} learning rates; the comparison needs one")
        (lr,) = rates
        for metric in METRICS:
            value = ((lambda arm, s: per_run[(opt, arm, s)]) if metric == "step_share"
                     else (lambda arm, s: float(final[(opt, lr, arm, s)][metric])))  # noqa: B023 (used at once)
            a = [value("balanced", s) for s in seeds]
            b = [value("original", s) for s in seeds]
            out.append(Comparison(opt, metric, statistics.median(b), statistics.median(a),
                                  stats.paired_summary(a, b, n_boot=resamples, level=level),
                                  signed_rank_test(a, b).p_value))
    adjusted = holm([c.p_value for c in out])
    return [Comparison(**{**c.__dict__, "adjusted": p}) for c, p in zip(out, adjusted, strict=True)]


def rebalance_table(comparisons: Sequence[Comparison]) -> str:
    body = [[c.optimiser, METRICS[c.metric], f"{c.original:.3g}", f"{c.balanced:.3g}",
             f"{c.summary.median_difference:.2g} [{c.summary.low:.2g}, {c.summary.high:.2g}]",
             f"{c.summary.wins}/{c.summary.ties}/{c.summary.losses}", f"{c.adjusted:.2g}" + (" *" if c.adjusted <= ALPHA else "")]
            for c in comparisons]
    return markdown_table(["optimiser", "metric", "median, trained start", "median, balanced start",
                           "median paired difference [95% interval]", "lower/tied/higher", "Holm p"], body,
                          right=(2, 3, 4, 6))


def balance_ranges(rows: Sequence[Row]) -> dict[tuple[str, str, str], tuple[float, float, float, float]]:
    """(optimiser, arm, when) -> (min, max) of the query/key ratios and of the value/output ratios over groups and seeds."""
    by: dict[tuple[str, str, str], tuple[list[float], list[float]]] = {}
    for r in rows:
        qk, vo = by.setdefault((r["optimiser"], r["arm"], r["when"]), ([], []))
        qk.append(float(r["qk_ratio"]))
        vo.append(float(r["vo_ratio"]))
    return {k: (min(qk), max(qk), min(vo), max(vo)) for k, (qk, vo) in by.items()}


def significant(c: Comparison) -> bool:
    """Whether Holm's adjusted p is at most ``ALPHA``."""
    return c.adjusted <= ALPHA


def balance_table(ranges: Mapping[tuple[str, str, str], tuple[float, float, float, float]]) -> str:
    body = [[opt, arm, when, f"{q0:.3g} to {q1:.3g}", f"{v0:.3g} to {v1:.3g}"]
            for (opt, arm, when), (q0, q1, v0, v1) in sorted(ranges.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] != "start"))]
    return markdown_table(["optimiser", "start", "when", "query/key ratios", "value/output ratios"], body)


LEVELLED = 0.05  # the largest change of the median validation loss over a run's last quarter we call levelled off
ROUND_OFF = 1e-4  # a share the float32 weights' rounding can produce; a gradient step's is 0 in exact arithmetic


def balance_change(balance: Sequence[Row]) -> float:
    """The largest change of one group's balance ratio between a run's start and its end, over every run and group."""
    start: dict[tuple[str, ...], tuple[float, float]] = {}
    end: dict[tuple[str, ...], tuple[float, float]] = {}
    for r in balance:
        key = (r["optimiser"], r["arm"], r["seed"], r["layer"], r["group"])
        (start if r["when"] == "start" else end)[key] = (float(r["qk_ratio"]), float(r["vo_ratio"]))
    if set(start) != set(end):
        raise ValueError("finetune_balance.csv: a run's group has a start row without an end row, or the reverse")
    return max(abs(a - b) for key in start for a, b in zip(start[key], end[key], strict=True))


def largest_step_share(shares: Sequence[Row], optimiser: str) -> float:
    """The largest share of any measured step of any run of ``optimiser``."""
    return max(float(r["total"]) for r in shares if r["update"] == "step" and r["optimiser"] == optimiser)


def findings(tuning: Sequence[Row], rows: Sequence[Row], shares: Sequence[Row], balance: Sequence[Row],
             summaries: Mapping[tuple[str, str], ShareSummary], comparisons: Sequence[Comparison],
             orbit: Row) -> dict[str, Any]:
    """The numbers the chapter's prose quotes, after asserting the statements it makes about them."""
    assert not edge_of_grid(tuning), "a tuned rate sits at the edge of its grid: widen the grid"
    tuned = tuned_rates(tuning)
    assert all(r["lr"] == tuned[r["optimiser"]] for r in rows if r["phase"] == "main"), "main runs off the tuned rate"
    levelled = plateau(rows)
    assert all(abs(change) < LEVELLED for _, change in levelled.values()), levelled
    by = {(c.optimiser, c.metric): c for c in comparisons}
    for opt in ("adamw", "sgd"):
        for metric in ("val_loss", "val_accuracy"):  # the balanced start changes neither
            assert not significant(by[(opt, metric)]), by[(opt, metric)]
    adam, sgd = summaries[("adamw", "original")], summaries[("sgd", "original")]
    assert largest_step_share(shares, "sgd") < ROUND_OFF  # every SGD step is orthogonal to the orbit, up to rounding
    for arm in ARMS_SHOWN:
        s, a = summaries[("sgd", arm)], summaries[("adamw", arm)]
        assert s.net > 100 * s.median["total"], s  # the tangent space turns over the run
        assert 10 * ROUND_OFF < a.low and a.high < chance(orbit), a  # AdamW: well above rounding, below chance
        assert a.median["query_key"] > a.median["value_output"], a  # mostly on the query/key side
        assert abs(a.net / a.median["total"] - 1) < 0.1, a  # the whole run's share is about that of one step
    step = by[("adamw", "step_share")]
    assert significant(step) and step.summary.high < 0 and step.summary.wins == step.summary.n, step
    assert math.isclose(step.adjusted, len(comparisons) * 2 / 2**step.summary.n), step  # the smallest Holm p possible
    assert significant(by[("sgd", "step_share")]), by[("sgd", "step_share")]
    return {"ft-adam-share": adam.median["total"], "ft-adam-low": adam.low, "ft-adam-high": adam.high,
            "ft-chance": chance(orbit), "ft-adam-relative": f"{adam.median['total'] / chance(orbit):.0%}",
            "ft-adam-qk": adam.median["query_key"], "ft-adam-vo": adam.median["value_output"],
            "ft-sgd-bound": f"{ROUND_OFF:g}", "ft-sgd-net": sgd.net, "ft-adam-net": adam.net,
            "ft-step-drop": -step.summary.median_difference,
            "ft-step-drop-relative": f"{-step.summary.median_difference / step.original:.0%}",
            "ft-step-p": f"{step.adjusted:.2g}", "ft-seeds": step.summary.n,
            "ft-other-p": f"{min(c.adjusted for c in comparisons if c.metric != 'step_share'):.2g}",
            "ft-levelled": f"{LEVELLED:g}", "ft-steps": max(int(r["step"]) for r in rows if r["phase"] == "main"),
            "ft-balance-moved": below(balance_change(balance), 0.01, "the largest change of a balance ratio"),
            "ft-tests": len(comparisons)}
