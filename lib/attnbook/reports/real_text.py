"""Chapter 13's report on the real-text runs: shares per part of the invisible subspace, drift, dead parameters, rebalancing.

The runs are ``experiments/real_text.ipynb``'s (``data/experiments/real_text_*.csv``); no experiment
imports this module, so editing it never makes their data stale. Every interval is the seeded
percentile bootstrap of a median (``attnid.train.stats.median_interval``) at the chapter's level; a
paired comparison is ``attnid.train.stats.paired_summary``. Each ``*_findings`` function returns the values
the prose glues (an interval ``name`` comes with ``name-low`` and ``name-high``); the chapter
asserts what it says in words.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnid.train import stats

from attnbook.tables import markdown_table

NAMES = ("corpus", "loss", "shares", "drift", "dead")  # the tables: data/experiments/real_text_<name>.csv
KIND_LABELS = {"model": "all the model cannot see", "total": "the layer's orbit", "query_key": "GL(d_k) part",
               "value_output": "GL(d_v) part", "key_bias": "key-bias shift", "value_bias": "b_V/b_O trade",
               "input": "mean: W_Q, W_K, W_V", "output": "mean: W_O, b_O"}
DEAD_LABELS = {"key_bias": "dead key bias", "input_mean": "mean directions of W_Q, W_K, W_V",
               "output_mean": "mean directions of W_O, b_O"}
OPTIMISERS = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD", "momentum": "SGD with momentum"}
RUN_FIELDS = ("STEPS", "LAYERS", "D_MODEL", "HEADS", "KV_HEADS", "SEQ_LEN", "BATCH", "LR", "WEIGHT_DECAY",
              "BALANCE_EVERY", "SHARES_EVERY", "MEASURE_EVERY", "VAL_WINDOWS", "TIE_NATS", "CONTROL_LR", "LONG_STEPS",
              "LONG_EVAL_EVERY", "PLATEAU_WINDOW", "PLATEAU_NATS")

Row = Mapping[str, str]

# The experiment's configuration for one GPU (chapter 13 states it, the experiment's header points here): the
# book's other parameters unchanged, a model about 35 times larger, and a long pair of GPU_PASSES passes over the
# training text. No share measurement: the directions attnid.train.spans projects on are built dense (gigabytes per layer at this size).
GPU_RUN = {"LAYERS": 6, "D_MODEL": 256, "HEADS": 8, "KV_HEADS": 2, "SEQ_LEN": 256, "BATCH": 64, "SHARES_EVERY": 0}
GPU_PASSES = 2


def gpu_parameters(train_bytes: int) -> dict[str, int]:
    """``GPU_RUN`` with LONG_STEPS: the steps of ``GPU_PASSES`` passes over ``train_bytes`` bytes of training text, rounded up."""
    if train_bytes < 1:
        raise ValueError(f"train_bytes must be positive, got {train_bytes!r}")
    return GPU_RUN | {"LONG_STEPS": -(-GPU_PASSES * train_bytes // (GPU_RUN["BATCH"] * GPU_RUN["SEQ_LEN"]))}


def gpu_command(parameters: Mapping[str, int]) -> str:
    """The ``make`` command that runs the real-text experiment with ``parameters`` on a CUDA device."""
    overrides = " ".join(f"-p {name}={value}" for name, value in parameters.items())
    return f'make experiments DEVICE=cuda ARGS="--only experiments/real_text.ipynb {overrides}"'


@dataclass(frozen=True)
class Bootstrap:
    """The chapter's bootstrap: its level and number of resamples."""

    level: float = 0.95
    resamples: int = 10_000

    def interval(self, values: Sequence[float]) -> tuple[float, float, float]:
        """(median, low, high): the median of ``values`` and its percentile bootstrap interval."""
        low, high = stats.median_interval(values, level=self.level, n_boot=self.resamples)
        return float(np.median(values)), low, high

    def findings(self, name: str, values: Sequence[float]) -> dict[str, float]:
        """``name``, ``name-low``, ``name-high``: the median and its interval, for the prose."""
        med, low, high = self.interval(values)
        return {name: med, name + "-low": low, name + "-high": high}

    def paired(self, a: Sequence[float], b: Sequence[float], tie: float = 0.0) -> stats.PairedSummary:
        """a minus b, paired by seed."""
        return stats.paired_summary(a, b, tie=tie, level=self.level, n_boot=self.resamples)


