"""Rotary position embeddings (RoPE), rotate-half layout: the one implementation the layer and the kernels share.

Position p rotates the pair of columns (i, i + r/2) of a query or key by the angle
p * base^(-2i/r), i = 0..r/2-1, on the first r columns of the head; the other d_k - r
columns pass through unchanged. A leaf module: it imports nothing from ``attnid``.
"""

from __future__ import annotations

import torch


def rope_tables(n: int, rope_dims: int, base: float, dtype: torch.dtype, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape (n, r) for positions 0..n-1, frequencies base^(-2i/r), rotate-half layout.

    The angles are computed in float64 and only then cast, so every dtype sees the same table.
    """
    half = rope_dims // 2
    inv_freq = base ** (-torch.arange(half, dtype=torch.float64, device=device) * 2 / rope_dims)
    angles = torch.arange(n, dtype=torch.float64, device=device)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, rope_dims: int, base: float) -> torch.Tensor:
    """Rotate the first r columns of x (..., n, d_k): pair (i, i + r/2) of row p by angle p * base^(-2i/r)."""
    if rope_dims == 0:
        return x
    cos, sin = rope_tables(x.shape[-2], rope_dims, base, x.dtype, x.device)
    rot, rest = x[..., :rope_dims], x[..., rope_dims:]
    x1, x2 = rot[..., : rope_dims // 2], rot[..., rope_dims // 2 :]
    rotated = rot * cos + torch.cat([-x2, x1], dim=-1) * sin
    return torch.cat([rotated, rest], dim=-1)
