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
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import families
from .layout import Count, Layout
from .fields import FIELDS
from .spec import AttentionSpec

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
          "resid_pdrop", "hidden_dropout", "parallel_attn", "num_ln_in_parallel_attn", "use_parallel_residual")
LAYER_KINDS = ("full_attention", "sliding_attention", "chunked_attention")


@dataclass(frozen=True)
class LayerGroup:
    """Layers of one type with the same layout: ``layers`` of them, each with these counts.

    ``attention`` is False for a layer type this tool does not count (its parameters are then
    unknown, ``total`` 0 and ``unidentified`` None). ``spec`` is the layout, of any family.
    """

    kind: str
    layers: int
    description: str
    total: int
    unidentified: int | None
    breakdown: dict[str, int] = field(default_factory=dict)
    note: str = ""
    weakly_identified: int = 0
    spec: Any = None
    attention: bool = True

    @classmethod
    def from_layout(cls, kind: str, layers: int, layout: Layout, note: str = "") -> "LayerGroup":
        """A group of attention layers of a layout of any family, counted by its family (``attnid.families``).

        A ``note`` says why the count does not apply to these layers (the group is then not covered).
        """
        return cls.from_count(kind, layers, families.count(layout), note)

    @classmethod
    def from_count(cls, kind: str, layers: int, counted: Count, note: str = "") -> "LayerGroup":
        """A group from a ``Count`` already made (a plugged-in family that counts itself)."""
        notes = "; ".join(n for n in (note, counted.note) if n)
        return cls(kind, layers, counted.spec.describe(), counted.total, counted.unidentified if not note else None,
                   dict(counted.breakdown) if not note else {}, notes, counted.weakly_identified, counted.spec)

    @classmethod
    def not_counted(cls, kind: str, layers: int, why: str) -> "LayerGroup":
        """Layers of a type this tool does not count."""
        return cls(kind, layers, f"{kind}: not counted", 0, None, {}, why, 0, None, attention=False)

    @property
    def ratio(self) -> float | None:
        """unidentified / total per layer (None when not covered or not counted)."""
        return None if self.unidentified is None or not self.total else self.unidentified / self.total

    def record(self) -> dict[str, Any]:
        """The group as a JSON-ready dict (what `attnid count --config --json` prints)."""
        layout = self.spec.to_dict() if isinstance(self.spec, Layout) else None
        return {"layer_type": self.kind, "layers": self.layers, "attention": self.attention,
                "layout": self.description, "layout_fields": layout, "parameters_per_layer": self.total,
                "unidentified_per_layer": self.unidentified, "ratio": self.ratio, "breakdown": self.breakdown,
                "weakly_identified_per_layer": self.weakly_identified, "note": self.note}


@dataclass(frozen=True)
class Ignored:
    """A configuration field that does not enter the counts, and why."""

    field: str
    value: Any
    why: str

    def record(self) -> dict[str, Any]:
        """The field, its value and the reason, as a JSON-ready dict."""
        return {"field": self.field, "value": self.value, "why": self.why}


