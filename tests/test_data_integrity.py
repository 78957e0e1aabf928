"""data/ is never left half-written: atomic pairs, rollback of a failed notebook, cleanup after a kill."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from attnbook.snapshot import all_or_nothing, remove_temporaries

ROOT = Path(__file__).resolve().parents[1]


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _data(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    (data / "a").mkdir(parents=True)
    (data / "a" / "kept.csv").write_text("x\n1\n")
    (data / "a" / "changed.csv").write_text("x\n2\n")
    (data / "gone.csv").write_text("x\n3\n")
    return data


def test_a_failed_run_leaves_data_as_it_found_it(tmp_path: Path) -> None:
    data = _data(tmp_path)
    before = _tree(data)
    with pytest.raises(RuntimeError, match="boom"):
        with all_or_nothing(data, tmp_path / ".backup"):
            (data / "a" / "changed.csv").write_text("x\n20\n")
            (data / "gone.csv").unlink()
            (data / "b").mkdir()
            (data / "b" / "new.csv").write_text("x\n4\n")
            raise RuntimeError("boom")
    assert _tree(data) == before
    assert not (tmp_path / ".backup").exists()


def test_a_successful_run_keeps_its_writes(tmp_path: Path) -> None:
    data = _data(tmp_path)
    with all_or_nothing(data, tmp_path / ".backup"):
        (data / "a" / "changed.csv").write_text("x\n20\n")
    assert (data / "a" / "changed.csv").read_text() == "x\n20\n"
    assert not (tmp_path / ".backup").exists()


def test_a_killed_run_is_rolled_back_by_the_next(tmp_path: Path) -> None:
    # A process that dies (os._exit, like kill -9) inside the block leaves its backup; the next run restores it.
    data = _data(tmp_path)
    before = _tree(data)
    script = textwrap.dedent(f"""
        import os
        from pathlib import Path
        from attnbook.snapshot import all_or_nothing
        data = Path({str(data)!r})
        with all_or_nothing(data, Path({str(tmp_path / '.backup')!r})):
            (data / "a" / "changed.csv").write_text("half")
            os._exit(9)
    """)
    assert subprocess.run([sys.executable, "-c", script]).returncode == 9
    assert (data / "a" / "changed.csv").read_text() == "half"
    with all_or_nothing(data, tmp_path / ".backup"):
        assert _tree(data) == before


def test_temporaries_of_a_killed_write_are_removed(tmp_path: Path) -> None:
    data = _data(tmp_path)
    (data / "a" / ".changed.csv.abc123.tmp").write_text("partial")
    (tmp_path / ".chapter.x1.tmp.ipynb").write_text("{}")
    keep = data / "a" / "notes.tmp.txt"
    keep.write_text("not ours")
    removed = remove_temporaries(data) + remove_temporaries(tmp_path, recursive=False)
    assert sorted(p.name for p in removed) == [".changed.csv.abc123.tmp", ".chapter.x1.tmp.ipynb"]
    assert keep.is_file()


def _notebook(path: Path, body: str) -> None:
    params = nbformat.v4.new_code_cell('DEVICE = "cpu"\nSEED = 0')
    params.metadata["tags"] = ["parameters"]
    nb = nbformat.v4.new_notebook(cells=[params, nbformat.v4.new_code_cell(body)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def test_reproduce_rolls_back_what_a_failing_notebook_wrote(tmp_path: Path) -> None:
    # A miniature book: chapter a writes and succeeds, chapter b overwrites a file, adds one, then fails.
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "reproduce.py", tmp_path / "scripts" / "reproduce.py")
    (tmp_path / "_config.yml").write_text("title: t\n")
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n- file: chapters/a\n- file: chapters/b\n")
    (tmp_path / "chapters").mkdir()
    write = 'import attnbook\nbook = attnbook.setup("chapters/{0}.ipynb", globals())\nbook.write_csv("{1}", ["v"], [({2},)])\n'
    _notebook(tmp_path / "chapters" / "a.ipynb", write.format("a", "a/out.csv", 1))
    _notebook(tmp_path / "chapters" / "b.ipynb", write.format("b", "a/out.csv", 2) + write.format("b", "b/new.csv", 3).split("\n", 2)[2]
              + 'raise RuntimeError("chapter b fails half-way")\n')
    (tmp_path / "data" / "x").mkdir(parents=True)
    (tmp_path / "data" / "x" / ".old.csv.k1ll3d.tmp").write_text("left by a killed run")
    env = dict(os.environ, ATTNBOOK_ROOT=str(tmp_path))
    result = subprocess.run([sys.executable, "scripts/reproduce.py"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode != 0 and "chapter b fails half-way" in result.stderr + result.stdout
    data = _tree(tmp_path / "data")
    assert data["a/out.csv"] == b"v\n1\n", "chapter a's result must survive chapter b's failure"
    assert "b/new.csv" not in data and "b/new.csv.provenance.json" not in data
    assert "x/.old.csv.k1ll3d.tmp" not in data
    assert not (tmp_path / ".data-backup").exists()


def _mini_book(root: Path) -> None:
    (root / "_toc.yml").write_text("root: intro\n")
    (root / "_config.yml").write_text("title: t\n")
    (root / "chapters").mkdir()
    _notebook(root / "chapters" / "n.ipynb", "x = 1")


WRITE = ("from pathlib import Path\nfrom attnbook.provenance import write_csv\n"
         "write_csv('t/v.csv', ['v'], [({value},)], notebook='chapters/n.ipynb', parameters={{}}, device='cpu', "
         "root=Path({root!r}))\n")


@pytest.mark.parametrize("fault", ["fsync:1", "fsync:2", "replace:1", "replace:2", "end"])
def test_a_kill_at_any_step_of_write_csv_is_harmless_or_reported(tmp_path: Path, fault: str) -> None:
    # Write an old pair, then kill (os._exit, as kill -9 would) a second write at each step.
    from attnbook.provenance import check_pair

    _mini_book(tmp_path)
    subprocess.run([sys.executable, "-c", WRITE.format(value=1, root=str(tmp_path))], check=True)
    target = tmp_path / "data" / "t" / "v.csv"
    old = check_pair(target)
    kind, _, when = fault.partition(":")
    inject = ""
    if kind in ("fsync", "replace"):
        inject = (f"import os\n_real = os.{kind}\n_calls = [0]\n"
                  f"def _fault(*a):\n    _calls[0] += 1\n    if _calls[0] == {when}:\n        os._exit(9)\n    return _real(*a)\n"
                  f"os.{kind} = _fault\n")
    tail = "import os\nos._exit(9)\n" if kind == "end" else ""
    code = inject + WRITE.format(value=2, root=str(tmp_path)) + tail
    assert subprocess.run([sys.executable, "-c", code]).returncode == 9
    try:
        record = check_pair(target)
    except ValueError as err:  # a mismatch: reported, naming the file
        assert "v.csv" in str(err) and "make reproduce" in str(err)
        assert fault == "replace:2"
    else:
        assert record["sha256"] == (old["sha256"] if kind != "end" else record["sha256"])
        assert target.read_text() == ("v\n1\n" if kind != "end" else "v\n2\n")
    # the next run repairs everything and the cleanup removes what the kill left
    remove_temporaries(tmp_path / "data")
    subprocess.run([sys.executable, "-c", WRITE.format(value=2, root=str(tmp_path))], check=True)
    assert check_pair(target)["sha256"] != old["sha256"] and target.read_text() == "v\n2\n"
    assert sorted(p.name for p in (tmp_path / "data" / "t").iterdir()) == ["v.csv", "v.csv.provenance.json"]


def test_reading_a_mismatched_pair_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import attnbook

    monkeypatch.delenv("ATTNBOOK_ROOT", raising=False)  # the book root must come from the mini book's folder
    _mini_book(tmp_path)
    subprocess.run([sys.executable, "-c", WRITE.format(value=1, root=str(tmp_path))], check=True)
    (tmp_path / "data" / "t" / "v.csv").write_text("v\n7\n")
    os.chdir(tmp_path / "chapters")
    try:
        book = attnbook.setup("chapters/n.ipynb", {"DEVICE": "cpu", "SEED": 0})
        with pytest.raises(ValueError, match=r"v\.csv does not match its provenance sidecar"):
            book.read_csv("t/v.csv")
    finally:
        os.chdir(ROOT)
