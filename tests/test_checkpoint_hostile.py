"""Hostile checkpoint files: each gets exit 2 and one short line on stderr, before any large allocation."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch

from attnid.cli import main


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import transformers as tf

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny") / "bert"
    tf.BertModel(tf.BertConfig(hidden_size=16, num_attention_heads=4, num_hidden_layers=1, intermediate_size=32,
                               vocab_size=64, max_position_embeddings=64)).save_pretrained(folder)
    return folder


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for item in src.iterdir():
        (dst / item.name).write_bytes(item.read_bytes())
    return dst


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], words: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and len(err) < 400, err
    assert words in err, err


def _safetensors(folder: Path) -> Path:
    return folder / "model.safetensors"


def test_truncated_weights(tmp_path: Path, tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _copy(tiny, tmp_path / "t")
    data = _safetensors(folder).read_bytes()
    _safetensors(folder).write_bytes(data[: len(data) // 2])
    _refused(capsys, ["inspect", str(folder)], "outside the file")


def test_oversized_header_is_refused_unread(tmp_path: Path, tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _copy(tiny, tmp_path / "h")
    _safetensors(folder).write_bytes(struct.pack("<Q", 2**62) + b"{}")
    _refused(capsys, ["inspect", str(folder)], "header of")


def test_header_that_is_not_json(tmp_path: Path, tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _copy(tiny, tmp_path / "j")
    _safetensors(folder).write_bytes(struct.pack("<Q", 5) + b"{nope" + b"\0" * 16)
    _refused(capsys, ["inspect", str(folder)], "not JSON")


def test_shapes_that_disagree_with_the_config(tmp_path: Path, tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _copy(tiny, tmp_path / "s")
    config = json.loads((folder / "config.json").read_text())
    config["num_attention_heads"], config["hidden_size"] = 2, 32
    (folder / "config.json").write_text(json.dumps(config))
    _refused(capsys, ["inspect", str(folder)], "the configuration implies")


def test_a_missing_tensor_is_named(tmp_path: Path, tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.torch import load_file, save_file

    folder = _copy(tiny, tmp_path / "m")
    state = load_file(_safetensors(folder))
    del state["encoder.layer.0.attention.self.key.weight"]
    save_file(state, _safetensors(folder))
    _refused(capsys, ["inspect", str(folder)], "key.weight is missing")


def test_nan_weights(tmp_path: Path, tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.torch import load_file, save_file

    folder = _copy(tiny, tmp_path / "n")
    state = load_file(_safetensors(folder))
    state["encoder.layer.0.attention.self.query.weight"][0, 0] = float("nan")
    save_file(state, _safetensors(folder))
    _refused(capsys, ["inspect", str(folder)], "NaN or inf")


def test_shard_outside_the_folder(tmp_path: Path, tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _copy(tiny, tmp_path / "o")
    _safetensors(folder).unlink()
    index = {"weight_map": {"encoder.layer.0.attention.self.query.weight": "../elsewhere.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    _refused(capsys, ["inspect", str(folder)], "not a file name in the folder")


@pytest.mark.parametrize("content, words", [
    (b"", "no GGUF magic"),
    (b"GGUF" + struct.pack("<IQQ", 3, 2**40, 2**40), "more than"),
    (b"GGUF" + struct.pack("<IQQ", 9, 0, 0), "version 9"),
    (b"GGUF" + struct.pack("<IQQ", 3, 1, 1) + b"\x05" * 40, "GGUF"),
    (bytes(range(256)) * 4, "no GGUF magic"),
], ids=["empty", "huge-counts", "version", "truncated", "junk"])
def test_junk_gguf(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, words: str) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    _refused(capsys, ["inspect", str(path)], words)


def test_missing_and_unsupported(tmp_path: Path, tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _refused(capsys, ["inspect", str(tmp_path / "absent")], "no such file or folder")
    empty = tmp_path / "empty"
    empty.mkdir()
    _refused(capsys, ["inspect", str(empty)], "config.json")
    folder = _copy(tiny, tmp_path / "u")
    (folder / "config.json").write_text(json.dumps({"model_type": "t5"}))
    _refused(capsys, ["inspect", str(folder)], "not read yet")
    no_weights = _copy(tiny, tmp_path / "w")
    _safetensors(no_weights).unlink()
    _refused(capsys, ["inspect", str(no_weights)], "no model.safetensors")
    (folder / "config.json").write_text("{not json")
    _refused(capsys, ["inspect", str(folder)], "not valid JSON")


def test_rebalance_refuses_bad_input_and_an_existing_out(tmp_path: Path, tiny: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    _refused(capsys, ["rebalance", str(tmp_path / "absent"), str(tmp_path / "out")], "no such file or folder")
    _refused(capsys, ["rebalance", str(tiny), str(tiny)], "already exists")
    _refused(capsys, ["rebalance", str(tiny), str(tmp_path / "no" / "out")], "no such folder")
    assert not (tmp_path / "out").exists()
