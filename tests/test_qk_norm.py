"""QK-norm and sliding windows: the layer, the exact counts, the moves, and the numeric check of both."""

import json
from collections.abc import Callable

import pytest
import torch

from attnid import balancing as bal

from attnid import symmetry as sym
from attnid.checks import invariance_error, key_bias_gradient_ratio, off_orbit_change
from attnid.counts import count
from attnid.layer import forward, init_params, qk_normalise
from attnid.rank import decide_rank
from attnid.jacobian import jacobian_matrix
from attnid.spec import AttentionSpec
from attnid.verification import verify

CLI = Callable[..., tuple[int, str, str]]  # the fixture ``cli`` (conftest.py): args -> (exit code, stdout, stderr)


# ------------------------------------------------------------------------------------------------
# The layer
# ------------------------------------------------------------------------------------------------


def test_qk_norm_is_rmsnorm_over_the_right_entries(gen: torch.Generator) -> None:
    t = torch.randn(3, 2, 5, 4, generator=gen, dtype=torch.float64)  # (batch, heads, tokens, d_k)
    eps = 1e-3
    shared = AttentionSpec.create(8, 2, qk_norm="shared", qk_norm_eps=eps)
    w = torch.randn(4, generator=gen, dtype=torch.float64)
    expected = t / torch.sqrt((t**2).mean(-1, keepdim=True) + eps) * w
    torch.testing.assert_close(qk_normalise(t, w, shared), expected, rtol=1e-15, atol=0)
    per_head = AttentionSpec.create(8, 2, qk_norm="per-head", qk_norm_eps=eps)
    wh = torch.randn(2, 4, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(qk_normalise(t, wh, per_head), expected / w * wh[:, None, :], rtol=1e-14, atol=0)
    full = AttentionSpec.create(8, 2, qk_norm="full", qk_norm_eps=eps)
    flat = t.transpose(1, 2).reshape(3, 5, 8)  # each token's whole query: heads side by side (OLMo-2's q_proj)
    normed = flat / torch.sqrt((flat**2).mean(-1, keepdim=True) + eps) * wh.reshape(-1)
    torch.testing.assert_close(qk_normalise(t, wh, full), normed.reshape(3, 5, 2, 4).transpose(1, 2), rtol=1e-14,
                               atol=0)


def test_defaults_keep_the_old_layer(gen: torch.Generator) -> None:
    old = AttentionSpec.create(8, 2, bias="qkvo", rope_fraction=1.0, causal=True)
    assert (old.qk_norm, old.window) == ("none", None)
    assert "qk_norm" not in old.describe() and "window" not in old.describe()
    assert set(init_params(old, gen)) == {"W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"}


def test_window_mask_shows_each_row_its_last_w_keys(gen: torch.Generator) -> None:
    spec = AttentionSpec.create(4, 1, causal=True, window=3, norm="sigmoid")
    params = init_params(spec, gen)
    x = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    base = forward(params, x, spec)
    for j in range(6):  # changing token j changes the rows i with j <= i < j + 3 only
        moved = x.clone()
        moved[j] += 1.0
        changed = ((forward(params, moved, spec) - base).abs().max(-1).values > 1e-12).nonzero().flatten().tolist()
        assert changed == list(range(j, min(j + 3, 6)))
    with pytest.raises(ValueError, match="window needs causal"):
        AttentionSpec.create(4, 1, window=3)
    softmax = AttentionSpec.create(4, 1, causal=True, window=3)
    with pytest.raises(ValueError, match="no sliding window"):
        forward(init_params(softmax, gen), x, softmax, backend="kernels")


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    (dict(qk_norm="rms"), ValueError, "qk_norm must be one of none, shared, per-head, full"),
    (dict(qk_norm="shared", qk_norm_eps=-1e-6), ValueError, "qk_norm_eps must be a number in"),
    (dict(qk_norm="shared", qk_norm_eps=float("nan")), ValueError, "qk_norm_eps must be a number in"),
    (dict(qk_norm="shared", qk_norm_eps=True), TypeError, "qk_norm_eps must be a number in"),
    (dict(window=0, causal=True), ValueError, "window must be an integer from 1 to 2,147,483,647, got 0"),
    (dict(window=2.0, causal=True), TypeError, "window must be an integer"),
])
def test_invalid_qk_norm_and_window_fields(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        AttentionSpec.create(8, 2, **kwargs)


# ------------------------------------------------------------------------------------------------
# The counts, derived by hand
# ------------------------------------------------------------------------------------------------


def test_the_issue_example_d8_two_heads() -> None:
    # d = 8, two heads of d_k = 4, shared weight, no RoPE. eps = 0: H + G = 4 scales, d_k = 4 weight trades and the
    # value side's 2 * 4^2 = 32: 40, against 64 = 2 (16 + 16) without the norm. eps > 0: the 4 scales are identified.
    plain = count(AttentionSpec.create(8, 2))
    exact = count(AttentionSpec.create(8, 2, qk_norm="shared", qk_norm_eps=0.0))
    weak = count(AttentionSpec.create(8, 2, qk_norm="shared", qk_norm_eps=1e-6))
    assert (plain.unidentified, exact.unidentified, weak.unidentified) == (64, 40, 36)
    assert exact.total == plain.total + 2 * 4
    assert (exact.weakly_identified, weak.weakly_identified) == (0, 4)


@pytest.mark.parametrize(("qk_norm", "scales", "trades"), [
    ("shared", 8 + 2, 6),            # H + G scales; r/2 + (d_k - r) = 2 + 4 trades, once
    ("per-head", 8 + 2, 2 * 6),      # the same trades per group
    ("full", 2, 2 * 6),              # one scale for all queries, one for all keys
])
def test_counts_with_gqa_partial_rope_and_biases(qk_norm: str, scales: int, trades: int) -> None:
    spec = dict(d_model=64, heads=8, kv_heads=2, head_dim=8, bias="qkvo", rope_fraction=0.5, causal=True, qk_norm=qk_norm)
    zero = count(AttentionSpec.create(**spec, qk_norm_eps=0.0))
    positive = count(AttentionSpec.create(**spec, qk_norm_eps=1e-5))
    value_side = 2 * 8**2 + 2 * 8  # G d_v^2, and b_V folded into b_O under plain softmax
    assert zero.breakdown == {"query_key": scales, "norm_weights": trades, "key_bias": 0, "value_output": 2 * 64,
                              "value_bias": 16}
    assert zero.unidentified == scales + trades + value_side
    assert positive.unidentified == trades + value_side and positive.weakly_identified == scales
    n_norm = 2 * 8 if qk_norm == "shared" else (8 + 2) * 8
    assert zero.total == count(AttentionSpec.create(**{**spec, "qk_norm": "none"})).total + n_norm


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(d_model=4, heads=1, head_dim=6, v_head_dim=4, qk_norm="shared"), "head_dim 6 > d_model 4"),
    (dict(d_model=6, heads=2, head_dim=4, v_head_dim=3, qk_norm="full"), "H d_k and G d_k <= d_model"),
    (dict(d_model=4, heads=2, head_dim=1, v_head_dim=2, qk_norm="per-head", qk_norm_eps=0.0), "only its sign"),
    (dict(d_model=2, heads=1, head_dim=2, v_head_dim=3, qk_norm="shared"), "v_head_dim 3 > d_model 2"),
    (dict(d_model=4, heads=2, head_dim=1, v_head_dim=1, qk_norm="full", qk_norm_eps=0.0), "full-width QK-norm on heads"),
    (dict(d_model=4, heads=3, kv_heads=1, head_dim=1, v_head_dim=1, qk_norm="full", qk_norm_eps=1e-2),
     "full-width QK-norm on heads"),
    (dict(d_model=1, heads=2, head_dim=1, v_head_dim=1, qk_norm="per-head", qk_norm_eps=1e-2), "d_model 1"),
    (dict(d_model=8, heads=2, causal=True, window=1), "window of 1 key"),
    (dict(d_model=8, heads=2, causal=True, window=2, rope_fraction=1.0), "window of 2 keys with RoPE"),
])
def test_layouts_the_proofs_do_not_cover(kwargs: dict, message: str) -> None:
    c = count(AttentionSpec.create(**kwargs))
    assert c.unidentified is None and message in c.note


