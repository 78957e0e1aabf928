"""A census of published attention layouts: parameters, unidentified dimension, biases.

The layouts come from ``architectures.yaml`` next to this module, or from a file a user gives
(``attnid census --file``), read and checked by ``attnid.census_file`` (``load_layouts``; every
field checked, every failure one line naming the file, the layout and the field). This module
counts them: ``census`` gives a ``CensusRow`` per layout (the exact count per layer and for the
whole model, the bias verdicts of ``bias_status``, the same width as plain MHA for comparison),
``census_table`` and ``bias_table`` the chapter's tables, ``scaled_down`` a small layout of the
same structure for a numeric check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnid import families
from attnid.strict_yaml import MAX_FILE_BYTES
from attnid.census_file import DEFAULT_CAUSAL, SHIPPED, UNCOVERED, ModelEntry, load_layouts, parse_layout
from attnid.counts import Count, count
from attnid.spec import AttentionSpec

__all__ = ["BIAS_COLUMNS", "CENSUS_COLUMNS", "DEFAULT_CAUSAL", "MAX_FILE_BYTES", "SHIPPED", "CensusRow", "ModelEntry",
           "bias_status", "bias_table", "census", "census_table", "load_layouts", "parse_layout", "plain_mha", "scaled_down"]

def bias_status(spec: AttentionSpec) -> dict[str, str]:
    """For each bias present: identified, dead, folded, or alive and why."""
    status: dict[str, str] = {}
    r, dk = spec.rope_dims, spec.head_dim
    why = {"sink": "a sink in the softmax", "sigmoid": "sigmoid attention"}.get(spec.norm, "")
    if spec.has_bias("q"):
        status["q"] = "identified"
    if spec.has_bias("k"):
        if spec.has_qk_norm:
            status["k"] = "alive (inside the QK-norm)"
        elif why:
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
    layout: ModelEntry
    count: Count
    mha: Count

    def per_layer_type(self) -> list[tuple[int, Count]]:
        """(layers, count) per layer type: a family's own layout on every layer; T5's table on the first layer only
        (the others see it as fixed offsets, which change no count); windows or chunks on some layers."""
        lay, c = self.layout, self.count
        if lay.relative_bias is not None and not lay.relative_bias[2]:
            return [(1, c)] + ([(lay.layers - 1, count(lay.spec))] if lay.layers > 1 else [])
        if lay.mla is not None or lay.gate != "none" or lay.alibi or lay.relative_bias is not None:
            return [(lay.layers, c)]
        return [(n, count(spec)) for n, spec in lay.layer_specs()]

    def record(self) -> dict[str, Any]:
        c, layers = self.count, self.layout.layers
        per_type = self.per_layer_type()
        covered = self.layout.covered and all(t.covered for _, t in per_type)
        spec = self.layout.spec
        masked = {"window": spec.window, "chunk": spec.chunk, "masked_layers": self.layout.masked_layers} \
            if spec.window is not None or spec.chunk is not None else {}
        return {
            "model": self.layout.key, "name": self.layout.name, "layers": layers,
            "layout": self.layout.layout.describe(),
            "parameters_per_layer": c.total,
            "parameters_all_layers": sum(n * t.total for n, t in per_type),
            "unidentified_per_layer": c.unidentified if covered else None,
            "unidentified_all_layers": sum(n * t.unidentified for n, t in per_type) if covered else None,  # type: ignore[misc]
            "ratio": c.ratio if covered else None, "plain_mha_ratio": self.mha.ratio,
            "biases": bias_status(self.layout.spec),
            "uncovered": {u: UNCOVERED[u] for u in self.layout.uncovered}, "source": self.layout.source,
            **({"qk_norm": spec.qk_norm, "qk_norm_eps": spec.qk_norm_eps,
                "weakly_identified_per_layer": c.weakly_identified} if spec.has_qk_norm else {}),
            **masked,
        }


def census(layouts: list[ModelEntry]) -> list[CensusRow]:
    """One row per layout (multi-head latent attention counted by ``attnid.families.mla``, next to MHA of the same widths)."""
    return [CensusRow(lay, families.count(lay.layout), count(plain_mha(lay.spec)))
            for lay in layouts]


# the shares first, next to the model's name: on a phone the table scrolls and those columns stay in view
CENSUS_COLUMNS = ("model", "ratio", "plain MHA", "layers", "params / layer", "unidentified / layer",
                  "unidentified, all layers")


def census_table(rows: list[CensusRow]) -> list[list[str]]:
    """The census as strings, one list per model in the order of ``CENSUS_COLUMNS`` ('n/a' where not covered)."""
    def shown(value: Any, spec: str) -> str:
        return "n/a" if value is None else format(value, spec)

    body = []
    for row in rows:
        r = row.record()
        body.append([r["name"], shown(r["ratio"], ".5f"), f"{r['plain_mha_ratio']:.5f}", str(r["layers"]),
                     f"{r['parameters_per_layer']:,}", shown(r["unidentified_per_layer"], ","),
                     shown(r["unidentified_all_layers"], ",")])
    return body


BIAS_COLUMNS = ("model", "query bias", "key bias", "value bias", "output bias")


def bias_table(rows: list[CensusRow]) -> list[list[str]]:
    """For every model with a bias: the status of b_Q, b_K, b_V, b_O ('none' where absent)."""
    return [[row.layout.name, *(row.record()["biases"].get(k, "none") for k in "qkvo")]
            for row in rows if row.record()["biases"]]


def scaled_down(spec: AttentionSpec, heads: int = 4, head_dim: int = 4) -> AttentionSpec:
    """A small layout with the same structure: query/key-value sharing, RoPE share, biases, normalisation, QK-norm.

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
    # A window or chunks wider than the check's inputs would do nothing there: 3 keys, the narrowest the counts cover.
    return AttentionSpec.create(h * dk, h, kv_heads=g, head_dim=dk, v_head_dim=dk, bias=spec.bias or "none",
                                rope_dims=round(fraction * dk), causal=spec.causal, norm=spec.norm,
                                sink_learned=spec.sink_learned, qk_norm=spec.qk_norm, qk_norm_eps=spec.qk_norm_eps,
                                window=None if spec.window is None else min(spec.window, 3),
                                chunk=None if spec.chunk is None else min(spec.chunk, 3))
