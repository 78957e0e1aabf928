"""The whole-model count (attnid.whole, attnid.hf.whole) against the float64 Jacobian of transformers models.

Each tiny configuration is built by transformers (``attnid.hf.whole_jacobian.measure``) at a random point; the
nullity of the Jacobian of its last hidden state (base) and of its logits (with the head) must equal the closed
form, and so must the parameter count, for every family, at eps 0 and at the configuration's own eps.
"""

from __future__ import annotations

import csv
import json

import jsonschema
import pytest

from attnbook.paths import data_dir
from attnbook.provenance import check_pair
from attnid import schemas
from attnid.cli import main
from attnid.hf.whole import whole_model
from attnid.hf.whole_checks import FAMILY_CONFIGS
from attnid.hf.whole_jacobian import MAX_ROWS_PER_PARAMETER, measure, next_decision

LLAMA = dict(model_type="llama", vocab_size=12, hidden_size=6, intermediate_size=10, num_hidden_layers=2,
             num_attention_heads=2, num_key_value_heads=1, head_dim=4, max_position_embeddings=16,
             architectures=["LlamaForCausalLM"])
GPT2 = dict(model_type="gpt2", vocab_size=16, n_positions=8, n_embd=8, n_layer=2, n_head=2, n_inner=12,
            architectures=["GPT2LMHeadModel"])
BERT = dict(model_type="bert", vocab_size=16, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=12, max_position_embeddings=8, type_vocab_size=2, architectures=["BertForMaskedLM"])
NEOX = dict(model_type="gpt_neox", vocab_size=12, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
            num_attention_heads=2, max_position_embeddings=16, rotary_pct=0.5, use_parallel_residual=False,
            architectures=["GPTNeoXForCausalLM"])
OPT = dict(model_type="opt", vocab_size=12, hidden_size=8, ffn_dim=12, num_hidden_layers=2, num_attention_heads=2,
           max_position_embeddings=8, word_embed_proj_dim=8, activation_function="gelu", architectures=["OPTForCausalLM"])
QWEN2 = dict(model_type="qwen2", vocab_size=12, hidden_size=8, intermediate_size=10, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16, tie_word_embeddings=False,
             architectures=["Qwen2ForCausalLM"])
MISTRAL = dict(model_type="mistral", vocab_size=10, hidden_size=8, intermediate_size=6, num_hidden_layers=1,
               num_attention_heads=4, num_key_value_heads=2, head_dim=2, max_position_embeddings=16,
               sliding_window=4, tie_word_embeddings=False, architectures=["MistralForCausalLM"])

