"""Attention weights from scores: the one implementation of the masks, softmax, the sink, sigmoid and RMSNorm.

    softmax:  A_ij = exp(S_ij) / sum_l exp(S_il)
    sink:     A_ij = exp(S_ij) / (exp(s_h) + sum_l exp(S_il))   (one logit s_h per head, denominator only)
    sigmoid:  A_ij = 1 / (1 + exp(-S_ij))

With a causal mask, keys j > i are removed from row i (weight exactly 0); a sliding window of
w keys (always causal) removes the keys j <= i - w as well, so row i sees i - w < j <= i; chunks
of c tokens (always causal) remove the keys of earlier chunks. The masks are boolean (True:
hidden); ``additive_mask`` turns one into the 0 / -inf form that transformers' modules and
PyTorch's ``scaled_dot_product_attention`` take. ``rms_normalise`` is the RMSNorm without its
weight that QK-norm and latent attention share. A leaf module: it imports nothing from ``attnid``.
"""

from __future__ import annotations

import math

import torch

NORMS: tuple[str, ...] = ("softmax", "sink", "sigmoid")


def causal_mask(n: int, device: torch.device | str, n_keys: int | None = None) -> torch.Tensor:
    """(n, n_keys) boolean, True where query i may not look: keys j > i + (n_keys - n).

    The queries are aligned to the end of the keys (the last query sees every key), as when n new tokens
    follow n_keys - n cached ones; ``n_keys`` defaults to n, the square mask above the diagonal.
    """
    n_keys = n if n_keys is None else n_keys
    return torch.ones(n, n_keys, dtype=torch.bool, device=device).triu(1 + n_keys - n)


def window_mask(n: int, window: int, device: torch.device | str) -> torch.Tensor:
    """(n, n) boolean, True where row i may not look: keys j > i, and keys j <= i - window."""
    offsets = torch.arange(n, device=device)[:, None] - torch.arange(n, device=device)[None, :]  # i - j
    return (offsets < 0) | (offsets >= window)


def chunk_mask(n: int, chunk: int, device: torch.device | str) -> torch.Tensor:
    """(n, n) boolean, True where row i may not look: keys j > i, and keys of an earlier chunk of ``chunk`` tokens."""
    i = torch.arange(n, device=device)
    return (i[None, :] > i[:, None]) | (i[None, :] // chunk != i[:, None] // chunk)


def additive_mask(hidden: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True: hidden) as scores to add: 0 where a key is seen, -inf where it is hidden."""
    return torch.zeros(hidden.shape, dtype=dtype, device=hidden.device).masked_fill(hidden, -math.inf)


def rms_normalise(z: torch.Tensor, eps: float, dims: int | tuple[int, ...] = -1) -> torch.Tensor:
    """z / sqrt(mean(z^2) + eps) over ``dims``: RMSNorm without its weight."""
    return z * torch.rsqrt(z.pow(2).mean(dim=dims, keepdim=True) + eps)


def attention_weights(scores: torch.Tensor, *, norm: str, causal: bool, sink: torch.Tensor | None = None,
                      window: int | None = None, chunk: int | None = None) -> torch.Tensor:
    """Scores (..., n, n_keys) -> weights of the same shape.

    A causal mask on rectangular scores aligns the queries to the end of the keys (``causal_mask``).
    ``sink`` holds one logit per score matrix, broadcastable to ``scores.shape[:-2]`` (for
    scores (..., H, n, n) a tensor of shape (H,)); with ``norm='sink'`` and no sink the logit is 0.
    ``window`` (with ``causal``): row i sees only the keys i - window < j <= i; ``chunk`` (with
    ``causal``): only the keys j <= i with floor(j / chunk) = floor(i / chunk).
    """
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {', '.join(NORMS)}; got {norm!r}")
    if (window is not None or chunk is not None) and not causal:
        raise ValueError("a sliding window or chunked attention needs causal=True")
    if window is not None:
        mask = window_mask(scores.shape[-1], window, scores.device)
    elif chunk is not None:
        mask = chunk_mask(scores.shape[-1], chunk, scores.device)
    else:
        mask = causal_mask(scores.shape[-2], scores.device, scores.shape[-1]) if causal else None
    if norm == "sigmoid":
        weights = torch.sigmoid(scores)
        return weights.masked_fill(mask, 0.0) if mask is not None else weights
    if mask is not None:
        scores = scores.masked_fill(mask, -math.inf)
    if norm == "softmax":
        return torch.softmax(scores, dim=-1)
    logit = scores.new_zeros(()) if sink is None else sink.to(scores.dtype)
    extra = logit.expand(scores.shape[:-2])[..., None, None].expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, extra], dim=-1), dim=-1)[..., :-1]
