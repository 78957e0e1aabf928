"""The latent-attention layout: MLASpec, its fields validated by attnid.fields, and its config.json reader."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from attnid.fields import check, json_integer
from attnid.spec import format_base

# transformers builds q_a_layernorm and kv_a_layernorm as DeepseekV3RMSNorm(width), whose eps defaults to 1e-6;
# the config's rms_norm_eps goes to the decoder block's norms only. The original DeepSeek code does the same.
HF_LATENT_NORM_EPS: float = 1e-6

# config.json keys that from_hf_config reads (everything else is returned as ignored, with the reason).
CONFIG_KEYS_READ = ("hidden_size", "num_attention_heads", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim",
           "qk_rope_head_dim", "v_head_dim")
_WIDTH_KEYS = (*CONFIG_KEYS_READ, "num_key_value_heads")  # a width written 7168.0 is read as 7168
_IGNORED_WHY = {
    "num_key_value_heads": "equals num_attention_heads: MLA builds one key and value per head from the shared latent",
    "attention_bias": "false: no projection biases, as in the reference layer",
    "rms_norm_eps": "eps of the decoder block's RMSNorms; the latent norms use the module default 1e-6",
    "rope_interleave": "a fixed permutation of the rotated coordinates (relabels columns of W_UQ and W_KR); "
                       "same function class and count",
    "num_hidden_layers": "a layer count, not part of one attention layer (the census reads it)",
    "head_dim": "transformers' rotary width (qk_rope_head_dim), not a separate width",
    "rope_scaling": "YaRN frequency and score scaling: not in the reference forward (default RoPE)",
    "attention_dropout": "dropout is off at inference",
    "max_position_embeddings": "context length, not a parameter",
}
_ROPE_KEYS_READ = ("rope_theta", "rope_type")


@dataclass(frozen=True)
class MLASpec:
    """A validated multi-head latent attention layout (one layer). ``q_lora_rank`` None: one full query projection."""

    d_model: int
    heads: int
    kv_lora_rank: int
    """d_c: the width of the shared key/value latent (DeepSeek's ``kv_lora_rank``)."""
    qk_nope_head_dim: int
    """d_n: the per-head query/key width without rotation."""
    qk_rope_head_dim: int
    """d_r: the rotated query width per head; the rotated key of that width is shared by all heads."""
    v_head_dim: int
    q_lora_rank: int | None = None
    rope_base: float = 10000.0
    norm_eps: float = HF_LATENT_NORM_EPS
    causal: bool = True

    def __post_init__(self) -> None:
        for name in ("d_model", "heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                     "rope_base", "norm_eps"):
            object.__setattr__(self, name, check(name, getattr(self, name)))  # stored as a plain int or float
        if self.q_lora_rank is not None:
            object.__setattr__(self, "q_lora_rank", check("q_lora_rank", self.q_lora_rank))
        if not isinstance(self.causal, bool):
            raise TypeError(f"causal must be True or False, got {self.causal!r}")

    @property
    def qk_head_dim(self) -> int:
        """d_n + d_r, the width of one query (and key) head; the scores are divided by its square root."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def query_input(self) -> int:
        """The width the query up-projection reads: q_lora_rank, or d_model without a query latent."""
        return self.d_model if self.q_lora_rank is None else self.q_lora_rank

    def describe(self) -> str:
        """One line naming every field."""
        q = "none (full query projection)" if self.q_lora_rank is None else str(self.q_lora_rank)
        return (f"MLA d_model={self.d_model} heads={self.heads} kv_lora_rank={self.kv_lora_rank} q_lora_rank={q} "
                f"nope={self.qk_nope_head_dim} rope={self.qk_rope_head_dim} base={format_base(float(self.rope_base))} "
                f"v_head_dim={self.v_head_dim} eps={self.norm_eps:g} causal={'yes' if self.causal else 'no'}")

    def label(self) -> str:
        """Short label for tables and legends."""
        q = f"c'={self.q_lora_rank}" if self.q_lora_rank is not None else "no q-latent"
        return (f"d={self.d_model} H={self.heads} c={self.kv_lora_rank} {q} "
                f"n/r/v={self.qk_nope_head_dim}/{self.qk_rope_head_dim}/{self.v_head_dim}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any], *, norm_eps: float = HF_LATENT_NORM_EPS,
                       causal: bool = True) -> tuple["MLASpec", dict[str, str]]:
        """(spec, ignored) from a DeepSeek-V2/V3 or Kimi K2 config.json dict.

        ``ignored`` names every key that the spec does not carry, with the reason; nothing is
        dropped silently. A Kimi-K2.5 style config (a ``text_config`` inside) is read from its
        text part, and that is listed too. Raises ValueError for a config that is not MLA
        (no ``kv_lora_rank``), for projection biases (``attention_bias: true``, not modelled) and for
        ``num_key_value_heads`` other than ``num_attention_heads``.
        """
        if not isinstance(cfg, Mapping):
            raise TypeError(f"cfg must be a mapping (a parsed config.json), got {type(cfg).__name__}")
        ignored: dict[str, str] = {}
        if "text_config" in cfg and "kv_lora_rank" not in cfg:
            for key in cfg:
                if key != "text_config":
                    ignored[key] = "outside the language model's text_config"
            cfg = cfg["text_config"]
            if not isinstance(cfg, Mapping):
                raise ValueError(f"text_config must be a mapping, got {type(cfg).__name__}")
            ignored_prefix = "text_config."
        else:
            ignored_prefix = ""
        cfg = {key: json_integer(value) if key in _WIDTH_KEYS else value for key, value in cfg.items()}
        missing = [k for k in CONFIG_KEYS_READ if k not in cfg and k != "q_lora_rank"]
        if missing:
            raise ValueError(f"not a multi-head latent attention config: missing {', '.join(missing)}")
        if "q_lora_rank" not in cfg:  # transformers would fill in its class default (1536), so say it explicitly
            raise ValueError("q_lora_rank is missing: give its width, or null for one full query projection "
                             "(DeepSeek-V2-Lite)")
        heads = cfg["num_attention_heads"]
        kv = cfg.get("num_key_value_heads", heads)
        if kv != heads:
            raise ValueError(f"num_key_value_heads must equal num_attention_heads ({heads!r}) in MLA, got {kv!r}")
        if cfg.get("attention_bias", False):
            raise ValueError("attention_bias: true (biases on q_a_proj, kv_a_proj_with_mqa, o_proj) is not modelled; "
                             "only false is accepted")
        base = cfg.get("rope_theta")
        rope = cfg.get("rope_parameters")
        if isinstance(rope, Mapping):
            base = rope.get("rope_theta", base)
            if rope.get("rope_type", "default") != "default":
                ignored[ignored_prefix + "rope_parameters"] = _IGNORED_WHY["rope_scaling"]
            else:
                extra = [k for k in rope if k not in _ROPE_KEYS_READ]
                if extra:
                    ignored[ignored_prefix + "rope_parameters"] = f"keys {', '.join(sorted(extra))} not modelled"
        if base is not None and (isinstance(base, bool) or not isinstance(base, numbers.Real)):
            raise TypeError(f"rope_theta must be a number, got {base!r}")
        try:
            spec = cls(d_model=cfg["hidden_size"], heads=heads, kv_lora_rank=cfg["kv_lora_rank"],
                       qk_nope_head_dim=cfg["qk_nope_head_dim"], qk_rope_head_dim=cfg["qk_rope_head_dim"],
                       v_head_dim=cfg["v_head_dim"], q_lora_rank=cfg["q_lora_rank"],
                       rope_base=float(10000.0 if base is None else base), norm_eps=norm_eps, causal=causal)
        except (TypeError, ValueError) as exc:  # name the config.json keys behind the spec's two renamed fields
            raise type(exc)(f"config.json: {exc} (d_model is hidden_size, heads is num_attention_heads)") from None
        for key in cfg:
            if key in CONFIG_KEYS_READ or key in ("rope_theta", "rope_parameters"):
                continue
            if key == "rope_scaling" and cfg[key] is None:
                ignored[ignored_prefix + key] = "null: no scaling"
                continue
            ignored[ignored_prefix + key] = _IGNORED_WHY.get(key, "not part of the attention layer")
        return spec, ignored
