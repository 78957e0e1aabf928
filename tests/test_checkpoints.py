"""Trained checkpoints: reading them (attnid.hf.checkpoint), the count at their point (attnid.hf.atpoint), rebalancing.

Tiny random checkpoints are written here with transformers' own save_pretrained for five model types. The
count at a point is checked against an independent float64 Jacobian nullity: the one of transformers' own
attention module, loaded from the checkpoint, at the checkpoint's weights (attnid.jacobian.functional_rank),
at generic and at deliberately degenerate points.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest
import torch

from attnid.hf import atpoint
from attnid.hf.checkpoint import CheckpointError, open_checkpoint
from attnid.hf.inspect import inspect_checkpoint
from attnid.hf.modules import HFLayer, additive_causal_mask, float64_rope
from attnid.jacobian import functional_rank
from attnid.layer import forward, init_params
from attnid.spec import AttentionSpec


def _model(kind: str, seed: int = 0) -> torch.nn.Module:
    import transformers as tf

    torch.manual_seed(seed)
    small = dict(hidden_size=16, num_attention_heads=4, num_hidden_layers=2, intermediate_size=32, vocab_size=64,
                 max_position_embeddings=64)
    if kind == "bert":
        return tf.BertModel(tf.BertConfig(**small))
    if kind == "gpt2":
        return tf.GPT2Model(tf.GPT2Config(n_embd=16, n_head=4, n_layer=2, vocab_size=64, n_positions=64))
    decoder = dict(small, num_key_value_heads=2, head_dim=4)
    if kind == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(**decoder))
    if kind == "qwen3":  # QK-norm weights drawn around one: transformers initialises them all to one
        model = tf.Qwen3Model(tf.Qwen3Config(**decoder))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(("q_norm.weight", "k_norm.weight")):
                    p.copy_(1 + 0.3 * torch.randn(p.shape))
        return model
    if kind == "gemma":
        return tf.GemmaModel(tf.GemmaConfig(**dict(decoder, num_key_value_heads=1)))
    raise ValueError(kind)


KINDS = ("bert", "gpt2", "llama", "qwen3", "gemma")


def _attention(model: torch.nn.Module, kind: str, i: int) -> torch.nn.Module:
    base = getattr(model, "model", model)
    if kind == "bert":
        return _BertAttention(base.encoder.layer[i].attention)
    if kind == "gpt2":
        return base.h[i].attn
    return base.layers[i].self_attn


class _BertAttention(torch.nn.Module):
    """BERT's self-attention and its output projection, without the residual LayerNorm that follows."""

    def __init__(self, attention: torch.nn.Module) -> None:
        super().__init__()
        self.inner, self.dense = attention.self, attention.output.dense

    def forward(self, x: torch.Tensor, **kwargs) -> tuple[torch.Tensor]:
        return (self.dense(self.inner(x, **kwargs)[0]),)


def _hf_layer(model: torch.nn.Module, kind: str, i: int, spec: AttentionSpec) -> HFLayer:
    module = _attention(model, kind, i).to(torch.float64).eval()

    def kwargs(x: torch.Tensor) -> dict:
        if kind == "bert":
            return {}
        mask = {"attention_mask": additive_causal_mask(x.shape[-2], x.dtype)}
        return mask if kind == "gpt2" else {**mask, "position_embeddings": float64_rope(x, spec)}

    family = "qwen3" if kind == "qwen3" else "llama"  # qwen3: its RMSNorm kept in float64 (attnid.hf.modules)
    return HFLayer(family, module, spec, dict, dict, kwargs)


