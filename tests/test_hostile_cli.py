"""Hostile inputs: each is refused (or survived) with at most one clear line, never a traceback.

The command-line cases run the real command (``python -m attnid``) in subprocesses, all at once
in a thread pool (they spend most of their time importing torch), each under an address-space
limit so that a regression fails the test instead of exhausting the machine. Each child is reaped
with ``os.wait4``, which gives its own peak RSS and CPU time. The library's checks (spec, runtime,
kernels, the memory estimate) are tested in-process; the names added with them are imported inside
the tests, so against an older library each test fails on its own.
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import attnid
from attnid.spec import AttentionSpec

pytestmark = pytest.mark.slow  # `make test-fast` skips this file: subprocesses or Triton's interpreter

V = importlib.import_module("attnid.verification")
B = importlib.import_module("attnid.budget")
LIB = Path(attnid.__file__).resolve().parents[1]  # the children import this checkout's library
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(LIB), os.environ.get("PYTHONPATH", "")])}
AS_LIMIT = 4 * 2**30  # virtual memory per child: importing torch and a small verify use about 1 GiB
TIMEOUT_S = 120
BASE = ["--d-model", "8", "--heads", "2"]
GIB = 2**30


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str
    max_rss: int  # bytes
    cpu_s: float


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def run_child(argv: list[str], *, close_stdout: bool = False) -> Run:
    """Run ``python argv`` under AS_LIMIT; with close_stdout the read end of its stdout pipe is closed at once."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, *argv], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE if close_stdout else out, stderr=err, env=ENV,
                                preexec_fn=_limit_memory)
        if close_stdout:
            proc.stdout.close()  # before the child (still importing torch) writes: its writes hit a closed pipe
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.02)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return Run(proc.returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace"),
                   usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime)


def attnid_cli(*args: str, close_stdout: bool = False) -> Run:
    return run_child(["-m", "attnid", *args], close_stdout=close_stdout)


# ------------------------------------------------------------------------------------------------
# Command-line cases: (args, exit code, fragments that must appear on stderr)
# ------------------------------------------------------------------------------------------------

