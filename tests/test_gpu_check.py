"""`make gpu-check` (scripts/gpu_check.py): its refusal off CUDA, its smoke mode end to end, and its rule."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # `make test-fast` skips this file: subprocesses or Triton's interpreter

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environment = dict(os.environ)
    environment.pop("TRITON_INTERPRET", None)  # other test modules set it in this process
    environment.update(env or {})
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True,
                          env=environment, timeout=600)


def bench_files() -> list[Path]:
    folder = ROOT / "data" / "bench"
    return sorted(folder.glob("attention_*")) + sorted(folder.glob("correctness_*")) if folder.is_dir() else []


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_without_cuda_it_refuses_in_one_line_and_writes_nothing() -> None:
    before = bench_files()
    result = run()
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs a CUDA GPU" in lines[0], result.stderr
    assert result.stdout == ""
    assert bench_files() == before


def test_it_refuses_to_run_interpreted_outside_the_smoke_mode() -> None:
    result = run(env={"TRITON_INTERPRET": "1"})
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "unset TRITON_INTERPRET" in result.stderr


def test_bad_worker_count_is_refused() -> None:
    result = run("--workers", "0")
    assert result.returncode == 2 and "--workers must lie in 1..64, got 0" in result.stderr


def test_the_gpu_cases_cover_every_setting() -> None:
    gpu = load_script()
    full = gpu.correctness_cases(smoke=False, full=True)
    combos = {(c.dtype, c.head_dim, c.heads // c.kv_heads, c.causal, c.rope_fraction, c.sink) for c in full}
    assert len(full) == len(combos) == 3 * 3 * 3 * 2 * 3 * 2
    cases = gpu.correctness_cases(smoke=False)
    assert len(cases) == len(set(cases)) == 54 + 9 + 3 + 3  # the covering design, one case beyond the square per cell,
    masked = [c for c in cases if c.mask]  # and one general mask per dtype
    assert {(c.dtype, c.mask) for c in masked} == {("bf16", "boolean"), ("fp16", "additive"), ("fp32", "boolean")}
    assert {c.causal for c in masked} == {False, True} and {c.head_dim for c in masked} == {64, 128, 256}
    cases = [c for c in cases if not c.mask]
    cross = [c for c in cases if c.key_tokens and c.keys < c.tokens]  # and one cross-attention case per dtype
    assert {c.dtype for c in cross} == {"bf16", "fp16", "fp32"} and {c.head_dim for c in cross} == {64, 128, 256}
    assert not any(c.causal or c.rope_fraction for c in cross)
    cases = [c for c in cases if c not in cross]
    beyond = [c for c in cases if c.key_tokens]
    assert len(beyond) == 9 and all(c.keys > c.tokens and c.causal and c.padded for c in beyond)
    assert {(c.dtype, c.head_dim) for c in beyond} == {(d, w) for d in ("bf16", "fp16", "fp32") for w in (64, 128, 256)}
    cases = [c for c in cases if not c.key_tokens]
    for dtype in ("bf16", "fp16", "fp32"):
        for width in (64, 128, 256):
            cell = [c for c in cases if (c.dtype, c.head_dim) == (dtype, width)]
            assert {(c.rope_fraction, c.sink) for c in cell} == {(r, s) for r in (0.0, 0.5, 1.0) for s in (False, True)}
            assert {c.causal for c in cell} == {False, True} and {c.heads // c.kv_heads for c in cell} == {1, 4, 8}
            assert {c.tokens for c in cell} == set(gpu.CORRECTNESS_TOKENS)
    assert len({(c.heads // c.kv_heads, c.causal, c.rope_fraction) for c in cases}) == 3 * 2 * 3
    assert 1 in gpu.CORRECTNESS_TOKENS
    # every other length is a multiple of no tile size the kernels use (16 to 128)
    assert all(n == 1 or all(n % t for t in (16, 32, 64, 128)) for n in gpu.CORRECTNESS_TOKENS)


def test_the_rule_rejects_a_wrong_result() -> None:
    gpu = load_script()
    case = gpu.Case("bf16", 64, 8, 2, 77, True, 0.5, True)
    ref = torch.randn(2, 8, 77, 64, dtype=torch.float64)
    pytorch = ref.to(torch.bfloat16)
    assert gpu.compare(case, "out", ref.to(torch.bfloat16), pytorch, ref)[-1] is True
    wrong = ref.clone()
    wrong[0, 0, 5] += 0.1  # one row off by 0.1: over twice the rounding of values up to about 5 to bf16 (0.02)
    assert gpu.compare(case, "out", wrong, pytorch, ref)[-1] is False
    assert gpu.compare(case, "out", torch.full_like(ref, float("nan")), pytorch, ref)[-1] is False


def test_smoke_run_checks_every_quantity_and_benchmarks_outside_data() -> None:
    """The same code path as on a GPU, in the interpreter, with the correctness cases in two processes."""
    before = bench_files()
    result = run("--smoke", "--workers", "2", env={"PYTHONHASHSEED": "0"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    written = [Path(line.split("wrote ")[-1]) for line in result.stdout.splitlines() if "wrote " in line]
    correctness = next(p for p in written if p.name.startswith("correctness_"))
    attention = next(p for p in written if p.name.startswith("attention_"))
    assert correctness.parent == attention.parent and "attnid-gpu-check-" in str(correctness)
    for path in (correctness, attention):
        record = json.loads(path.with_name(path.name + ".provenance.json").read_text())
        assert "attnid/kernels/flash.py" in record["depends_on"] and "triton" in record["versions"]
    rows = list(csv.DictReader(correctness.open()))
    assert {r["quantity"] for r in rows} == {"out", "dq", "dk", "dv", "dsink", "tangent",
                                              "hvp_q", "hvp_k", "hvp_v", "hvp_sink"}
    assert all(r["ok"] == "True" and float(r["err_attnid"]) <= float(r["bound"]) for r in rows)
    assert any(int(r["key_tokens"]) > int(r["tokens"]) and r["padded"] == "True" for r in rows)  # beyond the square
    assert any(int(r["key_tokens"]) < int(r["tokens"]) for r in rows)  # cross-attention: more queries than keys
    assert {r["causal"] for r in rows} == {"True", "False"} and {r["sink"] for r in rows} == {"True", "False"}
    assert {r["rope_fraction"] for r in rows} == {"0.0", "0.5", "1.0"} and "1" in {r["tokens"] for r in rows}
    seen = {(r["pass"], r["implementation"]) for r in csv.DictReader(attention.open())}
    assert {("forward", "attnid-triton"), ("backward", "attnid-triton"), ("jvp", "attnid-triton"),
            ("jvp", "torch.func.jvp-sdpa-math"), ("forward", "unfused-rope+sdpa")} <= seen
    assert "worst err/bound" in result.stdout and "peak MiB" in result.stdout  # the two summary tables
    assert bench_files() == before