def _independent_nullity(model: torch.nn.Module, kind: str, i: int, spec: AttentionSpec) -> int:
    layer = _hf_layer(model, kind, i, spec)
    gen = torch.Generator().manual_seed(7)
    n = 8
    weights = layer.weights()
    rows_needed = 2 * sum(w.numel() for w in weights.values())
    inputs = [torch.randn(1, n, spec.d_model, generator=gen, dtype=torch.float64)
              for _ in range(rows_needed // (n * spec.d_model) + 2)]
    return functional_rank(layer.output, weights, inputs).require_clear().nullity


def _degenerate(kind: str, how: str) -> Callable[[torch.nn.Module], None]:
    """Edit layer 0 of a model in place: a head that writes nothing, or two heads with one attention pattern."""

    def edit(model: torch.nn.Module) -> None:
        attn = _attention(model, kind, 0)
        with torch.no_grad():
            if kind == "bert":
                q, k, o = attn.inner.query.weight, attn.inner.key.weight, attn.dense.weight
            elif kind == "gpt2":
                q, k, o = attn.c_attn.weight.T[:16], attn.c_attn.weight.T[16:32], attn.c_proj.weight.T
            else:
                q, k, o = attn.q_proj.weight, attn.k_proj.weight, attn.o_proj.weight
            if how == "silent_head":
                o[:, :4] = 0  # head 0's output projection
            elif how == "low_rank_query":
                q[1] = q[0]  # head 0's query factor loses a rank
            elif how == "twin_heads":  # heads 0 and 1 read the same key head only without GQA
                q[4:8] = q[0:4]
                if kind in ("bert", "gpt2"):
                    k[4:8] = k[0:4]
                    if kind == "bert":
                        attn.inner.query.bias[4:8] = attn.inner.query.bias[0:4]
                        attn.inner.key.bias[4:8] = attn.inner.key.bias[0:4]
                    else:
                        attn.c_attn.bias[4:8] = attn.c_attn.bias[0:4]
                        attn.c_attn.bias[20:24] = attn.c_attn.bias[16:20]

    return edit


def _save(tmp: Path, kind: str, edit: Callable[[torch.nn.Module], None] | None = None) -> tuple[Path, torch.nn.Module]:
    model = _model(kind)
    if edit:
        edit(model)
    folder = tmp / kind
    model.save_pretrained(folder)
    return folder, model


@pytest.mark.parametrize("kind", KINDS)
def test_layer_weights_compute_what_the_transformers_module_computes(tmp_path: Path, kind: str) -> None:
    folder, model = _save(tmp_path, kind)
    checkpoint = open_checkpoint(folder)
    assert checkpoint.n_layers == 2
    for i in range(2):
        spec = checkpoint.specs[i]
        layer = _hf_layer(model, kind, i, spec)
        x = torch.randn(2, 6, spec.d_model, dtype=torch.float64)
        y = layer.output(layer.weights(), x)
        assert torch.allclose(forward(checkpoint.layer(i), x, spec), y, atol=1e-12, rtol=1e-10)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", [None, "silent_head", "low_rank_query", "twin_heads"])
def test_count_at_point_matches_an_independent_jacobian(tmp_path: Path, kind: str, how: str | None) -> None:
    folder, model = _save(tmp_path, kind, _degenerate(kind, how) if how else None)
    report = inspect_checkpoint(folder)
    # a dense limit just below the layer's size: the structured route, with a dense block only where it is smaller
    structured = inspect_checkpoint(folder, dense_limit=report["layers"][0]["parameters"] - 1)
    for i in range(2):
        spec = open_checkpoint(folder).specs[i]
        expected = _independent_nullity(model, kind, i, spec)
        assert report["layers"][i]["route"] == "dense"
        assert report["layers"][i]["unidentified_at_point"] == expected
        assert structured["layers"][i]["route"] == "structured"
        decided = structured["layers"][i]["unidentified_at_point"]
        assert decided in (None, expected)  # the structured route never claims a wrong count
        if how is None:
            assert expected == report["layers"][i]["unidentified_generic"]
        if not spec.has_qk_norm and (spec.kv_heads > 1 or how is None or i == 1):  # QK-norm: outside the theorem
            assert decided == expected  # one key/value group: the block would be the whole layer
    if how == "twin_heads" and kind in ("bert", "gpt2"):
        assert structured["layers"][0]["jacobian_block"]["groups"] == [0, 1]
    if how == "silent_head":
        assert report["layers"][0]["unidentified_at_point"] > report["layers"][0]["unidentified_generic"]
        assert structured["layers"][0]["heads"][0]["verdict"] == "degenerate"


def test_freshly_initialised_qk_norm_weights_are_not_a_generic_point(tmp_path: Path) -> None:
    import transformers as tf

    torch.manual_seed(0)
    model = tf.Qwen3Model(tf.Qwen3Config(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
                                         num_hidden_layers=1, intermediate_size=32, vocab_size=64))
    model.save_pretrained(tmp_path / "fresh")
    layer = inspect_checkpoint(tmp_path / "fresh")["layers"][0]
    spec = open_checkpoint(tmp_path / "fresh").specs[0]
    # every norm weight equal to one: more directions are invisible than at a generic point, and the
    # independent Jacobian of transformers' own module agrees
    assert layer["unidentified_at_point"] == _independent_nullity(model, "qwen3", 0, spec) > layer["unidentified_generic"]


LAYOUTS = [dict(d_model=8, heads=2), dict(d_model=8, heads=2, bias="qkvo"), dict(d_model=8, heads=4, kv_heads=2, bias="qkv"),
           dict(d_model=8, heads=2, bias="qkv"), dict(d_model=8, heads=2, rope_fraction=1.0, causal=True),
           dict(d_model=12, heads=3, kv_heads=1, rope_fraction=1.0, causal=True, bias="qvo"),
           dict(d_model=8, heads=2, causal=True, bias="v"), dict(d_model=16, heads=4, kv_heads=2, rope_fraction=0.5, causal=True)]


def _edit(name: str, spec: AttentionSpec) -> Callable[[dict], None]:
    def edit(p: dict) -> None:
        if name == "silent_head":
            p["W_O"][0].zero_()
        elif name == "low_rank_query":
            p["W_Q"][1][:, 0] = p["W_Q"][1][:, 1]
        elif name == "low_rank_value":
            p["W_V"][0][:, 0] = 0
        elif name == "low_rank_key":
            p["W_K"][0][:, 1] = 2 * p["W_K"][0][:, 0]
        elif name in ("same_pattern", "scaled_pattern"):  # head 1's scores a multiple of head 0's (same or another group)
            k0, k1 = spec.group_of_head(0), spec.group_of_head(1)
            p["W_K"][k1].copy_(p["W_K"][k0])
            p["W_Q"][1] = p["W_Q"][0] * (1.0 if name == "same_pattern" else -2.5)
            if "b_Q" in p:
                p["b_Q"][1] = p["b_Q"][0] * (1.0 if name == "same_pattern" else -2.5)
        elif name == "blind_head":  # head 0's scores are all zero: it averages
            p["W_Q"][0].zero_()
            if "b_Q" in p:
                p["b_Q"][0].zero_()
        elif name == "all_heads_alike":
            for h in range(1, spec.heads):
                p["W_Q"][h] = p["W_Q"][0]
                p["W_K"][spec.group_of_head(h)].copy_(p["W_K"][0])
                if "b_Q" in p:
                    p["b_Q"][h] = p["b_Q"][0]
    return edit


DEGENERATE = ["silent_head", "low_rank_query", "low_rank_value", "low_rank_key", "same_pattern", "scaled_pattern",
              "blind_head", "all_heads_alike"]


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()))
@pytest.mark.parametrize("edit", [None, *DEGENERATE])
def test_structured_route_agrees_with_the_dense_jacobian(layout: dict, edit: str | None) -> None:
    spec = AttentionSpec.create(**layout)
    params = init_params(spec, torch.Generator().manual_seed(3))
    if edit:
        _edit(edit, spec)(params)
    nullity, _, clear = atpoint.dense(params, spec)
    result = atpoint.structured(params, spec)
    assert clear
    assert result.unidentified in (None, nullity)
    if edit is None:
        assert result.unidentified == nullity == atpoint.generic_count(spec) and not result.block_groups
    if not (spec.has_bias("v") and not spec.has_bias("o")):
        assert result.unidentified == nullity  # the theorem, with the dense block where a condition fails
    if edit in ("same_pattern", "scaled_pattern", "blind_head") and spec.heads > 2 and spec.kv_heads > 1:
        assert len(result.block_groups) < spec.kv_heads  # the block is the affected groups, not the layer


