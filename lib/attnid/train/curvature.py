"""Curvature of a training problem at a point: the Hessian of the loss with respect to the attention layer.

Used to test the conditioning explanation of rebalancing (chapter 10): the sharpness
lambda_max(H) bounds the step sizes at which gradient descent is stable (eta < 2 / lambda_max
for a quadratic), and moving along the orbit changes H while leaving the function unchanged.
"""

from __future__ import annotations

import torch

from attnid.jacobian import flatten, unflatten
from attnid.train.training import ATTENTION_PREFIX, Problem, attention_part


def attention_hessian(problem: Problem, params: dict[str, torch.Tensor]) -> torch.Tensor:
    """The (P, P) Hessian of ``problem.loss`` with respect to the attention layer's parameters, the rest held fixed."""
    attention = {n: p.detach() for n, p in attention_part(params).items()}
    rest = {n: p.detach() for n, p in params.items() if not n.startswith(ATTENTION_PREFIX)}

    def loss_of(flat: torch.Tensor) -> torch.Tensor:
        moved = {ATTENTION_PREFIX + n: p for n, p in unflatten(flat, attention).items()}
        return problem.loss({**rest, **moved})

    hessian = torch.autograd.functional.hessian(loss_of, flatten(attention))
    return (hessian + hessian.T) / 2


def sharpness(problem: Problem, params: dict[str, torch.Tensor]) -> float:
    """lambda_max of ``attention_hessian``: gradient descent on a quadratic with this curvature is stable for eta < 2 / lambda_max."""
    return float(torch.linalg.eigvalsh(attention_hessian(problem, params))[-1])
