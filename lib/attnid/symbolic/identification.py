"""Exact checks behind chapter 1 (identification): the scalar product example and the matrix-product gauge.

Each function returns the ``Identity`` list that the chapter shows as a table and asserts; the exact-rank
count of the matrix product over several shapes stays with ``attnid.symbolic.exact_nullity``.
"""

from __future__ import annotations

import sympy as sp

from attnid.symbolic.identity import Identity, zero_identity

__all__ = ["factored_gauge", "product_example"]


def product_example() -> list[Identity]:
    """The smallest example f(x) = a b x (chapter 1, ``ex-product``), checked exactly.

    f is unchanged by the group t . (a, b) = (t a, b / t); its Jacobian [df/da, df/db] = [b x, a x] has
    rank 1; the orbit tangent (a, -b), the derivative of (t a, b / t) at t = 1, lies in the Jacobian's
    null space; and at the origin (a, b) = (0, 0) the rank drops to 0.
    """
    a, b, t, x = sp.symbols("a b t x")
    f = a * b * x
    jac = sp.Matrix([[sp.diff(f, a), sp.diff(f, b)]])
    orbit_tangent = sp.Matrix([a, -b])  # d/dt of (t a, b / t) at t = 1
    rank, rank_at_origin = jac.rank(), jac.subs({a: 0, b: 0}).rank()
    return [
        zero_identity("f(t a, b / t) - f(a, b) = 0", f.subs({a: t * a, b: b / t}, simultaneous=True) - f),
        Identity("the Jacobian [df/da, df/db] has rank 1", f"{jac}, rank {rank}", rank == 1),
        zero_identity("Jacobian times the orbit tangent (a, -b) = 0", jac * orbit_tangent),
        Identity("at (a, b) = (0, 0) the Jacobian has rank 0", f"rank {rank_at_origin}", rank_at_origin == 0),
    ]


def factored_gauge() -> list[Identity]:
    """The GL(k) move of a matrix product keeps it (chapter 1, ``prop-factored``), for symbolic 2 x 2 matrices.

    (A M)(M^-1 B) - A B = 0 with A, B and the invertible M generic symbolic 2 x 2 matrices.
    """
    a2 = sp.Matrix(2, 2, sp.symbols("a0:4"))
    b2 = sp.Matrix(2, 2, sp.symbols("b0:4"))
    m2 = sp.Matrix(2, 2, sp.symbols("m0:4"))
    return [zero_identity("(A M)(M^-1 B) - A B = 0 (2 x 2)", a2 * m2 * m2.inv() * b2 - a2 * b2)]
