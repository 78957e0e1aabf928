"""The book as one printed PDF: headless Chromium prints jupyter-book's one-page build, then checks it.

``print_book(source, target)`` opens the one-page HTML build (``_build/singlehtml``) offline,
lets the book's own MathJax typeset it, and lays it out for A4 paper before printing:

- a **cover** (the book's title, what it is, its licence) and a **contents** page whose entries
  link to every chapter and section;
- every chapter starts on a **new page**; a code cell, a figure, a table or an equation is not
  split over two pages when it fits on one;
- paper cannot scroll, so anything wider than the column (a table, a figure, a code line, a display
  equation MathJax could not break at the printed column's width, which it typesets at) is **scaled
  down to fit** (text by its font size, pictures by their width), to no less than ``MIN_ZOOM`` of
  its size; text outputs and code wrap;
- the contents give each entry's page, and the PDF gets **bookmarks** for the same entries.

Before printing, ``clipped`` content is looked for in the print layout: an element still wider
than the column, cut by its box, or a row of an aligned equation whose columns print over each
other (MathJax 4 did that after re-typesetting a page whose line breaks it had turned off). Any is
an error (``ClippedContent``), and no PDF is written.
After printing, ``read_pdf`` reads the file back (pypdf): its pages, its outline and its links;
``pdf_problems`` says what a printed book would lack (bookmarks, a cover, a contents page).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from pathlib import Path

NOT_A_DEPENDENCY = 'prints the rendered book: no data'

A4_MM = (210.0, 297.0)
MARGIN_MM = {"top": 18.0, "bottom": 18.0, "left": 16.0, "right": 16.0}
PX_PER_MM = 96 / 25.4
COLUMN_PX = int((A4_MM[0] - MARGIN_MM["left"] - MARGIN_MM["right"]) * PX_PER_MM)  # the printed column, CSS px
MIN_ZOOM = 0.5  # narrower than half size is unreadable on paper: such content must be rewritten

PRINT_CSS = """
.bd-header, .bd-sidebar-primary, .bd-sidebar-secondary, .header-article, .prev-next-area,
.bd-footer, .bd-footer-article, .bd-footer-content, .toggle-secondary-sidebar, .primary-toggle,
.secondary-toggle, .search-button-field, details.hide, .cell_input.hide, .bd-header-announcement,
.headerlink, #jb-print-docs-body { display: none !important; }
html, body, .bd-container, .bd-container__inner, .bd-main, .bd-content, .bd-article-container,
.bd-article { width: 100% !important; max-width: 100% !important; margin: 0 !important; padding: 0 !important; }
.bd-article pre, .bd-article code, .bd-article code span.pre { white-space: pre-wrap !important; overflow-wrap: anywhere; }
.bd-article table { display: table !important; font-size: 80%; }
mjx-container, .math-wrapper, .table-wrapper, .pst-scrollable-table-container, .cell_output, .output,
.output_area, div.highlight, .math { overflow: visible !important; }
.pdf-cover { height: 200mm; display: flex; flex-direction: column; justify-content: center; text-align: center;
             break-after: page; }
.pdf-cover .pdf-title { font-size: 30pt; font-weight: 700; margin-bottom: 12mm; }
.pdf-contents-title { font-size: 20pt; font-weight: 700; margin-bottom: 6mm; }
.pdf-cover p { font-size: 13pt; margin: 3mm 20mm; }
.pdf-contents { break-after: page; font-size: 10.5pt; }
.pdf-contents ol { list-style: none; padding-left: 0; }
.pdf-contents ol ol { padding-left: 6mm; font-size: 9.5pt; }
.pdf-contents li.pdf-chapter { margin-top: 2.5mm; font-weight: 600; }
.pdf-contents li li { font-weight: 400; }
.pdf-contents li > a { display: inline-block; max-width: 88%; }
.pdf-contents .pdf-page { float: right; }
.pdf-chapter-start { break-before: page; }
.cell_input, figure, table, mjx-container[display="true"], .proof, div.theorem, div.lemma, div.proposition
  { break-inside: avoid; }
