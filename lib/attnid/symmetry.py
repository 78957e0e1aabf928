"""Symmetries of the attention layer: moves of the parameters that leave the function unchanged.

Per key/value group g, with M in GL(d_k) and N in GL(d_v):

    W_Q^h -> W_Q^h M,   b_Q^h -> b_Q^h M          (every query head h of group g)
    W_K^g -> W_K^g M^-T, b_K^g -> b_K^g M^-T
    W_V^g -> W_V^g N,   b_V^g -> b_V^g N
    W_O^h -> N^-1 W_O^h

With RoPE on r dimensions, M must commute with every rotation: 2 x 2 blocks a I + b J on
each rotated pair (i, i + r/2), any matrix on the unrotated part, zeros between them.
Under plain softmax two more moves exist: any shift of the unrotated coordinates of b_K,
and the trade b_V^g -> b_V^g + u, b_O -> b_O - sum_{h in g} u W_O^h. Permuting heads (whole
groups, and query heads inside a group) is a finite symmetry.

With a QK-norm (``spec.qk_norm``, chapter 7b) the query/key moves are different, and
``move_qk_norm`` makes them: a positive scale c_h of each head's [W_Q^h; b_Q^h] and c_g of each
[W_K^g; b_K^g] (with 'full', one scale for all queries and one for all keys), a symmetry only
when eps = 0; and the trade q_norm -> q_norm D, k_norm -> k_norm D^-1 with D positive diagonal
and equal on each rotated pair (i, i + r/2), once for the shared weights or per group. The
'unweighted' norm (no learned weight) has no trade; instead an orthogonal change of basis O_g
commuting with RoPE moves the group's [W_Q^h; b_Q^h] and [W_K^g; b_K^g] alike (``rotations``). The
GL(d_k) moves, the key-bias shift, the conserved quantities and the balancing below are for
layouts without a QK-norm and refuse the others; the value side is unchanged.

The tangent space of the orbit is spanned by the derivatives of these moves at the
identity; ``orbit_tangent`` returns an orthonormal basis of it in the flattened
parameter space of ``attnid.jacobian.flatten``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnid.counts import sink_corner_trade
from attnid.jacobian import flatten
from attnid.layer import check_params
from attnid.rank import COMMUTANT_TOL, DEFAULT_ZERO_TOL, is_invertible, numerical_rank
from attnid.spec import AttentionSpec, Params


@dataclass(frozen=True)
class GroupElement:
    """One (M_g, N_g) per key/value group: shapes (G, d_k, d_k) and (G, d_v, d_v)."""

    query_key: torch.Tensor
    value_output: torch.Tensor


def lie_algebra_basis(spec: AttentionSpec) -> torch.Tensor:
    """Basis (n, d_k, d_k) of the matrices A with A R = R A for every RoPE rotation R (all of gl(d_k) without RoPE)."""
    dk, r = spec.head_dim, spec.rope_dims
    half = r // 2
    basis = []
    for i in range(half):  # a I + b J on the pair (i, i + r/2)
        ident = torch.zeros(dk, dk, dtype=torch.float64)
        ident[i, i] = ident[i + half, i + half] = 1.0
        turn = torch.zeros(dk, dk, dtype=torch.float64)
        turn[i + half, i], turn[i, i + half] = 1.0, -1.0
        basis += [ident, turn]
    for a in range(r, dk):
        for b in range(r, dk):
            unit = torch.zeros(dk, dk, dtype=torch.float64)
            unit[a, b] = 1.0
            basis.append(unit)
    return torch.stack(basis) if basis else torch.zeros(0, dk, dk, dtype=torch.float64)


def in_commutant(m: torch.Tensor, spec: AttentionSpec) -> bool:
    """Whether M (d_k, d_k) lies in the span of ``lie_algebra_basis`` (commutes with every rotation)."""
    basis = lie_algebra_basis(spec).reshape(-1, spec.head_dim**2).to(m)
    coeffs = torch.linalg.lstsq(basis.T, m.reshape(-1, 1)).solution
    residual = (basis.T @ coeffs).reshape(m.shape) - m
    return bool(residual.abs().max() <= COMMUTANT_TOL * max(1.0, float(m.abs().max())))


def random_group_element(spec: AttentionSpec, generator: torch.Generator, scale: float = 0.3) -> GroupElement:
    """I + scale * (random element of the Lie algebra), per group: invertible for small scale.

    With a QK-norm the query/key part is the identity (GL(d_k) is no symmetry there; see
    ``random_qk_norm_move``) and only the value/output part is drawn.
    """
    g, dk, dv = spec.kv_heads, spec.head_dim, spec.v_head_dim
    basis = lie_algebra_basis(spec)
    coeffs = torch.randn(g, basis.shape[0], generator=generator, dtype=torch.float64)
    qk = torch.eye(dk, dtype=torch.float64) + scale * torch.einsum("gn,nab->gab", coeffs, basis)
    if spec.has_qk_norm:
        qk = torch.eye(dk, dtype=torch.float64).expand(g, dk, dk).clone()
    vo = torch.eye(dv, dtype=torch.float64) + scale * torch.randn(g, dv, dv, generator=generator, dtype=torch.float64)
    return GroupElement(qk, vo)


def _check_element(element: GroupElement, spec: AttentionSpec) -> None:
    g, dk, dv = spec.kv_heads, spec.head_dim, spec.v_head_dim
    if tuple(element.query_key.shape) != (g, dk, dk) or tuple(element.value_output.shape) != (g, dv, dv):
        raise ValueError(
            f"group element needs shapes ({g}, {dk}, {dk}) and ({g}, {dv}, {dv}), got "
            f"{tuple(element.query_key.shape)} and {tuple(element.value_output.shape)}"
        )
    for name, mats in (("query_key", element.query_key), ("value_output", element.value_output)):
        if not torch.isfinite(mats).all():
            raise ValueError(f"{name} matrices contain NaN or inf")
        sv = torch.linalg.svdvals(mats)  # (G, n), descending per matrix
        if not is_invertible(sv):
            cond = sv[..., 0] / sv[..., -1]
            raise ValueError(f"{name} matrices must be invertible (condition numbers {cond.tolist()})")
    if spec.has_qk_norm:
        eye = torch.eye(dk, dtype=element.query_key.dtype, device=element.query_key.device)
        if not torch.equal(element.query_key, eye.expand(g, dk, dk)):
            raise ValueError("with a QK-norm the query/key matrices must be the identity: GL(d_k) is no symmetry of "
                             "this layout (its moves are move_qk_norm's scales and norm-weight trades)")
    elif spec.rope_dims:
        for i, m in enumerate(element.query_key):
            if not in_commutant(m, spec):
                raise ValueError(f"query_key[{i}] does not commute with the RoPE rotations: not a symmetry of this layout")


def head_groups(spec: AttentionSpec) -> torch.Tensor:
    return torch.tensor([spec.group_of_head(h) for h in range(spec.heads)])


def apply_group(params: Params, spec: AttentionSpec, element: GroupElement) -> dict[str, torch.Tensor]:
    """The parameters moved by (M_g, N_g) as in the module docstring; the function is unchanged."""
    check_params(params, spec)
    _check_element(element, spec)
    m = element.query_key.to(params["W_Q"])
    n = element.value_output.to(params["W_V"])
    m_inv_t = torch.linalg.inv(m).transpose(-1, -2)
    n_inv = torch.linalg.inv(n)
    per_head = head_groups(spec)
    out = dict(params)
    out["W_Q"] = params["W_Q"] @ m[per_head]
    out["W_K"] = params["W_K"] @ m_inv_t
    out["W_V"] = params["W_V"] @ n
    out["W_O"] = n_inv[per_head] @ params["W_O"]
    if "b_Q" in params:
        out["b_Q"] = (params["b_Q"][:, None, :] @ m[per_head])[:, 0]
    if "b_K" in params:
        out["b_K"] = (params["b_K"][:, None, :] @ m_inv_t)[:, 0]
    if "b_V" in params:
        out["b_V"] = (params["b_V"][:, None, :] @ n)[:, 0]
    return out


def _require_softmax(spec: AttentionSpec, what: str) -> None:
    if not spec.shift_invariant:
        raise ValueError(f"{what} is a symmetry only under plain softmax; this layout uses norm={spec.norm!r}")


def refuse_qk_norm(spec: AttentionSpec, what: str) -> None:
    if spec.has_qk_norm:
        raise ValueError(f"{what} is derived for layouts without a QK-norm; this layout has qk_norm={spec.qk_norm!r}")


def qk_norm_units(spec: AttentionSpec) -> list[list[int]]:
    """The coordinates a QK-norm trade must scale together: each rotated pair [i, i + r/2], then each unrotated [a]."""
    half = spec.rope_dims // 2
    return [[i, i + half] for i in range(half)] + [[a] for a in range(spec.rope_dims, spec.head_dim)]


def orthogonal_commutant_basis(spec: AttentionSpec) -> torch.Tensor:
    """Basis (n, d_k, d_k) of the antisymmetric matrices commuting with RoPE: J on each rotated pair, so(d_k - r) beyond."""
    dk, r = spec.head_dim, spec.rope_dims
    basis = [m for m in lie_algebra_basis(spec)[: r] if torch.equal(m, -m.T)]  # the a I + b J blocks: keep the J ones
    for a in range(r, dk):
        for b in range(a + 1, dk):
            unit = torch.zeros(dk, dk, dtype=torch.float64)
            unit[a, b], unit[b, a] = 1.0, -1.0
            basis.append(unit)
    return torch.stack(basis) if basis else torch.zeros(0, dk, dk, dtype=torch.float64)


def move_qk_norm(params: Params, spec: AttentionSpec, *, query_scales: torch.Tensor | None = None,
                 key_scales: torch.Tensor | None = None, trade: torch.Tensor | None = None,
                 rotations: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The QK-norm moves: scale the projections, trade the norm weights. Invisible exactly when the docstring says.

    ``query_scales`` (H,) multiplies each head's W_Q^h and b_Q^h, ``key_scales`` (G,) each W_K^g and b_K^g
    (with 'full' shapes (1,): all heads together); both must be positive, and they are symmetries only
    with eps = 0 (ValueError otherwise). ``trade`` holds positive factors, one per unit of ``qk_norm_units``
    (shape (units,) for 'shared', (G, units) otherwise): q_norm is multiplied and k_norm divided by them,
    per group for the group's query heads and its key head. ``rotations`` ('unweighted' only), shape
    (G, n) with n the size of ``orthogonal_commutant_basis``: O_g = exp(sum_i c_gi A_i) multiplies the
    group's [W_Q^h; b_Q^h] and [W_K^g; b_K^g] on the right.
    """
    check_params(params, spec)
    if not spec.has_qk_norm:
        raise ValueError("move_qk_norm needs a layout with a QK-norm (qk_norm 'shared', 'per-head' or 'full')")
    out = dict(params)
    n_q, n_k = (1, 1) if spec.qk_norm == "full" else (spec.heads, spec.kv_heads)
    for name, scales, count, weight, bias in (("query_scales", query_scales, n_q, "W_Q", "b_Q"),
                                              ("key_scales", key_scales, n_k, "W_K", "b_K")):
        if scales is None:
            continue
        if spec.qk_norm_eps != 0:
            raise ValueError(f"{name}: scaling the projections is a symmetry only with qk_norm_eps = 0, "
                             f"this layout has {spec.qk_norm_eps:g}")
        scales = scales.to(params[weight])
        if tuple(scales.shape) != (count,) or not bool((scales > 0).all()):
            raise ValueError(f"{name} must be {count} positive numbers, got shape {tuple(scales.shape)}")
        per_head = scales.expand(params[weight].shape[0])
        out[weight] = params[weight] * per_head[:, None, None]
        if bias in params:
            out[bias] = params[bias] * per_head[:, None]
    if rotations is not None:
        basis = orthogonal_commutant_basis(spec).to(params["W_Q"])
        if spec.qk_norm != "unweighted" or tuple(rotations.shape) != (spec.kv_heads, basis.shape[0]):
            raise ValueError(f"rotations need qk_norm 'unweighted' and shape ({spec.kv_heads}, {basis.shape[0]})")
        turn = torch.linalg.matrix_exp(torch.einsum("gn,nab->gab", rotations.to(params["W_Q"]), basis))
        per_head = head_groups(spec)
        out["W_Q"], out["W_K"] = out["W_Q"] @ turn[per_head], out["W_K"] @ turn
        if "b_Q" in params:
            out["b_Q"] = (out["b_Q"][:, None, :] @ turn[per_head])[:, 0]
        if "b_K" in params:
            out["b_K"] = (out["b_K"][:, None, :] @ turn)[:, 0]
    if trade is not None:
        if spec.qk_norm == "unweighted":
            raise ValueError("an unweighted QK-norm has no weights to trade")
        units = qk_norm_units(spec)
        shape = (len(units),) if spec.qk_norm == "shared" else (spec.kv_heads, len(units))
        trade = trade.to(params["q_norm"])
        if tuple(trade.shape) != shape or not bool((trade > 0).all()):
            raise ValueError(f"trade must be positive factors of shape {shape}, got {tuple(trade.shape)}")
        factor = torch.ones(*shape[:-1], spec.head_dim, dtype=trade.dtype, device=trade.device)
        for u, coords in enumerate(units):
            factor[..., coords] = trade[..., u : u + 1]
        if spec.qk_norm == "shared":
            out["q_norm"], out["k_norm"] = params["q_norm"] * factor, params["k_norm"] / factor
        else:
            out["q_norm"] = params["q_norm"] * factor[head_groups(spec)]
            out["k_norm"] = params["k_norm"] / factor
    return out


