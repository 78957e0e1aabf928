"""attnid against the real attention modules of transformers (random float64 weights, no downloads)."""

import pytest
import torch

from attnid.hf import FAMILIES, build, cross_check, family_spec

CASES = [
    ("gpt2", dict(heads=2)),
    ("llama", dict(heads=4, kv_heads=2)),           # grouped-query attention with RoPE
    ("qwen2", dict(heads=4, kv_heads=2)),           # q/k/v biases, RoPE after them
    ("gpt_neox", dict(heads=2, head_dim=8, rope_fraction=0.25)),  # partial rotary, per-head fused qkv
    ("gpt_oss", dict(heads=4, kv_heads=2)),         # learned attention sinks
]


@pytest.mark.parametrize(("family", "sizes"), CASES, ids=[c[0] for c in CASES])
def test_predictions_hold_on_the_real_module(family: str, sizes: dict) -> None:
    result = cross_check(family, family_spec(family, **sizes), seed=3)
    # same function; transformers builds its RoPE tables in float32, hence 1e-7 rather than 1e-13
    assert result.same_function < (1e-13 if family == "gpt2" else 1e-7)
    assert result.symmetry_change < 1e-13          # the predicted symmetry is invisible to their code
    assert result.off_orbit_change > 1e-7          # a predicted identified direction is not
    assert result.numeric == result.exact          # their module's own Jacobian has the predicted nullity


@pytest.mark.parametrize(("family", "sizes"), CASES, ids=[c[0] for c in CASES])
def test_weight_maps_are_inverse(family: str, sizes: dict) -> None:
    layer = build(family, family_spec(family, **sizes), seed=1)
    weights = layer.weights()
    back = layer.from_attnid(layer.to_attnid(weights))
    assert set(back) == set(weights)
    for name, w in weights.items():
        torch.testing.assert_close(back[name], w, rtol=0, atol=0)


def test_unknown_family_is_rejected() -> None:
    with pytest.raises(ValueError, match="family must be one of"):
        family_spec("bloom")
    with pytest.raises(ValueError, match="family must be one of"):
        build("bloom", family_spec("gpt2"))
    assert len(FAMILIES) == 5
