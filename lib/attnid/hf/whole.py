"""``attnid count --config C --whole-model``: a configuration's whole-model layout and count.

``whole_layout(data)`` reads a config.json dict into an ``attnid.whole.model.WholeLayout``. The fields
and their defaults come from transformers' own configuration class for the model type (the defaults
are transformers', not guessed here); the attention layers come from the config reader of
``attnid.hf.config`` (their layouts and their own counts). ``whole_model(data)`` gives the record
``--json`` prints: ``whole_model`` (the model ``architectures[0]`` builds, its head included) and
``base`` (the backbone inside it, whose output is its last hidden state), each with ``parameters``,
``unidentified`` and a breakdown by component, or withheld with one line.

Families the theory covers (``STRUCTURES``): pre-norm RMSNorm decoders with a gated MLP (Llama,
Mistral, Qwen2, Qwen3, Gemma, Phi-3), pre-norm LayerNorm decoders with a smooth MLP (GPT-2, GPTBigCode,
GPT-NeoX, OPT, StarCoder2) and the post-norm LayerNorm encoder BERT. Every other model type, and every feature of these outside the theory, is
withheld with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from attnid import families
from attnid.hf.config import count_config
from attnid.hf.read import LayerGroup
from attnid.spec import AttentionSpec
from attnid.whole.model import AttentionGroup, Head, Mlp, Table, WholeCount, WholeLayout, count

RMS_DECODERS = ("llama", "mistral", "qwen2", "qwen3", "gemma", "phi3")
LN_DECODERS = ("gpt2", "gpt_bigcode", "gpt_neox", "opt", "starcoder2")
STRUCTURES = (*RMS_DECODERS, *LN_DECODERS, "bert")
LM_SUFFIXES = ("ForCausalLM", "LMHeadModel")
OUTSIDE = "outside the whole-model theory"


class Withheld(ValueError):
    """A configuration (or one of its features) the whole-model theory does not cover; the message says why."""


@dataclass(frozen=True)
class WholeResult:
    """The record of one model: the count, or None and the one-line reason it is withheld."""

    architecture: str | None
    counted: WholeCount | None
    note: str = ""

    def record(self) -> dict[str, Any]:
        c = self.counted
        return {"architecture": self.architecture, "parameters": c.parameters if c else None,
                "unidentified": c.unidentified if c else None, "ratio": c.ratio if c else None,
                "breakdown": dict(c.breakdown) if c else {}, "note": self.note or (c.note if c else "")}


def transformers_config(data: dict[str, Any]) -> Any:
    """transformers' configuration object for ``data`` (its class gives every default)."""
    from transformers import CONFIG_MAPPING
    from transformers.utils import logging

    model_type = data.get("model_type")
    if model_type not in STRUCTURES:
        raise Withheld(f"model_type {model_type!r} is {OUTSIDE}, which covers {', '.join(STRUCTURES)}")
    fields = {k: v for k, v in data.items() if k != "model_type"}
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # a tiny test vocabulary draws warnings about special-token ids no count reads
    try:
        return CONFIG_MAPPING[model_type](**fields)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise ValueError(f"transformers' {model_type} configuration class refuses the fields: {exc}") from None
    finally:
        logging.set_verbosity(verbosity)


def _attention(group: LayerGroup, layer_norm: bool) -> AttentionGroup:
    """A group of attention layers: its own count, with the q/k/v biases a LayerNorm's shift lends it."""
    spec = group.spec
    if group.unidentified is None or not isinstance(spec, AttentionSpec):
        raise Withheld(f"the {group.kind} layers are {OUTSIDE}: {group.note or 'their attention is not counted'}")
    effective = spec
    if layer_norm:
        effective = replace(spec, bias="qkv" + ("o" if spec.has_bias("o") else ""))
    unidentified = families.count(effective).unidentified
    if unidentified is None:
        raise Withheld(f"the {group.kind} layers with the biases a LayerNorm lends them are {OUTSIDE}")
    rows = (spec.heads + spec.kv_heads) * spec.head_dim, spec.kv_heads * spec.v_head_dim
    bias_rows = (spec.heads * spec.head_dim * spec.has_bias("q") + spec.kv_heads * spec.head_dim * spec.has_bias("k")
                 + spec.kv_heads * spec.v_head_dim * spec.has_bias("v"))
    return AttentionGroup(group.layers, group.total, unidentified, sum(rows), bias_rows,
                          spec.heads * spec.v_head_dim, spec.has_bias("o"))


# Activations with no continuous symmetry of their own: neither positively homogeneous (ReLU, its leaky and
# squared forms) nor linear. A plain MLP with one of them has no per-neuron scale; a gated one only up/down.
SMOOTH = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_accurate", "quick_gelu", "silu", "swish", "tanh",
          "sigmoid", "mish")


def _mlp_kind(activation: Any, gated: bool) -> str:
    if activation == "relu" and not gated:
        return "relu"
    _require(activation in SMOOTH, f"the activation {activation!r} ({'gated' if gated else 'plain'} MLP)")
    return "gated" if gated else "plain"


def _require(condition: bool, why: str) -> None:
    if not condition:
        raise Withheld(f"{why}: {OUTSIDE}")


