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

Rule 2 is ``numerical_rank``; ``decide_rank`` and every other rank decision in the library
(the span of the orbit generators, the value-bias directions a layer without b_O cannot
see, whether a group element or a Gram matrix can be inverted) call it, so the comparison
is written once. Each tolerance is a named constant below with the reason for its value.

The fast path (``attnid.certify``) reaches the same decision without the full spectrum: it
proves an upper bound on t_{r+1} and a lower bound on t_r, and applies rules 3(a) and 3(b)
to the bounds. Such a decision carries the bounds instead of ``singular_values``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# A singular value counts as zero at or below 1e-10 of the largest: about a million times float64
# round-off (eps * size) for the matrices in this book, and far below any value a generic
# point makes non-zero. Used for Jacobians and for matrices built from the parameters.
DEFAULT_ZERO_TOL: float = 1e-10
# Six decades between the kept and the dropped values: round-off cannot open such a gap by
# chance, and a smoothly decaying spectrum never shows one.
DEFAULT_MIN_GAP: float = 1e6
# float64 machine epsilon: the floor for the gap's denominator, so exact zeros compare like round-off.
FLOAT64_EPS: float = float(torch.finfo(torch.float64).eps)
# A matrix is numerically singular when its smallest singular value is at most 1e-12 of its
# largest (condition number 1e12 or more): its inverse would keep at most four of float64's
# sixteen digits, too few to check that a moved layer computes the same function.
INVERTIBLE_REL_TOL: float = 1e-12
# Least-squares residual, relative to max(1, largest entry), below which a matrix lies in a
# span (the RoPE commutant): an exact combination leaves round-off, about 1e-16, while a
# matrix outside the span leaves a residual of order one; 1e-10 sits six decades above the first.
COMMUTANT_TOL: float = 1e-10
# The certificate (attnid.certify) proves t_r only down to 1e-5: its Gram matrix squares the
# condition number, so t_r = 1e-5 is a relative Gram eigenvalue of 1e-10, just a few decades
# above the Gram's own round-off (eps times its size); below it a Cholesky bound is untrustworthy.
GRAM_FLOOR: float = 1e-5
# Unit round-off u of float64 (half of eps): every correctly rounded operation has relative error at most u.
# The verified bounds of attnid.certify are built from it (gamma_n = n u / (1 - n u), Higham Sec. 3.1).
FLOAT64_UNIT_ROUNDOFF: float = FLOAT64_EPS / 2
# Unit round-off of float32: attnid.certify scales the float32-versus-float64 Jacobian difference by the ratio of
# the two round-offs to estimate the float64 Jacobian's own error.
FLOAT32_UNIT_ROUNDOFF: float = float(torch.finfo(torch.float32).eps) / 2
# The smallest positive (subnormal) float64, eta: the absolute error an underflowing product can make,
# and the underflow term of Rump's positive-definiteness criterion (attnid.certify).
FLOAT64_UNDERFLOW: float = math.ulp(0.0)
# The verified upper bound on s_1 tests beta I - J^T J by Cholesky with beta = (1 + SIGMA_1_SLACK) times the
# power-iteration estimate of s_1^2: 1% above it, so an estimate that converged to a few digits passes at the
# first try, and a loose s_1 bound only moves the relative bounds t_r, t_{r+1} by half a percent.
SIGMA_1_SLACK: float = 0.01


@dataclass(frozen=True)
class VerifiedBounds:
    """Singular-value bounds for the computed (float64) Jacobian J~, with every rounding error bounded.

    Proved by ``attnid.certify`` (its docstring gives the argument): ``sigma_kept`` <= s_r(J~)
    with r = P - u, ``sigma_1_lower`` <= s_1(J~) <= ``sigma_1_upper``, and ``null_stretch`` >=
    ||J~ T||_2, which bounds s_{r+1}(J~) when T is orthonormal (for the computed T, only up to the
    factor 1 / s_min(T), which is within round-off of 1 but not bounded: an estimate). They say nothing yet about the exact Jacobian J:
    by Weyl's inequality s_r(J) >= ``sigma_kept`` - ||J - J~||_2, so rank(J) >= r as soon as
    the Jacobian's own error ||J - J~||_2 is below ``sigma_kept``.
    """

    sigma_kept: float
    sigma_1_upper: float
    sigma_1_lower: float
    null_stretch: float

    @property
    def kept(self) -> float:
        """A lower bound on t_r = s_r(J~) / s_1(J~)."""
        return math.nextafter(self.sigma_kept / self.sigma_1_upper, -math.inf)  # one step down covers the division's rounding

    @property
    def dropped(self) -> float:
        """An upper bound on t_{r+1} = s_{r+1}(J~) / s_1(J~) (nan when there is no null direction)."""
        if math.isnan(self.null_stretch):
            return math.nan
        return math.nextafter(self.null_stretch / self.sigma_1_lower, math.inf)


