"""`attention`: checks its inputs, picks a backend, and wires the Triton kernels into autograd.

Four custom operators wrap the kernel launches (forward, forward-mode tangent, backward, and the
backward's own tangent). Each has a vmap rule that folds the vmapped dimension into the batch
dimension, so `torch.func.vmap`, `jacfwd` and `jacrev` reach the kernels as one launch.
`_FlashAttention` (an autograd.Function) supplies the derivatives: `backward` for reverse mode,
`jvp` for forward mode (the fused tangent kernel), and lets torch generate its vmap rule from those
operators. Its backward is a function of its own, `_FlashBackward`, so that `torch.func.grad`
composes, and `_FlashBackward` has derivatives of its own from the fused kernels, in O(B H N)
memory like the first order: its forward-mode tangent (`jvp(grad(f))`, `hessian`) is the backward
kernels run with TANGENT, and its reverse mode (double backward) is the same launch along the
cotangent plus one tangent pass, by the symmetry of the Hessian. Third derivatives are not
provided: the launches that only second order uses run inside `_Terminal`, whose own derivatives
raise NotImplementedError (a custom operator alone would pass for a constant under forward mode).
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch

from attnid.kernels.settings import CallSettings
from attnid.kernels.reference import reference_attention
from attnid.kernels.arguments import check_inputs, check_masks

BACKENDS = ("auto", "triton", "reference")
TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256


def choose_backend(backend: str, q: torch.Tensor, v: torch.Tensor) -> str:
    """'triton' or 'reference'; raise if 'triton' is asked for where it cannot run."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    if backend == "auto":
        return "triton" if q.is_cuda else "reference"
    if backend == "reference":
        return backend
    if q.dtype not in TRITON_DTYPES:
        raise TypeError(f"backend='triton' takes float16, bfloat16 or float32; got {q.dtype} (use backend='reference')")
    for name, width in (("q/k", q.shape[-1]), ("v", v.shape[-1])):
        if not MIN_HEAD_DIM <= width <= MAX_HEAD_DIM:
            raise ValueError(f"backend='triton' takes head widths {MIN_HEAD_DIM} to {MAX_HEAD_DIM}; {name} has {width}")
    if not q.is_cuda:
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(
                f"backend='triton' needs a CUDA tensor (got one on {q.device}); on a CPU set TRITON_INTERPRET=1 "
                "before importing attnid.kernels to run the kernels in Triton's interpreter"
            )
        if q.dtype != torch.float32:
            raise TypeError(f"Triton's CPU interpreter runs float32 only; got {q.dtype}")
    return "triton"


# ------------------------------------------------------------------------------------------------
# Custom operators around the launches, with vmap rules
# ------------------------------------------------------------------------------------------------


def _flash():
    """The kernels' launchers, imported on first use so that TRITON_INTERPRET is read as late as possible."""
    from attnid.kernels import flash, launch

    if not flash.INTERPRETED and not torch.cuda.is_available():
        raise RuntimeError("attnid.kernels.flash was imported without TRITON_INTERPRET=1 on a machine without CUDA")
    return launch


def _dense(t: torch.Tensor | None) -> torch.Tensor | None:
    """A contiguous copy where needed: the kernels read every tensor by offset from its first element
    (a column slice or an expanded sink would be read past its end)."""
    return None if t is None else t.contiguous()


def _settings(causal: bool, rope_dims: int, rope_base: float, scale: float) -> CallSettings:
    """The record the kernels read, rebuilt from a custom operator's plain arguments."""
    return CallSettings(causal, rope_dims, rope_base, scale)


