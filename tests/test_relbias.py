"""Relative position bias (attnid.families.relbias): T5's bucket map, the forward, the moves, and count = Jacobian nullity."""

from __future__ import annotations

import pytest
import torch

from attnid import counts, families
from attnid.families import relbias
from attnid.hf import t5
from attnid.families.relbias import RelativeBiasSpec
from attnid.spec import AttentionSpec

LAYOUTS = [  # (layout fields, buckets, max_distance, length)
    (dict(d_model=6, heads=2), 8, 10, 3),
    (dict(d_model=6, heads=2), 8, 10, 9),
    (dict(d_model=6, heads=2, causal=True), 8, 10, 4),
    (dict(d_model=6, heads=2, causal=True), 6, 9, 12),
    (dict(d_model=8, heads=4, kv_heads=2, bias="qkvo", causal=True), 8, 12, 6),
    (dict(d_model=6, heads=3, kv_heads=1, bias="kv"), 7, 10, 5),
    (dict(d_model=8, heads=2, bias="qkvo", causal=True, window=3), 8, 10, 7),
    (dict(d_model=4, heads=1, head_dim=6, v_head_dim=2, bias="qk"), 10, 20, 6),
]


def _t5_bucket(relative: torch.Tensor, bidirectional: bool, buckets: int, max_distance: int) -> torch.Tensor:
    from transformers.models.t5.modeling_t5 import T5Attention

    return T5Attention._relative_position_bucket(relative, bidirectional=bidirectional, num_buckets=buckets,
                                                 max_distance=max_distance)


@pytest.mark.parametrize(("buckets", "max_distance"), [(32, 128), (8, 12), (16, 64), (7, 10), (64, 40), (33, 257)])
@pytest.mark.parametrize("causal", [False, True])
def test_the_bucket_map_is_t5s(buckets: int, max_distance: int, causal: bool) -> None:
    spec = RelativeBiasSpec(AttentionSpec.create(4, 1, causal=causal), buckets=buckets, max_distance=max_distance)
    relative = torch.arange(-3 * max_distance, 3 * max_distance + 1)
    assert torch.equal(relbias.bucket_of(relative, spec), _t5_bucket(relative, not causal, buckets, max_distance))


def test_t5s_encoder_never_uses_one_bucket_and_the_count_says_so() -> None:
    """The positive side's distance-0 bucket (16 of 32): distance 0 is never positive. Read off T5's own map."""
    relative = torch.arange(-1000, 1001)
    used = set(_t5_bucket(relative, True, 32, 128).tolist())
    assert set(range(32)) - used == {16}
    encoder = RelativeBiasSpec(AttentionSpec.create(512, 8, head_dim=64, causal=False))
    assert relbias.seen_buckets(encoder) == sorted(used)
    assert relbias.count(encoder).breakdown["relative_bias"] == 8 * 2
    decoder = RelativeBiasSpec(AttentionSpec.create(512, 8, head_dim=64, causal=True))
    assert relbias.seen_buckets(decoder) == list(range(32)) and relbias.count(decoder).breakdown["relative_bias"] == 8


def test_the_saturation_length_is_the_shortest_that_sees_every_bucket() -> None:
    for causal in (False, True):
        spec = RelativeBiasSpec(AttentionSpec.create(4, 1, causal=causal), buckets=32, max_distance=128)
        n = relbias.saturation_length(spec)
        assert relbias.seen_buckets(spec, n) == relbias.seen_buckets(spec, 400) != relbias.seen_buckets(spec, n - 1)


@pytest.mark.parametrize(("fields", "buckets", "max_distance", "n"), LAYOUTS, ids=str)
def test_the_count_is_the_jacobians_nullity(fields, buckets: int, max_distance: int, n: int) -> None:
    spec = RelativeBiasSpec(AttentionSpec.create(**fields), buckets=buckets, max_distance=max_distance, seq_len=n)
    result = relbias.verify(spec)
    unseen = buckets - len(relbias.seen_buckets(spec))
    assert result.exact == counts.count(spec.base).unidentified + spec.heads * (1 + unseen)
    assert result.decision.clear and result.matches
    assert result.orbit == result.exact and result.orbit_stretch < 1e-12


def test_a_longer_input_sees_more_buckets_and_fewer_directions() -> None:
    base = AttentionSpec.create(6, 2)
    found = [relbias.verify(RelativeBiasSpec(base, 8, 10, n)).numeric for n in (2, 4, 8)]
    assert found[0] > found[1] > found[2]


def _point(spec: RelativeBiasSpec, n: int):
    gen = torch.Generator().manual_seed(0)
    return relbias.init_params(spec, gen), torch.randn(2, n, spec.d_model, generator=gen, dtype=torch.float64)


