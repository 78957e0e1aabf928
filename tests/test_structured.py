"""The structured route (attnid.structured) against the dense Jacobian from automatic differentiation."""

from __future__ import annotations

import math

import pytest
import torch

from attnid import structured
from attnid.counts import count
from attnid.jacobian import input_jacobian
from attnid.layer import forward, init_params
from attnid.runtime import generator
from attnid.spec import AttentionSpec, standard_layouts
from attnid.symmetry import orbit_tangent
from attnid.verification import numeric_rank, verify

# Every standard layout the dense route handles at d = 8 (biases none and qkvo), and the features the standard
# sweep leaves out: partial RoPE, a causal mask, a sliding window, chunks, single biases, d_v != d_k, heads narrower than d / H.
EXTRA = [
    AttentionSpec.create(8, 2, causal=True, bias="qk"),
    AttentionSpec.create(8, 2, rope_fraction=0.5, bias="kv", causal=True, window=3),
    AttentionSpec.create(8, 2, kv_heads=1, rope_fraction=1.0, causal=True, chunk=3, bias="o"),
    AttentionSpec.create(12, 3, kv_heads=1, rope_fraction=0.5, bias="qkvo"),
    AttentionSpec.create(8, 2, head_dim=3, v_head_dim=5, bias="v"),
    AttentionSpec.create(12, 2, head_dim=4, rope_fraction=0.5, bias="qkvo"),
]
LAYOUTS = standard_layouts(8, biases=("none", "qkvo")) + EXTRA
IDS = [s.describe().replace(" ", ",") for s in LAYOUTS]


def _point(spec: AttentionSpec, seed: int = 1, n_inputs: int = 3, seq_len: int = 5):
    gen = generator(seed)
    params = init_params(spec, gen)
    inputs = [torch.randn(seq_len, spec.d_model, generator=gen, dtype=torch.float64) for _ in range(n_inputs)]
    return params, inputs


def _dense(spec: AttentionSpec, params, inputs) -> torch.Tensor:
    return torch.cat([input_jacobian(lambda p, x: forward(p, x, spec), params, x) for x in inputs])


@pytest.mark.parametrize("spec", LAYOUTS, ids=IDS)
def test_gram_matrix_and_products_match_the_dense_jacobian(spec: AttentionSpec) -> None:
    params, inputs = _point(spec)
    jac = _dense(spec, params, inputs)
    factors = structured._concat([structured.token_factors(params, x, spec) for x in inputs])
    gram, diagonal = structured.gram_matrix(factors)
    dense = jac.T @ jac
    scale = dense.abs().max()
    assert (gram - dense).abs().max() <= 1e-12 * scale
    assert (diagonal - dense.diagonal()).abs().max() <= 1e-12 * scale
    lower, _ = structured.gram_matrix(factors, lower=True)
    assert torch.equal(lower, lower.tril()) and (lower - dense.tril()).abs().max() <= 1e-12 * scale
    vectors = torch.randn(jac.shape[1], 3, dtype=torch.float64, generator=generator(5))
    assert (structured.apply(factors, vectors) - jac @ vectors).abs().max() <= 1e-12 * (jac @ vectors).abs().max()
    keep = torch.rand(jac.shape[1], generator=generator(6)) > 0.3
    reduced, _ = structured.gram_matrix(factors, keep)
    assert (reduced - dense[keep][:, keep]).abs().max() <= 1e-12 * scale


@pytest.mark.parametrize("spec", LAYOUTS, ids=IDS)
def test_orbit_families_are_an_orthonormal_basis_of_the_orbit_tangent(spec: AttentionSpec) -> None:
    params, inputs = _point(spec, seed=2)
    families = structured.orbit_families(params, spec)
    tangent = orbit_tangent(params, spec)
    basis = torch.zeros(tangent.shape[0], sum(f.basis.shape[1] for f in families), dtype=torch.float64)
    column = 0
    for family in families:
        basis[family.support, column: column + family.basis.shape[1]] = family.basis
        column += family.basis.shape[1]
    assert basis.shape[1] == tangent.shape[1] == count(spec).unidentified
    assert (basis.T @ basis - torch.eye(basis.shape[1], dtype=torch.float64)).abs().max() < 1e-12
    assert (tangent - basis @ (basis.T @ tangent)).abs().max() < 1e-12  # the same span
    jac = _dense(spec, params, inputs)
    factors = structured._concat([structured.token_factors(params, x, spec) for x in inputs])
    # J B is round-off (about 1e-29 squared here), so check stretch_squared on other orthonormal bases with the
    # same supports, where J V is of order one: every family must be applied, through the right columns.
    gen = generator(9)
    rotated = [structured.OrbitFamily(f.support, torch.linalg.qr(torch.randn(f.support.numel(), f.basis.shape[1],
                                      generator=gen, dtype=torch.float64)).Q) for f in families]
    other = torch.zeros_like(basis)
    column = 0
    for family in rotated:
        other[family.support, column: column + family.basis.shape[1]] = family.basis
        column += family.basis.shape[1]
    expected = float((jac @ other).pow(2).sum())
    assert math.isclose(structured.stretch_squared(factors, rotated), expected, rel_tol=1e-10)
    for i in range(len(families)):  # leaving out any one family changes the sum
        if families[i].basis.shape[1]:
            part = structured.stretch_squared(factors, rotated[:i] + rotated[i + 1:])
            assert part < expected * (1 - 1e-9)
    assert structured.stretch_squared(factors, families) < 1e-20 * float(jac.pow(2).sum())  # the orbit is null
    gauge = structured.gauge_coordinates(families)
    assert gauge.numel() == basis.shape[1] == gauge.unique().numel()
    assert torch.linalg.matrix_rank(basis[gauge]) == basis.shape[1]  # no orbit direction vanishes on the gauge