h1, h2, h3, h4 { break-after: auto; }
"""

# Builds the cover and the contents from the page's own headings, promotes each chapter's headings
# one level (the one-page build nests them under the introduction's), and marks where chapters start.
PREPARE_JS = """
() => {
  const article = document.querySelector('.bd-article') || document.body;
  const heading = s => s.querySelector(':scope > h1, :scope > h2, :scope > h3, :scope > h4, :scope > h5');
  const text = el => Array.from(el.childNodes).filter(n => !(n.classList && n.classList.contains('headerlink')))
                                             .map(n => n.textContent).join('').trim();
  const root = Array.from(article.querySelectorAll('section')).find(s => s.querySelector(':scope > h1'));
  const chapters = Array.from(article.querySelectorAll('span[id^="document-"] + section'));
  for (const chapter of chapters) {
    chapter.classList.add('pdf-chapter-start');
    for (const h of Array.from(chapter.querySelectorAll('h3, h4, h5, h6'))) {
      const up = document.createElement('h' + (Number(h.tagName[1]) - 1));
      for (const a of h.attributes) up.setAttribute(a.name, a.value);
      while (h.firstChild) up.appendChild(h.firstChild);
      h.replaceWith(up);
    }
  }
  // The one-page build repeats ids ("symbolic-check" in many chapters): give each chapter's repeats its own.
  const seen = new Set(Array.from(article.querySelectorAll('[id]'), el => el.closest('span[id^="document-"] + section') ? null : el.id));
  for (const chapter of chapters) {
    const renamed = new Map();
    for (const el of chapter.querySelectorAll('[id]')) {
      if (seen.has(el.id)) { renamed.set(el.id, `${chapter.id}--${el.id}`); el.id = renamed.get(el.id); }
      seen.add(el.id);
    }
    for (const a of chapter.querySelectorAll('a[href^="#"]')) {
      const to = renamed.get(a.getAttribute('href').slice(1));
      if (to) a.setAttribute('href', '#' + to);
    }
  }
  const entries = (root ? [root] : []).concat(chapters);
  const cover = document.createElement('div');
  cover.className = 'pdf-cover';
  cover.innerHTML = '<div class="pdf-title"></div><p></p><p></p>';
  cover.children[0].textContent = root ? text(heading(root)) : document.title;
  cover.children[1].textContent =
    'A companion to the paper, with every proof, its symbolic and numeric checks, and the data behind every figure.';
  cover.children[2].textContent = 'Code: MIT licence. Prose, figures and data: CC BY 4.0 (the section Licence).';
  const nav = document.createElement('nav');
  nav.className = 'pdf-contents';
  nav.innerHTML = '<div class="pdf-contents-title">Contents</div><ol></ol>';
  const link = (section) => {
    const a = document.createElement('a');
    a.href = '#' + section.id;
    a.dataset.target = section.id;
    a.textContent = text(heading(section));
    return a;
  };
  const listed = [];
  for (const entry of entries) {
    const item = document.createElement('li');
    item.className = 'pdf-chapter';
    item.appendChild(link(entry));
    listed.push([entry.id, text(heading(entry)), 0]);
    // a section that holds the chapters is the landing page's list of them: the contents page replaces it
    const holders = Array.from(entry.querySelectorAll(':scope > section')).filter(s => s.querySelector('span[id^="document-"]'));
    for (const s of holders) if (heading(s)) heading(s).style.display = 'none';
    const sections = Array.from(entry.querySelectorAll(':scope > section')).filter(s => s.id && heading(s) && !holders.includes(s));
    if (sections.length) {
      const sub = document.createElement('ol');
      for (const s of sections) {
        sub.appendChild(document.createElement('li')).appendChild(link(s));
        listed.push([s.id, text(heading(s)), 1]);
      }
      item.appendChild(sub);
    }
    nav.querySelector('ol').appendChild(item);
  }
  article.prepend(nav);
  article.prepend(cover);
  return [chapters.length, listed];
}
"""

# Writes each contents entry's page number after its link (pages: {id: number}).
NUMBER_JS = """
(pages) => {
  for (const a of document.querySelectorAll('.pdf-contents a[data-target]')) {
    const n = pages[a.dataset.target];
    if (n === undefined) continue;
    const span = document.createElement('span');
    span.className = 'pdf-page';
    span.textContent = String(n);
    a.after(span);
  }
}
"""

# Scales what is wider than the column down to fit (at most to MIN_ZOOM); returns [fitted, too wide].
FIT_JS = """
([column, minZoom]) => {
  const article = document.querySelector('.bd-article') || document.body;
  const left = article.getBoundingClientRect().left;
  const candidates = article.querySelectorAll(
    'mjx-container[display="true"], table, pre, figure img, figure svg, .cell_output img, .cell_output svg, .output img');
  const excess = el => {
    const box = el.getBoundingClientRect();
    const room = Math.min(el.parentElement.clientWidth || column, column - (box.left - left));
    return [Math.max(el.scrollWidth, box.width), room];
  };
  let fitted = 0;
  const tooWide = [];
  for (const el of candidates) {
    if (!el.parentElement) continue;
    let [needed, room] = excess(el);
    if (needed <= room) continue;
    const name = el.tagName.toLowerCase() + (el.id ? '#' + el.id : '');
    if (room / needed < minZoom) { tooWide.push(`${name} needs ${Math.round(needed)} px of ${Math.round(room)} px`); continue; }
    if (['img', 'svg'].includes(el.tagName.toLowerCase())) {  // a picture scales as a whole
      el.style.width = `${Math.floor(room)}px`;
      el.style.height = 'auto';
    } else {  // text (MathJax's output is in em) scales with its font size; padding may not, so again until it fits
      const base = parseFloat(getComputedStyle(el).fontSize);
      let size = base;
      for (let i = 0; i < 8 && needed > room && size > base * minZoom; i++) {
        size = Math.max(base * minZoom, size * Math.min(0.97, (room - 1) / needed));
        el.style.fontSize = `${size.toFixed(2)}px`;
        [needed, room] = excess(el);
      }
    }
    fitted += 1;
  }
  return [fitted, tooWide];
}
"""

# What a reader of the paper would not see: wider than the column, cut by its own box, or printed over.
CLIPPED_JS = """
([column]) => {
  const article = document.querySelector('.bd-article') || document.body;
  const left = article.getBoundingClientRect().left;
  const found = [];
  const describe = el => {
    const text = (el.textContent || '').trim().replace(/\\s+/g, ' ').slice(0, 60);
    return `<${el.tagName.toLowerCase()}${el.className && typeof el.className === 'string' ? ' class="' + el.className + '"' : ''}> "${text}"`;
  };
  for (const row of article.querySelectorAll('mjx-mtr, mjx-mlabeledtr')) {  // aligned math: a column over the next
    const ink = Array.from(row.children).filter(c => c.tagName.toLowerCase() === 'mjx-mtd').map(cell => {
      const boxes = Array.from(cell.querySelectorAll('*'), e => e.getBoundingClientRect()).filter(b => b.width > 0);
      return boxes.length ? [Math.min(...boxes.map(b => b.left)), Math.max(...boxes.map(b => b.right))] : null;
    }).filter(Boolean);
    for (let i = 1; i < ink.length; i++) {
      if (ink[i][0] < ink[i - 1][1] - 1) {
        const math = row.closest('mjx-math');
        const latex = ((math && math.getAttribute('data-latex')) || row.textContent).trim().replace(/\\s+/g, ' ').slice(0, 60);
        found.push(`overprinted: columns of an aligned equation overlap by ${Math.round(ink[i - 1][1] - ink[i][0])} px: "${latex}"`);
      }
    }
  }
  for (const el of article.querySelectorAll('*')) {
    const style = getComputedStyle(el);
    if (style.display === 'none' || style.visibility === 'hidden' || style.position === 'fixed') continue;
    const box = el.getBoundingClientRect();
    if (box.width === 0 || box.height === 0) continue;
    const cuts = style.display !== 'inline' && ['hidden', 'auto', 'scroll', 'clip'].includes(style.overflowX);
    if (cuts && el.scrollWidth > el.clientWidth + 2) found.push(`cut by its box: ${describe(el)}`);
    else if (box.right - left > column + (style.display === 'inline' ? 12 : 2))  // an inline box's padding may end a line
      found.push(`past the column (${Math.round(box.right - left)} of ${column} px): ${describe(el)}`);
  }
  return found;
}
"""


class ClippedContent(RuntimeError):
    """Content the printed page would cut off: a list of what and where."""


@dataclass(frozen=True)
class PdfReport:
    """What ``print_book`` made: the file, its size, the chapters it found and how much it had to scale."""

    path: Path
    size: int
    chapters: int
    fitted: int


@dataclass(frozen=True)
class PdfContents:
    """What ``read_pdf`` finds in a PDF: its page count, its bookmark titles (depth first) and internal links."""

    pages: int
    outline: tuple[str, ...]
    internal_links: int
    first_page_text: str



LOAD_TIMEOUT_MS = 300_000  # for every wait of the printing page: loading, typesetting, layout passes

def _typeset(page) -> None:  # noqa: ANN001 (a Playwright page)
    """Wait for the book's MathJax; raise if a formula did not typeset."""
    page.wait_for_function("() => !window.MathJax || (window.MathJax.startup && window.MathJax.startup.promise)")
    page.evaluate("() => window.MathJax && window.MathJax.startup ? window.MathJax.startup.promise : null")
    page.evaluate("() => window.MathJax && window.MathJax.typesetPromise ? window.MathJax.typesetPromise() : null")
    errors, raw = page.evaluate("() => [document.querySelectorAll('mjx-merror').length, "
                                "Array.from(document.querySelectorAll('.math')).filter(m => !m.querySelector('mjx-container')).length]")
    if errors or raw:
        raise RuntimeError(f"{errors} math error(s) and {raw} untypeset math element(s)")


