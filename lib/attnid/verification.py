"""Numeric functional dimension of an attention layout, compared with the exact count.

How many inputs? The rank of the stacked Jacobian can only grow as inputs are added and
stops growing once they are generic and numerous enough (chapter 1's theorem). A first
batch is sized from two estimates (``default_inputs``). The SVD route then keeps adding
half as many inputs again until the rank stops rising (``stable``); a rank that was still
rising when the rounds ran out is reported as unstable and never as a match. The
certificate route (``attnid.certify``) needs no such loop: proving that the null space is
exactly the orbit tangent proves the rank is the largest any number of inputs can give.

How much memory? ``attnid.budget.estimate_resources`` predicts the peak memory of ``numeric_rank``
(and so of ``verify``) from the layout alone, before anything is allocated; each route is
guarded by it when a memory limit is given. The exact count is computed once per call and passed down.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from tqdm import tqdm

from attnid import structured
from attnid.budget import MAX_EXTRA_ROUNDS, check_arguments, default_seq_len, guard
from attnid.certify import JacobianError, certify_nullity, jacobian_error_estimate
from attnid.counts import Count, count
from attnid.jacobian import Mode, Model, RankAccumulator, count_parameters, input_jacobian
from attnid.layer import forward, init_params
from attnid.layout import ComparesNullity
from attnid.rank import RankDecision, counts_as_zero
from attnid.runtime import generator
from attnid.spec import AttentionSpec, Params
from attnid.symmetry import orbit_tangent



@dataclass(frozen=True)
class NumericRank:
    """A rank decision with how it was reached."""

    decision: RankDecision
    n_inputs: int
    stable: bool


@dataclass(frozen=True)
class Verification(ComparesNullity):
    """An exact count next to the numeric nullity of the Jacobian at a random point."""

    count: Count
    numeric: NumericRank
    seq_len: int
    seed: int

    @property
    def spec(self) -> AttentionSpec:
        return self.count.spec

    @property
    def total(self) -> int:
        return self.count.total

    @property
    def decision(self) -> RankDecision:
        return self.numeric.decision

    @property
    def n_inputs(self) -> int:
        return self.numeric.n_inputs

    @property
    def exact(self) -> int | None:
        """The exact count of unidentified parameters (None: not covered)."""
        return self.count.unidentified

    @property
    def stable(self) -> bool:
        """Whether the rank had stopped rising (a rank still rising never matches)."""
        return self.numeric.stable


def _inputs(spec: AttentionSpec, gen: torch.Generator, n_inputs: int, seq_len: int, device) -> list[torch.Tensor]:
    """``n_inputs`` Gaussian inputs (seq_len, d_model) in float64, drawn from ``gen`` in order."""
    return [torch.randn(seq_len, spec.d_model, generator=gen, dtype=torch.float64).to(device) for _ in range(n_inputs)]


def _draw_point(spec: AttentionSpec, gen: torch.Generator, device: torch.device | str, expected: int) -> Params:
    """The random point (the first draws from ``gen``), checked against the exact count's parameter total."""
    params = init_params(spec, gen, device=device)
    drawn = count_parameters(params)
    if drawn != expected:
        # ValueError, as the architecture issue asks: it is raised for one layout (the spec argument), and
        # callers such as the CLI report a ValueError as a one-line error naming the layout. It can only mean
        # that attnid.layer.init_params and attnid.counts.count disagree about this layout (a bug in one).
        raise ValueError(
            f"the random point has {drawn} parameters but the exact count says {expected} for {spec.describe()}: "
            "attnid.layer and attnid.counts disagree about this layout"
        )
    return params


def _try_certificate(layer: Model, params: Params, inputs: list[torch.Tensor], basis: torch.Tensor, mode: Mode,
                     progress: bool) -> RankDecision | None:
    """A clear certified decision that the null space is span(basis), or None when it cannot be proved."""
    certified = certify_nullity(layer, params, inputs, basis, mode=mode, progress=progress)
    return certified if certified is not None and certified.clear else None


def _try_structured(spec: AttentionSpec, params: Params, inputs: list[torch.Tensor],
                    draw: Callable[[int], list[torch.Tensor]], total: int, progress: bool = False) -> NumericRank | None:
    """The structured certificate on verify's inputs and more drawn after them (``structured.INPUT_FACTORS``).

    Above ``structured.GAUGE_MIN_PARAMS`` parameters the first try deletes the gauge coordinates.
    """
    families = structured.orbit_families(params, spec)
    attempts = [(factor, False) for factor in structured.INPUT_FACTORS]
    if total > structured.GAUGE_MIN_PARAMS:
        attempts.insert(0, (structured.INPUT_FACTORS[0], True))
    pool = list(inputs)
    for number, (factor, gauge) in enumerate(attempts, 1):
        pool = pool + draw(factor * len(inputs) - len(pool))
        if progress:
            print(f"structured certificate: attempt {number} of {len(attempts)}, {len(pool)} inputs"
                  + (", gauge coordinates deleted" if gauge else ""), file=sys.stderr, flush=True)
        decision = structured.certify_structured(params, pool, spec, families=families, gauge=gauge)
        if decision is not None and decision.clear:
            return NumericRank(decision, len(pool), stable=True)
    return None