def _layout(data: dict[str, Any], where: str) -> WholeLayout:
    """The whole-model layout of a configuration (``Withheld`` when the theory does not cover it)."""
    cfg = transformers_config(data)
    model_type = data["model_type"]
    counted = count_config(data, where)
    not_attention = [g for g in counted.groups if not g.attention]
    if not_attention:
        raise Withheld(f"layers of type {not_attention[0].kind} are not attention: {OUTSIDE}")
    d, layers, vocab = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    _require(vocab > d, f"a token table of {vocab} rows at width {d} (the first layer's readers are free off the "
             "span of the token rows; the theory needs more tokens than the width)")
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    if model_type in RMS_DECODERS:
        groups = tuple(_attention(g, False) for g in counted.groups)
        activation = getattr(cfg, "hidden_activation", None) or cfg.hidden_act
        mlp = Mlp(_mlp_kind(activation, True), cfg.intermediate_size, bool(getattr(cfg, "mlp_bias", False)),
                  bool(getattr(cfg, "mlp_bias", False)))
        return WholeLayout(d, layers, (Table("tokens", vocab, vocab),), "rms", "pre", float(cfg.rms_norm_eps),
                           groups, mlp, norm_bias=False, head=Head("lm", tied, False))
    groups = tuple(_attention(g, True) for g in counted.groups)
    for g in groups:
        _require(g.writer_bias and g.reader_bias_rows == g.reader_rows,
                 "a LayerNorm model without biases on every attention projection")
    if model_type in ("gpt2", "gpt_bigcode"):  # GPTBigCode: GPT-2 with multi-query attention
        _require(not getattr(cfg, "add_cross_attention", False), "GPT-2 with cross-attention")
        width = cfg.n_inner or 4 * d
        return WholeLayout(d, layers, (Table("tokens", vocab, vocab), Table("positions", cfg.n_positions,
                           cfg.n_positions)), "layernorm", "pre", float(cfg.layer_norm_epsilon), groups,
                           Mlp(_mlp_kind(cfg.activation_function, False), width, True, True), head=Head("lm", tied))
    if model_type == "gpt_neox":
        return WholeLayout(d, layers, (Table("tokens", vocab, vocab),), "layernorm", "pre", float(cfg.layer_norm_eps),
                           groups, Mlp(_mlp_kind(cfg.hidden_act, False), cfg.intermediate_size, True, True),
                           head=Head("lm", tied), parallel=bool(cfg.use_parallel_residual))
    if model_type == "starcoder2":
        return WholeLayout(d, layers, (Table("tokens", vocab, vocab),), "layernorm", "pre", float(cfg.norm_epsilon),
                           groups, Mlp(_mlp_kind(cfg.hidden_act, False), cfg.intermediate_size, True, True),
                           head=Head("lm", tied))
    if model_type == "opt":
        _require(cfg.do_layer_norm_before, "OPT with its LayerNorms after the blocks (do_layer_norm_before false)")
        _require(not getattr(cfg, "_remove_final_layer_norm", False), "OPT without its final LayerNorm")
        _require(cfg.word_embed_proj_dim == d, "OPT with projections in and out of the stream (word_embed_proj_dim)")
        _require(cfg.enable_bias and cfg.layer_norm_elementwise_affine, "OPT without biases or LayerNorm affine maps")
        positions = cfg.max_position_embeddings
        tables = (Table("tokens", vocab, vocab), Table("positions", positions + 2, positions))  # rows 0, 1 unused
        return WholeLayout(d, layers, tables, "layernorm", "pre", 1e-5, groups,
                           Mlp(_mlp_kind(cfg.activation_function, False), cfg.ffn_dim, True, True), head=Head("lm", tied))
    # bert
    _require(getattr(cfg, "position_embedding_type", "absolute") == "absolute", "BERT with relative positions")
    _require(not getattr(cfg, "is_decoder", False), "BERT as a decoder")
    tables = (Table("tokens", vocab, vocab), Table("positions", cfg.max_position_embeddings, cfg.max_position_embeddings),
              Table("token types", cfg.type_vocab_size, cfg.type_vocab_size))
    # transformers' BertLMPredictionHead keeps a bias of its own that the untied decoder never reads
    head = Head("mlm", tied, True, unused=0 if tied else vocab)
    return WholeLayout(d, layers, tables, "layernorm", "post", float(cfg.layer_norm_eps), groups,
                       Mlp(_mlp_kind(cfg.hidden_act, False), cfg.intermediate_size, True, True), embedding_norm=True,
                       final_norm=False, head=head)


def head_kind(model_type: str, architecture: str | None) -> str | None:
    """'lm', 'mlm' or 'none' for the class ``architectures[0]`` names; None for a head the theory does not cover."""
    if architecture is None:
        return None
    if model_type == "bert":
        return {"BertForMaskedLM": "mlm", "BertModel": "none"}.get(architecture)
    if architecture.endswith(LM_SUFFIXES):
        return "lm"
    return "none" if architecture.endswith("Model") else None


def whole_model(data: dict[str, Any], where: str = "config") -> dict[str, dict[str, Any]]:
    """``{"whole_model": ..., "base": ...}``: the records ``--whole-model --json`` adds (see the module docstring)."""
    architectures = data.get("architectures")
    architecture = architectures[0] if isinstance(architectures, list) and architectures and isinstance(
        architectures[0], str) else None
    try:
        layout = _layout(data, where)
    except Withheld as exc:
        note = str(exc)
        return {"whole_model": WholeResult(architecture, None, note).record(), "base": WholeResult(None, None, note).record()}
    base = WholeResult("base model", count(layout, with_head=False))
    kind = head_kind(data["model_type"], architecture)
    if kind is None:
        why = ("no architectures field names the model" if architecture is None
               else f"architectures[0] {architecture}: only the base model and the language-model head are covered")
        whole = WholeResult(architecture, None, why)
    elif kind == "none":
        whole = WholeResult(architecture, base.counted) if data["model_type"] != "bert" else WholeResult(
            architecture, None, "BertModel adds a pooler, a second output the theory does not cover")
    else:
        try:
            whole = WholeResult(architecture, count(layout, with_head=True))
        except ValueError as exc:
            whole = WholeResult(architecture, None, f"{exc}: {OUTSIDE}")
    return {"whole_model": whole.record(), "base": base.record()}
