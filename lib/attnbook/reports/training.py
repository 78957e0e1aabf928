"""Chapter 11's report on the training runs: invisible shares, float32 against float64, and conservation.

The runs are ``experiments/training_shares.ipynb``'s (``data/experiments/invisible_shares*.csv`` and
``conservation.csv``); no experiment imports this module, so editing it never makes their data stale.
A run's key is (task, layout, optimiser, gradient, dtype): gradient is ``"loss"`` for training and
``"random"`` for the same optimiser fed isotropic noise (the baseline a share is compared with).

Every comparison pairs two measurements seed by seed (``attnid.train.stats.paired_summary``): the median
difference, its bootstrap interval and the seeds below / level (within ``SHARE_TIE``) / above. The
functions return summaries and the dicts of values the prose glues; the chapter asserts what it says.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnid.train.stats import PairedSummary, group_by, paired_summary, round_up

from attnbook.tables import markdown_table

N_BOOT = 10_000     # bootstrap resamples of every paired comparison (seeded)
SHARE_TIE = 0.005   # two shares closer than this count as level in below/level/above
ZERO_SHARE = 1e-10  # float64: below this a share is rounding, not motion
NAMES = {"sgd": "SGD", "momentum": "momentum", "adam": "Adam", "adamw": "AdamW"}

Row = Mapping[str, str]
Key = tuple[str, str, str, str, str]  # (task, layout, optimiser, gradient, dtype)
Setting = tuple[str, str, str]        # (task, layout, optimiser)
Problem = tuple[str, str]             # (task, layout)


def column(rows: Sequence[Row], name: str) -> np.ndarray:
    """One numeric column of a list of CSV rows."""
    return np.array([float(r[name]) for r in rows])


def group_runs(table: Sequence[Row]) -> dict[Key, list[Row]]:
    """The share runs by (task, layout, optimiser, gradient, dtype), sorted by seed."""
    return group_by(table, ("task", "layout", "optimiser", "gradient", "dtype"))  # type: ignore[return-value]


def settings(runs: Mapping[Key, Sequence[Row]]) -> list[Setting]:
    """The (task, layout, optimiser) settings trained in float64 on the loss, in the order of the data."""
    return list(dict.fromkeys(k[:3] for k in runs if k[3:] == ("loss", "float64")))


def problems(runs: Mapping[Key, Sequence[Row]]) -> list[Problem]:
    """The (task, layout) problems, in the order of the data."""
    return list(dict.fromkeys(s[:2] for s in settings(runs)))


def drift(rows: Sequence[Row]) -> np.ndarray:
    """Per run, the drift of both conserved quantities at the end (C_QK's plus C_VO's)."""
    return column(rows, "drift_qk") + column(rows, "drift_vo")


# ---------------------------------------------------------------- shares against chance and noise


@dataclass(frozen=True)
class Chance:
    """A problem's orbit and its chance level: the share of an isotropic update (``attnid.train.stats.chance_share``)."""

    mean: float
    rms: float
    tangent_dim: int
    parameters: int


@dataclass(frozen=True)
class ShareResult:
    """One setting's median shares per seed, against chance and (when run) against the random-gradient arm."""

    task: str
    layout: str
    optimiser: str
    chance: Chance
    shares: np.ndarray                 # per seed, the median share over the measured steps
    vs_chance: PairedSummary           # shares minus the chance mean
    random: np.ndarray | None = None   # the same optimiser fed noise, per seed
    vs_random: PairedSummary | None = None


@dataclass(frozen=True)
class Span:
    """The subspace a share is measured against, as the CSV's columns name it."""

    share: str        # per run, the median share over the measured steps
    largest: str      # per run, the largest share of a measured step
    chance_mean: str
    chance_rms: str
    dim: str          # its dimension u at the initial point


ORBIT = Span("median_share", "max_share", "chance_mean", "chance_rms", "tangent_dim")  # the layer's orbit
MODEL = Span("median_model_share", "max_model_share", "model_chance_mean", "model_chance_rms", "model_dim")  # all the model cannot see


