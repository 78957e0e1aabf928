"""The count at a given point (a trained checkpoint's weights), not at a generic one.

``unidentified_at_point`` is the nullity, at the given weights, of the layer's Jacobian over generic inputs
(the book's definition, chapter 1). Two routes compute it:

- ``dense``: the float64 Jacobian on seeded Gaussian inputs and the book's rank rule (``attnid.nullity``),
  for layers of at most ``DENSE_LIMIT`` parameters;
- ``structured``: the theorem of the trained-models chapter (``thm-at-point``). Per head the function sees
  A_h(D) = [W_Q^h; b_Q^h] R_D W_K^gT for the offsets D of one moving token, C_h = W_V^g W_O^h, and the output
  constant c = b_O + sum_h b_V^g W_O^h. When every A_h(D) is non-zero and no two are proportional, the
  Jacobian's kernel is exactly the kernel of these products' Jacobian, whose dimension is read off ranks of
  small factor matrices (``product_kernel``). Without RoPE this holds at any factor ranks, heads that write
  nothing (C_h = 0) included (a value bias without an output bias needs full-rank value and output factors);
  with RoPE the stacked query factor and W_K of each group need full column rank and every C_h must be
  non-zero, and a key bias is not covered. Sliding windows, chunks, sinks and QK-norms are not covered. The
  inputs are of any fixed length n >= 3 (the moving token's rows and keys must exist). Key/value groups whose
  heads fail a condition are counted together by the dense Jacobian of the sub-layer they form, when it has
  at most ``DENSE_LIMIT`` parameters (``thm-at-point-block``: the other groups still follow the formula).

Every condition is a number with a decision (``Condition``): it holds, it fails, or it lies between the
zero tolerance and the clear margin, and then the route does not decide (``None``, with the reason).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from attnid import families
from attnid.budget import default_seq_len
from attnid.counts import key_bias_unidentified, value_bias_unidentified
from attnid.layer import forward
from attnid.nullity import measure
from attnid.rank import DEFAULT_MIN_GAP, DEFAULT_ZERO_TOL, FLOAT64_UNIT_ROUNDOFF, decide_rank
from attnid.rope import rope_tables
from attnid.spec import AttentionSpec, Params

DENSE_LIMIT = 4096  # parameters: the dense Jacobian takes seconds up to here, the structured route beyond
CLEAR = DEFAULT_ZERO_TOL * DEFAULT_MIN_GAP  # 1e-4: a margin above this holds clearly; at or below 1e-10 it is zero
# The round-off bound on a dead parameter's effect: first order in u, a factor 64 for the sums and exponentials
# between the scores and the output (softmax, the mixing, the output projection).
ROUNDOFF_FACTOR = 64


@dataclass(frozen=True)
class Condition:
    """One hypothesis of the at-point theorem at this point: its margin (relative) and the decision."""

    name: str
    margin: float

    @property
    def holds(self) -> bool | None:
        """True above CLEAR, False at or below the zero tolerance, None in between (undecided)."""
        if self.margin > CLEAR:
            return True
        return False if self.margin <= DEFAULT_ZERO_TOL else None


@dataclass(frozen=True)
class Rank:
    """A factor's rank by the book's rule, with its margin (smallest kept relative singular value) and gap.

    ``clear``: the rule's gap decided it and every kept value lies above CLEAR (an exact zero factor is clear).
    """

    rank: int
    margin: float
    gap: float
    full: bool
    clear: bool = True


def factor_rank(mat: torch.Tensor) -> Rank:
    """Column rank of a factor (rows >= 0); an empty or all-zero matrix has rank 0."""
    cols = mat.shape[-1]
    if mat.numel() == 0 or float(mat.abs().max()) == 0.0:
        return Rank(0, 0.0, math.inf, cols == 0)
    s = torch.linalg.svdvals(mat)
    d = decide_rank(s, n_rows=mat.shape[0], n_params=cols)
    margin = d.smallest_kept if d.rank else 0.0
    return Rank(d.rank, margin, d.gap, d.rank == cols, d.clear and margin > CLEAR)


def product_kernel(rank_u: int, rank_v: int, m: int, n: int, r: int) -> int:
    """dim ker of (dU, dV) -> dU V^T + U dV^T for U (m x r) of rank a and V (n x r) of rank b.

    The image is R^m (x) col(V) + col(U) (x) R^n, of dimension m b + a n - a b, so the kernel has
    (m + n) r - (m b + a n - a b) dimensions; r^2 when both have full column rank (the GL(r) orbit).
    """
    return (m + n) * r - (m * rank_v + rank_u * n - rank_u * rank_v)


def offset_matrix(spec: AttentionSpec, p: int, m: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The d_k x d_k matrix P with score(query at p, key at m) = q P k^T: rotations of positions p and m combined."""
    dk, r = spec.head_dim, spec.rope_dims
    eye = torch.eye(dk, dtype=dtype)
    if not r:
        return eye
    cos, sin = rope_tables(max(p, m) + 1, r, spec.rope_base, dtype, "cpu")

    def rotation(pos: int) -> torch.Tensor:  # rows: the rotated unit vectors (row vector convention)
        rot, rest = eye[:, :r], eye[:, r:]
        x1, x2 = rot[:, : r // 2], rot[:, r // 2:]
        return torch.cat([rot * cos[pos] + torch.cat([-x2, x1], dim=-1) * sin[pos], rest], dim=-1)

    return rotation(p) @ rotation(m).T


def moving_token_positions(spec: AttentionSpec) -> list[tuple[int, int]]:
    """(row, moving key) pairs of the proof: row 2 sees keys 1 and 0 under a causal mask, row 0 sees 1 and 2 without."""
    if not spec.rope_dims:
        return [(1, 0)] if spec.causal else [(0, 1)]
    return [(2, 1), (2, 0)] if spec.causal else [(0, 1), (0, 2)]


def query_factor(params: Params, h: int) -> torch.Tensor:
    """[W_Q^h; b_Q^h] ((d + 1) x d_k with a query bias, d x d_k without)."""
    if "b_Q" in params:
        return torch.cat([params["W_Q"][h], params["b_Q"][h][None]], dim=0)
    return params["W_Q"][h]


def _relative(x: torch.Tensor, scale: float) -> float:
    return float(x.norm()) / scale if scale > 0 else 0.0


def _sine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Sine of the angle between two non-zero vectors, computed from the residual (accurate near 0)."""
    a, b = a / a.norm(), b / b.norm()
    return float((a - (a @ b) * b).norm())


class _Patterns:
    """The score matrices A_h = Q_h P W_K^gT of one offset, compared through d_k x d_k Grams.

    <A_h, A_k>_F = tr(P^T (Q_h^T Q_k) P (W_K^kT W_K^h)), so norms and angles need no (d + 1) x d matrix; a
    pair whose sine comes out below ``EXACT_BELOW`` (where 1 - cos^2 loses digits) is formed and compared
    directly, so that an exactly proportional pair reads as zero.
    """

    EXACT_BELOW = 1e-3

    def __init__(self, params: Params, spec: AttentionSpec, mat: torch.Tensor) -> None:
        self.params, self.spec, self.mat = params, spec, mat
        self.q = [query_factor(params, h) for h in range(spec.heads)]
        self.k = [params["W_K"][spec.group_of_head(h)] for h in range(spec.heads)]
        self._norms = [math.sqrt(max(self.inner(h, h), 0.0)) for h in range(spec.heads)]

    def inner(self, h: int, k: int) -> float:
        return float(torch.trace(self.mat.T @ (self.q[h].T @ self.q[k]) @ self.mat @ (self.k[k].T @ self.k[h])))

    def norm(self, h: int) -> float:
        return self._norms[h]

    def relative_norm(self, h: int) -> float:
        """||A_h||_F / (||Q_h||_F ||W_K||_F), formed exactly when the Gram gives a small value."""
        scale = float(self.q[h].norm() * self.k[h].norm())
        value = self._norms[h] / scale if scale > 0 else 0.0
        if value < self.EXACT_BELOW:
            value = _relative(self.q[h] @ self.mat @ self.k[h].T, scale)
        return value

    def sine(self, h: int, k: int) -> float:
        cosine = self.inner(h, k) / (self._norms[h] * self._norms[k])
        value = math.sqrt(max(1.0 - cosine * cosine, 0.0))
        if value < self.EXACT_BELOW:
            value = _sine((self.q[h] @ self.mat @ self.k[h].T).reshape(-1), (self.q[k] @ self.mat @ self.k[k].T).reshape(-1))
        return value


@dataclass
class Structured:
    """The structured route's result: the count (None when undecided), why, and every condition checked.

    ``block_groups``: the key/value groups whose heads fail a condition and were counted by a dense Jacobian
    of the sub-layer they form (``thm-at-point-block``); ``block_parameters`` is its size.
    """

    unidentified: int | None
    reason: str
    conditions: list[Condition] = field(default_factory=list)
    ranks: dict[str, Rank] = field(default_factory=dict)
    head_pattern_margin: list[float] = field(default_factory=list)
    head_value_margin: list[float] = field(default_factory=list)
    block_groups: list[int] = field(default_factory=list)
    block_parameters: int = 0


HEAD_KEYS, GROUP_KEYS = ("W_Q", "b_Q", "W_O"), ("W_K", "b_K", "W_V", "b_V")


def sub_layer(params: Params, spec: AttentionSpec, groups: list[int]) -> tuple[Params, AttentionSpec]:
    """The layer made of the given key/value groups and all their query heads, with the output bias kept."""
    heads = [h for h in range(spec.heads) if spec.group_of_head(h) in groups]
    sub = {k: v[heads] if k in HEAD_KEYS else v[groups] if k in GROUP_KEYS else v for k, v in params.items()}
    return sub, replace(spec, heads=len(heads), kv_heads=len(groups))


def _pattern_conditions(params: Params, spec: AttentionSpec, out: Structured) -> set[int]:
    """Check every A_h(t) non-zero and every pair not proportional; return the groups of heads that fail."""
    affected: set[int] = set()
    sines = [[math.inf] * spec.heads for _ in range(spec.heads)]
    for p, m in moving_token_positions(spec):
        pattern = _Patterns(params, spec, offset_matrix(spec, p, m))
        for h in range(spec.heads):
            c = Condition(f"head {h}: A_h({p - m}) non-zero", pattern.relative_norm(h))
            out.conditions.append(c)
            if c.holds is not True:
                affected.add(spec.group_of_head(h))
        for h in range(spec.heads):
            for k in range(h + 1, spec.heads):
                if pattern.norm(h) > 0 and pattern.norm(k) > 0:
                    s = pattern.sine(h, k)
                    sines[h][k] = sines[k][h] = min(sines[h][k], s)
                    c = Condition(f"heads {h}, {k}: A_h, A_k not proportional", s)
                    out.conditions.append(c)
                    if c.holds is not True:
                        affected |= {spec.group_of_head(h), spec.group_of_head(k)}
    out.head_pattern_margin = [min(row) for row in sines]  # inf: a head with no other head to compare
    return affected


def _group_ranks(params: Params, spec: AttentionSpec, g: int, live: list[bool]) -> dict[str, Rank]:
    heads = [h for h in range(spec.heads) if spec.group_of_head(h) == g]
    q_live = [query_factor(params, h) for h in heads if live[h]]
    q_stack = torch.cat(q_live) if q_live else torch.zeros(0, spec.head_dim, dtype=torch.float64)
    return {"query": factor_rank(q_stack), "key": factor_rank(params["W_K"][g]),
            "value": factor_rank(params["W_V"][g]),
            "output": factor_rank(torch.cat([params["W_O"][h] for h in heads], dim=1).T)}


def _group_count(params: Params, spec: AttentionSpec, g: int, live: list[bool], ranks: dict[str, Rank]) -> int | str:
    """Group g's invisible directions by the theorem (its key bias and, with an output bias, its value bias
    included), or why the theorem does not decide it."""
    unclear = [k for k, v in ranks.items() if not v.clear]
    if unclear:
        return (f"the rank of its {unclear[0]} factor is too close to call (smallest kept relative singular value "
                f"{ranks[unclear[0]].margin:.2e}, gap {ranks[unclear[0]].gap:.2e})")
    heads = [h for h in range(spec.heads) if spec.group_of_head(h) == g]
    d, dk, dv, r = spec.d_model, spec.head_dim, spec.v_head_dim, spec.rope_dims
    if r:
        if not (ranks["query"].full and ranks["key"].full and all(live[h] for h in heads)):
            return "under RoPE the theorem needs full-rank query and key factors and no head with C_h = 0"
        total = r + (dk - r) ** 2
    else:
        rows = query_factor(params, heads[0]).shape[0]
        n_live = sum(live[h] for h in heads)
        total = product_kernel(ranks["query"].rank, ranks["key"].rank, n_live * rows, d, dk) \
            + (len(heads) - n_live) * rows * dk
    total += product_kernel(ranks["value"].rank, ranks["output"].rank, d, len(heads) * d, dv)
    total += key_bias_unidentified(spec) // spec.kv_heads
    return total + (dv if spec.has_bias("v") and spec.has_bias("o") else 0)


def _value_bias_without_output_bias(params: Params, spec: AttentionSpec, out: Structured) -> int | str:
    """beta = G d_v - rank [S_1; ...; S_G] (every factor full rank), or why not."""
    if not all(v.full for k, v in out.ranks.items() if k.endswith(("value", "output"))):
        return "a value bias without an output bias needs full-rank value and output factors"
    sums = factor_rank(torch.cat([sum(params["W_O"][h] for h in range(spec.heads) if spec.group_of_head(h) == g)
                                  for g in range(spec.kv_heads)]).T)
    if not sums.clear:
        return f"the rank of the summed output blocks is too close to call (margin {sums.margin:.2e})"
    return spec.kv_heads * spec.v_head_dim - sums.rank


def _block_count(params: Params, spec: AttentionSpec, out: Structured, block_limit: int, seed: int) -> int | str:
    """The affected groups' sub-layer, counted by the dense float64 Jacobian (``thm-at-point-block``)."""
    if spec.has_bias("v") and not spec.has_bias("o"):
        return "a value bias without an output bias ties the groups together through the output constant"
    sub, sub_spec = sub_layer(params, spec, out.block_groups)
    out.block_parameters = sum(t.numel() for t in sub.values())
    if out.block_parameters > block_limit:
        return (f"the groups failing a condition form a block of {out.block_parameters} parameters, above the "
                f"dense limit {block_limit}")
    nullity, gap, clear = dense(sub, sub_spec, seed)
    return nullity if clear else f"the block's dense rank decision is not clear (gap {gap:.2e})"


