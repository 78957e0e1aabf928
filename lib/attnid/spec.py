"""AttentionSpec: one attention layout, validated.

A layout fixes everything about a multi-head attention layer except the values of its
weights: the model width, the query heads H and key/value heads G (G divides H: MHA when
G = H, GQA when 1 < G < H, MQA when G = 1), the per-head widths d_k and d_v, which of the
four biases exist, rotary position embeddings (RoPE) on the first r of the d_k
dimensions, a causal mask, and how scores are normalised (softmax, softmax with a sink
logit in the denominator, or an elementwise sigmoid). ``Params``, the type of a point in
parameter space, lives here too.

Three features of recent models are optional fields whose defaults give the layer of the
earlier chapters (every count and output of a layout without them is unchanged):

* ``qk_norm``: an RMSNorm with a learned weight on the queries and the keys, after the
  projections' biases and before RoPE. ``"shared"``: over each head's d_k entries, one
  weight vector for all query heads and one for all key heads (Qwen3, Gemma 3);
  ``"per-head"``: the same with one weight vector per head; ``"full"``: one norm over the
  whole projection width, H d_k entries for the queries and G d_k for the keys, one weight
  per entry (OLMo-2); ``"unweighted"``: over each head's d_k entries with no learned weight
  (Llama 4's L2 norm, which it applies after RoPE; RoPE keeps the norm, so before or after
  is the same function). ``qk_norm_eps`` is the norm's epsilon, RMSNorm(u) =
  u / sqrt(mean(u^2) + eps) * weight; its default, 1e-6, is Qwen3's (``rms_norm_eps`` of
  transformers' Qwen3Config, also Gemma 3's).
* ``window``: a causal sliding window of w keys: query i sees the keys j with
  i - w < j <= i (Mistral, the local layers of Gemma 2 and 3 and gpt-oss; the convention
  of transformers' ``sliding_window``). It needs ``causal=True``.
* ``chunk``: chunked causal attention with chunks of c tokens: query i sees the keys j <= i
  in its own chunk, floor(j / c) = floor(i / c) (Llama 4's ``attention_chunk_size``). It
  needs ``causal=True`` and excludes ``window``.
"""

from __future__ import annotations

import operator

from dataclasses import asdict, dataclass
from typing import Any, Literal

from attnid.fields import MAX_NORM_EPS, check, rope_columns
from attnid.layout import Params  # noqa: F401 (a point in parameter space: named tensors; re-exported)
from attnid.normalise import NORMS

Norm = Literal["softmax", "sink", "sigmoid"]
QKNorm = Literal["none", "shared", "per-head", "full", "unweighted"]
QK_NORMS: tuple[str, ...] = ("none", "shared", "per-head", "full", "unweighted")
# The default epsilon of a QK-norm: Qwen3's rms_norm_eps (transformers Qwen3Config; Gemma 3 uses the same).
DEFAULT_QK_NORM_EPS = 1e-6
MAX_QK_NORM_EPS = MAX_NORM_EPS  # the ranges of every field, and why: attnid.fields
BIAS_LETTERS = "qkvo"


def parse_bias(text: str) -> str:
    """Normalise a bias flag: 'none' or any combination of q, k, v, o -> letters in qkvo order."""
    if not isinstance(text, str):
        raise TypeError(f"bias must be a string such as 'qkvo', 'kv' or 'none', got {type(text).__name__}")
    lowered = text.strip().lower()
    if lowered in ("", "none"):
        return ""
    bad = sorted(set(lowered) - set(BIAS_LETTERS))
    if bad:
        raise ValueError(f"bias: unknown letter(s) {''.join(bad)!r} in {text!r}; use 'none' or letters from 'qkvo'")
    if len(set(lowered)) != len(lowered):
        raise ValueError(f"bias: repeated letter in {text!r}; each of q, k, v, o at most once")
    return "".join(c for c in BIAS_LETTERS if c in lowered)


def format_base(base: float) -> str:
    """A RoPE base as typed, without rounding: 10000, 500000, 1.000001, 1e+16 (shortest round-trip form)."""
    text = repr(float(base))
    return text[:-2] if text.endswith(".0") else text


def rope_dims_from_fraction(fraction: float, head_dim: int) -> int:
    """r = fraction * d_k, which must be an even integer (RoPE rotates pairs of dimensions)."""
    try:
        return rope_columns(fraction, head_dim)
    except (TypeError, ValueError) as exc:
        message = str(exc)
        raise type(exc)(message if "rope_fraction" in message else f"rope_fraction {message}") from None


