"""Multi-head latent attention (MLA, DeepSeek-V2/V3, Kimi K2): layout, reference layer, symmetries, count.

Shapes (per-head layout; d = d_model, H heads, c = kv_lora_rank, c' = q_lora_rank,
d_n / d_r / d_v the non-rotated query-key, rotated query-key and value widths per head):

    with q_lora_rank:   W_DQ (d, c')   g_Q (c')   W_UQ (H, c', d_n + d_r)
    without (V2-Lite):  W_Q (H, d, d_n + d_r)
    W_DKV (d, c)   g_KV (c)   W_KR (d, d_r)   W_UK (H, c, d_n)   W_UV (H, c, d_v)   W_O (H, d_v, d)

    N(z)    = z / sqrt(mean(z^2) + eps)                     RMSNorm without its weight
    C_Q     = N(X W_DQ) diag(g_Q)                           query latent (or C_Q = X, W_UQ = W_Q)
    C_KV    = N(X W_DKV) diag(g_KV)                         key/value latent, shared by all heads
    [Q_h^n, Q_h^r] = C_Q W_UQ^h                             split after d_n columns
    K_h^n = C_KV W_UK^h,  V_h = C_KV W_UV^h,  K^r = X W_KR  one rotated key for all heads
    S_h   = (Q_h^n K_h^n^T + RoPE(Q_h^r) RoPE(K^r)^T) / sqrt(d_n + d_r)   causal
    Y     = sum_h softmax(S_h) V_h W_O^h

transformers' ``DeepseekV3Attention`` splits ``kv_a_proj_with_mqa`` into W_DKV (first c outputs)
and W_KR (last d_r), and ``kv_b_proj`` head by head into W_UK^h and W_UV^h; ``hf_cross_check``
maps the weights both ways and compares outputs. Its latent RMSNorms are built with their
default eps = 1e-6 (``HF_LATENT_NORM_EPS``), not the config's ``rms_norm_eps`` (the block norms).

Symmetries (``tangent_directions`` gives the Lie algebra at a point, ``random_symmetry`` a group
element; the chapter proves each leaves Y unchanged):

* each latent space (c, and c' when present): O(c) acting on the down-projection's columns and,
  through diag(g), on the up-projection's rows, because N(z M) = N(z) M for orthogonal M;
  the norm weight against the rows of the up-projection (c directions); and when eps = 0 the
  scale of the down-projection, since then N(t z) = N(z). With eps > 0 that scale changes Y,
  but only by a relative amount of order eps / mean(z^2): weakly identified, not unidentified.
* per head: GL(d_n) between the non-rotated query and key columns, GL(d_v) between W_UV^h and W_O^h;
* the RoPE commutant (d_r dimensions: a complex scalar per rotated pair), one for all heads
  together, because the rotated key K^r is shared.

``count`` adds these up when the widths make every factor generic (``Count.covered``); the
numeric nullity (``verify``) is measured with ``attnid.rank``'s rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from attnid.layout import Params
from attnid.families.mla.spec import HF_LATENT_NORM_EPS, MLASpec
from attnid.families.mla.layer import check_params, forward, init_params, kv_latent, parameter_shapes, query_states
from attnid.families.mla.count import count, coverage_problems, latent_symmetry_dimension, total_parameters
from attnid.families.mla.symmetry import apply_symmetry, labelled_tangent_directions, MLASymmetry, orbit_dimension, random_symmetry, rope_commutant_basis, scale_direction, tangent_basis
from attnid.families.mla.verify import MLAVerification, default_seq_len, estimate, verify
from attnid.families.mla.hf import hf_cross_check, hf_module, hf_nullity, HFCrossCheck, HFMLA

__all__ = [
    "HFCrossCheck",
    "HFMLA",
    "HF_LATENT_NORM_EPS",
    "MLASpec",
    "MLASymmetry",
    "MLAVerification",
    "default_seq_len",
    "estimate",
    "apply_symmetry",
    "check_params",
    "count",
    "example",
    "coverage_problems",
    "forward",
    "from_hf_config",
    "hf_cross_check",
    "hf_module",
    "hf_nullity",
    "init_params",
    "kv_latent",
    "labelled_tangent_directions",
    "latent_symmetry_dimension",
    "orbit_dimension",
    "parameter_shapes",
    "query_states",
    "random_symmetry",
    "rope_commutant_basis",
    "scale_direction",
    "tangent_columns",
    "tangent_basis",
    "total_parameters",
    "verify",
]


def example() -> MLASpec:
    """A small latent layout with both latents and a rotated part, quick to verify."""
    return MLASpec(d_model=8, heads=2, kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2,
                   q_lora_rank=4)


def from_hf_config(cfg: Mapping[str, Any]) -> tuple[MLASpec, dict[str, str]]:
    """The layout of a DeepSeek-style config.json, and the keys it did not read, each with the reason."""
    return MLASpec.from_hf_config(cfg)


def tangent_columns(params: Params, spec: MLASpec) -> torch.Tensor:
    """The orbit's tangent directions at ``params`` as the columns of a (P, k) matrix (``tangent_basis`` gives rows)."""
    return tangent_basis(params, spec).T
