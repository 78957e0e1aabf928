"""What every attention family offers: the ``Layout`` protocol, the ``Family`` record and the one ``Count``.

A *layout* fixes an attention layer's shape but not its weights (``AttentionSpec`` for multi-head,
grouped and multi-query attention with their variants; ``mla.MLASpec`` for latent attention). Its
fields are validated by ``attnid.fields``; it describes itself (``describe``, ``label``,
``to_dict``) and carries its model width, head count and mask, which is all a consumer reads
from it directly.

Everything else a consumer needs is the *family*'s: parameter shapes, random points, the
reference forward, the exact count, the orbit's tangent directions with the theorems that
prove the count, the numeric check and the reader of a Hugging Face ``config.json``. A family
module builds one ``Family`` record of these functions and ``attnid.families`` lists the records,
so ``verify``, ``census``, ``hfconfig``, the CLI and ``variants`` dispatch on the layout's type and
a new family is one module plus one line there. (The behaviour sits in a record rather than in
methods of the layout class so that a layout module never imports the modules that count it:
``counts`` and ``verify`` import ``spec``, not the other way round.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

Params = Mapping[str, torch.Tensor]  # a point in parameter space: named tensors (the layer's W_Q, W_K, ..., or any model's)


@runtime_checkable
class Layout(Protocol):
    """A validated attention layout of some family (``AttentionSpec``, ``mla.MLASpec``)."""

    @property
    def d_model(self) -> int: ...

    @property
    def heads(self) -> int: ...

    @property
    def causal(self) -> bool: ...

    def describe(self) -> str:
        """One line naming every field."""
        ...

    def label(self) -> str:
        """A short label for tables and legends."""
        ...

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (for JSON)."""
        ...


@runtime_checkable
class VerificationResult(Protocol):
    """What ``attnid.verify`` returns for a layout of any family: the exact count next to the numeric one.

    ``attnid.verification.Verification`` (multi-head, with certificates) and ``attnid.nullity.FamilyCheck``
    (every other family) both follow it; the CLI and the chapters read only these names.
    """

    @property
    def spec(self) -> Any: ...

    @property
    def total(self) -> int:
        """The layout's parameter count P."""
        ...

    @property
    def exact(self) -> int | None:
        """The exact count of unidentified parameters (None: no theorem covers the layout)."""
        ...

    @property
    def decision(self) -> Any:
        """The ``attnid.rank.RankDecision`` on the stacked Jacobian."""
        ...

    @property
    def numeric_unidentified(self) -> int: ...

    @property
    def matches(self) -> bool | None:
        """Clear decision equal to the exact count (None: nothing to compare)."""
        ...

    @property
    def n_inputs(self) -> int: ...

    @property
    def seq_len(self) -> int: ...


class ComparesNullity:
    """``numeric_unidentified`` and ``matches`` of a ``VerificationResult``, from its ``exact`` and ``decision``.

    The one rule by which a numeric check confirms an exact count: the decision is clear, the rank had
    stopped rising (``stable``; a class whose rank may still have been rising overrides it), and the
    nullity equals the count.
    """

    exact: int | None
    decision: Any

    @property
    def stable(self) -> bool:
        """Whether the rank had stopped rising when the inputs ran out (True unless the route says otherwise)."""
        return True

    @property
    def numeric_unidentified(self) -> int:
        """The numeric nullity of the stacked Jacobian."""
        return self.decision.nullity

    @property
    def matches(self) -> bool | None:
        """True/False when an exact count covers the layout, None when there is nothing to compare."""
        if self.exact is None:
            return None
        return self.decision.clear and self.stable and self.exact == self.decision.nullity


@dataclass(frozen=True)
class Count:
    """Exact parameter count of a layout of any family. ``unidentified`` is None when no theorem covers it."""

    spec: Layout
    total: int
    unidentified: int | None
    breakdown: dict[str, int] = field(default_factory=dict)
    note: str = ""
    weakly_identified: int = 0
    """Directions identified only through a norm's eps > 0 (a QK-norm's query/key scales, MLA's latent scales)."""

    @property
    def covered(self) -> bool:
        """Whether the exact count is proved for this layout."""
        return self.unidentified is not None

    @property
    def ratio(self) -> float | None:
        """unidentified / total."""
        return None if self.unidentified is None else self.unidentified / self.total


@dataclass(frozen=True)
class Family:
    """One attention family's behaviour, as functions of its layout type ``layout``.

    ``proofs`` names the book's statements (chapter labels) that prove ``count`` and that the
    tangent directions leave the function unchanged. ``verify(layout, *, seed, seq_len, n_inputs,
    method, progress, max_bytes)`` returns a ``VerificationResult``; ``estimate`` (same arguments
    but the seed) its peak memory before anything is allocated, ``default_seq_len`` its input length;
    ``tangent_basis`` a (P, k) matrix whose columns span the orbit's tangent space at a point;
    ``from_hf_config`` the layout and the config keys it did not read, each with the reason (None:
    the family reads configs another way, as the multi-head family does through ``hfconfig``).
    """

    name: str
    layout: type
    proofs: tuple[str, ...]
    parameter_shapes: Callable[[Any], dict[str, tuple[int, ...]]]
    init_params: Callable[..., dict[str, torch.Tensor]]
    forward: Callable[[Params, torch.Tensor, Any], torch.Tensor]
    count: Callable[[Any], Count]
    tangent_basis: Callable[[Params, Any], torch.Tensor]
    verify: Callable[..., Any]
    example: Callable[[], Any]
    """A small layout of the family, quick to verify (tests, documentation)."""
    estimate: Callable[..., Any]
    default_seq_len: Callable[[Any], int]
    """A small layout of the family, quick to verify (tests, documentation)."""
    from_hf_config: Callable[[Mapping[str, Any]], tuple[Any, dict[str, str]]] | None = None
