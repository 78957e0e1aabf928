"""The mappers of attnid.hf.models on published config.json files, against closed forms written here.

The closed forms restate the book's counts for the layouts these models use (d_k, d_v <= d), from the
theorems, without the library: per key/value group the query/key side keeps r + (d_k - r)^2 (all of
GL(d_k) without RoPE, r = 0), the value side d_v^2 (an elementwise output gate: d_v); plain softmax
adds the unrotated key-bias coordinates, and b_V, which only moves b_O + sum_h b_V W_O^h (all of it
with b_O, G d_v - min(G d_v, d) without); a shared QK-norm with eps > 0 replaces the query/key side
by one trade per rotated pair and unrotated coordinate, r/2 + (d_k - r), once (per group when the
norm spans the whole width).
"""

from __future__ import annotations


from pathlib import Path

import pytest

from attnid.hf.config import count_config, model_count

FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"


def closed_form(d: int, h: int, g: int, dk: int, r: int = 0, bias: str = "", qk_norm: str = "",
                gate: bool = False) -> tuple[int, int]:
    """(parameters, unidentified) of one layer, d_v = d_k."""
    dv = dk
    total = d * (h * dk + g * dk + g * dv + h * dv) + ("q" in bias) * h * dk + ("k" in bias) * g * dk
    total += ("v" in bias) * g * dv + ("o" in bias) * d
    if qk_norm == "shared":
        total += 2 * dk
        query_key = r // 2 + dk - r
    elif qk_norm == "full":
        total += (h + g) * dk
        query_key = g * (r // 2 + dk - r)
    else:
        query_key = g * (r + (dk - r) ** 2) + ("k" in bias) * g * (dk - r)
    if gate:
        total += h * d * dv
        value = g * dv
    else:
        value = g * dv * dv
        if "v" in bias:
            value += g * dv if "o" in bias else g * dv - min(g * dv, d)
    return total, query_key + value


# folder: [(layer type, layers, closed form arguments)]
COUNTED = {
    "mixtral-8x7b": [("full_attention", 32, dict(d=4096, h=32, g=8, dk=128, r=128))],
    "qwen3-30b-a3b": [("full_attention", 48, dict(d=2048, h=32, g=4, dk=128, r=128, qk_norm="shared"))],
    "phi-3-mini-4k": [("sliding_attention", 32, dict(d=3072, h=32, g=32, dk=96, r=96))],
    "starcoder": [("full_attention", 40, dict(d=6144, h=48, g=1, dk=128, bias="qkvo"))],
    "gpt-j-6b": [("full_attention", 28, dict(d=4096, h=16, g=16, dk=256, r=64))],
    "granite-3.0-8b": [("full_attention", 40, dict(d=4096, h=32, g=8, dk=128, r=128))],
    "internlm2.5-7b": [("full_attention", 32, dict(d=4096, h=32, g=8, dk=128, r=128))],
    "chatglm3-6b": [("full_attention", 28, dict(d=4096, h=32, g=2, dk=128, r=64, bias="qkv"))],
    "qwen-7b": [("full_attention", 32, dict(d=4096, h=32, g=32, dk=128, r=128, bias="qkv"))],
    "stablelm-3b-4e1t": [("full_attention", 32, dict(d=2560, h=32, g=32, dk=80, r=20))],
    "starcoder2-15b": [("sliding_attention", 40, dict(d=6144, h=48, g=4, dk=128, r=128, bias="qkvo"))],
    "glm-4-9b": [("full_attention", 40, dict(d=4096, h=32, g=2, dk=128, r=64, bias="qkv"))],
    "glm-4.5": [("full_attention", 92, dict(d=5120, h=96, g=8, dk=128, r=64, bias="qkv", qk_norm="shared"))],
    "olmoe-1b-7b": [("full_attention", 16, dict(d=2048, h=16, g=16, dk=128, r=128, qk_norm="full"))],
    "command-r7b": [("sliding_attention", 24, dict(d=4096, h=32, g=8, dk=128, r=128)),
                    ("full_attention (no RoPE)", 8, dict(d=4096, h=32, g=8, dk=128))],
    "jamba-v0.1": [("full_attention", 4, dict(d=4096, h=32, g=8, dk=128))],
    "nemotron-4-minitron-4b": [("full_attention", 32, dict(d=3072, h=24, g=8, dk=128, r=64))],
    "nemotron-minitron-8b": [("full_attention", 40, dict(d=4096, h=32, g=8, dk=128, r=128))],
    "qwen3-next-80b-a3b": [("full_attention", 12, dict(d=2048, h=16, g=2, dk=256, r=64, qk_norm="shared", gate=True))],
    # ALiBi (attnid.families.alibi) changes no count: the closed form of the same layout without position biases
    "bloom": [("full_attention", 70, dict(d=14336, h=112, g=112, dk=128, bias="qkvo"))],
    "mpt-7b": [("full_attention", 32, dict(d=4096, h=32, g=32, dk=128))],
}
# folder: (layer type, layers, closed form arguments, a word of the reason the count is withheld)
WITHHELD = {
    "persimmon-8b": ("full_attention", 36, dict(d=4096, h=64, g=64, dk=64, r=32, bias="qkvo"), "LayerNorm"),
}


@pytest.mark.parametrize("folder", sorted(COUNTED))
def test_a_published_config_is_counted_as_the_closed_form_says(folder: str) -> None:
    result = model_count(FIXTURES / folder)
    counted = [g for g in result.groups if g.attention]
    assert [(g.kind, g.layers) for g in counted] == [(kind, n) for kind, n, _ in COUNTED[folder]]
    for group, (_, _, shape) in zip(counted, COUNTED[folder]):
        assert (group.total, group.unidentified) == closed_form(**shape), group.description
    assert result.unidentified == sum(n * closed_form(**shape)[1] for _, n, shape in COUNTED[folder])
    assert not [i for i in result.ignored if i.why.startswith("not read")], result.ignored


# Persimmon-8B (and Fuyu-8B's language model): q_layernorm and k_layernorm, a weight and a bias over head_dim 64 each,
# 256 parameters per layer that PersimmonAttention holds besides its projections
QK_NORM_PARAMETERS = {"persimmon-8b": 4 * 64}


@pytest.mark.parametrize("folder", sorted(WITHHELD))
def test_attention_outside_the_theory_is_named_and_its_parameters_counted(folder: str) -> None:
    kind, layers, shape, reason = WITHHELD[folder]
    group = next(g for g in model_count(FIXTURES / folder).groups if g.kind == kind)
    assert group.layers == layers and group.total == closed_form(**shape)[0] + QK_NORM_PARAMETERS.get(folder, 0)
    assert group.unidentified is None and reason in group.note


def test_qwen3_next_counts_its_gated_layers_and_names_the_linear_ones() -> None:
    groups = {g.kind: g for g in model_count(FIXTURES / "qwen3-next-80b-a3b").groups}
    assert groups["linear_attention"].layers == 36 and not groups["linear_attention"].attention
    assert "DeltaNet" in groups["linear_attention"].note
    assert groups["full_attention"].spec.gate == "elementwise" and groups["full_attention"].weakly_identified == 16 + 2


def _t5_unseen(bidirectional: bool, buckets: int = 32, max_distance: int = 128) -> int:
    """Buckets T5's own map never gives (at any distance), read off transformers' T5Attention."""
    import torch
    from transformers.models.t5.modeling_t5 import T5Attention

    used = T5Attention._relative_position_bucket(torch.arange(-2000, 2001), bidirectional=bidirectional,
                                                 num_buckets=buckets, max_distance=max_distance)
    return buckets - len(set(used.tolist()))


def test_t5_counts_its_first_layers_table_and_its_cross_attention() -> None:
    groups = model_count(FIXTURES / "t5-base").groups
    assert [(g.kind, g.layers, g.attention) for g in groups] == [
        ("encoder_self_attention_with_table", 1, True), ("encoder_self_attention", 11, True),
        ("decoder_self_attention_with_table", 1, True), ("decoder_self_attention", 11, True),
        ("cross_attention", 12, True)]
    total, unidentified = closed_form(d=768, h=12, g=12, dk=64)
    # EncDecAttention: no table, no mask, no bias; counted as non-causal attention (prop-cross-attention)
    assert (groups[4].total, groups[4].unidentified) == (total, unidentified) and not groups[4].spec.causal
    table = 12 * 32  # one entry per head and bucket; each head's shift and the unseen buckets are invisible
    for g, unseen in zip(groups[:4:2], (_t5_unseen(True), _t5_unseen(False))):
        assert (g.total, g.unidentified) == (total + table, unidentified + 12 * (1 + unseen))
    for g in groups[1:4:2]:
        assert (g.total, g.unidentified) == (total, unidentified)
    assert (_t5_unseen(True), _t5_unseen(False)) == (1, 0)


def test_umt5_has_a_table_in_every_layer() -> None:

    data = {"model_type": "umt5", "d_model": 512, "d_kv": 64, "num_heads": 6, "num_layers": 8,
            "num_decoder_layers": 8, "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128}
    groups = count_config(data, "umt5").groups
    assert [(g.kind, g.layers) for g in groups if g.attention] == [("encoder_self_attention", 8),
                                                                   ("decoder_self_attention", 8), ("cross_attention", 8)]
    total, unidentified = closed_form(d=512, h=6, g=6, dk=64)
    assert (groups[0].total, groups[0].unidentified) == (total + 6 * 32, unidentified + 6 * (1 + _t5_unseen(True)))


def test_a_disagreeing_duplicate_field_is_refused() -> None:
    import json

    data = json.loads((FIXTURES / "stablelm-3b-4e1t" / "config.json").read_text())

    with pytest.raises(ValueError, match="'num_heads' is 16 but num_attention_heads is 32"):
        count_config({**data, "num_heads": 16})


# model_type -> the transformers configuration class whose defaults (as to_dict writes them) the mapper must read
TRANSFORMERS_DEFAULTS = {
    "mixtral": "MixtralConfig", "qwen2_moe": "Qwen2MoeConfig", "qwen3_moe": "Qwen3MoeConfig", "phi3": "Phi3Config",
    "gpt_bigcode": "GPTBigCodeConfig", "gptj": "GPTJConfig", "granite": "GraniteConfig", "granitemoe": "GraniteMoeConfig",
    "stablelm": "StableLmConfig", "starcoder2": "Starcoder2Config", "olmo": "OlmoConfig", "olmoe": "OlmoeConfig",
    "glm": "GlmConfig", "glm4": "Glm4Config", "exaone4": "Exaone4Config", "nemotron": "NemotronConfig",
    "cohere": "CohereConfig", "cohere2": "Cohere2Config", "persimmon": "PersimmonConfig", "jamba": "JambaConfig",
    "bloom": "BloomConfig", "mpt": "MptConfig", "t5": "T5Config", "mt5": "MT5Config", "umt5": "UMT5Config", "qwen3_next": "Qwen3NextConfig",
    "internlm3": "InternLM3Config", "exaone": "ExaoneConfig", "opt": "OPTConfig", "gpt_neo": "GPTNeoConfig",
    "codegen": "CodeGenConfig", "dbrx": "DbrxConfig", "smollm3": "SmolLM3Config", "olmo3": "Olmo3Config",
    "phimoe": "PhimoeConfig", "ernie4_5": "Ernie4_5Config", "seed_oss": "SeedOssConfig", "arcee": "ArceeConfig",
    "apertus": "ApertusConfig", "xglm": "XGLMConfig", "helium": "HeliumConfig", "llava": "LlavaConfig",
    "mistral3": "Mistral3Config", "qwen2_vl": "Qwen2VLConfig", "qwen2_5_vl": "Qwen2_5_VLConfig",
}


@pytest.mark.parametrize("model_type", sorted(TRANSFORMERS_DEFAULTS))
def test_the_mapper_reads_the_configuration_transformers_writes(model_type: str) -> None:
    import json
    import math
    import warnings

    transformers = pytest.importorskip("transformers")
    from attnid import families

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = getattr(transformers, TRANSFORMERS_DEFAULTS[model_type])().to_dict()
    result = count_config(json.loads(json.dumps({**data, "model_type": model_type})), model_type)
    assert not [i.field for i in result.ignored if i.why.startswith("not read")]
    counted = [g for g in result.groups if g.attention]
    assert counted and sum(g.layers for g in result.groups) == result.layers
    for g in counted:
        norms = 4 * g.spec.head_dim if model_type == "persimmon" else 0  # q/k LayerNorms (QK_NORM_PARAMETERS)
        assert g.total == sum(math.prod(s) for s in families.parameter_shapes(g.spec).values()) + norms
        if g.unidentified is not None:
            assert g.unidentified == families.count(g.spec).unidentified
