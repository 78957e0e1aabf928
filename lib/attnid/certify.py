"""Certified rank decisions: the rule of ``attnid.rank`` without computing the full spectrum.

A full SVD of a P x P Jacobian costs about 4 P^3 flops and dominates verification at
P in the thousands. When a candidate null space is known (the orbit tangent T, P x u,
from ``attnid.symmetry``), two bounds settle the decision at the cost of one Gram matrix
and three Cholesky factorisations. Write r = P - u, s_i for the singular values of the
Jacobian and t_i = s_i / s_1.

* s_{r+1} <= ||J T||_2 <= ||J T||_F (T orthonormal; in general ||J T||_2 / s_min(T)). By Courant-Fischer, s_{r+1} is at most
  the largest stretch of J on any u-dimensional subspace.
* s_r >= sqrt(c) whenever K - c I is positive definite, K = J^T J + w T T^T (any w >= 0).
  For v orthogonal to the columns of T, v^T K v = ||J v||^2, so J stretches every vector of
  the complement of span(T), a subspace of dimension at least P - u, by at least sqrt(c);
  by Courant-Fischer so is s_r. This needs no property of T at all (not even that it is
  orthonormal or in the null space), which is what makes the bound robust.

How the code runs it: the Gram matrix G = sum over inputs of block^T block, s_1 from power
iteration on G (w = s_1^2), K = G + w T T^T, a Cholesky factorisation of K, c half an
inverse-iteration estimate of lambda_min(K), and a Cholesky factorisation of K - c I. The
Gram matrix squares the condition number, so only t_r >= ``GRAM_FLOOR`` (a tolerance of
``attnid.rank``) is accepted; below it, or when a factorisation fails (an extra null
direction, or T not in the null space), the certificate gives up and the caller falls back
to the full SVD. Those are the bounds ``kept_bound`` and ``dropped_bound`` of the returned
decision, evaluated in floating point as if it were exact.

Verified bounds (``RankDecision.verified``)
-------------------------------------------
The same factorisations also prove bounds for the computed Jacobian J~ (the float64 matrix
``input_jacobian`` returned, taken as exact real numbers), with every rounding error of
what follows bounded. u = 2^-53 is float64's unit round-off, eta = 2^-1074 its smallest
subnormal, gamma_n = n u / (1 - n u), and m the number of rows of J~.

1. Forming the Gram matrix. Each entry of G^ = fl(sum block^T block) is an inner product of
   two columns of J~ of length m, accumulated in some order (BLAS blocks and fused
   multiply-adds change the order and skip roundings, never add any), so
   |G^ - J~^T J~| <= gamma_m |J~|^T |J~| + m eta entrywise (Higham, Accuracy and Stability of
   Numerical Algorithms, 2nd ed., Sec. 3.1 and 3.5; the eta term covers underflowing
   products). The spectral norm of a matrix is at most that of any non-negative matrix
   bounding it entrywise, and |J~|^T |J~| is positive semidefinite with trace ||J~||_F^2,
   so ||G^ - J~^T J~||_2 <= gamma_m ||J~||_F^2 + P m eta. ||J~||_F^2 = trace(J~^T J~) is
   bounded from the diagonal of G^. K^ (step 2) is made exactly symmetric by copying its
   lower triangle (the triangle LAPACK reads); each copied entry obeys the same bounds, and
   so does every entry of the possibly unsymmetric G^ and M^ the bounds are computed from.
2. Forming K. The same bound for M^ = fl(T T^T) (gamma_u ||T||_F^2), and one rounding for
   each of fl(w M^) and fl(G^ + w M^), give ||K^ - (J~^T J~ + w T T^T)||_2 <= delta_K
   (``_k_error``), with T and w the floating-point numbers actually used.
3. Positive definiteness (Rump, "Verification of positive definiteness", BIT Numer. Math.
   46:433-452, 2006, Theorem 2.3 and Corollary 2.4; formally proved in Coq by P. Roux,
   "Formal proofs of rounding error bounds", J. Autom. Reasoning 57, 2016). For a symmetric
   floating-point n x n matrix A with non-negative diagonal, let A~ agree with A off the
   diagonal and have A~_ii <= A_ii - c (c >= 0). If floating-point Cholesky runs to
   completion on A~, then every unit x has x^T A x > c - |x|^T D |x|, where D bounds the
   factorisation's backward error entrywise, and |x|^T D |x| <= gamma_{n+1} trace(A)
   + 4 n eta (2 (n + 1) + max_i A_ii). In words: the computed factor R is an exact
   Cholesky factor of A~ + E with |E| <= D, R^T R is positive definite, so A~ is at most
   ||E|| away from positive definite, and A is A~ shifted up by at least c. The bound on
   E needs only that each entry of R is computed from its defining sum with the stated
   number of roundings, in any order. We use n + 2 in place of n + 1: that allows one extra
   rounding per entry, for BLAS triangular solves that multiply by a computed reciprocal
   of the pivot instead of dividing (the bound only grows with n). Applied to A = K^ with
   A~_ii the float just below fl(K^_ii - c) (so A~_ii <= K^_ii - c holds exactly), it gives
   lambda_min(K^) > c - delta_chol; with step 2, lambda_min(J~^T J~ + w T T^T) > c
   - delta_chol - delta_K =: c_v, and s_r(J~) >= sqrt(c_v) when c_v > 0.
4. s_1(J~). An upper bound: Rump's criterion on beta I - G^ (beta = (1 + ``SIGMA_1_SLACK``)
   times the power-iteration estimate) proves lambda_max(G^) < beta, one extra Cholesky;
   then s_1^2 <= beta + ||G^ - J~^T J~||_2. If that factorisation fails, s_1 <= ||J~||_F.
   A lower bound: the Rayleigh quotient of the power-iteration vector x, with the rounding
   of computing x^T G^ x (gamma_{2P+1} ||G^||_F ||x||^2) and of G^ subtracted.
5. ||J~ T||_F. Each computed block J~_b T is within gamma_P |J~_b| |T| (+ P eta) of the
   exact one; its Frobenius norm is at most ||J~||_F ||T||_F. It bounds s_{r+1}(J~) only up to
   the factor 1 / s_min(T) (see (c) below).

Every scalar step of these bounds is rounded outward (``math.nextafter``), and every sum of
non-negative floats is inflated by its own gamma. The decision ``RankDecision.rigorous`` then
applies the rule to the verified bounds.

What is not verified. (a) That LAPACK's Cholesky (``torch.linalg.cholesky_ex``) performs the
standard algorithm in floating point with info = 0 only when every pivot was positive; we
trust the library for that. (c) That the computed basis T is orthonormal: s_{r+1}(J~) <=
||J~ T||_2 / s_min(T), and s_min(T) is within round-off of 1 but not bounded, so the upper
bound on s_{r+1}, which serves only the rule's gap test and not the rank, is an estimate. (b) That J~ is close to the exact Jacobian J of the layer at the
same (floating-point, hence exact) parameters and inputs. By Weyl's inequality s_r(J) >=
s_r(J~) - ||J - J~||_2, so rank(J) >= r whenever ||J - J~||_2 < ``sigma_kept``; the error of
automatic differentiation in float64 is not bounded here, only estimated
(``jacobian_error_estimate``: forward against reverse mode, and float32 against float64
scaled by the ratio of round-offs). Chapter 1 states the resulting theorem and the appendix
tabulates both numbers for every layout the book verifies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm import tqdm

from attnid.jacobian import Mode, Model, count_parameters, input_jacobian
from attnid.rank import (
    DEFAULT_MIN_GAP,
    DEFAULT_ZERO_TOL,
    FLOAT32_UNIT_ROUNDOFF,
    FLOAT64_UNDERFLOW,
    FLOAT64_UNIT_ROUNDOFF,
    GRAM_FLOOR,
    SIGMA_1_SLACK,
    RankDecision,
    VerifiedBounds,
)
from attnid.spec import Params

POWER_STEPS = 100
INVERSE_STEPS = 30

_U = FLOAT64_UNIT_ROUNDOFF
_ETA = FLOAT64_UNDERFLOW


# ------------------------------------------------------------------------------------------------
# Outward rounding and the gamma constants
# ------------------------------------------------------------------------------------------------

def _up(x: float) -> float:
    """The float just above a correctly rounded result: >= the exact value it approximates."""
    return math.nextafter(x, math.inf)


def _down(x: float) -> float:
    """The float just below a correctly rounded result: <= the exact value it approximates."""
    return math.nextafter(x, -math.inf)


def gamma(n: int) -> float:
    """gamma_n = n u / (1 - n u) for float64 (Higham (3.8)), rounded up; ValueError unless n u < 1/2."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    if 2 * n * _U >= 1:
        raise ValueError(f"gamma_n needs n u < 1/2; n = {n} is too large for float64")
    if n == 0:
        return 0.0
    return _up(_up(n * _U) / _down(1 - n * _U))