@torch.library.custom_op("attnid::flash_forward", mutates_args=())
def flash_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sink: torch.Tensor | None, mask: torch.Tensor | None, lengths: torch.Tensor | None,
    causal: bool, rope_dims: int, rope_base: float, scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) from the Triton forward kernel."""
    out, lse, _, _ = _flash().forward(q.contiguous(), k.contiguous(), v.contiguous(), _dense(sink),
                                      _settings(causal, rope_dims, rope_base, scale), None, mask, _dense(lengths))
    return out, lse


@torch.library.custom_op("attnid::flash_tangent", mutates_args=())
def flash_tangent(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sink: torch.Tensor | None, mask: torch.Tensor | None, lengths: torch.Tensor | None,
    tq: torch.Tensor, tk: torch.Tensor, tv: torch.Tensor,
    causal: bool, rope_dims: int, rope_base: float, scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, tangent of out, lse, tangent of lse) in one fused pass, for tangents (tq, tk, tv) of (q, k, v)."""
    tangents = (tq.contiguous(), tk.contiguous(), tv.contiguous())
    out, lse, t_out, t_lse = _flash().forward(q.contiguous(), k.contiguous(), v.contiguous(), _dense(sink),
                                              _settings(causal, rope_dims, rope_base, scale), tangents, mask,
                                              _dense(lengths))
    return out, t_out, lse, t_lse


@torch.library.custom_op("attnid::flash_backward", mutates_args=())
def flash_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, d_out: torch.Tensor,
    mask: torch.Tensor | None, lengths: torch.Tensor | None, causal: bool, rope_dims: int, rope_base: float, scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, delta) from the Triton backward kernels; delta = rowsum(d_out * out)."""
    return _flash().backward(q.contiguous(), k.contiguous(), v.contiguous(), out.contiguous(), lse.contiguous(),
                             d_out.contiguous(), _settings(causal, rope_dims, rope_base, scale), None, mask,
                             _dense(lengths))


@torch.library.custom_op("attnid::flash_backward_tangent", mutates_args=())
def flash_backward_tangent(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, d_out: torch.Tensor,
    tq: torch.Tensor, tk: torch.Tensor, tv: torch.Tensor, t_dout: torch.Tensor, t_lse: torch.Tensor,
    t_out: torch.Tensor, mask: torch.Tensor | None, lengths: torch.Tensor | None, causal: bool, rope_dims: int, rope_base: float, scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, delta) and their tangents along (tq, tk, tv, t_dout), from one fused pass of the backward kernels.

    t_lse and t_out are the forward pass's tangents along (tq, tk, tv) (and the sink's, ``_forward_tangent``).
    """
    tangents = tuple(t.contiguous() for t in (tq, tk, tv, t_dout, t_lse, t_out))
    return _flash().backward(q.contiguous(), k.contiguous(), v.contiguous(), out.contiguous(), lse.contiguous(),
                             d_out.contiguous(), _settings(causal, rope_dims, rope_base, scale), tangents, mask,
                             _dense(lengths))


@flash_forward.register_fake
def _(q, k, v, sink, mask, lengths, causal, rope_dims, rope_base, scale):
    return q.new_empty((*q.shape[:3], v.shape[-1])), q.new_empty(q.shape[:3], dtype=torch.float32)


@flash_tangent.register_fake
def _(q, k, v, sink, mask, lengths, tq, tk, tv, causal, rope_dims, rope_base, scale):
    out = q.new_empty((*q.shape[:3], v.shape[-1]))
    lse = q.new_empty(q.shape[:3], dtype=torch.float32)
    return out, torch.empty_like(out), lse, torch.empty_like(lse)


@flash_backward.register_fake
def _(q, k, v, out, lse, d_out, mask, lengths, causal, rope_dims, rope_base, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(lse)


@flash_backward_tangent.register_fake
def _(q, k, v, out, lse, d_out, tq, tk, tv, t_dout, t_lse, t_out, mask, lengths, causal, rope_dims, rope_base, scale):
    first = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(lse))
    return first + tuple(torch.empty_like(x) for x in first)


