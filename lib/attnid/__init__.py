"""attnid: parameter identification in multi-head attention.

The library behind the companion book: numeric functional rank (``jacobian``, ``rank``),
the warm-up models of chapter 1 (``toy``), exact rational checks (``symbolic``), and the book's plumbing (``runtime``,
``provenance``).
"""

from .jacobian import count_parameters, functional_rank, jacobian_matrix
from .rank import DEFAULT_MIN_GAP, DEFAULT_ZERO_TOL, RankDecision, decide_rank
from .runtime import describe_device, generator, resolve_device

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MIN_GAP",
    "DEFAULT_ZERO_TOL",
    "RankDecision",
    "count_parameters",
    "decide_rank",
    "describe_device",
    "functional_rank",
    "generator",
    "jacobian_matrix",
    "resolve_device",
]
