"""The exact checks behind chapters 9 and 10 and the kernel appendix (attnid.symbolic.training, .kernels)."""

import pytest
import sympy as sp

from attnid.symbolic import Identity, failed
from attnid.symbolic.kernels import online_softmax_identities
from attnid.symbolic.training import balanced_point_stationarity, gradient_step_conservation


def _all_hold(checks: list[Identity]) -> None:
    assert checks
    assert not failed(checks), failed(checks)
    assert all(c.holds for c in checks)


def test_gradient_step_conservation_holds() -> None:
    checks = gradient_step_conservation()
    _all_hold(checks)
    # one step multiplies a^2 - b^2 by (1 - eta g)(1 + eta g): the factored form the chapter shows
    a, b, eta, g = sp.symbols("a b eta g", real=True)
    assert checks[0].result == str(sp.factor((a - b) * (a + b) * (1 - eta * g) * (1 + eta * g)))
    assert checks[1].result == checks[2].result == str(sp.zeros(2, 2))


@pytest.mark.parametrize("shape", [(1, 1), (2, 1), (4, 3)])
def test_gradient_step_conservation_at_other_shapes(shape: tuple[int, int]) -> None:
    checks = gradient_step_conservation(*shape)
    _all_hold(checks)
    assert checks[1].result == str(sp.zeros(shape[1], shape[1]))


def test_gradient_step_conservation_rejects_an_empty_factor() -> None:
    with pytest.raises(ValueError, match="factor shape must be positive"):
        gradient_step_conservation(0, 2)


def test_balanced_point_stationarity_holds() -> None:
    checks = balanced_point_stationarity()
    _all_hold(checks)
    assert [c.result for c in checks[:3]] == ["0", "0", "0"]
    # a^2 t^2 + b^2 / t^2 has derivative 2 a^2 t - 2 b^2 / t^3: zero at t^4 = b^2 / a^2, t = sqrt(b / a) > 0,
    # where (a t)^2 = a^2 b / a = a b
    assert checks[3].result == "[sqrt(b)/sqrt(a)]"
    assert checks[4].result == "a*b"


def test_online_softmax_identities_hold() -> None:
    checks = online_softmax_identities()
    _all_hold(checks)
    assert [c.result for c in checks] == ["0"] * 4


def test_online_softmax_holds_for_every_split_of_the_keys() -> None:
    _all_hold(online_softmax_identities(((0,), (1,), (2,))))


def test_a_tiling_that_misses_a_key_fails() -> None:
    # the recurrence over blocks {1, 2} alone is the softmax of two keys, not of three: the lemma and the
    # tangent recurrence must fail, while the two identities that do not use the blocks still hold
    checks = online_softmax_identities(((0, 1),))
    assert [c.holds for c in checks] == [False, False, True, True]
    assert failed(checks) == [checks[0].statement, checks[1].statement]
    assert checks[0].result != "0"


@pytest.mark.parametrize("blocks", [(), ((0,), ()), ((0, 3),), ((-1, 0),)])
def test_online_softmax_rejects_bad_blocks(blocks: tuple[tuple[int, ...], ...]) -> None:
    with pytest.raises(ValueError, match="blocks must be|block indices"):
        online_softmax_identities(blocks)
