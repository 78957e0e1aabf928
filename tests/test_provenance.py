"""attnbook.provenance: atomic writes, sidecars, and staleness that follows what a result really depended on."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest

from attnbook.machine import is_other_machine
from attnbook.paths import repo_root
from attnbook.codehash import LEGACY_RULE, RULE, file_hash, normalised_source, reads_docstrings
from attnbook.provenance import (
    SIDECAR_SUFFIX,
    csv_text,
    currency,
    migrated,
    sidecar_bytes,
    code_root,
    notebook_parameters,
    notebook_source_hash,
    read_all_provenance,
    stale_reasons,
    write_bytes,
    write_csv,
)

ROOT = Path(__file__).resolve().parents[1]


def _book(tmp_path: Path, parameters: str = "SEED = 3\nSIZES = [1, 2]") -> Path:
    """A minimal book root: the two marker files and one notebook with a parameters cell."""
    (tmp_path / "_toc.yml").write_text("root: intro\n")
    (tmp_path / "_config.yml").write_text("title: t\n")
    cell = nbformat.v4.new_code_cell(parameters)
    cell.metadata["tags"] = ["parameters"]
    (tmp_path / "chapters").mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=[cell, nbformat.v4.new_code_cell("x = 1")]),
                   tmp_path / "chapters" / "n.ipynb")
    return tmp_path


def _write(root: Path, name: str = "sub/table.csv", rows=((1, "x"), (2, "y")), **params) -> Path:
    return write_csv(name, ["a", "b"], rows, notebook="chapters/n.ipynb",
                     parameters=params or {"SEED": 3, "SIZES": [1, 2]}, device="cpu", root=root)


def test_write_csv_writes_file_and_sidecar(tmp_path: Path) -> None:
    root = _book(tmp_path)
    out = _write(root)
    assert out == root / "data" / "sub" / "table.csv"
    assert out.read_text() == "a,b\n1,x\n2,y\n"
    record = json.loads(out.with_name("table.csv" + SIDECAR_SUFFIX).read_text())
    assert record["file"] == "data/sub/table.csv"
    assert record["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert record["notebook"] == "chapters/n.ipynb"
    assert record["parameters"] == {"SEED": 3, "SIZES": [1, 2]}
    assert record["device"] == "cpu"
    assert {"python", "torch", "numpy", "attnid"} <= set(record["versions"])
    assert record["rule"] == RULE and "accepted" not in record
    # plumbing that only moves bytes is no dependency (NOT_A_DEPENDENCY): its format is checked below instead
    assert "attnbook/provenance.py" not in record["depends_on"] and "attnbook/codehash.py" not in record["depends_on"]
    assert read_all_provenance(root) == [record]
    assert stale_reasons(record, root) == []
    for path in (out, out.with_name("table.csv" + SIDECAR_SUFFIX)):
        assert path.stat().st_mode & 0o777 == 0o644


def test_sidecar_is_byte_stable(tmp_path: Path) -> None:
    root = _book(tmp_path)
    out = _write(root)
    first = out.with_name(out.name + SIDECAR_SUFFIX).read_bytes()
    _write(root)
    assert out.with_name(out.name + SIDECAR_SUFFIX).read_bytes() == first


def test_failed_rename_leaves_old_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "f.csv"
    target.write_text("old\n")

    def broken_replace(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        write_bytes(target, b"new\n")
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.csv"]


def test_bad_requests_write_nothing(tmp_path: Path) -> None:
    root = _book(tmp_path)
    with pytest.raises(ValueError, match="data files live under"):
        write_csv(tmp_path / "elsewhere.csv", ["a"], [(1,)], notebook="chapters/n.ipynb", parameters={},
                  device="cpu", root=root)
    with pytest.raises(ValueError, match="has 1 fields, the header has 2"):
        _write(root, rows=[(1,)])
    with pytest.raises(ValueError, match="not found"):
        write_csv("y.csv", ["a"], [(1,)], notebook="chapters/nope.ipynb", parameters={}, device="cpu", root=root)
    # a parameter JSON cannot hold is refused before either file is written
    with pytest.raises(ValueError, match="plain JSON values"):
        _write(root, SEED=np.float32(1.5))
    assert not (root / "data").exists()


def test_notebook_hash_ignores_outputs_and_injected_cells(tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# t"), nbformat.v4.new_code_cell("x = 1")])
    path = tmp_path / "n.ipynb"
    nbformat.write(nb, path)
    base = notebook_source_hash(path)
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="1\n")]
    injected = nbformat.v4.new_code_cell("x = 2")
    injected.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(1, injected)
    nbformat.write(nb, path)
    assert notebook_source_hash(path) == base
    nb.cells[2].source = "x = 3"
    nbformat.write(nb, path)
    assert notebook_source_hash(path) != base


def test_notebook_parameters_reads_literal_defaults(tmp_path: Path) -> None:
    root = _book(tmp_path, 'A = 1  # comment\nB = {"x": [1.5, "s"]}\nC = A + 1')
    assert notebook_parameters(root / "chapters" / "n.ipynb") == {"A": 1, "B": {"x": [1.5, "s"]}}


def test_root_is_found_from_a_subfolder_or_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _book(tmp_path)
    monkeypatch.delenv("ATTNBOOK_ROOT", raising=False)
    assert repo_root(root / "chapters") == root.resolve()
    with pytest.raises(FileNotFoundError, match="no book root"):
        repo_root(Path("/"))
    monkeypatch.setenv("ATTNBOOK_ROOT", str(root / "chapters"))
    with pytest.raises(FileNotFoundError, match="not the book's root"):
        repo_root()


def test_source_and_parameter_changes_make_data_stale(tmp_path: Path) -> None:
    root = _book(tmp_path)
    record = json.loads(_write(root).with_name("table.csv" + SIDECAR_SUFFIX).read_text())
    path = root / "chapters" / "n.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells[0].source = "SEED = 4\nSIZES = [1, 2]"
    nbformat.write(nb, path)
    reasons = stale_reasons(record, root)
    assert "chapters/n.ipynb changed" in reasons and "ran with non-default parameters SEED" in reasons
    (root / "data" / "sub" / "table.csv").write_text("a,b\n")
    assert any("differs from the bytes" in r for r in stale_reasons(record, root))


def _dependencies_written_after(imports: str, tmp_path: Path) -> dict:
    """depends_on of a data file that a fresh process writes after ``imports``."""
    root = _book(tmp_path)
    script = (f"{imports}\nfrom attnbook.provenance import write_csv\n"
              f"write_csv('t.csv', ['a'], [(1,)], notebook='chapters/n.ipynb', parameters={{}}, device='cpu',"
              f" root=__import__('pathlib').Path({str(root)!r}))\n")
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path)
    return json.loads((root / "data" / ("t.csv" + SIDECAR_SUFFIX)).read_text())["depends_on"]


def test_dependencies_are_the_modules_the_writer_loaded(tmp_path: Path) -> None:
    # A fresh process that imports attnid.counts (and so the package's core, which `import attnid` loads)
    # before writing, but none of the census, the kernels or the training code.
    deps = _dependencies_written_after("import attnid.counts", tmp_path)
    assert {"attnid/counts.py", "attnid/spec.py", "attnid/normalise.py"} <= set(deps)
    assert "attnbook/provenance.py" not in deps  # plumbing
    assert not {"attnid/census.py", "attnid/architectures.yaml", "attnid/kernels/flash.py", "attnid/train/training.py"} & set(deps)


def test_a_module_that_affects_no_data_is_not_a_dependency(tmp_path: Path) -> None:
    # attnbook.style draws figures only (NOT_A_DEPENDENCY): loading it must not tie data files to it.
    deps = _dependencies_written_after("import attnid.counts, attnbook.style", tmp_path)
    assert "attnid/counts.py" in deps and "attnbook/style.py" not in deps


def _chapter_record(name: str) -> dict:
    return next(r for r in read_all_provenance(ROOT) if r["file"] == name)


def test_editing_a_module_the_chapter_did_not_import_keeps_it_current(tmp_path: Path) -> None:
    # Chapter 2's stored sweep, checked against a copy of the library that we then edit.
    record = _chapter_record("data/one_head/width_sweep.csv")
    code = tmp_path / "lib"
    shutil.copytree(code_root(), code, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    assert stale_reasons(record, ROOT, code) == []
    unused = ["attnid/census.py", "attnid/kernels/flash.py", "attnid/train/training.py"]
    assert not set(unused) & set(record["depends_on"])
    for rel in unused:
        with open(code / rel, "a") as handle:
            handle.write("\n# an edit this chapter never imports\n")
    assert stale_reasons(record, ROOT, code) == []
    used = "attnid/counts.py"
    assert used in record["depends_on"]
    with open(code / used, "a") as handle:
        handle.write("\n# a comment: no change in behaviour\n")
    assert stale_reasons(record, ROOT, code) == []
    with open(code / used, "a") as handle:
        handle.write("\nCOUNTING_RULES_EDITED = True\n")
    assert stale_reasons(record, ROOT, code) == [f"{used} changed"]


def test_every_committed_chapter_data_file_is_current() -> None:
    # A chapter's data file is stale when its bytes, its notebook, its parameters or a module it loaded
    # changed: run `make reproduce` and commit. Benchmarks (written by scripts, some only on a GPU) may be
    # older than the code; the appendix table says so, and their bytes must still match their sidecars.
    # other machines' per-machine folders (git-ignored, written by runs in another numeric environment, such as
    # nbval's) are theirs to refresh: only the committed data must be current
    records = [r for r in read_all_provenance(ROOT) if not is_other_machine(r["file"])]
    assert any(r["notebook"].endswith(".ipynb") for r in records)
    stale = {r["file"]: stale_reasons(r, ROOT) for r in records if r["notebook"].endswith(".ipynb")}
    assert not {f: why for f, why in stale.items() if why}
    for r in records:
        assert (ROOT / r["file"]).is_file() and hashlib.sha256((ROOT / r["file"]).read_bytes()).hexdigest() == r["sha256"]
        assert r["depends_on"], f"{r['file']}: its sidecar records no dependencies"
    for data_file in (ROOT / "data").rglob("*"):
        if data_file.is_file() and not data_file.name.endswith(SIDECAR_SUFFIX):
            assert data_file.with_name(data_file.name + SIDECAR_SUFFIX).is_file(), f"{data_file} has no sidecar"


def test_every_experiment_notebook_has_current_data() -> None:
    # experiments/*.ipynb are executed by `make experiments`, not by nbval: this is their guard. Each must
    # have written at least one committed data file, and each of those must be current with the
    # notebook's source, its parameter defaults and the library modules it loaded.
    import importlib.util

    spec = importlib.util.spec_from_file_location("reproduce", ROOT / "scripts" / "reproduce.py")
    assert spec and spec.loader
    reproduce = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reproduce)
    records = read_all_provenance(ROOT)
    for notebook in reproduce.experiment_notebooks(ROOT):
        written = [r for r in records if r["notebook"] == notebook.as_posix()]
        assert written, f"{notebook} wrote no data file: run `make experiments` and commit data/"
        for r in written:
            assert stale_reasons(r, ROOT) == [], f"{r['file']} is stale: {stale_reasons(r, ROOT)}; run `make experiments`"


# --- currency by behaviour (attnbook.codehash) -------------------------------------------------------------------

MODULE = '''"""A module."""
import math

X = 1
"""X's docstring."""