def random_qk_norm_move(params: Params, spec: AttentionSpec, generator: torch.Generator,
                        scale: float = 0.3) -> dict[str, torch.Tensor]:
    """A random ``move_qk_norm``: factors exp(scale N(0, 1)); the projection scales only where eps = 0."""
    def draw(*shape: int) -> torch.Tensor:
        return (scale * torch.randn(*shape, generator=generator, dtype=torch.float64)).exp()

    n_units = len(qk_norm_units(spec))
    moves: dict[str, torch.Tensor] = {}
    if spec.qk_norm == "unweighted":
        n_gen = orthogonal_commutant_basis(spec).shape[0]
        moves["rotations"] = scale * torch.randn(spec.kv_heads, n_gen, generator=generator, dtype=torch.float64)
    else:
        moves["trade"] = draw(n_units) if spec.qk_norm == "shared" else draw(spec.kv_heads, n_units)
    if spec.qk_norm_eps == 0:
        n_q, n_k = (1, 1) if spec.qk_norm == "full" else (spec.heads, spec.kv_heads)
        moves.update(query_scales=draw(n_q), key_scales=draw(n_k))
    return move_qk_norm(params, spec, **moves)


def shift_key_bias(params: Params, spec: AttentionSpec, delta: torch.Tensor) -> dict[str, torch.Tensor]:
    """b_K -> b_K + delta, delta (G, d_k) zero on the rotated coordinates: invisible under plain softmax."""
    check_params(params, spec)
    _require_softmax(spec, "shifting the key bias")
    if spec.has_qk_norm:
        raise ValueError("shifting the key bias is no symmetry with a QK-norm: the bias sits inside the norm")
    if "b_K" not in params:
        raise ValueError("this layout has no key bias (bias flag without 'k')")
    if tuple(delta.shape) != tuple(params["b_K"].shape):
        raise ValueError(f"delta has shape {tuple(delta.shape)}, b_K has {tuple(params['b_K'].shape)}")
    if spec.rope_dims and delta[:, : spec.rope_dims].abs().max() > 0:
        raise ValueError("with RoPE after the bias, only the unrotated coordinates of b_K can be shifted")
    return dict(params, b_K=params["b_K"] + delta.to(params["b_K"]))


