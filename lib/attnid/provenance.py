"""Atomic writes into data/ and the provenance sidecar that goes with every data file.

Every file a chapter writes lands through ``write_csv`` (or ``write_bytes``): the content
goes to a temporary file in the same folder and is renamed into place only when complete,
so an interrupted run never leaves a half-written file. Next to ``name.csv`` sits
``name.csv.provenance.json`` recording what produced it.

The sidecar must be byte-for-byte stable when the same code runs twice, so it holds no
timestamps. It records the commit of the last change to the library and the pins
(``lib/``, ``pyproject.toml``, ``requirements.txt``) rather than HEAD: HEAD moves every
time results are committed, the code that computed them does not. The notebook itself is
identified by a SHA-256 of its source cells (outputs excluded).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import nbformat

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = REPO_ROOT / "data"
SIDECAR_SUFFIX = ".provenance.json"
CODE_PATHS = ("lib", "pyproject.toml", "requirements.txt")
VERSIONED_PACKAGES = ("attnid", "torch", "triton", "numpy", "sympy", "matplotlib")


def write_bytes(path: Path, content: bytes) -> None:
    """Write ``content`` to ``path`` atomically (temporary file in the same folder, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def code_commit() -> dict[str, Any]:
    """The last commit that changed the library or the pins, and whether they have uncommitted edits."""
    commit = _git("log", "-1", "--format=%H", "--", *CODE_PATHS)
    status = _git("status", "--porcelain", "--", *CODE_PATHS)
    return {"git_commit": commit or "unknown", "git_dirty": bool(status) if status is not None else None}


def notebook_source_hash(notebook: Path) -> str:
    """SHA-256 of a notebook's cell types and sources, ignoring outputs and papermill's injected cell."""
    nb = nbformat.read(notebook, as_version=4)
    digest = hashlib.sha256()
    for cell in nb.cells:
        if "injected-parameters" in cell.get("metadata", {}).get("tags", []):
            continue
        digest.update(cell.cell_type.encode() + b"\0" + cell.source.encode() + b"\0")
    return digest.hexdigest()


def package_versions() -> dict[str, str]:
    """Python and the versions of the packages the numbers depend on."""
    versions = {"python": platform.python_version()}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def provenance_record(
    path: Path, content: bytes, notebook: str, parameters: Mapping[str, Any], device: str, data_dir: Path = DATA_DIR
) -> dict[str, Any]:
    """Everything the sidecar of the data file ``path`` holding ``content`` records (see module docstring).

    ``notebook`` is the repository path of what wrote the file: a chapter notebook (hashed by
    its source cells) or a script such as a benchmark (hashed whole).
    """
    nb_path = REPO_ROOT / notebook
    if not nb_path.is_file():
        raise ValueError(f"notebook {notebook!r} not found under {REPO_ROOT}")
    source_hash = (notebook_source_hash(nb_path) if nb_path.suffix == ".ipynb"
                   else hashlib.sha256(nb_path.read_bytes()).hexdigest())
    return {
        "file": path.resolve().relative_to(data_dir.resolve().parent).as_posix(),
        "sha256": hashlib.sha256(content).hexdigest(),
        "notebook": notebook,
        "notebook_source_sha256": source_hash,
        "parameters": dict(parameters),
        **code_commit(),
        "device": device,
        "versions": package_versions(),
    }


def _csv_text(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = [",".join(header)]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"row {row!r} has {len(row)} fields, the header has {len(header)}")
        for value in row:
            if any(c in str(value) for c in ',"\n'):
                raise ValueError(f"CSV value {str(value)!r} holds a comma, quote or newline; this writer does not quote")
        lines.append(",".join(str(v) for v in row))
    return "\n".join(lines) + "\n"


def write_csv(
    path: Path | str,
    header: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    notebook: str,
    parameters: Mapping[str, Any],
    device: str,
    data_dir: Path = DATA_DIR,
) -> Path:
    """Write a CSV under ``data_dir`` atomically, then its provenance sidecar. Returns the CSV path.

    A relative ``path`` is taken relative to ``data_dir``. Values are written with ``str``:
    format floats before passing them, at the precision the computation really has.
    """
    path = Path(path)
    if not path.is_absolute():
        path = data_dir / path
    if data_dir.resolve() not in path.resolve().parents:
        raise ValueError(f"data files live under {data_dir}; got {path}")
    content = _csv_text(header, rows).encode()
    record = provenance_record(path, content, notebook, parameters, device, data_dir)  # validates before writing
    write_bytes(path, content)
    sidecar = path.with_name(path.name + SIDECAR_SUFFIX)
    write_bytes(sidecar, (json.dumps(record, indent=2, sort_keys=True) + "\n").encode())
    return path


def read_all_provenance(data_dir: Path = DATA_DIR) -> list[dict[str, Any]]:
    """Every sidecar under ``data_dir``, sorted by file name."""
    return [json.loads(p.read_text()) for p in sorted(data_dir.rglob("*" + SIDECAR_SUFFIX))]