def chance_levels(runs: Mapping[Key, Sequence[Row]], span: Span = ORBIT) -> dict[Problem, Chance]:
    """Each problem's chance level against ``span``, checked to be the same in every seed and optimiser.

    Problems whose rows leave ``span.dim`` empty (the model adds nothing to the orbit) are left out.
    """
    levels: dict[Problem, Chance] = {}
    for task, layout, opt in settings(runs):
        rs = runs[task, layout, opt, "loss", "float64"]
        if not rs[0].get(span.dim):
            continue
        if len({(r[span.dim], r["parameters"]) for r in rs}) != 1:
            raise ValueError(f"{task} {layout} {opt}: the tangent dimension differs between seeds ({span.dim})")
        r = rs[0]
        levels[task, layout] = Chance(float(r[span.chance_mean]), float(r[span.chance_rms]), int(r[span.dim]),
                                      int(r["parameters"]))
    return levels


def share_results(runs: Mapping[Key, Sequence[Row]], span: Span = ORBIT, *, n_boot: int = N_BOOT,
                  tie: float = SHARE_TIE) -> list[ShareResult]:
    """Every float64 setting's shares against ``span``'s chance and, where run, against its random-gradient arm."""
    levels, results = chance_levels(runs, span), []
    for task, layout, opt in settings(runs):
        if (task, layout) not in levels:
            continue
        chance = levels[task, layout]
        real = column(runs[task, layout, opt, "loss", "float64"], span.share)
        vs_chance = paired_summary(real, np.full_like(real, chance.mean), n_boot=n_boot, seed=0, tie=tie)
        random = vs_random = None
        if (task, layout, opt, "random", "float64") in runs:
            random = column(runs[task, layout, opt, "random", "float64"], span.share)
            vs_random = paired_summary(real, random, n_boot=n_boot, seed=0, tie=tie)
        results.append(ShareResult(task, layout, opt, chance, real, vs_chance, random, vs_random))
    return results


def interval_text(s: PairedSummary, spec: str = "+.3f") -> str:
    """'median [low, high]' of a paired summary, each at the format ``spec``."""
    return f"{s.median_difference:{spec}} [{s.low:{spec}}, {s.high:{spec}}]"


def counts_text(s: PairedSummary) -> str:
    """The seeds below / level / above, as 'b/l/a'."""
    return f"{s.wins}/{s.ties}/{s.losses}"


def shares_markdown(results: Sequence[ShareResult]) -> str:
    """The main table of the shares: one row per (problem, optimiser)."""
    body = []
    for r in results:
        random = [interval_text(r.vs_random), counts_text(r.vs_random)] if r.vs_random else ["-", "-"]
        body.append([r.task, r.layout, str(r.chance.tangent_dim), str(r.chance.parameters),
                     f"{r.chance.mean:.3f}", r.optimiser,
                     f"{np.median(r.shares):.3g} [{r.shares.min():.2g}, {r.shares.max():.2g}]",
                     interval_text(r.vs_chance), counts_text(r.vs_chance), *random])
    header = ["task", "layout", "u", "P", "chance", "optimiser", "median share [min, max]",
              "minus chance: median [95% interval]", "-/=/+", "minus random-gradient run", "-/=/+"]
    return markdown_table(header, body, right=(2, 3, 4))


def share_findings(runs: Mapping[Key, Sequence[Row]], results: Sequence[ShareResult]) -> dict[str, Any]:
    """What the prose says of the shares: run counts, chance range, and the Adam-like and momentum settings."""
    loss = {k: v for k, v in runs.items() if k[3:] == ("loss", "float64")}
    adam = [r for r in results if r.optimiser in ("adam", "adamw")]
    momentum = [r for r in results if r.optimiser == "momentum"]
    noise = [r for r in results if r.vs_random is not None]
    if not (adam and momentum and noise):
        raise ValueError("the share findings need Adam or AdamW, momentum and random-gradient settings")
    chances = [r.chance.mean for r in results]
    median = lambda rs: [float(np.median(r.shares)) for r in rs]
    noise_medians = [float(np.median(r.random)) for r in noise]
    return {
        "boot-level": results[0].vs_chance.level,
        "share-runs": sum(len(v) for v in loss.values()),
        "sgd-share-runs": sum(len(v) for k, v in loss.items() if k[2] == "sgd"),
        "chance-min": min(chances), "chance-max": max(chances),
        "adam-share-min": min(median(adam)), "adam-share-max": max(median(adam)), "adam-settings": len(adam),
        "adam-below-chance": sum(r.vs_chance.high < 0 for r in adam),
        "adam-above-chance": sum(r.vs_chance.low > 0 for r in adam),
        "adam-minus-chance-min": min(r.vs_chance.median_difference for r in adam),
        "adam-minus-chance-max": max(r.vs_chance.median_difference for r in adam),
        "adam-below-random": sum(r.vs_random.high < 0 for r in noise),
        "adam-above-random": sum(r.vs_random.low > 0 for r in noise),
        "adam-minus-random-min": min(r.vs_random.median_difference for r in noise),
        "adam-minus-random-max": max(r.vs_random.median_difference for r in noise),
        "random-share-min": min(noise_medians), "random-share-max": max(noise_medians),
        "momentum-share-min": min(median(momentum)), "momentum-share-max": max(median(momentum)),
        "momentum-below-chance": sum(r.vs_chance.high < 0 for r in momentum), "momentum-settings": len(momentum),
    }


