"""One block of the structured certificate's Gram matrix, from two factors, without forming the Jacobian.

A ``Factor`` is the Jacobian of the layer's output with respect to one parameter tensor, kept as
the product of a per-token left part and a right part (``attnid.structured`` explains the algebra);
``gram_block`` computes F^T G from the parts, choosing the cheaper order and cutting the token
axis into chunks of at most ``CHUNK_ELEMENTS`` float64 elements.
"""

from __future__ import annotations
from dataclasses import dataclass
import torch


CHUNK_ELEMENTS = 2**24  # float64 elements of the largest temporary of one Gram block (128 MiB)


@dataclass(frozen=True)
class Factor:
    """One parameter tensor's Jacobian, per token: J_i[c, flat] = sum_t L[i, t, gamma, alpha] R[i, t, gamma, beta, c].

    ``order`` says how (gamma, alpha, beta) map to the tensor's flat (row-major) index:
    'gab' when the flat order is (gamma, alpha, beta), 'gba' when it is (gamma, beta, alpha).
    """

    name: str
    left: torch.Tensor  # (tokens, T, Gamma, A)
    right: torch.Tensor  # (tokens, T, Gamma, B, d)
    order: str
    identity_right: bool = False  # R is the identity (W_O, b_O): J_f is L times delta(c, c')
    fixed_right: bool = False  # R is the same for every token (W_V, b_V, W_O, b_O)

    @property
    def size(self) -> int:
        _, _, gamma, a = self.left.shape
        return gamma * a * self.right.shape[3]


def _to_flat(block: torch.Tensor, order: str, order2: str) -> torch.Tensor:
    """(Gamma, Gamma', A, A', B, B') -> (flat, flat') in the tensors' own orders."""
    rows = (0, 2, 4) if order == "gab" else (0, 4, 2)
    cols = (1, 3, 5) if order2 == "gab" else (1, 5, 3)
    out = block.permute(*rows, *cols)
    n_rows = out.shape[0] * out.shape[1] * out.shape[2]
    return out.reshape(n_rows, -1)


def is_explicit(f: Factor) -> bool:
    """A tensor stored as its whole Jacobian row per token (L = 1, one term, no head index)."""
    return f.left.shape[1:] == (1, 1, 1)


def _explicit_rows(f: Factor, tokens: slice) -> torch.Tensor:
    """J_f on a range of tokens as a (tokens * d_model, size) matrix in the tensor's flat order."""
    rows = torch.einsum("itga,itgbc->icgab", f.left[tokens], f.right[tokens])
    if f.order == "gba":
        rows = rows.transpose(-1, -2)
    return rows.reshape(-1, f.size)


def shared_left(f: Factor) -> bool:
    """L is the same for every head index (it was expanded along gamma)."""
    return f.left.shape[2] == 1 or f.left.stride(2) == 0


def fixed_right(f: Factor) -> bool:
    """R is the same for every token (W_O and the identity), as ``token_factors`` marks it."""
    return f.fixed_right


