"""The layout rules: one-way dependencies, no import cycle, a light public API that needs no checkout."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import attnid

LIB = Path(attnid.__file__).resolve().parent.parent
PACKAGES = ("attnid", "attnbook")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(LIB).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((LIB / pkg).rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module of ours that ``name`` imports, at module level or inside functions."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t.split(".")[0] in PACKAGES)
    return found - {name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_import_walker_sees_imports_inside_functions(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from .layer import forward\n    from . import symmetry\n")
    assert _imports("attnid.m", source, set(_modules())) == {"attnid.layer", "attnid.symmetry"}


def test_no_import_cycle_in_lib() -> None:
    assert _cycle(_graph()) is None


def test_the_library_never_imports_the_book_layer() -> None:
    for name, targets in _graph().items():
        if name.startswith("attnid"):
            assert not any(t.startswith("attnbook") for t in targets), name
    for path in (LIB / "attnid").rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"^\s*(import|from)\s+(nbformat|papermill|matplotlib|myst_nb)\b", text, re.M), path


def test_rope_and_normalise_are_leaves() -> None:
    graph = _graph()
    assert graph["attnid.rope"] == set() and graph["attnid.normalise"] == set()
    assert "attnid.rope" in graph["attnid.kernels.launch"] and "attnid.rope" in graph["attnid.layer"]  # the tables
    assert "attnid.normalise" in graph["attnid.kernels.reference"] and "attnid.normalise" in graph["attnid.layer"]
    assert "attnid.toy" not in graph["attnid.counts"]


def test_public_api_outside_a_checkout(tmp_path: Path) -> None:
    # From a folder that is not the book: the library needs no repository, and importing it loads
    # neither the book layer nor notebook tooling nor the kernels.
    code = ("import sys, attnid\n"
            "spec = attnid.AttentionSpec.create(8, 2)\n"
            "assert attnid.count(spec).unidentified == 2 * (4 * 4 + 4 * 4)\n"
            "assert callable(attnid.verify) and callable(attnid.forward) and callable(attnid.init_params)\n"
            "heavy = [m for m in ('attnbook', 'nbformat', 'matplotlib', 'attnid.kernels') if m in sys.modules]\n"
            "assert not heavy, heavy\n"
            "assert callable(attnid.attention) and 'attnid.kernels' in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True)


def _architecture_block() -> str:
    page = (LIB.parent / "notes" / "architecture.md").read_text(encoding="utf-8")
    return page.split("```", 2)[1]


def _names_on_disk(package: Path, recursive: bool) -> set[str]:
    """Module stems (no dunder files) and sub-package names under ``package``."""
    files = package.rglob("*.py") if recursive else package.glob("*.py")
    modules = {p.stem for p in files if not p.stem.startswith("_") and "egg-info" not in str(p)}
    folders = package.rglob("*") if recursive else package.iterdir()
    return modules | {p.name for p in folders if (p / "__init__.py").is_file()}


def test_the_architecture_map_lists_every_module() -> None:
    # notes/architecture.md's block is the complete map, sub-packages included; each package's docstring maps
    # its top level and must never name a module that is gone.
    block = _architecture_block()
    mapped = set(re.findall(r"(\w+)\.py\b", block)) | set(re.findall(r"(\w+)/\s", block))
    for package in ("attnid", "attnbook"):
        on_disk = _names_on_disk(LIB / package, recursive=True)
        assert on_disk <= mapped, (package, on_disk - mapped)
        module = importlib.import_module(package)
        listed = set(re.findall(r"^``(\w+)``", module.__doc__ or "", re.M))
        assert listed <= _names_on_disk(LIB / package, recursive=False), (package, listed)
    for name in attnid.__all__:
        assert getattr(attnid, name) is not None


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        attnid.nope  # noqa: B018


def test_importing_the_packages_loads_at_most_four_of_their_modules() -> None:
    # Both faces are lazy (PEP 562): what a data file's provenance records is what its writer used.
    code = ("import sys, attnid, attnbook\n"
            "mods = sorted(m for m in sys.modules if m.split('.')[0] in ('attnid', 'attnbook'))\n"
            "assert len([m for m in mods if m.startswith('attnid')]) <= 4 and len(mods) <= 8, mods\n"
            "import types\n"
            "assert isinstance(attnid.verify, types.FunctionType) and attnid.verify.__module__ == 'attnid.families'\n"
            "assert set(attnid.__all__) <= set(dir(attnid)) and callable(attnbook.setup)\n")
    subprocess.run([sys.executable, "-c", code], check=True)
