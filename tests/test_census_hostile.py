"""`census --file` against hostile or careless YAML: every failure is one line naming the file, the entry, the field.

Each case goes through ``load_layouts`` (a ValueError whose message is a single line naming the
file and, where there is one, the layout and the field), and through the CLI (exit 2, one
``attnid census: error:`` line, no traceback). A few run the real command in a subprocess;
the alias bomb runs there under a memory cap, so a regression fails the test instead of
taking the machine's memory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import attnid
from attnid import census as census_module
from attnid.census import load_layouts
from attnid.cli import main

pytestmark = pytest.mark.slow  # `make test-fast` skips this file: subprocesses or Triton's interpreter

LIB = str(Path(attnid.__file__).resolve().parent.parent)
BASE = {"d_model": "8", "heads": "2", "kv_heads": "2", "head_dim": "4", "layers": "1"}


def layout_file(tmp_path: Path, **fields: str) -> Path:
    """A file with one layout 'm': the base fields, with ``fields`` (raw YAML text) added or replaced."""
    entry = {**BASE, **fields}
    path = tmp_path / "layouts.yaml"
    path.write_text("models:\n  m:\n" + "".join(f"    {k}: {v}\n" for k, v in entry.items()))
    return path


def refused(path: Path, *parts: str) -> str:
    """load_layouts(path) raises a one-line ValueError naming the file and each of ``parts``; also via the CLI."""
    with pytest.raises(ValueError) as info:
        load_layouts(path)
    message = str(info.value)
    assert "\n" not in message, message
    assert f"census file {str(path)!r}" in message, message
    for part in parts:
        assert part in message, (part, message)
    return message


def cli_refuses(path: Path, capsys: pytest.CaptureFixture) -> str:
    """``main(["census", "--file", path])`` exits 2 with one error line on stderr."""
    with pytest.raises(SystemExit) as info:
        main(["census", "--file", str(path)])
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert err.startswith("attnid census: error: census file ") and err.count("\n") == 1, err
    return err


def run_cli(path: Path, *, memory_cap: bool = False, timeout: float = 60) -> subprocess.CompletedProcess:
    """The real command in a subprocess. With ``memory_cap`` the address space may grow by at most
    100 MB once the command is imported, and the time spent in ``main`` is printed to stdout."""
    env = {**os.environ, "PYTHONPATH": LIB + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if not memory_cap:
        return subprocess.run([sys.executable, "-m", "attnid", "census", "--file", str(path)], env=env,
                              capture_output=True, text=True, timeout=timeout)
    code = textwrap.dedent("""
        import resource, sys, time
        from attnid.cli import main
        size = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (size + 100 * 2**20, resource.getrlimit(resource.RLIMIT_AS)[1]))
        start = time.perf_counter()
        try:
            main(["census", "--file", sys.argv[1]])
        finally:
            print(f"seconds {time.perf_counter() - start:.3f}", flush=True)
    """)
    return subprocess.run([sys.executable, "-c", code, str(path)], env=env, capture_output=True, text=True,
                          timeout=timeout)


def assert_clean_exit(result: subprocess.CompletedProcess, path: Path) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = result.stderr.splitlines()
    assert 1 <= len(lines) <= 2, result.stderr[-2000:]
    assert lines[-1].startswith("attnid census: error: ") and str(path) in lines[-1], lines


# --- the alias bomb and other YAML features that a layout file does not need -------------------------------------


def alias_bomb() -> str:
    """Billion laughs in the notes of an otherwise valid layout: nine levels of nine aliases, under 600 bytes."""
    levels = ["&l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    levels += [f"&l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    fields = "".join(f"    {k}: {v}\n" for k, v in BASE.items())
    return f"models:\n  m:\n{fields}    notes: [{', '.join(levels)}]\n"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memory cap read from /proc")
def test_alias_bomb_is_refused_at_once_in_little_memory(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(alias_bomb())
    assert bomb.stat().st_size < 700
    result = run_cli(bomb, memory_cap=True, timeout=30)
    assert_clean_exit(result, bomb)
    assert "alias" in result.stderr or "anchor" in result.stderr, result.stderr
    seconds = float(result.stdout.split("seconds")[-1])
    assert seconds < 1.0, seconds


def test_anchor_and_alias_are_refused_with_their_position(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "alias.yaml"
    path.write_text("models:\n  m: &base {d_model: 8, heads: 2, kv_heads: 2, head_dim: 4, layers: 1}\n  n: *base\n")
    refused(path, "line 2, column 6", "anchor")
    cli_refuses(path, capsys)
    path.write_text("models:\n  m:\n    <<: {d_model: 8, heads: 2, kv_heads: 2, head_dim: 4}\n    layers: 1\n")
    refused(path, "line 3, column 5", "merge")


def test_duplicate_keys_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("models:\n  m: {d_model: 8, heads: 2, kv_heads: 2, head_dim: 4, layers: 1}\n"
                    "  m: {d_model: 8, heads: 2, kv_heads: 1, head_dim: 4, layers: 1}\n")
    refused(path, "line 3, column 3", "duplicate key 'm'")
    path.write_text("models:\n  m:\n    d_model: 8\n    heads: 2\n    kv_heads: 2\n    head_dim: 4\n"
                    "    layers: 1\n    layers: 2\n")
    refused(path, "line 8, column 5", "duplicate key 'layers'")


def test_deep_nesting_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("models: " + "[" * 20000 + "]" * 20000 + "\n")
    refused(path, "nested")


# --- one bad field at a time -------------------------------------------------------------------------------------

BAD_FIELDS = [
    ("d_model", '"8"', "an integer from 1 to 1,000,000", 'got "8"'),
    ("d_model", "true", "an integer from 1 to 1,000,000", "got true"),
    ("d_model", "8.0", "an integer from 1 to 1,000,000", "got 8.0"),
    ("d_model", str(2**40), "an integer from 1 to 1,000,000", ""),
    ("heads", "0", "an integer from 1 to 1,000,000", "got 0"),
    ("kv_heads", "-2", "an integer from 1 to 1,000,000", "got -2"),
    ("kv_heads", "null", "an integer from 1 to 1,000,000", "got null"),
    ("head_dim", "[4]", "an integer from 1 to 1,000,000", "got a list"),
    ("layers", "0", "an integer from 1 to 2,147,483,647", "got 0"),
    ("v_head_dim", "false", "an integer from 1 to 1,000,000", "got false"),
    ("rope_fraction", "true", "a number in [0, 1]", "got true"),
    ("rope_fraction", '"0.5"', "a number in [0, 1]", 'got "0.5"'),
    ("rope_fraction", "1.5", "a number in [0, 1]", "got 1.5"),
    ("rope_fraction", "-0.25", "a number in [0, 1]", "got -0.25"),
    ("rope_fraction", ".nan", "a number in [0, 1]", "got .nan"),
    ("rope_base", '"1e4"', "a number in [1 + 1e-6, 1e12]", 'got "1e4"'),
    ("rope_base", "true", "a number in [1 + 1e-6, 1e12]", "got true"),
    ("rope_base", "1", "a number in [1 + 1e-6, 1e12]", "got 1"),
    ("rope_base", ".inf", "a number in [1 + 1e-6, 1e12]", "got .inf"),
    ("rope_base", "1" + "0" * 400, "a number in [1 + 1e-6, 1e12]", ""),
    ("causal", '"yes"', "true or false", 'got "yes"'),
    ("causal", "0", "true or false", "got 0"),
    ("bias", "123", "string", "got 123"),
    ("bias", "null", "string", "got null"),
    ("bias", "false", "string", "got false"),
    ("norm", "5", "one of", "got 5"),
    ("norm", "relu", "one of", '"relu"'),
    ("sink", "true", "fixed or learned", "got true"),
    ("name", "123", "string", "got 123"),
    ("name", "null", "string", "got null"),
    ("notes", "[a, b]", "string", "got a list"),
    ("notes", "2020-01-01", "string", "got a date"),
    ("source", "{a: 1}", "string", "got a mapping"),
    ("source", "!!binary aGVsbG8=", "string", "got bytes"),
    ("uncovered", "[[x]]", "list drawn from", "got a list"),
    ("uncovered", "mla", "list", '"mla"'),
    ("uncovered", "[moe]", "list drawn from", '"moe"'),
    ("uncovered", "[mla, mla]", "more than once", '"mla"'),
    ("uncovered", "[{a: 1}]", "list drawn from", "got a mapping"),
    ("transformers_check", "[1, 2]", "mapping", "got a list"),
    ("transformers_check", "GPT2Config", "mapping", '"GPT2Config"'),
    ("transformers_check", "{fields: {n_embd: 8}}", "config", "missing"),
    ("transformers_check", "{config: GPT2Config}", "fields", "missing"),
    ("transformers_check", "{config: 12, fields: {n_embd: 8}}", "config", "got 12"),
    ("transformers_check", "{config: GPT2Config, fields: [1]}", "fields", "got a list"),
    ("transformers_check", "{config: GPT2Config, fields: {}}", "fields", "at least one"),
    ("transformers_check", "{config: GPT2Config, fields: {n_embd: [8]}}", "n_embd", "got a list"),
    ("transformers_check", "{config: GPT2Config, fields: {1: 8}}", "fields", "got 1"),
    ("transformers_check", "{config: GPT2Config, fields: {n_embd: 8}, strict: true}", "strict", "unknown"),
]


@pytest.mark.parametrize(("field", "value", "rule", "shown"), BAD_FIELDS, ids=lambda x: str(x)[:30])
def test_bad_field_is_refused_naming_file_layout_field(tmp_path: Path, field: str, value: str, rule: str,
                                                       shown: str) -> None:
    message = refused(layout_file(tmp_path, **{field: value}), "layout 'm'", f"field '{field}'", rule, shown)
    assert len(message) < 400, message


@pytest.mark.parametrize(
    ("fields", "parts"),
    [
        ({"size": "3"}, ("unknown field(s) size",)),
        ({"1": "2", "size": "3"}, ("unknown field(s)", "size")),
        ({"null": "2"}, ("unknown field(s)",)),
        ({"sink": "learned"}, ("sink", "norm")),
        ({"kv_heads": "3"}, ("must divide heads",)),
        ({"bias": "qz"}, ("field 'bias'", "unknown letter")),
        ({"rope_fraction": "0.25"}, ("field 'rope_fraction'", "odd")),
    ],
)
def test_bad_entry_is_refused_naming_file_and_layout(tmp_path: Path, fields: dict, parts: tuple) -> None:
    refused(layout_file(tmp_path, **fields), "layout 'm'", *parts)


@pytest.mark.parametrize(("field", "value", "line"), [("d_model", "1" * 5000, 3), ("notes", "2020-13-45", 8)])
def test_unreadable_scalar_gives_line_and_column(tmp_path: Path, field: str, value: str, line: int) -> None:
    refused(layout_file(tmp_path, **{field: value}), f"line {line}, column ")


def test_missing_field_is_named(tmp_path: Path) -> None:
    path = tmp_path / "missing.yaml"
    path.write_text("models:\n  m: {d_model: 8, heads: 2, kv_heads: 2, head_dim: 4}\n")
    refused(path, "layout 'm'", "missing field(s) layers")


def test_cli_on_bad_fields(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for field, value, _, _ in BAD_FIELDS:
        err = cli_refuses(layout_file(tmp_path, **{field: value}), capsys)
        assert f"field '{field}'" in err, err


def test_cli_subprocess_on_bad_nested_fields(tmp_path: Path) -> None:
    for field, value in (("transformers_check", "[1, 2]"), ("uncovered", "[[x]]")):
        path = layout_file(tmp_path, **{field: value})
        result = run_cli(path)
        assert_clean_exit(result, path)
        assert f"layout 'm', field '{field}'" in result.stderr, result.stderr


# --- the file as a whole -----------------------------------------------------------------------------------------


def test_malformed_yaml_gives_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("models:\n  m: {d_model: 8, heads: 2\n  n: 3\n")
    message = refused(path, "not valid YAML", "line ", "column ")
    assert "line 3" in message or "line 4" in message, message
    path.write_text("models:\n  m:\n\td_model: 8\n")
    refused(path, "not valid YAML", "line 3, column 1")
    path.write_text("models: {}\n---\nmodels: {}\n")
    refused(path, "single document", "line 2")
    result = run_cli(path)
    assert_clean_exit(result, path)


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n...\n"])
def test_empty_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    refused(path, "empty")


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("- a\n- b\n", ("top level", "mapping", "got a list")),
        ("just text\n", ("top level", "mapping", '"just text"')),
        ("42\n", ("top level", "mapping", "got 42")),
        ("layouts: {}\n", ("top-level 'models'",)),
        ("models: {}\n", ("'models'", "at least one")),
        ("models: [a, b]\n", ("'models'", "mapping", "got a list")),
        ("models:\n  m: {d_model: 8, heads: 2, kv_heads: 2, head_dim: 4, layers: 1}\nextra: 1\n", ("unknown", "extra")),
        ("models:\n  m: 3\n", ("layout 'm'", "mapping of fields", "got 3")),
        ("models:\n  m:\n", ("layout 'm'", "mapping of fields", "got null")),
        ("models:\n  1: {d_model: 8, heads: 2, kv_heads: 2, head_dim: 4, layers: 1}\n", ("layout name", "got 1")),
        ("models:\n  [a]: {d_model: 8}\n", ("line 2",)),
        ("models: !!python/object:os.system {}\n", ("line 1",)),
    ],
)
def test_wrong_shapes(tmp_path: Path, text: str, parts: tuple, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "shape.yaml"
    path.write_text(text)
    refused(path, *parts)
    cli_refuses(path, capsys)


def test_missing_file_and_directory(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    refused(tmp_path / "missing.yaml", "cannot read", "No such file")
    cli_refuses(tmp_path / "missing.yaml", capsys)
    refused(tmp_path, "cannot read")
    cli_refuses(tmp_path, capsys)


def test_too_large(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "large.yaml"
    limit = census_module.MAX_FILE_BYTES
    path.write_text("models:\n  m: {d_model: 8, heads: 2, kv_heads: 2, head_dim: 4, layers: 1}\n"
                    + "# padding\n" * (limit // 10 + 1))
    refused(path, "larger than", str(limit))
    cli_refuses(path, capsys)


def test_undecodable_bytes_and_control_characters(tmp_path: Path) -> None:
    path = tmp_path / "bytes.yaml"
    path.write_bytes(b"models:\n  m:\n    notes: caf\xe9\n")
    refused(path, "not UTF-8", "byte 0xe9", "line 3")
    result = run_cli(path)
    assert_clean_exit(result, path)
    path.write_bytes(b"models:\n  m:\n    notes: a\x00b\n")
    refused(path, "line 3", "#x0000")


# --- what is still accepted --------------------------------------------------------------------------------------


def test_valid_edge_values_are_accepted(tmp_path: Path) -> None:
    path = layout_file(tmp_path, rope_fraction="1", rope_base="500000", bias='""', causal="false", norm="sink",
                       sink="learned", notes="|\n      two\n      lines", name="'0.5'", uncovered="[]",
                       transformers_check="{config: GPT2Config, fields: {n_embd: 8, x.y: 0.5, s: a, b: true, n: null}}")
    (layout,) = load_layouts(path)
    assert layout.spec.rope_dims == 4 and layout.spec.rope_base == 500000.0 and not layout.spec.causal
    assert layout.notes == "two\nlines\n" and layout.name == "0.5" and layout.uncovered == ()
    assert layout.transformers_check["fields"]["n"] is None
    (default,) = load_layouts(layout_file(tmp_path))
    assert default.name == "m" and default.spec.rope_dims == 0 and default.spec.causal