def momentum_peaks(curve_table: Sequence[Row], results: Sequence[ShareResult]) -> dict[str, Any]:
    """Momentum's peak: per problem the largest median-over-seeds share of a measured step (float64, loss gradients),
    the step it was at, and the problems where that peak lies above the mean chance share."""
    chance = {(r.task, r.layout): r.chance.mean for r in results}
    peaks: dict[Problem, tuple[float, int]] = {}
    for r in curve_table:
        if (r["optimiser"], r["gradient"], r["dtype"]) == ("momentum", "loss", "float64"):
            key, value = (r["task"], r["layout"]), (float(r["median"]), int(r["step"]))
            peaks[key] = max(peaks.get(key, value), value)
    above = [(k, v) for k, v in peaks.items() if v[0] > chance[k]]
    return {"momentum-peak-step-max": max(step for _, step in peaks.values()),
            "momentum-peak-above": len(above), "momentum-peak-problems": len(peaks),
            "momentum-peak-above-where": "; ".join(f"{task} {layout}: {v[0]:.2f} at step {v[1]} against {chance[task, layout]:.2f}"
                                                   for (task, layout), v in above) or "none"}


def largest_sgd_share(runs: Mapping[Key, Sequence[Row]], dtype: str = "float64", span: Span = ORBIT) -> float:
    """The largest share against ``span`` any SGD step took in ``dtype`` (exact gradients: zero up to rounding)."""
    return max(float(column(v, span.largest).max()) for k, v in runs.items()
               if k[2] == "sgd" and k[3:] == ("loss", dtype) and v[0].get(span.largest))


def model_findings(orbit: Sequence[ShareResult], model: Sequence[ShareResult]) -> dict[str, Any]:
    """What the prose says of the copy task against its model's span: Adam-like shares against chance and noise, beside the orbit's."""
    if not model:
        raise ValueError("no setting was measured against the model's span")
    by_setting = {(r.task, r.layout, r.optimiser): r for r in orbit}
    adam = [r for r in model if r.optimiser in ("adam", "adamw")]
    noise = [r for r in adam if r.vs_random is not None]
    if not (adam and noise):
        raise ValueError("the model findings need Adam or AdamW settings with a random-gradient arm")
    ratio = lambda r: float(np.median(r.shares)) / r.chance.mean
    return {
        "model-chance": model[0].chance.mean, "model-u": model[0].chance.tangent_dim,
        "model-adam-min": min(float(np.median(r.shares)) for r in adam),
        "model-adam-max": max(float(np.median(r.shares)) for r in adam),
        "model-adam-ratio-min": min(ratio(r) for r in adam), "model-adam-ratio-max": max(ratio(r) for r in adam),
        "orbit-adam-ratio-min": min(ratio(by_setting[r.task, r.layout, r.optimiser]) for r in adam),
        "orbit-adam-ratio-max": max(ratio(by_setting[r.task, r.layout, r.optimiser]) for r in adam),
        "model-adam-below-chance": sum(r.vs_chance.high < 0 for r in adam), "model-adam-settings": len(adam),
        "model-adam-below-random": sum(r.vs_random.high < 0 for r in noise), "model-noise-settings": len(noise),
        "model-random-min": min(float(np.median(r.random)) for r in noise),
        "model-random-max": max(float(np.median(r.random)) for r in noise),
    }


