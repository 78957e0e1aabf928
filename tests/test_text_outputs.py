"""Every text output on a book page is prose, so that it can wrap at the column's edge (book.css): a table
is a Markdown table (``attnbook.tables``), which the browser lays out, never columns set apart by spaces."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from reproduce import toc_notebooks  # noqa: E402

COLUMNS = re.compile(r"\S {2,}\S")  # two words set apart by a run of spaces: a hand-aligned column
RICH = {"text/html", "text/markdown", "image/svg+xml", "image/png"}


def text_of(output: dict) -> str:
    """The plain text a page shows for one output ('' when a richer form is shown instead)."""
    if output.get("output_type") == "stream":
        return "".join(output.get("text", ""))
    data = output.get("data", {})
    return "" if RICH & set(data) else "".join(data.get("text/plain", ""))


def hand_printed_tables(text: str) -> list[str]:
    """The lines of a text output that look like rows of a table printed by hand (two or more such lines)."""
    rows = [line for line in text.splitlines() if COLUMNS.search(line.strip())]
    return rows if len(rows) >= 2 else []


def test_the_rule_finds_a_hand_printed_table_and_passes_prose() -> None:
    assert hand_printed_tables("int8  original 0.0167  balanced 0.0154\nint4  original 0.25  balanced 0.246\n")
    assert not hand_printed_tables("one line  with a gap\nand prose on the next\n")
    assert not hand_printed_tables("")


@pytest.mark.parametrize("notebook", toc_notebooks(), ids=lambda p: p.name)
def test_no_book_page_prints_a_table_by_hand(notebook: Path) -> None:
    nb = nbformat.read(notebook, as_version=4)
    found = [(i, hand_printed_tables(text_of(o))[:2]) for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
             for o in cell.get("outputs", []) if hand_printed_tables(text_of(o))]
    assert not found, f"{notebook.name}: cell outputs printed as hand-aligned tables (use a Markdown table): {found}"
