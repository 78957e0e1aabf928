"""The attention families, and dispatch on a layout's type: ``count(layout)``, ``verify(layout)``, ...

These are the library's front door: ``attnid.count``, ``attnid.verify``, ``attnid.forward`` and
``attnid.init_params`` are the functions below, so they take a layout of every family. ``verify``
takes the same options on every route (seed, input size, method, progress, a memory limit checked
against the family's own ``estimate`` before anything is allocated) and returns a
``attnid.layout.VerificationResult``.

Every consumer that takes a layout of any family (``census``, ``hfconfig``, the CLI) asks this
module, never a family's own functions. Adding a family means one module that defines the
functions the ``Family`` record (``attnid.layout``) holds, under the names in ``PROTOCOL`` (and
``from_hf_config`` when it reads configs itself), and one line in ``LAYOUT_FAMILIES`` below that
names the family, its layout type and the book's statements that prove its count.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import torch

from attnid.families import alibi, gated, mha, mla, relbias
from attnid.budget import Estimate
from attnid.layout import Count, Family, Layout, Params, VerificationResult

PROTOCOL = ("parameter_shapes", "init_params", "forward", "count", "tangent_basis", "verify", "example", "estimate",
            "default_seq_len")


def from_module(module: ModuleType, name: str, layout: type, proofs: Sequence[str], **functions: Any) -> Family:
    """The record of the family ``module`` implements: its functions named in ``PROTOCOL`` (``functions``
    overrides one where the module's own name means something else) and its ``from_hf_config``, if any."""
    found = {f: functions.get(f, getattr(module, f, None)) for f in PROTOCOL}
    missing = [f for f, fn in found.items() if not callable(fn)]
    if missing:
        raise TypeError(f"{module.__name__} does not define {', '.join(missing)} (the Family protocol)")
    return Family(name=name, layout=layout, proofs=tuple(proofs), **found,
                  from_hf_config=functions.get("from_hf_config", getattr(module, "from_hf_config", None)))


LAYOUT_FAMILIES: tuple[Family, ...] = (
    # AttentionSpec: MHA, GQA, MQA, biases, RoPE, sinks, sigmoid, QK-norm, windows and chunks
    from_module(mha, "multi-head", mha.AttentionSpec, ("thm-one-head", "thm-many-heads", "thm-gqa", "thm-rope",
                                                       "thm-biases", "thm-window", "thm-qk-norm")),
    # MLASpec: multi-head latent attention (DeepSeek-V2/V3, Kimi K2); its tangent_basis is k x P, the protocol's P x k
    from_module(mla, "latent", mla.MLASpec, ("thm-mla-symmetries", "prop-mla-count", "prop-mla-weak"),
                tangent_basis=mla.tangent_columns),
    # GatedSpec: a multi-head layout with a sigmoid output gate per head or per value coordinate
    from_module(gated, "output-gated", gated.GatedSpec, ("thm-output-gate",)),
    # AlibiSpec: a multi-head layout without RoPE and with ALiBi's fixed position biases
    from_module(alibi, "alibi", alibi.AlibiSpec, ("thm-alibi",)),
    # RelativeBiasSpec: a multi-head layout without RoPE and with T5's learned bucketed position bias
    from_module(relbias, "relative-bias", relbias.RelativeBiasSpec, ("thm-relative-bias",)),
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


def verify(layout: Layout, *, seed: int = 0, seq_len: int | None = None, n_inputs: int | None = None,
           method: str = "auto", progress: bool = False, max_bytes: int | None = None) -> VerificationResult:
    """The exact count next to the float64 Jacobian's nullity at a seeded random point, for a layout of any family.

    ``method``: 'auto' (every family), 'dense' (every family), 'svd' (multi-head only); ``progress``
    draws the work on stderr; ``max_bytes``: the family's ``estimate`` is compared with it before each
    route runs, and ``attnid.budget.MemoryLimitExceeded`` is raised instead of running past it.
    """
    return family_of(layout).verify(layout, seed=seed, seq_len=seq_len, n_inputs=n_inputs, method=method,
                                    progress=progress, max_bytes=max_bytes)


def estimate(layout: Layout, seq_len: int | None = None, n_inputs: int | None = None, method: str = "auto") -> Estimate:
    """The predicted peak memory of ``verify`` with the same arguments, computed from the layout alone."""
    return family_of(layout).estimate(layout, seq_len=seq_len, n_inputs=n_inputs, method=method)


def default_seq_len(layout: Layout) -> int:
    """The tokens per input ``verify`` uses when ``seq_len`` is not given."""
    return family_of(layout).default_seq_len(layout)


def parameter_shapes(layout: Layout) -> dict[str, tuple[int, ...]]:
    return family_of(layout).parameter_shapes(layout)


def init_params(layout: Layout, generator: torch.Generator, dtype: torch.dtype = torch.float64,
                **options: Any) -> dict[str, torch.Tensor]:
    """A random point of the layout's parameters (``options``: what its family takes beyond, e.g. ``device``)."""
    return family_of(layout).init_params(layout, generator, dtype, **options)


def forward(params: Params, x: torch.Tensor, layout: Layout, **options: Any) -> torch.Tensor:
    """The layer of the layout's family at ``params`` on inputs ``x`` (..., n, d_model)."""
    return family_of(layout).forward(params, x, layout, **options)


def tangent_basis(params: Params, layout: Layout) -> torch.Tensor:
    """(P, k): columns spanning the tangent space of the symmetry orbit at ``params``."""
    return family_of(layout).tangent_basis(params, layout)
