"""The attention benchmark script: its smoke mode runs end to end, and off CUDA it refuses clearly."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # `make test-fast` skips this file: subprocesses or Triton's interpreter

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_attention.py"


def load_script():
    spec = importlib.util.spec_from_file_location("bench_attention", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_without_cuda_it_refuses_and_writes_nothing(capsys: pytest.CaptureFixture) -> None:
    before = sorted(Path("data/bench").glob("attention_*")) if Path("data/bench").is_dir() else []
    assert load_script().main([]) == 2
    assert "CUDA GPU" in capsys.readouterr().err
    assert (sorted(Path("data/bench").glob("attention_*")) if Path("data/bench").is_dir() else []) == before


def test_smoke_run_writes_every_pass_outside_data(capsys: pytest.CaptureFixture) -> None:
    assert load_script().main(["--smoke"]) == 0
    written = Path(capsys.readouterr().out.strip().splitlines()[-1].removeprefix("wrote "))
    assert "attnid-bench-" in str(written) and written.is_file()
    assert written.with_name(written.name + ".provenance.json").is_file()
    rows = list(csv.DictReader(written.open()))
    seen = {(r["pass"], r["implementation"]) for r in rows}
    for expected in [("forward", "attnid-triton"), ("backward", "attnid-triton"), ("jvp", "attnid-triton"), ("hvp", "attnid-triton"),
                     ("hvp", "torch.func-sdpa-math"), ("jvp", "jvp_flash_attention"),
                     ("forward", "unfused-rope+sdpa"), ("jvp", "torch.func.jvp-sdpa-math"), ("forward", "sdpa-math")]:
        assert expected in seen
    ours = [r for r in rows if r["implementation"] == "attnid-triton"]
    assert all(float(r["median_ms"]) > 0 for r in ours)


def test_smoke_run_covers_cross_attention_padding_and_the_peer(capsys: pytest.CaptureFixture) -> None:
    assert load_script().main(["--smoke"]) == 0
    written = Path(capsys.readouterr().out.strip().splitlines()[-1].removeprefix("wrote "))
    rows = list(csv.DictReader(written.open()))
    cross = [r for r in rows if r["kv_tokens"] != r["tokens"]]
    assert {(r["pass"], r["implementation"]) for r in cross} >= {("forward", "attnid-triton"), ("backward", "sdpa"),
                                                                  ("jvp", "attnid-triton")}
    assert all(r["causal"] == "False" for r in cross)  # cross-attention rows run without the causal mask
    padded = {(r["pass"], r["implementation"], r["mask"]) for r in rows if r["mask"] != "none"}
    assert ("jvp", "attnid-triton", "key_lengths") in padded and ("forward", "sdpa-math", "boolean") in padded
    ours = [r for r in rows if r["implementation"] == "attnid-triton"]
    assert all(float(r["median_ms"]) > 0 and r["note"] == "" for r in ours), [r for r in ours if r["note"]]
    peer = [r for r in rows if r["implementation"] == "jvp_flash_attention"]
    assert peer and all(r["median_ms"] or r["note"].startswith("skipped") for r in peer)


def test_the_math_baseline_shrinks_to_a_shape_whose_scores_fit() -> None:
    bench = load_script()
    # fits(heads) stands for "3 B H N^2 float32 values under half the free memory" at batch 1
    assert bench.smaller_math_shape(32, 8, 8192, lambda heads: heads <= 4) == (4, 1)
    assert bench.smaller_math_shape(32, 32, 8192, lambda heads: heads <= 8) == (8, 8)
    assert bench.smaller_math_shape(32, 8, 8192, lambda heads: True) == (32, 8)
    assert bench.smaller_math_shape(32, 8, 8192, lambda heads: False) is None
