"""Seeded random generators: every draw in the library starts from one of these."""

from __future__ import annotations

import torch


def generator(seed: int) -> torch.Generator:
    """A CPU generator with a fixed seed: draw on the CPU, then move, so results do not depend on the device."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return torch.Generator().manual_seed(seed)
