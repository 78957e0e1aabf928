"""Shared fixtures: seeded generators, so every test draws fresh but reproducible randomness."""

import pytest
import torch

import attnid


@pytest.fixture
def gen(request: pytest.FixtureRequest) -> torch.Generator:
    # A different seed per test (from its name), fixed across runs.
    seed = sum(ord(c) * (i + 1) for i, c in enumerate(request.node.name)) % (2**31)
    return attnid.generator(seed)
