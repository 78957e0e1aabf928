"""A transformers module and attnid's layer on the same weights: the relative error every cross-check reports.

``SameWeights.of(layer, x)`` runs the module on X with its own weights and maps those weights to
attnid's parameters; ``error`` is max |out - Y| / max |Y| for any output, and ``module_error`` that
of the module itself at other attnid parameters (after a symmetry move, or a step off the orbit).
The layer is any object with ``weights``, ``output``, ``to_attnid`` and ``from_attnid``
(``attnid.hf.modules.HFLayer``, ``attnid.families.mla.HFMLA``). It sits below both
folders, which it serves, and imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from attnid.spec import Params


@dataclass(frozen=True)
class SameWeights:
    """The module's output Y on inputs X with its own weights, and those weights as attnid's parameters."""

    layer: Any
    x: torch.Tensor
    weights: dict[str, torch.Tensor]
    y: torch.Tensor
    params: dict[str, torch.Tensor]

    @classmethod
    def of(cls, layer: Any, x: torch.Tensor) -> SameWeights:
        """Run ``layer`` on ``x`` with its own weights (no random draws)."""
        weights = layer.weights()
        return cls(layer, x, weights, layer.output(weights, x), layer.to_attnid(weights))

    def error(self, out: torch.Tensor) -> float:
        """max |out - Y| / max |Y|."""
        return float((out - self.y).abs().max()) / float(self.y.abs().max())

    def module_error(self, params: Params) -> float:
        """``error`` of the module itself with attnid's ``params`` mapped back to its weights."""
        return self.error(self.layer.output(self.layer.from_attnid(params), self.x))
