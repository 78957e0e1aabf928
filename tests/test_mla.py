"""Multi-head latent attention: closed-form count against the numeric nullity, transformers, symmetries, bad input."""

import math

import pytest
import torch

from attnid.families import mla
from attnid.census import census, load_layouts, parse_layout
from attnid.jacobian import count_parameters, flatten, input_jacobian
from attnid.rank import DEFAULT_ZERO_TOL

SMALL = {
    "q-latent, rope 2": dict(d_model=8, heads=2, kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2,
                             q_lora_rank=4),
    "no q-latent, rope 4": dict(d_model=8, heads=2, kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=4,
                                v_head_dim=2),
    "3 heads, uneven widths": dict(d_model=8, heads=3, kv_lora_rank=3, qk_nope_head_dim=1, qk_rope_head_dim=2,
                                   v_head_dim=3, q_lora_rank=5),
    "no rope": dict(d_model=6, heads=2, kv_lora_rank=5, qk_nope_head_dim=3, qk_rope_head_dim=0, v_head_dim=1,
                    q_lora_rank=3),
}


@pytest.mark.parametrize("eps", [0.0, 1e-6, 1e-2])
@pytest.mark.parametrize("name", list(SMALL))
def test_closed_form_matches_numeric_nullity(name: str, eps: float) -> None:
    spec = mla.MLASpec(norm_eps=eps, **SMALL[name])
    v = mla.verify(spec, seed=3)
    assert v.decision.clear, (name, eps, v.decision.smallest_kept, v.decision.largest_dropped)
    assert v.exact is not None and v.numeric == v.exact, (name, eps, v.numeric, v.exact)
    assert v.total == count_parameters(mla.init_params(spec, torch.Generator().manual_seed(0)))
    # the generators are independent (trivial stabiliser) and each one is a null direction of the Jacobian
    assert v.orbit == v.exact and v.orbit_stretch < 1e-12


def test_eps_turns_each_scale_into_a_weak_direction() -> None:
    base = SMALL["q-latent, rope 2"]
    stretch = {eps: mla.verify(mla.MLASpec(norm_eps=eps, **base), seed=1).weak for eps in (0.0, 1e-6, 1e-4)}
    for name in ("W_DKV scale", "W_DQ scale"):
        assert stretch[0.0][name] < 1e-14  # eps = 0: a null direction
        assert DEFAULT_ZERO_TOL < stretch[1e-6][name] < 1e-4  # seen, but weakly
        # proportional to eps: d/dt N(t z) = z eps / (mean z^2 + eps)^(3/2) at t = 1
        assert 50 < stretch[1e-4][name] / stretch[1e-6][name] < 200
    counts = {eps: mla.count(mla.MLASpec(norm_eps=eps, **base)) for eps in (0.0, 1e-6)}
    assert counts[0.0].unidentified - counts[1e-6].unidentified == 2 == counts[1e-6].weakly_identified


def test_uncovered_layouts_say_why_and_are_not_counted() -> None:
    wide = mla.MLASpec(d_model=4, heads=2, kv_lora_rank=6, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2)
    c = mla.count(wide)
    assert c.unidentified is None and c.ratio is None and "kv_lora_rank 6 > d_model 4" in c.note
    v = mla.verify(wide)
    assert v.exact is None and not v.matches and v.numeric > v.orbit  # more than the generators: measured only


@pytest.mark.parametrize("name", list(SMALL))
def test_symmetries_leave_the_output_unchanged(name: str) -> None:
    for eps in (0.0, 1e-6):
        spec = mla.MLASpec(norm_eps=eps, **SMALL[name])
        gen = torch.Generator().manual_seed(5)
        params = mla.init_params(spec, gen)
        x = torch.randn(3, 6, spec.d_model, generator=gen, dtype=torch.float64)
        y = mla.forward(params, x, spec)
        moved = mla.apply_symmetry(params, spec, mla.random_symmetry(spec, gen, scale=0.5))
        assert max(float((moved[k] - params[k]).abs().max()) for k in params) > 0.1  # a real move
        assert float((mla.forward(moved, x, spec) - y).abs().max()) < 1e-12 * float(y.abs().max())


