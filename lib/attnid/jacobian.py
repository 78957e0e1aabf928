"""Jacobians of a model's outputs with respect to all of its parameters.

A model is a pure function ``fn(params, x)`` of a dict of named parameter tensors and one
input tensor. The functional rank of the model at ``params`` is the rank of the matrix
J whose rows are d(output coordinate)/d(parameter) for every output coordinate of every
input in a list: ``jacobian_matrix`` builds J, ``functional_rank`` decides its rank.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch
from torch.func import jacfwd, jacrev
from tqdm import tqdm

from attnid.rank import DEFAULT_MIN_GAP, DEFAULT_ZERO_TOL, RankDecision, decide_rank
from attnid.spec import Params

Model = Callable[[Params, torch.Tensor], torch.Tensor]
Mode = Literal["auto", "forward", "reverse"]


def count_parameters(params: Params) -> int:
    """P, the total number of scalar parameters."""
    return sum(int(p.numel()) for p in params.values())


def flatten(params: Params) -> torch.Tensor:
    """Concatenate all parameters (in dict order) into one vector theta of length P."""
    return torch.cat([p.reshape(-1) for p in params.values()])


def unflatten(theta: torch.Tensor, like: Params) -> dict[str, torch.Tensor]:
    """Inverse of ``flatten``: cut theta back into tensors shaped like ``like``."""
    needed = count_parameters(like)
    if theta.shape != (needed,):
        raise ValueError(f"theta has shape {tuple(theta.shape)}, the parameters need ({needed},)")
    out, start = {}, 0
    for name, p in like.items():
        out[name] = theta[start : start + p.numel()].reshape(p.shape)
        start += p.numel()
    return out


def _check_finite(params: Params, inputs: Sequence[torch.Tensor]) -> None:
    for name, p in params.items():
        if not torch.isfinite(p).all():
            raise ValueError(f"parameter {name!r} contains NaN or inf")
    for i, x in enumerate(inputs):
        if not torch.isfinite(x).all():
            raise ValueError(f"input {i} contains NaN or inf")


def input_jacobian(fn: Model, params: Params, x: torch.Tensor, mode: Mode = "auto") -> torch.Tensor:
    """The block of J for one input: shape (number of outputs of fn(params, x), P).

    ``auto`` picks forward mode when there are no more parameters than outputs (cost grows
    with P) and reverse mode otherwise (cost grows with the number of outputs).
    """
    theta = flatten(params)

    def flat_output(t: torch.Tensor) -> torch.Tensor:
        return fn(unflatten(t, params), x).reshape(-1)

    if mode == "auto":
        with torch.no_grad():
            n_out = fn(params, x).numel()
        mode = "forward" if theta.numel() <= n_out else "reverse"
    if mode == "forward":
        return jacfwd(flat_output)(theta)
    if mode == "reverse":
        return jacrev(flat_output)(theta)
    raise ValueError(f"mode must be 'auto', 'forward' or 'reverse', got {mode!r}")


def jacobian_matrix(fn: Model, params: Params, inputs: Sequence[torch.Tensor], mode: Mode = "auto") -> torch.Tensor:
    """J: the per-input blocks stacked row-wise, shape (total outputs, P)."""
    if not inputs:
        raise ValueError("inputs is empty: the Jacobian needs at least one input")
    _check_finite(params, inputs)
    return torch.cat([input_jacobian(fn, params, x, mode) for x in inputs])


class RankAccumulator:
    """Jacobian blocks folded into the triangular factor R of a running QR factorisation.

    R <- qr([R; blocks]).R has the same singular values as all blocks stacked, but only
    P x P entries. Blocks are folded in chunks of at least P rows, so a QR runs once per
    chunk rather than once per input. More blocks can be added after a decision.
    """

    def __init__(self, n_params: int) -> None:
        self.n_params = n_params
        self.n_rows = 0
        self._r: torch.Tensor | None = None
        self._pending: list[torch.Tensor] = []

    def add(self, block: torch.Tensor) -> None:
        if block.ndim != 2 or block.shape[1] != self.n_params:
            raise ValueError(f"block must have shape (rows, {self.n_params}), got {tuple(block.shape)}")
        self._pending.append(block)
        self.n_rows += block.shape[0]
        if sum(b.shape[0] for b in self._pending) >= self.n_params:
            self._fold()

    def _fold(self) -> None:
        if not self._pending:
            return
        parts = ([] if self._r is None else [self._r]) + self._pending
        self._r = torch.linalg.qr(torch.cat(parts), mode="r").R
        self._pending = []

    def decide(self, *, zero_tol: float = DEFAULT_ZERO_TOL, min_gap: float = DEFAULT_MIN_GAP) -> RankDecision:
        """The rank decision for all blocks added so far."""
        self._fold()
        if self._r is None:
            raise ValueError("no Jacobian blocks added")
        return decide_rank(torch.linalg.svdvals(self._r), self.n_rows, self.n_params, zero_tol=zero_tol, min_gap=min_gap)


def functional_rank(
    fn: Model,
    params: Params,
    inputs: Sequence[torch.Tensor],
    *,
    mode: Mode = "auto",
    zero_tol: float = DEFAULT_ZERO_TOL,
    min_gap: float = DEFAULT_MIN_GAP,
    progress: bool = False,
    accumulator: RankAccumulator | None = None,
) -> RankDecision:
    """Decide the rank of J (see ``attnid.rank``) without ever holding all of J.

    The per-input blocks go through a ``RankAccumulator`` (pass one to keep adding inputs
    later). Computed in the dtype of the parameters (use float64).
    """
    if not inputs:
        raise ValueError("inputs is empty: the Jacobian needs at least one input")
    _check_finite(params, inputs)
    acc = RankAccumulator(count_parameters(params)) if accumulator is None else accumulator
    for x in tqdm(inputs, desc="jacobian", disable=not progress, leave=False):
        acc.add(input_jacobian(fn, params, x, mode))
    return acc.decide(zero_tol=zero_tol, min_gap=min_gap)
