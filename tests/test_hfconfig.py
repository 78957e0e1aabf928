"""Whole-model counts from a Hugging Face config.json: published configs, every family, the registry, bad input."""

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from attnid.hf.config import MAPPERS, Config, LayerGroup, count_config, model_count, register, supported_types
from attnid.layout import Count
from attnid.spec import AttentionSpec

CLI = Callable[..., tuple[int, str, str]]  # the fixture ``cli`` (conftest.py): args -> (exit code, stdout, stderr)

FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"
REQUIRED_TYPES = {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi", "gpt2", "gpt_neox",
                  "falcon", "olmo2", "gpt_oss", "bert"}


def test_llama_3_8b_from_its_published_config(cli: CLI) -> None:
    # Derived here from the published numbers, not from the library: d = 4096, H = 32 query heads, G = 8
    # key/value heads, d_k = d_v = d / H = 128, full RoPE (r = 128), no biases, 32 layers.
    d, h, g, dk, layers = 4096, 32, 8, 128, 32
    params = d * (h * dk) + d * (g * dk) + d * (g * dk) + (h * dk) * d  # W_Q, W_K, W_V, W_O
    # Per group one matrix commuting with every RoPE rotation (r = 128 dimensions: one a I + b J per pair,
    # 2 * 64 = 128) and one GL(d_v) for the value/output product (128^2): G (r + d_v^2).
    unidentified = g * (dk + dk * dk)
    assert (params, unidentified) == (41_943_040, 132_096)

    m = model_count(FIXTURES / "llama-3-8b")
    (group,) = m.groups
    assert (group.kind, group.layers, group.total, group.unidentified) == ("full_attention", 32, params, unidentified)
    assert (m.total, m.unidentified) == (layers * params, layers * unidentified)
    assert group.spec == AttentionSpec.create(d, h, kv_heads=g, rope_fraction=1.0, rope_base=500000.0, causal=True)
    assert m.ignored == []  # rope_scaling is null: nothing to ignore

    code, out, _ = cli("count", "--config", str(FIXTURES / "llama-3-8b" / "config.json"))
    assert code == 0
    assert "per layer: parameters 41,943,040, unidentified 132,096" in out
    assert "all 32 attention layers (attention only; --whole-model counts the rest): parameters 1,342,177,280, unidentified 4,227,072" in out


def test_qwen3_8b_from_its_published_config(cli: CLI) -> None:
    d, h, g, dk, layers = 4096, 32, 8, 128, 36
    params = 2 * d * h * dk + 2 * d * g * dk + 2 * dk  # projections, plus q_norm and k_norm (shared, d_k each)
    # eps = 1e-6 > 0: the norm sees the projections' scale; what stays unidentified is the trade of the shared
    # norm weights (one factor per rotated pair: r/2 = 64) and the value side, G d_v^2.
    unidentified = dk // 2 + g * dk * dk
    weak = h + g  # each head's query/key scale, identified only through eps
    code, out, _ = cli("count", "--config", str(FIXTURES / "qwen3-8b"), "--json")
    assert code == 0
    record = json.loads(out)
    (group,) = record["groups"]
    assert group["parameters_per_layer"] == params == 41_943_296
    assert group["unidentified_per_layer"] == unidentified == 131_136
    assert group["weakly_identified_per_layer"] == weak
    assert group["layout_fields"]["qk_norm"] == "shared" and group["layout_fields"]["qk_norm_eps"] == 1e-6
    assert record["layers"] == layers and record["parameters_all_layers"] == layers * params
    assert record["unidentified_all_layers"] == layers * unidentified
    assert record["ignored"] == []


def test_folder_and_file_paths_give_the_same_count() -> None:
    assert model_count(FIXTURES / "qwen3-8b").record()["groups"] == \
        model_count(FIXTURES / "qwen3-8b" / "config.json").record()["groups"]


def test_registry_covers_the_census_families() -> None:
    from attnid.hf import meta
    assert all(t in supported_types() or meta.known(t) for t in REQUIRED_TYPES)  # a reader, or transformers' modules
    assert {"kimi_k2"} <= set(MAPPERS) and meta.known("deepseek_v3")  # latent attention: remote code, or transformers


