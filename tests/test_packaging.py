"""The library installs alone: a fresh virtual environment with only its declared dependencies runs it."""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "hf_configs" / "llama-3-8b"
BUILD = ("setuptools",)  # what building the wheel needs (no network: the build runs without isolation)


def _declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"]]


def _closure(roots: list[str]) -> set[str]:
    """The installed distributions ``roots`` need, with theirs, recursively (markers evaluated, no extras)."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        for text in metadata.requires(name) or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def _expose(dists: set[str], site: Path) -> None:
    """Link each distribution's top-level files (packages, modules, .dist-info) into ``site``."""
    for name in dists:
        dist = metadata.distribution(name)
        base = Path(str(dist.locate_file("")))
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            source, target = base / top, site / top
            if source.exists() and not target.exists() and ".." not in top and top != "bin":
                target.symlink_to(source)


@pytest.mark.slow
def test_the_library_installs_and_runs_without_the_book_dependencies(tmp_path: Path) -> None:
    installed = {d.metadata["Name"].lower(): d.version for d in metadata.distributions()}
    for req in _declared():  # the pins the book runs with lie inside the ranges the library declares
        assert req.specifier.contains(installed[req.name.lower()], prereleases=True), (req, installed[req.name.lower()])
    dists = _closure([r.name for r in _declared()] + list(BUILD))
    assert not {"matplotlib", "nbformat", "jupyter-book", "papermill"} & dists
    site = tmp_path / "deps"
    site.mkdir()
    _expose(dists, site)
    source = tmp_path / "src"  # a copy: building writes build/ and *.egg-info next to the sources
    shutil.copytree(ROOT / "lib", source / "lib", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "deps.pth").write_text(f"{site}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    pip = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", "--no-deps", "--no-build-isolation", "--no-index", str(source)], check=True,
                   env=env, cwd=tmp_path)
    probe = ("import importlib.util, attnid, attnid.families, attnid.hf.config;"
             "print(attnid.__file__); print(importlib.util.find_spec('matplotlib') is None)")
    out = subprocess.run([python, "-c", probe], check=True, capture_output=True, text=True, env=env, cwd=tmp_path).stdout
    where, no_matplotlib = out.split()
    assert where.startswith(purelib) and no_matplotlib == "True", out
    result = subprocess.run([venv / "bin" / "attnid", "count", "--config", str(FIXTURE), "--json"], capture_output=True,
                            text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    here = subprocess.run([sys.executable, "-m", "attnid.cli", "count", "--config", str(FIXTURE), "--json"],
                          capture_output=True, text=True, check=True, cwd=tmp_path)
    assert json.loads(result.stdout) == json.loads(here.stdout)
