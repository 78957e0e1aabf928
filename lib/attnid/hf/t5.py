"""The transformers cross-check of the relative-bias family (``attnid.families.relbias``): T5's attention
(encoder and decoder), built with random float64 weights, against attnid's layer with the same weights.
"""

from __future__ import annotations
import math
from typing import Any
import torch
from attnid import symmetry
from attnid.layout import Params
from attnid.families.relbias import RelativeBiasSpec, TABLE, count, count_length, forward, seen_buckets, tangent_basis


def _t5_layer(spec: RelativeBiasSpec, generator: torch.Generator) -> Any:
    """transformers' T5Attention for ``spec`` (encoder without a mask, decoder with one), random float64 weights.

    T5 does not scale its scores, so attnid's W_Q^h is sqrt(d_k) times the transpose of q's rows of head h;
    its table is ``relative_attention_bias.weight`` (buckets, H), transposed.
    """
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention

    from attnid.hf import modules as hf

    base = spec.base
    if base.bias or base.kv_heads != base.heads or base.window is not None or base.chunk is not None or \
            base.head_dim != base.v_head_dim or base.norm != "softmax":
        raise ValueError("T5's attention has no biases, one key/value head per head, d_k = d_v, plain softmax "
                         "and no window: give such a layout")
    h, dk, d = base.heads, base.head_dim, base.d_model
    config = T5Config(d_model=d, num_heads=h, d_kv=dk, relative_attention_num_buckets=spec.buckets,
                      relative_attention_max_distance=spec.max_distance, is_decoder=base.causal,
                      dropout_rate=0.0, attn_implementation="eager")
    module = hf._randomise(T5Attention(config, has_relative_attention_bias=True, layer_idx=0, is_causal=base.causal),
                           generator, d**-0.5)
    root = math.sqrt(dk)

    def to_attnid(w: Params) -> dict[str, torch.Tensor]:
        per_head = {n: w[f"{n}.weight"].reshape(h, dk, d).transpose(1, 2) for n in "qkv"}
        return {"W_Q": per_head["q"] * root, "W_K": per_head["k"], "W_V": per_head["v"],
                "W_O": w["o.weight"].reshape(d, h, dk).permute(1, 2, 0), TABLE: w["relative_attention_bias.weight"].T}

    def from_attnid(p: Params) -> dict[str, torch.Tensor]:
        rows = {n: p[f"W_{n.upper()}"].transpose(1, 2).reshape(h * dk, d) for n in "qkv"}
        return {"q.weight": rows["q"] / root, "k.weight": rows["k"], "v.weight": rows["v"],
                "o.weight": p["W_O"].permute(2, 0, 1).reshape(d, h * dk),
                "relative_attention_bias.weight": p[TABLE].T}

    def forward_kwargs(x: torch.Tensor) -> dict:
        return {"mask": hf.additive_causal_mask(x.shape[-2], x.dtype)} if base.causal else {}

    return hf.HFLayer("t5", module, base, to_attnid, from_attnid, forward_kwargs)


def hf_cross_check(spec: RelativeBiasSpec, seed: int = 0) -> Any:
    """T5's own attention against attnid: the same function, the moves, the count, at the layout's length.

    As ``attnid.families.gated.hf_cross_check``: ``same_function``, ``symmetry_change`` (a random move of
    the layer without the table and a shift of each head's table), ``off_orbit_change`` (a 1e-4
    step orthogonal to ``tangent_basis``), all relative to the output's size, and ``numeric``, the
    nullity of the module's own float64 Jacobian.
    """
    from attnid.hf import modules as hf
    from attnid.budget import default_inputs

    def move(params: Params, gen: torch.Generator) -> dict[str, torch.Tensor]:
        base_params = {k: v for k, v in params.items() if k != TABLE}
        moved = symmetry.apply_group(base_params, spec.base, symmetry.random_group_element(spec.base, gen, scale=0.5))
        shifts = torch.randn(spec.heads, 1, generator=gen, dtype=torch.float64)
        seen = torch.isin(torch.arange(spec.buckets), torch.tensor(seen_buckets(spec)))
        return {**moved, TABLE: params[TABLE] + shifts * seen}

    n = count_length(spec)
    return hf.module_cross_check("t5", _t5_layer(spec, torch.Generator().manual_seed(seed)), spec,
                                 lambda p, x: forward(p, x, spec), lambda p: tangent_basis(p, spec), move,
                                 count(spec).unidentified, seed=seed, seq_len=n,
                                 n_inputs=default_inputs(spec.base, n) + 4)