def _fold_vmap(op: Callable) -> Callable:
    """A vmap rule for an operator whose tensors all lead with the batch dimension B, except the sink (H,).

    The vmapped dimension (size T) is folded into B: batched tensors are moved to the front and
    merged (T*B), unbatched ones are expanded to match. If the sink itself is vmapped it cannot be
    folded; the rule then loops over T.
    """

    def rule(info: Any, in_dims: tuple, *args: Any) -> tuple[tuple[torch.Tensor, ...], tuple[int, ...]]:
        size = info.batch_size
        # a batched tensor arrives with its vmapped dimension: its own rank is one less
        rank = [a.dim() - (d is not None) if isinstance(a, torch.Tensor) else -1 for a, d in zip(args, in_dims, strict=True)]
        if any(r == 1 and d is not None for r, d in zip(rank, in_dims, strict=True)):  # a vmapped sink
            slices = [op(*[a.select(d, i) if d is not None else a for a, d in zip(args, in_dims, strict=True)])
                      for i in range(size)]
            return tuple(torch.stack(parts) for parts in zip(*slices, strict=True)), (0,) * len(slices[0])
        folded = []
        for a, d, r in zip(args, in_dims, rank, strict=True):
            if r > 1:
                a = a.movedim(d, 0) if d is not None else a.expand(size, *a.shape)
                a = a.reshape(size * a.shape[1], *a.shape[2:])
            folded.append(a)
        outputs = op(*folded)
        return tuple(o.reshape(size, -1, *o.shape[1:]) for o in outputs), (0,) * len(outputs)

    return rule


for _op in (flash_forward, flash_tangent, flash_backward, flash_backward_tangent):
    torch.library.register_vmap(_op, _fold_vmap(_op))