def share_figure(curve_table: Sequence[Row], runs: Mapping[Key, Sequence[Row]], optimisers: Sequence[str]):
    """The share along training per problem: median and 10-90% band, trained and noise-fed, against chance."""
    import matplotlib.pyplot as plt  # noqa: PLC0415 (the figures only)

    curves = group_by(curve_table, ("task", "layout", "optimiser", "gradient", "dtype"), order="step")
    levels = chance_levels(runs)
    rows = -(-len(levels) // 2)  # two panels a row: each wide enough to read in the column and on a phone
    fig, grid = plt.subplots(rows, 2, figsize=(6.6, 2.7 * rows + 0.9), sharey=True, squeeze=False)
    axes = grid.ravel()
    for ax in axes[len(levels):]:
        ax.set_visible(False)
    for ax, (task, layout) in zip(axes, levels):
        for i, opt in enumerate(optimisers):
            for gradient, style in (("loss", "-"), ("random", "--")):
                rs = curves.get((task, layout, opt, gradient, "float64"), [])
                if not rs:
                    continue
                steps = [int(r["step"]) for r in rs]
                label = opt if gradient == "loss" else f"{opt}, random gradient"
                ax.plot(steps, column(rs, "median"), style, color=f"C{i}", lw=1.1, label=label)
                ax.fill_between(steps, column(rs, "q10"), column(rs, "q90"), color=f"C{i}", alpha=0.18, lw=0)
        ax.axhline(levels[task, layout].mean, color="k", lw=1, ls=":", label="chance (isotropic)")
        ax.set_title(f"{task}\n{layout}", fontsize=8)
        ax.set_xlabel("step")
    for ax in grid[:, 0]:
        ax.set_ylabel("invisible share")
    axes[0].set_ylim(0, 0.65)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0.8 / (2.7 * rows + 0.9), 1, 1))  # the bottom 0.8 in for the legend
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=3)
    return fig


# ---------------------------------------------------------------- float32 against float64


@dataclass(frozen=True)
class PrecisionResult:
    """One setting run in float32 and float64 on the same seeds (SGD: the largest float32 share only)."""

    task: str
    layout: str
    optimiser: str
    float32_median: float            # SGD: the largest share of any float32 step
    difference: PairedSummary | None  # float32 minus float64, per seed (None for SGD)


def precision_results(runs: Mapping[Key, Sequence[Row]], *, n_boot: int = N_BOOT, tie: float = SHARE_TIE) -> list[PrecisionResult]:
    """Every setting that was also run in float32, paired with its float64 run seed by seed."""
    results = []
    for task, layout, opt in settings(runs):
        single = runs.get((task, layout, opt, "loss", "float32"))
        if single is None:
            continue
        if opt == "sgd":
            results.append(PrecisionResult(task, layout, opt, float(column(single, "max_share").max()), None))
            continue
        a, b = column(single, "median_share"), column(runs[task, layout, opt, "loss", "float64"], "median_share")
        results.append(PrecisionResult(task, layout, opt, float(np.median(a)),
                                       paired_summary(a, b, n_boot=n_boot, seed=0, tie=tie)))
    return results


def precision_markdown(results: Sequence[PrecisionResult]) -> str:
    """float32 against float64: the float32 median share and the paired difference per setting."""
    body = []
    for r in results:
        if r.difference is None:
            body.append([r.task, r.layout, r.optimiser, f"largest share {r.float32_median:.1e} "
                         f"(float64: < {ZERO_SHARE:.0e})", "-", "-"])
        else:
            body.append([r.task, r.layout, r.optimiser, f"{r.float32_median:.3f}",
                         interval_text(r.difference, "+.1e"), counts_text(r.difference)])
    header = ["task", "layout", "optimiser", "float32 median share", "float32 minus float64: median [95% interval]",
              "-/=/+"]
    return markdown_table(header, body)


def precision_findings(results: Sequence[PrecisionResult]) -> dict[str, Any]:
    """What the prose says of float32: SGD's largest share, and how far the others' medians move."""
    paired = [r.difference for r in results if r.difference is not None]
    return {"sgd-float32-max": max(r.float32_median for r in results if r.optimiser == "sgd"),
            "f32-settings": len(paired),
            "f32-diff-max": round_up(max(abs(s.median_difference) for s in paired), 2),
            "f32-excludes-zero": sum(s.excludes_zero for s in paired)}


# ---------------------------------------------------------------- the drift of the conserved quantities


@dataclass(frozen=True)
class StepSizeDrift:
    """Gradient descent at fixed time t = eta x steps: per seed, the drift at each step size, and its log-log slope."""

    per_seed: dict[int, tuple[np.ndarray, np.ndarray]]  # seed -> (step sizes, drift), by step size
    slopes: np.ndarray                                  # per seed, d log drift / d log eta


