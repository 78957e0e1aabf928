"""Glued floats that prose prints with fewer digits: round once, not twice.

``attnbook.precision.glue`` keeps four significant digits. Prose that prints one digit fewer rounds the stored value
again, and from a stored last digit 5 that second rounding follows the stored value, not the true one: 1.02541 glued
as 1.025 prints "1.02" at two decimals, where the value gives "1.03". ``glue_unambiguous`` glues each float with the
fewest digits from four up whose last is not a 5 (at most the precision rule's six), so any shorter display rounds
the value itself; ``tests/test_precision.py`` scans every notebook's prose for the double rounding this prevents.
(It lives beside ``attnbook.precision``, not in it: the per-machine data of the kernels appendix record that
module's hash, and only their own machine can rewrite them.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from attnbook.precision import MAX_SIGNIFICANT, SIGNIFICANT, glue, rounded


def _ends_in_five(value: float, digits: int) -> bool:
    """Whether ``value``, written with ``digits`` significant digits, ends in a 5."""
    return math.isfinite(value) and value != 0 and f"{value:.{digits - 1}e}".split("e")[0].endswith("5")


def unambiguous_digits(value: float, digits: int = SIGNIFICANT) -> int:
    """The fewest digits from ``digits`` up (at most ``MAX_SIGNIFICANT``) whose rounding of ``value`` does not end in 5."""
    while digits < MAX_SIGNIFICANT and _ends_in_five(rounded(value, digits), digits):
        digits += 1
    return digits


def glue_unambiguous(values: Mapping[str, Any]) -> None:
    """``glue`` each name -> value (display off); a float with ``unambiguous_digits`` of it."""
    for name, value in values.items():
        if isinstance(value, float) and not isinstance(value, bool):
            glue(name, value, display=False, digits=unambiguous_digits(value))
        else:
            glue(name, value, display=False)
