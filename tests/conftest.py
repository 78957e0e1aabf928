"""Shared fixtures: seeded generators, so every test draws fresh but reproducible randomness.

Without CUDA the Triton kernels run in Triton's interpreter: TRITON_INTERPRET=1 is set here, once,
before any test module can import the kernel module (Triton reads it at import).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import attnid  # noqa: E402


@pytest.fixture
def gen(request: pytest.FixtureRequest) -> torch.Generator:
    # A different seed per test (from its name), fixed across runs.
    seed = sum(ord(c) * (i + 1) for i, c in enumerate(request.node.name)) % (2**31)
    return attnid.generator(seed)
