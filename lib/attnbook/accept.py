"""``make accept``: establish that stale data files are still what today's code would write, without a full run.

Two routes, each sound on its own terms, each recorded in the sidecar's ``accepted`` field:

* ``rule``: a sidecar written under the old rule (raw bytes of every module) whose dependencies
  were byte-identical at the base revision, and whose kept dependencies have the same normalised
  hash today, is re-hashed under today's rule. Nothing runs: the code is the same code.
* ``canary``: every experiment notebook declares a small parameter set in its metadata
  (``metadata.attnbook.canary``: one seed, few steps, every arm and dtype). The writer of a stale
  file runs that canary twice on this machine, at the base revision (a temporary git worktree)
  and at the work tree (a temporary copy of it), each in its own data folder and in the portable
  numeric environment. Equal bytes in every file it writes: the change did not change what the
  experiment computes on those inputs, and the sidecars take today's dependencies and source,
  with ``accepted: canary``. Different bytes: the files are named and a full run is due.

The base revision must be one where the file was current (checked); by default ``HEAD``.
Chapters are not accepted this way: they run in about 90 seconds, so ``make reproduce ARGS=--stale``
re-runs them. Benchmarks (scripts) may be older than the code and are left alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnbook.machine import PER_MACHINE, REFERENCE, fingerprint, is_other_machine, portable_environment
from attnbook.codehash import exemption, file_hash
from attnbook.provenance import (SIDECAR_SUFFIX, LEGACY_RULE, migrated, package_versions, read_all_provenance, rule_of, sidecar_bytes,
                         sidecar_path, stale_reasons, write_bytes)

NOT_A_DEPENDENCY = "decides whether a sidecar may be rewritten; computes no number of any data file"
EXPERIMENTS = "experiments"
CANARY_KEY = ("attnbook", "canary")
UNCOMPARED = ("DEVICE", "PROGRESS")  # parameters a canary never sets: run on the CPU, no progress bars


@dataclass(frozen=True)
class Outcome:
    """What ``make accept`` decided for one writer."""

    writer: str
    files: tuple[str, ...]
    verdict: str  # "accepted", "migrated", "full run due", "re-run"
    detail: str


def canary_parameters(notebook: Path) -> dict[str, Any]:
    """The canary parameter set an experiment notebook declares in its metadata; ValueError if it declares none."""
    meta: Any = json.loads(notebook.read_text())["metadata"]
    for key in CANARY_KEY:
        meta = meta.get(key) if isinstance(meta, dict) else None
    if not isinstance(meta, dict):
        raise ValueError(f"{notebook.name} declares no canary (notebook metadata attnbook.canary: "
                         "a small parameter set that runs every arm; {} for the notebook's own defaults)")
    bad = sorted(set(meta) & set(UNCOMPARED))
    if bad:
        raise ValueError(f"{notebook.name}: a canary may not set {', '.join(bad)}")
    return dict(meta)


def git(root: Path, *args: str) -> str:
    """The stripped standard output of ``git args`` in ``root``; RuntimeError with git's message on failure."""
    done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


@contextlib.contextmanager
def base_tree(root: Path, revision: str) -> Iterator[Path]:
    """A temporary git worktree of ``revision`` (removed afterwards)."""
    folder = Path(tempfile.mkdtemp(prefix="attnbook-base-"))
    git(root, "worktree", "add", "--detach", "--quiet", str(folder / "tree"), revision)
    try:
        yield folder / "tree"
    finally:
        git(root, "worktree", "remove", "--force", str(folder / "tree"))
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def work_tree_copy(root: Path) -> Iterator[Path]:
    """A temporary copy of every tracked and untracked-but-not-ignored file of the work tree."""
    folder = Path(tempfile.mkdtemp(prefix="attnbook-work-"))
    try:
        for rel in git(root, "ls-files", "-co", "--exclude-standard", "-z").split("\0"):
            if rel and (root / rel).is_file():
                (folder / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(root / rel, folder / rel)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _data_files(tree: Path) -> dict[str, bytes]:
    data = tree / "data"
    return {p.relative_to(tree).as_posix(): p.read_bytes() for p in sorted(data.rglob("*"))
            if p.is_file() and not p.name.startswith(".")} if data.is_dir() else {}


def run_canary(tree: Path, notebook: str, parameters: Mapping[str, Any]) -> dict[str, bytes]:
    """Run ``notebook`` of ``tree`` with ``parameters`` on tree's own library; {data file: bytes} it wrote.

    The writer's own earlier outputs are removed from the tree's data folder first (except per-machine
    measurements, which a chapter may read), so every file it writes is found, even one whose bytes the
    canary leaves as they were.
    """
    import papermill

    for sidecar in (tree / "data").rglob("*" + SIDECAR_SUFFIX):
        if f"/{PER_MACHINE}/" in sidecar.as_posix():
            continue  # another machine's measurements: read by the chapter, never rewritten here
        if json.loads(sidecar.read_text()).get("notebook") == notebook:
            sidecar.with_name(sidecar.name.removesuffix(SIDECAR_SUFFIX)).unlink(missing_ok=True)
            sidecar.unlink()
    before = _data_files(tree)
    pinned = portable_environment() if notebook.startswith(EXPERIMENTS + "/") else {}  # as make reproduce runs it
    env = {**os.environ, **pinned, "PYTHONPATH": str(tree / "lib"), "ATTNBOOK_ROOT": str(tree), "PYTHONHASHSEED": "0"}
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)  # papermill's kernel inherits this process's environment
    try:
        papermill.execute_notebook(str(tree / notebook), str(tree / (notebook + ".canary.ipynb")),
                                   parameters={**parameters, **{k: v for k, v in (("DEVICE", "cpu"), ("PROGRESS", False))
                                                                if k in papermill.inspect_notebook(str(tree / notebook))}},
                                   cwd=str((tree / notebook).parent), progress_bar=False, kernel_name="python3",
                                   extra_arguments=["--IPKernelApp.capture_fd_output=False"])
    finally:
        os.environ.clear()
        os.environ.update(saved)
    after = _data_files(tree)
    return {rel: content for rel, content in after.items() if before.get(rel) != content}


