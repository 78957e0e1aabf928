"""The PyTorch reference for `attnid.kernels.attention`: the same function, written like the equations.

Runs everywhere, differentiates in both modes (plain torch ops), and in float64 is the yardstick the
Triton kernels are tested against. Unlike the kernels it materialises the (N_q, N_k) score matrix.
"""

from __future__ import annotations

import torch

from attnid.normalise import attention_weights, causal_mask
from attnid.rope import apply_rope


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, rope_dims: int, rope_base: float,
    sink: torch.Tensor | None, scale: float, mask: torch.Tensor | None = None,
    key_lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(rope(q) rope(k)^T scale [+ mask] [+ sink in the denominator]) v, head h reading k/v head h // (H/G).

    ``mask`` is boolean (True: the pair takes part) or additive, broadcasting to (B, H, N_q, N_k);
    ``key_lengths`` (B, 1) or (B,) hides the keys j >= key_lengths[b]. A row with no visible key and no
    sink gives zeros. Half-precision inputs are computed in float32 and the result cast back; float32 and
    float64 stay as they are.
    """
    batch, heads, n, d = q.shape
    kv_heads, n_k, dtype = k.shape[1], k.shape[2], q.dtype
    shift = n_k - n  # query i sits at position i + shift: the queries are aligned to the end of the keys
    work = q.dtype if q.dtype in (torch.float32, torch.float64) else torch.float32
    q, k, v = q.to(work), k.to(work), v.to(work)
    if shift > 0 and rope_dims:  # rotate at positions shift..n_k-1: pad in front, rotate, drop the padding
        q = apply_rope(torch.cat([q.new_zeros(batch, heads, shift, d), q], dim=2), rope_dims, rope_base)[:, :, shift:]
    else:
        q = apply_rope(q, rope_dims, rope_base)
    k = apply_rope(k, rope_dims, rope_base)
    # (B, G, H/G, N, D): the query heads of one group side by side, broadcast against their k/v head.
    q = q.reshape(batch, kv_heads, heads // kv_heads, n, d)
    scores = q @ k[:, :, None].transpose(-1, -2) * scale
    if mask is not None:  # (B, H, N_q, N_k) -> (B, G, H/G, N_q, N_k), like the scores
        full = mask.expand(batch, heads, n, n_k).reshape(batch, kv_heads, heads // kv_heads, n, n_k)
        scores = scores.masked_fill(~full, float("-inf")) if full.dtype == torch.bool else scores + full.to(work)
    if key_lengths is not None:
        padded = torch.arange(n_k, device=q.device) >= key_lengths.reshape(batch, 1, 1, 1, 1).to(q.device)
        scores = scores.masked_fill(padded, float("-inf"))
    empty = None
    if sink is None and (mask is not None or key_lengths is not None):
        visible_any = ~torch.isneginf(scores)
        if causal:  # the causal mask is applied by attention_weights, aligned to the end of the keys
            visible_any = visible_any & ~causal_mask(n, q.device, n_k)
        empty = ~visible_any.any(-1, keepdim=True)  # a row that sees nothing: zeros, and no NaN in its gradient
        scores = scores.masked_fill(empty, 0.0)
    logits = None if sink is None else sink.to(work).reshape(kv_heads, heads // kv_heads)
    weights = attention_weights(scores, norm="softmax" if sink is None else "sink", causal=causal, sink=logits)
    if empty is not None:
        weights = weights.masked_fill(empty, 0.0)
    out = weights @ v[:, :, None]
    return out.reshape(batch, heads, n, v.shape[-1]).to(dtype)
