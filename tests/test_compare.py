"""scripts/compare.py: how a reproduction is compared with the checkout (the re-run itself is `make compare`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import compare  # noqa: E402


def test_csv_difference_names_the_largest_relative_change() -> None:
    old = b"a,b\n1.0,x\n2.0,y\n"
    assert compare.csv_difference(old, old) == "identical"
    assert compare.csv_difference(old, b"a,b\n1.0,x\n2.002,y\n") == "largest relative difference 1.0e-03"
    assert compare.csv_difference(old, b"a,b\n1.0,z\n2.0,y\n") == "1 text field(s) differ"
    assert compare.csv_difference(old, b"a,b\n1.0,x\n") == "differs in shape (rows or columns)"


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_data_report_lists_per_machine_files_without_comparing(tmp_path: Path) -> None:
    old = _tree(tmp_path / "old", {"data/x.csv": "v\n1\n", "data/gone.csv": "v\n"})
    new = _tree(tmp_path / "new", {"data/x.csv": "v\n1\n", "data/k/machines/cpu-a/e.csv": "e\n3e-07\n"})
    assert compare.data_report(old, new) == [
        ("gone.csv", "not written by the re-run"),
        ("k/machines/cpu-a/e.csv", "per-machine measurement of the re-run (not compared)"),
        ("x.csv", "identical"),
    ]


def test_notebook_report_names_the_changed_cells(tmp_path: Path) -> None:
    def notebook(root: Path, text: str) -> None:
        cells = [{"cell_type": "code", "outputs": []}, {"cell_type": "code", "outputs": [{"text": text}]}]
        (root / "c.ipynb").parent.mkdir(parents=True, exist_ok=True)
        (root / "c.ipynb").write_text(json.dumps({"cells": cells}))

    notebook(tmp_path / "old", "0.1235")
    notebook(tmp_path / "new", "0.1234")
    assert compare.notebook_report(tmp_path / "old", tmp_path / "new", [Path("c.ipynb")]) == [
        ("c.ipynb", "outputs changed in cells [1]")]
    notebook(tmp_path / "new", "0.1235")
    assert compare.notebook_report(tmp_path / "old", tmp_path / "new", [Path("c.ipynb")]) == [
        ("c.ipynb", "outputs unchanged")]


def test_perturbed_runs_the_command_in_the_changed_environment() -> None:
    script = [sys.executable, str(ROOT / "scripts" / "perturbed.py")]
    shown = subprocess.run([*script, "--", sys.executable, "-c", "import os; print(os.environ['OMP_NUM_THREADS'], "
                            "os.environ['MKL_CBWR'])"], capture_output=True, text=True, check=True)
    assert shown.stdout.split() == ["1", "COMPATIBLE"]
    refused = subprocess.run(script, capture_output=True, text=True)
    assert refused.returncode == 2 and "give a command after --" in refused.stderr


def test_csv_difference_says_when_only_the_writing_differs() -> None:
    assert compare.csv_difference(b"a\n1.0\n", b"a\n1.00\n") == "the same numbers, written differently (such as 1.0 and 1.00)"