@pytest.mark.parametrize("spec", LAYOUTS, ids=IDS)
def test_structured_and_dense_routes_agree(spec: AttentionSpec) -> None:
    fast = numeric_rank(spec, seed=4, method="auto")
    dense = numeric_rank(spec, seed=4, method="dense")
    assert fast.decision.method == "structured" and fast.decision.clear and fast.stable
    assert fast.decision.nullity == dense.decision.nullity == count(spec).unidentified
    assert fast.decision.verified is None and not fast.decision.rigorous


@pytest.mark.parametrize("spec", LAYOUTS[::4] + EXTRA, ids=lambda s: s.describe().replace(" ", ","))
@pytest.mark.parametrize("gauge", [True, False])
def test_certificate_bounds_bracket_the_spectrum_of_the_same_jacobian(spec: AttentionSpec, gauge: bool) -> None:
    # Same point, same inputs: the certified lower bound on t_r must sit below the SVD's t_r, the upper bound on
    # t_{r+1} above the SVD's t_{r+1} (both round-off there, so up to a floor), as the rank rule needs.
    params, inputs = _point(spec, seed=7, n_inputs=4 + count(spec).total // 30, seq_len=6)
    decision = structured.certify_structured(params, inputs, spec, gauge=gauge)
    assert decision is not None and decision.clear
    t = torch.linalg.svdvals(_dense(spec, params, inputs))
    t = t / t[0]
    r = decision.rank
    assert decision.smallest_kept <= float(t[r - 1])
    if r < t.numel():
        assert max(decision.largest_dropped, 1e-14) >= float(t[r])


@pytest.mark.parametrize("gauge", [True, False])
def test_both_factorisations_certify_and_a_missing_orbit_direction_is_caught(gauge: bool) -> None:
    spec = AttentionSpec.create(8, 2, kv_heads=1, bias="qkvo")
    params, inputs = _point(spec, seed=3, n_inputs=12, seq_len=8)
    families = structured.orbit_families(params, spec)
    decision = structured.certify_structured(params, inputs, spec, families=families, gauge=gauge)
    assert decision is not None and decision.clear and decision.nullity == count(spec).unidentified
    # Claim one orbit direction fewer: that direction is null for J but neither deleted nor added to K,
    # so the factorisation must fail (the certificate cannot prove a rank the Jacobian does not have).
    short = [structured.OrbitFamily(f.support, f.basis[:, 1:]) if i == 0 else f for i, f in enumerate(families)]
    assert structured.certify_structured(params, inputs, spec, families=short, gauge=gauge) is None


def test_too_few_inputs_are_not_certified() -> None:
    # One input of three tokens cannot show the rank: the factorisation fails (the rows cap the rank).
    spec = AttentionSpec.create(8, 2)
    params, inputs = _point(spec, n_inputs=1, seq_len=3)
    for gauge in (True, False):
        assert structured.certify_structured(params, inputs, spec, gauge=gauge) is None


@pytest.mark.parametrize("spec", [AttentionSpec.create(8, 2, norm="sink", bias="qkvo"),
                                  AttentionSpec.create(8, 2, norm="sigmoid"),
                                  AttentionSpec.create(8, 2, qk_norm="shared")], ids=["sink", "sigmoid", "qk-norm"])
def test_uncovered_layouts_go_to_the_dense_route(spec: AttentionSpec) -> None:
    assert structured.covers(spec) is not None
    params, inputs = _point(spec)
    with pytest.raises(ValueError, match="does not cover"):
        structured.token_factors(params, inputs[0], spec)
    assert verify(spec, seed=1).decision.method in ("certificate", "svd")


def test_wider_layout_matches_its_count() -> None:
    # d = 16 with GQA, RoPE and biases: the structured route alone, checked against the exact count.
    spec = AttentionSpec.create(16, 4, kv_heads=2, rope_fraction=1.0, bias="qkvo", causal=True)
    result = verify(spec, seed=0)
    assert result.decision.method == "structured" and result.matches is True
