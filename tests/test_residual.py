"""attnid.train.residual: turning the text model's residual stream about the ones vector changes nothing, and the
moves are independent of the embedding's own invariant directions."""

from __future__ import annotations

import pytest
import torch

from attnid.train import residual
from attnid.train import textmodel as tm


def _small_text_model(seed: int = 0, rope_fraction: float = 0.5):
    spec = tm.TextModelSpec.create(layers=2, d_model=8, heads=2, kv_heads=1, seq_len=12, rope_fraction=rope_fraction)
    params = tm.init_model(spec, torch.Generator().manual_seed(seed), torch.float64)
    tokens = torch.randint(0, 256, (3, 12), generator=torch.Generator().manual_seed(seed + 1))
    return spec, params, tokens


@pytest.mark.parametrize("rope_fraction", [0.5, 0.0])  # without RoPE the model has a position table
def test_turning_the_residual_stream_about_the_ones_vector_leaves_the_logits_unchanged(rope_fraction):
    spec, params, tokens = _small_text_model(rope_fraction=rope_fraction)
    assert ("pos" in params) == (rope_fraction == 0.0)
    q = residual.random_mean_fixing_rotation(8, torch.Generator().manual_seed(2))
    assert torch.allclose(q @ q.T, torch.eye(8, dtype=torch.float64), atol=1e-13)
    assert torch.allclose(q @ torch.ones(8, dtype=torch.float64), torch.ones(8, dtype=torch.float64), atol=1e-13)
    turned = residual.rotate_residual(params, q)
    assert (turned["embed"] - params["embed"]).abs().max() > 0.1  # the parameters did move
    before, after = tm.logits(params, tokens, spec), tm.logits(turned, tokens, spec)
    assert (before - after).abs().max() < 1e-10


def test_a_rotation_that_moves_the_ones_vector_changes_the_logits():
    spec, params, tokens = _small_text_model()
    q = torch.linalg.qr(torch.randn(8, 8, generator=torch.Generator().manual_seed(3), dtype=torch.float64))[0]
    after = tm.logits(residual.rotate_residual(params, q), tokens, spec)
    assert (tm.logits(params, tokens, spec) - after).abs().max() > 1e-3


def test_the_residual_rotations_are_independent_of_the_embeddings_own_directions():
    # tangent at q = I: E -> E A for skew A with A 1 = 0; the embedding's own invariant moves are E[x] + c 1
    _, params, _ = _small_text_model()
    d = 8
    e = params["embed"]
    ones = torch.full((d, 1), d**-0.5, dtype=torch.float64)
    rest = torch.linalg.qr(torch.cat([ones, torch.eye(d, dtype=torch.float64)[:, : d - 1]], 1))[0][:, 1:]
    moves = []
    for i in range(d - 1):
        for j in range(i + 1, d - 1):
            a = torch.zeros(d - 1, d - 1, dtype=torch.float64)
            a[i, j], a[j, i] = 1.0, -1.0
            moves.append((e @ rest @ a @ rest.T).reshape(-1))
    shifts = [torch.zeros_like(e).index_fill_(0, torch.tensor([x]), 1.0).reshape(-1) for x in range(e.shape[0])]
    rank = torch.linalg.matrix_rank(torch.stack(moves + shifts)).item()
    assert len(moves) == residual.rotation_dimension(d)
    assert rank == len(moves) + len(shifts)


def test_a_parameter_of_unknown_role_is_refused():
    _, params, _ = _small_text_model()
    with pytest.raises(ValueError, match="norm.gain"):
        residual.rotate_residual(params | {"layer0.norm.gain": torch.ones(8, dtype=torch.float64)}, torch.eye(8, dtype=torch.float64))
    with pytest.raises(ValueError, match="d_model >= 2"):
        residual.rotation_dimension(1)
