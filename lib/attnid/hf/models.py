"""``config.json`` mappers for further model types, registered in ``attnid.hf.read``'s registry.

Each mapper reads the fields its model type's attention uses (named in its docstring, with the
transformers module or the published modelling code it follows) and withholds a count, with a
one-line reason, where the attention has a feature no theorem of the book covers: a
LayerNorm or clipping on the queries and keys, linear attention, cross-attention.
Mixture-of-experts routing fields never change an attention layer and are read silently.
"""

from __future__ import annotations

from dataclasses import replace

from typing import Any

from attnid.hf.read import (WRAPPERS, Config, LayerGroup, _bias_all, layer_kinds, _cross_attention, _decoder, _shown,
                     _spec, _uncover, group_layers, register, rope_base,
                     rope_fraction)

QK_LAYERNORM = ("not covered: a LayerNorm (centring and, with a bias, a shift) on the queries and keys, not the "
                "RMSNorm of chapter 7b; its known moves give only a lower bound (chapter 7b, prop-qk-layernorm-moves)")
CLIP_QKV = "not covered: clip_qkv clamps the queries, keys and values, which bends the layer off the theory"


def _clipped(cfg: Config, groups: list[LayerGroup], name: str = "clip_qkv") -> list[LayerGroup]:
    clip = cfg.value(name, None)
    return [_uncover(g, f"{CLIP_QKV} (clip_qkv {_shown(clip)})") for g in groups] if clip is not None else groups


def _all_or_sliding(cfg: Config) -> list[str]:
    """Every layer sliding when the config gives a sliding window (Mistral style), else every layer full."""
    n = cfg.layers()
    window = cfg.value("sliding_window", None)
    return layer_kinds(cfg, n, lambda i: "full_attention" if window is None else "sliding_attention")


def map_phi3(cfg: Config) -> list[LayerGroup]:
    """Phi-3/Phi-4-mini: fused qkv without biases, partial RoPE (partial_rotary_factor), a window on every layer."""
    cfg.mark_read("original_max_position_embeddings")  # the context length of a longrope scaling (rope_scaling)
    if cfg.flag("attention_bias", False):
        cfg.ignore("attention_bias", "true, but transformers' Phi-3 attention has no biases: counted without them")
    return _decoder(cfg, bias="none", fraction=rope_fraction(cfg, 1.0), kinds=_all_or_sliding(cfg))


def map_gpt_bigcode(cfg: Config) -> list[LayerGroup]:
    """StarCoder/SantaCoder (GPTBigCode): multi-query (multi_query) attention, biases everywhere, learned positions."""
    d = cfg.integer("n_embd", None, "hidden_size")
    h = cfg.integer("n_head", None, "num_attention_heads")
    n = cfg.layers()
    kv = 1 if cfg.flag("multi_query", True) else h
    cfg.mark_read("num_key_value_heads")  # transformers derives it from multi_query
    if not cfg.flag("scale_attn_weights", True):
        cfg.ignore("scale_attn_weights", "false: the scores are not divided by sqrt(head_dim), a constant factor "
                   "no count depends on")
    spec = _spec(cfg, d_model=d, heads=h, kv_heads=kv, bias="qkvo", causal=True)
    return [LayerGroup.from_layout("full_attention", n, spec), *_cross_attention(cfg, n)]


def map_gptj(cfg: Config) -> list[LayerGroup]:
    """GPT-J: multi-head attention without biases, rotary on the first rotary_dim entries of each head.

    GPT-J rotates interleaved pairs (2i, 2i + 1), a fixed permutation of attnid's rotate-half pairs
    (no count depends on it), with base 10000.
    """
    d = cfg.integer("n_embd", None, "hidden_size")
    h = cfg.integer("n_head", None, "num_attention_heads")
    n = cfg.layers()
    if d % h:  # the model splits n_embd into n_head equal heads
        raise cfg._fail("n_head", f"{h} does not divide n_embd {d}")
    head = d // h
    rotary = cfg.integer("rotary_dim", head) if cfg.flag("rotary", True) else 0
    cfg.mark_read("rotary_dim", "scale_attn_weights")  # GPT-J always divides the scores by sqrt(head_dim)
    if rotary > head:
        raise cfg._fail("rotary_dim", f"{rotary} is more than the head width {head}")
    spec = _spec(cfg, d_model=d, heads=h, rope_fraction=rotary / head, rope_base=10000.0, causal=True)
    return [LayerGroup.from_layout("full_attention", n, spec)]


def map_internlm(cfg: Config) -> list[LayerGroup]:
    """InternLM (v1): multi-head attention with RoPE, biases on q, k, v, o from bias (default true)."""
    rotary = cfg.value("rotary", None)
    if isinstance(rotary, dict):
        if rotary.get("type", "origin") not in ("origin", "default"):
            cfg.ignore("rotary", "a dynamic RoPE scaling changes the frequencies with the length; the counts need "
                       "only that they stay distinct")
        base = rotary.get("base", 10000.0)
        return _decoder(cfg, bias=_bias_all(cfg, "bias", True), base_default=float(base))
    return _decoder(cfg, bias=_bias_all(cfg, "bias", True))


