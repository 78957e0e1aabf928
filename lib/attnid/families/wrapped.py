"""Layouts that add one feature to a multi-head layout (an output gate, ALiBi, a relative bias): shared parts.

``OnMultiHead`` gives a layout class with a ``base: AttentionSpec`` field the width, head count and
mask of the ``Layout`` protocol from its base; the family module adds its own fields and ``describe``.
``offset_forward`` is the reference layer with additive score offsets per head and pair of positions;
``verify_on_base`` the numeric check of such a layout (``attnid.nullity``) at its base's default length.
"""

from __future__ import annotations

import math

import torch

from collections.abc import Callable
from typing import Any

from attnid import layer
from attnid.layout import Count, Params
from attnid.normalise import attention_weights
from attnid.nullity import FamilyCheck, check_layout
from attnid.spec import AttentionSpec
from attnid.verification import default_seq_len


class OnMultiHead:
    """Mixin for a frozen dataclass with a ``base: AttentionSpec`` field."""

    base: AttentionSpec

    def _check_base(self) -> None:
        if not isinstance(self.base, AttentionSpec):
            raise TypeError(f"base must be an AttentionSpec, got {type(self.base).__name__}")

    @property
    def d_model(self) -> int:
        return self.base.d_model

    @property
    def heads(self) -> int:
        return self.base.heads

    @property
    def causal(self) -> bool:
        return self.base.causal


def offset_forward(params: Params, x: torch.Tensor, base: AttentionSpec, offsets: torch.Tensor) -> torch.Tensor:
    """The layer of ``attnid.layer`` (no RoPE, no QK-norm) with ``offsets`` (H, n, n) added to the scores; X (..., n, d)."""
    q = torch.einsum("...nd,hdk->...hnk", x, params["W_Q"]) + layer._head_bias(params, "b_Q")
    k = torch.einsum("...nd,gdk->...gnk", x, params["W_K"]) + layer._head_bias(params, "b_K")
    v = torch.einsum("...nd,gdv->...gnv", x, params["W_V"]) + layer._head_bias(params, "b_V")
    groups = torch.tensor([base.group_of_head(h) for h in range(base.heads)], device=x.device)
    k, v = k.index_select(-3, groups), v.index_select(-3, groups)
    scores = q @ k.transpose(-1, -2) / math.sqrt(base.head_dim) + offsets
    weights = attention_weights(scores, norm=base.norm, causal=base.causal, sink=params.get("sink"),
                                window=base.window, chunk=base.chunk)
    return torch.einsum("...hnv,hvd->...nd", weights @ v, params["W_O"]) + params.get("b_O", 0.0)


def verify_on_base(spec: Any, count: Count, init_params: Callable[..., Params], forward: Callable[..., torch.Tensor],
                   tangent_basis: Callable[[Params, Any], torch.Tensor], *, seed: int, seq_len: int | None,
                   n_inputs: int | None, max_rounds: int) -> FamilyCheck:
    """The exact ``count`` of a layout on ``spec.base`` next to the float64 Jacobian's nullity at a seeded random point."""
    return check_layout(spec, init_params=init_params, forward=forward, tangent_basis=tangent_basis,
                        exact=count.unidentified, total=count.total,
                        seq_len=default_seq_len(spec.base) if seq_len is None else seq_len, seed=seed,
                        n_inputs=n_inputs, max_rounds=max_rounds)
