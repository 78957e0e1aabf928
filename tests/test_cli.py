"""The command line and every invalid layout we could think of: each gets a clear, specific error."""

import json
import subprocess
import sys
from collections.abc import Callable

import pytest

from attnid.spec import AttentionSpec, parse_bias, rope_dims_from_fraction
from attnid.verification import numeric_rank

CLI = Callable[..., tuple[int, str, str]]  # the fixture ``cli`` (conftest.py): args -> (exit code, stdout, stderr)

BASE = ["--d-model", "8", "--heads", "2"]


def test_count_json(cli: CLI) -> None:
    code, out, _ = cli("count", *BASE, "--bias", "qkvo", "--json")
    record = json.loads(out)
    assert code == 0
    assert (record["total"], record["unidentified"]) == (288, 80)
    assert record["ratio"] == pytest.approx(80 / 288)
    assert record["breakdown"] == {"query_key": 32, "key_bias": 8, "value_output": 32, "value_bias": 8}


def test_count_text(cli: CLI) -> None:
    code, out, _ = cli("count", "--d-model", "8", "--heads", "4", "--kv-heads", "2")
    assert code == 0
    assert "(GQA)" in out and "parameters: 192" in out and "unidentified: 16" in out


def test_verify_json_matches(cli: CLI) -> None:
    code, out, _ = cli("verify", *BASE, "--rope-fraction", "1", "--bias", "qkv", "--causal", "--json")
    record = json.loads(out)
    assert code == 0
    assert record["matches"] is True and record["clear"] is True
    # per group r + d_v^2 = 4 + 16; b_K is rotated (identified); without b_O, G d_v = d_model means b_V is seen
    assert record["numeric_unidentified"] == record["unidentified"] == 2 * (4 + 16)


def test_verify_text_and_uncovered_layout(cli: CLI) -> None:
    code, out, _ = cli("verify", "--d-model", "8", "--heads", "1", "--head-dim", "10",
                       "--v-head-dim", "8", "--rope-fraction", "1")
    assert code == 0
    assert "no exact count" in out and "matches: no exact count to compare" in out


def test_module_entry_point_runs() -> None:
    result = subprocess.run([sys.executable, "-m", "attnid", "count", *BASE, "--json"], capture_output=True, text=True)
    assert result.returncode == 0 and json.loads(result.stdout)["unidentified"] == 64


CLI_ERRORS = [
    ([], "required"),
    (["count"], "required: --d-model, --heads"),
    (["count", "--d-model", "8"], "--heads"),
    (["count", *BASE, "--bias", "qx"], "unknown letter"),
    (["count", *BASE, "--bias", "kk"], "repeated letter"),
    (["count", "--d-model", "8", "--heads", "3"], "does not divide d_model"),
    (["count", *BASE, "--kv-heads", "3"], "kv_heads 3 must divide heads 2"),
    (["count", "--d-model", "0", "--heads", "1"], "--d-model: must be an integer from 1 to 1,000,000, got '0'"),
    (["count", "--d-model", "8", "--heads", "two"], "--heads: must be an integer from 1 to 1,000,000, got 'two'"),
    (["count", *BASE, "--head-dim", "0"], "--head-dim: must be an integer from 1 to 1,000,000, got '0'"),
    (["count", *BASE, "--v-head-dim", "-2"], "--v-head-dim: must be an integer from 1 to 1,000,000, got '-2'"),
    (["count", *BASE, "--rope-fraction", "1.5"], "--rope-fraction: must be a number in [0, 1], got '1.5'"),
    (["count", *BASE, "--rope-fraction", "0.3"], "not a whole number"),
    (["count", *BASE, "--rope-fraction", "0.25"], "odd r = 1"),
    (["count", *BASE, "--rope-fraction", "1", "--rope-base", "1"], "--rope-base: must be a number in [1 + 1e-6, 1e12], got '1'"),
    (["count", *BASE, "--norm", "relu"], "invalid choice"),
    (["count", *BASE, "--sink", "learned"], "--sink learned needs --norm sink"),
    (["count", *BASE, "--frobnicate"], "unrecognized arguments"),
    (["verify", *BASE, "--seq-len", "1"], "--seq-len: '1' is out of range: give a whole number from 2 to"),
    (["shout", *BASE], "invalid choice"),
]