def map_internlm2(cfg: Config) -> list[LayerGroup]:
    """InternLM2/2.5: GQA with RoPE, a fused wqkv and wo, both with a bias when bias is true (default false)."""
    return _decoder(cfg, bias=_bias_all(cfg, "bias", False))


def map_chatglm(cfg: Config) -> list[LayerGroup]:
    """ChatGLM2/3 and GLM-4 (the chatglm code): grouped heads, RoPE on half of each head, base 10000 rope_ratio.

    Reads hidden_size, num_attention_heads, kv_channels (the head width), multi_query_attention and
    multi_query_group_num (the key/value heads), add_qkv_bias, add_bias_linear (the output bias),
    num_layers, rope_ratio. Pairs are interleaved, a fixed permutation of attnid's (no count depends on it).
    """
    d = cfg.integer("hidden_size")
    h = cfg.integer("num_attention_heads")
    n = cfg.layers()
    dk = cfg.integer("kv_channels", d // h)
    kv = cfg.integer("multi_query_group_num", 1) if cfg.flag("multi_query_attention", False) else h
    bias = ("qkv" if cfg.flag("add_qkv_bias", False) else "") + ("o" if cfg.flag("add_bias_linear", False) else "")
    base = 10000.0 * cfg.number("rope_ratio", 1.0)
    # not the attention layer: its norms, residual layout and fused kernels
    cfg.mark_read("original_rope", "rmsnorm", "post_layer_norm", "layernorm_epsilon", "apply_residual_connection_post_layernorm")
    spec = _spec(cfg, d_model=d, heads=h, kv_heads=kv, head_dim=dk, v_head_dim=dk, bias=bias or "none",
                 rope_fraction=0.5, rope_base=base, causal=True)
    return [LayerGroup.from_layout("full_attention", n, spec)]


def map_qwen(cfg: Config) -> list[LayerGroup]:
    """Qwen (v1): multi-head attention, biases on q, k, v (c_attn) and on o unless no_bias, RoPE on rotary_pct.

    use_logn_attn multiplies the queries beyond seq_length by log_{seq_length}(position), one factor
    per row of scores, 1 up to seq_length: every move commutes with it and no count depends on it.
    use_dynamic_ntk raises the RoPE base beyond seq_length: the frequencies stay distinct.
    """
    d = cfg.integer("hidden_size")
    h = cfg.integer("num_attention_heads")
    n = cfg.layers()
    dk = cfg.integer("kv_channels", d // h)
    for name, why in (("use_logn_attn", "scales the queries beyond seq_length by a factor per position; every move "
                                        "commutes with it"),
                      ("use_dynamic_ntk", "raises the RoPE base beyond seq_length; the frequencies stay distinct")):
        if cfg.flag(name, False):
            cfg.ignore(name, why)
    fraction = rope_fraction(cfg, 1.0, "rotary_pct")
    base = rope_base(cfg, 10000.0, None, "rotary_emb_base")
    bias = "qkv" if cfg.flag("no_bias", True) else "qkvo"
    cfg.mark_read("scale_attn_weights", "seq_length")
    spec = _spec(cfg, d_model=d, heads=h, head_dim=dk, v_head_dim=dk, bias=bias, rope_fraction=fraction,
                 rope_base=base, causal=True)
    return [LayerGroup.from_layout("full_attention", n, spec)]


def map_stablelm(cfg: Config) -> list[LayerGroup]:
    """StableLM (stablelm and stablelm_epoch): GQA, partial RoPE (0.25 unless given), q/k/v biases per use_qkv_bias;
    qk_layernorm (StableLM 2 12B: a LayerNorm per head) is not covered."""
    fraction = rope_fraction(cfg, 0.25, "rope_pct")
    bias = "qkv" if cfg.flag("use_qkv_bias", False) else "none"
    base = rope_base(cfg, 10000.0, None, "rotary_emb_base")
    groups = _decoder(cfg, bias=bias, fraction=fraction, base_default=base)
    _same_as(cfg, "num_heads", "num_attention_heads")
    if cfg.number("rotary_scaling_factor", 1.0) != 1.0:
        cfg.ignore("rotary_scaling_factor", "a RoPE scaling: the frequencies stay distinct, which is all the counts need")
    return [_uncover(g, QK_LAYERNORM) for g in groups] if cfg.flag("qk_layernorm", False) else groups


def map_nemotron(cfg: Config) -> list[LayerGroup]:
    """Nemotron (3, 4, Minitron): GQA, partial RoPE (0.5), biases on every projection per attention_bias;
    kv_channels, where given, must equal head_dim (transformers reads head_dim)."""
    groups = _decoder(cfg, bias=_bias_all(cfg), fraction=rope_fraction(cfg, 0.5))
    _same_as(cfg, "kv_channels", "head_dim")
    return groups


def _same_as(cfg: Config, alias: str, name: str) -> None:
    """A duplicate field (an older name of ``name``): read, and refused when it disagrees."""
    if cfg.has(alias) and cfg.has(name) and cfg.value(alias) != cfg.value(name):
        raise cfg._fail(alias, f"is {_shown(cfg.value(alias))} but {name} is {_shown(cfg.value(name))}")
    cfg.mark_read(alias)


def map_persimmon(cfg: Config) -> list[LayerGroup]:
    """Persimmon and Fuyu's language model: MHA, partial RoPE (0.5), biases everywhere; qk_layernorm not covered."""
    groups = _decoder(cfg, bias="qkvo", fraction=rope_fraction(cfg, 0.5))
    if not cfg.flag("qk_layernorm", True):
        return groups
    # q_layernorm and k_layernorm: a LayerNorm over head_dim each, with a weight and a bias (PersimmonAttention)
    return [_with_norms(_uncover(g, QK_LAYERNORM), 4 * g.spec.head_dim) for g in groups]


def _with_norms(group: LayerGroup, parameters: int) -> LayerGroup:
    """A withheld group whose layers also hold ``parameters`` of norms on the queries and keys."""
    assert group.count is not None and group.count.unidentified is None
    return replace(group, count=replace(group.count, total=group.count.total + parameters))


def map_gpt_neo(cfg: Config) -> list[LayerGroup]:
    """GPT-Neo: global and local (window_size keys) layers per attention_layers, learned positions, a bias on the output
    projection only, and no score scaling (a constant factor no count depends on)."""
    d = cfg.integer("hidden_size")
    h = cfg.integer("num_heads", None, "num_attention_heads")
    n = cfg.layers()
    types = cfg.value("attention_layers", None)
    if not isinstance(types, list) or len(types) != n or any(t not in ("global", "local") for t in types):
        raise cfg._fail("attention_layers", f"must list 'global' or 'local' for each of the {n} layers")
    window = cfg.integer("window_size", 256)
    cfg.mark_read("attention_types")  # the run-length form of attention_layers

    def make(kind: str) -> Any:
        return _spec(cfg, d_model=d, heads=h, bias="o", causal=True, window=window if kind == "local" else None)

    return group_layers(["sliding_attention" if t == "local" else "full_attention" for t in types],
                        lambda kind: make("local" if kind == "sliding_attention" else "global"))


def mosaic(cfg: Config) -> tuple[int, int, int, dict[str, Any]]:
    """(d_model, n_heads, n_layers, attn_config) of MosaicML's configurations (MPT, DBRX)."""
    d = cfg.integer("d_model", None, "hidden_size")
    h = cfg.integer("n_heads", None, "num_attention_heads")
    n = cfg.integer("n_layers", None, "num_hidden_layers")
    attn = cfg.value("attn_config", {})
    if not isinstance(attn, dict):
        raise cfg._fail("attn_config", f"must be a mapping, got {_shown(attn)}")
    return d, h, n, attn


def map_dbrx(cfg: Config) -> list[LayerGroup]:
    """DBRX: GQA (attn_config.kv_n_heads) with RoPE (attn_config.rope_theta), no biases; clip_qkv is not covered."""
    d, h, n, attn = mosaic(cfg)
    kv = attn.get("kv_n_heads", 1)
    base = float(attn.get("rope_theta", rope_base(cfg, 10000.0)))
    spec = _spec(cfg, d_model=d, heads=h, kv_heads=kv, rope_fraction=1.0, rope_base=base, causal=True)
    clip = attn.get("clip_qkv")
    cfg.mark_read("max_seq_len", "ffn_config", "num_key_value_heads")  # transformers copies kv_n_heads there
    note = f"{CLIP_QKV} (clip_qkv {_shown(clip)})" if clip is not None else ""
    return [LayerGroup.from_layout("full_attention", n, spec, note=note)]


def map_phimoe(cfg: Config) -> list[LayerGroup]:
    """Phi-3.5-MoE (phimoe): GQA with RoPE, biases on every projection per attention_bias, a window on every layer
    when given."""
    cfg.mark_read("original_max_position_embeddings", "lm_head_bias", "input_jitter_noise")
    return _decoder(cfg, bias=_bias_all(cfg), kinds=_all_or_sliding(cfg))


def map_minicpm(cfg: Config) -> list[LayerGroup]:
    """MiniCPM (1, 2): Llama's attention; scale_emb, dim_model_base and scale_depth scale embeddings and residuals."""
    cfg.mark_read("scale_emb", "dim_model_base", "scale_depth")
    return _decoder(cfg, bias=_bias_all(cfg))


for _type, _mapper in {  # the types attnid.hf.meta does not read (see attnid.hf.config)
    "phi3": map_phi3, "gpt_bigcode": map_gpt_bigcode, "internlm": map_internlm, "internlm2": map_internlm2,
    "chatglm": map_chatglm, "qwen": map_qwen, "stablelm_epoch": map_stablelm, "nemotron": map_nemotron,
    "persimmon": map_persimmon, "fuyu": map_persimmon, "gpt_neo": map_gpt_neo, "codegen": map_gptj, "dbrx": map_dbrx,
    "phimoe": map_phimoe, "minicpm": map_minicpm,
}.items():
    register(_type, _mapper)

WRAPPERS.update({"fuyu": "text_config"})
