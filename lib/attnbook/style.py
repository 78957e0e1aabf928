"""One figure style for every chapter."""

from __future__ import annotations

import matplotlib.pyplot as plt

RC = {"figure.dpi": 100, "savefig.dpi": 100, "font.size": 10}


def apply() -> None:
    """Set the book's matplotlib defaults."""
    plt.rcParams.update(RC)
