#!/usr/bin/env python3
"""Print the one-page HTML build of the book (jupyter-book's singlehtml) as one PDF, then check the PDF.

``attnbook.pdf`` does the work: a cover, a contents page with page numbers, every chapter on a
new page, wide content scaled to the column (an error if it would still be cut off), bookmarks.
The math is typeset by the book's own MathJax; the network is blocked, as for the browser test.
`make pdf` builds the page and runs this.

Usage: print_pdf.py INPUT.html OUTPUT.pdf
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from attnbook.browser import BrowserMissing
from attnbook.pdf import ClippedContent, pdf_problems, print_book


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    source, target = Path(args[0]), Path(args[1])
    if source.name == "index.html" and (source.parent / "intro.html").is_file():
        source = source.parent / "intro.html"  # index.html only redirects
    if not source.is_file():
        print(f"print_pdf: no {source}: build it with `make pdf`", file=sys.stderr)
        return 2
    try:
        report = print_book(source, target)
    except BrowserMissing as err:
        print(f"print_pdf: {err}", file=sys.stderr)
        return 2
    except ClippedContent as err:
        print(f"print_pdf: {err}", file=sys.stderr)
        return 1
    title = yaml.safe_load((Path(__file__).resolve().parents[1] / "_config.yml").read_text())["title"]
    problems = pdf_problems(target, report.chapters, title)
    for problem in problems:
        print(f"print_pdf: {problem}", file=sys.stderr)
    print(f"pdf: {target} ({report.size / 1e6:.1f} MB, {report.chapters} chapters, {report.fitted} wide elements "
          "scaled to the column)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
