"""Chapter 13's report on rebalancing the real-text model against plain training: final losses, ties, the plateau."""

from __future__ import annotations
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any
import numpy as np
from attnid.train import stats
from attnid.train.multitest import signed_rank_test
from attnbook.reports.real_text import Bootstrap, Row


def read_losses(table: Sequence[Row]) -> dict[tuple[str, int], dict[int, float]]:
    """(arm, seed) -> {step: validation loss}."""
    val: dict[tuple[str, int], dict[int, float]] = defaultdict(dict)
    for r in table:
        val[r["arm"], int(r["seed"])][int(r["step"])] = float(r["val_loss"])
    return val


def rebalance_findings(val: Mapping[tuple[str, int], Mapping[int, float]], run: Mapping[str, Any],
                       boot: Bootstrap, long: bool = False) -> tuple[dict[str, Any], stats.PairedSummary]:
    """The final validation loss, balanced minus plain, paired by seed (a tie within TIE_NATS); ``long``: the long pair."""
    seeds, steps = run["SEEDS"], run["LONG_STEPS" if long else "STEPS"]
    arms, tag = (("long-plain", "long-balanced"), "rt-long") if long else (("plain", "balanced"), "rt")
    plain = [val[arms[0], s][steps] for s in seeds]
    balanced = [val[arms[1], s][steps] for s in seeds]
    s = boot.paired(balanced, plain, tie=run["TIE_NATS"])
    diverged = [k for k, v in val.items() if k[0] in arms and not all(np.isfinite(list(v.values())))]
    return (boot.findings(f"{tag}-val-plain", plain)
            | {f"{tag}-rb-median": s.median_difference, f"{tag}-rb-low": s.low, f"{tag}-rb-high": s.high,
               f"{tag}-rb-wins": s.wins, f"{tag}-rb-ties": s.ties, f"{tag}-rb-losses": s.losses, f"{tag}-rb-n": s.n,
               f"{tag}-rb-rel": float(np.median(np.array(balanced) / np.array(plain) - 1)),
               f"{tag}-rb-p": signed_rank_test(balanced, plain, tie=run["TIE_NATS"]).p_value,  # exact, two-sided
               f"{tag}-diverged": len(diverged)}), s


def plateau_findings(val: Mapping[tuple[str, int], Mapping[int, float]], run: Mapping[str, Any]) -> dict[str, Any]:
    """The plateau rule on the long plain runs: how far the median seed's validation loss fell over the last window.

    (The rule's window and threshold are glued with the run's settings, ``setup_findings``.)
    """
    steps, window = run["LONG_STEPS"], run["PLATEAU_WINDOW"]
    curves = {t: float(np.median([val["long-plain", s][t] for s in run["SEEDS"]])) for t in val["long-plain", run["SEEDS"][0]]}
    if steps - window not in curves:
        raise ValueError(f"no validation loss at step {steps - window}: the plateau window must be a multiple of LONG_EVAL_EVERY")
    fall = curves[steps - window] - curves[steps]
    return {"rt-plateau-fall": fall, "rt-plateau-start": curves[min(curves)], "rt-plateau-end": curves[steps],
            "rt-plateau-reached": bool(fall < run["PLATEAU_NATS"])}


def rebalance_figure(val: Mapping[tuple[str, int], Mapping[int, float]], seeds: Sequence[int], tie: float,
                     arms: tuple[str, str] = ("plain", "balanced")):
    """Top: the validation loss of both arms. Bottom: balanced minus plain per seed, with the tie band."""
    import matplotlib.pyplot as plt  # noqa: PLC0415 (the figures only)

    steps = sorted(val[arms[0], seeds[0]])
    fig, axes = plt.subplots(2, 1, figsize=(6.4, 6.4))  # stacked: the difference gets its own full-width panel
    ax = axes[0]
    for k, (arm, name, style, marker) in enumerate(((arms[0], "plain", "-", None), (arms[1], "balanced", "--", "o"))):
        curves = np.array([[val[arm, s][t] for t in steps] for s in seeds])
        ax.plot(steps, np.median(curves, 0), style, marker=marker, ms=3, markevery=max(1, len(steps) // 8),
                color=f"C{k}", label=f"{name}: median")
        ax.fill_between(steps, curves.min(0), curves.max(0), color=f"C{k}", alpha=0.2, lw=0)
    ax.set(xlabel="step", ylabel="validation loss (nats per byte)",
           title="both arms: the medians almost coincide (the difference is below)")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7)
    ax = axes[1]
    diffs = np.array([[val[arms[1], s][t] - val[arms[0], s][t] for t in steps] for s in seeds])
    for i in range(len(seeds)):
        ax.plot(steps, diffs[i], "-", color="C2", lw=0.7, alpha=0.5, label="one seed" if i == 0 else None)
    ax.plot(steps, np.median(diffs, 0), "-", color="k", lw=1.5, label="median")
    ax.axhline(0, color="grey", lw=0.8)
    ax.axhspan(-tie, tie, color="grey", alpha=0.15, lw=0, label="tie band")
    ax.set(xlabel="step", ylabel="balanced - plain")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
