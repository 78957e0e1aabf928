"""The cell-tag rule (attnbook.celltags): plumbing off the rendered page, results never hidden;
and every notebook of the book follows it (scripts/tag_cells.py fixes one that does not)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import nbformat
import pytest

from attnbook import celltags

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from reproduce import toc_notebooks  # noqa: E402


def code(source: str, *outputs: dict, tags: tuple[str, ...] = ()) -> dict:
    return {"cell_type": "code", "source": source, "metadata": {"tags": list(tags)}, "outputs": list(outputs)}


def stdout(text: str) -> dict:
    return {"output_type": "stream", "name": "stdout", "text": text}


RECORD = {"output_type": "display_data", "data": {"application/papermill.record/text/plain": "3"}, "metadata": {}}


def test_parameters_cell_is_collapsed() -> None:
    assert celltags.required_tags(code("DEVICE = 'cpu'", tags=("parameters",))) == {"hide-cell"}
    assert celltags.required_tags(code("DEVICE = 'cuda'", tags=("injected-parameters",))) == {"hide-cell"}


def test_hash_and_write_lines_are_removed() -> None:
    cell = code("fig...; print('figure data sha256[:16]:', h)", RECORD, stdout("figure data sha256[:16]: ab12\n"))
    assert celltags.required_tags(cell) == {"remove-cell"}
    assert celltags.required_tags(code("book.write_csv(...)", stdout("wrote data/x.csv and data/x.csv.json\n"))) == {"remove-cell"}


def test_glue_only_cell_is_removed_and_glue_with_a_check_keeps_the_check() -> None:
    assert celltags.required_tags(code('glue("n", 3, display=False)', RECORD)) == {"remove-cell"}
    check = code('glue("n", n)\nprint("18 layouts, 18 match")', RECORD, stdout("18 layouts, 18 match\n"))
    assert celltags.required_tags(check) == {"hide-input"}


def test_a_result_is_never_removed() -> None:
    result = code("print(rank)", stdout("figure data: 3\nrank 12 of 16\n"), tags=("remove-cell",))
    assert celltags.required_tags(result) == set()
    assert celltags.forbidden_tags(result) == {"remove-cell"}
    assert celltags.violations([result]) == ["cell 0: missing [], forbidden ['remove-cell']"]
    celltags.apply([result])
    assert result["metadata"]["tags"] == []


def test_plain_code_is_left_alone_and_other_tags_kept() -> None:
    cell = code("x = sp.symbols('x')\nprint(x)", stdout("x\n"), tags=("hide-input",))
    assert celltags.violations([cell]) == []
    assert celltags.apply([cell]) == 0 and cell["metadata"]["tags"] == ["hide-input"]


def test_apply_is_idempotent_and_fixes_every_violation() -> None:
    cells = [code("DEVICE = 'cpu'", tags=("parameters",)), code('glue("a", 1)', RECORD),
             code("print('figure data: 1')", stdout("figure data: 1\n"), tags=("hide-input",))]
    assert len(celltags.violations(cells)) == 3
    assert celltags.apply(cells) == 3
    once = copy.deepcopy(cells)
    assert celltags.apply(cells) == 0 and cells == once
    assert celltags.violations(cells) == []
    assert cells[2]["metadata"]["tags"] == ["hide-input", "remove-cell"]


@pytest.mark.parametrize("notebook", toc_notebooks(), ids=str)
def test_every_book_notebook_follows_the_rule(notebook: Path) -> None:
    cells = nbformat.read(ROOT / notebook, as_version=4).cells
    bad = celltags.violations(cells)
    assert not bad, f"{notebook}: " + "; ".join(bad) + " (fix: python scripts/tag_cells.py)"
