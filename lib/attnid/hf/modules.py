"""Cross-checks against attention modules we did not write: the `transformers` implementations.

For a family (GPT-2, Llama, Qwen2, GPT-NeoX, gpt-oss, and with QK-norm Qwen3, Gemma 3 and
OLMo-2) ``build`` makes a small configuration,
instantiates that family's real attention module with random float64 weights, and returns it
with two converters between its weights and ``attnid``'s named parameters. With them a
chapter or a test can check, on code written by others, that

* the module computes what ``attnid.layer.forward`` computes (the layouts mean the same thing);
* the symmetries ``attnid.symmetry`` predicts leave the module's output unchanged;
* the numeric nullity of the module's own Jacobian equals ``attnid.counts.count``.

Every module gets an explicit additive causal mask, so the masking is the same in both
implementations, and runs its softmax in float64 (see ``SOFTMAX_IN_FLOAT64``). Nothing is
downloaded: only configuration classes and module code from the installed package are used.

The QK-norm families (``QK_NORM_FAMILIES``) are checked to float64 precision. Their RMSNorm
modules cast to float32 (``hidden_states.to(torch.float32)``, ``x.float()``), which would make
every comparison a float32 one and hide the weakly identified directions (relative singular
values near 1e-8) in float32 noise. So their modules run inside ``float64_kept()``, which makes
``Tensor.to(torch.float32)`` and ``Tensor.float()`` leave float64 tensors alone for the duration
(their code, with the downcast skipped), and they get RoPE tables computed in float64 by
``attnid.rope.rope_tables`` (the same rotate-half formula as their rotary modules, whose float32
tables agree to about 1e-7). A sliding window's mask comes from transformers' own
``sliding_window_causal_mask_function``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnid import normalise
from attnid.same_weights import SameWeights
from attnid.normalise import additive_mask
from attnid.spec import AttentionSpec, Params

FAMILIES = ("gpt2", "llama", "qwen2", "gpt_neox", "gpt_oss", "qwen3", "gemma3", "olmo2")
# Families whose attention normalises queries and keys, and the variant (attnid's qk_norm) each uses.
QK_NORM_FAMILIES = {"qwen3": "shared", "gemma3": "shared", "olmo2": "full"}
# The eps of each QK-norm family's configuration class (rms_norm_eps defaults in transformers).
QK_NORM_EPS = {"qwen3": 1e-6, "gemma3": 1e-6, "olmo2": 1e-5}
# Families whose configuration has sliding-window layers (the window is then checked too).
WINDOW_FAMILIES = ("qwen3", "gemma3", "gpt_oss")
# The eager attention of Llama, Qwen2 and GPT-NeoX computes its softmax in float32 even in a float64
# model, which breaks the exact shift invariance that makes the key bias dead (to ~1e-8). Their SDPA
# path stays in the model's dtype, so those families run through it. GPT-2's eager path and gpt-oss's
# (the only one with sinks) keep float64.
SOFTMAX_IN_FLOAT64 = "sdpa"
ATTENTION_PATHS = ("sdpa", "eager")


@dataclass
class HFLayer:
    """A transformers attention module and the maps between its weights and attnid's."""

    family: str
    module: torch.nn.Module
    spec: AttentionSpec
    to_attnid: Callable[[Params], dict[str, torch.Tensor]]
    from_attnid: Callable[[Params], dict[str, torch.Tensor]]
    forward_kwargs: Callable[[torch.Tensor], dict]

    def weights(self) -> dict[str, torch.Tensor]:
        """The module's parameters by their transformers names (detached copies)."""
        return {name: p.detach().clone() for name, p in self.module.named_parameters()}

    def output(self, weights: Params, x: torch.Tensor) -> torch.Tensor:
        """The module's output for X of shape (batch, n, d) with the given weights (functional, differentiable).

        SDPA is pinned to its math backend (plain matmuls and softmax in the input's dtype), which
        torch.func can batch; the fused CPU kernel has no batching rule for its backward. The
        QK-norm families run inside ``float64_kept()`` (module docstring).
        """
        with sdpa_kernel(SDPBackend.MATH), (float64_kept() if self.family in QK_NORM_FAMILIES else _nothing()):
            return functional_call(self.module, dict(weights), (x,), self.forward_kwargs(x), strict=True)[0]


