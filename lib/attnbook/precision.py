"""The book's precision rule: what a stored output may show of a floating-point number, and its checks.

A stored output (printed text, a glued value, a table, a figure) must read the same on any
x86-64 or ARM CPU, with any thread count and any BLAS build. Summation order changes with all
three, so a float computed on one machine differs in its last bits on another. The rule:

1. Exact integers and rationals are shown exactly.
2. A computed float is shown with at most ``SIGNIFICANT`` (4) significant digits, fewer where
   the computation is ill-conditioned (the chapter passes ``digits``). No float in a stored
   output carries more than ``MAX_SIGNIFICANT`` (6), the most a well-conditioned float64
   result keeps on every machine (its relative change across summation orders is around
   1e-13, so the sixth digit flips only for a value within that distance of a rounding edge).
3. Rounding-level quantities (float32 errors, residuals near machine epsilon) are shown as
   bounds against a bound the chapter states in advance: ``below(err, 1e-6)`` asserts and
   shows "below 1e-06"; the measured value itself is never printed.
4. Measurements that depend on the machine itself (the Triton interpreter's float32 errors)
   are written per machine under ``data/**/machines/<fingerprint>/`` (``attnbook.machine``)
   and a chapter draws the book's figures from the reference machine's file, read, not
   recomputed.

``glue`` is the one way a chapter glues a value: floats are rounded by rule 2 and the record
states its digits; ``stored_findings`` is the static scan that ``tests/test_precision.py`` runs
over every stored output of the book.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

SIGNIFICANT = 4
MAX_SIGNIFICANT = 6
METADATA_KEY = "attnbook_precision"  # a glue record's metadata: the digits its float carries
RECORD_PREFIX = "application/papermill.record/"
SKIPPED_MIMES = ("image/",)  # binary images; SVG coordinates are guarded by nbval's re-execution instead

# A decimal or scientific literal (thousands separators allowed), not inside a word, a hash or a version
# string (nothing but a sentence's full stop may follow it); a unit may follow ("0.25ms").
FLOAT_TOKEN = re.compile(
    r"(?<![\w.,])[-+]?(?:\d{1,3}(?:,\d{3})+(?:\.\d*)?|\d+\.\d*|\.\d+|\d+(?=[eE][-+]?\d))(?:[eE][-+]?\d+)?(?![\d,]\d|\.\d|\d)")


def significant_digits(token: str) -> int:
    """How many significant digits a float literal shows: from its first nonzero digit to its last
    written digit, not counting zeros that end the integer part or a lone ``.0`` (Python's repr of
    an integral float). ``"0.03770"`` shows 4, ``"123500.0"`` 4, ``"2.5e-07"`` 2, ``"138.20"`` 5."""
    mantissa = re.split("[eE]", token.lstrip("+-"))[0].replace(",", "")
    if mantissa.endswith(".0"):
        mantissa = mantissa[:-2]
    whole, _, fraction = mantissa.partition(".")
    if not fraction:
        return len(whole.lstrip("0").rstrip("0"))
    return len((whole + fraction).lstrip("0"))


def is_float_token(token: str) -> bool:
    """Whether a FLOAT_TOKEN match is a float (has a decimal point or an exponent), not an integer."""
    return "." in token or "e" in token.lower()


def rounded(value: float, digits: int = SIGNIFICANT) -> float:
    """``value`` rounded to ``digits`` significant digits (its repr then shows no more)."""
    if not 1 <= digits <= MAX_SIGNIFICANT:
        raise ValueError(f"digits must be between 1 and {MAX_SIGNIFICANT}; got {digits!r}")
    if not math.isfinite(value):
        return value
    return float(f"{value:.{digits}g}")


class Shown:
    """Text a reader sees as it is (its repr has no quotes), for a glued bound."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def __str__(self) -> str:
        return self.text


def below(value: float, bound: float, what: str = "value") -> Shown:
    """Assert ``value < bound`` and show the bound ("below 1e-06"), never the value: rule 3."""
    if not math.isfinite(value) or not value < bound:
        raise AssertionError(f"{what} {value!r} is not below its stated bound {bound:g}")
    return Shown(f"below {bound:g}")


def _scalar(value: Any) -> Any:
    """A NumPy scalar or 1-element array or tensor as the Python number it holds; anything else unchanged."""
    if hasattr(value, "item") and hasattr(value, "ndim"):  # NumPy arrays and scalars, torch tensors
        if (value.numel() if hasattr(value, "numel") else value.size) != 1:
            raise TypeError(f"glue one number at a time, not an array of shape {tuple(value.shape)}")
        return value.item()
    return value


