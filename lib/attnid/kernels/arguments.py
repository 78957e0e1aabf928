"""The checks every call of the attention kernels passes first: shapes, dtypes, devices, the settings
through the field schema (``attnid.fields``), and the masks (a boolean or additive mask, key lengths).
A bad argument is one ValueError or TypeError naming it, before anything is computed.
"""

from __future__ import annotations
import math
from typing import Any
import torch
from attnid.fields import check, rope_columns
from attnid.kernels.settings import CallSettings


def _shape(name: str, x: Any) -> tuple[int, int, int, int]:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 4:
        raise ValueError(f"{name} must have 4 dimensions (batch, heads, tokens, width); got shape {tuple(x.shape)}")
    return tuple(x.shape)  # type: ignore[return-value]


def check_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, rope_fraction: float, rope_base: float,
    sink: torch.Tensor | None, scale: float | None,
) -> CallSettings:
    """Raise TypeError/ValueError naming the bad argument; return the checked settings."""
    (b, h, n, d), (bk, g, nk, dk), (bv, gv, nv, _) = _shape("q", q), _shape("k", k), _shape("v", v)
    if (bk, dk) != (b, d):
        raise ValueError(f"k must have shape (B, G, N_k, D) = ({b}, G, N_k, {d}) to match q {tuple(q.shape)}; got {tuple(k.shape)}")
    if (bv, gv, nv) != (b, g, nk):
        raise ValueError(f"v must have shape (B, G, N_k, Dv) = ({b}, {g}, {nk}, Dv) to match k; got {tuple(v.shape)}")
    if h < 1 or g < 1 or h % g != 0:
        raise ValueError(f"the key/value heads G={g} must divide the query heads H={h}")
    if min(b, n, nk, d, v.shape[-1]) < 1:
        raise ValueError(f"empty input: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {x.dtype}, q has {q.dtype}: q, k and v must share one dtype")
        if x.device != q.device:
            raise ValueError(f"{name} is on {x.device}, q on {q.device}: q, k and v must share one device")
    if not q.dtype.is_floating_point:
        raise TypeError(f"q, k and v must be floating point, got {q.dtype}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    rope_dims = rope_columns(check("rope_fraction", rope_fraction), d)  # the field schema, as for every layout
    rope_base = check("rope_base", rope_base)
    if n > nk and (causal or rope_dims):
        raise ValueError(f"{n} queries against {nk} keys: the queries are aligned to the end of the keys (query i at "
                         f"position i + N_k - N_q), so a causal mask or RoPE needs N_q <= N_k")
    if sink is not None:
        if not isinstance(sink, torch.Tensor) or tuple(sink.shape) != (h,):
            raise ValueError(f"sink must be a tensor of shape (H,) = ({h},), one logit per query head; got {sink!r}")
        if sink.device != q.device or not sink.dtype.is_floating_point:
            raise ValueError(f"sink must be a floating tensor on {q.device}; got {sink.dtype} on {sink.device}")
    if isinstance(scale, bool):  # bool is an int subclass: True would pass as a scale of 1
        raise TypeError(f"scale must be a positive finite number or None (1/sqrt(D)), got {scale!r}")
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    return CallSettings(causal, rope_dims, float(rope_base), float(scale))


def check_masks(mask: Any, key_lengths: Any, q: torch.Tensor, k: torch.Tensor, *, for_kernels: bool = True
                ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(additive float32 mask broadcast to (B, H, N_q, N_k) or None, int32 key lengths (B, 1) or None), checked.

    ``mask``: boolean (True: the pair takes part) or floating (added to the scores; -inf hides), of any shape
    that broadcasts to (B, H, N_q, N_k). ``key_lengths``: integers (B,), each between 1 and N_k: batch row b
    sees only its first key_lengths[b] keys (a key padding mask). The kernels take the mask as a constant:
    for them (``for_kernels``) a mask that requires a gradient is refused here, since they give none, and one
    that carries a forward-mode tangent is refused by their ``jvp`` (it reaches them undetached for that).
    """
    (b, h, n_q, _), n_k = q.shape, k.shape[2]
    full = (b, h, n_q, n_k)
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or not (mask.dtype == torch.bool or mask.dtype.is_floating_point):
            raise TypeError(f"mask must be a boolean or floating tensor, got {mask!r:.80}")
        if mask.device != q.device:
            raise ValueError(f"mask is on {mask.device}, q on {q.device}")
        if mask.requires_grad and for_kernels:
            raise ValueError("the kernels take the mask as a constant and give no gradient for it; "
                             "use backend='reference' to differentiate an additive mask")
        try:
            if torch.broadcast_shapes(tuple(mask.shape), full) != full:
                raise RuntimeError
        except RuntimeError:
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to (B, H, N_q, N_k) = {full}") from None
        if mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=torch.float32, device=q.device).masked_fill(~mask, float("-inf"))
        mask = mask.float().expand(full)
    if key_lengths is not None:
        if not isinstance(key_lengths, torch.Tensor) or key_lengths.dtype.is_floating_point or key_lengths.dtype == torch.bool:
            raise TypeError(f"key_lengths must be an integer tensor of shape (B,) = ({b},), got {key_lengths!r:.80}")
        if tuple(key_lengths.shape) != (b,) or key_lengths.device != q.device:
            raise ValueError(f"key_lengths must have shape (B,) = ({b},) on {q.device}; got {tuple(key_lengths.shape)} "
                             f"on {key_lengths.device}")
        if b and (int(key_lengths.min()) < 1 or int(key_lengths.max()) > n_k):
            raise ValueError(f"key_lengths must lie between 1 and N_k = {n_k}; got {key_lengths.tolist()[:8]}")
        key_lengths = key_lengths.to(torch.int32).reshape(b, 1).contiguous()
    return mask, key_lengths