def _sum_upper(values: torch.Tensor) -> float:
    """An upper bound on the exact sum of non-negative float64 ``values``, in whatever order torch summed them.

    |fl(sum) - sum| <= gamma_{n-1} sum, so sum <= fl(sum) / (1 - gamma_{n-1}).
    """
    n = values.numel()
    if n == 0:
        return 0.0
    total = float(values.sum())
    return _up(total / _down(1 - gamma(max(n - 1, 1))))


def _sumsq_upper(values: torch.Tensor) -> float:
    """An upper bound on the exact sum of squares of float64 ``values`` (an inner product: gamma_n, plus underflow)."""
    n = values.numel()
    if n == 0:
        return 0.0
    flat = values.reshape(-1)
    total = float(torch.dot(flat, flat))  # one BLAS inner product, no temporary
    return _up(_up(total / _down(1 - gamma(n))) + _up(n * _ETA))


def _rump_shift(diagonal: torch.Tensor) -> float:
    """Rump's bound on |x|^T D |x| for a symmetric n x n matrix with this (non-negative) diagonal, n + 2 for n + 1.

    gamma_{n+2} trace(A) + 4 n eta (2 (n + 2) + max_i A_ii), rounded up (module docstring, step 3).
    """
    n = diagonal.numel()
    trace = _sum_upper(diagonal)
    largest = float(diagonal.max())
    underflow = _up(_up(4 * n * _ETA) * _up(2 * (n + 2) + largest))
    return _up(_up(gamma(n + 2) * trace) + underflow)


