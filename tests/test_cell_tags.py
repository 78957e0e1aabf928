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
    assert celltags.apply([cell]) == 1 and cell["metadata"]["tags"] == ["hide-input"]  # only its button labelled
    assert celltags.violations([cell]) == [] and celltags.apply([cell]) == 0


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


def test_a_long_cell_that_shows_a_result_is_collapsed_and_its_result_kept() -> None:
    long = "\n".join(f"x{i} = {i}" for i in range(celltags.LONG_CELL_LINES + 1))
    assert celltags.required_tags(code(long, stdout("a result\n"))) == {"hide-input"}
    assert celltags.required_tags(code(long)) == set()  # nothing shown: nothing pushed off the page
    short = "\n".join(f"x{i} = {i}" for i in range(celltags.LONG_CELL_LINES))
    assert celltags.required_tags(code(short, stdout("a result\n"))) == set()


def test_every_collapsed_cell_says_what_its_button_opens() -> None:
    cells = [code("DEVICE = 'cpu'", tags=("parameters",)), code('book = attnbook.setup(NB, globals())\nglue("a", 1)', RECORD,
             stdout("shown\n")), code('glue("b", 2)\nprint(2)', RECORD, stdout("2\n")), code("y = 1")]
    celltags.apply(cells)
    shows = [c["metadata"].get("mystnb", {}).get("code_prompt_show") for c in cells]
    assert shows == [celltags.PROMPTS["parameters"][0], celltags.PROMPTS["setup"][0], celltags.PROMPTS["result"][0], None]
    cells[2]["metadata"]["mystnb"]["code_prompt_show"] = "Show code cell source"
    assert any("button" in line for line in celltags.violations(cells))


def test_a_cell_that_glues_with_glue_all_is_plumbing_too() -> None:
    assert celltags.required_tags(code('glue_all({"a": 1})', RECORD)) == {"remove-cell"}
    assert celltags.required_tags(code('glue_all(found)\nprint("shown")', RECORD, stdout("shown\n"))) == {"hide-input"}
    assert celltags.required_tags(code('my_glue_all(x)', stdout("shown\n"))) == set()