def _print(page, path: Path) -> None:  # noqa: ANN001 (a Playwright page)
    page.pdf(path=str(path), width=f"{A4_MM[0]}mm", height=f"{A4_MM[1]}mm", print_background=True,
             margin={k: f"{v}mm" for k, v in MARGIN_MM.items()}, display_header_footer=True,
             header_template="<span></span>",
             footer_template='<div style="font-size:8px;width:100%;text-align:center">'
                             '<span class="pageNumber"></span> / <span class="totalPages"></span></div>')


def _plain(title: str) -> str:
    """A heading's text for a bookmark: MathJax's invisible operators (U+2061-U+2064) dropped, spaces collapsed."""
    return " ".join("".join(c for c in title if not 0x2061 <= ord(c) <= 0x2064).split())


def destination_pages(path: Path) -> dict[str, int]:
    """{element id: 1-based page} of every named destination Chromium wrote (one per id in the page)."""
    from pypdf import PdfReader  # noqa: PLC0415

    reader = PdfReader(str(path))
    return {name.lstrip("/"): reader.get_destination_page_number(dest) + 1
            for name, dest in reader.named_destinations.items()}


def add_outline(source: Path, target: Path, entries: list[tuple[str, str, int]], pages: dict[str, int]) -> int:
    """Copy the PDF ``source`` to ``target`` with bookmarks: one per (id, title, depth 0 or 1) entry. Returns their number."""
    from pypdf import PdfWriter  # noqa: PLC0415

    writer = PdfWriter(clone_from=str(source))
    parent = None
    for element, title, depth in entries:
        item = writer.add_outline_item(title=_plain(title), page_number=pages[element] - 1, parent=parent if depth else None)
        if depth == 0:
            parent = item
    writer.page_mode = "/UseOutlines"
    with open(target, "wb") as out:
        writer.write(out)
    return len(entries)


