"""The table the meta-device route reads attention modules by (``attnid.hf.meta``): what each attention class of
transformers does that its modules' shapes cannot show, one line per class (``ATTENTION_CLASSES``), the remote-code
types read as the transformers type they subclass (``REMOTE_AS``), and the names the route finds modules by.
"""

from __future__ import annotations

from dataclasses import dataclass

CROSS_NAMES = ("encoder_attn", "EncDecAttention", "crossattention", "cross_attn")
VISION_WORDS = ("vision", "visual", "image")
MIXER_NAMES = ("mixer", "linear_attn", "mamba", "ssm", "short_conv", "conv", "token_mixer", "time_mix")
OUT_NAMES = ("o_proj", "out_proj", "dense")
BENDS = {  # config fields that change every attention layer in a way no theorem here covers
    "attn_logit_softcapping": "soft-capping tanh(s / c) c of the attention scores",
    "clip_qkv": "clip_qkv clamps the queries, keys and values",
}


@dataclass(frozen=True)
class Semantics:
    """What a class's modules do not show. ``rope``: 'config' (rope_parameters of its layer type), 'none',
    'use_rope' (the module's flag, with rope_parameters), 'rotary_dim' or 'rotary_ndims' (the module's rotated
    width). ``window``: 'module' (its sliding_window attribute), 'config' (the config's sliding_window on every
    layer) or 'none'. ``gate``: 'q_proj' (an elementwise gate folded into the query projection), 'g_proj' (one
    gate per head) or ''. ``norms``: the names of its query and key norms. ``outside``: the feature, when the class
    is outside the theory."""

    rope: str = "config"  # 'latent': multi-head latent attention, read by attnid.families.mla
    window: str = "module"
    gate: str = ""
    norms: tuple[str, str] = ("q_norm", "k_norm")
    outside: str = ""


PLAIN = Semantics()
NO_ROPE = Semantics(rope="none", window="none")
# Each line was read against the class's forward in transformers 5.24; tests/test_meta_table.py measures the count
# of 14 of them against the float64 Jacobian of the class itself.
ATTENTION_CLASSES: dict[str, Semantics] = {
    **dict.fromkeys(("LlamaAttention", "Qwen2Attention", "Qwen3Attention", "Qwen2MoeAttention", "Qwen3MoeAttention",
                     "Olmo2Attention", "Olmo3Attention", "OlmoAttention", "GraniteAttention", "GraniteMoeAttention",
                     "Gemma2Attention", "Gemma3Attention", "GemmaAttention", "GptOssAttention", "Glm4MoeAttention",
                     "Glm4Attention", "GlmAttention", "MiniMaxM2Attention", "Qwen3VLTextAttention",
                     "Qwen3VLMoeTextAttention", "Qwen2_5_VLAttention", "Qwen2VLAttention", "Ernie4_5Attention",
                     "Ernie4_5_MoeAttention", "SeedOssAttention", "ApertusAttention", "ArceeAttention",
                     "HeliumAttention", "HunYuanDenseV1Attention", "HunYuanMoEV1Attention", "Dots1Attention",
                     "MiMoV2FlashAttention", "FalconH1Attention", "GraniteMoeHybridAttention", "BambaAttention",
                     "CohereAttention", "GraniteMoeSharedAttention"), PLAIN),
    "Lfm2Attention": Semantics(norms=("q_layernorm", "k_layernorm")),
    **dict.fromkeys(("MistralAttention", "MixtralAttention", "Starcoder2Attention", "MinistralAttention",
                     "OlmoeAttention", "MiniMaxAttention"), Semantics(window="config")),
    **dict.fromkeys(("Qwen3NextAttention", "Qwen3_5Attention", "Qwen3_5MoeAttention"), Semantics(gate="q_proj")),
    "Step3p7Attention": Semantics(gate="g_proj"),
    "SmolLM3Attention": Semantics(rope="use_rope"),
    "Cohere2Attention": Semantics(rope="sliding_only"),  # RoPE on the sliding-window layers only
    "Exaone4Attention": Semantics(rope="exaone4", window="is_sliding"),  # RoPE on sliding layers, or all without any
    "NemotronHAttention": NO_ROPE,
    "GPTJAttention": Semantics(rope="rotary_dim", window="none"),
    **dict.fromkeys(("PhiAttention", "StableLmAttention"), Semantics(rope="rotary_ndims", window="none")),
    **dict.fromkeys(("BartAttention", "WhisperAttention", "OPTAttention", "MBartAttention", "MarianAttention",
                     "PegasusAttention", "M2M100Attention", "NllbMoeAttention", "BlenderbotAttention",
                     "CLIPAttention", "SiglipAttention", "Siglip2Attention", "XGLMAttention",
                     "Idefics3VisionAttention", "SmolVLMVisionAttention"), NO_ROPE),
    **dict.fromkeys(("DeepseekV2Attention", "DeepseekV3Attention", "DeepseekV32Attention", "GlmMoeDsaAttention"),
                    Semantics(rope="latent", window="none")),
    "Gemma4TextAttention": Semantics(outside="an RMSNorm without weights on the values (v_norm)"),
    "MiniMaxLightningAttention": Semantics(outside="lightning attention (linear attention with a decay), not softmax"),
    "DeepseekV4Attention": Semantics(outside="compressed sparse attention (keys and values pooled over blocks of "
                                             "tokens, a top-k indexer, a grouped output projection)"),
}


# Remote-code model types whose config class subclasses a transformers one and whose model computes what that
# type's model computes; the fields they add, and why no count depends on them.
REMOTE_AS: dict[str, tuple[str, dict[str, str]]] = {
    "mimo": ("qwen2", {"num_nextn_predict_layers": "Xiaomi MiMo's multi-token-prediction layers (mtp_layers): "
                       "MiMoModel is Qwen2Model with these added and its forward never runs them, so the causal LM's function "
                       "does not see their parameters; they are not counted (as transformers builds DeepSeek-V3 "
                       "without its own)"}),
}
