"""The attention families, and dispatch on a layout's type: ``count(layout)``, ``verify(layout)``, ...

Every consumer that takes a layout of any family (``census``, ``hfconfig``, the CLI) asks this
module, never a family's own functions. Adding a family means one module that builds its
``Family`` record (``attnid.layout``) and one line in ``LAYOUT_FAMILIES`` below.
"""

from __future__ import annotations

from typing import Any

import torch

from . import alibi, gated, mha, mla, relbias
from .layout import Count, Family, Layout, Params

LAYOUT_FAMILIES: tuple[Family, ...] = (
    mha.FAMILY,  # AttentionSpec: MHA, GQA, MQA, biases, RoPE, sinks, sigmoid, QK-norm, windows and chunks
    mla.FAMILY,  # MLASpec: multi-head latent attention (DeepSeek-V2/V3, Kimi K2)
    gated.FAMILY,  # GatedSpec: a multi-head layout with a sigmoid output gate per head or per value coordinate
    alibi.FAMILY,  # AlibiSpec: a multi-head layout without RoPE and with ALiBi's fixed position biases
    relbias.FAMILY,  # RelativeBiasSpec: a multi-head layout without RoPE and with T5's learned bucketed position bias
)


def family_of(layout: Any) -> Family:
    """The family whose layout type ``layout`` is; TypeError naming the known types otherwise."""
    for family in LAYOUT_FAMILIES:
        if isinstance(layout, family.layout):
            return family
    known = ", ".join(f.layout.__name__ for f in LAYOUT_FAMILIES)
    raise TypeError(f"not a layout of a known attention family: {type(layout).__name__} (known: {known})")


def family_named(name: str) -> Family:
    """The family called ``name`` ('multi-head', 'latent', 'output-gated', 'alibi', 'relative-bias')."""
    for family in LAYOUT_FAMILIES:
        if family.name == name:
            return family
    raise ValueError(f"unknown attention family {name!r}; known: {', '.join(f.name for f in LAYOUT_FAMILIES)}")


def count(layout: Layout) -> Count:
    """The exact count of a layout of any family."""
    return family_of(layout).count(layout)


def verify(layout: Layout, **options: Any) -> Any:
    """The family's numeric check (exact count next to the Jacobian's nullity at a random point)."""
    return family_of(layout).verify(layout, **options)


def parameter_shapes(layout: Layout) -> dict[str, tuple[int, ...]]:
    return family_of(layout).parameter_shapes(layout)


def init_params(layout: Layout, generator: torch.Generator, dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
    return family_of(layout).init_params(layout, generator, dtype)


def forward(params: Params, x: torch.Tensor, layout: Layout) -> torch.Tensor:
    return family_of(layout).forward(params, x, layout)


def tangent_basis(params: Params, layout: Layout) -> torch.Tensor:
    """(P, k): columns spanning the tangent space of the symmetry orbit at ``params``."""
    return family_of(layout).tangent_basis(params, layout)