def print_book(source: Path, target: Path) -> PdfReport:
    """Print the HTML file ``source`` to the PDF ``target`` as described above; raise ``ClippedContent`` instead of cutting.

    Two passes: the first finds the page of every contents entry (the PDF's named destinations),
    the second prints them in the contents; the bookmarks are added to the second (pypdf), from the
    same entries. Chromium's own outline (its tagged mode) repeats some headings' titles twice.
    """
    from attnbook.browser import _load_playwright, find_chromium  # noqa: PLC0415 (a browser only when printing)

    sync_playwright = _load_playwright()
    target.parent.mkdir(parents=True, exist_ok=True)
    first, second = (target.with_name(f".{target.name}.pass{i}") for i in (1, 2))
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=find_chromium(), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": COLUMN_PX, "height": 1400})
            # the one-page book (about 8 MB, every formula typeset) can take over Playwright's default 30 s to load
            # on a busy 2-core machine: seen in a fresh-clone CI run while another build shared the cores
            page.set_default_timeout(LOAD_TIMEOUT_MS)
            page.route("**/*", lambda route, request: route.continue_() if request.url.startswith(("file:", "data:"))
                       else route.abort())
            page.goto(source.resolve().as_uri(), wait_until="load")
            _typeset(page)
            page.emulate_media(media="print")
            page.add_style_tag(content=PRINT_CSS)
            chapters, entries = page.evaluate(PREPARE_JS)
            fitted, too_wide = page.evaluate(FIT_JS, [COLUMN_PX, MIN_ZOOM])
            problems = too_wide + page.evaluate(CLIPPED_JS, [COLUMN_PX])
            if problems:
                raise ClippedContent(f"{len(problems)} element(s) of {source.name} would be cut off on paper:\n  "
                                     + "\n  ".join(problems[:20]))
            _print(page, first)
            pages = destination_pages(first)
            missing = [element for element, _, _ in entries if element not in pages]
            if missing:
                raise RuntimeError(f"the PDF has no destination for contents entries {missing[:5]}")
            page.evaluate(NUMBER_JS, {element: pages[element] for element, _, _ in entries})
            _print(page, second)
            moved = {e: (pages[e], n) for e, n in destination_pages(second).items() if e in pages and pages[e] != n}
            if moved:
                raise RuntimeError(f"printing the page numbers moved {len(moved)} destination(s), e.g. {next(iter(moved.items()))}")
            add_outline(second, first, [tuple(e) for e in entries], pages)
            first.replace(target)  # never a half-written PDF under the target's name
        finally:
            browser.close()
            for leftover in (first, second):
                leftover.unlink(missing_ok=True)
    return PdfReport(target, target.stat().st_size, chapters, fitted)


