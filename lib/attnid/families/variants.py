"""The unidentified share of each attention variant at the same width: the data of chapter 7b's comparison.

``variant_shares(d_model, heads, kv_heads)`` counts one layer of every registered variant
with the same width d, H query heads of width d / H and, where the variant groups keys and
values, G key/value heads. The registry ``VARIANTS`` maps a name to a builder
``builder(d_model, heads, kv_heads)`` that returns a layout of any family (counted by its family
through ``attnid.families``) or a pair ``(description, counted)`` where ``counted`` has ``total``
and ``unidentified`` (and optionally ``weakly_identified``). Multi-head latent attention joins
the comparison with a builder that returns an ``MLASpec``::

    register_variant("MLA", lambda d, h, g: MLASpec(d_model=d, heads=h, kv_lora_rank=d // 2, ...))

The order of registration is the order of the figure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attnid import families
from attnid.layout import Layout
from attnid.spec import AttentionSpec

Builder = Callable[[int, int, int], Any]
VARIANTS: dict[str, Builder] = {}
# The eps of the QK-norm variants: Qwen3's and Gemma 3's rms_norm_eps (attnid.spec.DEFAULT_QK_NORM_EPS).
COMPARISON_EPS = 1e-6
# The window of the window variant: 3 keys, the narrowest the counts cover, so that a numeric check on short
# inputs sees it; any wider window counts the same.
WINDOW = 3


@dataclass(frozen=True)
class VariantShare:
    """One variant's layer at the comparison's width: parameters, unidentified, and those identified only through eps."""

    name: str
    description: str
    total: int
    unidentified: int
    weakly_identified: int = 0

    @property
    def ratio(self) -> float:
        return self.unidentified / self.total

    @property
    def ratio_eps_zero(self) -> float:
        """The share if the weakly identified directions (a QK-norm's scales) count as unidentified (eps = 0)."""
        return (self.unidentified + self.weakly_identified) / self.total


def register_variant(name: str, builder: Builder) -> None:
    """Add (or replace) a variant of the comparison."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a variant needs a non-empty name, got {name!r}")
    VARIANTS[name] = builder


def _builder(grouped: bool, **fields: Any) -> Builder:
    def build(d: int, h: int, g: int) -> AttentionSpec:
        return AttentionSpec.create(d, h, kv_heads=g if grouped else h, causal=True, **fields)
    return build


for _name, _grouped, _fields in (
    ("MHA", False, {}),
    ("GQA", True, {}),
    ("MHA + RoPE", False, {"rope_fraction": 1.0}),
    ("GQA + RoPE", True, {"rope_fraction": 1.0}),
    ("GQA + RoPE + window", True, {"rope_fraction": 1.0, "window": WINDOW}),
    ("QK-norm shared", True, {"rope_fraction": 1.0, "qk_norm": "shared", "qk_norm_eps": COMPARISON_EPS}),
    ("QK-norm per-head", True, {"rope_fraction": 1.0, "qk_norm": "per-head", "qk_norm_eps": COMPARISON_EPS}),
    ("QK-norm full width", True, {"rope_fraction": 1.0, "qk_norm": "full", "qk_norm_eps": COMPARISON_EPS}),
    ("QK-norm unweighted", True, {"rope_fraction": 1.0, "qk_norm": "unweighted", "qk_norm_eps": COMPARISON_EPS}),
):
    register_variant(_name, _builder(_grouped, **_fields))


def variant_shares(d_model: int, heads: int, kv_heads: int, names: list[str] | None = None) -> list[VariantShare]:
    """Every registered variant (or those in ``names``, in that order) at width d_model with H and G heads.

    Variants whose count is not covered at this size (``count(...).unidentified is None``) are refused
    with a ValueError naming them, never dropped.
    """
    chosen = list(VARIANTS) if names is None else names
    unknown = [n for n in chosen if n not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant(s) {', '.join(unknown)}; registered: {', '.join(VARIANTS)}")
    out = []
    for name in chosen:
        built = VARIANTS[name](d_model, heads, kv_heads)
        if isinstance(built, Layout):  # a layout of any family, counted by its family
            description, counted = built.describe(), families.count(built)
        else:
            description, counted = built
        if counted.unidentified is None:
            raise ValueError(f"variant {name!r} has no exact count at d_model={d_model}, heads={heads}, "
                             f"kv_heads={kv_heads}: {getattr(counted, 'note', '')}")
        out.append(VariantShare(name, description, int(counted.total), int(counted.unidentified),
                                int(getattr(counted, "weakly_identified", 0))))
    return out