def test_product_kernel_is_the_generic_count_at_full_rank() -> None:
    from attnid.counts import FactoredCount

    for m, n, r in ((9, 8, 4), (18, 8, 2), (8, 16, 3)):
        assert atpoint.product_kernel(r, r, m, n, r) == r * r == FactoredCount(m, r, n).unidentified
    # a rank-one U (m x 2): only one of its columns can be moved against V, so more directions are free
    assert atpoint.product_kernel(1, 2, 5, 4, 2) == (5 + 4) * 2 - (5 * 2 + 1 * 4 - 1 * 2)


def test_dead_parameters_change_nothing_beyond_round_off() -> None:
    spec = AttentionSpec.create(d_model=8, heads=2, bias="qkvo")
    params = init_params(spec, torch.Generator().manual_seed(1))
    effects = atpoint.dead_effects(params, spec)
    assert set(effects) == {"key_bias", "value_bias"}
    assert effects["key_bias"].count == 8 and effects["value_bias"].count == 8
    for effect in effects.values():
        assert effect.change <= effect.bound < 1e-8
    # a live parameter moved the same way is seen far above the bound (the check can fail)
    moved = dict(params, b_Q=torch.zeros_like(params["b_Q"]))
    x = atpoint._inputs(spec, 0)
    assert float((forward(moved, x, spec) - forward(params, x, spec)).abs().max()) > 1e3 * effects["key_bias"].bound


