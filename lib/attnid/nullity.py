"""The numeric check a family without its own rank machinery uses: the Jacobian's nullity at one random point.

``measure`` stacks the float64 Jacobian of a layer ``fn(params, x)`` on batches of Gaussian
inputs, decides its rank by the library's one rule (``attnid.rank``), and adds batches until two
successive decisions agree and are clear. It also measures how far the family's orbit tangent
directions are from the null space (``orbit_stretch``: about round-off when they are symmetries).
``FamilyCheck`` is the record every family's ``verify`` returns in this form (latent and
output-gated attention; the multi-head family has ``attnid.verification`` with certificates); both
follow ``attnid.layout.VerificationResult``. ``admit`` applies the front door's method choice and
memory limit to this route before anything is allocated.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm import tqdm

from attnid.budget import Estimate, MemoryLimitExceeded
from attnid.jacobian import RankAccumulator, count_parameters, input_jacobian
from attnid.layout import ComparesNullity, Params
from attnid.rank import RankDecision, numerical_rank

Layer = Callable[[Params, torch.Tensor], torch.Tensor]
METHODS = ("auto", "dense")  # this route is the dense one: the float64 Jacobian, stacked and decided


@dataclass(frozen=True)
class FamilyCheck(ComparesNullity):
    """The closed-form count next to the numeric nullity of the Jacobian at one random point."""

    spec: Any
    total: int
    exact: int | None
    decision: RankDecision
    orbit: int  # dimension of the span of the symmetry generators at the point
    orbit_stretch: float  # largest ||J v|| / (s_1 ||v||) over the generators: ~0 when they are symmetries
    n_inputs: int
    seq_len: int
    weak: dict[str, float] = field(default_factory=dict)  # named directions seen only weakly: ||J v|| / (s_1 ||v||)

    @property
    def numeric(self) -> int:
        """The numeric nullity (``numeric_unidentified``, the name every family's check shares)."""
        return self.numeric_unidentified


def check_int(name: str, value: Any, minimum: int) -> int:
    """A check argument: an integer >= minimum (TypeError or ValueError naming it otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class Measured:
    """A rank decision, the number of inputs it took, and the stretch of any direction under the stacked Jacobian."""

    decision: RankDecision
    n_inputs: int
    stretch: Callable[[torch.Tensor], float]

    def orbit(self, basis: torch.Tensor) -> tuple[int, float]:
        """(dimension of span(basis), largest stretch of its columns)."""
        dim = numerical_rank(torch.linalg.svdvals(basis)) if basis.numel() else 0
        return dim, max((self.stretch(v) for v in basis.T), default=0.0)


def measure(fn: Layer, params: Params, d_model: int, gen: torch.Generator, *, seq_len: int,
            n_inputs: int | None = None, max_rounds: int = 4, progress: bool = False) -> Measured:
    """Rank of the float64 Jacobian of ``fn`` at ``params`` on batches of seeded Gaussian inputs.

    A batch has ``n_inputs`` sequences (default 1.5 P / (seq_len d_model) + 2); batches are added
    until two successive decisions agree and are clear (at most ``max_rounds``).
    """
    check_int("seq_len", seq_len, 2)
    check_int("max_rounds", max_rounds, 1)
    if n_inputs is not None:
        check_int("n_inputs", n_inputs, 1)
    n_params = count_parameters(params)
    batch = n_inputs or math.ceil(1.5 * n_params / (seq_len * d_model)) + 2
    acc = RankAccumulator(n_params)
    blocks: list[torch.Tensor] = []
    previous = None
    for number in range(1, max_rounds + 1):
        for _ in tqdm(range(batch), desc=f"nullity: round {number} of at most {max_rounds}", unit="input",
                      disable=not progress, file=sys.stderr, leave=False):
            x = torch.randn(seq_len, d_model, generator=gen, dtype=torch.float64)
            block = input_jacobian(fn, params, x, "forward")
            acc.add(block)
            blocks.append(block)
        decision = acc.decide()
        if previous is not None and decision.clear and decision.rank == previous.rank:
            break
        previous = decision
    jac = torch.cat(blocks)
    s1 = float(torch.linalg.svdvals(jac)[0]) if jac.numel() else 1.0

    def stretch(direction: torch.Tensor) -> float:
        return float((jac @ direction).norm() / (s1 * direction.norm()))

    return Measured(decision, len(blocks), stretch)


FIRST_USE_BYTES = 200 * 2**20  # torch's first allocations and kernels, above the memory after ``import attnid``


def estimate_bytes(n_params: int, d_model: int, seq_len: int, n_inputs: int | None = None, max_rounds: int = 4) -> int:
    """An upper bound on the peak memory of ``measure`` (bytes above the memory after ``import attnid``).

    In float64 elements, with P parameters, R = max_rounds * N * seq_len * d_model Jacobian rows
    (N the batch ``measure`` uses): the stacked blocks and their concatenation (2 R P), one
    input's forward-mode Jacobian with its temporaries (4 seq_len d_model P), the accumulator's
    triangle and its SVD (3 P^2); times 1.5, plus ``FIRST_USE_BYTES``. Not calibrated like
    ``attnid.verification.estimate_resources``: it counts every batch ``max_rounds`` allows.
    """
    batch = n_inputs or math.ceil(1.5 * n_params / (seq_len * d_model)) + 2
    rows = max_rounds * batch * seq_len * d_model
    floats = 2 * rows * n_params + 4 * seq_len * d_model * n_params + 3 * n_params**2
    return FIRST_USE_BYTES + math.ceil(1.5 * 8 * floats)


def estimate(n_params: int, d_model: int, seq_len: int, n_inputs: int | None = None, max_rounds: int = 4) -> Estimate:
    """``estimate_bytes`` as the front door's ``Estimate`` record (the batch ``measure`` would draw)."""
    batch = n_inputs or math.ceil(1.5 * n_params / (seq_len * d_model)) + 2
    return Estimate(estimate_bytes(n_params, d_model, seq_len, n_inputs, max_rounds), n_params, seq_len, batch,
                    "forward", {})


def admit(n_params: int, d_model: int, seq_len: int, n_inputs: int | None, max_rounds: int, method: str,
          max_bytes: int | None) -> None:
    """ValueError for a method this route does not have; MemoryLimitExceeded when its estimate exceeds ``max_bytes``."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)} for this family (its check is the dense "
                         f"Jacobian's nullity), got {method!r}")
    if max_bytes is not None:
        found = estimate(n_params, d_model, seq_len, n_inputs, max_rounds)
        if found.bytes > max_bytes:
            raise MemoryLimitExceeded("dense", found, max_bytes)


def checked_estimate(n_params: int, d_model: int, seq_len: int, n_inputs: int | None = None, method: str = "auto",
                     max_rounds: int = 4) -> Estimate:
    """``estimate`` after ``admit``'s method check: what a family's ``estimate`` returns."""
    admit(n_params, d_model, seq_len, n_inputs, max_rounds, method, None)
    return estimate(n_params, d_model, seq_len, n_inputs, max_rounds)


def check_layout(spec: Any, *, init_params: Callable[[Any, torch.Generator], Params], forward: Callable[..., torch.Tensor],
                 tangent_basis: Callable[[Params, Any], torch.Tensor], exact: int | None, total: int, seq_len: int,
                 seed: int = 0, n_inputs: int | None = None, max_rounds: int = 4, method: str = "auto",
                 progress: bool = False, max_bytes: int | None = None,
                 weak: Callable[[Params, Measured], dict[str, float]] | None = None) -> FamilyCheck:
    """A family's ``verify``: the exact count next to the float64 Jacobian's nullity at a seeded random point.

    The point is drawn first from a generator seeded with ``seed``, then the inputs (``measure``); the
    orbit is the span of ``tangent_basis`` at the point, and its stretch how far it is from the null space.
    ``method``, ``progress`` and ``max_bytes`` as in ``attnid.verify`` (``admit``); ``weak`` names the
    directions the family sees only weakly, measured at the point (``Measured.stretch``).
    """
    check_int("seq_len", seq_len, 2)
    admit(total, spec.d_model, seq_len, n_inputs, max_rounds, method, max_bytes)
    gen = torch.Generator().manual_seed(seed)
    params = init_params(spec, gen)

    def fn(p: Params, x: torch.Tensor) -> torch.Tensor:
        return forward(p, x, spec)

    measured = measure(fn, params, spec.d_model, gen, seq_len=seq_len, n_inputs=n_inputs, max_rounds=max_rounds,
                       progress=progress)
    orbit, stretch = measured.orbit(tangent_basis(params, spec))
    return FamilyCheck(spec, total, exact, measured.decision, orbit, stretch, measured.n_inputs, seq_len,
                       {} if weak is None else weak(params, measured))
