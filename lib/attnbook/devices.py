"""The book's DEVICE parameter: which torch device a chapter computes on, and its name for the record."""

from __future__ import annotations

import torch

NOT_A_DEPENDENCY = 'resolves the DEVICE parameter; the device a file was computed on is recorded in its sidecar'

DEVICES = ("cpu", "cuda", "auto")


def resolve_device(name: str) -> torch.device:
    """Map 'cpu', 'cuda' or 'auto' (CUDA when torch sees one) to a torch device."""
    if name not in DEVICES:
        raise ValueError(f"DEVICE must be one of {', '.join(DEVICES)}; got {name!r}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("DEVICE='cuda' but torch sees no CUDA device; use DEVICE='cpu' or 'auto'")
    return torch.device(name)


def describe_device(device: torch.device) -> str:
    """A short human-readable name: 'cpu' or 'cuda:' and the device's product name."""
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return "cpu"
