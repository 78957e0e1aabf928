"""Invisible shares of an update in closed form, for attention layers too large for ``attnid.train.spans``.

``training.invisible_shares`` orthonormalises the orbit's tangent directions one by one: about
H (d_k^2 + d_v^2) directions of P entries each. For one layer of all-MiniLM-L6-v2 (P = 591,360,
25,344 directions) that is far beyond a laptop. Here nothing of size P x n is formed. The tangent
space at a point is the image of a linear map T of small matrices (one d_k x d_k matrix A_g and one
d_v x d_v matrix B_g per key/value group, plus the biases' trades), and the share of u is
||P u|| / ||u|| with ||P u||^2 = <x, T^T u>, x a least-squares solution of T^T T x = T^T u.

* Queries and keys of group g: T(A) = (W~_Q^h A for the heads h of g, -W~_K^g A^T), W~ a weight with
  its bias as one more row. T^T T is the Sylvester operator A -> M A + A N with M = sum_h W~_Q^h^T W~_Q^h
  and N = W~_K^g^T W~_K^g; in the eigenbases of M and N it is diagonal, with eigenvalues
  lambda_i + sigma_j, so its pseudo-inverse costs two d_k x d_k eigendecompositions (``sylvester``).
* The key bias, with no RoPE, is dead on all of its coordinates: its share is its own norm, and in the
  total the query/key solve uses the plain W_K^g (the bias row of the tangent lies inside it).
* Values and outputs: the same with W~_V^g and N = sum_h W_O^h W_O^h^T. With both b_V and b_O, the
  trade v -> (b_V + v, b_O - v M) (M's row (g, i): sum over the heads h of g of W_O^h[i]) shares the b_V
  coordinates with the value/output tangent; the total eliminates B by its Schur complement, a
  (G d_v) x (G d_v) system.

The rank rule is ``attnid.rank``'s rule 2: the singular values of T are sqrt(lambda_i + sigma_j), and
one counts as zero when it is at most ``rel_tol`` times the largest. Supported: plain softmax
attention, with or without GQA and biases, without RoPE, QK-norm or a learned sink, and without a
value bias lacking an output bias (``training.invisible_shares`` covers those, on small layers).
tests/test_tangent.py checks every share against ``training.invisible_shares`` on small layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnid.rank import DEFAULT_ZERO_TOL
from attnid.spec import AttentionSpec, Params
from attnid.symmetry import head_groups


def supported(spec: AttentionSpec) -> str:
    """'' when ``shares`` handles this layout, else the reason it does not."""
    if not spec.shift_invariant or spec.sink_learned:
        return "the closed form covers plain softmax attention only"
    if spec.rope_dims:
        return "the closed form does not cover RoPE (its orbit lives in the rotations' commutant)"
    if spec.has_qk_norm:
        return "the closed form does not cover a QK-norm"
    if spec.has_bias("v") and not spec.has_bias("o"):
        return "the closed form does not cover a value bias without an output bias"
    return ""


@dataclass(frozen=True)
class Sylvester:
    """The pseudo-inverse of X -> M X + X N (M, N symmetric positive semi-definite), from their eigendecompositions."""

    u: torch.Tensor
    v: torch.Tensor
    inverse: torch.Tensor  # 1 / (lambda_i + sigma_j), 0 where rule 2 counts the singular value as zero

    @classmethod
    def of(cls, m: torch.Tensor, n: torch.Tensor, rel_tol: float = DEFAULT_ZERO_TOL) -> "Sylvester":
        lam, u = torch.linalg.eigh(m)
        sig, v = torch.linalg.eigh(n)
        denom = lam[:, None] + sig[None, :]
        keep = denom > rel_tol ** 2 * denom.max().clamp_min(torch.finfo(denom.dtype).tiny)
        return cls(u, v, torch.where(keep, 1.0 / torch.where(keep, denom, 1.0), 0.0))

    def solve(self, c: torch.Tensor) -> torch.Tensor:
        """The minimum-norm least-squares X of M X + X N = C (C may carry leading batch dimensions)."""
        return self.u @ ((self.u.T @ c @ self.v) * self.inverse) @ self.v.T


def sylvester(m: torch.Tensor, n: torch.Tensor, c: torch.Tensor, rel_tol: float = DEFAULT_ZERO_TOL) -> torch.Tensor:
    """The minimum-norm least-squares X of M X + X N = C, for symmetric positive semi-definite M and N."""
    return Sylvester.of(m, n, rel_tol).solve(c)


def _with_row(w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """[W; b]: a (d, k) weight with its bias as row d (W itself when there is no bias)."""
    return w if b is None else torch.cat([w, b[None]], dim=0)


def _qk_solve(params: Params, update: Params, spec: AttentionSpec, g: int, heads: list[int], key_row: bool,
              rel_tol: float) -> float:
    """||projection||^2 of the update on group g's query/key tangent (key bias row included or not)."""
    bq, bk = params.get("b_Q"), params.get("b_K")
    ubq, ubk = update.get("b_Q"), update.get("b_K")
    q = [_with_row(params["W_Q"][h], None if bq is None else bq[h]) for h in heads]
    uq = [_with_row(update["W_Q"][h], None if ubq is None else ubq[h]) for h in heads]
    k = _with_row(params["W_K"][g], bk[g] if key_row and bk is not None else None)
    uk = _with_row(update["W_K"][g], ubk[g] if key_row and ubk is not None else None)
    m = sum(x.T @ x for x in q)
    c = sum(x.T @ y for x, y in zip(q, uq, strict=True)) - uk.T @ k
    a = sylvester(m, k.T @ k, c, rel_tol)
    return float((a * c).sum())


