#!/usr/bin/env python3
"""Apply the book's cell-tag rule (attnbook.celltags) to notebooks: plumbing off the page.

Idempotent. scripts/reproduce.py applies the same rule to every notebook it executes, so a
notebook from any branch gets it on `make reproduce`. With --check, change nothing and exit 1
listing the cells that break the rule.

Usage: tag_cells.py [--check] [NOTEBOOK ...]   (default: every notebook in _toc.yml, the rendered book)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

from attnbook import celltags

ROOT = Path(__file__).resolve().parents[1]


def default_notebooks() -> list[Path]:
    sys.path.insert(0, str(ROOT / "scripts"))
    from reproduce import toc_notebooks  # noqa: PLC0415 (a sibling script)
    return [ROOT / p for p in toc_notebooks()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="report violations, change nothing")
    parser.add_argument("notebooks", nargs="*", type=Path)
    args = parser.parse_args(argv)
    bad = 0
    for path in args.notebooks or default_notebooks():
        notebook = nbformat.read(path, as_version=4)
        if args.check:
            for line in celltags.violations(notebook.cells):
                print(f"{path}: {line}")
                bad += 1
        elif celltags.apply(notebook.cells):
            nbformat.write(notebook, path)
            print(f"tagged {path}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