def _ran_on(tree: Path, written: Mapping[str, bytes]) -> bool:
    """Whether every sidecar a canary wrote records the modules of ``tree``'s own library, as they are there."""
    sidecars = [json.loads(v) for k, v in written.items() if k.endswith(SIDECAR_SUFFIX)]
    return bool(sidecars) and all((tree / "lib" / rel).is_file() and file_hash(tree / "lib" / rel, rule_of(sc)) == digest
                                  for sc in sidecars for rel, digest in sc["depends_on"].items())


def counterpart(file: str, written: Mapping[str, bytes]) -> str | None:
    """The file a canary wrote in place of ``file``: itself, or for a file in a per-machine folder
    (``data/**/machines/<fingerprint>/``) the same file in the folder of the machine the canary ran on."""
    if file in written:
        return file
    parts = file.split("/")
    if PER_MACHINE not in parts[:-2]:
        return None
    at = parts.index(PER_MACHINE) + 1
    found = [w for w in written if (q := w.split("/"))[:at] == parts[:at] and q[at + 1:] == parts[at + 1:]
             and len(q) == len(parts)]
    return found[0] if len(found) == 1 else None


def compare_canaries(base: Mapping[str, bytes], work: Mapping[str, bytes]) -> list[str]:
    """The data files (not sidecars) whose canary bytes differ between the two runs, or that only one wrote."""
    names = {n for n in (*base, *work) if not n.endswith(SIDECAR_SUFFIX)}
    return sorted(n for n in names if base.get(n) != work.get(n))


def accepted_record(record: Mapping[str, Any], canary_sidecar: Mapping[str, Any], revision: str,
                    parameters: Mapping[str, Any], code: Path) -> dict[str, Any]:
    """``record`` with today's dependencies, inputs and source (from the work tree's canary sidecar), marked accepted.

    A full run may load modules the canary never reaches: those recorded dependencies that still
    exist are kept, re-hashed under today's rule at ``code``, so an edit to them still stales the file.
    One that is gone (renamed or moved) is replaced by what the canary's run of today's code loaded.
    """
    keep = {k: v for k, v in record.items()
            if k not in ("depends_on", "rule", "notebook_source_sha256", "accepted", "inputs")}
    depends = {rel: file_hash(code / rel) for rel in record["depends_on"]
               if (code / rel).is_file() and exemption(code / rel) is None}
    depends.update(canary_sidecar["depends_on"])
    inputs = {"inputs": canary_sidecar["inputs"]} if canary_sidecar.get("inputs") else {}
    return {**keep, "rule": canary_sidecar["rule"], "depends_on": dict(sorted(depends.items())), **inputs,
            "notebook_source_sha256": canary_sidecar["notebook_source_sha256"],
            "accepted": {"by": "canary", "base": revision, "parameters": dict(parameters)}}


def _write_record(root: Path, record: Mapping[str, Any]) -> None:
    write_bytes(sidecar_path(root / record["file"]), sidecar_bytes(record))


def migrate(root: Path, base: Path, revision: str) -> list[Outcome]:
    """Move every old-rule sidecar that ``provenance.migrated`` allows to today's rule; one outcome per writer."""
    moved: dict[str, list[str]] = {}
    for record in read_all_provenance(root):
        if rule_of(record) != LEGACY_RULE:
            continue
        new = migrated(record, base / "lib", root / "lib", base=revision)
        if new is not None:
            _write_record(root, new)
            moved.setdefault(record["notebook"], []).append(record["file"])
    return [Outcome(writer, tuple(files), "migrated", f"{len(files)} sidecar(s) from rule {LEGACY_RULE}")
            for writer, files in sorted(moved.items())]


