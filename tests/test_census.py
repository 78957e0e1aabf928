"""The census: shipped layouts load, counts follow the theory, malformed files get clear errors."""

import json
from pathlib import Path

import pytest

from attnid.census import SHIPPED, bias_status, census, load_layouts, parse_layout
from attnid.cli import main
from attnid.spec import AttentionSpec

PAPER_MODELS = {"gpt2", "bert-base", "pythia-160m", "llama-2-7b", "llama-3-8b", "mistral-7b", "qwen2-7b", "falcon-7b",
                "phi-2", "gemma-7b", "olmo-2-7b", "gpt-oss-20b", "deepseek-v2"}
MODERN_MODELS = {"qwen3-8b", "gemma-2-2b", "gemma-3", "llama-4-scout", "llama-4-nope"}


def test_shipped_layouts_cover_the_paper_table() -> None:
    layouts = {lay.key: lay for lay in load_layouts()}
    assert PAPER_MODELS | MODERN_MODELS <= set(layouts)
    assert all(lay.source for lay in layouts.values()), "every entry names its source"
    assert layouts["deepseek-v2"].covered and layouts["deepseek-v2"].mla is not None  # counted by attnid.families.mla
    assert not layouts["gemma-2-2b"].covered  # soft-capping
    assert layouts["olmo-2-7b"].covered and layouts["olmo-2-7b"].spec.qk_norm == "full"  # no stand-in any more
    assert layouts["mistral-7b"].covered and layouts["mistral-7b"].spec.window == 4096  # a window changes no count
    assert not layouts["bert-base"].spec.causal


def test_census_rows_follow_the_counts() -> None:
    rows = {row.layout.key: row.record() for row in census(load_layouts())}
    llama2 = rows["llama-2-7b"]
    # MHA with full RoPE, no biases: H (d_k + d_v^2) per layer
    assert llama2["unidentified_per_layer"] == 32 * (128 + 128**2)
    assert llama2["parameters_all_layers"] == 32 * 4 * 4096**2
    # GQA with RoPE: G (d_k + d_v^2)
    assert rows["llama-3-8b"]["unidentified_per_layer"] == 8 * (128 + 128**2)
    # multi-query Falcon: one group
    assert rows["falcon-7b"]["unidentified_per_layer"] == 64 + 64**2
    assert rows["gemma-2-2b"]["ratio"] is None
    # DeepSeek-V2: counted by attnid.families.mla, every layer the same
    assert rows["deepseek-v2"]["unidentified_all_layers"] == rows["deepseek-v2"]["layers"] * rows["deepseek-v2"]["unidentified_per_layer"]
    # OLMo-2: QK-norm over the full width, eps > 0: the weight trade G r/2 and the value side G d_v^2
    assert rows["olmo-2-7b"]["unidentified_per_layer"] == 32 * (64 + 128**2)
    assert rows["olmo-2-7b"]["parameters_per_layer"] == 4 * 4096**2 + 2 * 4096  # two weights of 32 x 128
    assert rows["olmo-2-7b"]["weakly_identified_per_layer"] == 2
    # Qwen3-8B: shared QK-norm, one trade of r/2 = 64 for all heads
    assert rows["qwen3-8b"]["unidentified_per_layer"] == 64 + 8 * 128**2
    # Mistral: the window changes nothing; gpt-oss: windowed and full layers count the same
    assert rows["mistral-7b"]["unidentified_per_layer"] == rows["llama-3-8b"]["unidentified_per_layer"]
    assert rows["gpt-oss-20b"]["unidentified_all_layers"] == 24 * rows["gpt-oss-20b"]["unidentified_per_layer"]
    assert rows["gpt-oss-20b"]["masked_layers"] == 12 and rows["gemma-3"]["masked_layers"] == 22
    # Llama 4: an unweighted QK-norm leaves one rotation angle per RoPE pair (r/2 = 64) per group
    assert rows["llama-4-scout"]["unidentified_per_layer"] == 8 * (64 + 128**2)
    assert rows["llama-4-nope"]["unidentified_per_layer"] == 8 * (128**2 + 128**2)
    assert rows["gpt2"]["biases"]["k"].startswith("dead")
    assert rows["qwen3-8b"]["biases"] == {}
    assert rows["qwen2-7b"]["biases"]["k"].startswith("alive")
    assert rows["gpt-oss-20b"]["biases"]["v"].startswith("identified")
    mla = {lay.key for lay in load_layouts() if lay.mla is not None}  # latent symmetries: above MHA (chapter 7c)
    for key, r in rows.items():
        if r["ratio"] is not None and key not in mla:
            assert r["ratio"] <= r["plain_mha_ratio"] + 1e-15, key