REFUSALS = {  # verify refused before allocating anything: exit 2, one line naming the estimate and what to do
    "verify d512 h8, default limit": ["verify", "--d-model", "512", "--heads", "8"],
    "verify d64 h4, --max-memory 4G": ["verify", "--d-model", "64", "--heads", "4", "--max-memory", "4G"],
}
BAD_FLAGS = {  # the cases, through the real command: (args, fragments of the one stderr line)
    "seq-len 1e8": (["verify", *BASE, "--seq-len", "100000000"], ["--seq-len", "100000000", "2 to 4,096"]),
    "seed 1e23": (["verify", *BASE, "--seed", "99999999999999999999999"], ["--seed", "99999999999999999999999", "2**63 - 1"]),
    "d-model 2e6": (["count", "--d-model", "2000000", "--heads", "2"], ["--d-model", "2000000", "1 to 1,000,000"]),
    "rope-base 1e308": (["count", *BASE, "--rope-fraction", "1", "--rope-base", "1e308"],
                        ["--rope-base", "1e308", "[1 + 1e-6, 1e12]"]),
    "rope-base 1+1e-10": (["verify", *BASE, "--rope-fraction", "1", "--rope-base", "1.0000000001"],
                          ["--rope-base", "1.0000000001", "[1 + 1e-6, 1e12]"]),
    "max-memory 0": (["verify", *BASE, "--max-memory", "0"], ["--max-memory", "'0'", "positive size"]),
}
MORE_BAD_FLAGS = {  # every other numeric flag and edge, through main() in this process (the same parser)
    "seed 2**63": (["verify", *BASE, "--seed", str(2**63)], ["--seed", str(2**63), "0 to 2**63 - 1"]),
    "seed -1": (["verify", *BASE, "--seed", "-1"], ["--seed", "'-1'", "0 to 2**63 - 1"]),
    "seed 1.5": (["verify", *BASE, "--seed", "1.5"], ["--seed", "1.5", "0 to 2**63 - 1"]),
    "heads 0": (["count", "--d-model", "8", "--heads", "0"], ["--heads", "'0'", "1 to 1,000,000"]),
    "kv-heads 1000001": (["count", *BASE, "--kv-heads", "1000001"], ["--kv-heads", "1000001", "1 to 1,000,000"]),
    "head-dim -4": (["count", *BASE, "--head-dim", "-4"], ["--head-dim", "-4", "1 to 1,000,000"]),
    "v-head-dim 1e3": (["count", *BASE, "--v-head-dim", "1e3"], ["--v-head-dim", "1e3", "1 to 1,000,000"]),
    "d-model 5000 digits": (["count", "--d-model", "9" * 5000, "--heads", "2"], ["--d-model", "1 to 1,000,000"]),
    "seq-len 4097": (["verify", *BASE, "--seq-len", "4097"], ["--seq-len", "4097", "2 to 4,096"]),
    "rope-fraction nan": (["count", *BASE, "--rope-fraction", "nan"], ["--rope-fraction", "nan", "[0, 1]"]),
    "rope-fraction -0.5": (["count", *BASE, "--rope-fraction", "-0.5"], ["--rope-fraction", "-0.5", "[0, 1]"]),
    "rope-base inf": (["verify", *BASE, "--rope-base", "inf"], ["--rope-base", "inf", "[1 + 1e-6, 1e12]"]),
    "rope-base 1e13": (["count", *BASE, "--rope-base", "1e13"], ["--rope-base", "1e13", "[1 + 1e-6, 1e12]"]),
    "max-memory -3G": (["verify", *BASE, "--max-memory=-3G"], ["--max-memory", "-3G", "positive size"]),
    "max-memory lots": (["verify", *BASE, "--max-memory", "lots"], ["--max-memory", "lots", "positive size"]),
    "max-memory nan": (["verify", *BASE, "--max-memory", "nan"], ["--max-memory", "nan", "positive size"]),
}
# An allocation that fails although the estimate allowed it (the limit raised by hand): d_model 4 with
# 4096 tokens pushes 64 forward-mode tangents of 4096 x 4096 scores, 8 GiB, far above AS_LIMIT.
OUT_OF_MEMORY = ["verify", "--d-model", "4", "--heads", "1", "--seq-len", "4096", "--max-memory", "1000G", "--method", "dense"]
CLOSED_PIPE = {  # the reader stops before the first byte: the command must end quietly
    "count": ["count", *BASE],
    "census": ["census"],
    "census --json": ["census", "--json"],
    "verify": ["verify", "--d-model", "4", "--heads", "1"],
}
# Peak memory of verify against its estimate, in a child: RSS after import attnid, then the kernel's
# high-water mark (reset through clear_refs where allowed, else the lifetime peak: stricter) after verify.
MEASURE = textwrap.dedent("""
    import json, sys
    import attnid
    from attnid.spec import AttentionSpec
    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    base = status("VmRSS:")
    attnid.verify(AttentionSpec.create(**json.loads(sys.argv[1])))
    print(json.dumps({"base": base, "peak": status("VmHWM:")}))
""")
MEASURED_LAYOUTS = {  # the two cheapest regimes of the calibration: tiny, and P x P below glibc's mmap threshold
    "d8 h2 qkvo": {"d_model": 8, "heads": 2, "bias": "qkvo"},
    "d16 h2": {"d_model": 16, "heads": 2},
}


@pytest.fixture(scope="module")
def runs() -> dict[str, Run]:
    """Every subprocess of this file, run concurrently once."""
    jobs = {f"refuse {k}": (lambda a=a: attnid_cli(*a)) for k, a in REFUSALS.items()}
    jobs |= {f"flag {k}": (lambda a=a: attnid_cli(*a)) for k, (a, _) in BAD_FLAGS.items()}
    jobs["oom"] = lambda: attnid_cli(*OUT_OF_MEMORY)
    jobs |= {f"pipe {k}": (lambda a=a: attnid_cli(*a, close_stdout=True)) for k, a in CLOSED_PIPE.items()}
    jobs |= {f"measure {k}": (lambda kw=kw: run_child(["-c", MEASURE, json.dumps(kw)])) for k, kw in MEASURED_LAYOUTS.items()}
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        return {name: f.result() for name, f in futures.items()}


