"""Certified rank decisions: the rule of ``attnid.rank`` without computing the full spectrum.

A full SVD of a P x P Jacobian costs about 4 P^3 flops and dominates verification at
P in the thousands. When a candidate null space is known (the orbit tangent T, P x u with
orthonormal columns, from ``attnid.symmetry``), two bounds settle the decision at the cost
of one Gram matrix and two Cholesky factorisations:

* t_{r+1} <= ||J T||_2 / s_1 with r = P - u. By Courant-Fischer, the (P-u+1)-th singular
  value is at most the largest stretch of J on any u-dimensional subspace.
* t_r >= sqrt(c) / s_1 whenever K - c I is positive definite, K = J^T J + s^2 T T^T.
  For unit v orthogonal to T, v^T K v = ||J v||^2, so the smallest stretch of J on the
  (P-u)-dimensional complement of T is at least sqrt(lambda_min(K)), and by Courant-Fischer
  so is the (P-u)-th singular value. A Cholesky factorisation of K - c I succeeds exactly
  when K - c I is positive definite; c comes from inverse iteration and is halved for margin.

||J T||_2 is bounded above by the Frobenius norm of J T. s_1 comes from power iteration on
J^T J: a lower bound, accurate to many digits after ``POWER_STEPS`` steps, which can only
overstate t_{r+1}; its relative error is negligible next to the five or more decades
that separate ``GRAM_FLOOR`` from the zero tolerance. The Gram matrix squares the
condition number, so only t_r >= ``GRAM_FLOOR`` (a tolerance of ``attnid.rank``) is certified; below it, or when a
factorisation fails (an extra null direction, or T not in the null space), the certificate
gives up and the caller falls back to the full SVD.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from tqdm import tqdm

from .jacobian import Mode, Model, count_parameters, input_jacobian
from .rank import DEFAULT_MIN_GAP, DEFAULT_ZERO_TOL, GRAM_FLOOR, RankDecision
from .spec import Params

POWER_STEPS = 100
INVERSE_STEPS = 30


def _largest_eigenvalue_lower_bound(gram: torch.Tensor) -> float:
    """A Rayleigh quotient after power iteration: never above lambda_max(gram)."""
    x = torch.ones(gram.shape[0], dtype=gram.dtype, device=gram.device)
    for _ in range(POWER_STEPS):
        x = gram @ x
        x = x / x.norm()
    return float(x @ (gram @ x))


def _smallest_eigenvalue_estimate(chol: torch.Tensor, k: torch.Tensor) -> float:
    """Rayleigh quotient after inverse iteration with the Cholesky factor of k (an estimate, not a bound)."""
    x = torch.linspace(1.0, 2.0, k.shape[0], dtype=k.dtype, device=k.device)
    for _ in range(INVERSE_STEPS):
        x = torch.cholesky_solve(x[:, None], chol)[:, 0]
        x = x / x.norm()
    return float(x @ (k @ x))


def certify_nullity(
    fn: Model,
    params: Params,
    inputs: Sequence[torch.Tensor],
    basis: torch.Tensor,
    *,
    mode: Mode = "auto",
    zero_tol: float = DEFAULT_ZERO_TOL,
    min_gap: float = DEFAULT_MIN_GAP,
    progress: bool = False,
) -> RankDecision | None:
    """A certified decision that the null space of J is exactly span(basis), or None if it cannot be proved."""
    n_params = count_parameters(params)
    if basis.ndim != 2 or basis.shape[0] != n_params:
        raise ValueError(f"basis must have shape ({n_params}, u), got {tuple(basis.shape)}")
    gram = torch.zeros(n_params, n_params, dtype=basis.dtype, device=basis.device)
    stretched: list[torch.Tensor] = []
    n_rows = 0
    for x in tqdm(inputs, desc="jacobian", disable=not progress, leave=False):
        block = input_jacobian(fn, params, x, mode)
        n_rows += block.shape[0]
        gram += block.T @ block
        stretched.append(block @ basis)
    sigma_1 = math.sqrt(max(_largest_eigenvalue_lower_bound(gram), 0.0))
    if sigma_1 == 0.0:
        return None
    null_stretch = float(torch.cat(stretched).norm()) if basis.shape[1] else 0.0  # Frobenius >= spectral
    k = gram + sigma_1**2 * (basis @ basis.T)
    chol, info = torch.linalg.cholesky_ex(k)
    if int(info):
        return None
    shift = 0.5 * _smallest_eigenvalue_estimate(chol, k)
    if shift <= 0.0:
        return None
    _, info = torch.linalg.cholesky_ex(k - shift * torch.eye(n_params, dtype=k.dtype, device=k.device))
    if int(info):
        return None
    kept = math.sqrt(shift) / sigma_1
    if kept < GRAM_FLOOR:
        return None
    dropped = null_stretch / sigma_1 if basis.shape[1] else math.nan
    return RankDecision(
        singular_values=None, n_rows=n_rows, n_params=n_params, rank=n_params - basis.shape[1],
        zero_tol=zero_tol, min_gap=min_gap, kept_bound=kept, dropped_bound=dropped,
    )
