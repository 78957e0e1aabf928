"""What a data file's code dependencies are, and how each is hashed: by behaviour, not by bytes.

The rule (``RULE``, recorded in every sidecar):

* a Python module is hashed as its normalised syntax tree: parsed, every docstring removed
  (every statement that is a bare string: the docstrings of modules, classes and functions, and
  strings used as comments), then printed back with
  ``ast.unparse``. Comments, blank lines, quotes, line breaks and docstrings change nothing;
  any change to a statement or an expression changes the hash;
* any other file a module declares it reads (a module-level ``DATA_FILES``) is hashed as bytes;
* a module that only moves bytes declares ``NOT_A_DEPENDENCY = "<why>"`` and is left out. Such
  plumbing is guarded by a test instead: every committed data file and sidecar must equal what
  today's writer would serialise from its contents (``tests/test_provenance.py``), so a format
  change that changes bytes is still caught.

Because docstrings are out of the hash, a module that reads a docstring at run time
(``__doc__``, ``inspect.getdoc``) must never be a dependency of a data file; a test checks it.

Sidecars written before this rule (no ``rule`` field: ``LEGACY_RULE``, the SHA-256 of the raw
bytes of every loaded module) are still read: ``attnbook.provenance`` compares them byte for byte.
"""

from __future__ import annotations

import ast
import hashlib
import sys
from pathlib import Path

NOT_A_DEPENDENCY = 'decides how dependencies are hashed: changes sidecars, never a computed number'

RULE = "ast-unparse/1"  # Python modules: docstring-free syntax tree, printed by ast.unparse; other files: bytes
LEGACY_RULE = "bytes/0"  # sidecars without a rule field: raw bytes of every loaded module
TRACKED_PACKAGES = ("attnid", "attnbook")
EXEMPT_ATTRIBUTE = "NOT_A_DEPENDENCY"


def _is_string_statement(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    """``tree`` without docstrings (in place): every statement that is a bare string, in any body.

    That is the docstring of the module and of every class and function, and any other string
    statement (an attribute's docstring, a string used as a comment): none of them computes anything.
    """
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if isinstance(body, list) and any(isinstance(s, ast.stmt) and _is_string_statement(s) for s in body):
                kept = [s for s in body if not _is_string_statement(s)]
                setattr(node, field, kept or ([ast.Pass()] if field == "body" and not isinstance(node, ast.Module)
                                              else []))
    return tree


def normalised_source(source: str, name: str = "<module>") -> str:
    """The behaviour-bearing text of a Python module: its syntax tree without docstrings, unparsed."""
    return ast.unparse(_strip_docstrings(ast.parse(source, filename=name)))


_NORMALISED: dict[str, str] = {}


def file_hash(path: Path, rule: str = RULE) -> str:
    """SHA-256 of ``path`` under ``rule``: the normalised source of a ``.py`` file, else the bytes.

    The normalised hash is remembered per process by the SHA-256 of the file's bytes, so that checking
    every sidecar parses each distinct module text once, not once per data file.
    """
    raw = path.read_bytes()
    if rule not in (RULE, LEGACY_RULE):
        raise ValueError(f"unknown provenance rule {rule!r}; known: {RULE!r}, {LEGACY_RULE!r}")
    if rule == LEGACY_RULE or path.suffix != ".py":
        return hashlib.sha256(raw).hexdigest()
    key = hashlib.sha256(raw).hexdigest()
    if key not in _NORMALISED:
        _NORMALISED[key] = hashlib.sha256(normalised_source(raw.decode("utf-8"), str(path)).encode()).hexdigest()
    return _NORMALISED[key]


def exemption(path: Path) -> str | None:
    """The reason a module gives for being plumbing (its ``NOT_A_DEPENDENCY`` string), read from its source."""
    if path.suffix != ".py" or not path.is_file():
        return None
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == EXEMPT_ATTRIBUTE and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str) and node.value.value.strip()):
            return node.value.value
    return None


def loaded_files(root: Path) -> list[Path]:
    """Every tracked module loaded in this process, and the data files they declare, except plumbing."""
    files: set[Path] = set()
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] not in TRACKED_PACKAGES or not getattr(module, "__file__", None):
            continue
        path = Path(module.__file__).resolve()
        if exemption(path) is not None:  # declared in the module's own source, as ``migrated`` reads it
            continue
        files.add(path)
        files.update(Path(f).resolve() for f in getattr(module, "DATA_FILES", ()))
    return sorted(f for f in files if f.is_relative_to(root))


def loaded_dependencies(root: Path) -> dict[str, str]:
    """{path relative to ``root``: hash under ``RULE``} of what ``loaded_files`` finds."""
    return {f.relative_to(root).as_posix(): file_hash(f) for f in loaded_files(root)}


def reads_docstrings(path: Path) -> list[int]:
    """Line numbers where the module at ``path`` may read a docstring at run time.

    ``x.__doc__``, a bare ``__doc__``, ``getdoc`` however imported or called, and the strings
    ``"__doc__"`` and ``"getdoc"`` (as in ``getattr(f, "__doc__")``).
    """
    names = ("__doc__", "getdoc")
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if (isinstance(node, ast.Attribute) and node.attr in names or isinstance(node, ast.Name) and node.id in names
                or isinstance(node, ast.Constant) and node.value in names
                or isinstance(node, ast.alias) and node.name in names):
            lines.append(getattr(node, "lineno", 0) or 0)
    return sorted(lines)
