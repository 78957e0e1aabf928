"""Orthonormal bases of spans of parameter directions, kept as coefficients on the directions.

The invisible share of an update u is ||B^T u|| / ||u||, B an orthonormal basis of the span of
some directions A = (a_1 .. a_n), each a flattened parameter-shaped move (P entries). Forming B by
an SVD of the dense (P, n) matrix costs O(P n^2) flops at LAPACK's slow, half matrix-vector pace;
for a layer of the real-text model (P = 12,480, n = 704) that was about 7 s of 17 per share
measurement in the portable numeric environment. Here B is never formed: B = A C for an (n, r)
coefficient matrix C, so B^T u = C^T (A^T u), and A is sparse (a move touches one head's block),
so A^T u and the Gram matrix G = A^T A cost next to nothing.

How C is found, and the rank rule (``attnid.rank``, rule 2: a singular value s counts as zero
when s <= ``rel_tol`` s_max):

* **Gram path.** G = V diag(lam) V^T (``eigh``). The eigenvalues split into *large* ones,
  lam >= ``GRAM_PATH_MIN``^2 lam_max, and j *small* ones. Rule 2 keeps the singular values of the
  large ones: they are at least about ``GRAM_PATH_MIN`` s_max, and ``rel_tol`` is at most a tenth of
  that. For the small ones Courant-Fischer bounds the j smallest singular values of A by
  ||A V_small||_2 / sigma_min(V_small) (V_small's columns are orthonormal up to round-off). That
  product is computed from A, not through G; its round-off is at most gamma_n || |A| |V_small| ||_F
  (gamma_n = n u / (1 - n u), u the unit round-off, n the number of directions), and the bound used
  adds it. When the bound is at most ``DROP_MARGIN`` ``rel_tol`` sqrt(lam_max), rule 2 drops them
  (the margin leaves room for lam_max's own round-off). Then C = V_large diag(lam_large)^(-1/2), and
  (A C)^T (A C) = I up to the round-off of G and of its eigendecomposition: forming G errs by at most
  gamma_k |A|^T |A| entrywise (k: the most rows two directions share; A is sparse), eigh by a small
  multiple of n u ||G||, and both are divided by the smallest large eigenvalue. ``ortho_bound`` is
  that estimate, (k + n) u trace(G) / lam_min_large; above ``ORTHO_TOL`` the Gram path gives way to
  the SVD. For a real-text layer at its initial point (P = 12,480 parameters, n = 897 directions of
  orbit and model, k = 390, lam_max / lam_min_large = 24) the estimate is about 1e-9 and the
  measured deviation of (A C)^T (A C) from I is 4e-14.
* **SVD path.** Otherwise (a singular value between the two classes, badly conditioned directions,
  a collapsing factor, an eigendecomposition that fails) A = U S V^T, rule 2 on S, and
  C = V_r S_r^(-1), so A C = U_r, the leading left singular vectors (``left_singular`` falls back to
  Householder QR when LAPACK's SVD fails to converge).

A column subset (a part of the orbit: one kind, one group; the model's moves next to the orbit)
has the Gram matrix G[S, S], so every part's C comes from one G: ``SpanFamily``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attnid.jacobian import flatten
from attnid.rank import DEFAULT_ZERO_TOL, numerical_rank
from attnid.spec import Params

# Large Gram eigenvalues are those of singular values at least 1e-3 of the largest: such an eigenvalue (1e-6 of the
# largest) stands far above the Gram's round-off, and rule 2's threshold (rel_tol <= GRAM_PATH_MIN / 10) far below it.
GRAM_PATH_MIN: float = 1e-3
# The dropped singular values must be bounded by half the rule's threshold: room for the round-off in s_max.
DROP_MARGIN: float = 0.5
# The Gram path's basis must be orthonormal to this (ortho_bound), a hundredth of the shares' last printed digit (1e-5).
ORTHO_TOL: float = 1e-7
UNIT_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24}


def left_singular(mat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(U, s, Vh) of a thin SVD of ``mat``, falling back to the SVD of its triangular QR factor when the SVD fails.

    On the CPU torch calls LAPACK's gesdd, which can stop with "failed to converge" on matrices
    with clusters of equal singular values (the model's moves are orthonormal by construction).
    Householder QR always finishes; mat = Q R has the singular values of R (k x k), and U = Q U_R.
    If R's SVD fails too, its columns are scaled by distinct factors D in [1, 2] (same span, singular
    values within a factor 2 of mat's) and the error, if any, propagates. In every case
    mat @ Vh^T = U diag(s) with U orthonormal, which is all ``svd_coefficients`` needs; in the scaled
    case s are the singular values of R D and Vh^T = D W for R D = U_R diag(s) W^T (Vh^T is then not orthogonal).
    """
    try:
        return torch.linalg.svd(mat, full_matrices=False)
    except torch.linalg.LinAlgError:
        q, r = torch.linalg.qr(mat)
    try:
        u_r, s, vh = torch.linalg.svd(r, full_matrices=False)
    except torch.linalg.LinAlgError:
        scale = torch.linspace(1.0, 2.0, r.shape[1], dtype=r.dtype)
        u_r, s, vh = torch.linalg.svd(r * scale, full_matrices=False)
        vh = vh * scale
    return q @ u_r, s, vh


