"""Every page of the built book in headless Chromium, offline, at desktop and phone widths;
and proof that the checks catch a broken page (an undefined macro, a wide table without a
scroll container, a missing image, a request to the network)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from attnbook.browser import WIDTHS, book_pages, check_book

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "_build" / "screenshots"


def test_every_page_reads_offline(html_root: Path) -> None:
    pages = book_pages(html_root)
    assert len(pages) >= 10, f"only {len(pages)} pages under {html_root}"
    for old in SCREENSHOTS.glob("*.png"):  # count only the screenshots this run takes
        old.unlink()
    # the first screen of each page; FULL_SCREENSHOTS=1 (make test-browser FULL_SCREENSHOTS=1) the whole page
    problems = check_book(html_root, pages, screenshots=SCREENSHOTS, full_page=bool(os.environ.get("FULL_SCREENSHOTS")))
    assert not problems, f"{len(problems)} problem(s):\n" + "\n".join(map(str, problems))
    assert len(list(SCREENSHOTS.glob("*.png"))) >= len(pages) * len(WIDTHS)


def test_math_is_typeset_from_the_book_itself(html_root: Path) -> None:
    page = (html_root / "chapters" / "03_many_heads.html").read_text()
    assert "mathjax/tex-chtml.js" in page and "cdn." not in page
    assert (html_root / "_static" / "mathjax" / "tex-chtml.js").is_file()


@pytest.fixture()
def broken(html_root: Path) -> Iterator:
    """Write a copy of the first page, broken by ``edit``, next to it; remove it afterwards."""
    made: list[Path] = []

    def make(name: str, html: str) -> Path:
        source = (html_root / "intro.html").read_text()
        article = re.search(r'<article class="bd-article"[^>]*>', source)
        assert article, "intro.html has no <article class=bd-article>"
        path = html_root / f"_probe_{name}.html"
        path.write_text(source[:article.end()] + html + source[article.end():])
        made.append(path)
        return path

    yield make
    for path in made:
        path.unlink(missing_ok=True)


def kinds(html_root: Path, page: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for problem in check_book(html_root, [page], widths=WIDTHS[:1]):
        found.setdefault(problem.kind, []).append(problem.detail)
    return found


def test_an_undefined_macro_fails(html_root: Path, broken) -> None:  # noqa: ANN001
    page = broken("macro", r'<p><span class="math notranslate nohighlight">\(\nosuchmacro{x}\)</span></p>')
    found = kinds(html_root, page)
    assert any("nosuchmacro" in d for d in found.get("math", [])), found


def test_a_book_macro_typesets(html_root: Path, broken) -> None:  # noqa: ANN001
    page = broken("bookmacro", r'<p><span class="math notranslate nohighlight">\(\WQ \fiber{\theta} \R^{d}\)</span></p>')
    assert kinds(html_root, page) == {}


def test_a_wide_table_without_a_container_fails(html_root: Path, broken) -> None:  # noqa: ANN001
    wide = '<table style="display: table"><tr><td style="min-width: 1600px">wide</td></tr></table>'
    found = kinds(html_root, broken("table", wide))
    assert any("<table" in d for d in found.get("overflow", [])), found


def test_a_wide_table_in_the_book_style_scrolls(html_root: Path, broken) -> None:  # noqa: ANN001
    wide = '<table><tr><td style="min-width: 1600px">wide</td></tr></table>'
    assert kinds(html_root, broken("scrolls", wide)) == {}


def test_a_missing_image_a_network_request_and_a_dead_link_fail(html_root: Path, broken) -> None:  # noqa: ANN001
    html = ('<img src="_images/no-such-figure.svg" alt="x"><img src="https://example.org/x.png" alt="y">'
            '<a href="prf-prf.html#x">proof index</a>')
    found = kinds(html_root, broken("image", html))
    assert any("no-such-figure" in d for d in found.get("image", [])), found
    assert any("example.org" in d for d in found.get("network", [])), found
    assert any(d.endswith("prf-prf.html") for d in found.get("link", [])), found


def test_a_figure_wider_than_the_column_fails_even_in_a_scroll_box(html_root: Path, broken) -> None:  # noqa: ANN001
    svg = next((html_root / "_images").glob("*.svg")).name
    html = (f'<figure id="probe-wide" style="overflow-x: auto"><img src="_images/{svg}" alt="wide" '
            f'style="min-width: 1600px; max-width: none"></figure>')
    found = kinds(html_root, broken("figure", html))
    assert any("probe-wide" in d for d in found.get("figure", [])), found


def test_a_figure_fits_the_phone_and_opens_at_full_size(html_root: Path, broken) -> None:  # noqa: ANN001
    svg = next((html_root / "_images").glob("*.svg")).name
    page = broken("phonefigure", f'<figure id="probe-fits"><img src="_images/{svg}" alt="fits"></figure>')
    assert not [p for p in check_book(html_root, [page], widths=WIDTHS) if p.kind in ("figure", "overflow")]


def test_a_display_equation_wider_than_the_phone_fails(html_root: Path, broken) -> None:  # noqa: ANN001
    # a rule 40 em long: nothing MathJax can break (it breaks long sums and even \\mbox text over lines)
    wide = r'<div class="math notranslate nohighlight" id="probe-eq">\[x = \rule{40em}{1pt}\]</div>'
    found = {}
    for problem in check_book(html_root, [broken("equation", wide)], widths=WIDTHS[1:]):
        found.setdefault(problem.kind, []).append(problem.detail)
    assert any("px wide in a" in d for d in found.get("equation", [])), found


def test_a_long_display_equation_is_broken_over_lines_on_the_phone(html_root: Path, broken) -> None:  # noqa: ANN001
    long = r'<div class="math notranslate nohighlight">\[' + " + ".join(f"a_{{{i}}} b_{{{i}}}" for i in range(40)) + r'\]</div>'
    problems = check_book(html_root, [broken("longequation", long)], widths=WIDTHS[1:])
    assert not [p for p in problems if p.kind in ("equation", "overflow")], problems


def test_a_text_output_wider_than_the_column_fails_at_desktop_width(html_root: Path, broken) -> None:  # noqa: ANN001
    wide = '<div class="cell_output docutils container"><div class="output stream highlight-myst-ansi notranslate">' \
           '<div class="highlight"><pre id="probe-pre">' + "x" * 400 + '</pre></div></div></div>'
    found = kinds(html_root, broken("output", wide))
    # sphinx-copybutton renumbers every <pre> (codecell0, ...), so the probe is known by its text, not its id
    assert any("x" * 60 in d and "a text output the reader has to scroll" in d for d in found.get("output", [])), found
    narrow = wide.replace("x" * 400, "x" * 40)
    assert "output" not in kinds(html_root, broken("narrowoutput", narrow))


def phone_kinds(html_root: Path, page: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for problem in check_book(html_root, [page], widths=WIDTHS[1:]):
        found.setdefault(problem.kind, []).append(problem.detail)
    return found


def test_a_text_output_that_scrolls_on_a_phone_fails_there(html_root: Path, broken) -> None:  # noqa: ANN001
    output = '<div class="cell_output docutils container"><div class="output stream highlight-myst-ansi notranslate">' \
             '<div class="highlight"><pre>' + "y" * 70 + '</pre></div></div></div>'
    assert "output" not in kinds(html_root, broken("phoneoutput", output))  # 70 characters fit at desktop width (90 did not with the monospace font of a fresh machine: 791 px in 688)
    found = phone_kinds(html_root, broken("phoneoutput", output))
    assert any("y" * 60 in d for d in found.get("output", [])), found
    code = '<div class="highlight-bash notranslate"><div class="highlight"><pre style="white-space: pre">' + "z" * 90 + \
           '</pre></div></div>'
    assert "output" not in phone_kinds(html_root, broken("phonecode", code))  # a code block may scroll on a phone


def test_glued_numbers_with_quotes_e_notation_or_bold_fail(html_root: Path, broken) -> None:  # noqa: ANN001
    html = ('<p>quoted <span class="pasted-text" id="probe-q">\'1e-06\'</span>, '
            'raw <span class="output text_plain" id="probe-e">2.7e-04</span>, '
            'bold <strong><span class="pasted-text" id="probe-b">20</span></strong></p>')
    found = kinds(html_root, broken("glue", html))
    details = found.get("glue", [])
    assert any("probe-q" in d and "quote marks" in d for d in details), found
    assert any("probe-e" in d and "E notation" in d for d in details), found
    assert any("probe-b" in d and "bold" in d for d in details), found
    typeset = '<p>fine <span class="pasted-text">2.7 × 10⁻⁴</span>, a hash <span class="pasted-text">9f0e1e20</span></p>'
    assert kinds(html_root, broken("gluefine", typeset)) == {}


def test_raw_tex_and_a_raw_markdown_table_fail(html_root: Path, broken) -> None:  # noqa: ANN001
    html = (r'<p id="probe-tex">dividing by $b_T = \sum_j e^{s_j}$ gives</p>'
            '<p id="probe-md">| module | max |\n|---|---:|\n| a | 1 |</p>')
    found = kinds(html_root, broken("raw", html))
    assert any("probe-tex" in d for d in found.get("raw", [])), found
    assert any("probe-md" in d for d in found.get("raw", [])), found
    code = r'<div class="highlight"><pre>print("$x$ \\alpha | --- |")</pre></div>'
    assert kinds(html_root, broken("rawcode", code)) == {}


def test_a_phone_table_that_scrolls_needs_a_sticky_narrow_first_column(html_root: Path, broken) -> None:  # noqa: ANN001
    cells = "".join(f"<td>value {i} with some width</td>" for i in range(8))
    loose = (f'<table id="probe-loose"><tr><th style="position: static">name</th>{cells}</tr></table>')
    fat = (f'<table id="probe-fat"><tr><th style="min-width: 300px">a very long row name</th>{cells}</tr></table>')
    found = phone_kinds(html_root, broken("table", loose + fat))
    assert any("probe-loose" in d and "scrolls away" in d for d in found.get("table", [])), found
    assert any("probe-fat" in d and "sticky first column" in d for d in found.get("table", [])), found
    fine = f'<table id="probe-fine"><tr><th>name</th>{cells}</tr></table>'
    assert "table" not in phone_kinds(html_root, broken("tablefine", fine))


def test_a_long_code_line_wraps_and_an_unwrapped_one_fails_at_desktop_width(html_root: Path, broken) -> None:  # noqa: ANN001
    line = "make reproduce  # " + "a long comment that runs on " * 12
    block = f'<div class="highlight-bash notranslate"><div class="highlight"><pre>{line}</pre></div></div>'
    assert "output" not in kinds(html_root, broken("codewraps", block))
    rigid = block.replace("<pre>", '<pre style="white-space: pre">')
    assert any("a long comment" in d for d in kinds(html_root, broken("coderigid", rigid)).get("output", []))


def test_a_number_broken_over_two_lines_fails(html_root: Path, broken) -> None:  # noqa: ANN001
    # as if book.css did not keep numbers whole: the browser then breaks "7.9e-02" after its minus sign
    squeezed = ('<style>#probe-num span.nobreak { white-space: normal !important; }</style>'
                '<table><tr><td id="probe-num" style="max-width: 2.5em; width: 2.5em">7.9e-02</td><td>x</td></tr></table>')
    found = kinds(html_root, broken("number", squeezed))
    assert any("probe-num" in d and "7.9e-02" in d for d in found.get("number", [])), found
    # the book's own cells keep a number on one line (book.js wraps it in span.nobreak, which book.css keeps whole)
    fine = '<table><tr><td style="max-width: 2.5em; width: 2.5em">7.9e-02</td><td>x</td></tr></table>'
    assert "number" not in kinds(html_root, broken("numberfine", fine))


def test_a_table_that_scrolls_without_a_hint_fails(html_root: Path, broken) -> None:  # noqa: ANN001
    cells = "".join(f'<td style="white-space: nowrap">value {i} with some width</td>' for i in range(12))
    table = f'<table id="probe-wide"><tr><th>name</th>{cells}</tr></table>'
    hidden = '<style>.table-scroll-hint { display: none !important; }</style>' + table
    found = kinds(html_root, broken("nohint", hidden))
    assert any("probe-wide" in d and "nothing above it says so" in d for d in found.get("table", [])), found
    assert "table" not in kinds(html_root, broken("hint", table))  # book.js puts the hint above it