# The configurations chapter 13 measures (attnid.hf.whole_checks.FAMILY_CONFIGS) are not repeated here: nbval
# re-executes the chapter, and test_the_chapters_measurements_agree_with_the_closed_form checks its stored
# nullities against today's closed form. These are the cases the chapter does not show.
CASES = {
    "llama tied": {**LLAMA, "rms_norm_eps": 1e-6, "tie_word_embeddings": True},
    "mistral window": MISTRAL,
    "qwen2 eps 0": {**QWEN2, "rms_norm_eps": 0.0},
    "qwen2 tied": {**QWEN2, "tie_word_embeddings": True},
    "gpt_neox eps 0": {**NEOX, "layer_norm_eps": 0.0},
    "gpt_neox tied": {**NEOX, "tie_word_embeddings": True},
    "gpt_neox 1 layer full rope": {**NEOX, "num_hidden_layers": 1, "rotary_pct": 1.0},
    "opt eps default": OPT,
    "opt untied": {**OPT, "tie_word_embeddings": False},
    "bert eps 1e-12": {**BERT, "layer_norm_eps": 1e-12},
    "bert untied": {**BERT, "tie_word_embeddings": False, "num_hidden_layers": 1},
    "bert relu eps 0": {**BERT, "hidden_act": "relu", "layer_norm_eps": 0.0},
    "opt relu": {**OPT, "activation_function": "relu"},
    "opt relu 3 layers d 6": {**OPT, "activation_function": "relu", "num_hidden_layers": 3, "hidden_size": 6,
                              "word_embed_proj_dim": 6},
    "gpt2 relu": {**GPT2, "activation_function": "relu"},
    "bert relu": {**BERT, "hidden_act": "relu", "num_hidden_layers": 1},
    "gpt_neox parallel": {**NEOX, "use_parallel_residual": True, "vocab_size": 48},
    "gpt_neox parallel 2 layers tied": {**NEOX, "use_parallel_residual": True, "vocab_size": 40, "tie_word_embeddings": True},
    "gpt_neox parallel short vocabulary": {**NEOX, "use_parallel_residual": True, "vocab_size": 24, "num_hidden_layers": 1},
    "gpt_neox parallel short vocabulary eps 0": {**NEOX, "use_parallel_residual": True, "vocab_size": 16,
                                                 "intermediate_size": 20, "layer_norm_eps": 0.0},
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_closed_form_equals_the_jacobian_nullity(name: str) -> None:
    data = CASES[name]
    record = whole_model(data)
    for key, head in (("base", False), ("whole_model", True)):
        counted = record[key]
        assert counted["unidentified"] is not None, counted["note"]
        measured = measure(data, head=head)
        assert measured.decision.clear
        assert (measured.parameters, measured.nullity) == (counted["parameters"], counted["unidentified"]), key
        assert sum(counted["breakdown"].values()) == counted["unidentified"]


CHECKS = data_dir() / "whole_model" / "checks.csv"


def test_the_chapters_measurements_agree_with_the_closed_form() -> None:
    """Chapter 13's float64 nullities (its data file, re-measured whenever nbval re-executes the chapter) against
    today's closed form and parameter count, for every configuration it lists."""
    check_pair(CHECKS)  # the file is the one its sidecar describes
    with open(CHECKS, newline="") as handle:
        stored = {(r["family"], r["configuration"]): r for r in csv.DictReader(handle)}
    listed = {(family, name): data for family, cases in FAMILY_CONFIGS.items() for name, data in cases}
    assert set(stored) == set(listed)
    for key, data in listed.items():
        record, row = whole_model(data), stored[key]
        for part, prefix in (("base", "base"), ("whole_model", "head")):
            counted = (record[part]["parameters"], record[part]["unidentified"])
            assert counted == (int(row[f"{prefix}_parameters"]), int(row[f"{prefix}_numeric"])), (key, part)


def test_the_decision_schedule_steps_a_quarter_jumps_while_the_rank_grows_and_keeps_under_the_cap() -> None:
    total = 1000
    assert next_decision(total, 1000, 900, None) == 1250  # first decision: a quarter of P later
    assert next_decision(total, 1250, 900, (1000, 900)) == 1500  # the rank held but was not clear, say
    # 100 more directions in 500 rows; 400 to go at that rate is 2,000 rows, capped at the rows so far
    assert next_decision(total, 1500, 600, (1000, 500)) == 3000
    assert next_decision(total, 4000, 700, (3000, 650)) == 7750  # 6,000 at that rate: the cap (8,000) less a quarter
    assert next_decision(total, 2000, 995, (1750, 900)) == 2250  # 14 rows at that rate, but never less than a quarter
    for rows in range(1000, 7750, 250):  # the confirming decision always fits under the cap
        assert next_decision(total, rows, 10, (rows - 250, 0)) + total // 4 <= MAX_ROWS_PER_PARAMETER * total


def test_the_stream_symmetries_change_the_count_as_the_theory_says() -> None:
    """eps 0 adds the stream's scale; an untied head adds O(d) and the final gain; a tied one adds nothing."""
    d = LLAMA["hidden_size"]
    exact = whole_model({**LLAMA, "rms_norm_eps": 1e-6, "tie_word_embeddings": False})
    scaled = whole_model({**LLAMA, "rms_norm_eps": 0.0, "tie_word_embeddings": False})
    tied = whole_model({**LLAMA, "rms_norm_eps": 1e-6, "tie_word_embeddings": True})
    assert scaled["base"]["unidentified"] == exact["base"]["unidentified"] + 1
    assert exact["whole_model"]["unidentified"] == exact["base"]["unidentified"] + d * (d - 1) // 2 + d
    assert tied["whole_model"]["unidentified"] == tied["base"]["unidentified"]


@pytest.mark.parametrize(("data", "words"), [
    ({**OPT, "activation_function": "leaky_relu"}, "leaky_relu"),
    ({**LLAMA, "hidden_act": "relu"}, "gated"),
    ({**LLAMA, "vocab_size": 6}, "more tokens than the width"),
    ({**NEOX, "attention_bias": False}, "biases on every attention projection"),
    ({"model_type": "falcon", "hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 1}, "falcon"),
    ({**OPT, "do_layer_norm_before": False}, "do_layer_norm_before"),
    ({**BERT, "position_embedding_type": "relative_key"}, "relative"),
])
def test_outside_the_theory_is_withheld_with_one_line(data: dict, words: str) -> None:
    record = whole_model(data)
    for key in ("whole_model", "base"):
        assert record[key]["unidentified"] is None and words in record[key]["note"]
        assert "\n" not in record[key]["note"]


def test_a_short_vocabulary_under_a_tied_parallel_head_is_withheld() -> None:
    record = whole_model({**NEOX, "use_parallel_residual": True, "vocab_size": 24, "tie_word_embeddings": True})
    assert record["base"]["unidentified"] is not None and "checked numerically, not proved" in record["base"]["note"]
    assert record["whole_model"]["unidentified"] is None and "tied head" in record["whole_model"]["note"]


def test_a_head_outside_the_theory_keeps_the_base_count() -> None:
    record = whole_model({**LLAMA, "architectures": ["LlamaForSequenceClassification"]})
    assert record["whole_model"]["unidentified"] is None and "LlamaForSequenceClassification" in record["whole_model"]["note"]
    assert record["base"]["unidentified"] == whole_model(LLAMA)["base"]["unidentified"]
    assert whole_model({k: v for k, v in LLAMA.items() if k != "architectures"})["whole_model"]["unidentified"] is None


def test_a_70b_config_counts_in_closed_form(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """Llama-3-70B's published shape: 70.55 billion parameters, counted without building anything."""
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
              "intermediate_size": 28672, "num_attention_heads": 64, "num_key_value_heads": 8,
              "num_hidden_layers": 80, "vocab_size": 128256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
              "max_position_embeddings": 131072, "tie_word_embeddings": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main(["count", "--config", str(path), "--whole-model", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    jsonschema.validate(out, schemas.CONFIG)
    d, layers, vocab, width = 8192, 80, 128256, 28672
    attention = 8192 * (64 + 2 * 8) * 128 + 64 * 128 * 8192
    assert out["whole_model"]["parameters"] == 2 * vocab * d + layers * (attention + 3 * d * width + 2 * d) + d
    assert out["whole_model"]["breakdown"]["residual"] == d * (d - 1) // 2
    assert out["whole_model"]["breakdown"]["mlp"] == layers * width
    assert out["base"]["breakdown"]["norms"] == layers * 2 * d


def test_whole_model_needs_a_config(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["count", "--d-model", "8", "--heads", "2", "--whole-model"])
    assert exc.value.code == 2 and "--whole-model needs --config" in capsys.readouterr().err


def test_text_report_names_both_models(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GPT2))
    assert main(["count", "--config", str(path), "--whole-model"]) == 0
    out = capsys.readouterr().out
    assert "whole model (GPT2LMHeadModel): parameters 1,272, unidentified" in out and "base model: parameters" in out
    assert "all 2 attention layers (attention only" in out


def _tiny_llama_checkpoint(folder, edit=None):
    import torch
    import transformers

    from attnid.hf.whole_jacobian import _randomise

    config = transformers.LlamaConfig(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                                      num_hidden_layers=2, intermediate_size=12, vocab_size=16,
                                      max_position_embeddings=32, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    _randomise(model, 0)
    if edit is not None:
        with torch.no_grad():
            edit(model)
    model.save_pretrained(folder)
    return folder


def test_inspect_counts_the_whole_model_at_the_checkpoints_weights(tmp_path) -> None:
    from attnid.hf.inspect import inspect_checkpoint, inspect_lines

    report = inspect_checkpoint(_tiny_llama_checkpoint(tmp_path / "generic"))
    jsonschema.validate(json.loads(json.dumps(report)), schemas.INSPECT)
    generic, point = report["whole_model"], report["whole_model_at_point"]
    assert generic["unidentified"] is not None and point == {"unidentified": generic["unidentified"], "clear": True,
                                                             "note": ""}
    assert any(line.startswith("whole model (LlamaForCausalLM)") for line in inspect_lines(report))


def test_a_degenerate_checkpoint_hides_more_at_its_point(tmp_path) -> None:
    """A final-norm gain of zero hides that coordinate of the last state from the head: the point is not generic."""
    from attnid.hf.inspect import inspect_checkpoint

    def silence(model) -> None:
        model.model.norm.weight[0] = 0.0

    report = inspect_checkpoint(_tiny_llama_checkpoint(tmp_path / "degenerate", silence))
    point = report["whole_model_at_point"]
    assert point["clear"] and point["unidentified"] > report["whole_model"]["unidentified"]


def test_a_large_checkpoint_is_not_decided_at_its_point(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from attnid.hf import inspect

    monkeypatch.setattr(inspect, "WHOLE_DENSE_LIMIT", 100)
    report = inspect.inspect_checkpoint(_tiny_llama_checkpoint(tmp_path / "large"))
    assert report["whole_model_at_point"]["unidentified"] is None
    assert "at most 100 parameters" in report["whole_model_at_point"]["note"]
