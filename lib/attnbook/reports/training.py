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

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnid.train.stats import PairedSummary, paired_summary, round_up

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


def group_by(table: Sequence[Row], fields: Sequence[str], order: str = "seed") -> dict[tuple[str, ...], list[Row]]:
    """The rows grouped by ``fields`` (in order of first appearance), each group sorted by the integer column ``order``."""
    groups: dict[tuple[str, ...], list[Row]] = {}
    for r in table:
        groups.setdefault(tuple(r[f] for f in fields), []).append(r)
    return {k: sorted(v, key=lambda r: int(r[order])) for k, v in groups.items()}


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

def adam_step_bound(beta1: float, beta2: float, step: int | None = None) -> float:
    """The largest |update| / learning rate of bias-corrected Adam with eps = 0, over every gradient sequence of one
    coordinate: at ``step`` t (1, 2, ...), or with ``step=None`` the supremum over all steps.

    Cauchy-Schwarz on m_t = (1 - b1) sum_k b1^k g_(t-k) against v_t = (1 - b2) sum_k b2^k g_(t-k)^2, k < t:
    |m_t| <= (1 - b1) sqrt(sum_k (b1^2 / b2)^k) sqrt(v_t / (1 - b2)), with equality when g_(t-k) is proportional
    to (b1 / b2)^k. The bias corrections multiply by sqrt(1 - b2^t) / (1 - b1^t). Step 1 gives 1 (the sign of the
    gradient); the bound rises towards its supremum (1 - b1) / sqrt((1 - b2) (1 - b1^2 / b2)) as t grows
    (Kingma and Ba's section 2.1 gives (1 - b1) / sqrt(1 - b2) as a rough bound; it can be exceeded). A positive
    eps only shrinks the step.
    """
    rho = beta1**2 / beta2
    if not (0 <= beta1 < 1 and 0 < beta2 < 1 and rho < 1):
        raise ValueError(f"need 0 <= beta1 < 1, 0 < beta2 < 1 and beta1^2 < beta2; got {beta1!r}, {beta2!r}")
    if step is None:
        return (1 - beta1) / math.sqrt((1 - beta2) * (1 - rho))
    if step < 1:
        raise ValueError(f"Adam's steps count from 1; got {step!r}")
    return (1 - beta1) / (1 - beta1**step) * math.sqrt((1 - beta2**step) / (1 - beta2) * (1 - rho**step) / (1 - rho))


def adam_extremal_gradients(beta1: float, beta2: float, steps: int, scale: float = 1e-150) -> np.ndarray:
    """The gradient sequence g_s = scale (b2 / b1)^s, s < steps, whose last Adam step meets ``adam_step_bound(steps)``
    (the equality case of its Cauchy-Schwarz). ``scale`` keeps g^2 inside float64's range for a few thousand steps."""
    if not 0 < beta1:
        raise ValueError(f"the extremal sequence needs beta1 > 0; got {beta1!r}")
    return scale * (beta2 / beta1) ** np.arange(steps, dtype=np.float64)


def adam_update_sizes(grads: Sequence[float], beta1: float, beta2: float) -> np.ndarray:
    """|update| / learning rate of torch's Adam (eps = 0) on one float64 coordinate fed ``grads``, step by step."""
    import torch  # noqa: PLC0415 (only this check runs an optimiser)

    p = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([p], lr=1.0, betas=(beta1, beta2), eps=0.0)
    sizes = []
    for g in grads:
        before = p.detach().clone()
        p.grad = torch.tensor([float(g)], dtype=torch.float64)
        opt.step()
        sizes.append(abs(float(p.detach() - before)))
    return np.array(sizes)


NEVER_MOVED = 1e-13  # float64: a relative change of the key bias below this is round-off


def kb_setting(optimiser: str, lr: float, decay: float = 0.0, sink: bool = False) -> str:
    """The name key_bias.ipynb gives a setting, e.g. 'adamw lr=0.01 decay=0.5'."""
    return f"{optimiser} lr={lr:g} decay={decay:g}" + (" sink" if sink else "")


