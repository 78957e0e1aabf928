"""Exact checks behind multi-head latent attention (chapter 7c): the symmetries and their count.

The up-projection absorbs a rotation and a new norm weight of the latent, one element of the RoPE
commutant shared by all heads keeps every head's rotated scores (one head's own element does not),
and the count N is the sum of the dimensions of the symmetry groups. The RMSNorm lemma itself is
``attnid.symbolic.norms.rms_norm_rotation``. Each function returns a list of ``Identity``.
"""

from __future__ import annotations

import sympy as sp

from attnid.symbolic.identity import Identity, zero_identity
from attnid.symbolic.norms import rms_normalise

__all__ = ["mla_latent_absorption", "mla_orbit_dimension", "mla_rope_commutant"]


def _rotation(angle: sp.Expr) -> sp.Matrix:
    """The 2 x 2 rotation by ``angle``."""
    return sp.Matrix([[sp.cos(angle), -sp.sin(angle)], [sp.sin(angle), sp.cos(angle)]])


def mla_latent_absorption() -> list[Identity]:
    """The up-projection absorbs a rotation M and a new weight g s of the latent: N(z M) diag(g s) U' = N(z) diag(g) U.

    Chapter 7c, part 1 of ``thm-mla-symmetries``, with c = 2 and U' = diag(g s)^-1 M^T diag(g) U for a
    2 x 3 up-projection U.
    """
    z0, z1, th, eps = sp.symbols("z0 z1 theta epsilon", positive=True)
    z = sp.Matrix([[z0, z1]])
    rot = _rotation(th)
    g0, g1, s0, s1 = sp.symbols("g0 g1 s0 s1", nonzero=True)
    weight, new = sp.diag(g0, g1), sp.diag(s0, s1)
    up = sp.Matrix(2, 3, sp.symbols("u0:6"))
    up_new = (weight * new).inv() * rot.T * weight * up
    residual = rms_normalise(z * rot, eps) * weight * new * up_new - rms_normalise(z, eps) * weight * up
    return [zero_identity("N(z M) diag(g s) U' - N(z) diag(g) U = 0", residual)]


def mla_rope_commutant() -> list[Identity]:
    """One commutant element C for all heads keeps every head's rotated scores; one head's own element does not.

    Chapter 7c, part 3 of ``thm-mla-symmetries``: C = [[a, -b], [b, a]] commutes with every rotation;
    the rotated score q C R_i (k C^-T R_j)^T of two heads (queries q and w, one key k) is unchanged;
    and with C2 = [[1, -1/3], [1/3, 1]] on the second head's query against the key's C^-T it changes.
    """
    th = sp.symbols("theta", positive=True)
    a, b, p = sp.symbols("a b p", real=True)
    comm = sp.Matrix([[a, -b], [b, a]])
    q1, q2, k = (sp.Matrix([sp.symbols(f"{n}0:2")]) for n in ("q", "w", "k"))
    i, j = sp.symbols("i j", integer=True)

    def score(qv: sp.Matrix, kv: sp.Matrix, cq: sp.Matrix, ck: sp.Matrix) -> sp.Expr:
        """The rotated score of query qv at position i and key kv at position j, after cq and ck."""
        return (qv * cq * _rotation(i * th) * (kv * ck * _rotation(j * th)).T)[0]

    ck = comm.inv().T
    eye = sp.eye(2)
    other = sp.Matrix([[1, -sp.Rational(1, 3)], [sp.Rational(1, 3), 1]])
    changed = sp.simplify(score(q2, k, other, ck) - score(q2, k, eye, eye))
    shown = "0" if changed == 0 else "non-zero, in " + ", ".join(sorted(map(str, changed.free_symbols)))
    return [
        zero_identity("C R(p) - R(p) C = 0", comm * _rotation(p) - _rotation(p) * comm),
        *(
            zero_identity(
                f"head {h}: a shared C keeps the rotated score", score(qv, k, comm, ck) - score(qv, k, eye, eye)
            )
            for h, qv in ((1, q1), (2, q2))
        ),
        Identity("head 2 with its own C2 != C: the rotated score changes", shown, changed != 0),
    ]


def mla_orbit_dimension() -> list[Identity]:
    """The count N (eps > 0) is the sum of the dimensions of the symmetry groups of ``thm-mla-symmetries``.

    Chapter 7c, the count before ``thm-mla-orbit``: N = c(c+1)/2 + c'(c'+1)/2 + H(d_n^2 + d_v^2) + d_r equals
    dim O(c) + c + dim O(c') + c' + H d_n^2 + H d_v^2 + 2 (d_r / 2) (one aI + bJ per rotated pair).
    """
    c_, cq, h_, dn, dr, dv = sp.symbols("c c' H d_n d_r d_v", positive=True, integer=True)
    n_eps = c_ * (c_ + 1) / 2 + cq * (cq + 1) / 2 + h_ * (dn**2 + dv**2) + dr
    lie_dims = (c_ * (c_ - 1) / 2 + c_) + (cq * (cq - 1) / 2 + cq) + h_ * dn**2 + h_ * dv**2 + 2 * (dr / 2)
    return [
        Identity(
            "N (eps > 0) = the sum of the groups' dimensions", str(sp.factor(n_eps)), sp.simplify(n_eps - lie_dims) == 0
        )
    ]