def test_unknown_model_type_is_exit_2_naming_the_supported_ones(cli: CLI, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "not_a_model", "hidden_size": 5120}))  # neither transformers nor attnid
    code, out, err = cli("count", "--config", str(path))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "model_type \"not_a_model\" is not supported; supported: every model type transformers knows" in err
    assert "qwen" in err and "gpt2" in err  # and the types attnid's readers read


def test_a_plugged_in_mapper_is_used(tmp_path: Path) -> None:
    counted = Count(AttentionSpec.create(8, 2), 100, 7, {"latent": 7})  # a family that counts itself

    def fake(cfg: Config) -> list[LayerGroup]:
        return [LayerGroup.from_count("full_attention", cfg.layers(), counted)]

    register("fake_mla", fake)
    try:
        assert (count_config({"model_type": "fake_mla", "num_hidden_layers": 3}).unidentified) == 21
        m = count_config({"model_type": "fake_mla", "num_hidden_layers": 3, "kv_lora_rank": 512})
        assert [i.field for i in m.ignored] == ["kv_lora_rank"]  # an attention field the mapper never read
        assert (m.total, m.unidentified) == (300, None)  # ... which withholds the count
    finally:
        MAPPERS.pop("fake_mla")


def test_ignored_fields_are_listed_never_dropped() -> None:
    cfg = json.loads((FIXTURES / "llama-3-8b" / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 8192}  # as Llama 3.1 ships
    cfg["attn_new_feature"] = 3
    m = count_config(cfg)
    fields = {i.field: i.why for i in m.ignored}
    assert "RoPE scaling" in fields["rope_parameters"] and "llama3" in fields["rope_parameters"]
    # a field transformers' config class does not define is listed: the model transformers builds never reads it
    assert fields["attn_new_feature"] == "not a field of transformers' LlamaConfig: the model it builds never reads it"
    assert m.unidentified == 32 * 132_096  # RoPE scaling changes no count


def test_the_readers_list_unread_fields_and_withhold_on_an_unknown_switch() -> None:
    cfg = {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2}  # GPT2Attention: read by attnid's reader
    base = count_config(cfg)
    assert base.route == "reader" and base.unidentified is not None
    m = count_config({**cfg, "qk_layernorm": False, "attn_new_feature": 3})
    fields = {i.field: i.why for i in m.ignored}
    assert fields["qk_layernorm"].endswith("a switch that is off, so no feature it could add")
    assert fields["attn_new_feature"] == "not read by the gpt2 mapper"
    assert m.unidentified is None and all("attn_new_feature may describe the attention" in g.note for g in m.counted)
    for name in ("is_causal", "use_bidirectional_attention"):  # an off flag here could change which keys a query sees
        withheld = count_config({**cfg, name: False})
        assert withheld.unidentified is None and all(name in g.note for g in withheld.counted)


def test_rope_theta_beside_rope_parameters_must_agree_in_the_readers() -> None:
    cfg = {"model_type": "gpt_neox", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2}
    params = {"rope_type": "default", "rope_theta": 500000.0}
    agreeing = count_config({**cfg, "rope_theta": 500000.0, "rope_parameters": params})
    assert agreeing.route == "reader" and agreeing.counted[0].spec.rope_base == 500000.0
    with pytest.raises(ValueError, match="'rope_theta' is 10000.0 but rope_parameters.rope_theta is 500000.0"):
        count_config({**cfg, "rope_theta": 10000.0, "rope_parameters": params})


def test_local_and_global_layers_are_counted_per_layer_type() -> None:
    import transformers

    gemma3 = transformers.Gemma3TextConfig().to_dict()  # defaults only: 26 layers, five local to one global
    m = count_config(gemma3)
    by_kind = {g.kind: g for g in m.groups}
    assert by_kind["sliding_attention"].layers == 22 and by_kind["full_attention"].layers == 4
    local, full = by_kind["sliding_attention"].spec, by_kind["full_attention"].spec
    assert local.window == 4096 and full.window is None
    assert (local.rope_base, full.rope_base) == (10000.0, 1_000_000.0)
    assert local.qk_norm == full.qk_norm == "shared"
    # a window this wide does not change the count: local and global layers count the same
    assert by_kind["sliding_attention"].unidentified == by_kind["full_attention"].unidentified
    assert m.unidentified == sum(g.unidentified * g.layers for g in m.groups)


def test_layers_without_attention_are_counted_apart() -> None:
    m = count_config(json.loads((FIXTURES / "qwen3-next-80b-a3b" / "config.json").read_text()))
    kinds = {g.kind: g for g in m.groups}
    linear = kinds["linear_attention"]
    assert linear.layers == 36 and not linear.attention and linear.unidentified is None
    assert linear.parameters and "Qwen3NextGatedDeltaNet" in linear.note  # listed with its parameters
    full = kinds["full_attention"]
    assert m.unidentified == full.layers * full.unidentified  # the count covers the attention layers it counts


TRANSFORMERS_DEFAULTS = [
    # (configuration class, what its defaults must map to: group kind -> (layers, selected spec fields))
    ("LlamaConfig", {"full_attention": (32, dict(d_model=4096, heads=32, kv_heads=32, rope_dims=128, bias=""))}),
    ("MistralConfig", {"sliding_attention": (32, dict(kv_heads=8, window=4096, rope_dims=128))}),
    ("Qwen2Config", {"full_attention": (32, dict(bias="qkv", rope_dims=128, window=None))}),
    ("Qwen3Config", {"full_attention": (32, dict(qk_norm="shared", qk_norm_eps=1e-6, head_dim=128))}),
    ("Olmo2Config", {"full_attention": (32, dict(qk_norm="full", qk_norm_eps=1e-5, bias=""))}),
    ("GemmaConfig", {"full_attention": (28, dict(d_model=3072, head_dim=256, rope_dims=256))}),
    ("Gemma2Config", {"sliding_attention": (13, dict(window=4096, head_dim=256)),
                      "full_attention": (13, dict(window=None))}),
    ("GptOssConfig", {"sliding_attention": (18, dict(window=128, norm="sink", sink_learned=True, bias="qkvo")),
                      "full_attention": (18, dict(window=None, rope_base=150000.0))}),
    ("PhiConfig", {"full_attention": (24, dict(d_model=2048, rope_dims=32, bias="qkvo"))}),
    ("GPTNeoXConfig", {"full_attention": (44, dict(d_model=6144, rope_dims=24, bias="qkvo"))}),
    ("FalconConfig", {"full_attention": (32, dict(d_model=4544, heads=71, kv_heads=1, bias=""))}),
    ("GPT2Config", {"full_attention": (12, dict(d_model=768, heads=12, rope_dims=0, bias="qkvo", causal=True))}),
    ("BertConfig", {"full_attention": (12, dict(d_model=768, causal=False, bias="qkvo"))}),
]


@pytest.mark.parametrize(("config_class", "expected"), TRANSFORMERS_DEFAULTS, ids=[c for c, _ in TRANSFORMERS_DEFAULTS])
def test_each_family_reads_the_configuration_transformers_writes(config_class: str, expected: dict) -> None:
    import transformers

    data = getattr(transformers, config_class)().to_dict()  # what save_pretrained would write; nothing downloaded
    m = count_config(data, config_class)
    groups = {g.kind: g for g in m.groups}
    assert set(groups) == set(expected)
    for kind, (layers, fields) in expected.items():
        assert groups[kind].layers == layers
        for name, value in fields.items():
            assert getattr(groups[kind].spec, name) == value, (config_class, kind, name)
    rope_params = [i for i in m.ignored if i.field in ("rope_parameters", "rope_scaling")]
    assert bool(rope_params) == (config_class == "GptOssConfig")  # only gpt-oss ships a scaled RoPE (YaRN)


def test_llama4_rope_and_nope_layers() -> None:
    import transformers

    m = count_config(transformers.Llama4Config().to_dict())  # Scout: 48 layers, every 4th without RoPE
    groups = {g.kind: g for g in m.groups}
    rope, nope = groups["chunked_attention"], groups["full_attention (no RoPE)"]
    assert (rope.layers, nope.layers) == (36, 12)
    assert rope.spec.qk_norm == "unweighted" and rope.spec.chunk == 8192 and rope.spec.rope_dims == 128
    assert nope.spec.qk_norm == "none" and nope.spec.chunk is None and nope.spec.rope_dims == 0
    # the census describes the same two layer types
    from attnid.census import census, load_layouts

    rows = {r.layout.key: r.record() for r in census(load_layouts())}
    assert (rows["llama-4-scout"]["layers"], rows["llama-4-nope"]["layers"]) == (36, 12)
    assert rows["llama-4-scout"]["unidentified_per_layer"] == rope.unidentified
    assert rows["llama-4-nope"]["unidentified_per_layer"] == nope.unidentified
    assert any(i.field == "attn_temperature_tuning" for i in m.ignored)


def test_gemma2_soft_capping_is_reported_not_counted() -> None:
    import transformers

    m = count_config(transformers.Gemma2Config().to_dict())
    assert m.unidentified is None
    assert all("soft-capping" in g.note for g in m.groups)


@pytest.mark.parametrize(("content", "message"), [
    ("{", "not valid JSON"),
    ("[1, 2]", "top level must be a JSON object"),
    (json.dumps({"model_type": "qwen"}), "field 'hidden_size' is missing"),  # a type transformers does not know
    (json.dumps({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": "32", "num_hidden_layers": 2}),
     "field 'num_attention_heads' must be an integer from 1 to 1,000,000, got \"32\""),
    (json.dumps({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 2,
                 "num_key_value_heads": 5}), "kv_heads 5 must divide heads 32"),
    (json.dumps({"hidden_size": 8}), "no model_type is not supported"),
])
def test_bad_configs_are_one_line_exit_2(cli: CLI, tmp_path: Path, content: str,
                                         message: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(content)
    code, out, err = cli("count", "--config", str(path))
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err, err


def test_missing_file_and_mixed_flags(cli: CLI, tmp_path: Path) -> None:
    code, _, err = cli("count", "--config", str(tmp_path))
    assert code == 2 and "cannot read" in err
    code, _, err = cli("count", "--config", str(FIXTURES / "qwen3-8b"), "--d-model", "8")
    assert code == 2 and "do not give --d-model" in err


def test_deepseek_v3_and_kimi_configs_are_counted_as_latent_attention() -> None:
    # DeepSeek-V3's published widths: c = 512 (kv latent), c' = 1536 (query latent), H = 128, d_nope = d_v = 128, d_rope = 64.
    # The latent rotations c(c+1)/2 and c'(c'+1)/2, per-head GL(d_nope) and GL(d_v), and the shared RoPE commutant d_rope
    # (chapter 7c) give the count; eps > 0 leaves the two down-projection scales weakly identified.
    from transformers import DeepseekV3Config

    cfg = DeepseekV3Config().to_dict()
    cfg["model_type"] = "deepseek_v3"
    result = count_config(cfg, "DeepseekV3Config()")
    (group,) = result.groups
    c, cq, h, dn, dv, dr = 512, 1536, 128, 128, 128, 64
    assert group.unidentified == c * (c + 1) // 2 + cq * (cq + 1) // 2 + h * (dn**2 + dv**2) + dr == 5_506_112
    assert group.layers == cfg["num_hidden_layers"] and result.unidentified == group.layers * group.unidentified
    assert group.weakly_identified == 2
    assert all(i.field != "vocab_size" for i in result.ignored)  # not an attention field
    kimi = {**cfg, "model_type": "kimi_k2", "num_attention_heads": 64, "num_key_value_heads": 64, "rope_theta": 50000.0}
    assert count_config(kimi).groups[0].unidentified == c * (c + 1) // 2 + cq * (cq + 1) // 2 + 64 * (dn**2 + dv**2) + dr
    wrapped = {"model_type": "kimi_k25", "text_config": kimi, "vision_config": {}}
    assert count_config(wrapped).counted[0].unidentified == count_config(kimi).groups[0].unidentified


def test_falcon_40b_original_config_builds_n_head_kv_groups() -> None:
    # model_type RefinedWeb (Falcon-40B's own code) always builds n_head_kv key/value groups, with no
    # new_decoder_architecture flag; reading it as multi-query was a silent wrong count (issue 26).
    raw = {"model_type": "RefinedWeb", "hidden_size": 8192, "n_head": 128, "n_head_kv": 8, "n_layer": 60,
           "bias": False, "parallel_attn": True}
    group = count_config(raw).groups[0]
    d, h, g, dk = 8192, 128, 8, 64
    assert group.spec.kv_heads == g
    assert group.total == d * (h * dk + g * dk + g * dk + h * dk) == 142_606_336
    # per group: the RoPE commutant, r + (d_k - r)^2 = d_k with r = d_k, and GL(d_v) shared by its heads, d_v^2
    assert group.unidentified == g * (dk + dk * dk) == 33_280
