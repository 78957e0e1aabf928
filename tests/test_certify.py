"""The verified certificate: Rump's positive-definiteness test, the rounding bounds, agreement with the SVD route."""

import math

import pytest
import torch

from attnid import certify
from attnid.counts import count
from attnid.layer import forward
from attnid.rank import FLOAT64_UNIT_ROUNDOFF, VerifiedBounds
from attnid.spec import AttentionSpec
from attnid.symmetry import orbit_tangent
from attnid.budget import default_inputs
from attnid.verification import _draw_point, _inputs, jacobian_error, numeric_rank

N = 40


def with_spectrum(eigenvalues: list[float], seed: int = 0) -> torch.Tensor:
    """Q diag(eigenvalues) Q^T in float64 for a random orthogonal Q, made exactly symmetric."""
    gen = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(len(eigenvalues), len(eigenvalues), generator=gen, dtype=torch.float64))
    a = q @ torch.diag(torch.tensor(eigenvalues, dtype=torch.float64)) @ q.T
    return torch.tril(a) + torch.tril(a, -1).T


def rump_bound(a: torch.Tensor) -> float:
    """Rump's shift for a, written out independently: gamma_{n+2} trace + the (negligible) underflow term."""
    n = a.shape[0]
    g = (n + 2) * FLOAT64_UNIT_ROUNDOFF / (1 - (n + 2) * FLOAT64_UNIT_ROUNDOFF)
    return g * float(a.diagonal().sum())


def plain_cholesky_succeeds(a: torch.Tensor) -> bool:
    return int(torch.linalg.cholesky_ex(a)[1]) == 0


def test_gamma_matches_its_definition_and_rejects_bad_n() -> None:
    u = FLOAT64_UNIT_ROUNDOFF
    for n in (1, 10, 10**6):
        assert n * u / (1 - n * u) <= certify.gamma(n) <= n * u / (1 - n * u) * (1 + 4 * u)
    assert certify.gamma(0) == 0.0
    for bad in (-1, 2**52, 1.5, True):
        with pytest.raises(ValueError, match="n"):
            certify.gamma(bad)


def test_clearly_positive_definite_matrices_are_proved() -> None:
    for seed in range(3):
        a = with_spectrum([1.0 + i for i in range(N)], seed)
        assert certify.proves_positive_definite(a)
        bound = certify.min_eigenvalue_lower_bound(a, 0.5)
        # a proven lower bound: positive, below the true smallest eigenvalue 1, and only the rounding term below 0.5
        assert bound is not None and 0 < bound < 0.5 < 1.0
        assert 0.5 - bound <= 2 * rump_bound(a)


def test_singular_matrix_is_rejected_although_plain_cholesky_succeeds() -> None:
    # One eigenvalue exactly 0 in exact arithmetic; rounding makes the stored matrix slightly definite or not.
    # Search a few seeds for one where LAPACK's plain Cholesky runs to completion: the trap Rump's test avoids.
    fooled = []
    for seed in range(40):
        a = with_spectrum([0.0] + [1.0] * (N - 1), seed)
        if plain_cholesky_succeeds(a):
            fooled.append(seed)
            assert not certify.proves_positive_definite(a)
            bound = certify.min_eigenvalue_lower_bound(a, 0.0)
            assert bound is None or bound < 0  # nothing proved
    assert fooled, "plain Cholesky failed on every singular matrix tried: the test would prove nothing"


def test_negative_eigenvalue_hidden_by_rounding_is_rejected() -> None:
    # lambda_min = -1e-17 in exact arithmetic: indefinite, but below the rounding of forming Q D Q^T (about
    # 1e-15 here), so plain Cholesky of the stored matrix often runs to completion. Rump's test never does.
    fooled = 0
    for seed in range(40):
        a = with_spectrum([-1e-17] + [1.0] * (N - 1), seed)
        fooled += plain_cholesky_succeeds(a)
        assert not certify.proves_positive_definite(a)
    assert fooled, "plain Cholesky never ran to completion: the test would prove nothing"


@pytest.mark.parametrize("factor, proved", [(0.1, False), (0.9, False), (100.0, True)])
def test_smallest_eigenvalue_against_the_bound(factor: float, proved: bool) -> None:
    # Positive definite, but with lambda_min a multiple of Rump's bound: proved only well above it.
    probe = with_spectrum([1.0] * N)
    a = with_spectrum([factor * rump_bound(probe)] + [1.0] * (N - 1), 1)
    assert certify.proves_positive_definite(a) is proved


def test_bad_matrices_are_value_errors() -> None:
    a = with_spectrum([1.0] * 4)
    with pytest.raises(ValueError, match="symmetric"):
        certify.proves_positive_definite(a + torch.triu(torch.full_like(a, 1e-3), 1))
    with pytest.raises(ValueError, match="float64"):
        certify.proves_positive_definite(a.to(torch.float32))
    with pytest.raises(ValueError, match="c must be"):
        certify.min_eigenvalue_lower_bound(a, -1.0)