def test_scale_is_not_a_symmetry_when_eps_is_positive() -> None:
    spec = mla.MLASpec(norm_eps=1e-2, **SMALL["no q-latent, rope 4"])
    gen = torch.Generator().manual_seed(2)
    params = mla.init_params(spec, gen)
    x = torch.randn(6, spec.d_model, generator=gen, dtype=torch.float64)
    scaled = dict(params, W_DKV=2 * params["W_DKV"])
    assert float((mla.forward(scaled, x, spec) - mla.forward(params, x, spec)).abs().max()) > 1e-4
    element = mla.random_symmetry(mla.MLASpec(norm_eps=0.0, **SMALL["no q-latent, rope 4"]), gen)
    with pytest.raises(ValueError, match="only when norm_eps = 0"):
        mla.apply_symmetry(params, spec, element)


def test_rope_commutant_is_shared_not_per_head() -> None:
    """A commutant element on one head's rotated queries alone is not a symmetry: the rotated key is shared."""
    spec = mla.MLASpec(norm_eps=0.0, **SMALL["no q-latent, rope 4"])
    gen = torch.Generator().manual_seed(4)
    params = mla.init_params(spec, gen)
    x = torch.randn(6, spec.d_model, generator=gen, dtype=torch.float64)
    c = torch.eye(4, dtype=torch.float64) + 0.3 * mla.rope_commutant_basis(4)[1]
    w_q = params["W_Q"].clone()
    w_q[0, :, 2:] = w_q[0, :, 2:] @ c
    one_head = dict(params, W_Q=w_q, W_KR=params["W_KR"] @ torch.linalg.inv(c).T)
    change = float((mla.forward(one_head, x, spec) - mla.forward(params, x, spec)).abs().max())
    assert change > 1e-4


@pytest.mark.parametrize(("version", "interleave", "tol"), [("v3", True, 1e-13), ("v3", False, 1e-13), ("v2", True, 1e-6)])
def test_transformers_deepseek_attention_computes_the_same_function(version: str, interleave: bool, tol: float) -> None:
    for q_lora in (6, None):
        spec = mla.MLASpec(d_model=8, heads=2, kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=4, v_head_dim=3,
                           q_lora_rank=q_lora, norm_eps=1e-6)
        check = mla.hf_cross_check(spec, version, seed=1, interleave=interleave)
        assert check.round_trip == 0.0
        # V3 in float64 to round-off; V2 rotates its queries and keys as complex64 (float32), hence its tolerance
        assert check.same_function < tol, check
        assert check.symmetry_change < tol, check


def test_transformers_norms_in_float32_are_the_only_deviation() -> None:
    spec = mla.MLASpec(d_model=8, heads=2, kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2,
                       q_lora_rank=4)
    shipped = mla.hf_cross_check(spec, "v3", norm_in_float64=False)
    assert 1e-10 < shipped.same_function < 1e-5  # float32 RMSNorm inside a float64 module


def test_from_hf_config_reads_deepseek_v3_and_lists_what_it_ignores() -> None:
    from transformers import DeepseekV3Config

    cfg = DeepseekV3Config().to_dict()
    spec, ignored = mla.MLASpec.from_hf_config(cfg)
    assert (spec.d_model, spec.heads, spec.q_lora_rank, spec.kv_lora_rank) == (7168, 128, 1536, 512)
    assert (spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.v_head_dim, spec.rope_base) == (128, 64, 128, 10000.0)
    read = {"hidden_size", "num_attention_heads", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim",
            "qk_rope_head_dim", "v_head_dim", "rope_parameters", "rope_theta"}
    assert set(cfg) - read <= set(ignored), sorted(set(cfg) - read - set(ignored))  # nothing dropped silently
    assert "rms_norm_eps" in ignored and "vocab_size" in ignored