@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_rebalance_writes_the_same_function_balanced(tmp_path: Path, kind: str) -> None:
    from attnid.hf import rebalance as rebalance_module
    from attnid.hf.rebalance import rebalance

    folder, _ = _save(tmp_path, kind)
    out = tmp_path / "out"
    figures = rebalance(folder, out)
    assert figures["float32_difference"] <= figures["tolerance"]
    assert figures["float64_difference"] <= figures["tolerance"]  # only the weights' rounding to float32 remains
    checkpoint = open_checkpoint(folder)
    for i in range(checkpoint.n_layers):  # the move itself, in float64, changes the layer by round-off only
        spec, params = checkpoint.specs[i], checkpoint.layer(i)
        x = torch.randn(2, 6, spec.d_model, dtype=torch.float64)
        y = forward(params, x, spec)
        assert float((forward(rebalance_module.representative(params, spec)[0], x, spec) - y).abs().max()) < 1e-12 * float(y.abs().max())
    report = inspect_checkpoint(out)
    for layer in report["layers"]:
        for ratio in layer["query_key_norm_ratio"] + layer["value_output_norm_ratio"]:
            assert ratio == pytest.approx(1.0, abs=1e-5)
        for effect in layer["dead_effect"].values():
            assert effect["change"] == 0.0
    before = inspect_checkpoint(folder)
    assert any(abs(r - 1) > 1e-2 for layer in before["layers"] for r in layer["query_key_norm_ratio"])


def test_rebalance_never_touches_an_existing_out_and_leaves_nothing_on_failure(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from attnid.hf import rebalance as rb

    folder, _ = _save(tmp_path, "bert")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="already exists"):
        rb.rebalance(folder, out)
    assert (out / "keep.txt").read_text() == "mine" and len(list(out.iterdir())) == 1

    def broken(*args, **kwargs):
        raise KeyboardInterrupt  # killed during the check, after the weights were written to the staging folder

    monkeypatch.setattr(rb, "check_same_function", broken)
    target = tmp_path / "new"
    with pytest.raises(KeyboardInterrupt):
        rb.rebalance(folder, target)
    assert not target.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bert", "out"]


