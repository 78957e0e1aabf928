"""Exact checks behind the normalised layers: the QK-norm of chapter 7b and the latent RMSNorm of chapter 7c.

``N_eps(u) = u / sqrt(|u|^2/k + eps)`` is the RMSNorm without its weight (``rms_normalise``). The
functions here check, in exact arithmetic, its scale invariance at ``eps = 0`` and its derivative in
the scale, the weight trade on a rotated pair, the two radial identities, Step 4 of the tangent
proposition, the Laurent coefficients of the logistic function at a pole that the several-heads
argument reads, and that the RMSNorm commutes with a rotation. Each returns a list of ``Identity``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy as sp

from attnid.symbolic.identity import Identity, is_zero, zero_identity

__all__ = [
    "logistic_pole_laurent",
    "qk_norm_scale",
    "qk_tangent_offsets",
    "qk_weight_trade",
    "radial_identities",
    "rms_norm_rotation",
    "rms_normalise",
]


def rms_normalise(vec: sp.Matrix, eps: sp.Expr | int) -> sp.Matrix:
    """N_eps of a row vector: ``vec / sqrt(|vec|^2 / len(vec) + eps)``."""
    return vec / sp.sqrt((vec * vec.T)[0] / vec.shape[1] + eps)


def qk_norm_scale() -> list[Identity]:
    """N_0 ignores a positive scale, and d/dc N_eps(c u) at c = 1 is N_eps(u) eps / (mean(u^2) + eps).

    Chapter 7b, the QK-norm's scales: part 2 of ``thm-qk-moves`` (a scale is a move only at eps = 0)
    and the weak identification of the scale at eps > 0; here with k = 3 entries.
    """
    u = sp.Matrix([sp.symbols("u1:4", real=True)])
    c, eps = sp.symbols("c epsilon", positive=True)
    mean_square = (u * u.T)[0] / 3
    rate = sp.diff(rms_normalise(c * u, eps), c).subs(c, 1) - rms_normalise(u, eps) * eps / (mean_square + eps)
    return [
        zero_identity("N_0(c u) - N_0(u) = 0 for c > 0 (k = 3)", rms_normalise(c * u, 0) - rms_normalise(u, 0)),
        zero_identity("d/dc N_eps(c u) at c = 1 minus N_eps(u) eps / (mean(u^2) + eps) = 0", rate),
    ]


def qk_weight_trade() -> list[Identity]:
    """The trade Gamma_Q D, D^-1 Gamma_K on a rotated pair keeps M = Gamma_Q R Gamma_K iff D is equal on the pair.

    Chapter 7b, part 1 of ``thm-qk-moves``: with D = diag(d1, d2) the diagonal of M is unchanged,
    the off-diagonal entries change by a multiple of (d2 - d1) sin(theta), and for an angle outside
    pi Z the only solution is d2 = d1.
    """
    theta = sp.symbols("theta", real=True)
    rot = sp.Matrix([[sp.cos(theta), -sp.sin(theta)], [sp.sin(theta), sp.cos(theta)]])
    gq, gk, d1, d2 = sp.symbols("g_q1:3"), sp.symbols("g_k1:3"), *sp.symbols("d1 d2", positive=True)
    gamma_q, gamma_k, trade = sp.diag(*gq), sp.diag(*gk), sp.diag(d1, d2)
    moved = sp.simplify(gamma_q * trade * rot * trade.inv() * gamma_k - gamma_q * rot * gamma_k)
    expected = {
        (0, 1, "g_q1 g_k2 (d2 - d1) sin(theta) / d2"): gq[0] * gk[1] * (d2 - d1) * sp.sin(theta) / d2,
        (1, 0, "g_q2 g_k1 (d2 - d1) sin(theta) / d1"): gq[1] * gk[0] * (d2 - d1) * sp.sin(theta) / d1,
    }
    solved = sp.solve(list(moved), [d2], dict=True)
    return [
        Identity(
            "the trade leaves the diagonal of M unchanged",
            str([moved[0, 0], moved[1, 1]]),
            moved[0, 0] == 0 and moved[1, 1] == 0,
        ),
        *(
            Identity(f"the trade changes M[{i}, {j}] by {text}", str(moved[i, j]), sp.simplify(moved[i, j] - e) == 0)
            for (i, j, text), e in expected.items()
        ),
        zero_identity("with d1 = d2 (equal on the pair) M is unchanged", moved.subs(d2, d1)),
        Identity("M unchanged forces d2 = d1 (angle outside pi Z)", str(solved), solved == [{d2: d1}]),
    ]


def radial_identities() -> list[Identity]:
    """The two radial identities of ``lem-radial`` (chapter 7b) at k = 3, solved coefficient by coefficient.

    (1) |n|^2 c n^T = (w n^T)(n B n^T) for all n, with w = (1, 2, -1), has one family of solutions,
    B + B^T = 2 lambda I and c = lambda w. (2) |n|^2 n C = (n B n^T) n for all n has one family,
    C = mu I and B + B^T = 2 mu I.
    """
    n = sp.Matrix([sp.symbols("n1:4")])
    b = sp.Matrix(3, 3, sp.symbols("b0:9"))
    cmat = sp.Matrix(3, 3, sp.symbols("c0:9"))
    cvec, wvec = sp.Matrix([sp.symbols("cc1:4")]), sp.Matrix([[1, 2, -1]])
    norm2 = (n * n.T)[0]
    identity1 = sp.Poly(sp.expand(norm2 * (cvec * n.T)[0] - (wvec * n.T)[0] * (n * b * n.T)[0]), *n)
    sol1 = sp.solve(identity1.coeffs(), list(b) + list(cvec), dict=True)
    rows = [sp.Poly(sp.expand(norm2 * (n * cmat)[a] - (n * b * n.T)[0] * n[a]), *n).coeffs() for a in range(3)]
    sol2 = sp.solve([eq for r in rows for eq in r], list(b) + list(cmat), dict=True)
    checks = [Identity("(1) has exactly one family of solutions", f"{len(sol1)} solution(s)", len(sol1) == 1)]
    if len(sol1) == 1:
        sym1, c1 = (b + b.T).subs(sol1[0]), cvec.subs(sol1[0])
        lam = sym1[0, 0] / 2
        checks += [
            Identity("(1): B + B^T = 2 lambda I", str(sp.simplify(sym1)), is_zero(sym1 - 2 * lam * sp.eye(3))),
            Identity("(1): c = lambda w, w = (1, 2, -1)", str(c1), is_zero(c1 - lam * wvec)),
        ]
    checks.append(Identity("(2) has exactly one family of solutions", f"{len(sol2)} solution(s)", len(sol2) == 1))
    if len(sol2) == 1:
        c2, sym2 = cmat.subs(sol2[0]), (b + b.T).subs(sol2[0])
        mu = c2[0, 0]
        checks += [
            Identity("(2): C = mu I", str(c2), is_zero(c2 - mu * sp.eye(3))),
            Identity("(2): B + B^T = 2 mu I", str(sym2), is_zero(sym2 - 2 * mu * sp.eye(3))),
        ]
    return checks


def _antisymmetric(letter: str) -> sp.Matrix:
    """A 3 x 3 antisymmetric matrix of symbols {letter}{i}{j} above the diagonal."""
    return sp.Matrix(
        3, 3, lambda i, j: 0 if i == j else sp.Symbol(f"{letter}{min(i, j)}{max(i, j)}") * (1 if i < j else -1)
    )


def qk_tangent_offsets(gamma_q: Sequence[int] = (2, 3, 5), gamma_k: Sequence[int] = (7, 11, 13)) -> list[Identity]:
    """Step 4 of ``prop-qk-tangent`` (chapter 7b) at k = 3: one rotated pair (cos = 3/5) and one free coordinate.

    Weighted (Gamma_Q = diag(gamma_q), Gamma_K = diag(gamma_k); the default products 14, 33, 65 have
    distinct squares, as the proposition asks): R_p X = Y R_p at the offsets 1 and 2 forces
    K = K' = 0, D_K = -D_Q and D_Q equal on the rotated pair. Unweighted: it forces K' = K, one
    antisymmetric generator on the rotated pair. Weights whose products have equal squares break
    the weighted part.
    """
    c5, s5 = sp.Rational(3, 5), sp.Rational(4, 5)
    r1 = sp.Matrix([[c5, -s5, 0], [s5, c5, 0], [0, 0, 1]])
    r2 = r1 * r1
    k, kp = _antisymmetric("k"), _antisymmetric("l")
    dq, dk = sp.diag(*sp.symbols("dq0:3")), sp.diag(*sp.symbols("dk0:3"))
    gq, gk = sp.diag(*gamma_q), sp.diag(*gamma_k)
    x, y = gk * k * gk.inv() - dk, gq.inv() * kp * gq + dq
    unknowns = sorted(k.free_symbols | kp.free_symbols | dq.free_symbols | dk.free_symbols, key=str)  # any hash seed
    step4 = sp.solve(list(r1 * x - y * r1) + list(r2 * x - y * r2), unknowns, dict=True)
    shown = ", ".join(f"{s}: {v}" for s, v in sorted(step4[0].items(), key=str)) if step4 else "no solution"
    one = len(step4) == 1
    sol = step4[0] if one else {}
    checks = [
        Identity(
            "weighted: one family of solutions, with K = K' = 0",
            shown,
            one and all(sol.get(v) == 0 for v in k.free_symbols | kp.free_symbols),
        ),
        Identity("weighted: D_K = -D_Q", str((dk + dq).subs(sol)), one and is_zero(dk.subs(sol) + dq.subs(sol))),
        Identity(
            "weighted: D_Q equal on the rotated pair",
            str((dq[0, 0] - dq[1, 1]).subs(sol)),
            one and sp.simplify((dq[0, 0] - dq[1, 1]).subs(sol)) == 0,
        ),
    ]
    antisym = sorted(k.free_symbols | kp.free_symbols, key=str)
    step4u = sp.solve(list(r1 * k - kp * r1) + list(r2 * k - kp * r2), antisym, dict=True)
    shown_u = ", ".join(f"{s}: {v}" for s, v in sorted(step4u[0].items(), key=str)) if step4u else "no solution"
    ku, kpu = (k.subs(step4u[0]), kp.subs(step4u[0])) if len(step4u) == 1 else (k, kp)
    checks.append(
        Identity(
            "unweighted: one family, K' = K with one free entry, on the rotated pair",
            shown_u,
            len(step4u) == 1 and ku == kpu and len(ku.free_symbols) == 1 and ku[0, 2] == ku[1, 2] == 0,
        )
    )
    return checks


def logistic_pole_laurent(pole: sp.Expr = sp.I * sp.pi) -> list[Identity]:
    """The Laurent coefficients of sigma(S) at a pole: residue 1/S' and double-pole coefficient -1/S'^2.

    Chapter 7b, the pole argument of ``prop-qk-several-heads``: with S = pole + s1 tau + s2 tau^2 and
    pole = i pi (a zero of 1 + e^{-S}), tau sigma(S) -> 1/s1 and tau^2 sigma'(S) -> -1/s1^2 as tau -> 0.
    Any other ``pole`` that is not an odd multiple of i pi gives no pole, and the checks fail.
    """
    tau, s1, s2 = sp.symbols("tau s1 s2")
    s = pole + s1 * tau + s2 * tau**2
    sigma = 1 / (1 + sp.exp(-s))
    simple = sp.simplify(sp.series(tau * sigma, tau, 0, 1).removeO())
    double = sp.simplify(sp.series(tau**2 * sigma * (1 - sigma), tau, 0, 1).removeO())
    return [
        Identity("tau sigma(S) -> 1/S' (the residue)", str(simple), simple == 1 / s1),
        Identity("tau^2 sigma'(S) -> -1/S'^2 (the double-pole coefficient)", str(double), double == -1 / s1**2),
    ]


def rms_norm_rotation() -> list[Identity]:
    """The RMSNorm commutes with a rotation, ignores a scale at eps = 0, and its scale derivative (c = 2).

    Chapter 7c: ``lem-rms-orthogonal`` (N_eps(z M) = N_eps(z) M for a rotation M, N_0(t z) = N_0(z))
    and ``prop-mla-weak`` (d/dt N_eps(t z) at t = 1 is eps / (m + eps) N_eps(z), m = mean(z^2)).
    """
    z0, z1, th, eps, t = sp.symbols("z0 z1 theta epsilon t", positive=True)
    z = sp.Matrix([[z0, z1]])
    rot = sp.Matrix([[sp.cos(th), -sp.sin(th)], [sp.sin(th), sp.cos(th)]])
    m = (z * z.T)[0] / 2
    rate = sp.diff(rms_normalise(t * z, eps), t).subs(t, 1) - eps / (m + eps) * rms_normalise(z, eps)
    rotated = rms_normalise(z * rot, eps) - rms_normalise(z, eps) * rot
    return [
        zero_identity("N_eps(z M) - N_eps(z) M = 0 for a rotation M", rotated),
        zero_identity("N_0(t z) - N_0(z) = 0 for t > 0", rms_normalise(t * z, 0) - rms_normalise(z, 0)),
        zero_identity("d/dt N_eps(t z) at t = 1 minus eps / (m + eps) N_eps(z) = 0", rate),
    ]