def f(a):
    """Doubled."""
    return 2 * a  # twice
'''


def test_normalised_hash_ignores_comments_docstrings_and_formatting(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(MODULE)
    base = file_hash(path)
    neutral = ['"""Another docstring."""\nimport math\n\nX = 1\n\n\ndef f(a):\n    return 2*a\n',
               MODULE + "\n# an appended comment\n", MODULE + '\n"""An appended string statement."""\n',
               MODULE.replace('"""Doubled."""', '"""Doubled, said otherwise."""\n    # and a comment')]
    for text in neutral:
        path.write_text(text)
        assert file_hash(path) == base, text
    for text in (MODULE.replace("2 * a", "3 * a"), MODULE + "\nY = 2\n", MODULE.replace("import math", "import cmath")):
        path.write_text(text)
        assert file_hash(path) != base, text
    assert file_hash(path, LEGACY_RULE) == hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(ValueError, match="unknown provenance rule"):
        file_hash(path, "nope/9")
    assert "Doubled" not in normalised_source(MODULE) and "twice" not in normalised_source(MODULE)


def _committed_current_records() -> list[dict]:
    records = [r for r in read_all_provenance(ROOT) if not is_other_machine(r["file"]) and r["notebook"].endswith(".ipynb")]
    assert records and all(stale_reasons(r, ROOT) == [] for r in records)
    return records


def _library_copy(tmp_path: Path) -> Path:
    code = tmp_path / "lib"
    shutil.copytree(code_root(), code, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return code


def test_comments_and_docstrings_appended_to_every_module_stale_nothing(tmp_path: Path) -> None:
    records = _committed_current_records()
    code = _library_copy(tmp_path)
    for module in code.rglob("*.py"):
        text = module.read_text()
        if text.lstrip().startswith('"""'):  # lengthen the module's docstring
            text = text.replace('"""', '"""An added sentence. ', 1)
        module.write_text(text + '\n# an appended comment\n"""An appended docstring."""\n')
    assert {r["file"]: stale_reasons(r, ROOT, code) for r in records} == {r["file"]: [] for r in records}


def test_a_statement_stales_exactly_the_files_whose_writers_loaded_the_module(tmp_path: Path) -> None:
    records = _committed_current_records()
    for rel in ("attnid/counts.py", "attnid/train/training.py", "attnid/ballcert.py"):
        code = _library_copy(tmp_path / rel.replace("/", "_"))
        with open(code / rel, "a") as handle:
            handle.write("\n_ADDED = 1\n")
        stale = {r["file"] for r in records if stale_reasons(r, ROOT, code)}
        loaded = {r["file"] for r in records if rel in r["depends_on"]}
        assert loaded and stale == loaded, rel


def test_plumbing_out_of_the_hash_still_writes_the_committed_bytes() -> None:
    # provenance.py is NOT_A_DEPENDENCY: a change to its CSV or sidecar format would change no hash, so every
    # committed data file and sidecar must be exactly what today's serialisers give for the same contents.
    import csv

    for record in read_all_provenance(ROOT):
        path = ROOT / record["file"]
        assert sidecar_path_of(path).read_bytes() == sidecar_bytes(record), record["file"]
        if path.suffix == ".csv":
            with open(path, newline="") as handle:
                header, *rows = list(csv.reader(handle))
            assert csv_text(header, rows).encode() == path.read_bytes(), record["file"]


def sidecar_path_of(path: Path) -> Path:
    return path.with_name(path.name + SIDECAR_SUFFIX)


def test_no_data_file_depends_on_a_module_that_reads_docstrings() -> None:
    # Docstrings are out of the hash, so one read at run time must never feed data: a module that reads one
    # (the CLI's help text) may not be a dependency of any committed data file.
    readers = {p.relative_to(code_root()).as_posix() for p in code_root().rglob("*.py")
               if "egg-info" not in str(p) and reads_docstrings(p)}
    for record in read_all_provenance(ROOT):
        assert not readers & set(record["depends_on"]), (record["file"], readers & set(record["depends_on"]))


def test_an_old_rule_sidecar_is_read_explained_and_moved_only_when_sound(tmp_path: Path) -> None:
    root = _book(tmp_path)
    code = _library_copy(tmp_path)
    module = code / "attnid" / "counts.py"
    record = json.loads(sidecar_path_of(_write(root)).read_text())
    legacy = {k: v for k, v in record.items() if k != "rule"}
    legacy["depends_on"] = {"attnid/counts.py": hashlib.sha256(module.read_bytes()).hexdigest()}
    assert stale_reasons(legacy, root, code) == [] and currency(legacy).endswith("old rule (raw bytes of every loaded module)")
    moved = migrated(legacy, code, code, base="abc")
    assert moved and moved["rule"] == RULE and moved["accepted"] == {"by": "rule", "from": LEGACY_RULE, "base": "abc"}
    assert stale_reasons(moved, root, code) == [] and "byte-identical" in currency(moved)
    # a comment added since the base: the old rule calls it stale, the move still holds (same behaviour)
    after = _library_copy(tmp_path / "after")
    with open(after / "attnid" / "counts.py", "a") as handle:
        handle.write("\n# a comment\n")
    assert stale_reasons(legacy, root, after) == ["attnid/counts.py changed"]
    assert migrated(legacy, code, after) is not None
    with open(after / "attnid" / "counts.py", "a") as handle:
        handle.write("_ADDED = 1\n")
    assert migrated(legacy, code, after) is None  # behaviour changed: only a run or a canary decides
    assert migrated(moved, code, code) is None  # already under today's rule


def test_the_writer_format_is_pinned() -> None:
    # provenance.py is out of every hash, so its formats are pinned here: a change to how a value is written fails
    # this test instead of silently changing the bytes of every future run.
    assert csv_text(["a", "b", "c"], [(1, 0.5, True), (-2, 1e-20, None), ("x", 3.0, "")]) == (
        "a,b,c\n1,0.5,True\n-2,1e-20,None\nx,3.0,\n")
    assert sidecar_bytes({"b": [1, 2], "a": {"y": 0.5, "x": "s"}}) == (
        b'{\n  "a": {\n    "x": "s",\n    "y": 0.5\n  },\n  "b": [\n    1,\n    2\n  ]\n}\n')


def test_only_the_books_plumbing_is_out_of_the_hash() -> None:
    # NOT_A_DEPENDENCY takes a module out of every data file's hash: the list is pinned, so a module cannot leave it
    # unnoticed (each entry names its reason in its own source).
    from attnbook.codehash import exemption

    exempt = sorted(p.relative_to(code_root()).as_posix() for p in code_root().rglob("*.py")
                    if "egg-info" not in str(p) and exemption(p))
    assert exempt == ["attnbook/accept.py", "attnbook/browser.py", "attnbook/celltags.py", "attnbook/chapter.py",
                      "attnbook/codehash.py", "attnbook/devices.py", "attnbook/downloads.py", "attnbook/paths.py",
                      "attnbook/pdf.py", "attnbook/provenance.py", "attnbook/snapshot.py", "attnbook/sphinxext.py",
                      "attnbook/style.py"]


def test_docstring_readers_are_found_in_every_form(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    forms = ["f.__doc__", "__doc__", "getattr(f, '__doc__')", "from inspect import getdoc as g", "inspect.getdoc(f)"]
    for form in forms:
        path.write_text(f"x = 1\n{form}\n")
        assert reads_docstrings(path) == [2], form
    path.write_text('"""A docstring."""\nx = 1\n')
    assert reads_docstrings(path) == []


def test_a_data_file_read_before_a_write_is_an_input(tmp_path: Path) -> None:
    import attnbook

    root = _book(tmp_path)
    _write(root, "up.csv")  # another writer's file (the sidecar names chapters/n.ipynb; this chapter is chapters/m)
    nbformat.write(nbformat.read(root / "chapters" / "n.ipynb", as_version=4), root / "chapters" / "m.ipynb")
    import os

    previous = os.environ.get("ATTNBOOK_ROOT")
    os.environ["ATTNBOOK_ROOT"] = str(root)
    try:
        book = attnbook.setup("chapters/m.ipynb", {"SEED": 3, "SIZES": [1, 2]})
        rows = book.read_csv("up.csv")
        out = book.write_csv("down.csv", ["a"], [(len(rows),)])
    finally:
        if previous is None:
            os.environ.pop("ATTNBOOK_ROOT", None)
        else:
            os.environ["ATTNBOOK_ROOT"] = previous
    record = json.loads(sidecar_path_of(out).read_text())
    assert record["inputs"] == {"data/up.csv": hashlib.sha256((root / "data" / "up.csv").read_bytes()).hexdigest()}
    assert stale_reasons(record, root) == []
    _write(root, "up.csv", rows=((9, "z"),))  # the upstream file is re-run with other numbers
    assert stale_reasons(record, root) == ["its input data/up.csv changed"]