def _accumulate(layer: Model, params: Params, inputs: list[torch.Tensor], basis: torch.Tensor | None, mode: Mode,
                progress: bool) -> tuple[RankAccumulator, float]:
    """The inputs' Jacobian blocks folded into an accumulator, and ||J T||_F^2 (0 without an orbit basis T)."""
    acc = RankAccumulator(count_parameters(params))
    orbit_stretch = 0.0  # ||J T||_F^2: how far the orbit tangent is from the null space
    for x in tqdm(inputs, desc="jacobian", disable=not progress, leave=False):
        block = input_jacobian(layer, params, x, mode)
        acc.add(block)
        if basis is not None:
            orbit_stretch += float((block @ basis).pow(2).sum())
    return acc, orbit_stretch


def _orbit_is_null_space(decision: RankDecision, basis: torch.Tensor, orbit_stretch: float) -> bool:
    """Whether the clear SVD decision's null space is the orbit tangent: same dimension, and J T counted as zero.

    Then the rank is final: the orbit directions are exact symmetries for every input, so no
    number of inputs can push the rank above P - dim(orbit).
    """
    if not (decision.clear and decision.nullity == basis.shape[1]):
        return False
    s_1 = float(decision.singular_values[0])
    return s_1 > 0 and counts_as_zero(orbit_stretch**0.5, s_1, decision.zero_tol)


