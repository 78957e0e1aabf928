"""Exact checks with SymPy: every symbolic check behind a chapter's proof lives in this package.

Each chapter calls one function of a topic module (listed in notes/architecture.md) that returns a
list of ``Identity`` (``identity.py``): the statement, SymPy's result, and whether it holds. The
chapter shows the list and asserts that each holds.

This module holds the exact-rank tools: ``exact_nullity`` evaluates a symbolic Jacobian at a
random integer point and takes its rank exactly. The rank of a Jacobian at any particular point
is at most its generic rank, so the nullity found there is an *upper bound* on the generic nullity (the number of
unidentified parameters). Together with a lower bound from a symmetry group, it proves a
count for one concrete shape with no floating point involved.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import sympy as sp

from attnid.symbolic.identity import IDENTITY_HEAD, Identity, failed, identity_rows, is_zero, zero_identity

__all__ = ["IDENTITY_HEAD", "Identity", "exact_nullity", "failed", "identity_rows", "is_zero", "matrix_symbols",
           "product_map_nullity", "zero_identity"]


def matrix_symbols(name: str, rows: int, cols: int) -> sp.Matrix:
    """A rows x cols matrix of distinct real symbols name{i}_{j}."""
    if rows < 1 or cols < 1:
        raise ValueError(f"matrix shape must be positive, got {rows} x {cols}")
    return sp.Matrix(rows, cols, lambda i, j: sp.Symbol(f"{name}{i}_{j}", real=True))


def exact_nullity(outputs: Sequence[sp.Expr], variables: Sequence[sp.Symbol], seed: int, bound: int = 9) -> int:
    """len(variables) minus the exact rank of d(outputs)/d(variables) at a random integer point.

    The point's coordinates are drawn uniformly from -bound..bound with ``random.Random(seed)``.
    """
    if not variables:
        raise ValueError("variables is empty: nothing to differentiate with respect to")
    if not outputs:
        raise ValueError("outputs is empty: the Jacobian would have no rows")
    if bound < 1:
        raise ValueError(f"bound must be >= 1, got {bound}")
    rng = random.Random(seed)
    point = {v: sp.Integer(rng.randint(-bound, bound)) for v in variables}
    jacobian = sp.Matrix(list(outputs)).jacobian(list(variables))
    return len(variables) - jacobian.subs(point).rank()


def product_map_nullity(d_model: int, head_dim: int, v_head_dim: int, seed: int) -> int:
    """Exact-rank upper bound on the unidentified dimension of one head's product map.

    The map (W_Q, W_K, W_V, W_O) -> (W_Q W_K^T, W_V W_O) is what a single head's function
    factors through; ``exact_nullity`` of its entries at a random integer point bounds the
    generic nullity from above (chapter 2 pairs it with the GL(d_k) x GL(d_v) lower bound).
    """
    wq, wk = matrix_symbols("Q", d_model, head_dim), matrix_symbols("K", d_model, head_dim)
    wv, wo = matrix_symbols("V", d_model, v_head_dim), matrix_symbols("O", v_head_dim, d_model)
    outputs = list(wq * wk.T) + list(wv * wo)
    return exact_nullity(outputs, list(wq) + list(wk) + list(wv) + list(wo), seed=seed)
