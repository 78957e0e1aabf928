"""Output-gated attention: each head's output multiplied by a sigmoid gate computed from its own token.

Head h of a multi-head layout (``AttentionSpec``, any GQA grouping, biases, RoPE, masks, QK-norm)
produces the mixture O_h = A_h V_g(h) (n x d_v). The gated layer multiplies it, row by row, by

    G_h = sigmoid(X W_G^h + b_G^h)      W_G^h: d x d_v ('elementwise') or d x 1 ('headwise')

before the output projection: Y = sum_h (O_h * G_h) W_O^h + b_O. This is the gate of Qwen3-Next's
full-attention layers (elementwise, from a second half of q_proj, no bias) and of the "gated
attention" studies (elementwise or one scalar per head). ``GatedSpec`` is the layout;
``attnid.families`` lists the family.

What the gate does to the symmetry (chapter 7b, theorem on output gates). The query/key side is
untouched. On the value side a move W_V -> W_V M, W_O^h -> M^-1 W_O^h commutes with a scalar gate
per head, so 'headwise' keeps GL(d_v) per key/value group; an elementwise product commutes only
with diagonal M (and permutations, a finite group), so 'elementwise' keeps d_v scales per group
of the d_v^2 dimensions. The gate depends on the query token, so under plain softmax the value
bias, which without a gate only moved the constant b_O + sum_h b_V W_O^h, is now seen: its
directions are identified. The gate's own weights are identified. The count is proved for plain
softmax (with a sink or the sigmoid the proof's constant inputs mix the query/key side into the
value side; such layouts get no exact count) and whenever the ungated layout's count is proved
(with a QK-norm, as there: chapter 7b's pole argument separates the heads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from attnid import counts, layer, symmetry
from attnid.counts import FactoredCount
from attnid.layout import Count, Params
from attnid.spec import AttentionSpec
from attnid.families.wrapped import OnMultiHead, base_checks, base_seq_len

GATES = ("elementwise", "headwise")
GATE_PARAMS = ("W_G", "b_G")


@dataclass(frozen=True)
class GatedSpec(OnMultiHead):
    """A multi-head layout ``base`` with an output gate: 'elementwise' (d_v per head) or 'headwise' (one per head)."""

    base: AttentionSpec
    gate: str = "elementwise"
    gate_bias: bool = False

    def __post_init__(self) -> None:
        self._check_base()
        if self.gate not in GATES:
            raise ValueError(f"gate must be one of {', '.join(GATES)}, got {self.gate!r}")
        if not isinstance(self.gate_bias, bool):
            raise TypeError(f"gate_bias must be true or false, got {self.gate_bias!r}")

    @property
    def gate_width(self) -> int:
        """Gates per head: d_v ('elementwise') or 1 ('headwise')."""
        return self.base.v_head_dim if self.gate == "elementwise" else 1

    def describe(self) -> str:
        return f"{self.base.describe()} output_gate={self.gate}{' (with bias)' if self.gate_bias else ''}"

    def label(self) -> str:
        return f"{self.base.label()} gate {self.gate}{' +b' if self.gate_bias else ''}"

    def to_dict(self) -> dict[str, Any]:
        return {**self.base.to_dict(), "output_gate": self.gate, "gate_bias": self.gate_bias}


def parameter_shapes(spec: GatedSpec) -> dict[str, tuple[int, ...]]:
    """The ungated layer's parameters, then W_G (H, d, w) and, with a gate bias, b_G (H, w); w = ``gate_width``."""
    shapes = layer.parameter_shapes(spec.base)
    shapes["W_G"] = (spec.heads, spec.d_model, spec.gate_width)
    if spec.gate_bias:
        shapes["b_G"] = (spec.heads, spec.gate_width)
    return shapes


