"""The structured route: the certificate's Gram matrix assembled from the layer's structure, not from J.

Why. The dense certificate (``attnid.certify``) forms J^T J from the Jacobian J, whose rows are
the n d_model output coordinates of every input: (rows) x P^2 multiply-adds, 7 * 10^12 for
d_model = 64, 8 heads (P = 16,384, 13 inputs of 32 tokens), a few minutes on two cores. Here
the same matrix comes from formulas in which the output coordinate c is summed out once per
token, so the cost grows with the number of tokens rather than with tokens times d_model.

The Jacobian of one token's output row (standard layout, softmax). Notation per input X
(n x d): nu_i = x_i W_Q^h + b_Q^h and kappa_j = x_j W_K^g + b_K^g before RoPE, q_i and k_j after
it (q_i = nu_i R_i with R_p the rotation at position p; R_p = I without RoPE), A_h the
attention weights, Z_h = A_h V_g, w^h_j = v_j W_O^h (v_j = x_j W_V^g + b_V^g) and
U^h_i[j, c] = A_h[i, j] (w^h_j - sum_l A_h[i, l] w^h_l)[c] / sqrt(d_k). Differentiating
Y_i = sum_h sum_j A_h[i, j] w^h_j + b_O (softmax: dA_ij = A_ij (dS_ij - sum_l A_il dS_il)):

    dY_i[c] / dW_O^h[l, c']   = Z_h[i, l] delta(c, c')                         dY_i / db_O = I
    dY_i[c] / dW_V^g[a, l]    = sum_{h in g} (A_h X)[i, a] W_O^h[l, c]          (b_V: A_h 1 = 1 for a)
    dY_i[c] / dW_Q^h[a, e]    = x_ia beta^h_i[e, c],   beta^h_i = sum_j (k_j R_i^T)[e] U^h_i[j, c]
    dY_i[c] / dW_K^g[a, e]    = sum_{h in g} sum_j x_ja (q^h_i R_j^T)[e] U^h_i[j, c]

(biases: x_ia -> 1). Without RoPE the last is sum_{h in g} q^h_i[e] (X^T U^h_i)[a, c]. So for
each parameter tensor, token i and c, the Jacobian is sum_t L_t[gamma, alpha] R_t[gamma, beta, c]
(``Factor``): gamma a head or group index, alpha indexes the factor L that does not depend on c,
beta the factor R that does, t the heads of a group. A tensor with no such split (W_K and b_K
with RoPE) is stored explicitly, as L = 1 and R = its whole Jacobian row.

Gram blocks. For two tensors p, p' the block of J^T J is

    sum_i sum_{t, s} L_t[gamma, alpha] L'_s[gamma', alpha'] (sum_c R_t[gamma, beta, c] R'_s[gamma', beta', c])

which is computed as one batched matrix product per block pair with the tokens (i, t, s) as the
inner dimension (``gram_block``). Proof of correctness: expanding J_i^T J_i for token i with
J_i[c, (gamma, alpha, beta)] = sum_t L_t R_t gives exactly this sum; summing over tokens gives
J^T J. The formulas above are the chain rule for ``attnid.layer.forward``; the tests compare the
assembled matrix with the dense J^T J from automatic differentiation on every standard layout,
with and without biases, RoPE (full and partial), GQA, a causal mask and a sliding window.

The certificate. Write u for the orbit dimension, r = P - u, and B for an orthonormal basis of
the orbit tangent, built per generator family (``orbit_families``: one head group's GL(d_k),
its GL(d_v), ...; families with overlapping supports merged, so the supports are disjoint and
the families' bases side by side are orthonormal). Two bounds decide the rank, as in the dense
certificate (``attnid.certify``):

* s_{r+1}(J) <= ||J B||_2 <= ||J B||_F (Courant-Fischer: s_{r+1} is at most the largest stretch
  of J on any u-dimensional subspace). J B comes from the same factors (``stretch_squared``),
  each family through the few head indices its support reaches.
* s_r(J) >= sqrt(c), from one Cholesky factorisation that succeeds, in one of two forms:
  (a) gauge deletion: D is a set of u coordinates (``gauge_coordinates``) and J_S is J without
  those columns (S the other r). If G_SS - c I is positive definite then s_min(J_S) >= sqrt(c),
  and deleting columns never raises a singular value (s_i(J_S) <= s_i(J), interlacing), so
  s_r(J) >= s_r(J_S) >= sqrt(c). The argument needs nothing of D; D is chosen so that it can
  succeed: if the null space of J is span(B), J_S is injective exactly when B restricted to
  the rows D is invertible, which LU pivoting on each family's basis provides. The matrix is
  r x r instead of P x P, 18 % fewer operations at d_model = 64, 8 heads.
  (b) K = G + w B B^T with w = s_1^2 estimated: for v orthogonal to span(B), v^T K v = ||J v||^2,
  so K - c I positive definite gives ||J v|| >= sqrt(c) ||v|| on a subspace of dimension r, and
  s_r(J) >= sqrt(c) by Courant-Fischer. More robust (nothing is deleted), P x P.
  ``attnid.verification`` tries (a) first above ``GAUGE_MIN_PARAMS`` parameters and (b) otherwise or after.

The shift is chosen in advance, c = (GRAM_FLOOR s_1)^2 with s_1 estimated, about the least
separation the rank rule accepts (a second factorisation would measure t_r; at P = 16,384 one
costs about 15 to 20 s here). What is proved is s_r(J) >= sqrt(c); the reported lower bound on
t_r = s_r / s_1 divides it by ||J||_F >= s_1 (the square root of the trace of G, from its
diagonal), so it holds whatever the estimate of s_1, and is smaller than GRAM_FLOOR by the
factor s_1 / ||J||_F (about 0.25 at d_model = 64, 8 heads: a reported 2.5e-6): still far above the rule's
zero tolerance. The factorisation runs in place, on the
lower triangle (``gram_matrix(lower=True)``) read column-major, so the only P x P (or r x r)
matrix is the Gram matrix itself. s_1 is estimated by 10 steps of power iteration on G (for
(a): on G_SS, plus ||J_D||_F^2 from the diagonal when it sets c): an estimate from below,
measured 2 to 5 % below lambda_max on four d_model <= 32 layouts, which only sets c. The upper
bound on t_{r+1} divides ||J B||_F by the power estimate for G_SS, at most s_1(J_S) <= s_1(J),
so it errs upwards (safe). If the factorisation fails,
``verify`` draws more inputs (``INPUT_FACTORS``; the Gram matrix of more inputs is cheap) and
tries again, and after the last attempt gives up to the dense route.

What it does not do: the verified bounds of the dense certificate (``RankDecision.verified``), which
bound every rounding error of forming J^T J from the computed Jacobian. Here J is never formed;
the decision is a floating-point certificate like the SVD route's (``RankDecision.rigorous`` is
False). Layouts outside softmax without a QK-norm (sinks, sigmoid, QK-norm) are not covered
(``covers``): ``verify`` sends them to the dense route.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from attnid.layer import parameter_shapes
from attnid.normalise import attention_weights
from attnid.rank import DEFAULT_MIN_GAP, DEFAULT_ZERO_TOL, GRAM_FLOOR, RankDecision, numerical_rank
from attnid.rope import apply_rope, rope_tables
from attnid.spec import AttentionSpec, Params
from attnid.symmetry import labelled_tangent_directions
from attnid.jacobian import flatten
from attnid.gram_blocks import CHUNK_ELEMENTS, Factor, fixed_right, gram_block, is_explicit, shared_left

POWER_STEPS = 10
# Inputs for each attempt, as multiples of verify's first batch: the Gram matrix of more inputs costs little more.
INPUT_FACTORS: tuple[int, ...] = (2, 4, 8)
# Above this many parameters the first attempt deletes the gauge coordinates (a smaller Cholesky; if it fails,
# the same inputs are tried again without deleting). Below it the Cholesky is cheap and K = G + w B B^T goes first.
GAUGE_MIN_PARAMS = 8192


def covers(spec: AttentionSpec) -> str | None:
    """None when the structured route can decide the layout, else the reason it cannot."""
    if spec.norm != "softmax":
        return f"its scores are normalised by {spec.norm}, the structured route's formulas are for softmax"
    if spec.has_qk_norm:
        return "it has a QK-norm, which the structured route's formulas leave out"
    return None


def _rotate_back(v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """v R_p^T (rotation by minus the angle) on the first r columns, cos and sin broadcast to v's rotated part."""
    r = cos.shape[-1]
    if r == 0:
        return v
    rot, rest = v[..., :r], v[..., r:]
    half = r // 2
    turned = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    rotated = rot * cos - turned * sin
    return torch.cat([rotated, rest.expand(*rotated.shape[:-1], rest.shape[-1])], dim=-1)