def trade_value_bias(params: Params, spec: AttentionSpec, delta: torch.Tensor) -> dict[str, torch.Tensor]:
    """b_V^g -> b_V^g + delta_g and b_O -> b_O - sum_h delta_{g(h)} W_O^h: invisible under plain softmax."""
    check_params(params, spec)
    _require_softmax(spec, "trading the value bias for the output bias")
    if "b_V" not in params or "b_O" not in params:
        raise ValueError("the trade needs both a value bias and an output bias (bias flag with 'v' and 'o')")
    if tuple(delta.shape) != tuple(params["b_V"].shape):
        raise ValueError(f"delta has shape {tuple(delta.shape)}, b_V has {tuple(params['b_V'].shape)}")
    delta = delta.to(params["b_V"])
    moved = torch.einsum("hv,hvd->d", delta[head_groups(spec)], params["W_O"])
    return dict(params, b_V=params["b_V"] + delta, b_O=params["b_O"] - moved)


def permute_heads(params: Params, spec: AttentionSpec, perm: list[int]) -> dict[str, torch.Tensor]:
    """New query head h is old head perm[h]; perm must move whole key/value groups together."""
    check_params(params, spec)
    if sorted(perm) != list(range(spec.heads)):
        raise ValueError(f"perm must be a permutation of 0..{spec.heads - 1}, got {perm}")
    group_map: dict[int, int] = {}
    for h, old in enumerate(perm):
        new_g, old_g = spec.group_of_head(h), spec.group_of_head(old)
        if group_map.setdefault(new_g, old_g) != old_g:
            raise ValueError(f"perm {perm} splits a key/value group: heads sharing K/V must move together")
    heads = torch.tensor(perm)
    groups = torch.tensor([group_map[g] for g in range(spec.kv_heads)])
    out = dict(params)
    for name in ("W_Q", "W_O", "b_Q", "sink"):
        if name in params:
            out[name] = params[name][heads]
    for name in ("W_K", "W_V", "b_K", "b_V"):
        if name in params:
            out[name] = params[name][groups]
    if spec.has_qk_norm and spec.qk_norm not in ("shared", "unweighted"):  # per-head norm weights move with their heads
        out["q_norm"], out["k_norm"] = params["q_norm"][heads], params["k_norm"][groups]
    return out


