"""Learned relative position bias (T5, mT5, UMT5): one learned entry per head and distance bucket added to the scores.

Head h adds ``table[h, b(j - i)]`` to the score of query i and key j, where ``b`` is T5's bucket
map of the signed distance j - i: the first half of a side's buckets are exact distances, the
rest grow logarithmically up to ``max_distance``, past which every distance shares the last
bucket. Without a causal mask (T5's encoder) each sign has half of the buckets; with one (the
decoder) only the keys behind the query count and all buckets serve them. ``bucket_table``
computes the map as T5's code does (in float32, which decides the bucket of the few distances on a
boundary), so the buckets a length reaches are the ones the model uses.

T5 does not divide the scores by sqrt(d_k); a constant factor is absorbed into W_Q and changes no
count, so the forward here keeps the scaling of ``attnid.layer``.

What the table does to the count (chapter 7b, theorem on relative position bias): the layer
without it keeps its count, and the table adds, per head, one unidentified direction (the same
constant on every bucket, a shift of every row's scores) plus one for every bucket no pair of
positions of an input of the given length reaches. ``seq_len`` is that length (None: long enough
that every bucket the map can give is reached). In T5 one table serves every layer of a stack
and belongs to its first layer; UMT5 gives each layer its own. ``attnid.families`` lists the
family.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch

from attnid import counts, layer, symmetry
from attnid.layout import Count, Params
from attnid.normalise import causal_mask, chunk_mask, window_mask
from attnid.budget import Estimate
from attnid.nullity import FamilyCheck, check_layout, checked_estimate
from attnid.spec import AttentionSpec
from attnid.budget import default_seq_len
from attnid.families.wrapped import OnMultiHead, offset_forward

TABLE = "rel_bias"  # the parameter: (H, buckets)
T5_BUCKETS, T5_MAX_DISTANCE = 32, 128  # T5Config's defaults
MAX_BUCKETS = 2**16  # no published model has more than a few hundred; the bucket map is built per length


@dataclass(frozen=True)
class RelativeBiasSpec(OnMultiHead):
    """A multi-head layout ``base`` (no RoPE, no QK-norm, plain softmax or not) with a learned bucketed position bias.

    The buckets are bidirectional exactly when the layout has no causal mask (T5's convention).
    """

    base: AttentionSpec
    buckets: int = T5_BUCKETS
    max_distance: int = T5_MAX_DISTANCE
    seq_len: int | None = None

    def __post_init__(self) -> None:
        self._check_position_base("a relative position bias")
        for name, value, low in (("buckets", self.buckets, 2), ("max_distance", self.max_distance, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_BUCKETS:
                raise ValueError(f"relative position bias: {name} must be an integer from {low} to {MAX_BUCKETS}, "
                                 f"got {value!r}")
        if self.bidirectional and self.buckets < 4:
            raise ValueError(f"relative position bias without a causal mask needs at least 4 buckets (two per "
                             f"direction), got {self.buckets}")
        if self.max_distance <= self.exact_buckets:
            raise ValueError(f"relative position bias: max_distance ({self.max_distance}) must exceed the "
                             f"{self.exact_buckets} exact buckets (half of each direction's buckets)")
        if self.seq_len is not None and (isinstance(self.seq_len, bool) or not isinstance(self.seq_len, int)
                                         or not 1 <= self.seq_len <= 16 * MAX_BUCKETS):
            raise ValueError(f"relative position bias: seq_len must be an integer from 1 to {16 * MAX_BUCKETS} or "
                             f"None, got {self.seq_len!r}")

    @property
    def bidirectional(self) -> bool:
        return not self.base.causal

    @property
    def side_buckets(self) -> int:
        """Buckets per direction: half of them without a causal mask (odd counts leave the last one unused)."""
        return self.buckets // 2 if self.bidirectional else self.buckets

    @property
    def exact_buckets(self) -> int:
        """The buckets that hold one distance each (0, 1, ..., exact - 1) in each direction."""
        return self.side_buckets // 2

    def describe(self) -> str:
        length = "long" if self.seq_len is None else str(self.seq_len)
        return (f"{self.base.describe()} relative_bias={self.buckets}x{self.max_distance} "
                f"{'bidirectional' if self.bidirectional else 'causal'} seq_len={length}")

    def label(self) -> str:
        return f"{self.base.label()} rel-bias {self.buckets}"

    def to_dict(self) -> dict[str, Any]:
        return {**self.base.to_dict(), "relative_bias": {"buckets": self.buckets, "max_distance": self.max_distance,
                                                         "seq_len": self.seq_len}}


def bucket_of(relative: torch.Tensor, spec: RelativeBiasSpec) -> torch.Tensor:
    """The bucket of each signed distance key - query (an integer tensor), by T5's rule and its float32 arithmetic."""
    side, exact = spec.side_buckets, spec.exact_buckets
    if spec.bidirectional:
        offset, distance = (relative > 0).to(torch.long) * side, relative.abs()
    else:
        offset, distance = torch.zeros_like(relative), (-relative).clamp(min=0)
    logarithmic = torch.log(distance.float() / exact) / math.log(spec.max_distance / exact) * (side - exact)
    far = (exact + logarithmic.to(torch.long)).clamp(max=side - 1)  # distance 0 gives -inf here; not selected below
    return offset + torch.where(distance < exact, distance, far)


def bucket_table(spec: RelativeBiasSpec, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(n, n) long: the bucket of query i and key j, for an input of n tokens."""
    i = torch.arange(n, device=device)
    return bucket_of(i[None, :] - i[:, None], spec)


def _hidden(base: AttentionSpec, n: int) -> torch.Tensor | None:
    """The mask of ``attnid.normalise`` for the layout at length n (True: hidden), None without one."""
    if base.window is not None:
        return window_mask(n, base.window, "cpu")
    if base.chunk is not None:
        return chunk_mask(n, base.chunk, "cpu")
    return causal_mask(n, "cpu") if base.causal else None


def saturation_length(spec: RelativeBiasSpec) -> int:
    """The shortest input length at which every bucket the map gives at any length is reached.

    Past ``max_distance`` every distance falls in a direction's last bucket, so distances up to
    max_distance + 1 give every bucket there is; a window or chunks of w keys show only distances
    below w. Distance t is seen from length t + 1 on, so the answer is one more than the largest
    distance that first reaches some bucket.
    """
    limit = min(x for x in (spec.max_distance + 2, spec.base.window, spec.base.chunk) if x is not None)
    distances = torch.arange(limit)
    first_use: dict[int, int] = {}
    for sign in ((1, -1) if spec.bidirectional else (-1,)):
        for dist, b in zip(distances.tolist(), bucket_of(sign * distances, spec).tolist()):
            first_use.setdefault(b, dist)
    return max(first_use.values()) + 1


def count_length(spec: RelativeBiasSpec) -> int:
    """The input length the count is for: ``seq_len``, or the saturation length."""
    return saturation_length(spec) if spec.seq_len is None else spec.seq_len


def seen_buckets(spec: RelativeBiasSpec, n: int | None = None) -> list[int]:
    """The buckets some pair of positions that sees each other reaches in an input of n tokens (default: the count's)."""
    n = count_length(spec) if n is None else n
    table = bucket_table(spec, n)
    hidden = _hidden(spec.base, n)
    reached = table if hidden is None else table[~hidden]
    return sorted(set(reached.flatten().tolist()))


def count(spec: RelativeBiasSpec) -> Count:
    """The count without the bias plus, per head, one shift and the unseen buckets (plain softmax only)."""
    plain = counts.count(spec.base)
    total = plain.total + spec.heads * spec.buckets
    if spec.base.norm != "softmax":
        return Count(spec, total, None, {}, f"not covered: a relative position bias with {spec.base.norm} attention "
                                            "(the proof needs the shift invariance of plain softmax)")
    if plain.unidentified is None:
        return Count(spec, total, None, {}, plain.note)
    unseen = spec.buckets - len(seen_buckets(spec))
    table = spec.heads * (1 + unseen)
    length = f"length {spec.seq_len}" if spec.seq_len is not None else f"every length from {count_length(spec)} on"
    note = (f"{spec.heads} x (1 shift + {unseen} unseen bucket{'' if unseen == 1 else 's'}) of the table at {length}"
            + (f"; {plain.note}" if plain.note else ""))
    return Count(spec, total, plain.unidentified + table, {**plain.breakdown, "relative_bias": table}, note,
                 plain.weakly_identified)


def parameter_shapes(spec: RelativeBiasSpec) -> dict[str, tuple[int, ...]]:
    """The layer's parameters, then the table (H, buckets)."""
    return {**layer.parameter_shapes(spec.base), TABLE: (spec.heads, spec.buckets)}


def init_params(spec: RelativeBiasSpec, generator: torch.Generator,
                dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
    """The layer's random point, then a Gaussian table (scale 1/2)."""
    params = layer.init_params(spec.base, generator, dtype)
    params[TABLE] = (torch.randn((spec.heads, spec.buckets), generator=generator, dtype=torch.float64) * 0.5).to(dtype)
    return params


def position_bias(params: Params, spec: RelativeBiasSpec, n: int) -> torch.Tensor:
    """(H, n, n): the table's entry of each head for each pair of positions."""
    table = params[TABLE]
    return table[:, bucket_table(spec, n, table.device)]


def forward(params: Params, x: torch.Tensor, spec: RelativeBiasSpec) -> torch.Tensor:
    """The layer of ``attnid.layer`` with the table's entries added to every head's scores, X of shape (..., n, d)."""
    return offset_forward(params, x, spec.base, position_bias(params, spec, x.shape[-2]))


def table_directions(params: Params, spec: RelativeBiasSpec) -> list[dict[str, torch.Tensor]]:
    """Per head: the same shift of every seen bucket, and each unseen bucket alone."""
    table = params[TABLE]
    seen = seen_buckets(spec)
    out = []
    for h in range(spec.heads):
        shift = torch.zeros_like(table)
        shift[h, seen] = 1.0
        out.append({TABLE: shift})
        for b in sorted(set(range(spec.buckets)) - set(seen)):
            alone = torch.zeros_like(table)
            alone[h, b] = 1.0
            out.append({TABLE: alone})
    return out


def tangent_basis(params: Params, spec: RelativeBiasSpec) -> torch.Tensor:
    """(P, k): the orbit tangent of the layer without the table, and the table's own directions."""
    base_params = {k: v for k, v in params.items() if k != TABLE}
    moves = [d for _, d in symmetry.labelled_tangent_directions(base_params, spec.base)]
    moves += table_directions(params, spec)
    padded = [{name: d[name] if name in d else torch.zeros_like(p) for name, p in params.items()} for d in moves]
    return symmetry.orthonormal_span(padded, params)


def check_seq_len(spec: RelativeBiasSpec) -> int:
    """The tokens per input of ``verify``: the layout's own length, else the multi-head default."""
    return spec.seq_len or default_seq_len(spec.base)


def verify(spec: RelativeBiasSpec, *, seed: int = 0, seq_len: int | None = None, n_inputs: int | None = None,
           max_rounds: int = 4, method: str = "auto", progress: bool = False,
           max_bytes: int | None = None) -> FamilyCheck:
    """The count at the check's length next to the float64 Jacobian's nullity at a seeded random point.

    The length is ``seq_len``, else ``check_seq_len`` (the count then follows it: the buckets a
    length reaches decide it).
    """
    n = seq_len or check_seq_len(spec)
    at = replace(spec, seq_len=n)
    c = count(at)
    return check_layout(at, init_params=init_params, forward=forward, tangent_basis=tangent_basis,
                        exact=c.unidentified, total=c.total, seq_len=n, seed=seed, n_inputs=n_inputs,
                        max_rounds=max_rounds, method=method, progress=progress, max_bytes=max_bytes)


def estimate(spec: RelativeBiasSpec, seq_len: int | None = None, n_inputs: int | None = None,
             method: str = "auto") -> Estimate:
    """The peak-memory estimate of ``verify`` with the same arguments (``attnid.nullity.estimate``)."""
    n = seq_len or check_seq_len(spec)
    return checked_estimate(count(replace(spec, seq_len=n)).total, spec.d_model, n, n_inputs, method)


def example() -> RelativeBiasSpec:
    """T5's encoder structure at a small size: two heads, no biases, 8 buckets up to distance 12, 10 tokens."""
    return RelativeBiasSpec(AttentionSpec.create(8, 2, causal=False), buckets=8, max_distance=12, seq_len=10)