def token_factors(params: Params, x: torch.Tensor, spec: AttentionSpec) -> list[Factor]:
    """The factors of every parameter tensor for one input x (n, d_model), in ``parameter_shapes`` order."""
    reason = covers(spec)
    if reason is not None:
        raise ValueError(f"the structured route does not cover {spec.describe()}: {reason}")
    n, d, dk = x.shape[0], spec.d_model, spec.head_dim
    heads_of = torch.tensor([[h for h in range(spec.heads) if spec.group_of_head(h) == g] for g in range(spec.kv_heads)],
                            device=x.device)  # (G, T)
    g_of_h = torch.tensor([spec.group_of_head(h) for h in range(spec.heads)], device=x.device)
    zero = x.new_zeros(())
    nu = torch.einsum("nd,hdk->hnk", x, params["W_Q"]) + (params["b_Q"][:, None] if "b_Q" in params else zero)
    kappa = torch.einsum("nd,gdk->gnk", x, params["W_K"]) + (params["b_K"][:, None] if "b_K" in params else zero)
    v = torch.einsum("nd,gdv->gnv", x, params["W_V"]) + (params["b_V"][:, None] if "b_V" in params else zero)
    cos, sin = rope_tables(n, spec.rope_dims, spec.rope_base, x.dtype, x.device)
    q = apply_rope(nu, spec.rope_dims, spec.rope_base)
    k = apply_rope(kappa, spec.rope_dims, spec.rope_base)[g_of_h]  # (H, n, d_k)
    weights = attention_weights(q @ k.transpose(-1, -2) / math.sqrt(dk), norm="softmax", causal=spec.causal,
                                window=spec.window, chunk=spec.chunk)  # (H, n, n)
    vh = v[g_of_h]
    w = vh @ params["W_O"]  # (H, n, d): w^h_j
    mean = weights @ w
    u = weights[..., None] * (w[:, None, :, :] - mean[:, :, None, :]) / math.sqrt(dk)  # (H, i, j, d)
    kback = _rotate_back(k[:, None, :, :], cos[None, :, None, :], sin[None, :, None, :])  # (H, i, j, d_k): k_j R_i^T
    beta = torch.einsum("hije,hijc->ihec", kback, u)  # (n, H, d_k, d)
    ones = x.new_ones(n, 1, 1, 1)
    factors: list[Factor] = []
    for name in parameter_shapes(spec):
        if name == "W_Q":
            factors.append(Factor(name, x[:, None, None, :].expand(n, 1, spec.heads, d), beta[:, None], "gab"))
        elif name == "b_Q":
            factors.append(Factor(name, ones.expand(n, 1, spec.heads, 1), beta[:, None], "gab"))
        elif name in ("W_K", "b_K"):
            factors.append(_key_factor(name, x, q, u, cos, sin, heads_of, spec))
        elif name in ("W_V", "b_V"):
            mixed = torch.einsum("hij,ja->iha", weights, x)  # (n, H, d): (A_h X)_i
            left = mixed[:, heads_of.T] if name == "W_V" else ones.expand(n, *heads_of.T.shape, 1)  # (n, T, G, A)
            right = params["W_O"][heads_of.T][None].expand(n, -1, -1, -1, -1)  # (n, T, G, d_v, d)
            factors.append(Factor(name, left, right, "gab", fixed_right=True))
        elif name == "W_O":
            z = (weights @ vh).permute(1, 0, 2)  # (n, H, d_v)
            eye = torch.eye(d, dtype=x.dtype, device=x.device)
            factors.append(Factor(name, z[:, None], eye.expand(n, 1, spec.heads, d, d), "gab", identity_right=True, fixed_right=True))
        elif name == "b_O":
            eye = torch.eye(d, dtype=x.dtype, device=x.device)
            factors.append(Factor(name, ones, eye.expand(n, 1, 1, d, d), "gab", identity_right=True, fixed_right=True))
        else:  # covers() excludes the layouts with other parameters
            raise AssertionError(f"no structured factor for parameter {name!r}")
    return factors