def _lower_triangle_symmetric(a: torch.Tensor) -> torch.Tensor:
    """The exactly symmetric matrix with a's lower triangle (the triangle LAPACK's Cholesky reads); no rounding."""
    out = torch.tril(a)
    out += torch.tril(a, -1).T  # adds the mirrored entries to exact zeros: no rounding
    return out


def _check_symmetric_nonnegative_diagonal(a: torch.Tensor) -> None:
    if a.ndim != 2 or a.shape[0] != a.shape[1] or a.dtype != torch.float64:
        raise ValueError(f"a must be a square float64 matrix, got shape {tuple(a.shape)} and dtype {a.dtype}")
    if not bool(torch.equal(a, a.T)):
        raise ValueError("a must be exactly symmetric (copy one triangle onto the other)")
    if not bool(torch.isfinite(a).all()) or bool((a.diagonal() < 0).any()):
        raise ValueError("a must be finite with a non-negative diagonal")


def _cholesky_lowered(a: torch.Tensor, c: float) -> bool:
    """Does floating-point Cholesky succeed on a with every diagonal entry lowered to at most a_ii - c?

    fl(a_ii - c) can round up, so each entry is moved one float further down, which puts it
    at or below the exact a_ii - c.
    """
    shifted = a.clone()
    diag = torch.nextafter(a.diagonal() - c, torch.tensor(-math.inf, dtype=a.dtype, device=a.device))
    shifted.diagonal().copy_(diag)
    _, info = torch.linalg.cholesky_ex(shifted)
    return int(info) == 0


def min_eigenvalue_lower_bound(a: torch.Tensor, c: float) -> float | None:
    """A proven lower bound on lambda_min(a) from one Cholesky of a - c I, or None when that factorisation fails.

    Rump's criterion (module docstring, step 3): if Cholesky runs to completion on a with its
    diagonal lowered by c >= 0, then lambda_min(a) > c - (gamma_{n+2} trace(a) + 4 n eta
    (2 (n + 2) + max a_ii)). ``a``: an exactly symmetric float64 matrix with non-negative
    diagonal (the exact real matrix its floats represent). The returned value may be negative
    (then nothing is proved about definiteness).
    """
    _check_symmetric_nonnegative_diagonal(a)
    if not (math.isfinite(c) and c >= 0):
        raise ValueError(f"c must be a finite number >= 0, got {c!r}")
    if not _cholesky_lowered(a, c):
        return None
    return _down(c - _rump_shift(a.diagonal()))


