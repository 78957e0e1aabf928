"""Atomic writes into data/, the provenance sidecar of every data file, and when a data file is stale.

Every file a chapter or script writes lands through ``write_csv`` (or ``write_bytes``): the
content goes to a temporary file in the same folder and is renamed into place only when
complete, and a data file and its sidecar are replaced as a pair (``write_pair``) so that an
interruption leaves the old pair, the new pair, or a mismatch that ``check_pair`` reports. Next
to ``name.csv`` sits ``name.csv.provenance.json``, which records what the numbers depended on,
found at run time rather than assumed:

* ``depends_on``: a hash of every module of the ``attnid`` and ``attnbook`` packages loaded in
  the writing process when the file was written (``sys.modules``), and of the data files those
  modules declare they read; ``rule`` says how they were hashed (``attnbook.codehash``: the
  docstring-free syntax tree, so a comment, docstring or formatting edit stales nothing, and
  plumbing that only moves bytes is left out);
* ``notebook_source_sha256``: the writer's own source (a notebook's cell sources, outputs
  excluded; a script's bytes);
* ``parameters``: the values it ran with;
* ``inputs`` (only when the writer read data files first): {data file: SHA-256} of what it read;
* ``accepted`` (only when the file was not written by a full run of today's code): how its
  currency was established instead, by ``make accept`` (``attnbook.accept``): a canary run that
  gave the same bytes at the base revision and at the work tree, or the move of an old-rule
  sidecar whose every dependency was byte-for-byte unchanged.

A data file is stale exactly when one of these no longer matches (``stale_reasons``): editing
a module the chapter never imported leaves its data current. The sidecar holds no timestamp
and no commit of its own, so it is byte-for-byte stable when the same code runs twice. Versions
and the device are recorded for the reader, not compared.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import json
import os
import platform
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from attnbook.codehash import LEGACY_RULE, RULE, exemption, file_hash
from attnbook.codehash import loaded_dependencies as _loaded_dependencies
from attnbook.paths import data_dir as default_data_dir
from attnbook.paths import repo_root

NOT_A_DEPENDENCY = ("moves bytes: atomic writes and sidecars; the bytes it writes are checked against a fresh "
                    "serialisation of every committed data file by tests/test_provenance.py")
SIDECAR_SUFFIX = ".provenance.json"
VERSIONED_PACKAGES = ("attnid", "torch", "triton", "numpy", "sympy", "matplotlib")
FILE_MODE = 0o644  # what git checks out: readable by all, like every other committed file


def _write_temporary(path: Path, content: bytes) -> Path:
    """``content`` in a complete, synced temporary file next to ``path`` (named ``.NAME.*.tmp``), mode 0644."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, FILE_MODE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def write_bytes(path: Path, content: bytes) -> None:
    """Write ``content`` to ``path`` atomically (temporary file in the same folder, then rename)."""
    tmp = _write_temporary(path, content)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_pair(path: Path, content: bytes, sidecar_content: bytes) -> None:
    """Replace a data file and its sidecar so that any interruption is either harmless or detectable.

    Both are written completely to temporary files first; then the data file is renamed into
    place, then the sidecar. Killed before the first rename: the old pair is intact (and the
    temporaries are removed by the next ``make reproduce``). Killed between the renames: the new
    data file sits beside the old sidecar, whose SHA-256 no longer matches, which ``check_pair``
    reports and the next run of the writer repairs.
    """
    sidecar = sidecar_path(path)
    tmp_data = _write_temporary(path, content)
    try:
        tmp_sidecar = _write_temporary(sidecar, sidecar_content)
    except BaseException:
        tmp_data.unlink(missing_ok=True)
        raise
    try:
        os.replace(tmp_data, path)
        os.replace(tmp_sidecar, sidecar)
    finally:
        tmp_data.unlink(missing_ok=True)
        tmp_sidecar.unlink(missing_ok=True)


def sidecar_path(path: Path) -> Path:
    """Where the provenance of ``path`` lives: NAME.provenance.json next to it."""
    return path.with_name(path.name + SIDECAR_SUFFIX)


def check_pair(path: Path) -> dict[str, Any]:
    """The sidecar record of the data file ``path``; ValueError naming the file if the two do not match."""
    sidecar = sidecar_path(path)
    if not path.is_file():
        raise ValueError(f"{path} does not exist: run `make reproduce`")
    if not sidecar.is_file():
        raise ValueError(f"{path} has no provenance sidecar {sidecar.name}: run `make reproduce`")
    try:
        record = json.loads(sidecar.read_text())
        expected = record["sha256"]
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{sidecar} is not a valid provenance record ({err}): run `make reproduce`") from None
    if _sha256(path) != expected:
        raise ValueError(f"{path} does not match its provenance sidecar (an interrupted write?): run `make reproduce`")
    return record


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def code_root() -> Path:
    """The folder that holds the tracked packages (``lib/`` in a checkout)."""
    import attnid

    return Path(attnid.__file__).resolve().parent.parent


