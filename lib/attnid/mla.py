"""Multi-head latent attention (MLA, DeepSeek-V2/V3, Kimi K2): layout, reference layer, symmetries, count.

Shapes (per-head layout; d = d_model, H heads, c = kv_lora_rank, c' = q_lora_rank,
d_n / d_r / d_v the non-rotated query-key, rotated query-key and value widths per head):

    with q_lora_rank:   W_DQ (d, c')   g_Q (c')   W_UQ (H, c', d_n + d_r)
    without (V2-Lite):  W_Q (H, d, d_n + d_r)
    W_DKV (d, c)   g_KV (c)   W_KR (d, d_r)   W_UK (H, c, d_n)   W_UV (H, c, d_v)   W_O (H, d_v, d)

    N(z)    = z / sqrt(mean(z^2) + eps)                     RMSNorm without its weight
    C_Q     = N(X W_DQ) diag(g_Q)                           query latent (or C_Q = X, W_UQ = W_Q)
    C_KV    = N(X W_DKV) diag(g_KV)                         key/value latent, shared by all heads
    [Q_h^n, Q_h^r] = C_Q W_UQ^h                             split after d_n columns
    K_h^n = C_KV W_UK^h,  V_h = C_KV W_UV^h,  K^r = X W_KR  one rotated key for all heads
    S_h   = (Q_h^n K_h^n^T + RoPE(Q_h^r) RoPE(K^r)^T) / sqrt(d_n + d_r)   causal
    Y     = sum_h softmax(S_h) V_h W_O^h

transformers' ``DeepseekV3Attention`` splits ``kv_a_proj_with_mqa`` into W_DKV (first c outputs)
and W_KR (last d_r), and ``kv_b_proj`` head by head into W_UK^h and W_UV^h; ``hf_cross_check``
maps the weights both ways and compares outputs. Its latent RMSNorms are built with their
default eps = 1e-6 (``HF_LATENT_NORM_EPS``), not the config's ``rms_norm_eps`` (the block norms).

Symmetries (``tangent_directions`` gives the Lie algebra at a point, ``random_symmetry`` a group
element; the chapter proves each leaves Y unchanged):

* each latent space (c, and c' when present): O(c) acting on the down-projection's columns and,
  through diag(g), on the up-projection's rows, because N(z M) = N(z) M for orthogonal M;
  the norm weight against the rows of the up-projection (c directions); and when eps = 0 the
  scale of the down-projection, since then N(t z) = N(z). With eps > 0 that scale changes Y,
  but only by a relative amount of order eps / mean(z^2): weakly identified, not unidentified.
* per head: GL(d_n) between the non-rotated query and key columns, GL(d_v) between W_UV^h and W_O^h;
* the RoPE commutant (d_r dimensions: a complex scalar per rotated pair), one for all heads
  together, because the rotated key K^r is shared.

``count`` adds these up when the widths make every factor generic (``Count.covered``); the
numeric nullity (``verify``) is measured with ``attnid.rank``'s rule.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch

from .fields import check
from .jacobian import RankAccumulator, count_parameters, flatten, input_jacobian
from .layout import Count, Family
from .normalise import additive_mask, attention_weights, causal_mask, rms_normalise
from .rank import DEFAULT_ZERO_TOL, RankDecision, numerical_rank
from .rope import apply_rope, rope_tables
from .spec import Params, format_base

# transformers builds q_a_layernorm and kv_a_layernorm as DeepseekV3RMSNorm(width), whose eps defaults to 1e-6;
# the config's rms_norm_eps goes to the decoder block's norms only. The original DeepSeek code does the same.
HF_LATENT_NORM_EPS: float = 1e-6

# config.json keys that from_hf_config reads (everything else is returned as ignored, with the reason).
_MAPPED = ("hidden_size", "num_attention_heads", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim",
           "qk_rope_head_dim", "v_head_dim")
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
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None
    rope_base: float = 10000.0
    norm_eps: float = HF_LATENT_NORM_EPS
    causal: bool = True

    def __post_init__(self) -> None:
        for name in ("d_model", "heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                     "rope_base", "norm_eps"):
            check(name, getattr(self, name))
        if self.q_lora_rank is not None:
            check("q_lora_rank", self.q_lora_rank)
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
        missing = [k for k in _MAPPED if k not in cfg and k != "q_lora_rank"]
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
            if key in _MAPPED or key in ("rope_theta", "rope_parameters"):
                continue
            if key == "rope_scaling" and cfg[key] is None:
                ignored[ignored_prefix + key] = "null: no scaling"
                continue
            ignored[ignored_prefix + key] = _IGNORED_WHY.get(key, "not part of the attention layer")
        return spec, ignored


# ---------------------------------------------------------------------------------------------- the layer


def parameter_shapes(spec: MLASpec) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter, in a fixed order (module docstring)."""
    d, h, c = spec.d_model, spec.heads, spec.kv_lora_rank
    dn, dr, dv = spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.v_head_dim
    shapes: dict[str, tuple[int, ...]] = {}
    if spec.q_lora_rank is None:
        shapes["W_Q"] = (h, d, dn + dr)
    else:
        shapes.update({"W_DQ": (d, spec.q_lora_rank), "g_Q": (spec.q_lora_rank,), "W_UQ": (h, spec.q_lora_rank, dn + dr)})
    shapes.update({"W_DKV": (d, c), "g_KV": (c,)})
    if dr:
        shapes["W_KR"] = (d, dr)
    shapes.update({"W_UK": (h, c, dn), "W_UV": (h, c, dv), "W_O": (h, dv, d)})
    return shapes


