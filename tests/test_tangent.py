"""The closed-form invisible shares (attnid.train.tangent) against the spans route of training.invisible_shares.

The spans route orthonormalises every tangent direction of ``symmetry.labelled_tangent_directions``; the closed
form solves small Sylvester systems. Both must give the same share of the same update, at random points and at
degenerate ones (a silent head, a rank-deficient factor), for every supported layout; the unsupported ones are refused.
"""

from __future__ import annotations

import pytest
import torch

from attnid.layer import init_params
from attnid.spec import AttentionSpec
from attnid.train import tangent
from attnid.train.training import invisible_shares

LAYOUTS = {
    "mha-qkvo": AttentionSpec.create(d_model=6, heads=2, bias="qkvo"),
    "mha-none": AttentionSpec.create(d_model=6, heads=3),
    "gqa-qkvo": AttentionSpec.create(d_model=8, heads=4, kv_heads=2, bias="qkvo"),
    "gqa-qk": AttentionSpec.create(d_model=8, heads=4, kv_heads=2, bias="qk"),
    "wide-heads": AttentionSpec.create(d_model=4, heads=2, head_dim=3, v_head_dim=5, bias="kvo"),
    "mqa-vo": AttentionSpec.create(d_model=6, heads=3, kv_heads=1, bias="vo"),
}


def _silent_head(params):
    params["W_O"][0] = 0.0
    return params


def _low_rank_key(params):
    params["W_K"][0][:, 0] = params["W_K"][0][:, 1]
    return params


def _random_update(params, gen):
    return {k: torch.randn(p.shape, generator=gen, dtype=torch.float64) for k, p in params.items()}


@pytest.mark.parametrize("edit", [None, _silent_head, _low_rank_key], ids=["generic", "silent-head", "low-rank-key"])
@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_closed_form_matches_the_spans_route(name, edit):
    spec = LAYOUTS[name]
    gen = torch.Generator().manual_seed(7)
    params = init_params(spec, gen)
    if edit is not None:
        params = edit(params)
    for trial in range(3):
        update = _random_update(params, gen)
        if trial == 1:  # an update inside the tangent space plus a little noise: shares near 1
            from attnid.symmetry import labelled_tangent_directions
            dirs = [d for _, d in labelled_tangent_directions(params, spec)]
            weights = torch.randn(len(dirs), generator=gen, dtype=torch.float64)
            update = {k: sum(w * d[k] for w, d in zip(weights, dirs)) + 1e-3 * update[k] for k in params}
        want = invisible_shares(update, params, spec)
        got = tangent.shares(update, params, spec)
        assert set(got) == {k for k in want if "/" not in k}
        for key, value in got.items():
            assert value == pytest.approx(want[key], abs=1e-9), key


@pytest.mark.parametrize("spec, words", [
    (AttentionSpec.create(d_model=8, heads=2, rope_fraction=1.0), "RoPE"),
    (AttentionSpec.create(d_model=8, heads=2, bias="qkv"), "value bias without an output bias"),
    (AttentionSpec.create(d_model=8, heads=2, qk_norm="per-head"), "QK-norm"),
])
def test_unsupported_layouts_are_refused(spec, words):
    params = init_params(spec, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=words):
        tangent.shares(params, params, spec)


def test_zero_update_has_zero_shares():
    spec = LAYOUTS["mha-qkvo"]
    params = init_params(spec, torch.Generator().manual_seed(0))
    zero = {k: torch.zeros_like(p) for k, p in params.items()}
    assert set(tangent.shares(zero, params, spec).values()) == {0.0}
