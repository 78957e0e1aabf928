#!/usr/bin/env python3
"""Check a reproduction in one command: re-run the book into a temporary copy and compare it with this tree.

    python scripts/compare.py [--all] [--only NOTEBOOK ...] [--perturbed] [--keep]

The copy holds this checkout's files (tracked and untracked, not ignored); ``scripts/reproduce.py``
executes its chapters there (``--all``: the experiments too, about 27 minutes on 2 cores), with the
copy's own library first on the path. Then, per data file: identical, or the largest relative
difference of its numbers (and whether any text differs); per notebook: whether any stored output
changed, and in which cells. ``--perturbed`` runs the copy in the perturbed numeric environment of
``make test`` (scripts/perturbed.py: other threads, MKL and PyTorch kernels; not OpenBLAS's). Other
machines' per-machine measurements (``data/**/machines/<fingerprint>/``) are listed, not compared.
Run it with the book's Python (``make compare``): the notebooks' kernel is the one next to it. Exit status 0 when
everything is identical, 1 when something differs, 2 when the run itself failed.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))
from attnbook.machine import is_other_machine, portable_environment  # noqa: E402


def checkout_files(root: Path) -> list[Path]:
    """Tracked and untracked (not ignored) files of the checkout, relative to ``root``."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         check=True, capture_output=True).stdout.decode()
    return [Path(p) for p in out.split("\0") if p and (root / p).is_file()]


def copy_checkout(root: Path, target: Path) -> None:
    for rel in checkout_files(root):
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target / rel)


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def csv_difference(old: bytes, new: bytes) -> str:
    """'identical', or the largest relative difference of the numeric fields and whether other text differs."""
    if old == new:
        return "identical"
    a = list(csv.reader(io.StringIO(old.decode())))
    b = list(csv.reader(io.StringIO(new.decode())))
    if len(a) != len(b) or any(len(x) != len(y) for x, y in zip(a, b)):
        return "differs in shape (rows or columns)"
    largest, text = 0.0, 0
    for row_a, row_b in zip(a, b):
        for x, y in zip(row_a, row_b):
            if x == y:
                continue
            fx, fy = _number(x), _number(y)
            if fx is None or fy is None:
                text += 1
            else:
                largest = max(largest, abs(fx - fy) / max(abs(fx), abs(fy), 1e-300))
    parts = [f"largest relative difference {largest:.1e}"] if largest else []
    parts += [f"{text} text field(s) differ"] if text else []
    return "; ".join(parts) or "the same numbers, written differently (such as 1.0 and 1.00)"


def data_report(old_root: Path, new_root: Path) -> list[tuple[str, str]]:
    """(data file, verdict) for every file under either tree's data/."""
    old_data, new_data = old_root / "data", new_root / "data"
    names = {p.relative_to(old_data) for p in old_data.rglob("*") if p.is_file()}
    names |= {p.relative_to(new_data) for p in new_data.rglob("*") if p.is_file()}
    report = []
    for rel in sorted(names):
        if is_other_machine(rel.as_posix()):
            if not (old_data / rel).is_file():
                report.append((rel.as_posix(), "per-machine measurement of the re-run (not compared)"))
            continue
        if not (old_data / rel).is_file() or not (new_data / rel).is_file():
            report.append((rel.as_posix(), "only in the re-run" if (new_data / rel).is_file() else "not written by the re-run"))
            continue
        old, new = (old_data / rel).read_bytes(), (new_data / rel).read_bytes()
        verdict = csv_difference(old, new) if rel.suffix == ".csv" else ("identical" if old == new else "differs")
        report.append((rel.as_posix(), verdict))
    return report


def _outputs(path: Path) -> list[str]:
    cells = json.loads(path.read_text())["cells"]
    return [json.dumps(c.get("outputs", []), sort_keys=True) for c in cells]


def notebook_report(old_root: Path, new_root: Path, notebooks: list[Path]) -> list[tuple[str, str]]:
    report = []
    for rel in notebooks:
        old, new = _outputs(old_root / rel), _outputs(new_root / rel)
        if len(old) != len(new):
            report.append((str(rel), "a different number of cells"))
            continue
        changed = [i for i, (x, y) in enumerate(zip(old, new)) if x != y]
        report.append((str(rel), "outputs unchanged" if not changed else f"outputs changed in cells {changed}"))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="re-run the experiments too (slow), not only the chapters")
    parser.add_argument("--only", nargs="+", help="re-run only these notebooks (paths from the repository root)")
    parser.add_argument("--perturbed", action="store_true", help="re-run in make test's perturbed numeric environment")
    parser.add_argument("--keep", action="store_true", help="keep the temporary copy and print where it is")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="attnbook-compare-"))
    try:
        copy_checkout(ROOT, work)
        paths = [str(work / "lib"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths),
               "ATTNBOOK_ROOT": str(work),
               "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
        if args.perturbed:
            env.update(portable_environment())
        command = [sys.executable, str(work / "scripts" / "reproduce.py")]
        command += ["--only", *args.only] if args.only else [] if args.all else ["--chapters"]
        print(f"re-running in {work}: {' '.join(command[2:]) or 'everything'}", flush=True)
        if subprocess.run(command, cwd=work, env=env).returncode != 0:
            print("compare: the re-run failed; nothing compared", file=sys.stderr)
            return 2
        listing = subprocess.run([sys.executable, str(work / "scripts" / "reproduce.py"), "--list"], cwd=work, env=env,
                                 capture_output=True, text=True)
        if listing.returncode != 0:
            print(f"compare: could not list the book's notebooks: {listing.stderr.strip()}", file=sys.stderr)
            return 2
        listed = listing.stdout.split()
        rerun = [Path(p) for p in (args.only or listed)]
        rows = data_report(ROOT, work) + notebook_report(ROOT, work, [p for p in rerun if p.suffix == ".ipynb"])
        width = max(len(name) for name, _ in rows)
        for name, verdict in rows:
            print(f"{name:{width}}  {verdict}")
        same = all(v in ("identical", "outputs unchanged") or v.startswith("per-machine") for _, v in rows)
        print("reproduction identical" if same else "reproduction differs (see above)")
        return 0 if same else 1
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