@dataclass(frozen=True)
class ModelCount:
    """A whole model's attention, by layer type, from its configuration."""

    source: str
    model_type: str
    groups: list[LayerGroup]
    ignored: list[Ignored]
    not_attention: list[str]

    @property
    def layers(self) -> int:
        """Layers of every type, counted or not."""
        return sum(g.layers for g in self.groups)

    @property
    def counted(self) -> list[LayerGroup]:
        """The groups of attention layers this tool counts."""
        return [g for g in self.groups if g.attention]

    @property
    def total(self) -> int:
        """Parameters of all counted attention layers."""
        return sum(g.total * g.layers for g in self.counted)

    @property
    def unidentified(self) -> int | None:
        """Unidentified parameters of all counted attention layers (None if any of them has no exact count)."""
        if any(g.unidentified is None for g in self.counted):
            return None
        return sum(g.unidentified * g.layers for g in self.counted)  # type: ignore[operator]

    @property
    def weakly_identified(self) -> int:
        """Directions identified only through a norm's eps, over all counted layers."""
        return sum(g.weakly_identified * g.layers for g in self.counted)

    @property
    def ratio(self) -> float | None:
        """unidentified / total over all counted layers (None when any group is not covered)."""
        u = self.unidentified
        return None if u is None or not self.total else u / self.total

    def record(self) -> dict[str, Any]:
        """The whole model as a JSON-ready dict."""
        return {"config": self.source, "model_type": self.model_type, "layers": self.layers,
                "layers_counted": sum(g.layers for g in self.counted),
                "groups": [g.record() for g in self.groups],
                "parameters_all_layers": self.total, "unidentified_all_layers": self.unidentified,
                "ratio": self.ratio, "weakly_identified_all_layers": self.weakly_identified,
                "ignored": [i.record() for i in self.ignored], "not_attention_fields": self.not_attention}


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
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        try:
            return FIELDS[CONFIG_FIELDS.get(name, "positive_integer")].check(value, _shown)
        except (TypeError, ValueError) as exc:
            raise self._fail(name, str(exc)) from None

    def number(self, name: str, default: float) -> float:
        """A finite real number field, marked as read."""
        value = self.value(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self._fail(name, f"must be a finite number, got {_shown(value)}")
        return float(value)

    def flag(self, name: str, default: bool) -> bool:
        """A true/false field, marked as read."""
        value = self.value(name, default)
        if not isinstance(value, bool):
            raise self._fail(name, f"must be true or false, got {_shown(value)}")
        return value

    def ignore(self, name: str, why: str, value: Any = None) -> None:
        """List a field that is read but does not enter the counts."""
        self.read.add(name)
        shown = self.raw.get(name) if value is None else value
        if all(i.field != name for i in self.ignored):
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
    for kind in dict.fromkeys(kinds):
        made = make(kind)
        n = kinds.count(kind)
        if isinstance(made, AttentionSpec):
            groups.append(LayerGroup.from_layout(kind, n, made))
        else:
            groups.append(LayerGroup(made.kind, n, made.description, made.total, made.unidentified, made.breakdown,
                                     made.note, made.weakly_identified, made.spec, made.attention))
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


def _qwen_kinds(cfg: Config, n: int) -> list[str]:
    """Qwen2/Qwen3: sliding windows only with use_sliding_window, on the layers from max_window_layers on."""
    use = cfg.flag("use_sliding_window", False)
    first = cfg.integer("max_window_layers", n) if use else n
    if not use:
        cfg.read.update(("sliding_window", "max_window_layers"))
    return layer_kinds(cfg, n, lambda i: "sliding_attention" if use and i >= first else "full_attention")


# ------------------------------------------------------------------------------------------------
# The families
# ------------------------------------------------------------------------------------------------


def _decoder(cfg: Config, *, bias: str, qk_norm: str = "none", eps_default: float = 1e-6,
             head_dim_default: int | None = None, kinds: list[str] | None = None, fraction: float = 1.0,
             base_default: float = 10000.0, local_base: float | None = None, norm: str = "softmax",
             sink: bool = False) -> list[LayerGroup]:
    """A decoder with q/k/v/o projections, RoPE, causal masks, optional QK-norm and sliding windows."""
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
                     rope_fraction=fraction, rope_base=base, causal=True, norm=norm, sink_learned=sink,
                     qk_norm=qk_norm, qk_norm_eps=eps, window=_window(cfg, kind))

    return group_layers(kinds, make)


def _bias_all(cfg: Config, name: str = "attention_bias", default: bool = False) -> str:
    return "qkvo" if cfg.flag(name, default) else "none"


def map_llama(cfg: Config) -> list[LayerGroup]:
    """Llama 2/3: GQA with RoPE on every layer, biases from attention_bias."""
    return _decoder(cfg, bias=_bias_all(cfg))


def map_mistral(cfg: Config) -> list[LayerGroup]:
    """Mistral (and Mixtral's attention): GQA with RoPE, no biases, a sliding window on every layer when given."""
    n = cfg.layers()
    window = cfg.value("sliding_window", None)
    kinds = layer_kinds(cfg, n, lambda i: "full_attention" if window is None else "sliding_attention")
    return _decoder(cfg, bias="none", kinds=kinds)


def map_qwen2(cfg: Config) -> list[LayerGroup]:
    """Qwen2/2.5: GQA with RoPE, biases on q, k and v (not o), sliding windows per use_sliding_window."""
    return _decoder(cfg, bias="qkv", kinds=_qwen_kinds(cfg, cfg.layers()))


def map_qwen3(cfg: Config) -> list[LayerGroup]:
    """Qwen3: GQA with RoPE and a shared QK-norm (one weight vector over head_dim for all heads)."""
    # transformers' Qwen3Config: head_dim 128 unless given; q_norm and k_norm over head_dim, shared by the heads
    return _decoder(cfg, bias=_bias_all(cfg), qk_norm="shared", head_dim_default=128, kinds=_qwen_kinds(cfg, cfg.layers()))


