"""The --json output of every subcommand follows its published schema (attnid.schemas)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from attnid import schemas
from attnid.cli import main

CONFIGS = sorted(p for p in (Path(__file__).parent / "fixtures" / "hf_configs").iterdir() if (p / "config.json").is_file())


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> object:
    code = main(argv)
    out = capsys.readouterr().out
    assert code in (0, 1), (argv, code)
    return json.loads(out)


@pytest.mark.parametrize("name", sorted(schemas.SCHEMAS))
def test_each_schema_is_a_valid_json_schema(name: str) -> None:
    jsonschema.Draft202012Validator.check_schema(schemas.SCHEMAS[name])


@pytest.mark.parametrize("flags", [[], ["--kv-heads", "1", "--bias", "qkvo", "--rope-fraction", "0.5"],
                                   ["--qk-norm", "per-head"], ["--output-gate", "elementwise"], ["--alibi"],
                                   ["--relative-bias", "8"]])
def test_count_and_verify_follow_their_schemas(capsys: pytest.CaptureFixture[str], flags: list[str]) -> None:
    layout = ["--d-model", "8", "--heads", "2", *flags]
    jsonschema.validate(_json(capsys, ["count", *layout, "--json"]), schemas.COUNT)
    jsonschema.validate(_json(capsys, ["verify", *layout, "--json"]), schemas.VERIFY)


def test_census_follows_its_schema(capsys: pytest.CaptureFixture[str]) -> None:
    jsonschema.validate(_json(capsys, ["census", "--json"]), schemas.CENSUS)


@pytest.mark.parametrize("folder", CONFIGS, ids=lambda p: p.name)
def test_every_fixture_config_follows_its_schema(capsys: pytest.CaptureFixture[str], folder: Path) -> None:
    jsonschema.validate(_json(capsys, ["count", "--config", str(folder), "--json"]), schemas.CONFIG)


def test_a_key_the_schema_does_not_list_fails() -> None:
    record = {k: 0 for k in schemas.COUNT["required"]} | {"layout": {}, "covered": True, "note": "", "breakdown": {}}
    jsonschema.validate(record, schemas.COUNT)
    with pytest.raises(jsonschema.ValidationError, match="Additional properties"):
        jsonschema.validate({**record, "surprise": 1}, schemas.COUNT)


@pytest.mark.parametrize("kind", ["bert", "llama", "qwen3"])
def test_inspect_and_rebalance_follow_their_schemas(capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str) -> None:
    import torch
    import transformers as tf

    torch.manual_seed(0)
    small = dict(hidden_size=16, num_attention_heads=4, num_hidden_layers=1, intermediate_size=32, vocab_size=64)
    model = {"bert": lambda: tf.BertModel(tf.BertConfig(**small)),
             "llama": lambda: tf.LlamaModel(tf.LlamaConfig(**small, num_key_value_heads=1, head_dim=4)),
             "qwen3": lambda: tf.Qwen3Model(tf.Qwen3Config(**small, num_key_value_heads=2, head_dim=4))}[kind]()
    model.save_pretrained(tmp_path / "in")
    for limit in ("4096", "0"):  # the dense route and the structured one
        jsonschema.validate(_json(capsys, ["inspect", str(tmp_path / "in"), "--json", "--dense-limit", limit]),
                            schemas.INSPECT)
    jsonschema.validate(_json(capsys, ["rebalance", str(tmp_path / "in"), str(tmp_path / "out"), "--json"]),
                        schemas.REBALANCE)
