"""The rule that decides which code cells a reader sees, applied by tags (one source of truth).

A reader sees prose, checks and figures; the plumbing stays in the notebook, where nbval still
re-executes and compares it, but off the rendered page:

- the papermill parameters cell (``parameters``, ``injected-parameters``): ``hide-cell``
  (collapsed; one click shows the settings);
- a cell whose only visible outputs are plumbing (figure-data hashes, "wrote data/...") or that
  has no visible output at all while it glues values (``glue(``): ``remove-cell``;
- any other cell that glues values: ``hide-input`` (its checks stay visible).

A cell keeps tags the rule does not manage. ``remove-cell``/``remove-output`` on a cell that
shows a result is a violation (a result must never be hidden by accident), and the rule
removes it. ``apply`` is idempotent; ``violations`` lists what ``apply`` would change.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

PARAMETER_TAGS = frozenset({"parameters", "injected-parameters"})
REMOVING = frozenset({"remove-cell", "remove-output"})
# Lines a chapter prints only so that nbval guards data the reader sees as a figure or file.
PLUMBING = re.compile(r"^(figure data\b|wrote data/)")
RECORD_PREFIX = "application/papermill.record/"  # glue() outputs: never shown where they are made
GLUE_CALL = re.compile(r"(^|[^\w.])glue\(")


def visible_outputs(cell: dict[str, Any]) -> list[dict[str, Any]]:
    """The outputs a reader would see in place (glue records are pasted elsewhere, not here)."""
    shown = []
    for out in cell.get("outputs", []):
        data = out.get("data")
        if data is not None and all(key.startswith(RECORD_PREFIX) for key in data):
            continue
        shown.append(out)
    return shown


def is_plumbing(output: dict[str, Any]) -> bool:
    """A stream output all of whose non-empty lines are plumbing lines (PLUMBING)."""
    if output.get("output_type") != "stream" or output.get("name") != "stdout":
        return False
    text = output.get("text", "")
    lines = [line for line in ("".join(text) if isinstance(text, list) else text).splitlines() if line.strip()]
    return bool(lines) and all(PLUMBING.match(line) for line in lines)


def required_tags(cell: dict[str, Any]) -> set[str]:
    """The tags the rule asks of a code cell (empty for markdown cells)."""
    if cell.get("cell_type") != "code":
        return set()
    tags = set(cell.get("metadata", {}).get("tags", []))
    if tags & PARAMETER_TAGS:
        return {"hide-cell"}
    source = "".join(cell.get("source", ""))
    shown = visible_outputs(cell)
    glues = bool(GLUE_CALL.search(source))
    if shown and all(is_plumbing(out) for out in shown):
        return {"remove-cell"}
    if glues and not shown:
        return {"remove-cell"}
    if glues:
        return {"hide-input"}
    return set()


def forbidden_tags(cell: dict[str, Any]) -> set[str]:
    """Tags the cell carries that would hide a result the rule wants shown."""
    tags = set(cell.get("metadata", {}).get("tags", []))
    return (tags & REMOVING) - required_tags(cell)


def violations(cells: Iterable[dict[str, Any]]) -> list[str]:
    """One line per code cell whose tags break the rule: 'cell N: missing {...}, forbidden {...}'."""
    found = []
    for i, cell in enumerate(cells):
        tags = set(cell.get("metadata", {}).get("tags", []))
        missing, forbidden = required_tags(cell) - tags, forbidden_tags(cell)
        if missing or forbidden:
            found.append(f"cell {i}: missing {sorted(missing)}, forbidden {sorted(forbidden)}")
    return found


def apply(cells: Iterable[dict[str, Any]]) -> int:
    """Bring every cell's tags in line with the rule, in place (tag order kept). Returns the cells changed."""
    changed = 0
    for cell in cells:
        if cell.get("cell_type") != "code":
            continue
        tags = list(cell.get("metadata", {}).get("tags", []))
        drop = forbidden_tags(cell)
        new = [t for t in tags if t not in drop] + sorted(required_tags(cell) - set(tags))
        if new != tags:
            cell.setdefault("metadata", {})["tags"] = new
            changed += 1
    return changed
