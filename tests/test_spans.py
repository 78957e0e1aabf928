"""attnid.train.spans: orthonormal bases kept as coefficients, against a dense SVD with the rank rule."""

from __future__ import annotations

import pytest
import torch

from attnid.train import spans
from attnid import symmetry as sym
from attnid.train import training as T
from attnid.jacobian import flatten, unflatten
from attnid.layer import init_params
from attnid.rank import numerical_rank
from attnid.spec import AttentionSpec


def reference_basis(mat: torch.Tensor) -> torch.Tensor:
    """The dense route the library used before: leading left singular vectors, as many as rule 2 keeps."""
    u, s, _ = torch.linalg.svd(mat, full_matrices=False)
    return u[:, : numerical_rank(s)]


def projector(basis: torch.Tensor) -> torch.Tensor:
    return basis @ basis.T


def sparse_columns(rows: int, cols: int, per_column: int, gen: torch.Generator) -> torch.Tensor:
    mat = torch.zeros(rows, cols, dtype=torch.float64)
    for c in range(cols):
        where = torch.randperm(rows, generator=gen)[:per_column]
        mat[where, c] = torch.randn(per_column, generator=gen, dtype=torch.float64)
    return mat


@pytest.mark.parametrize("case", ["independent", "duplicate", "zero", "ill-conditioned"])
def test_the_span_matches_the_dense_svd_with_the_rank_rule(case: str) -> None:
    gen = torch.Generator().manual_seed(3)
    mat = sparse_columns(200, 30, 12, gen)
    if case == "duplicate":
        mat[:, 7] = 2.0 * mat[:, 3] - mat[:, 5]
    elif case == "zero":
        mat[:, 11] = 0.0
    elif case == "ill-conditioned":
        mat[:, 9] = mat[:, 4] + 1e-6 * mat[:, 9]
    family = spans.SpanFamily(mat)
    basis, expected = family.basis(), reference_basis(mat)
    assert basis.shape == expected.shape
    assert basis.shape[1] == (30 if case in ("independent", "ill-conditioned") else 29)
    assert torch.allclose(basis.T @ basis, torch.eye(basis.shape[1], dtype=torch.float64), atol=1e-9)
    assert torch.allclose(projector(basis), projector(expected), atol=1e-9)
    # the Gram path decides unless a singular value lies between rel_tol and GRAM_PATH_MIN of the largest
    gram_path = family._gram_coefficients(torch.arange(30))
    assert (gram_path is None) == (case == "ill-conditioned")


def test_a_subset_of_columns_has_the_span_of_those_columns() -> None:
    gen = torch.Generator().manual_seed(4)
    mat = sparse_columns(150, 20, 10, gen)
    mat[:, 6] = mat[:, 2] - mat[:, 4]  # dependent inside the subset
    family = spans.SpanFamily(mat)
    subset = [2, 4, 6, 8, 10, 12]
    expected = reference_basis(mat[:, subset])
    assert family.dimension(subset) == expected.shape[1] == 5
    assert torch.allclose(projector(family.basis(subset)), projector(expected), atol=1e-9)
    v = torch.randn(150, generator=gen, dtype=torch.float64)
    coords = family.coordinates(family.transpose_times(v), subset)
    assert torch.allclose(coords.norm(), (expected.T @ v).norm(), atol=1e-10)


def test_project_agrees_with_the_dense_projection() -> None:
    gen = torch.Generator().manual_seed(5)
    mat = sparse_columns(120, 15, 9, gen)
    mat[:, 3] = mat[:, 1] + mat[:, 2]  # a dependent column: the Gram path drops it with its bound
    family = spans.SpanFamily(mat)
    v = torch.randn(120, 3, generator=gen, dtype=torch.float64)
    p = projector(reference_basis(mat))
    assert family.dimension() == 14
    assert torch.allclose(family.project(v), p @ v, atol=1e-10)
    assert torch.allclose(family.project(v[:, 0]), p @ v[:, 0], atol=1e-10)


def test_a_singular_value_just_above_the_threshold_is_kept() -> None:
    gen = torch.Generator().manual_seed(7)
    mat = sparse_columns(100, 10, 8, gen)
    q, _ = torch.linalg.qr(mat)
    mat = q * torch.tensor([1.0] * 9 + [1e-9], dtype=torch.float64)  # s_min / s_max = 1e-9 > rel_tol = 1e-10
    assert spans.SpanFamily(mat).dimension() == 10  # the SVD path decides (the Gram cannot see 1e-9)
    mat[:, 9] *= 1e-3  # 1e-12: below the threshold, dropped
    assert spans.SpanFamily(mat).dimension() == 9


def test_no_directions_give_an_empty_span() -> None:
    params = init_params(AttentionSpec.create(4, 2), torch.Generator().manual_seed(0))
    family = spans.SpanFamily(spans.stack([], params))
    assert family.dimension() == 0 and family.basis().shape == (sum(p.numel() for p in params.values()), 0)
    with pytest.raises(ValueError, match="matrix"):
        spans.SpanFamily(torch.zeros(3))


@pytest.mark.parametrize("spec", [AttentionSpec.create(4, 1, head_dim=6),  # a head wider than d_model: dependent generators
                                  AttentionSpec.create(16, 4, kv_heads=2, bias="qkvo", rope_fraction=0.5)],
                         ids=["wide-head", "gqa-rope-biases"])