def _key_factor(name: str, x: torch.Tensor, q: torch.Tensor, u: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                heads_of: torch.Tensor, spec: AttentionSpec) -> Factor:
    """W_K or b_K: sum_{h in g} sum_j x_ja (q^h_i R_j^T)[e] U^h_i[j, c] (x_ja -> 1 for b_K)."""
    n = x.shape[0]
    inputs = x if name == "W_K" else x.new_ones(n, 1)
    if spec.rope_dims == 0:  # separable: L = q^h_i over e, R = (X^T U^h_i) over (a, c)
        left = q.permute(1, 0, 2)[:, heads_of.T]  # (n, T, G, d_k)
        right = torch.einsum("ja,hijc->ihac", inputs, u)[:, heads_of.T]  # (n, T, G, A, d)
        return Factor(name, left, right, "gba")
    qback = _rotate_back(q[:, :, None, :], cos[None, None, :, :], sin[None, None, :, :])  # (H, i, j, d_k): q_i R_j^T
    per_head = torch.einsum("ja,hije,hijc->ihaec", inputs, qback, u)  # (n, H, A, d_k, d)
    explicit = per_head[:, heads_of].sum(2)  # (n, G, A, d_k, d): the heads of each group summed
    flat = explicit.reshape(n, 1, 1, -1, explicit.shape[-1])
    return Factor(name, x.new_ones(n, 1, 1, 1), flat, "gab")


