"""Chapter 11's report on the rate x width sweep (``experiments/share_sweep.ipynb``): the share against chance, and stability."""

from __future__ import annotations
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
import numpy as np
from attnid.train.stats import round_up
from attnbook.tables import markdown_table
from attnbook.reports.training import NAMES, Row, group_by


SPIKE = 10.0  # a run whose loss ever rises above SPIKE x its first loss counts as unstable (Adam's loss spikes, never overflows)


@dataclass(frozen=True)
class SweepCell:
    """One (width, optimiser, rate) of the rate x width sweep: each stable seed's median share over its chance level."""

    width: int
    optimiser: str
    lr: float
    ratios: np.ndarray  # seeds that were stable (see ``unstable_run``): median share after the first step / chance
    unstable: int       # seeds whose loss became non-finite or spiked
    with_first: np.ndarray  # the same seeds' ratios with the first step among the measured ones
    fitted: np.ndarray      # the same seeds' final loss / first loss


FIRST_LEFT_OUT = "median_share_after_first"  # the sweep's statistic: Adam's first step moves every coordinate by ~lr


def unstable_run(row: Row, spike: float = SPIKE) -> bool:
    """The sweep's stability rule: the loss became non-finite (``diverged_at``) or rose above spike x its first value."""
    return row["diverged_at"] != "" or float(row["max_loss"]) > spike * float(row["first_loss"])


def sweep_cells(table: Sequence[Row], spike: float = SPIKE) -> list[SweepCell]:
    """The sweep's (width, optimiser, rate) cells in the order of the data (``spike``: see ``unstable_run``)."""
    cells = []
    for (width, opt, lr), rows in group_by(table, ("d_model", "optimiser", "lr")).items():
        stable = [r for r in rows if not unstable_run(r, spike)]
        ratio = lambda share: np.array([float(r[share]) / float(r["chance_rms"]) for r in stable])
        fitted = np.array([float(r["final_loss"]) / float(r["first_loss"]) for r in stable])
        cells.append(SweepCell(int(width), opt, float(lr), ratio(FIRST_LEFT_OUT), len(rows) - len(stable),
                               ratio("median_share"), fitted))
    return cells


def stability_edges(cells: Sequence[SweepCell]) -> dict[tuple[int, str], tuple[float | None, float | None]]:
    """(width, optimiser) -> (largest rate below the first unstable one with every seed stable, smallest rate with an
    unstable seed; None: not on the grid)."""
    edges: dict[tuple[int, str], tuple[float | None, float | None]] = {}
    for key in dict.fromkeys((c.width, c.optimiser) for c in cells):
        mine = sorted((c for c in cells if (c.width, c.optimiser) == key), key=lambda c: c.lr)
        first_bad = next((c.lr for c in mine if c.unstable), None)
        stable = [c.lr for c in mine if not c.unstable and (first_bad is None or c.lr < first_bad)]
        edges[key] = (stable[-1] if stable else None, first_bad)
    return edges


def sweep_markdown(cells: Sequence[SweepCell]) -> str:
    """One row per optimiser and rate, one column per width: the median share / chance of the stable seeds, and how
    many seeds were unstable."""
    widths = list(dict.fromkeys(c.width for c in cells))
    by_key = {(c.optimiser, c.lr, c.width): c for c in cells}
    body = []
    for opt, lr in dict.fromkeys(sorted(((c.optimiser, c.lr) for c in cells), key=lambda k: (list(NAMES).index(k[0]), k[1]))):
        row = [NAMES[opt], f"{lr:g}"]
        for width in widths:
            c = by_key[opt, lr, width]
            text = f"{np.median(c.ratios):.2g}" if c.ratios.size else "-"
            row.append(text + (f" ({c.unstable}/{c.ratios.size + c.unstable} unstable)" if c.unstable else ""))
        body.append(row)
    header = ["optimiser", "rate", *(f"d = {w}" for w in widths)]
    return markdown_table(header, body, right=tuple(range(1, 2 + len(widths))))


