"""Chapter 11's report on the dead key bias (``experiments/key_bias.ipynb``): how far each optimiser moves it, and Adam's step bound."""

from __future__ import annotations
import math
from collections.abc import Mapping, Sequence
from typing import Any
import numpy as np
from attnid.train.stats import PairedSummary, paired_summary, round_up
from attnbook.tables import markdown_table
from attnbook.reports.training import N_BOOT, Row, column


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
