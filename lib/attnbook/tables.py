"""Tables for the chapters: fixed-width text and Markdown, numbers at the precision they really have."""

from __future__ import annotations

from collections.abc import Sequence

from attnid.checks import GridRow

LAYOUT_COLUMNS = {
    "d": lambda s: s.d_model, "H": lambda s: s.heads, "G": lambda s: s.kv_heads, "d_k": lambda s: s.head_dim,
    "d_v": lambda s: s.v_head_dim, "r": lambda s: s.rope_dims, "bias": lambda s: s.bias or "none",
    "norm": lambda s: s.norm, "causal": lambda s: "yes" if s.causal else "no",
    "qk_norm": lambda s: s.qk_norm, "eps": lambda s: f"{s.qk_norm_eps:g}" if s.has_qk_norm else "-",
    "window": lambda s: "-" if s.window is None else s.window,
}


def text_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """Right-aligned columns separated by two spaces."""
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(b, widths)) for b in body]
    return "\n".join(lines)


def markdown_table(header: Sequence[str], body: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    """A Markdown table (for ``IPython.display.Markdown``); columns whose index is in ``right`` align right."""
    rule = "|" + "".join("---:|" if i in right else "---|" for i in range(len(header)))
    lines = ["| " + " | ".join(header) + " |", rule]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def _grid_table(rows: Sequence[GridRow], columns: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """(header, body) of ``attnid.checks.verify_grid`` rows: the chosen layout columns, then P, exact, numeric, match."""
    unknown = [c for c in columns if c not in LAYOUT_COLUMNS]
    if unknown:
        raise ValueError(f"unknown column(s) {unknown}; choose from {sorted(LAYOUT_COLUMNS)}")
    header = [*columns, "P", "exact", "numeric", "match"]
    body = [[str(LAYOUT_COLUMNS[c](r.spec)) for c in columns]
            + [str(r.total), "-" if r.exact is None else str(r.exact), str(r.numeric),
               {True: "yes", False: "NO", None: "n/a"}[r.matches]] for r in rows]
    return header, body


def format_rows(rows: Sequence[GridRow], columns: Sequence[str] = ("d", "H", "G", "d_k", "d_v")) -> str:
    """A text table of ``attnid.checks.verify_grid`` rows: the chosen layout columns, then P, exact, numeric, match."""
    return text_table(*_grid_table(rows, columns))


def markdown_rows(rows: Sequence[GridRow], columns: Sequence[str] = ("d", "H", "G", "d_k", "d_v")) -> str:
    """The table of ``format_rows`` in Markdown (an HTML table in the book: it scrolls, its first column stays)."""
    header, body = _grid_table(rows, columns)
    numeric = [i for i, h in enumerate(header) if h in ("d", "H", "G", "d_k", "d_v", "r", "window", "P", "exact", "numeric")]
    return markdown_table(header, body, right=numeric)
