#!/usr/bin/env python3
"""Print the one-page HTML build of the book (jupyter-book's singlehtml) to one PDF with headless Chromium.

The math is typeset by the book's own MathJax before printing; the network is blocked, as for
the browser test. `make pdf` builds the page and runs this.

Usage: print_pdf.py INPUT.html OUTPUT.pdf
"""

from __future__ import annotations

import sys
from pathlib import Path

from attnbook.browser import BrowserMissing, _load_playwright, find_chromium

PRINT_CSS = """
.bd-header, .bd-sidebar-primary, .bd-sidebar-secondary, .header-article, .prev-next-area,
.bd-footer, .bd-footer-article, .bd-footer-content, .toggle-secondary-sidebar, .primary-toggle,
.secondary-toggle, .search-button-field, details.hide, .cell_input.hide { display: none !important; }
.bd-main .bd-content .bd-article-container { max-width: 100% !important; }
/* Paper cannot scroll: wrap text outputs, shrink wide tables to the page. */
.bd-article pre { white-space: pre-wrap !important; overflow-wrap: anywhere; }
.bd-article table { display: table !important; font-size: 75%; }
"""


def print_pdf(source: Path, target: Path) -> int:
    """Write ``source`` (an HTML file) as a PDF to ``target``. Returns the PDF's size in bytes."""
    sync_playwright = _load_playwright()
    target.parent.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=find_chromium(), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1000, "height": 1400})
            page.route("**/*", lambda route, request: route.continue_() if request.url.startswith(("file:", "data:"))
                       else route.abort())
            page.goto(source.resolve().as_uri(), wait_until="load")
            page.wait_for_function("() => !window.MathJax || (window.MathJax.startup && window.MathJax.startup.promise)")
            page.evaluate("() => window.MathJax && window.MathJax.startup ? window.MathJax.startup.promise : null")
            page.evaluate("() => window.MathJax && window.MathJax.typesetPromise ? window.MathJax.typesetPromise() : null")
            errors, raw = page.evaluate("() => [document.querySelectorAll('mjx-merror').length, "
                                        "Array.from(document.querySelectorAll('.math')).filter(m => !m.querySelector('mjx-container')).length]")
            if errors or raw:
                raise RuntimeError(f"{errors} math error(s) and {raw} untypeset math element(s) in {source}")
            page.add_style_tag(content=PRINT_CSS)
            page.emulate_media(media="print")
            page.pdf(path=str(target), format="A4", print_background=True,
                     margin={"top": "18mm", "bottom": "18mm", "left": "16mm", "right": "16mm"},
                     display_header_footer=True, header_template="<span></span>",
                     footer_template='<div style="font-size:8px;width:100%;text-align:center">'
                                     '<span class="pageNumber"></span> / <span class="totalPages"></span></div>')
        finally:
            browser.close()
    return target.stat().st_size


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    source, target = Path(args[0]), Path(args[1])
    if not source.is_file():
        print(f"print_pdf: no {source}: build it with `make pdf`", file=sys.stderr)
        return 2
    try:
        size = print_pdf(source, target)
    except BrowserMissing as err:
        print(f"print_pdf: {err}", file=sys.stderr)
        return 2
    print(f"pdf: {target} ({size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
