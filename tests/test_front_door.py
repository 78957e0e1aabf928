"""One front door: attnid.count, attnid.verify and attnid.forward take a layout of any family."""

from __future__ import annotations

import pytest
import torch

import attnid
from attnid import families
from attnid.families import alibi, gated, mla, relbias
from attnid.layout import VerificationResult
from attnid.budget import MemoryLimitExceeded

LAYOUTS = {
    "multi-head": attnid.AttentionSpec.create(8, 2, kv_heads=1, bias="qkvo"),
    "output-gated": gated.example(),
    "alibi": alibi.example(),
    "latent": mla.example(),
    "relative-bias": relbias.example(),
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_count_and_forward_take_every_family(name: str) -> None:
    layout = LAYOUTS[name]
    family = families.family_of(layout)
    assert family.name == name
    assert attnid.count(layout) == family.count(layout)
    params = attnid.init_params(layout, attnid.generator(0))
    assert sum(p.numel() for p in params.values()) == attnid.count(layout).total
    x = torch.randn(2, 6, layout.d_model, dtype=torch.float64, generator=attnid.generator(1))
    assert torch.equal(attnid.forward(params, x, layout), family.forward(params, x, layout))


@pytest.mark.parametrize("name", LAYOUTS)
def test_verify_gives_one_result_type_on_every_family(name: str) -> None:
    layout = LAYOUTS[name]
    result = attnid.verify(layout, seed=0)
    assert isinstance(result, VerificationResult)
    assert result.total == attnid.count(layout).total and result.exact == attnid.count(layout).unidentified
    assert result.matches is True and result.numeric_unidentified == result.exact
    assert result.n_inputs >= 1 and result.seq_len >= 2 and result.decision.clear


@pytest.mark.parametrize("name", LAYOUTS)
def test_the_memory_limit_and_method_apply_on_every_route(name: str) -> None:
    layout = LAYOUTS[name]
    estimate = families.estimate(layout)
    assert estimate.n_params == attnid.count(layout).total and estimate.bytes > 0
    with pytest.raises(MemoryLimitExceeded, match="above the limit"):
        attnid.verify(layout, max_bytes=estimate.bytes // 100)
    with pytest.raises(ValueError, match="method must be one of"):
        attnid.verify(layout, method="nope")


def test_a_layout_of_no_family_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="not a layout of a known attention family: dict"):
        attnid.count({"d_model": 8})
