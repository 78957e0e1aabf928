#!/usr/bin/env python3
"""Execute the book's notebooks with papermill, safely and reproducibly.

First every experiment notebook (experiments/*.ipynb, sorted by name: the heavy runs, which
write data/ and are not re-executed by nbval), then every notebook listed in _toc.yml (in book
order: the chapters, which read that data). For each notebook:
  1. drop any cell papermill injected on an earlier run (stale parameters must not linger);
  2. execute it with papermill into a temporary file next to it, passing only the
     parameters that differ from the notebook's own defaults (its `parameters` cell);
  3. strip volatile metadata (papermill's timings and paths, execution timestamps) and merge
     stream outputs the kernel happened to split, keeping outputs, execution counts, cell
     tags and the kernelspec;
  3b. apply the book's cell-tag rule (attnbook.celltags: parameters, hashes and glue plumbing
     off the rendered page), so every executed notebook, from whichever branch, follows it;
  4. move the result into place only on success, so a failure never loses stored outputs;
  5. treat data/ the same way: what a failing (or interrupted) notebook wrote there is rolled
     back, and temporary files left by a killed run are removed when the next run starts.

The experiments' kernels run in the portable numeric environment (attnbook.machine: one thread,
MKL's compatible path, PyTorch's generic kernels), so that their float32 training runs write the
same bytes on another x86-64 CPU; the chapters run in the machine's own environment (their stored
outputs follow attnbook.precision's rule, which make test checks in the portable environment).

Currency without a full run (attnbook.accept): --list-stale prints the stale data files written by
notebooks, one per line; --stale re-runs only their writers (and the notebooks that tabulate every
sidecar, metadata attnbook.rerun_with_stale); --accept establishes, where sound, that stale files are
still what today's code writes (old-rule sidecars re-hashed, experiments by their canary).

Usage: reproduce.py [--device cpu|cuda|auto] [--only NOTEBOOK ...] [--experiments | --chapters | --stale]
                    [-p NAME=VALUE ...] [--list] [--list-experiments] [--list-stale] [--accept [--base REV]]
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import fcntl
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import papermill
import yaml

from attnbook import celltags
from attnbook.machine import is_other_machine, portable_environment
from attnbook.provenance import read_all_provenance, stale_reasons
from attnbook.snapshot import all_or_nothing, remove_temporaries

ROOT = Path(__file__).resolve().parents[1]
INJECTED_TAG = "injected-parameters"
VOLATILE_CELL_KEYS = ("papermill", "execution", "ExecuteTime")
VOLATILE_NOTEBOOK_KEYS = ("papermill",)
DATA = ROOT / "data"
DATA_BACKUP = ROOT / ".data-backup"  # data/ as it was before the running notebook started (gitignored)
LOCK = ROOT / ".reproduce.lock"  # one run at a time: two would share DATA_BACKUP and each other's temporaries (gitignored)
EXPERIMENTS = "experiments"  # the heavy runs: executed before the chapters, never by nbval


def toc_notebooks(toc_path: Path = ROOT / "_toc.yml") -> list[Path]:
    """The .ipynb files of the book, in reading order, relative to the repository root."""
    toc = yaml.safe_load(toc_path.read_text())
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("file"), str):
                found.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(toc.get("root") and {"file": toc["root"]})
    walk(toc.get("parts", toc.get("chapters", [])))
    notebooks = []
    for name in found:
        path = Path(name if name.endswith(".ipynb") else name + ".ipynb")
        if (ROOT / path).is_file():
            notebooks.append(path)
    return notebooks


def experiment_notebooks(root: Path = ROOT) -> list[Path]:
    """experiments/*.ipynb sorted by name, relative to the repository root (temporaries excluded)."""
    folder = root / EXPERIMENTS
    return sorted(p.relative_to(root) for p in folder.glob("*.ipynb") if not p.name.startswith(".")) if folder.is_dir() else []


def stale_files(root: Path = ROOT) -> dict[str, str]:
    """{stale data file: its writer} for every committed data file a notebook wrote (benchmarks excluded)."""
    return {r["file"]: r["notebook"] for r in read_all_provenance(root)
            if r["notebook"].endswith(".ipynb") and not is_other_machine(r["file"]) and stale_reasons(r, root)}


def reruns_with_stale(path: Path) -> bool:
    """Whether a notebook asks to be re-run whenever stale files are (it tabulates every sidecar)."""
    meta = json.loads((ROOT / path).read_text())["metadata"]
    return bool(meta.get("attnbook", {}).get("rerun_with_stale"))


def print_outcomes(outcomes: list) -> int:
    """One line per writer make accept decided for; 0 when nothing is left that needs a full run."""
    for o in outcomes:
        print(f"{o.verdict:>13}  {o.writer}: {o.detail}" + (f" [{', '.join(o.files)}]" if o.verdict != "migrated" else ""))
    due = [o for o in outcomes if o.verdict == "full run due"]
    if due:
        print(f"accept: a full run is due for {len(due)} writer(s): make reproduce ARGS='--only "
              + " ".join(o.writer for o in due) + "'")
    if any(o.verdict == "re-run" for o in outcomes):
        print("accept: stale chapters remain: make reproduce ARGS=--stale")
    if not outcomes:
        print("accept: every data file written by a notebook is current")
    return 0


def parse_value(text: str) -> Any:
    """Parse a -p value as YAML, so 3 is an int, 0.5 a float, [1, 2] a list, cpu a string."""
    return yaml.safe_load(text)


def changed_parameters(notebook: nbformat.NotebookNode, wanted: dict[str, Any]) -> dict[str, Any]:
    """The requested parameters that the notebook declares and whose value differs from its default."""
    declared = papermill.inspect_notebook(notebook)
    changed = {}
    for name, value in wanted.items():
        if name not in declared:
            continue
        default = declared[name]["default"]
        try:
            default_value = ast.literal_eval(default)
        except (ValueError, SyntaxError):
            default_value = object()  # not a literal: always pass the requested value
        if value != default_value:
            changed[name] = value
    return changed


def coalesce_streams(outputs: list) -> list:
    """Merge adjacent stdout (or stderr) outputs: how the kernel split them depends on timing."""
    merged: list = []
    for out in outputs:
        if (out.get("output_type") == "stream" and merged and merged[-1].get("output_type") == "stream"
                and merged[-1]["name"] == out["name"]):
            merged[-1]["text"] += out["text"]
        else:
            merged.append(out)
    return merged


def strip_volatile(notebook: nbformat.NotebookNode) -> None:
    """Remove run-specific metadata and timing-dependent stream splits in place; keep outputs,
    execution counts, tags and the kernelspec."""
    for key in VOLATILE_NOTEBOOK_KEYS:
        notebook.metadata.pop(key, None)
    for cell in notebook.cells:
        for key in VOLATILE_CELL_KEYS:
            cell.metadata.pop(key, None)
        if cell.cell_type == "code":
            cell.outputs = coalesce_streams(cell.outputs)


# An experiment's kernel leaves the file descriptors 1 and 2 alone (ipykernel captures them by default), so the
# progress bars of attnid.train.sweep, written to sys.__stderr__, reach this terminal and never the stored notebook.
EXPERIMENT_KERNEL_ARGUMENTS = ["--IPKernelApp.capture_fd_output=False"]


def kernel_arguments(path: Path) -> list[str]:
    """Extra command-line arguments of the notebook's kernel."""
    return EXPERIMENT_KERNEL_ARGUMENTS if path.parts[:1] == (EXPERIMENTS,) else []


def notebook_environment(path: Path) -> dict[str, str]:
    """The environment variables a notebook's kernel runs with beyond ours: the portable ones for an experiment."""
    return portable_environment() if path.parts[:1] == (EXPERIMENTS,) else {}


@contextlib.contextmanager
def environment(changes: dict[str, str]) -> Iterator[None]:
    """os.environ with ``changes`` for the duration (a kernel started inside inherits them)."""
    saved = {key: os.environ.get(key) for key in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_notebook(path: Path, parameters: dict[str, Any]) -> float:
    """Execute one notebook in place (atomically). Returns the seconds it took."""
    source = nbformat.read(ROOT / path, as_version=4)
    source.cells = [c for c in source.cells if INJECTED_TAG not in c.metadata.get("tags", [])]
    params = changed_parameters(source, parameters)
    fd, tmp = tempfile.mkstemp(dir=(ROOT / path).parent, prefix=f".{path.stem}.", suffix=".tmp.ipynb")
    os.close(fd)
    start = time.perf_counter()
    try:
        with environment(notebook_environment(path)):
            result = papermill.execute_notebook(
                source, tmp, parameters=params, cwd=str((ROOT / path).parent), progress_bar=False,
                kernel_name="python3", extra_arguments=kernel_arguments(path))
        strip_volatile(result)
        celltags.apply(result.cells)
        nbformat.write(result, tmp)
        os.replace(tmp, ROOT / path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"], help="passed to every notebook as DEVICE")
    parser.add_argument("--only", nargs="+", type=Path, help="run only these notebooks (paths from the repository root)")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE", help="override a parameter")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--experiments", action="store_true", help="run only the experiment notebooks (experiments/*.ipynb)")
    which.add_argument("--chapters", action="store_true", help="run only the book's notebooks (_toc.yml)")
    which.add_argument("--stale", action="store_true", help="run only the writers of stale data files (make stale)")
    parser.add_argument("--list-stale", action="store_true", help="print the stale data files, one per line, and exit")
    parser.add_argument("--accept", action="store_true",
                        help="make accept: establish, without a full run where sound, that stale data are current")
    parser.add_argument("--base", default="HEAD", help="the revision --accept compares with (default HEAD)")
    parser.add_argument("--list", action="store_true",
                        help="print the book's notebooks (what nbval re-executes) and exit")
    parser.add_argument("--list-experiments", action="store_true", help="print the experiment notebooks and exit")
    args = parser.parse_args(argv)

    chapters, experiments = toc_notebooks(), experiment_notebooks()
    if args.list_stale:
        for name in sorted(stale_files()):
            print(name)
        return 0
    if args.accept:
        from attnbook.accept import accept

        return print_outcomes(accept(ROOT, args.base))
    if args.list or args.list_experiments:
        print(" ".join(str(p) for p in (chapters if args.list else experiments)))
        return 0
    notebooks = experiments if args.experiments else chapters if args.chapters else experiments + chapters
    if args.stale:
        writers = {Path(w) for w in stale_files().values()}
        notebooks = [p for p in experiments + chapters if p in writers]
        if notebooks:
            notebooks += [p for p in chapters if reruns_with_stale(p) and p not in notebooks]
        else:
            print("no stale data file: nothing to run")
            return 0
    if args.only:
        known = experiments + chapters
        missing = [p for p in args.only if p not in known]
        if missing:
            parser.error(f"not an experiment notebook nor in _toc.yml: {', '.join(map(str, missing))}; "
                         f"known: {', '.join(map(str, known))}")
        notebooks = [p for p in known if p in args.only]  # experiments first, then book order
    parameters: dict[str, Any] = {"DEVICE": args.device}
    for item in args.param:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            parser.error(f"-p expects NAME=VALUE, got {item!r}")
        try:
            parameters[name] = parse_value(value)
        except yaml.YAMLError as exc:
            parser.error(f"-p {name}: {value!r} is not a YAML value ({' '.join(str(exc).split())[:160]})")
    declared = set().union(*(papermill.inspect_notebook(str(ROOT / p)) for p in notebooks))
    unknown = sorted(set(parameters) - declared - {"DEVICE"})
    if unknown:
        parser.error(f"no selected notebook declares {', '.join(unknown)}; declared: {', '.join(sorted(declared))}")

    lock = open(LOCK, "w")  # held until this process exits
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        parser.exit(2, f"{parser.prog}: error: another reproduce.py is running in {ROOT} (lock {LOCK.name}); wait for it\n")
    left = remove_temporaries(DATA, *{(ROOT / p).parent for p in notebooks if p.parent != Path(".")})
    left += remove_temporaries(ROOT, recursive=False)
    if left:
        print(f"removed {len(left)} temporary file(s) left by an interrupted run", flush=True)
    total = time.perf_counter()
    for i, path in enumerate(notebooks, 1):
        pinned = " (portable numerics: " + ", ".join(f"{k}={v}" for k, v in sorted(notebook_environment(path).items())) + ")"
        print(f"[{i}/{len(notebooks)}] {path}{pinned if notebook_environment(path) else ''} ...", flush=True)
        with all_or_nothing(DATA, DATA_BACKUP):
            seconds = run_notebook(path, parameters)
        print(f"[{i}/{len(notebooks)}] {path} done in {seconds:.1f} s", flush=True)
    print(f"executed {len(notebooks)} notebook(s) in {time.perf_counter() - total:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