def key_bias_markdown(kb_runs: Mapping[tuple[str, ...], Sequence[Row]]) -> str:
    """Per setting and dtype: the key bias's distance from its prediction, or its norm ratio where none exists."""
    body = []
    for (name, dtype), rs in kb_runs.items():
        if rs[0]["deviation"] == "":
            ratio = column(rs, "final_ratio")
            body.append([name, dtype, "-", "-", f"{np.median(ratio):.3f} [{ratio.min():.3f}, {ratio.max():.3f}]"])
            continue
        d, per = column(rs, "deviation"), column(rs, "deviation_per_coordinate_over_lr_steps")
        body.append([name, dtype, f"{np.median(d):.2e} [{d.min():.2e}, {d.max():.2e}]", f"{np.median(per):.2e}", "-"])
    header = ["setting", "dtype", "\\|b_K(T) - predicted\\| / \\|b_K(0)\\|: median [min, max]", "per coordinate / (lr T)",
              "no prediction: \\|b_K(T)\\| / \\|b_K(0)\\|"]
    return markdown_table(header, body)


def deviations(kb_runs: Mapping[tuple[str, ...], Sequence[Row]]) -> dict[tuple[str, ...], np.ndarray]:
    """Per (setting, dtype) with a prediction, each seed's relative distance of b_K(T) from it."""
    return {k: column(rs, "deviation") for k, rs in kb_runs.items() if rs[0]["deviation"] != ""}


def per_step_drift(kb_runs: Mapping[tuple[str, ...], Sequence[Row]], name: str, dtype: str = "float32") -> float:
    """The median over seeds of the drift per coordinate over lr x steps, of one setting."""
    return float(np.median(column(kb_runs[name, dtype], "deviation_per_coordinate_over_lr_steps")))