def test_bias_status_under_partial_rope() -> None:
    status = bias_status(AttentionSpec.create(8, 1, bias="qkvo", rope_fraction=0.5))
    assert status == {"q": "identified", "k": "alive on 4 rotated coordinates, dead on 4",
                      "v": "folded into the output bias", "o": "identified"}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"d_model": 8, "heads": 2, "kv_heads": 2, "head_dim": 4}, "missing field"),
        ({"d_model": 8, "heads": 2, "kv_heads": 2, "head_dim": 4, "layers": 0}, "field 'layers': must be an integer from 1 to 2,147,483,647"),
        ({"d_model": 8, "heads": 2, "kv_heads": 3, "head_dim": 4, "layers": 1}, "must divide heads"),
        ({"d_model": 8, "heads": 2, "kv_heads": 2, "head_dim": 4, "layers": 1, "size": 3}, "unknown field"),
        ({"d_model": 8, "heads": 2, "kv_heads": 2, "head_dim": 4, "layers": 1, "uncovered": ["moe"]}, "uncovered"),
        ({"d_model": 8, "heads": 2, "kv_heads": 2, "head_dim": 4, "layers": 1, "sink": "maybe"}, "sink"),
        ({"d_model": 8, "heads": 2, "kv_heads": 2, "head_dim": 4, "layers": 1, "bias": "qz"}, "unknown letter"),
        ("not a mapping", "must be a mapping"),
    ],
)
def test_malformed_entries_name_the_entry_and_field(entry: object, message: str) -> None:
    with pytest.raises(ValueError, match=f"layout 'm'.*{message}"):
        parse_layout("m", entry)