def proves_positive_definite(a: torch.Tensor) -> bool:
    """Rump's Corollary 2.4: True only if a (exactly symmetric float64, diagonal >= 0) is positive definite.

    Lowers the diagonal by Rump's bound and runs one Cholesky; False means "not proved",
    which includes every matrix that is singular or indefinite.
    """
    _check_symmetric_nonnegative_diagonal(a)
    return _cholesky_lowered(a, _rump_shift(a.diagonal()))


def _proves_positive_definite_unchecked(a: torch.Tensor) -> bool:
    """``proves_positive_definite`` for a matrix the caller built exactly symmetric with a non-negative diagonal."""
    return _cholesky_lowered(a, _rump_shift(a.diagonal()))


# ------------------------------------------------------------------------------------------------
# Spectral estimates (heuristic) and their verified counterparts
# ------------------------------------------------------------------------------------------------

def _power_iteration(gram: torch.Tensor) -> tuple[float, torch.Tensor]:
    """(Rayleigh quotient, unit vector) after power iteration: an estimate of lambda_max(gram) from below."""
    x = torch.ones(gram.shape[0], dtype=gram.dtype, device=gram.device)
    for _ in range(POWER_STEPS):
        x = gram @ x
        x = x / x.norm()
    return float(x @ (gram @ x)), x


def _smallest_eigenvalue_estimate(chol: torch.Tensor, k: torch.Tensor) -> float:
    """Rayleigh quotient after inverse iteration with the Cholesky factor of k (an estimate, not a bound)."""
    x = torch.linspace(1.0, 2.0, k.shape[0], dtype=k.dtype, device=k.device)
    for _ in range(INVERSE_STEPS):
        x = torch.cholesky_solve(x[:, None], chol)[:, 0]
        x = x / x.norm()
    return float(x @ (k @ x))


def _gram_error(jac_frob_sq: float, n_rows: int, n_params: int) -> float:
    """Step 1: an upper bound on ||fl(J~^T J~) - J~^T J~||_2 from ||J~||_F^2 <= jac_frob_sq."""
    return _up(_up(gamma(n_rows) * jac_frob_sq) + _up(n_params * _up(n_rows * _ETA)))


def _k_error(gram_error: float, w: float, basis: torch.Tensor, basis_frob_sq: float, k_frob_sq: float,
             scaled_frob_sq: float) -> float:
    """Step 2: ||K^ - (J~^T J~ + w T T^T)||_2 <= gram error + w gamma_u ||T||_F^2 + 2u (||K^||_F + ||w M^||_F) + underflow.

    M^ = fl(T T^T) has entries that are inner products of length u (the columns of T):
    |M^ - T T^T| <= gamma_u |T| |T|^T, whose spectral norm is at most ||T||_F^2. Then
    fl(w M^) and fl(G^ + w M^) round each entry once (2u covers u / (1 - u) twice).
    ``k_frob_sq`` bounds ||K^||_F^2 (K^ symmetrised), ``scaled_frob_sq`` ||w M^||_F^2 (before).
    """
    n_params, u = basis.shape
    outer = _up(w * _up(gamma(max(u, 1)) * basis_frob_sq))
    # K^ keeps the lower-triangle entries of w M^, whose Frobenius norm is at most sqrt(2) ||w M^||_F: use 2
    entry_roundings = _up(2 * _U * _up(math.sqrt(k_frob_sq) + _up(2 * math.sqrt(scaled_frob_sq))))
    underflow = _up(n_params * _up((u + 2) * _ETA) * _up(w + 1))
    return _up(_up(_up(gram_error + outer) + entry_roundings) + underflow)


def _sigma_1_bounds(gram: torch.Tensor, rho: float, x: torch.Tensor, gram_error: float,
                    jac_frob_sq: float) -> tuple[float, float] | None:
    """Step 4: (lower, upper) bounds on s_1(J~), or None when the lower bound is not positive."""
    n = gram.shape[0]
    beta = _up(rho * (1 + SIGMA_1_SLACK))
    upper_sq = jac_frob_sq  # lambda_max <= trace: the fallback
    below = _lower_triangle_symmetric(-gram)
    diag = torch.nextafter(beta + below.diagonal(), torch.tensor(-math.inf, dtype=gram.dtype, device=gram.device))
    if bool((diag >= 0).all()):
        below.diagonal().copy_(diag)  # <= beta I - G^ on the diagonal, equal off it
        if _proves_positive_definite_unchecked(below):
            upper_sq = min(upper_sq, _up(beta + gram_error))
    gram_frob = _up(math.sqrt(_sumsq_upper(gram)))
    x_norm_sq = _up(float(x @ x) / _down(1 - gamma(n)))
    quotient_error = _up(_up(gamma(2 * n + 1) * gram_frob) + gram_error)
    quotient = float(x @ (gram @ x))
    numerator = _down(_down(quotient - _up(quotient_error * x_norm_sq)) - _up(2 * n * n * _ETA))
    if not numerator > 0:
        return None
    lower = _down(math.sqrt(_down(numerator / x_norm_sq)))
    return lower, _up(math.sqrt(upper_sq))