def key_bias_findings(kb_runs: Mapping[tuple[str, ...], Sequence[Row]], kp: Mapping[str, Any],
                      *, n_boot: int = N_BOOT) -> tuple[dict[str, Any], dict[str, PairedSummary]]:
    """The glued values of the key-bias section, and float32 minus float64 for Adam and AdamW at the middle rate."""
    dev, mid, rates = deviations(kb_runs), kp["ADAM_RATES"][len(kp["ADAM_RATES"]) // 2], kp["ADAM_RATES"]
    names = {"adam": kb_setting("adam", mid), "adamw": kb_setting("adamw", mid, kp["KEY_BIAS_DECAY"])}
    found: dict[str, Any] = {"kb-seeds": kp["SEEDS"], "kb-steps": kp["STEPS"]}
    comparisons = {}
    for label, name in names.items():
        s = comparisons[label] = paired_summary(dev[name, "float32"], dev[name, "float64"], n_boot=n_boot, seed=0)
        found |= {f"kb-{label}-f64": float(np.median(dev[name, "float64"])),
                  f"kb-{label}-f32": float(np.median(dev[name, "float32"])),
                  f"kb-{label}-f32-min": float(dev[name, "float32"].min()),
                  f"kb-{label}-f32-max": float(dev[name, "float32"].max()),
                  f"kb-{label}-f32-larger": s.losses, f"kb-{label}-diff-low": s.low, f"kb-{label}-diff-high": s.high}
    per_step = [per_step_drift(kb_runs, kb_setting("adam", lr)) for lr in rates]
    sgd, sink = kb_setting("sgd", kp["SGD_LR"]), column(kb_runs[kb_setting("sgd", kp["SGD_LR"], sink=True), "float64"],
                                                        "final_ratio")
    found |= {"kb-mid-lr": mid, "kb-lr-slope": lr_slope(kb_runs, rates), "kb-per-step-min": min(per_step),
              "kb-per-step-max": max(per_step), "kb-rates": ", ".join(f"{lr:g}" for lr in rates),
              "adamw-bias-left": (1 - mid * kp["KEY_BIAS_DECAY"]) ** kp["STEPS"],
              "sgd-bias-max": round_up(float(dev[sgd, "float64"].max())),
              "sgd-bias-f32-max": round_up(float(dev[sgd, "float32"].max())),
              "sink-bias-ratio-min": float(sink.min()), "sink-bias-ratio-max": float(sink.max()),
              "kb-l2-loss-min": float(l2_losses(kb_runs, kp).min()),
              "kb-free-loss-max": float(column(kb_runs[sgd, "float64"], "final_loss").max()),
              "kb-decay": kp["KEY_BIAS_DECAY"]}
    return found, comparisons


def lr_slope(kb_runs: Mapping[tuple[str, ...], Sequence[Row]], rates: Sequence[float]) -> float:
    """float32 Adam without decay: the log-log slope of the absolute drift per coordinate against the rate."""
    absolute = np.array([per_step_drift(kb_runs, kb_setting("adam", lr)) * lr for lr in rates])
    return float(np.polyfit(np.log(np.array(rates)), np.log(absolute), 1)[0])


def l2_losses(kb_runs: Mapping[tuple[str, ...], Sequence[Row]], kp: Mapping[str, Any]) -> np.ndarray:
    """The final losses of the runs whose L2 penalty reaches the key bias (SGD and Adam with decay)."""
    names = [kb_setting("sgd", kp["SGD_LR"], kp["KEY_BIAS_DECAY"]), kb_setting("adam", kp["L2_ADAM_LR"], kp["KEY_BIAS_DECAY"])]
    return np.concatenate([column(kb_runs[n, "float64"], "final_loss") for n in names])


def key_bias_figure(curve: Sequence[Row], kb_runs: Mapping[tuple[str, ...], Sequence[Row]], kp: Mapping[str, Any]):
    """Left: the key bias's norm along training against its prediction. Right: its drift per seed against the rate."""
    import matplotlib.pyplot as plt  # noqa: PLC0415 (the figures only)

    mid, rates, decay = kp["ADAM_RATES"][len(kp["ADAM_RATES"]) // 2], kp["ADAM_RATES"], kp["KEY_BIAS_DECAY"]
    fig, axes = plt.subplots(2, 1, figsize=(6.4, 8.2))  # stacked, legends under the data they describe
    shown = [kb_setting("sgd", kp["SGD_LR"], decay), kb_setting("adamw", mid, decay), kb_setting("adam", mid),
             kb_setting("adam", kp["L2_ADAM_LR"], decay), kb_setting("sgd", kp["SGD_LR"], sink=True)]
    for i, name in enumerate(shown):
        for dtype, style in (("float64", "-"), ("float32", "--")):
            rs = [r for r in curve if r["setting"] == name and r["dtype"] == dtype]
            steps = [int(r["step"]) for r in rs]
            axes[0].plot(steps, column(rs, "median_ratio"), style, color=f"C{i}", lw=1.2,
                         label=name if dtype == "float64" else None)
            axes[0].fill_between(steps, column(rs, "min_ratio"), column(rs, "max_ratio"), color=f"C{i}", alpha=0.15, lw=0)
        if rs[0]["predicted"] not in ("", "1"):
            axes[0].plot(steps, column(rs, "predicted"), "k:", lw=1)
    axes[0].plot([], [], "k:", lw=1, label="$(1 - \\eta\\lambda)^t$")
    axes[0].plot([], [], "k--", lw=1, label="float32 (solid: float64)")
    axes[0].set(xlabel="step", ylabel="$\\|b_K(t)\\| / \\|b_K(0)\\|$", title="norm of the key bias (median, min-max band)")
    axes[0].legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=2)
    for j, (optimiser, marker) in enumerate((("adam", "o"), ("adamw", "s"))):
        for k, dtype in enumerate(("float64", "float32")):
            for lr in rates:
                y = column(kb_runs[kb_setting(optimiser, lr, decay if optimiser == "adamw" else 0.0), dtype],
                           "deviation_per_coordinate_over_lr_steps")
                x = lr * np.exp(np.linspace(-0.08, 0.08, y.size) + (0.12 if j else -0.12))
                axes[1].loglog(x, np.maximum(y, 1e-17), marker, ms=3, color=f"C{2 * j + k}", alpha=0.8,
                               label=f"{optimiser}, {dtype}" if lr == rates[0] else None)
    axes[1].axhline(1.0, color="k", lw=0.8, ls="-", label="every step lr, same sign")
    axes[1].axhline(kp["STEPS"] ** -0.5, color="k", lw=0.8, ls=":", label="every step lr, random signs")
    axes[1].set_xticks(rates, [f"{lr:g}" for lr in rates])
    axes[1].minorticks_off()
    axes[1].set(xlabel="learning rate", ylabel="$|b_K(T) - $predicted$| / (\\sqrt{n}\\, \\eta T)$",
                title="drift of the dead key bias, one point per seed")
    axes[1].legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=2)
    for ax in axes:
        ax.title.set_fontsize(9)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- rate x width: the share against chance, and stability


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
