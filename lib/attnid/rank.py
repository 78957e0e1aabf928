"""The rank-decision rule used throughout the book.

Numerical rank is a decision, not a measurement: floating-point singular values of a
rank-deficient matrix are never exactly zero. The rule below is the single place where the
book decides which singular values count as zero.

Rule (all quantities relative to the largest singular value s_1):

1. Normalise: t_i = s_i / s_1 for i = 1..P, padding with exact zeros when the matrix has
   fewer rows than columns (P = number of columns = number of parameters).
2. The rank r is the number of t_i above the zero tolerance ``zero_tol`` (default 1e-10,
   about a million times float64 round-off for the sizes in this book).
3. The decision is *clear* when
   (a) the gap around the threshold is wide: t_r / max(t_{r+1}, eps) >= ``min_gap``
       (default 1e6, six decades; eps is float64 machine epsilon, so exact zeros compare
       like round-off), and
   (b) the rows did not cap the rank: r < m (m = number of rows) or r = P. Otherwise more
       inputs might reveal more directions, and the decision is not clear.
A decision that is not clear is reported as such; callers that need an answer raise.

The fast path (``attnid.certify``) reaches the same decision without the full spectrum: it
proves an upper bound on t_{r+1} and a lower bound on t_r, and applies rules 3(a) and 3(b)
to the bounds. Such a decision carries the bounds instead of ``singular_values``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

DEFAULT_ZERO_TOL: float = 1e-10
DEFAULT_MIN_GAP: float = 1e6
FLOAT64_EPS: float = float(torch.finfo(torch.float64).eps)


@dataclass(frozen=True)
class RankDecision:
    """Singular values of a Jacobian and the rank decided from them.

    ``singular_values`` are the raw values in descending order (length min(m, P));
    ``relative`` pads them with zeros to length ``n_params`` and divides by the largest.
    A certified decision has no spectrum (``singular_values`` is None) and stores proven
    bounds: ``kept_bound`` <= t_r and ``dropped_bound`` >= t_{r+1}.
    """

    singular_values: torch.Tensor | None
    n_rows: int
    n_params: int
    rank: int
    zero_tol: float
    min_gap: float
    kept_bound: float | None = None
    dropped_bound: float | None = None

    @property
    def method(self) -> str:
        """'svd' (full spectrum) or 'certificate' (proven bounds, see attnid.certify)."""
        return "svd" if self.singular_values is not None else "certificate"

    @property
    def nullity(self) -> int:
        """Dimension of the null space: the number of unidentified directions."""
        return self.n_params - self.rank

    @property
    def relative(self) -> torch.Tensor:
        """t_i = s_i / s_1, padded with zeros to one value per parameter (SVD decisions only)."""
        if self.singular_values is None:
            raise ValueError("a certified decision has no spectrum, only bounds on t_r and t_{r+1}")
        s = self.singular_values.detach().to("cpu", torch.float64)
        t = torch.zeros(self.n_params, dtype=torch.float64)
        if s.numel() and s[0] > 0:
            t[: s.numel()] = s / s[0]
        return t

    @property
    def smallest_kept(self) -> float:
        """t_r, the smallest singular value counted as non-zero (nan if the rank is 0); a lower bound if certified."""
        if self.kept_bound is not None:
            return self.kept_bound
        return float(self.relative[self.rank - 1]) if self.rank > 0 else math.nan

    @property
    def largest_dropped(self) -> float:
        """t_{r+1}, the largest singular value counted as zero (nan if full rank); an upper bound if certified."""
        if self.dropped_bound is not None:
            return self.dropped_bound
        return float(self.relative[self.rank]) if self.rank < self.n_params else math.nan

    @property
    def gap(self) -> float:
        """t_r / max(t_{r+1}, eps): how far the kept values stand above the dropped ones."""
        if self.rank == 0:
            return math.inf
        below = FLOAT64_EPS if self.rank == self.n_params else max(self.largest_dropped, FLOAT64_EPS)
        return self.smallest_kept / below

    @property
    def rows_sufficient(self) -> bool:
        """False when the rank equals the number of rows: more inputs might raise it."""
        return self.rank < self.n_rows or self.rank == self.n_params

    @property
    def clear(self) -> bool:
        """True when the rule's conditions (a) and (b) both hold (and, if certified, t_r > zero_tol >= t_{r+1})."""
        if self.method == "certificate":
            dropped_ok = self.rank == self.n_params or self.largest_dropped <= self.zero_tol
            if not (self.smallest_kept > self.zero_tol and dropped_ok):
                return False
        return self.gap >= self.min_gap and self.rows_sufficient

    def require_clear(self) -> "RankDecision":
        """Return self, or raise ValueError explaining why the rank is not clear."""
        if not self.rows_sufficient:
            raise ValueError(
                f"rank {self.rank} equals the number of Jacobian rows {self.n_rows}: "
                "use more or longer inputs so the rows cannot cap the rank"
            )
        if self.gap < self.min_gap:
            raise ValueError(
                f"no clear singular-value gap at rank {self.rank}: kept {self.smallest_kept:.3e}, "
                f"dropped {self.largest_dropped:.3e} (relative), gap {self.gap:.3e} < {self.min_gap:.0e}"
            )
        return self


def decide_rank(
    singular_values: torch.Tensor,
    n_rows: int,
    n_params: int,
    *,
    zero_tol: float = DEFAULT_ZERO_TOL,
    min_gap: float = DEFAULT_MIN_GAP,
) -> RankDecision:
    """Apply the rank-decision rule (module docstring) to descending singular values."""
    if singular_values.ndim != 1:
        raise ValueError(f"singular_values must be 1-D, got shape {tuple(singular_values.shape)}")
    if singular_values.numel() > min(n_rows, n_params):
        raise ValueError(
            f"{singular_values.numel()} singular values for a {n_rows} x {n_params} matrix "
            f"(at most {min(n_rows, n_params)})"
        )
    if not 0 < zero_tol < 1:
        raise ValueError(f"zero_tol must lie in (0, 1), got {zero_tol}")
    if min_gap < 1:
        raise ValueError(f"min_gap must be >= 1, got {min_gap}")
    s = singular_values.detach().to("cpu", torch.float64)
    if not torch.isfinite(s).all():
        raise ValueError("singular values contain NaN or inf: the Jacobian is not finite")
    rank = int((s > zero_tol * s[0]).sum()) if s.numel() and s[0] > 0 else 0
    return RankDecision(s, n_rows, n_params, rank, zero_tol, min_gap)
