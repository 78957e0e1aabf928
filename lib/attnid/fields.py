"""The field schema: one rule (type, range, message) for every layout field, whichever door it comes through.

A value reaches a layout through six doors: ``AttentionSpec``, ``mla.MLASpec``, a census YAML
entry, a Hugging Face ``config.json`` (``hfconfig``), a CLI flag and the kernels'
``check_inputs``. Each door names the field its own way (``rope_base``, ``rope_theta``,
``--rope-base``) and then calls ``FIELDS[name].check(value)``, so the rule and its message are
written once here: a test feeds the same bad value through every door and finds the same words.

``check`` returns the value in its canonical type (an int, or a float for a real field) or raises
``TypeError`` (wrong type: a bool is never a number) or ``ValueError`` (out of range, NaN, an
infinity); the message has no field name, so a door writes ``f"{its_name} {message}"``.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Widths and head counts: at most a million each, which keeps every count below 2**63 (P is at most
# d_model (H d_k + G d_k + G d_v + H d_v) plus the biases, about 4e18 at the cap), so JSON readers with
# 64-bit integers read them exactly; published layouts stay below 20,000.
MAX_WIDTH = 1_000_000
# Sliding windows and chunks: any positive width a 32-bit config field can hold (published: 128 to 131072).
MAX_WINDOW = 2**31 - 1
# Layers of a model: published models have at most a few hundred; the cap keeps a per-layer list (layer_types,
# one entry per layer) small whatever a file claims.
MAX_LAYERS = 100_000
# The RoPE bases a layout accepts. Position p turns the pair (i, i + r/2) by p * base^(-2i/r): the
# slowest pair turns by more than base^-1 per position, and adjacent pairs turn at speeds that
# differ by the factor base^(2/r), about 1 + (2/r) ln(base) near 1. Above 1e12 the slowest pair turns
# by less than 1e-12 per position, a change to a score of a few thousand float64 round-offs (2.2e-16)
# per position: at the lengths a numeric check uses, that pair is hard to tell from an unrotated one,
# whose layout has a larger symmetry group than the exact count describes (base 1e308 gave a "clear"
# mismatch). Below 1 + 1e-6 all pairs turn at speeds equal to within 1e-6 (2/r): the differences
# RoPE's count rests on sink towards the rank rule's zero tolerance (1e-10) and again look like
# extra symmetries (base 1 + 1e-10 gave a "clear" mismatch). Published layouts use 1e4 to 1e7.
# Inside the range a numeric check can still be inconclusive for wide rotated heads near either end
# ("NOT clear", as at base 1e12 with r = 8), which is honest, not wrong. The kernels take the same range.
MIN_ROPE_BASE = 1.0 + 1e-6
MAX_ROPE_BASE = 1e12
# Epsilons of an RMSNorm (QK-norm, MLA's latent norms): 0 (the exact scale invariance) up to 1, far above
# any published value (1e-6, 1e-5).
MAX_NORM_EPS = 1.0


def show(value: Any, limit: int = 60) -> str:
    """A value for an error message: a number as typed (shortest round-trip form), anything else as repr, cut short."""
    if isinstance(value, float) and math.isfinite(value):
        text = repr(value)
        text = text[:-2] if text.endswith(".0") else text
    elif isinstance(value, numbers.Integral) and not isinstance(value, bool):
        text = str(int(value))
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shown_path(path: object, limit: int = 160) -> str:
    """A file path for an error message: as given, or cut in the middle when longer than ``limit`` characters."""
    text = str(path)
    return text if len(text) <= limit else f"{text[: limit // 2]}...{text[-(limit // 2 - 3):]}"


def json_integer(value: Any) -> Any:
    """An integer as a JSON writer may give it: an integral float (7168.0) as that int; any other value unchanged."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    return value


def format_number(value: float) -> str:
    """A range end for a message: 1e12 as 1e12, 1 + 1e-6 as 1 + 1e-6, 1,000,000 with separators."""
    if value == MIN_ROPE_BASE:
        return "1 + 1e-6"
    if float(value).is_integer() and abs(value) < 2**53:
        return f"{int(value):,}" if abs(value) < 1e10 else f"{value:g}".replace("e+", "e")
    return f"{value:g}".replace("e+", "e")


