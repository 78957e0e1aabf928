"""Chapter 12's report on the rebalancing runs: paired comparisons, Holm's correction, tables and the grid figure.

A **comparison** pairs a variant with a baseline seed by seed: the bootstrap interval of the median
difference (``attnid.train.stats.paired_summary``), the exact signed-rank p-value (``attnid.train.multitest``),
and Holm's adjusted p-value over its family: the comparisons of the same variant in the same table
(the grid's stable settings, or the tuned arms). The runs, the stability rule and the tuned rates are
``attnid.train.rebalancing``'s; no experiment imports this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from attnid.train.multitest import SignedRankTest, holm, signed_rank_test
from attnid.train.stats import PairedSummary, paired_summary

from attnid.train.rebalancing import VARIANTS, Key, Row, diverged, final_losses, stability_edge, unstable

SAME_LOSS = 1e-9   # relative difference of two final losses counted as level (a tie)
N_BOOT = 10_000    # bootstrap resamples of every paired comparison (seeded)
ALPHA = 0.05       # family-wise error rate of the Holm-corrected tests
COMPARED = VARIANTS[1:]
NAMES = {"sgd": "SGD", "momentum": "momentum", "adam": "Adam", "adamw": "AdamW"}
SHORT = {"none": "plain", "project": "project", "balance": "balance", "balance-transport": "transport"}
LABELS = {"none": "plain", "project": "projected updates", "balance": "balanced, state kept",
          "balance-transport": "balanced, state transported"}


@dataclass(frozen=True)
class Comparison:
    """A variant against a baseline, paired by seed (difference = variant - baseline, final loss)."""

    imbalance: float
    optimiser: str
    variant: str
    baseline: str
    lr: float              # the variant's rate
    baseline_lr: float     # the baseline's rate (the same on the grid, its own tuned rate otherwise)
    summary: PairedSummary
    test: SignedRankTest
    stable: bool           # no run of either arm unstable (on the grid: plain training stable at that rate)
    baseline_median: float  # the baseline's median final loss (over the pairs where both finished)
    diverged: int = 0           # runs of the variant that diverged (counted as its worst outcomes)
    baseline_diverged: int = 0  # the same for the baseline
    one_sided: int = 0          # pairs where exactly one of the two arms diverged
    holm_p: float = float("nan")
    largest_seed_difference: float = 0.0  # max over the finished pairs of |variant - baseline|
    largest_seed_relative: float = 0.0    # max over the finished pairs of |variant - baseline| / baseline

    @property
    def relative(self) -> float:
        """The median difference over the baseline's median final loss (negative: the variant ended lower)."""
        return self.summary.median_difference / self.baseline_median

    def significant(self, alpha: float = ALPHA) -> bool:
        """Holm-adjusted p-value at most ``alpha``: the difference survives the correction for its family."""
        return self.holm_p <= alpha


def compare(variant_rows: Sequence[Row], baseline_rows: Sequence[Row], *, divergence_is_worst: bool = False,
            **labels: Any) -> Comparison | None:
    """The paired comparison of two arms over the same seeds.

    By default None when a run of either arm diverged. With ``divergence_is_worst`` a diverged run counts as
    worse than every finished one: a pair where both diverged is a tie, a pair where one did ranks above every
    finished pair in the signed-rank test, and the median and its interval are taken over the pairs where both
    finished (at least two).
    """
    assert [r["seed"] for r in variant_rows] == [r["seed"] for r in baseline_rows], "arms not paired by seed"
    lost = np.array([r["diverged_at"] != "" for r in variant_rows])
    base_lost = np.array([r["diverged_at"] != "" for r in baseline_rows])
    if (lost.any() or base_lost.any()) and not divergence_is_worst:
        return None
    done = ~lost & ~base_lost
    if done.sum() < 2:
        return None
    a = np.array([float(r["final_loss"]) if r["final_loss"] else np.nan for r in variant_rows])
    b = np.array([float(r["final_loss"]) if r["final_loss"] else np.nan for r in baseline_rows])
    s = paired_summary(a[done], b[done], n_boot=N_BOOT, seed=0, tie=SAME_LOSS, relative_tie=True)
    one_sided = lost ^ base_lost
    gap = np.abs(a[done] - b[done])
    top = float(gap.max()) + 1.0  # above every finished pair's |difference|
    x = np.where(done, a, np.where(one_sided, np.where(lost, top, -top), 0.0))
    y = np.where(done, b, 0.0)
    t = signed_rank_test(x, y, tie=SAME_LOSS, relative_tie=True)
    return Comparison(summary=s, test=t, baseline_median=float(np.median(b[done])), diverged=int(lost.sum()),
                      baseline_diverged=int(base_lost.sum()), one_sided=int(one_sided.sum()),
                      largest_seed_difference=float(gap.max()), largest_seed_relative=float((gap / b[done]).max()), **labels)


