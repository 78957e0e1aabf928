"""Ball-arithmetic rank proofs (attnid.ballcert): the ball layer is the layer, true counts are proved, wrong ones not."""

from __future__ import annotations

import pytest

from attnid import ballcert
from attnid.counts import count
from attnid.spec import AttentionSpec

LAYOUTS = [  # small layouts of every feature the ball layer has: each compared with attnid.layer
    dict(d_model=4, heads=2),
    dict(d_model=4, heads=2, bias="qkvo", rope_fraction=1.0, causal=True),
    dict(d_model=4, heads=2, kv_heads=1, qk_norm="full", qk_norm_eps=0.0),
    dict(d_model=4, heads=2, qk_norm="shared", qk_norm_eps=1.0, rope_fraction=1.0, causal=True),
    dict(d_model=4, heads=2, qk_norm="per-head", qk_norm_eps=1.0, bias="qkv"),
    dict(d_model=4, heads=2, qk_norm="unweighted", qk_norm_eps=1.0),
    dict(d_model=4, heads=2, norm="sink", sink_learned=True, causal=True, bias="qkv"),
    dict(d_model=4, heads=2, norm="sigmoid", bias="qk", causal=True, window=3),
    dict(d_model=6, heads=2, head_dim=4, rope_fraction=0.5, causal=True, chunk=3),
]


@pytest.mark.parametrize("fields", LAYOUTS, ids=str)
def test_the_ball_layer_is_the_reference_layer(fields) -> None:
    assert ballcert.forward_error(AttentionSpec.create(**fields)) < 1e-13


WIDE_SINK = dict(d_model=3, heads=2, head_dim=5, v_head_dim=2, norm="sink", sink_learned=True, bias="qkv", causal=True)


@pytest.mark.parametrize("fields", [LAYOUTS[1], LAYOUTS[3], LAYOUTS[6], WIDE_SINK], ids=str)
def test_the_exact_count_is_proved(fields) -> None:
    spec = AttentionSpec.create(**fields)
    result = ballcert.certify(spec)
    assert result.proved and result.claimed == count(spec).unidentified
    assert result.rank_lower_bound == result.total - result.claimed and result.log10_det_low is not None


def test_a_count_one_too_small_is_not_proved() -> None:
    spec = AttentionSpec.create(4, 2, qk_norm="shared", qk_norm_eps=1.0, rope_fraction=1.0, causal=True)
    result = ballcert.certify(spec, claimed=count(spec).unidentified - 1)
    assert not result.rank_proved and not result.proved and result.rank_lower_bound is None


def test_a_missing_symmetry_generator_makes_the_proof_fail() -> None:
    spec = AttentionSpec.create(4, 2, bias="qkvo", rope_fraction=1.0, causal=True)
    result = ballcert.certify(spec, drop_orbit_directions=1)
    assert result.orbit == count(spec).unidentified - 1 and not result.proved


def test_qk_norm_eps_other_than_0_or_1_is_refused() -> None:
    with pytest.raises(ValueError, match="eps = 1 covers every eps > 0"):
        ballcert.certify(AttentionSpec.create(4, 2, qk_norm="shared", qk_norm_eps=1e-6))
