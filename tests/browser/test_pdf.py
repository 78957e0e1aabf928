"""The printed book (make pdf): cover, contents, bookmarks, nothing cut off; and proof that each check fails
on a document broken on purpose."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnbook import pdf

ROOT = Path(__file__).resolve().parents[2]
BOOK_PDF = ROOT / "_build" / "pdf" / "book.pdf"

PROBE = """<!doctype html><html><head><meta charset="utf-8"><title>probe</title></head><body>
<article class="bd-article"><section id="probe-book"><h1>Probe book</h1><p>Lead.</p>
<section id="two"><h2>Two</h2><p>Text.</p></section></section>
<span id="document-chapter"></span><section id="chapter"><h3>1. A chapter</h3><p>Chapter text.</p>
<section id="part"><h4>1.1. A part</h4>{body}</section></section></article></body></html>"""


def _chapters() -> int:
    """The chapters of the one-page build: one per document after the landing page."""
    html = (ROOT / "_build" / "singlehtml" / "intro.html").read_text()
    return html.count('<span id="document-')


def test_the_book_pdf_has_a_cover_contents_bookmarks_and_every_chapter() -> None:
    if not BOOK_PDF.is_file():
        pytest.fail(f"no {BOOK_PDF}: `make test-browser` runs `make pdf` first")
    chapters = _chapters()
    assert chapters >= 15
    assert pdf.pdf_problems(BOOK_PDF, chapters, "Attention as parameter identification") == []
    found = pdf.read_pdf(BOOK_PDF)
    assert found.pages > 100 and len(found.outline) > 2 * chapters
    assert (ROOT / "_build" / "html" / "book.pdf").is_file()  # the landing page links it


def _probe(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "probe.html"
    path.write_text(PROBE.format(body=body))
    return path


def test_a_probe_prints_with_bookmarks_page_numbers_and_a_fitted_table(tmp_path: Path) -> None:
    wide = '<table><tr>' + "".join(f"<td>column{i}</td>" for i in range(16)) + "</tr></table>"
    report = pdf.print_book(_probe(tmp_path, wide), tmp_path / "probe.pdf")
    assert report.chapters == 1 and report.fitted == 1  # the table was scaled to the column
    found = pdf.read_pdf(tmp_path / "probe.pdf")
    assert found.outline == ("Probe book", "Two", "1. A chapter", "1.1. A part")
    assert found.pages == 4  # cover, contents, the landing page, the chapter on its own page
    assert "Probe book" in found.first_page_text
    assert pdf.pdf_problems(tmp_path / "probe.pdf", 1, "Probe book") == []


@pytest.mark.parametrize("body, what", [
    ('<div style="width: 300px; overflow: hidden; white-space: nowrap">' + "a box that cuts its content " * 8 + '</div>',
     "cut by its box"),
    ('<pre>' + "x" * 40 + '</pre><div style="width: 2000px">far too wide to scale</div>', "past the column"),
    ('<table><tr>' + "".join(f"<td>columnnumber{i}</td>" for i in range(40)) + '</tr></table>', "needs"),
    ('<mjx-container display="true"><mjx-math data-latex="f(X) = \\sum_h g_h"><mjx-mtr><mjx-mtd><span>f(X) =</span></mjx-mtd>'
     '<mjx-mtd style="position: relative; left: -40px"><span>the sum over every head</span></mjx-mtd></mjx-mtr></mjx-math>'
     '</mjx-container>', "overprinted"),
], ids=["clipped-box", "past-column", "too-wide-to-scale", "overprinted-math"])
def test_content_cut_off_on_paper_fails(tmp_path: Path, body: str, what: str) -> None:
    with pytest.raises(pdf.ClippedContent, match=what):
        pdf.print_book(_probe(tmp_path, body), tmp_path / "probe.pdf")
    assert not (tmp_path / "probe.pdf").exists()  # nothing half-written


def test_a_pdf_without_bookmarks_cover_or_contents_fails(tmp_path: Path) -> None:
    from pypdf import PdfWriter

    writer = PdfWriter()
    writer.add_blank_page(595, 842)
    bare = tmp_path / "bare.pdf"
    with open(bare, "wb") as out:
        writer.write(out)
    problems = pdf.pdf_problems(bare, 3, "Probe book")
    assert any("no bookmarks" in p for p in problems) and any("cover" in p for p in problems)
    assert any("contents" in p for p in problems)
    assert pdf.pdf_problems(tmp_path / "missing.pdf", 3, "x") == [f"no PDF at {tmp_path / 'missing.pdf'}: run `make pdf`"]
