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
from attnid.nullity import FamilyCheck, check_layout, checked_estimate
from attnid.spec import AttentionSpec
from attnid.budget import Estimate, default_seq_len


class OnMultiHead:
    """Mixin for a frozen dataclass with a ``base: AttentionSpec`` field."""

    base: AttentionSpec

    def _check_base(self) -> None:
        if not isinstance(self.base, AttentionSpec):
            raise TypeError(f"base must be an AttentionSpec, got {type(self.base).__name__}")

    def _check_position_base(self, feature: str) -> None:
        """The base of a layout whose ``feature`` adds position information to the scores: no RoPE, no QK-norm."""
        self._check_base()
        if self.base.rope_dims:
            raise ValueError(f"{feature} replaces the rotary embedding: give a layout without RoPE (rope_fraction 0)")
        if self.base.has_qk_norm:
            raise ValueError(f"{feature} with a QK-norm is not described here (no published model has both)")

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


def base_seq_len(spec: Any) -> int:
    """The tokens per input of a check on a layout built on a multi-head one: the multi-head default."""
    return default_seq_len(spec.base)


def base_checks(count: Callable[[Any], Count], init_params: Callable[..., Params], forward: Callable[..., torch.Tensor],
                tangent_basis: Callable[[Params, Any], torch.Tensor]) -> tuple[Callable[..., FamilyCheck],
                                                                             Callable[..., Estimate]]:
    """``verify`` and ``estimate`` of a family whose layouts add one feature to a multi-head ``base``.

    ``verify`` puts the exact count next to the float64 Jacobian's nullity at a seeded random point
    (``attnid.nullity.check_layout``), ``estimate`` predicts its peak memory; both read the input
    length from ``base_seq_len`` when ``seq_len`` is not given.
    """
    def verify(spec: Any, *, seed: int = 0, seq_len: int | None = None, n_inputs: int | None = None,
               max_rounds: int = 4, method: str = "auto", progress: bool = False,
               max_bytes: int | None = None) -> FamilyCheck:
        c = count(spec)
        return check_layout(spec, init_params=init_params, forward=forward, tangent_basis=tangent_basis,
                            exact=c.unidentified, total=c.total,
                            seq_len=base_seq_len(spec) if seq_len is None else seq_len, seed=seed,
                            n_inputs=n_inputs, max_rounds=max_rounds, method=method, progress=progress,
                            max_bytes=max_bytes)

    def estimate(spec: Any, seq_len: int | None = None, n_inputs: int | None = None, method: str = "auto") -> Estimate:
        return checked_estimate(count(spec).total, spec.d_model, base_seq_len(spec) if seq_len is None else seq_len,
                                n_inputs, method)

    return verify, estimate
