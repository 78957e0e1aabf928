"""Hostile inputs, third round (issue 31): the CLI's contract under fuzzing, its output streams and Ctrl-C, the
memory guard before every route of verify, and the library's type checks.

The contract of ``attnid count --config``: exit 0 with valid JSON on stdout, or exit 2 with one line on
stderr; never a traceback. Hypothesis draws configs around every registered model type and hostile values
for the fields a mapper reads (seeded and bounded: ``derandomize`` and a fixed number of examples).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attnid
from attnid import cli
from attnid.hf import config as hfconfig, read as hfread
from attnid.spec import AttentionSpec


pytestmark = pytest.mark.slow  # subprocesses and a few hundred fuzzed configs

V = importlib.import_module("attnid.verification")
B = importlib.import_module("attnid.budget")
LIB = Path(attnid.__file__).resolve().parents[1]
ROOT = LIB.parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(LIB), os.environ.get("PYTHONPATH", "")])}
COMMAND = [sys.executable, "-m", "attnid"]


MEMORY_CAP = 2**30  # what one config may add to the process's address space


@contextlib.contextmanager
def address_space_cap(extra: int) -> Iterator[None]:
    """Cap this process's address space (RLIMIT_AS) at its size now plus ``extra`` bytes, then restore the limit.

    An allocation past the cap fails at once (MemoryError), whatever ran before: unlike the peak resident
    memory (ru_maxrss, a high-water mark), the cap checks each run on its own.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    size = int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()
    cap = size + extra if hard == resource.RLIM_INFINITY else min(size + extra, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def run_main(argv: list[str]) -> tuple[int, str, str]:
    """cli.main in this process: (exit code, stdout, stderr); an exception other than SystemExit propagates."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def strict_json(text: str) -> Any:
    """json.loads that refuses NaN and Infinity, which are not JSON."""
    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def assert_contract(code: int, out: str, err: str) -> None:
    assert "Traceback" not in err, err
    if code == 0:
        strict_json(out)
    else:
        assert code == 2, (code, err)
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("attnid count: error:"), err


# ---------------------------------------------------------------- the fuzz of count --config

HOSTILE = st.one_of(
    st.integers(min_value=-3, max_value=70_000), st.integers(min_value=10**18, max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(), st.text(max_size=8),
    st.lists(st.integers(min_value=0, max_value=64), max_size=4), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
    st.sampled_from([7168.0, 4096.5, "4096", "full_attention", ["full_attention", "sliding_attention"], 1e9]),
)
FIELDS = sorted(set(hfread.CONFIG_FIELDS) | {"rope_theta", "layer_types", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim",
                                        "qk_nope_head_dim", "v_head_dim", "attention_bias", "rope_scaling",
                                        "partial_rotary_factor", "max_position_embeddings", "num_experts"})
SANE = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
        "head_dim": 16, "rope_theta": 10000.0, "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8, "v_head_dim": 8, "vocab_size": 100, "intermediate_size": 128}


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    """A plausible config of a registered model type with a few fields replaced by hostile values."""
    cfg: dict[str, Any] = {"model_type": draw(st.sampled_from(sorted(hfread.MAPPERS) + ["no_such_model"])), **SANE}
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=4, unique=True)):
        cfg[name] = draw(HOSTILE)
    return cfg


# types read through transformers (attnid.hf.meta), not by a reader of attnid's own: dense, MoE, sliding, sinks,
# latent attention, a hybrid, an encoder-decoder. Their layer count is not fuzzed: the stack is built layer by layer
# (on the meta device, a few ms a layer), so 70,000 layers take minutes, which is slow but not wrong.
META_TYPES = ["llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "qwen3_next", "gemma2", "gemma3_text", "gpt_oss",
              "deepseek_v3", "olmo2", "cohere2", "phi", "starcoder2", "granite", "glm4", "smollm3", "bart"]
LAYER_COUNTS = {"num_hidden_layers", "n_layer", "num_layers", "n_layers"}


@st.composite
def meta_configs(draw: st.DrawFn) -> dict[str, Any]:
    """A plausible config of a type transformers builds, with a few fields (not its layer count) made hostile."""
    cfg: dict[str, Any] = {"model_type": draw(st.sampled_from(META_TYPES)), **SANE}
    for name in draw(st.lists(st.sampled_from([f for f in FIELDS if f not in LAYER_COUNTS]), max_size=4, unique=True)):
        cfg[name] = draw(HOSTILE)
    return cfg


@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cfg=configs())
def test_count_config_keeps_its_contract_on_fuzzed_configs(tmp_path: Path, cfg: dict[str, Any]) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")  # NaN and Infinity are written as JSON's common extension
    with address_space_cap(MEMORY_CAP):  # a config that makes the reader allocate > 1 GiB fails here
        assert_contract(*run_main(["count", "--config", str(path), "--json"]))
        code, _, err = run_main(["count", "--config", str(path)])  # the text report takes the same paths
    assert "Traceback" not in err and code in (0, 2), err


@settings(max_examples=120, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cfg=meta_configs())
def test_count_config_through_transformers_keeps_its_contract_on_fuzzed_configs(tmp_path: Path,
                                                                                 cfg: dict[str, Any]) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    with address_space_cap(MEMORY_CAP):
        assert_contract(*run_main(["count", "--config", str(path), "--json"]))


def test_the_address_space_cap_stops_an_allocation_past_it() -> None:
    with address_space_cap(64 * 2**20), pytest.raises(MemoryError):
        bytearray(512 * 2**20)
    assert len(bytearray(512 * 2**20)) == 512 * 2**20  # the limit is back as it was


FLAG_VALUES = st.sampled_from(["0", "-1", "1", "2", "3", "8", "64", "1e3", "nan", "inf", "-inf", "1.5", "true", "",
                               "9" * 400, "0x10", "1_000", " 8", "8\u00a0", "\u0668"])
COUNT_FLAGS = ["--d-model", "--heads", "--kv-heads", "--head-dim", "--v-head-dim", "--rope-fraction", "--rope-base",
               "--qk-norm-eps", "--window", "--chunk", "--bias", "--norm", "--qk-norm"]


@settings(max_examples=200, derandomize=True, deadline=None)
@given(flags=st.dictionaries(st.sampled_from(COUNT_FLAGS), FLAG_VALUES, max_size=5),
       switches=st.lists(st.sampled_from(["--causal", "--json", "--sink-learned"]), unique=True))
def test_count_flags_keep_their_contract(flags: dict[str, str], switches: list[str]) -> None:
    argv = ["count", *[x for kv in flags.items() for x in kv], *switches]
    code, out, err = run_main(argv)
    assert "Traceback" not in err, err
    if code == 0:
        if "--json" in switches:
            strict_json(out)
    else:
        assert code == 2 and len(err.splitlines()) in (1, 2), (argv, err)  # argparse: usage line + error line


# ---------------------------------------------------------------- output streams and Ctrl-C, in subprocesses

def test_a_closed_stdout_is_one_line_and_exit_2() -> None:
    proc = subprocess.run([*COMMAND, "count", "--d-model", "8", "--heads", "2"], env=ENV, stdin=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, timeout=120, preexec_fn=lambda: os.close(1))
    err = proc.stderr.decode()
    assert proc.returncode == 2 and err.splitlines() == ["attnid: error: standard output is closed; nowhere to write the result"]


@pytest.mark.parametrize("argv", [["count", "--d-model", "8", "--heads", "2"], ["census", "--json"]])
def test_a_full_disk_is_one_line_and_exit_2(argv: list[str]) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    with open("/dev/full", "w") as full:
        proc = subprocess.run([*COMMAND, *argv], env=ENV, stdin=subprocess.DEVNULL, stdout=full,
                              stderr=subprocess.PIPE, timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert "cannot write the output" in err


def test_ctrl_c_during_verify_is_one_line_and_exit_130() -> None:
    proc = subprocess.Popen([*COMMAND, "verify", "--d-model", "40", "--heads", "1", "--rope-fraction", "1",
                             "--rope-base", "1e12", "--progress"], env=ENV, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    first = proc.stderr.readline()  # the estimate line: verify is about to allocate and compute
    assert "estimated peak memory" in first, first
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(timeout=60) == 130
    assert "Traceback" not in rest and rest.splitlines()[-1] == "attnid: interrupted", rest


def test_reproduce_refuses_a_parameter_that_is_not_yaml_in_one_line() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "reproduce.py"), "-p", "GRID_MAX=[", "--only",
                           "chapters/02_one_head.ipynb"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "-p GRID_MAX: '[' is not a YAML value" in proc.stderr.splitlines()[-1]


# ---------------------------------------------------------------- paths, the memory guard, the library's checks

def test_a_config_path_too_long_is_one_line_cut_in_the_middle(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"File name too long") as info:
        hfconfig.read_config(tmp_path / ("a" * 5000))
    assert "..." in str(info.value) and len(str(info.value)) < 300


def test_a_config_in_a_folder_one_may_not_enter_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(self: Path, *args: Any, **kwargs: Any) -> Any:  # root may enter any folder: denial by hand
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "stat", denied)
    with pytest.raises(ValueError, match=r"config.json: cannot read \(Permission denied\)"):
        hfconfig.read_config(tmp_path / "locked" / "config.json")


def test_verify_checks_the_limit_again_before_the_dense_route(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = AttentionSpec.create(8, 1, rope_fraction=1.0, rope_base=1e12)  # the layout
    structured, dense = (B.estimate_resources(spec, seq_len=512, method=m).bytes for m in ("auto", "dense"))
    assert structured < dense
    gave_up = []
    monkeypatch.setattr(V, "_try_structured", lambda *a, **k: gave_up.append(True))  # returns None: gives up
    with pytest.raises(B.MemoryLimitExceeded) as info:
        V.verify(spec, seq_len=512, max_bytes=(structured + dense) // 2)
    assert gave_up and info.value.route == "dense" and info.value.estimate.bytes == dense
    with pytest.raises(B.MemoryLimitExceeded, match="structured route"):
        V.verify(spec, seq_len=512, max_bytes=structured - 1)  # refused before the structured route starts


def test_a_string_for_sink_learned_is_refused() -> None:
    with pytest.raises(TypeError, match="sink_learned must be True or False, got 'yes'"):
        AttentionSpec.create(8, 2, norm="sink", sink_learned="yes")


def test_count_of_something_that_is_not_a_layout_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="not a layout of a known attention family: NoneType"):
        attnid.count(None)


def test_latent_attention_widths_written_as_integral_floats_count_as_their_integers(tmp_path: Path) -> None:
    cfg = {"model_type": "deepseek_v3", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
           "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8}
    records = []
    for widths in (cfg, {**cfg, "hidden_size": 64.0, "kv_lora_rank": 16.0}):  # as other model types accept them
        path = tmp_path / "config.json"
        path.write_text(json.dumps(widths), encoding="utf-8")
        code, out, err = run_main(["count", "--config", str(path), "--json"])
        assert code == 0, err
        records.append(strict_json(out))
    assert records[0] == records[1]  # the same file name: the whole record, counts included, is the same
    path.write_text(json.dumps({**cfg, "hidden_size": 64.5}), encoding="utf-8")
    code, _, err = run_main(["count", "--config", str(path)])
    assert code == 2 and "64.5" in err and len(err.splitlines()) == 1
