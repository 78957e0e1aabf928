"""Launching the Triton kernels of ``attnid.kernels.flash``: tile sizes per kernel, width and dtype, the
RoPE tables, output buffers, and one ``forward`` and one ``backward`` that fill in every argument.

``check_hooks`` changes what a check needs without touching a kernel: outputs allocated full of NaN
(an element a kernel forgets to write cannot pass for a correct one) and forced tile sizes.
"""

from __future__ import annotations
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
import torch
import triton
from attnid.rope import rope_tables as reference_tables
from attnid.kernels.settings import CallSettings
from attnid.kernels.flash import _backward_dkdv_kernel, _backward_dq_kernel, _forward_kernel


@dataclass(frozen=True)
class CheckHooks:
    """What a check changes in the kernels: ``poison`` allocates every output full of NaN (an element a
    kernel forgets to write cannot pass for a correct one); ``block`` forces (BLOCK_M, BLOCK_N) tiles."""

    poison: bool = False
    block: tuple[int, int] | None = None


BackwardTangents = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
_hooks = CheckHooks()  # set only through check_hooks


@contextlib.contextmanager
def check_hooks(*, poison: bool = False, block: tuple[int, int] | None = None) -> Iterator[CheckHooks]:
    """Run the kernels with these check hooks inside the block (every thread, backward passes included)."""
    global _hooks
    previous, _hooks = _hooks, CheckHooks(poison, block)
    try:
        yield _hooks
    finally:
        _hooks = previous


