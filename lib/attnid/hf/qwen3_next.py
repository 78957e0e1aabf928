"""The transformers cross-check of output-gated attention (``attnid.families.gated``): Qwen3-Next's
full-attention layer, built with random float64 weights, against attnid's layer with the same weights.
"""

from __future__ import annotations
from typing import Any
import torch
from attnid import symmetry
from attnid.layout import Params
from attnid.families.gated import GATE_PARAMS, GatedSpec, move_value_coordinates, count, forward, tangent_basis


def _qwen3_next_layer(spec: GatedSpec, generator: torch.Generator) -> Any:
    """Qwen3NextAttention for ``spec`` with random float64 weights, and its converters to and from attnid's names.

    Its q_proj writes, per head, the d_k query entries and then the d_k gate entries; its norms
    multiply by 1 + weight.
    """
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextAttention

    from attnid.hf import modules as hf

    base = spec.base
    h, dk = base.heads, base.head_dim
    config = Qwen3NextConfig(hidden_size=base.d_model, num_attention_heads=h, num_key_value_heads=base.kv_heads,
                             head_dim=dk, num_hidden_layers=1, layer_types=["full_attention"],
                             rms_norm_eps=base.qk_norm_eps, attention_bias=spec.gate_bias,
                             partial_rotary_factor=base.rope_dims / dk, attn_implementation=hf.SOFTMAX_IN_FLOAT64,
                             rope_parameters={"rope_type": "default", "rope_theta": base.rope_base,
                                              "partial_rotary_factor": base.rope_dims / dk})
    module = hf._randomise(Qwen3NextAttention(config, 0), generator, base.d_model**-0.5)
    with torch.no_grad():
        for norm in (module.q_norm, module.k_norm):
            gamma = (1 + 0.3 * torch.randn(norm.weight.shape, generator=generator, dtype=torch.float64)).clamp(0.6, 1.9)
            norm.weight.copy_(gamma - 1)  # gamma in [0.6, 1.9]: gamma - 1 + 1 is gamma exactly (Sterbenz)
    linear = hf._linear_maps(base)

    def to_attnid(w: Params) -> dict[str, torch.Tensor]:
        halves = w["q_proj.weight"].reshape(h, 2, dk, base.d_model)
        inner = dict(w, **{"q_proj.weight": halves[:, 0].reshape(h * dk, -1)})
        if spec.gate_bias:
            inner["q_proj.bias"] = w["q_proj.bias"].reshape(h, 2, dk)[:, 0].reshape(-1)
        out = linear[0](inner)
        out["q_norm"], out["k_norm"] = w["q_norm.weight"] + 1, w["k_norm.weight"] + 1
        out["W_G"] = halves[:, 1].transpose(1, 2)
        if spec.gate_bias:
            out["b_G"] = w["q_proj.bias"].reshape(h, 2, dk)[:, 1]
        return out

    def from_attnid(p: Params) -> dict[str, torch.Tensor]:
        out = linear[1](p)
        query = out["q_proj.weight"].reshape(h, 1, dk, base.d_model)
        out["q_proj.weight"] = torch.cat([query, p["W_G"].transpose(1, 2)[:, None]], 1).reshape(2 * h * dk, -1)
        if spec.gate_bias:
            out["q_proj.bias"] = torch.stack([p["b_Q"], p["b_G"]], 1).reshape(-1)
        out["q_norm.weight"], out["k_norm.weight"] = p["q_norm"] - 1, p["k_norm"] - 1
        return out

    def forward_kwargs(x: torch.Tensor) -> dict:
        from attnid.rope import rope_tables

        cos, sin = rope_tables(x.shape[-2], base.rope_dims, base.rope_base, torch.float64, x.device)
        batch = x.shape[0]
        return {"position_embeddings": (cos[None].expand(batch, -1, -1), sin[None].expand(batch, -1, -1)),
                "attention_mask": hf.additive_causal_mask(x.shape[-2], x.dtype)}

    return hf.HFLayer("qwen3_next", module, base, to_attnid, from_attnid, forward_kwargs)


def hf_cross_check(spec: GatedSpec, seed: int = 0, seq_len: int = 8) -> Any:
    """Qwen3-Next's own attention against attnid: the same function, the orbit's moves, the count (``hf.CrossCheck``).

    Errors are relative to the output's size: ``same_function`` (``forward`` against the module,
    same weights), ``symmetry_change`` (a finite move: the ungated layer's QK-norm trades and
    per-group scales of the value coordinates), ``off_orbit_change`` (a 1e-4 step orthogonal to
    ``tangent_basis``); ``numeric`` is the nullity of the module's own float64 Jacobian.
    """
    from attnid.hf import modules as hf
    from attnid.budget import default_inputs

    if spec.gate != "elementwise" or spec.base.qk_norm != "shared" or not spec.causal:
        raise ValueError("Qwen3-Next's layer has an elementwise gate, a shared QK-norm and a causal mask: "
                         "build its layout with qwen3_next_spec")

    def move(params: Params, gen: torch.Generator) -> dict[str, torch.Tensor]:
        ungated = {k: v for k, v in params.items() if k not in GATE_PARAMS}
        moved = {**params, **symmetry.random_qk_norm_move(ungated, spec.base, gen, scale=0.5)}
        moved.update(move_value_coordinates(moved, spec, gen))
        return moved

    layer_ = _qwen3_next_layer(spec, torch.Generator().manual_seed(seed))
    with hf.float64_kept():
        return hf.module_cross_check("qwen3_next", layer_, spec, lambda p, x: forward(p, x, spec),
                                     lambda p: tangent_basis(p, spec), move, count(spec).unidentified, seed=seed,
                                     seq_len=seq_len, n_inputs=default_inputs(spec.base, seq_len) + 4)
