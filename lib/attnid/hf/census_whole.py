"""The census's whole-model column: what each listed model's whole function cannot see, beside its attention share.

``whole_configs.yaml`` holds, per census model, the fields of its published config.json that the whole-model
count reads (``attnid.hf.whole``); a model type outside the whole-model theory needs only its ``model_type``
and ``architectures``, and its count is withheld with the reason. ``whole_column`` pairs every census row with
its whole-model record: parameters and unidentified parameters of the model ``architectures[0]`` builds (its head
included), its breakdown by component, and the attention-only share of the census (one layer's u / P) beside them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnid.census import CensusRow
from attnid.hf.whole import whole_model
from attnid.whole.model import COMPONENTS
from attnid.strict_yaml import read_yaml, show

SHIPPED = Path(__file__).resolve().parents[1] / "whole_configs.yaml"
ENTRY_KEYS = ("source", "config")


@dataclass(frozen=True)
class WholeRow:
    """One census model: its whole-model count (None where withheld, with the reason) and its attention share."""

    key: str
    name: str
    parameters: int | None
    unidentified: int | None
    attention_ratio: float | None
    note: str
    source: str
    breakdown: dict[str, int]

    @property
    def ratio(self) -> float | None:
        return None if self.parameters is None or self.unidentified is None else self.unidentified / self.parameters


def _entry(key: str, entry: Any, where: str) -> dict[str, Any]:
    if not isinstance(entry, dict) or sorted(entry) != sorted(ENTRY_KEYS):
        raise ValueError(f"{where}: model {key!r} must be a mapping with exactly the keys source and config, "
                         f"got {show(entry)}")
    if not isinstance(entry["source"], str) or not entry["source"]:
        raise ValueError(f"{where}: model {key!r}: source must be a non-empty string, got {show(entry['source'])}")
    config = entry["config"]
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise ValueError(f"{where}: model {key!r}: config must be a mapping with a model_type, got {show(config)}")
    return entry


def load_configs(path: Path | str = SHIPPED) -> dict[str, dict[str, Any]]:
    """{census key: {"source", "config"}} from a whole-model configuration file (read strictly, checked)."""
    path = Path(path)
    where = f"whole-model configuration file {path.name!r}"
    data = read_yaml(path)
    if not isinstance(data, dict) or list(data) != ["models"] or not isinstance(data["models"], dict):
        raise ValueError(f"{where}: the top level must be a mapping with one key, models")
    return {key: _entry(key, entry, where) for key, entry in data["models"].items()}


def whole_column(rows: list[CensusRow], configs: dict[str, dict[str, Any]] | None = None) -> list[WholeRow]:
    """Per census row, in order: the whole-model record of its configuration (every census model must have one)."""
    configs = load_configs() if configs is None else configs
    missing = [row.layout.key for row in rows if row.layout.key not in configs]
    if missing:
        raise ValueError(f"no whole-model configuration for census model(s) {', '.join(missing)}")
    out = []
    for row in rows:
        entry = configs[row.layout.key]
        record = whole_model(dict(entry["config"]), row.layout.key)["whole_model"]
        out.append(WholeRow(row.layout.key, row.layout.name, record["parameters"], record["unidentified"],
                            row.record()["ratio"], record["note"], entry["source"], dict(record["breakdown"])))
    return out


def with_whole(columns: tuple[str, ...], table: list[list[str]], rows: list[WholeRow],
               after: str = "ratio") -> tuple[tuple[str, ...], list[list[str]]]:
    """The census table (``attnid.census.census_table``) with a "whole model" share column after ``after``."""
    at = columns.index(after) + 1
    shares = ["n/a" if r.ratio is None else f"{r.ratio:.5f}" for r in rows]
    return (*columns[:at], "whole model", *columns[at:]), [[*t[:at], w, *t[at:]] for t, w in zip(table, shares, strict=True)]


WHOLE_COLUMNS = ("model", "parameters", "unidentified", *COMPONENTS)


def whole_table(rows: list[WholeRow]) -> list[list[str]]:
    """The counted models as strings in the order of ``WHOLE_COLUMNS``: the whole model's P, U and U by component."""
    return [[r.name, f"{r.parameters:,}", f"{r.unidentified:,}", *(f"{r.breakdown.get(k, 0):,}" for k in COMPONENTS)]
            for r in rows if r.parameters is not None and r.unidentified is not None]