def with_holm(comparisons: Sequence[Comparison]) -> list[Comparison]:
    """The comparisons, in their order, with Holm's adjusted p-value; one family per variant."""
    adjusted: dict[int, float] = {}
    for variant in {c.variant for c in comparisons}:
        members = [i for i, c in enumerate(comparisons) if c.variant == variant]
        adjusted.update(zip(members, holm([comparisons[i].test.p_value for i in members])))
    return [replace(c, holm_p=adjusted[i]) for i, c in enumerate(comparisons)]


def grid_comparisons(runs: Mapping[Key, list[Row]], settings: Mapping[str, Any]) -> list[Comparison]:
    """Every variant against plain training at the same rate, where neither diverged; Holm over the stable ones."""
    out = []
    for imbalance in map(float, settings["IMBALANCES"]):
        for opt, rates in settings["RATES"].items():
            for lr in map(float, rates):
                plain = runs[imbalance, opt, lr, "none"]
                for variant in COMPARED:
                    if (imbalance, opt, lr, variant) not in runs:
                        continue
                    c = compare(runs[imbalance, opt, lr, variant], plain, imbalance=imbalance, optimiser=opt,
                                variant=variant, baseline="none", lr=lr, baseline_lr=lr, stable=unstable(plain) == 0)
                    if c is not None:
                        out.append(c)
    stable = with_holm([c for c in out if c.stable])
    return stable + [c for c in out if not c.stable]


def transport_comparisons(runs: Mapping[Key, list[Row]], settings: Mapping[str, Any]) -> list[Comparison]:
    """Balancing with the state transported against balancing with it kept, at the same rate (plain stable there)."""
    out = []
    for imbalance in map(float, settings["IMBALANCES"]):
        for opt, rates in settings["RATES"].items():
            for lr in map(float, rates):
                key = (imbalance, opt, lr, "balance-transport")
                if key not in runs or unstable(runs[imbalance, opt, lr, "none"]):
                    continue
                c = compare(runs[key], runs[imbalance, opt, lr, "balance"], imbalance=imbalance, optimiser=opt,
                            variant="balance-transport", baseline="balance", lr=lr, baseline_lr=lr, stable=True)
                if c is not None:
                    out.append(c)
    return with_holm(out)


def tuned_comparisons(evaluation: Mapping[Key, list[Row]], rates: Mapping[tuple[float, str, str], float | None]
                      ) -> list[Comparison]:
    """Each variant at its tuned rate against plain training at its own, on the evaluation seeds; Holm per variant.

    Every pair of arms is compared, a diverged run counting as the worst outcome (``compare``).
    """
    out = []
    for (imbalance, opt, variant), lr in rates.items():
        base_lr = rates.get((imbalance, opt, "none"))
        if variant == "none" or lr is None or base_lr is None:
            continue
        mine, plain = evaluation[imbalance, opt, lr, variant], evaluation[imbalance, opt, base_lr, "none"]
        c = compare(mine, plain, divergence_is_worst=True, imbalance=imbalance, optimiser=opt, variant=variant,
                    baseline="none", lr=lr, baseline_lr=base_lr, stable=unstable(mine) == 0 and unstable(plain) == 0)
        if c is not None:
            out.append(c)
    return with_holm(out)


def edges(runs: Mapping[Key, list[Row]], settings: Mapping[str, Any]) -> dict[tuple[float, str], tuple[float | None, float | None]]:
    """{(imbalance, optimiser): (stability edge of plain training, first unstable rate of the grid or None)}."""
    out = {}
    for imbalance in map(float, settings["IMBALANCES"]):
        for opt, rates in settings["RATES"].items():
            edge = stability_edge(runs, imbalance, opt, rates)
            above = [float(lr) for lr in rates if edge is None or lr > edge]
            out[imbalance, opt] = (edge, above[0] if above else None)
    return out