@dataclass(frozen=True)
class Field:
    """One field's rule: an integer or a real number in [low, high]; ``even``: a whole even number."""

    name: str
    kind: str  # "int" or "real"
    low: float
    high: float
    even: bool = False

    @property
    def rule(self) -> str:
        """What a valid value is, in words: 'an integer from 1 to 1,000,000', 'a number in [0, 1]'."""
        if self.kind == "int":
            parity = "an even integer" if self.even else "an integer"
            return f"{parity} from {format_number(self.low)} to {format_number(self.high)}"
        return f"a number in [{format_number(self.low)}, {format_number(self.high)}]"

    def message(self, value: Any, shown: Callable[[Any], str] = show) -> str:
        """The error for a bad value, without the field's name: 'must be <rule>, got <value>'.

        ``shown`` writes the value as the door's reader would see it (YAML's ``true``, JSON's ``null``).
        """
        return f"must be {self.rule}, got {shown(value)}"

    def check(self, value: Any, shown: Callable[[Any], str] = show) -> Any:
        """``value`` in its canonical type (int or float); TypeError or ValueError with ``message``."""
        if isinstance(value, bool):
            raise TypeError(self.message(value, shown))
        try:  # any integral type (numpy, torch) through operator.index; any real through float
            canonical: Any = operator.index(value) if self.kind == "int" else _real(value)
        except TypeError:
            raise TypeError(self.message(value, shown)) from None
        except OverflowError:  # an integer too large for a float: out of every range
            raise ValueError(self.message(value, shown)) from None
        if not self.low <= canonical <= self.high or (self.even and canonical % 2):  # NaN fails the comparison
            raise ValueError(self.message(value, shown))
        return canonical


def _real(value: Any) -> float:
    """``value`` as a plain float when it is a real number (numbers.Real: int, float, numpy's); TypeError otherwise."""
    if not isinstance(value, numbers.Real):
        raise TypeError(value)
    return float(value)


def _int(name: str, low: int = 1, high: int = MAX_WIDTH, even: bool = False) -> Field:
    return Field(name, "int", low, high, even)


FIELDS: dict[str, Field] = {f.name: f for f in (
    _int("d_model"), _int("heads"), _int("kv_heads"), _int("head_dim"), _int("v_head_dim"),
    _int("window", high=MAX_WINDOW), _int("chunk", high=MAX_WINDOW), _int("layers", high=MAX_LAYERS),
    _int("positive_integer", high=MAX_WINDOW),  # any other whole-number setting of a config (a pattern, an interval)
    Field("rope_fraction", "real", 0.0, 1.0),
    Field("rope_base", "real", MIN_ROPE_BASE, MAX_ROPE_BASE),
    Field("qk_norm_eps", "real", 0.0, MAX_NORM_EPS),
    # multi-head latent attention (attnid.families.mla)
    _int("kv_lora_rank"), _int("q_lora_rank"), _int("qk_nope_head_dim"), _int("qk_rope_head_dim", low=0, even=True),
    Field("norm_eps", "real", 0.0, MAX_NORM_EPS),
)}


def register(field: Field) -> Field:
    """Add a family's own field to the schema (a new family's module calls this; a name is registered once)."""
    if field.name in FIELDS and FIELDS[field.name] != field:
        raise ValueError(f"field {field.name!r} is already in the schema with another rule")
    FIELDS[field.name] = field
    return field


def check(name: str, value: Any) -> Any:
    """``FIELDS[name].check(value)``, with the field's name in front of the message (the Python API's form)."""
    try:
        return FIELDS[name].check(value)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{name} {exc}") from None


def rope_columns(fraction: float, width: int, name: str = "rope_fraction") -> int:
    """r = fraction * width rotated columns, which must be an even whole number (RoPE rotates pairs)."""
    fraction = FIELDS["rope_fraction"].check(fraction)
    exact = fraction * width
    r = round(exact)
    if abs(exact - r) > 1e-9:
        raise ValueError(f"{name} {show(fraction)} of head_dim {width} is {exact:g} columns, not a whole number")
    if r % 2:
        raise ValueError(f"RoPE rotates pairs: {name} {show(fraction)} of head_dim {width} gives odd r = {r}")
    return r
