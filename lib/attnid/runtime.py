"""Seeded random generators: every draw in the library starts from one of these."""

from __future__ import annotations

import torch

# torch.Generator.manual_seed takes a signed or unsigned 64-bit seed; the library keeps to the
# non-negative signed range, so a seed means the same thing to every 64-bit consumer.
MAX_SEED = 2**63 - 1


def check_seed(seed: object) -> int:
    """``seed`` if it is an integer in [0, 2**63 - 1]; ValueError naming it and the range otherwise (booleans too)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        big = isinstance(seed, int) and seed.bit_length() > 128  # repr of a huge int is slow or refused
        shown = f"an integer of {seed.bit_length()} bits" if big else repr(seed)[:80]
        raise ValueError(f"seed must be a non-negative integer from 0 to 2**63 - 1 = {MAX_SEED}, got {shown}")
    return seed


def generator(seed: int) -> torch.Generator:
    """A CPU generator with a fixed seed: draw on the CPU, then move, so results do not depend on the device."""
    return torch.Generator().manual_seed(check_seed(seed))
