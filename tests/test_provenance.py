"""Atomic writes and provenance sidecars."""

import hashlib
import json
import os
from pathlib import Path

import nbformat
import pytest

from attnid import provenance
from attnid.provenance import SIDECAR_SUFFIX, notebook_source_hash, read_all_provenance, write_bytes, write_csv

NOTEBOOK = "chapters/01_identification.ipynb"


def test_write_csv_writes_file_and_sidecar(tmp_path: Path) -> None:
    data = tmp_path / "data"
    out = write_csv("sub/table.csv", ["a", "b"], [(1, "x"), (2, "y")], notebook=NOTEBOOK,
                    parameters={"SEED": 3}, device="cpu", data_dir=data)
    assert out == data / "sub" / "table.csv"
    assert out.read_text() == "a,b\n1,x\n2,y\n"
    record = json.loads(out.with_name("table.csv" + SIDECAR_SUFFIX).read_text())
    assert record["file"] == "data/sub/table.csv"
    assert record["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert record["notebook"] == NOTEBOOK
    assert record["parameters"] == {"SEED": 3}
    assert record["device"] == "cpu"
    assert {"python", "torch", "numpy", "attnid"} <= set(record["versions"])
    assert len(record["git_commit"]) == 40 or record["git_commit"] == "unknown"
    assert read_all_provenance(data) == [record]


def test_sidecar_is_byte_stable(tmp_path: Path) -> None:
    kwargs = dict(notebook=NOTEBOOK, parameters={"N": 1}, device="cpu", data_dir=tmp_path)
    out = write_csv("t.csv", ["v"], [(1,)], **kwargs)
    first = out.with_name("t.csv" + SIDECAR_SUFFIX).read_bytes()
    write_csv("t.csv", ["v"], [(1,)], **kwargs)
    assert out.with_name("t.csv" + SIDECAR_SUFFIX).read_bytes() == first


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
    with pytest.raises(ValueError, match="data files live under"):
        write_csv(tmp_path / "elsewhere.csv", ["a"], [(1,)], notebook=NOTEBOOK, parameters={}, device="cpu",
                  data_dir=tmp_path / "data")
    with pytest.raises(ValueError, match="has 1 fields, the header has 2"):
        write_csv("x.csv", ["a", "b"], [(1,)], notebook=NOTEBOOK, parameters={}, device="cpu", data_dir=tmp_path)
    with pytest.raises(ValueError, match="not found"):
        write_csv("y.csv", ["a"], [(1,)], notebook="chapters/nope.ipynb", parameters={}, device="cpu", data_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


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


def test_committed_data_files_have_matching_sidecars() -> None:
    for record in read_all_provenance():
        data_file = provenance.REPO_ROOT / record["file"]
        assert data_file.is_file(), record["file"]
        assert hashlib.sha256(data_file.read_bytes()).hexdigest() == record["sha256"], record["file"]
    for data_file in provenance.DATA_DIR.rglob("*"):
        if data_file.is_file() and not data_file.name.endswith(SIDECAR_SUFFIX):
            assert data_file.with_name(data_file.name + SIDECAR_SUFFIX).is_file(), f"{data_file} has no sidecar"
