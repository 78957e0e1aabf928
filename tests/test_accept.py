"""attnbook.accept: the canaries each experiment declares, and how make accept compares and records."""

from __future__ import annotations

import json
from pathlib import Path

import papermill
import pytest

from attnbook.accept import accepted_record, canary_parameters, compare_canaries
from attnbook.codehash import file_hash
from attnbook.provenance import currency

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted((ROOT / "experiments").glob("*.ipynb"))


@pytest.mark.parametrize("notebook", EXPERIMENTS, ids=lambda p: p.stem)
def test_every_experiment_declares_a_canary_of_its_own_parameters(notebook: Path) -> None:
    canary = canary_parameters(notebook)
    declared = papermill.inspect_notebook(str(notebook))
    assert set(canary) <= set(declared), set(canary) - set(declared)


def test_a_notebook_without_a_canary_or_with_a_forbidden_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps({"cells": [], "metadata": {}}))
    with pytest.raises(ValueError, match="declares no canary"):
        canary_parameters(path)
    path.write_text(json.dumps({"cells": [], "metadata": {"attnbook": {"canary": {"DEVICE": "cuda"}}}}))
    with pytest.raises(ValueError, match="may not set DEVICE"):
        canary_parameters(path)


def test_canaries_are_compared_file_by_file_sidecars_aside() -> None:
    base = {"data/a.csv": b"1\n", "data/a.csv.provenance.json": b"{old}", "data/b.csv": b"2\n"}
    assert compare_canaries(base, {**base, "data/a.csv.provenance.json": b"{new}"}) == []
    assert compare_canaries(base, {**base, "data/b.csv": b"3\n"}) == ["data/b.csv"]
    assert compare_canaries(base, {"data/a.csv": b"1\n"}) == ["data/b.csv"]


def test_an_accepted_record_keeps_its_bytes_and_takes_todays_dependencies(tmp_path: Path) -> None:
    code = tmp_path / "lib"
    (code / "attnid").mkdir(parents=True)
    (code / "attnid" / "only_full.py").write_text("X = 1\n")  # loaded by the full run, never by the canary
    record = {"file": "data/x.csv", "sha256": "s", "notebook": "experiments/e.ipynb", "parameters": {"SEEDS": 10},
              "rule": "ast-unparse/1", "depends_on": {"attnid/old.py": "1", "attnid/only_full.py": "2"},
              "notebook_source_sha256": "n0"}
    canary = {"rule": "ast-unparse/1", "depends_on": {"attnid/new.py": "3"}, "notebook_source_sha256": "n1",
              "parameters": {"SEEDS": 1}, "sha256": "other", "inputs": {"data/up.csv": "u"}}
    new = accepted_record(record, canary, "f" * 40, {"SEEDS": 1}, code)
    assert new["sha256"] == "s" and new["parameters"] == {"SEEDS": 10}
    # the canary's modules, and the full run's that the canary never loaded, re-hashed today; a gone one (renamed or
    # moved: attnid/old.py) is replaced by what the canary's run of today's code loaded
    assert new["depends_on"] == {"attnid/new.py": "3", "attnid/only_full.py": file_hash(code / "attnid" / "only_full.py")}
    assert new["notebook_source_sha256"] == "n1" and new["inputs"] == {"data/up.csv": "u"}
    assert new["accepted"] == {"by": "canary", "base": "f" * 40, "parameters": {"SEEDS": 1}}
    assert currency(new).startswith("canary at ffffffffff")


def _git(root: Path, *args: str) -> None:
    import subprocess

    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


@pytest.mark.slow
def test_make_accept_accepts_a_neutral_change_and_refuses_a_real_one(tmp_path: Path) -> None:
    # A tiny book in its own git repository: the real library, one experiment that counts a layout and writes it.
    import shutil

    import nbformat

    from attnbook.accept import accept
    from attnbook.provenance import read_all_provenance, stale_reasons

    root = tmp_path / "book"
    shutil.copytree(ROOT / "lib", root / "lib", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (root / "_toc.yml").write_text("root: intro\n")
    (root / "_config.yml").write_text("title: t\n")
    params = nbformat.v4.new_code_cell("DEVICE = 'cpu'\nPROGRESS = False\nWIDTHS = [4, 8]")
    params.metadata["tags"] = ["parameters"]
    body = nbformat.v4.new_code_cell(
        "import attnbook, attnid\n"
        "book = attnbook.setup('experiments/e.ipynb', globals())\n"
        "from attnid import _probe\n"
        "rows = [(d, attnid.count(attnid.AttentionSpec.create(d, 2)).unidentified, _probe.value(d)) for d in WIDTHS]\n"
        "book.write_csv('experiments/e.csv', ['d', 'unidentified', 'probe'], rows)\n")
    probe = root / "lib" / "attnid" / "_probe.py"
    probe.write_text("def value(d):\n    return d * d\n")
    nb = nbformat.v4.new_notebook(cells=[params, body])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["attnbook"] = {"canary": {"WIDTHS": [4]}}
    (root / "experiments").mkdir()
    nbformat.write(nb, root / "experiments" / "e.ipynb")
    _git(root, "init", "-q")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "empty")
    from attnbook.accept import run_canary

    run_canary(root, "experiments/e.ipynb", {})  # the full run: default parameters
    (root / "experiments" / "e.ipynb.canary.ipynb").unlink()
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "data")
    [record] = read_all_provenance(root)
    assert {"attnid/counts.py", "attnid/_probe.py"} <= set(record["depends_on"])
    assert stale_reasons(record, root, root / "lib") == []

    probe.write_text("def value(d):\n    return d ** 2  # stale by the rule, the same numbers\n")
    [record] = read_all_provenance(root)
    written = (root / "data" / "experiments" / "e.csv").read_bytes()
    assert written.startswith(b"d,unidentified,probe\n4,") and written.endswith(b",64\n")
    assert stale_reasons(record, root, root / "lib") == ["attnid/_probe.py changed"]
    [outcome] = accept(root)
    assert outcome.verdict == "accepted", outcome
    [record] = read_all_provenance(root)
    assert stale_reasons(record, root, root / "lib") == [] and record["accepted"]["by"] == "canary"
    assert (root / "data" / "experiments" / "e.csv").read_bytes() == written  # accept never touches a data file
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "accepted")

    probe.write_text("def value(d):\n    return d * d + 1\n")
    [outcome] = accept(root)
    assert outcome.verdict == "full run due" and "canary bytes differ in data/experiments/e.csv" in outcome.detail


def test_a_per_machine_file_is_matched_to_the_canarys_own_machine() -> None:
    from attnbook.accept import counterpart

    written = {"data/k/machines/this-t2/case.csv": b"1", "data/k/machines/this-t2/case.csv.provenance.json": b"{}",
               "data/other.csv": b"2"}
    assert counterpart("data/other.csv", written) == "data/other.csv"
    assert counterpart("data/k/machines/reference-t2/case.csv", written) == "data/k/machines/this-t2/case.csv"
    assert counterpart("data/k/machines/reference-t2/layer.csv", written) is None
    assert counterpart("data/k/case.csv", written) is None
