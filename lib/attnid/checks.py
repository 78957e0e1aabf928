"""The numeric checks every theory chapter runs, in one place.

* ``verify_grid``: exact count next to numeric nullity for a list of layouts, as rows.
* ``invariance_error``: how much random group elements (and, where they are symmetries,
  the bias moves and a head permutation) change the layer's output, relative to its size.
* ``off_orbit_change``: how much a small step orthogonal to the orbit changes the output.
* ``weak_spectrum``: where a QK-norm's weakly identified directions sit in the Jacobian's spectrum.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from attnid import symmetry as sym
from attnid.jacobian import flatten, unflatten
from attnid.layer import forward, init_params
from attnid.runtime import generator
from attnid.spec import AttentionSpec
from attnid.verification import numeric_rank, verify


@dataclass(frozen=True)
class GridRow:
    """One layout's exact and numeric counts."""

    spec: AttentionSpec
    total: int
    exact: int | None
    numeric: int
    matches: bool | None
    method: str
    smallest_kept: float

    @property
    def ratio(self) -> float | None:
        return None if self.exact is None else self.exact / self.total

    @property
    def numeric_ratio(self) -> float:
        return self.numeric / self.total


def verify_grid(specs: Sequence[AttentionSpec], *, seed: int = 0, seq_len: int | None = None,
                device: torch.device | str = "cpu", method: str = "dense") -> list[GridRow]:
    """``attnid.verify`` over every layout, as rows.

    ``method`` defaults to 'dense', the route with verified rounding bounds, which the book's
    chapters report; 'auto' (structured first) is faster on wide layouts.
    """
    rows = []
    for spec in specs:
        v = verify(spec, seed=seed, seq_len=seq_len, device=device, method=method)
        rows.append(GridRow(spec, v.count.total, v.count.unidentified, v.numeric_unidentified, v.matches,
                            v.decision.method, v.decision.smallest_kept))
    return rows


def _point(spec: AttentionSpec, seed: int, seq_len: int, device: torch.device | str):
    gen = generator(seed)
    params = init_params(spec, gen, device=device)
    x = torch.randn(4, seq_len, spec.d_model, generator=gen, dtype=torch.float64).to(device)
    return gen, params, x


def invariance_error(spec: AttentionSpec, *, seed: int = 0, n_elements: int = 3, seq_len: int = 8,
                     device: torch.device | str = "cpu") -> float:
    """max |Y(moved) - Y| / max |Y| over random group elements, bias moves, QK-norm moves and a head permutation."""
    gen, params, x = _point(spec, seed, seq_len, device)
    y = forward(params, x, spec)
    moved = [sym.apply_group(params, spec, sym.random_group_element(spec, gen, scale=0.5)) for _ in range(n_elements)]
    if spec.has_qk_norm:
        moved += [sym.random_qk_norm_move(params, spec, gen, scale=0.5) for _ in range(n_elements)]
    if spec.shift_invariant and spec.has_bias("k") and spec.rope_dims < spec.head_dim and not spec.has_qk_norm:
        delta = torch.randn(spec.kv_heads, spec.head_dim, generator=gen, dtype=torch.float64)
        delta[:, : spec.rope_dims] = 0.0
        moved.append(sym.shift_key_bias(params, spec, delta))
    if spec.shift_invariant and spec.has_bias("v") and spec.has_bias("o"):
        moved.append(sym.trade_value_bias(params, spec, torch.randn(spec.kv_heads, spec.v_head_dim, generator=gen,
                                                                    dtype=torch.float64)))
    if spec.heads > 1:
        m = spec.group_size
        perm = [(h + m) % spec.heads for h in range(spec.heads)] if spec.kv_heads > 1 else list(range(spec.heads))[::-1]
        moved.append(sym.permute_heads(params, spec, perm))
    scale = float(y.abs().max())
    return max(float((forward(p, x, spec) - y).abs().max()) for p in moved) / scale


def off_orbit_change(spec: AttentionSpec, *, seed: int = 0, step: float = 1e-4, seq_len: int = 8,
                     device: torch.device | str = "cpu") -> float:
    """max |Y(theta + step u) - Y| / max |Y| for a random unit u orthogonal to the orbit tangent."""
    gen, params, x = _point(spec, seed, seq_len, device)
    basis = sym.orbit_tangent(params, spec)
    _, across = sym.split_direction(torch.randn(basis.shape[0], generator=gen, dtype=torch.float64).to(basis), basis)
    nudged = unflatten(flatten(params) + step * across / across.norm(), params)
    y = forward(params, x, spec)
    return float((forward(nudged, x, spec) - y).abs().max()) / float(y.abs().max())


def key_bias_gradient_ratio(spec: AttentionSpec, *, seed: int = 0, seq_len: int = 8,
                            device: torch.device | str = "cpu") -> float:
    """max |dL/db_K| / max |dL/db_Q| for L = sum(Y^2) at a random point: round-off where b_K is dead."""
    if not (spec.has_bias("k") and spec.has_bias("q")):
        raise ValueError("the comparison needs both a query and a key bias (bias flag with 'q' and 'k')")
    _, params, x = _point(spec, seed, seq_len, device)
    params = {name: p.clone().requires_grad_() for name, p in params.items()}
    forward(params, x, spec).pow(2).sum().backward()
    return float(params["b_K"].grad.abs().max()) / float(params["b_Q"].grad.abs().max())


@dataclass(frozen=True)
class WeakSpectrum:
    """The relative singular values around a QK-norm's weakly identified directions (full SVD of the Jacobian).

    With P parameters, u unidentified (exact count) and k weakly identified, the Jacobian should have
    rank r = P - u: ``weak`` are t_{r-k+1} .. t_r (the k directions eps makes visible), ``strong`` is
    t_{r-k} (the smallest of the rest) and ``dropped`` t_{r+1} (round-off), all relative to t_1.
    ``nullity`` is the rank rule's decision, which equals u only while ``weak`` clears its zero tolerance.
    """

    spec: AttentionSpec
    weak: tuple[float, ...]
    strong: float
    dropped: float
    nullity: int
    clear: bool


def weak_spectrum(spec: AttentionSpec, *, seed: int = 0, seq_len: int | None = None,
                  device: torch.device | str = "cpu") -> WeakSpectrum:
    """The spectrum around the weakly identified directions at ``verify``'s point and inputs (SVD route)."""
    from attnid.counts import count

    c = count(spec)
    if c.unidentified is None or not c.weakly_identified:
        raise ValueError("weak_spectrum needs a covered layout with weakly identified directions (a QK-norm, eps > 0)")
    decision = numeric_rank(spec, seed=seed, seq_len=seq_len, method="svd", device=device).decision
    rel = decision.relative.tolist()
    r, k = c.total - c.unidentified, c.weakly_identified
    return WeakSpectrum(spec, tuple(rel[r - k:r]), rel[r - k - 1], rel[r] if r < len(rel) else 0.0, decision.nullity,
                        decision.clear)
