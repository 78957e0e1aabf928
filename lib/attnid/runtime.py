"""Where computations run, and with which seeds."""

from __future__ import annotations

import torch

DEVICES = ("cpu", "cuda", "auto")


def resolve_device(name: str) -> torch.device:
    """Map the book's DEVICE parameter ('cpu', 'cuda' or 'auto') to a torch device."""
    if name not in DEVICES:
        raise ValueError(f"DEVICE must be one of {', '.join(DEVICES)}; got {name!r}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("DEVICE='cuda' but torch sees no CUDA device; use DEVICE='cpu' or 'auto'")
    return torch.device(name)


def describe_device(device: torch.device) -> str:
    """A short human-readable name: 'cpu' or the CUDA device's product name."""
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return "cpu"


def generator(seed: int) -> torch.Generator:
    """A CPU generator with a fixed seed: draw on the CPU, then move, so results do not depend on the device."""
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return torch.Generator().manual_seed(seed)
