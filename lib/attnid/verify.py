"""Numeric functional dimension of an attention layout, compared with the exact count."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .counts import Count, count
from .jacobian import Mode, count_parameters, functional_rank
from .layer import forward, init_params
from .rank import RankDecision
from .runtime import generator
from .spec import AttentionSpec

MIN_SEQ_LEN = 2


@dataclass(frozen=True)
class Verification:
    """An exact count next to the numeric nullity of the Jacobian at a random point."""

    count: Count
    decision: RankDecision
    seq_len: int
    n_inputs: int
    seed: int

    @property
    def numeric_unidentified(self) -> int:
        return self.decision.nullity

    @property
    def matches(self) -> bool | None:
        """True/False when the theory covers the layout, None when there is no exact count to compare."""
        if self.count.unidentified is None:
            return None
        return self.decision.clear and self.count.unidentified == self.decision.nullity


def default_inputs(spec: AttentionSpec, seq_len: int) -> int:
    """Enough random inputs that the Jacobian's independent rows can exceed the parameters, plus one spare.

    Each output row is b_O plus a combination of the rows of the H W_O^h, so apart from the
    shared W_O and b_O an input contributes at most seq_len * min(d_model, H d_v) independent
    rows, not seq_len * d_model. Counting with that effective width keeps layouts whose heads
    are narrow (H d_v < d_model) from being capped by too few inputs.
    """
    width = min(spec.d_model, spec.heads * spec.v_head_dim)
    return math.ceil(count(spec).total / (seq_len * width)) + 1


def numeric_rank(
    spec: AttentionSpec,
    *,
    seq_len: int = 8,
    seed: int = 0,
    n_inputs: int | None = None,
    mode: Mode = "auto",
    device: torch.device | str = "cpu",
    progress: bool = False,
) -> tuple[RankDecision, int]:
    """Rank decision for the layer's Jacobian at a seeded random point on seeded random inputs."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < MIN_SEQ_LEN:
        raise ValueError(f"seq_len must be an integer >= {MIN_SEQ_LEN} (attention over one token is constant), got {seq_len!r}")
    n_inputs = default_inputs(spec, seq_len) if n_inputs is None else n_inputs
    if isinstance(n_inputs, bool) or not isinstance(n_inputs, int) or n_inputs < 1:
        raise ValueError(f"n_inputs must be a positive integer, got {n_inputs!r}")
    gen = generator(seed)
    params = init_params(spec, gen, device=device)
    inputs = [torch.randn(seq_len, spec.d_model, generator=gen, dtype=torch.float64).to(device) for _ in range(n_inputs)]
    assert count_parameters(params) == count(spec).total
    decision = functional_rank(lambda p, x: forward(p, x, spec), params, inputs, mode=mode, progress=progress)
    return decision, n_inputs


def verify(spec: AttentionSpec, *, seq_len: int = 8, seed: int = 0, n_inputs: int | None = None,
           device: torch.device | str = "cpu", progress: bool = False) -> Verification:
    """Exact count and numeric nullity side by side."""
    decision, used = numeric_rank(spec, seq_len=seq_len, seed=seed, n_inputs=n_inputs, device=device, progress=progress)
    return Verification(count(spec), decision, seq_len, used, seed)
