"""Exact checks behind prop-qk-width-one, QK-norm heads of width one (chapters/07b_modern_attention, rendered 8).

At ``d_k = 1`` and ``eps > 0`` the normalised key is ``n(v) = v / sqrt(v^2 + eps)``, with derivative
``J(v) = eps / (v^2 + eps)^(3/2)``. Step 2 of prop-qk-tangent then reads
``c n(v) + w J(v) (v A + beta) = a`` for all real ``v``, and the four functions ``n``, ``v J``, ``J`` and
``1`` are linearly independent, so ``c = w A = w beta = a = 0`` (and Step 3 likewise). The two-head determinant that the
several-head proposition needs, ``A_h B_h' - A_h' B_h``, is identically zero at this width, which is
why the proposition separates two heads of one normaliser by their scalar factors instead.
"""

from __future__ import annotations

import sympy as sp

from attnid.symbolic.identity import Identity, zero_identity


def _key_functions(v: sp.Expr, eps: sp.Expr) -> list[sp.Expr]:
    """n(v), v J(v), J(v) and 1: the functions of the key that Step 2's identity combines."""
    jacobian = eps / (v**2 + eps) ** sp.Rational(3, 2)
    return [v / sp.sqrt(v**2 + eps), v * jacobian, jacobian, sp.Integer(1)]


def independence_determinant(points: tuple[int, ...] = (0, 1, 2, 3), eps: sp.Expr = sp.Integer(1)) -> sp.Expr:
    """det [f_i(v_j)] of the four key functions at the given points.

    eps = 1 stands for every eps > 0: with s = v / sqrt(eps), n(v; eps) = n(s; 1), v J(v; eps) = s J(s; 1)
    and J(v; eps) = J(s; 1) / sqrt(eps), so a relation at one eps is one at every eps.
    """
    v = sp.Symbol("v", real=True)
    rows = [[f.subs(v, p) for f in _key_functions(v, eps)] for p in points]
    return sp.simplify(sp.Matrix(rows).det())


def width_one_identities() -> list[Identity]:
    """The exact facts prop-qk-width-one uses, each computed by SymPy."""
    eps = sp.Symbol("epsilon", positive=True)
    v = sp.Symbol("v", real=True)
    n = v / sp.sqrt(v**2 + eps)
    checks = [zero_identity("dn/dv = eps / (v^2 + eps)^(3/2), the key normaliser's derivative J(v)",
                            sp.diff(n, v) - _key_functions(v, eps)[2])]
    det = independence_determinant()
    x = sp.Symbol("x")
    minimal = sp.minimal_polynomial(det, x)  # x itself exactly when det = 0
    checks.append(Identity("det [n, v J, J, 1] at v = 0, 1, 2, 3 (eps = 1) is non-zero: the four are independent",
                           str(det), minimal != x))
    q_h, q_h2, k, nu = sp.symbols("ubar_h ubar_h' k_g nu_g", real=True)
    lam = sp.Symbol("lambda")  # complex: the roots of q_g are not real
    gamma_h, gamma_h2 = sp.symbols("gamma_h gamma_h'", nonzero=True)
    a_h, b_h = q_h * gamma_h * k, q_h * gamma_h * nu
    a_h2, b_h2 = q_h2 * gamma_h2 * k, q_h2 * gamma_h2 * nu
    checks.append(zero_identity("A_h B_h' - A_h' B_h = 0 for two heads of one key normaliser (no Möbius separation)",
                                a_h * b_h2 - a_h2 * b_h))
    key = k + lam * nu
    phi = key / sp.sqrt(key**2 + eps)  # the normalised moving key, one function for the normaliser's heads
    score_h = gamma_h * q_h / sp.sqrt(q_h**2 + eps) * phi
    score_h2 = gamma_h2 * q_h2 / sp.sqrt(q_h2**2 + eps) * phi
    score_ratio = sp.simplify(score_h / score_h2)
    checks.append(Identity("s_h / s_h' = r_h / r_h' does not depend on the moving token (the heads share phi_g)",
                           str(score_ratio), lam not in score_ratio.free_symbols))
    root = sp.solve(sp.Eq(key**2 + eps, 0), lam)
    at_root = [sp.simplify(key.subs(lam, r) ** 2) for r in root]
    checks.append(Identity("at a root lambda_g of q_g, (k_g + lambda_g nu_g)^2 = -eps != 0 (so b_h != 0)",
                           str(at_root), all(sp.simplify(x + eps) == 0 for x in at_root) and len(root) == 2))
    return checks