class _Terminal(torch.autograd.Function):
    """One launch whose own derivatives the kernels do not provide: it runs, and differentiating it raises.

    Without this wrapper a custom operator with no autograd formula is treated as a constant by forward-mode
    AD, so a third derivative (or a tangent of the tangent pass) would silently come out as zero.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(what: str, op: Callable, *args: Any) -> Any:  # type: ignore[override]
        return op(*args)

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[override]
        ctx.what = inputs[0]

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        raise NotImplementedError(_not_provided(ctx.what))

    @staticmethod
    def jvp(ctx, *tangents):  # type: ignore[override]
        raise NotImplementedError(_not_provided(ctx.what))


def _not_provided(what: str) -> str:
    return (f"attnid.kernels: the {what} has no derivative of its own in the Triton kernels (they provide first "
            "and second order: grad, jvp, hessian, jvp(grad), double backward). For third derivatives, or a "
            "derivative of a forward-mode tangent, use backend='reference'.")


def _refuse_mask_tangent(t_mask: torch.Tensor | None) -> None:
    """The kernels hold the mask constant: a tangent along it would silently count as zero, so it is an error."""
    if t_mask is not None:
        raise ValueError("the kernels take the mask as a constant and give no derivative along it (here a "
                         "forward-mode tangent); use backend='reference' to differentiate an additive mask")


class _FlashAttention(torch.autograd.Function):
    """out, lse = attention(q, k, v, sink); reverse mode through the backward kernels, forward mode through the tangent kernel."""

    generate_vmap_rule = True

    @staticmethod
    def forward(q, k, v, sink, mask, lengths, settings: CallSettings):  # type: ignore[override]
        p = settings
        return flash_forward(q, k, v, sink, mask, lengths, p.causal, p.rope_dims, p.rope_base, p.scale)

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[override]
        q, k, v, sink, mask, lengths, settings = inputs
        out, lse = output
        ctx.settings = settings
        ctx.set_materialize_grads(False)  # an input without a tangent (a constant mask) gives None, not zeros
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(q, k, v, sink, mask, lengths, out, lse)
        ctx.save_for_forward(q, k, v, sink, mask, lengths, out, lse)

    @staticmethod
    def backward(ctx, d_out, _d_lse):  # type: ignore[override]
        if d_out is None:  # the output took no part in the loss (grads are not materialised)
            return None, None, None, None, None, None, None
        q, k, v, sink, mask, lengths, out, lse = ctx.saved_tensors
        dq, dk, dv, d_sink = _FlashBackward.apply(q, k, v, sink, mask, lengths, d_out, out.detach(), lse.detach(),
                                                  ctx.settings)
        return dq, dk, dv, d_sink if sink is not None and ctx.needs_input_grad[3] else None, None, None, None

    @staticmethod
    def jvp(ctx, tq, tk, tv, t_sink, t_mask, _t_lengths, _settings):  # type: ignore[override]
        _refuse_mask_tangent(t_mask)
        q, k, v, sink, mask, lengths, _out, _lse = ctx.saved_tensors
        _, t_out, _, _ = _forward_tangent(q, k, v, sink, (mask, lengths), (tq, tk, tv, t_sink), ctx.settings)
        return t_out, None


class _FlashBackward(torch.autograd.Function):
    """(dq, dk, dv, d_sink) = the vector-Jacobian product of attention with d_out, by the Triton backward kernels.

    It is a function of (q, k, v, sink, d_out) of its own, so that every torch.func transform composes with
    ``_FlashAttention`` (``grad``, ``vmap(grad)``, ``jacrev``). Its own derivatives, which second-order use needs
    (``hessian``, ``jvp(grad(f))``, double backward), come from the fused kernels too (``_backward_tangent``):
    the forward-mode tangent of this map is the backward kernels run with TANGENT after one tangent pass of the
    forward kernel, in the same O(B H N) memory as the first order. ``out`` and ``lse`` are the forward pass's
    results, passed detached; the tangent pass recomputes them with their tangents.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(q, k, v, sink, mask, lengths, d_out, out, lse, settings: CallSettings):  # type: ignore[override]
        p = settings
        dq, dk, dv, delta = flash_backward(q, k, v, out, lse, d_out, mask, lengths, p.causal, p.rope_dims,
                                           p.rope_base, p.scale)
        # d out_i / d sink = -p_sink_i out_i, so dL/dsink_h = -sum_{b,i} p_sink_i delta_i
        d_sink = None if sink is None else -(_sink_weight(sink, lse) * delta).sum(dim=(0, 2)).to(sink.dtype)
        return dq, dk, dv, d_sink

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[override]
        q, k, v, sink, mask, lengths, d_out, _out, _lse, settings = inputs
        ctx.settings = settings
        ctx.set_materialize_grads(False)  # as in _FlashAttention: no zeros made up for a constant mask
        ctx.save_for_backward(q, k, v, sink, mask, lengths, d_out)
        ctx.save_for_forward(q, k, v, sink, mask, lengths, d_out)

    @staticmethod
    def backward(ctx, g_dq, g_dk, g_dv, g_sink):  # type: ignore[override]
        # The Hessian of <d_out, attention> is symmetric, so the cotangent's pull-back onto (q, k, v, sink) is the
        # tangent of this map along the cotangent itself with d_out held fixed; onto d_out it is the forward
        # pass's tangent along the cotangent.
        q, k, v, sink, mask, lengths, d_out = ctx.saved_tensors
        along = (g_dq, g_dk, g_dv, g_sink if sink is not None else None)
        if all(g is None for g in along):  # no part of (dq, dk, dv, d_sink) took part in the loss
            return (None,) * 10
        grads, t_out = _backward_tangent(q, k, v, sink, (mask, lengths), d_out, along, None, ctx.settings)
        return grads[0], grads[1], grads[2], grads[3], None, None, t_out, None, None, None

    @staticmethod
    def jvp(ctx, tq, tk, tv, t_sink, t_mask, _t_lengths, t_dout, _t_out, _t_lse, _settings):  # type: ignore[override]
        _refuse_mask_tangent(t_mask)
        q, k, v, sink, mask, lengths, d_out = ctx.saved_tensors
        grads, _ = _backward_tangent(q, k, v, sink, (mask, lengths), d_out, (tq, tk, tv, t_sink), t_dout, ctx.settings)
        return grads