_TABLES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def rope_tables(n: int, rope_dims: int, base: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos/sin (n, R), computed in float64 by the reference's formula; cached per shape."""
    key = (n, rope_dims, base, str(device))
    if key not in _TABLES:
        if rope_dims == 0:
            empty = torch.ones(1, dtype=torch.float32, device=device)
            _TABLES[key] = (empty, empty)
        else:
            cos, sin = reference_tables(n, rope_dims, base, torch.float64, device)
            _TABLES[key] = (cos.float().contiguous(), sin.float().contiguous())
    return _TABLES[key]


# (BLOCK_M, BLOCK_N, num_warps, num_stages) per kernel and largest head width. Chosen so that every
# kernel fits the 227 KiB of shared memory an H100/H200 block may use, as checked by compiling for
# sm_90 without a GPU (scripts/check_kernels.py, run by the tests). Speed on a GPU is unmeasured.
TILES: dict[str, dict[int, tuple[int, int, int, int]]] = {
    "forward": {64: (128, 64, 4, 3), 128: (128, 64, 4, 3), 256: (128, 32, 8, 3)},
    "tangent": {64: (128, 64, 8, 3), 128: (128, 32, 8, 2), 256: (64, 32, 4, 2)},
    "dkdv": {64: (32, 128, 8, 3), 128: (32, 128, 8, 3), 256: (32, 128, 8, 2)},
    "dq": {64: (128, 32, 8, 3), 128: (128, 32, 8, 3), 256: (128, 32, 8, 2)},
    "dkdv_tangent": {64: (32, 64, 8, 2), 128: (32, 64, 8, 2), 256: (16, 64, 8, 1)},
    "dq_tangent": {64: (64, 32, 8, 2), 128: (64, 32, 8, 2), 256: (32, 32, 8, 1)},
}


# float32 tiles take twice the bytes: smaller tiles and fewer stages.
TILES_FP32: dict[str, dict[int, tuple[int, int, int, int]]] = {
    "forward": {64: (128, 64, 4, 3), 128: (64, 32, 4, 2), 256: (32, 32, 4, 1)},
    "tangent": {64: (64, 32, 4, 2), 128: (64, 32, 4, 1), 256: (32, 16, 4, 1)},
    "dkdv": {64: (32, 128, 8, 3), 128: (32, 64, 4, 2), 256: (16, 64, 4, 1)},
    "dq": {64: (128, 32, 8, 3), 128: (64, 32, 4, 2), 256: (32, 32, 4, 1)},
    "dkdv_tangent": {64: (32, 64, 4, 2), 128: (16, 64, 4, 1), 256: (16, 32, 4, 1)},
    "dq_tangent": {64: (64, 32, 4, 2), 128: (32, 32, 4, 1), 256: (16, 32, 4, 1)},
}


def tiles(kind: str, width: int, dtype_bytes: int = 2, masked: bool = False) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) of kernel `kind` for head width `width` (16 to 256).

    With a mask (``masked``) each stage also holds a float32 mask tile: one pipeline stage fewer.
    """
    limit = next(w for w in sorted(TILES[kind]) if width <= w)
    block_m, block_n, warps, stages = (TILES_FP32 if dtype_bytes == 4 else TILES)[kind][limit]
    if masked:
        stages = max(1, stages - 1)
    if _hooks.block is not None:
        block_m, block_n = _hooks.block
    return block_m, block_n, warps, stages


def _new(shape: tuple[int, ...], like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    dtype = dtype or like.dtype
    if _hooks.poison:
        return torch.full(shape, float("nan"), dtype=dtype, device=like.device)
    return torch.empty(shape, dtype=dtype, device=like.device)


def _precision(dtype: torch.dtype) -> str | None:
    """IEEE float32 products for float32 inputs (no silent TF32); the hardware default otherwise."""
    return "ieee" if dtype == torch.float32 else None


def _shared_args(kind: str, q: torch.Tensor, v: torch.Tensor, settings: CallSettings, masked: bool = False) -> dict:
    d, dv = q.shape[-1], v.shape[-1]
    block_m, block_n, warps, stages = tiles(kind, max(d, dv), q.element_size(), masked)
    return dict(
        D=d, DV=dv, D_PAD=max(16, triton.next_power_of_2(d)), DV_PAD=max(16, triton.next_power_of_2(dv)),
        R=settings.rope_dims, CAUSAL=settings.causal, PRECISION=_precision(q.dtype), BLOCK_M=block_m, BLOCK_N=block_n,
        num_warps=warps, num_stages=stages,
    )


def _mask_args(mask: torch.Tensor | None, lengths: torch.Tensor | None, placeholder: torch.Tensor) -> tuple[list, dict]:
    """The mask and key-length pointers, the mask's four strides, and their flags, for any of the kernels.

    ``mask`` is an additive float32 tensor broadcast (stride 0) to (B, H, N_q, N_k); ``lengths`` int32 (B, 1).
    """
    strides = list(mask.stride()) if mask is not None else [0, 0, 0, 0]
    pointers = [mask if mask is not None else placeholder, lengths if lengths is not None else placeholder]
    return pointers + strides, dict(HAS_MASK=mask is not None, HAS_LENGTHS=lengths is not None)


def forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sink: torch.Tensor | None, settings: CallSettings,
    tangents: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    mask: torch.Tensor | None = None, lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(out, lse, tangent_out, tangent_lse): out (B, H, N, DV), lse (B, H, N) float32; the tangents if given.

    tangent_lse is the lse's tangent from the scores alone (a sink's own tangent is the caller's to add).
    ``mask`` (additive, float32, (B, H, N_q, N_k) with stride-0 broadcasts) and ``lengths`` (int32 (B, 1):
    the keys each batch row has) hide key positions; a row left with no key and no sink gets out = 0.
    """
    batch, heads, n, _ = q.shape
    kv_heads, n_k, dv = k.shape[1], k.shape[2], v.shape[-1]
    out = _new((batch, heads, n, dv), q)
    lse = _new((batch, heads, n), q, torch.float32)
    t_out = _new((batch, heads, n, dv), q) if tangents is not None else None
    t_lse = _new((batch, heads, n), q, torch.float32) if tangents is not None else None
    tq, tk, tv = tangents if tangents is not None else (q, k, v)  # placeholders, unused without TANGENT
    cos, sin = rope_tables(max(n, n_k), settings.rope_dims, settings.rope_base, q.device)
    args = _shared_args("tangent" if tangents is not None else "forward", q, v, settings, mask is not None)
    grid = (triton.cdiv(n, args["BLOCK_M"]), batch * heads)
    masking, flags = _mask_args(mask, lengths, lse)
    pointers, mask_strides = masking[:2], masking[2:]
    _forward_kernel[grid](
        q, k, v, tq, tk, tv, sink if sink is not None else lse, cos, sin, out,
        t_out if t_out is not None else out, lse, t_lse if t_lse is not None else lse, *pointers,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3], *mask_strides,
        n, n_k, heads, heads // kv_heads, settings.scale,
        HAS_SINK=sink is not None, TANGENT=tangents is not None, **flags, **args,
    )
    return out, lse, t_out, t_lse


def backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    d_out: torch.Tensor, settings: CallSettings, tangents: BackwardTangents | None = None,
    mask: torch.Tensor | None = None, lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """(dq, dk, dv, delta) with delta = rowsum(dO * O) (B, H, N), which the sink's gradient needs.

    With ``tangents`` = (tq, tk, tv, t_dO, t_lse, t_out) (the tangents of the inputs, of the output
    gradient, and of the forward pass's lse and output along them) the same launches also return the
    tangents of all four: (dq, dk, dv, delta, t_dq, t_dk, t_dv, t_delta), the fused second order.
    """
    batch, heads, n, _ = q.shape
    kv_heads, n_k = k.shape[1], k.shape[2]
    d_out = d_out.contiguous()
    delta = (d_out.float() * out.float()).sum(-1).contiguous()
    dq, dk, dv = _new(tuple(q.shape), q), _new(tuple(k.shape), k), _new(tuple(v.shape), v)
    if tangents is not None:
        tq, tk, tv, t_dout, t_lse, t_out = (t.contiguous() for t in tangents)
        t_delta = (t_dout.float() * out.float() + d_out.float() * t_out.float()).sum(-1).contiguous()
        t_dq, t_dk, t_dv = _new(tuple(q.shape), q), _new(tuple(k.shape), k), _new(tuple(v.shape), v)
    else:  # placeholders, unused without TANGENT
        tq, tk, tv, t_dout, t_lse, t_delta, t_dq, t_dk, t_dv = q, k, v, d_out, lse, delta, dq, dk, dv
    cos, sin = rope_tables(max(n, n_k), settings.rope_dims, settings.rope_base, q.device)
    # dq, dk, dv and their tangents are written with the strides of q, k, v: the caller passes contiguous inputs.
    masking, flags = _mask_args(mask, lengths, lse)
    pointers, mask_strides = masking[:2], masking[2:]
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *d_out.stride()[:3], *mask_strides)
    second = tangents is not None
    args = _shared_args("dkdv_tangent" if second else "dkdv", q, v, settings, mask is not None)
    grid_kv = (triton.cdiv(n_k, args["BLOCK_N"]), batch * kv_heads)
    _backward_dkdv_kernel[grid_kv](
        q, k, v, d_out, lse, delta, cos, sin, dk, dv, tq, tk, tv, t_dout, t_lse, t_delta, t_dk, t_dv, *pointers,
        *strides, n, n_k, heads, kv_heads, heads // kv_heads, settings.scale, TANGENT=second, **flags, **args,
    )
    args = _shared_args("dq_tangent" if second else "dq", q, v, settings, mask is not None)
    grid_q = (triton.cdiv(n, args["BLOCK_M"]), batch * heads)
    _backward_dq_kernel[grid_q](
        q, k, v, d_out, lse, delta, cos, sin, dq, tq, tk, tv, t_dout, t_lse, t_delta, t_dq, *pointers,
        *strides, n, n_k, heads, heads // kv_heads, settings.scale, TANGENT=second, **flags, **args,
    )
    if second:
        return dq, dk, dv, delta, t_dq, t_dk, t_dv, t_delta
    return dq, dk, dv, delta