def assert_one_clean_line(run: Run, code: int) -> str:
    assert run.code == code, run.err
    assert "Traceback" not in run.err and "Exception ignored" not in run.err, run.err
    lines = run.err.splitlines()
    assert 1 <= len(lines) <= 2, run.err
    return run.err


@pytest.mark.parametrize("name", REFUSALS)
def test_verify_refuses_what_exceeds_the_memory_limit_before_allocating(runs: dict[str, Run], name: str) -> None:
    run = runs[f"refuse {name}"]
    err = assert_one_clean_line(run, 2)
    assert run.out == ""
    args = REFUSALS[name]
    spec = AttentionSpec.create(int(args[2]), int(args[4]))
    assert B.estimate_resources(spec).human() in err  # the library's estimate, in the message
    assert "--max-memory" in err and "attnid count" in err
    # refused before any work: no more than importing the library costs
    assert run.max_rss < 1 * GIB and run.cpu_s < 10, (run.max_rss, run.cpu_s)


@pytest.mark.parametrize("name", BAD_FLAGS)
def test_numeric_flags_out_of_bounds_are_one_line_and_exit_2(runs: dict[str, Run], name: str) -> None:
    run = runs[f"flag {name}"]
    err = assert_one_clean_line(run, 2)
    for fragment in BAD_FLAGS[name][1]:
        assert fragment in err, err
    assert "Overflow" not in err
    assert run.max_rss < 1 * GIB and run.cpu_s < 10, (run.max_rss, run.cpu_s)


@pytest.mark.parametrize("name", MORE_BAD_FLAGS)
def test_every_numeric_flag_has_bounds(capsys: pytest.CaptureFixture, name: str) -> None:
    from attnid.cli import main

    args, fragments = MORE_BAD_FLAGS[name]
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and out == ""
    assert err.count("\n") == 1 and len(err) < 400, err
    for fragment in fragments:
        assert fragment in err, err


def test_running_out_of_memory_is_one_line_and_exit_3(runs: dict[str, Run]) -> None:
    err = assert_one_clean_line(runs["oom"], 3)
    assert "ran out of memory" in err and "attnid count" in err


@pytest.mark.parametrize("name", CLOSED_PIPE)
def test_a_reader_that_stops_early_ends_the_command_quietly(runs: dict[str, Run], name: str) -> None:
    run = runs[f"pipe {name}"]
    assert run.code == 0, run.err
    assert run.err == ""


@pytest.mark.parametrize("name", MEASURED_LAYOUTS)
def test_measured_peak_stays_below_the_estimate(runs: dict[str, Run], name: str) -> None:
    run = runs[f"measure {name}"]
    assert run.code == 0, run.err
    measured = json.loads(run.out)
    increase = measured["peak"] - measured["base"]
    estimate = B.estimate_resources(AttentionSpec.create(**MEASURED_LAYOUTS[name]))
    assert 0 < increase < estimate.bytes, (increase, estimate)


def test_help_states_the_memory_default_and_the_exit_codes() -> None:
    from attnid.cli import build_parser

    verify_parser = build_parser()._subparsers._group_actions[0].choices["verify"]
    text = " ".join(verify_parser.format_help().split())
    assert "--max-memory" in text and "50% of this machine's memory" in text
    for code in ("0 success", "1 verify", "2 bad flags", "3 verify ran out of memory"):
        assert code in text, code


# ------------------------------------------------------------------------------------------------
# The estimate itself
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", [
    AttentionSpec.create(8, 2),
    AttentionSpec.create(8, 2, bias="qkvo"),
    AttentionSpec.create(16, 4, kv_heads=2, rope_fraction=0.5, bias="k"),
    AttentionSpec.create(6, 3, kv_heads=1, norm="sigmoid", causal=True, bias="qvo"),
    AttentionSpec.create(8, 2, bias="v"),  # b_V without b_O: the value-bias directions are an upper bound
], ids=lambda s: s.label())
def test_generator_count_bounds_the_orbit_generators(spec: AttentionSpec) -> None:
    from attnid.symmetry import tangent_directions

    built = len(tangent_directions(attnid.init_params(spec, attnid.generator(0)), spec))
    counted, _ = B.orbit_generator_count(spec)
    assert built <= counted <= built + spec.kv_heads * spec.v_head_dim
    if "v" not in spec.bias or "o" in spec.bias or spec.norm != "softmax":
        assert counted == built


