"""Output-gated attention (attnid.families.gated): the forward, the symmetries the gate keeps and breaks, count = verify."""

from __future__ import annotations

import json

import pytest
import torch

from attnid import families, layer
from attnid.families import gated
from attnid.hf import qwen3_next
from attnid.cli import main
from attnid.families.gated import GatedSpec
from attnid.spec import AttentionSpec

# (ungated layout, gate, gate bias): elementwise and headwise gates, MHA/GQA/MQA, biases, RoPE, causal masks,
# value heads wider than the model (d_v > d), and a layout without b_O
LAYOUTS = [
    (dict(d_model=6, heads=2), "elementwise", False),
    (dict(d_model=6, heads=2), "headwise", False),
    (dict(d_model=6, heads=2, bias="qkvo"), "elementwise", True),
    (dict(d_model=6, heads=2, bias="qkvo"), "headwise", True),
    (dict(d_model=6, heads=2, bias="qkv"), "headwise", False),
    (dict(d_model=8, heads=4, kv_heads=2, causal=True, bias="v"), "elementwise", False),
    (dict(d_model=8, heads=2, kv_heads=1, rope_fraction=1.0), "elementwise", True),
    (dict(d_model=8, heads=2, kv_heads=1, rope_fraction=0.5, bias="qkvo", causal=True), "headwise", True),
    (dict(d_model=4, heads=1, head_dim=2, v_head_dim=6), "elementwise", False),
    (dict(d_model=4, heads=1, head_dim=2, v_head_dim=6), "headwise", False),
    (dict(d_model=6, heads=3, kv_heads=1, bias="vo"), "elementwise", True),
]


def gated_spec(fields: dict, gate: str, bias: bool) -> GatedSpec:
    return GatedSpec(AttentionSpec.create(**fields), gate, bias)


@pytest.mark.parametrize("fields,gate,bias", LAYOUTS, ids=lambda v: str(v))
def test_the_count_agrees_with_the_float64_jacobian(fields, gate, bias) -> None:
    result = families.verify(gated_spec(fields, gate, bias))
    assert result.decision.clear and result.matches, (result.exact, result.numeric)
    assert result.orbit == result.exact and result.orbit_stretch < 1e-12  # the orbit is the whole null space


