"""Where the book lives: its repository root is found, never assumed from where this file is installed."""

from __future__ import annotations

import os
from pathlib import Path

NOT_A_DEPENDENCY = "finds the book's root and data folder: moves no number"

ROOT_ENV = "ATTNBOOK_ROOT"
ROOT_MARKERS = ("_toc.yml", "_config.yml")


def repo_root(start: Path | None = None) -> Path:
    """The book's root: $ATTNBOOK_ROOT if set, else the nearest folder at or above ``start`` (default: the
    working directory) that holds both ``_toc.yml`` and ``_config.yml``."""
    if os.environ.get(ROOT_ENV):
        root = Path(os.environ[ROOT_ENV]).resolve()
        if not all((root / m).is_file() for m in ROOT_MARKERS):
            raise FileNotFoundError(f"${ROOT_ENV}={root} holds no {' and '.join(ROOT_MARKERS)}: not the book's root")
        return root
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if all((folder / m).is_file() for m in ROOT_MARKERS):
            return folder
    raise FileNotFoundError(
        f"no book root (a folder with {' and '.join(ROOT_MARKERS)}) at or above {here}; "
        f"run from inside the book's checkout or set ${ROOT_ENV}"
    )


def data_dir(root: Path | None = None) -> Path:
    """The folder of everything a run writes that a chapter reads: <root>/data."""
    return (root or repo_root()) / "data"
