"""The reference attention layer: parameters as named tensors, a pure forward function.

Shapes (per-head layout, so the code reads like the equations):

    W_Q (H, d, d_k)   W_K (G, d, d_k)   W_V (G, d, d_v)   W_O (H, d_v, d)
    b_Q (H, d_k)      b_K (G, d_k)      b_V (G, d_v)      b_O (d,)         sink (H,)
    q_norm, k_norm: (d_k,) with qk_norm 'shared'; (H, d_k) and (G, d_k) with 'per-head' or 'full';
                    none with 'unweighted'

    Q_h = X W_Q^h + b_Q^h,  K_g = X W_K^g + b_K^g,  V_g = X W_V^g + b_V^g
    QK-norm: each row q of Q_h <- q / sqrt(mean(q^2) + eps) * q_norm (mean over the head's d_k
             entries; with 'full' over all H d_k entries of the token), likewise K_g with k_norm
    Q_h, K_g <- RoPE on their first r dimensions (after the biases and the norm)
    S_h = Q_h K_{g(h)}^T / sqrt(d_k)            (causal: j > i masked; window w: also j <= i - w;
                                                 chunks of c: also the keys of earlier chunks)
    A_h = softmax(S_h) | exp(S_h) / (exp(sink_h) + sum_j exp(S_h)) | sigmoid(S_h)
    Y   = sum_h A_h V_{g(h)} W_O^h + b_O
"""

from __future__ import annotations

import math

import torch

from attnid.normalise import attention_weights, rms_normalise
from attnid.rope import apply_rope
from attnid.spec import AttentionSpec, Params


def parameter_shapes(spec: AttentionSpec) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter of the layout, in a fixed order."""
    d, h, g, dk, dv = spec.d_model, spec.heads, spec.kv_heads, spec.head_dim, spec.v_head_dim
    shapes: dict[str, tuple[int, ...]] = {"W_Q": (h, d, dk), "W_K": (g, d, dk), "W_V": (g, d, dv), "W_O": (h, dv, d)}
    for letter, name, shape in (("q", "b_Q", (h, dk)), ("k", "b_K", (g, dk)), ("v", "b_V", (g, dv)), ("o", "b_O", (d,))):
        if spec.has_bias(letter):
            shapes[name] = shape
    if spec.has_qk_norm and spec.qk_norm != "unweighted":
        shared = spec.qk_norm == "shared"
        shapes["q_norm"] = (dk,) if shared else (h, dk)
        shapes["k_norm"] = (dk,) if shared else (g, dk)
    if spec.sink_learned:
        shapes["sink"] = (h,)
    return shapes


def init_params(
    spec: AttentionSpec, generator: torch.Generator, dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu"
) -> dict[str, torch.Tensor]:
    """A generic random point: Gaussian weights scaled so scores and outputs are of order one.

    QK-norm weights are drawn around one (1 + 0.5 N(0, 1)), like a trained norm weight.
    """
    scale = {"W_Q": spec.d_model**-0.5, "W_K": spec.d_model**-0.5, "W_V": spec.d_model**-0.5,
             "W_O": (spec.heads * spec.v_head_dim) ** -0.5}
    centre = {"q_norm": 1.0, "k_norm": 1.0}
    params = {}
    for name, shape in parameter_shapes(spec).items():
        draw = torch.randn(shape, generator=generator, dtype=torch.float64) * scale.get(name, 0.5)
        if name in centre:
            draw = draw + centre[name]
        params[name] = draw.to(device=device, dtype=dtype)
    return params


def check_params(params: Params, spec: AttentionSpec) -> None:
    """Raise ValueError unless params has exactly the layout's names and shapes, all finite."""
    check_named_shapes(params, parameter_shapes(spec), "the layout")


def check_named_shapes(params: Params, shapes: dict[str, tuple[int, ...]], layout: str) -> None:
    """Raise ValueError unless params has exactly the names and shapes of ``shapes``, all finite.

    The check the multi-head and the MLA layers share; ``layout`` names the layout in the message.
    """
    if set(params) != set(shapes):
        missing, extra = sorted(set(shapes) - set(params)), sorted(set(params) - set(shapes))
        raise ValueError(f"parameters do not match {layout}: missing {missing}, unexpected {extra}")
    for name, shape in shapes.items():
        if tuple(params[name].shape) != shape:
            raise ValueError(f"{name} has shape {tuple(params[name].shape)}, the layout needs {shape}")
        if not torch.isfinite(params[name]).all():
            raise ValueError(f"{name} contains NaN or inf")


