"""What a model's configuration counts to: ``LayerGroup`` (layers of one type and the count of one of
them), ``Ignored`` (a field that does not enter the counts) and ``ModelCount`` (the whole model).

Built by the mappers of ``attnid.hf.config`` and ``attnid.hf.models`` from the pieces in ``attnid.hf.read``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from attnid import families
from attnid.layout import Count, Layout


@dataclass(frozen=True)
class LayerGroup:
    """Layers of one type with the same layout: ``layers`` of them, each with the ``count`` of one layer.

    ``count`` is None for a layer type this tool does not count (its parameters are then unknown,
    ``total`` 0 and ``unidentified`` None). ``count.spec`` is the layout, of any family. A ``note``
    says why a count does not apply (``unidentified`` is then None) or what the count leaves out.
    """

    kind: str
    layers: int
    count: Count | None
    note: str = ""
    parameters: int | None = None
    """Parameters of one layer of a type this tool does not count, where known (None for a counted group)."""

    @classmethod
    def from_layout(cls, kind: str, layers: int, layout: Layout, note: str = "") -> "LayerGroup":
        """A group of attention layers of a layout of any family, counted by its family (``attnid.families``).

        A ``note`` says why the count does not apply to these layers (the group is then not covered).
        """
        return cls.from_count(kind, layers, families.count(layout), note)

    @classmethod
    def from_count(cls, kind: str, layers: int, counted: Count, note: str = "") -> "LayerGroup":
        """A group from a ``Count`` already made (a plugged-in family that counts itself)."""
        notes = "; ".join(n for n in (note, counted.note) if n)
        return cls(kind, layers, withheld(counted) if note else counted, notes)

    @classmethod
    def not_counted(cls, kind: str, layers: int, why: str, parameters: int | None = None) -> "LayerGroup":
        """Layers of a type this tool does not count (``parameters`` per layer where known)."""
        return cls(kind, layers, None, why, parameters)

    @property
    def attention(self) -> bool:
        """Whether these layers are attention this tool counts."""
        return self.count is not None

    @property
    def description(self) -> str:
        """The layout in one line."""
        return self.count.spec.describe() if self.count is not None else f"{self.kind}: not counted"

    @property
    def spec(self) -> Any:
        """The layout (None when not counted)."""
        return self.count.spec if self.count is not None else None

    @property
    def total(self) -> int:
        """Parameters of one layer (0 when not counted)."""
        return self.count.total if self.count is not None else 0

    @property
    def unidentified(self) -> int | None:
        """Unidentified parameters of one layer (None when not covered or not counted)."""
        return self.count.unidentified if self.count is not None else None

    @property
    def breakdown(self) -> dict[str, int]:
        return dict(self.count.breakdown) if self.count is not None else {}

    @property
    def weakly_identified(self) -> int:
        return self.count.weakly_identified if self.count is not None else 0

    @property
    def ratio(self) -> float | None:
        """unidentified / total per layer (None when not covered or not counted)."""
        return None if self.unidentified is None or not self.total else self.unidentified / self.total

    def record(self) -> dict[str, Any]:
        """The group as a JSON-ready dict (what `attnid count --config --json` prints)."""
        layout = self.spec.to_dict() if isinstance(self.spec, Layout) else None
        return {"layer_type": self.kind, "layers": self.layers, "attention": self.attention,
                "layout": self.description, "layout_fields": layout,
                "parameters_per_layer": self.total if self.attention else self.parameters,
                "unidentified_per_layer": self.unidentified, "ratio": self.ratio, "breakdown": self.breakdown,
                "weakly_identified_per_layer": self.weakly_identified, "note": self.note}


@dataclass(frozen=True)
class Ignored:
    """A configuration field that does not enter the counts, and why."""

    field: str
    value: Any
    why: str

    def record(self) -> dict[str, Any]:
        """The field, its value and the reason, as a JSON-ready dict (a non-finite number as its text: JSON has none)."""
        value = self.value
        if isinstance(value, float) and not math.isfinite(value):
            value = repr(value)
        return {"field": self.field, "value": value, "why": self.why}


@dataclass(frozen=True)
class ModelCount:
    """A whole model's attention, by layer type, from its configuration."""

    source: str
    model_type: str
    groups: list[LayerGroup]
    ignored: list[Ignored]
    not_attention: list[str]
    defaults: list[Ignored] = field(default_factory=list)
    """Fields the file leaves out that transformers' config class fills (the model it builds has these values)."""
    route: str = "reader"
    """'transformers' (read from the modules transformers builds, ``attnid.hf.meta``) or 'reader' (attnid's reader)."""

    @property
    def layers(self) -> int:
        """Layers of every type, counted or not."""
        return sum(g.layers for g in self.groups)

    @property
    def counted(self) -> list[LayerGroup]:
        """The groups of attention layers this tool counts."""
        return [g for g in self.groups if g.attention]

    @property
    def total(self) -> int:
        """Parameters of all counted attention layers."""
        return sum(g.total * g.layers for g in self.counted)

    @property
    def unidentified(self) -> int | None:
        """Unidentified parameters of all counted attention layers (None if any of them has no exact count)."""
        if any(g.unidentified is None for g in self.counted):
            return None
        return sum(g.unidentified * g.layers for g in self.counted)  # type: ignore[operator]

    @property
    def weakly_identified(self) -> int:
        """Directions identified only through a norm's eps, over all counted layers."""
        return sum(g.weakly_identified * g.layers for g in self.counted)

    @property
    def ratio(self) -> float | None:
        """unidentified / total over all counted layers (None when any group is not covered)."""
        u = self.unidentified
        return None if u is None or not self.total else u / self.total

    def record(self) -> dict[str, Any]:
        """The whole model as a JSON-ready dict."""
        return {"config": self.source, "model_type": self.model_type, "layers": self.layers,
                "layers_counted": sum(g.layers for g in self.counted),
                "groups": [g.record() for g in self.groups],
                "parameters_all_layers": self.total, "unidentified_all_layers": self.unidentified,
                "ratio": self.ratio, "weakly_identified_all_layers": self.weakly_identified,
                "ignored": [i.record() for i in self.ignored], "not_attention_fields": self.not_attention,
                "defaults": [i.record() for i in self.defaults], "route": self.route}


def withheld(counted: Count) -> Count:
    """``counted`` with its unidentified parameters withheld (no theorem covers the layers)."""
    return replace(counted, unidentified=None, breakdown={}, weakly_identified=0)
