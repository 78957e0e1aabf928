"""The book's figures as SVG, sized for the text column, byte-identical across runs.

``apply()`` sets matplotlib's defaults and, inside a Jupyter kernel, makes every figure (shown
or glued) an SVG:

- vector output, sharp on high-density screens; glyphs drawn as paths, so a figure looks the
  same without the fonts it was made with;
- no wider than ``COLUMN_WIDTH_IN``: a figure made wider is scaled down to it before it is
  drawn (its layout redone with ``tight_layout``), so text keeps its point size instead of
  being shrunk by the browser (the column is about 690 CSS px, 7.2 in at 96 px per inch);
- deterministic: no date in the metadata, and element ids numbered in document order
  (``stable_ids``) instead of matplotlib's hashes of float coordinates, whose last bits (and so
  the ids) change with the CPU; so two executions, on any machine, write the same bytes and
  nbval can compare them;
- colour-blind safe: the colour cycle is Okabe and Ito's palette (``OKABE_ITO``), so "C0" to "C7"
  in a chapter name colours that stay apart for readers with a colour-vision deficiency.

``attnbook.setup`` calls ``apply()`` for every chapter. Checked by tests/test_figures.py
(determinism, fitting) and by ``make reproduce`` run twice (SVG outputs byte-identical).
"""

from __future__ import annotations

import re
from typing import Any

import matplotlib.pyplot as plt
from cycler import cycler

NOT_A_DEPENDENCY = 'draws figures only; no data file is computed from it'

# Okabe and Ito's palette, safe for the common colour-vision deficiencies, in the order of matplotlib's
# defaults that the chapters name: C0 blue, C1 orange, C2 bluish green, C3 vermillion (the "red"), ...
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
COLUMN_WIDTH_IN = 6.8  # widest figure, inches; the text column is ~7.2 in at 96 CSS px per inch
RC: dict[str, Any] = {
    "figure.figsize": (COLUMN_WIDTH_IN, 3.8),
    "figure.dpi": 100,
    "savefig.dpi": 200,  # a raster fallback (PNG) at twice the screen's density
    "font.size": 10,
    "axes.titlesize": 10,
    "axes.labelsize": 10,
    "legend.fontsize": 9,
    "svg.hashsalt": "attnbook",  # stable element ids
    "svg.fonttype": "path",
    "axes.prop_cycle": cycler(color=OKABE_ITO),
}
SVG_METADATA = {"Date": None}  # no timestamp in the file


def fit_to_column(fig: Any, width: float = COLUMN_WIDTH_IN) -> None:
    """Scale ``fig`` down (aspect kept) if it is wider than ``width`` inches, and redo its layout."""
    w, h = fig.get_size_inches()
    if w > width:
        fig.set_size_inches(width, h * width / w)
        fig.tight_layout()


# matplotlib names clip paths, markers and hatches by a hash of their (float) geometry: p/m/h + 10 hex digits
HASHED_ID = re.compile(r'id="([a-z])([0-9a-f]{10})"')


def stable_ids(text: str) -> str:
    """``text`` (an SVG) with every hashed element id renamed by its order of first definition
    (``p3311100a66`` -> ``p1``), so the bytes no longer depend on the last bits of a coordinate."""
    names: dict[str, str] = {}
    counts: dict[str, int] = {}
    for kind, digest in HASHED_ID.findall(text):
        if kind + digest not in names:
            counts[kind] = counts.get(kind, 0) + 1
            names[kind + digest] = f"{kind}{counts[kind]}"
    if not names:
        return text
    pattern = re.compile("(?<=[\"#])(" + "|".join(map(re.escape, names)) + ")(?=[\")])")
    return pattern.sub(lambda m: names[m.group(1)], text)


def svg(fig: Any) -> str:
    """The figure as SVG text, fitted to the column, without a date, ids numbered: what the book embeds."""
    from IPython.core.pylabtools import print_figure  # noqa: PLC0415 (only inside a kernel)

    fit_to_column(fig)
    return stable_ids(print_figure(fig, "svg", bbox_inches="tight", metadata=SVG_METADATA))


def apply() -> None:
    """Set the book's matplotlib defaults; in a Jupyter kernel, render figures as fitted SVG only."""
    plt.rcParams.update(RC)
    try:
        from IPython import get_ipython  # noqa: PLC0415
        from matplotlib.figure import Figure  # noqa: PLC0415
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return
    # Activate the inline backend now (it registers its formatters on activation, which would
    # otherwise come with the first figure and replace ours), and configure it the same way.
    shell.run_line_magic("matplotlib", "inline")
    shell.run_line_magic("config", "InlineBackend.figure_formats = ['svg']")
    shell.run_line_magic("config", "InlineBackend.print_figure_kwargs = "
                                   "{'bbox_inches': 'tight', 'metadata': {'Date': None}}")
    formatters = shell.display_formatter.formatters
    for mime in ("image/png", "image/jpeg", "application/pdf"):
        formatters[mime].pop(Figure, None)
    formatters["image/svg+xml"].for_type(Figure, svg)
