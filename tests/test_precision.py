"""The precision rule (attnbook.precision): what a stored output may show of a float, and the static scan
of every stored output of the book against it. The perturbed re-execution is `make test-notebooks`
(nbval under scripts/perturbed.py); its environment is checked here."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from attnbook import machine, precision

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from reproduce import toc_notebooks  # noqa: E402

BOOK = [pytest.param(p, id=str(p)) for p in toc_notebooks()]
# Floats beyond the rule that are exact by construction: token -> why. Keep this short.
ALLOWED: dict[str, str] = {}


@pytest.mark.parametrize(("token", "digits"), [
    ("0.03770", 4), ("123500.0", 4), ("2.5e-07", 2), ("138.20", 5), ("1e-06", 1), ("-0.1013", 4),
    ("1.0254072298606771", 17), ("1000000.0", 1), ("0.000", 0), ("+3.0", 1), ("26.168818", 8),
])
def test_significant_digits(token: str, digits: int) -> None:
    assert precision.significant_digits(token) == digits


def test_rounded_keeps_only_the_digits_asked_for() -> None:
    assert repr(precision.rounded(1.0254072298606771)) == "1.025"
    assert repr(precision.rounded(-0.10130000000000003)) == "-0.1013"
    assert repr(precision.rounded(3.0087869042594803e-07, 2)) == "3e-07"
    with pytest.raises(ValueError, match="digits must be between 1 and 6"):
        precision.rounded(1.0, 7)


def test_below_shows_the_bound_and_refuses_a_value_above_it() -> None:
    assert str(precision.below(3.0e-7, 1e-6)) == "below 1e-06"
    assert repr(precision.below(3.0e-7, 1e-6)) == "below 1e-06"  # no quotes when glued
    with pytest.raises(AssertionError, match="not below its stated bound 1e-06"):
        precision.below(1.2e-6, 1e-6, "error")
    with pytest.raises(AssertionError):
        precision.below(float("nan"), 1e-6)


def test_glue_refuses_a_container_of_floats() -> None:
    with pytest.raises(TypeError, match="glue each float on its own"):
        precision.glue("x", [0.1, 0.2])


def _notebook(tmp_path: Path, *outputs: dict, markdown: str = "") -> Path:
    cells = [{"cell_type": "markdown", "source": markdown, "metadata": {}},
             {"cell_type": "code", "source": "", "metadata": {}, "outputs": list(outputs)}]
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps({"cells": cells}))
    return path


def _record(name: str, text: str, digits: int | None) -> dict:
    meta = {"scrapbook": {"name": name}}
    if digits is not None:
        meta[precision.METADATA_KEY] = {"significant": digits}
    return {"output_type": "display_data", "data": {precision.RECORD_PREFIX + "text/plain": text}, "metadata": meta}


def test_scan_finds_a_raw_glued_float_and_a_long_printed_one(tmp_path: Path) -> None:
    # today's two failures in kind: a float glued at full repr, a long float printed
    path = _notebook(tmp_path, _record("slope", "1.0254072298606771", None),
                     {"output_type": "stream", "name": "stdout", "text": "fit 0.29447457570215346\n"})
    found = precision.stored_findings(path)
    assert [f.token for f in found] == ["1.0254072298606771", "1.0254072298606771", "0.29447457570215346"]
    assert "without attnbook.precision.glue" in found[0].reason
    assert precision.stored_findings(path, allowed={"1.0254072298606771": "x", "0.29447457570215346": "y"})[0]


def test_scan_accepts_glue_records_and_short_floats(tmp_path: Path) -> None:
    path = _notebook(tmp_path, _record("slope", "1.025", 4), _record("n", "12", None),
                     {"output_type": "stream", "name": "stdout", "text": "torch 2.13.0, rank 12, 0.1235 at 1e-06\n"},
                     {"output_type": "display_data", "data": {"text/markdown": "| 2.43e-12 | abead53acadd3f15 |"}})
    assert precision.stored_findings(path) == []


def test_scan_finds_a_record_with_more_digits_than_declared(tmp_path: Path) -> None:
    path = _notebook(tmp_path, _record("x", "0.12346", 4))
    assert "declared 4" in precision.stored_findings(path)[0].reason


def test_prose_may_not_show_more_digits_than_glued(tmp_path: Path) -> None:
    record = _record("loss", "138.2", 4)
    assert precision.reference_findings(_notebook(tmp_path, record, markdown="{glue:text}`loss:.1f`")) == []
    found = precision.reference_findings(_notebook(tmp_path, record, markdown="is {glue:text}`loss:.2f`."))
    assert [f.token for f in found] == ["loss:.2f -> 138.20"]
    big = _record("n", "12350.0", 4)
    assert precision.reference_findings(_notebook(tmp_path, big, markdown="{glue:text}`n:,.0f`")) == []


@pytest.mark.parametrize("notebook", BOOK)
def test_every_stored_output_follows_the_precision_rule(notebook: Path) -> None:
    found = precision.stored_findings(ROOT / notebook, ALLOWED, name=str(notebook))
    assert not found, "\n".join(map(str, found))


@pytest.mark.parametrize("notebook", BOOK)
def test_the_prose_shows_no_more_digits_than_glued(notebook: Path) -> None:
    found = precision.reference_findings(ROOT / notebook, name=str(notebook))
    assert not found, "\n".join(map(str, found))


@pytest.mark.parametrize("notebook", BOOK)
def test_chapters_glue_through_the_precision_helper(notebook: Path) -> None:
    cells = json.loads((ROOT / notebook).read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    assert not any(re.search(r"from myst_nb import .*\bglue\b|myst_nb\.glue\(", s) for s in sources)


def test_the_perturbed_environment_changes_the_numerics_but_not_openblas_core_type() -> None:
    env = machine.perturbed_environment()
    assert {"OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_CBWR"} <= set(env)
    assert not {"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"} & set(env)
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"test-notebooks:.*\n(\t.*\n)*\t.*scripts/perturbed\.py", makefile)


def test_fingerprint_names_the_numeric_environment() -> None:
    name = machine.fingerprint()
    assert re.fullmatch(r"[a-z0-9_-]+", name) and machine.description()["arch"].lower() in name


def test_only_the_reference_machine_folder_is_committed() -> None:
    # .gitignore ignores every data/**/machines/<fingerprint>/ except the book's reference machine
    ignore = (ROOT / ".gitignore").read_text().splitlines()
    assert "data/**/machines/*/" in ignore
    assert f"!data/kernels/machines/{machine.REFERENCE}/" in ignore
    assert machine.is_other_machine("kernels/machines/some-other-cpu/case_errors.csv")
    assert not machine.is_other_machine(f"kernels/machines/{machine.REFERENCE}/case_errors.csv")
    assert not machine.is_other_machine("machines.csv") and not machine.is_other_machine("census/census.csv")
