"""The symmetries of latent attention: tangent directions at a point, group elements and their action."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnid.jacobian import flatten
from attnid.rank import DEFAULT_ZERO_TOL, numerical_rank
from attnid.spec import Params
from attnid.families.mla.layer import check_params
from attnid.families.mla.spec import MLASpec

def _zeros_like(params: Params) -> dict[str, torch.Tensor]:
    return {name: torch.zeros_like(p) for name, p in params.items()}


def _latent_names(spec: MLASpec, which: str) -> tuple[str, str, tuple[str, ...]]:
    """(down-projection, norm weight, up-projections) of latent 'kv' or 'q'."""
    if which == "kv":
        return "W_DKV", "g_KV", ("W_UK", "W_UV")
    if which == "q" and spec.q_lora_rank is not None:
        return "W_DQ", "g_Q", ("W_UQ",)
    raise ValueError(f"latent must be 'kv' or, with a q_lora_rank, 'q'; got {which!r}")


def query_up_name(spec: MLASpec) -> str:
    return "W_Q" if spec.q_lora_rank is None else "W_UQ"


def rope_commutant_basis(rope_dims: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """(d_r, d_r, d_r): per rotated pair (i, i + d_r/2), the identity and the quarter turn on that pair.

    These span the matrices commuting with every RoPE rotation (the pairs turn at distinct speeds).
    """
    half = rope_dims // 2
    basis = torch.zeros(rope_dims, rope_dims, rope_dims, dtype=dtype)
    for i in range(half):
        a, b = i, i + half
        basis[2 * i, a, a] = basis[2 * i, b, b] = 1.0
        basis[2 * i + 1, a, b], basis[2 * i + 1, b, a] = -1.0, 1.0
    return basis


def labelled_tangent_directions(params: Params, spec: MLASpec) -> list[tuple[str, dict[str, torch.Tensor]]]:
    """The symmetry group's Lie algebra at ``params``: one tangent direction per generator, with its source.

    Sources: 'kv_latent' / 'q_latent' (rotations, norm weights, and the scale when eps = 0),
    'query_key_nope' (per head gl(d_n)), 'rope_commutant' (shared by all heads), 'value_output'
    (per head gl(d_v)). The number of directions equals ``count(spec).unidentified`` by construction;
    that they are independent (a trivial stabiliser) is what ``orbit_dimension`` measures.
    """
    check_params(params, spec)
    out: list[tuple[str, dict[str, torch.Tensor]]] = []
    for which in ("kv", "q") if spec.q_lora_rank is not None else ("kv",):
        down, gain, ups = _latent_names(spec, which)
        width = params[gain].shape[0]
        g = params[gain]
        for i in range(width):
            for j in range(i + 1, width):
                a = torch.zeros(width, width, dtype=g.dtype)
                a[i, j], a[j, i] = 1.0, -1.0
                t = _zeros_like(params)
                t[down] = params[down] @ a
                mix = -(torch.diag(1 / g) @ a @ torch.diag(g))  # d/dt of diag(g)^-1 M^T diag(g), M = exp(t A)
                for up in ups:
                    t[up] = torch.einsum("rs,hsk->hrk", mix, params[up])
                out.append((f"{which}_latent", t))
        for i in range(width):
            t = _zeros_like(params)
            t[gain][i] = g[i]
            for up in ups:
                t[up][:, i, :] = -params[up][:, i, :]
            out.append((f"{which}_latent", t))
        if spec.norm_eps == 0:
            t = _zeros_like(params)
            t[down] = params[down].clone()
            out.append((f"{which}_latent", t))
    dn, qup = spec.qk_nope_head_dim, query_up_name(spec)
    for h in range(spec.heads):
        for a in range(dn):
            for b in range(dn):
                t = _zeros_like(params)
                t[qup][h, :, b] = params[qup][h, :, a]  # W_Qn^h E_ab
                t["W_UK"][h, :, a] = -params["W_UK"][h, :, b]  # -W_UK^h E_ab^T
                out.append(("query_key_nope", t))
    for e in rope_commutant_basis(spec.qk_rope_head_dim, params["W_O"].dtype):
        t = _zeros_like(params)
        t[qup][..., dn:] = params[qup][..., dn:] @ e
        t["W_KR"] = -params["W_KR"] @ e.T
        out.append(("rope_commutant", t))
    dv = spec.v_head_dim
    for h in range(spec.heads):
        for a in range(dv):
            for b in range(dv):
                t = _zeros_like(params)
                t["W_UV"][h, :, b] = params["W_UV"][h, :, a]
                t["W_O"][h, a, :] = -params["W_O"][h, b, :]
                out.append(("value_output", t))
    return out


def tangent_basis(params: Params, spec: MLASpec) -> torch.Tensor:
    """The tangent directions flattened (in parameter order) as rows: (number of generators, P)."""
    return torch.stack([flatten(t) for _, t in labelled_tangent_directions(params, spec)])


def orbit_dimension(params: Params, spec: MLASpec, rel_tol: float = DEFAULT_ZERO_TOL) -> int:
    """Dimension of the span of the tangent directions, by the rank rule (``attnid.rank.numerical_rank``)."""
    return numerical_rank(torch.linalg.svdvals(tangent_basis(params, spec)), rel_tol)


@dataclass(frozen=True)
class MLASymmetry:
    """A group element: latent rotations and scales, per-head GL blocks, one RoPE-commutant element."""

    kv_rotation: torch.Tensor  # (c, c) orthogonal
    kv_gain: torch.Tensor  # (c,) non-zero: new g_KV = g_KV * kv_gain
    kv_scale: float  # multiplies W_DKV (must be 1 unless eps = 0)
    q_rotation: torch.Tensor | None
    q_gain: torch.Tensor | None
    q_scale: float
    nope: torch.Tensor  # (H, d_n, d_n) invertible: W_Qn^h M_h, W_UK^h M_h^-T
    value: torch.Tensor  # (H, d_v, d_v) invertible: W_UV^h M_h, M_h^-1 W_O^h
    rope: torch.Tensor  # (d_r, d_r) invertible, in the RoPE commutant: W_Qr^h C, W_KR C^-T


def _orthogonal(width: int, generator: torch.Generator, scale: float) -> torch.Tensor:
    a = torch.randn(width, width, generator=generator, dtype=torch.float64) * scale
    return torch.linalg.matrix_exp(a - a.T)


def random_symmetry(spec: MLASpec, generator: torch.Generator, scale: float = 0.3) -> MLASymmetry:
    """A random group element near the identity (``scale`` sets the distance)."""
    def near_identity(*shape: int) -> torch.Tensor:
        return torch.eye(shape[-1], dtype=torch.float64) + scale * torch.randn(*shape, generator=generator, dtype=torch.float64)

    def gains(width: int) -> torch.Tensor:
        return torch.exp(scale * torch.randn(width, generator=generator, dtype=torch.float64))

    c, q = spec.kv_lora_rank, spec.q_lora_rank
    coeff = scale * torch.randn(spec.qk_rope_head_dim, generator=generator, dtype=torch.float64)
    rope = torch.eye(spec.qk_rope_head_dim, dtype=torch.float64) + torch.einsum(
        "k,kij->ij", coeff, rope_commutant_basis(spec.qk_rope_head_dim))
    free_scale = spec.norm_eps == 0
    return MLASymmetry(
        kv_rotation=_orthogonal(c, generator, scale), kv_gain=gains(c),
        kv_scale=float(torch.exp(scale * torch.randn((), generator=generator, dtype=torch.float64))) if free_scale else 1.0,
        q_rotation=None if q is None else _orthogonal(q, generator, scale), q_gain=None if q is None else gains(q),
        q_scale=(float(torch.exp(scale * torch.randn((), generator=generator, dtype=torch.float64)))
                 if free_scale and q is not None else 1.0),
        nope=near_identity(spec.heads, spec.qk_nope_head_dim, spec.qk_nope_head_dim),
        value=near_identity(spec.heads, spec.v_head_dim, spec.v_head_dim), rope=rope)


def apply_symmetry(params: Params, spec: MLASpec, element: MLASymmetry) -> dict[str, torch.Tensor]:
    """The moved point; the layer's output is unchanged (the chapter's lemma; tests check it).

    Latent (down D, weight g, ups U): D -> t D M, g -> g * s, U -> diag(g s)^-1 M^T diag(g) U, using
    N(t z M) = N(z) M for orthogonal M (and t > 0 only when eps = 0).
    """
    check_params(params, spec)
    if spec.norm_eps != 0 and (element.kv_scale != 1.0 or element.q_scale != 1.0):
        raise ValueError("a down-projection scale other than 1 is a symmetry only when norm_eps = 0")
    p = {name: t.clone() for name, t in params.items()}
    latents = [("kv", element.kv_rotation, element.kv_gain, element.kv_scale)]
    if spec.q_lora_rank is not None:
        if element.q_rotation is None or element.q_gain is None:
            raise ValueError("the layout has a query latent: the element needs q_rotation and q_gain")
        latents.append(("q", element.q_rotation, element.q_gain, element.q_scale))
    for which, m, s, t in latents:
        down, gain, ups = _latent_names(spec, which)
        g = params[gain]
        p[down] = t * params[down] @ m
        p[gain] = g * s
        mix = torch.diag(1 / (g * s)) @ m.T @ torch.diag(g)
        for up in ups:
            p[up] = torch.einsum("rs,hsk->hrk", mix, p[up])
    dn, qup = spec.qk_nope_head_dim, query_up_name(spec)
    q = p[qup]
    q_nope = torch.einsum("hik,hkl->hil", q[..., :dn], element.nope)
    q_rope = q[..., dn:] @ element.rope
    p[qup] = torch.cat([q_nope, q_rope], dim=-1)
    p["W_UK"] = torch.einsum("hik,hlk->hil", p["W_UK"], torch.linalg.inv(element.nope))
    if spec.qk_rope_head_dim:
        p["W_KR"] = params["W_KR"] @ torch.linalg.inv(element.rope).T
    p["W_UV"] = torch.einsum("hik,hkl->hil", p["W_UV"], element.value)
    p["W_O"] = torch.einsum("hkl,hld->hkd", torch.linalg.inv(element.value), p["W_O"])
    return p


def scale_direction(params: Params, spec: MLASpec, which: str = "kv") -> dict[str, torch.Tensor]:
    """The direction that scales one down-projection (W_DKV or W_DQ): unidentified at eps = 0, weak at eps > 0."""
    down, _, _ = _latent_names(spec, which)
    t = _zeros_like(params)
    t[down] = params[down].clone()
    return t
