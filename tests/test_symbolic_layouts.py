"""The exact checks of chapters 4 to 7 (attnid.symbolic.layouts and attnid.symbolic.biases)."""


import sympy as sp

from attnid.symbolic import Identity
from attnid.symbolic.biases import dead_key_bias
from attnid.symbolic.layouts import (
    _sign_identity,
    gqa_ratio,
    gqa_shared_group_element,
    rope_commutant,
    rope_ratio,
    scaled_rotated_scores,
    smallest_standard_ratio,
)

d, H, G = sp.symbols("d H G", positive=True)


def _results(checks: list[Identity]) -> list[sp.Expr]:
    return [sp.sympify(c.result, locals={"d": d, "H": H, "G": G}) for c in checks]


def _equal(result: sp.Expr, expected: sp.Expr) -> bool:
    return sp.simplify(result - expected) == 0


def test_smallest_ratios_are_the_known_values() -> None:
    # the GQA ratio G/(H(H+G)) at H = d, G = 1, and the full-RoPE ratio at H = d/2, G = 1
    results = _results(smallest_standard_ratio())
    expected = [-G * (2 * H + G) / (H**2 * (H + G) ** 2), 1 / (H + G) ** 2, 1 / (d * (d + 1)), 0, 2 / (d + 1),
                sp.diff(G * (1 + d / H) / (2 * d * (H + G)), H), (H + d) / (2 * d * (H + G) ** 2), 3 / (d * (d + 2)),
                3 / (d * (d + 2)) - 1 / (d * (d + 1))]
    assert len(results) == len(expected)
    assert all(_equal(r, e) for r, e in zip(results, expected, strict=True))


def test_gqa_and_rope_ratios_are_the_known_values() -> None:
    # P = d * (d/H) * (2H + 2G) and 2G (d/H)^2 unidentified; full RoPE: H (d/H + (d/H)^2) / (4 d^2)
    mqa_mha = _results(gqa_ratio())
    assert _equal(mqa_mha[0], 2 * G * d**2 / H**2 / (d * d / H * (2 * H + 2 * G)))
    assert _equal(mqa_mha[1], 1 / (H * (H + 1)))
    assert _equal(mqa_mha[2], 1 / (2 * H))
    assert _equal(_results(rope_ratio())[0], (H + d) / (4 * H * d))


def test_commutant_is_the_span_of_i_and_j() -> None:
    solved, dimension = rope_commutant()
    m = sp.Matrix(sp.sympify(solved.result))
    assert m[0, 0] == m[1, 1] and m[0, 1] == -m[1, 0] and m[0, 1] != 0  # a I + b J with b free
    r, dk = 4, 5
    assert dimension.result == str(r + (dk - r) ** 2)


def test_residuals_are_zero_and_biases_have_the_known_terms() -> None:
    for check in (scaled_rotated_scores, gqa_shared_group_element):
        assert all(c.result == "Matrix([[0, 0], [0, 0]])" for c in check())
    softmax_shift, key_terms = dead_key_bias()
    assert softmax_shift.result == "[0, 0, 0]"
    x1, x2, bq1, bq2, bk1, bk2 = sp.symbols("x1 x2 bq1 bq2 bk1 bk2")
    q = sp.Matrix(2, 2, sp.symbols("q1:5"))
    expected = ((sp.Matrix([[x1, x2]]) * q + sp.Matrix([[bq1, bq2]])) * sp.Matrix([bk1, bk2]))[0]
    assert sp.expand(sp.sympify(key_terms.result) - expected) == 0


def test_a_wrong_claim_does_not_hold() -> None:
    ratio = G / (H * (H + G))
    slope = sp.diff(ratio, H)
    assert _sign_identity("right", slope, -(2 * H + G) * G / (H**2 * (H + G) ** 2), -1).holds
    assert not _sign_identity("wrong value", slope, -(H + G) * G / (H**2 * (H + G) ** 2), -1).holds
    assert not _sign_identity("wrong sign", slope, slope, 1).holds
