"""Exact counts of unidentified parameters for any attention layout.

Every count reduces to the matrix-product count of chapter 1 (``FactoredCount`` below):
a product (a x k)(k x b) has, at a generic point, P - rho (a + b - rho) unidentified
parameters with rho = min(k, a, b).

Per key/value group g (m = H/G query heads share it), writing d for d_model:

* query/key. The scores of head h are [x_i, 1] [W_Q^h; b_Q^h] [W_K; b_K]^T [x_j, 1]^T.
  Stacking the m query heads' [W_Q^h; b_Q^h] gives one (m (d + bq)) x d_k factor and the
  key side a (d + bk) x d_k factor. Plain softmax ignores anything constant along a row
  of scores, so there the key side loses its bias row and b_K is entirely unidentified.
  With RoPE on r of the d_k dimensions, only matrices commuting with every rotation
  survive: r + (d_k - r)^2 dimensions (proved for d_k <= d_model); under plain softmax
  the d_k - r unrotated coordinates of b_K stay unidentified.
* value/output. Head h contributes A_h [X, 1] [W_V; b_V] W_O^h. The m heads' W_O^h
  side by side give a d_v x (m d) factor. Under plain softmax the rows of A_h sum to one,
  so b_V only enters through c = b_O + sum_h b_V^{g(h)} W_O^h: with b_O present all of b_V
  is unidentified, without it G d_v - min(G d_v, d) of it. Other normalisations see b_V.
* a learned sink logit per head is identified, except in one case: with both b_Q and b_K and
  no RoPE, the sink sees the entries of the product above only through the logit minus
  b_Q^h b_K^T / sqrt(d_k) (chapter 5). For d_k <= d_model the GL(d_k) orbit fixes that
  corner entry; for d_k > d_model the product has full rank, its corner entry is free, and
  each head's learned logit trades with it: one more direction per head.

With a QK-norm (``spec.qk_norm``; chapter 7b) the query/key side is different. The norm
divides each head's query (each token's whole query with 'full') by its root mean square, so
of GL(d_k) only a positive scale of each head's [W_Q^h; b_Q^h], and of each [W_K^g; b_K^g],
survives, and only when eps = 0: H + G directions ('full': one for all queries, one for all
keys). With eps > 0 these directions are identified, but only through eps (weakly; their
singular values are small). The learned norm weights enter the scores only through the
products q_norm * k_norm per coordinate, which RoPE ties together on each rotated pair: a
trade of r/2 + (d_k - r) dimensions, once ('shared') or per group ('per-head', 'full').
Without a learned weight ('unweighted', Llama 4) nothing tells the coordinates apart, and an
orthogonal change of basis commuting with RoPE survives instead of the trade: per group
r/2 rotation angles and (d_k - r)(d_k - r - 1)/2 dimensions of SO(d_k - r).
Every bias is identified, b_K included: it sits inside the norm. Chapter 7b proves that these
moves are unidentified and that nothing else is, so the counts are equalities, where
``qk_norm_not_covered`` returns '': for 2 <= d_k <= d_model and d_v <= d_model (H d_k and G d_k
<= d_model with 'full'), by thm-qk-norm (prop-qk-several-heads separates the heads by the poles
of their logistic factors; prop-qk-tangent and, for 'full', prop-qk-tangent-full give each head's
tangent); for d_k = 1 with eps > 0, d_model >= 2 and d_v <= d_model, shared, per-head or
unweighted (or 'full' with one head, which is per-head), by prop-qk-width-one. Every other
QK-norm layout is not covered (its count is withheld with the reason); ``attnid verify`` still
measures it. Every numeric check agrees (``attnid verify``, tests/test_qk_norm.py).

A sliding window (``spec.window``) changes no count when it is at least 3 keys wide, or 2
without RoPE: every proof reads rows that see the keys at offsets 0, 1 and 2 (0 and 1
without RoPE). Narrower windows are not covered (with w = 1 a softmax row sees one key).
Chunks (``spec.chunk``) of at least 3 tokens (2 without RoPE) likewise: the proofs' first
three positions lie in the first chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnid.layout import Count
from attnid.spec import AttentionSpec

__all__ = ["Count", "FactoredCount", "count"]  # Count lives in attnid.layout: one record for every family


@dataclass(frozen=True)
class FactoredCount:
    """Exact identification count of f(X) = X A B."""

    d_in: int
    k: int
    d_out: int

    def __post_init__(self) -> None:
        for name in ("d_in", "k", "d_out"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    @property
    def total(self) -> int:
        """P = k (d_in + d_out)."""
        return self.k * (self.d_in + self.d_out)

    @property
    def product_rank(self) -> int:
        """r = min(k, d_in, d_out), the rank of A B at a generic point."""
        return min(self.k, self.d_in, self.d_out)

    @property
    def identified(self) -> int:
        """Dimension of the d_in x d_out matrices of rank <= r: r (d_in + d_out - r)."""
        r = self.product_rank
        return r * (self.d_in + self.d_out - r)

    @property
    def unidentified(self) -> int:
        """P minus the identified dimension; equals k^2 when k <= min(d_in, d_out)."""
        return self.total - self.identified

    @property
    def ratio(self) -> float:
        """Share of unidentified parameters."""
        return self.unidentified / self.total

    @property
    def stabiliser_dimension(self) -> int:
        """Dimension of {M in GL(k): A M = A, M^-1 B = B} at a generic point: (k - rank A)(k - rank B).

        Its Lie algebra is {N : A N = 0, N B = 0}: maps that vanish on the column space of B
        (dimension min(k, d_out)) and land in the null space of A (dimension k - min(k, d_in)).
        """
        return (self.k - min(self.k, self.d_in)) * (self.k - min(self.k, self.d_out))

    @property
    def orbit_dimension(self) -> int:
        """Dimension of the GL(k) orbit through a generic point: k^2 minus the stabiliser's dimension."""
        return self.k**2 - self.stabiliser_dimension

    @property
    def beyond_orbit(self) -> int:
        """Fibre dimension not swept by GL(k): (k - d_in)(d_out - k) when k lies strictly between the sides, else 0.

        Then A has a null space and B does not fill R^k, so B can move by maps into ker A (and A
        by maps vanishing on the columns of B) without changing AB; GL(k) does not produce all of these.
        """
        return self.unidentified - self.orbit_dimension



