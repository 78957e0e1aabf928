"""Exact SymPy checks of the identities behind the whole model's moves (chapter "The whole model").

``whole_model_identities()`` checks each identity on symbolic vectors and matrices, raising AssertionError if
one fails, and returns the names of those that hold.
"""

from __future__ import annotations

import sympy as sp


def _layer_norm(h: sp.Matrix, eps: sp.Expr) -> sp.Matrix:
    d = h.rows
    centred = h - sp.ones(d, 1) * (sum(h) / d)
    variance = sum(x**2 for x in centred) / d
    return centred / sp.sqrt(variance + eps)


def _rms_norm(h: sp.Matrix, eps: sp.Expr) -> sp.Matrix:
    return h / sp.sqrt(sum(x**2 for x in h) / h.rows + eps)


def _zero(expr: sp.Matrix) -> bool:
    return all(sp.simplify(e) == 0 for e in expr)


def _rotation_fixing_ones(angle: sp.Symbol) -> sp.Matrix:
    """A rotation of R^3 about the all-ones axis (Rodrigues' formula with the unit axis 1 / sqrt 3)."""
    k = sp.Matrix([1, 1, 1]) / sp.sqrt(3)
    cross = sp.Matrix([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    return sp.eye(3) + sp.sin(angle) * cross + (1 - sp.cos(angle)) * cross * cross


def _table_moves_rank(rows: tuple[int, ...], d: int) -> int:
    """The exact rank of the tangent map of the table gauges and mean components (lemma thm-whole-tables)."""
    gauges = [sp.Matrix(sp.symbols(f"v{j}_0:{d}")) for j in range(1, len(rows))]
    means = [sp.Matrix(sp.symbols(f"c{j}_0:{r}")) for j, r in enumerate(rows)]
    ones = [sp.ones(r, 1) for r in rows]
    moved = [means[0] * sp.ones(1, d) + ones[0] * sum((g.T for g in gauges), sp.zeros(1, d))]
    moved += [means[j] * sp.ones(1, d) - ones[j] * gauges[j - 1].T for j in range(1, len(rows))]
    variables = [s for g in gauges for s in g] + [s for c in means for s in c]
    entries = sp.Matrix([e for m in moved for e in m])
    return entries.jacobian(variables).rank()


def whole_model_identities() -> list[str]:
    """Check each identity exactly; return the names of those that hold (AssertionError on a failure)."""
    h = sp.Matrix(sp.symbols("h0:3", real=True))
    eps, t, angle = sp.symbols("epsilon t theta", positive=True)
    checked: list[str] = []

    shift = sp.Symbol("s", real=True)
    assert _zero(_layer_norm(h + shift * sp.ones(3, 1), eps) - _layer_norm(h, eps))
    checked.append("LayerNorm(h + s 1) = LayerNorm(h)  (mean components, move 2)")

    assert _zero(_layer_norm(t * h, eps) - _layer_norm(h, eps / t**2))
    assert _zero(_rms_norm(t * h, eps) - _rms_norm(h, eps / t**2))
    checked.append("N_eps(t h) = N_{eps / t^2}(h) for LayerNorm and RMSNorm  (theorem thm-whole-eps)")

    q = _rotation_fixing_ones(angle)
    assert _zero(q.T * q - sp.eye(3)) and _zero(q * sp.ones(3, 1) - sp.ones(3, 1))
    assert _zero(_layer_norm(q * h, eps) - q * _layer_norm(h, eps))
    checked.append("LayerNorm(Q h) = Q LayerNorm(h) for Q orthogonal fixing 1  (stream rotation, move 5)")

    rotation = sp.Matrix([[sp.cos(angle), -sp.sin(angle), 0], [sp.sin(angle), sp.cos(angle), 0], [0, 0, 1]])
    assert _zero(_rms_norm(rotation * h, eps) - rotation * _rms_norm(h, eps))
    checked.append("RMSNorm(Q h) = Q RMSNorm(h) for Q orthogonal  (stream rotation, move 5)")

    w = sp.Matrix(2, 3, sp.symbols("w0:6", real=True))
    g = sp.Matrix(sp.symbols("g0:3", positive=True))
    a = sp.Matrix(sp.symbols("a0:3", positive=True))
    n = sp.Matrix(sp.symbols("n0:3", real=True))
    b = sp.Matrix(sp.symbols("b0:3", real=True))
    gained = sp.matrix_multiply_elementwise(sp.matrix_multiply_elementwise(g, a), n) + sp.matrix_multiply_elementwise(b, a)
    assert _zero(w * sp.diag(*a).inv() * gained - w * (sp.matrix_multiply_elementwise(g, n) + b))
    checked.append("W diag(a)^-1 ((g a) n + b a) = W (g n + b)  (gains and shifts, move 3)")

    for rows, d in (((4, 3), 3), ((4, 3, 2), 3), ((5, 2, 2), 4)):
        expected = sum(rows) + (len(rows) - 1) * (d - 1)
        assert _table_moves_rank(rows, d) == expected, (rows, d)
    checked.append("the table moves span sum R_j + (k - 1)(d - 1) dimensions  (lemma thm-whole-tables)")
    return checked