def _verified_bounds(gram: torch.Tensor, k_terms: tuple[float, float], scaled_frob_sq: float, w: float,
                     shift: float, basis: torch.Tensor, stretched: torch.Tensor, n_rows: int, rho: float,
                     x: torch.Tensor) -> VerifiedBounds | None:
    """Steps 1-5 of the module docstring, given that Cholesky succeeded on K^ with its diagonal lowered by ``shift``.

    ``k_terms``: (upper bound on ||K^||_F^2, Rump's shift for K^), taken before K^ was freed.
    """
    n_params = gram.shape[0]
    k_frob_sq, k_rump = k_terms
    if not (all(bool(torch.isfinite(t).all()) for t in (gram, stretched))
            and math.isfinite(k_frob_sq) and math.isfinite(scaled_frob_sq)):
        return None
    # ||J~||_F^2 = trace(J~^T J~), and G^_ii >= (1 - gamma_m) (J~^T J~)_ii - m eta (step 1 on the diagonal)
    trace = _up(_sum_upper(gram.diagonal()) + _up(n_params * _up(n_rows * _ETA)))
    jac_frob_sq = _up(trace / _down(1 - gamma(n_rows)))
    basis_frob_sq = _sumsq_upper(basis)
    gram_error = _gram_error(jac_frob_sq, n_rows, n_params)
    k_error = _k_error(gram_error, w, basis, basis_frob_sq, k_frob_sq, scaled_frob_sq)
    c_verified = _down(_down(shift - k_rump) - k_error)
    if not c_verified > 0:
        return None
    sigma_1 = _sigma_1_bounds(gram, rho, x, gram_error, jac_frob_sq)
    if sigma_1 is None:
        return None
    if basis.shape[1]:
        rounding = _up(gamma(n_params) * _up(math.sqrt(jac_frob_sq) * math.sqrt(basis_frob_sq)))
        underflow = _up(n_params * _ETA * math.sqrt(stretched.numel()))
        null_stretch = _up(_up(math.sqrt(_sumsq_upper(stretched)) + rounding) + underflow)
    else:
        null_stretch = math.nan
    return VerifiedBounds(sigma_kept=_down(math.sqrt(c_verified)), sigma_1_upper=sigma_1[1],
                          sigma_1_lower=sigma_1[0], null_stretch=null_stretch)