def test_the_table_shift_and_the_unseen_buckets_keep_the_function_and_a_seen_bucket_does_not() -> None:
    spec = RelativeBiasSpec(AttentionSpec.create(6, 2, causal=True), buckets=8, max_distance=10, seq_len=4)
    params, x = _point(spec, 4)
    y = relbias.forward(params, x, spec)
    seen = relbias.seen_buckets(spec)
    unseen = sorted(set(range(8)) - set(seen))
    assert seen == [0, 1, 2, 3] and unseen
    shifted = dict(params, rel_bias=params["rel_bias"] + torch.tensor([[0.7], [-1.3]], dtype=torch.float64))
    assert torch.allclose(relbias.forward(shifted, x, spec), y, rtol=0, atol=1e-13)
    spare = params["rel_bias"].clone()
    spare[:, unseen] += 5.0
    assert torch.equal(relbias.forward(dict(params, rel_bias=spare), x, spec), y)
    one = params["rel_bias"].clone()
    one[0, seen[1]] += 0.5
    assert (relbias.forward(dict(params, rel_bias=one), x, spec) - y).abs().max() > 1e-3


@pytest.mark.parametrize("causal", [False, True])
def test_transformers_t5_attention_agrees(causal: bool) -> None:
    spec = RelativeBiasSpec(AttentionSpec.create(6, 2, head_dim=3, causal=causal), buckets=8, max_distance=10,
                            seq_len=6)
    check = t5.hf_cross_check(spec)
    assert check.same_function < 1e-13 and check.symmetry_change < 1e-12 and check.off_orbit_change > 1e-6
    assert check.numeric == check.exact == relbias.count(spec).unidentified


def test_the_family_is_registered() -> None:
    spec = relbias.example()
    assert families.family_of(spec).name == "relative-bias" and families.count(spec) == relbias.count(spec)


def test_what_is_refused_or_not_covered() -> None:
    with pytest.raises(ValueError, match="replaces the rotary embedding"):
        RelativeBiasSpec(AttentionSpec.create(8, 2, rope_fraction=1.0))
    with pytest.raises(ValueError, match="at least 4 buckets"):
        RelativeBiasSpec(AttentionSpec.create(8, 2), buckets=3)
    with pytest.raises(ValueError, match="must exceed"):
        RelativeBiasSpec(AttentionSpec.create(8, 2), buckets=32, max_distance=8)
    with pytest.raises(ValueError, match="seq_len"):
        RelativeBiasSpec(AttentionSpec.create(8, 2), seq_len=0)
    c = relbias.count(RelativeBiasSpec(AttentionSpec.create(6, 2, norm="sink", sink_learned=True, causal=True)))
    assert c.unidentified is None and "not covered" in c.note and c.total == counts.count(
        AttentionSpec.create(6, 2, norm="sink", sink_learned=True, causal=True)).total + 2 * 32


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    from attnid.cli import main

    try:
        code = main(list(args))
    except SystemExit as stop:
        code = int(stop.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_the_command_line_counts_and_verifies_a_relative_bias(capsys) -> None:
    import json

    code, out, _ = _cli(capsys, "count", "--d-model", "512", "--heads", "8", "--relative-bias", "32", "--json")
    record = json.loads(out)
    plain = counts.count(AttentionSpec.create(512, 8))
    assert code == 0 and record["total"] == plain.total + 8 * 32
    assert record["unidentified"] == plain.unidentified + 8 * 2  # T5's encoder map leaves one bucket unused
    code, out, _ = _cli(capsys, "verify", "--d-model", "6", "--heads", "2", "--causal", "--relative-bias", "8",
                        "--max-distance", "10", "--seq-len", "4", "--json")
    record = json.loads(out)
    assert code == 0 and record["matches"] and record["unidentified"] == plain_count(6, 2) + 2 * (1 + 4)


def plain_count(d: int, h: int) -> int:
    return counts.count(AttentionSpec.create(d, h, causal=True)).unidentified


@pytest.mark.parametrize(("flags", "message"), [
    (("--relative-bias", "8", "--alibi"), "at most one of --alibi, --relative-bias"),
    (("--relative-bias", "8", "--output-gate", "headwise"), "at most one of --output-gate, --relative-bias"),
    (("--max-distance", "9"), "--max-distance needs --relative-bias"),
    (("--relative-bias", "8", "--rope-fraction", "1"), "replaces the rotary embedding"),
    (("--relative-bias", "1"), "--relative-bias"),
])
def test_the_command_line_refuses_what_does_not_go_together(capsys, flags, message: str) -> None:
    code, _, err = _cli(capsys, "count", "--d-model", "8", "--heads", "2", *flags)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