def setup_findings(corpus: Row, run: Mapping[str, Any], boot: Bootstrap) -> dict[str, Any]:
    """The corpus and the run's settings, as the prose names them."""
    found: dict[str, Any] = {
        "rt-package": corpus["package"], "rt-version": corpus["version"], "rt-files": int(corpus["files"]),
        "rt-mbytes": int(corpus["bytes"]) / 1e6, "rt-val-mbytes": int(corpus["validation_bytes"]) / 1e6,
        "rt-sha": corpus["sha256"][:16], "rt-seeds": len(run["SEEDS"]), "rt-f64-seeds": run["FLOAT64_SEEDS"]}
    found |= {"rt-" + key.lower().replace("_", "-"): run[key] for key in RUN_FIELDS}
    window_bytes = run["BATCH"] * run["SEQ_LEN"] / int(corpus["train_bytes"])  # one step's share of a pass
    found |= {"rt-passes": run["STEPS"] * window_bytes, "rt-long-passes": run["LONG_STEPS"] * window_bytes,
              "rt-control-optimiser": OPTIMISERS[run["CONTROL_OPTIMISER"]]}
    return found | {"rt-optimiser": OPTIMISERS[run["OPTIMISER"]],
                    "rt-rope-dims": int(run["ROPE_FRACTION"] * run["D_MODEL"] // run["HEADS"]),
                    "rt-head-dim": run["D_MODEL"] // run["HEADS"], "rt-level": round(100 * boot.level)}


# ---------------------------------------------------------------- shares per part of the orbit


Part = tuple[int, str]  # (layer, kind)


@dataclass
class Shares:
    """Every measured share, of plain training and of the optimiser fed random gradients (the baseline)."""

    plain: dict[Part, list[tuple[int, int, float]]] = field(default_factory=lambda: defaultdict(list))  # (seed, step, share)
    noise: dict[Part, list[tuple[int, int, float]]] = field(default_factory=lambda: defaultdict(list))
    chance: dict[Part, float] = field(default_factory=dict)
    orbit_dim: dict[str, int] = field(default_factory=dict)  # kind -> u
    parameters: int = 0

    @property
    def steps(self) -> list[int]:
        """The measured steps."""
        return sorted({s for v in self.plain.values() for _, s, _ in v})

    @property
    def later(self) -> list[int]:
        """The measured steps after step 0 (Adam's first step is sign(g) x lr: shown, not pooled)."""
        return [s for s in self.steps if s > 0]

    def parts(self, layers: int) -> list[Part]:
        """The (layer, kind) parts that were measured, layer by layer in KIND_LABELS order."""
        return [(layer, kind) for layer in range(layers) for kind in KIND_LABELS if (layer, kind) in self.plain]

    def seed_medians(self, part: Part, noise: bool = False) -> np.ndarray:
        """Per seed, the median share over the later steps (of plain training, or of the noise-fed arm)."""
        by_seed: dict[int, list[float]] = defaultdict(list)
        for seed, step, value in (self.noise if noise else self.plain)[part]:
            if step > 0:
                by_seed[seed].append(value)
        return np.array([np.median(by_seed[s]) for s in sorted(by_seed)])

    def curves(self, part: Part, seeds: Sequence[int], noise: bool = False) -> np.ndarray:
        """seeds x steps: every share along training."""
        rows = sorted((self.noise if noise else self.plain)[part])
        return np.array([[v for s, _, v in rows if s == seed] for seed in seeds])


def read_shares(table: Sequence[Row]) -> Shares:
    """The shares table, checked to have one orbit dimension per kind and one parameter count."""
    sh, dims, params = Shares(), defaultdict(set), set()
    for r in table:
        part = (int(r["layer"]), r["kind"])
        arm = {"plain": sh.plain, "random-gradient": sh.noise}[r["arm"]]
        arm[part].append((int(r["seed"]), int(r["step"]), float(r["share"])))
        sh.chance[part] = float(r["chance"])
        dims[r["kind"]].add(int(r["span_dim"]))
        params.add(int(r["params"]))
    if len(params) != 1 or any(len(v) != 1 for v in dims.values()):
        raise ValueError(f"the span dimension or parameter count differs between rows: {params}, {dict(dims)}")
    if set(sh.noise) != set(sh.plain):
        raise ValueError("every (layer, part) needs its random-gradient baseline")
    sh.orbit_dim = {k: v.pop() for k, v in dims.items()}
    sh.parameters = params.pop()
    return sh


def span_findings(sh: Shares, outside: Mapping[str, int]) -> dict[str, Any]:
    """The dimensions the model cannot see per attention layer (orbit, mean directions, all) and outside attention."""
    dims, p = sh.orbit_dim, sh.parameters
    return ({f"rt-u-{k.replace('_', '-')}": u for k, u in dims.items()} | {"rt-p": p}
            | {"rt-chance-orbit": (dims["total"] / p) ** 0.5, "rt-chance-model": (dims["model"] / p) ** 0.5,
               "rt-outside-total": sum(outside.values())})


def span_markdown(sh: Shares, outside: Mapping[str, int], across: Mapping[str, int] | None = None) -> str:
    """Where the model's invariant directions are: per attention layer by kind, then each block outside attention,
    then ``across``: {what: dimension} of the moves of several blocks at once (no chance share: no layer's alone)."""
    body = [["each attention layer", KIND_LABELS[k], str(sh.orbit_dim[k]), f"{(sh.orbit_dim[k] / sh.parameters) ** 0.5:.3f}"]
            for k in ("total", "input", "output", "model")]
    body += [[block, "mean directions" + (" and the logit shift" if block == "unembed" else ""), str(u), ""]
             for block, u in outside.items()]
    body += [["every block at once", what, str(u), ""] for what, u in (across or {}).items()]
    return markdown_table(["block", "directions", "dimension", "chance share"], body, right=(2, 3))


def _tag(prefix: str, part: Part) -> str:
    return f"{prefix}-{part[0]}-{part[1].replace('_', '-')}"


def share_findings(sh: Shares, layers: int, boot: Bootstrap) -> tuple[dict[str, Any], dict[Part, stats.PairedSummary]]:
    """The glued share values (per part: against chance and against the noise-fed arm), and plain minus noise-fed."""
    parts = sh.parts(layers)
    found: dict[str, Any] = {}
    vs_noise = {}
    for part in parts:
        med, fed, chance = sh.seed_medians(part), sh.seed_medians(part, noise=True), sh.chance[part]
        s = vs_noise[part] = boot.paired(med, fed)  # wins: the real update's share is lower
        tag, ntag = _tag("rt-share", part), _tag("rt-noise", part)
        found |= boot.findings(tag, med) | {tag + "-chance": chance, tag + "-ratio": float(np.median(med)) / chance,
                                            tag + "-below": int((med < chance).sum())}
        found |= boot.findings(ntag, fed) | {ntag + "-ratio": float(np.median(fed)) / chance,
                                             ntag + "-diff": s.median_difference, ntag + "-diff-low": s.low,
                                             ntag + "-diff-high": s.high, ntag + "-lower": s.wins}
    below = sum(bool((sh.seed_medians(p) < sh.chance[p]).all()) for p in parts)
    above = sum(bool((sh.seed_medians(p) > sh.chance[p]).all()) for p in parts)
    first = np.array([v for layer in range(layers) for _, s, v in sh.plain[layer, "model"] if s == 0])
    later = sh.later
    found |= {"rt-share-combos": len(parts), "rt-share-all-below": below, "rt-share-all-above": above,
              "rt-share-steps": len(later), "rt-share-first": later[0], "rt-share-last": later[-1],
              "rt-share-step0-min": float(first.min()), "rt-share-step0-max": float(first.max()),
              "rt-noise-n": next(iter(vs_noise.values())).n,
              "rt-noise-below": sum(s.high < 0 for s in vs_noise.values()),
              "rt-noise-above": sum(s.low > 0 for s in vs_noise.values())}
    ratios = noise_ratios(sh, layers)
    return found | {"rt-noise-ratio-min": min(ratios), "rt-noise-ratio-max": max(ratios)}, vs_noise


def noise_ratios(sh: Shares, layers: int) -> list[float]:
    """Per part, the noise-fed arm's median share over its chance level (1: at chance)."""
    return [float(np.median(sh.seed_medians(p, noise=True))) / sh.chance[p] for p in sh.parts(layers)]


def shares_markdown(sh: Shares, vs_noise: Mapping[Part, stats.PairedSummary]) -> str:
    """Per layer and part: the share against chance and against the noise-fed arm."""
    body = []
    for part, s in vs_noise.items():
        med, fed, chance = sh.seed_medians(part), sh.seed_medians(part, noise=True), sh.chance[part]
        body.append([str(part[0]), KIND_LABELS[part[1]], f"{np.median(med):.3f}", f"{chance:.3f}",
                     f"{(med < chance).sum()}/{len(med)}", f"{np.median(fed):.3f} ({np.median(fed) / chance:.2f} x chance)",
                     f"{s.median_difference:+.4f} [{s.low:+.4f}, {s.high:+.4f}]", f"{s.wins}/{s.n}"])
    header = ["layer", "part", "median share", "chance", "seeds below chance", "noise-fed median share",
              "plain minus noise-fed: median [interval]", "seeds plain lower"]
    return markdown_table(header, body, right=(0, 2, 3))


LAYER_MARKERS = (("o", "^"), ("s", "v"))  # (loss gradients, random gradients) per layer: shape as well as colour


def shares_figure(sh: Shares, seeds: Sequence[int], layers: int):
    """Top: the share on everything the model cannot see along training, every seed. Bottom: each part's median share per seed."""
    import matplotlib.pyplot as plt  # noqa: PLC0415 (the figures only)

    fig, axes = plt.subplots(2, 1, figsize=(6.4, 7.0))
    ax = axes[0]
    for layer in range(layers):
        part, steps = (layer, "model"), np.array(sh.steps) + 4 * layer
        vals = sh.curves(part, seeds)
        ax.plot(np.repeat(steps[None], len(seeds), 0).ravel(), vals.ravel(), LAYER_MARKERS[layer % 2][0],
                color=f"C{layer}", alpha=0.35, ms=3, mfc="none" if layer % 2 else None)
        ax.plot(steps, np.median(vals, 0), "-", color=f"C{layer}", lw=1.5, label=f"layer {layer}, median")
        ax.plot(steps, np.median(sh.curves(part, seeds, noise=True), 0), ":", color=f"C{layer}", lw=1.5,
                label=f"layer {layer}, random gradients, median")
        ax.axhline(sh.chance[part], color=f"C{layer}", ls="--", lw=1,
                   label=f"chance sqrt(u/P) = {sh.chance[part]:.3f}" if layer == 0 else None)
    ax.set(xlabel="step", ylabel="invisible share of the update")
    ax.set_ylim(0, None)
    ax.legend(fontsize=7, loc="lower right", ncol=2)
    ax.set_title("everything the model cannot see, every seed", fontsize=9)
    ax = axes[1]
    kinds = [k for k in KIND_LABELS if (0, k) in sh.plain]
    for layer in range(layers):
        for i, kind in enumerate(kinds):
            med, fed, x = sh.seed_medians((layer, kind)), sh.seed_medians((layer, kind), noise=True), i + (layer - 0.5) * 0.3
            loss_marker, noise_marker = LAYER_MARKERS[layer % 2]
            ax.plot(np.full(len(med), x), med, loss_marker, color=f"C{layer}", ms=3, alpha=0.6,
                    label=f"layer {layer}, one mark per seed" if i == 0 else None)
            ax.plot(np.full(len(fed), x), fed, noise_marker, mfc="none", color=f"C{layer}", ms=3, alpha=0.6,
                    label=f"layer {layer}, random gradients" if i == 0 else None)
            ax.plot([x - 0.12, x + 0.12], [sh.chance[layer, kind]] * 2, "k-", lw=1.5,
                    label="chance" if (i, layer) == (0, 0) else None)
    ax.set_yscale("log")
    ax.set_xticks(range(len(kinds)), [KIND_LABELS[k] for k in kinds], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("median share over steps > 0")
    ax.legend(fontsize=7, loc="lower left", ncol=2)
    ax.set_title("each part", fontsize=9)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- drift of the conserved quantities

DRIFT_COLUMNS = ("c_qk", "c_vo", "gram_qk", "gram_vo", "c_qk_beyond_decay", "c_vo_beyond_decay",
                 "gram_qk_beyond_decay", "gram_vo_beyond_decay")
Run = tuple[str, str, int, int]  # (arm, dtype, seed, layer)


def read_steps(table: Sequence[Row], columns: Sequence[str], part: str | None = None) -> dict[Run, dict[int, tuple[float, ...]]]:
    """(arm, dtype, seed, layer) -> {step: the values of ``columns``}; with ``part``, only that part's rows."""
    out: dict[Run, dict[int, tuple[float, ...]]] = defaultdict(dict)
    for r in table:
        if part is None or r["part"] == part:
            out[r["arm"], r["dtype"], int(r["seed"]), int(r["layer"])][int(r["step"])] = tuple(float(r[k]) for k in columns)
    return out


def last_step(by_run: Mapping[Run, Mapping[int, Any]]) -> int:
    """The last measured step (the same in every run)."""
    last = {max(v) for v in by_run.values()}
    if len(last) != 1:
        raise ValueError(f"the runs were measured to different steps: {sorted(last)}")
    return last.pop()


def drift_ratios(drift: Mapping[Run, Mapping[int, tuple[float, ...]]], arm: str, dtype: str, seeds: Sequence[int],
                 layers: int) -> np.ndarray:
    """seeds x layers x (QK, VO): C's final drift beyond decay over its Gram matrices' drift."""
    last = last_step(drift)
    return np.array([[[drift[arm, dtype, seed, layer][last][j + 4] / drift[arm, dtype, seed, layer][last][j + 6]
                       for j in range(2)] for layer in range(layers)] for seed in seeds])


def drift_findings(drift: Mapping[Run, Mapping[int, tuple[float, ...]]], dtype: str, seeds: Sequence[int],
                   layers: int, boot: Bootstrap, arm: str = "plain", prefix: str = "rt-drift") -> tuple[dict[str, Any], str]:
    """The final drift of C_QK and C_VO per layer, raw and beyond weight decay, over its Gram matrices' drift."""
    last = last_step(drift)
    found: dict[str, Any] = {f"{prefix}-step": last + 1}
    ratios, body = [], []
    for layer in range(layers):
        finals = np.array([drift[arm, dtype, seed, layer][last] for seed in seeds])
        for j, side in enumerate(("qk", "vo")):
            tag = f"{prefix}-{layer}-{side}"
            values = {"": finals[:, j], "-gram": finals[:, j + 2], "-ratio": finals[:, j] / finals[:, j + 2],
                      "-nd": finals[:, j + 4], "-nd-gram": finals[:, j + 6], "-nd-ratio": finals[:, j + 4] / finals[:, j + 6]}
            for suffix, v in values.items():
                found |= boot.findings(tag + suffix, v)
            ratio = values["-nd-ratio"]
            ratios.append(ratio)
            body.append([str(layer), f"C_{side.upper()}", f"{np.median(values['-nd']):.3g}",
                         f"{np.median(values['-nd-gram']):.3g}",
                         f"{np.median(ratio):.3f} [{ratio.min():.3f}, {ratio.max():.3f}]",
                         f"{np.median(values['-ratio']):.3f}"])
    every = np.concatenate(ratios)
    found |= {f"{prefix}-nd-ratio-min": float(every.min()), f"{prefix}-nd-ratio-max": float(every.max())}
    header = ["layer", "quantity", "drift beyond decay", "its Gram matrices' drift", "ratio: median [min, max]",
              "ratio, decay included"]
    return found, markdown_table(header, body, right=(0, 2, 3))


def control_findings(drift: Mapping[Run, Mapping[int, tuple[float, ...]]], dtype: str, seeds: Sequence[int], layers: int,
                     boot: Bootstrap, control: str = "sgd") -> tuple[dict[str, Any], str]:
    """The conservation control, per (layer, side): minibatch SGD's drift ratio against AdamW's, paired by seed.

    Per part: both arms' median ratio over seeds, the median over seeds of SGD / AdamW with its bootstrap interval
    (resampling seeds), and the seeds where SGD's ratio is the higher; and in how many parts SGD's absolute drift of C
    beyond decay (median over seeds) is the lower. Parts are not pooled: they differ in kind.
    Returns the glued values and a table.
    """
    sgd = drift_ratios(drift, control, dtype, seeds, layers)    # seeds x layers x (QK, VO)
    adamw = drift_ratios(drift, "plain", dtype, seeds, layers)
    found: dict[str, Any] = {"rt-sgd-ratio-max": float(sgd.max()), "rt-adamw-ratio-min": float(adamw.min()),
                             "rt-sgd-below": int((sgd.reshape(len(seeds), -1).max(1) < adamw.reshape(len(seeds), -1).min(1)).sum())}
    last = last_step(drift)
    absolute = lambda arm, layer, j: np.array([drift[arm, dtype, seed, layer][last][j + 4] for seed in seeds])  # C beyond decay
    body, below, above, lower = [], [], [], 0
    for layer in range(layers):
        for j, side in enumerate(("qk", "vo")):
            lower += int(np.median(absolute(control, layer, j)) < np.median(absolute("plain", layer, j)))
            tag, ratio = f"{layer}-{side}", sgd[:, layer, j] / adamw[:, layer, j]
            part = boot.findings(f"rt-sgd-over-adamw-{tag}", ratio)
            found |= part | {f"rt-sgd-ratio-{tag}": float(np.median(sgd[:, layer, j])),
                             f"rt-adamw-ratio-{tag}": float(np.median(adamw[:, layer, j])),
                             f"rt-sgd-higher-{tag}": int((ratio > 1).sum())}
            name = f"layer {layer}, C_{side.upper()}"
            (below if part[f"rt-sgd-over-adamw-{tag}-high"] < 1 else above if part[f"rt-sgd-over-adamw-{tag}-low"] > 1 else []).append(name)
            body.append([name, f"{np.median(adamw[:, layer, j]):.3f}", f"{np.median(sgd[:, layer, j]):.3f}",
                         f"{np.median(ratio):.2f} [{part[f'rt-sgd-over-adamw-{tag}-low']:.2f}, {part[f'rt-sgd-over-adamw-{tag}-high']:.2f}]",
                         f"{int((ratio > 1).sum())} of {len(seeds)}"])
    found |= {"rt-sgd-parts": 2 * layers, "rt-sgd-abs-lower": lower, "rt-sgd-parts-below": len(below), "rt-sgd-parts-above": len(above),
              "rt-sgd-parts-below-where": "; ".join(below) or "none", "rt-sgd-parts-above-where": "; ".join(above) or "none"}
    header = ["part", "AdamW: median ratio", "SGD: median ratio", f"SGD / AdamW per seed: median [{boot.level:.0%}]",
              "seeds with SGD higher"]
    return found, markdown_table(header, body, right=(1, 2, 3, 4))


def drift_figure(drift: Mapping[Run, Mapping[int, tuple[float, ...]]], dtype: str, seeds: Sequence[int], layers: int,
                 arms: Sequence[tuple[str, str]] = (("plain", "AdamW"), ("sgd", "minibatch SGD"))):
    """Per arm, C_QK and C_VO beyond decay along training against their Gram matrices' drift: median and range."""
    import matplotlib.pyplot as plt  # noqa: PLC0415 (the figures only)

    fig, axes = plt.subplots(len(arms), 2, figsize=(6.4, 3.0 * len(arms)), sharey=True, squeeze=False)
    for row, (arm, name) in zip(axes, arms):
        for j, (ax, side) in enumerate(zip(row, ("QK", "VO"))):
            for layer in range(layers):
                steps = np.array(sorted(drift[arm, dtype, seeds[0], layer])) + 1
                c = np.array([[drift[arm, dtype, seed, layer][s - 1][j + 4] for s in steps] for seed in seeds])
                g = np.array([[drift[arm, dtype, seed, layer][s - 1][j + 6] for s in steps] for seed in seeds])
                mark = dict(marker=LAYER_MARKERS[layer % 2][0], ms=3, markevery=max(1, len(steps) // 6))
                ax.plot(steps, np.median(c, 0), "-", color=f"C{layer}", label=f"layer {layer}: C", **mark)
                ax.fill_between(steps, c.min(0), c.max(0), color=f"C{layer}", alpha=0.2, lw=0)
                ax.plot(steps, np.median(g, 0), "--", color=f"C{layer}", label=f"layer {layer}: its Gram matrices",
                        mfc="none", **mark)
                ax.fill_between(steps, g.min(0), g.max(0), color=f"C{layer}", alpha=0.1, lw=0)
            ax.set_yscale("log")
            ax.set_xlabel("step")
            ax.set_title(f"{name}: C_{side}", fontsize=9)
        row[0].set_ylabel("drift beyond decay / norm^2(0)")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=2, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


# ---------------------------------------------------------------- the parameters the loss cannot see

DEAD_COLUMNS = ("moved", "beyond_decay", "rms_step_over_lr")


def dead_findings(dead: Mapping[str, Mapping[Run, Mapping[int, tuple[float, ...]]]], dtype: str, run: Mapping[str, Any],
                  boot: Bootstrap) -> tuple[dict[str, Any], str]:
    """Per dead part (``DEAD_LABELS``), in ``dtype`` and in float64: its drift beyond weight decay and the size of a step."""
    found: dict[str, Any] = {}
    body = []
    for part, by_run in dead.items():
        last = last_step(by_run)
        tag = "rt-dead-" + part.replace("_", "-")
        cells = [DEAD_LABELS[part]]
        for precision, name in ((dtype, "32"), ("float64", "64")):
            keys = [k for k in by_run if k[0] == "plain" and k[1] == precision]
            beyond = np.array([by_run[k][last][1] for k in keys])
            rms = np.array([by_run[k][last][2] for k in keys])
            found |= (boot.findings(f"{tag}-beyond{name}", beyond) | boot.findings(f"{tag}-rms{name}", rms)
                      | {f"{tag}-beyond{name}-min": float(beyond.min()), f"{tag}-beyond{name}-max": float(beyond.max()),
                         f"{tag}-rms{name}-max": float(rms.max()), f"{tag}-runs{name}": len(keys)})
            cells += [f"{np.median(beyond):.2e} [{beyond.min():.1e}, {beyond.max():.1e}]", f"{np.median(rms):.2e}"]
        found[f"{tag}-step0"] = float(np.median([by_run[k][0][2] for k in by_run if k[:2] == ("plain", dtype)]))
        control = [by_run[k][last][1] for k in by_run if k[0] == "sgd"]  # the minibatch-SGD control (no decay)
        if control:
            found[f"{tag}-sgd-max"] = stats.round_up(float(max(control)))  # "at most" stays true when printed
        body.append(cells)
    found |= {"rt-dead-step": last + 1, "rt-bias-decay-only": 1 - (1 - run["LR"] * run["WEIGHT_DECAY"]) ** (last + 1)}
    header = ["part", f"{dtype}: drift beyond decay, median [min, max]", f"{dtype}: rms step / lr",
              "float64: drift beyond decay, median [min, max]", "float64: rms step / lr"]
    return found, markdown_table(header, body)


def dead_figure(dead: Mapping[str, Mapping[Run, Mapping[int, tuple[float, ...]]]], dtypes: Sequence[str]):
    """Per dead part (a row), every plain run's drift beyond decay (left) and rms step over the rate (right)."""
    import matplotlib.pyplot as plt  # noqa: PLC0415 (the figures only)

    fig, axes = plt.subplots(len(dead), 2, figsize=(6.4, 2.6 * len(dead)), squeeze=False)
    for row, (part, by_run) in zip(axes, dead.items()):
        for dtype, color, style in zip(dtypes, ("#D55E00", "#0072B2"), ("-", "--")):
            keys = [k for k in by_run if k[0] == "plain" and k[1] == dtype]
            steps = np.array(sorted(by_run[keys[0]])) + 1
            for i, k in enumerate(keys):
                for j in range(2):
                    row[j].plot(steps, [by_run[k][s - 1][j + 1] for s in steps], style, color=color, lw=0.7, alpha=0.5,
                                label=f"{dtype}, {len(keys)} runs" if i == 0 else None)
        row[0].set_ylabel("beyond decay / norm(0)", fontsize=8)
        row[1].set_ylabel("rms step / lr", fontsize=8)
        for ax in row:
            ax.set_yscale("log")
            ax.set_title(DEAD_LABELS[part], fontsize=9)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=2, frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


# ---------------------------------------------------------------- rebalancing against plain training


