"""The route of ``count --config`` through the modules transformers builds (``attnid.hf.meta``).

Cross-checks it against attnid's own readers on every published config we keep, and checks what only it reads:
hybrids, encoder-decoders (cross-attention against the float64 Jacobian of transformers' own module), defaults
filled by transformers' config class, and the sparse indexer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnid.hf.config import count_config, read_config

FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"
SAME_BOTH_WAYS = ("command-r7b", "glm-4-9b", "glm-4.5", "granite-3.0-8b", "llama-3-8b", "mixtral-8x7b",
                  "nemotron-minitron-8b", "olmoe-1b-7b", "qwen3-30b-a3b", "qwen3-8b", "qwen3-next-80b-a3b",
                  "starcoder2-15b")


def _counted(m: object) -> list[tuple[int, int, int | None]]:
    return sorted((g.layers, g.total, g.unidentified) for g in m.counted)  # type: ignore[attr-defined]


@pytest.mark.parametrize("folder", SAME_BOTH_WAYS)
def test_a_published_config_of_a_type_transformers_knows_goes_through_its_modules(folder: str) -> None:
    # Before their readers were retired, both routes gave the same counts on these twelve configs and on the
    # defaults of some forty config classes; tests/test_hfmodels.py checks the counts against closed forms.
    data, where = read_config(FIXTURES / folder)
    m = count_config(data, where)
    assert m.route == "transformers" and m.counted and _counted(m) == _counted(count_config(data, where, "transformers"))


def test_a_class_outside_the_table_goes_to_the_reader_or_is_named() -> None:
    data, where = read_config(FIXTURES / "persimmon-8b")  # PersimmonAttention: one fused query_key_value
    assert count_config(data, where).route == "reader"
    built = count_config(data, where, route="transformers")
    assert "PersimmonAttention is not in attnid's table" in built.groups[0].note and built.groups[0].count is None


def test_gpt_j_ignores_a_field_its_model_never_reads() -> None:
    data, where = read_config(FIXTURES / "gpt-j-6b")
    m = count_config({**data, "window_size": 256}, where)  # a leftover field: GPTJAttention has no window
    (group,) = m.groups
    assert group.unidentified is not None and group.spec.window is None and group.spec.rope_dims == 64


def test_qwen_72b_reads_rotary_emb_base() -> None:
    data, where = read_config(FIXTURES / "qwen-7b")  # model_type qwen: remote code, attnid's reader
    published = {"hidden_size": 8192, "num_attention_heads": 64, "num_hidden_layers": 80, "kv_channels": 128,
                  "rotary_emb_base": 1000000, "use_dynamic_ntk": False, "use_logn_attn": False}
    (group,) = count_config({**data, **published}, where).groups
    # full RoPE: the rotations' commutant, d_k per head, on the query-key side; GL(d_v) per head on the value side
    assert group.spec.rope_base == 1e6 and group.unidentified == 64 * 128 + 64 * 128 * 128


def test_defaults_of_transformers_are_listed() -> None:
    m = count_config({"model_type": "llama", "num_hidden_layers": 2})
    fields = {d.field: d.value for d in m.defaults}
    assert fields["hidden_size"] == 4096 and fields["num_attention_heads"] == 32
    assert m.counted[0].spec.d_model == 4096


def test_a_hybrid_lists_its_other_layers_with_their_parameters() -> None:
    cfg = {"model_type": "nemotron_h", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "num_hidden_layers": 4, "layers_block_type": ["mamba", "attention", "mlp", "mamba"],
           "mamba_num_heads": 4, "mamba_head_dim": 16, "ssm_state_size": 8, "n_groups": 1, "intermediate_size": 64,
           "vocab_size": 32}
    try:
        m = count_config(cfg)
    except ValueError as exc:  # this transformers spells the layer list another way
        pytest.skip(str(exc))
    kinds = {g.kind: g for g in m.groups}
    attention = [g for g in m.groups if g.attention]
    assert len(attention) == 1 and attention[0].layers == 1 and attention[0].spec.rope_dims == 0
    others = [g for g in m.groups if not g.attention]
    assert others and all(g.parameters and "outside the theory" in g.note for g in others), kinds


def test_a_model_without_attention_is_listed_not_refused() -> None:
    m = count_config({"model_type": "mamba", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 32})
    assert not m.counted and m.groups[0].parameters and "no attention layer" in m.groups[0].note


def test_sparse_indexer_parameters_are_unidentified() -> None:
    from transformers import DeepseekV32Config
    cfg = DeepseekV32Config(hidden_size=64, num_attention_heads=4, num_hidden_layers=1, q_lora_rank=16,
                            kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, index_n_heads=2,
                            index_head_dim=16, index_topk=4, vocab_size=32, first_k_dense_replace=1,
                            intermediate_size=32).to_dict()
    with_indexer = count_config(cfg).groups[0]
    plain = count_config({**cfg, "model_type": "deepseek_v3"}).groups[0]
    extra = with_indexer.total - plain.total
    assert extra > 0 and with_indexer.unidentified == plain.unidentified + extra
    assert with_indexer.breakdown.get("indexer", extra) == extra and "prop-sparse-indexer" in with_indexer.note


def _jacobian_nullity(module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    names = [n for n, _ in module.named_parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    shapes = [p.shape for p in module.parameters()]

    def f(theta: torch.Tensor) -> torch.Tensor:
        params, i = {}, 0
        for n, s in zip(names, shapes):
            params[n] = theta[i:i + s.numel()].reshape(s)
            i += s.numel()
        return torch.func.functional_call(module, params, (x,), {"key_value_states": y})[0].reshape(-1)

    jac = torch.func.jacrev(f)(flat)
    s = torch.linalg.svdvals(jac)
    return int(flat.numel() - (s > s[0] * flat.numel() * torch.finfo(torch.float64).eps).sum())  # rank rule


def test_cross_attention_count_matches_the_jacobian_of_transformers_own_module() -> None:
    from transformers import BartConfig
    from transformers.models.bart.modeling_bart import BartAttention
    cfg = BartConfig(d_model=8, encoder_attention_heads=2, decoder_attention_heads=2, encoder_layers=1,
                     decoder_layers=1, vocab_size=16, max_position_embeddings=16, encoder_ffn_dim=8,
                     decoder_ffn_dim=8)
    counted = {g.kind: g for g in count_config(cfg.to_dict()).groups}
    cross = counted["cross_attention"]
    torch.manual_seed(0)
    module = BartAttention(8, 2, is_decoder=True, bias=True, config=cfg).double()
    for p in module.parameters():
        torch.nn.init.normal_(p, std=0.5)
    x, y = torch.randn(4, 12, 8, dtype=torch.float64), torch.randn(4, 7, 8, dtype=torch.float64)  # 384 rows, P 288
    assert cross.total == sum(p.numel() for p in module.parameters())
    assert _jacobian_nullity(module, x, y) == cross.unidentified
    assert json.dumps(count_config(cfg.to_dict()).record())  # the record stays JSON


def test_cross_attention_reading_another_width_is_not_covered() -> None:
    """prop-cross-attention compares with self-attention of one width: keys and values of width d_Y != d_X are
    marked not covered, not counted as if d_Y were d_X."""
    from transformers import BartConfig
    from transformers.models.bart.modeling_bart import BartAttention
    from attnid.hf.meta import ATTENTION_CLASSES, _layout
    cfg = BartConfig(d_model=8, encoder_attention_heads=2, decoder_attention_heads=2, vocab_size=16)
    module = BartAttention(8, 2, is_decoder=True, bias=True, config=cfg)
    sem = ATTENTION_CLASSES["BartAttention"]
    assert _layout("decoder.layers.0.encoder_attn", module, cfg, sem)[1] is not None  # one width: counted
    module.k_proj, module.v_proj = torch.nn.Linear(12, 8), torch.nn.Linear(12, 8)
    kind, layout, note = _layout("decoder.layers.0.encoder_attn", module, cfg, sem)
    assert kind == "cross_attention" and layout is None and "width 12, queries 8" in note


def test_config_accepts_the_id_of_a_model_in_the_local_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants
    snapshot = tmp_path / "models--acme--tiny" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text((FIXTURES / "llama-3-8b" / "config.json").read_text())
    (tmp_path / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "models--acme--tiny" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    from attnid.hf.config import model_count
    by_id = model_count("acme/tiny")
    assert _counted(by_id) == _counted(model_count(FIXTURES / "llama-3-8b"))
    with pytest.raises(ValueError, match="cannot read"):
        model_count("acme/absent")  # not in the cache: the path's own error, one line


def test_the_indexer_is_invisible_at_most_k_tokens_and_locally_beyond() -> None:
    from transformers import DeepseekV32Config, DeepseekV32Model
    cfg = DeepseekV32Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=1,
                            q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
                            index_n_heads=2, index_head_dim=16, index_topk=4, vocab_size=32, first_k_dense_replace=1,
                            intermediate_size=32, attn_implementation="eager")
    torch.manual_seed(0)
    model = DeepseekV32Model(cfg).double().eval()
    indexer = model.layers[0].self_attn.indexer

    def run(ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return model(input_ids=ids).last_hidden_state

    short, long = torch.randint(0, 32, (2, 4)), torch.randint(0, 32, (2, 12))  # k = 4 keys kept per query
    before_short, before_long = run(short), run(long)
    with torch.no_grad():
        for p in indexer.parameters():
            p.add_(1e-6 * torch.randn_like(p))  # a small move: no k-th score changes place
    assert torch.equal(run(short), before_short) and torch.equal(run(long), before_long)
    with torch.no_grad():
        for p in indexer.parameters():
            p.copy_(torch.randn_like(p))  # any move at all, at most k tokens
    assert torch.equal(run(short), before_short)
    assert not torch.equal(run(long), before_long)  # beyond k tokens the indexer's choice is seen


def _nas_block(group: int | None, **attention: object) -> dict:
    return {"attention": {"n_heads_in_group": group, "no_op": False, "replace_with_linear": False, "sparsify": None,
                          "window_length": None, "num_sink_tokens": None, **attention},
            "ffn": {"ffn_mult": 2.625, "no_op": False, "replace_with_linear": False}}


NAS = {"model_type": "nemotron-nas", "architectures": ["DeciLMForCausalLM"], "hidden_size": 256,
       "num_attention_heads": 8, "num_key_value_heads": None, "attention_bias": False, "rope_theta": 500000.0,
       "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                        "original_max_position_embeddings": 8192, "rope_type": "llama3"},
       "vocab_size": 1000, "intermediate_size": None, "rms_norm_eps": 1e-5}


def test_nemotron_nas_counts_each_block_as_the_llama_transformers_builds_with_its_kv_heads() -> None:
    """Each attention block is Llama attention with heads / n_heads_in_group kv heads: its P and U are those of
    transformers' own Llama with that many kv heads; no_op and replace_with_linear blocks are listed, not counted."""
    blocks = [_nas_block(8), _nas_block(2), _nas_block(None, no_op=True), _nas_block(None, replace_with_linear=True),
              _nas_block(2)]
    result = count_config({**NAS, "num_hidden_layers": 5, "block_configs": blocks})
    groups = {g.kind: g for g in result.groups}
    for kv, kind in ((1, "full_attention (GQA 1 kv heads)"), (4, "full_attention (GQA 4 kv heads)")):
        llama = count_config({"model_type": "llama", "hidden_size": 256, "num_attention_heads": 8,
                              "num_key_value_heads": kv, "num_hidden_layers": 1, "rope_theta": 500000.0}).groups[0]
        assert (groups[kind].total, groups[kind].unidentified) == (llama.total, llama.unidentified)
    assert groups["full_attention (GQA 4 kv heads)"].layers == 2
    assert groups["no_attention"].count is None and groups["linear"].count is None
    assert groups["linear"].parameters == 256 * 256  # DeciLM's linear replacement: one d x d map, no bias
    assert any(i.field == "rope_scaling" for i in result.ignored)