def interval_counts(comparisons: Sequence[Comparison], variant: str, prefix: str | None = None) -> dict[str, int]:
    """Counts of the stable comparisons of ``variant`` whose interval lies below, above or across zero, in all and
    per optimiser, and how many survive Holm's correction; keys '<prefix>-better', '<prefix>-sgd-n', ..."""
    prefix = prefix or variant
    mine = [c for c in comparisons if c.variant == variant and c.stable]
    out = {f"{prefix}-stable-settings": len(mine), f"{prefix}-better": sum(c.summary.high < 0 for c in mine),
           f"{prefix}-worse": sum(c.summary.low > 0 for c in mine),
           f"{prefix}-unclear": sum(not c.summary.excludes_zero for c in mine),
           f"{prefix}-holm": sum(c.significant() for c in mine)}
    for opt in dict.fromkeys(c.optimiser for c in comparisons):
        theirs = [c for c in mine if c.optimiser == opt]
        out |= {f"{prefix}-{opt}-better": sum(c.summary.high < 0 for c in theirs),
                f"{prefix}-{opt}-worse": sum(c.summary.low > 0 for c in theirs), f"{prefix}-{opt}-n": len(theirs)}
    return out


def smallest_p(n_pairs: int) -> float:
    """The smallest two-sided p-value an exact paired rank test over ``n_pairs`` seeds can give: 2 / 2^n."""
    return 2.0 / 2 ** n_pairs


def _cell(c: Comparison | None) -> str:
    """One comparison in one table cell (the grid's): median difference [interval], p, Holm p, bold if it survives."""
    if c is None:
        return "diverged"
    text = " ".join(_columns(c))
    return f"**{text}**" if c.significant() else text


def _columns(c: Comparison) -> list[str]:
    """median difference [interval], exact p, Holm's p (or why not tested), and the diverged runs of both arms."""
    s = c.summary
    holm_text = "not tested (unstable)" if np.isnan(c.holm_p) else f"Holm {c.holm_p:.2g}"  # grid: plain unstable
    diverged_text = f"{c.diverged} / {c.baseline_diverged}" if c.diverged or c.baseline_diverged else ""
    return [f"{s.median_difference:+.3g}", f"[{s.low:+.3g}, {s.high:+.3g}]", f"p {c.test.p_value:.2g}", holm_text,
            diverged_text]


def grid_markdown(runs: Mapping[Key, list[Row]], settings: Mapping[str, Any], comparisons: Sequence[Comparison]) -> str:
    """The grid as a Markdown table: plain training's median final loss, and each variant minus plain."""
    from attnbook.tables import markdown_table

    found = {(c.imbalance, c.optimiser, c.lr, c.variant): c for c in comparisons}
    body = []
    for imbalance in map(float, settings["IMBALANCES"]):
        for opt, rates in settings["RATES"].items():
            for lr in map(float, rates):
                plain = runs[imbalance, opt, lr, "none"]
                head = "diverged" if diverged(plain) else f"{np.median(final_losses(plain)):.4g}"
                if unstable(plain):
                    head += f" (unstable {unstable(plain)}/{len(plain)})"
                body.append([f"{opt}, c = {imbalance:g}", f"{lr:g}", head]
                            + [_cell(found.get((imbalance, opt, lr, v))) if (imbalance, opt, lr, v) in runs else "-"
                               for v in COMPARED])
    return markdown_table(["optimiser, start", "rate", "plain: median"] + [f"{v} minus plain" for v in COMPARED], body,
                          right=(1,))


def comparisons_markdown(comparisons: Sequence[Comparison]) -> str:
    """Comparisons as a Markdown table, one quantity per column; rows that survive Holm's correction in bold."""
    from attnbook.tables import markdown_table

    body = []
    for c in comparisons:
        median, interval, p, holm_text, lost = _columns(c)
        row = [f"{NAMES.get(c.optimiser, c.optimiser)}, {SHORT[c.variant]}, c = {c.imbalance:g}", f"{c.lr:g}",
               f"{c.baseline_lr:g}", f"{c.baseline_median:.4g}", median, interval, f"{c.relative:+.0%}",
               p.removeprefix("p "), holm_text.removeprefix("Holm "), lost or "-"]
        body.append([f"**{x}**" for x in row] if c.significant() else row)
    return markdown_table(["optimiser, variant, start", "its rate", "plain's rate", "plain: median", "difference",
                           "95% interval", "relative", "p", "Holm p", "diverged"], body, right=(1, 2, 3, 4, 6, 7, 8))