def init_params(spec: GatedSpec, generator: torch.Generator, dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
    """The ungated layer's random point, then Gaussian gate weights (scale d^-1/2) and gate biases (scale 1/2)."""
    params = layer.init_params(spec.base, generator, dtype)
    shapes = parameter_shapes(spec)
    params["W_G"] = (torch.randn(shapes["W_G"], generator=generator, dtype=torch.float64) * spec.d_model**-0.5).to(dtype)
    if spec.gate_bias:
        params["b_G"] = (torch.randn(shapes["b_G"], generator=generator, dtype=torch.float64) * 0.5).to(dtype)
    return params


def head_mixtures(params: Params, x: torch.Tensor, base: AttentionSpec) -> torch.Tensor:
    """O_h = A_h V_g(h) for every head, shape (..., n, H, d_v), from the reference layer itself.

    The layer is run with W_O replaced by the block identity (H, d_v, H d_v) and no b_O, so its
    output is the heads' mixtures side by side: one forward for every family that gates them.
    """
    h, dv = base.heads, base.v_head_dim
    inner = {k: v for k, v in params.items() if k not in ("W_O", "b_O", *GATE_PARAMS)}
    inner["W_O"] = torch.eye(h * dv, dtype=x.dtype, device=x.device).reshape(h, dv, h * dv)
    return layer.forward(inner, x, base).unflatten(-1, (h, dv))


def gates(params: Params, x: torch.Tensor) -> torch.Tensor:
    """sigmoid(X W_G^h + b_G^h) for every head, shape (..., n, H, w)."""
    z = torch.einsum("...nd,hdw->...nhw", x, params["W_G"])
    return torch.sigmoid(z + params["b_G"] if "b_G" in params else z)


def forward(params: Params, x: torch.Tensor, spec: GatedSpec) -> torch.Tensor:
    """Y = sum_h (O_h * G_h) W_O^h + b_O for X of shape (..., n, d_model)."""
    gated = head_mixtures(params, x, spec.base) * gates(params, x)
    return torch.einsum("...nhv,hvd->...nd", gated, params["W_O"]) + params.get("b_O", 0.0)


def gate_parameters(spec: GatedSpec) -> int:
    """H d w gate weights plus H w gate biases."""
    return spec.heads * spec.gate_width * (spec.d_model + spec.gate_bias)


def value_side_unidentified(spec: GatedSpec) -> int:
    """Per key/value group: d_v scales (elementwise), or the factored count of [W_V; b_V] against the heads' W_O (headwise)."""
    base = spec.base
    if spec.gate == "elementwise":
        return base.kv_heads * base.v_head_dim
    rows = base.d_model + base.has_bias("v")  # the gate shows b_V per head, whatever the normalisation
    return base.kv_heads * FactoredCount(rows, base.v_head_dim, base.group_size * base.d_model).unidentified


def not_covered(spec: GatedSpec) -> str:
    """Why the gated count is not proved for this layout ('' when it is)."""
    if spec.base.norm != "softmax":
        return (f"not covered: an output gate with {spec.base.norm} attention (the proof reads constant inputs, "
                "where only plain softmax keeps the query/key side out of the value side)")
    return ""


def count(spec: GatedSpec) -> Count:
    """The ungated count with the value side replaced (``value_side_unidentified``); the gate itself is identified."""
    ungated = counts.count(spec.base)
    total = ungated.total + gate_parameters(spec)
    note = not_covered(spec) or ("" if ungated.covered else ungated.note)
    if note:
        return Count(spec, total, None, {}, note)
    breakdown = {k: v for k, v in ungated.breakdown.items() if k not in ("value_output", "value_bias")}
    breakdown.update({"value_output": value_side_unidentified(spec), "gate": 0})
    return Count(spec, total, sum(breakdown.values()), breakdown, weakly_identified=ungated.weakly_identified)


def _value_scales(params: Params, spec: GatedSpec) -> list[dict[str, torch.Tensor]]:
    """Elementwise gate: per group g and value coordinate i, scale column i of W_V^g (and b_V^g) against row i of W_O^h."""
    base, out = spec.base, []
    groups = [base.group_of_head(h) for h in range(base.heads)]
    for g in range(base.kv_heads):
        heads = [h for h in range(base.heads) if groups[h] == g]
        for i in range(base.v_head_dim):
            d = {name: torch.zeros_like(p) for name, p in params.items()}
            d["W_V"][g, :, i] = params["W_V"][g, :, i]
            if "b_V" in params:
                d["b_V"][g, i] = params["b_V"][g, i]
            d["W_O"][heads, i, :] = -params["W_O"][heads, i, :]
            out.append(d)
    return out


def tangent_basis(params: Params, spec: GatedSpec) -> torch.Tensor:
    """(P, k): an orthonormal basis of the orbit's tangent space at ``params``.

    The ungated layer's directions on the query/key side (and key-bias shifts, QK-norm trades)
    are kept, the gate parameters not moving; the value side is GL(d_v) per group with a
    headwise gate, d_v scales per group with an elementwise one; the ungated value-bias trades
    are gone (the gate sees b_V).
    """
    base_params = {k: v for k, v in params.items() if k not in GATE_PARAMS}
    kept = [d for label, d in symmetry.labelled_tangent_directions(base_params, spec.base)
            if not label.startswith("value_bias") and (spec.gate == "headwise" or not label.startswith("value_output"))]
    if spec.gate == "elementwise":
        kept += _value_scales(base_params, spec)
    padded = [{name: d[name] if name in d else torch.zeros_like(p) for name, p in params.items()} for d in kept]
    return symmetry.orthonormal_span(padded, params)


# verify: the exact count next to the float64 Jacobian's nullity at a seeded random point (``attnid.nullity``);
# estimate: its peak memory; default_seq_len: its input length, the multi-head default
verify, estimate = base_checks(count, init_params, forward, tangent_basis)
default_seq_len = base_seq_len


def example() -> GatedSpec:
    """Grouped heads, partial RoPE, every bias and a biased elementwise gate: every kind of direction."""
    return GatedSpec(AttentionSpec.create(8, 2, kv_heads=1, head_dim=4, v_head_dim=2, rope_fraction=0.5, bias="qkvo",
                                          causal=True), "elementwise", gate_bias=True)


# ------------------------------------------------------------------------------------------------
# Qwen3-Next's full-attention layer as a layout (its transformers cross-check: attnid.hf.qwen3_next)
# ------------------------------------------------------------------------------------------------


def qwen3_next_spec(heads: int = 2, kv_heads: int = 1, head_dim: int = 4, rope_fraction: float = 0.5,
                    eps: float = 1e-6, bias: bool = False) -> GatedSpec:
    """The layout of a small Qwen3-Next full-attention layer: shared QK-norm, partial RoPE, causal, elementwise gate.

    ``bias`` is the configuration's attention_bias: q_proj (queries and gates), k_proj, v_proj and o_proj.
    """
    base = AttentionSpec.create(heads * head_dim, heads, kv_heads=kv_heads, head_dim=head_dim, v_head_dim=head_dim,
                                bias="qkvo" if bias else "none", rope_fraction=rope_fraction, causal=True,
                                qk_norm="shared", qk_norm_eps=eps)
    return GatedSpec(base, "elementwise", gate_bias=bias)


def move_value_coordinates(params: Params, spec: GatedSpec, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """A finite move of the elementwise-gated value side: W_V^g D_g, b_V^g D_g, D_g^-1 W_O^h with D_g positive diagonal."""
    base = spec.base
    scales = torch.exp(0.5 * torch.randn(base.kv_heads, base.v_head_dim, generator=gen, dtype=torch.float64))
    per_head = scales[[base.group_of_head(h) for h in range(base.heads)]]
    out = {"W_V": params["W_V"] * scales[:, None, :], "W_O": params["W_O"] / per_head[:, :, None]}
    if "b_V" in params:
        out["b_V"] = params["b_V"] * scales
    return out