def test_nemotron_nas_names_a_block_setting_outside_the_theory_and_refuses_a_bad_group() -> None:
    blocks = [_nas_block(2, window_length=4096, num_sink_tokens=16)]
    group, = count_config({**NAS, "num_hidden_layers": 1, "block_configs": blocks}).groups
    assert group.count is not None and "window_length" in group.note and "num_sink_tokens" in group.note
    assert group.note.startswith("not covered")
    blocks = [_nas_block(2, attention_chunk_size=8192)]  # a field this reader does not know withholds, naming it
    group, = count_config({**NAS, "num_hidden_layers": 1, "block_configs": blocks}).groups
    assert group.note.startswith("not covered") and "attention_chunk_size (not read here)" in group.note
    with pytest.raises(ValueError, match="n_heads_in_group must be a positive integer dividing num_attention_heads 8"):
        count_config({**NAS, "num_hidden_layers": 1, "block_configs": [_nas_block(3)]})
    with pytest.raises(ValueError, match="block_configs"):
        count_config({**NAS, "num_hidden_layers": 2, "block_configs": [_nas_block(2)]})


def test_mimo_is_counted_as_the_qwen2_it_subclasses_and_its_mtp_layers_are_named() -> None:
    """MiMoConfig subclasses Qwen2Config and MiMoModel's forward is Qwen2Model's; its MTP layers are never run."""
    qwen2 = {"hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 2, "num_hidden_layers": 3,
             "rope_theta": 640000, "vocab_size": 1000}
    mimo = count_config({"model_type": "mimo", **qwen2, "num_nextn_predict_layers": 1})
    base = count_config({"model_type": "qwen2", **qwen2})
    assert [(g.kind, g.layers, g.total, g.unidentified) for g in mimo.groups] == \
        [(g.kind, g.layers, g.total, g.unidentified) for g in base.groups]
    assert mimo.model_type == "mimo" and mimo.route == "transformers"
    assert {i.field for i in mimo.ignored} >= {"model_type", "num_nextn_predict_layers"}