def _token_chunks(tokens: int, per_token: int) -> list[slice]:
    step = max(1, CHUNK_ELEMENTS // max(per_token, 1))
    return [slice(start, start + step) for start in range(0, tokens, step)]


def _costs(f: Factor, g: Factor) -> tuple[int, int]:
    """(factored, explicit) multiply-adds per token for the block of f and g (``gram_block`` picks the cheaper)."""
    _, t1, c1, a1 = f.left.shape
    _, t2, c2, a2 = g.left.shape
    b1, b2, d = f.right.shape[3], g.right.shape[3], f.right.shape[4]
    factored = t1 * t2 * (c1 * b1 * c2 * b2 * d + c1 * c2 * a1 * a2 * b1 * b2)
    explicit = d * f.size * g.size + d * (t1 * f.size + t2 * g.size)
    return factored, explicit


def _explicit_by_fixed(f: Factor, g: Factor) -> torch.Tensor:
    """J_f^T J_g when R_g is the same for every token: sum over tokens of J_f's rows times L_g, then R_g over (t, c)."""
    tokens, t2, c2, a2 = g.left.shape
    d = g.right.shape[4]
    moment = f.left.new_zeros(d * f.size, t2 * c2 * a2)
    for sl in _token_chunks(tokens, d * f.size + t2 * c2 * a2):
        rows = _explicit_rows(f, sl).reshape(-1, d * f.size)  # (tokens, d P_f): token i's row block, c-major
        moment.addmm_(rows.T, g.left[sl].reshape(-1, t2 * c2 * a2))
    moment = moment.reshape(d, f.size, t2, c2, a2)
    out = torch.einsum("cftga,tgbc->fgab", moment, g.right[0])  # (P_f, Gamma, A, B)
    if g.order == "gba":
        out = out.transpose(2, 3)
    return out.reshape(f.size, g.size)


def _by_identity(f: Factor, g: Factor) -> torch.Tensor:
    """J_f^T J_g when R_g is the identity (W_O, b_O): sum_{i, t} L_f[t, gamma, a] L_g[gamma', a'] R_f[t, gamma, b, c'].

    One matrix product per head index gamma of f, with the tokens (and terms) as inner dimension.
    """
    tokens, t1, c1, a1 = f.left.shape
    _, _, c2, a2 = g.left.shape
    b1, d = f.right.shape[3], f.right.shape[4]
    lg = g.left[:, 0].reshape(tokens, 1, 1, c2 * a2)
    out = f.left.new_empty(c1, a1, c2 * a2, b1 * d)
    for gamma in range(c1):
        pairs = (f.left[:, :, gamma, :, None] * lg).reshape(tokens * t1, a1 * c2 * a2)
        out[gamma] = (pairs.T @ f.right[:, :, gamma].reshape(tokens * t1, b1 * d)).reshape(a1, c2 * a2, b1 * d)
    out = out.reshape(c1, a1, c2, a2, b1, d).permute(0, 2, 1, 3, 4, 5)  # (Gamma, Gamma', A, A', B, B' = c')
    return _to_flat(out, f.order, g.order)


def gram_block(f: Factor, g: Factor) -> torch.Tensor:
    """sum over tokens of J_f^T J_g for two tensors' factors, as a (size_f, size_g) matrix in their flat orders.

    Several ways to the same sum, by what the factors allow: R fixed over tokens in both (sum
    the L products over tokens first, one matrix product), R the identity in one
    (``_by_identity``), an explicit tensor against a token-fixed R (``_explicit_by_fixed``), L
    shared by every head index in both or in one (one matrix product over tokens), the general
    batched product, or the explicit rows (J_f^T J_g from the rows themselves, when the factors
    are too thin to save work: ``_costs``). The tests compare every path with the dense product.
    """
    tokens, t1, c1, a1 = f.left.shape
    _, t2, c2, a2 = g.left.shape
    b1, b2 = f.right.shape[3], g.right.shape[3]
    if fixed_right(f) and fixed_right(g):
        lam = torch.einsum("tgbc,sGBc->tgbsGB", f.right[0], g.right[0])
        ll = (f.left.reshape(tokens, -1).T @ g.left.reshape(tokens, -1)).reshape(t1, c1, a1, t2, c2, a2)
        out = torch.einsum("tgasGA,tgbsGB->gGaAbB", ll, lam)
        return _to_flat(out, f.order, g.order)
    if f.identity_right and not g.identity_right:
        return gram_block(g, f).T
    if g.identity_right and not f.identity_right:
        return _by_identity(f, g)
    if fixed_right(f) and is_explicit(g):
        return gram_block(g, f).T
    if fixed_right(g) and is_explicit(f):
        return _explicit_by_fixed(f, g)
    factored, explicit = _costs(f, g)
    if explicit < factored or (is_explicit(f) and is_explicit(g)):
        out = f.left.new_zeros(f.size, g.size)
        for sl in _token_chunks(tokens, f.right.shape[4] * (f.size + g.size)):
            out.addmm_(_explicit_rows(f, sl).T, _explicit_rows(g, sl))
        return out
    if shared_left(f) and shared_left(g):
        lf, lg = f.left[:, :, 0], g.left[:, :, 0]  # (tokens, T, A)
        out = f.left.new_zeros(a1 * a2, c1 * b1 * c2 * b2)
        for sl in _token_chunks(tokens, t1 * t2 * (a1 * a2 + c1 * b1 * c2 * b2)):
            lam = torch.einsum("itgbc,isGBc->itsgbGB", f.right[sl], g.right[sl])
            ll = torch.einsum("ita,isA->itsaA", lf[sl], lg[sl])
            out.addmm_(ll.reshape(-1, a1 * a2).T, lam.reshape(-1, c1 * b1 * c2 * b2))
        out = out.reshape(a1, a2, c1, b1, c2, b2).permute(2, 4, 0, 1, 3, 5)
        return _to_flat(out, f.order, g.order)
    if shared_left(g):
        return gram_block(g, f).T
    if shared_left(f):  # L_f is one vector per token for every head: contract it last, in one matrix product
        lf = f.left[:, :, 0].reshape(-1, a1)  # (tokens T1, A)
        out = f.left.new_zeros(a1, c1 * b1 * c2 * a2 * b2)
        for sl in _token_chunks(tokens, t1 * t2 * c1 * b1 * c2 * b2 + t1 * c1 * b1 * c2 * a2 * b2):
            lam = torch.einsum("itgbc,isGBc->itgbsGB", f.right[sl], g.right[sl])
            mixed = torch.einsum("itgbsGB,isGA->itgbGAB", lam, g.left[sl])
            out.addmm_(lf[sl.start * t1: sl.stop * t1].T, mixed.reshape(-1, out.shape[1]))
        out = out.reshape(a1, c1, b1, c2, a2, b2).permute(1, 3, 0, 4, 2, 5)
        return _to_flat(out, f.order, g.order)
    out = f.left.new_zeros(c1 * c2, a1 * a2, b1 * b2)
    for sl in _token_chunks(tokens, c1 * c2 * t1 * t2 * max(a1 * a2, b1 * b2)):
        lam = torch.einsum("itgbc,isGBc->gGitsbB", f.right[sl], g.right[sl]).reshape(c1 * c2, -1, b1 * b2)
        ll = torch.einsum("itga,isGA->gGitsaA", f.left[sl], g.left[sl]).reshape(c1 * c2, -1, a1 * a2)
        out.baddbmm_(ll.transpose(1, 2), lam)
    return _to_flat(out.reshape(c1, c2, a1, a2, b1, b2), f.order, g.order)
