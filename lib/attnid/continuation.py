"""A QK-norm layer's scores continued to complex inputs: the quantities of chapter 8's pole argument.

The proof of ``prop-qk-several-heads`` (chapter 8) moves one key token along a line,
x_m = u + lambda v, and continues row p's output to complex lambda. Each key normaliser
rho_g(lambda)^2 = |kappa_g + lambda nu_g|^2 / k + eps (kappa_g = u W_K^g + b_K^g, nu_g = v W_K^g; with
'full' one normaliser over all groups' k = G d_k entries) is a real quadratic with two non-real
roots, its branch points. Near a root lambda_g, on the double cover lambda = lambda_g + tau^2, the score of
head h at key m is b_h / tau + O(1). The proof asks of a generic point and input: non-real roots,
no root shared by two normalisers, every b_h != 0, and b_h / b_h' not real for two heads read through
one normaliser. ``pole_margins`` measures these at a point, with the layer's own projections,
norm and RoPE (``attnid.layer``, ``attnid.rope``) evaluated in complex arithmetic (the norm's
mean square is the bilinear z^2, the analytic continuation of the real formula).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attnid.layer import check_params, project
from attnid.rope import apply_rope
from attnid.spec import AttentionSpec

Params = dict[str, torch.Tensor]


def scores(params: Params, x: torch.Tensor, spec: AttentionSpec) -> torch.Tensor:
    """(H, n, n) scores q_h R k_g^T / sqrt(d_k) of a complex input x (n, d): the layer's formula, continued."""
    check_params(params, spec)
    q, k, _ = project({name: p.to(torch.complex128) for name, p in params.items()}, x, spec)
    groups = torch.tensor([spec.group_of_head(h) for h in range(spec.heads)])
    q, k = apply_rope(q, spec.rope_dims, spec.rope_base), apply_rope(k, spec.rope_dims, spec.rope_base)
    return q @ k.index_select(0, groups).transpose(-1, -2) / math.sqrt(spec.head_dim)


def branch_points(params: Params, spec: AttentionSpec, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The root in the upper half-plane of each key normaliser's rho^2(lambda) (G values; one with 'full')."""
    kappa = torch.einsum("d,gdk->gk", u, params["W_K"]) + params.get("b_K", 0.0)
    nu = torch.einsum("d,gdk->gk", v, params["W_K"])
    if spec.qk_norm == "full":
        kappa, nu = kappa.reshape(1, -1), nu.reshape(1, -1)
    width = kappa.shape[1]
    a, b = (nu * nu).sum(1) / width, 2 * (kappa * nu).sum(1) / width
    c = (kappa * kappa).sum(1) / width + spec.qk_norm_eps
    disc = (b * b - 4 * a * c).to(torch.complex128)
    roots = (-b + torch.sqrt(disc)) / (2 * a)
    return torch.where(roots.imag < 0, roots.conj(), roots)


@dataclass(frozen=True)
class PoleMargins:
    """How far a point and an input are from failing the pole argument's conditions (all should be > 0)."""

    root_imag: float      # min |Im lambda_g| / |lambda_g|: the roots are not real
    root_gap: float       # min distance between roots of two normalisers (and their conjugates), relative; inf if one
    laurent_min: float    # min |b_h| over the heads, relative to the largest
    laurent_drift: float  # max relative change of |tau s_h| between tau = t and t / 10: O(t) for a simple pole
    ratio_imag: float     # min |Im(b_h / b_h')| / |b_h / b_h'| over heads of one normaliser; inf if none share


def pole_margins(params: Params, spec: AttentionSpec, u: torch.Tensor, v: torch.Tensor, *, p: int = 2, m: int = 1,
                 t: float = 1e-4) -> PoleMargins:
    """The conditions of the pole argument at ``params`` for the input of length max(p, m) + 1 with x_m = u + lambda v."""
    if not spec.has_qk_norm:
        raise ValueError("the pole argument is about layouts with a QK-norm")
    roots = branch_points(params, spec, u, v)
    points = torch.cat([roots, roots.conj()])
    gaps = [abs(points[i] - points[j]).item() for i in range(len(roots)) for j in range(len(points))
            if j % len(roots) != i]
    scale = roots.abs().max().item()
    readers = [0] * spec.heads if spec.qk_norm == "full" else [spec.group_of_head(h) for h in range(spec.heads)]
    n = max(p, m) + 1
    laurent = torch.zeros(2, spec.heads, dtype=torch.complex128)
    for h in range(spec.heads):
        for i, tau in enumerate((t, t / 10)):
            x = u.to(torch.complex128).repeat(n, 1)
            x[m] = u + (roots[readers[h]] + tau**2) * v
            laurent[i, h] = tau * scores(params, x, spec)[h, p, m]
    drift = ((laurent[0].abs() - laurent[1].abs()).abs() / laurent[1].abs()).max().item()
    ratios = [laurent[1, h] / laurent[1, k] for h in range(spec.heads) for k in range(h + 1, spec.heads)
              if readers[h] == readers[k]]
    return PoleMargins(
        root_imag=(roots.imag.abs() / roots.abs()).min().item(),
        root_gap=min(gaps) / scale if gaps else math.inf,
        laurent_min=(laurent[1].abs().min() / laurent[1].abs().max()).item(),
        laurent_drift=drift,
        ratio_imag=min((abs(r.imag) / abs(r)).item() for r in ratios) if ratios else math.inf,
    )
