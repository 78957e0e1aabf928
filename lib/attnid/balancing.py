"""Conserved quantities of gradient flow and the balanced point of a symmetry orbit (chapter 12).

Along the orbit of ``attnid.symmetry`` the Gram matrices of each factor pair change by congruence;
their differences (projected on the commutant) are what gradient flow conserves, and the balanced
point is where each pair's Grams agree. ``balance`` moves a point there without changing the function.
"""

from __future__ import annotations
import torch
from attnid.layer import check_params
from attnid.rank import is_invertible
from attnid.spec import AttentionSpec, Params
from attnid.symmetry import GroupElement, head_groups, refuse_qk_norm, apply_group, lie_algebra_basis


class SingularGramError(ValueError):
    """A factor's Gram matrix is singular (its columns collapsed onto fewer directions): no balanced point exists."""


def grams(params: Params, spec: AttentionSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per group: (sum_h W_Q^hT W_Q^h + b_Q^hT b_Q^h, W_K^T W_K + b_K^T b_K, W_V^T W_V + b_V^T b_V, sum_h W_O^h W_O^hT).

    The biases enter as one more row of the weight matrix (an input coordinate fixed at one),
    which is how the group acts on them.
    """
    per_head = head_groups(spec)
    g = spec.kv_heads
    wq, wk, wv, wo = params["W_Q"], params["W_K"], params["W_V"], params["W_O"]
    if "b_Q" in params:
        wq = torch.cat([wq, params["b_Q"][:, None, :]], dim=1)
    if "b_K" in params:
        wk = torch.cat([wk, params["b_K"][:, None, :]], dim=1)
    if "b_V" in params:
        wv = torch.cat([wv, params["b_V"][:, None, :]], dim=1)
    gram_q = torch.zeros(g, spec.head_dim, spec.head_dim, dtype=wq.dtype, device=wq.device)
    gram_q.index_add_(0, per_head.to(wq.device), wq.transpose(-1, -2) @ wq)
    gram_o = torch.zeros(g, spec.v_head_dim, spec.v_head_dim, dtype=wo.dtype, device=wo.device)
    gram_o.index_add_(0, per_head.to(wo.device), wo @ wo.transpose(-1, -2))
    return gram_q, wk.transpose(-1, -2) @ wk, wv.transpose(-1, -2) @ wv, gram_o


def project_commutant(mats: torch.Tensor, spec: AttentionSpec) -> torch.Tensor:
    """Orthogonal projection of (..., d_k, d_k) matrices onto the matrices commuting with RoPE (identity without RoPE)."""
    if spec.rope_dims == 0:
        return mats
    basis = lie_algebra_basis(spec).to(mats)  # orthogonal in the Frobenius product, entries 0 and +-1
    norms = (basis * basis).sum(dim=(-1, -2))
    coeffs = torch.einsum("...ab,nab->...n", mats, basis) / norms
    return torch.einsum("...n,nab->...ab", coeffs, basis)


def conserved_quantities(params: Params, spec: AttentionSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """(C_QK (G, d_k, d_k), C_VO (G, d_v, d_v)): constant along gradient flow of any loss of the layer's output.

    C_QK = Gram(W_Q; b_Q) - Gram(W_K; b_K) summed over the group's query heads, projected onto
    the RoPE commutant (the Lie algebra the symmetry uses); C_VO = Gram(W_V; b_V) - sum_h W_O^h W_O^hT.
    Noether's argument: the loss is invariant along the orbit, so the gradient is orthogonal to
    every tangent direction, and that orthogonality is exactly d/dt C = 0 under gradient flow.
    """
    refuse_qk_norm(spec, "the conservation of C_QK")
    gram_q, gram_k, gram_v, gram_o = grams(params, spec)
    return project_commutant(gram_q - gram_k, spec), gram_v - gram_o


def _balancing_matrix(gram_a: torch.Tensor, gram_b: torch.Tensor) -> torch.Tensor:
    """M minimising ||A M||^2 + ||B M^-T||^2 for Grams P = A^T A, Q = B^T B: M = X^(1/2), X = P^-1 # Q.

    At the minimum M^T P M = M^-1 Q M^-T (both sides equal P^(1/2)-conjugated geometric means),
    i.e. the moved factors have equal Grams: the balanced point.
    """
    evals, evecs = torch.linalg.eigh(gram_a)
    if not is_invertible(evals):  # eigenvalues of a Gram are its singular values; judged per group
        raise SingularGramError("a Gram matrix is singular: the factor has dependent columns, so no balanced point exists")
    p_half = evecs @ torch.diag_embed(evals.sqrt()) @ evecs.transpose(-1, -2)
    p_inv_half = evecs @ torch.diag_embed(evals.rsqrt()) @ evecs.transpose(-1, -2)
    middle_vals, middle_vecs = torch.linalg.eigh(p_half @ gram_b @ p_half)
    middle = middle_vecs @ torch.diag_embed(middle_vals.clamp_min(0).sqrt()) @ middle_vecs.transpose(-1, -2)
    x = p_inv_half @ middle @ p_inv_half
    x_vals, x_vecs = torch.linalg.eigh((x + x.transpose(-1, -2)) / 2)
    return x_vecs @ torch.diag_embed(x_vals.sqrt()) @ x_vecs.transpose(-1, -2)


def _balancing_query_key(gram_q: torch.Tensor, gram_k: torch.Tensor, spec: AttentionSpec) -> torch.Tensor:
    """Per group, the M in the RoPE commutant that balances query and key: blockwise on the commutant's blocks."""
    r, half = spec.rope_dims, spec.rope_dims // 2
    m = torch.zeros_like(gram_q)
    for i in range(half):  # each rotated pair: a scalar r_i (times the identity); balance the traces
        idx = [i, i + half]
        tq = gram_q[:, idx][:, :, idx].diagonal(dim1=-2, dim2=-1).sum(-1)
        tk = gram_k[:, idx][:, :, idx].diagonal(dim1=-2, dim2=-1).sum(-1)
        scale = (tk / tq) ** 0.25
        m[:, i, i] = m[:, i + half, i + half] = scale
    if r < spec.head_dim:
        m[:, r:, r:] = _balancing_matrix(gram_q[:, r:, r:], gram_k[:, r:, r:])
    return m


def balancing_element(params: Params, spec: AttentionSpec) -> GroupElement:
    """The group element that moves ``params`` to the balanced point of its orbit.

    Balanced: the projected C_QK and C_VO vanish; it is the point of least squared norm on
    the orbit (the norm's derivative along the tangent A is 2 <A, C>). Closed form per group:
    M = (P^-1 # Q)^(1/2) with # the matrix geometric mean, blockwise on the RoPE commutant.
    """
    check_params(params, spec)
    refuse_qk_norm(spec, "balancing")
    gram_q, gram_k, gram_v, gram_o = grams(params, spec)
    return GroupElement(_balancing_query_key(gram_q, gram_k, spec), _balancing_matrix(gram_v, gram_o))


def balance(params: Params, spec: AttentionSpec) -> dict[str, torch.Tensor]:
    """``params`` moved along the orbit to its balanced point: the same function, C_QK = C_VO = 0."""
    return apply_group(params, spec, balancing_element(params, spec))