def total_parameters(spec: AttentionSpec) -> int:
    """P = d (H d_k + G d_k + G d_v + H d_v) + the biases present + H learned sink logits + the QK-norm weights."""
    d, h, g, dk, dv = spec.d_model, spec.heads, spec.kv_heads, spec.head_dim, spec.v_head_dim
    total = d * (h * dk + g * dk + g * dv + h * dv)
    total += spec.has_bias("q") * h * dk + spec.has_bias("k") * g * dk + spec.has_bias("v") * g * dv
    total += spec.has_bias("o") * d + spec.sink_learned * h
    return total + qk_norm_parameters(spec)


def qk_norm_parameters(spec: AttentionSpec) -> int:
    """The QK-norm weights: 2 d_k shared, (H + G) d_k per head or over the full width, 0 without a norm."""
    if not spec.has_qk_norm or spec.qk_norm == "unweighted":
        return 0
    return 2 * spec.head_dim if spec.qk_norm == "shared" else (spec.heads + spec.kv_heads) * spec.head_dim


def qk_norm_not_covered(spec: AttentionSpec) -> str:
    """Why the QK-norm count does not apply to this layout ('' when it does, or without a QK-norm)."""
    if not spec.has_qk_norm:
        return ""
    d, dk = spec.d_model, spec.head_dim
    if spec.qk_norm == "full":
        if max(spec.heads, spec.kv_heads) * dk > d:
            return (f"not covered: a QK-norm over the full width needs H d_k and G d_k <= d_model (here "
                    f"{spec.heads * dk} and {spec.kv_heads * dk} against {d}): the proof needs the projections onto "
                    "the whole normalised width")
        widths = (spec.heads * dk, spec.kv_heads * dk)
    else:
        if dk > d:
            return (f"not covered: QK-norm with head_dim {dk} > d_model {d} (the proof needs each head's "
                    "projection onto all of R^d_k)")
        widths = (dk,)
    if spec.qk_norm_eps == 0 and min(widths) == 1:
        return ("not covered: with eps = 0 a QK-norm over a single entry keeps only its sign, so the layer is not "
                "differentiable in the query/key weights and its Jacobian does not measure the fiber")
    if spec.v_head_dim > d:
        return (f"not covered: QK-norm with v_head_dim {spec.v_head_dim} > d_model {d} (the proofs need W_V of full "
                "column rank and W_O of full row rank)")
    if dk == 1 and spec.qk_norm == "full" and max(spec.heads, spec.kv_heads) > 1:
        return ("not covered: a full-width QK-norm on heads of width one (the proofs of the full variant need "
                "head_dim >= 2)")
    if dk == 1 and d == 1:
        return "not covered: QK-norm heads of width one with d_model 1 (the proof needs d_model >= 2)"
    return ""


def window_not_covered(spec: AttentionSpec) -> str:
    """Why the counts do not apply to this window or these chunks ('' when they do, or without either)."""
    width = spec.window if spec.window is not None else spec.chunk
    what = "window" if spec.window is not None else "chunks"
    if width is None or width >= 3:
        return ""
    if width == 1:
        return f"not covered: {what} of 1 key show each row only its own key (a softmax row then ignores its scores)"
    if spec.rope_dims:
        return (f"not covered: {what} of 2 keys with RoPE leave each row the offsets 0 and 1 only, where the fiber "
                "can be larger (as with a causal mask and two tokens, chapter 6)")
    return ""


def qk_norm_unit_count(spec: AttentionSpec) -> int:
    """Dimensions of the diagonal matrices commuting with RoPE: r/2 rotated pairs plus d_k - r unrotated coordinates."""
    return spec.rope_dims // 2 + spec.head_dim - spec.rope_dims