def test_the_shares_equal_the_dense_svd_route(spec: AttentionSpec) -> None:
    gen = torch.Generator().manual_seed(6)
    params = {n: p.double() for n, p in init_params(spec, gen).items()}
    update = {n: torch.randn(p.shape, generator=gen, dtype=torch.float64) for n, p in params.items()}
    shares = T.invisible_shares(update, params, spec)
    labelled = sym.labelled_tangent_directions(params, spec)
    u = flatten(update)
    total = reference_basis(torch.stack([flatten(d) for _, d in labelled], dim=1))
    assert total.shape[1] == sym.orbit_tangent(params, spec).shape[1]
    assert shares["total"] == pytest.approx(float((total.T @ u).norm() / u.norm()), abs=1e-10)
    for key in shares:
        part = [flatten(d) for label, d in labelled if label == key or label.split("/")[0] == key] if key != "total" else None
        if part:
            assert shares[key] == pytest.approx(float((reference_basis(torch.stack(part, 1)).T @ u).norm() / u.norm()),
                                                abs=1e-10)
    inside = unflatten(total @ (total.T @ u), params)
    assert T.invisible_shares(inside, params, spec)["total"] == pytest.approx(1.0, abs=1e-10)


def test_disjoint_blocks_are_diagonalised_apart_and_give_the_whole_span() -> None:
    gen = torch.Generator().manual_seed(8)
    mat = torch.zeros(90, 12, dtype=torch.float64)
    mat[:40, :5] = torch.randn(40, 5, generator=gen, dtype=torch.float64)  # rows 0-39
    mat[40:70, 5:9] = torch.randn(30, 4, generator=gen, dtype=torch.float64)  # rows 40-69
    mat[70:, 9:] = torch.randn(20, 3, generator=gen, dtype=torch.float64)
    mat[:, 8] = 3.0 * mat[:, 6]  # a dependent column inside the second block
    family = spans.SpanFamily(mat)
    groups = family.components(torch.arange(12))
    assert sorted(sorted(g.tolist()) for g in groups) == [[0, 1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11]]
    assert family.dimension() == 11
    assert torch.allclose(projector(family.basis()), projector(reference_basis(mat)), atol=1e-10)
    # a subset keeps its own blocks: columns 4 and 5 touch no common row
    assert len(family.components(torch.tensor([4, 5]))) == 2


def test_the_bound_on_the_dropped_singular_values_holds() -> None:
    gen = torch.Generator().manual_seed(9)
    mat = sparse_columns(120, 16, 10, gen)
    mat[:, 3] = mat[:, 1] + mat[:, 2] + 1e-13 * mat[:, 3]  # two singular values far below the others
    mat[:, 12] = mat[:, 10] - 1e-12 * mat[:, 12]
    family = spans.SpanFamily(mat)
    lam, v = family._eigh(torch.arange(16))
    small = v[:, :2]
    true = torch.linalg.svdvals(mat)[-2:]
    bound = family.small_bound(small)
    assert float(true.max()) <= bound <= 1e-9 * float(torch.linalg.svdvals(mat)[0])
    assert family.dimension() == 14  # both dropped on the Gram path
    assert family._gram_coefficients(torch.arange(16)) is not None


def test_a_badly_conditioned_span_leaves_the_gram_path_for_the_svd() -> None:
    gen = torch.Generator().manual_seed(10)
    q, _ = torch.linalg.qr(torch.randn(400, 60, generator=gen, dtype=torch.float64))
    mat = q * torch.tensor([1.0] * 59 + [1.2e-3], dtype=torch.float64)  # s_min = 1.2e-3 s_max: every s is "large"
    family = spans.SpanFamily(mat)
    lam, _ = family._eigh(torch.arange(60))
    assert bool((lam >= spans.GRAM_PATH_MIN**2 * lam[-1]).all())
    assert family.ortho_bound(torch.arange(60), float(lam[0])) > spans.ORTHO_TOL  # cond^2 ~ 7e5, 460 terms: not trusted
    assert family._gram_coefficients(torch.arange(60)) is None
    basis = family.basis()
    assert basis.shape[1] == 60
    assert torch.allclose(basis.T @ basis, torch.eye(60, dtype=torch.float64), atol=1e-12)


def test_a_failed_eigendecomposition_falls_back_to_the_svd(monkeypatch: pytest.MonkeyPatch) -> None:
    mat = sparse_columns(60, 8, 6, torch.Generator().manual_seed(11))

    def fail(*args, **kwargs):
        raise torch.linalg.LinAlgError("eigh did not converge")

    monkeypatch.setattr(torch.linalg, "eigh", fail)
    family = spans.SpanFamily(mat)
    assert family._gram_coefficients(torch.arange(8)) is None
    assert torch.allclose(projector(family.basis()), projector(reference_basis(mat)), atol=1e-10)


@pytest.mark.parametrize("rel_tol", [0.0, 2e-4, 1e-3])
def test_a_threshold_the_gram_path_cannot_honour_is_refused(rel_tol: float) -> None:
    with pytest.raises(ValueError, match="rel_tol"):
        spans.SpanFamily(torch.eye(4, dtype=torch.float64), rel_tol)


def test_the_qr_fallback_keeps_the_contract_mat_vh_t_equals_u_s(monkeypatch: pytest.MonkeyPatch) -> None:
    mat = sparse_columns(50, 6, 5, torch.Generator().manual_seed(12))
    real_svd, calls = torch.linalg.svd, []

    def flaky(a, full_matrices=True):  # the first two calls fail: mat's SVD and R's
        calls.append(a.shape)
        if len(calls) <= 2:
            raise torch.linalg.LinAlgError("did not converge")
        return real_svd(a, full_matrices=full_matrices)

    monkeypatch.setattr(torch.linalg, "svd", flaky)
    u, s, vh = spans.left_singular(mat)
    assert len(calls) == 3 and u.shape == (50, 6)
    assert torch.allclose(mat @ vh.T, u * s, atol=1e-12)
    assert torch.allclose(u.T @ u, torch.eye(6, dtype=torch.float64), atol=1e-12)