@dataclass(frozen=True)
class AttentionSpec:
    """A validated attention layout. Use ``AttentionSpec.create`` for defaults and fractions."""

    d_model: int
    heads: int
    kv_heads: int
    head_dim: int
    v_head_dim: int
    bias: str = ""
    rope_dims: int = 0
    rope_base: float = 10000.0
    causal: bool = False
    norm: Norm = "softmax"
    sink_learned: bool = False
    qk_norm: QKNorm = "none"
    qk_norm_eps: float = DEFAULT_QK_NORM_EPS
    window: int | None = None
    chunk: int | None = None

    def __post_init__(self) -> None:
        for name in ("d_model", "heads", "kv_heads", "head_dim", "v_head_dim", "rope_base", "qk_norm_eps"):
            object.__setattr__(self, name, check(name, getattr(self, name)))  # stored as a plain int or float
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads {self.kv_heads} must divide heads {self.heads}")
        if parse_bias(self.bias) != self.bias:
            raise ValueError(f"bias must be letters of 'qkvo' in that order (got {self.bias!r}); use parse_bias")
        if isinstance(self.rope_dims, bool) or not hasattr(type(self.rope_dims), "__index__"):
            raise TypeError(f"rope_dims must be an integer, got {self.rope_dims!r}")
        object.__setattr__(self, "rope_dims", operator.index(self.rope_dims))
        if not 0 <= self.rope_dims <= self.head_dim or self.rope_dims % 2:
            raise ValueError(f"rope_dims must be an even number in [0, head_dim={self.head_dim}], got {self.rope_dims}")
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {', '.join(NORMS)}; got {self.norm!r}")
        if not isinstance(self.sink_learned, bool):
            raise TypeError(f"sink_learned must be True or False, got {self.sink_learned!r}")
        if self.sink_learned and self.norm != "sink":
            raise ValueError(f"sink_learned needs norm='sink', got norm={self.norm!r}")
        if not isinstance(self.causal, bool):
            raise TypeError(f"causal must be True or False, got {self.causal!r}")
        if not isinstance(self.qk_norm, str) or self.qk_norm not in QK_NORMS:
            raise ValueError(f"qk_norm must be one of {', '.join(QK_NORMS)}; got {self.qk_norm!r}")
        if self.window is not None:
            object.__setattr__(self, "window", check("window", self.window))
            if not self.causal:
                raise ValueError("a sliding window needs causal=True (query i sees keys i - window < j <= i)")
        if self.chunk is not None:
            object.__setattr__(self, "chunk", check("chunk", self.chunk))
            if not self.causal:
                raise ValueError("chunked attention needs causal=True (query i sees keys j <= i of its own chunk)")
            if self.window is not None:
                raise ValueError("give a sliding window or chunks, not both")

    @classmethod
    def create(
        cls,
        d_model: int,
        heads: int,
        kv_heads: int | None = None,
        head_dim: int | None = None,
        v_head_dim: int | None = None,
        bias: str = "none",
        rope_fraction: float = 0.0,
        rope_dims: int | None = None,
        rope_base: float = 10000.0,
        causal: bool = False,
        norm: str = "softmax",
        sink_learned: bool = False,
        qk_norm: str = "none",
        qk_norm_eps: float = DEFAULT_QK_NORM_EPS,
        window: int | None = None,
        chunk: int | None = None,
    ) -> "AttentionSpec":
        """Build a spec with defaults: kv_heads = heads, head widths d_model / heads, RoPE from a fraction."""
        rope_fraction = check("rope_fraction", rope_fraction)
        check("rope_base", rope_base)
        d_model, heads = check("d_model", d_model), check("heads", heads)
        if head_dim is None or v_head_dim is None:
            if d_model % heads:
                raise ValueError(
                    f"heads {heads} does not divide d_model {d_model}: give head_dim and v_head_dim explicitly"
                )
        head_dim = d_model // heads if head_dim is None else check("head_dim", head_dim)
        v_head_dim = d_model // heads if v_head_dim is None else v_head_dim
        if rope_dims is not None and rope_fraction:
            raise ValueError("give rope_fraction or rope_dims, not both")
        r = rope_dims if rope_dims is not None else rope_dims_from_fraction(rope_fraction, head_dim)
        return cls(
            d_model=d_model,
            heads=heads,
            kv_heads=heads if kv_heads is None else kv_heads,
            head_dim=head_dim,
            v_head_dim=v_head_dim,
            bias=parse_bias(bias),
            rope_dims=r,
            rope_base=float(rope_base),
            causal=causal,
            norm=norm,  # type: ignore[arg-type]
            sink_learned=sink_learned,
            qk_norm=qk_norm,  # type: ignore[arg-type]
            qk_norm_eps=float(check("qk_norm_eps", qk_norm_eps)),
            window=window,
            chunk=chunk,
        )

    @property
    def group_size(self) -> int:
        """m = H / G, the number of query heads that share one key/value head."""
        return self.heads // self.kv_heads

    def group_of_head(self, h: int) -> int:
        """g(h) = floor(h G / H): the key/value head used by query head h."""
        return h * self.kv_heads // self.heads

    def has_bias(self, letter: str) -> bool:
        """Whether the bias b_Q, b_K, b_V or b_O (letter q, k, v or o) exists."""
        return letter in self.bias

    @property
    def shift_invariant(self) -> bool:
        """True when the normalisation ignores a constant added to a row of scores (plain softmax)."""
        return self.norm == "softmax"

    @property
    def has_qk_norm(self) -> bool:
        """Whether queries and keys pass through an RMSNorm (any of the QK-norm variants)."""
        return self.qk_norm != "none"

    @property
    def kind(self) -> str:
        """'MHA', 'GQA' or 'MQA'."""
        if self.kv_heads == self.heads:
            return "MHA"
        return "MQA" if self.kv_heads == 1 else "GQA"

    def describe(self) -> str:
        """One line naming every field."""
        rope = f"rope={self.rope_dims}/{self.head_dim} base={format_base(self.rope_base)}" if self.rope_dims else "rope=none"
        norm = self.norm + (" (learned)" if self.sink_learned else " (fixed 0)" if self.norm == "sink" else "")
        extra = (f" qk_norm={self.qk_norm} eps={self.qk_norm_eps:g}" if self.has_qk_norm else "") + (
            f" window={self.window}" if self.window is not None else "") + (
            f" chunk={self.chunk}" if self.chunk is not None else "")
        return (
            f"d_model={self.d_model} heads={self.heads} kv_heads={self.kv_heads} ({self.kind}) "
            f"head_dim={self.head_dim} v_head_dim={self.v_head_dim} bias={self.bias or 'none'} {rope} "
            f"norm={norm} causal={'yes' if self.causal else 'no'}{extra}"
        )

    def label(self) -> str:
        """A short label for tables and legends: width, heads, RoPE and biases (no commas)."""
        rope = f"RoPE {self.rope_dims}/{self.head_dim}" if self.rope_dims else "no RoPE"
        extra = "" if self.norm == "softmax" else f" {self.norm}"
        if self.has_qk_norm:
            extra += f" QK-norm {self.qk_norm} eps={self.qk_norm_eps:g}"
        if self.window is not None:
            extra += f" window {self.window}"
        if self.chunk is not None:
            extra += f" chunk {self.chunk}"
        return f"d={self.d_model} H={self.heads} G={self.kv_heads} {rope} bias={self.bias or 'none'}{extra}"

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (for JSON); qk_norm_eps is null without a QK-norm, window and chunk without one."""
        out = asdict(self)
        out["bias"] = self.bias or "none"
        if not self.has_qk_norm:
            out["qk_norm_eps"] = None
        return out


def divisors(n: int) -> list[int]:
    """The positive divisors of n, ascending."""
    return [k for k in range(1, n + 1) if n % k == 0]


def standard_layouts(d_model: int, heads: list[int] | None = None, biases: tuple[str, ...] = ("none",)) -> list[AttentionSpec]:
    """The standard layouts of width d: head widths d/H, every G dividing H, with and without full RoPE.

    ``heads`` defaults to every H dividing d; full RoPE is added where d/H is even (RoPE rotates
    pairs). Each layout appears once per bias flag in ``biases``. Order: H, then G, RoPE off then on, bias.
    """
    check("d_model", d_model)
    chosen = divisors(d_model) if heads is None else heads
    bad = [h for h in chosen if isinstance(h, bool) or not isinstance(h, int) or h < 1 or d_model % h]
    if bad:
        raise ValueError(f"heads {bad} do not divide d_model {d_model}; the standard layout has d_k = d_model / H")
    layouts = []
    for h in chosen:
        for g in divisors(h):
            for rope in (0.0, 1.0) if (d_model // h) % 2 == 0 else (0.0,):
                layouts += [AttentionSpec.create(d_model, h, kv_heads=g, rope_fraction=rope, bias=b) for b in biases]
    return layouts
