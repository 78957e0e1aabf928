"""Chapter 1's models: the exact counts against the numeric nullity, and the symmetry itself."""

import random

import pytest
import torch

import attnid
from attnid import toy


def random_shapes(n: int, seed: int, largest: int = 7) -> list[tuple[int, int, int]]:
    rng = random.Random(seed)
    return [(rng.randint(1, largest), rng.randint(1, largest), rng.randint(1, largest)) for _ in range(n)]


@pytest.mark.parametrize("shape", random_shapes(40, seed=2026))
def test_exact_count_equals_numeric_nullity(shape: tuple[int, int, int], gen: torch.Generator) -> None:
    count = toy.FactoredCount(*shape)
    params = toy.random_factored_params(count, gen)
    inputs = toy.random_inputs(3, shape[0] + 2, shape[0], gen)
    decision = attnid.functional_rank(toy.factored_linear, params, inputs).require_clear()
    assert decision.nullity == count.unidentified
    assert decision.n_params == count.total


@pytest.mark.parametrize("shape", [(3, 1, 4), (5, 2, 5), (6, 3, 4), (7, 7, 7)])
def test_unsaturated_count_is_k_squared(shape: tuple[int, int, int]) -> None:
    count = toy.FactoredCount(*shape)
    assert count.unidentified == shape[1] ** 2


def test_saturated_count_matches_the_claims_edge_case() -> None:
    # the paper's claim C3 (our reading of it): a head wider than the model, d_k = 10 > d = 8, has 2 d d_k - d^2 = 96.
    assert toy.FactoredCount(8, 10, 8).unidentified == 2 * 8 * 10 - 8**2


def test_group_action_leaves_the_function_unchanged(gen: torch.Generator) -> None:
    count = toy.FactoredCount(5, 3, 4)
    params = toy.random_factored_params(count, gen)
    x = toy.random_inputs(1, 6, 5, gen)[0]
    m = torch.randn(3, 3, generator=gen, dtype=torch.float64) + 3 * torch.eye(3, dtype=torch.float64)
    moved = {"A": params["A"] @ m, "B": torch.linalg.solve(m, params["B"])}
    torch.testing.assert_close(toy.factored_linear(moved, x), toy.factored_linear(params, x), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(moved["A"], params["A"])


def test_non_symmetry_direction_changes_the_function(gen: torch.Generator) -> None:
    count = toy.FactoredCount(5, 3, 4)
    params = toy.random_factored_params(count, gen)
    x = toy.random_inputs(1, 6, 5, gen)[0]
    nudged = {"A": params["A"] + 1e-3 * torch.randn(5, 3, generator=gen, dtype=torch.float64), "B": params["B"]}
    change = (toy.factored_linear(nudged, x) - toy.factored_linear(params, x)).abs().max()
    assert change > 1e-6


def test_product_model_has_one_unidentified_direction(gen: torch.Generator) -> None:
    params = {"a": torch.tensor(1.3, dtype=torch.float64), "b": torch.tensor(-0.7, dtype=torch.float64)}
    inputs = [torch.randn(4, generator=gen, dtype=torch.float64)]
    d = attnid.functional_rank(toy.product, params, inputs).require_clear()
    assert (d.n_params, d.rank, d.nullity) == (2, 1, 1)


@pytest.mark.parametrize("bad", [(0, 1, 1), (1, -2, 1), (1, 1, 2.5)])
def test_invalid_shapes_are_rejected(bad: tuple) -> None:
    with pytest.raises(ValueError, match="must be a positive integer"):
        toy.FactoredCount(*bad)


def test_invalid_input_sizes_are_rejected(gen: torch.Generator) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        toy.random_inputs(0, 3, 3, gen)


@pytest.mark.parametrize("shape", [(a, k, b) for a in range(1, 5) for k in range(1, 6) for b in range(1, 5)])
def test_orbit_dimension_is_the_rank_of_the_orbit_tangent(shape: tuple[int, int, int]) -> None:
    # The GL(k) orbit's tangent at (A, B) is {(A N, -N B)}: its dimension, measured as a numeric rank at a
    # random point, is what FactoredCount.orbit_dimension states; the rest of the fibre is beyond_orbit >= 0.
    from attnid.rank import numerical_rank

    count = toy.FactoredCount(*shape)
    gen = torch.Generator().manual_seed(sum(shape) * 31 + shape[1])
    a = torch.randn(shape[0], shape[1], generator=gen, dtype=torch.float64)
    b = torch.randn(shape[1], shape[2], generator=gen, dtype=torch.float64)
    columns = []
    for i in range(shape[1]):
        for j in range(shape[1]):
            n = torch.zeros(shape[1], shape[1], dtype=torch.float64)
            n[i, j] = 1.0
            columns.append(torch.cat([(a @ n).reshape(-1), (-n @ b).reshape(-1)]))
    tangent = torch.stack(columns, dim=1)
    assert numerical_rank(torch.linalg.svdvals(tangent)) == count.orbit_dimension
    assert count.beyond_orbit >= 0
    assert (count.beyond_orbit > 0) == (min(shape[0], shape[2]) < shape[1] < max(shape[0], shape[2]))