@pytest.mark.parametrize("d,h", [(8, 1), (8, 2), (8, 4), (12, 3), (16, 8)])
def test_standard_layouts_follow_the_closed_forms(d, h) -> None:
    # d_k = d_v = d/H, no biases: elementwise H (d/H)^2 + H (d/H) = d^2/H + d of 4 d^2 + H d (d/H);
    # headwise 2 d^2 / H of 4 d^2 + H d
    base = AttentionSpec.create(d, h)
    elementwise, headwise = gated.count(GatedSpec(base, "elementwise")), gated.count(GatedSpec(base, "headwise"))
    assert (elementwise.total, elementwise.unidentified) == (5 * d * d, d * d // h + d)
    assert (headwise.total, headwise.unidentified) == (4 * d * d + h * d, 2 * d * d // h)


def _point(spec: GatedSpec, seed: int = 0) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return gated.init_params(spec, gen), torch.randn(2, 7, spec.d_model, generator=gen, dtype=torch.float64)


def _move_values(params: dict[str, torch.Tensor], m: torch.Tensor) -> dict[str, torch.Tensor]:
    out = dict(params)
    out["W_V"] = params["W_V"] @ m
    if "b_V" in params:
        out["b_V"] = (params["b_V"][:, None, :] @ m)[:, 0]
    out["W_O"] = torch.linalg.solve(m, params["W_O"])
    return out


def test_a_half_open_gate_halves_the_ungated_heads() -> None:
    # W_G = 0 and no gate bias: every gate is sigmoid(0) = 1/2 exactly
    spec = gated_spec(dict(d_model=8, heads=2, kv_heads=1, rope_fraction=0.5, bias="qkvo", causal=True), "elementwise", False)
    params, x = _point(spec)
    params["W_G"] = torch.zeros_like(params["W_G"])
    ungated = {k: v for k, v in params.items() if k != "W_G"}
    expected = 0.5 * (layer.forward(ungated, x, spec.base) - params["b_O"]) + params["b_O"]
    assert torch.allclose(gated.forward(params, x, spec), expected, rtol=0, atol=1e-14)


def test_the_gate_keeps_diagonal_value_moves_and_breaks_the_others() -> None:
    spec = gated_spec(dict(d_model=6, heads=2, kv_heads=1, bias="qkvo"), "elementwise", True)
    params, x = _point(spec)
    y = gated.forward(params, x, spec)
    diagonal = torch.diag(torch.tensor([0.5, -2.0, 3.0], dtype=torch.float64))
    assert torch.allclose(gated.forward(_move_values(params, diagonal), x, spec), y, rtol=0, atol=1e-12)
    mixing = torch.eye(3, dtype=torch.float64) + 0.3 * torch.ones(3, 3, dtype=torch.float64)
    assert (gated.forward(_move_values(params, mixing), x, spec) - y).abs().max() > 1e-3


def test_a_head_gate_keeps_every_value_move() -> None:
    spec = gated_spec(dict(d_model=6, heads=2, bias="qkvo"), "headwise", True)
    params, x = _point(spec)
    m = torch.eye(3, dtype=torch.float64) + 0.3 * torch.randn(3, 3, generator=torch.Generator().manual_seed(1),
                                                               dtype=torch.float64)
    moved = _move_values(params, m[None].expand(2, 3, 3))
    assert torch.allclose(gated.forward(moved, x, spec), gated.forward(params, x, spec), rtol=0, atol=1e-12)


@pytest.mark.parametrize("gate", ["elementwise", "headwise"])
def test_the_gate_sees_the_value_bias_the_ungated_layer_trades_with_b_o(gate) -> None:
    spec = gated_spec(dict(d_model=6, heads=2, bias="qkvo"), gate, False)
    params, x = _point(spec)
    delta = torch.randn(2, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    traded = dict(params, b_V=params["b_V"] + delta, b_O=params["b_O"] - torch.einsum("hv,hvd->d", delta, params["W_O"]))
    ungated = {k: v for k, v in params.items() if k != "W_G"}
    ungated_traded = {k: v for k, v in traded.items() if k != "W_G"}
    assert torch.allclose(layer.forward(ungated_traded, x, spec.base), layer.forward(ungated, x, spec.base), atol=1e-12)
    assert (gated.forward(traded, x, spec) - gated.forward(params, x, spec)).abs().max() > 1e-3
    c = gated.count(spec)
    assert "value_bias" not in c.breakdown and c.breakdown["key_bias"] == 6  # the key bias still does nothing


def test_sinks_and_the_sigmoid_have_no_exact_count_with_a_gate() -> None:
    for norm in ("sink", "sigmoid"):
        c = gated.count(gated_spec(dict(d_model=6, heads=2, norm=norm), "elementwise", False))
        assert c.unidentified is None and "not covered" in c.note and c.total == 6 * 6 * 5


def test_bad_gates_are_refused_by_name() -> None:
    base = AttentionSpec.create(6, 2)
    with pytest.raises(ValueError, match="gate must be one of elementwise, headwise"):
        GatedSpec(base, "scalar")
    with pytest.raises(TypeError, match="gate_bias must be true or false"):
        GatedSpec(base, "headwise", 1)
    with pytest.raises(TypeError, match="base must be an AttentionSpec"):
        GatedSpec({"d_model": 6}, "headwise")


def test_the_cli_counts_and_verifies_a_gated_layout(capsys) -> None:
    assert main(["count", "--d-model", "8", "--heads", "2", "--kv-heads", "1", "--output-gate", "elementwise",
                 "--gate-bias", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    spec = gated_spec(dict(d_model=8, heads=2, kv_heads=1), "elementwise", True)
    assert (record["total"], record["unidentified"]) == (gated.count(spec).total, gated.count(spec).unidentified)
    assert record["layout"]["output_gate"] == "elementwise" and record["layout"]["gate_bias"] is True
    assert main(["verify", "--d-model", "6", "--heads", "2", "--output-gate", "headwise", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["matches"] is True and record["numeric_unidentified"] == record["unidentified"] == 18 + 18
    with pytest.raises(SystemExit) as stop:
        main(["count", "--d-model", "6", "--heads", "2", "--gate-bias"])
    assert stop.value.code == 2 and "--gate-bias needs --output-gate" in capsys.readouterr().err


@pytest.mark.parametrize("bias", [False, True])
def test_qwen3_next_s_own_attention_computes_the_gated_layer_and_has_its_count(bias) -> None:
    pytest.importorskip("transformers.models.qwen3_next")
    spec = gated.qwen3_next_spec(heads=2, kv_heads=1, head_dim=4, rope_fraction=0.5, bias=bias)
    check = qwen3_next.hf_cross_check(spec)
    assert check.same_function < 1e-13 and check.symmetry_change < 1e-13 and check.off_orbit_change > 1e-7
    assert check.numeric == check.exact == gated.count(spec).unidentified
