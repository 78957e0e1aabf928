"""The PyTorch reference for `attnid.kernels.attention`: the same function, written like the equations.

Runs everywhere, differentiates in both modes (plain torch ops), and in float64 is the yardstick the
Triton kernels are tested against. Unlike the kernels it materialises the (N, N) score matrix.
"""

from __future__ import annotations

import torch

from ..normalise import attention_weights
from ..rope import apply_rope


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, rope_dims: int, rope_base: float,
    sink: torch.Tensor | None, scale: float,
) -> torch.Tensor:
    """softmax(rope(q) rope(k)^T scale [+ sink in the denominator]) v, head h reading k/v head h // (H/G).

    Half-precision inputs are computed in float32 and the result cast back; float32 and float64 stay as they are.
    """
    batch, heads, n, d = q.shape
    kv_heads, dtype = k.shape[1], q.dtype
    work = q.dtype if q.dtype in (torch.float32, torch.float64) else torch.float32
    q, k, v = q.to(work), k.to(work), v.to(work)
    q, k = apply_rope(q, rope_dims, rope_base), apply_rope(k, rope_dims, rope_base)
    # (B, G, H/G, N, D): the query heads of one group side by side, broadcast against their k/v head.
    q = q.reshape(batch, kv_heads, heads // kv_heads, n, d)
    scores = q @ k[:, :, None].transpose(-1, -2) * scale
    logits = None if sink is None else sink.to(work).reshape(kv_heads, heads // kv_heads)
    weights = attention_weights(scores, norm="softmax" if sink is None else "sink", causal=causal, sink=logits)
    out = weights @ v[:, :, None]
    return out.reshape(batch, heads, n, v.shape[-1]).to(dtype)
