"""Read the built book as a person would: every page in headless Chromium, offline, at two widths.

``check_book(html_root)`` opens each HTML page of a built book (``_build/html``) from the file
system, blocks every request that is not a local file (so the book must work offline), and
reports a ``Problem`` for each of:

- a console error or an uncaught exception (``console``, ``pageerror``);
- a request that failed or that tried to leave the machine (``network``);
- a math element that MathJax did not typeset, or a MathJax error such as an undefined macro
  (``math``);
- an image that did not load (``image``);
- content wider than the text column that is not inside a horizontal scroll container, or a
  page that scrolls sideways (``overflow``);
- a figure wider than the text column, even inside a scroll container: part of it is out of
  sight until the reader scrolls (``figure``);
- a display equation wider than the text column, even inside a scroll container (``equation``):
  MathJax 4 breaks a long one over lines, so one that is still wide needs rewriting (``aligned``);
- at desktop width, a text output or code block wider than its box, so that the reader has to
  scroll it (``output``): results belong in tables, or in lines that fit, and code wraps;
- a glued number (myst-nb's ``{glue:text}`` or ``{glue:}``) that shows quote marks, E notation or
  bold (``glue``): attnbook.sphinxext writes glued numbers as the prose does;
- source left unrendered: TeX outside MathJax's output, or a Markdown table shown as text (``raw``);
- at phone width, a table that scrolls sideways without a sticky first column, or whose first
  column takes more than half the visible width (``table``);
- a link to a local file that does not exist (``link``).

Desktop (1280 px, light) and phone (390 px, dark) widths; a screenshot of each page's first screen is
saved when ``screenshots`` is given, of the whole page with ``full_page`` (a long chapter's full-page
PNG took 2 to 12 s here, which, over every page at both widths, was a third of the walk). The browser is
Debian's ``chromium`` driven by Playwright (``playwright`` from PyPI, no browser download): ``make test``
installs both.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

NOT_A_DEPENDENCY = 'reads the rendered book in a browser: no data'

WIDTHS: tuple[tuple[str, int, int, str], ...] = (
    ("desktop", 1280, 900, "light"),
    ("phone", 390, 844, "dark"),
)
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
# every wait of a page (loading, MathJax): make test walks the book while nbval shares the two cores, and a
# long chapter took 12 s alone; a wait that runs out is a failure, so the bound is generous
PAGE_TIMEOUT_MS = 120_000


class BrowserMissing(RuntimeError):
    """No Chromium executable or no Playwright: says what to install."""


@dataclass(frozen=True)
class Problem:
    """One thing a reader would see go wrong on one page at one width."""

    page: str
    width: str
    kind: str  # console | network | math | image | overflow | figure | equation | output | glue | raw | table | link
    detail: str

    def __str__(self) -> str:
        return f"{self.page} [{self.width}] {self.kind}: {self.detail}"


def find_chromium() -> str:
    """The Chromium executable: $CHROMIUM, else the first of CHROMIUM_NAMES on PATH."""
    explicit = os.environ.get("CHROMIUM")
    if explicit:
        if not Path(explicit).is_file():
            raise BrowserMissing(f"CHROMIUM={explicit} is not a file")
        return explicit
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    raise BrowserMissing("no Chromium found (looked for " + ", ".join(CHROMIUM_NAMES)
                         + " on PATH and $CHROMIUM); install Debian's: apt-get install chromium")


def book_pages(html_root: Path) -> list[Path]:
    """The book's pages under ``html_root``: every .html (search included) except the probes of the tests
    (names starting with ``_``) and index.html, which only redirects to the first page."""
    skip = {"index.html"}
    return sorted(p for p in html_root.rglob("*.html")
                  if p.name not in skip and not p.name.startswith("_") and "_static" not in p.parts
                  and "_sources" not in p.parts and "_images" not in p.parts)


# Runs in the page once it has loaded and MathJax has finished. Returns [kind, detail] pairs.
PAGE_CHECKS_JS = r"""
async () => {
  const found = [];
  const maths = Array.from(document.querySelectorAll('.math'));
  if (maths.length && !(window.MathJax && window.MathJax.startup)) {
    found.push(['math', `${maths.length} math elements but MathJax did not load`]);
    return found;
  }
  if (window.MathJax && window.MathJax.startup) {
    try { await window.MathJax.startup.promise; } catch (e) { found.push(['math', 'MathJax failed: ' + e]); }
  }
  const untypeset = maths.filter(m => !m.querySelector('mjx-container'));
  if (untypeset.length)
    found.push(['math', `${untypeset.length} of ${maths.length} math elements not typeset, first: ` +
                         untypeset[0].textContent.trim().slice(0, 80)]);
  for (const err of document.querySelectorAll('mjx-merror, [data-mjx-error]'))
    found.push(['math', 'MathJax error: ' + (err.getAttribute('data-mjx-error') || err.textContent).slice(0, 120)]);

  for (const img of document.querySelectorAll('img')) {
    if (img.loading === 'lazy') { img.loading = 'eager'; }
    try { await img.decode(); } catch (e) {}
    if (!img.complete || img.naturalWidth === 0) found.push(['image', 'did not load: ' + img.getAttribute('src')]);
  }

  const column = document.querySelector('article.bd-article') || document.querySelector('main') || document.body;
  const box = column.getBoundingClientRect();
  const style = getComputedStyle(column);
  const left = box.left + parseFloat(style.paddingLeft), right = box.right - parseFloat(style.paddingRight);
  const scrolls = el => ['auto', 'scroll', 'hidden', 'clip'].includes(getComputedStyle(el).overflowX);
  const describe = el => {
    const id = el.id ? '#' + el.id : '';
    const cls = el.classList.length ? '.' + Array.from(el.classList).slice(0, 2).join('.') : '';
    const text = (el.textContent || '').trim().replace(/\s+/g, ' ').slice(0, 60);
    return `<${el.tagName.toLowerCase()}${id}${cls}> "${text}"`;
  };
  const reported = new Set();
  for (const el of column.querySelectorAll('*')) {
    const r = el.getBoundingClientRect(), cs = getComputedStyle(el);
    if (r.width === 0 || r.height === 0 || cs.visibility === 'hidden') continue;
    // An inline element broken over lines: its padding may pass the edge, its text may not.
    const slack = cs.display === 'inline' ? parseFloat(cs.paddingRight) + parseFloat(cs.borderRightWidth) + 2 : 0;
    if (r.right <= right + 1 + slack && r.left >= left - 1 - slack) continue;
    let contained = false, parent = el.parentElement, outer = el;
    for (; parent && parent !== column; parent = parent.parentElement) {
      if (scrolls(parent)) {
        const pr = parent.getBoundingClientRect();
        if (pr.right <= right + 1 && pr.left >= left - 1) { contained = true; break; }
      }
      const pr = parent.getBoundingClientRect();
      if (pr.right > right + 1 || pr.left < left - 1) outer = parent;
    }
    if (contained || reported.has(outer)) continue;
    reported.add(outer);
    found.push(['overflow', `${describe(outer)} spans ${Math.round(outer.getBoundingClientRect().width)} px ` +
                            `in a ${Math.round(right - left)} px column without a scroll container`]);
  }
  for (const img of column.querySelectorAll('figure img')) {
    const w = img.getBoundingClientRect().width;
    if (w > right - left + 1)
      found.push(['figure', `${describe(img.closest('figure'))} is ${Math.round(w)} px wide in a ` +
                            `${Math.round(right - left)} px column: part of it is out of sight`]);
  }
  for (const eq of column.querySelectorAll('mjx-container[display="true"]')) {
    const w = Math.max(eq.scrollWidth, eq.getBoundingClientRect().width);
    if (w > right - left + 1)
      found.push(['equation', `${describe(eq)} is ${Math.round(w)} px wide in a ${Math.round(right - left)} px ` +
                              'column: part of it is out of sight']);
  }
  // A text output or code block sits in a scroll box, which the overflow check accepts; at desktop width
  // none may need it (code wraps, book.css; an output that is a table must fit), and on a phone no cell's
  // text output may (a result printed as fixed-width text belongs in a table).
  const pres = window.innerWidth >= 1000 ? column.querySelectorAll('pre') : column.querySelectorAll('.cell_output pre');
  for (const pre of pres) {
    if (pre.scrollWidth > pre.clientWidth + 1)
      found.push(['output', `${describe(pre)} is ${pre.scrollWidth} px wide in a ${pre.clientWidth} px box: ` +
                            'a text output the reader has to scroll']);
  }
  // A number in a table is never broken over two lines ("7.9e-" then "02"): each number's text, as a range,
  // lies on one line.
  // (A number is a word of its own: digits inside a hash or a name are not one, nor is code.)
  const numberToken = /(?<![\w.])[-+\u2212]?\d[\d.,]*(?:e[-+\u2212]?\d+)?(?![\w.])/gi;
  for (const cell of column.querySelectorAll('td, th')) {
    const texts = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    let broken = null;
    for (let n = texts.nextNode(); n && !broken; n = texts.nextNode()) {
      if (n.parentElement.closest('mjx-container, code, pre')) continue;
      for (const m of n.textContent.matchAll(numberToken)) {
        if (m[0].length < 2) continue;
        const range = document.createRange();
        range.setStart(n, m.index);
        range.setEnd(n, m.index + m[0].length);
        if (new Set(Array.from(range.getClientRects(), r => Math.round(r.top))).size > 1) { broken = m[0]; break; }
      }
    }
    if (broken) found.push(['number', `${describe(cell)}: the number "${broken}" is broken over two lines`]);
  }
  // Glued numbers read like the prose's: no quote marks (a string's repr), no E notation, no bold.
  for (const g of column.querySelectorAll('.pasted-text, span.output.text_plain')) {
    const t = g.textContent.trim();
    if (/^(['"]).*\1$/s.test(t) && t.length >= 2)
      found.push(['glue', `${describe(g)} shows the quote marks of a glued string`]);
    if (/(^|[^\w.])[-+]?\d+(\.\d*)?e[-+]?\d+($|[^\w.])/i.test(t))
      found.push(['glue', `${describe(g)} is in E notation where the prose writes a power of ten`]);
    if (g.closest('strong, b'))
      found.push(['glue', `${describe(g)} is a glued number set in bold`]);
  }
  // Source that should have been rendered: TeX outside MathJax's output, a Markdown table left as text.
  const skip = 'pre, code, script, style, textarea, mjx-container, .math, .highlight';
  const walker = document.createTreeWalker(column, NodeFilter.SHOW_TEXT);
  const raw = /\\[a-zA-Z]{2,}|\$[^$\s][^$]*\$|\|\s*[\u2014\u2013-]{1,3}:?\s*\|/;
  const rawReported = new Set();
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const host = n.parentElement;
    if (!host || host.closest(skip) || !raw.test(n.textContent)) continue;
    const block = host.closest('p, li, td, th, figcaption, dt, dd, div') || host;
    if (rawReported.has(block)) continue;
    rawReported.add(block);
    found.push(['raw', `${describe(block)} shows unrendered source: ` +
                       n.textContent.trim().replace(/\s+/g, ' ').slice(0, 80)]);
  }
  // A table that scrolls sideways says so above it (book.js), at any width.
  for (const table of column.querySelectorAll('table')) {
    if (table.scrollWidth <= table.clientWidth + 1) continue;
    const hint = table.previousElementSibling;
    if (!(hint && hint.classList.contains('table-scroll-hint') && hint.getBoundingClientRect().height > 0))
      found.push(['table', `${describe(table)} scrolls sideways and nothing above it says so`]);
  }
  // On a phone a table that scrolls keeps its first column (the row's name) in view, and that column
  // leaves room for the values: at most half the visible width.
  if (window.innerWidth < 600)
    for (const table of column.querySelectorAll('table')) {
      if (table.scrollWidth <= table.clientWidth + 1 || !table.rows.length) continue;
      const first = table.rows[0].cells[0];
      if (!first) continue;
      if (getComputedStyle(first).position !== 'sticky')
        found.push(['table', `${describe(table)} scrolls sideways and its first column scrolls away with it`]);
      else if (first.getBoundingClientRect().width > 0.5 * table.clientWidth + 1)
        found.push(['table', `${describe(table)}: its sticky first column is ` +
                             `${Math.round(first.getBoundingClientRect().width)} px of ${table.clientWidth} px`]);
    }
  if (document.documentElement.scrollWidth > window.innerWidth + 1)
    found.push(['overflow', `the page scrolls sideways (${document.documentElement.scrollWidth} px wide ` +
                            `in a ${window.innerWidth} px window)`]);
  return found;
}
"""


def _load_playwright():  # noqa: ANN202 (the module's sync API)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as err:
        raise BrowserMissing("the Python package playwright is missing: pip install -r requirements.txt "
                             "(make install does it)") from err
    return sync_playwright


def check_book(html_root: Path, pages: Sequence[Path] | None = None, screenshots: Path | None = None,
               widths: Iterable[tuple[str, int, int, str]] = WIDTHS, full_page: bool = False) -> list[Problem]:
    """Open every page (default: ``book_pages(html_root)``) at every width; return what went wrong.

    ``screenshots``: a folder for a PNG of each page at each width (its first screen; the whole page with
    ``full_page``). The checks read the whole page either way.
    """
    html_root = html_root.resolve()
    if not (html_root / "intro.html").is_file() and pages is None:
        raise FileNotFoundError(f"no built book under {html_root}: run `make book` first")
    pages = list(pages) if pages is not None else book_pages(html_root)
    executable = find_chromium()
    sync_playwright = _load_playwright()
    problems: list[Problem] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            for label, width, height, scheme in widths:
                context = browser.new_context(viewport={"width": width, "height": height}, color_scheme=scheme)
                context.set_default_timeout(PAGE_TIMEOUT_MS)
                try:
                    for page_path in pages:
                        problems += _check_page(context, html_root, page_path.resolve(), label, screenshots, full_page)
                finally:
                    context.close()
        finally:
            browser.close()
    return problems


def broken_links(hrefs: Iterable[str]) -> list[str]:
    """The local (file:) link targets among ``hrefs`` that do not exist, fragments and queries ignored."""
    from urllib.parse import unquote, urlsplit  # noqa: PLC0415

    missing = []
    for href in sorted(set(hrefs)):
        parts = urlsplit(href)
        if parts.scheme == "file" and not Path(unquote(parts.path)).exists():
            missing.append(unquote(parts.path))
    return missing


def _check_page(context, html_root: Path, path: Path, label: str, screenshots: Path | None,  # noqa: ANN001
                full_page: bool = False) -> list[Problem]:
    name = str(path.relative_to(html_root)) if path.is_relative_to(html_root) else path.name
    found: list[Problem] = []

    def note(kind: str, detail: str) -> None:
        found.append(Problem(name, label, kind, detail))

    def route(route, request) -> None:  # noqa: ANN001
        if request.url.startswith(("file:", "data:", "blob:", "about:")):
            route.continue_()
        else:
            note("network", f"request to leave the machine blocked: {request.url}")
            route.abort()

    page = context.new_page()
    page.route("**/*", route)
    page.on("console", lambda msg: note("console", msg.text[:300]) if msg.type == "error" else None)
    page.on("pageerror", lambda err: note("console", f"uncaught: {err}"[:300]))
    page.on("requestfailed", lambda req: None if req.url.startswith(("http:", "https:"))
            else note("network", f"failed {req.url} ({req.failure})"))
    try:
        page.goto(path.as_uri(), wait_until="load")
        page.wait_for_function("() => !window.MathJax || !window.MathJax.startup || window.MathJax.startup.promise",
                               timeout=PAGE_TIMEOUT_MS)
        for kind, detail in page.evaluate(PAGE_CHECKS_JS):
            note(kind, detail)
        for target in broken_links(page.evaluate("() => Array.from(document.links, a => a.href)")):
            note("link", f"links to a missing file: {target}")
        if screenshots is not None:
            out = screenshots / f"{name.removesuffix('.html').replace('/', '__')}-{label}.png"
            out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(out), full_page=full_page)
    finally:
        page.close()
    return found
