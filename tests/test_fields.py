"""One field schema: the same bad value through every door gets the same rule in its message."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from attnid.families import mla
from attnid.census import load_layouts
from attnid.cli import main
from attnid.fields import FIELDS, MAX_WIDTH, check, rope_columns, show
from attnid.hf.config import count_config
from attnid.kernels.arguments import check_inputs
from attnid.spec import AttentionSpec

LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2}
MLA_BASE = dict(d_model=8, heads=2, kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2, q_lora_rank=4)


def _message(action: Callable[[], object]) -> str:
    with pytest.raises((TypeError, ValueError)) as info:
        action()
    return str(info.value)


def _census(tmp_path: Path, **fields: object) -> str:
    entry = {"d_model": 8, "heads": 2, "kv_heads": 2, "head_dim": 4, "layers": 1, **fields}
    path = tmp_path / "layouts.yaml"
    path.write_text("models:\n  m:\n" + "".join(f"    {k}: {v}\n" for k, v in entry.items()))
    return _message(lambda: load_layouts(path))


def _cli(capsys: pytest.CaptureFixture, *flags: str) -> str:
    with pytest.raises(SystemExit):
        main(["count", *flags])
    return capsys.readouterr().err


def _kernels(**options: object) -> str:
    q = torch.zeros(1, 2, 4, 8)
    base = dict(causal=False, rope_fraction=0.0, rope_base=10000.0, sink=None, scale=None)
    return _message(lambda: check_inputs(q, q, q, **{**base, **options}))


def test_a_rope_base_out_of_range_gets_one_rule_at_every_door(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rule = FIELDS["rope_base"].rule
    assert rule == "a number in [1 + 1e-6, 1e12]"
    doors = {
        "AttentionSpec": _message(lambda: AttentionSpec.create(8, 2, rope_fraction=1.0, rope_base=0.5)),
        "MLASpec": _message(lambda: mla.MLASpec(**MLA_BASE, rope_base=0.5)),
        "census": _census(tmp_path, rope_base=0.5),
        "config.json": _message(lambda: count_config({**LLAMA, "rope_theta": 0.5})),
        "CLI": _cli(capsys, "--d-model", "8", "--heads", "2", "--rope-base", "0.5"),
        "kernels": _kernels(rope_base=0.5),
    }
    for door, message in doors.items():
        assert f"must be {rule}, got " in message and "0.5" in message, (door, message)


def test_a_width_out_of_range_gets_one_rule_at_every_door(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rule = f"must be an integer from 1 to {MAX_WIDTH:,}, got 0"
    doors = {
        "AttentionSpec": _message(lambda: AttentionSpec.create(0, 2)),
        "MLASpec": _message(lambda: mla.MLASpec(**{**MLA_BASE, "d_model": 0})),
        "census": _census(tmp_path, d_model=0),
        "config.json": _message(lambda: count_config({**LLAMA, "hidden_size": 0})),
        "CLI": _cli(capsys, "--d-model", "0", "--heads", "2"),
    }
    for door, message in doors.items():
        assert rule in message.replace("'0'", "0"), (door, message)


def test_a_rope_fraction_out_of_range_gets_one_rule_at_every_door(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rule = "must be a number in [0, 1], got "
    doors = {
        "AttentionSpec": _message(lambda: AttentionSpec.create(8, 2, rope_fraction=1.5)),
        "census": _census(tmp_path, rope_fraction=1.5),
        "config.json": _message(lambda: count_config({**LLAMA, "model_type": "phi", "partial_rotary_factor": 1.5})),
        "CLI": _cli(capsys, "--d-model", "8", "--heads", "2", "--rope-fraction", "1.5"),
        "kernels": _kernels(rope_fraction=1.5),
    }
    for door, message in doors.items():
        assert rule in message and "1.5" in message, (door, message)


@pytest.mark.parametrize(("name", "value", "error"), [
    ("d_model", True, TypeError), ("d_model", 8.0, TypeError), ("d_model", MAX_WIDTH + 1, ValueError),
    ("rope_base", float("nan"), ValueError), ("rope_base", float("inf"), ValueError), ("rope_base", 10**400, ValueError),
    ("rope_fraction", "0.5", TypeError), ("qk_rope_head_dim", 3, ValueError), ("qk_norm_eps", -1e-9, ValueError),
    ("layers", 10**9, ValueError),
])
def test_the_schema_refuses_with_its_rule(name: str, value: object, error: type) -> None:
    with pytest.raises(error, match=f"^{name} must be "):
        check(name, value)


def test_the_schema_returns_canonical_values_and_the_boundaries_are_inside() -> None:
    assert check("rope_base", 10000) == 10000.0 and isinstance(check("rope_base", 10000), float)
    assert check("d_model", MAX_WIDTH) == MAX_WIDTH and check("qk_rope_head_dim", 0) == 0
    assert check("rope_base", 1 + 1e-6) == 1 + 1e-6 and check("rope_base", 1e12) == 1e12
    assert rope_columns(0.5, 8) == 4
    with pytest.raises(ValueError, match="not a whole number"):
        rope_columns(0.3, 8)
    with pytest.raises(ValueError, match="gives odd r = 1"):
        rope_columns(0.125, 8)
    assert show(1e12) == "1000000000000" and show(0.5) == "0.5" and show(True) == "True"


def test_integer_fields_take_any_integral_type_and_store_a_plain_int() -> None:
    import numpy as np
    import torch

    from attnid.families.mla import MLASpec
    from attnid.spec import AttentionSpec

    spec = AttentionSpec.create(d_model=np.int64(8), heads=torch.tensor(2), rope_fraction=np.float64(0.5),
                                window=np.int32(4), causal=True)
    assert spec == AttentionSpec.create(8, 2, rope_fraction=0.5, window=4, causal=True)
    for name in ("d_model", "heads", "kv_heads", "head_dim", "v_head_dim", "rope_dims", "window"):
        assert type(getattr(spec, name)) is int, name
    assert type(spec.rope_base) is float and type(spec.qk_norm_eps) is float
    latent = MLASpec(d_model=np.int64(8), heads=2, kv_lora_rank=np.int16(4), qk_nope_head_dim=2, qk_rope_head_dim=2,
                     v_head_dim=2, q_lora_rank=np.uint8(4))
    assert type(latent.d_model) is int and type(latent.kv_lora_rank) is int and type(latent.q_lora_rank) is int
    with pytest.raises(TypeError, match="d_model must be an integer"):
        AttentionSpec.create(d_model=np.float64(8), heads=2)
