"""Symmetries leave the layer unchanged; other directions do not; the key bias is dead only where the theory says."""

import pytest
import torch

import attnid
from attnid import symmetry as sym
from attnid.counts import count
from attnid.jacobian import flatten, jacobian_matrix, unflatten
from attnid.layer import check_params, forward, init_params
from attnid.spec import AttentionSpec

SPECS = [
    AttentionSpec.create(8, 2, bias="qkvo"),
    AttentionSpec.create(8, 4, kv_heads=2, bias="qkv", rope_fraction=1.0, causal=True),
    AttentionSpec.create(8, 4, kv_heads=1, rope_dims=2),
    AttentionSpec.create(8, 1, head_dim=10, v_head_dim=8, bias="kv"),
    AttentionSpec.create(8, 2, bias="qkvo", norm="sink", sink_learned=True),
    AttentionSpec.create(6, 2, bias="v"),
    AttentionSpec.create(8, 2, bias="qkvo", norm="sigmoid", causal=True),
    AttentionSpec.create(3, 2, head_dim=5, v_head_dim=2, bias="qkv", norm="sink", sink_learned=True, causal=True),
]
IDS = [s.describe().replace(" ", ",") for s in SPECS]


def point(spec: AttentionSpec, gen: torch.Generator, n: int = 6):
    return init_params(spec, gen), torch.randn(3, n, spec.d_model, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_random_group_element_leaves_output_unchanged(spec: AttentionSpec, gen: torch.Generator) -> None:
    params, x = point(spec, gen)
    moved = sym.apply_group(params, spec, sym.random_group_element(spec, gen, scale=0.5))
    assert not torch.allclose(moved["W_Q"], params["W_Q"])
    torch.testing.assert_close(forward(moved, x, spec), forward(params, x, spec), rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_orbit_tangent_is_the_null_space(spec: AttentionSpec, gen: torch.Generator) -> None:
    params, _ = point(spec, gen)
    basis = sym.orbit_tangent(params, spec)
    assert basis.shape[1] == count(spec).unidentified
    inputs = [torch.randn(6, spec.d_model, generator=gen, dtype=torch.float64) for _ in range(4)]
    jac = jacobian_matrix(lambda p, x: forward(p, x, spec), params, inputs)
    assert float((jac @ basis).abs().max()) < 1e-10 * float(jac.abs().max())


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_direction_off_the_orbit_changes_the_output(spec: AttentionSpec, gen: torch.Generator) -> None:
    params, x = point(spec, gen)
    basis = sym.orbit_tangent(params, spec)
    along, across = sym.split_direction(torch.randn(basis.shape[0], generator=gen, dtype=torch.float64), basis)
    assert float((basis.T @ across).abs().max()) < 1e-12
    nudged = unflatten(flatten(params) + 1e-4 * across / across.norm(), params)
    assert float((forward(nudged, x, spec) - forward(params, x, spec)).abs().max()) > 1e-8
    # and a move along the orbit changes the output only to second order
    slid = unflatten(flatten(params) + 1e-4 * along / along.norm(), params)
    assert float((forward(slid, x, spec) - forward(params, x, spec)).abs().max()) < 1e-6


def key_bias_gradients(spec: AttentionSpec, gen: torch.Generator) -> tuple[float, float]:
    params, x = point(spec, gen)
    params = {k: v.requires_grad_() for k, v in params.items()}
    forward(params, x, spec).pow(2).sum().backward()
    return float(params["b_K"].grad.abs().max()), float(params["b_Q"].grad.abs().max())


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("heads", "kv"), [(1, 1), (4, 4), (4, 2)])
def test_key_bias_gradient_vanishes_under_softmax(causal: bool, heads: int, kv: int, gen: torch.Generator) -> None:
    k_grad, q_grad = key_bias_gradients(AttentionSpec.create(8, heads, kv_heads=kv, bias="qkvo", causal=causal), gen)
    assert q_grad > 1e-3
    assert k_grad < 1e-13 * q_grad


@pytest.mark.parametrize(
    "spec",
    [
        AttentionSpec.create(8, 2, bias="qkvo", norm="sink"),
        AttentionSpec.create(8, 2, bias="qkvo", norm="sigmoid"),
        AttentionSpec.create(8, 2, bias="qkvo", rope_fraction=1.0),
    ],
    ids=["sink", "sigmoid", "rope-after-bias"],
)
def test_key_bias_gradient_lives_elsewhere(spec: AttentionSpec, gen: torch.Generator) -> None:
    k_grad, q_grad = key_bias_gradients(spec, gen)
    assert k_grad > 1e-3 * q_grad


def test_bias_moves_are_invisible_under_softmax(gen: torch.Generator) -> None:
    spec = AttentionSpec.create(8, 4, kv_heads=2, bias="qkvo", rope_dims=2)
    params, x = point(spec, gen)
    delta_k = torch.randn(2, 2, generator=gen, dtype=torch.float64)
    delta_k[:, :2] = 0.0  # rope_dims = 2 = head_dim: nothing to shift except zeros
    y = forward(params, x, spec)
    torch.testing.assert_close(forward(sym.shift_key_bias(params, spec, delta_k), x, spec), y)
    moved = sym.trade_value_bias(params, spec, torch.randn(2, 2, generator=gen, dtype=torch.float64))
    assert not torch.allclose(moved["b_O"], params["b_O"])
    torch.testing.assert_close(forward(moved, x, spec), y, rtol=1e-12, atol=1e-12)


def test_bias_moves_are_refused_where_they_are_not_symmetries(gen: torch.Generator) -> None:
    sink = AttentionSpec.create(8, 2, bias="qkvo", norm="sink")
    params, _ = point(sink, gen)
    with pytest.raises(ValueError, match="only under plain softmax"):
        sym.shift_key_bias(params, sink, torch.zeros(2, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="only under plain softmax"):
        sym.trade_value_bias(params, sink, torch.zeros(2, 4, dtype=torch.float64))
    rope = AttentionSpec.create(8, 2, bias="qkv", rope_fraction=0.5)
    params, _ = point(rope, gen)
    with pytest.raises(ValueError, match="unrotated coordinates"):
        sym.shift_key_bias(params, rope, torch.ones(2, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="needs both a value bias and an output bias"):
        sym.trade_value_bias(params, rope, torch.zeros(2, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="no key bias"):
        spec = AttentionSpec.create(8, 2)
        sym.shift_key_bias(init_params(spec, gen), spec, torch.zeros(2, 4, dtype=torch.float64))


def test_non_commuting_matrix_is_not_a_rope_symmetry(gen: torch.Generator) -> None:
    spec = AttentionSpec.create(8, 2, rope_fraction=1.0)
    params, _ = point(spec, gen)
    element = sym.random_group_element(spec, gen)
    assert all(sym.in_commutant(m, spec) for m in element.query_key)
    generic = torch.eye(4, dtype=torch.float64) + 0.3 * torch.randn(2, 4, 4, generator=gen, dtype=torch.float64)
    assert not sym.in_commutant(generic[0], spec)
    with pytest.raises(ValueError, match="does not commute with the RoPE rotations"):
        sym.apply_group(params, spec, sym.GroupElement(generic, element.value_output))
    with pytest.raises(ValueError, match="must be invertible"):
        sym.apply_group(params, spec, sym.GroupElement(torch.zeros(2, 4, 4, dtype=torch.float64), element.value_output))
    with pytest.raises(ValueError, match="needs shapes"):
        sym.apply_group(params, spec, sym.GroupElement(element.query_key[:1], element.value_output))


def test_head_permutations(gen: torch.Generator) -> None:
    spec = AttentionSpec.create(8, 4, kv_heads=2, bias="qkvo", norm="sink", sink_learned=True)
    params, x = point(spec, gen)
    y = forward(params, x, spec)
    for perm in ([1, 0, 2, 3], [2, 3, 0, 1], [3, 2, 1, 0]):
        torch.testing.assert_close(forward(sym.permute_heads(params, spec, perm), x, spec), y)
    with pytest.raises(ValueError, match="splits a key/value group"):
        sym.permute_heads(params, spec, [0, 2, 1, 3])
    with pytest.raises(ValueError, match="must be a permutation"):
        sym.permute_heads(params, spec, [0, 0, 1, 2])


def test_identical_heads_are_a_non_generic_point(gen: torch.Generator) -> None:
    # Two equal heads: their sum is what the function sees, so the fiber is larger than at a generic point.
    spec = AttentionSpec.create(8, 2)
    params, _ = point(spec, gen)
    for name in ("W_Q", "W_K", "W_V", "W_O"):
        params[name][1] = params[name][0]
    inputs = [torch.randn(6, 8, generator=gen, dtype=torch.float64) for _ in range(12)]
    decision = attnid.functional_rank(lambda p, x: forward(p, x, spec), params, inputs).require_clear()
    assert decision.nullity > count(spec).unidentified


def test_check_params_names_the_problem(gen: torch.Generator) -> None:
    spec = AttentionSpec.create(8, 2, bias="qk")
    params, x = point(spec, gen)
    check_params(params, spec)
    with pytest.raises(ValueError, match=r"missing \['b_K'\]"):
        check_params({k: v for k, v in params.items() if k != "b_K"}, spec)
    with pytest.raises(ValueError, match=r"W_Q has shape \(2, 8, 3\)"):
        check_params(dict(params, W_Q=torch.zeros(2, 8, 3, dtype=torch.float64)), spec)
    bad = dict(params, W_V=params["W_V"].clone())
    bad["W_V"][0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="W_V contains NaN"):
        check_params(bad, spec)
    with pytest.raises(ValueError, match="does not match d_model"):
        forward(params, x[..., :5], spec)
    with pytest.raises(ValueError, match="direction must be a vector"):
        sym.split_direction(torch.zeros(3, dtype=torch.float64), torch.zeros(5, 1, dtype=torch.float64))


@pytest.mark.parametrize("causal", [False, True])
def test_key_bias_shift_is_dead_only_on_unrotated_coordinates(causal: bool, gen: torch.Generator) -> None:
    """A non-zero key-bias shift is invisible exactly where the theory says.

    Under plain softmax, b_K adds q_i . b_K to every score of row i, the same for each key j, and a
    softmax ignores a constant added to a row. RoPE applied after the bias rotates b_K by a
    position-dependent angle, so on the rotated coordinates the added term depends on the key's
    position and is no longer constant along the row. (The older test used head_dim == rope_dims,
    where the only allowed shift is the zero vector, so it proved nothing.)
    """

    def relative_change(p_new: dict, p_old: dict, x: torch.Tensor, spec: AttentionSpec) -> float:
        y = forward(p_old, x, spec)
        return float((forward(p_new, x, spec) - y).abs().max() / y.abs().max())

    spec = AttentionSpec.create(8, 2, bias="qkvo", rope_fraction=0.5, causal=causal)
    r, dk = spec.rope_dims, spec.head_dim
    assert 0 < r < dk
    params, x = point(spec, gen)
    assert params["b_K"].dtype == x.dtype == torch.float64
    delta = torch.zeros(spec.kv_heads, dk, dtype=torch.float64)
    delta[:, r:] = torch.randn(spec.kv_heads, dk - r, generator=gen, dtype=torch.float64)
    assert float(delta.norm()) > 0.1
    assert relative_change(sym.shift_key_bias(params, spec, delta), params, x, spec) < 1e-12
    # the same-size shift moved onto the rotated coordinates (shift_key_bias refuses it, so add it directly)
    rotated = torch.zeros_like(delta)
    rotated[:, : dk - r] = delta[:, r:]
    assert float(rotated.norm()) == pytest.approx(float(delta.norm()))
    assert relative_change(dict(params, b_K=params["b_K"] + rotated), params, x, spec) > 1e-6
    # no RoPE at all: every coordinate of b_K is dead, so a full random shift changes nothing
    plain = AttentionSpec.create(8, 2, bias="qkvo", causal=causal)
    params, x = point(plain, gen)
    full = torch.randn(plain.kv_heads, plain.head_dim, generator=gen, dtype=torch.float64)
    assert float(full.norm()) > 0.1
    assert relative_change(sym.shift_key_bias(params, plain, full), params, x, plain) < 1e-12


def test_the_sink_corner_trade_is_generated_exactly_where_it_is_counted(gen: torch.Generator) -> None:
    wide = AttentionSpec.create(3, 2, head_dim=5, v_head_dim=2, bias="qkv", norm="sink", sink_learned=True)
    for spec, expected in ((wide, 2), (AttentionSpec.create(8, 2, bias="qkv", norm="sink", sink_learned=True), 0),
                           (AttentionSpec.create(3, 2, head_dim=5, v_head_dim=2, bias="kv", norm="sink", sink_learned=True), 0)):
        labels = [label for label, _ in sym.labelled_tangent_directions(init_params(spec, gen), spec)]
        assert sum(label.startswith("sink_corner/") for label in labels) == expected
    params = init_params(wide, gen)
    direction = dict(sym.labelled_tangent_directions(params, wide))["sink_corner/1"]
    assert direction["W_Q"].abs().max() == 0 and direction["b_Q"][0].abs().max() == 0
    torch.testing.assert_close(direction["b_Q"][1] @ params["W_K"][1].T, torch.zeros(3, dtype=torch.float64), atol=1e-13, rtol=0)
    assert abs(float(direction["b_Q"][1] @ params["b_K"][1]) - 1) < 1e-13
