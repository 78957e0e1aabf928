"""Direct tests of the two leaf modules everything shares: rope.py and normalise.py, against independent formulas."""

from __future__ import annotations

import math

import pytest
import torch

from attnid.normalise import (additive_mask, attention_weights, causal_mask, chunk_mask, rms_normalise,
                              window_mask)
from attnid.rope import apply_rope, rope_tables

GEN = torch.Generator().manual_seed(11)


def _rotate_pairs_by_hand(x: torch.Tensor, r: int, base: float) -> torch.Tensor:
    """Row p, pair (i, i + r/2): multiply x_i + i x_{i + r/2} by exp(i p base^(-2i/r)), one complex number at a time."""
    out = x.clone()
    for p in range(x.shape[-2]):
        for i in range(r // 2):
            angle = p * base ** (-2 * i / r)
            z = complex(float(x[p, i]), float(x[p, i + r // 2])) * complex(math.cos(angle), math.sin(angle))
            out[p, i], out[p, i + r // 2] = z.real, z.imag
    return out


@pytest.mark.parametrize(("r", "base"), [(2, 10000.0), (4, 500000.0), (6, 1.5)])
def test_rope_rotates_each_pair_by_its_angle_and_leaves_the_rest(r: int, base: float) -> None:
    x = torch.randn(5, 8, generator=GEN, dtype=torch.float64)
    got = apply_rope(x, r, base)
    assert torch.allclose(got, _rotate_pairs_by_hand(x, r, base), atol=1e-14, rtol=0)
    assert torch.equal(got[:, r:], x[:, r:]) and torch.equal(apply_rope(x, 0, base), x)


def test_rope_keeps_norms_and_scores_depend_only_on_the_offset() -> None:
    q, k = (torch.randn(1, 8, generator=GEN, dtype=torch.float64).expand(6, 8) for _ in range(2))
    rq, rk = apply_rope(q, 8, 100.0), apply_rope(k, 8, 100.0)
    assert torch.allclose(rq.norm(dim=-1), q.norm(dim=-1), atol=1e-14)
    scores = rq @ rk.T  # the same q and k at every position: score(p, s) depends on p - s only
    for offset in range(-4, 5):
        diagonal = torch.diagonal(scores, offset)
        assert torch.allclose(diagonal, diagonal[:1].expand_as(diagonal), atol=1e-13)


def test_rope_tables_are_computed_in_float64_for_every_dtype() -> None:
    cos64, sin64 = rope_tables(7, 4, 10000.0, torch.float64, "cpu")
    cos32, sin32 = rope_tables(7, 4, 10000.0, torch.float32, "cpu")
    assert torch.equal(cos32, cos64.float()) and torch.equal(sin32, sin64.float())
    assert cos64.shape == (7, 4) and torch.equal(cos64[:, :2], cos64[:, 2:])


def test_the_masks_hide_exactly_the_keys_their_rules_name() -> None:
    n = 7
    for i in range(n):
        for j in range(n):
            assert bool(causal_mask(n, "cpu")[i, j]) == (j > i)
            assert bool(window_mask(n, 3, "cpu")[i, j]) == (not i - 3 < j <= i)
            assert bool(chunk_mask(n, 3, "cpu")[i, j]) == (j > i or j // 3 != i // 3)
    additive = additive_mask(causal_mask(3, "cpu"), torch.float32)
    assert additive.dtype == torch.float32 and additive.tolist() == [[0, -math.inf, -math.inf], [0, 0, -math.inf], [0, 0, 0]]


def test_a_rectangular_causal_mask_aligns_the_queries_to_the_end_of_the_keys() -> None:
    """3 new queries after 4 cached keys: query i sits at position i + 4 and sees keys 0..i + 4."""
    mask = causal_mask(3, "cpu", 7)
    assert mask.shape == (3, 7)
    assert [[bool(mask[i, j]) for j in range(7)] for i in range(3)] == [[j > i + 4 for j in range(7)] for i in range(3)]
    weights = attention_weights(torch.zeros(3, 7), norm="softmax", causal=True)
    assert torch.equal(weights[0, :5], torch.full((5,), 0.2)) and torch.equal(weights[2], torch.full((7,), 1 / 7))


def test_attention_weights_follow_their_formulas() -> None:
    s = torch.randn(2, 5, 5, generator=GEN, dtype=torch.float64)
    sink = torch.tensor([0.3, -1.2], dtype=torch.float64)
    e = s.exp()
    hidden = causal_mask(5, "cpu")
    causal = e.masked_fill(hidden, 0.0)
    assert torch.allclose(attention_weights(s, norm="softmax", causal=True), causal / causal.sum(-1, keepdim=True))
    expected_sink = e / (e.sum(-1, keepdim=True) + sink.exp()[:, None, None])
    assert torch.allclose(attention_weights(s, norm="sink", causal=False, sink=sink), expected_sink)
    assert torch.allclose(attention_weights(s, norm="sigmoid", causal=True), (1 / (1 + (-s).exp())).masked_fill(hidden, 0))
    with pytest.raises(ValueError, match="needs causal=True"):
        attention_weights(s, norm="softmax", causal=False, window=2)


def test_rms_normalise_divides_by_the_root_mean_square() -> None:
    z = torch.randn(3, 4, 6, generator=GEN, dtype=torch.float64)
    by_hand = z / ((z**2).mean(-1, keepdim=True) + 1e-3).sqrt()
    assert torch.allclose(rms_normalise(z, 1e-3), by_hand, atol=1e-15)
    over_two = z / ((z**2).mean(dim=(-3, -1), keepdim=True)).sqrt()
    assert torch.allclose(rms_normalise(z, 0.0, (-3, -1)), over_two, atol=1e-15)
