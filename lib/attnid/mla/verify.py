"""The numeric check: the closed-form count next to the Jacobian's nullity at a random point."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..jacobian import RankAccumulator, count_parameters, flatten, input_jacobian
from ..rank import RankDecision, numerical_rank
from ..spec import Params
from .count import count
from .layer import forward, init_params
from .spec import MLASpec
from .symmetry import scale_direction, tangent_basis

@dataclass(frozen=True)
class MLAVerification:
    """The closed-form count next to the numeric nullity of the Jacobian at one random point."""

    spec: MLASpec
    total: int
    exact: int | None
    decision: RankDecision
    orbit: int  # dimension of the span of the symmetry generators at the point
    orbit_stretch: float  # largest ||J v|| / (s_1 ||v||) over the generators: ~0 when they are symmetries
    weak: dict[str, float]  # per down-projection scale: ||J v|| / (s_1 ||v||)
    n_inputs: int
    seq_len: int

    @property
    def numeric(self) -> int:
        return self.decision.nullity

    @property
    def numeric_unidentified(self) -> int:
        """The numeric nullity (the name every family's check shares)."""
        return self.decision.nullity

    @property
    def matches(self) -> bool:
        return self.decision.clear and self.exact is not None and self.exact == self.numeric


def _int(name: str, value: Any, minimum: int) -> int:
    """A verify argument: an integer >= minimum."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _model(spec: MLASpec):
    def fn(params: Params, x: torch.Tensor) -> torch.Tensor:
        return forward(params, x, spec)
    return fn


def verify(spec: MLASpec, *, seed: int = 0, seq_len: int = 6, n_inputs: int | None = None,
           max_rounds: int = 4) -> MLAVerification:
    """Numeric nullity of the float64 Jacobian at a random point, by the library's rank rule.

    Inputs come in batches of ``n_inputs`` Gaussian sequences (default 1.5 P / (seq_len d_model) + 2);
    batches are added until two successive decisions agree and are clear (at most ``max_rounds``).
    """
    _int("seq_len", seq_len, 2)
    _int("max_rounds", max_rounds, 1)
    if n_inputs is not None:
        _int("n_inputs", n_inputs, 1)
    gen = torch.Generator().manual_seed(seed)
    params = init_params(spec, gen)
    n_params = count_parameters(params)
    batch = n_inputs or math.ceil(1.5 * n_params / (seq_len * spec.d_model)) + 2
    fn, acc = _model(spec), RankAccumulator(n_params)
    blocks: list[torch.Tensor] = []
    previous = None
    used = 0
    for _ in range(max_rounds):
        for _ in range(batch):
            x = torch.randn(seq_len, spec.d_model, generator=gen, dtype=torch.float64)
            block = input_jacobian(fn, params, x, "forward")
            acc.add(block)
            blocks.append(block)
            used += 1
        decision = acc.decide()
        if previous is not None and decision.clear and decision.rank == previous.rank:
            break
        previous = decision
    jac = torch.cat(blocks)
    s1 = float(torch.linalg.svdvals(jac)[0]) if jac.numel() else 1.0

    def stretch(direction: torch.Tensor) -> float:
        return float((jac @ direction).norm() / (s1 * direction.norm()))

    basis = tangent_basis(params, spec)
    orbit = numerical_rank(torch.linalg.svdvals(basis))
    orbit_stretch = max((stretch(v) for v in basis), default=0.0)
    weak = {f"W_D{'KV' if w == 'kv' else 'Q'} scale": stretch(flatten(scale_direction(params, spec, w)))
            for w in (("kv", "q") if spec.q_lora_rank is not None else ("kv",))}
    return MLAVerification(spec, n_params, count(spec).unidentified, decision, orbit, orbit_stretch, weak, used, seq_len)
