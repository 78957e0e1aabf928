"""numeric_rank after its split into small functions: the same draws, the same decisions, a real error."""

import dataclasses
import importlib

import pytest
import torch

from attnid.counts import count
from attnid.layer import init_params
from attnid.runtime import generator
from attnid.spec import AttentionSpec
from attnid.verification import verify

V = importlib.import_module("attnid.verification")
B = importlib.import_module("attnid.budget")

SEQ_LEN = 5
SEED = 3

LAYOUTS = {
    "MHA": AttentionSpec.create(6, 2),
    "GQA+RoPE": AttentionSpec.create(8, 4, kv_heads=2, rope_fraction=1.0, bias="k"),
    "biases qkvo": AttentionSpec.create(4, 2, bias="qkvo"),
    "sigmoid": AttentionSpec.create(6, 3, kv_heads=1, norm="sigmoid", causal=True, bias="qvo"),
}


def exact_rank(spec: AttentionSpec) -> int:
    c = count(spec)
    assert c.covered
    return c.total - c.unidentified


def inputs_after_rounds(first: int, rounds: int) -> int:
    """Inputs after ``rounds`` extra rounds of the SVD route: each adds max(1, n // 2)."""
    n = first
    for _ in range(rounds):
        n += max(1, n // 2)
    return n


def test_parameter_count_disagreement_is_a_value_error(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = LAYOUTS["MHA"]
    real = count(spec)
    monkeypatch.setattr(V, "count", lambda s: dataclasses.replace(count(s), total=count(s).total + 1))
    with pytest.raises(ValueError, match=rf"has {real.total} parameters but the exact count says {real.total + 1}"):
        V.numeric_rank(spec, seq_len=SEQ_LEN, n_inputs=1)


@pytest.mark.parametrize("name", LAYOUTS)
def test_first_batch_settles_the_rank(name: str) -> None:
    # Default inputs: the first batch is enough (default_inputs' margin), so the SVD route stops at once
    # through the orbit test and the certificate proves the same rank; both equal the exact count.
    spec = LAYOUTS[name]
    first = B.default_inputs(spec, SEQ_LEN)
    svd = V.numeric_rank(spec, seq_len=SEQ_LEN, seed=SEED, method="svd")
    auto = V.numeric_rank(spec, seq_len=SEQ_LEN, seed=SEED, method="dense")
    for result, method in ((svd, "svd"), (auto, "certificate")):
        assert (result.decision.rank, result.n_inputs, result.stable, result.decision.method) == (
            exact_rank(spec), first, True, method)
        assert result.decision.clear


@pytest.mark.parametrize("name", LAYOUTS)
def test_one_input_grows_until_the_rank_is_stable(name: str) -> None:
    # One input cannot show the rank (or certify it): the SVD route adds inputs until the rank stops rising.
    spec = LAYOUTS[name]
    for method in ("svd", "dense"):
        result = V.numeric_rank(spec, seq_len=SEQ_LEN, seed=SEED, n_inputs=1, method=method)
        assert result.decision.method == "svd" and result.stable
        assert result.decision.rank == exact_rank(spec)
        assert result.n_inputs in {inputs_after_rounds(1, k) for k in range(1, B.MAX_EXTRA_ROUNDS + 1)}


def test_rank_still_rising_after_the_last_round_is_unstable() -> None:
    # Two tokens per input and one input to start: after every round the rows still cap the rank.
    spec = AttentionSpec.create(8, 2)
    result = V.numeric_rank(spec, seq_len=2, seed=1, n_inputs=1, method="svd")
    assert not result.stable
    assert result.n_inputs == inputs_after_rounds(1, B.MAX_EXTRA_ROUNDS) == 13  # 1, 2, 3, 4, 6, 9, 13
    assert result.decision.rank < exact_rank(spec)


def test_draws_come_in_the_documented_order(monkeypatch: pytest.MonkeyPatch) -> None:
    # The point first, then the first inputs, then each round's extra inputs, all from generator(seed).
    spec = LAYOUTS["MHA"]
    seen: list[torch.Tensor] = []
    real_jacobian = V.input_jacobian

    def recording(layer, params, x, mode):
        seen.append(x)
        return real_jacobian(layer, params, x, mode)

    monkeypatch.setattr(V, "input_jacobian", recording)
    result = V.numeric_rank(spec, seq_len=SEQ_LEN, seed=SEED, n_inputs=1, method="svd")
    gen = generator(SEED)
    init_params(spec, gen)
    expected = [torch.randn(SEQ_LEN, spec.d_model, generator=gen, dtype=torch.float64) for _ in range(result.n_inputs)]
    assert len(seen) == result.n_inputs > 1
    assert all(torch.equal(a, b) for a, b in zip(seen, expected, strict=True))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"seq_len": 1}, "seq_len must be an integer >= 2"), ({"seq_len": True}, "seq_len must be an integer"),
     ({"n_inputs": 0}, "n_inputs must be a positive integer"), ({"method": "qr"}, "method must be one of auto, dense, svd")],
)
def test_bad_arguments_are_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        V.numeric_rank(LAYOUTS["MHA"], **kwargs)


def test_causal_rope_with_two_tokens_is_refused() -> None:
    # Chapter 6: with a causal mask and two tokens only offset 1 is seen and the fibre is larger than the count.
    spec = AttentionSpec.create(4, 1, rope_fraction=1.0, causal=True)
    with pytest.raises(ValueError, match="seq_len must be >= 3 for a causal layout with RoPE"):
        verify(spec, seq_len=2)
    assert verify(spec, seq_len=3).matches
    assert verify(AttentionSpec.create(4, 1, rope_fraction=1.0), seq_len=2).matches  # no mask: two tokens suffice