def init_params(spec: MLASpec, generator: torch.Generator, dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
    """A generic random point: Gaussian matrices scaled by 1/sqrt(fan-in), norm weights 1 + N(0, 1/16)."""
    params = {}
    for name, shape in parameter_shapes(spec).items():
        draw = torch.randn(shape, generator=generator, dtype=torch.float64)
        if name.startswith("g_"):
            draw = 1.0 + 0.25 * draw
        else:
            fan_in = spec.heads * spec.v_head_dim if name == "W_O" else shape[-2]
            draw = draw * fan_in**-0.5
        params[name] = draw.to(dtype)
    return params


def check_params(params: Params, spec: MLASpec) -> None:
    """ValueError unless params has exactly the layout's names and shapes, all finite."""
    shapes = parameter_shapes(spec)
    if set(params) != set(shapes):
        missing, extra = sorted(set(shapes) - set(params)), sorted(set(params) - set(shapes))
        raise ValueError(f"parameters do not match the MLA layout: missing {missing}, unexpected {extra}")
    for name, shape in shapes.items():
        if tuple(params[name].shape) != shape:
            raise ValueError(f"{name} has shape {tuple(params[name].shape)}, the layout needs {shape}")
        if not torch.isfinite(params[name]).all():
            raise ValueError(f"{name} contains NaN or inf")


def query_states(params: Params, x: torch.Tensor, spec: MLASpec) -> torch.Tensor:
    """Q of shape (..., H, n, d_n + d_r), before RoPE."""
    if spec.q_lora_rank is None:
        return torch.einsum("...nd,hdk->...hnk", x, params["W_Q"])
    latent = rms_normalise(x @ params["W_DQ"], spec.norm_eps) * params["g_Q"]
    return torch.einsum("...nr,hrk->...hnk", latent, params["W_UQ"])


def kv_latent(params: Params, x: torch.Tensor, spec: MLASpec) -> torch.Tensor:
    """C_KV = N(X W_DKV) diag(g_KV), shape (..., n, c): what an MLA cache stores besides the rotated key."""
    return rms_normalise(x @ params["W_DKV"], spec.norm_eps) * params["g_KV"]


def forward(params: Params, x: torch.Tensor, spec: MLASpec) -> torch.Tensor:
    """Y for X of shape (..., n, d_model), in the dtype of the parameters (module docstring)."""
    if x.shape[-1] != spec.d_model:
        raise ValueError(f"input width {x.shape[-1]} does not match d_model {spec.d_model}")
    dn, dr = spec.qk_nope_head_dim, spec.qk_rope_head_dim
    q = query_states(params, x, spec)
    q_nope, q_rope = q[..., :dn], q[..., dn:]
    latent = kv_latent(params, x, spec)
    k_nope = torch.einsum("...nc,hck->...hnk", latent, params["W_UK"])
    v = torch.einsum("...nc,hcv->...hnv", latent, params["W_UV"])
    scores = q_nope @ k_nope.transpose(-1, -2)
    if dr:
        k_rope = apply_rope((x @ params["W_KR"]).unsqueeze(-3), dr, spec.rope_base)  # (..., 1, n, d_r), all heads
        scores = scores + apply_rope(q_rope, dr, spec.rope_base) @ k_rope.transpose(-1, -2)
    weights = attention_weights(scores / math.sqrt(spec.qk_head_dim), norm="softmax", causal=spec.causal)
    return torch.einsum("...hnv,hvd->...nd", weights @ v, params["W_O"])


# ---------------------------------------------------------------------------------------------- the count


def total_parameters(spec: MLASpec) -> int:
    """All parameters of the layer, norm weights included."""
    return sum(math.prod(shape) for shape in parameter_shapes(spec).values())


def coverage_problems(spec: MLASpec) -> list[str]:
    """The width conditions the closed form needs that this layout breaks (empty: covered).

    Each latent must be no wider than the model (so X W_D has full column rank c), and each
    per-head factor no wider than the two spaces it joins (so the products are generic of full rank).
    """
    d, c, qin = spec.d_model, spec.kv_lora_rank, spec.query_input
    dn, dr, dv = spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.v_head_dim
    conditions = [
        (c <= d, f"kv_lora_rank {c} > d_model {d}"),
        (spec.q_lora_rank is None or spec.q_lora_rank <= d, f"q_lora_rank {spec.q_lora_rank} > d_model {d}"),
        (dn <= min(qin, c), f"qk_nope_head_dim {dn} > min(query input {qin}, kv_lora_rank {c})"),
        (dv <= min(c, d), f"v_head_dim {dv} > min(kv_lora_rank {c}, d_model {d})"),
        (dr <= min(qin, d), f"qk_rope_head_dim {dr} > min(query input {qin}, d_model {d})"),
    ]
    return [why for ok, why in conditions if not ok]


def latent_symmetry_dimension(width: int, eps: float) -> int:
    """dim O(c) + c norm weights + (1 if eps = 0: the down-projection's scale) = c (c + 1) / 2 + [eps = 0]."""
    return width * (width - 1) // 2 + width + (eps == 0)


def count(spec: MLASpec) -> Count:
    """Total and unidentified parameters per layer (the chapter's theorem), with the breakdown by source.

    ``weakly_identified`` is the number of directions that are unidentified at eps = 0 and only weakly
    identified at eps > 0 (the scale of each down-projection): 0 when eps = 0.
    """
    total = total_parameters(spec)
    problems = coverage_problems(spec)
    latents = 1 + (spec.q_lora_rank is not None)
    if problems:
        return Count(spec, total, None, {}, "not covered: " + "; ".join(problems))
    breakdown = {"kv_latent": latent_symmetry_dimension(spec.kv_lora_rank, spec.norm_eps)}
    if spec.q_lora_rank is not None:
        breakdown["q_latent"] = latent_symmetry_dimension(spec.q_lora_rank, spec.norm_eps)
    breakdown["query_key_nope"] = spec.heads * spec.qk_nope_head_dim**2
    breakdown["rope_commutant"] = spec.qk_rope_head_dim
    breakdown["value_output"] = spec.heads * spec.v_head_dim**2
    weak = latents if spec.norm_eps > 0 else 0
    return Count(spec, total, sum(breakdown.values()), breakdown, weakly_identified=weak)


# ---------------------------------------------------------------------------------------------- symmetries


def _zeros_like(params: Params) -> dict[str, torch.Tensor]:
    return {name: torch.zeros_like(p) for name, p in params.items()}


def _latent_names(spec: MLASpec, which: str) -> tuple[str, str, tuple[str, ...]]:
    """(down-projection, norm weight, up-projections) of latent 'kv' or 'q'."""
    if which == "kv":
        return "W_DKV", "g_KV", ("W_UK", "W_UV")
    if which == "q" and spec.q_lora_rank is not None:
        return "W_DQ", "g_Q", ("W_UQ",)
    raise ValueError(f"latent must be 'kv' or, with a q_lora_rank, 'q'; got {which!r}")


def _query_up(spec: MLASpec) -> str:
    return "W_Q" if spec.q_lora_rank is None else "W_UQ"


def rope_commutant_basis(rope_dims: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """(d_r, d_r, d_r): per rotated pair (i, i + d_r/2), the identity and the quarter turn on that pair.

    These span the matrices commuting with every RoPE rotation (the pairs turn at distinct speeds).
    """
    half = rope_dims // 2
    basis = torch.zeros(rope_dims, rope_dims, rope_dims, dtype=dtype)
    for i in range(half):
        a, b = i, i + half
        basis[2 * i, a, a] = basis[2 * i, b, b] = 1.0
        basis[2 * i + 1, a, b], basis[2 * i + 1, b, a] = -1.0, 1.0
    return basis


def labelled_tangent_directions(params: Params, spec: MLASpec) -> list[tuple[str, dict[str, torch.Tensor]]]:
    """The symmetry group's Lie algebra at ``params``: one tangent direction per generator, with its source.

    Sources: 'kv_latent' / 'q_latent' (rotations, norm weights, and the scale when eps = 0),
    'query_key_nope' (per head gl(d_n)), 'rope_commutant' (shared by all heads), 'value_output'
    (per head gl(d_v)). The number of directions equals ``count(spec).unidentified`` by construction;
    that they are independent (a trivial stabiliser) is what ``orbit_dimension`` measures.
    """
    check_params(params, spec)
    out: list[tuple[str, dict[str, torch.Tensor]]] = []
    for which in ("kv", "q") if spec.q_lora_rank is not None else ("kv",):
        down, gain, ups = _latent_names(spec, which)
        width = params[gain].shape[0]
        g = params[gain]
        for i in range(width):
            for j in range(i + 1, width):
                a = torch.zeros(width, width, dtype=g.dtype)
                a[i, j], a[j, i] = 1.0, -1.0
                t = _zeros_like(params)
                t[down] = params[down] @ a
                mix = -(torch.diag(1 / g) @ a @ torch.diag(g))  # d/dt of diag(g)^-1 M^T diag(g), M = exp(t A)
                for up in ups:
                    t[up] = torch.einsum("rs,hsk->hrk", mix, params[up])
                out.append((f"{which}_latent", t))
        for i in range(width):
            t = _zeros_like(params)
            t[gain][i] = g[i]
            for up in ups:
                t[up][:, i, :] = -params[up][:, i, :]
            out.append((f"{which}_latent", t))
        if spec.norm_eps == 0:
            t = _zeros_like(params)
            t[down] = params[down].clone()
            out.append((f"{which}_latent", t))
    dn, qup = spec.qk_nope_head_dim, _query_up(spec)
    for h in range(spec.heads):
        for a in range(dn):
            for b in range(dn):
                t = _zeros_like(params)
                t[qup][h, :, b] = params[qup][h, :, a]  # W_Qn^h E_ab
                t["W_UK"][h, :, a] = -params["W_UK"][h, :, b]  # -W_UK^h E_ab^T
                out.append(("query_key_nope", t))
    for e in rope_commutant_basis(spec.qk_rope_head_dim, params["W_O"].dtype):
        t = _zeros_like(params)
        t[qup][..., dn:] = params[qup][..., dn:] @ e
        t["W_KR"] = -params["W_KR"] @ e.T
        out.append(("rope_commutant", t))
    dv = spec.v_head_dim
    for h in range(spec.heads):
        for a in range(dv):
            for b in range(dv):
                t = _zeros_like(params)
                t["W_UV"][h, :, b] = params["W_UV"][h, :, a]
                t["W_O"][h, a, :] = -params["W_O"][h, b, :]
                out.append(("value_output", t))
    return out


def tangent_basis(params: Params, spec: MLASpec) -> torch.Tensor:
    """The tangent directions flattened (in parameter order) as rows: (number of generators, P)."""
    return torch.stack([flatten(t) for _, t in labelled_tangent_directions(params, spec)])


def orbit_dimension(params: Params, spec: MLASpec, rel_tol: float = DEFAULT_ZERO_TOL) -> int:
    """Dimension of the span of the tangent directions, by the rank rule (``attnid.rank.numerical_rank``)."""
    return numerical_rank(torch.linalg.svdvals(tangent_basis(params, spec)), rel_tol)


@dataclass(frozen=True)
class MLASymmetry:
    """A group element: latent rotations and scales, per-head GL blocks, one RoPE-commutant element."""

    kv_rotation: torch.Tensor  # (c, c) orthogonal
    kv_gain: torch.Tensor  # (c,) non-zero: new g_KV = g_KV * kv_gain
    kv_scale: float  # multiplies W_DKV (must be 1 unless eps = 0)
    q_rotation: torch.Tensor | None
    q_gain: torch.Tensor | None
    q_scale: float
    nope: torch.Tensor  # (H, d_n, d_n) invertible: W_Qn^h M_h, W_UK^h M_h^-T
    value: torch.Tensor  # (H, d_v, d_v) invertible: W_UV^h M_h, M_h^-1 W_O^h
    rope: torch.Tensor  # (d_r, d_r) invertible, in the RoPE commutant: W_Qr^h C, W_KR C^-T


def _orthogonal(width: int, generator: torch.Generator, scale: float) -> torch.Tensor:
    a = torch.randn(width, width, generator=generator, dtype=torch.float64) * scale
    return torch.linalg.matrix_exp(a - a.T)


def random_symmetry(spec: MLASpec, generator: torch.Generator, scale: float = 0.3) -> MLASymmetry:
    """A random group element near the identity (``scale`` sets the distance)."""
    def near_identity(*shape: int) -> torch.Tensor:
        return torch.eye(shape[-1], dtype=torch.float64) + scale * torch.randn(*shape, generator=generator, dtype=torch.float64)

    def gains(width: int) -> torch.Tensor:
        return torch.exp(scale * torch.randn(width, generator=generator, dtype=torch.float64))

    c, q = spec.kv_lora_rank, spec.q_lora_rank
    coeff = scale * torch.randn(spec.qk_rope_head_dim, generator=generator, dtype=torch.float64)
    rope = torch.eye(spec.qk_rope_head_dim, dtype=torch.float64) + torch.einsum(
        "k,kij->ij", coeff, rope_commutant_basis(spec.qk_rope_head_dim))
    free_scale = spec.norm_eps == 0
    return MLASymmetry(
        kv_rotation=_orthogonal(c, generator, scale), kv_gain=gains(c),
        kv_scale=float(torch.exp(scale * torch.randn((), generator=generator, dtype=torch.float64))) if free_scale else 1.0,
        q_rotation=None if q is None else _orthogonal(q, generator, scale), q_gain=None if q is None else gains(q),
        q_scale=(float(torch.exp(scale * torch.randn((), generator=generator, dtype=torch.float64)))
                 if free_scale and q is not None else 1.0),
        nope=near_identity(spec.heads, spec.qk_nope_head_dim, spec.qk_nope_head_dim),
        value=near_identity(spec.heads, spec.v_head_dim, spec.v_head_dim), rope=rope)


def apply_symmetry(params: Params, spec: MLASpec, element: MLASymmetry) -> dict[str, torch.Tensor]:
    """The moved point; the layer's output is unchanged (the chapter's lemma; tests check it).

    Latent (down D, weight g, ups U): D -> t D M, g -> g * s, U -> diag(g s)^-1 M^T diag(g) U, using
    N(t z M) = N(z) M for orthogonal M (and t > 0 only when eps = 0).
    """
    check_params(params, spec)
    if spec.norm_eps != 0 and (element.kv_scale != 1.0 or element.q_scale != 1.0):
        raise ValueError("a down-projection scale other than 1 is a symmetry only when norm_eps = 0")
    p = {name: t.clone() for name, t in params.items()}
    latents = [("kv", element.kv_rotation, element.kv_gain, element.kv_scale)]
    if spec.q_lora_rank is not None:
        if element.q_rotation is None or element.q_gain is None:
            raise ValueError("the layout has a query latent: the element needs q_rotation and q_gain")
        latents.append(("q", element.q_rotation, element.q_gain, element.q_scale))
    for which, m, s, t in latents:
        down, gain, ups = _latent_names(spec, which)
        g = params[gain]
        p[down] = t * params[down] @ m
        p[gain] = g * s
        mix = torch.diag(1 / (g * s)) @ m.T @ torch.diag(g)
        for up in ups:
            p[up] = torch.einsum("rs,hsk->hrk", mix, p[up])
    dn, qup = spec.qk_nope_head_dim, _query_up(spec)
    q = p[qup]
    q_nope = torch.einsum("hik,hkl->hil", q[..., :dn], element.nope)
    q_rope = q[..., dn:] @ element.rope
    p[qup] = torch.cat([q_nope, q_rope], dim=-1)
    p["W_UK"] = torch.einsum("hik,hlk->hil", p["W_UK"], torch.linalg.inv(element.nope))
    if spec.qk_rope_head_dim:
        p["W_KR"] = params["W_KR"] @ torch.linalg.inv(element.rope).T
    p["W_UV"] = torch.einsum("hik,hkl->hil", p["W_UV"], element.value)
    p["W_O"] = torch.einsum("hkl,hld->hkd", torch.linalg.inv(element.value), p["W_O"])
    return p


def scale_direction(params: Params, spec: MLASpec, which: str = "kv") -> dict[str, torch.Tensor]:
    """The direction that scales one down-projection (W_DKV or W_DQ): unidentified at eps = 0, weak at eps > 0."""
    down, _, _ = _latent_names(spec, which)
    t = _zeros_like(params)
    t[down] = params[down].clone()
    return t


# ---------------------------------------------------------------------------------------------- numeric check


@dataclass(frozen=True)
class MLAVerification:
    """The closed-form count next to the numeric nullity of the Jacobian at one random point."""

    spec: MLASpec
    total: int
    exact: int | None
    decision: RankDecision
    orbit: int  # dimension of the span of the symmetry generators at the point
    orbit_stretch: float  # largest ||J v|| / (s_1 ||v||) over the generators: ~0 when they are symmetries
    weak: dict[str, float]  # per down-projection scale: ||J v|| / (s_1 ||v||)
    n_inputs: int
    seq_len: int

    @property
    def numeric(self) -> int:
        return self.decision.nullity

    @property
    def numeric_unidentified(self) -> int:
        """The numeric nullity (the name every family's check shares)."""
        return self.decision.nullity

    @property
    def matches(self) -> bool:
        return self.decision.clear and self.exact is not None and self.exact == self.numeric


def _int(name: str, value: Any, minimum: int) -> int:
    """A verify argument: an integer >= minimum."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _model(spec: MLASpec):
    def fn(params: Params, x: torch.Tensor) -> torch.Tensor:
        return forward(params, x, spec)
    return fn


def verify(spec: MLASpec, *, seed: int = 0, seq_len: int = 6, n_inputs: int | None = None,
           max_rounds: int = 4) -> MLAVerification:
    """Numeric nullity of the float64 Jacobian at a random point, by the library's rank rule.

    Inputs come in batches of ``n_inputs`` Gaussian sequences (default 1.5 P / (seq_len d_model) + 2);
    batches are added until two successive decisions agree and are clear (at most ``max_rounds``).
    """
    _int("seq_len", seq_len, 2)
    _int("max_rounds", max_rounds, 1)
    if n_inputs is not None:
        _int("n_inputs", n_inputs, 1)
    gen = torch.Generator().manual_seed(seed)
    params = init_params(spec, gen)
    n_params = count_parameters(params)
    batch = n_inputs or math.ceil(1.5 * n_params / (seq_len * spec.d_model)) + 2
    fn, acc = _model(spec), RankAccumulator(n_params)
    blocks: list[torch.Tensor] = []
    previous = None
    used = 0
    for _ in range(max_rounds):
        for _ in range(batch):
            x = torch.randn(seq_len, spec.d_model, generator=gen, dtype=torch.float64)
            block = input_jacobian(fn, params, x, "forward")
            acc.add(block)
            blocks.append(block)
            used += 1
        decision = acc.decide()
        if previous is not None and decision.clear and decision.rank == previous.rank:
            break
        previous = decision
    jac = torch.cat(blocks)
    s1 = float(torch.linalg.svdvals(jac)[0]) if jac.numel() else 1.0

    def stretch(direction: torch.Tensor) -> float:
        return float((jac @ direction).norm() / (s1 * direction.norm()))

    basis = tangent_basis(params, spec)
    orbit = numerical_rank(torch.linalg.svdvals(basis))
    orbit_stretch = max((stretch(v) for v in basis), default=0.0)
    weak = {f"W_D{'KV' if w == 'kv' else 'Q'} scale": stretch(flatten(scale_direction(params, spec, w)))
            for w in (("kv", "q") if spec.q_lora_rank is not None else ("kv",))}
    return MLAVerification(spec, n_params, count(spec).unidentified, decision, orbit, orbit_stretch, weak, used, seq_len)


# ---------------------------------------------------------------------------------------------- transformers


def _hf_norm_float64(norm: torch.nn.Module) -> None:
    """Make a DeepseekV3RMSNorm keep the input's dtype (transformers casts to float32 inside); same formula."""
    def forward(hidden: torch.Tensor) -> torch.Tensor:
        return norm.weight * (hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon))
    norm.forward = forward  # type: ignore[method-assign]


@dataclass
class HFMLA:
    """A transformers DeepSeek attention module with the maps between its weights and this module's."""

    version: str
    module: torch.nn.Module
    spec: MLASpec
    interleave: bool

    def _perm(self) -> torch.Tensor:
        """Rotated coordinates in transformers' interleaved order -> rotate-half order (identity if not interleaved)."""
        r = self.spec.qk_rope_head_dim
        if not self.interleave:
            return torch.arange(r)
        return torch.cat([torch.arange(0, r, 2), torch.arange(1, r, 2)])

    def weights(self) -> dict[str, torch.Tensor]:
        return {name: p.detach().clone() for name, p in self.module.named_parameters()}

    def to_attnid(self, w: Params) -> dict[str, torch.Tensor]:
        s = self.spec
        h, c, dn, dr, dv, d = s.heads, s.kv_lora_rank, s.qk_nope_head_dim, s.qk_rope_head_dim, s.v_head_dim, s.d_model
        perm = self._perm()
        out: dict[str, torch.Tensor] = {}
        qw = w["q_proj.weight"] if s.q_lora_rank is None else w["q_b_proj.weight"]  # (H (dn + dr), in)
        q = qw.T.reshape(-1, h, dn + dr).permute(1, 0, 2)  # (H, in, dn + dr)
        q = torch.cat([q[..., :dn], q[..., dn:][..., perm]], dim=-1)
        if s.q_lora_rank is None:
            out["W_Q"] = q
        else:
            out.update({"W_DQ": w["q_a_proj.weight"].T, "g_Q": w["q_a_layernorm.weight"], "W_UQ": q})
        a = w["kv_a_proj_with_mqa.weight"].T  # (d, c + dr)
        out.update({"W_DKV": a[:, :c], "g_KV": w["kv_a_layernorm.weight"]})
        if dr:
            out["W_KR"] = a[:, c:][:, perm]
        b = w["kv_b_proj.weight"].T.reshape(c, h, dn + dv).permute(1, 0, 2)  # (H, c, dn + dv)
        out.update({"W_UK": b[..., :dn], "W_UV": b[..., dn:], "W_O": w["o_proj.weight"].T.reshape(h, dv, d)})
        return {name: out[name] for name in parameter_shapes(s)}

    def from_attnid(self, p: Params) -> dict[str, torch.Tensor]:
        s = self.spec
        h, c, dn, dr, dv, d = s.heads, s.kv_lora_rank, s.qk_nope_head_dim, s.qk_rope_head_dim, s.v_head_dim, s.d_model
        inverse = torch.argsort(self._perm())
        q = p[_query_up(s)]
        q = torch.cat([q[..., :dn], q[..., dn:][..., inverse]], dim=-1)
        q = q.permute(1, 0, 2).reshape(q.shape[1], -1).T
        out = {"q_proj.weight": q} if s.q_lora_rank is None else {
            "q_a_proj.weight": p["W_DQ"].T, "q_a_layernorm.weight": p["g_Q"], "q_b_proj.weight": q}
        rope = p["W_KR"][:, inverse] if dr else p["W_DKV"][:, :0]
        out["kv_a_proj_with_mqa.weight"] = torch.cat([p["W_DKV"], rope], dim=1).T
        out["kv_a_layernorm.weight"] = p["g_KV"]
        out["kv_b_proj.weight"] = torch.cat([p["W_UK"], p["W_UV"]], dim=-1).permute(1, 0, 2).reshape(c, -1).T
        out["o_proj.weight"] = p["W_O"].reshape(h * dv, d).T
        return out

    def output(self, weights: Params, x: torch.Tensor) -> torch.Tensor:
        """The module's output for X (batch, n, d): causal additive mask, cos/sin from attnid.rope in float64."""
        from torch.func import functional_call
        from torch.nn.attention import SDPBackend, sdpa_kernel

        n = x.shape[-2]
        cos, sin = rope_tables(n, self.spec.qk_rope_head_dim, self.spec.rope_base, x.dtype, x.device)
        if self.version == "v2":
            angles = torch.atan2(sin, cos)[:, : self.spec.qk_rope_head_dim // 2]
            position = torch.polar(torch.ones_like(angles), angles)[None].expand(x.shape[0], -1, -1)
            kwargs = {"position_embeddings": position}
        else:
            kwargs = {"position_embeddings": (cos[None].expand(x.shape[0], -1, -1), sin[None].expand(x.shape[0], -1, -1))}
        mask = additive_mask(causal_mask(n, x.device), x.dtype)[None, None]
        with sdpa_kernel(SDPBackend.MATH):
            return functional_call(self.module, dict(weights), (x,), {**kwargs, "attention_mask": mask}, strict=True)[0]


def hf_module(spec: MLASpec, version: str = "v3", seed: int = 0, interleave: bool = True,
              norm_in_float64: bool = True) -> HFMLA:
    """transformers' DeepseekV3Attention (or V2's) for ``spec`` with random float64 weights; nothing downloaded.

    ``norm_in_float64`` keeps the latent RMSNorms in float64 (transformers computes them in float32
    inside a float64 module, the one place its code leaves the model's dtype); False leaves it as shipped.
    ``interleave`` is DeepSeek-V3's ``rope_interleave`` (V2 always pairs adjacent coordinates).
    """
    if version not in ("v2", "v3"):
        raise ValueError(f"version must be 'v2' or 'v3', got {version!r}")
    if not spec.causal:
        raise ValueError("the transformers DeepSeek attention is causal: use a spec with causal=True")
    if spec.qk_rope_head_dim == 0:
        raise ValueError("the transformers DeepSeek attention needs qk_rope_head_dim >= 2")
    common = dict(hidden_size=spec.d_model, num_attention_heads=spec.heads, num_key_value_heads=spec.heads,
                  q_lora_rank=spec.q_lora_rank, kv_lora_rank=spec.kv_lora_rank, qk_rope_head_dim=spec.qk_rope_head_dim,
                  qk_nope_head_dim=spec.qk_nope_head_dim, v_head_dim=spec.v_head_dim, head_dim=spec.qk_rope_head_dim,
                  num_hidden_layers=1, attention_bias=False, attn_implementation="sdpa",
                  rope_parameters={"rope_type": "default", "rope_theta": float(spec.rope_base)})
    if version == "v3":
        from transformers import DeepseekV3Config
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention
        module = DeepseekV3Attention(DeepseekV3Config(**common, rope_interleave=interleave), layer_idx=0)
    else:
        from transformers import DeepseekV2Config
        from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Attention
        module = DeepseekV2Attention(DeepseekV2Config(**common), layer_idx=0)
        interleave = True  # V2 rotates adjacent pairs as complex numbers
    module = module.to(torch.float64).eval()
    for norm in (module.kv_a_layernorm, module.q_a_layernorm):
        if norm is not None:
            norm.variance_epsilon = float(spec.norm_eps)
            if norm_in_float64:
                _hf_norm_float64(norm)
    layer = HFMLA(version, module, spec, interleave)
    gen = torch.Generator().manual_seed(seed)
    point = init_params(spec, gen)
    with torch.no_grad():
        for name, value in layer.from_attnid(point).items():
            dict(module.named_parameters())[name].copy_(value)
    return layer


def hf_nullity(spec: MLASpec, version: str = "v3", seed: int = 0, seq_len: int = 6, n_inputs: int | None = None,
               interleave: bool = True) -> RankDecision:
    """The numeric nullity of the transformers module's own Jacobian (float64 norms), by the library's rank rule.

    The rows come from ``n_inputs`` Gaussian inputs (default 1.5 P / (seq_len d_model) + 3), one sequence each.
    """
    from .jacobian import functional_rank

    layer = hf_module(spec, version, seed, interleave, norm_in_float64=True)
    weights = layer.weights()
    gen = torch.Generator().manual_seed(seed + 2)
    n = n_inputs or math.ceil(1.5 * count_parameters(weights) / (seq_len * spec.d_model)) + 3
    inputs = [torch.randn(1, seq_len, spec.d_model, generator=gen, dtype=torch.float64) for _ in range(n)]
    return functional_rank(layer.output, weights, inputs, mode="forward")


@dataclass(frozen=True)
class HFCrossCheck:
    """attnid's MLA layer against transformers' on the same weights (errors relative to the largest output)."""

    version: str
    spec: MLASpec
    same_function: float
    symmetry_change: float
    round_trip: float


def hf_cross_check(spec: MLASpec, version: str = "v3", seed: int = 0, seq_len: int = 7, interleave: bool = True,
                   norm_in_float64: bool = True) -> HFCrossCheck:
    """Same weights in both layers: max |Y_attnid - Y_transformers| / max |Y|, and the same after a random symmetry."""
    layer = hf_module(spec, version, seed, interleave, norm_in_float64)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(2, seq_len, spec.d_model, generator=gen, dtype=torch.float64)
    weights = layer.weights()
    y = layer.output(weights, x)
    scale = float(y.abs().max())
    params = layer.to_attnid(weights)
    back = layer.from_attnid(params)
    round_trip = max(float((back[k] - weights[k]).abs().max()) for k in weights)
    same = float((forward(params, x, spec) - y).abs().max()) / scale
    moved = apply_symmetry(params, spec, random_symmetry(spec, gen))
    change = float((layer.output(layer.from_attnid(moved), x) - y).abs().max()) / scale
    return HFCrossCheck(version, spec, same, change, round_trip)


# ---------------------------------------------------------------------------------------------- the family record


def _example() -> MLASpec:
    """A small latent layout with both latents and a rotated part, quick to verify."""
    return MLASpec(d_model=8, heads=2, kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2,
                   q_lora_rank=4)


def _from_hf_config(cfg: Mapping[str, Any]) -> tuple[MLASpec, dict[str, str]]:
    return MLASpec.from_hf_config(cfg)


FAMILY = Family(
    name="latent",
    layout=MLASpec,
    proofs=("thm-mla-symmetries", "prop-mla-count", "prop-mla-weak"),
    parameter_shapes=parameter_shapes,
    init_params=init_params,
    forward=forward,
    count=count,
    tangent_basis=lambda params, spec: tangent_basis(params, spec).T,
    verify=verify,
    example=_example,
    from_hf_config=_from_hf_config,
)
