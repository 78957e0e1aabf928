"""One exact identity check and how a chapter shows it.

Every SymPy check behind a chapter's proof returns a list of ``Identity``: what it states, SymPy's
result as the reader sees it (a residual, a solved form, a count), and whether it holds. The check
computes ``holds`` from SymPy's own answer; the chapter shows the list as a table and asserts that
each one holds, and ``tests/test_symbolic.py`` asserts the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sympy as sp

IDENTITY_HEAD = ["identity", "SymPy's result", "holds"]


@dataclass(frozen=True)
class Identity:
    """One exact check: its statement in words, SymPy's result, and whether it holds."""

    statement: str
    result: str
    holds: bool


def is_zero(expr: sp.Expr | sp.MatrixBase) -> bool:
    """Whether ``expr`` (a scalar or every entry of a matrix) simplifies to exactly 0."""
    entries = list(expr) if isinstance(expr, sp.MatrixBase) else [expr]
    return all(sp.simplify(e) == 0 for e in entries)


def zero_identity(statement: str, residual: sp.Expr | sp.MatrixBase) -> Identity:
    """The identity ``residual == 0``, shown as the simplified residual."""
    simplified = residual.applyfunc(sp.simplify) if isinstance(residual, sp.MatrixBase) else sp.simplify(residual)
    return Identity(statement, str(simplified), is_zero(simplified))


def identity_rows(checks: Sequence[Identity]) -> list[list[str]]:
    """The rows of a chapter's Markdown table of checks (columns ``IDENTITY_HEAD``); results as code."""
    return [[c.statement, "`" + c.result.replace("|", "\\|") + "`", "yes" if c.holds else "NO"] for c in checks]


def failed(checks: Sequence[Identity]) -> list[str]:
    """The statements that do not hold (empty when every check holds)."""
    return [c.statement for c in checks if not c.holds]