def map_olmo2(cfg: Config) -> list[LayerGroup]:
    """OLMo-2: a QK-norm over the whole projection width ('full'), eps 1e-5 unless given."""
    # q_norm over num_attention_heads * head_dim, k_norm over num_key_value_heads * head_dim (Olmo2Attention)
    return _decoder(cfg, bias=_bias_all(cfg), qk_norm="full", eps_default=1e-5)


def map_gemma(cfg: Config) -> list[LayerGroup]:
    """Gemma 1: multi-head or multi-query attention with RoPE, head_dim 256 unless given."""
    return _decoder(cfg, bias=_bias_all(cfg), head_dim_default=256)


def _score_scale(cfg: Config) -> None:
    if cfg.has("query_pre_attn_scalar"):
        cfg.ignore("query_pre_attn_scalar", "scores are scaled by query_pre_attn_scalar^-1/2 instead of "
                   "head_dim^-1/2: a constant factor, which no count depends on")


def _softcap_note(cfg: Config) -> str:
    cap = cfg.value("attn_logit_softcapping", None)
    if cap is None:
        return ""
    return (f"not covered: attention logit soft-capping ({_shown(cap)} tanh(s / {_shown(cap)})) bends every score; "
            "no theorem of the book covers it")


def map_gemma2(cfg: Config) -> list[LayerGroup]:
    """Gemma 2: alternating sliding and full layers; logit soft-capping withheld (not covered), the score scale a constant."""
    n = cfg.layers()
    _score_scale(cfg)
    cap = _softcap_note(cfg)
    kinds = layer_kinds(cfg, n, lambda i: "sliding_attention" if (i + 1) % 2 else "full_attention")
    groups = _decoder(cfg, bias=_bias_all(cfg), head_dim_default=256, kinds=kinds)
    return [_uncover(g, cap) for g in groups] if cap else groups


def _uncover(group: LayerGroup, note: str) -> LayerGroup:
    if not group.attention:
        return group
    return LayerGroup(group.kind, group.layers, group.description, group.total, None, {}, note, 0, group.spec)


def map_gemma3(cfg: Config) -> list[LayerGroup]:
    """Gemma 3: five sliding layers to one full (sliding_window_pattern), a shared QK-norm, a RoPE base per layer type."""
    n = cfg.layers()
    _score_scale(cfg)
    cap = _softcap_note(cfg)
    pattern = cfg.integer("sliding_window_pattern", 6, "_sliding_window_pattern")
    kinds = layer_kinds(cfg, n, lambda i: "sliding_attention" if (i + 1) % pattern else "full_attention")
    keyed = cfg.raw.get("rope_parameters")
    local_params = keyed.get("sliding_attention") if isinstance(keyed, dict) else None
    if isinstance(local_params, dict) and local_params.get("rope_theta") is not None:
        local = float(local_params["rope_theta"])  # transformers 5: rope_parameters keyed by layer type
    else:
        local = cfg.number("rope_local_base_freq", 10000.0)
    if cfg.flag("use_bidirectional_attention", False):
        raise ValueError(f"{cfg.where}: use_bidirectional_attention is true: bidirectional sliding windows are not a "
                         "layout attnid describes")
    groups = _decoder(cfg, bias=_bias_all(cfg), qk_norm="shared", head_dim_default=256, kinds=kinds,
                      base_default=1_000_000.0, local_base=local)
    return [_uncover(g, cap) for g in groups] if cap else groups


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
    interval = cfg.integer("no_rope_layer_interval", 4)
    uses_rope = cfg.value("no_rope_layers", None) or [int((i + 1) % interval != 0) for i in range(n)]
    if not isinstance(uses_rope, list) or len(uses_rope) != n or any(v not in (0, 1) for v in uses_rope):
        raise cfg._fail("no_rope_layers", f"must list 0 or 1 for each of the {n} layers")
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


def map_gpt_oss(cfg: Config) -> list[LayerGroup]:
    """gpt-oss: alternating sliding and full layers, biases on every projection, a learned sink logit per head."""
    n = cfg.layers()
    kinds = layer_kinds(cfg, n, lambda i: "sliding_attention" if i % 2 == 0 else "full_attention")
    return _decoder(cfg, bias=_bias_all(cfg, default=True), head_dim_default=64, kinds=kinds, base_default=150000.0,
                    norm="sink", sink=True)


