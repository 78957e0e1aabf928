"""``config.json`` mappers of model types whose attention is not plain multi-head, registered in
``attnid.hf.read``'s registry: ALiBi (BLOOM, MPT), T5's learned relative position bias (T5, mT5,
UMT5), and hybrids whose other layers are not softmax attention (Jamba, NVIDIA's Nemotron-NAS).
"""

from __future__ import annotations
from dataclasses import replace
from typing import Any
from attnid.families.alibi import AlibiSpec
from attnid.counts import count
from attnid.hf.read import (CROSS_NOTE, Config, LayerGroup, _heads, _shown, _spec, group_layers, register, rope_base)
from attnid.families.relbias import T5_BUCKETS, T5_MAX_DISTANCE, RelativeBiasSpec
from attnid.hf.models import CLIP_QKV, QK_LAYERNORM, mosaic


def map_jamba(cfg: Config) -> list[LayerGroup]:
    """Jamba: attention layers every attn_layer_period layers from attn_layer_offset (GQA, no RoPE, no biases);
    the Mamba layers are not attention and are not counted."""
    d, h, kv, dk = _heads(cfg)
    n = cfg.layers()
    period = cfg.integer("attn_layer_period", 8)
    offset = cfg.value("attn_layer_offset", 4)
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < period:
        raise cfg._fail("attn_layer_offset", f"must be an integer from 0 to attn_layer_period - 1, got {_shown(offset)}")
    kinds = ["full_attention" if i % period == offset else "mamba" for i in range(n)]
    cfg.mark_read(*(k for k in cfg.raw if k.startswith("mamba_")))  # the Mamba layers' settings

    def make(kind: str) -> LayerGroup | Any:
        if kind == "mamba":
            return LayerGroup.not_counted("mamba", 1, "a Mamba (state-space) layer, not attention")
        return _spec(cfg, d_model=d, heads=h, kv_heads=kv, head_dim=dk, v_head_dim=dk, causal=True)

    return group_layers(kinds, make)


# Nemotron-NAS attention settings that change the layer in ways no theorem here covers, when they are set
NAS_OUTSIDE = {"window_length": "a sliding window with sink tokens", "num_sink_tokens": "sink tokens",
               "llama4": "Llama 4 attention (chunks, no-RoPE layers, an L2 norm, query temperature)",
               "sparsify": "sparsified projections", "unshifted_sink": "an unshifted sink",
               "use_prefill_window_in_sink_attention": "a prefill window in sink attention"}
NAS_READ = {"n_heads_in_group", "no_op", "replace_with_linear", "mamba", *NAS_OUTSIDE}  # any other set field withholds


def map_nemotron_nas(cfg: Config) -> list[LayerGroup]:
    """NVIDIA's Nemotron-NAS (remote code DeciLM: Llama-3.1-Nemotron-Nano/Super/Ultra): a Llama whose layers each
    take their attention from ``block_configs[i]["attention"]``: grouped-query attention with
    num_attention_heads / n_heads_in_group key-value heads, biases on q, k, v, o from attention_bias, RoPE;
    or nothing (no_op); or one linear map of each token (replace_with_linear), which mixes no tokens and is listed
    outside the theory, as is a Mamba block. The feed-forward blocks do not change an attention count."""
    d, h, _, dk = _heads(cfg)
    n = cfg.layers()
    base = rope_base(cfg, 10000.0)
    bias = "qkvo" if cfg.flag("attention_bias", False) else "none"
    blocks = cfg.value("block_configs", None)
    if not isinstance(blocks, list) or len(blocks) != n:
        raise cfg._fail("block_configs", f"must be a list of {n} blocks (one per layer), got {_shown(blocks)}")
    cfg.mark_read("num_key_value_heads")  # null: each block gives its own
    kinds: list[str] = []
    made: dict[str, LayerGroup | Any] = {}
    for i, block in enumerate(blocks):
        attention = block.get("attention") if isinstance(block, dict) else None
        if not isinstance(attention, dict):
            raise cfg._fail("block_configs", f"block {i} has no 'attention' mapping")
        kind, group = _nas_layer(cfg, attention, i, d, h, dk, base, bias)
        kinds.append(kind)
        made.setdefault(kind, group)
    return group_layers(kinds, lambda kind: made[kind])


def _nas_layer(cfg: Config, attention: dict[str, Any], i: int, d: int, h: int, dk: int, base: float,
               bias: str) -> tuple[str, LayerGroup | Any]:
    """(layer type, group or layout) of one Nemotron-NAS block's attention."""
    if attention.get("no_op"):
        return "no_attention", LayerGroup.not_counted("no_attention", 1, "no attention in this block (no_op)", 0)
    if attention.get("replace_with_linear"):
        return "linear", LayerGroup.not_counted("linear", 1, "attention replaced by one linear map of each token "
                                                "(replace_with_linear): no token mixing, outside the theory", d * d)
    if attention.get("mamba"):
        return "mamba", LayerGroup.not_counted("mamba", 1, "a Mamba (state-space) block, not attention")
    group = attention.get("n_heads_in_group")
    if isinstance(group, bool) or not isinstance(group, int) or group < 1 or h % group:
        raise cfg._fail("block_configs", f"block {i}: n_heads_in_group must be a positive integer dividing "
                                         f"num_attention_heads {h}, got {_shown(group)}")
    kind = "full_attention" if group == 1 else f"full_attention (GQA {h // group} kv heads)"
    spec = _spec(cfg, d_model=d, heads=h, kv_heads=h // group, head_dim=dk, v_head_dim=dk, bias=bias,
                 rope_fraction=1.0, rope_base=base, causal=True)
    outside = [k for k in NAS_OUTSIDE if attention.get(k) not in (None, False, [], {}, 0)]
    unread = sorted(k for k, v in attention.items() if k not in NAS_READ and v not in (None, False, [], {}, 0))
    if outside or unread:  # the fields are part of the type's name: blocks that set different ones are other groups
        kind += f" ({', '.join(outside + unread)})"
        why = ", ".join([f"{k} ({NAS_OUTSIDE[k]})" for k in outside] + [f"{k} (not read here)" for k in unread])
        return kind, LayerGroup.from_layout(kind, 1, spec, f"not covered: the block's attention sets {why}")
    return kind, spec


