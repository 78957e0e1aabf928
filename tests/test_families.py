"""Every attention family follows the Layout protocol: the registry, and each family's functions agreeing."""

from __future__ import annotations

import math

import pytest
import torch

from attnid import families
from attnid.layout import Count, Layout

FAMILIES = families.LAYOUT_FAMILIES


def test_every_family_is_listed_once_with_its_own_layout_type() -> None:
    assert len({f.name for f in FAMILIES}) == len({f.layout for f in FAMILIES}) == len(FAMILIES) >= 2


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_a_family_s_example_follows_the_protocol_and_dispatches_to_it(family) -> None:
    layout = family.example()
    assert isinstance(layout, Layout) and families.family_of(layout) is family
    assert layout.describe() and layout.label() and isinstance(layout.to_dict(), dict)
    assert families.family_named(family.name) is family and family.proofs


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_the_count_adds_up_over_the_parameter_shapes(family) -> None:
    layout = family.example()
    c = families.count(layout)
    assert isinstance(c, Count) and c.covered and c.spec is layout
    assert c.total == sum(math.prod(s) for s in families.parameter_shapes(layout).values())
    assert c.unidentified == sum(c.breakdown.values())


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_the_tangent_directions_leave_the_function_unchanged_to_first_order(family) -> None:
    # d/dt f(p + t v) at t = 0 vanishes for every column v of the tangent basis (a forward-mode JVP, float64)
    layout = family.example()
    gen = torch.Generator().manual_seed(3)
    params = families.init_params(layout, gen)
    x = torch.randn(5, layout.d_model, generator=gen, dtype=torch.float64)
    basis = families.tangent_basis(params, layout)
    assert basis.shape[0] == sum(p.numel() for p in params.values()) and basis.shape[1] >= 1
    names = list(params)
    for column in basis.T[:12]:
        pieces = torch.split(column, [params[n].numel() for n in names])
        tangent = {n: t.reshape(params[n].shape) for n, t in zip(names, pieces)}
        _, change = torch.func.jvp(lambda p: families.forward(p, x, layout), (dict(params),), (tangent,))
        assert float(change.abs().max()) < 1e-10 * max(1.0, float(column.abs().max()))


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_the_numeric_check_agrees_with_the_count(family) -> None:
    result = families.verify(family.example())
    assert result.matches and result.exact == result.numeric_unidentified == families.count(family.example()).unidentified
    assert result.decision.clear


def test_an_unknown_layout_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="not a layout of a known attention family: dict"):
        families.count({"d_model": 8})
    with pytest.raises(ValueError, match="unknown attention family 'linear'"):
        families.family_named("linear")