def qk_norm_trade(spec: AttentionSpec) -> int:
    """Unidentified QK-norm weight directions: q_norm -> q_norm D, k_norm -> k_norm / D, once or per group."""
    if spec.qk_norm == "unweighted":
        return 0
    return qk_norm_unit_count(spec) * (1 if spec.qk_norm == "shared" else spec.kv_heads)


def qk_norm_rotations(spec: AttentionSpec) -> int:
    """'unweighted' only: per group, the orthogonal matrices commuting with RoPE: r/2 + (d_k - r)(d_k - r - 1)/2."""
    if spec.qk_norm != "unweighted":
        return 0
    free = spec.head_dim - spec.rope_dims
    return spec.kv_heads * (spec.rope_dims // 2 + free * (free - 1) // 2)


def qk_norm_scales(spec: AttentionSpec) -> int:
    """The positive scales of the query and key projections a QK-norm cannot see: H + G ('full': 2)."""
    return 2 if spec.qk_norm == "full" else spec.heads + spec.kv_heads


def query_key_unidentified(spec: AttentionSpec) -> int | None:
    """Unidentified dimensions of the query/key weights (and b_Q) of all groups; None if not covered."""
    d, m, dk, r = spec.d_model, spec.group_size, spec.head_dim, spec.rope_dims
    if spec.has_qk_norm:  # the scales of the projections, exact only with eps = 0
        return None if qk_norm_not_covered(spec) else (0 if spec.qk_norm_eps > 0 else qk_norm_scales(spec))
    if r:
        if dk > d:
            return None
        return spec.kv_heads * (r + (dk - r) ** 2)
    # Under plain softmax b_K is not part of the product (key_bias_unidentified counts it).
    key_rows = d + (spec.has_bias("k") and not spec.shift_invariant)
    product = spec.kv_heads * FactoredCount(m * (d + spec.has_bias("q")), dk, key_rows).unidentified
    return product + sink_corner_trade(spec)


def sink_corner_trade(spec: AttentionSpec) -> int:
    """H when each learned sink logit trades with the corner b_Q^h b_K^T of a full-rank query/key product, else 0.

    The sink sees that corner only through sink_h - b_Q^h b_K^T / sqrt(d_k). Below full rank
    (d_k <= d_model) the rest of the product fixes the corner; at full rank (d_k > d_model,
    no RoPE) nothing does (chapter 5, theorem on sinks and sigmoid).
    """
    full_rank = spec.head_dim > spec.d_model and not spec.rope_dims and not spec.has_qk_norm
    return spec.heads if spec.sink_learned and spec.has_bias("q") and spec.has_bias("k") and full_rank else 0


def key_bias_unidentified(spec: AttentionSpec) -> int:
    """b_K coordinates that never change the output: all unrotated ones, under plain softmax without a QK-norm only."""
    if not spec.has_bias("k") or not spec.shift_invariant or spec.has_qk_norm:
        return 0
    return spec.kv_heads * (spec.head_dim - spec.rope_dims)


def value_output_unidentified(spec: AttentionSpec) -> int:
    """Unidentified dimensions of W_V, W_O (and b_V when the normalisation sees it) of all groups."""
    d, m, dv = spec.d_model, spec.group_size, spec.v_head_dim
    value_rows = d + (spec.has_bias("v") and not spec.shift_invariant)
    return spec.kv_heads * FactoredCount(value_rows, dv, m * d).unidentified


def value_bias_unidentified(spec: AttentionSpec) -> int:
    """Under plain softmax b_V only moves c = b_O + sum_h b_V W_O^h: the b_V directions c cannot see."""
    if not spec.has_bias("v") or not spec.shift_invariant:
        return 0
    n_bv = spec.kv_heads * spec.v_head_dim
    return n_bv if spec.has_bias("o") else n_bv - min(n_bv, spec.d_model)


def count(spec: AttentionSpec) -> Count:
    """Total, unidentified and the breakdown by source for a layout."""
    if not isinstance(spec, AttentionSpec):
        raise TypeError(f"count takes an AttentionSpec, got {type(spec).__name__}; for a layout of another family "
                        "use attnid.families.count")
    total = total_parameters(spec)
    qk = query_key_unidentified(spec)
    if qk is None:
        note = qk_norm_not_covered(spec) or (
            f"not covered: RoPE with head_dim {spec.head_dim} > d_model {spec.d_model} "
            "(the commutant argument needs the query/key factors to have full column rank)")
        return Count(spec, total, None, {}, note)
    if window_not_covered(spec):
        return Count(spec, total, None, {}, window_not_covered(spec))
    breakdown = {"query_key": qk}
    if spec.qk_norm == "unweighted":
        breakdown["rotations"] = qk_norm_rotations(spec)
    elif spec.has_qk_norm:
        breakdown["norm_weights"] = qk_norm_trade(spec)
    breakdown.update({
        "key_bias": key_bias_unidentified(spec),
        "value_output": value_output_unidentified(spec),
        "value_bias": value_bias_unidentified(spec),
    })
    weak = qk_norm_scales(spec) if spec.has_qk_norm and spec.qk_norm_eps > 0 else 0
    return Count(spec, total, sum(breakdown.values()), breakdown, weakly_identified=weak)