def _zeros_like(params: Params) -> dict[str, torch.Tensor]:
    return {name: torch.zeros_like(p) for name, p in params.items()}


def labelled_tangent_directions(params: Params, spec: AttentionSpec) -> list[tuple[str, dict[str, torch.Tensor]]]:
    """Derivatives of every symmetry at the identity, each with the part of the orbit it belongs to.

    Labels: 'query_key/g' and 'value_output/g' (the GL(d_k) and GL(d_v) factors of group g),
    'key_bias/g' (shifts of b_K^g), 'value_bias/g' (the b_V^g, b_O trade), 'value_bias' (b_V
    directions the layer cannot see when it has no b_O). With a QK-norm, instead of
    'query_key/g' and 'key_bias/g': 'norm_weights/g' (or 'norm_weights' for shared weights),
    the trades of ``move_qk_norm``, and with eps = 0 'query_scale/h' and 'key_scale/g'
    ('query_scale' and 'key_scale' with 'full').
    With a learned sink, b_Q, b_K and d_k > d_model: 'sink_corner/h' (``_sink_corner_directions``).
    """
    check_params(params, spec)
    directions: list[tuple[str, dict[str, torch.Tensor]]] = []
    per_head = head_groups(spec).tolist()
    if spec.has_qk_norm:
        directions += _qk_norm_directions(params, spec)
    for g in range(spec.kv_heads):
        heads = [h for h in range(spec.heads) if per_head[h] == g]
        for a in ([] if spec.has_qk_norm else lie_algebra_basis(spec).to(params["W_Q"])):
            d = _zeros_like(params)
            d["W_Q"][heads] = params["W_Q"][heads] @ a
            d["W_K"][g] = -params["W_K"][g] @ a.T
            if "b_Q" in params:
                d["b_Q"][heads] = params["b_Q"][heads] @ a
            if "b_K" in params:
                d["b_K"][g] = -params["b_K"][g] @ a.T
            directions.append((f"query_key/{g}", d))
        for i in range(spec.v_head_dim):
            for j in range(spec.v_head_dim):
                b = torch.zeros(spec.v_head_dim, spec.v_head_dim).to(params["W_V"])
                b[i, j] = 1.0
                d = _zeros_like(params)
                d["W_V"][g] = params["W_V"][g] @ b
                d["W_O"][heads] = -b @ params["W_O"][heads]
                if "b_V" in params:
                    d["b_V"][g] = params["b_V"][g] @ b
                directions.append((f"value_output/{g}", d))
        if spec.shift_invariant and "b_K" in params and not spec.has_qk_norm:
            for i in range(spec.rope_dims, spec.head_dim):
                d = _zeros_like(params)
                d["b_K"][g, i] = 1.0
                directions.append((f"key_bias/{g}", d))
        if spec.shift_invariant and "b_V" in params and "b_O" in params:
            for i in range(spec.v_head_dim):
                d = _zeros_like(params)
                d["b_V"][g, i] = 1.0
                d["b_O"] = -params["W_O"][heads, i, :].sum(0)
                directions.append((f"value_bias/{g}", d))
    if spec.shift_invariant and "b_V" in params and "b_O" not in params:
        directions += [("value_bias", d) for d in _value_bias_null_directions(params, spec)]
    return directions + _sink_corner_directions(params, spec)