def test_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read"):
        load_layouts(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [1, 2\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_layouts(bad)
    bad.write_text("layouts: {}\n")
    with pytest.raises(ValueError, match="top-level 'models'"):
        load_layouts(bad)


def test_census_cli(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    assert main(["census", "--model", "gpt2", "falcon-7b", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert [m["model"] for m in record["models"]] == ["gpt2", "falcon-7b"]
    assert main(["census"]) == 0
    assert "deepseek-v2" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["census", "--model", "gpt-5"])
    assert exc.value.code == 2 and "unknown model(s) gpt-5" in capsys.readouterr().err
    user = tmp_path / "mine.yaml"
    user.write_text("models:\n  tiny:\n    d_model: 8\n    heads: 2\n    kv_heads: 1\n    head_dim: 4\n    layers: 2\n")
    assert main(["census", "--file", str(user), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["models"][0]["unidentified_per_layer"] == 16 + 16


def test_shipped_file_is_the_package_one() -> None:
    assert SHIPPED.name == "architectures.yaml" and SHIPPED.is_file()


LAYOUT_FIELD = {"n_embd": "d_model", "hidden_size": "d_model", "n_head": "heads", "num_attention_heads": "heads",
                "num_key_value_heads": "kv_heads", "head_dim": "head_dim", "n_layer": "layers",
                "num_hidden_layers": "layers", "rms_norm_eps": "qk_norm_eps", "sliding_window": "window",
                "attention_chunk_size": "chunk"}


@pytest.mark.parametrize("layout", [lay for lay in load_layouts() if lay.transformers_check], ids=lambda lay: lay.key)
def test_layout_matches_the_transformers_config_defaults(layout) -> None:
    import transformers

    check = layout.transformers_check
    config = getattr(transformers, check["config"])()  # defaults only: nothing is downloaded
    for field, expected in check["fields"].items():
        attr, _, key = field.partition(".")  # "rope_parameters.rope_theta" reads a key of a dict attribute
        value = getattr(config, attr)[key] if key else getattr(config, attr)
        assert value == expected, (layout.key, field, value)
        if field in LAYOUT_FIELD:
            attr = LAYOUT_FIELD[field]
            ours = layout.layers if attr == "layers" else getattr(layout.spec, attr)
            assert ours == expected, (layout.key, field, ours)


def test_causal_field_defaults_to_decoder_and_bert_is_bidirectional() -> None:
    layouts = {lay.key: lay for lay in load_layouts()}
    assert not layouts["bert-base"].spec.causal, "BERT attends both ways"
    assert layouts["gpt2"].spec.causal and layouts["llama-3-8b"].spec.causal  # decoders: the default
    base = {"d_model": 8, "heads": 2, "kv_heads": 2, "head_dim": 4, "layers": 1}
    assert parse_layout("m", base).spec.causal is True
    assert parse_layout("m", {**base, "causal": False}).spec.causal is False


@pytest.mark.parametrize("value", ["no", 0, 1, "false", None])
def test_causal_field_must_be_a_yaml_bool(value: object) -> None:
    entry = {"d_model": 8, "heads": 2, "kv_heads": 2, "head_dim": 4, "layers": 1, "causal": value}
    with pytest.raises(ValueError, match=r"layout 'm', field 'causal': must be true or false"):
        parse_layout("m", entry)


def test_qwen3_entry_agrees_with_the_published_config() -> None:
    from attnid.hf.config import model_count

    row = next(r.record() for r in census(load_layouts()) if r.layout.key == "qwen3-8b")
    (group,) = model_count(Path(__file__).parent / "fixtures" / "hf_configs" / "qwen3-8b").groups
    assert (group.total, group.unidentified) == (row["parameters_per_layer"], row["unidentified_per_layer"])


@pytest.mark.parametrize(("extra", "message"), [
    ({"qk_norm": "rms"}, "field 'qk_norm': must be one of"),
    ({"qk_norm_eps": 1e-6}, "needs a qk_norm other than none"),
    ({"qk_norm": "shared", "qk_norm_eps": -1}, r"must be a number in \[0, 1\], got -1"),
    ({"window": 0}, "field 'window': must be an integer from 1 to 2,147,483,647, got 0"),
    ({"window": 4, "causal": False}, "needs causal: true"),
    ({"window_layers": 1}, "needs a window"),
    ({"window": 4, "window_layers": 3}, "must be an integer from 1 to layers"),
    ({"window": 4, "chunk": 4}, "not both"),
])
def test_malformed_modern_fields(extra: dict, message: str) -> None:
    entry = {"d_model": 8, "heads": 2, "kv_heads": 2, "head_dim": 4, "layers": 2, **extra}
    with pytest.raises(ValueError, match=f"layout 'm'.*{message}"):
        parse_layout("m", entry)


def test_gated_alibi_and_relative_bias_rows() -> None:
    from attnid.families import gated
    from attnid.counts import count

    rows = {row.layout.key: row.record() for row in census(load_layouts())}
    qwen = next(lay for lay in load_layouts() if lay.key == "qwen3-next-80b")
    assert isinstance(qwen.layout, gated.GatedSpec) and qwen.layout.gate == "elementwise"
    assert rows["qwen3-next-80b"]["unidentified_per_layer"] == gated.count(qwen.layout).unidentified
    assert rows["qwen3-next-80b"]["unidentified_all_layers"] == 12 * gated.count(qwen.layout).unidentified
    bloom = next(lay for lay in load_layouts() if lay.key == "bloom")
    assert rows["bloom"]["unidentified_per_layer"] == count(bloom.spec).unidentified  # ALiBi changes no count
    from attnid.families import relbias

    for key, unseen in (("t5-small", 1), ("t5-small-decoder", 0)):  # T5's map leaves one encoder bucket unused
        t5 = next(lay for lay in load_layouts() if lay.key == key)
        plain = count(t5.spec)
        assert rows[key]["unidentified_per_layer"] == plain.unidentified + 8 * (1 + unseen)
        assert rows[key]["unidentified_all_layers"] == 6 * plain.unidentified + 8 * (1 + unseen)
        assert rows[key]["parameters_all_layers"] == 6 * plain.total + 8 * 32
        assert len(relbias.seen_buckets(t5.layout)) == 32 - unseen


@pytest.mark.parametrize("extra,message", [
    ("    output_gate: scalar\n", "field .output_gate.: must be one of none, elementwise, headwise"),
    ("    gate_bias: true\n", "field .gate_bias.: needs an output_gate"),
    ("    output_gate: headwise\n    gate_bias: 1\n", "field .gate_bias.: must be true or false"),
    ("    relative_bias: 32\n", "field .relative_bias.: must be a mapping with buckets"),
    ("    relative_bias: {buckets: 32, slopes: 2}\n", "field .relative_bias.: must be a mapping with buckets"),
    ("    relative_bias: {buckets: 32, every_layer: 1}\n", "field .relative_bias.: every_layer must be true or false"),
    ("    relative_bias: {buckets: 32, max_distance: 4}\n", "field .relative_bias.: max_distance .4. must exceed"),
    ("    relative_bias: {buckets: 1.5}\n", "field .relative_bias.: buckets must be an integer"),
    ("    rope_fraction: 1.0\n    relative_bias: {buckets: 32}\n", "field .relative_bias.: replaces RoPE"),
])
def test_bad_gate_fields_are_refused(tmp_path: Path, extra: str, message: str) -> None:
    user = tmp_path / "mine.yaml"
    user.write_text("models:\n  tiny:\n    d_model: 8\n    heads: 2\n    kv_heads: 1\n    head_dim: 4\n    layers: 2\n" + extra)
    with pytest.raises(ValueError, match=message):
        load_layouts(user)
