"""Each line of attnid.hf.meta.ATTENTION_CLASSES against the class's own forward in transformers.

For a tiny model of each type, transformers builds the model in float64; the Jacobian of the first layer's output
(hidden_states[1], the input of the second layer) in the attention module's parameters has the nullity the route
counts. The map from the attention output to the layer's output (the residual plus the MLP, per token) is a local
diffeomorphism at a generic point, so it adds no null direction. The first layer's input norm is taken out, so that
the attention sees generic inputs: a LayerNorm's output lies in an affine hyperplane, which adds null directions of
the whole model (chapter 13), not of the layer. SDPA keeps float64 throughout (the eager path takes the softmax in
float32, which blurs the key-bias and value-bias directions to about 1e-9). The rank rule is attnid's
(attnid.rank.decide_rank, a clear gap required). Gemma's and Qwen3-Next's RMSNorm, x (1 + w) / rms(x), also
computes in float32; on their queries and keys it is replaced by the same formula in float64 (OffsetRMSNorm).
gpt-oss has no SDPA path (its sinks), and its eager softmax in float32 leaves the gap clear: with a sink neither the
key bias nor the value-bias trade is a null direction.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from attnid.hf.config import count_config
from attnid.hf.meta import attention_modules
from attnid.rank import decide_rank

TINY = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "hidden_size": 16, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 4, "num_hidden_layers": 2,
        "intermediate_size": 24, "vocab_size": 64, "max_position_embeddings": 64}
# per type: what makes its one layer an attention layer of the kind under test
CASES: dict[str, dict[str, Any]] = {
    "llama": {},
    "gemma3_text": {"layer_types": ["sliding_attention"] * 2, "sliding_window": 4, "_offset_norms": True},
    "qwen3": {},  # per-head RMSNorm on queries and keys, shared across heads
    "olmo2": {},  # RMSNorm over all heads' queries and keys
    "mistral": {"sliding_window": 4},
    "gpt_oss": {"layer_types": ["full_attention"] * 2, "num_local_experts": 2, "num_experts_per_tok": 1,
                "_attn": "eager"},  # sinks
    "starcoder2": {"use_bias": True, "sliding_window": None},
    "glm4": {"partial_rotary_factor": 0.5},
    "phi": {"partial_rotary_factor": 0.5, "qk_layernorm": False},
    "cohere2": {"layer_types": ["full_attention"] * 2},  # no RoPE on full-attention layers
    "smollm3": {"no_rope_layers": [0, 0]},
    "lfm2": {"layer_types": ["full_attention"] * 2, "full_attn_idxs": [0, 1]},
    "minimax": {"layer_types": ["full_attention"] * 2, "num_local_experts": 2, "num_experts_per_tok": 1},
    "qwen3_next": {"layer_types": ["full_attention"] * 2, "num_experts": 2, "num_experts_per_tok": 1,
                   "partial_rotary_factor": 0.5, "_offset_norms": True},  # a gate folded into q_proj
}
BATCH, TOKENS = 12, 10
INPUT_NORMS = ("input_layernorm", "operator_norm")


class OffsetRMSNorm(torch.nn.Module):
    """x (1 + w) / sqrt(mean(x^2) + eps) in the input's precision (the float64 twin of Gemma's RMSNorm)."""

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight, self.eps = torch.nn.Parameter(weight.detach().clone()), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)


def _model(model_type: str) -> tuple[Any, dict[str, Any]]:
    from transformers import CONFIG_MAPPING, AutoModel
    case = dict(CASES[model_type])
    attn, offset = case.pop("_attn", "sdpa"), case.pop("_offset_norms", False)
    data = {"model_type": model_type, **TINY, **case}
    config = CONFIG_MAPPING[model_type].from_dict({k: v for k, v in data.items() if k != "model_type"})
    config._experts_implementation = "eager"  # the grouped matmul of MoE experts has no float64 kernel
    config._attn_implementation = attn  # eager takes the softmax in float32; SDPA keeps float64
    torch.manual_seed(0)
    model = AutoModel.from_config(config).double().eval()
    with torch.no_grad():
        for p in model.parameters():  # a generic point: no norm gain at 1, no bias at 0
            p.normal_(0.0, 0.25) if p.ndim > 1 else p.uniform_(0.8, 1.2)
    path, attention = attention_modules(model)[0]
    if offset:
        for name in ("q_norm", "k_norm"):
            norm = getattr(attention, name)
            setattr(attention, name, OffsetRMSNorm(norm.weight, float(getattr(norm, "eps", 1e-6))))
    layer = model.get_submodule(path.rsplit(".", 1)[0])
    for name in INPUT_NORMS:
        if hasattr(layer, name):
            setattr(layer, name, torch.nn.Identity())
    return model, data


def _nullity(model: Any, path: str) -> tuple[int, int]:
    names = [n for n, _ in model.named_parameters() if n.startswith(path + ".")]
    base = {n: p.detach() for n, p in model.named_parameters()}
    ids = torch.randint(0, TINY["vocab_size"], (BATCH, TOKENS), generator=torch.Generator().manual_seed(1))

    def f(theta: dict[str, torch.Tensor]) -> torch.Tensor:
        out = torch.func.functional_call(model, {**base, **theta}, (ids,), {"output_hidden_states": True})
        return out.hidden_states[1].reshape(-1)

    jac = torch.func.jacrev(f)({n: base[n] for n in names})
    matrix = torch.cat([jac[n].reshape(jac[n].shape[0], -1) for n in names], dim=1)
    decision = decide_rank(torch.linalg.svdvals(matrix), *matrix.shape).require_clear()
    return decision.nullity, matrix.shape[1]


@pytest.mark.parametrize("model_type", sorted(CASES))
def test_the_route_counts_what_the_class_computes(model_type: str) -> None:
    model, data = _model(model_type)
    path, module = attention_modules(model)[0]
    group, = [g for g in count_config(data, model_type).groups if g.count is not None]
    nullity, params = _nullity(model, path)
    assert params == group.total
    assert nullity == group.unidentified, (type(module).__name__, nullity, group.unidentified)