@dataclass(frozen=True)
class RankDecision:
    """Singular values of a Jacobian and the rank decided from them.

    ``singular_values`` are the raw values in descending order (length min(m, P));
    ``relative`` pads them with zeros to length ``n_params`` and divides by the largest.
    A certified decision has no spectrum (``singular_values`` is None) and stores the
    certificate's bounds ``kept_bound`` (for t_r) and ``dropped_bound`` (for t_{r+1}), computed
    in floating point without accounting for its rounding; ``verified`` holds bounds that do
    account for it (rigorous for the computed Jacobian, see ``VerifiedBounds``), or None when
    that argument did not go through.
    """

    singular_values: torch.Tensor | None
    n_rows: int
    n_params: int
    rank: int
    zero_tol: float
    min_gap: float
    kept_bound: float | None = None
    dropped_bound: float | None = None
    verified: "VerifiedBounds | None" = None
    route: str = "certificate"

    @property
    def method(self) -> str:
        """'svd' (full spectrum), 'certificate' (proven bounds, see attnid.certify) or 'structured' (attnid.structured)."""
        return "svd" if self.singular_values is not None else self.route

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
        if self.singular_values is None:  # a certificate, dense or structured: bounds instead of a spectrum
            dropped_ok = self.rank == self.n_params or self.largest_dropped <= self.zero_tol
            if not (self.smallest_kept > self.zero_tol and dropped_ok):
                return False
        return self.gap >= self.min_gap and self.rows_sufficient

    @property
    def rigorous(self) -> bool:
        """True for a clear certified decision whose verified lower bound on t_r(J~) is above the zero tolerance.

        That proves rank(J~) >= rank for the computed Jacobian (``attnid.certify``). The upper
        bound on t_{r+1} is not part of the proof: that the orbit directions are null for the
        exact Jacobian is a theorem, not a measurement.
        """
        v = self.verified
        return self.method == "certificate" and v is not None and self.clear and v.kept > self.zero_tol

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
    return RankDecision(s, n_rows, n_params, numerical_rank(s, zero_tol), zero_tol, min_gap)


def _kept(values: torch.Tensor, largest: torch.Tensor | float, rel_tol: float) -> torch.Tensor:
    """Rule 2's one comparison: which values stand above ``rel_tol`` times ``largest``."""
    return values > rel_tol * largest


def numerical_rank(singular_values: torch.Tensor, rel_tol: float = DEFAULT_ZERO_TOL) -> int:
    """Rule 2: how many of the (1-D, any order) singular values exceed ``rel_tol`` times the largest.

    0 when there are none or the largest is not positive. The values may also be the
    eigenvalues of a positive semi-definite matrix (its singular values); round-off
    negatives then count as zero.
    """
    if singular_values.ndim != 1:
        raise ValueError(f"singular_values must be 1-D, got shape {tuple(singular_values.shape)}")
    if not 0 < rel_tol < 1:
        raise ValueError(f"rel_tol must lie in (0, 1), got {rel_tol}")
    s = singular_values.detach().to("cpu", torch.float64)
    if not torch.isfinite(s).all():
        raise ValueError("singular values contain NaN or inf")
    if s.numel() == 0 or s.max() <= 0:
        return 0
    return int(_kept(s, s.max(), rel_tol).sum())


def counts_as_zero(value: float, largest: float, rel_tol: float = DEFAULT_ZERO_TOL) -> bool:
    """Rule 2 for one value measured against a known largest singular value: True when it would be dropped.

    Like ``numerical_rank``, everything counts as zero when ``largest`` is not positive.
    """
    if not (math.isfinite(value) and math.isfinite(largest)):
        raise ValueError(f"value and largest must be finite, got {value} and {largest}")
    if not 0 < rel_tol < 1:
        raise ValueError(f"rel_tol must lie in (0, 1), got {rel_tol}")
    if largest <= 0:
        return True
    return not bool(_kept(torch.tensor(float(value), dtype=torch.float64), float(largest), rel_tol))


def is_invertible(singular_values: torch.Tensor, rel_tol: float = INVERTIBLE_REL_TOL) -> bool:
    """Whether every matrix with these singular values (shape (..., n), one row per matrix) is numerically invertible.

    Invertible: finite, and all n values kept by rule 2 at ``rel_tol`` (the default
    ``INVERTIBLE_REL_TOL`` is a bound on the condition number). Non-finite values mean
    the matrix itself was not finite: not invertible.
    """
    if singular_values.ndim == 0:
        raise ValueError("singular_values must have at least one dimension (..., n)")
    s = singular_values.detach().to("cpu", torch.float64)
    if not torch.isfinite(s).all():
        return False
    n = s.shape[-1]
    if n == 0 or s.numel() == 0:
        return True  # empty matrices (or none at all) are trivially invertible
    return all(numerical_rank(row, rel_tol) == n for row in s.reshape(-1, n))
