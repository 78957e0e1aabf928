"""Hostile config.json and layout files through the CLI, in-process: one line and exit 2, valid JSON, linear time."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from attnid.cli import main

LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2}


def _config(tmp_path: Path, data: dict | str) -> str:
    path = tmp_path / "config.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def _refused(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("data,words", [
    ('{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "rope_theta": 1'
     + "0" * 400 + "}", "rope_theta"),
    ({**LLAMA, "hidden_size": "64"}, "hidden_size"),
    ({**LLAMA, "hidden_size": [64]}, "hidden_size"),
    ({**LLAMA, "hidden_size": int("9" * 2500)}, "hidden_size"),
    ({"model_type": "llama4", **{k: v for k, v in LLAMA.items() if k != "model_type"}, "attention_chunk_size": [1]},
     "attention_chunk_size"),
    ({"model_type": "gemma3_text", **{k: v for k, v in LLAMA.items() if k != "model_type"},
      "rope_parameters": {"sliding_attention": {"rope_theta": [1]}, "full_attention": {"rope_theta": 1e6}}},
     "rope_parameters.sliding_attention.rope_theta"),
    ({**LLAMA, "rope_parameters": {"rope_theta": 1e6, "partial_rotary_factor": "half"}},
     "rope_parameters.partial_rotary_factor"),
    ({**LLAMA, "rope_parameters": [1e6]}, "rope_parameters"),
])
def test_a_value_of_the_wrong_kind_is_one_line_and_exit_2(tmp_path, capsys, data, words) -> None:
    err = _refused(["count", "--config", _config(tmp_path, data)], capsys)
    assert words in err


def test_a_nan_in_an_ignored_field_still_gives_strict_json(tmp_path, capsys) -> None:
    assert main(["count", "--config", _config(tmp_path, {**LLAMA, "attn_extra": float("nan")}), "--json"]) == 0

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    record = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert any(i["field"] == "attn_extra" for i in record["ignored"])


def test_a_config_of_unknown_layer_types_is_refused_in_one_line_naming_them(tmp_path, capsys) -> None:
    """transformers' own validator refuses layer types its models do not know; the refusal names the field."""
    data = {**LLAMA, "model_type": "qwen3", "layer_types": ["weird", "odd"]}
    err = _refused(["count", "--config", _config(tmp_path, data)], capsys)
    assert "layer_types" in err and "Qwen3Config" in err


@pytest.mark.parametrize("kind", ["unread keys", "layer types"])
def test_work_on_a_config_is_linear_in_its_size(tmp_path, capsys, kind) -> None:
    def run(n: int) -> float:
        if kind == "unread keys":
            data = {**LLAMA, **{f"attn_{i}": i for i in range(n)}}
        else:
            data = {**LLAMA, "model_type": "qwen3", "num_hidden_layers": n, "num_key_value_heads": 4, "use_sliding_window": True,
                    "sliding_window": 64, "layer_types": [("sliding", "full")[i % 2] + "_attention" for i in range(n)]}
        path = _config(tmp_path, data)
        start = time.perf_counter()
        assert main(["count", "--config", path, "--json"]) == 0
        capsys.readouterr()
        return time.perf_counter() - start

    run(100)  # warm up
    small, large = run(1_000), run(8_000)  # the layer stack is built (on the meta device): about 2 ms a layer
    assert large < 2.0 + 16 * small, (small, large)  # 8x the size: quadratic work would take about 64x


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_fifo_is_refused_before_it_is_opened(tmp_path, capsys) -> None:
    fifo = tmp_path / "layouts.yaml"
    os.mkfifo(fifo)
    start = time.perf_counter()
    err = _refused(["census", "--file", str(fifo)], capsys)
    assert "not a regular file" in err and time.perf_counter() - start < 5


def test_a_sequence_too_short_for_the_layout_is_one_line(capsys) -> None:
    err = _refused(["verify", "--d-model", "8", "--heads", "2", "--causal", "--rope-fraction", "1", "--seq-len", "2"],
                   capsys)
    assert "seq_len must be >= 3" in err