LAYOUTS = [
    AttentionSpec.create(6, 2),
    AttentionSpec.create(8, 4, kv_heads=2, rope_fraction=1.0, bias="k"),
    AttentionSpec.create(4, 2, bias="qkvo"),
    AttentionSpec.create(6, 3, kv_heads=1, norm="sigmoid", causal=True, bias="qvo"),
    AttentionSpec.create(6, 2, bias="qkvo", norm="sink", sink_learned=True),
]


def certified_and_full(spec: AttentionSpec, seed: int = 3, seq_len: int = 6):
    fast = numeric_rank(spec, seq_len=seq_len, seed=seed, method="dense")
    full = numeric_rank(spec, seq_len=seq_len, seed=seed, method="svd", n_inputs=fast.n_inputs)
    return fast.decision, full.decision


@pytest.mark.parametrize("spec", LAYOUTS, ids=lambda s: s.describe().replace(" ", ","))
def test_verified_bounds_are_rigorous_and_agree_with_the_svd(spec: AttentionSpec) -> None:
    fast, full = certified_and_full(spec)
    assert fast.method == "certificate" and full.method == "svd"
    assert fast.rank == full.rank == count(spec).total - count(spec).unidentified
    v = fast.verified
    assert isinstance(v, VerifiedBounds) and fast.rigorous
    # never stronger than the floating-point bounds they make rigorous
    assert v.kept <= fast.kept_bound and v.dropped >= fast.dropped_bound
    assert v.sigma_1_lower <= v.sigma_1_upper
    # and they enclose the SVD of the same Jacobian (its own rounding is far below these margins)
    s = full.singular_values
    assert v.sigma_1_lower <= float(s[0]) * (1 + 1e-12) and float(s[0]) <= v.sigma_1_upper * (1 + 1e-12)
    assert v.sigma_kept <= float(s[fast.rank - 1])
    assert v.kept <= full.smallest_kept


def _point(spec: AttentionSpec, seed: int = 3, seq_len: int = 6):
    from attnid.runtime import generator
    gen = generator(seed)
    params = _draw_point(spec, gen, "cpu", count(spec).total)
    inputs = _inputs(spec, gen, default_inputs(spec, seq_len), seq_len, "cpu")
    return params, inputs, (lambda p, x: forward(p, x, spec))


def test_wrong_null_space_is_not_certified() -> None:
    spec = LAYOUTS[0]
    params, inputs, layer = _point(spec)
    basis = orbit_tangent(params, spec)
    # one orbit direction missing: K has a null direction, and the shifted Cholesky must fail
    assert certify.certify_nullity(layer, params, inputs, basis[:, 1:]) is None
    # one direction too many (a random one, orthogonalised): the lower bound still holds, but the
    # stretch of T is not small, so the decision is not clear and nothing is claimed
    extra = torch.randn(basis.shape[0], 1, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    wide, _ = torch.linalg.qr(torch.cat([basis, extra], dim=1))
    decision = certify.certify_nullity(layer, params, inputs, wide)
    assert decision is None or not (decision.clear or decision.rigorous)


def test_verified_lower_bound_needs_no_orthonormal_basis() -> None:
    # K = J^T J + w T T^T bounds s_r from below for any T: a scaled basis proves the same rank.
    spec = LAYOUTS[0]
    params, inputs, layer = _point(spec)
    basis = orbit_tangent(params, spec)
    plain = certify.certify_nullity(layer, params, inputs, basis)
    scaled = certify.certify_nullity(layer, params, inputs, 3.0 * basis)
    assert plain.verified is not None and scaled.verified is not None
    assert scaled.rank == plain.rank


@pytest.mark.parametrize("spec", LAYOUTS[:3], ids=lambda s: s.describe().replace(" ", ","))
def test_jacobian_error_is_far_below_the_verified_margin(spec: AttentionSpec) -> None:
    fast, _ = certified_and_full(spec)
    err = jacobian_error(spec, seq_len=6, seed=3)
    assert 0 < err.estimate < math.inf
    # float64 round-off on entries of size about one: the estimate sits at round-off, and the margin is decades above
    assert err.estimate < 1e-10 * fast.verified.sigma_1_upper
    assert err.estimate * 1e6 < fast.verified.sigma_kept


@pytest.mark.parametrize("spec", LAYOUTS[:2], ids=lambda s: s.describe().replace(" ", ","))
def test_certify_layout_is_the_certificate_of_verify(spec: AttentionSpec) -> None:
    from attnid.verification import certify_layout, verify
    one_pass = certify_layout(spec, seq_len=6, seed=3)
    full = verify(spec, seq_len=6, seed=3, method="dense")
    assert one_pass.decision is not None and full.decision.method == "certificate"
    assert one_pass.decision == full.decision  # same point, inputs and blocks: the same decision, bounds included
    again = jacobian_error(spec, seq_len=6, seed=3, compare_modes=False)
    assert one_pass.error == again
