"""The measurement code behind the training chapters: invisible shares, conserved quantities, balancing."""

from __future__ import annotations

import math

import pytest
import torch

from attnid import balancing as bal

from attnid import symmetry as sym
from attnid.train import training as T
from attnid.jacobian import flatten, unflatten
from attnid.layer import forward, init_params
from attnid.spec import AttentionSpec

LAYOUTS = [
    AttentionSpec.create(8, 2),
    AttentionSpec.create(8, 4, kv_heads=2, bias="qkvo"),
    AttentionSpec.create(8, 2, kv_heads=1, rope_fraction=0.5, bias="qkvo"),
    AttentionSpec.create(8, 2, rope_fraction=1.0, causal=True),
]


def moved_point(spec: AttentionSpec, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """A generic point away from balance: a random point moved by a random group element."""
    params = init_params(spec, gen)
    return sym.apply_group(params, spec, sym.random_group_element(spec, gen, scale=0.5))


@pytest.mark.parametrize("spec", LAYOUTS, ids=lambda s: s.describe())
def test_share_is_one_inside_the_tangent_space_and_zero_across(spec: AttentionSpec, gen: torch.Generator) -> None:
    params = moved_point(spec, gen)
    directions = sym.tangent_directions(params, spec)
    coeffs = torch.randn(len(directions), generator=gen, dtype=torch.float64)
    inside = sum(c * flatten(d) for c, d in zip(coeffs, directions, strict=True))
    shares = T.invisible_shares(unflatten(inside, params), params, spec)
    assert abs(shares["total"] - 1) < 1e-12
    basis = sym.orbit_tangent(params, spec)
    noise = torch.randn(basis.shape[0], generator=gen, dtype=torch.float64)
    _, across = sym.split_direction(noise, basis)
    shares = T.invisible_shares(unflatten(across, params), params, spec)
    assert all(v < 1e-12 for v in shares.values()), shares
    # one part alone: a value/output direction of group 0 has share 1 there and 0 in the query/key part
    label, direction = next((lab, d) for lab, d in sym.labelled_tangent_directions(params, spec) if lab == "value_output/0")
    shares = T.invisible_shares(direction, params, spec)
    assert abs(shares[label] - 1) < 1e-12 and shares["query_key/0"] < 1e-12


@pytest.mark.parametrize("spec", LAYOUTS, ids=lambda s: s.describe())
def test_balancing_keeps_the_function_and_zeroes_the_conserved_quantities(spec: AttentionSpec, gen: torch.Generator) -> None:
    params = moved_point(spec, gen)
    balanced = bal.balance(params, spec)
    x = torch.randn(3, 7, spec.d_model, generator=gen, dtype=torch.float64)
    y = forward(params, x, spec)
    assert (forward(balanced, x, spec) - y).abs().max() < 1e-12 * y.abs().max()
    c_qk, c_vo = bal.conserved_quantities(balanced, spec)
    assert c_qk.abs().max() < 1e-10 and c_vo.abs().max() < 1e-10
    before_qk, _ = bal.conserved_quantities(params, spec)
    assert before_qk.abs().max() > 1e-2  # the test point was not balanced to begin with
    assert T.squared_norm(balanced) < T.squared_norm(params)  # the balanced point has the least norm on the orbit
    assert T.squared_norm(bal.balance(balanced, spec)) == pytest.approx(T.squared_norm(balanced), rel=1e-12)


def test_balanced_point_is_the_least_norm_point_nearby(gen: torch.Generator) -> None:
    """Small moves along the orbit from the balanced point only add norm."""
    spec = LAYOUTS[0]
    balanced = bal.balance(moved_point(spec, gen), spec)
    for _ in range(5):
        nearby = sym.apply_group(balanced, spec, sym.random_group_element(spec, gen, scale=0.05))
        assert T.squared_norm(nearby) > T.squared_norm(balanced)


def test_conserved_quantities_are_invariant_under_gradient_flow_to_first_order(gen: torch.Generator) -> None:
    """d/dt C along -grad L is zero: C(theta - eps grad) - C(theta) = O(eps^2), for a real loss."""
    spec = LAYOUTS[2]
    problem = T.teacher_student(AttentionSpec.create(8, 2), spec, n_sequences=8)
    params = {n: p.requires_grad_() for n, p in problem.init(3).items()}
    problem.loss(params).backward()
    attn = {n.removeprefix("attn."): p.detach() for n, p in params.items()}
    grads = {n.removeprefix("attn."): p.grad for n, p in params.items()}
    c0 = bal.conserved_quantities(attn, spec)
    changes = []
    for eps in (1e-3, 1e-4):
        c1 = bal.conserved_quantities({n: attn[n] - eps * grads[n] for n in attn}, spec)
        changes.append(sum(float((b - a).norm()) for a, b in zip(c0, c1, strict=True)))
    assert changes[1] < changes[0] / 50  # quadratic in eps: a factor 10 in eps gives ~100 in the change


def test_exact_gradient_steps_have_no_invisible_part_and_keep_a_dead_key_bias() -> None:
    problem = T.teacher_student(AttentionSpec.create(8, 2), LAYOUTS[1], n_sequences=16)
    history = T.train(problem, optimiser="sgd", lr=0.3, steps=20, seed=1, measure_every=5)
    assert max(s["total"] for _, s in history.shares) < 1e-12
    assert max(abs(b - history.key_bias[0]) for b in history.key_bias) < 1e-13
    adam = T.train(problem, optimiser="adam", lr=0.01, steps=20, seed=1, measure_every=5)
    assert max(s["total"] for _, s in adam.shares) > 1e-3


def test_adamw_decays_a_dead_key_bias_geometrically() -> None:
    problem = T.teacher_student(AttentionSpec.create(8, 2), LAYOUTS[1], n_sequences=16)
    lr, wd, steps = 0.01, 0.5, 30
    history = T.train(problem, optimiser="adamw", lr=lr, steps=steps, seed=2, weight_decay=wd)
    start = float(T.attention_part(problem.init(2))["b_K"].norm())
    predicted = start * (1 - lr * wd) ** steps
    assert history.key_bias[-1] == pytest.approx(predicted, rel=1e-9)


def test_projected_updates_have_no_invisible_part() -> None:
    problem = T.teacher_student(AttentionSpec.create(8, 2), LAYOUTS[0], n_sequences=16)
    plain = T.train(problem, optimiser="adam", lr=0.01, steps=10, seed=1)
    projected = T.train(problem, optimiser="adam", lr=0.01, steps=10, seed=1, rebalance="project")
    assert plain.loss[1] != projected.loss[1]
    # the first projected update, measured again after the fact, has share ~0
    params = {n.removeprefix("attn."): p for n, p in problem.init(1).items()}
    step_one = T.train(problem, optimiser="adam", lr=0.01, steps=1, seed=1, rebalance="project").final
    update = {n: step_one["attn." + n] - params[n] for n in params}
    assert T.invisible_shares(update, params, problem.spec)["total"] < 1e-12


def test_bad_arguments_are_named() -> None:
    problem = T.teacher_student(AttentionSpec.create(8, 2), LAYOUTS[0], n_sequences=4)
    with pytest.raises(ValueError, match="optimiser must be one of"):
        T.train(problem, optimiser="lion", lr=0.1, steps=1, seed=0)
    with pytest.raises(ValueError, match="rebalance must be one of"):
        T.train(problem, optimiser="sgd", lr=0.1, steps=1, seed=0, rebalance="sometimes")
    with pytest.raises(ValueError, match="learning rate must be positive"):
        T.train(problem, optimiser="sgd", lr=0.0, steps=1, seed=0)
    with pytest.raises(ValueError, match="same d_model"):
        T.teacher_student(AttentionSpec.create(8, 2), AttentionSpec.create(16, 2))
    with pytest.raises(ValueError, match="causal"):
        T.copy_task(AttentionSpec.create(8, 2))


@pytest.mark.parametrize("spec", LAYOUTS, ids=lambda s: s.describe())
def test_gradients_transport_by_the_inverse_transpose_action(spec: AttentionSpec, gen: torch.Generator) -> None:
    # L(theta) = |f_theta(x) - y|^2; at g.theta the gradient is the transported gradient at theta.
    params = moved_point(spec, gen)
    element = sym.random_group_element(spec, gen, scale=0.5)
    x = torch.randn(2, 5, spec.d_model, generator=gen, dtype=torch.float64)
    y = torch.randn(2, 5, spec.d_model, generator=gen, dtype=torch.float64)

    def grad(point: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        point = {n: p.clone().requires_grad_() for n, p in point.items()}
        (forward(point, x, spec) - y).pow(2).sum().backward()
        return {n: p.grad for n, p in point.items()}

    moved = grad(sym.apply_group(params, spec, element))
    carried = T.transport_covector(grad(params), spec, element)
    for name in params:
        assert torch.allclose(moved[name], carried[name], rtol=1e-10, atol=1e-12), name


def test_balancing_with_transported_momentum_and_random_gradients() -> None:
    teacher, student = AttentionSpec.create(8, 2), AttentionSpec.create(8, 4)
    problem = T.teacher_student(teacher, student, seed=1, imbalance=3.0)
    for opt in ("momentum", "adam"):
        kept = T.train(problem, optimiser=opt, lr=0.01, steps=12, seed=1, rebalance="balance", balance_every=5)
        moved = T.train(problem, optimiser=opt, lr=0.01, steps=12, seed=1, rebalance="balance", balance_every=5,
                        transport_state=True)
        assert kept.loss[:6] == moved.loss[:6] and kept.loss[-1] != moved.loss[-1]
    # random gradients: seeded, and they do not descend the loss the way gradients do
    a = T.train(problem, optimiser="sgd", lr=0.01, steps=5, seed=2, gradient="random", measure_every=1)
    b = T.train(problem, optimiser="sgd", lr=0.01, steps=5, seed=2, gradient="random", measure_every=1)
    assert a.loss == b.loss and a.shares == b.shares
    assert min(s["total"] for _, s in a.shares) > 0.05  # an isotropic step has a share near sqrt(u/P), not 0
    with pytest.raises(ValueError, match="gradient must be one of"):
        T.train(problem, optimiser="sgd", lr=0.01, steps=1, seed=0, gradient="noise")


def test_a_balanced_run_whose_factors_collapsed_stops_as_diverged_instead_of_raising() -> None:
    # Found by the learning-rate sweep of experiments/rebalancing.ipynb: momentum far past its stability edge
    # blows the factors up until a Gram matrix is numerically singular at a balancing step.
    spec = AttentionSpec.create(4, 2)
    params = init_params(spec, torch.Generator().manual_seed(0), dtype=torch.float64)
    params["W_V"][..., 1] = params["W_V"][..., 0]  # two equal columns: the value factor has dependent columns
    with pytest.raises(bal.SingularGramError):
        bal.balancing_element(params, spec)
    teacher, student = AttentionSpec.create(8, 2), T.student_spec(8, [4, 4, 0.0, "none"])
    cpu = torch.device("cpu")
    problem = T.teacher_student(teacher, student, seed=3, dtype=torch.float64, device=cpu, backend="reference")
    h = T.train(problem, optimiser="momentum", lr=1.28, steps=200, seed=3, rebalance="balance", balance_every=25)
    assert h.diverged is not None and h.diverged % 25 == 24 and all(map(math.isfinite, h.loss))  # stopped by balancing
