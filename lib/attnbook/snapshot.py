"""All-or-nothing runs for data/: a notebook that fails leaves data/ exactly as it found it.

``all_or_nothing(data, backup)`` copies the data folder aside before a run, and on any
failure (an exception, Ctrl-C) puts back every file the run changed, added or removed. The
copy lives in ``backup`` until the run ends; if a run is killed outright (kill -9), the copy
is still there and the next ``all_or_nothing`` restores it before doing anything else.
``remove_temporaries`` deletes the temporary files an interrupted atomic write leaves behind.
"""

from __future__ import annotations

import filecmp
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from attnbook.provenance import write_bytes

NOT_A_DEPENDENCY = 'copies data/ aside and restores it: moves bytes'

TEMPORARY_PATTERNS = (".*.tmp", ".*.tmp.ipynb")  # what write_bytes and the notebook runner name their temporaries


def _files(folder: Path) -> set[Path]:
    return {p.relative_to(folder) for p in folder.rglob("*") if p.is_file()} if folder.is_dir() else set()


def restore(data: Path, backup: Path) -> list[str]:
    """Make ``data`` hold exactly the files of ``backup``; returns the relative paths that changed."""
    changed = []
    for rel in sorted(_files(data) - _files(backup)):
        (data / rel).unlink()
        changed.append(rel.as_posix())
    for rel in sorted(_files(backup)):
        if not (data / rel).is_file() or not filecmp.cmp(backup / rel, data / rel, shallow=False):
            write_bytes(data / rel, (backup / rel).read_bytes())
            changed.append(rel.as_posix())
    return changed


@contextmanager
def all_or_nothing(data: Path, backup: Path) -> Iterator[None]:
    """Run the body; if it raises (or is interrupted), put ``data`` back as it was before it started."""
    if backup.exists():  # a run before this one was killed before it could clean up
        changed = restore(data, backup)
        shutil.rmtree(backup)
        if changed:
            print(f"restored {len(changed)} file(s) in {data.name}/ left by an interrupted run", flush=True)
    staging = backup.with_name(backup.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    if data.is_dir():
        shutil.copytree(data, staging)
    else:
        staging.mkdir(parents=True)
    os.replace(staging, backup)  # the backup exists only once it is complete
    try:
        yield
    except BaseException:
        restore(data, backup)
        raise
    finally:
        shutil.rmtree(backup, ignore_errors=True)


def remove_temporaries(*folders: Path, recursive: bool = True) -> list[Path]:
    """Delete the temporary files (``.NAME.*.tmp``) interrupted atomic writes left in ``folders`` (and below)."""
    removed = []
    for folder in folders:
        for pattern in TEMPORARY_PATTERNS:
            for path in (folder.rglob(pattern) if recursive else folder.glob(pattern)):
                if path.is_file():
                    path.unlink()
                    removed.append(path)
    return removed