def _head_bias(params: Params, name: str) -> torch.Tensor | float:
    """A per-head bias (heads, width) shaped (heads, 1, width) to broadcast over tokens; 0 if absent."""
    bias = params.get(name)
    return 0.0 if bias is None else bias[:, None, :]


def qk_normalise(t: torch.Tensor, weight: torch.Tensor | None, spec: AttentionSpec) -> torch.Tensor:
    """The QK-norm of queries (..., H, n, d_k) or keys (..., G, n, d_k): RMSNorm with ``spec.qk_norm_eps``, times ``weight``.

    'shared' and 'per-head' take the mean square over each head's d_k entries; 'full' over all
    heads' entries of a token (the whole projection width, as OLMo-2 does before splitting heads).
    """
    dims = (-3, -1) if spec.qk_norm == "full" else (-1,)
    scaled = rms_normalise(t, spec.qk_norm_eps, dims)
    if weight is None:  # 'unweighted'
        return scaled
    return scaled * (weight if weight.ndim == 1 else weight[:, None, :])


def project(params: Params, x: torch.Tensor, spec: AttentionSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(Q, K, V) of X (..., n, d_model): shapes (..., H, n, d_k), (..., G, n, d_k), (..., G, n, d_v), QK-norm applied, before RoPE.

    Plain tensor arithmetic, so a complex X gives the formula's analytic continuation
    (``attnid.continuation``; the norm's mean square is the bilinear z^2).
    """
    q = torch.einsum("...nd,hdk->...hnk", x, params["W_Q"]) + _head_bias(params, "b_Q")
    k = torch.einsum("...nd,gdk->...gnk", x, params["W_K"]) + _head_bias(params, "b_K")
    v = torch.einsum("...nd,gdv->...gnv", x, params["W_V"]) + _head_bias(params, "b_V")
    if spec.has_qk_norm:
        q, k = qk_normalise(q, params.get("q_norm"), spec), qk_normalise(k, params.get("k_norm"), spec)
    return q, k, v


def forward(params: Params, x: torch.Tensor, spec: AttentionSpec, backend: str = "reference") -> torch.Tensor:
    """Y for X of shape (..., n, d_model): the layer's output, same leading shape.

    backend 'reference' computes it here, on any device and dtype; 'kernels' hands the
    attention itself (RoPE, GQA, causal mask, sink, softmax) to ``attnid.kernels.attention``,
    which runs the Triton kernels on CUDA (softmax and sink layouts, head widths 16 to 256).
    """
    if x.shape[-1] != spec.d_model:
        raise ValueError(f"input width {x.shape[-1]} does not match d_model {spec.d_model}")
    if backend not in ("reference", "kernels"):
        raise ValueError(f"backend must be 'reference' or 'kernels', got {backend!r}")
    q, k, v = project(params, x, spec)
    if backend == "kernels":
        mixed = _attention_kernels(q, k, v, params, spec)
    else:
        groups = torch.tensor([spec.group_of_head(h) for h in range(spec.heads)], device=x.device)
        q, k = apply_rope(q, spec.rope_dims, spec.rope_base), apply_rope(k, spec.rope_dims, spec.rope_base)
        k, v = k.index_select(-3, groups), v.index_select(-3, groups)  # share K/V heads by index
        scores = q @ k.transpose(-1, -2) / math.sqrt(spec.head_dim)
        weights = attention_weights(scores, norm=spec.norm, causal=spec.causal, sink=params.get("sink"),
                                    window=spec.window, chunk=spec.chunk)
        mixed = weights @ v
    return torch.einsum("...hnv,hvd->...nd", mixed, params["W_O"]) + params.get("b_O", 0.0)


def _attention_kernels(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: Params, spec: AttentionSpec) -> torch.Tensor:
    """The per-head mixtures A_h V_g(h), shape (..., H, n, d_v), from attnid.kernels."""
    from attnid.kernels import attention

    if spec.norm == "sigmoid":
        raise ValueError("backend='kernels' computes softmax attention (with or without a sink), not sigmoid")
    if spec.window is not None or spec.chunk is not None:
        raise ValueError("backend='kernels' has no sliding window or chunks; use backend='reference'")
    sink = params.get("sink")
    if spec.norm == "sink" and sink is None:
        sink = q.new_zeros(spec.heads)
    lead = q.shape[:-3]
    flat = [t.reshape(-1, *t.shape[-3:]) for t in (q, k, v)]
    mixed = attention(*flat, causal=spec.causal, rope_fraction=spec.rope_dims / spec.head_dim,
                      rope_base=spec.rope_base, sink=sink, scale=spec.head_dim**-0.5)
    return mixed.reshape(*lead, *mixed.shape[-3:])