@pytest.mark.parametrize("kwargs", [
    dict(d_model=4, heads=2, kv_heads=1, head_dim=1, v_head_dim=1, qk_norm="shared", qk_norm_eps=0.5),
    dict(d_model=4, heads=1, head_dim=1, v_head_dim=1, qk_norm="full", qk_norm_eps=0.5),  # one head: per-head
    dict(d_model=3, heads=2, head_dim=1, v_head_dim=3, qk_norm="unweighted", qk_norm_eps=0.5, bias="qkvo"),
])
def test_width_one_layouts_prop_qk_width_one_covers(kwargs: dict) -> None:
    # d_k = 1, eps > 0, d >= 2, d_v <= d: counted (1 + S shared, G + S per-head, S unweighted) and measured equal
    spec = AttentionSpec.create(**kwargs)
    value_side = spec.kv_heads * spec.v_head_dim ** 2 + (spec.kv_heads * spec.v_head_dim if "v" in spec.bias else 0)
    trades = {"shared": 1, "full": spec.kv_heads, "unweighted": 0}[spec.qk_norm]
    c = count(spec)
    assert c.unidentified == trades + value_side
    assert verify(spec, seed=0).matches


def test_unweighted_norm_leaves_rotations_commuting_with_rope() -> None:
    # Llama 4's norm has no weight: no trade, but an orthogonal O_g commuting with RoPE survives, per group:
    # r/2 rotation angles and so(d_k - r); with eps = 0 also the H + G scales.
    spec = dict(d_model=64, heads=8, kv_heads=2, head_dim=8, rope_fraction=0.5, causal=True, qk_norm="unweighted")
    c = count(AttentionSpec.create(**spec, qk_norm_eps=1e-5))
    assert c.breakdown["rotations"] == 2 * (2 + 4 * 3 // 2) and c.weakly_identified == 10
    assert c.total == count(AttentionSpec.create(**{**spec, "qk_norm": "none"})).total  # no weights
    assert count(AttentionSpec.create(**spec, qk_norm_eps=0.0)).breakdown["query_key"] == 10


def test_chunks_wide_enough_change_no_count() -> None:
    base = count(AttentionSpec.create(8, 2, causal=True, rope_fraction=1.0, bias="qkvo"))
    assert count(AttentionSpec.create(8, 2, causal=True, rope_fraction=1.0, bias="qkvo", chunk=3)).breakdown == \
        base.breakdown
    assert count(AttentionSpec.create(8, 2, causal=True, rope_fraction=1.0, chunk=2)).unidentified is None
    assert verify(AttentionSpec.create(8, 2, causal=True, rope_fraction=1.0, bias="qkvo", chunk=3)).matches is True
    with pytest.raises(ValueError, match="not both"):
        AttentionSpec.create(8, 2, causal=True, window=3, chunk=3)


def test_windows_wide_enough_change_no_count() -> None:
    for kwargs in (dict(bias="qkvo"), dict(rope_fraction=1.0, bias="qkv"), dict(norm="sink", sink_learned=True),
                   dict(qk_norm="shared", rope_fraction=0.5)):
        full = count(AttentionSpec.create(8, 2, causal=True, **kwargs))
        for w in (3, 4, 4096):
            assert count(AttentionSpec.create(8, 2, causal=True, window=w, **kwargs)).breakdown == full.breakdown
    assert count(AttentionSpec.create(8, 2, causal=True, window=2)).unidentified == 64  # no RoPE: 2 keys suffice


# ------------------------------------------------------------------------------------------------
# The moves
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("qk_norm", ["shared", "per-head", "full"])
@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_moves_are_invisible_and_off_orbit_steps_are_not(qk_norm: str, eps: float) -> None:
    spec = AttentionSpec.create(16, 4, kv_heads=2, bias="qkvo", rope_fraction=0.5, causal=True, qk_norm=qk_norm,
                                qk_norm_eps=eps)
    assert invariance_error(spec) < 1e-13
    assert off_orbit_change(spec) > 1e-8


def test_scales_are_symmetries_only_with_eps_zero(gen: torch.Generator) -> None:
    x = torch.randn(3, 8, 8, generator=gen, dtype=torch.float64)
    for eps in (0.0, 1e-2):
        spec = AttentionSpec.create(8, 2, bias="qk", qk_norm="shared", qk_norm_eps=eps)
        params = init_params(spec, gen)
        scaled = dict(params, W_Q=params["W_Q"] * 3.0, b_Q=params["b_Q"] * 3.0)
        change = float((forward(scaled, x, spec) - forward(params, x, spec)).abs().max())
        assert (change < 1e-13) == (eps == 0.0)
    with pytest.raises(ValueError, match="only with qk_norm_eps = 0"):
        sym.move_qk_norm(params, spec, query_scales=torch.ones(2))


def test_gl_moves_and_key_bias_shift_are_refused(gen: torch.Generator) -> None:
    spec = AttentionSpec.create(8, 2, bias="qkvo", qk_norm="shared")
    params = init_params(spec, gen)
    element = sym.random_group_element(AttentionSpec.create(8, 2), gen)  # a non-identity M
    with pytest.raises(ValueError, match="must be the identity"):
        sym.apply_group(params, spec, element)
    with pytest.raises(ValueError, match="inside the norm"):
        sym.shift_key_bias(params, spec, torch.ones(2, 4))
    with pytest.raises(ValueError, match="without a QK-norm"):
        bal.balance(params, spec)
    with pytest.raises(ValueError, match="without a QK-norm"):
        bal.conserved_quantities(params, spec)


def test_the_key_bias_is_alive_inside_the_norm() -> None:
    assert key_bias_gradient_ratio(AttentionSpec.create(8, 2, bias="qkvo")) < 1e-13
    assert key_bias_gradient_ratio(AttentionSpec.create(8, 2, bias="qkvo", qk_norm="shared")) > 1e-3


def test_eps_makes_the_scales_weakly_identified(gen: torch.Generator) -> None:
    # The H + G directions that eps = 0 leaves free have, for eps = 1e-6, relative singular values far below the
    # rest of the spectrum but far above round-off: identified, weakly. Measured on the real layer's Jacobian.
    spec0 = AttentionSpec.create(8, 2, qk_norm="shared", qk_norm_eps=0.0)
    spec1 = AttentionSpec.create(8, 2, qk_norm="shared", qk_norm_eps=1e-6)
    params = init_params(spec0, gen)
    inputs = [torch.randn(8, 8, generator=gen, dtype=torch.float64) for _ in range(12)]
    spectra = []
    for spec in (spec0, spec1):
        j = jacobian_matrix(lambda p, x, s=spec: forward(p, x, s), params, inputs)
        d = decide_rank(torch.linalg.svdvals(j), j.shape[0], j.shape[1])
        spectra.append(d)
    zero, weak = spectra
    assert zero.clear and weak.clear and zero.nullity - weak.nullity == 4
    rel = weak.singular_values / weak.singular_values[0]
    new = rel[zero.rank : weak.rank]  # the four values eps brings above the zero tolerance
    assert float(new.max()) < 1e-5 and float(new.min()) > 1e-10
    assert float(rel[zero.rank - 1]) > 1e-4  # the rest of the kept spectrum is far above them


# ------------------------------------------------------------------------------------------------
# Acceptance: `attnid count` against the numeric nullity of `attnid verify`, eps = 0 and eps > 0
# ------------------------------------------------------------------------------------------------

SWEEP = [
    ["--d-model", "8", "--heads", "2"],
    ["--d-model", "8", "--heads", "4", "--kv-heads", "2", "--rope-fraction", "1", "--causal"],
    ["--d-model", "8", "--heads", "2", "--bias", "qkvo", "--rope-fraction", "0.5"],
    ["--d-model", "12", "--heads", "3", "--kv-heads", "1", "--bias", "qkv", "--rope-fraction", "0.5", "--causal"],
    ["--d-model", "8", "--heads", "2", "--bias", "qkvo", "--norm", "sink", "--sink", "learned"],
    ["--d-model", "8", "--heads", "2", "--bias", "k", "--rope-fraction", "1", "--causal", "--window", "3"],
]


@pytest.mark.parametrize("layout", SWEEP, ids=[" ".join(s[4:]) or "mha" for s in SWEEP])
@pytest.mark.parametrize("qk_norm", ["shared", "per-head", "full", "unweighted"])
@pytest.mark.parametrize("eps", ["0", "1e-6"])
def test_count_agrees_with_verify(cli: CLI, layout: list[str], qk_norm: str, eps: str) -> None:
    flags = [*layout, "--qk-norm", qk_norm, "--qk-norm-eps", eps, "--json"]
    code, out, _ = cli("count", *flags)
    counted = json.loads(out)
    assert code == 0 and counted["covered"]
    code, out, _ = cli("verify", *flags)
    verified = json.loads(out)
    assert code == 0 and verified["matches"] is True and verified["clear"] is True
    assert verified["numeric_unidentified"] == counted["unidentified"]
    scales = 2 if qk_norm == "full" else verified["layout"]["heads"] + verified["layout"]["kv_heads"]
    assert counted["weakly_identified"] == (0 if eps == "0" else scales)


@pytest.mark.parametrize("kwargs", [
    dict(d_model=8, heads=2, bias="qkvo", window=2),
    dict(d_model=8, heads=2, bias="qkvo", rope_fraction=0.5, window=3, norm="sink", sink_learned=True),
    dict(d_model=8, heads=4, kv_heads=2, bias="qkv", rope_fraction=1.0, window=4, norm="sigmoid"),
])
def test_windows_verify(kwargs: dict) -> None:
    v = verify(AttentionSpec.create(causal=True, **kwargs))
    assert v.matches is True


def test_a_window_of_two_with_rope_can_leave_more_unidentified() -> None:
    # Why the count does not cover it: one head at d = d_k = 4 with full RoPE. A causal layout has 20 unidentified
    # parameters (chapter 6); with a window of 2 keys every row sees the offsets 0 and 1 only, and 2 more are free.
    spec = AttentionSpec.create(4, 1, rope_fraction=1.0, causal=True)
    assert count(spec).unidentified == 20
    v = verify(AttentionSpec.create(4, 1, rope_fraction=1.0, causal=True, window=2), n_inputs=40)
    assert v.count.unidentified is None and v.decision.clear and v.numeric_unidentified == 22


def test_cli_qk_norm_and_window_flags(cli: CLI) -> None:
    code, out, _ = cli("count", "--d-model", "8", "--heads", "2", "--qk-norm", "shared", "--qk-norm-eps", "0")
    assert code == 0 and "qk_norm=shared eps=0" in out and "unidentified: 40" in out
    assert "norm weights 4" in out and "weakly" not in out
    code, out, _ = cli("count", "--d-model", "8", "--heads", "2", "--qk-norm", "per-head")
    assert code == 0 and "eps=1e-06" in out and "weakly identified: 4" in out  # the default eps is Qwen3's
    code, out, _ = cli("count", "--d-model", "8", "--heads", "2", "--causal", "--chunk", "3", "--qk-norm",
                       "unweighted")
    assert code == 0 and "chunk=3" in out and "rotations" in out
    for args, message in ((["--window", "4"], "--window needs --causal"),
                          (["--chunk", "4"], "--chunk needs --causal"),
                          (["--causal", "--window", "4", "--chunk", "4"], "not both"),
                          (["--qk-norm", "rms"], "invalid choice"),
                          (["--qk-norm", "shared", "--qk-norm-eps", "2"], "--qk-norm-eps: must be a number in [0, 1], got '2'"),
                          (["--causal", "--window", "0"], "--window: must be an integer from 1 to 2,147,483,647, got '0'")):
        code, out, err = cli("count", "--d-model", "8", "--heads", "2", *args)
        assert code == 2 and out == "" and err.count("\n") == 1 and message in err, err


def test_verify_explains_a_too_small_eps(cli: CLI) -> None:
    # With eps = 1e-12 the scales are identified in exact arithmetic, but their singular values fall below the rank
    # rule's zero tolerance: the numeric nullity is the eps = 0 count, and verify says why it disagrees.
    code, out, _ = cli("verify", "--d-model", "8", "--heads", "2", "--qk-norm", "shared", "--qk-norm-eps", "1e-12")
    assert code == 1 and "matches: NO" in out and "below the rank rule's zero tolerance" in out