@contextmanager
def _nothing() -> Iterator[None]:
    yield


@contextmanager
def float64_kept() -> Iterator[None]:
    """While active, ``Tensor.to(torch.float32)`` and ``Tensor.float()`` leave a float64 tensor in float64.

    transformers' RMSNorm modules compute in float32 whatever the model's dtype; inside this context
    their own code runs with that one cast skipped, so a float64 module stays float64 end to end.
    Tensors of any other dtype are converted as usual. Not thread-safe: it patches ``torch.Tensor``.
    """
    original_to, original_float = torch.Tensor.to, torch.Tensor.float

    def to(self: torch.Tensor, *args, **kwargs):  # noqa: ANN202 - torch's signature
        if self.dtype == torch.float64:
            args = tuple(torch.float64 if a is torch.float32 else a for a in args)
            if kwargs.get("dtype") is torch.float32:
                kwargs["dtype"] = torch.float64
        return original_to(self, *args, **kwargs)

    def to_float(self: torch.Tensor, *args, **kwargs):  # noqa: ANN202
        return self if self.dtype == torch.float64 else original_float(self, *args, **kwargs)

    torch.Tensor.to, torch.Tensor.float = to, to_float
    try:
        yield
    finally:
        torch.Tensor.to, torch.Tensor.float = original_to, original_float