def map_bloom(cfg: Config) -> list[LayerGroup]:
    """BLOOM: multi-head attention with biases everywhere and ALiBi (``attnid.families.alibi``)."""
    d = cfg.integer("hidden_size", None, "n_embed")
    h = cfg.integer("n_head", None, "num_attention_heads")
    n = cfg.layers()
    spec = _spec(cfg, d_model=d, heads=h, bias="qkvo", causal=True)
    cfg.mark_read("skip_bias_add", "skip_bias_add_qkv", "offset_alibi", "slow_but_exact")  # Megatron-DeepSpeed switches
    return [LayerGroup.from_layout("full_attention", n, AlibiSpec(spec))]


def map_mpt(cfg: Config) -> list[LayerGroup]:
    """MPT: multi-head attention, no biases (no_bias), ALiBi (``attnid.families.alibi``) or learned positions (attn_config);
    clip_qkv and qk_ln are not covered."""
    d, h, n, attn = mosaic(cfg)
    kind = attn.get("attn_type", "multihead_attention")
    if kind not in ("multihead_attention", "multiquery_attention", "grouped_query_attention"):
        raise ValueError(f"{cfg.where}: attn_config.attn_type {_shown(kind)} is not an attention this tool reads")
    kv = {"multihead_attention": h, "multiquery_attention": 1}.get(kind, attn.get("kv_n_heads", h))
    spec = _spec(cfg, d_model=d, heads=h, kv_heads=kv, bias="none" if cfg.flag("no_bias", True) else "qkvo",
                 causal=not attn.get("prefix_lm", False))
    note = (CLIP_QKV if attn.get("clip_qkv") is not None else QK_LAYERNORM if attn.get("qk_ln", False) else "")
    cfg.mark_read("learned_pos_emb", "max_seq_len", "norm_type")
    layout = AlibiSpec(spec) if attn.get("alibi", False) else spec
    return [LayerGroup.from_layout("full_attention", n, layout, note=note)]


def map_t5(cfg: Config) -> list[LayerGroup]:
    """T5 and mT5 (one relative-bias table per stack, in its first layer and used by all) and UMT5 (a table per
    layer): encoder and decoder self-attention (``attnid.families.relbias``), counted at inputs long enough to reach every
    bucket; cross-attention (no table, no mask) is counted as non-causal attention (prop-cross-attention). The scores are not scaled, a constant that W_Q absorbs. A layer that
    uses another layer's table sees it as fixed offsets, which change no count (chapter 7b)."""
    d = cfg.integer("d_model", None, "hidden_size")
    h = cfg.integer("num_heads", None, "num_attention_heads")
    dk = cfg.integer("d_kv", d // h)
    encoder = cfg.integer("num_layers", None, "num_hidden_layers")
    decoder = cfg.integer("num_decoder_layers", encoder)
    buckets = cfg.integer("relative_attention_num_buckets", T5_BUCKETS)
    distance = cfg.integer("relative_attention_max_distance", T5_MAX_DISTANCE)
    per_layer = cfg.value("model_type") == "umt5"
    cfg.mark_read("is_decoder", "scale_decoder_outputs")
    groups = []
    for kind, layers, causal in (("encoder_self_attention", encoder, False), ("decoder_self_attention", decoder, True)):
        spec = _spec(cfg, d_model=d, heads=h, head_dim=dk, v_head_dim=dk, causal=causal)
        try:
            table = RelativeBiasSpec(spec, buckets, distance)
        except ValueError as exc:
            raise ValueError(f"{cfg.where}: {exc}") from None
        if per_layer:
            groups.append(LayerGroup.from_layout(kind, layers, table))
            continue
        groups.append(LayerGroup.from_layout(f"{kind}_with_table", 1, table))
        if layers > 1:
            shared = replace(count(spec), note="adds the first layer's relative-bias table, fixed offsets for this layer")
            groups.append(LayerGroup.from_count(kind, layers - 1, shared))
    cross = _spec(cfg, d_model=d, heads=h, head_dim=dk, v_head_dim=dk, causal=False)  # no table, no mask
    groups.append(replace(LayerGroup.from_layout("cross_attention", decoder, cross), note=CROSS_NOTE))
    return groups


for _type, _mapper in {"jamba": map_jamba, "nemotron-nas": map_nemotron_nas, "bloom": map_bloom, "mpt": map_mpt,
                       "t5": map_t5, "mt5": map_t5, "umt5": map_t5}.items():
    register(_type, _mapper)
