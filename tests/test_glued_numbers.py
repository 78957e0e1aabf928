"""The book's one rule for glued numbers (attnbook.sphinxext): E notation becomes a typeset power of ten."""

from __future__ import annotations

import pytest
from docutils import nodes
from docutils.frontend import get_default_settings
from docutils.parsers.rst import Parser
from docutils.utils import new_document

from attnbook import sphinxext


@pytest.mark.parametrize(("text", "shown"), [
    ("7.1e-03", "7.1 \u00d7 10\u207b\u00b3"),
    ("1e-10", "10\u207b\u00b9\u2070"),
    ("-2.50e+02", "\u22122.50 \u00d7 10\u00b2"),
    ("+0.0e+00", "+0.0"),
    ("[7.20e-03, 9.38e-03]", "[7.20 \u00d7 10\u207b\u00b3, 9.38 \u00d7 10\u207b\u00b3]"),
    ("8.8e-08 to 2.1e-07", "8.8 \u00d7 10\u207b\u2078 to 2.1 \u00d7 10\u207b\u2077"),
    ("1.5E5", "1.5 \u00d7 10\u2075"),
])
def test_e_notation_becomes_a_power_of_ten_with_its_digits(text: str, shown: str) -> None:
    assert sphinxext.power_of_ten(text) == shown


@pytest.mark.parametrize("text", ["0.0123", "42", "d=16 H=2", "9f0ece20da5d8fa6", "x1e5", "below 1e", "e-05"])
def test_anything_else_is_left_alone(text: str) -> None:
    assert sphinxext.power_of_ten(text) == text


def _document(*inlines: nodes.Node) -> nodes.document:
    doc = new_document("probe", get_default_settings(Parser))
    doc += nodes.paragraph("", "", *inlines)
    return doc


def test_only_glued_text_is_rewritten() -> None:
    glued = nodes.inline("2.7e-04", "2.7e-04", classes=["pasted-text"])
    any_role = nodes.inline("1e-06", "1e-06", classes=["output", "text_plain"])
    plain = nodes.inline("3e-04", "3e-04", classes=["other"])
    doc = _document(glued, any_role, plain)
    sphinxext.typeset_glued_numbers(None, doc, "probe")
    assert [glued.astext(), any_role.astext(), plain.astext()] == ["2.7 \u00d7 10\u207b\u2074", "10\u207b\u2076", "3e-04"]


def test_a_quoted_string_and_a_bold_number_are_warned_about(monkeypatch: pytest.MonkeyPatch) -> None:
    quoted = nodes.inline("'1e-06'", "'1e-06'", classes=["pasted-text"])
    bold = nodes.strong("", "", nodes.inline("20", "20", classes=["pasted-text"]))
    messages: list[str] = []
    monkeypatch.setattr(sphinxext.LOG, "warning", lambda message, **kwargs: messages.append(message))
    sphinxext.typeset_glued_numbers(None, _document(quoted, bold), "probe")
    assert any("quote marks" in m for m in messages) and any("bold" in m for m in messages), messages


@pytest.mark.parametrize(("alt", "why"), [
    (None, "no alt text"), ("  ", "no alt text"), ("_images/abc123.svg", "file name"), ("fig.png", "file name"),
    ("figure data", "fewer than"),
])
def test_a_figure_without_words_for_its_alt_text_is_found(alt: str | None, why: str) -> None:
    assert why in sphinxext.alt_problem(alt)


def test_a_figure_with_an_alt_text_passes_and_one_without_is_warned_about(monkeypatch: pytest.MonkeyPatch) -> None:
    warned = []
    monkeypatch.setattr(sphinxext.LOG, "warning", lambda message, location=None: warned.append(message))
    doc = new_document("test", get_default_settings(Parser))
    good = nodes.figure("", nodes.image(uri="a.svg", alt="Shares against the step, one line per optimiser"))
    bad = nodes.figure("", nodes.image(uri="_images/b.svg"))
    doc += [good, bad, nodes.image(uri="logo.svg")]  # an image outside a figure (a logo) is not checked
    sphinxext.figure_alt_text(None, doc, "test")
    assert len(warned) == 1 and "no alt text" in warned[0]