def _sink_corner_directions(params: Params, spec: AttentionSpec) -> list[tuple[str, dict[str, torch.Tensor]]]:
    """'sink_corner/h': where ``counts.sink_corner_trade`` counts it, head h's learned sink logit trades with its scores' constant.

    With b_Q, b_K and d_k > d_model (no RoPE, no QK-norm) the d_k x (d + 1) matrix [W_K^g; b_K^g]^T has
    full column rank, so some beta has beta W_K^g^T = 0 and beta . b_K^g = 1 (the last row of its
    pseudo-inverse). Moving b_Q^h by beta adds 1 / sqrt(d_k) to every score of head h, which the sink
    logit, moved by the same amount, absorbs: the corner of the query/key product against the sink.
    """
    if not sink_corner_trade(spec):
        return []
    directions = []
    for h in range(spec.heads):
        g = spec.group_of_head(h)
        keys = torch.cat([params["W_K"][g], params["b_K"][g][None, :]])  # (d + 1, d_k)
        d = _zeros_like(params)
        d["b_Q"][h] = torch.linalg.pinv(keys.T)[-1]
        d["sink"][h] = spec.head_dim ** -0.5
        directions.append((f"sink_corner/{h}", d))
    return directions


def _qk_norm_directions(params: Params, spec: AttentionSpec) -> list[tuple[str, dict[str, torch.Tensor]]]:
    """The derivatives of ``move_qk_norm`` at the identity, labelled (see ``labelled_tangent_directions``)."""
    directions: list[tuple[str, dict[str, torch.Tensor]]] = []
    units = qk_norm_units(spec)
    groups = [None] if spec.qk_norm == "shared" else list(range(spec.kv_heads))
    per_head = head_groups(spec)
    if spec.qk_norm == "unweighted":
        groups = []  # no weights to trade; the rotations instead
        for g in range(spec.kv_heads):
            heads = per_head == g
            for a in orthogonal_commutant_basis(spec).to(params["W_Q"]):
                d = _zeros_like(params)
                d["W_Q"][heads] = params["W_Q"][heads] @ a
                d["W_K"][g] = params["W_K"][g] @ a
                if "b_Q" in params:
                    d["b_Q"][heads] = params["b_Q"][heads] @ a
                if "b_K" in params:
                    d["b_K"][g] = params["b_K"][g] @ a
                directions.append((f"rotations/{g}", d))
    for g in groups:
        for coords in units:
            d = _zeros_like(params)
            if g is None:
                d["q_norm"][coords] = params["q_norm"][coords]
                d["k_norm"][coords] = -params["k_norm"][coords]
            else:
                heads = per_head == g
                for c in coords:
                    d["q_norm"][heads, c] = params["q_norm"][heads, c]
                    d["k_norm"][g, c] = -params["k_norm"][g, c]
            directions.append(("norm_weights" if g is None else f"norm_weights/{g}", d))
    if spec.qk_norm_eps != 0:
        return directions
    full = spec.qk_norm == "full"
    for weight, bias, label, n in (("W_Q", "b_Q", "query_scale", spec.heads), ("W_K", "b_K", "key_scale", spec.kv_heads)):
        for h in [slice(None)] if full else range(n):
            d = _zeros_like(params)
            d[weight][h] = params[weight][h]
            if bias in params:
                d[bias][h] = params[bias][h]
            directions.append((label if full else f"{label}/{h}", d))
    return directions