def step_size_drift(table: Sequence[Row]) -> StepSizeDrift:
    """The drift of C_QK + C_VO against the step size, per seed, and each seed's fitted slope."""
    pairs: dict[int, list[tuple[float, float]]] = {}
    for r in table:
        pairs.setdefault(int(r["seed"]), []).append((float(r["step_size"]), float(r["drift_qk"]) + float(r["drift_vo"])))
    per_seed = {s: tuple(map(np.array, zip(*sorted(p)))) for s, p in sorted(pairs.items())}
    slopes = np.array([np.polyfit(np.log(eta), np.log(d), 1)[0] for eta, d in per_seed.values()])
    return StepSizeDrift(per_seed, slopes)  # type: ignore[arg-type]


def drift_by_optimiser(runs: Mapping[Key, Sequence[Row]], optimisers: Sequence[str]) -> dict[Problem, dict[str, np.ndarray]]:
    """Per problem and optimiser, each seed's drift at the end of training (float64, loss gradients)."""
    return {(task, layout): {o: drift(runs[task, layout, o, "loss", "float64"]) for o in optimisers}
            for task, layout in problems(runs)}


def separated(drifts: Mapping[str, np.ndarray]) -> bool:
    """Every other optimiser's smallest drift above SGD's largest, on one problem."""
    return all(d.min() > drifts["sgd"].max() for o, d in drifts.items() if o != "sgd")


def drift_markdown(by_problem: Mapping[Problem, Mapping[str, np.ndarray]]) -> str:
    """The drift at the end of training: median [min, max] over seeds, per problem and optimiser."""
    optimisers = list(next(iter(by_problem.values())))
    body = [[task, layout, *(f"{np.median(d[o]):.2e} [{d[o].min():.2e}, {d[o].max():.2e}]" for o in optimisers),
             "yes" if separated(d) else "no"] for (task, layout), d in by_problem.items()]
    header = ["task", "layout", *optimisers, "every seed of the others above SGD's largest"]
    return markdown_table(header, body)


def drift_findings(cons: StepSizeDrift, by_problem: Mapping[Problem, Mapping[str, np.ndarray]],
                   share_table: Sequence[Row], flow_time: float, rates: Mapping[str, float],
                   copy_rates: Mapping[str, float]) -> dict[str, Any]:
    """What the prose says of the drift: SGD's slope in eta, the rates, and the optimisers' separation."""
    slopes = cons.slopes
    named = lambda rs: ", ".join(f"{NAMES[o]} {lr:g}" for o, lr in rs.items())
    return {"flow-time": flow_time, "drift-seeds": len(slopes), "drift-slope": float(np.median(slopes)),
            "drift-slope-min": float(slopes.min()), "drift-slope-max": float(slopes.max()),
            "rates-ts": named(rates), "rates-copy": named(copy_rates),
            "ch9-runs": len(share_table), "ch9-diverged": sum(r["diverged_at"] != "" for r in share_table),
            "drift-separated": sum(separated(d) for d in by_problem.values()), "drift-problems": len(by_problem)}


def conservation_figure(cons: StepSizeDrift, drifts: Mapping[str, np.ndarray], layout: str, steps: int):
    """Left: SGD's drift against the step size at fixed time. Right: each optimiser's drift, every seed."""
    import matplotlib.pyplot as plt  # noqa: PLC0415 (the figures only)

    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.4))
    for i, (etas, d) in enumerate(cons.per_seed.values()):
        axes[0].loglog(etas, d, "o-", color="C0", ms=2.5, lw=0.7, alpha=0.6,
                       label="measured, one line per seed" if i == 0 else None)
    axes[0].loglog(etas, d[-1] * etas / etas[-1], ":", color="0.3", label="slope 1")
    axes[0].set(xlabel="step size $\\eta$", ylabel="drift at $t = \\eta \\times$ steps", title="gradient descent, fixed time")
    axes[0].set_xticks(etas, [f"{e:g}" for e in etas])
    axes[0].minorticks_off()
    axes[0].legend(fontsize=7)
    for i, d in enumerate(drifts.values()):
        axes[1].semilogy(np.full(d.size, i) + np.linspace(-0.15, 0.15, d.size), d, "o", ms=3, color=f"C{i}")
    axes[1].set_xticks(range(len(drifts)), list(drifts))
    axes[1].set(ylabel=f"drift after {steps} steps", title=f"each optimiser, every seed, {layout}")
    for ax in axes:
        ax.title.set_fontsize(9)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- the dead key bias (experiments/key_bias.ipynb)


# ---------------------------------------------------------------- rate x width: the share against chance, and stability


