"""The chapters' shared checks."""

import pytest

from attnbook.tables import format_rows
from attnid.checks import invariance_error, key_bias_gradient_ratio, off_orbit_change, verify_grid
from attnid.spec import AttentionSpec


def test_verify_grid_and_table() -> None:
    specs = [AttentionSpec.create(4, 1), AttentionSpec.create(4, 2, kv_heads=1, rope_fraction=1.0)]
    rows = verify_grid(specs, seed=1)
    assert [r.exact for r in rows] == [32, 2 * 1 + 4]  # d_k^2 + d_v^2 = 16 + 16; MQA RoPE: G (d_k + d_v^2)
    assert all(r.matches is True and r.exact == r.numeric for r in rows)
    text = format_rows(rows, columns=("d", "H", "G", "r"))
    assert text.splitlines()[0].split() == ["d", "H", "G", "r", "P", "exact", "numeric", "match"]
    assert len(text.splitlines()) == 3
    with pytest.raises(ValueError, match="unknown column"):
        format_rows(rows, columns=("width",))


@pytest.mark.parametrize("spec", [AttentionSpec.create(8, 4, kv_heads=2, bias="qkvo", rope_dims=2),
                                  AttentionSpec.create(6, 3, kv_heads=1, bias="qkvo", norm="sink", sink_learned=True)])
def test_symmetries_are_invisible_and_other_moves_are_not(spec: AttentionSpec) -> None:
    assert invariance_error(spec, seed=2) < 1e-12
    assert off_orbit_change(spec, seed=2) > 1e-8


def test_key_bias_gradient_ratio() -> None:
    assert key_bias_gradient_ratio(AttentionSpec.create(8, 2, bias="qk", causal=True)) < 1e-13
    assert key_bias_gradient_ratio(AttentionSpec.create(8, 2, bias="qk", norm="sigmoid")) > 1e-3
    with pytest.raises(ValueError, match="needs both a query and a key bias"):
        key_bias_gradient_ratio(AttentionSpec.create(8, 2, bias="k"))
