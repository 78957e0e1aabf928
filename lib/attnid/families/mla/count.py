"""The exact count of a latent-attention layout (the chapter's theorem), with its coverage conditions."""

from __future__ import annotations

import math

from attnid.layout import Count
from attnid.families.mla.layer import parameter_shapes
from attnid.families.mla.spec import MLASpec

def total_parameters(spec: MLASpec) -> int:
    """All parameters of the layer, norm weights included."""
    return sum(math.prod(shape) for shape in parameter_shapes(spec).values())


def coverage_problems(spec: MLASpec) -> list[str]:
    """The width conditions the closed form needs that this layout breaks (empty: covered).

    Each latent must be no wider than the model (so X W_D has full column rank c), and each
    per-head factor no wider than the two spaces it joins (so the products are generic of full rank).
    """
    d, c, qin = spec.d_model, spec.kv_lora_rank, spec.query_input
    dn, dr, dv = spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.v_head_dim
    conditions = [
        (c <= d, f"kv_lora_rank {c} > d_model {d}"),
        (spec.q_lora_rank is None or spec.q_lora_rank <= d, f"q_lora_rank {spec.q_lora_rank} > d_model {d}"),
        (dn <= min(qin, c), f"qk_nope_head_dim {dn} > min(query input {qin}, kv_lora_rank {c})"),
        (dv <= min(c, d), f"v_head_dim {dv} > min(kv_lora_rank {c}, d_model {d})"),
        (dr <= min(qin, d), f"qk_rope_head_dim {dr} > min(query input {qin}, d_model {d})"),
    ]
    return [why for ok, why in conditions if not ok]


def latent_symmetry_dimension(width: int, eps: float) -> int:
    """dim O(c) + c norm weights + (1 if eps = 0: the down-projection's scale) = c (c + 1) / 2 + [eps = 0]."""
    return width * (width - 1) // 2 + width + (eps == 0)


def count(spec: MLASpec) -> Count:
    """Total and unidentified parameters per layer (the chapter's theorem), with the breakdown by source.

    ``weakly_identified`` is the number of directions that are unidentified at eps = 0 and only weakly
    identified at eps > 0 (the scale of each down-projection): 0 when eps = 0.
    """
    total = total_parameters(spec)
    problems = coverage_problems(spec)
    latents = 1 + (spec.q_lora_rank is not None)
    if problems:
        return Count(spec, total, None, {}, "not covered: " + "; ".join(problems))
    breakdown = {"kv_latent": latent_symmetry_dimension(spec.kv_lora_rank, spec.norm_eps)}
    if spec.q_lora_rank is not None:
        breakdown["q_latent"] = latent_symmetry_dimension(spec.q_lora_rank, spec.norm_eps)
    breakdown["query_key_nope"] = spec.heads * spec.qk_nope_head_dim**2
    breakdown["rope_commutant"] = spec.qk_rope_head_dim
    breakdown["value_output"] = spec.heads * spec.v_head_dim**2
    weak = latents if spec.norm_eps > 0 else 0
    return Count(spec, total, sum(breakdown.values()), breakdown, weakly_identified=weak)
