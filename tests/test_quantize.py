"""Round-to-nearest quantisation and the orbit moves of the quantisation experiment (attnid.hf.quantize)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnid.hf import quantize as qz
from attnid.layer import forward, init_params
from attnid.spec import AttentionSpec


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_rtn_uses_its_levels_and_errs_by_at_most_half_a_step(bits: int) -> None:
    w = torch.randn(16, 40, dtype=torch.float64, generator=torch.Generator().manual_seed(bits))
    q = qz.rtn(w, bits)
    levels = 2 ** (bits - 1) - 1
    step = w.abs().amax(dim=1, keepdim=True) / levels
    assert torch.all((q - w).abs() <= step / 2 + 1e-15)
    codes = q / step
    assert torch.allclose(codes, codes.round()) and codes.abs().max() <= levels + 1e-9
    assert torch.allclose(qz.rtn(q, bits), q, rtol=0, atol=1e-14)  # already on the grid: unchanged


def test_tuned_clipping_is_never_worse_per_channel_and_sometimes_better() -> None:
    w = torch.randn(64, 128, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    w[:, 0] *= 20  # an outlier per row: clipping it pays at 4 bits
    plain, tuned = ((qz.rtn(w, 4) - w) ** 2).sum(1), ((qz.rtn_clipped(w, 4) - w) ** 2).sum(1)
    assert torch.all(tuned <= plain) and torch.any(tuned < plain)


def test_hadamard_is_orthogonal_and_refuses_other_orders() -> None:
    h = qz.hadamard(32)
    assert torch.allclose(h @ h.T, torch.eye(32, dtype=torch.float64), atol=1e-14)
    assert torch.allclose(h.abs(), torch.full_like(h, 32 ** -0.5))
    with pytest.raises(ValueError, match="power-of-two"):
        qz.hadamard(24)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_rotating_heads_keeps_the_function(kv_heads: int) -> None:
    spec = AttentionSpec.create(16, 4, kv_heads=kv_heads, bias="qkvo")
    gen = torch.Generator().manual_seed(1)
    params = init_params(spec, gen)
    rotations = [(qz._orthogonal(spec.head_dim, gen), qz._orthogonal(spec.v_head_dim, gen)) for _ in range(kv_heads)]
    moved = qz.rotate_heads(params, spec, rotations)
    x = torch.randn(3, 6, 16, dtype=torch.float64, generator=gen)
    y = forward(params, x, spec)
    assert torch.allclose(forward(moved, x, spec), y, atol=1e-12 * float(y.abs().max()))
    assert not torch.allclose(moved["W_Q"], params["W_Q"])
    with pytest.raises(ValueError, match="without RoPE"):
        qz.rotate_heads(params, AttentionSpec.create(16, 4, rope_fraction=1.0), rotations)


def test_sentences_keep_prose_and_drop_code_tables_and_front_matter(tmp_path: Path) -> None:
    card = tmp_path / "README.md"
    card.write_text("---\ntags:\n- a\n---\n# Title\nThis sentence has more than six words in it. Short one.\n"
                    "```python\nprint('this line of code has many words in it too')\n```\n| a | table | row | with | many | words |\n"
                    "See [the link text](http://x) for the details of the training run.\n")
    licence = tmp_path / "LICENSE"
    licence.write_text("You may not use this file except in compliance with the License.\n")
    assert qz.sentences(card, licence) == ["This sentence has more than six words in it.",
                                           "See the link text for the details of the training run.",
                                           "You may not use this file except in compliance with the License."]
