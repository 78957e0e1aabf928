"""The book's pipeline: the papermill runner's helpers, the committed notebooks' hygiene, and nbval's guard."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("reproduce", ROOT / "scripts" / "reproduce.py")
assert spec and spec.loader
reproduce = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reproduce)

NOTEBOOKS = reproduce.toc_notebooks()
CHAPTERS = [p for p in NOTEBOOKS if p.parts[0] == "chapters"]
EXPERIMENTS = reproduce.experiment_notebooks()


def test_toc_lists_the_chapters_in_order() -> None:
    assert NOTEBOOKS[0] == Path("chapters/01_identification.ipynb")
    assert Path("reproducing.ipynb") in NOTEBOOKS
    assert sorted(CHAPTERS) == CHAPTERS
    on_disk = sorted(p.relative_to(ROOT) for p in (ROOT / "chapters").glob("*.ipynb"))
    assert on_disk == sorted(CHAPTERS), "every chapter notebook must be in _toc.yml"


def test_strip_volatile_keeps_what_matters() -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")])
    nb.metadata["papermill"] = {"start_time": "now"}
    nb.metadata["kernelspec"] = {"name": "python3"}
    cell = nb.cells[0]
    cell.metadata.update({"papermill": {"duration": 1.0}, "execution": {"iopub.status.busy": "t"}, "tags": ["x"]})
    cell.execution_count = 4
    cell.outputs = [nbformat.v4.new_output("stream", text="1\n")]
    reproduce.strip_volatile(nb)
    assert "papermill" not in nb.metadata and nb.metadata["kernelspec"] == {"name": "python3"}
    assert cell.metadata == {"tags": ["x"]}
    assert cell.execution_count == 4 and cell.outputs[0]["text"] == "1\n"


def test_split_streams_are_merged() -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1)")])
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="a\n"),
                           nbformat.v4.new_output("stream", name="stdout", text="b\n"),
                           nbformat.v4.new_output("stream", name="stderr", text="c\n"),
                           nbformat.v4.new_output("stream", name="stdout", text="d\n")]
    reproduce.strip_volatile(nb)
    assert [(o["name"], o["text"]) for o in nb.cells[0].outputs] == [("stdout", "a\nb\n"), ("stderr", "c\n"),
                                                                      ("stdout", "d\n")]


def test_committed_notebooks_have_no_split_streams() -> None:
    for path in NOTEBOOKS:
        for cell in nbformat.read(ROOT / path, as_version=4).cells:
            outs = cell.get("outputs", [])
            for a, b in zip(outs, outs[1:]):
                assert not (a.output_type == b.output_type == "stream" and a.name == b.name), path


def test_only_changed_parameters_are_injected() -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell('DEVICE = "cpu"\nSEED = 0\nSIZES = [1, 2]')])
    nb.cells[0].metadata["tags"] = ["parameters"]
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    wanted = {"DEVICE": "cpu", "SEED": 3, "SIZES": [1, 2], "OTHER": 1}
    assert reproduce.changed_parameters(nb, wanted) == {"SEED": 3}


def test_bad_command_lines_exit_2() -> None:
    for args in (["--only", "chapters/missing.ipynb"], ["-p", "NOPE"], ["-p", "NOT_DECLARED=1"], ["--device", "tpu"]):
        result = subprocess.run([sys.executable, "scripts/reproduce.py", *args], cwd=ROOT, capture_output=True, text=True)
        assert result.returncode == 2, args
        assert "error:" in result.stderr


@pytest.mark.parametrize("path", NOTEBOOKS + EXPERIMENTS, ids=str)
def test_committed_notebook_is_clean_and_executed(path: Path) -> None:
    nb = nbformat.read(ROOT / path, as_version=4)
    assert "papermill" not in nb.metadata
    assert nb.metadata["kernelspec"]["name"] == "python3"
    code = [c for c in nb.cells if c.cell_type == "code"]
    for cell in code:
        tags = cell.metadata.get("tags", [])
        assert "injected-parameters" not in tags, "stale papermill parameters are committed"
        assert not {"papermill", "execution"} & set(cell.metadata), "volatile metadata is committed"
        assert cell.execution_count is not None, "a code cell was never executed"
        for out in cell.outputs:
            assert out.output_type != "error", "a stored output is an error"
            assert not (out.output_type == "stream" and out.name == "stderr"), f"stderr in stored output: {out.text[:200]}"
    counts = [c.execution_count for c in code]
    assert counts == list(range(1, len(code) + 1)), "cells were not executed once, top to bottom"


@pytest.mark.parametrize("path", CHAPTERS + EXPERIMENTS, ids=str)
def test_chapter_has_a_parameters_cell_with_device(path: Path) -> None:
    nb = nbformat.read(ROOT / path, as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1
    assert 'DEVICE = "cpu"' in tagged[0].source


def test_nbval_fails_when_a_stored_result_is_changed(tmp_path: Path) -> None:
    # Tamper with one printed number in a copy of the appendix notebook: nbval must notice.
    nb = nbformat.read(ROOT / "reproducing.ipynb", as_version=4)
    stream = next(o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "stream")
    assert "data files" in stream.text
    stream.text = stream.text.replace(" data files", "0 data files")
    copy = tmp_path / "tampered.ipynb"
    nbformat.write(nb, copy)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--nbval", "--nbval-current-env", str(copy)],
        cwd=tmp_path, capture_output=True, text=True,
    )
    assert result.returncode == 1, result.stdout[-2000:]
    assert "data files" in result.stdout and "failed" in result.stdout


@pytest.mark.parametrize("path", NOTEBOOKS + EXPERIMENTS, ids=str)
def test_stored_outputs_hold_no_machine_paths(path: Path) -> None:
    # An absolute path in an output differs on every checkout, so nbval would fail elsewhere.
    text = (ROOT / path).read_text()
    assert str(ROOT) not in text and "PosixPath(" not in text, f"{path} stores a machine-specific path"


def test_experiments_are_found_run_first_and_not_listed_for_nbval(tmp_path: Path) -> None:
    # A miniature book: an experiment writes data, the chapter reads it; `reproduce.py` must run the
    # experiment first, `--list` (what nbval re-executes) must name only the chapter.
    import os
    import shutil

    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "reproduce.py", tmp_path / "scripts" / "reproduce.py")
    (tmp_path / "_config.yml").write_text("title: t\n")
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n- file: chapters/c\n")
    for folder, name, body in (("experiments", "b_second", 'book.write_csv("e/b.csv", ["v"], [(N + 1,)])'),
                               ("experiments", "a_first", 'book.write_csv("e/a.csv", ["v"], [(N,)])'),
                               ("chapters", "c", 'print(book.read_csv("e/a.csv"), book.read_csv("e/b.csv"))')):
        (tmp_path / folder).mkdir(exist_ok=True)
        params = nbformat.v4.new_code_cell('DEVICE = "cpu"\nN = 1')
        params.metadata["tags"] = ["parameters"]
        code = f'import attnbook\nbook = attnbook.setup("{folder}/{name}.ipynb", globals())\n{body}'
        nb = nbformat.v4.new_notebook(cells=[params, nbformat.v4.new_code_cell(code)])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, tmp_path / folder / f"{name}.ipynb")
    env = dict(os.environ, ATTNBOOK_ROOT=str(tmp_path))

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "scripts/reproduce.py", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True)

    assert run("--list").stdout.split() == ["chapters/c.ipynb"]
    assert run("--list-experiments").stdout.split() == ["experiments/a_first.ipynb", "experiments/b_second.ipynb"]
    result = run("--experiments", "-p", "N=5")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "[1/2] experiments/a_first.ipynb" in result.stdout and "chapters/c" not in result.stdout
    assert (tmp_path / "data" / "e" / "b.csv").read_text() == "v\n6\n"
    result = run()
    assert result.returncode == 0, result.stderr[-2000:]
    order = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("[") and line.endswith("...")]
    assert order == ["experiments/a_first.ipynb", "experiments/b_second.ipynb", "chapters/c.ipynb"]
    assert "'v': '2'" in nbformat.read(tmp_path / "chapters" / "c.ipynb", as_version=4).cells[1].outputs[0]["text"]
    assert run("--only", "experiments/missing.ipynb").returncode == 2


@pytest.mark.slow
def test_an_experiments_progress_bar_reaches_the_terminal_not_the_stored_notebook(tmp_path: Path) -> None:
    import papermill

    assert reproduce.kernel_arguments(Path("experiments/x.ipynb")) == reproduce.EXPERIMENT_KERNEL_ARGUMENTS
    assert reproduce.kernel_arguments(Path("chapters/x.ipynb")) == []  # nbval's kernels capture; the chapters' too
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "from attnid.train.sweep import run_sweep\nprint(run_sweep(abs, [-1, 2], progress=True, desc='probe-bar'))")]
    source, out = tmp_path / "in.ipynb", tmp_path / "out.ipynb"
    nbformat.write(nb, source)
    script = ("import papermill, sys\n"
              f"papermill.execute_notebook({str(source)!r}, {str(out)!r}, progress_bar=False, kernel_name='python3', "
              f"extra_arguments={reproduce.EXPERIMENT_KERNEL_ARGUMENTS!r})\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "probe-bar" in run.stderr and "2/2" in run.stderr  # the terminal shows the bar
    outputs = nbformat.read(out, as_version=4).cells[0].outputs
    assert [o.get("text") for o in outputs] == ["[1, 2]\n"]  # the notebook keeps the result only


def test_list_stale_names_the_files_a_changed_module_stales(tmp_path: Path) -> None:
    # make stale is `reproduce.py --list-stale`: exit 0 and one data file a line. On a copy of the library where one
    # module gains a statement, the stale files are exactly those whose writers loaded it (a comment stales none).
    import shutil

    from attnbook.provenance import read_all_provenance, stale_reasons

    done = subprocess.run([sys.executable, "scripts/reproduce.py", "--list-stale"], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 0 and done.stdout == "".join(f"{f}\n" for f in sorted(reproduce.stale_files(ROOT)))
    code = tmp_path / "lib"
    shutil.copytree(ROOT / "lib", code, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    records = [r for r in read_all_provenance(ROOT) if r["notebook"].endswith(".ipynb")]
    module = code / "attnid" / "families" / "gated.py"
    module.write_text(module.read_text() + "\n# a comment\n")
    assert not [r for r in records if stale_reasons(r, ROOT, code) and not stale_reasons(r, ROOT)]
    module.write_text(module.read_text() + "_ADDED = 1\n")
    newly = {r["file"] for r in records if stale_reasons(r, ROOT, code) and not stale_reasons(r, ROOT)}
    assert newly == {r["file"] for r in records if "attnid/families/gated.py" in r["depends_on"]
                     and not stale_reasons(r, ROOT)}
    assert newly  # chapter 7b checks the output-gated family