def map_phi(cfg: Config) -> list[LayerGroup]:
    """Phi-1/2: multi-head attention with partial RoPE and biases everywhere; qk_layernorm is not covered."""
    if cfg.flag("qk_layernorm", False):
        note = ("not covered: qk_layernorm applies a LayerNorm (centring, scale and bias) to the queries and keys, "
                "not the RMSNorm of chapter 7b")
    else:
        note = ""
    groups = _decoder(cfg, bias="qkvo", fraction=rope_fraction(cfg, 0.5))
    return [_uncover(g, note) for g in groups] if note else groups


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
    RefinedWeb, which always builds n_head_kv groups), or ALiBi (not covered)."""
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
        group = LayerGroup.from_layout("full_attention", n, spec, note="not covered: ALiBi adds a per-head linear "
                                                                      "position bias to the scores")
        return [group]
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


def _cross_attention(cfg: Config, n: int) -> list[LayerGroup]:
    if not cfg.flag("add_cross_attention", False):
        return []
    return [LayerGroup.not_counted("cross_attention", n, "cross-attention to an encoder's output: its keys and values "
                                                         "come from another sequence, which no theorem here covers")]


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


for _type, _mapper in {
    "llama": map_llama, "mistral": map_mistral, "qwen2": map_qwen2, "qwen3": map_qwen3, "olmo2": map_olmo2,
    "gemma": map_gemma, "gemma2": map_gemma2, "gemma3": map_gemma3, "gemma3_text": map_gemma3,
    "gpt_oss": map_gpt_oss, "llama4": map_llama4, "llama4_text": map_llama4, "phi": map_phi, "gpt_neox": map_gpt_neox, "falcon": map_falcon,
    "RefinedWebModel": map_falcon, "RefinedWeb": map_falcon, "gpt2": map_gpt2, "bert": map_bert,
}.items():
    register(_type, _mapper)

# Configurations that wrap the language model's configuration (multimodal checkpoints).
WRAPPERS = {"gemma3": "text_config", "llama4": "text_config", "kimi_k25": "text_config"}


# ------------------------------------------------------------------------------------------------
# Reading a file
# ------------------------------------------------------------------------------------------------


def map_mla(cfg: Config) -> list[LayerGroup]:
    """DeepSeek-V2/V3, Kimi K2: multi-head latent attention in every layer, read and counted by ``attnid.mla``.

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


def read_config(path: Path | str) -> tuple[dict[str, Any], str]:
    """(the JSON object, the file's path as text) from a config.json or a folder holding one."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    where = str(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ValueError(f"{where}: cannot read ({exc.strerror or exc})") from None
    if not path.is_file():
        raise ValueError(f"{where}: is not a file")
    if size > MAX_CONFIG_BYTES:
        raise ValueError(f"{where}: {size} bytes, larger than a configuration ({MAX_CONFIG_BYTES} bytes at most)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{where}: cannot read ({exc})") from None
    try:
        data = json.loads(text, parse_constant=lambda c: float(c))
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{where}: the top level must be a JSON object, got {type(data).__name__}")
    return data, where


def model_count(path: Path | str) -> ModelCount:
    """Per-layer-type and whole-model attention counts from a config.json (or a folder holding one)."""
    data, where = read_config(path)
    return count_config(data, where)


def count_config(data: dict[str, Any], where: str = "config") -> ModelCount:
    """``model_count`` for a configuration already read into a dict."""
    model_type = data.get("model_type")
    if not isinstance(model_type, str) or model_type not in MAPPERS:
        shown = "no model_type" if model_type is None else f"model_type {_shown(model_type)}"
        raise ValueError(f"{where}: {shown} is not supported; supported: {', '.join(supported_types())}")
    inner = WRAPPERS.get(model_type)
    if inner and isinstance(data.get(inner), dict):
        wrapped = data[inner]
        data = {**wrapped, "model_type": wrapped.get("model_type", model_type)}
        where = f"{where} ({inner})"
    cfg = Config(data, where)
    cfg.read.add("model_type")
    groups = MAPPERS[model_type](cfg)
    if cfg.flag("is_encoder_decoder", False):
        cfg.ignore("is_encoder_decoder", "an encoder-decoder model: the cross-attention of its decoder is not counted")
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
            ignored.append(Ignored(name, data[name], f"not read by the {model_type} mapper"))
    not_attention = [k for k in unread if k not in {i.field for i in ignored}]
    return ModelCount(where, model_type, groups, ignored, not_attention)