def sweep_findings(cells: Sequence[SweepCell]) -> dict[str, Any]:
    """What the prose says of the sweep: the range of share / chance per optimiser over its stable cells, and the edges."""
    found: dict[str, Any] = {"sweep-widths": ", ".join(str(w) for w in dict.fromkeys(c.width for c in cells)),
                             "sweep-cells": len(cells), "sweep-unstable-cells": sum(bool(c.unstable) for c in cells),
                             "spike": SPIKE}
    for opt in dict.fromkeys(c.optimiser for c in cells):
        medians = [float(np.median(c.ratios)) for c in cells if c.optimiser == opt and not c.unstable]
        found |= {f"sweep-{opt}-min": min(medians), f"sweep-{opt}-max": max(medians)}
    stable = [c for c in cells if not c.unstable and c.optimiser in ("adam", "adamw")]
    change = lambda cs: round_up(max((abs(float(np.median(c.ratios) - np.median(c.with_first))) for c in cs), default=0.0), 2)
    above = [c for c in stable if c.optimiser == "adamw" and np.median(c.ratios) > 1]
    found |= {"sweep-first-step-change": change(stable),
              "sweep-first-step-change-rest": change([c for c in stable if all(c is not a for a in above)])}
    found |= {"sweep-adamw-above": len(above), "sweep-adamw-stable": sum(c.optimiser == "adamw" for c in stable),
              "sweep-adamw-above-cells": ", ".join(f"d = {c.width} at {c.lr:g}" for c in above) or "none",
              "sweep-adam-above": sum(c.optimiser == "adam" and np.median(c.ratios) > 1 for c in stable),
              "sweep-adamw-above-fit": max((float(np.median(c.fitted)) for c in above), default=0.0)}
    edges = stability_edges(cells)
    found["sweep-edges-found"] = sum(bad is not None for _, bad in edges.values())
    found["sweep-edges"] = len(edges)
    return found


def sweep_figure(cells: Sequence[SweepCell]):
    """Share / chance against the rate, one panel per optimiser, one line per width; crosses where a seed was unstable."""
    import matplotlib.pyplot as plt  # noqa: PLC0415 (the figures only)

    optimisers = list(dict.fromkeys(c.optimiser for c in cells))
    widths = list(dict.fromkeys(c.width for c in cells))
    fig, axes = plt.subplots(2, 2, figsize=(6.4, 5.6), squeeze=False)
    for ax, opt in zip(axes.ravel(), optimisers):
        for k, (width, marker, style) in enumerate(zip(widths, "os^D", ("-", "--", ":", "-."))):
            mine = sorted((c for c in cells if (c.width, c.optimiser) == (width, opt)), key=lambda c: c.lr)
            ok = [c for c in mine if c.ratios.size]
            ax.plot([c.lr for c in ok], [max(float(np.median(c.ratios)), 1e-16) for c in ok], style, marker=marker, ms=4,
                    color=f"C{k}", label=f"d = {width}")
            bad = [c for c in mine if c.unstable]
            ax.plot([c.lr for c in bad], [1.0] * len(bad), "x", color=f"C{k}", ms=7, mew=1.5,
                    label="a seed unstable" if k == 0 and bad else None)
        ax.set_xscale("log")
        ax.set_yscale("log")
        rates = sorted({c.lr for c in cells if c.optimiser == opt})
        ax.set_xticks(rates, [f"{r:g}" for r in rates], fontsize=7, rotation=45)  # the rates run: no labels collide
        ax.xaxis.set_minor_locator(plt.NullLocator())
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_title(NAMES[opt], fontsize=9)
        ax.set_xlabel("learning rate", fontsize=8)
        ax.set_ylabel("median share / chance", fontsize=8)
    handles, labels = [], []
    for ax in axes.ravel():
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=len(labels), frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig
