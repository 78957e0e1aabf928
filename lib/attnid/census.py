"""A census of published attention layouts: parameters, unidentified dimension, biases.

The shipped layouts live in ``architectures.yaml`` next to this file; ``load_layouts``
reads that file or one a user gives, and rejects an unknown or malformed entry with an
error naming the entry and the field.

``causal`` (a YAML bool, ``true`` or ``false``) says whether the layer masks later tokens.
It defaults to ``true`` (``DEFAULT_CAUSAL``): most entries are decoder language models, so
an encoder or other bidirectional model (BERT) must say ``causal: false``. Anything but a
bool (``"no"``, ``0``, ``null``) is refused rather than guessed at.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .counts import Count, count
from .spec import AttentionSpec

SHIPPED = Path(__file__).with_name("architectures.yaml")
# Files this module reads: a record of what results built on it depend on (see attnbook.provenance).
DATA_FILES = (SHIPPED,)
REQUIRED = ("d_model", "heads", "kv_heads", "head_dim", "layers")
OPTIONAL = ("name", "v_head_dim", "bias", "rope_fraction", "rope_base", "causal", "norm", "sink", "uncovered",
            "notes", "source", "transformers_check")
DEFAULT_CAUSAL = True  # decoder models mask later tokens; encoders (BERT) set causal: false
UNCOVERED = {
    "qk_norm": ("not covered: an RMSNorm over the full-width queries and keys sees their scale, so a change of "
                "basis inside a head is no longer free; the count below the norm is smaller, and not derived here"),
    "mla": ("not covered: multi-head latent attention builds keys and values from a shared low-rank latent and "
            "adds a RoPE key shared by all heads; the symmetry group is different and not derived here"),
    "sliding_window": ("covered: a sliding window only removes keys from each row, and the counts hold for any "
                       "mask that leaves every row two or more keys"),
}


@dataclass(frozen=True)
class Layout:
    """One model's attention layer and how many layers it has."""

    key: str
    name: str
    spec: AttentionSpec
    layers: int
    uncovered: tuple[str, ...] = ()
    notes: str = ""
    source: str = ""
    transformers_check: dict[str, Any] = field(default_factory=dict)

    @property
    def covered(self) -> bool:
        """Whether the theory's count applies (only sliding windows among the extra features)."""
        return all(u == "sliding_window" for u in self.uncovered)


def _entry_error(key: str, message: str) -> ValueError:
    return ValueError(f"layout {key!r}: {message}")


def parse_layout(key: str, entry: Any) -> Layout:
    """Validate one entry of a layout file."""
    if not isinstance(entry, dict):
        raise _entry_error(key, f"must be a mapping of fields, got {type(entry).__name__}")
    unknown = sorted(set(entry) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise _entry_error(key, f"unknown field(s) {', '.join(unknown)}; allowed: {', '.join(REQUIRED + OPTIONAL)}")
    missing = [f for f in REQUIRED if f not in entry]
    if missing:
        raise _entry_error(key, f"missing field(s) {', '.join(missing)}")
    for name in (*REQUIRED, "v_head_dim"):
        if name in entry and (isinstance(entry[name], bool) or not isinstance(entry[name], int) or entry[name] < 1):
            raise _entry_error(key, f"field {name} must be a positive integer, got {entry[name]!r}")
    uncovered = entry.get("uncovered", [])
    if not isinstance(uncovered, list) or any(u not in UNCOVERED for u in uncovered):
        raise _entry_error(key, f"field uncovered must be a list drawn from {', '.join(UNCOVERED)}, got {uncovered!r}")
    causal = entry.get("causal", DEFAULT_CAUSAL)
    if not isinstance(causal, bool):
        raise _entry_error(key, f"field causal must be true or false (a YAML bool), got {causal!r}")
    sink = entry.get("sink", "fixed")
    if sink not in ("fixed", "learned"):
        raise _entry_error(key, f"field sink must be fixed or learned, got {sink!r}")
    try:
        spec = AttentionSpec.create(
            d_model=entry["d_model"], heads=entry["heads"], kv_heads=entry["kv_heads"], head_dim=entry["head_dim"],
            v_head_dim=entry.get("v_head_dim", entry["head_dim"]), bias=str(entry.get("bias", "none")),
            rope_fraction=float(entry.get("rope_fraction", 0.0)), rope_base=float(entry.get("rope_base", 10000.0)),
            causal=causal, norm=entry.get("norm", "softmax"), sink_learned=sink == "learned",
        )
    except (TypeError, ValueError) as exc:
        raise _entry_error(key, str(exc)) from None
    return Layout(key, str(entry.get("name", key)), spec, entry["layers"], tuple(uncovered), str(entry.get("notes", "")),
                  str(entry.get("source", "")), dict(entry.get("transformers_check", {}) or {}))


def load_layouts(path: Path | str = SHIPPED) -> list[Layout]:
    """All layouts of a YAML file with a top-level ``models`` mapping."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read layout file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"layout file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("models"), dict) or not data["models"]:
        raise ValueError(f"layout file {path} needs a top-level 'models' mapping with at least one entry")
    return [parse_layout(str(key), entry) for key, entry in data["models"].items()]


def bias_status(spec: AttentionSpec) -> dict[str, str]:
    """For each bias present: identified, dead, folded, or alive and why."""
    status: dict[str, str] = {}
    r, dk = spec.rope_dims, spec.head_dim
    why = {"sink": "a sink in the softmax", "sigmoid": "sigmoid attention"}.get(spec.norm, "")
    if spec.has_bias("q"):
        status["q"] = "identified"
    if spec.has_bias("k"):
        if why:
            status["k"] = f"alive ({why})"
        elif r == dk:
            status["k"] = "alive (RoPE after the bias)"
        elif r:
            status["k"] = f"alive on {r} rotated coordinates, dead on {dk - r}"
        else:
            status["k"] = "dead (softmax ignores it)"
    if spec.has_bias("v"):
        if why:
            status["v"] = f"identified ({why}: rows do not sum to one)"
        elif spec.has_bias("o"):
            status["v"] = "folded into the output bias"
        else:
            n = spec.kv_heads * spec.v_head_dim
            lost = n - min(n, spec.d_model)
            status["v"] = (f"{lost} of {n} coordinates unidentified (no output bias)" if lost
                           else "identified (no output bias to fold into)")
    if spec.has_bias("o"):
        status["o"] = "identified"
    return status


def plain_mha(spec: AttentionSpec) -> AttentionSpec:
    """The same widths and biases as plain multi-head attention: G = H, no RoPE, softmax."""
    return AttentionSpec.create(spec.d_model, spec.heads, kv_heads=spec.heads, head_dim=spec.head_dim,
                                v_head_dim=spec.v_head_dim, bias=spec.bias or "none", causal=spec.causal)


@dataclass(frozen=True)
class CensusRow:
    layout: Layout
    count: Count
    mha: Count

    def record(self) -> dict[str, Any]:
        c, layers = self.count, self.layout.layers
        covered = self.layout.covered and c.covered
        return {
            "model": self.layout.key, "name": self.layout.name, "layers": layers,
            "layout": self.layout.spec.describe(), "parameters_per_layer": c.total,
            "parameters_all_layers": c.total * layers,
            "unidentified_per_layer": c.unidentified if covered else None,
            "unidentified_all_layers": c.unidentified * layers if covered and c.unidentified is not None else None,
            "ratio": c.ratio if covered else None, "plain_mha_ratio": self.mha.ratio,
            "biases": bias_status(self.layout.spec),
            "uncovered": {u: UNCOVERED[u] for u in self.layout.uncovered}, "source": self.layout.source,
        }


def census(layouts: list[Layout]) -> list[CensusRow]:
    """One row per layout."""
    return [CensusRow(lay, count(lay.spec), count(plain_mha(lay.spec))) for lay in layouts]


CENSUS_COLUMNS = ("model", "layers", "params / layer", "unidentified / layer", "ratio", "plain MHA",
                  "unidentified, all layers")


def census_table(rows: list[CensusRow]) -> list[list[str]]:
    """The census as strings, one list per model in the order of ``CENSUS_COLUMNS`` ('n/a' where not covered)."""
    def shown(value: Any, spec: str) -> str:
        return "n/a" if value is None else format(value, spec)

    body = []
    for row in rows:
        r = row.record()
        body.append([r["name"], str(r["layers"]), f"{r['parameters_per_layer']:,}", shown(r["unidentified_per_layer"], ","),
                     shown(r["ratio"], ".5f"), f"{r['plain_mha_ratio']:.5f}", shown(r["unidentified_all_layers"], ",")])
    return body


BIAS_COLUMNS = ("model", "query bias", "key bias", "value bias", "output bias")


def bias_table(rows: list[CensusRow]) -> list[list[str]]:
    """For every model with a bias: the status of b_Q, b_K, b_V, b_O ('none' where absent)."""
    return [[row.layout.name, *(row.record()["biases"].get(k, "none") for k in "qkvo")]
            for row in rows if row.record()["biases"]]


def scaled_down(spec: AttentionSpec, heads: int = 4, head_dim: int = 4) -> AttentionSpec:
    """A small layout with the same structure: query/key-value sharing, RoPE share, biases, normalisation.

    Grouped layouts whose sharing ratio m = H/G is at most ``heads`` keep it exactly with two
    groups (H' = 2m); otherwise H' = min(H, heads) and G' is the nearest divisor of H' to
    H' G / H (so a wide sharing ratio becomes multi-query). d_k' = head_dim, widened until
    the RoPE share is a whole even number of dimensions; d_model = H' d_k'.
    """
    m = spec.heads // spec.kv_heads
    h = 2 * m if spec.kv_heads > 1 and 1 < m <= heads else min(spec.heads, heads)
    g = max(1, round(h * spec.kv_heads / spec.heads))
    while h % g:
        g -= 1
    fraction = spec.rope_dims / spec.head_dim
    dk = head_dim
    while fraction and (abs(fraction * dk - round(fraction * dk)) > 1e-9 or round(fraction * dk) % 2):
        dk += 1
    return AttentionSpec.create(h * dk, h, kv_heads=g, head_dim=dk, v_head_dim=dk, bias=spec.bias or "none",
                                rope_dims=round(fraction * dk), causal=spec.causal, norm=spec.norm,
                                sink_learned=spec.sink_learned)