def _grow_until_stable(acc: RankAccumulator, decision: RankDecision, n_inputs: int,
                       draw: Callable[[int], list[torch.Tensor]], layer: Model, params: Params,
                       mode: Mode) -> NumericRank:
    """Add half as many inputs again (``draw(k)`` gives k new ones) until the rank stops rising.

    At most MAX_EXTRA_ROUNDS rounds; a rank still rising after the last is reported unstable.
    """
    for _ in range(MAX_EXTRA_ROUNDS):
        extra = draw(max(1, n_inputs // 2))
        for x in extra:
            acc.add(input_jacobian(layer, params, x, mode))
        n_inputs += len(extra)
        previous, decision = decision, acc.decide()
        if decision.rank == previous.rank:
            return NumericRank(decision, n_inputs, stable=True)
    return NumericRank(decision, n_inputs, stable=False)


def numeric_rank(
    spec: AttentionSpec,
    *,
    seq_len: int | None = None,
    seed: int = 0,
    n_inputs: int | None = None,
    mode: Mode = "auto",
    method: str = "svd",
    device: torch.device | str = "cpu",
    progress: bool = False,
    max_bytes: int | None = None,
    exact: Count | None = None,
) -> NumericRank:
    """Rank decision for the layer's Jacobian at a seeded random point on seeded random inputs.

    ``method``: 'svd' computes the full spectrum (adding inputs until the rank is stable);
    'dense' first tries to certify that the null space is the orbit tangent from the Jacobian
    itself (``attnid.certify``, layouts with an exact count only, with verified rounding bounds)
    and falls back to the SVD route when that cannot be proved; 'auto' tries the structured
    certificate (``attnid.structured``: softmax layouts without a QK-norm, no verified bounds,
    far cheaper for wide layers) before the dense one.

    ``max_bytes``: before each route starts, its estimated peak memory (``estimate_resources``) is
    compared with this limit, and ``MemoryLimitExceeded`` is raised instead of running it; so a
    layout the structured route gives up on never reaches the far larger dense route unchecked.
    """
    exact = count(spec) if exact is None else exact
    seq_len, n_inputs = check_arguments(spec, seq_len, n_inputs, method, exact.total)
    covered = exact.covered
    tries_structured = method == "auto" and covered and structured.covers(spec) is None
    fallback = "dense" if method in ("auto", "dense") else "svd"
    guard("structured" if tries_structured else fallback, spec, seq_len, n_inputs, max_bytes, exact)
    gen = generator(seed)  # draws, in order: the point, the first inputs, then each round's extra inputs
    params = _draw_point(spec, gen, device, exact.total)
    inputs = _inputs(spec, gen, n_inputs, seq_len, device)

    def layer(p: Params, x: torch.Tensor) -> torch.Tensor:
        return forward(p, x, spec)

    if tries_structured:
        decided = _try_structured(spec, params, inputs, lambda k: _inputs(spec, gen, k, seq_len, device),
                                  exact.total, progress)
        if decided is not None:
            return decided
        guard(fallback, spec, seq_len, n_inputs, max_bytes, exact)
    basis = orbit_tangent(params, spec) if covered else None
    if method in ("auto", "dense") and basis is not None:
        certified = _try_certificate(layer, params, inputs, basis, mode, progress)
        if certified is not None:
            return NumericRank(certified, n_inputs, stable=True)
    acc, orbit_stretch = _accumulate(layer, params, inputs, basis, mode, progress)
    decision = acc.decide()
    if basis is not None and _orbit_is_null_space(decision, basis, orbit_stretch):
        return NumericRank(decision, n_inputs, stable=True)
    return _grow_until_stable(acc, decision, n_inputs, lambda k: _inputs(spec, gen, k, seq_len, device),
                              layer, params, mode)


def verify(spec: AttentionSpec, *, seq_len: int | None = None, seed: int = 0, n_inputs: int | None = None,
           method: str = "auto", device: torch.device | str = "cpu", progress: bool = False,
           max_bytes: int | None = None) -> Verification:
    """Exact count and numeric nullity side by side (``method`` and ``max_bytes`` as in ``numeric_rank``)."""
    seq_len = default_seq_len(spec) if seq_len is None else seq_len
    exact = count(spec)
    numeric = numeric_rank(spec, seq_len=seq_len, seed=seed, n_inputs=n_inputs, method=method, device=device,
                           progress=progress, max_bytes=max_bytes, exact=exact)
    return Verification(exact, numeric, seq_len, seed)


def jacobian_error(spec: AttentionSpec, *, seq_len: int | None = None, seed: int = 0, n_inputs: int | None = None,
                   device: torch.device | str = "cpu", compare_modes: bool = True) -> JacobianError:
    """Estimated ||J - J~||_F at the point and on the first inputs ``numeric_rank`` draws with the same arguments.

    The certificate's Jacobian (``attnid.certify.jacobian_error_estimate``): a measurement, not a
    bound, to set against the verified margin ``decision.verified.sigma_kept``.
    """
    total = count(spec).total
    seq_len, n_inputs = check_arguments(spec, seq_len, n_inputs, "auto", total)
    gen = generator(seed)  # the same draws, in the same order, as numeric_rank
    params = _draw_point(spec, gen, device, total)
    inputs = _inputs(spec, gen, n_inputs, seq_len, device)
    return jacobian_error_estimate(lambda p, x: forward(p, x, spec), params, inputs, compare_modes=compare_modes)


@dataclass(frozen=True)
class CertifiedLayout:
    """The certificate step of ``numeric_rank(method='auto')`` for one layout, with the Jacobian's estimated error.

    ``decision`` is the certified decision (None when the layout has no exact count, hence
    no orbit basis, or when the certificate gave up and the SVD route would decide);
    ``error`` estimates ||J - J~||_F on the same Jacobian (None without a decision).
    """

    spec: AttentionSpec
    count: Count
    decision: RankDecision | None
    error: JacobianError | None
    n_inputs: int


def certify_layout(spec: AttentionSpec, *, seq_len: int | None = None, seed: int = 0, n_inputs: int | None = None,
                   device: torch.device | str = "cpu") -> CertifiedLayout:
    """Certify one layout at the point and on the inputs ``numeric_rank`` draws, and estimate the Jacobian's error.

    Each float64 Jacobian block is computed once and serves both the certificate and the
    float32-against-float64 error estimate (``attnid.certify.jacobian_error_estimate``).
    """
    exact = count(spec)
    seq_len, n_inputs = check_arguments(spec, seq_len, n_inputs, "auto", exact.total)
    gen = generator(seed)  # the same draws, in the same order, as numeric_rank
    params = _draw_point(spec, gen, device, exact.total)
    inputs = _inputs(spec, gen, n_inputs, seq_len, device)
    if not exact.covered:
        return CertifiedLayout(spec, exact, None, None, n_inputs)

    def layer(p: Params, x: torch.Tensor) -> torch.Tensor:
        return forward(p, x, spec)

    blocks = [input_jacobian(layer, params, x) for x in inputs]
    decision = certify_nullity(layer, params, inputs, orbit_tangent(params, spec), blocks=blocks)
    if decision is None or not decision.clear:
        return CertifiedLayout(spec, exact, None, None, n_inputs)
    error = jacobian_error_estimate(layer, params, inputs, compare_modes=False, blocks=blocks)
    return CertifiedLayout(spec, exact, decision, error, n_inputs)


# ------------------------------------------------------------------------------------------------
# Peak memory, predicted from the layout before anything is allocated
# ------------------------------------------------------------------------------------------------

# What the float64 terms of estimate_resources leave out, calibrated on measured peaks (its docstring):
# * ESTIMATE_FIRST_USE_BYTES: the first Jacobian, Cholesky and SVD of a process load code and
#   thread buffers (torch.func, PyTorch's CPU kernels, LAPACK): 164-170 MiB measured, whatever the layout.
# * ESTIMATE_SAFETY: temporaries and allocator rounding the terms do not name (the terms alone came
#   within 10% below the measured peak on the largest layouts tried).
# * ESTIMATE_HEAP_SLACK_CAP: glibc malloc keeps blocks below its mmap threshold (at most 32 MiB) after
#   they are freed, and fragments them; on layouts whose P x P matrices are below that size the peak
#   grew by up to 1.2 times the terms. Larger blocks are mapped and returned, so the slack is capped.
