"""The rule that decides which code cells a reader sees, applied by tags (one source of truth).

A reader sees prose, checks and figures; the plumbing stays in the notebook, where nbval still
re-executes and compares it, but off the rendered page:

- the papermill parameters cell (``parameters``, ``injected-parameters``): ``hide-cell``
  (collapsed; one click shows the settings);
- a cell whose only visible outputs are plumbing (figure-data hashes, "wrote data/...") or that
  has no visible output at all while it glues values (``glue(``): ``remove-cell``;
- any other cell that glues values: ``hide-input`` (its checks stay visible);
- a cell of more than ``LONG_CELL_LINES`` lines that shows a result: ``hide-input`` (the result
  stays in view; a long listing would push it, and the prose, off the page).

Every collapsed cell gets a button that says what it opens (myst-nb's ``code_prompt_show`` and
``code_prompt_hide`` in the cell's ``mystnb`` metadata): the chapter's parameters, its imports and
setup, or the code behind the result shown under it (``PROMPTS``).

A cell keeps tags the rule does not manage. ``remove-cell``/``remove-output`` on a cell that
shows a result is a violation (a result must never be hidden by accident), and the rule
removes it. ``apply`` is idempotent; ``violations`` lists what ``apply`` would change.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

NOT_A_DEPENDENCY = "decides which cells a reader sees: notebooks' metadata, no data"

PARAMETER_TAGS = frozenset({"parameters", "injected-parameters"})
REMOVING = frozenset({"remove-cell", "remove-output"})
# Lines a chapter prints only so that nbval guards data the reader sees as a figure or file.
PLUMBING = re.compile(r"^(figure data\b|wrote data/)")
RECORD_PREFIX = "application/papermill.record/"  # glue() outputs: never shown where they are made
GLUE_CALL = re.compile(r"(^|[^\w.])glue(_all)?\(")  # glue(...) or glue_all({...})
LONG_CELL_LINES = 25  # a visible code cell longer than this (a symbolic check is shorter) is collapsed (its outputs stay)
SETUP_CALL = re.compile(r"attnbook\.setup\(")
PROMPTS = {  # what the button of a collapsed cell says, by the cell's role
    "parameters": ("Show the parameters of this notebook", "Hide the parameters"),
    "setup": ("Show the imports and setup", "Hide the imports and setup"),
    "result": ("Show the code behind this result", "Hide the code"),
}


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
    if glues or (shown and source.count("\n") + 1 > LONG_CELL_LINES):
        return {"hide-input"}
    return set()


def required_prompts(cell: dict[str, Any], tags: set[str]) -> dict[str, str]:
    """The labels of a collapsed cell's button ({} for a cell shown in full or removed), given its tags."""
    if cell.get("cell_type") != "code" or "remove-cell" in tags or not tags & {"hide-cell", "hide-input"}:
        return {}
    role = ("parameters" if tags & PARAMETER_TAGS else
            "setup" if SETUP_CALL.search("".join(cell.get("source", ""))) else "result")
    show, hide = PROMPTS[role]
    return {"code_prompt_show": show, "code_prompt_hide": hide}


def _prompts(cell: dict[str, Any]) -> dict[str, str]:
    mystnb = cell.get("metadata", {}).get("mystnb", {})
    return {k: mystnb[k] for k in ("code_prompt_show", "code_prompt_hide") if k in mystnb}


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
        elif _prompts(cell) != required_prompts(cell, tags):
            found.append(f"cell {i}: its button should say {required_prompts(cell, tags) or 'nothing'}")
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
        prompts = required_prompts(cell, set(new))
        if new == tags and _prompts(cell) == prompts:
            continue
        metadata = cell.setdefault("metadata", {})
        metadata["tags"] = new
        mystnb = {k: v for k, v in metadata.get("mystnb", {}).items() if k not in ("code_prompt_show", "code_prompt_hide")}
        mystnb |= prompts
        if mystnb:
            metadata["mystnb"] = mystnb
        else:
            metadata.pop("mystnb", None)
        changed += 1
    return changed