@pytest.mark.parametrize(("args", "message"), CLI_ERRORS, ids=[" ".join(a) or "empty" for a, _ in CLI_ERRORS])
def test_cli_errors_are_one_line_and_exit_2(cli: CLI, args: list[str], message: str) -> None:
    code, out, err = cli(*args)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and message in err, err


SPEC_ERRORS = [
    (lambda: AttentionSpec.create(8, 2, kv_heads=4), ValueError, "must divide heads"),
    (lambda: AttentionSpec.create(8, 2, rope_fraction=0.5, rope_dims=2), ValueError, "not both"),
    (lambda: AttentionSpec(8, 2, 2, 4, 4, bias="kq"), ValueError, "qkvo"),
    (lambda: AttentionSpec(8, 2, 2, 4, 4, rope_dims=3), ValueError, "even number"),
    (lambda: AttentionSpec(8, 2, 2, 4, 4, rope_dims=6), ValueError, "even number in \\[0, head_dim=4\\]"),
    (lambda: AttentionSpec(8, 2, 2, 4, 4, norm="softmax", sink_learned=True), ValueError, "needs norm='sink'"),
    (lambda: AttentionSpec(8, 2, 2, 4, 4, norm="relu"), ValueError, "norm must be one of"),
    (lambda: AttentionSpec(8.0, 2, 2, 4, 4), TypeError, "d_model must be an integer"),
    (lambda: AttentionSpec(8, True, 2, 4, 4), TypeError, "heads must be an integer"),
    (lambda: AttentionSpec(8, 2, 2, 4, 4, causal=1), TypeError, "causal must be True or False"),
    (lambda: AttentionSpec(8, 2, 2, 4, 4, rope_base=float("nan")), ValueError, "rope_base"),
    (lambda: parse_bias(3), TypeError, "bias must be a string"),
    (lambda: rope_dims_from_fraction(float("nan"), 4), ValueError, "rope_fraction must be a number in"),
    (lambda: numeric_rank(AttentionSpec.create(8, 2), n_inputs=0), ValueError, "n_inputs must be a positive integer"),
]


@pytest.mark.parametrize(("make", "error", "message"), SPEC_ERRORS)
def test_invalid_layouts_name_the_field(make, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        make()


def test_bias_parsing_accepts_any_order_and_none() -> None:
    assert parse_bias("okvq") == "qkvo"
    assert parse_bias("None") == parse_bias("") == ""
    assert AttentionSpec.create(8, 2, bias="vk").bias == "kv"


def test_verify_default_seq_len_is_the_library_rule(cli: CLI) -> None:
    from attnid.cli import build_parser
    from attnid.budget import default_seq_len

    spec = AttentionSpec.create(12, 2)
    assert default_seq_len(spec) != 8  # a layout where the old CLI default (8) differed from the library's
    code, out, _ = cli("verify", "--d-model", "12", "--heads", "2", "--json")
    assert code == 0 and json.loads(out)["seq_len"] == default_seq_len(spec)
    code, out, _ = cli("verify", "--d-model", "12", "--heads", "2")
    assert code == 0 and f"inputs of {default_seq_len(spec)} tokens" in out
    code, out, _ = cli("verify", "--d-model", "12", "--heads", "2", "--seq-len", "3", "--json")
    assert code == 0 and json.loads(out)["seq_len"] == 3  # an explicit value still wins
    verify_parser = build_parser()._subparsers._group_actions[0].choices["verify"]
    assert "default_seq_len" in verify_parser.format_help()


def test_verify_methods_and_progress(cli: CLI) -> None:
    # --method picks the route; --progress states the memory estimate before the work and each structured attempt.
    layout = ["--d-model", "8", "--heads", "2", "--kv-heads", "1", "--bias", "qkvo"]
    code, out, err = cli("verify", *layout, "--json", "--progress")
    record = json.loads(out)
    assert code == 0 and record["method"] == "structured" and record["matches"] is True
    assert "estimated peak memory" in err and "--method auto" in err and "structured certificate: attempt 1" in err
    assert err.index("estimated peak memory") < err.index("structured certificate")
    code, out, err = cli("verify", *layout, "--json", "--method", "dense")
    assert code == 0 and json.loads(out)["method"] == "certificate" and err == ""
    code, out, _ = cli("verify", *layout, "--json", "--method", "svd")
    assert code == 0 and json.loads(out)["method"] == "svd"
    assert json.loads(out)["numeric_unidentified"] == record["numeric_unidentified"]
    code, _, err = cli("verify", *layout, "--method", "qr")
    assert code == 2 and "--method" in err