def _is_float(value: Any) -> bool:
    """A non-integral real number (not an int, a bool or a Fraction)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool | numbers.Integral | Fraction)


def _contains_float(value: Any) -> bool:
    if isinstance(value, list | tuple | set):
        return any(_contains_float(v) or _is_float(_scalar(v)) for v in value)
    if isinstance(value, Mapping):
        return _contains_float(list(value.values()))
    return False


def glue(name: str, value: Any, display: bool = False, *, digits: int = SIGNIFICANT) -> None:
    """Glue ``value`` for the prose (myst-nb's ``{glue:text}``), a float rounded to ``digits`` significant digits.

    Integers, fractions, strings, figures and Markdown are glued as they are. A container of
    floats is refused: glue each number, or a formatted string.
    """
    from IPython.core.formatters import format_display_data  # noqa: PLC0415 (only inside a kernel)
    from IPython.display import display as ipy_display  # noqa: PLC0415

    if _contains_float(value):
        raise TypeError(f"glue {name!r}: glue each float on its own (or a formatted string), not a container")
    value = _scalar(value)
    extra: dict[str, Any] = {}
    if _is_float(value):
        value = rounded(float(value), digits)
        extra[METADATA_KEY] = {"significant": digits}
    mimebundle, metadata = format_display_data(value)
    metadata = {**metadata, **extra, "scrapbook": {"name": name, "mime_prefix": "" if display else RECORD_PREFIX}}
    prefix = "" if display else RECORD_PREFIX
    ipy_display({prefix + k: v for k, v in mimebundle.items()}, raw=True, metadata=metadata)


# ---------------------------------------------------------------- the static scan of stored outputs


@dataclass(frozen=True)
class Finding:
    """A stored output that breaks the rule."""

    notebook: str
    cell: int
    mime: str
    token: str
    reason: str

    def __str__(self) -> str:
        return f"{self.notebook} cell {self.cell} ({self.mime}): {self.token!r}: {self.reason}"


def glue_all(values: Mapping[str, Any], *, digits: int = SIGNIFICANT) -> None:
    """``glue`` each name -> value of a dict (display off): a chapter's summary in one call."""
    for name, value in values.items():
        glue(name, value, display=False, digits=digits)


FIGURE_DATA_PREFIX = "figure data sha256[:16]:"


def figure_data_fingerprint(data: Any) -> str:
    """The first 16 hex digits of the SHA-256 of ``repr(data)``: a figure's data, compared by nbval.

    The chapters round every float in ``data`` to the precision rule before they hash it, so the
    fingerprint is the same on any machine.
    """
    return hashlib.sha256(repr(data).encode()).hexdigest()[:16]


def print_figure_data(data: Any) -> None:
    """Print the figure-data fingerprint line (a cell-tag rule removes it from the rendered page)."""
    print(FIGURE_DATA_PREFIX, figure_data_fingerprint(data))


def _text(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else value if isinstance(value, str) else json.dumps(value)


def stored_texts(cells: list[dict[str, Any]]) -> Iterator[tuple[int, str, str, Mapping[str, Any]]]:
    """(cell index, mime type, text, output metadata) of every textual output a notebook stores."""
    for index, cell in enumerate(cells):
        for output in cell.get("outputs", []):
            if "text" in output:
                yield index, f"stream:{output.get('name', '')}", _text(output["text"]), {}
            for mime, value in output.get("data", {}).items():
                if not mime.replace(RECORD_PREFIX, "").startswith(SKIPPED_MIMES) and "svg" not in mime:
                    yield index, mime, _text(value), output.get("metadata", {})


def _record_findings(notebook: str, index: int, mime: str, text: str, meta: Mapping[str, Any]) -> list[Finding]:
    """Rule 2 for a glue record (shown or not): a float came through ``glue`` and shows no more than its digits."""
    if "scrapbook" not in meta or not mime.endswith("text/plain") or not FLOAT_TOKEN.fullmatch(text.strip()):
        return []
    declared = meta.get(METADATA_KEY, {}).get("significant")
    if declared is None:
        return [Finding(notebook, index, mime, text, "a float glued without attnbook.precision.glue")]
    if significant_digits(text) > declared:
        return [Finding(notebook, index, mime, text, f"shows more than its declared {declared} digits")]
    return []


def stored_findings(path: Path, allowed: Mapping[str, str] = {}, name: str | None = None) -> list[Finding]:
    """Every stored output of the notebook at ``path`` that breaks the rule (``allowed``: token -> why it is exact)."""
    name = name or path.name
    cells = json.loads(path.read_text())["cells"]
    found: list[Finding] = []
    for index, mime, text, meta in stored_texts(cells):
        found += _record_findings(name, index, mime, text, meta)
        for match in FLOAT_TOKEN.finditer(text):
            token = match.group()
            if is_float_token(token) and significant_digits(token) > MAX_SIGNIFICANT and token not in allowed:
                found.append(Finding(name, index, mime, token, f"more than {MAX_SIGNIFICANT} significant digits"))
    return found


GLUE_REFERENCE = re.compile(r"\{glue:text\}`([\w.-]+):([^`]+)`")


def reference_findings(path: Path, name: str | None = None) -> list[Finding]:
    """Prose that shows more digits of a glued float than the record carries (``{glue:text}`key:spec```)."""
    name = name or path.name
    cells = json.loads(path.read_text())["cells"]
    records: dict[str, tuple[str, int]] = {}
    for _, mime, text, meta in stored_texts(cells):
        key = meta.get("scrapbook", {}).get("name")
        declared = meta.get(METADATA_KEY, {}).get("significant")
        if key and declared and mime.endswith("text/plain"):
            records[key] = (text, declared)
    found = []
    for index, cell in enumerate(cells):
        if cell["cell_type"] != "markdown":
            continue
        for match in GLUE_REFERENCE.finditer(_text(cell["source"])):
            key, spec = match.groups()
            if key not in records or spec[-1] not in "eEfFgG%":
                continue
            text, declared = records[key]
            shown = format(float(text), spec).replace(",", "").rstrip("%")
            if significant_digits(shown) > declared:
                found.append(Finding(name, index, "markdown", f"{key}:{spec} -> {shown}",
                                     f"the prose shows more than the {declared} digits glued"))
    return found