def grid_figure(runs: Mapping[Key, list[Row]], settings: Mapping[str, Any],
                edge: Mapping[tuple[float, str], tuple[float | None, float | None]]):
    """Final loss against the rate, a panel per (start, optimiser): every seed's dot, the median line, crosses where
    runs diverged, the stability edge dotted."""
    import matplotlib.pyplot as plt

    imbalances, opts = [float(c) for c in settings["IMBALANCES"]], list(settings["RATES"])
    fig, axes = plt.subplots(len(imbalances), len(opts), figsize=(11, 2.8 * len(imbalances)), squeeze=False)
    for (i, imbalance), (j, opt) in ((a, b) for a in enumerate(imbalances) for b in enumerate(opts)):
        ax, rates = axes[i, j], np.array(settings["RATES"][opt], dtype=float)
        top = max(float(r["final_loss"]) for lr in rates for v in VARIANTS for r in runs.get((imbalance, opt, lr, v), ())
                  if r["final_loss"])
        for k, variant in enumerate(VARIANTS):
            if (imbalance, opt, rates[0], variant) in runs:
                _variant_curve(ax, [runs[imbalance, opt, lr, variant] for lr in rates], rates * np.exp(0.06 * (k - 1.5)),
                               top, f"C{k}", LABELS[variant], VARIANT_STYLES[k % len(VARIANT_STYLES)])
        if edge[imbalance, opt][0] is not None:
            ax.axvline(edge[imbalance, opt][0], color="0.3", ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(rates, [f"{lr:g}" for lr in rates], fontsize=7, rotation=45)
        ax.xaxis.set_minor_locator(plt.NullLocator())
        ax.yaxis.set_minor_formatter(plt.NullFormatter())
        ax.tick_params(axis="y", labelsize=7)
        ax.set_title(f"{opt}, start c = {imbalance:g}", fontsize=9)
        if i == len(imbalances) - 1:
            ax.set_xlabel("learning rate")
    for i in range(len(imbalances)):
        axes[i, 0].set_ylabel(f"loss after {settings['STEPS']} steps")
    handles, labels = axes[0, min(1, len(opts) - 1)].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=4, bbox_to_anchor=(0.5, -0.04))
    fig.tight_layout()
    return fig


VARIANT_STYLES = (("-", "o"), ("--", "s"), ("-.", "^"), (":", "D"))  # (median line, its marker) per variant


def _variant_curve(ax, per_rate: Sequence[Sequence[Row]], x: np.ndarray, top: float, color: str, label: str,
                   style: tuple[str, str] = VARIANT_STYLES[0]) -> None:
    """One variant in one panel: the seeds' final losses as dots, their median as a line (only where none diverged),
    drawn in the variant's line style and marker as well as its colour."""
    med = []
    for xi, rows in zip(x, per_rate):
        ok = [float(r["final_loss"]) for r in rows if r["final_loss"]]
        ax.plot(np.full(len(ok), xi), ok, ".", ms=2.5, color=color, alpha=0.6)
        if len(ok) < len(rows):
            ax.plot([xi], [top * 1.6], "x", ms=5, color=color)
        med.append(np.median(ok) if len(ok) == len(rows) else np.nan)
    ax.plot(x, med, style[0], marker=style[1], ms=3, mfc="none", color=color, lw=1.2, label=label)


def divergence_findings(table: Sequence[Row], settings: Mapping[str, Any]) -> dict[str, int]:
    """How many runs diverged: in all, in plain training, before and after the first balancing step, and the plain runs
    from the unbalanced start (all of them, and those that diverged after the first balancing step)."""
    at = [(float(r["imbalance"]), r["variant"], int(r["diverged_at"])) for r in table if r["diverged_at"]]
    first = settings["BALANCE_EVERY"]
    c_max = max(map(float, settings["IMBALANCES"]))
    return {"n-runs": len(table), "n-diverged": len(at), "max-diverged-at": max((s for *_, s in at), default=0),
            "n-diverged-plain": sum(v == "none" for _, v, _ in at),
            "n-diverged-early": sum(s < first for *_, s in at), "n-diverged-late": sum(s >= first for *_, s in at),
            "n-diverged-cmax-plain": sum(c == c_max and v == "none" for c, v, _ in at),
            "n-diverged-cmax-plain-late": sum(s >= first for c, v, s in at if c == c_max and v == "none")}


def edge_findings(edge: Mapping[tuple[float, str], tuple[float | None, float | None]],
                  settings: Mapping[str, Any]) -> dict[str, str]:
    """The glued text of each stability edge ('edge-3-sgd', 'unstable-3-sgd') and whether the grid crossed them all."""
    out = {}
    for (imbalance, opt), (e, above) in edge.items():
        out[f"edge-{imbalance:g}-{opt}"] = "none of the grid" if e is None else f"{e:g}"
        out[f"unstable-{imbalance:g}-{opt}"] = "none" if above is None else f"{above:g}"
    open_edges = sum(e is None or above is None for e, above in edge.values())
    out["edge-note"] = ("The grid crosses every edge: each (start, optimiser) has a stable and an unstable rate."
                        if not open_edges else
                        f"For {open_edges} (start, optimiser) pairs the grid did not cross the edge ('none' above).")
    return out