def _canary_blockers(record: Mapping[str, Any], root: Path, base: Path) -> list[str]:
    """Why a canary cannot decide for this record: its bytes, parameters or inputs changed, its writer is gone, it
    was written on another device or with other package versions, or it was stale at base. (A module it loaded
    may be gone: renamed or moved, which the canary's run of today's code then stands for.)"""
    blockers = [r for r in stale_reasons(record, root, root / "lib")
                if "differs from the bytes" in r or "non-default parameters" in r or r.startswith("its writer")
                or "its input" in r]
    if record["device"] != "cpu":
        blockers.append(f"written on {record['device']}; a canary runs on the CPU")
    now = package_versions()
    changed = sorted(k for k, v in record["versions"].items() if now.get(k) != v)
    if changed:
        blockers.append("written with other versions of " + ", ".join(f"{k} ({record['versions'][k]}, now {now.get(k)})"
                                                                       for k in changed))
    at_base = stale_reasons(record, base, base / "lib")
    if at_base:
        blockers.append(f"not current at the base revision either ({'; '.join(at_base[:3])})")
    return blockers


def accept_writer(root: Path, base: Path, revision: str, writer: str, records: list[dict[str, Any]]) -> Outcome:
    """Run ``writer``'s canary at base and work tree; rewrite its sidecars when the bytes agree."""
    files = tuple(r["file"] for r in records)
    git(base, "reset", "--quiet", "--hard")  # the base as committed: no earlier canary's outputs
    git(base, "clean", "-fdxq")
    blockers = [f"{r['file']}: {b}" for r in records for b in _canary_blockers(r, root, base)]
    if blockers:
        return Outcome(writer, files, "full run due", "; ".join(blockers))
    parameters = canary_parameters(root / writer)
    with work_tree_copy(root) as work:
        base_bytes = run_canary(base, writer, parameters)
        work_bytes = run_canary(work, writer, parameters)
        wrong = [tree for tree, found in ((base, base_bytes), (work, work_bytes)) if not _ran_on(tree, found)]
        if wrong:
            return Outcome(writer, files, "full run due", f"a canary did not run on its own tree's library: {wrong}")
        differ = compare_canaries(base_bytes, work_bytes)
        missing = [f for f in files if counterpart(f, work_bytes) is None]
        if differ or missing:
            why = (f"canary bytes differ in {', '.join(differ)}" if differ else
                   f"the canary does not write {', '.join(missing)}")
            return Outcome(writer, files, "full run due", why)
        for record in records:
            canary = json.loads(work_bytes[counterpart(record["file"], work_bytes) + SIDECAR_SUFFIX])
            _write_record(root, accepted_record(record, canary, revision, parameters, root / "lib"))
    return Outcome(writer, files, "accepted", f"canary {parameters} gave the same bytes at {revision[:10]}")


def _reference_elsewhere(file: str) -> bool:
    """Whether ``file`` lies in the reference machine's per-machine folder and this is another machine."""
    return f"/{PER_MACHINE}/{REFERENCE}/" in file and fingerprint() != REFERENCE


def _declares_canary(notebook: Path) -> bool:
    try:
        canary_parameters(notebook)
    except ValueError:
        return False
    return True


def accept(root: Path, revision: str = "HEAD") -> list[Outcome]:
    """Migrate old-rule sidecars, then accept each stale experiment by its canary; chapters are listed to re-run."""
    commit = git(root, "rev-parse", "--verify", revision + "^{commit}")
    outcomes: list[Outcome] = []
    with base_tree(root, commit) as base:
        outcomes += migrate(root, base, commit)
        stale: dict[str, list[dict[str, Any]]] = {}
        for record in read_all_provenance(root):
            if (stale_reasons(record, root, root / "lib") and record["notebook"].endswith(".ipynb")
                    and not is_other_machine(record["file"])):
                stale.setdefault(record["notebook"], []).append(record)
        for writer, records in sorted(stale.items()):
            if not writer.startswith(EXPERIMENTS + "/"):
                # a chapter re-runs in minutes; only what this machine cannot rewrite (the reference machine's
                # measurements, on another machine) is accepted by the chapter's canary, when it declares one
                elsewhere = [r for r in records if _reference_elsewhere(r["file"])]
                rest = [r for r in records if r not in elsewhere]
                if rest or not elsewhere or not _declares_canary(root / writer):
                    outcomes.append(Outcome(writer, tuple(r["file"] for r in records), "re-run",
                                            "a chapter: make reproduce ARGS=--stale re-runs it"))
                    continue
                records = elsewhere
            print(f"accept: {writer}: canary at {commit[:10]} and at the work tree ...", flush=True)
            outcomes.append(accept_writer(root, base, commit, writer, records))
    return outcomes