def tangent_directions(params: Params, spec: AttentionSpec) -> list[dict[str, torch.Tensor]]:
    """Derivatives of every symmetry at the identity, one parameter-shaped dict per generator."""
    return [d for _, d in labelled_tangent_directions(params, spec)]


def _value_bias_null_directions(params: Params, spec: AttentionSpec) -> list[dict[str, torch.Tensor]]:
    """Without b_O: the b_V = u that c = sum_g u_g S_g (S_g = sum of the group's W_O^h) cannot see."""
    per_head = head_groups(spec)
    stacked = torch.cat([params["W_O"][per_head == g].sum(0) for g in range(spec.kv_heads)])  # (G d_v, d)
    _, sv, vh = torch.linalg.svd(stacked.T, full_matrices=True)
    rank = numerical_rank(sv)
    directions = []
    for u in vh[rank:]:
        d = _zeros_like(params)
        d["b_V"] = u.reshape(spec.kv_heads, spec.v_head_dim)
        directions.append(d)
    return directions


def orbit_tangent(params: Params, spec: AttentionSpec, rel_tol: float = DEFAULT_ZERO_TOL) -> torch.Tensor:
    """Orthonormal basis (P, k) of the span of ``tangent_directions``, flattened in parameter order.

    The generators are linearly dependent where a head is wider than d_model (then some M
    fix W_Q and W_K both); the span, found by an SVD whose rank ``attnid.rank.numerical_rank``
    decides with relative tolerance ``rel_tol``, is what counts.
    """
    return orthonormal_span(tangent_directions(params, spec), params, rel_tol)


