"""Shared fixtures: seeded generators, so every test draws fresh but reproducible randomness, and the CLI.

Without CUDA the Triton kernels run in Triton's interpreter: TRITON_INTERPRET=1 is set here, once,
before any test module can import the kernel module (Triton reads it at import).
"""

import os
from collections.abc import Callable

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


@pytest.fixture
def cli(capsys: pytest.CaptureFixture) -> Callable[..., tuple[int, str, str]]:
    """attnid's command line run in this process: ``cli(*args)`` -> (exit code, stdout, stderr)."""
    from attnid.cli import main

    def run(*args: str) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as exc:
            raise SystemExit(main(list(args)))
        out, err = capsys.readouterr()
        return int(exc.value.code or 0), out, err

    return run
