"""ALiBi: a fixed linear position bias per head added to the scores (BLOOM, MPT, Falcon-RW, Baichuan-13B).

Head h adds -m_h (i - j) to the score of query i and key j (-m_h |i - j| without a causal mask),
with the slopes of Press et al.: for H a power of two m_h = 2^(-8 h / H), h = 1..H; otherwise the
slopes of the next lower power of two n, then every other slope of 2n (``slopes``). The slopes
are constants, not parameters. ``AlibiSpec`` wraps a multi-head layout without RoPE or QK-norm
(ALiBi replaces the rotary embedding); ``attnid.families`` lists the family.

What ALiBi does to the count (chapter 7b, theorem on position biases): nothing, under plain
softmax. Its offsets depend on no parameter, so every move of the layout without them keeps the
function, and one moving key still gives each head's score slope and ramp (the proof of
``prop-moving-token`` never uses the scores of the fixed keys), which pin the same products.
With a sink or the sigmoid the count is not proved here (``count`` gives none).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from attnid import counts, layer, symmetry
from attnid.layout import Count, Params
from attnid.spec import AttentionSpec
from attnid.families.wrapped import OnMultiHead, base_checks, base_seq_len, offset_forward


def slopes(heads: int) -> list[float]:
    """ALiBi's slope per head: 2^(-8h/H) for a power of two H, else the next lower power's and every other of twice it."""
    n = 2 ** math.floor(math.log2(heads))
    base = [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]
    extra = [2.0 ** (-4.0 * h / n) for h in range(1, 2 * n + 1, 2)][: heads - n]  # every other slope of 2n heads
    return base + extra


@dataclass(frozen=True)
class AlibiSpec(OnMultiHead):
    """A multi-head layout ``base`` (no RoPE, no QK-norm) with ALiBi position biases on its scores."""

    base: AttentionSpec

    def __post_init__(self) -> None:
        self._check_position_base("ALiBi")

    def describe(self) -> str:
        return f"{self.base.describe()} alibi=yes"

    def label(self) -> str:
        return f"{self.base.label()} ALiBi"

    def to_dict(self) -> dict[str, Any]:
        return {**self.base.to_dict(), "alibi": True}


def position_bias(spec: AlibiSpec, n: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """(H, n, n): -m_h (i - j), or -m_h |i - j| without a causal mask (the masked entries are masked anyway)."""
    i = torch.arange(n, device=device, dtype=dtype)
    distance = i[:, None] - i[None, :]
    if not spec.causal:
        distance = distance.abs()
    return -torch.tensor(slopes(spec.heads), dtype=dtype, device=device)[:, None, None] * distance


def forward(params: Params, x: torch.Tensor, spec: AlibiSpec) -> torch.Tensor:
    """The layer of ``attnid.layer`` with ALiBi's offsets added to every head's scores, for X of shape (..., n, d)."""
    return offset_forward(params, x, spec.base, position_bias(spec, x.shape[-2], x.dtype, x.device))


def count(spec: AlibiSpec) -> Count:
    """The count of the layout without ALiBi (plain softmax); no exact count with a sink or the sigmoid."""
    plain = counts.count(spec.base)
    if spec.base.norm != "softmax":
        return Count(spec, plain.total, None, {}, f"not covered: ALiBi with {spec.base.norm} attention (the proof "
                                                  "needs the shift invariance of plain softmax)")
    return Count(spec, plain.total, plain.unidentified, dict(plain.breakdown), plain.note, plain.weakly_identified)


def tangent_basis(params: Params, spec: AlibiSpec) -> torch.Tensor:
    """(P, k): the orbit tangent of the layout without ALiBi (its moves keep every score, and so the offsets)."""
    return symmetry.orbit_tangent(params, spec.base)


def parameter_shapes(spec: AlibiSpec) -> dict[str, tuple[int, ...]]:
    return layer.parameter_shapes(spec.base)


def init_params(spec: AlibiSpec, generator: torch.Generator, dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
    return layer.init_params(spec.base, generator, dtype)


# verify: the exact count next to the float64 Jacobian's nullity at a seeded random point (``attnid.nullity``);
# estimate: its peak memory; default_seq_len: its input length, the multi-head default
verify, estimate = base_checks(count, init_params, forward, tangent_basis)
default_seq_len = base_seq_len


def example() -> AlibiSpec:
    """BLOOM's structure at a small size: four heads, every bias, a causal mask."""
    return AlibiSpec(AttentionSpec.create(8, 4, bias="qkvo", causal=True))
