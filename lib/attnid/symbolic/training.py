"""Exact checks behind the training chapters: what a gradient step conserves, where balancing lands.

``gradient_step_conservation`` backs chapter 9's conservation law (``thm-conservation``): one
gradient step changes the query/key Gram difference only at second order in the step size.
``balanced_point_stationarity`` backs chapter 10's balanced point (``thm-balanced``): the
gradient of the norm along the orbit, and the scalar case of its minimum.
"""

from __future__ import annotations

import sympy as sp

from attnid.symbolic.identity import Identity, zero_identity

__all__ = ["balanced_point_stationarity", "gradient_step_conservation"]


def gradient_step_conservation(rows: int = 3, cols: int = 2) -> list[Identity]:
    """The two steps of the proof of chapter 9's ``thm-conservation`` (Conserved quantities), exactly.

    Scalar model ``f = a b``: one gradient step ``a - eta g b``, ``b - eta g a`` on ``l(ab)``
    (``g = l'(ab)``) multiplies ``C = a^2 - b^2`` by ``1 - eta^2 g^2``. Matrix model
    ``W_Q W_K^T`` (``rows x cols`` factors, 3 x 2 in the chapter) under a loss with any gradient
    ``G`` with respect to the product: one step ``W_Q - eta G W_K``, ``W_K - eta G^T W_Q`` changes
    ``C = W_Q^T W_Q - W_K^T W_K`` by nothing linear in ``eta``, and by
    ``eta^2 (W_K^T G^T G W_K - W_Q^T G G^T W_Q)``.
    """
    if rows < 1 or cols < 1:
        raise ValueError(f"factor shape must be positive, got {rows} x {cols}")
    a, b, eta, g = sp.symbols("a b eta g", real=True)
    a1, b1 = a - eta * g * b, b - eta * g * a  # one gradient step on l(ab), g = l'(ab)
    c_before, c_after = a**2 - b**2, a1**2 - b1**2
    scalar = Identity("scalar f = ab: C = a² − b² after one step is C (1 − η² g²)", str(sp.factor(c_after)),
                      sp.expand(c_after - c_before * (1 - eta**2 * g**2)) == 0)

    wq = sp.Matrix(rows, cols, sp.symbols(f"q0:{rows * cols}"))
    wk = sp.Matrix(rows, cols, sp.symbols(f"k0:{rows * cols}"))
    grad = sp.Matrix(rows, rows, sp.symbols(f"g0:{rows * rows}"))  # gradient of the loss w.r.t. W_Q W_K^T

    def conserved(q: sp.Matrix, k: sp.Matrix) -> sp.Matrix:
        return q.T * q - k.T * k

    change = (conserved(wq - eta * grad * wk, wk - eta * grad.T * wq) - conserved(wq, wk)).applyfunc(sp.expand)
    linear = change.applyfunc(lambda e: e.coeff(eta, 1))
    quadratic = change.applyfunc(lambda e: e.coeff(eta, 2))
    residual = (quadratic - (wk.T * grad.T * grad * wk - wq.T * grad * grad.T * wq)).applyfunc(sp.expand)
    zero = sp.zeros(cols, cols)
    return [
        scalar,
        Identity(f"W_Q W_Kᵀ ({rows} × {cols} factors): the change of C = W_Qᵀ W_Q − W_Kᵀ W_K, its term in η",
                 str(linear), linear == zero),
        Identity("its term in η², minus W_Kᵀ Gᵀ G W_K − W_Qᵀ G Gᵀ W_Q", str(residual), residual == zero),
    ]


def balanced_point_stationarity() -> list[Identity]:
    """The stationarity condition of chapter 10's ``thm-balanced`` (The balanced point), exactly.

    For generic symmetric 2 x 2 matrices ``X``, ``P``, ``Q`` and
    ``phi(X) = tr(X P) + tr(X^-1 Q)``, the derivative of ``phi`` along each of the three symmetric
    directions ``E00``, ``E01 + E10``, ``E11`` is the inner product of that direction with the
    matrix gradient ``P - X^-1 Q X^-1`` the proof uses. In the scalar case, the only critical point
    ``t > 0`` of ``a^2 t^2 + b^2 / t^2`` is ``t = sqrt(b / a)``, where the two moved squares agree:
    ``(a t)^2 = (b / t)^2 = a b``.
    """
    x0, x1, x2, p0, p1, p2, q0, q1, q2 = sp.symbols("x0 x1 x2 p0 p1 p2 q0 q1 q2", real=True)
    x = sp.Matrix([[x0, x1], [x1, x2]])
    p = sp.Matrix([[p0, p1], [p1, p2]])
    q = sp.Matrix([[q0, q1], [q1, q2]])
    phi = (x * p).trace() + (x.inv() * q).trace()
    gradient = p - x.inv() * q * x.inv()  # the matrix gradient used in the proof
    directions = (("x0", "E00", x0, sp.Matrix([[1, 0], [0, 0]])), ("x1", "E01 + E10", x1, sp.Matrix([[0, 1], [1, 0]])),
                  ("x2", "E11", x2, sp.Matrix([[0, 0], [0, 1]])))
    checks = [zero_identity(f"∂φ/∂{name} = ⟨P − X⁻¹ Q X⁻¹, {label}⟩ for φ = tr(XP) + tr(X⁻¹Q)",
                            sp.diff(phi, variable) - (gradient.T * direction).trace())
              for name, label, variable, direction in directions]

    t, a, b = sp.symbols("t a b", positive=True)
    best = sp.solve(sp.diff(a**2 * t**2 + b**2 / t**2, t), t)
    checks.append(Identity("scalar case: the critical points t > 0 of a² t² + b² / t²", str(best),
                           best == [sp.sqrt(b) / sp.sqrt(a)]))
    if len(best) == 1:
        checks.append(Identity("at that t, (a t)² = (b / t)² =", str(sp.simplify((a * best[0]) ** 2)),
                               sp.simplify((a * best[0]) ** 2 - (b / best[0]) ** 2) == 0))
    return checks
