"""attnbook: the companion book's plumbing, kept out of the maths library ``attnid``.

``chapter``     ``setup``: one call per chapter (device, recorded parameters, bound data writer/reader)
``codehash``    how a data file's code dependencies are hashed (by behaviour) and which are plumbing
``accept``      make accept: currency by a canary run at base and work tree, or by the old rule's bytes
``provenance``  atomic writes into data/, provenance sidecars, which data files are stale and why
``snapshot``    all-or-nothing runs: a notebook that fails leaves data/ as it found it
``paths``       finds the book's root (never assumed from where the package is installed)
``devices``     the DEVICE parameter: cpu, cuda or auto
``precision``   the precision rule for stored outputs, ``glue`` and the static scan of stored outputs
``machine``     the numeric environment: per-machine fingerprints and the portable environment
``grids``       the layouts each chapter verifies numerically, one definition per grid
``tables``      text and Markdown tables for the chapters
``style``       the figures as SVG, sized for the text column, byte-identical across runs
``celltags``    which code cells a reader sees, applied by tags
``downloads``   each chapter's data files, zipped with their provenance, for the reader to download
``sphinxext``   the book's Sphinx extension (the download links)
``browser``     reads the built book in headless Chromium, as a person would, at two widths
``reports``     what chapters 11 to 13 compute from the experiments' data (no experiment imports them)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Loaded on first use (PEP 562), so that a data file's provenance lists only what its writer used.
_LAZY = {"Chapter": "chapter", "setup": "chapter"}
__all__ = sorted(_LAZY)

if TYPE_CHECKING:
    from attnbook.chapter import Chapter, setup


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'attnbook' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
