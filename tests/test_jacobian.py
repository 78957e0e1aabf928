"""The Jacobian engine against finite differences, between modes, and the QR fold against a plain SVD."""

import pytest
import torch

import attnid
from attnid import toy
from attnid.jacobian import flatten, input_jacobian, jacobian_matrix, unflatten


def factored_point(gen: torch.Generator, shape: tuple[int, int, int] = (4, 2, 3)):
    count = toy.FactoredCount(*shape)
    return count, toy.random_factored_params(count, gen), toy.random_inputs(3, 5, shape[0], gen)


def test_flatten_roundtrip(gen: torch.Generator) -> None:
    _, params, _ = factored_point(gen)
    back = unflatten(flatten(params), params)
    assert list(back) == list(params)
    for name in params:
        assert torch.equal(back[name], params[name])
    with pytest.raises(ValueError, match="the parameters need"):
        unflatten(torch.zeros(3, dtype=torch.float64), params)


def test_jacobian_matches_central_differences(gen: torch.Generator) -> None:
    _, params, inputs = factored_point(gen)
    jac = jacobian_matrix(toy.factored_linear, params, inputs)
    theta = flatten(params)
    h = 1e-6
    for j in range(theta.numel()):
        e = torch.zeros_like(theta)
        e[j] = h
        plus = torch.cat([toy.factored_linear(unflatten(theta + e, params), x).reshape(-1) for x in inputs])
        minus = torch.cat([toy.factored_linear(unflatten(theta - e, params), x).reshape(-1) for x in inputs])
        torch.testing.assert_close(jac[:, j], (plus - minus) / (2 * h), rtol=1e-6, atol=1e-8)


def test_forward_and_reverse_modes_agree(gen: torch.Generator) -> None:
    _, params, inputs = factored_point(gen, (5, 3, 2))
    fwd = input_jacobian(toy.factored_linear, params, inputs[0], "forward")
    rev = input_jacobian(toy.factored_linear, params, inputs[0], "reverse")
    torch.testing.assert_close(fwd, rev, rtol=1e-12, atol=1e-12)


def test_qr_fold_keeps_the_singular_values(gen: torch.Generator) -> None:
    _, params, inputs = factored_point(gen, (6, 4, 5))
    direct = torch.linalg.svdvals(jacobian_matrix(toy.factored_linear, params, inputs))
    folded = attnid.functional_rank(toy.factored_linear, params, inputs).singular_values
    torch.testing.assert_close(folded[: direct.numel()], direct, rtol=1e-10, atol=1e-12 * float(direct[0]))


def test_bad_inputs_are_rejected(gen: torch.Generator) -> None:
    _, params, inputs = factored_point(gen)
    with pytest.raises(ValueError, match="at least one input"):
        attnid.functional_rank(toy.factored_linear, params, [])
    with pytest.raises(ValueError, match="at least one input"):
        jacobian_matrix(toy.factored_linear, params, [])
    bad = dict(params, A=params["A"].clone())
    bad["A"][0, 0] = float("nan")
    with pytest.raises(ValueError, match="parameter 'A' contains NaN"):
        attnid.functional_rank(toy.factored_linear, bad, inputs)
    poisoned = [inputs[0].clone()]
    poisoned[0][1, 1] = float("inf")
    with pytest.raises(ValueError, match="input 0 contains NaN or inf"):
        jacobian_matrix(toy.factored_linear, params, poisoned)
    with pytest.raises(ValueError, match="mode must be"):
        input_jacobian(toy.factored_linear, params, inputs[0], "sideways")  # type: ignore[arg-type]
