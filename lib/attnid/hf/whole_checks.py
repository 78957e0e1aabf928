"""The whole-model chapter's checks: tiny configurations of every covered family, and the closed form against them.

``FAMILY_CONFIGS`` holds three small configurations per family (varied widths, depths, heads, ties, eps 0 and
the configuration class's own eps); ``check(name, data)`` builds the model and returns one ``Row``: the closed
form (``attnid.hf.whole``) and the float64 Jacobian's nullity (``attnid.hf.whole_jacobian``), for the base model
and for the model with its head. ``shares(...)`` gives the closed-form shares of the chapter's figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnid.hf.whole import whole_model
from attnid.hf.whole_jacobian import measure

_LLAMA = dict(model_type="llama", vocab_size=12, hidden_size=6, intermediate_size=10, num_hidden_layers=2,
              num_attention_heads=2, num_key_value_heads=1, head_dim=4, architectures=["LlamaForCausalLM"])
_QWEN3 = dict(model_type="qwen3", vocab_size=12, hidden_size=8, intermediate_size=10, num_hidden_layers=2,
              num_attention_heads=2, num_key_value_heads=1, head_dim=4, tie_word_embeddings=False,
              architectures=["Qwen3ForCausalLM"])
_GEMMA = dict(model_type="gemma", vocab_size=12, hidden_size=8, intermediate_size=10, num_hidden_layers=2,
              num_attention_heads=2, num_key_value_heads=1, head_dim=4, architectures=["GemmaForCausalLM"])
_GPT2 = dict(model_type="gpt2", vocab_size=16, n_positions=8, n_embd=8, n_layer=2, n_head=2, n_inner=12,
             architectures=["GPT2LMHeadModel"])
_NEOX = dict(model_type="gpt_neox", vocab_size=48, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
             num_attention_heads=2, rotary_pct=0.5, architectures=["GPTNeoXForCausalLM"])
_OPT = dict(model_type="opt", vocab_size=12, hidden_size=8, ffn_dim=12, num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=8, word_embed_proj_dim=8, architectures=["OPTForCausalLM"])
_PHI3 = dict(model_type="phi3", vocab_size=12, hidden_size=8, intermediate_size=10, num_hidden_layers=2,
             num_attention_heads=2, num_key_value_heads=1, pad_token_id=0, architectures=["Phi3ForCausalLM"])
_BIGCODE = dict(model_type="gpt_bigcode", vocab_size=16, n_positions=8, n_embd=8, n_layer=2, n_head=2, n_inner=12,
                multi_query=True, architectures=["GPTBigCodeForCausalLM"])
_STARCODER2 = dict(model_type="starcoder2", vocab_size=24, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                   num_attention_heads=2, num_key_value_heads=1, architectures=["Starcoder2ForCausalLM"])
_BERT = dict(model_type="bert", vocab_size=16, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
             intermediate_size=12, max_position_embeddings=8, type_vocab_size=2, architectures=["BertForMaskedLM"])

FAMILY_CONFIGS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "RMSNorm + SwiGLU (Llama)": [
        ("GQA; untied; eps 0", {**_LLAMA, "rms_norm_eps": 0.0, "tie_word_embeddings": False}),
        ("GQA; tied", {**_LLAMA, "tie_word_embeddings": True}),
        ("MHA; 3 layers; untied", {**_LLAMA, "hidden_size": 8, "num_hidden_layers": 3, "num_key_value_heads": 2,
                                   "tie_word_embeddings": False}),
    ],
    "RMSNorm + QK-norm (Qwen3)": [
        ("eps 0", {**_QWEN3, "rms_norm_eps": 0.0}),
        ("own eps", _QWEN3),
        ("1 layer; tied", {**_QWEN3, "num_hidden_layers": 1, "tie_word_embeddings": True}),
    ],
    "RMSNorm + GeGLU (Gemma)": [
        ("tied; eps 0", {**_GEMMA, "rms_norm_eps": 0.0}),
        ("tied", _GEMMA),
        ("untied; 3 layers", {**_GEMMA, "tie_word_embeddings": False, "num_hidden_layers": 3}),
    ],
    "pre-LayerNorm + GELU (GPT-2)": [
        ("eps 0", {**_GPT2, "layer_norm_epsilon": 0.0}),
        ("own eps", _GPT2),
        ("1 layer; 4 heads", {**_GPT2, "n_layer": 1, "n_head": 4, "n_positions": 6}),
    ],
    "pre-LayerNorm + parallel (GPT-NeoX)": [
        ("parallel; untied", _NEOX),
        ("sequential; eps 0", {**_NEOX, "use_parallel_residual": False, "layer_norm_eps": 0.0}),
        ("parallel; V 24 (first MLP short); 1 layer", {**_NEOX, "vocab_size": 24, "num_hidden_layers": 1}),
    ],
    "pre-LayerNorm + ReLU (OPT)": [
        ("tied", _OPT),
        ("untied", {**_OPT, "tie_word_embeddings": False}),
        ("GELU; 3 layers", {**_OPT, "activation_function": "gelu", "num_hidden_layers": 3,
                            "max_position_embeddings": 6}),
    ],
    "RMSNorm + fused SwiGLU (Phi-3)": [
        ("GQA; untied; eps 0", {**_PHI3, "rms_norm_eps": 0.0}),
        ("GQA; tied", {**_PHI3, "tie_word_embeddings": True}),
        ("MHA; 1 layer; partial RoPE", {**_PHI3, "num_key_value_heads": 2, "num_hidden_layers": 1,
                                        "partial_rotary_factor": 0.5}),
    ],
    "pre-LayerNorm + multi-query (GPTBigCode)": [
        ("multi-query; tied", _BIGCODE),
        ("multi-head; eps 0", {**_BIGCODE, "multi_query": False, "layer_norm_epsilon": 0.0}),
        ("multi-query; untied; 1 layer", {**_BIGCODE, "tie_word_embeddings": False, "n_layer": 1}),
    ],
    "pre-LayerNorm + RoPE (StarCoder2)": [
        ("GQA; tied", _STARCODER2),
        ("GQA; untied; eps 0", {**_STARCODER2, "tie_word_embeddings": False, "norm_epsilon": 0.0}),
        ("MHA; 1 layer", {**_STARCODER2, "num_key_value_heads": 2, "num_hidden_layers": 1}),
    ],
    "post-LayerNorm (BERT)": [
        ("eps 0", {**_BERT, "layer_norm_eps": 0.0}),
        ("own eps 1e-12", _BERT),
        ("1 layer; 3 token types; 4 heads", {**_BERT, "num_hidden_layers": 1, "type_vocab_size": 3,
                                             "num_attention_heads": 4}),
    ],
}


@dataclass(frozen=True)
class Row:
    """One configuration: parameters, closed form and numeric nullity, base model and with the head."""

    family: str
    name: str
    base_parameters: int
    base_exact: int
    base_numeric: int
    head_parameters: int
    head_exact: int
    head_numeric: int
    clear: bool
    note: str

    @property
    def matches(self) -> bool:
        return self.clear and (self.base_exact, self.head_exact) == (self.base_numeric, self.head_numeric)


def check(family: str, name: str, data: dict[str, Any], seed: int = 0) -> Row:
    """The closed form and the Jacobian nullity of one configuration (base model and with its head)."""
    record = whole_model(data)
    base, whole = record["base"], record["whole_model"]
    if base["unidentified"] is None or whole["unidentified"] is None:
        raise ValueError(f"{family} / {name}: withheld: {base['note'] or whole['note']}")
    measured_base, measured_head = measure(data, head=False, seed=seed), measure(data, head=True, seed=seed)
    if (measured_base.parameters, measured_head.parameters) != (base["parameters"], whole["parameters"]):
        raise ValueError(f"{family} / {name}: the closed form's parameter count differs from the model's")
    return Row(family, name, base["parameters"], base["unidentified"], measured_base.nullity, whole["parameters"],
               whole["unidentified"], measured_head.nullity,
               measured_base.decision.clear and measured_head.decision.clear, whole["note"])


def llama_like(d: int, layers: int, heads: int, kv_heads: int, vocab: int = 32000, tied: bool = False) -> dict[str, Any]:
    """A Llama configuration of width d (head width d / heads, MLP width 8d/3 rounded up to 64)."""
    width = -(-8 * d // 3 // 64) * 64
    return dict(model_type="llama", hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv_heads, intermediate_size=width, vocab_size=vocab, rms_norm_eps=1e-5,
                tie_word_embeddings=tied, architectures=["LlamaForCausalLM"])


def shares(data: dict[str, Any]) -> tuple[float, float, float]:
    """(attention-only share, base model's share, whole model's share) of unidentified parameters."""
    from attnid.hf.config import count_config

    attention = count_config(data)
    record = whole_model(data)
    return attention.ratio, record["base"]["ratio"], record["whole_model"]["ratio"]