def test_rebalance_refuses_a_function_it_would_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from attnid.hf import rebalance as rb

    folder, _ = _save(tmp_path, "bert")

    def wrong(params, spec):  # a move that is not a symmetry: the check must catch it
        moved = dict(params, W_Q=params["W_Q"] * 1.5)
        return moved, ""

    monkeypatch.setattr(rb, "representative", wrong)
    with pytest.raises(CheckpointError, match="nothing written"):
        rb.rebalance(folder, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bert"]


def test_sharded_checkpoints_are_read_and_a_missing_shard_is_named(tmp_path: Path) -> None:
    model = _model("llama")
    folder = tmp_path / "sharded"
    model.save_pretrained(folder, max_shard_size="20KB")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1
    checkpoint = open_checkpoint(folder)
    assert checkpoint.layer(1)["W_Q"].shape == (4, 16, 4)
    (folder / shards[-1]).unlink()
    with pytest.raises(CheckpointError, match=f"shard {shards[-1]} is missing"):
        open_checkpoint(folder)


def test_structured_route_declines_what_its_theorem_does_not_cover() -> None:
    # a factor whose rank is too close to call: one key column scaled by 1e-9
    spec = AttentionSpec.create(d_model=8, heads=2, causal=True)
    params = init_params(spec, torch.Generator().manual_seed(0))
    params["W_K"][0][:, 1] *= 1e-9
    assert atpoint.structured(params, spec).unidentified is None
    assert "too close to call" in atpoint.structured(params, spec).reason
    # sliding windows and chunks (a window of one token hides every score)
    for extra in (dict(window=1), dict(chunk=1), dict(window=2, rope_fraction=1.0)):
        spec = AttentionSpec.create(d_model=8, heads=2, causal=True, **extra)
        params = init_params(spec, torch.Generator().manual_seed(0))
        assert atpoint.structured(params, spec).unidentified is None


def _llama_gguf(folder: Path, model: torch.nn.Module, quantised: tuple[str, ...] = ()) -> Path:
    """Write a Llama model as a GGUF file the way llama.cpp's converter does (Q/K rows permuted), with gguf's writer.

    Tensors whose GGUF name contains one of ``quantised`` are stored as Q8_0, the others as F32.
    """
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    config = model.config
    h, g, layers = config.num_attention_heads, config.num_key_value_heads, config.num_hidden_layers

    def permute(w: np.ndarray, heads: int) -> np.ndarray:  # rotate-half pairs to llama.cpp's interleaved pairs
        return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    modules = [("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"), ("self_attn.v_proj", "attn_v"),
               ("self_attn.o_proj", "attn_output"), ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"),
               ("mlp.down_proj", "ffn_down"), ("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ffn_norm")]
    for i in range(layers):
        names |= {f"model.layers.{i}.{a}.weight": f"blk.{i}.{b}.weight" for a, b in modules}
    folder.mkdir(parents=True)
    path = folder / "tiny.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(h)
    writer.add_head_count_kv(g)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_vocab_size(config.vocab_size)
    for name, tensor in model.state_dict().items():
        w = tensor.detach().numpy().astype(np.float32)
        if ".q_proj." in name or ".k_proj." in name:
            w = permute(w, h if ".q_proj." in name else g)
        if any(q in names[name] for q in quantised):
            writer.add_tensor(names[name], quantize(w, GGMLQuantizationType.Q8_0), raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(names[name], np.ascontiguousarray(w))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("how", [None, "silent_head", "low_rank_query"])
def test_a_gguf_checkpoint_reads_as_transformers_loads_it(tmp_path: Path, how: str | None) -> None:
    from transformers import AutoModelForCausalLM

    model = _model("llama")
    if how:
        _degenerate("llama", how)(model)
    path = _llama_gguf(tmp_path / "gguf", model)
    loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name).to(torch.float64)
    checkpoint = open_checkpoint(path)
    report = inspect_checkpoint(path)
    for i in range(2):
        spec = checkpoint.specs[i]
        attention = loaded.model.layers[i].self_attn
        for name, tensor in checkpoint.tensors(i, checkpoint.layer(i)).items():
            module = name.rsplit(".", 2)[-2]
            assert torch.equal(tensor, attention.get_submodule(module).weight), name
        assert report["layers"][i]["unidentified_at_point"] == _independent_nullity(loaded, "llama", i, spec)


def test_rebalance_of_a_gguf_file_writes_a_gguf_file_of_the_same_function(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from attnid.hf.gguf_file import GGUFFile
    from attnid.hf.rebalance import rebalance, representative

    source = _llama_gguf(tmp_path / "gguf", _model("llama"), quantised=("ffn_down",))
    with pytest.raises(CheckpointError, match="suffix .gguf"):
        rebalance(source, tmp_path / "out")
    out = tmp_path / "balanced.gguf"
    figures = rebalance(source, out)
    assert figures["float32_difference"] <= figures["tolerance"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["balanced.gguf", "gguf"]  # no staging left behind
    before, after = GGUFFile(source), GGUFFile(out)
    assert after.fields == before.fields and list(after.tensors) == list(before.tensors)
    for name, (dims, kind, _) in before.tensors.items():  # the attention tensors are float32, the rest as they were
        assert after.tensors[name][0] == dims
        if ".attn_" in name and not name.endswith("_norm.weight"):
            assert after.tensors[name][1] == 0, name
        else:
            assert after.tensors[name][1] == kind, name
            (a, n), (b, m) = before._extent(name), after._extent(name)
            assert before.data[a:a + n] == after.data[b:b + m], name
    assert any(kind == 8 for _, kind, _ in before.tensors.values())  # a Q8_0 tensor was copied byte for byte
    old, new = open_checkpoint(source), open_checkpoint(out)
    for i in range(old.n_layers):  # OUT holds the representative, rounded to float32 once
        want = representative(old.layer(i), old.specs[i])[0]
        for name, value in new.layer(i).items():
            assert torch.allclose(value, want[name].to(torch.float32).to(torch.float64), rtol=0, atol=0), name
    for layer in inspect_checkpoint(out)["layers"]:
        for ratio in layer["query_key_norm_ratio"] + layer["value_output_norm_ratio"]:
            assert ratio == pytest.approx(1.0, abs=1e-5)
    ids = torch.arange(12)[None] * 5 % 64
    with torch.no_grad():
        logits = [AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=torch.float64)(input_ids=ids).logits
                  for p in (source, out)]
    assert float((logits[1] - logits[0]).abs().max()) < 1e-5 * float(logits[0].abs().max())
    moved = [float((a - b).abs().max()) for a, b in zip(old.layer(0).values(), new.layer(0).values())]
    assert max(moved) > 1e-3  # the weights did move: the check above could fail


def test_a_gguf_tensor_the_loader_changes_beyond_a_permutation_is_not_written_back(tmp_path: Path) -> None:
    from attnid.hf.gguf_write import loaded_order

    checkpoint = open_checkpoint(_llama_gguf(tmp_path / "gguf", _model("llama")))
    source = checkpoint._source
    assert sorted(loaded_order(source, "blk.0.attn_q.weight")) == list(range(16 * 16))

    class Shifted:  # a loader that adds one to every element, as Gemma's does to its norms
        def process(self, weights, name):
            return type("T", (), {"weights": weights + 1})()

    source.processor = Shifted()
    with pytest.raises(CheckpointError, match="more than a permutation"):
        loaded_order(source, "blk.0.attn_q.weight")


def test_a_gguf_rebalance_that_moves_nothing_writes_the_source_bytes_back(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from attnid.hf import rebalance as rb

    source = _llama_gguf(tmp_path / "gguf", _model("llama"), quantised=("ffn_down",))
    monkeypatch.setattr(rb, "representative", lambda params, spec: (params, ""))  # a layer already at its point
    out = tmp_path / "same.gguf"
    rb.rebalance(source, out)
    assert out.read_bytes() == source.read_bytes()  # header, fields, index, alignment and data rebuilt exactly
