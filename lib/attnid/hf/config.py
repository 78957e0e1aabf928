"""Attention counts for a whole model, from its Hugging Face ``config.json`` (read offline).

``model_count(path)`` reads a ``config.json`` (or a folder holding one), finds the mapper
registered for its ``model_type`` and returns a ``ModelCount``: the model's layers grouped by
layer type (full and sliding-window attention, and any layer type the mapper does not count),
each group with its layout and its per-layer count, and the whole model's attention counts.
``attnid count --config PATH`` prints it (``--json`` for machines).

Nothing is guessed silently. A field the mapper reads but cannot express in a layout (RoPE
scaling, a constant score scale, logit soft-capping) is listed in ``ModelCount.ignored`` with
the reason, and so is every attention-looking field (``ATTENTION_WORDS``) that the mapper did
not read at all. A ``model_type`` without a mapper is refused with one line naming the
supported types (``attnid count`` exits with 2).

The registry. ``MAPPERS`` maps a ``model_type`` to a function ``mapper(cfg: Config) ->
list[LayerGroup]``; ``register(model_type, mapper)`` adds one. ``Config`` hands out fields and
records which were read; ``LayerGroup.from_layout`` makes a group from a layout of any family
(``attnid.families`` counts it), and ``LayerGroup.from_count`` from a ``Count`` a plugged-in
family made itself. Multi-head latent attention (DeepSeek-V2/V3, Kimi K2) plugs in through its
family's own config reader (``map_mla``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from attnid import families  # noqa: F401
from attnid.hf import meta, models, special  # noqa: F401  (each registers the mappers of further model types)
from attnid.families.alibi import AlibiSpec
from attnid.fields import shown_path
from attnid.hf.read import (ATTENTION_WORDS, CONFIG_FIELDS, LAYER_KINDS, MAPPERS, MAX_CONFIG_BYTES, NEVER_OFF_SWITCH,
                     ROPE_SCALING_WHY, SILENT,
                     WRAPPERS, Config, Ignored, LayerGroup, Mapper, ModelCount, _bias_all, _cross_attention, _heads, _shown, _spec, _uncover, _unknown_kind, _window, group_layers, layer_kinds,
                     register, rope_base, rope_fraction, rope_layers, supported_types)
from attnid.spec import AttentionSpec

__all__ = ["ATTENTION_WORDS", "CONFIG_FIELDS", "LAYER_KINDS", "MAPPERS", "MAX_CONFIG_BYTES", "ROPE_SCALING_WHY",
           "SILENT", "WRAPPERS", "Config", "Ignored", "LayerGroup", "Mapper", "ModelCount", "count_config", "group_layers",
           "layer_kinds", "model_count", "read_config", "register", "rope_base", "rope_fraction", "supported_types"]


def map_llama4(cfg: Config) -> list[LayerGroup]:
    """Llama 4: 3 of 4 layers with RoPE, chunked attention and an unweighted QK-norm; every 4th without RoPE.

    The RoPE layers rotate interleaved pairs (2i, 2i + 1), a fixed permutation of the rotate-half
    pairs (i, i + r/2) attnid uses (no count depends on it), and normalise after RoPE, which keeps
    the norm, so the function is the one with the norm before RoPE. The layers without RoPE
    multiply the queries at position p >= floor_scale by 1 + attn_scale log(1 + floor((p + 1) /
    floor_scale)): one factor per row of scores, which every move commutes with, and which is 1 at
    the positions the proofs read; no count depends on it.
    """
    d, h, kv, dk = _heads(cfg)
    n = cfg.layers()
    uses_rope = rope_layers(cfg, n)
    chunk = cfg.integer("attention_chunk_size") if cfg.has("attention_chunk_size") else None
    cfg.mark_read("attention_chunk_size")
    kinds = layer_kinds(cfg, n, lambda i: "chunked_attention" if uses_rope[i] and chunk is not None else "full_attention")
    qk_norm = "unweighted" if cfg.flag("use_qk_norm", True) else "none"
    eps = cfg.number("rms_norm_eps", 1e-5)
    if cfg.flag("attn_temperature_tuning", True):
        cfg.ignore("attn_temperature_tuning", "scales the queries of the layers without RoPE by a factor per position, "
                   "1 below floor_scale: every move commutes with it and no count depends on it")
        cfg.read.update(("floor_scale", "attn_scale"))
    base = rope_base(cfg, 500000.0)
    bias = _bias_all(cfg)
    labels = [f"{kind}{'' if rope else ' (no RoPE)'}" for kind, rope in zip(kinds, uses_rope)]

    def make(label: str) -> LayerGroup | AttentionSpec:
        kind, rope = label.split(" ")[0], "(no RoPE)" not in label
        if kind not in LAYER_KINDS:
            return _unknown_kind(kind)
        return _spec(cfg, d_model=d, heads=h, kv_heads=kv, head_dim=dk, v_head_dim=dk, bias=bias,
                     rope_fraction=1.0 if rope else 0.0, rope_base=base, causal=True,
                     qk_norm=qk_norm if rope else "none", qk_norm_eps=eps,
                     chunk=chunk if kind == "chunked_attention" else None, window=_window(cfg, kind))

    return group_layers(labels, make)


def map_gpt_neox(cfg: Config) -> list[LayerGroup]:
    """GPT-NeoX / Pythia: multi-head attention, rotary on rotary_pct of each head, biases everywhere."""
    d = cfg.integer("hidden_size")
    h = cfg.integer("num_attention_heads")
    n = cfg.layers()
    fraction = rope_fraction(cfg, 0.25, "rotary_pct")
    base = rope_base(cfg, 10000.0, None, "rotary_emb_base")
    spec = _spec(cfg, d_model=d, heads=h, bias=_bias_all(cfg, default=True), rope_fraction=fraction, rope_base=base,
                 causal=True)
    return [LayerGroup.from_layout("full_attention", n, spec)]


def map_falcon(cfg: Config) -> list[LayerGroup]:
    """Falcon: multi-query (7B), grouped (new_decoder_architecture, and the original 40B code of model_type
    RefinedWeb, which always builds n_head_kv groups), with RoPE or ALiBi (``attnid.families.alibi``)."""
    d = cfg.integer("hidden_size", None, "n_embd")
    h = cfg.integer("num_attention_heads", None, "n_head")
    n = cfg.layers()
    if cfg.flag("new_decoder_architecture", False) or cfg.raw.get("model_type") == "RefinedWeb":
        kv = cfg.integer("num_kv_heads", h, "n_head_kv")
    else:
        cfg.read.update(("num_kv_heads", "n_head_kv"))
        kv = 1 if cfg.flag("multi_query", True) else h
    bias = _bias_all(cfg, "bias", False)
    if cfg.flag("alibi", False):
        spec = _spec(cfg, d_model=d, heads=h, kv_heads=kv, bias=bias, causal=True)
        return [LayerGroup.from_layout("full_attention", n, AlibiSpec(spec))]
    spec = _spec(cfg, d_model=d, heads=h, kv_heads=kv, bias=bias, rope_fraction=1.0, rope_base=rope_base(cfg),
                 causal=True)
    return [LayerGroup.from_layout("full_attention", n, spec)]


def map_gpt2(cfg: Config) -> list[LayerGroup]:
    """GPT-2: causal multi-head attention with learned positions and biases on every projection."""
    d = cfg.integer("n_embd", None, "hidden_size")
    h = cfg.integer("n_head", None, "num_attention_heads")
    n = cfg.layers()
    for name, why in (("scale_attn_by_inverse_layer_idx", "a constant score factor per layer, which no count depends on"),
                      ("scale_attn_weights", "a constant score factor, which no count depends on")):
        if cfg.has(name):
            cfg.ignore(name, why)
    cfg.value("reorder_and_upcast_attn", None)
    spec = _spec(cfg, d_model=d, heads=h, bias="qkvo", causal=True)
    return [LayerGroup.from_layout("full_attention", n, spec), *_cross_attention(cfg, n)]


def map_bert(cfg: Config) -> list[LayerGroup]:
    """BERT: bidirectional (causal only as a decoder) multi-head attention with biases; relative positions not covered."""
    d = cfg.integer("hidden_size")
    h = cfg.integer("num_attention_heads")
    n = cfg.layers()
    causal = cfg.flag("is_decoder", False)
    positions = cfg.value("position_embedding_type", "absolute")
    spec = _spec(cfg, d_model=d, heads=h, bias="qkvo", causal=causal)
    note = "" if positions == "absolute" else (f"not covered: position_embedding_type {_shown(positions)} adds "
                                               "relative-position terms to the scores")
    return [LayerGroup.from_layout("full_attention", n, spec, note=note), *_cross_attention(cfg, n)]


# Model types whose attention classes attnid.hf.meta's table does not describe, and remote-code types transformers
# does not know; every other type is read through transformers (attnid.hf.meta).
for _type, _mapper in {
    "llama4": map_llama4, "llama4_text": map_llama4, "gpt_neox": map_gpt_neox, "falcon": map_falcon,
    "RefinedWebModel": map_falcon, "RefinedWeb": map_falcon, "gpt2": map_gpt2, "bert": map_bert,
}.items():
    register(_type, _mapper)

WRAPPERS.update({"llama4": "text_config", "kimi_k25": "text_config"})


# ------------------------------------------------------------------------------------------------
# Reading a file
# ------------------------------------------------------------------------------------------------


def map_mla(cfg: Config) -> list[LayerGroup]:
    """DeepSeek-V2/V3, Kimi K2: multi-head latent attention in every layer, read and counted by ``attnid.families.mla``.

    ``MLASpec.from_hf_config`` reads the fields it needs and names every other one with a reason;
    of those, the fields that look like attention settings are listed as ignored here.
    """
    layers = cfg.layers()
    spec, unread = families.family_named("latent").from_hf_config(cfg.raw)  # type: ignore[misc]
    cfg.mark_read(*cfg.raw)
    for name, why in unread.items():
        if any(word in name.lower() for word in ATTENTION_WORDS) and name not in SILENT and name != "num_hidden_layers":
            cfg.ignore(name, why)
    return [LayerGroup.from_layout("full_attention", layers, spec)]


for _type in ("deepseek_v2", "deepseek_v3", "kimi_k2", "kimi_k25"):
    register(_type, map_mla)


def _exists(path: Path) -> bool:
    """Whether ``path`` exists (True when the system cannot tell: the file's own reading then says why)."""
    try:
        return path.exists()
    except OSError:
        return True


def cached(model_id: str) -> Path | None:
    """The config.json of ``model_id`` ('org/name') in the local Hugging Face cache (offline), or None."""
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", model_id):
        return None
    from huggingface_hub import try_to_load_from_cache
    found = try_to_load_from_cache(model_id, "config.json")
    return Path(found) if isinstance(found, str) else None


def read_config(path: Path | str) -> tuple[dict[str, Any], str]:
    """(the JSON object, the file's path as text) from a config.json, a folder holding one, or the id of a model
    in the local Hugging Face cache ('org/name', read offline)."""
    if not _exists(Path(path)) and cached(str(path)) is not None:
        path = cached(str(path))  # type: ignore[assignment]
    path = Path(path)
    where = shown_path(path)
    try:  # a name too long, or a folder the user may not enter, fails already here
        if path.is_dir():
            path = path / "config.json"
            where = shown_path(path)
        size = path.stat().st_size
    except OSError as exc:
        raise ValueError(f"{where}: cannot read ({exc.strerror or exc})") from None
    if not path.is_file():
        raise ValueError(f"{where}: is not a file")
    if size > MAX_CONFIG_BYTES:
        raise ValueError(f"{where}: {size} bytes, larger than a configuration ({MAX_CONFIG_BYTES} bytes at most)")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{where}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{where}: cannot read ({exc})") from None
    try:
        data = json.loads(text, parse_constant=lambda c: float(c))
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{where}: the top level must be a JSON object, got {type(data).__name__}")
    return data, where


def model_count(path: Path | str, route: str = "auto") -> ModelCount:
    """Per-layer-type and whole-model attention counts from a config.json (or a folder holding one)."""
    data, where = read_config(path)
    return count_config(data, where, route)


def count_config(data: dict[str, Any], where: str = "config", route: str = "auto") -> ModelCount:
    """``model_count`` for a configuration already read into a dict: through the modules transformers builds
    (``attnid.hf.meta``) where it knows the model type, else through the reader registered for it.

    ``route`` 'reader' skips the first way and 'transformers' the second (the tests cross-check the two)."""
    model_type = data.get("model_type")
    if route not in ("auto", "reader", "transformers"):
        raise ValueError(f"route must be auto, reader or transformers, got {route!r}")
    if route == "transformers" and not meta.known(model_type):
        raise ValueError(f"{where}: transformers has no config class for model_type {_shown(model_type)}")
    if route == "transformers":
        return meta.meta_count(data, where, declinable=False)
    if route == "auto" and isinstance(model_type, str) and model_type in meta.REMOTE_AS:
        return meta.remote_count(data, where)
    if route == "auto" and meta.known(model_type):
        try:
            return meta.meta_count(data, where, declinable=model_type in MAPPERS)
        except meta.MetaRouteDeclined:
            pass
    if not isinstance(model_type, str) or model_type not in MAPPERS:
        shown = "no model_type" if model_type is None else f"model_type {_shown(model_type)}"
        raise ValueError(f"{where}: {shown} is not supported; supported: every model type transformers knows, "
                         f"and through attnid's readers {', '.join(supported_types())}")
    inner = WRAPPERS.get(model_type)
    if inner and isinstance(data.get(inner), dict):
        wrapped = data[inner]
        data = {**wrapped, "model_type": wrapped.get("model_type", model_type)}
        where = f"{where} ({inner})"
        if data["model_type"] in MAPPERS:  # the language model's own mapper (LLaVA's Llama, Fuyu's Persimmon)
            model_type = data["model_type"]
    cfg = Config(data, where)
    cfg.read.add("model_type")
    try:
        groups = MAPPERS[model_type](cfg)
    except (TypeError, OverflowError, KeyError, AttributeError, IndexError, RecursionError) as exc:
        # a mapper meeting a value of a type it did not expect: one line naming the file, never a traceback
        raise ValueError(f"{where}: a field has a value the {model_type} mapper cannot read ({type(exc).__name__}: "
                         f"{exc})") from None
    if cfg.flag("is_encoder_decoder", False):
        cfg.mark_read("is_encoder_decoder")  # its cross-attention is a group of its own (prop-cross-attention)
    pruned = cfg.value("pruned_heads", None)
    if pruned:
        cfg.ignore("pruned_heads", "heads were pruned from some layers: the counts assume every head is there")
        groups = [_uncover(g, "not covered: pruned heads") for g in groups]
    for name in SILENT:
        cfg.read.add(name)
    unread = sorted(k for k in data if k not in cfg.read)
    ignored = list(cfg.ignored)
    for name in unread:
        if any(word in name.lower() for word in ATTENTION_WORDS) and data[name] is not None:
            off = data[name] is False and not any(word in name.lower() for word in NEVER_OFF_SWITCH)
            ignored.append(Ignored(name, data[name], f"not read by the {model_type} mapper"
                                   + (": a switch that is off, so no feature it could add" if off else "")))
    unknown = [i.field for i in ignored if i.why == f"not read by the {model_type} mapper"]
    if unknown:  # a field the mapper does not know may change the attention: no count rests on a guess
        shown = ", ".join(unknown[:3]) + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
        groups = [_uncover(g, f"not covered: {shown} may describe the attention and the {model_type} mapper does "
                              "not read it") for g in groups]
    listed = {i.field for i in ignored}
    not_attention = [k for k in unread if k not in listed]
    return ModelCount(where, model_type, groups, ignored, not_attention)