def structured(params: Params, spec: AttentionSpec, *, block_limit: int = DENSE_LIMIT, seed: int = 0) -> Structured:
    """The nullity at ``params`` from the at-point theorem, or None with the reason it does not decide.

    Groups whose heads fail a condition are counted together by a dense Jacobian of their sub-layer when it has
    at most ``block_limit`` parameters (``thm-at-point-block``); every other group by the theorem's formula.
    """
    values = []  # C_h = W_V W_O of every head: a head with C_h = 0 writes nothing, in every layout
    for h in range(spec.heads):
        g = spec.group_of_head(h)
        scale = float(params["W_V"][g].norm() * params["W_O"][h].norm())
        values.append(Condition(f"head {h}: C_h = W_V W_O non-zero", _relative(params["W_V"][g] @ params["W_O"][h], scale)))
    out = Structured(None, "", conditions=list(values), head_value_margin=[c.margin for c in values])
    covered = spec.norm == "softmax" and not spec.has_qk_norm and spec.head_dim <= spec.d_model \
        and spec.v_head_dim <= spec.d_model and spec.window is None and spec.chunk is None
    if not covered:
        out.reason = ("the at-point theorem covers plain softmax without a QK-norm, a window or chunks, "
                      "with d_k, d_v <= d")
        return out
    if spec.rope_dims and spec.has_bias("k"):
        out.reason = "RoPE with a key bias is not covered by the at-point theorem"
        return out
    affected = _pattern_conditions(params, spec, out)
    affected |= {spec.group_of_head(h) for h, c in enumerate(values) if c.holds is None}
    live = [c.holds is True for c in values]
    total, why = 0, {}
    for g in range(spec.kv_heads):
        ranks = _group_ranks(params, spec, g, live)
        out.ranks.update({f"group {g} {k}": v for k, v in ranks.items()})
        counted = _group_count(params, spec, g, live, ranks)
        if isinstance(counted, str) or g in affected:
            affected.add(g)
            why[g] = counted if isinstance(counted, str) else "a head fails the pattern or value condition"
        else:
            total += counted
    out.block_groups = sorted(affected)
    if affected:
        counted = _block_count(params, spec, out, block_limit, seed)
    elif spec.has_bias("v") and not spec.has_bias("o"):
        counted = _value_bias_without_output_bias(params, spec, out)
    else:
        counted = 0
    failing = "; ".join(f"group {g}: {w}" for g, w in sorted(why.items()))
    if isinstance(counted, str):
        out.reason = f"{failing}; {counted}" if failing else counted
        return out
    out.unidentified = total + counted
    out.reason = ("at-point theorem: every condition holds with a clear margin" if not affected else
                  f"at-point theorem on {spec.kv_heads - len(affected)} groups; the dense Jacobian on groups "
                  f"{out.block_groups} ({out.block_parameters} parameters): {failing}")
    return out