def certify_nullity(
    fn: Model,
    params: Params,
    inputs: Sequence[torch.Tensor],
    basis: torch.Tensor,
    *,
    mode: Mode = "auto",
    zero_tol: float = DEFAULT_ZERO_TOL,
    min_gap: float = DEFAULT_MIN_GAP,
    progress: bool = False,
    blocks: Sequence[torch.Tensor] | None = None,
) -> RankDecision | None:
    """A certified decision that the null space of J is exactly span(basis), or None if it cannot be shown.

    The decision's ``kept_bound`` and ``dropped_bound`` are the floating-point bounds; its
    ``verified`` field holds the bounds proved for the computed Jacobian with rounding
    accounted for (module docstring), or None when that proof did not go through.
    ``blocks``: the Jacobian blocks of ``inputs`` (one per input, as ``input_jacobian``
    returns them) when the caller already has them; they are then not recomputed.
    """
    n_params = count_parameters(params)
    if basis.ndim != 2 or basis.shape[0] != n_params:
        raise ValueError(f"basis must have shape ({n_params}, u), got {tuple(basis.shape)}")
    if blocks is not None and len(blocks) != len(inputs):
        raise ValueError(f"blocks must hold one Jacobian block per input: {len(blocks)} blocks, {len(inputs)} inputs")
    gram = torch.zeros(n_params, n_params, dtype=basis.dtype, device=basis.device)
    stretched_blocks: list[torch.Tensor] = []
    n_rows = 0
    for i, x in enumerate(tqdm(inputs, desc="jacobian", disable=not progress, leave=False)):
        block = input_jacobian(fn, params, x, mode) if blocks is None else blocks[i]
        n_rows += block.shape[0]
        gram += block.T @ block
        stretched_blocks.append(block @ basis)
    stretched = torch.cat(stretched_blocks)
    rho, x_top = _power_iteration(gram)
    sigma_1 = math.sqrt(max(rho, 0.0))
    if sigma_1 == 0.0 or not math.isfinite(sigma_1):
        return None
    null_stretch = float(stretched.norm()) if basis.shape[1] else 0.0  # Frobenius >= spectral
    w = sigma_1**2
    scaled = w * (basis @ basis.T)
    scaled_frob_sq = _sumsq_upper(scaled)
    k = gram + scaled
    del scaled  # P x P matrices are freed as soon as they are done with (estimate_resources counts them)
    k = _lower_triangle_symmetric(k)  # exactly symmetric, as Rump's criterion needs; entries unchanged
    chol, info = torch.linalg.cholesky_ex(k)
    if int(info):
        return None
    shift = 0.5 * _smallest_eigenvalue_estimate(chol, k)
    del chol
    if shift <= 0.0 or not _cholesky_lowered(k, shift):
        return None
    k_terms = (_sumsq_upper(k), _rump_shift(k.diagonal()))
    del k
    kept = math.sqrt(shift) / sigma_1
    if kept < GRAM_FLOOR:
        return None
    dropped = null_stretch / sigma_1 if basis.shape[1] else math.nan
    verified = _verified_bounds(gram, k_terms, scaled_frob_sq, w, shift, basis, stretched, n_rows, rho, x_top)
    return RankDecision(
        singular_values=None, n_rows=n_rows, n_params=n_params, rank=n_params - basis.shape[1],
        zero_tol=zero_tol, min_gap=min_gap, kept_bound=kept, dropped_bound=dropped, verified=verified,
    )


# ------------------------------------------------------------------------------------------------
# How far the computed Jacobian is from the exact one: an estimate, not a bound
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class JacobianError:
    """Measured estimates of ||J - J~||_F for the float64 Jacobian J~ (not bounds).

    ``float32_scaled``: ||J~_32 - J~_64||_F times u_64 / u_32, the float32 Jacobian's error
    scaled to float64's round-off (both in the mode ``input_jacobian`` picks, the one the
    certificate used). ``forward_reverse``: ||J~_forward - J~_reverse||_F, two float64
    evaluations that round differently (nan when not measured: the second mode is the
    expensive one).
    """

    float32_scaled: float
    forward_reverse: float = math.nan

    @property
    def estimate(self) -> float:
        """The larger of the measured estimates."""
        return max(x for x in (self.float32_scaled, self.forward_reverse) if not math.isnan(x))


def jacobian_error_estimate(fn: Model, params: Params, inputs: Sequence[torch.Tensor], *,
                            compare_modes: bool = True, blocks: Sequence[torch.Tensor] | None = None) -> JacobianError:
    """Estimate ||J - J~||_F over all ``inputs`` (float64 params and inputs; see ``JacobianError``).

    ``compare_modes=False`` skips the forward-against-reverse comparison (it costs one Jacobian
    in the expensive mode per input). ``blocks``: the float64 blocks in mode 'auto', if the
    caller has them.
    """
    if not inputs:
        raise ValueError("inputs is empty: the Jacobian needs at least one input")
    if blocks is not None and len(blocks) != len(inputs):
        raise ValueError(f"blocks must hold one Jacobian block per input: {len(blocks)} blocks, {len(inputs)} inputs")
    params32 = {name: p.to(torch.float32) for name, p in params.items()}
    modes_sq, single_sq = 0.0, 0.0
    for i, x in enumerate(inputs):
        double = input_jacobian(fn, params, x, "auto") if blocks is None else blocks[i]
        single = input_jacobian(fn, params32, x.to(torch.float32), "auto").to(torch.float64)
        single_sq += float((single - double).pow(2).sum())
        if compare_modes:
            forward = input_jacobian(fn, params, x, "forward")
            reverse = input_jacobian(fn, params, x, "reverse")
            modes_sq += float((forward - reverse).pow(2).sum())
    scaled = math.sqrt(single_sq) * (FLOAT64_UNIT_ROUNDOFF / FLOAT32_UNIT_ROUNDOFF)
    return JacobianError(scaled, math.sqrt(modes_sq) if compare_modes else math.nan)