def svd_coefficients(mat: torch.Tensor, rel_tol: float = DEFAULT_ZERO_TOL) -> torch.Tensor:
    """C (n, r) with mat @ C the leading r left singular vectors of ``mat`` (P, n), r by rule 2."""
    if mat.shape[1] == 0:
        return mat.new_zeros(0, 0)
    _, s, vh = left_singular(mat)
    r = numerical_rank(s, rel_tol)
    return vh[:r].T / s[:r]


def stack(directions: Sequence[Params], params: Params) -> torch.Tensor:
    """(P, n): the directions flattened in ``params``' order, as columns (P from ``params`` when there are none)."""
    if not directions:
        return torch.zeros(sum(p.numel() for p in params.values()), 0, dtype=next(iter(params.values())).dtype)
    return torch.stack([flatten(d) for d in directions], dim=1)


class SpanFamily:
    """The spans of column subsets of one set of directions A (P, n), each orthonormalised under rule 2 as A[:, S] C_S.

    The Gram matrix is computed once (A is sparse: each move touches a few blocks). ``coefficients``
    gives C_S for an index set, ``coordinates`` B_S^T v = C_S^T (A^T v)[S], ``project`` B B^T v.
    """

    def __init__(self, matrix: torch.Tensor, rel_tol: float = DEFAULT_ZERO_TOL) -> None:
        if matrix.ndim != 2:
            raise ValueError(f"directions must be a (P, n) matrix, got shape {tuple(matrix.shape)}")
        if not 0 < rel_tol <= GRAM_PATH_MIN / 10:
            raise ValueError(f"rel_tol must lie in (0, {GRAM_PATH_MIN / 10:g}] (a tenth of GRAM_PATH_MIN), got {rel_tol}")
        if matrix.dtype not in UNIT_ROUNDOFF:
            raise ValueError(f"directions must be float32 or float64, got {matrix.dtype}")
        self.matrix, self.rel_tol = matrix, rel_tol
        self._sparse = matrix.to_sparse()
        self._sparse_t = matrix.T.to_sparse()
        self.gram = torch.sparse.mm(self._sparse_t, matrix) if matrix.shape[1] else matrix.new_zeros(0, 0)
        support = (matrix != 0).to(matrix.dtype).to_sparse()
        shared = torch.sparse.mm(support.T, support.to_dense()) if matrix.shape[1] else self.gram
        self._touch = shared > 0
        self.shared_rows = int(shared.max()) if shared.numel() else 0  # k: the most rows two directions share
        self._abs_sparse = matrix.abs().to_sparse()
        self._coef: dict[tuple[int, ...], torch.Tensor] = {}

    @property
    def size(self) -> int:
        return self.matrix.shape[1]

    def _columns(self, index: Sequence[int] | None) -> torch.Tensor:
        return torch.arange(self.size) if index is None else torch.tensor(list(index), dtype=torch.long)

    def coefficients(self, index: Sequence[int] | None = None) -> torch.Tensor:
        """C_S (|S|, r): A[:, S] C_S is an orthonormal basis of span(A[:, S]) (all columns when ``index`` is None)."""
        cols = self._columns(index)
        key = tuple(cols.tolist())
        if key not in self._coef:
            coef = self._gram_coefficients(cols)
            self._coef[key] = svd_coefficients(self.matrix[:, cols], self.rel_tol) if coef is None else coef
        return self._coef[key]

    def components(self, cols: torch.Tensor) -> list[torch.Tensor]:
        """The columns ``cols`` grouped into the connected components of "share a non-zero row".

        Directions of different groups are orthogonal, so the Gram matrix is block-diagonal over the
        groups and the singular values of A[:, cols] are those of the groups together. Zero columns
        share no row with anything; they all take one label and form one group of their own.
        """
        touch = self._touch[cols][:, cols]
        label = torch.arange(cols.numel())
        while True:  # every column takes the smallest label it touches, until nothing changes
            new = torch.where(touch, label[None, :], cols.numel()).min(dim=1).values
            if torch.equal(new, label):
                break
            label = new
        return [(label == value).nonzero()[:, 0] for value in torch.unique(label)]

    def _eigh(self, cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The eigenvalues (ascending) and eigenvectors of G[cols, cols], one component at a time."""
        lam = self.gram.new_zeros(cols.numel())
        v = self.gram.new_zeros(cols.numel(), cols.numel())
        start = 0
        for group in self.components(cols):
            block = cols[group]
            lam_g, v_g = torch.linalg.eigh(self.gram[block][:, block])  # LinAlgError: see _gram_coefficients
            lam[start : start + group.numel()] = lam_g
            v[group, start : start + group.numel()] = v_g
            start += group.numel()
        order = torch.argsort(lam, stable=True)
        return lam[order], v[:, order]

    def _gram_coefficients(self, cols: torch.Tensor) -> torch.Tensor | None:
        """The Gram path's C for the columns ``cols`` (module docstring), or None where it cannot decide."""
        if cols.numel() == 0:
            return self.gram.new_zeros(0, 0)
        try:
            lam, v = self._eigh(cols)
        except torch.linalg.LinAlgError:
            return None
        if not torch.isfinite(lam).all():
            return None
        top = float(lam[-1])
        if top <= 0:  # every direction is zero: rule 2 keeps nothing
            return self.gram.new_zeros(cols.numel(), 0)
        large = lam >= GRAM_PATH_MIN**2 * top
        if not large.all():
            small = self.gram.new_zeros(self.size, int((~large).sum()))
            small[cols] = v[:, ~large]
            if not self.small_bound(small) <= DROP_MARGIN * self.rel_tol * top**0.5:
                return None
        if not self.ortho_bound(cols, float(lam[large][0])) <= ORTHO_TOL:
            return None
        return v[:, large] / lam[large].sqrt()

    def small_bound(self, small: torch.Tensor) -> float:
        """An upper bound on the j smallest singular values of A given V_small (n, j), nearly orthonormal columns.

        ||A V_small||_2 plus the round-off of computing it (gamma_n || |A| |V_small| ||_F), over
        sigma_min(V_small) >= 1 - ||V_small^T V_small - I||_2 (inf when that is not positive).
        """
        n, u = self.size, UNIT_ROUNDOFF[self.matrix.dtype]
        product = float(torch.linalg.matrix_norm(self.times(small), ord=2))
        roundoff = n * u / (1 - n * u) * float(torch.sparse.mm(self._abs_sparse, small.abs()).norm())
        spread = float(torch.linalg.matrix_norm(small.T @ small - torch.eye(small.shape[1], dtype=small.dtype), ord=2))
        return (product + roundoff) / (1 - spread) if spread < 1 else float("inf")

    def ortho_bound(self, cols: torch.Tensor, smallest_large: float) -> float:
        """The Gram path's estimate of ||(A C)^T (A C) - I||: (k + n) u trace(G[cols, cols]) / lam_min_large."""
        u = UNIT_ROUNDOFF[self.matrix.dtype]
        trace = float(self.gram.diagonal()[cols].sum())
        return (self.shared_rows + cols.numel()) * u * trace / smallest_large

    def dimension(self, index: Sequence[int] | None = None) -> int:
        return self.coefficients(index).shape[1]

    def transpose_times(self, v: torch.Tensor) -> torch.Tensor:
        """A^T v for a vector (P,) or matrix (P, k)."""
        if v.ndim == 1:
            return torch.sparse.mm(self._sparse_t, v[:, None])[:, 0]
        return torch.sparse.mm(self._sparse_t, v)

    def times(self, x: torch.Tensor) -> torch.Tensor:
        """A x for x (n, k)."""
        return torch.sparse.mm(self._sparse, x)

    def coordinates(self, at: torch.Tensor, index: Sequence[int] | None = None) -> torch.Tensor:
        """B_S^T v given ``at`` = A^T v: the coordinates of v's projection on span(A[:, S]) in its orthonormal basis."""
        return self.coefficients(index).T @ at[self._columns(index)]

    def basis(self, index: Sequence[int] | None = None) -> torch.Tensor:
        """The orthonormal basis A[:, S] C_S (P, r), formed (for tests and small layers; shares never need it)."""
        return self.matrix[:, self._columns(index)] @ self.coefficients(index)

    def project(self, v: torch.Tensor) -> torch.Tensor:
        """B B^T v, the orthogonal projection onto the span of every column, for v (P,) or (P, k)."""
        c = self.coefficients()
        x = c @ (c.T @ self.transpose_times(v))
        return self.times(x[:, None])[:, 0] if v.ndim == 1 else self.times(x)


def span_dimension(directions: Sequence[Params], params: Params, rel_tol: float = DEFAULT_ZERO_TOL) -> int:
    """The dimension of the span of ``directions`` under rule 2 (``SpanFamily``'s decision)."""
    return SpanFamily(stack(directions, params), rel_tol).dimension()