def _vo_system(params: Params, update: Params, g: int, heads: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(M, N, C) of group g's value/output normal equations, the value bias as a row of W~_V."""
    bv, ubv = params.get("b_V"), update.get("b_V")
    v = _with_row(params["W_V"][g], None if bv is None else bv[g])
    uv = _with_row(update["W_V"][g], None if ubv is None else ubv[g])
    n = sum(params["W_O"][h] @ params["W_O"][h].T for h in heads)
    c = v.T @ uv - sum(update["W_O"][h] @ params["W_O"][h].T for h in heads)
    return v.T @ v, n, c


def _trade_system(params: Params, update: Params, groups: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(T_v^T T_v, T_v^T u) of the value-bias trade v -> (b_V + v, b_O - v M), v flattened by (group, i)."""
    m = torch.cat([params["W_O"][heads].sum(0) for heads in groups])  # (G d_v, d)
    gram = torch.eye(m.shape[0], dtype=m.dtype) + m @ m.T
    return gram, update["b_V"].reshape(-1) - m @ update["b_O"]


def _vo_total(params: Params, update: Params, groups: list[list[int]], rel_tol: float) -> float:
    """||projection||^2 on the value/output tangents of every group together with the value-bias trade."""
    systems = [_vo_system(params, update, g, heads) for g, heads in enumerate(groups)]
    solvers = [Sylvester.of(m, n, rel_tol) for m, n, _ in systems]
    if "b_V" not in params or "b_O" not in params:
        return sum(float((op.solve(c) * c).sum()) for op, (_, _, c) in zip(solvers, systems, strict=True))
    gram, rhs_v = _trade_system(params, update, groups)
    dv = params["b_V"].shape[1]
    schur, shift = gram.clone(), rhs_v.clone()
    for g, (op, (_, _, c)) in enumerate(zip(solvers, systems, strict=True)):
        bv, rows = params["b_V"][g], slice(g * dv, (g + 1) * dv)
        # K_g[:, k] = b_V^T S_g^+(b_V e_k^T): what the coupling through the b_V coordinates takes off the trade's Gram
        units = bv[None, :, None] * torch.eye(dv, dtype=bv.dtype)[:, None, :]  # (k, i, j) = b_V[i] [j == k]
        schur[rows, rows] -= (bv @ op.solve(units)).T
        shift[rows] -= bv @ op.solve(c)
    v = torch.linalg.lstsq(schur, shift[:, None], rcond=rel_tol ** 2).solution[:, 0]
    total = float(v @ rhs_v)
    for g, (op, (_, _, c)) in enumerate(zip(solvers, systems, strict=True)):
        total += float((op.solve(c - torch.outer(params["b_V"][g], v[g * dv:(g + 1) * dv])) * c).sum())
    return total


def shares(update: Params, params: Params, spec: AttentionSpec, rel_tol: float = DEFAULT_ZERO_TOL) -> dict[str, float]:
    """The keys of ``training.invisible_shares`` other than the per-group ones, in closed form (module docstring).

    'total' (the whole tangent space), 'query_key', 'value_output', and 'key_bias' and 'value_bias' when
    the layout has them. The point and the update are taken in float64. Raises ValueError for a
    layout outside ``supported``.
    """
    reason = supported(spec)
    if reason:
        raise ValueError(f"{spec.describe()}: {reason}; use attnid.train.training.invisible_shares on small layers")
    p = {k: t.detach().to("cpu", torch.float64) for k, t in params.items()}
    u = {k: t.detach().to("cpu", torch.float64) for k, t in update.items()}
    norm2 = sum(float((t ** 2).sum()) for t in u.values())
    groups_of = head_groups(spec).tolist()
    groups = [[h for h in range(spec.heads) if groups_of[h] == g] for g in range(spec.kv_heads)]
    keys = ["total", "query_key", "value_output"] + [k for k, b in (("key_bias", "b_K"), ("value_bias", "b_V")) if b in p]
    if not norm2 > 0:
        return dict.fromkeys(keys, 0.0)
    key_bias = float((u["b_K"] ** 2).sum()) if "b_K" in u else 0.0
    squared = {
        "query_key": sum(_qk_solve(p, u, spec, g, heads, True, rel_tol) for g, heads in enumerate(groups)),
        "value_output": sum(float((sylvester(*s, rel_tol) * s[2]).sum())
                            for s in (_vo_system(p, u, g, heads) for g, heads in enumerate(groups))),
        "total": sum(_qk_solve(p, u, spec, g, heads, False, rel_tol) for g, heads in enumerate(groups))
        + key_bias + _vo_total(p, u, groups, rel_tol),
    }
    if "b_K" in p:
        squared["key_bias"] = key_bias
    if "b_V" in p:
        gram, rhs = _trade_system(p, u, groups)
        squared["value_bias"] = float(rhs @ torch.linalg.solve(gram, rhs))
    return {k: min(1.0, max(0.0, squared[k] / norm2)) ** 0.5 for k in keys}
