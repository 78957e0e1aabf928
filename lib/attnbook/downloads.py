"""Chapter-level data downloads: the data files behind a chapter, zipped with their provenance.

A data file belongs to a chapter when the chapter wrote it (its provenance sidecar names the
notebook) or names it in its source (chapters that plot what an experiment notebook wrote).
The zip is deterministic (fixed timestamps, sorted members), so rebuilding the book leaves it
byte-identical. attnbook.sphinxext writes one per chapter and links it at the end of the page.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

NOT_A_DEPENDENCY = 'zips data files for readers: moves bytes'

SIDECAR = ".provenance.json"
EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip can hold: no build time in the file


def chapter_data_files(root: Path, notebook: str) -> list[Path]:
    """Data files (with their sidecars) of the chapter ``notebook`` (a path from ``root``), sorted."""
    source_path = root / notebook
    if not source_path.is_file():
        return []
    source = source_path.read_text()
    data = root / "data"
    found: set[Path] = set()
    for sidecar in sorted(data.rglob(f"*{SIDECAR}")):
        target = sidecar.with_name(sidecar.name.removesuffix(SIDECAR))
        try:
            writer = json.loads(sidecar.read_text()).get("notebook")
        except (OSError, json.JSONDecodeError):
            continue
        named = target.relative_to(data).as_posix() in source
        if target.is_file() and (writer == notebook or named):
            found.update({target, sidecar})
    return sorted(found)


def write_zip(files: list[Path], root: Path, target: Path) -> Path:
    """Zip ``files`` (stored under their paths from ``root``) into ``target``, deterministically."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(files):
            info = zipfile.ZipInfo(path.relative_to(root).as_posix(), date_time=EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, path.read_bytes())
    return target
