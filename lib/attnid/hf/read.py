"""The pieces every ``config.json`` mapper is built from: the checked ``Config``, the shared readers, the registry.

The records a mapper returns (``LayerGroup``, ``Ignored``, ``ModelCount``) live in ``attnid.hf.groups``.

``Config`` hands out fields through checked accessors (``integer``, ``number``, ``flag``) and
records what was read; ``ignore`` lists a field that is read but cannot enter a count, with the
reason. The shared readers (``rope_base``, ``rope_fraction``, ``layer_kinds``, ``_decoder``) read
the fields most decoders share. ``MAPPERS`` maps a ``model_type`` to its mapper; the mappers live in
``attnid.hf.config`` and ``attnid.hf.models``, which register them, and ``attnid.hf.config`` reads a
file and applies the registered mapper.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from attnid.fields import FIELDS, json_integer
from attnid.hf.groups import Ignored, LayerGroup, ModelCount, withheld  # noqa: F401  (ModelCount: re-exported)
from attnid.spec import AttentionSpec

MAX_CONFIG_BYTES = 4 * 2**20  # a config.json is a few kB; larger files are refused unread
# Unread fields whose names contain one of these are listed as ignored: they may describe the attention.
ATTENTION_WORDS = ("attn", "attention", "rope", "rotary", "head", "window", "qk", "kv", "query", "key", "softcap",
                   "sink", "alibi", "position", "chunk", "layer_type", "theta", "partial", "scaling", "bias", "norm",
                   "causal", "decoder", "cross")
# Fields that never change what an attention layer computes at a point (training or bookkeeping), read silently.
SILENT = ("attention_dropout", "attention_probs_dropout_prob", "attn_pdrop", "max_position_embeddings",
          "n_positions", "n_ctx", "pretraining_tp", "use_cache", "layer_norm_eps", "layer_norm_epsilon",
          "rms_norm_eps", "tie_word_embeddings", "mlp_bias", "final_logit_softcapping", "initializer_range",
          "output_attentions", "output_hidden_states", "return_dict", "chunk_size_feed_forward", "embd_pdrop",
          "resid_pdrop", "hidden_dropout", "parallel_attn", "num_ln_in_parallel_attn", "use_parallel_residual",
          # mixture-of-experts routing and training-time precision switches: no effect on an attention layer's function
          "norm_topk_prob", "decoder_sparse_step", "attention_softmax_in_fp32", "scale_attention_softmax_in_fp32",
          "norm_epsilon", "norm_eps", "apply_residual_connection_post_layernorm", "residual_in_fp32",
          "fp32_residual_connection", "apply_query_key_layer_scaling",
          # attention implementations and dropouts: how the same function is computed or trained
          "attn_implementation", "_attn_implementation", "use_flash_attn", "attn_dropout_prob", "softmax_in_fp32",
          "masked_softmax_fusion", "bias_dropout_fusion", "use_cache_quantization", "use_cache_kernel",
          "routed_scaling_factor", "decoder_start_token_id", "pad_key_length", "pre_allocate_kv_cache", "norm_type",
          "_attn_implementation_autoset", "use_flash_attention_2", "use_sdpa", "use_memory_efficient_attention",
          # the training length a RoPE scaling refers to: with a scaling it is listed with the scaling, without unused
          "original_max_position_embeddings")
# Unread switches that are off (false) describe a feature the model does not use; they are listed as ignored, not
# fatal, unless their name says which keys a query sees (a false "causal" flag would change the mask).
NEVER_OFF_SWITCH = ("causal", "bidirectional", "decoder", "cross")
LAYER_KINDS = ("full_attention", "sliding_attention", "chunked_attention")
CROSS_NOTE = "cross-attention: queries from the decoder, keys and values from the encoder's output (prop-cross-attention)"


def _shown(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) or math.isfinite(value) else repr(value)
    return text if len(text) <= 60 else text[:56] + "..."


# config.json keys that hold a layout field, and the field (attnid.fields) whose rule they follow.
CONFIG_FIELDS = {
    **dict.fromkeys(("hidden_size", "n_embd", "d_model"), "d_model"),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads"), "heads"),
    **dict.fromkeys(("num_key_value_heads", "num_kv_heads", "n_head_kv"), "kv_heads"),
    "head_dim": "head_dim",
    **dict.fromkeys(("sliding_window", "sliding_window_size"), "window"),
    "attention_chunk_size": "chunk",
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers"), "layers"),
}


class Config:
    """A configuration dict whose fields are read through checked accessors that record what was read."""

    def __init__(self, raw: dict[str, Any], where: str) -> None:
        self.raw = raw
        self.where = where
        self.read: set[str] = set()
        self.ignored: list[Ignored] = []
        self._ignored_names: set[str] = set()

    def _fail(self, name: str, message: str) -> ValueError:
        return ValueError(f"{self.where}: field {name!r} {message}")

    def has(self, name: str) -> bool:
        """Whether the field is present and not null."""
        return self.raw.get(name) is not None

    def mark_read(self, *names: str) -> None:
        """Record fields as read (a plugged-in reader that consumed them itself)."""
        self.read.update(names)

    def value(self, name: str, default: Any = None) -> Any:
        """The raw value of a field (``default`` when absent or null), marked as read."""
        self.read.add(name)
        value = self.raw.get(name)
        return default if value is None else value

    def integer(self, name: str, default: int | None = None, *aliases: str) -> int:
        """A positive integer field (a float with an integer value is accepted, as JSON writers produce them)."""
        for key in (name, *aliases):
            self.read.add(key)
            if self.raw.get(key) is not None:
                value, name = self.raw[key], key
                break
        else:
            if default is None:
                raise self._fail(name, "is missing, and this model type has no default for it")
            return default
        try:
            return FIELDS[CONFIG_FIELDS.get(name, "positive_integer")].check(json_integer(value), _shown)
        except (TypeError, ValueError) as exc:
            raise self._fail(name, str(exc)) from None

    def number(self, name: str, default: float) -> float:
        """A finite real number field, marked as read."""
        value = self.value(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._fail(name, f"must be a finite number, got {_shown(value)}")
        try:
            number = float(value)
        except OverflowError:  # an integer beyond every float
            raise self._fail(name, f"must be a finite number, got an integer of {len(str(value))} digits") from None
        if not math.isfinite(number):
            raise self._fail(name, f"must be a finite number, got {_shown(value)}")
        return number

    def flag(self, name: str, default: bool) -> bool:
        """A true/false field, marked as read."""
        value = self.value(name, default)
        if not isinstance(value, bool):
            raise self._fail(name, f"must be true or false, got {_shown(value)}")
        return value

    def ignore(self, name: str, why: str, value: Any = None) -> None:
        """List a field that is read but does not enter the counts (once; later reasons are dropped)."""
        self.read.add(name)
        shown = self.raw.get(name) if value is None else value
        if name not in self._ignored_names:
            self._ignored_names.add(name)
            self.ignored.append(Ignored(name, shown, why))

    def layers(self) -> int:
        """num_hidden_layers (or n_layer, num_layers), checked by the field schema."""
        return self.integer("num_hidden_layers", None, "n_layer", "num_layers")


Mapper = Callable[[Config], list[LayerGroup]]
MAPPERS: dict[str, Mapper] = {}


def register(model_type: str, mapper: Mapper) -> None:
    """Add (or replace) the mapper for a ``model_type``."""
    if not isinstance(model_type, str) or not model_type:
        raise ValueError(f"model_type must be a non-empty string, got {model_type!r}")
    MAPPERS[model_type] = mapper


def supported_types() -> list[str]:
    """The model types with a mapper, sorted."""
    return sorted(MAPPERS)


# ------------------------------------------------------------------------------------------------
# Shared readers: RoPE, layer types
# ------------------------------------------------------------------------------------------------

ROPE_SCALING_WHY = ("RoPE scaling changes the rotation frequencies; the counts need only that they stay distinct "
                    "and in (0, 1] (chapter 6), which the published scalings keep, but the layer built here uses "
                    "the unscaled frequencies base^(-2i/r)")


def _rope_parameters(cfg: Config, kind: str | None = None) -> dict[str, Any]:
    """The rope_parameters dict of transformers 5 (per layer type where it is keyed so), else {}."""
    params = cfg.value("rope_parameters", None)
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise cfg._fail("rope_parameters", f"must be a mapping, got {_shown(params)}")
    if kind is not None and isinstance(params.get(kind), dict):
        return params[kind]
    if all(isinstance(v, dict) for v in params.values()) and params:
        return params.get("full_attention", next(iter(params.values())))
    return params


def rope_base(cfg: Config, default: float = 10000.0, kind: str | None = None, *names: str) -> float:
    """The RoPE base: rope_parameters.rope_theta, else rope_theta (or the family's older names), else the default."""
    params = _rope_parameters(cfg, kind)
    base = params.get("rope_theta") if params else None
    flat = not any(isinstance(v, dict) for v in (cfg.value("rope_parameters", None) or {}).values())
    if base is not None and flat and cfg.has("rope_theta") and cfg.number("rope_theta", base) != base:
        raise cfg._fail("rope_theta", f"is {_shown(cfg.raw['rope_theta'])} but rope_parameters.rope_theta is "
                                      f"{_shown(base)}: which one the model uses is not clear")
    if base is None:
        for name in ("rope_theta", *names):
            if cfg.has(name):
                base = cfg.number(name, default)
                break
            cfg.read.add(name)
    base = default if base is None else base
    try:
        base = FIELDS["rope_base"].check(base, _shown)
    except (TypeError, ValueError) as exc:
        raise cfg._fail("rope_theta", str(exc)) from None
    _rope_scaling(cfg, params)
    return base


def _rope_scaling(cfg: Config, params: dict[str, Any]) -> None:
    scaling = cfg.value("rope_scaling", None)
    kind = params.get("rope_type", "default") if params else "default"
    if scaling is not None:
        cfg.ignore("rope_scaling", ROPE_SCALING_WHY)
    elif kind not in ("default", None):
        cfg.ignore("rope_parameters", ROPE_SCALING_WHY + f" (rope_type {kind})", value=params)


def rope_fraction(cfg: Config, default: float, *names: str) -> float:
    """The share of each head rotated: rope_parameters.partial_rotary_factor, partial_rotary_factor, or older names."""
    params = _rope_parameters(cfg)
    if params and params.get("partial_rotary_factor") is not None:
        value = params["partial_rotary_factor"]
    else:
        value = None
        for name in ("partial_rotary_factor", *names):
            if cfg.has(name):
                value = cfg.value(name)
                break
            cfg.read.add(name)
    value = default if value is None else value
    try:
        return FIELDS["rope_fraction"].check(value, _shown)
    except (TypeError, ValueError) as exc:
        raise cfg._fail("partial_rotary_factor", str(exc)) from None


def layer_kinds(cfg: Config, n_layers: int, default: Callable[[int], str]) -> list[str]:
    """One layer type per layer: the config's layer_types if it has them, else ``default(i)``."""
    given = cfg.value("layer_types", None)
    if given is None:
        return [default(i) for i in range(n_layers)]
    if not isinstance(given, list) or not all(isinstance(k, str) and k for k in given):
        raise cfg._fail("layer_types", "must be a list of layer-type names")
    if len(given) != n_layers:
        raise cfg._fail("layer_types", f"has {len(given)} entries for {n_layers} layers")
    return list(given)


def group_layers(kinds: list[str], make: Callable[[str], LayerGroup | AttentionSpec]) -> list[LayerGroup]:
    """Groups in order of first appearance: ``make(kind)`` gives a group or a spec for one layer of that type."""
    groups: list[LayerGroup] = []
    per_kind = Counter(kinds)  # linear in the layers: a list.count per kind was quadratic with many kinds
    for kind in per_kind:
        made = make(kind)
        n = per_kind[kind]
        if isinstance(made, AttentionSpec):
            groups.append(LayerGroup.from_layout(kind, n, made))
        else:
            groups.append(replace(made, layers=n))
    return groups


def _unknown_kind(kind: str) -> LayerGroup:
    return LayerGroup.not_counted(kind, 1, f"layer type {kind!r} is not one this tool counts "
                                           f"({', '.join(LAYER_KINDS)})")


def _spec(cfg: Config, **fields: Any) -> AttentionSpec:
    try:
        return AttentionSpec.create(**fields)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{cfg.where}: the configuration gives an invalid layout: {exc}") from None


def _heads(cfg: Config, head_dim_default: int | None = None) -> tuple[int, int, int, int]:
    """(d_model, heads, kv_heads, head_dim) with the usual names and defaults (kv = heads, head_dim = d / heads)."""
    d = cfg.integer("hidden_size", None, "n_embd", "d_model")
    h = cfg.integer("num_attention_heads", None, "n_head", "num_heads")
    kv = cfg.integer("num_key_value_heads", h)
    if head_dim_default is None:
        if d % h and not cfg.has("head_dim"):
            raise cfg._fail("head_dim", f"is missing and num_attention_heads {h} does not divide hidden_size {d}")
        head_dim_default = d // h
    dk = cfg.integer("head_dim", head_dim_default)
    return d, h, kv, dk


def _window(cfg: Config, kind: str) -> int | None:
    if kind != "sliding_attention":
        return None
    return cfg.integer("sliding_window", None, "sliding_window_size")


# ------------------------------------------------------------------------------------------------
# The families
# ------------------------------------------------------------------------------------------------


def _decoder(cfg: Config, *, bias: str, qk_norm: str = "none", eps_default: float = 1e-6,
             head_dim_default: int | None = None, kinds: list[str] | None = None, fraction: float = 1.0,
             base_default: float = 10000.0, local_base: float | None = None, norm: str = "softmax",
             sink: bool = False, no_rope: tuple[str, ...] = ()) -> list[LayerGroup]:
    """A decoder with q/k/v/o projections, RoPE (not on the layer types in ``no_rope``), causal masks, optional
    QK-norm and sliding windows."""
    d, h, kv, dk = _heads(cfg, head_dim_default)
    n = cfg.layers()
    eps = cfg.number("rms_norm_eps", eps_default) if qk_norm != "none" else 1e-6
    kinds = kinds if kinds is not None else layer_kinds(cfg, n, lambda i: "full_attention")

    def make(kind: str) -> LayerGroup | AttentionSpec:
        if kind not in LAYER_KINDS:
            return _unknown_kind(kind)
        base = rope_base(cfg, base_default, kind)
        if local_base is not None and kind == "sliding_attention":
            base = local_base
        return _spec(cfg, d_model=d, heads=h, kv_heads=kv, head_dim=dk, v_head_dim=dk, bias=bias,
                     rope_fraction=0.0 if kind in no_rope else fraction, rope_base=base, causal=True, norm=norm,
                     sink_learned=sink,
                     qk_norm=qk_norm, qk_norm_eps=eps, window=_window(cfg, kind))

    return group_layers(kinds, make)


def _bias_all(cfg: Config, name: str = "attention_bias", default: bool = False) -> str:
    return "qkvo" if cfg.flag(name, default) else "none"


def _uncover(group: LayerGroup, note: str) -> LayerGroup:
    """The group with its count withheld (``note`` says why); a group that is not attention stays as it is."""
    if group.count is None:
        return group
    return replace(group, count=withheld(group.count), note=note)


# Configurations that wrap the language model's configuration (multimodal checkpoints): model_type -> the inner key.
WRAPPERS: dict[str, str] = {}


def _cross_attention(cfg: Config, n: int) -> list[LayerGroup]:
    """A not-counted group of cross-attention layers when add_cross_attention is true, else nothing."""
    if not cfg.flag("add_cross_attention", False):
        return []
    return [LayerGroup.not_counted("cross_attention", n, "cross-attention to an encoder's output: this reader does "
                                                         "not count it (prop-cross-attention counts it where the "
                                                         "transformers route reads the attention class)")]


def rope_layers(cfg: Config, n: int) -> list[int]:
    """Per layer 1 with RoPE, 0 without: no_rope_layers (Llama 4, SmolLM3), else every no_rope_layer_interval-th
    layer (default 4) without."""
    interval = cfg.integer("no_rope_layer_interval", 4)
    uses = cfg.value("no_rope_layers", None) or [int((i + 1) % interval != 0) for i in range(n)]
    if not isinstance(uses, list) or len(uses) != n or any(v not in (0, 1) for v in uses):
        raise cfg._fail("no_rope_layers", f"must list 0 or 1 for each of the {n} layers")
    return uses


def checked_fields(data: dict[str, Any], where: str) -> None:
    """The file's widths, counts and RoPE settings, checked by the rules every other door applies (``attnid.fields``),
    before transformers reads it (the meta-device route, ``attnid.hf.meta``)."""
    for part, label in ((data, where), *((data[k], f"{where} ({k})") for k in ("text_config", "llm_config")
                                         if isinstance(data.get(k), dict))):
        cfg = Config(part, label)
        for name in CONFIG_FIELDS:  # widths and counts; a window or chunk is checked where a layer uses it
            if cfg.has(name) and CONFIG_FIELDS[name] not in ("window", "chunk"):
                cfg.integer(name)
        if cfg.has("partial_rotary_factor"):
            rope_fraction(cfg, 1.0)
        _rope_checked(part, label)


def _rope_checked(part: dict[str, Any], where: str) -> None:
    """Each RoPE base and rotated share the file gives (top level, or in rope_parameters, flat or per layer type)
    by attnid's rules, so that a base beyond every float or a list in place of a number is named, not met by torch."""
    params = part.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise ValueError(f"{where}: field 'rope_parameters' must be a mapping, got {_shown(params)}")
    nested = {f"rope_parameters.{k}": v for k, v in (params or {}).items() if isinstance(v, dict)}
    places = {"": part, **({"rope_parameters": params} if params and not nested else nested)}
    for prefix, fields in places.items():
        for name, rule in (("rope_theta", "rope_base"), ("partial_rotary_factor", "rope_fraction")):
            if fields.get(name) is None or (prefix == "" and name == "partial_rotary_factor"):
                continue
            label = f"{prefix}.{name}" if prefix else name
            try:
                FIELDS[rule].check(fields[name], _shown)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{where}: field {label!r} {exc}") from None