def dense(params: Params, spec: AttentionSpec, seed: int = 0) -> tuple[int, float, bool]:
    """(nullity, rank gap, clear) of the float64 Jacobian at ``params`` on seeded Gaussian inputs."""
    gen = torch.Generator().manual_seed(seed)
    m = measure(lambda p, x: forward(p, x, spec), params, spec.d_model, gen, seq_len=default_seq_len(spec))
    return m.decision.nullity, m.decision.gap, m.decision.clear


@dataclass(frozen=True)
class DeadEffect:
    """Parameters the function cannot see at all, and what removing them changes (float64, generic inputs)."""

    count: int
    change: float
    bound: float


def _inputs(spec: AttentionSpec, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(4, default_seq_len(spec), spec.d_model, generator=gen, dtype=torch.float64)


def without_dead(params: Params, spec: AttentionSpec) -> dict[str, torch.Tensor]:
    """The same function with the dead parameters at their representative: b_K zero on its unrotated
    coordinates (plain softmax), b_V folded into b_O (plain softmax with an output bias)."""
    out = dict(params)
    if key_bias_unidentified(spec):
        bk = params["b_K"].clone()
        bk[:, spec.rope_dims:] = 0
        out["b_K"] = bk
    if spec.has_bias("v") and spec.has_bias("o") and spec.shift_invariant:
        groups = [spec.group_of_head(h) for h in range(spec.heads)]
        out["b_O"] = params["b_O"] + sum(params["b_V"][g] @ params["W_O"][h] for h, g in enumerate(groups))
        out["b_V"] = torch.zeros_like(params["b_V"])
    return out


def dead_effects(params: Params, spec: AttentionSpec, seed: int = 0) -> dict[str, DeadEffect]:
    """{'key_bias': ..., 'value_bias': ...}: each dead set moved to its representative alone, and the change."""
    x = _inputs(spec, seed)
    y = forward(params, x, spec)
    q = torch.einsum("bnd,hdk->bhnk", x, params["W_Q"])
    scores = float(q.abs().max()) * float(params["W_K"].abs().sum(dim=1).max()) / math.sqrt(spec.head_dim) + 1.0
    bound = ROUNDOFF_FACTOR * FLOAT64_UNIT_ROUNDOFF * (spec.d_model + x.shape[-2]) * scores * (1 + float(y.abs().max()))
    effects = {}
    moved = without_dead(params, spec)
    for name, keys, count in (("key_bias", ("b_K",), key_bias_unidentified(spec)),
                              ("value_bias", ("b_V", "b_O"), value_bias_unidentified(spec) if spec.has_bias("o") else 0)):
        if count:
            one = {**params, **{k: moved[k] for k in keys}}
            effects[name] = DeadEffect(count, float((forward(one, x, spec) - y).abs().max()), bound)
    return effects


def generic_count(spec: AttentionSpec) -> int | None:
    """The layout's count at a generic point (the book's theorems, ``attnid.count``)."""
    return families.count(spec).unidentified


def balance_figures(params: Params, spec: AttentionSpec) -> dict[str, list[float]]:
    """Per group: ||[W_Q; b_Q] stacked||_F / ||[W_K; b_K]||_F and ||[W_V; b_V]||_F / ||W_O stacked||_F (1 when balanced)."""
    qk, vo = [], []
    for g in range(spec.kv_heads):
        heads = [h for h in range(spec.heads) if spec.group_of_head(h) == g]
        q = torch.cat([query_factor(params, h) for h in heads])
        k = params["W_K"][g] if "b_K" not in params else torch.cat([params["W_K"][g], params["b_K"][g][None]])
        v = params["W_V"][g] if "b_V" not in params else torch.cat([params["W_V"][g], params["b_V"][g][None]])
        o = torch.cat([params["W_O"][h] for h in heads], dim=1)
        qk.append(float(q.norm() / k.norm()) if k.norm() > 0 else math.inf)
        vo.append(float(v.norm() / o.norm()) if o.norm() > 0 else math.inf)
    return {"query_key_norm_ratio": qk, "value_output_norm_ratio": vo}


def analyse(params: Params, spec: AttentionSpec, *, seed: int = 0, dense_limit: int = DENSE_LIMIT) -> dict[str, Any]:
    """One layer at a point: generic count, count at the point (route, reason), dead parameters, margins, balance."""
    total = sum(t.numel() for t in params.values())
    generic = generic_count(spec)
    s = structured(params, spec, block_limit=dense_limit, seed=seed)
    record: dict[str, Any] = {"parameters": total, "unidentified_generic": generic}
    if total <= dense_limit:
        nullity, gap, clear = dense(params, spec, seed)
        record.update(unidentified_at_point=nullity if clear else None, route="dense",
                      rank_gap=gap if math.isfinite(gap) else None,
                      reason="float64 Jacobian on Gaussian inputs" + ("" if clear else ": the rank decision is not clear"),
                      structured_at_point=s.unidentified)
    else:
        record.update(unidentified_at_point=s.unidentified, route="structured", rank_gap=None, reason=s.reason)
    record["jacobian_block"] = {"groups": s.block_groups, "parameters": s.block_parameters} if s.block_groups else None
    effects = dead_effects(params, spec, seed)
    record["dead_parameters"] = {k: e.count for k, e in effects.items()}
    record["dead_effect"] = {k: {"change": e.change, "bound": e.bound} for k, e in effects.items()}
    record["conditions_failing"] = [c.name for c in s.conditions if c.holds is not True]
    record["factor_ranks"] = {k: {"rank": v.rank, "full": v.full, "margin": v.margin} for k, v in s.ranks.items()}
    record["heads"] = [_head(h, spec, s, record) for h in range(spec.heads)]
    record.update(balance_figures(params, spec))
    return record


def _head(h: int, spec: AttentionSpec, s: Structured, layer: dict[str, Any]) -> dict[str, Any]:
    g = spec.group_of_head(h)
    value = s.head_value_margin[h] if s.head_value_margin else None
    pattern = s.head_pattern_margin[h] if s.head_pattern_margin else None
    pattern = pattern if pattern is None or math.isfinite(pattern) else None
    factors = [v.margin for k, v in s.ranks.items() if k.startswith(f"group {g} ")]
    margin = min([m for m in (value, pattern, *factors) if m is not None], default=None)
    if value is not None and value <= DEFAULT_ZERO_TOL:
        verdict, why = "degenerate", "W_V W_O = 0: the head writes nothing, so its query and key weights are invisible"
    elif pattern is not None and pattern <= CLEAR:
        verdict, why = "degenerate", "its attention pattern is (nearly) proportional to another head's"
    elif factors and not all(v.full for k, v in s.ranks.items() if k.startswith(f"group {g} ")):
        verdict, why = "degenerate", "a factor of its key/value group has lost rank"
    elif margin is not None and margin > CLEAR:
        verdict, why = "generic", f"every condition of the at-point theorem holds; smallest margin {margin:.3g}"
    else:
        verdict, why = "undecided", layer["reason"]
    return {"head": h, "group": g, "verdict": verdict, "reason": why, "margin": margin,
            "value_output_margin": value, "pattern_margin": pattern}
