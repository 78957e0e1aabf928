"""The two pinned pretrained models (requirements-models.txt): inspect and rebalance on real trained weights.

MiniLM (all-MiniLM-L6-v2, BERT) is a safetensors folder; SmolLM2-135M-Instruct a Q4_1 GGUF file. Both are
installed by ``make install``; outside CI a missing model skips these tests, in CI it fails them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import pytest
import torch

from attnid import schemas
from attnid.hf.checkpoint import CheckpointError, open_checkpoint
from attnid.hf.inspect import inspect_checkpoint
from attnid.hf.pretrained import pretrained_path

pytestmark = pytest.mark.real_model


def _path(name: str) -> Path:
    try:
        return pretrained_path(name)
    except CheckpointError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))


def test_minilm_dead_key_bias_and_a_generic_trained_point() -> None:
    report = inspect_checkpoint(_path("minilm"))
    jsonschema.validate(json.loads(json.dumps(report)), schemas.INSPECT)
    assert report["dead_parameters"]["key_bias"] == 2304 == 6 * 12 * 32
    assert report["unidentified_generic"] == report["unidentified_at_point"] == 152_064
    assert report["head_verdicts"] == {"generic": 72}
    for layer in report["layers"]:
        assert layer["route"] == "structured" and not layer["conditions_failing"]
        for effect in layer["dead_effect"].values():
            assert effect["change"] <= effect["bound"]


def test_minilm_rebalanced_is_the_same_model_balanced(tmp_path: Path) -> None:
    from attnid.hf.rebalance import rebalance

    out = tmp_path / "minilm-balanced"
    figures = rebalance(_path("minilm"), out)
    assert figures["tokens"] > 20  # the check ran on the model's own tokenisation of real text
    assert figures["float32_difference"] <= figures["tolerance"]
    report = inspect_checkpoint(out)
    ratios = [r for layer in report["layers"] for r in layer["query_key_norm_ratio"] + layer["value_output_norm_ratio"]]
    assert max(abs(r - 1) for r in ratios) < 1e-5
    assert report["unidentified_at_point"] == 152_064


@pytest.mark.slow
def test_smollm2_gives_a_verdict_for_every_head_and_reads_as_transformers_does() -> None:
    from transformers import AutoModelForCausalLM

    path = _path("smollm2")
    report = inspect_checkpoint(path)
    jsonschema.validate(json.loads(json.dumps(report)), schemas.INSPECT)
    heads = [h for layer in report["layers"] for h in layer["heads"]]
    assert len(heads) == 270 and all(h["verdict"] in ("generic", "degenerate", "undecided") and h["reason"] for h in heads)
    assert report["unidentified_generic"] == 374_400
    # every condition of the at-point theorem holds at the trained (dequantised) weights: the count is the generic one
    assert report["unidentified_at_point"] == 374_400 and report["head_verdicts"] == {"generic": 270}
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    checkpoint = open_checkpoint(path)
    for i in (0, 29):  # transformers' dequantised, un-permuted weights, through attnid's names and back
        attention = model.model.layers[i].self_attn
        ours = checkpoint.tensors(i, checkpoint.layer(i))
        for name, tensor in ours.items():
            module, _, _ = name.rpartition(".")
            theirs = attention.get_submodule(module.rsplit(".", 1)[-1]).weight.to(torch.float64)
            assert torch.equal(tensor, theirs), name


def test_rebalance_of_a_gguf_file_wants_a_gguf_out(tmp_path: Path) -> None:
    from attnid.hf.rebalance import rebalance

    with pytest.raises(CheckpointError, match="suffix .gguf"):
        rebalance(_path("smollm2"), tmp_path / "out")
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_smollm2_rebalanced_is_a_gguf_file_of_the_same_model_balanced(tmp_path: Path) -> None:
    from attnid.hf.rebalance import rebalance

    out = tmp_path / "smollm2-balanced.gguf"
    figures = rebalance(_path("smollm2"), out)
    assert figures["tokens"] > 20  # the GGUF file's own tokenizer read the check text
    assert figures["float32_difference"] <= figures["tolerance"] and not figures["layers_not_balanced"]
    report = inspect_checkpoint(out)
    ratios = [r for layer in report["layers"] for r in layer["query_key_norm_ratio"] + layer["value_output_norm_ratio"]]
    assert max(abs(r - 1) for r in ratios) < 1e-5
    assert report["unidentified_at_point"] == 374_400 and report["head_verdicts"] == {"generic": 270}