def _forward_tangent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sink: torch.Tensor | None,
                     masks: tuple[torch.Tensor | None, torch.Tensor | None], along: tuple[torch.Tensor | None, ...],
                     p: CallSettings
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, t_out, lse, t_lse) along (tq, tk, tv, t_sink) (None: zero): the tangent kernel, plus the sink's part.

    A sink logit enters only the denominator: d lse / d sink = p_sink and d out / d sink = -p_sink out.
    """
    tq, tk, tv, t_sink = along
    tq, tk, tv = (torch.zeros_like(x) if t is None else t for x, t in ((q, tq), (k, tk), (v, tv)))
    out, t_out, lse, t_lse = _Terminal.apply("forward-mode tangent", flash_tangent, q, k, v, sink, *masks, tq, tk, tv,
                                             p.causal, p.rope_dims, p.rope_base, p.scale)
    if sink is not None and t_sink is not None:
        weight = _sink_weight(sink, lse)
        t_lse = t_lse + weight * t_sink.float()[:, None]
        t_out = t_out - (weight[..., None] * out * t_sink[:, None, None]).to(t_out.dtype)
    return out, t_out, lse, t_lse


def _backward_tangent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sink: torch.Tensor | None,
                      masks: tuple[torch.Tensor | None, torch.Tensor | None], d_out: torch.Tensor,
                      along: tuple[torch.Tensor | None, ...], t_dout: torch.Tensor | None,
                      p: CallSettings) -> tuple[tuple[torch.Tensor | None, ...], torch.Tensor]:
    """((t_dq, t_dk, t_dv, t_dsink), t_out): the tangent of (dq, dk, dv, d_sink) along (tq, tk, tv, t_sink) and
    t_dout (None: zero), and the forward pass's output tangent along (tq, tk, tv, t_sink), by the fused kernels."""
    tq, tk, tv, t_sink = along
    out, t_out, lse, t_lse = _forward_tangent(q, k, v, sink, masks, along, p)
    tq, tk, tv = (torch.zeros_like(x) if t is None else t for x, t in ((q, tq), (k, tk), (v, tv)))
    t_dout = torch.zeros_like(d_out) if t_dout is None else t_dout
    *_, delta, t_dq, t_dk, t_dv, t_delta = _Terminal.apply(
        "second-order pass", flash_backward_tangent, q, k, v, out, lse, d_out, tq, tk, tv, t_dout, t_lse, t_out,
        *masks, p.causal, p.rope_dims, p.rope_base, p.scale)
    t_dsink = None
    if sink is not None:
        weight = _sink_weight(sink, lse)  # d_sink = -sum p_sink delta; p_sink moves by p_sink (t_sink - t_lse)
        t_weight = weight * ((0.0 if t_sink is None else t_sink.float()[:, None]) - t_lse)
        t_dsink = -(t_weight * delta + weight * t_delta).sum(dim=(0, 2)).to(sink.dtype)
    return (t_dq, t_dk, t_dv, t_dsink), t_out