def additive_causal_mask(n: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask (1, 1, n, n): 0 on and below the diagonal, -inf above (attnid.normalise's causal mask)."""
    return additive_mask(normalise.causal_mask(n, "cpu"), dtype)[None, None]


def additive_window_mask(n: int, window: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask (1, 1, n, n) of transformers' own sliding_window_causal_mask_function(window): 0 where allowed."""
    from transformers.masking_utils import sliding_window_causal_mask_function

    i = torch.arange(n)
    allowed = sliding_window_causal_mask_function(window)(torch.tensor(0), torch.tensor(0), i[:, None], i[None, :])
    return additive_mask(~allowed, dtype)[None, None]


def float64_rope(x: torch.Tensor, spec: AttentionSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) of shape (batch, n, d_k) for positions 0..n-1 in float64 (rotate-half layout, all of d_k rotated)."""
    from attnid.rope import rope_tables

    cos, sin = rope_tables(x.shape[-2], spec.head_dim, spec.rope_base, torch.float64, x.device)
    return cos[None].expand(x.shape[0], -1, -1), sin[None].expand(x.shape[0], -1, -1)


def _split_heads(w: torch.Tensor, heads: int) -> torch.Tensor:
    """(d, heads * k) -> (heads, d, k)."""
    d = w.shape[0]
    return w.reshape(d, heads, -1).permute(1, 0, 2)


def _merge_heads(w: torch.Tensor) -> torch.Tensor:
    """(heads, d, k) -> (d, heads * k)."""
    return w.permute(1, 0, 2).reshape(w.shape[1], -1)


def _linear_family(family: str, spec: AttentionSpec, generator: torch.Generator, attention_path: str) -> HFLayer:
    """Llama, Qwen2 and gpt-oss: q_proj, k_proj, v_proj, o_proj (nn.Linear: y = x W^T + b)."""
    from transformers import GptOssConfig, LlamaConfig, Qwen2Config
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention, GptOssRotaryEmbedding
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding
    from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention, Qwen2RotaryEmbedding

    common = dict(hidden_size=spec.d_model, num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads,
                  head_dim=spec.head_dim, num_hidden_layers=1,
                  attn_implementation="eager" if family == "gpt_oss" else attention_path)
    rope = {"rope_type": "default", "rope_theta": spec.rope_base}
    if family == "llama":
        config = LlamaConfig(**common, attention_bias=spec.bias == "qkvo", rope_parameters=rope)
        module, rotary = LlamaAttention(config, 0), LlamaRotaryEmbedding(config)
    elif family == "qwen2":
        config = Qwen2Config(**common, rope_parameters=rope, layer_types=["full_attention"], use_sliding_window=False)
        module, rotary = Qwen2Attention(config, 0), Qwen2RotaryEmbedding(config)
    else:
        config = GptOssConfig(**common, rope_parameters=rope, layer_types=["full_attention"], num_local_experts=1,
                              num_experts_per_tok=1)
        module, rotary = GptOssAttention(config, 0), GptOssRotaryEmbedding(config)
    module = _randomise(module, generator, spec.d_model**-0.5)
    rotary = rotary.to(torch.float64)
    linear_to, linear_from = _linear_maps(spec)

    def to_attnid(w: Params) -> dict[str, torch.Tensor]:
        out = linear_to(w)
        if spec.sink_learned:
            out["sink"] = w["sinks"]
        return out

    def from_attnid(p: Params) -> dict[str, torch.Tensor]:
        out = linear_from(p)
        if spec.sink_learned:
            out["sinks"] = p["sink"]
        return out

    def forward_kwargs(x: torch.Tensor) -> dict:
        positions = torch.arange(x.shape[-2])[None].expand(x.shape[0], -1)
        n = x.shape[-2]
        mask = (additive_causal_mask(n, x.dtype) if spec.window is None
                else additive_window_mask(n, spec.window, x.dtype))
        return {"position_embeddings": rotary(x, positions), "attention_mask": mask}

    return HFLayer(family, module, spec, to_attnid, from_attnid, forward_kwargs)


def _qk_norm_family(family: str, spec: AttentionSpec, generator: torch.Generator, attention_path: str) -> HFLayer:
    """Qwen3, Gemma 3, OLMo-2: q/k/v/o projections (nn.Linear) and q_norm, k_norm RMSNorm modules.

    Qwen3 and Gemma 3 normalise each head's d_k entries with one weight vector for all heads
    (Gemma 3 stores the weight as w with multiplier 1 + w); OLMo-2 normalises the whole projection
    width with one weight per entry. The norm weights are drawn around one, as ``init_params`` does.
    """
    from transformers import Gemma3TextConfig, Olmo2Config, Qwen3Config
    from transformers.models.gemma3.modeling_gemma3 import Gemma3Attention
    from transformers.models.olmo2.modeling_olmo2 import Olmo2Attention
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention

    kind = "sliding_attention" if spec.window is not None else "full_attention"
    common = dict(hidden_size=spec.d_model, num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads,
                  head_dim=spec.head_dim, num_hidden_layers=1, rms_norm_eps=spec.qk_norm_eps,
                  attention_bias=spec.bias == "qkvo", attn_implementation=attention_path)
    rope = {"rope_type": "default", "rope_theta": spec.rope_base}
    if family == "qwen3":
        config = Qwen3Config(**common, rope_parameters=rope, layer_types=[kind], use_sliding_window=spec.window is not None,
                             sliding_window=spec.window, max_window_layers=0)
        module = Qwen3Attention(config, 0)
    elif family == "gemma3":
        config = Gemma3TextConfig(**common, query_pre_attn_scalar=spec.head_dim, layer_types=[kind],
                                  sliding_window=spec.window or 4096, rope_parameters={kind: rope})
        module = Gemma3Attention(config, 0)
    else:
        config = Olmo2Config(**common, rope_parameters=rope)
        module = Olmo2Attention(config, 0)
    module = _randomise(module, generator, spec.d_model**-0.5)
    offset = 1.0 if family == "gemma3" else 0.0  # Gemma 3 multiplies by 1 + weight
    with torch.no_grad():
        for norm in (module.q_norm, module.k_norm):
            # gamma in [0.6, 1.9]: then gamma - 1 is exact and 1 + (gamma - 1) gives gamma back (Sterbenz)
            gamma = (1 + 0.3 * torch.randn(norm.weight.shape, generator=generator, dtype=torch.float64)).clamp(0.6, 1.9)
            norm.weight.copy_(gamma - offset)
    base = _linear_maps(spec)

    def to_attnid(w: Params) -> dict[str, torch.Tensor]:
        out = base[0](w)
        q, k = w["q_norm.weight"] + offset, w["k_norm.weight"] + offset
        if spec.qk_norm == "full":
            q, k = q.reshape(spec.heads, spec.head_dim), k.reshape(spec.kv_heads, spec.head_dim)
        out["q_norm"], out["k_norm"] = q, k
        return out

    def from_attnid(p: Params) -> dict[str, torch.Tensor]:
        out = base[1](p)
        out["q_norm.weight"] = p["q_norm"].reshape(-1) - offset
        out["k_norm.weight"] = p["k_norm"].reshape(-1) - offset
        return out

    def forward_kwargs(x: torch.Tensor) -> dict:
        n = x.shape[-2]
        mask = (additive_causal_mask(n, x.dtype) if spec.window is None
                else additive_window_mask(n, spec.window, x.dtype))
        return {"position_embeddings": float64_rope(x, spec), "attention_mask": mask}

    return HFLayer(family, module, spec, to_attnid, from_attnid, forward_kwargs)


def _linear_maps(spec: AttentionSpec) -> tuple[Callable[[Params], dict[str, torch.Tensor]], Callable[[Params], dict[str, torch.Tensor]]]:
    """Weight maps of q_proj, k_proj, v_proj, o_proj (nn.Linear, y = x W^T + b) to attnid's names and back."""

    def to_attnid(w: Params) -> dict[str, torch.Tensor]:
        out = {"W_Q": _split_heads(w["q_proj.weight"].T, spec.heads), "W_K": _split_heads(w["k_proj.weight"].T, spec.kv_heads),
               "W_V": _split_heads(w["v_proj.weight"].T, spec.kv_heads),
               "W_O": w["o_proj.weight"].T.reshape(spec.heads, spec.v_head_dim, spec.d_model)}
        for letter, name, heads in (("q", "q_proj", spec.heads), ("k", "k_proj", spec.kv_heads), ("v", "v_proj", spec.kv_heads)):
            if spec.has_bias(letter):
                out[f"b_{letter.upper()}"] = w[f"{name}.bias"].reshape(heads, -1)
        if spec.has_bias("o"):
            out["b_O"] = w["o_proj.bias"]
        return out

    def from_attnid(p: Params) -> dict[str, torch.Tensor]:
        out = {"q_proj.weight": _merge_heads(p["W_Q"]).T, "k_proj.weight": _merge_heads(p["W_K"]).T,
               "v_proj.weight": _merge_heads(p["W_V"]).T, "o_proj.weight": p["W_O"].reshape(-1, spec.d_model).T}
        for letter, name in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj")):
            if spec.has_bias(letter):
                out[f"{name}.bias"] = p[f"b_{letter.upper()}"].reshape(-1)
        if spec.has_bias("o"):
            out["o_proj.bias"] = p["b_O"]
        return out

    return to_attnid, from_attnid


def _randomise(module: torch.nn.Module, generator: torch.Generator, scale: float) -> torch.nn.Module:
    module = module.to(torch.float64).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64) * scale)
    return module


def _gpt2(spec: AttentionSpec, generator: torch.Generator) -> HFLayer:
    """GPT-2: c_attn and c_proj are Conv1D (y = x W + b), queries|keys|values side by side."""
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    config = GPT2Config(n_embd=spec.d_model, n_head=spec.heads, n_layer=1, attn_implementation="eager")
    module = _randomise(GPT2Attention(config, layer_idx=0), generator, spec.d_model**-0.5)
    d, h = spec.d_model, spec.heads

    def to_attnid(w: Params) -> dict[str, torch.Tensor]:
        qkv, b = w["c_attn.weight"], w["c_attn.bias"]
        return {"W_Q": _split_heads(qkv[:, :d], h), "W_K": _split_heads(qkv[:, d:2 * d], h),
                "W_V": _split_heads(qkv[:, 2 * d:], h), "W_O": w["c_proj.weight"].reshape(h, -1, d),
                "b_Q": b[:d].reshape(h, -1), "b_K": b[d:2 * d].reshape(h, -1), "b_V": b[2 * d:].reshape(h, -1),
                "b_O": w["c_proj.bias"]}

    def from_attnid(p: Params) -> dict[str, torch.Tensor]:
        return {"c_attn.weight": torch.cat([_merge_heads(p[k]) for k in ("W_Q", "W_K", "W_V")], dim=1),
                "c_attn.bias": torch.cat([p[k].reshape(-1) for k in ("b_Q", "b_K", "b_V")]),
                "c_proj.weight": p["W_O"].reshape(-1, d), "c_proj.bias": p["b_O"]}

    def forward_kwargs(x: torch.Tensor) -> dict:
        return {"attention_mask": additive_causal_mask(x.shape[-2], x.dtype)}

    return HFLayer("gpt2", module, spec, to_attnid, from_attnid, forward_kwargs)


def _gpt_neox(spec: AttentionSpec, generator: torch.Generator, attention_path: str) -> HFLayer:
    """GPT-NeoX (Pythia): one query_key_value Linear whose rows run head by head, [q k v] within a head."""
    from transformers import GPTNeoXConfig
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXAttention, GPTNeoXRotaryEmbedding

    rope = {"rope_type": "default", "rope_theta": spec.rope_base, "partial_rotary_factor": spec.rope_dims / spec.head_dim}
    config = GPTNeoXConfig(hidden_size=spec.d_model, num_attention_heads=spec.heads, num_hidden_layers=1,
                           attention_bias=True, rope_parameters=rope, attn_implementation=attention_path)
    module = _randomise(GPTNeoXAttention(config, layer_idx=0), generator, spec.d_model**-0.5)
    rotary = GPTNeoXRotaryEmbedding(config).to(torch.float64)
    d, h, k = spec.d_model, spec.heads, spec.head_dim

    def to_attnid(w: Params) -> dict[str, torch.Tensor]:
        qkv = w["query_key_value.weight"].T.reshape(d, h, 3, k).permute(2, 1, 0, 3)  # (3, h, d, k)
        b = w["query_key_value.bias"].reshape(h, 3, k)
        return {"W_Q": qkv[0], "W_K": qkv[1], "W_V": qkv[2], "W_O": w["dense.weight"].T.reshape(h, k, d),
                "b_Q": b[:, 0], "b_K": b[:, 1], "b_V": b[:, 2], "b_O": w["dense.bias"]}

    def from_attnid(p: Params) -> dict[str, torch.Tensor]:
        qkv = torch.stack([p["W_Q"], p["W_K"], p["W_V"]]).permute(2, 1, 0, 3).reshape(d, 3 * d)
        bias = torch.stack([p["b_Q"], p["b_K"], p["b_V"]], dim=1).reshape(-1)
        return {"query_key_value.weight": qkv.T, "query_key_value.bias": bias,
                "dense.weight": p["W_O"].reshape(d, d).T, "dense.bias": p["b_O"]}

    def forward_kwargs(x: torch.Tensor) -> dict:
        positions = torch.arange(x.shape[-2])[None].expand(x.shape[0], -1)
        return {"attention_mask": additive_causal_mask(x.shape[-2], x.dtype), "position_embeddings": rotary(x, positions)}

    return HFLayer("gpt_neox", module, spec, to_attnid, from_attnid, forward_kwargs)


# What the transformers modules can express: GPT-2 and GPT-NeoX have one key/value head per query head;
# GPT-2 has no RoPE (its learned positions are added outside the layer); Llama, Qwen2 and gpt-oss rotate
# the whole head (their apply_rotary_pos_emb has no pass-through part); GPT-NeoX rotates any even share.
NO_GQA = ("gpt2", "gpt_neox")
FIXED_ROPE_FRACTION = {"gpt2": 0.0, "llama": 1.0, "qwen2": 1.0, "gpt_oss": 1.0, "qwen3": 1.0, "gemma3": 1.0, "olmo2": 1.0}


def family_spec(family: str, heads: int = 2, kv_heads: int | None = None, head_dim: int = 4,
                rope_fraction: float | None = None, qk_norm_eps: float | None = None, window: int | None = None,
                bias: str | None = None) -> AttentionSpec:
    """The attnid layout of a family's attention at a small size (biases and normalisation as in the family).

    ``kv_heads`` defaults to ``heads``; ``rope_fraction`` defaults to the family's own (0 for GPT-2,
    1 for Llama, Qwen2, gpt-oss and GPT-NeoX). A value the family's transformers module cannot have
    (grouped key/values for GPT-2 or GPT-NeoX; a RoPE share other than the fixed one for the rest)
    is refused with a ValueError naming the argument and the family, never silently ignored. For the
    QK-norm families ``qk_norm_eps`` defaults to the configuration class's rms_norm_eps and ``bias``
    may be 'none' (their default) or 'qkvo' (attention_bias=True); ``window`` gives a sliding-window
    layer where the family has them (Qwen3, Gemma 3, gpt-oss).
    """
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
    if qk_norm_eps is not None and family not in QK_NORM_FAMILIES:
        raise ValueError(f"qk_norm_eps is not available for family {family}: its attention has no QK-norm")
    if window is not None and family not in WINDOW_FAMILIES:
        raise ValueError(f"window={window} is not available for family {family}: its configuration has no "
                         f"sliding-window layers (families with them: {', '.join(WINDOW_FAMILIES)})")
    if bias is not None and (family not in QK_NORM_FAMILIES or bias not in ("none", "qkvo")):
        raise ValueError(f"bias={bias!r} is not available for family {family}: only the QK-norm families take "
                         "'none' or 'qkvo' (attention_bias)")
    kv = heads if kv_heads is None else kv_heads
    if family in NO_GQA and kv != heads:
        raise ValueError(f"kv_heads={kv} is not available for family {family}: its transformers module has one "
                         f"key/value head per query head (kv_heads must equal heads={heads})")
    fixed = FIXED_ROPE_FRACTION.get(family)
    if rope_fraction is None:
        rope_fraction = 1.0 if fixed is None else fixed
    elif fixed is not None and rope_fraction != fixed:
        what = "has no RoPE" if fixed == 0.0 else "rotates the whole head"
        raise ValueError(f"rope_fraction={rope_fraction} is not available for family {family}: its transformers "
                         f"module {what} (rope_fraction must be {fixed})")
    d = heads * head_dim
    if family in QK_NORM_FAMILIES:
        eps = QK_NORM_EPS[family] if qk_norm_eps is None else qk_norm_eps
        return AttentionSpec.create(d, heads, kv_heads=kv, head_dim=head_dim, v_head_dim=head_dim, bias=bias or "none",
                                    rope_fraction=rope_fraction, causal=True, qk_norm=QK_NORM_FAMILIES[family],
                                    qk_norm_eps=eps, window=window)
    if family == "gpt2":
        return AttentionSpec.create(d, heads, bias="qkvo", causal=True)
    if family == "gpt_neox":
        return AttentionSpec.create(d, heads, bias="qkvo", rope_fraction=rope_fraction, causal=True)
    bias = {"llama": "none", "qwen2": "qkv", "gpt_oss": "qkvo"}[family]
    norm = "sink" if family == "gpt_oss" else "softmax"
    return AttentionSpec.create(d, heads, kv_heads=kv, head_dim=head_dim, v_head_dim=head_dim, bias=bias,
                                rope_fraction=rope_fraction, causal=True, norm=norm, sink_learned=family == "gpt_oss",
                                window=window)


def build(family: str, spec: AttentionSpec, seed: int = 0, attention_path: str = SOFTMAX_IN_FLOAT64) -> HFLayer:
    """The family's transformers attention module for ``spec`` (see ``family_spec``), random float64 weights.

    ``attention_path`` is the transformers attention implementation of Llama, Qwen2 and GPT-NeoX:
    'sdpa' (softmax in float64, the default) or 'eager' (softmax in float32, shown in chapter 8 to
    break the dead key bias). GPT-2 and gpt-oss always run their eager path, which stays in float64.
    """
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
    if attention_path not in ATTENTION_PATHS:
        raise ValueError(f"attention_path must be one of {', '.join(ATTENTION_PATHS)}, got {attention_path!r}")
    generator = torch.Generator().manual_seed(seed)
    if family in QK_NORM_FAMILIES:
        return _qk_norm_family(family, spec, generator, attention_path)
    if family == "gpt2":
        return _gpt2(spec, generator)
    if family == "gpt_neox":
        return _gpt_neox(spec, generator, attention_path)
    return _linear_family(family, spec, generator, attention_path)


@dataclass(frozen=True)
class CrossCheck:
    """What one family's real module says about attnid's predictions (errors relative to the output size)."""

    family: str
    spec: AttentionSpec
    same_function: float   # attnid.forward vs the module, same weights
    symmetry_change: float  # output change under a random predicted symmetry
    off_orbit_change: float  # output change for a 1e-4 step orthogonal to the predicted orbit
    total: int
    exact: int | None
    numeric: int


def cross_check(family: str, spec: AttentionSpec, seed: int = 0, seq_len: int = 8,
                attention_path: str = SOFTMAX_IN_FLOAT64) -> CrossCheck:
    """Build the family's module (``attention_path`` as in ``build``) and test attnid's layer, symmetries and count against it."""
    from attnid import symmetry as sym
    from attnid.counts import count
    from attnid.layer import forward
    from attnid.budget import default_inputs

    def move(params: Params, gen: torch.Generator) -> dict[str, torch.Tensor]:
        moved = sym.apply_group(params, spec, sym.random_group_element(spec, gen, scale=0.5))
        return sym.random_qk_norm_move(moved, spec, gen, scale=0.5) if spec.has_qk_norm else moved

    return module_cross_check(family, build(family, spec, seed, attention_path), spec,
                              lambda p, x: forward(p, x, spec), lambda p: sym.orbit_tangent(p, spec), move,
                              count(spec).unidentified, seed=seed, seq_len=seq_len,
                              n_inputs=default_inputs(spec, seq_len) + 2)


def module_cross_check(family: str, layer: HFLayer, spec: Any, forward: Callable[[Params, torch.Tensor], torch.Tensor],
                       tangent_basis: Callable[[Params], torch.Tensor],
                       move: Callable[[Params, torch.Generator], dict[str, torch.Tensor]], exact: int | None, *,
                       seed: int, seq_len: int, n_inputs: int) -> CrossCheck:
    """The comparison every family's cross-check makes between a transformers module and attnid's layer.

    On three random inputs (errors relative to the output's size): ``same_function``, attnid's
    ``forward`` against the module with the same weights; ``symmetry_change``, the module after a
    finite ``move`` of attnid's parameters; ``off_orbit_change``, after a 1e-4 step orthogonal to
    ``tangent_basis``. ``numeric`` is the nullity of the module's own float64 Jacobian on
    ``n_inputs`` inputs. The draws come from one generator seeded ``seed + 1``, in that order.
    """
    from attnid.jacobian import flatten, functional_rank, unflatten
    from attnid.symmetry import split_direction

    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(3, seq_len, spec.d_model, generator=gen, dtype=torch.float64)
    ref = SameWeights.of(layer, x)
    params = ref.params
    same = ref.error(forward(params, x))
    change = ref.module_error(move(params, gen))
    basis = tangent_basis(params)
    _, across = split_direction(torch.randn(basis.shape[0], generator=gen, dtype=torch.float64), basis)
    off = ref.module_error(unflatten(flatten(params) + 1e-4 * across / across.norm(), params))
    inputs = [torch.randn(1, seq_len, spec.d_model, generator=gen, dtype=torch.float64) for _ in range(n_inputs)]
    decision = functional_rank(layer.output, ref.weights, inputs).require_clear()
    return CrossCheck(family, spec, same, change, off, decision.n_params, exact, decision.nullity)
