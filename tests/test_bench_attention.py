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
    for expected in [("forward", "attnid-triton"), ("backward", "attnid-triton"), ("jvp", "attnid-triton"),
                     ("forward", "unfused-rope+sdpa"), ("jvp", "torch.func.jvp-sdpa-math"), ("forward", "sdpa-math")]:
        assert expected in seen
    ours = [r for r in rows if r["implementation"] == "attnid-triton"]
    assert all(float(r["median_ms"]) > 0 for r in ours)