def test_estimate_is_arithmetic_fast_for_any_size_and_grows_with_the_layout() -> None:
    start = time.perf_counter()
    huge = B.estimate_resources(AttentionSpec.create(1_000_000, 1_000, kv_heads=1, rope_fraction=1.0))
    assert time.perf_counter() - start < 0.5
    assert huge.bytes > 2**60
    small = B.estimate_resources(AttentionSpec.create(8, 2))
    assert small.bytes < B.estimate_resources(AttentionSpec.create(16, 2)).bytes
    assert small.bytes < B.estimate_resources(AttentionSpec.create(8, 2), seq_len=64).bytes
    with pytest.raises(ValueError, match="seq_len"):
        B.estimate_resources(AttentionSpec.create(8, 2), seq_len=1)


def test_out_of_memory_errors_are_recognised_and_others_are_not() -> None:
    from attnid.cli import _is_out_of_memory

    assert _is_out_of_memory(MemoryError())
    assert _is_out_of_memory(RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate"))
    assert _is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not _is_out_of_memory(RuntimeError("shape mismatch"))
    assert not _is_out_of_memory(ValueError("out of memory"))


def test_an_unrelated_runtime_error_is_not_reported_as_out_of_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    cli = importlib.import_module("attnid.cli")

    def broken(*args, **kwargs):
        raise RuntimeError("a bug, not a shortage")

    monkeypatch.setattr(cli.families, "verify", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["verify", *BASE])


# ------------------------------------------------------------------------------------------------
# Library checks: spec, runtime, kernels
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("base", [1e308, 1.0 + 1e-10, 1e13, float("inf"), float("nan"), 1.0])
def test_rope_base_outside_the_meaningful_range_is_refused(base: float) -> None:
    with pytest.raises(ValueError, match=r"rope_base must be a number in \[1 \+ 1e-6, 1e12\]"):
        AttentionSpec.create(8, 2, rope_fraction=1.0, rope_base=base)


@pytest.mark.parametrize(("base", "shown"), [(1.5, "1.5"), (1.000001, "1.000001"), (500000, "500000"),
                                             (1e12, "1000000000000"), (10000.0, "10000")])
def test_describe_prints_the_base_faithfully(base: float, shown: str) -> None:
    spec = AttentionSpec.create(8, 2, rope_fraction=1.0, rope_base=base)
    assert f" base={shown} " in spec.describe()


@pytest.mark.parametrize("field", ["rope_fraction", "rope_base"])
def test_booleans_are_not_rope_numbers(field: str) -> None:
    with pytest.raises(TypeError, match=f"{field} must be a number in"):
        AttentionSpec.create(8, 2, **{field: True})
    if field == "rope_base":
        with pytest.raises(TypeError, match="rope_base must be a number in"):
            AttentionSpec(8, 2, 2, 4, 4, rope_dims=4, rope_base=True)


@pytest.mark.parametrize("seed", [2**63, 10**30, -1, True, 1.5])
def test_generator_refuses_seeds_outside_0_to_2_63_minus_1(seed) -> None:
    with pytest.raises(ValueError, match=r"seed must be a non-negative integer from 0 to 2\*\*63 - 1"):
        attnid.generator(seed)


def test_generator_accepts_the_largest_seed() -> None:
    a = torch.randn(2, generator=attnid.generator(2**63 - 1))
    assert torch.equal(a, torch.randn(2, generator=attnid.generator(2**63 - 1)))


@pytest.mark.parametrize("scale", [True, False])
def test_kernels_refuse_a_boolean_scale(scale: bool) -> None:
    from attnid.kernels import check_inputs

    q = torch.zeros(1, 2, 4, 16)
    with pytest.raises(TypeError, match="scale must be"):
        check_inputs(q, q, q, causal=False, rope_fraction=0.0, rope_base=10000.0, sink=None, scale=scale)
    assert check_inputs(q, q, q, causal=False, rope_fraction=0.0, rope_base=10000.0, sink=None, scale=1).scale == 1.0
