"""attnid against the real attention modules of transformers (random float64 weights, no downloads)."""

import pytest
import torch

from attnid.hf.modules import FAMILIES, QK_NORM_FAMILIES, build, cross_check, family_spec

CASES = [
    ("gpt2", dict(heads=2)),
    ("llama", dict(heads=4, kv_heads=2)),           # grouped-query attention with RoPE
    ("qwen2", dict(heads=4, kv_heads=2)),           # q/k/v biases, RoPE after them
    ("gpt_neox", dict(heads=2, head_dim=8, rope_fraction=0.25)),  # partial rotary, per-head fused qkv
    ("gpt_oss", dict(heads=4, kv_heads=2)),         # learned attention sinks
    ("qwen3", dict(heads=4, kv_heads=2)),           # QK-norm, one weight for all heads, eps 1e-6
    ("gemma3", dict(heads=4, kv_heads=2, window=3)),  # QK-norm with weight 1 + w, a sliding-window layer
    ("olmo2", dict(heads=2)),                       # QK-norm over the whole projection width, eps 1e-5
    ("qwen3", dict(heads=2, qk_norm_eps=0.0, bias="qkvo")),  # eps = 0: each head's scale is free; biases in the norm
    ("olmo2", dict(heads=4, kv_heads=2, qk_norm_eps=0.0)),
    ("gpt_oss", dict(heads=4, kv_heads=2, window=3)),  # gpt-oss's sliding-window layers
]
IDS = [f"{family}-{'-'.join(f'{k}{v}' for k, v in sizes.items())}" for family, sizes in CASES]


@pytest.mark.parametrize(("family", "sizes"), CASES, ids=IDS)
def test_predictions_hold_on_the_real_module(family: str, sizes: dict) -> None:
    result = cross_check(family, family_spec(family, **sizes), seed=3)
    # same function; transformers builds its RoPE tables in float32, hence 1e-7 rather than 1e-13, except for the
    # QK-norm families, which get float64 tables and run their RMSNorm in float64 (attnid.hf.modules.float64_kept)
    assert result.same_function < (1e-13 if family in ("gpt2", *QK_NORM_FAMILIES) else 1e-7)
    assert result.symmetry_change < 1e-13          # the predicted symmetry is invisible to their code
    assert result.off_orbit_change > 1e-7          # a predicted identified direction is not
    assert result.numeric == result.exact          # their module's own Jacobian has the predicted nullity


@pytest.mark.parametrize(("family", "sizes"), CASES, ids=IDS)
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
    assert len(FAMILIES) == 8


def test_family_spec_honours_every_argument() -> None:
    assert family_spec("gpt_neox", heads=2, head_dim=8, rope_fraction=0.25).rope_dims == 2
    assert family_spec("gpt_neox", heads=2, head_dim=8, rope_fraction=0.0).rope_dims == 0
    assert family_spec("gpt2", heads=3, head_dim=2).rope_dims == 0  # the family's own default: no RoPE
    for family in ("llama", "qwen2", "gpt_oss"):
        spec = family_spec(family, heads=4, kv_heads=2, head_dim=6)
        assert (spec.heads, spec.kv_heads, spec.head_dim, spec.rope_dims) == (4, 2, 6, 6)
        assert family_spec(family, rope_fraction=1.0).rope_dims == 4
    for family in ("gpt2", "gpt_neox"):
        assert family_spec(family, heads=4, kv_heads=4).kv_heads == 4


@pytest.mark.parametrize(
    ("family", "kwargs", "message"),
    [
        ("gpt2", dict(heads=2, kv_heads=1), "kv_heads=1 .*family gpt2"),
        ("gpt_neox", dict(heads=4, kv_heads=2), "kv_heads=2 .*family gpt_neox"),
        ("gpt2", dict(rope_fraction=0.5), "rope_fraction=0.5 .*family gpt2"),
        ("llama", dict(rope_fraction=0.5), "rope_fraction=0.5 .*family llama"),
        ("qwen2", dict(rope_fraction=0.0), "rope_fraction=0.0 .*family qwen2"),
        ("gpt_oss", dict(heads=4, kv_heads=2, rope_fraction=0.5), "rope_fraction=0.5 .*family gpt_oss"),
    ],
)
def test_family_spec_refuses_what_the_family_cannot_have(family: str, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        family_spec(family, **kwargs)


def test_qk_norm_family_specs() -> None:
    assert family_spec("qwen3").qk_norm == "shared" and family_spec("qwen3").qk_norm_eps == 1e-6
    assert family_spec("olmo2").qk_norm == "full" and family_spec("olmo2").qk_norm_eps == 1e-5
    assert family_spec("gemma3", window=4).window == 4
    with pytest.raises(ValueError, match="qk_norm_eps is not available for family llama"):
        family_spec("llama", qk_norm_eps=0.0)
    with pytest.raises(ValueError, match="window=4 is not available for family olmo2"):
        family_spec("olmo2", window=4)
    with pytest.raises(ValueError, match="bias='qkv' is not available for family qwen3"):
        family_spec("qwen3", bias="qkv")


def test_their_float32_norm_is_what_float64_kept_skips() -> None:
    # Without float64_kept, Qwen3's RMSNorm computes in float32: the same function only to float32 precision.
    import attnid.hf.modules as hf

    layer = build("qwen3", family_spec("qwen3", heads=2), seed=0)
    x = torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    kept = layer.output(layer.weights(), x)
    plain = hf.functional_call(layer.module, layer.weights(), (x,), layer.forward_kwargs(x), strict=True)[0]
    gap = float((kept - plain).abs().max() / kept.abs().max())
    assert 1e-10 < gap < 1e-5
    assert torch.Tensor.to is not None and torch.ones(1, dtype=torch.float64).float().dtype == torch.float32


def test_an_unknown_attention_path_is_refused() -> None:
    with pytest.raises(ValueError, match="attention_path must be one of sdpa, eager"):
        build("llama", family_spec("llama"), attention_path="flash")


def test_a_float32_softmax_makes_the_dead_key_bias_look_alive() -> None:
    # Why the SDPA path is the default: GPT-NeoX's eager attention computes its softmax in float32, where a
    # constant row shift changes the weights at round-off level; the rank rule then counts those directions.
    spec = family_spec("gpt_neox", heads=2, head_dim=8, rope_fraction=0.25)
    eager = cross_check("gpt_neox", spec, attention_path="eager")
    assert eager.numeric < eager.exact
