"""The rebalancing experiments of chapter 12: one run, what counts as unstable, and each arm's tuned rate.

Two experiments write the data: ``experiments/rebalancing.ipynb`` runs every (start, optimiser,
learning rate, variant) of a grid on the tuning seeds, and ``experiments/rebalancing_tuned.ipynb``
runs each variant at its own tuned rate (``tuned_rates``, chosen on the tuning seeds alone) on fresh
evaluation seeds. Both import this module; chapter 12 reads their data through it and through
``attnbook.reports.rebalancing`` (the comparisons, tables and figure, which no experiment imports, so
that a change to the report never makes the runs' data stale). The rules are written once:

* A run is **unstable** when it diverged or its loss ever exceeded ``SPIKE`` times its first loss.
* An arm's **tuned rate** is, among the rates at which none of its tuning runs was unstable, the one
  with the lowest median final loss (the smaller rate on a tie); no rate when none is stable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from attnid.train import training as T
from attnid.train.stats import group_by
from attnid.spec import AttentionSpec

SPIKE = 1.5        # a run whose loss ever exceeds this multiple of its first loss is unstable
VARIANTS = ("none", "project", "balance", "balance-transport")
HEADER = ["imbalance", "optimiser", "lr", "variant", "seed", "first_loss", "final_loss", "max_loss_ratio", "diverged_at"]

Row = Mapping[str, str]
Key = tuple[float, str, float, str]  # (imbalance, optimiser, lr, variant)


@dataclass(frozen=True)
class RunTask:
    """One training run of the rebalancing experiments; every field is plain data, so a task pickles."""

    imbalance: float
    optimiser: str
    lr: float
    variant: str
    seed: int
    d_model: int
    teacher_heads: int
    student: tuple
    steps: int
    balance_every: int
    weight_decay: float
    device: str = "cpu"


def tasks(settings: Mapping[str, Any], cells: Iterable[tuple[float, str, float, str]], seeds: Iterable[int],
          device: str = "cpu") -> list[RunTask]:
    """The runs of ``cells`` (imbalance, optimiser, lr, variant) on ``seeds``, with the experiment's ``settings``."""
    seeds = list(seeds)
    return [RunTask(imbalance=float(c), optimiser=o, lr=float(lr), variant=v, seed=int(s), d_model=settings["D_MODEL"],
                    teacher_heads=settings["TEACHER_HEADS"], student=tuple(settings["STUDENT"]),
                    steps=settings["STEPS"], balance_every=settings["BALANCE_EVERY"],
                    weight_decay=settings["WEIGHT_DECAY"] if o == "adamw" else 0.0, device=device)
            for c, o, lr, v in cells for s in seeds]


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def run(task: RunTask) -> list[Any]:
    """One run in float64 on the reference layer: a row of ``HEADER`` (final loss empty when it diverged)."""
    device = torch.device(task.device)
    dtype, backend = T.precision("float64", device)
    teacher = AttentionSpec.create(task.d_model, task.teacher_heads)
    student = T.student_spec(task.d_model, list(task.student))
    problem = T.teacher_student(teacher, student, seed=task.seed, dtype=dtype, device=device, backend=backend,
                                imbalance=task.imbalance)
    rebalance = "balance" if task.variant.startswith("balance") else task.variant
    h = T.train(problem, optimiser=task.optimiser, lr=task.lr, steps=task.steps, seed=task.seed, rebalance=rebalance,
                transport_state=task.variant == "balance-transport", balance_every=task.balance_every,
                weight_decay=task.weight_decay)
    finite = [x for x in h.loss if np.isfinite(x)]
    return [task.imbalance, task.optimiser, task.lr, task.variant, task.seed, _fmt(h.loss[0]),
            "" if h.diverged is not None else _fmt(h.loss[-1]), _fmt(max(finite) / h.loss[0]),
            "" if h.diverged is None else h.diverged]


def group_runs(table: Iterable[Row]) -> dict[Key, list[Row]]:
    """The rows of a runs table by (imbalance, optimiser, lr, variant), each list sorted by seed."""
    return {(float(i), o, float(lr), v): rows
            for (i, o, lr, v), rows in group_by(table, ("imbalance", "optimiser", "lr", "variant")).items()}


def is_unstable(row: Row, spike: float = SPIKE) -> bool:
    """Diverged, or the loss rose above ``spike`` times its first value at some step."""
    return row["diverged_at"] != "" or float(row["max_loss_ratio"]) > spike


def diverged(rows: Sequence[Row]) -> int:
    return sum(r["diverged_at"] != "" for r in rows)


def unstable(rows: Sequence[Row], spike: float = SPIKE) -> int:
    return sum(is_unstable(r, spike) for r in rows)


def final_losses(rows: Sequence[Row]) -> np.ndarray:
    return np.array([float(r["final_loss"]) for r in rows])


def stability_edge(runs: Mapping[Key, list[Row]], imbalance: float, optimiser: str, rates: Sequence[float],
                   variant: str = "none") -> float | None:
    """The largest rate of the grid below which (inclusive) every run of ``variant`` was stable; None if none."""
    stable = [lr for lr in rates if unstable(runs[imbalance, optimiser, lr, variant]) == 0]
    return max((lr for lr in rates if all(x in stable for x in rates if x <= lr)), default=None)


def tuned_rate(runs: Mapping[Key, list[Row]], imbalance: float, optimiser: str, variant: str,
               rates: Sequence[float]) -> float | None:
    """The arm's best stable rate: lowest median final loss among the rates where none of its runs was unstable."""
    best: tuple[float, float] | None = None
    for lr in sorted(rates):
        rows = runs.get((imbalance, optimiser, lr, variant))
        if not rows or unstable(rows):
            continue
        median = float(np.median(final_losses(rows)))
        if best is None or median < best[0]:
            best = (median, lr)
    return None if best is None else best[1]


def tuned_rates(runs: Mapping[Key, list[Row]], settings: Mapping[str, Any]) -> dict[tuple[float, str, str], float | None]:
    """{(imbalance, optimiser, variant): tuned rate} for every arm the grid ran."""
    out = {}
    for imbalance in settings["IMBALANCES"]:
        for opt, rates in settings["RATES"].items():
            for variant in VARIANTS:
                if (float(imbalance), opt, float(rates[0]), variant) in runs:
                    out[float(imbalance), opt, variant] = tuned_rate(runs, float(imbalance), opt, variant, rates)
    return out
