"""The trained-models chapter's tables and summaries: the at-point theorem's check, the two real models, quantisation.

Every number the chapter's prose quotes is computed here from the library's results (``attnid.hf``) or from
the quantisation experiment's data, and returned as a finding for ``glue``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from attnbook.tables import markdown_table
from attnid.hf import atpoint
from attnid.hf.checkpoint import Checkpoint
from attnid.layer import init_params
from attnid.spec import AttentionSpec
from attnid.train.multitest import holm, signed_rank_test
from attnid.train.stats import paired_summary

SPOILERS = ("none", "silent head", "rank-deficient query", "rank-deficient value", "rank-deficient key",
            "twin heads")
Q4_BLOCK = 32  # Q4_1 stores a scale and a minimum per block of 32 consecutive weights of a row
Q4_LEVELS = 15  # 4 bits: 16 levels, 15 steps between the block's minimum and maximum
ALPHA = 0.05


@dataclass(frozen=True)
class CheckRow:
    spec: AttentionSpec
    spoiler: str
    generic: int
    dense: int
    structured: int | None
    block: tuple[int, ...] = ()


def spoil(params: dict[str, torch.Tensor], spoiler: str) -> None:
    """Spoil a point in place: head 0 silent (W_O = 0), one factor column a multiple of another, or the last two
    heads with one attention pattern (the last head's query and key factors copied from the one before)."""
    if spoiler == "silent head":
        params["W_O"][0].zero_()
    elif spoiler == "rank-deficient query":
        params["W_Q"][-1][:, 0] = params["W_Q"][-1][:, 1]
    elif spoiler == "rank-deficient value":
        params["W_V"][0][:, 0] = 0
    elif spoiler == "rank-deficient key":
        params["W_K"][0][:, 1] = 2 * params["W_K"][0][:, 0]
    elif spoiler == "twin heads":
        heads, groups = params["W_Q"].shape[0], params["W_K"].shape[0]
        h, k = heads - 2, heads - 1
        g, f = h * groups // heads, k * groups // heads  # their key/value groups (AttentionSpec.group_of_head)
        params["W_Q"][k] = params["W_Q"][h]
        params["W_K"][f] = params["W_K"][g]
        if "b_Q" in params:
            params["b_Q"][k] = params["b_Q"][h]
    elif spoiler != "none":
        raise ValueError(f"spoiler must be one of {', '.join(SPOILERS)}, got {spoiler!r}")


def theorem_check(layouts: Sequence[AttentionSpec], spoilers: Sequence[str], seed: int) -> tuple[list[CheckRow], int]:
    """The at-point theorem's count against the dense float64 Jacobian at random and spoiled points."""
    rows = []
    for i, spec in enumerate(layouts):
        for spoiler in spoilers:
            params = init_params(spec, torch.Generator().manual_seed(seed + i))
            spoil(params, spoiler)
            dense, _, clear = atpoint.dense(params, spec, seed)
            if not clear:
                raise AssertionError(f"the dense rank decision is not clear for {spec} ({spoiler})")
            result = atpoint.structured(params, spec, seed=seed)
            rows.append(CheckRow(spec, spoiler, atpoint.generic_count(spec), dense, result.unidentified,
                                 tuple(result.block_groups)))
    return rows, sum(r.structured is not None for r in rows)


def _layout(spec: AttentionSpec) -> str:
    rope = f", RoPE {spec.rope_dims}/{spec.head_dim}" if spec.rope_dims else ""
    return f"d {spec.d_model}, H {spec.heads}, G {spec.kv_heads}, bias {spec.bias or 'none'}{rope}"


def _block(row: CheckRow) -> str:
    if not row.block:
        return "none"
    groups = ", ".join(map(str, row.block))
    return groups if row.structured is not None else f"{groups} (declined)"


def theorem_table(rows: Sequence[CheckRow]) -> str:
    body = [[_layout(r.spec), r.spoiler, str(r.generic), str(r.dense),
             "undecided" if r.structured is None else str(r.structured),
             _block(r)] for r in rows]
    return markdown_table(["layout", "point", "generic count", "dense Jacobian", "structured (theorem)",
                           "groups in the dense block"], body, right=(2, 3, 4))


def layer_table(report: Mapping[str, Any]) -> str:
    """One row per layer: parameters, the two counts, the dead parameters and the balance ranges."""
    body = []
    for layer in report["layers"]:
        qk, vo = layer["query_key_norm_ratio"], layer["value_output_norm_ratio"]
        dead = ", ".join(f"{k.replace('_', ' ')} {n}" for k, n in layer["dead_parameters"].items()) or "none"
        body.append([str(layer["layer"]), f"{layer['parameters']:,}", f"{layer['unidentified_generic']:,}",
                     "undecided" if layer["unidentified_at_point"] is None else f"{layer['unidentified_at_point']:,}",
                     dead, f"{min(h['margin'] for h in layer['heads']):.2g}",
                     f"{min(qk):.2f} to {max(qk):.2f}", f"{min(vo):.2f} to {max(vo):.2f}"])
    return markdown_table(["layer", "parameters", "generic", "at this point", "dead", "smallest margin",
                           "Q/K norm ratio", "V/O norm ratio"], body, right=(0, 1, 2, 3, 5))


def bias_norms(checkpoint: Checkpoint) -> dict[str, list[float]]:
    """Per layer, the Euclidean norm of all query biases and of all key biases."""
    out: dict[str, list[float]] = {"query": [], "key": []}
    for i in range(checkpoint.n_layers):
        params = checkpoint.layer(i)
        out["query"].append(float(params["b_Q"].norm()))
        out["key"].append(float(params["b_K"].norm()))
    return out


def whole_model_dead_bias(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """A BERT model's last hidden state after zeroing every key bias, and after folding every value bias into
    its output bias, each change relative to the largest output (float64)."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        ref = model(**batch).last_hidden_state
    scale = float(ref.abs().max())
    changes = {}
    for name in ("key_bias", "value_bias"):
        edited = dict(state)
        for key in state:
            if name == "key_bias" and key.endswith("attention.self.key.bias"):
                edited[key] = torch.zeros_like(state[key])
            if name == "value_bias" and key.endswith("attention.self.value.bias"):
                dense = key.replace("self.value.bias", "output.dense")
                edited[dense + ".bias"] = state[dense + ".bias"] + state[dense + ".weight"] @ state[key]
                edited[key] = torch.zeros_like(state[key])
        model.load_state_dict(edited)
        with torch.no_grad():
            changes[name] = float((model(**batch).last_hidden_state - ref).abs().max()) / scale
    model.load_state_dict(state)
    return {**changes, "scale": scale}


def _relative_smallest(m: torch.Tensor) -> float:
    s = torch.linalg.svdvals(m)
    return float(s[-1] / s[0])


def _q4_noise(w: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Uniform noise of half a Q4_1 step, the step estimated per block of 32 weights of each row (nn.Linear layout)."""
    rows, cols = w.shape
    blocks = w.reshape(rows, cols // Q4_BLOCK, Q4_BLOCK)
    step = (blocks.amax(dim=-1, keepdim=True) - blocks.amin(dim=-1, keepdim=True)) / Q4_LEVELS
    noise = (torch.rand(blocks.shape, generator=gen, dtype=w.dtype) - 0.5) * step
    return (blocks + noise).reshape(rows, cols)


@dataclass(frozen=True)
class Products:
    plain: list[float]       # smallest relative singular value of W_Q^hT W_K^g, per head
    seen: list[float]        # the same of S_Q V_Q^T P_1 V_K S_K: the rank-64 part of what the function sees
    random: list[float]      # plain, with U_Q and U_K replaced by random orthonormal frames
    rounded: list[float]     # plain, after Q4_1-sized noise on both factors
    moved: list[float]       # ||W_Q'^T W_K' - W_Q^T W_K||_2 / s_1 under that noise: Weyl's bound on the change above


def _spectrum(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(S, V^T) of a tall full-rank W = U S V^T, from the eigendecomposition of its small Gram matrix W^T W."""
    evals, evecs = torch.linalg.eigh(w.T @ w)
    return evals.clamp_min(0).sqrt().flip(0), evecs.flip(1).T


def _random_frame_product(rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    """R_Q^T R_K for two independent uniformly random orthonormal frames (rows x cols), via Cholesky of each Gram."""
    g = [torch.randn(rows, cols, generator=gen, dtype=torch.float64) for _ in range(2)]
    lq, lk = (torch.linalg.cholesky(m.T @ m) for m in g)
    cross = torch.linalg.solve_triangular(lq, g[0].T @ g[1], upper=False)
    return torch.linalg.solve_triangular(lk, cross.T, upper=False).T


def plain_products(checkpoint: Checkpoint, seed: int) -> Products:
    """The four statistics for every head of every layer (attnid's convention: W_Q^h is d x d_k)."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, list[float]] = {"plain": [], "seen": [], "random": [], "rounded": [], "moved": []}
    for i in range(checkpoint.n_layers):
        params, spec = checkpoint.layer(i), checkpoint.specs[i]
        rotation = atpoint.offset_matrix(spec, 1, 0)
        for h in range(spec.heads):
            wq, wk = params["W_Q"][h], params["W_K"][spec.group_of_head(h)]
            (sq, vqt), (sk, vkt) = _spectrum(wq), _spectrum(wk)
            product = wq.T @ wk
            out["plain"].append(_relative_smallest(product))
            out["seen"].append(_relative_smallest((sq[:, None] * vqt) @ rotation @ (vkt.T * sk)))
            frames = _random_frame_product(*wq.shape, gen)
            out["random"].append(_relative_smallest((vqt.T * sq) @ frames @ (sk[:, None] * vkt)))
            noisy = _q4_noise(wq.T, gen).T.T @ _q4_noise(wk.T, gen).T
            out["rounded"].append(_relative_smallest(noisy))
            out["moved"].append(float(torch.linalg.matrix_norm(noisy - product, 2) / torch.linalg.matrix_norm(product, 2)))
    return Products(**out)


def product_findings(p: Products) -> dict[str, Any]:
    plain, rounded, random = np.array(p.plain), np.array(p.rounded), np.array(p.random)
    return {"tm-prod-below-3": int((plain < 1e-3).sum()), "tm-prod-below-4": int((plain < 1e-4).sum()),
            "tm-prod-median": float(np.median(plain)), "tm-prod-seen-min": min(p.seen),
            "tm-prod-seen-median": float(np.median(p.seen)),
            "tm-prod-random-below-3": int((random < 1e-3).sum()), "tm-prod-random-below-4": int((random < 1e-4).sum()),
            "tm-prod-random-median": float(np.median(random)),
            "tm-prod-rounded-below-3": int((rounded < 1e-3).sum()), "tm-prod-moved-median": float(np.median(p.moved))}


def product_table(p: Products) -> str:
    body = []
    for name, values in (("trained: W_Q^T W_K", p.plain), ("what the function sees (t = 1)", p.seen),
                         ("random subspaces, same spectra", p.random), ("trained + Q4_1-sized noise", p.rounded)):
        v = np.array(values)
        body.append([name, f"{np.median(v):.2g}", f"{v.min():.2g}", str(int((v < 1e-3).sum())), str(int((v < 1e-4).sum()))])
    return markdown_table(["64 x 64 matrix, per head (270)", "median", "smallest", "below 1e-3", "below 1e-4"], body,
                          right=(1, 2, 3, 4))


def balance_summary(reports: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, tuple[float, float]]]:
    """Per model: the range of the Q/K and V/O norm ratios over all groups of all layers."""
    out = {}
    for name, report in reports.items():
        qk = [r for layer in report["layers"] for r in layer["query_key_norm_ratio"]]
        vo = [r for layer in report["layers"] for r in layer["value_output_norm_ratio"]]
        out[name] = {"qk": (min(qk), max(qk)), "vo": (min(vo), max(vo))}
    return out


def balance_table(summary: Mapping[str, Mapping[str, tuple[float, float]]]) -> str:
    body = [[name, f"{s['qk'][0]:.2f} to {s['qk'][1]:.2f}", f"{s['vo'][0]:.2f} to {s['vo'][1]:.2f}"]
            for name, s in summary.items()]
    return markdown_table(["model", "query/key norm ratio, per group", "value/output norm ratio, per group"], body)


def balance_findings(summary: Mapping[str, Mapping[str, tuple[float, float]]]) -> dict[str, str]:
    keys = {"all-MiniLM-L6-v2": "minilm", "SmolLM2-135M": "smol"}
    return {f"tm-bal-{keys[name]}-{side}": f"{s[side][0]:.2f} to {s[side][1]:.2f}"
            for name, s in summary.items() for side in ("qk", "vo")}


@dataclass(frozen=True)
class Comparison:
    bits: int
    quantiser: str
    arm: str
    baseline_median: float
    arm_median: float
    summary: Any
    p_value: float
    adjusted: float = 1.0


def quantisation_comparisons(rows: Sequence[Mapping[str, str]], *, level: float, resamples: int) -> list[Comparison]:
    """Each arm against the trained point, per bit width and quantiser: per-sentence paired errors (rotated: the
    mean over seeds), the median difference with its bootstrap interval, the exact signed-rank p and Holm's p."""
    table: dict[tuple[int, str, str], dict[int, list[float]]] = {}
    for r in rows:
        key = (int(r["bits"]), r["quantiser"], r["arm"])
        table.setdefault(key, {}).setdefault(int(r["sentence"]), []).append(float(r["relative_error"]))
    out = []
    for (bits, quantiser, arm), per_sentence in sorted(table.items(), key=lambda kv: (-kv[0][0], kv[0][1], kv[0][2])):
        if arm == "original":
            continue
        base = table[(bits, quantiser, "original")]
        sentences = sorted(base)
        a = [float(np.mean(per_sentence[s])) for s in sentences]
        b = [base[s][0] for s in sentences]
        summary = paired_summary(a, b, n_boot=resamples, level=level)
        out.append(Comparison(bits, quantiser, arm, float(np.median(b)), float(np.median(a)), summary,
                              signed_rank_test(a, b).p_value))
    adjusted = holm([c.p_value for c in out])
    return [Comparison(**{**c.__dict__, "adjusted": p}) for c, p in zip(out, adjusted)]


def quantisation_table(comparisons: Sequence[Comparison]) -> str:
    body = []
    for c in comparisons:
        s = c.summary
        body.append([f"int{c.bits}", c.quantiser, c.arm, f"{c.baseline_median:.3g}", f"{c.arm_median:.3g}",
                     f"{s.median_difference:.2g} [{s.low:.2g}, {s.high:.2g}]", f"{s.wins}/{s.n}",
                     f"{c.adjusted:.2g}" + (" *" if c.adjusted <= ALPHA else "")])
    return markdown_table(["bits", "quantiser", "moved to", "median error, trained", "median error, moved",
                           "median paired difference [95% interval]", "sentences improved", "Holm p"], body,
                          right=(3, 4, 6, 7))


def significant(c: Comparison) -> bool:
    """Holm-adjusted p at or below ALPHA."""
    return c.adjusted <= ALPHA


def quantisation_findings(comparisons: Sequence[Comparison]) -> dict[str, Any]:
    """The numbers the prose quotes, after asserting the qualitative statements it makes about them."""
    by = {(c.bits, c.quantiser, c.arm): c for c in comparisons}
    b8 = by[(8, "plain", "balanced")]
    for quantiser in ("plain", "tuned"):  # the balanced point helps at 8 bits, with both quantisers
        c = by[(8, quantiser, "balanced")]
        assert significant(c) and c.summary.high < 0, c
        for arm in ("hadamard", "rotated"):  # the rotations do not, at 8 bits
            assert not significant(by[(8, quantiser, arm)]), by[(8, quantiser, arm)]
    for c in comparisons:  # nothing helps at 4 bits
        assert c.bits == 8 or not (significant(c) and c.summary.median_difference < 0), c
    worse = [c for c in comparisons if significant(c) and c.summary.median_difference > 0]
    return {"tm-q8-balanced-wins": b8.summary.wins, "tm-q-sentences": b8.summary.n,
            "tm-q8-balanced-median": -b8.summary.median_difference,
            "tm-q8-balanced-relative": f"{-b8.summary.median_difference / b8.baseline_median:.0%}",
            "tm-q-rejected": sum(significant(c) for c in comparisons), "tm-q-tests": len(comparisons),
            "tm-q-worse": ", ".join(f"{c.arm} with the {c.quantiser} quantiser at {c.bits} bits" for c in worse) or "none"}
