"""The reference latent-attention layer: parameter shapes, random points, the forward pass."""

from __future__ import annotations

import math

import torch

from attnid.layer import check_named_shapes
from attnid.normalise import attention_weights, rms_normalise
from attnid.rope import apply_rope
from attnid.spec import Params
from attnid.families.mla.spec import MLASpec

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
    check_named_shapes(params, parameter_shapes(spec), "the MLA layout")


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
