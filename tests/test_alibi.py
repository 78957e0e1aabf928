"""ALiBi (attnid.families.alibi): the slopes, the forward, the symmetries it keeps, and count = float64 Jacobian nullity."""

from __future__ import annotations

import pytest
import torch

from attnid.families import alibi
from attnid import counts, layer, symmetry
from attnid.families.alibi import AlibiSpec
from attnid.spec import AttentionSpec

LAYOUTS = [
    dict(d_model=6, heads=2, causal=True),
    dict(d_model=8, heads=4, bias="qkvo", causal=True),
    dict(d_model=8, heads=4, kv_heads=2, bias="qkv", causal=True),
    dict(d_model=6, heads=3, kv_heads=1, bias="kv", causal=True),
    dict(d_model=6, heads=2, bias="qkvo"),
    dict(d_model=8, heads=2, bias="qkvo", causal=True, window=3),
    dict(d_model=4, heads=1, head_dim=6, v_head_dim=2, bias="qk", causal=True),
    dict(d_model=6, heads=3, bias="vo", causal=True),
]


@pytest.mark.parametrize("fields", LAYOUTS, ids=str)
def test_the_count_is_the_one_without_alibi_and_the_jacobian_agrees(fields) -> None:
    spec = AlibiSpec(AttentionSpec.create(**fields))
    result = alibi.verify(spec, seq_len=5)
    assert result.decision.clear and result.matches and result.exact == counts.count(spec.base).unidentified
    assert result.orbit == result.exact and result.orbit_stretch < 1e-12


def test_slopes_follow_press_et_al() -> None:
    assert alibi.slopes(8) == [2.0**-k for k in range(1, 9)]
    assert alibi.slopes(4) == [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8]
    # 6 heads: the 4-head slopes, then the 1st and 3rd of the 8-head slopes
    assert alibi.slopes(6) == [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]


def _point(spec: AlibiSpec, n: int = 6):
    gen = torch.Generator().manual_seed(0)
    return alibi.init_params(spec, gen), torch.randn(2, n, spec.d_model, generator=gen, dtype=torch.float64)


def test_one_token_and_the_offsets() -> None:
    spec = AlibiSpec(AttentionSpec.create(8, 4, bias="qkvo", causal=True))
    params, x = _point(spec, 1)
    assert torch.allclose(alibi.forward(params, x, spec), layer.forward(params, x, spec.base), rtol=0, atol=1e-14)
    bias = alibi.position_bias(spec, 3, torch.float64, "cpu")
    assert bias[0, 2, 0] == -0.25 * 2 and bias[3, 1, 0] == -(2.0**-8) and bias[1, 1, 1] == 0  # slopes 2^-2 .. 2^-8
    params, x = _point(spec)
    assert (alibi.forward(params, x, spec) - layer.forward(params, x, spec.base)).abs().max() > 1e-3


def test_the_moves_of_the_layout_without_alibi_keep_the_function() -> None:
    spec = AlibiSpec(AttentionSpec.create(8, 4, kv_heads=2, bias="qkvo", causal=True))
    params, x = _point(spec)
    gen = torch.Generator().manual_seed(5)
    moved = symmetry.apply_group(params, spec.base, symmetry.random_group_element(spec.base, gen, scale=0.5))
    moved = symmetry.shift_key_bias(moved, spec.base, torch.randn(2, 2, generator=gen, dtype=torch.float64))
    y = alibi.forward(params, x, spec)
    assert torch.allclose(alibi.forward(moved, x, spec), y, rtol=0, atol=1e-12)


def test_what_is_refused_or_not_covered() -> None:
    with pytest.raises(ValueError, match="ALiBi replaces the rotary embedding"):
        AlibiSpec(AttentionSpec.create(8, 2, rope_fraction=1.0))
    c = alibi.count(AlibiSpec(AttentionSpec.create(6, 2, norm="sink", sink_learned=True, causal=True)))
    assert c.unidentified is None and "not covered" in c.note