def _concat(factor_lists: Sequence[list[Factor]]) -> list[Factor]:
    """The factors of several inputs joined along the token axis, keeping L shared over heads and R fixed over tokens.

    (``token_factors`` builds those by expanding one copy; concatenation would copy them out.)
    """
    joined = []
    for parts in zip(*factor_lists):
        first = parts[0]
        tokens = sum(f.left.shape[0] for f in parts)
        if all(shared_left(f) for f in parts):
            left = torch.cat([f.left[:, :, :1] for f in parts]).expand(tokens, *first.left.shape[1:])
        else:
            left = torch.cat([f.left for f in parts])
        if all(fixed_right(f) for f in parts):  # W_O or the identity: one copy serves every input
            right = first.right[:1].expand(tokens, *first.right.shape[1:])
        else:
            right = torch.cat([f.right for f in parts])
        joined.append(Factor(first.name, left, right, first.order, first.identity_right, first.fixed_right))
    return joined


def gram_matrix(factors: list[Factor], keep: torch.Tensor | None = None, *,
                lower: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(J_S^T J_S, the diagonal of J^T J) from the factors of all inputs (``token_factors`` joined).

    S: the flat indices where ``keep`` (a boolean mask over the P parameters) is True; all of
    them by default, giving J^T J. The diagonal (squared column norms of J) is for all P.
    ``lower=True`` fills only the lower triangle (the upper one stays zero): what a Cholesky
    factorisation reads, at half the memory traffic (``_symmetric_matvec``).
    """
    sizes = [f.size for f in factors]
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    if keep is None:
        keep = torch.ones(sum(sizes), dtype=torch.bool, device=factors[0].left.device)
    kept = [keep[o: o + n].nonzero().reshape(-1) for o, n in zip(offsets, sizes)]
    starts = [sum(k.numel() for k in kept[:i]) for i in range(len(kept))]
    total = sum(k.numel() for k in kept)
    gram = factors[0].left.new_zeros(total, total)
    diagonal = []
    for i, f in enumerate(factors):
        rows = slice(starts[i], starts[i] + kept[i].numel())
        for j in range(i + 1):
            block = gram_block(f, factors[j])
            if j == i:
                diagonal.append(block.diagonal().clone())
            if kept[i].numel() < sizes[i] or kept[j].numel() < sizes[j]:
                block = block[kept[i][:, None], kept[j][None, :]]
            gram[rows, starts[j]: starts[j] + kept[j].numel()] = block.tril() if lower and j == i else block
            if j != i and not lower:
                gram[starts[j]: starts[j] + kept[j].numel(), rows] = block.T
            del block
    return gram, torch.cat(diagonal)


def _apply_one(f: Factor, full: torch.Tensor, tokens: slice, first: int, last: int) -> torch.Tensor:
    """J_f V on a range of tokens, shape (tokens, d_model, k), for V given on the head indices first:last of f."""
    _, _, _, a = f.left.shape
    b = f.right.shape[3]
    left, right = f.left[tokens, :, first:last], f.right[tokens, :, first:last]
    if a == 1:  # L is one number per token and term: fold it into R
        return torch.einsum("itgbc,gbk->ick", right * left[..., None], full.reshape(last - first, b, -1))
    shaped = full.reshape(last - first, a, b, -1) if f.order == "gab" else full.reshape(last - first, b, a, -1).transpose(1, 2)
    return torch.einsum("itgbc,itgbk->ick", right, torch.einsum("itga,gabk->itgbk", left, shaped))


def _token_step(factors: list[Factor], k: int) -> int:
    """Tokens per chunk so that the temporaries of ``_apply_one`` stay near CHUNK_ELEMENTS."""
    widest = max(f.right.shape[1] * f.right.shape[2] * f.right.shape[3] * max(k, f.right.shape[4]) for f in factors)
    return max(1, CHUNK_ELEMENTS // widest)


def apply(factors: list[Factor], vectors: torch.Tensor) -> torch.Tensor:
    """J V for V (P, k): shape (tokens * d_model, k), rows token-major like ``jacobian.input_jacobian``'s blocks."""
    tokens, step = factors[0].left.shape[0], _token_step(factors, vectors.shape[1])
    parts = []
    for s in range(0, tokens, step):
        offset, total = 0, None
        for f in factors:
            part = _apply_one(f, vectors[offset: offset + f.size], slice(s, s + step), 0, f.left.shape[2])
            total = part if total is None else total + part
            offset += f.size
        parts.append(total)
    return torch.cat(parts).reshape(-1, vectors.shape[1])


@dataclass(frozen=True)
class OrbitFamily:
    """Orbit generators that live on one set of parameters: ``basis`` (orthonormal) on the flat indices ``support``."""

    support: torch.Tensor
    basis: torch.Tensor


def orbit_families(params: Params, spec: AttentionSpec, rel_tol: float = DEFAULT_ZERO_TOL) -> list[OrbitFamily]:
    """The orbit tangent as families with pairwise disjoint supports, each with an orthonormal basis.

    The generators of ``symmetry.labelled_tangent_directions`` are grouped by label (one head
    group's GL(d_k), its GL(d_v), its key-bias shifts, its value-bias trades); labels whose
    supports overlap (the value-bias trades of all groups share b_O) are merged. Each family's
    span gets an orthonormal basis by an SVD with ``attnid.rank``'s rule, as ``orbit_tangent``
    does for all of them at once; disjoint supports make the columns of all families together an
    orthonormal basis of the same span, each family a few small products instead of P x u ones.
    """
    families: list[tuple[set[int], list[torch.Tensor]]] = []
    by_label: dict[str, list[torch.Tensor]] = {}
    for label, direction in labelled_tangent_directions(params, spec):
        by_label.setdefault(label, []).append(flatten(direction))
    for vectors in by_label.values():
        support = set(torch.stack(vectors).abs().sum(0).nonzero().reshape(-1).tolist())
        for other in [f for f in families if f[0] & support]:  # merge every family this one touches
            families.remove(other)
            support |= other[0]
            vectors = other[1] + vectors
        families.append((support, vectors))
    out = []
    for support, vectors in families:
        index = torch.tensor(sorted(support), dtype=torch.long, device=vectors[0].device)
        if index.numel() == 0:
            continue
        u, s, _ = torch.linalg.svd(torch.stack(vectors, dim=1)[index], full_matrices=False)
        out.append(OrbitFamily(index, u[:, : numerical_rank(s, rel_tol)]))
    return out


def stretch_squared(factors: list[Factor], families: list[OrbitFamily]) -> float:
    """||J B||_F^2 for B, the families' bases side by side (P x u), a chunk of tokens at a time.

    A factored tensor is applied family by family on the head indices each family's support
    reaches (few); an explicit one (no head index) to all u columns at once.
    """
    widths = [f.basis.shape[1] for f in families]
    starts = [sum(widths[:i]) for i in range(len(widths))]
    u = sum(widths)
    pieces, offset = [], 0  # (tensor, B on its head indices first:last, first, last, columns)
    for f in factors:
        per_gamma = f.size // f.left.shape[2]
        if is_explicit(f):
            full = f.left.new_zeros(f.size, u)
        for family, start in zip(families, starts):
            inside = (family.support >= offset) & (family.support < offset + f.size)
            if not bool(inside.any()):
                continue
            local = family.support[inside] - offset
            if is_explicit(f):
                full[local, start: start + family.basis.shape[1]] = family.basis[inside]
                continue
            first, last = int(local.min()) // per_gamma, int(local.max()) // per_gamma + 1
            part = family.basis.new_zeros((last - first) * per_gamma, family.basis.shape[1])
            part[local - first * per_gamma] = family.basis[inside]
            pieces.append((f, part, first, last, slice(start, start + family.basis.shape[1])))
        if is_explicit(f):
            pieces.append((f, full, 0, 1, slice(0, u)))
        offset += f.size
    tokens, step = factors[0].left.shape[0], _token_step(factors, u)
    total = 0.0
    for s in range(0, tokens, step):
        chunk = slice(s, s + step)
        out = factors[0].left.new_zeros(len(range(tokens)[chunk]), factors[0].right.shape[4], u)
        for f, part, first, last, columns in pieces:
            out[..., columns] += _apply_one(f, part, chunk, first, last)
        total += float(out.pow(2).sum())
    return total


def _symmetric_matvec(lower: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """G x for the symmetric G whose lower triangle ``lower`` holds (its upper triangle is zero)."""
    return lower @ x + lower.T @ x - lower.diagonal() * x


def _power_estimate(lower: torch.Tensor, steps: int = POWER_STEPS) -> float:
    """The Rayleigh quotient after power iteration: an estimate of lambda_max(G) from below (G stored as ``lower``)."""
    x = torch.ones(lower.shape[0], dtype=lower.dtype, device=lower.device)
    for _ in range(steps):
        x = _symmetric_matvec(lower, x)
        x = x / x.norm()
    return float(x @ _symmetric_matvec(lower, x))


def gauge_coordinates(families: list[OrbitFamily]) -> torch.Tensor:
    """Flat indices D, one per orbit direction, with the orbit basis restricted to D invertible.

    Per family, LU factorisation with partial pivoting of its basis (support x k) picks k pivot
    rows: the basis restricted to them is L_top U with L_top unit lower triangular (entries of
    modulus at most 1) and U invertible, so no orbit direction vanishes on all of them.
    """
    picked = []
    for family in families:
        k = family.basis.shape[1]
        if k == 0:
            continue
        perm, _, _ = torch.linalg.lu(family.basis)  # basis = perm @ L @ U
        picked.append(family.support[perm.argmax(dim=0)[:k]])
    if not picked:
        return torch.zeros(0, dtype=torch.long)
    return torch.cat(picked)


def certify_structured(params: Params, inputs: Sequence[torch.Tensor], spec: AttentionSpec, *,
                       families: list[OrbitFamily] | None = None, gauge: bool = True,
                       zero_tol: float = DEFAULT_ZERO_TOL, min_gap: float = DEFAULT_MIN_GAP) -> RankDecision | None:
    """A structured certificate that the null space of J is the orbit tangent, or None when it does not go through.

    One attempt on the given inputs (``attnid.verify`` draws more and calls again). ``families``:
    ``orbit_families(params, spec)`` if the caller has them. ``gauge=True`` factorises the Gram
    matrix of J without the gauge coordinates (``gauge_coordinates``), ``gauge=False`` the full
    K = J^T J + w B B^T (module docstring). The decision's ``method`` is 'structured'; its
    ``kept_bound`` is sqrt(c / ||J||_F^2), below t_r since ||J||_F >= s_1 (c the one shift tried),
    its ``dropped_bound`` ||J B||_F / s_1(J_S) with B the families' orthonormal basis and s_1(J_S)
    estimated from below.
    """
    reason = covers(spec)
    if reason is not None:
        raise ValueError(f"the structured route does not cover {spec.describe()}: {reason}")
    families = orbit_families(params, spec) if families is None else families
    factors = _concat([token_factors(params, x, spec) for x in inputs])
    n_params = sum(f.size for f in factors)
    nullity = sum(f.basis.shape[1] for f in families)
    stretch = math.sqrt(stretch_squared(factors, families)) if nullity else 0.0
    n_rows = sum(x.shape[0] for x in inputs) * spec.d_model
    deleted = gauge_coordinates(families).to(factors[0].left.device) if gauge else None
    keep = None
    if deleted is not None:
        keep = torch.ones(n_params, dtype=torch.bool, device=deleted.device)
        keep[deleted] = False
    gram, column_sq = gram_matrix(factors, keep, lower=True)
    deleted_sq = float(column_sq[deleted].sum()) if deleted is not None else 0.0
    del factors
    rho = _power_estimate(gram)
    if not (math.isfinite(rho) and rho > 0):
        return None
    # s_1(J_S) <= s_1(J) <= sqrt(s_1(J_S)^2 + ||J_D||_F^2) with J = [J_S, J_D]; no deletion: both are s_1(J)
    sigma_low, sigma_up = math.sqrt(rho), math.sqrt(rho + deleted_sq)
    if deleted is None:
        for family in families:  # K = G + w B B^T with w = s_1^2, on each family's support (lower triangle suffices)
            gram[family.support[:, None], family.support[None, :]] += rho * (family.basis @ family.basis.T)
    shift = (GRAM_FLOOR * sigma_up) ** 2
    diagonal = gram.diagonal()
    diagonal.copy_(torch.nextafter(diagonal - shift, torch.tensor(-math.inf, dtype=gram.dtype, device=gram.device)))
    upper = gram.mT  # the same numbers read column-major: LAPACK factorises it in place, with no copy
    _, info = torch.linalg.cholesky_ex(upper, upper=True, out=(upper, torch.empty((), dtype=torch.int32, device=gram.device)))
    del gram, upper
    if int(info):
        return None
    trace = float(column_sq.sum())  # ||J||_F^2 >= s_1(J)^2: the proved t_r >= sqrt(c) / s_1 is at least this
    return RankDecision(singular_values=None, n_rows=n_rows, n_params=n_params, rank=n_params - nullity,
                        zero_tol=zero_tol, min_gap=min_gap, kept_bound=math.sqrt(shift / trace),
                        dropped_bound=stretch / sigma_low if nullity else math.nan, verified=None, route="structured")
