"""The precision rule (attnbook.precision): what a stored output may show of a float, and the static scan
of every stored output of the book against it. The perturbed re-execution is `make test-notebooks`
(nbval under scripts/perturbed.py); its environment is checked here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from attnbook import machine, precision

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import reproduce  # noqa: E402
from reproduce import toc_notebooks  # noqa: E402

BOOK = [pytest.param(p, id=str(p)) for p in toc_notebooks()]
# Floats beyond the rule that are exact by construction: token -> why. Keep this short.
ALLOWED: dict[str, str] = {}


@pytest.mark.parametrize(("token", "digits"), [
    ("0.03770", 4), ("123500.0", 4), ("2.5e-07", 2), ("138.20", 5), ("1e-06", 1), ("-0.1013", 4),
    ("1.0254072298606771", 17), ("1000000.0", 1), ("0.000", 0), ("+3.0", 1), ("26.168818", 8),
])
def test_significant_digits(token: str, digits: int) -> None:
    assert precision.significant_digits(token) == digits


def test_rounded_keeps_only_the_digits_asked_for() -> None:
    assert repr(precision.rounded(1.0254072298606771)) == "1.025"
    assert repr(precision.rounded(-0.10130000000000003)) == "-0.1013"
    assert repr(precision.rounded(3.0087869042594803e-07, 2)) == "3e-07"
    with pytest.raises(ValueError, match="digits must be between 1 and 6"):
        precision.rounded(1.0, 7)


def test_below_shows_the_bound_and_refuses_a_value_above_it() -> None:
    assert str(precision.below(3.0e-7, 1e-6)) == "below 1e-06"
    assert repr(precision.below(3.0e-7, 1e-6)) == "below 1e-06"  # no quotes when glued
    with pytest.raises(AssertionError, match="not below its stated bound 1e-06"):
        precision.below(1.2e-6, 1e-6, "error")
    with pytest.raises(AssertionError):
        precision.below(float("nan"), 1e-6)


def test_glue_refuses_a_container_of_floats() -> None:
    with pytest.raises(TypeError, match="glue each float on its own"):
        precision.glue("x", [0.1, 0.2])


def _notebook(tmp_path: Path, *outputs: dict, markdown: str = "") -> Path:
    cells = [{"cell_type": "markdown", "source": markdown, "metadata": {}},
             {"cell_type": "code", "source": "", "metadata": {}, "outputs": list(outputs)}]
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps({"cells": cells}))
    return path


def _record(name: str, text: str, digits: int | None) -> dict:
    meta = {"scrapbook": {"name": name}}
    if digits is not None:
        meta[precision.METADATA_KEY] = {"significant": digits}
    return {"output_type": "display_data", "data": {precision.RECORD_PREFIX + "text/plain": text}, "metadata": meta}


def test_scan_finds_a_raw_glued_float_and_a_long_printed_one(tmp_path: Path) -> None:
    # today's two failures in kind: a float glued at full repr, a long float printed
    path = _notebook(tmp_path, _record("slope", "1.0254072298606771", None),
                     {"output_type": "stream", "name": "stdout", "text": "fit 0.29447457570215346\n"})
    found = precision.stored_findings(path)
    assert [f.token for f in found] == ["1.0254072298606771", "1.0254072298606771", "0.29447457570215346"]
    assert "without attnbook.precision.glue" in found[0].reason
    assert precision.stored_findings(path, allowed={"1.0254072298606771": "x", "0.29447457570215346": "y"})[0]


def test_scan_accepts_glue_records_and_short_floats(tmp_path: Path) -> None:
    path = _notebook(tmp_path, _record("slope", "1.025", 4), _record("n", "12", None),
                     {"output_type": "stream", "name": "stdout", "text": "torch 2.13.0, rank 12, 0.1235 at 1e-06\n"},
                     {"output_type": "display_data", "data": {"text/markdown": "| 2.43e-12 | abead53acadd3f15 |"}})
    assert precision.stored_findings(path) == []


def test_scan_finds_a_record_with_more_digits_than_declared(tmp_path: Path) -> None:
    path = _notebook(tmp_path, _record("x", "0.12346", 4))
    assert "declared 4" in precision.stored_findings(path)[0].reason


def test_prose_may_not_show_more_digits_than_glued(tmp_path: Path) -> None:
    record = _record("loss", "138.2", 4)
    assert precision.reference_findings(_notebook(tmp_path, record, markdown="{glue:text}`loss:.1f`")) == []
    found = precision.reference_findings(_notebook(tmp_path, record, markdown="is {glue:text}`loss:.2f`."))
    assert [f.token for f in found] == ["loss:.2f -> 138.20"]
    big = _record("n", "12350.0", 4)
    assert precision.reference_findings(_notebook(tmp_path, big, markdown="{glue:text}`n:,.0f`")) == []


def test_a_last_digit_5_earns_one_more_digit_so_shorter_displays_round_once(monkeypatch) -> None:
    from attnbook import rounding

    assert rounding.unambiguous_digits(1.0254072) == 5 and f"{precision.rounded(1.0254072, 5):.2f}" == "1.03"
    assert rounding.unambiguous_digits(0.2375107) == 5 and f"{precision.rounded(0.2375107, 5):.3f}" == "0.238"
    assert rounding.unambiguous_digits(0.2371) == 4 and rounding.unambiguous_digits(0.375) == 4  # 0.3750
    assert rounding.unambiguous_digits(0.1234549) == 6  # 0.1235, 0.12345, 0.123455: the rule's cap stops it
    assert rounding.unambiguous_digits(0.0) == 4 and rounding.unambiguous_digits(float("nan")) == 4
    shown: list[tuple[dict, dict]] = []
    monkeypatch.setattr("IPython.core.formatters.format_display_data", lambda v: ({"text/plain": repr(v)}, {}))
    monkeypatch.setattr("IPython.display.display", lambda data, raw, metadata: shown.append((data, metadata)))
    rounding.glue_unambiguous({"s": 1.0254072, "t": 0.2371, "n": 3, "w": "words"})
    assert [d[precision.RECORD_PREFIX + "text/plain"] for d, _ in shown] == ["1.0254", "0.2371", "3", "'words'"]
    assert [m.get(precision.METADATA_KEY) for _, m in shown] == [{"significant": 5}, {"significant": 4}, None, None]


def double_roundings(path: Path) -> list[str]:
    """Prose that prints a glued float one digit shorter than stored when the stored last digit is a 5."""
    cells = json.loads(path.read_text())["cells"]
    records = {}
    for _, mime, text, meta in precision.stored_texts(cells):
        key, declared = meta.get("scrapbook", {}).get("name"), meta.get(precision.METADATA_KEY, {}).get("significant")
        if key and declared and mime.endswith("text/plain"):
            records[key] = text.strip()
    found = []
    for cell in cells:
        if cell["cell_type"] != "markdown":
            continue
        for key, spec in precision.GLUE_REFERENCE.findall("".join(cell["source"])):
            if key not in records or spec[-1] not in "eEfFgG":
                continue
            text = records[key]
            shown = format(float(text), spec).replace(",", "")
            if (precision.significant_digits(shown) == precision.significant_digits(text) - 1
                    and re.split("[eE]", text)[0].rstrip("0").endswith("5")):
                found.append(f"{key}:{spec}: {text} -> {shown}")
    return found


def test_the_double_rounding_scan_finds_a_5_rounded_again(tmp_path: Path) -> None:
    record = _record("low", "0.007205", 4)
    assert double_roundings(_notebook(tmp_path, record, markdown="{glue:text}`low:.2e`")) == ["low:.2e: 0.007205 -> 7.20e-03"]
    assert double_roundings(_notebook(tmp_path, record, markdown="{glue:text}`low:.1e`")) == []  # 7.2e-03 either way
    assert double_roundings(_notebook(tmp_path, _record("x", "0.2371", 4), markdown="{glue:text}`x:.3f`")) == []


@pytest.mark.parametrize("notebook", BOOK)
def test_the_prose_never_rounds_a_glued_value_twice(notebook: Path) -> None:
    found = double_roundings(ROOT / notebook)
    assert not found, "glue these with attnbook.rounding.glue_unambiguous:\n" + "\n".join(found)


@pytest.mark.parametrize("notebook", BOOK)
def test_every_stored_output_follows_the_precision_rule(notebook: Path) -> None:
    found = precision.stored_findings(ROOT / notebook, ALLOWED, name=str(notebook))
    assert not found, "\n".join(map(str, found))


@pytest.mark.parametrize("notebook", BOOK)
def test_the_prose_shows_no_more_digits_than_glued(notebook: Path) -> None:
    found = precision.reference_findings(ROOT / notebook, name=str(notebook))
    assert not found, "\n".join(map(str, found))


@pytest.mark.parametrize("notebook", BOOK)
def test_chapters_glue_through_the_precision_helper(notebook: Path) -> None:
    cells = json.loads((ROOT / notebook).read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    assert not any(re.search(r"from myst_nb import .*\bglue\b|myst_nb\.glue\(", s) for s in sources)


@pytest.mark.parametrize("notebook", toc_notebooks(), ids=str)
def test_figure_data_is_fingerprinted_by_the_one_helper(notebook: Path) -> None:
    # one rule for a figure's data fingerprint (attnbook.precision.print_figure_data), not a hash per chapter
    cells = json.loads((ROOT / notebook).read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    assert not any("figure data sha256" in s for s in sources)


def test_the_figure_data_fingerprint_is_the_hash_of_the_repr(capsys: pytest.CaptureFixture) -> None:
    import hashlib

    table = [("a", 1, "0.5")]
    precision.print_figure_data(table)
    assert capsys.readouterr().out == f"figure data sha256[:16]: {hashlib.sha256(repr(table).encode()).hexdigest()[:16]}\n"
    assert precision.figure_data_fingerprint([1]) != precision.figure_data_fingerprint([2])


def test_the_portable_environment_changes_the_numerics_but_not_openblas_core_type() -> None:
    env = machine.portable_environment()
    assert {"OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_CBWR"} <= set(env)
    assert not {"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"} & set(env)
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"test-notebooks:.*\n(\t.*\n)*\t.*scripts/perturbed\.py", makefile)


def test_fingerprint_names_the_numeric_environment() -> None:
    name = machine.fingerprint()
    assert re.fullmatch(r"[a-z0-9_-]+", name) and machine.description()["arch"].lower() in name


def test_only_the_reference_machine_folder_is_committed() -> None:
    # .gitignore ignores every data/**/machines/<fingerprint>/ except the book's reference machine
    ignore = (ROOT / ".gitignore").read_text().splitlines()
    assert "data/**/machines/*/" in ignore
    assert f"!data/kernels/machines/{machine.REFERENCE}/" in ignore
    assert machine.is_other_machine("kernels/machines/some-other-cpu/case_errors.csv")
    assert not machine.is_other_machine(f"kernels/machines/{machine.REFERENCE}/case_errors.csv")
    assert not machine.is_other_machine("machines.csv") and not machine.is_other_machine("census/census.csv")


@pytest.mark.parametrize(("text", "tokens"), [
    ("value 1.2345678.", ["1.2345678"]), ("x=1.234567891e-07.", ["1.234567891e-07"]),
    ("0.123456789ms", ["0.123456789"]), ("1,234,567.891 tokens", ["1,234,567.891"]),
    ("torch 2.13.0 at 192.168.1.1", []), ("sha256[:16] = 3cd42629177b07ff", []), ("W_Q 3.9e-08, dV", ["3.9e-08"]),
    ("(0.5, -0.25) and 40.7%", ["0.5", "-0.25", "40.7"]),
])
def test_float_tokens_in_real_outputs(text: str, tokens: list[str]) -> None:
    assert precision.FLOAT_TOKEN.findall(text) == tokens


def test_integers_with_separators_are_not_floats(tmp_path: Path) -> None:
    path = _notebook(tmp_path, {"output_type": "stream", "name": "stdout", "text": "parameters 1,509,958,656\n"})
    assert precision.stored_findings(path) == []
    assert precision.significant_digits("1,234,567.891") == 10


def test_glue_rounds_a_float_and_records_its_digits(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np
    import torch

    shown: list[tuple[dict, dict]] = []
    monkeypatch.setattr("IPython.core.formatters.format_display_data", lambda v: ({"text/plain": repr(v)}, {}))
    monkeypatch.setattr("IPython.display.display", lambda data, raw, metadata: shown.append((data, metadata)))
    precision.glue("slope", np.float64(1.0254072298606771))
    precision.glue("err", torch.tensor([2.427385611123718e-06]), digits=2)
    precision.glue("n", np.int64(12))
    precision.glue("bound", precision.below(3e-7, 1e-6), display=True)
    texts = [data.get(precision.RECORD_PREFIX + "text/plain", data.get("text/plain")) for data, _ in shown]
    assert texts == ["1.025", "2.4e-06", "12", "below 1e-06"]
    assert [m.get(precision.METADATA_KEY) for _, m in shown] == [{"significant": 4}, {"significant": 2}, None, None]
    assert shown[0][1]["scrapbook"] == {"name": "slope", "mime_prefix": precision.RECORD_PREFIX}
    with pytest.raises(TypeError, match="one number at a time"):
        precision.glue("many", np.array([0.1, 0.2]))


def test_a_shown_glue_record_is_checked_too(tmp_path: Path) -> None:
    record = {"output_type": "display_data", "data": {"text/plain": "0.29447457570215346"},
              "metadata": {"scrapbook": {"name": "share", "mime_prefix": ""}}}
    assert "without attnbook.precision.glue" in precision.stored_findings(_notebook(tmp_path, record))[0].reason


def test_below_shows_a_bound_that_is_not_a_power_of_ten_exactly() -> None:
    assert str(precision.below(2.2e-7, 2.5e-7)) == "below 2.5e-07"


@pytest.mark.skipif(__import__("platform").machine() != "x86_64", reason="MKL and ATen's AVX kernels: x86-64")
def test_the_portable_environment_changes_pytorch_results() -> None:
    # the perturbation is only useful if it changes results: PyTorch's vector kernels and MKL's code path
    code = ("import torch, hashlib; g = torch.Generator().manual_seed(0); a = torch.randn(64, 257, generator=g);"
            "b = torch.randn(257, 33, generator=g, dtype=torch.float64);"
            "print(hashlib.sha256(torch.softmax(a, -1).numpy().tobytes() + torch.exp(a).numpy().tobytes()"
            " + (b.T @ b).numpy().tobytes()).hexdigest())")
    script = [sys.executable, str(ROOT / "scripts" / "perturbed.py"), "--"]
    native = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    perturbed = subprocess.run([*script, sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert native != perturbed


_FLOAT32_STEP = (
    "import torch, hashlib; g = torch.Generator().manual_seed(0); a = torch.randn(96, 257, generator=g);"
    "b = torch.randn(257, 80, generator=g); w = torch.randn(80, 80, generator=g, requires_grad=True);"
    "torch.softmax((a @ b) @ w, -1).sum().backward(); x = torch.randn(2_000_003, generator=g);"
    "print(hashlib.sha256((a @ b).numpy().tobytes() + w.grad.numpy().tobytes()"
    " + x.sum().numpy().tobytes()).hexdigest())")


@pytest.mark.skipif(__import__("platform").machine() != "x86_64", reason="MKL and ATen's AVX kernels: x86-64")
def test_every_pin_of_the_portable_environment_is_needed_for_float32_bytes() -> None:
    # The experiments run in portable_environment (make reproduce): each of its pins, left out, changes the
    # bytes of a float32 forward/backward step, so none is decoration. (That the pinned bytes agree across CPUs
    # is MKL's promise for its compatible path plus generic, undispatched code; other machines check it.)
    def digest(changes: dict[str, str | None]) -> str:
        env = {**os.environ, **machine.portable_environment()}
        for key, value in changes.items():
            env.pop(key, None) if value is None else env.__setitem__(key, value)
        return subprocess.run([sys.executable, "-c", _FLOAT32_STEP], env=env, capture_output=True, text=True,
                              check=True).stdout
    pinned = digest({})
    assert digest({}) == pinned
    for unpinned in ({"MKL_CBWR": None}, {"ATEN_CPU_CAPABILITY": None},
                     {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}):
        assert digest(unpinned) != pinned, f"{unpinned} left the bytes unchanged"


def test_reproduce_runs_the_experiments_and_only_them_in_the_portable_environment() -> None:
    assert reproduce.notebook_environment(Path("experiments/key_bias.ipynb")) == machine.portable_environment()
    assert reproduce.notebook_environment(Path("chapters/01_identification.ipynb")) == {}


def test_git_ignores_other_machines_and_keeps_the_reference() -> None:
    def ignored(path: str) -> bool:
        return subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0

    assert ignored("data/kernels/machines/some-other-cpu/case_errors.csv")
    assert not ignored(f"data/kernels/machines/{machine.REFERENCE}/case_errors.csv")