def loaded_dependencies(root: Path | None = None) -> dict[str, str]:
    """{path relative to ``root``: hash} of every tracked module loaded now (plumbing excluded), and the data
    files they declare (``attnbook.codehash``)."""
    return _loaded_dependencies(code_root() if root is None else root)


def notebook_source_hash(path: Path) -> str:
    """SHA-256 of a notebook's cell types and sources (outputs and papermill's injected cell ignored),
    or of a script's bytes."""
    if path.suffix != ".ipynb":
        return _sha256(path)
    digest = hashlib.sha256()
    for cell in json.loads(path.read_text())["cells"]:
        if "injected-parameters" in cell.get("metadata", {}).get("tags", []):
            continue
        source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        digest.update(cell["cell_type"].encode() + b"\0" + source.encode() + b"\0")
    return digest.hexdigest()


def notebook_parameters(path: Path) -> dict[str, Any]:
    """The defaults of a notebook's cell tagged ``parameters``: {name: value} for every literal assignment."""
    cells = [c for c in json.loads(path.read_text())["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise ValueError(f"{path.name} must have exactly one cell tagged 'parameters', found {len(cells)}")
    source = cells[0]["source"] if isinstance(cells[0]["source"], str) else "".join(cells[0]["source"])
    found: dict[str, Any] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                found[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue  # not a literal: the source hash still covers it
    return found


def package_versions() -> dict[str, str]:
    """Python and the versions of the packages the numbers depend on."""
    versions = {"python": platform.python_version()}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def _json(value: Any) -> Any:
    """``value`` as JSON would give it back (tuples become lists), refusing what JSON cannot hold."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as err:
        raise ValueError(f"parameters must be plain JSON values (int, float, str, bool, lists, dicts): {err}") from None


def provenance_record(path: Path, content: bytes, notebook: str, parameters: Mapping[str, Any], device: str,
                      root: Path, data: Path, inputs: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Everything the sidecar of ``path`` (holding ``content``, under the data folder ``data``) records;
    see the module docstring. ``notebook`` is the writer's path from the book's ``root``."""
    source = root / notebook
    if not source.is_file():
        raise ValueError(f"notebook or script {notebook!r} not found under {root}")
    record = {
        "file": path.resolve().relative_to(data.resolve().parent).as_posix(),
        "sha256": hashlib.sha256(content).hexdigest(),
        "notebook": notebook,
        "notebook_source_sha256": notebook_source_hash(source),
        "parameters": _json(dict(parameters)),
        "rule": RULE,
        "depends_on": loaded_dependencies(),
        "device": device,
        "versions": package_versions(),
    }
    if inputs:
        record["inputs"] = dict(sorted(inputs.items()))
    return record


def sidecar_bytes(record: Mapping[str, Any]) -> bytes:
    """The one serialisation of a sidecar record: sorted keys, two-space indent, a final newline."""
    return (json.dumps(record, indent=2, sort_keys=True) + "\n").encode()


def csv_text(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Comma-separated text with a header; refuses values this unquoted format cannot hold."""
    lines = [",".join(header)]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"row {row!r} has {len(row)} fields, the header has {len(header)}")
        for value in row:
            if any(c in str(value) for c in ',"\n'):
                raise ValueError(f"CSV value {str(value)!r} holds a comma, quote or newline; this writer does not quote")
        lines.append(",".join(str(v) for v in row))
    return "\n".join(lines) + "\n"


def write_csv(path: Path | str, header: Sequence[str], rows: Iterable[Sequence[Any]], *, notebook: str,
              parameters: Mapping[str, Any], device: str, root: Path | None = None,
              data_dir: Path | None = None, inputs: Mapping[str, str] | None = None) -> Path:
    """Write a CSV under the data folder (default ``<root>/data``) atomically, with its sidecar. Returns the CSV path.

    A relative ``path`` is taken relative to the data folder (a benchmark's smoke run passes a
    temporary one). Values are written with ``str``:
    format floats before passing them, at the precision the computation really has. Both
    files are fully prepared before either is written.
    """
    root = repo_root() if root is None else root
    data = default_data_dir(root) if data_dir is None else data_dir
    path = Path(path)
    if not path.is_absolute():
        path = data / path
    if data.resolve() not in path.resolve().parents:
        raise ValueError(f"data files live under {data}; got {path}")
    content = csv_text(header, rows).encode()
    record = provenance_record(path, content, notebook, parameters, device, root, data, inputs)
    write_pair(path, content, sidecar_bytes(record))
    return path


def read_all_provenance(root: Path | None = None) -> list[dict[str, Any]]:
    """Every sidecar under ``<root>/data``, sorted by file name."""
    data = default_data_dir(root)
    return [json.loads(p.read_text()) for p in sorted(data.rglob("*" + SIDECAR_SUFFIX))]


def code_digest(record: Mapping[str, Any]) -> str:
    """A short digest of everything a data file depended on (its code, source and parameters), for tables."""
    keys = {k: record[k] for k in ("depends_on", "notebook_source_sha256", "parameters")}
    return hashlib.sha256(json.dumps(keys, sort_keys=True).encode()).hexdigest()[:10]


def rule_of(record: Mapping[str, Any]) -> str:
    """How the record's dependencies were hashed; sidecars written before rules were recorded are ``LEGACY_RULE``."""
    return record.get("rule", LEGACY_RULE)


def currency(record: Mapping[str, Any]) -> str:
    """How the data file's currency was established, in a few words for the reproducing page."""
    accepted = record.get("accepted")
    if rule_of(record) == LEGACY_RULE:
        return "full run, old rule (raw bytes of every loaded module)"
    if not accepted:
        return "full run"
    if accepted.get("by") == "canary":
        return f"canary at {accepted['base'][:10]} and the work tree, same bytes"
    if accepted.get("by") == "rule":
        return f"full run; sidecar moved from rule {accepted['from']} (every dependency byte-identical)"
    raise ValueError(f"{record['file']}: unknown acceptance {accepted!r}")


def dependency_reasons(record: Mapping[str, Any], code: Path) -> list[str]:
    """Which recorded dependencies are gone or changed, hashed under the record's own rule."""
    rule, reasons = rule_of(record), []
    for rel, digest in sorted(record["depends_on"].items()):
        if not (code / rel).is_file():
            reasons.append(f"{rel} is gone")
        elif file_hash(code / rel, rule) != digest:
            reasons.append(f"{rel} changed")
    return reasons


def stale_reasons(record: Mapping[str, Any], root: Path | None = None, code: Path | None = None) -> list[str]:
    """Why the data file of ``record`` no longer matches what produced it; empty when it is current.

    Compares its own bytes, its writer's source, the writer's parameter defaults (notebooks) and
    every recorded dependency with what is on disk now (modules under ``code``, default ``code_root()``),
    each dependency hashed under the rule the sidecar was written with.
    """
    root = repo_root() if root is None else root
    code = code_root() if code is None else code
    reasons = []
    data_file, source = root / record["file"], root / record["notebook"]
    if not data_file.is_file() or _sha256(data_file) != record["sha256"]:
        reasons.append(f"{record['file']} differs from the bytes its sidecar records")
    if not source.is_file():
        return [*reasons, f"its writer {record['notebook']} is gone"]
    if notebook_source_hash(source) != record["notebook_source_sha256"]:
        reasons.append(f"{record['notebook']} changed")
    if source.suffix == ".ipynb":
        defaults = _json(notebook_parameters(source))
        changed = sorted(k for k, v in record["parameters"].items() if k in defaults and defaults[k] != v)
        if changed:
            reasons.append(f"ran with non-default parameters {', '.join(changed)}")
    for rel, digest in sorted(record.get("inputs", {}).items()):
        if not (root / rel).is_file() or _sha256(root / rel) != digest:
            reasons.append(f"its input {rel} changed")
    return reasons + dependency_reasons(record, code)


def migrated(record: Mapping[str, Any], base_code: Path, code: Path | None = None,
             base: str = "") -> dict[str, Any] | None:
    """An old-rule record moved to ``RULE`` without running anything, or None where that is not sound.

    Sound when the record was current at the base revision (every dependency under ``base_code``
    byte-identical to what it recorded) and no dependency changed behaviour since (its normalised
    hash under ``code``, default ``code_root()``, equals the base's; plumbing too, since it ran when
    the file was written). Plumbing (``NOT_A_DEPENDENCY`` under ``code``) is then dropped. None when
    the record is already under ``RULE``.
    """
    code = code_root() if code is None else code
    if rule_of(record) != LEGACY_RULE or dependency_reasons(record, base_code):
        return None
    depends = {}
    for rel in record["depends_on"]:
        if not (code / rel).is_file() or file_hash(base_code / rel) != file_hash(code / rel):
            return None  # gone, or changed in behaviour since the base: plumbing included, since it ran then
        if exemption(code / rel) is None:
            depends[rel] = file_hash(code / rel)
    accepted = {"by": "rule", "from": LEGACY_RULE, **({"base": base} if base else {})}
    return {**record, "rule": RULE, "depends_on": depends, "accepted": accepted}
