#!/usr/bin/env python3
"""Open every page of the built book in headless Chromium, offline, at desktop and phone widths.

Fails (exit 1) on a console error, a failed or outgoing request, untypeset math or a MathJax
error, an image that did not load, or content wider than its column without a scroll
container; exit 2 when the browser or its driver is missing. Screenshots go to
_build/screenshots/ (see attnbook.browser for the checks).

Usage: check_book.py [--html _build/html] [--screenshots DIR | --no-screenshots] [PAGE ...]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from attnbook.browser import BrowserMissing, book_pages, check_book

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--html", type=Path, default=ROOT / "_build" / "html", help="the built book")
    parser.add_argument("--screenshots", type=Path, default=ROOT / "_build" / "screenshots")
    parser.add_argument("--no-screenshots", action="store_true")
    parser.add_argument("pages", nargs="*", type=Path, help="only these pages (default: every page)")
    args = parser.parse_args(argv)
    pages = [p if p.is_absolute() else args.html / p for p in args.pages] or None
    start = time.perf_counter()
    try:
        problems = check_book(args.html, pages, None if args.no_screenshots else args.screenshots)
    except (BrowserMissing, FileNotFoundError) as err:
        print(f"check_book: {err}", file=sys.stderr)
        return 2
    count = len(pages or book_pages(args.html))
    for problem in problems:
        print(problem)
    print(f"checked {count} pages at 2 widths in {time.perf_counter() - start:.0f} s: "
          f"{len(problems)} problem(s)" + ("" if args.no_screenshots else f"; screenshots in {args.screenshots}"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