def orthonormal_span(directions: list[dict[str, torch.Tensor]], params: Params,
                     rel_tol: float = DEFAULT_ZERO_TOL) -> torch.Tensor:
    """Orthonormal basis (P, k) of the span of parameter-shaped directions, flattened like ``params``.

    The leading left singular vectors of the stacked directions, as many as their numerical
    rank. (A QR shortcut for independent generators used to skip the SVD; at d_model = 32,
    4 heads, P = 4096 it saved about 30 ms of 155, next to about a minute for the SVD of
    that layer's Jacobian, so one rank rule won.)
    """
    if not directions:
        return torch.zeros(sum(p.numel() for p in params.values()), 0, dtype=params["W_Q"].dtype)
    mat = torch.stack([flatten(d) for d in directions], dim=1)
    u, s, _ = torch.linalg.svd(mat, full_matrices=False)
    return u[:, : numerical_rank(s, rel_tol)]


def split_direction(direction: torch.Tensor, basis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(along, across): the orthogonal projection of a flat direction onto span(basis) and the remainder."""
    if direction.ndim != 1 or direction.shape[0] != basis.shape[0]:
        raise ValueError(f"direction must be a vector of length {basis.shape[0]}, got shape {tuple(direction.shape)}")
    along = basis @ (basis.T @ direction)
    return along, direction - along


