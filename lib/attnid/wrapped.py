"""Layouts that add one feature to a multi-head layout (an output gate, ALiBi): the fields they pass through.

``OnMultiHead`` gives a layout class with a ``base: AttentionSpec`` field the width, head count and
mask of the ``Layout`` protocol from its base; the family module adds its own fields and ``describe``.
"""

from __future__ import annotations

from .spec import AttentionSpec


class OnMultiHead:
    """Mixin for a frozen dataclass with a ``base: AttentionSpec`` field."""

    base: AttentionSpec

    def _check_base(self) -> None:
        if not isinstance(self.base, AttentionSpec):
            raise TypeError(f"base must be an AttentionSpec, got {type(self.base).__name__}")

    @property
    def d_model(self) -> int:
        return self.base.d_model

    @property
    def heads(self) -> int:
        return self.base.heads

    @property
    def causal(self) -> bool:
        return self.base.causal