def _sink_weight(sink: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """The sink's share of each row's denominator, exp(sink_h - lse) of shape (B, H, N)."""
    return torch.exp(sink.float()[:, None] - lse)


# ------------------------------------------------------------------------------------------------
# Public functions
# ------------------------------------------------------------------------------------------------


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, rope_fraction: float = 0.0,
    rope_base: float = 10000.0, sink: torch.Tensor | None = None, scale: float | None = None, backend: str = "auto",
    mask: torch.Tensor | None = None, key_lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """Multi-head attention with GQA, RoPE, an optional sink and masks; returns (B, H, N_q, Dv).

    q (B, H, N_q, D), k (B, G, N_k, D), v (B, G, N_k, Dv), G dividing H; query head h uses key/value head
    h // (H / G). N_q may differ from N_k (cross-attention, decoding against a cache): the queries are
    aligned to the end of the keys, query i at position i + N_k - N_q, so with a causal mask it sees the
    keys j <= i + N_k - N_q, as FlashAttention does (a causal mask or RoPE then needs N_q <= N_k).
    RoPE rotates the first r = rope_fraction * D columns of q and k (rotate-half, keys at positions
    0..N_k-1, frequencies rope_base^(-2i/r)). `sink` (H,) adds exp(sink_h) to each row's
    softmax denominator. `scale` defaults to 1/sqrt(D). backend: 'triton' (CUDA, or the CPU
    interpreter under TRITON_INTERPRET=1), 'reference' (PyTorch), 'auto' (Triton on CUDA tensors).
    `mask` (boolean, True where a pair takes part, or additive, broadcasting to (B, H, N_q, N_k)) and
    `key_lengths` (B,) (row b sees its first key_lengths[b] keys) hide pairs on top of the causal mask; a
    query row left with no key (and no sink) returns zeros. On Triton the mask is a constant: a mask that
    requires a gradient or carries a forward-mode tangent is refused (the reference differentiates an
    additive mask).
    Differentiable in reverse mode (`backward`, `torch.func.grad`), forward mode (`torch.func.jvp`, `jacfwd`) and to
    second order (`hessian`, `jvp(grad(f))`, double backward), every order by the fused kernels in O(B H N) memory;
    not to third order.
    """
    settings = check_inputs(q, k, v, causal=causal, rope_fraction=rope_fraction, rope_base=rope_base, sink=sink, scale=scale)
    chosen = choose_backend(backend, q, v)
    additive, lengths = check_masks(mask, key_lengths, q, k, for_kernels=chosen == "triton")
    if chosen == "reference":  # the mask as given: boolean, or additive and differentiable
        return reference_attention(q, k, v, causal=settings.causal, rope_dims=settings.rope_dims,
                                   rope_base=settings.rope_base, sink=sink, scale=settings.scale, mask=mask,
                                   key_lengths=lengths)
    return _FlashAttention.apply(q, k, v, sink, additive, lengths, settings)[0]


def attention_jvp(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tq: torch.Tensor, tk: torch.Tensor, tv: torch.Tensor, *,
    causal: bool = False, rope_fraction: float = 0.0, rope_base: float = 10000.0, sink: torch.Tensor | None = None,
    scale: float | None = None, backend: str = "auto", mask: torch.Tensor | None = None,
    key_lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, tangent of out) for tangents (tq, tk, tv) shaped like (q, k, v): one fused pass on Triton."""
    settings = check_inputs(q, k, v, causal=causal, rope_fraction=rope_fraction, rope_base=rope_base, sink=sink, scale=scale)
    for name, t, x in (("tq", tq, q), ("tk", tk, k), ("tv", tv, v)):
        if not isinstance(t, torch.Tensor) or t.shape != x.shape or t.dtype != x.dtype or t.device != x.device:
            raise ValueError(f"{name} must match {name[1]} in shape, dtype and device ({tuple(x.shape)}, {x.dtype}, {x.device})")
    chosen = choose_backend(backend, q, v)
    additive, lengths = check_masks(mask, key_lengths, q, k, for_kernels=chosen == "triton")
    if chosen == "reference":
        # dense copies: forward-mode AD refuses a primal or tangent whose elements share memory (an expanded view)
        return torch.func.jvp(
            lambda a, b, c: reference_attention(a, b, c, causal=settings.causal, rope_dims=settings.rope_dims,
                                                rope_base=settings.rope_base, sink=sink, scale=settings.scale,
                                                mask=mask, key_lengths=lengths),
            tuple(x.contiguous() for x in (q, k, v)), tuple(t.contiguous() for t in (tq, tk, tv)),
        )
    out, t_out, _, _ = _Terminal.apply("forward-mode tangent", flash_tangent, q, k, v, sink, additive, lengths,
                                       tq, tk, tv, settings.causal, settings.rope_dims, settings.rope_base,
                                       settings.scale)
    return out, t_out
