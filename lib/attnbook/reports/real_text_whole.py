"""Chapter 13's report on the whole-model share of the real-text model's updates (experiments/real_text_whole.ipynb)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from attnbook.reports.real_text import Bootstrap, Row
from attnbook.tables import markdown_table

ARMS = ("adamw", "random-gradient", "sgd")
SHARED = ("SEEDS", "DTYPE", "CORPUS_SHA256", "LAYERS", "D_MODEL", "HEADS", "KV_HEADS", "ROPE_FRACTION", "BIAS",
          "SEQ_LEN", "BATCH", "STEPS", "OPTIMISER", "LR", "WEIGHT_DECAY", "CONTROL_OPTIMISER", "CONTROL_LR")


def same_settings(whole: Mapping[str, Any], real: Mapping[str, Any]) -> list[str]:
    """The settings in which the two experiments differ (none, or the comparison is not of the same runs)."""
    return [k for k in SHARED if whole.get(k) != real.get(k)]


def per_seed(shares: Sequence[Row], arm: str, column: str = "whole") -> dict[int, float]:
    """seed -> the median over that seed's measured steps after the first of ``column`` (the first step is special:
    Adam's first update is close to the sign of its gradient, as in the per-layer shares)."""
    steps: dict[int, list[float]] = {}
    for r in shares:
        if r["arm"] == arm and int(r["step"]) > 0:
            steps.setdefault(int(r["seed"]), []).append(float(r[column]))
    return {seed: float(np.median(v)) for seed, v in sorted(steps.items())}


def whole_findings(spans: Sequence[Row], shares: Sequence[Row], boot: Bootstrap) -> tuple[dict[str, Any], str]:
    """The glued numbers (prefix rtw-) and a Markdown table: per arm, the median share against E and against the
    blocks' own span alone, each with its interval over seeds, beside the chance level sqrt(u / P)."""
    u = {int(r["seed"]): (int(r["u_whole"]), int(r["u_blocks"]), int(r["parameters"])) for r in spans}
    if len(set(u.values())) != 1:
        raise ValueError(f"the span's dimensions differ between seeds' initial points: {sorted(set(u.values()))}")
    u_whole, u_blocks, p = next(iter(u.values()))
    found: dict[str, Any] = {"rtw-u-whole": u_whole, "rtw-u-blocks": u_blocks, "rtw-u-rotations": u_whole - u_blocks,
                             "rtw-p": p, "rtw-chance": (u_whole / p) ** 0.5, "rtw-chance-blocks": (u_blocks / p) ** 0.5}
    rows = []
    for arm in ARMS:
        whole, blocks = per_seed(shares, arm), per_seed(shares, arm, "blocks")
        if len(whole) < 2:
            raise ValueError(f"arm {arm!r}: {len(whole)} seeds, a median interval needs at least 2")
        found |= boot.findings(f"rtw-{arm}", list(whole.values())) | boot.findings(f"rtw-{arm}-blocks", list(blocks.values()))
        found[f"rtw-{arm}-seeds"] = len(whole)
        found[f"rtw-{arm}-max"] = max(whole.values())
        found[f"rtw-{arm}-ratio"] = found[f"rtw-{arm}"] / found["rtw-chance"]
        found[f"rtw-{arm}-first"] = float(np.median([float(r["whole"]) for r in shares
                                                     if r["arm"] == arm and int(r["step"]) == 0]))
        rows.append([arm, str(len(whole)), *(f"{found[f'rtw-{arm}{k}']:.3g}" for k in ("", "-low", "-high", "-blocks"))])
    table = markdown_table(("arm", "seeds", "share of E", "low", "high", "blocks only"), rows, right=range(1, 6))
    return found, table


def paired_with_noise(shares: Sequence[Row], boot: Bootstrap) -> dict[str, Any]:
    """AdamW's whole-model share minus the noise-fed AdamW's, paired by seed: median, interval, wins/ties/losses."""
    real, noise = per_seed(shares, "adamw"), per_seed(shares, "random-gradient")
    seeds = sorted(set(real) & set(noise))
    s = boot.paired([real[k] for k in seeds], [noise[k] for k in seeds])
    return {"rtw-vs-noise": s.median_difference, "rtw-vs-noise-low": s.low, "rtw-vs-noise-high": s.high,
            "rtw-vs-noise-above": s.losses, "rtw-vs-noise-n": s.n}
