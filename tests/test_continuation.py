"""attnid.continuation: the complex scores continue the layer's, and the pole conditions are measured, not assumed."""

from __future__ import annotations

import math

import pytest
import torch

from attnid.continuation import branch_points, pole_margins, scores
from attnid.layer import forward, init_params
from attnid.normalise import attention_weights
from attnid.spec import AttentionSpec

LAYOUTS = [
    AttentionSpec.create(8, 4, kv_heads=2, qk_norm="shared", qk_norm_eps=1e-6, bias="qkvo", rope_fraction=1.0, causal=True),
    AttentionSpec.create(8, 2, qk_norm="full", qk_norm_eps=0.0, bias="qkv", rope_fraction=0.5),
    AttentionSpec.create(6, 3, kv_heads=1, qk_norm="unweighted", qk_norm_eps=0.3),
    AttentionSpec.create(8, 2, qk_norm="per-head", qk_norm_eps=1e-3, norm="sink", sink_learned=True, bias="qkv"),
]


def _draw(spec: AttentionSpec, seed: int) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    params = init_params(spec, gen)
    u, v = torch.randn(2, spec.d_model, generator=gen, dtype=torch.float64)
    return params, u, v


@pytest.mark.parametrize("spec", LAYOUTS, ids=lambda s: s.label())
def test_real_inputs_give_the_layers_scores(spec: AttentionSpec) -> None:
    params, _, _ = _draw(spec, 1)
    x = torch.randn(5, spec.d_model, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    s = scores(params, x.to(torch.complex128), spec)
    assert s.imag.abs().max() < 1e-13
    weights = attention_weights(s.real, norm=spec.norm, causal=spec.causal, sink=params.get("sink"))
    values = torch.einsum("nd,gdv->gnv", x, params["W_V"]) + params.get("b_V", torch.zeros(1, spec.v_head_dim))[:, None]
    groups = torch.tensor([spec.group_of_head(h) for h in range(spec.heads)])
    y = torch.einsum("hnv,hvd->nd", weights @ values[groups], params["W_O"]) + params.get("b_O", 0.0)
    assert torch.allclose(y, forward(params, x, spec), atol=1e-12, rtol=0)


@pytest.mark.parametrize("spec", LAYOUTS, ids=lambda s: s.label())
def test_the_branch_points_are_non_real_roots_of_the_mean_square(spec: AttentionSpec) -> None:
    params, u, v = _draw(spec, 3)
    roots = branch_points(params, spec, u, v)
    assert len(roots) == (1 if spec.qk_norm == "full" else spec.kv_heads) and (roots.imag > 0).all()
    key = torch.einsum("d,gdk->gk", u, params["W_K"]) + params.get("b_K", 0.0)
    nu = torch.einsum("d,gdk->gk", v, params["W_K"])
    rows = [(key.reshape(-1), nu.reshape(-1))] if spec.qk_norm == "full" else list(zip(key, nu))
    for root, (k, n) in zip(roots, rows):
        z = k.to(torch.complex128) + root * n
        assert abs((z * z).sum() / len(z) + spec.qk_norm_eps) < 1e-12 * (1 + (k * k).sum().item())


@pytest.mark.parametrize("spec", LAYOUTS, ids=lambda s: s.label())
def test_a_random_point_meets_every_condition(spec: AttentionSpec) -> None:
    params, u, v = _draw(spec, 4)
    m = pole_margins(params, spec, u, v)
    assert min(m.root_imag, m.root_gap, m.laurent_min, m.ratio_imag) > 1e-6
    assert m.laurent_drift < 1e-3  # |tau s_h| converges: a simple pole, b_h != 0
    assert (m.root_gap == math.inf) == (spec.qk_norm == "full" or spec.kv_heads == 1)


def test_copied_weights_break_the_conditions() -> None:
    spec = LAYOUTS[0]
    params, u, v = _draw(spec, 5)
    params["W_Q"][1] = params["W_Q"][0]
    params["b_Q"][1] = params["b_Q"][0]
    params["W_K"][1] = params["W_K"][0]
    params["b_K"][1] = params["b_K"][0]
    m = pole_margins(params, spec, u, v)
    assert m.ratio_imag < 1e-12 and m.root_gap < 1e-12 and m.laurent_min > 1e-3


def test_a_layout_without_a_norm_is_refused() -> None:
    spec = AttentionSpec.create(8, 2)
    params, u, v = _draw(spec, 6)
    with pytest.raises(ValueError, match="QK-norm"):
        pole_margins(params, spec, u, v)
