"""`CallSettings`: one checked attention call, everything but the tensors (what the API checks and the kernels read)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CallSettings:
    """What the kernels need to know besides the tensors."""

    causal: bool
    rope_dims: int  # r: rotated columns, even, 0 for no RoPE
    rope_base: float
    scale: float  # multiplies q k^T (1/sqrt(D) by default)
