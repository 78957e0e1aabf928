"""Exact counts against the numeric Jacobian nullity over a seeded sweep of random layouts,
and against the values our reading of the paper's claims reports from independent checks (not in this repository)."""

import random

import pytest

from attnid.counts import count
from attnid.spec import NORMS, AttentionSpec
from attnid.verification import numeric_rank, verify

MAX_PARAMS = 700  # keeps each SVD well under a second on the CI machine


def random_layout(rng: random.Random) -> AttentionSpec:
    """A small random layout: any d <= 12, H | d or explicit widths, G | H, biases, RoPE, norm, mask."""
    while True:
        d = rng.randint(2, 12)
        heads = rng.choice([h for h in range(1, d + 1) if d % h == 0])
        kv = rng.choice([g for g in range(1, heads + 1) if heads % g == 0])
        if rng.random() < 0.3:  # non-standard widths, sometimes wider than d_model
            dk, dv = rng.randint(1, d + 2), rng.randint(1, d + 2)
        else:
            dk = dv = d // heads
        rope = rng.choice([0, 0, dk - dk % 2, 2 * (dk // 4)]) if dk <= d else 0
        spec = AttentionSpec.create(
            d, heads, kv_heads=kv, head_dim=dk, v_head_dim=dv,
            bias="".join(c for c in "qkvo" if rng.random() < 0.5) or "none",
            rope_dims=rope, causal=rng.random() < 0.5, norm=rng.choice(NORMS),
        )
        if spec.norm == "sink" and rng.random() < 0.5:
            spec = AttentionSpec.create(d, heads, kv_heads=kv, head_dim=dk, v_head_dim=dv, bias=spec.bias or "none",
                                        rope_dims=rope, causal=spec.causal, norm="sink", sink_learned=True)
        if count(spec).total <= MAX_PARAMS:
            return spec


SWEEP = [random_layout(random.Random(1000 + i)) for i in range(60)]


@pytest.mark.parametrize("spec", SWEEP, ids=lambda s: s.describe().replace(" ", ","))
def test_exact_count_equals_numeric_nullity(spec: AttentionSpec) -> None:
    result = verify(spec, seq_len=6, seed=7)
    assert result.decision.clear, (result.decision.smallest_kept, result.decision.largest_dropped)
    assert result.count.unidentified == result.numeric_unidentified
    # the number of inputs was enough: three more do not raise the rank (full SVD route)
    more = numeric_rank(spec, seq_len=6, seed=7, n_inputs=result.n_inputs + 3, method="svd")
    assert more.decision.rank == result.decision.rank and more.stable


@pytest.mark.parametrize("spec", SWEEP[:30], ids=lambda s: s.describe().replace(" ", ","))
def test_certificate_bounds_bracket_the_spectrum(spec: AttentionSpec) -> None:
    # Same point, same inputs: the certificate's bounds must enclose the SVD's t_r and t_{r+1}.
    n_inputs = 4 + count(spec).total // 40
    fast = numeric_rank(spec, seq_len=6, seed=3, n_inputs=n_inputs, method="dense")
    full = numeric_rank(spec, seq_len=6, seed=3, n_inputs=n_inputs, method="svd")
    assert fast.decision.rank == full.decision.rank
    if fast.decision.method == "certificate":
        assert fast.decision.smallest_kept <= full.decision.smallest_kept * (1 + 1e-6)
        if fast.decision.nullity:  # above round-off the bound must hold; below it both are noise
            assert max(fast.decision.largest_dropped, 1e-14) >= full.decision.largest_dropped
            assert fast.decision.largest_dropped <= fast.decision.zero_tol


def test_narrow_heads_get_enough_inputs() -> None:
    # H d_v = 4 < d_model = 12: each input's output spans few directions. With inputs counted by
    # d_model this layout's rank was capped at 136 instead of 196 (a bug found by the sweep).
    spec = AttentionSpec.create(12, 4, kv_heads=1, head_dim=2, v_head_dim=1, bias="qvo", norm="sigmoid", causal=True)
    result = verify(spec, seq_len=6, seed=7, method="svd")
    assert result.decision.rank == 196 == result.count.total - result.count.unidentified


def test_sweep_covers_every_kind_of_layout() -> None:
    assert {s.norm for s in SWEEP} == set(NORMS)
    assert {s.kind for s in SWEEP} == {"MHA", "GQA", "MQA"}
    assert any(s.rope_dims and s.rope_dims < s.head_dim for s in SWEEP), "partial RoPE"
    assert any(s.rope_dims == s.head_dim > 0 for s in SWEEP), "full RoPE"
    assert any(s.head_dim > s.d_model or s.v_head_dim > s.d_model for s in SWEEP), "heads wider than the model"
    assert any(s.causal for s in SWEEP) and any(s.sink_learned for s in SWEEP)
    for letter in "qkvo":
        assert any(s.has_bias(letter) for s in SWEEP)


# (layout, unidentified, total): the paper's claims at d = 8, each worked out by hand from the book's theorems
# (per key/value group: d_k^2 for the query/key product, or r + (d_k - r)^2 with RoPE on r columns (thm-rope);
# d_v^2 for the value/output product; b_K's unrotated coordinates and, with b_O, all of b_V under softmax
# (thm-biases); P = d (H d_k + G d_k + G d_v + H d_v) plus the biases).
CLAIMS = [
    (dict(d_model=8, heads=1), 128, 256),  # 64 + 64; P = 4 * 64
    (dict(d_model=8, heads=2), 64, 256),  # 2 (16 + 16)
    (dict(d_model=8, heads=4), 32, 256),  # 4 (4 + 4)
    (dict(d_model=8, heads=8), 16, 256),  # 8 (1 + 1)
    (dict(d_model=8, heads=1, head_dim=10, v_head_dim=8), 160, None),  # 160 - 8 (8 + 8 - 8) = 96 (full rank), + 64
    (dict(d_model=8, heads=2, bias="qkvo"), 80, 288),  # 2 (16 + 16) + b_K 8 + b_V 8; P = 256 + 4 * 8
    (dict(d_model=8, heads=4, bias="qkvo"), 48, 288),  # 4 (4 + 4) + 8 + 8
    (dict(d_model=8, heads=4, bias="qkvo", causal=True), 48, 288),  # a causal mask changes nothing (chapter 6)
    (dict(d_model=8, heads=4, kv_heads=2, bias="qkvo"), 24, 216),  # 2 (4 + 4) + b_K 4 + b_V 4; P = 192 + 8 + 4 + 4 + 8
    (dict(d_model=8, heads=1, bias="qkvo", rope_fraction=1.0), 80, None),  # r = 8, + 64 + b_V 8 (b_K fully rotated)
    (dict(d_model=8, heads=1, rope_fraction=1.0), 72, None),  # 8 + 64
    (dict(d_model=8, heads=2, rope_fraction=1.0), 40, None),  # 2 (4 + 16)
    (dict(d_model=8, heads=1, rope_dims=4), 84, None),  # 4 + 4^2 + 64
    (dict(d_model=8, heads=1, rope_dims=2), 102, None),  # 2 + 6^2 + 64
    (dict(d_model=8, heads=4, kv_heads=2, rope_fraction=1.0), 12, None),  # 2 (2 + 4)
    (dict(d_model=8, heads=4, kv_heads=2), 16, 192),  # 2 (4 + 4); P = 8 (8 + 4 + 4 + 8)
    (dict(d_model=8, heads=4, kv_heads=1), 8, 160),  # 4 + 4; P = 8 (8 + 2 + 2 + 8)
]


@pytest.mark.parametrize(("layout", "unidentified", "total"), CLAIMS)
def test_counts_reproduce_the_claims(layout: dict, unidentified: int, total: int | None) -> None:
    c = count(AttentionSpec.create(**layout))
    assert c.unidentified == unidentified
    if total is not None:
        assert c.total == total


@pytest.mark.parametrize("heads", [1, 2, 4, 8, 16])
def test_standard_ratio_is_one_over_2h(heads: int) -> None:
    assert count(AttentionSpec.create(16, heads)).ratio == pytest.approx(1 / (2 * heads), abs=0)


@pytest.mark.parametrize(("heads", "kv"), [(4, 2), (8, 2), (8, 1), (16, 4)])
def test_gqa_ratio(heads: int, kv: int) -> None:
    assert count(AttentionSpec.create(16, heads, kv_heads=kv)).ratio == pytest.approx(kv / (heads * (heads + kv)))


@pytest.mark.parametrize("heads", [1, 2, 4, 8])
def test_rope_ratio(heads: int) -> None:
    d = 16
    assert count(AttentionSpec.create(d, heads, rope_fraction=1.0)).ratio == pytest.approx(1 / (4 * heads) + 1 / (4 * d))


def test_a_sink_makes_both_key_and_value_bias_identified() -> None:
    # Our reading of the paper says the sink makes b_K identified; the numbers show b_V loses its trade with b_O too,
    # because attention rows no longer sum to one.
    softmax = AttentionSpec.create(8, 2, bias="qkvo")
    sink = AttentionSpec.create(8, 2, bias="qkvo", norm="sink")
    assert count(softmax).unidentified - count(sink).unidentified == 2 * 4 + 2 * 4
    assert verify(sink).numeric_unidentified == count(sink).unidentified


def test_rope_wider_than_the_model_is_reported_not_guessed() -> None:
    c = count(AttentionSpec.create(8, 1, head_dim=10, v_head_dim=8, rope_fraction=1.0))
    assert c.unidentified is None and not c.covered and c.ratio is None
    assert "not covered" in c.note
    assert verify(c.spec).matches is None


def test_a_learned_sink_trades_with_the_corner_of_a_full_rank_query_key_product() -> None:
    # d = 2, d_k = 4 > d, biases q and k: the query/key product [W_Q; b_Q][W_K; b_K]^T is any 3 x 3 matrix
    # (24 weights, 9 entries: 15 unidentified). The sink sees its corner b_Q b_K^T only through
    # sink - b_Q b_K^T / sqrt(d_k): a fixed logit pins the corner, a learned one trades with it (16).
    # The value side (W_V 2 x 2, W_O 2 x 2) adds d_v^2 = 4 either way. Found while writing the proof.
    fixed = AttentionSpec.create(2, 1, head_dim=4, v_head_dim=2, bias="qk", norm="sink")
    learned = AttentionSpec.create(2, 1, head_dim=4, v_head_dim=2, bias="qk", norm="sink", sink_learned=True)
    assert count(fixed).unidentified == 15 + 4 == verify(fixed).numeric_unidentified
    assert count(learned).unidentified == 16 + 4 == verify(learned).numeric_unidentified
    # d_k <= d: the GL(d_k) orbit fixes the corner, so the learned logit is identified
    narrow = AttentionSpec.create(4, 1, head_dim=4, v_head_dim=2, bias="qk", norm="sink", sink_learned=True)
    assert count(narrow).unidentified == 4**2 + 2**2 == verify(narrow).numeric_unidentified
