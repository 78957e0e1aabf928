"""transformers' DeepSeek attention modules, their weights mapped both ways, and the cross-check."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attnid.same_weights import SameWeights
from attnid.jacobian import count_parameters
from attnid.normalise import additive_mask, causal_mask
from attnid.rank import RankDecision
from attnid.rope import rope_tables
from attnid.spec import Params
from attnid.families.mla.layer import forward, init_params, parameter_shapes
from attnid.families.mla.spec import MLASpec
from attnid.families.mla.symmetry import query_up_name, apply_symmetry, random_symmetry

def _hf_norm_float64(norm: torch.nn.Module) -> None:
    """Make a DeepseekV3RMSNorm keep the input's dtype (transformers casts to float32 inside); same formula."""
    def forward(hidden: torch.Tensor) -> torch.Tensor:
        return norm.weight * (hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon))
    norm.forward = forward  # type: ignore[method-assign]


@dataclass
class HFMLA:
    """A transformers DeepSeek attention module with the maps between its weights and this module's."""

    version: str
    module: torch.nn.Module
    spec: MLASpec
    interleave: bool

    def _perm(self) -> torch.Tensor:
        """Rotated coordinates in transformers' interleaved order -> rotate-half order (identity if not interleaved)."""
        r = self.spec.qk_rope_head_dim
        if not self.interleave:
            return torch.arange(r)
        return torch.cat([torch.arange(0, r, 2), torch.arange(1, r, 2)])

    def weights(self) -> dict[str, torch.Tensor]:
        return {name: p.detach().clone() for name, p in self.module.named_parameters()}

    def to_attnid(self, w: Params) -> dict[str, torch.Tensor]:
        s = self.spec
        h, c, dn, dr, dv, d = s.heads, s.kv_lora_rank, s.qk_nope_head_dim, s.qk_rope_head_dim, s.v_head_dim, s.d_model
        perm = self._perm()
        out: dict[str, torch.Tensor] = {}
        qw = w["q_proj.weight"] if s.q_lora_rank is None else w["q_b_proj.weight"]  # (H (dn + dr), in)
        q = qw.T.reshape(-1, h, dn + dr).permute(1, 0, 2)  # (H, in, dn + dr)
        q = torch.cat([q[..., :dn], q[..., dn:][..., perm]], dim=-1)
        if s.q_lora_rank is None:
            out["W_Q"] = q
        else:
            out.update({"W_DQ": w["q_a_proj.weight"].T, "g_Q": w["q_a_layernorm.weight"], "W_UQ": q})
        a = w["kv_a_proj_with_mqa.weight"].T  # (d, c + dr)
        out.update({"W_DKV": a[:, :c], "g_KV": w["kv_a_layernorm.weight"]})
        if dr:
            out["W_KR"] = a[:, c:][:, perm]
        b = w["kv_b_proj.weight"].T.reshape(c, h, dn + dv).permute(1, 0, 2)  # (H, c, dn + dv)
        out.update({"W_UK": b[..., :dn], "W_UV": b[..., dn:], "W_O": w["o_proj.weight"].T.reshape(h, dv, d)})
        return {name: out[name] for name in parameter_shapes(s)}

    def from_attnid(self, p: Params) -> dict[str, torch.Tensor]:
        s = self.spec
        h, c, dn, dr, dv, d = s.heads, s.kv_lora_rank, s.qk_nope_head_dim, s.qk_rope_head_dim, s.v_head_dim, s.d_model
        inverse = torch.argsort(self._perm())
        q = p[query_up_name(s)]
        q = torch.cat([q[..., :dn], q[..., dn:][..., inverse]], dim=-1)
        q = q.permute(1, 0, 2).reshape(q.shape[1], -1).T
        out = {"q_proj.weight": q} if s.q_lora_rank is None else {
            "q_a_proj.weight": p["W_DQ"].T, "q_a_layernorm.weight": p["g_Q"], "q_b_proj.weight": q}
        rope = p["W_KR"][:, inverse] if dr else p["W_DKV"][:, :0]
        out["kv_a_proj_with_mqa.weight"] = torch.cat([p["W_DKV"], rope], dim=1).T
        out["kv_a_layernorm.weight"] = p["g_KV"]
        out["kv_b_proj.weight"] = torch.cat([p["W_UK"], p["W_UV"]], dim=-1).permute(1, 0, 2).reshape(c, -1).T
        out["o_proj.weight"] = p["W_O"].reshape(h * dv, d).T
        return out

    def output(self, weights: Params, x: torch.Tensor) -> torch.Tensor:
        """The module's output for X (batch, n, d): causal additive mask, cos/sin from attnid.rope in float64."""
        from torch.func import functional_call
        from torch.nn.attention import SDPBackend, sdpa_kernel

        n = x.shape[-2]
        cos, sin = rope_tables(n, self.spec.qk_rope_head_dim, self.spec.rope_base, x.dtype, x.device)
        if self.version == "v2":
            angles = torch.atan2(sin, cos)[:, : self.spec.qk_rope_head_dim // 2]
            position = torch.polar(torch.ones_like(angles), angles)[None].expand(x.shape[0], -1, -1)
            kwargs = {"position_embeddings": position}
        else:
            kwargs = {"position_embeddings": (cos[None].expand(x.shape[0], -1, -1), sin[None].expand(x.shape[0], -1, -1))}
        mask = additive_mask(causal_mask(n, x.device), x.dtype)[None, None]
        with sdpa_kernel(SDPBackend.MATH):
            return functional_call(self.module, dict(weights), (x,), {**kwargs, "attention_mask": mask}, strict=True)[0]


def hf_module(spec: MLASpec, version: str = "v3", seed: int = 0, interleave: bool = True,
              norm_in_float64: bool = True) -> HFMLA:
    """transformers' DeepseekV3Attention (or V2's) for ``spec`` with random float64 weights; nothing downloaded.

    ``norm_in_float64`` keeps the latent RMSNorms in float64 (transformers computes them in float32
    inside a float64 module, the one place its code leaves the model's dtype); False leaves it as shipped.
    ``interleave`` is DeepSeek-V3's ``rope_interleave`` (V2 always pairs adjacent coordinates).
    """
    if version not in ("v2", "v3"):
        raise ValueError(f"version must be 'v2' or 'v3', got {version!r}")
    if not spec.causal:
        raise ValueError("the transformers DeepSeek attention is causal: use a spec with causal=True")
    if spec.qk_rope_head_dim == 0:
        raise ValueError("the transformers DeepSeek attention needs qk_rope_head_dim >= 2")
    common = dict(hidden_size=spec.d_model, num_attention_heads=spec.heads, num_key_value_heads=spec.heads,
                  q_lora_rank=spec.q_lora_rank, kv_lora_rank=spec.kv_lora_rank, qk_rope_head_dim=spec.qk_rope_head_dim,
                  qk_nope_head_dim=spec.qk_nope_head_dim, v_head_dim=spec.v_head_dim, head_dim=spec.qk_rope_head_dim,
                  num_hidden_layers=1, attention_bias=False, attn_implementation="sdpa",
                  rope_parameters={"rope_type": "default", "rope_theta": float(spec.rope_base)})
    if version == "v3":
        from transformers import DeepseekV3Config
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention
        module = DeepseekV3Attention(DeepseekV3Config(**common, rope_interleave=interleave), layer_idx=0)
    else:
        from transformers import DeepseekV2Config
        from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Attention
        module = DeepseekV2Attention(DeepseekV2Config(**common), layer_idx=0)
        interleave = True  # V2 rotates adjacent pairs as complex numbers
    module = module.to(torch.float64).eval()
    for norm in (module.kv_a_layernorm, module.q_a_layernorm):
        if norm is not None:
            norm.variance_epsilon = float(spec.norm_eps)
            if norm_in_float64:
                _hf_norm_float64(norm)
    layer = HFMLA(version, module, spec, interleave)
    gen = torch.Generator().manual_seed(seed)
    point = init_params(spec, gen)
    with torch.no_grad():
        for name, value in layer.from_attnid(point).items():
            dict(module.named_parameters())[name].copy_(value)
    return layer


def hf_nullity(spec: MLASpec, version: str = "v3", seed: int = 0, seq_len: int = 6, n_inputs: int | None = None,
               interleave: bool = True) -> RankDecision:
    """The numeric nullity of the transformers module's own Jacobian (float64 norms), by the library's rank rule.

    The rows come from ``n_inputs`` Gaussian inputs (default 1.5 P / (seq_len d_model) + 3), one sequence each.
    """
    from attnid.jacobian import functional_rank

    layer = hf_module(spec, version, seed, interleave, norm_in_float64=True)
    weights = layer.weights()
    gen = torch.Generator().manual_seed(seed + 2)
    n = n_inputs or math.ceil(1.5 * count_parameters(weights) / (seq_len * spec.d_model)) + 3
    inputs = [torch.randn(1, seq_len, spec.d_model, generator=gen, dtype=torch.float64) for _ in range(n)]
    return functional_rank(layer.output, weights, inputs, mode="forward")


@dataclass(frozen=True)
class HFCrossCheck:
    """attnid's MLA layer against transformers' on the same weights (errors relative to the largest output)."""

    version: str
    spec: MLASpec
    same_function: float
    symmetry_change: float
    round_trip: float


def hf_cross_check(spec: MLASpec, version: str = "v3", seed: int = 0, seq_len: int = 7, interleave: bool = True,
                   norm_in_float64: bool = True) -> HFCrossCheck:
    """Same weights in both layers: max |Y_attnid - Y_transformers| / max |Y|, and the same after a random symmetry."""
    layer = hf_module(spec, version, seed, interleave, norm_in_float64)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(2, seq_len, spec.d_model, generator=gen, dtype=torch.float64)
    ref = SameWeights.of(layer, x)
    back = layer.from_attnid(ref.params)
    round_trip = max(float((back[k] - ref.weights[k]).abs().max()) for k in ref.weights)
    same = ref.error(forward(ref.params, x, spec))
    change = ref.module_error(apply_symmetry(ref.params, spec, random_symmetry(spec, gen)))
    return HFCrossCheck(version, spec, same, change, round_trip)