def test_from_hf_config_v2_lite_and_kimi_text_config() -> None:
    lite = {"hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 16, "q_lora_rank": None,
            "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
            "rope_theta": 10000, "num_hidden_layers": 27, "n_routed_experts": 64}
    spec, ignored = mla.MLASpec.from_hf_config(lite)
    assert spec.q_lora_rank is None and spec.query_input == 2048
    assert set(ignored) == {"num_key_value_heads", "num_hidden_layers", "n_routed_experts"}
    kimi = {"model_type": "kimi_k25", "text_config": {**lite, "hidden_size": 7168, "num_attention_heads": 64,
                                                      "num_key_value_heads": 64, "q_lora_rank": 1536,
                                                      "rope_theta": 50000.0}}
    spec, ignored = mla.MLASpec.from_hf_config(kimi)
    assert (spec.heads, spec.q_lora_rank, spec.rope_base) == (64, 1536, 50000.0)
    assert "model_type" in ignored and "text_config.n_routed_experts" in ignored


def test_from_hf_config_reads_widths_written_as_integral_floats() -> None:
    """Some JSON writers give 7168 as 7168.0: the reader takes it (inside a text_config too); 4096.5 stays an error."""
    lite = {"hidden_size": 2048.0, "num_attention_heads": 16.0, "num_key_value_heads": 16.0, "q_lora_rank": None,
            "kv_lora_rank": 512.0, "qk_nope_head_dim": 128.0, "qk_rope_head_dim": 64.0, "v_head_dim": 128.0}
    spec, _ = mla.MLASpec.from_hf_config({"text_config": lite})
    assert (spec.d_model, spec.heads, spec.kv_lora_rank, spec.v_head_dim) == (2048, 16, 512, 128)
    assert all(type(getattr(spec, f)) is int for f in ("d_model", "heads", "kv_lora_rank", "qk_rope_head_dim"))
    with pytest.raises(TypeError, match="d_model must be an integer"):
        mla.MLASpec.from_hf_config({**lite, "hidden_size": 2048.5})


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        ({"d_model": 0}, ValueError, "d_model must be an integer from 1 to 1,000,000, got 0"),
        ({"heads": 2.0}, TypeError, "heads must be an integer"),
        ({"qk_rope_head_dim": 3}, ValueError, "qk_rope_head_dim must be an even integer from 0 to 1,000,000, got 3"),
        ({"q_lora_rank": 0}, ValueError, "q_lora_rank must be an integer from 1 to 1,000,000, got 0"),
        ({"norm_eps": -1e-6}, ValueError, r"norm_eps must be a number in \[0, 1\], got -1e-06"),
        ({"norm_eps": float("nan")}, ValueError, "norm_eps"),
        ({"rope_base": 1.0}, ValueError, "rope_base"),
        ({"causal": 1}, TypeError, "causal"),
    ],
)
def test_bad_spec_fields_name_the_field(fields: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        mla.MLASpec(**{**SMALL["q-latent, rope 2"], **fields})


def test_bad_hf_configs() -> None:
    good = {"hidden_size": 8, "num_attention_heads": 2, "kv_lora_rank": 4, "qk_nope_head_dim": 2,
            "qk_rope_head_dim": 2, "v_head_dim": 2}
    assert mla.MLASpec.from_hf_config({**good, "q_lora_rank": None})[0].q_lora_rank is None
    with pytest.raises(ValueError, match="missing kv_lora_rank"):
        mla.MLASpec.from_hf_config({k: v for k, v in good.items() if k != "kv_lora_rank"})
    with pytest.raises(ValueError, match="num_key_value_heads must equal num_attention_heads"):
        mla.MLASpec.from_hf_config({**good, "q_lora_rank": None, "num_key_value_heads": 1})
    with pytest.raises(ValueError, match="attention_bias"):
        mla.MLASpec.from_hf_config({**good, "q_lora_rank": None, "attention_bias": True})
    with pytest.raises(TypeError, match="mapping"):
        mla.MLASpec.from_hf_config([("hidden_size", 8)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="q_lora_rank is missing"):
        mla.MLASpec.from_hf_config(good)
    with pytest.raises(TypeError, match="config.json: heads must be an integer.*num_attention_heads"):
        mla.MLASpec.from_hf_config({**good, "q_lora_rank": None, "num_attention_heads": "2", "num_key_value_heads": "2"})
    with pytest.raises(ValueError, match="config.json: kv_lora_rank must be an integer from 1"):
        mla.MLASpec.from_hf_config({**good, "q_lora_rank": None, "kv_lora_rank": 0})
    with pytest.raises(TypeError, match="rope_theta must be a number"):
        mla.MLASpec.from_hf_config({**good, "q_lora_rank": None, "rope_theta": "1e4"})


def test_bad_params_and_inputs() -> None:
    spec = mla.MLASpec(**SMALL["q-latent, rope 2"])
    params = mla.init_params(spec, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="input width 5 does not match d_model 8"):
        mla.forward(params, torch.zeros(3, 5, dtype=torch.float64), spec)
    with pytest.raises(ValueError, match="W_DKV contains NaN"):
        mla.apply_symmetry(dict(params, W_DKV=params["W_DKV"] * float("nan")), spec,
                           mla.random_symmetry(spec, torch.Generator()))
    with pytest.raises(ValueError, match="missing \\['W_O'\\]"):
        mla.apply_symmetry({k: v for k, v in params.items() if k != "W_O"}, spec,
                           mla.random_symmetry(spec, torch.Generator()))
    with pytest.raises(ValueError, match="W_UK has shape"):
        mla.labelled_tangent_directions(dict(params, W_UK=params["W_UK"][:, :, :1]), spec)
    with pytest.raises(ValueError, match="version must be 'v2' or 'v3'"):
        mla.hf_module(spec, "v4")


def test_tangent_directions_are_null_for_the_jacobian_and_count_by_source() -> None:
    spec = mla.MLASpec(norm_eps=0.0, **SMALL["q-latent, rope 2"])
    params = mla.init_params(spec, torch.Generator().manual_seed(7))
    labelled = mla.labelled_tangent_directions(params, spec)
    by_source: dict[str, int] = {}
    for source, _ in labelled:
        by_source[source] = by_source.get(source, 0) + 1
    assert by_source == mla.count(spec).breakdown
    x = torch.randn(6, spec.d_model, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    jac = input_jacobian(lambda p, t: mla.forward(p, t, spec), params, x, "forward")
    scale = float(torch.linalg.matrix_norm(jac, 2))
    for _, direction in labelled:
        v = flatten(direction)
        assert float((jac @ v).norm()) < 1e-12 * scale * float(v.norm())


def test_census_mla_entries_follow_attnid_mla() -> None:
    """The census's MLA rows equal attnid.families.mla's count of the same layout read from transformers' config defaults."""
    from transformers import DeepseekV3Config

    rows = {row.layout.key: row.record() for row in census(load_layouts())}
    v3, _ = mla.MLASpec.from_hf_config(DeepseekV3Config().to_dict())
    assert rows["deepseek-v3"]["parameters_per_layer"] == mla.count(v3).total
    assert rows["deepseek-v3"]["unidentified_per_layer"] == mla.count(v3).unidentified
    for key in ("deepseek-v2", "deepseek-v3", "kimi-k2"):
        assert rows[key]["ratio"] is not None and rows[key]["layout"].startswith("MLA ")
    # Kimi K2 is DeepSeek-V3 with half the heads: only the per-head terms change
    difference = rows["deepseek-v3"]["unidentified_per_layer"] - rows["kimi-k2"]["unidentified_per_layer"]
    assert difference == 64 * (128**2 + 128**2)


@pytest.mark.parametrize(
    ("mla_block", "extra", "message"),
    [
        ("yes", {}, "must be a mapping"),
        ({"kv_lora_rank": 4, "q_lora_rank": None, "qk_nope_head_dim": 2}, {}, "missing key\\(s\\) qk_rope_head_dim"),
        ({"kv_lora_rank": 4, "q_lora_rank": None, "qk_nope_head_dim": 2, "qk_rope_head_dim": 2, "rank": 1}, {},
         "unknown key"),
        ({"kv_lora_rank": 4, "q_lora_rank": None, "qk_nope_head_dim": 1, "qk_rope_head_dim": 2}, {},
         "head_dim 4 must equal qk_nope_head_dim \\+ qk_rope_head_dim = 3"),
        ({"kv_lora_rank": 4, "q_lora_rank": None, "qk_nope_head_dim": 2, "qk_rope_head_dim": 2}, {"kv_heads": 1},
         "needs kv_heads = heads"),
        ({"kv_lora_rank": 4.5, "q_lora_rank": None, "qk_nope_head_dim": 2, "qk_rope_head_dim": 2}, {},
         "kv_lora_rank must be an integer"),
    ],
)
def test_census_mla_block_errors_name_the_field(mla_block: object, extra: dict, message: str) -> None:
    entry = {"d_model": 8, "heads": 2, "kv_heads": 2, "head_dim": 4, "layers": 1, "mla": mla_block, **extra}
    with pytest.raises(ValueError, match=f"layout 'm', field 'mla': {message}"):
        parse_layout("m", entry)


def test_census_mla_block_counts_a_user_layout() -> None:
    entry = {"d_model": 8, "heads": 2, "kv_heads": 2, "head_dim": 4, "v_head_dim": 2, "layers": 3,
             "mla": {"kv_lora_rank": 4, "q_lora_rank": None, "qk_nope_head_dim": 2, "qk_rope_head_dim": 2}}
    layout = parse_layout("m", entry)
    row = census([layout])[0].record()
    spec = mla.MLASpec(d_model=8, heads=2, kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2)
    assert row["unidentified_per_layer"] == mla.count(spec).unidentified == mla.verify(spec).numeric
    assert math.isclose(row["ratio"], mla.count(spec).ratio)


@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_transformers_module_jacobian_nullity_equals_the_count(eps: float) -> None:
    """The count predicts the nullity of transformers' own DeepseekV3Attention, not only of attnid's layer."""
    for q_lora in (4, None):
        spec = mla.MLASpec(d_model=8, heads=2, kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2,
                           q_lora_rank=q_lora, norm_eps=eps)
        decision = mla.hf_nullity(spec, "v3", seed=2)
        assert decision.clear and decision.nullity == mla.count(spec).unidentified, (eps, q_lora, decision.nullity)


def test_from_hf_config_reads_v2_and_kimi_k25_config_classes() -> None:
    from transformers import DeepseekV2Config, Kimi_K25Config

    cfg = DeepseekV2Config().to_dict()
    spec, ignored = mla.MLASpec.from_hf_config(cfg)
    assert (spec.d_model, spec.heads, spec.q_lora_rank, spec.kv_lora_rank) == (4096, 32, 1536, 512)
    assert set(cfg) - set(mla.spec.CONFIG_KEYS_READ) - {"rope_parameters", "rope_theta"} <= set(ignored)
    outer = Kimi_K25Config().to_dict()  # a text_config (DeepSeek-V3 defaults) inside a multimodal config
    spec, ignored = mla.MLASpec.from_hf_config(outer)
    assert spec.heads == outer["text_config"]["num_attention_heads"] and spec.kv_lora_rank == 512
    assert {k for k in outer if k != "text_config"} <= set(ignored)
    assert all(f"text_config.{k}" in ignored for k in outer["text_config"]
               if k not in mla.spec.CONFIG_KEYS_READ and k not in ("rope_parameters", "rope_theta"))
