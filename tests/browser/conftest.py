"""The browser tests read the built book (_build/html): `make test-browser` builds it first."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def html_root() -> Path:
    root = ROOT / "_build" / "html"
    if not (root / "intro.html").is_file():
        pytest.fail(f"no built book under {root}: run `make test-browser` (it builds the book first)")
    return root