def read_pdf(path: Path) -> PdfContents:
    """Pages, bookmark titles and internal links of a PDF (pypdf)."""
    from pypdf import PdfReader  # noqa: PLC0415 (only the PDF checks need it)

    reader = PdfReader(str(path))
    titles: list[str] = []

    def walk(items) -> None:  # noqa: ANN001 (pypdf's nested outline list)
        for item in items:
            if isinstance(item, list):
                walk(item)
            else:
                titles.append(str(item.title))

    walk(reader.outline)
    links = 0
    for page in reader.pages:
        for annot in page.get("/Annots") or []:
            obj = annot.get_object()
            if obj.get("/Subtype") == "/Link" and "/URI" not in (obj.get("/A") or {}):
                links += 1
    return PdfContents(len(reader.pages), tuple(titles), links, reader.pages[0].extract_text() if reader.pages else "")


def _words(text: str) -> str:
    """Text as a reader compares it: ligatures such as U+FB01 ("fi") unfolded (NFKC), spaces collapsed."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


def pdf_problems(path: Path, chapters: int, title: str) -> list[str]:
    """What a reader of the printed book would miss: no bookmarks, fewer than ``chapters``, no cover, no contents."""
    if not path.is_file():
        return [f"no PDF at {path}: run `make pdf`"]
    found = read_pdf(path)
    problems = []
    if not found.outline:
        problems.append("the PDF has no bookmarks (outline)")
    elif len(found.outline) < chapters:
        problems.append(f"the PDF has {len(found.outline)} bookmarks for {chapters} chapters")
    if _words(title) not in _words(found.first_page_text):
        problems.append(f"the first page is not a cover with the title {title!r}")
    if found.internal_links < chapters:
        problems.append(f"{found.internal_links} internal links: no contents page linking the {chapters} chapters")
    return problems
