"""The real-text model: corpus, batching, the model around attnid's attention, training and the paired statistic."""

from __future__ import annotations

import hashlib

import pytest
import torch

from attnid import balancing as bal

from attnid import symmetry as sym
from attnid.train import textmodel as tm
from attnid.layer import forward

SMALL = tm.TextModelSpec.create(layers=2, d_model=16, heads=4, kv_heads=2, rope_fraction=0.5, seq_len=12)
NO_ROPE_MHA = tm.TextModelSpec.create(layers=2, d_model=16, heads=4, rope_fraction=0.0, seq_len=12)


@pytest.fixture(scope="module")
def corpus() -> tm.Corpus:
    return tm.load_corpus("sympy")


def test_corpus_is_the_sorted_concatenation_and_its_hash(corpus: tm.Corpus) -> None:
    files = tm.package_sources("sympy")
    assert corpus.files == len(files) > 100
    names = [p.as_posix() for p in files]
    assert names == sorted(names, key=lambda n: n.split("/sympy/", 1)[1]) and all(n.endswith(".py") for n in names)
    raw = b"".join(p.read_bytes() for p in files)
    assert corpus.sha256 == hashlib.sha256(raw).hexdigest()
    assert bytes(corpus.data[:1000].tolist()) == raw[:1000] and corpus.data.numel() == len(raw)
    again = tm.load_corpus("sympy")
    assert again.sha256 == corpus.sha256 and torch.equal(again.data, corpus.data)
    import sympy

    assert corpus.version == sympy.__version__


def test_unknown_package_is_refused() -> None:
    with pytest.raises(ValueError, match="no installed package"):
        tm.load_corpus("no_such_package_here")


def test_split_is_deterministic_disjoint_and_complete() -> None:
    data = torch.arange(1000, dtype=torch.int64) % 251
    data = data.to(torch.uint8)
    train, val = tm.split_corpus(data, block=10, every=10)
    assert train.numel() + val.numel() == 1000 and val.numel() == 100
    blocks = data.reshape(100, 10)
    assert torch.equal(val, blocks[9::10].reshape(-1))
    assert torch.equal(train, blocks[[i for i in range(100) if i % 10 != 9]].reshape(-1))
    with pytest.raises(ValueError, match="block"):
        tm.split_corpus(data, block=1)


def test_batches_have_shifted_targets_and_fixed_batches_repeat() -> None:
    data = torch.arange(200, dtype=torch.uint8)
    x, y = tm.random_batch(data, 5, 8, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (5, 8) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1]) and torch.equal(y[:, -1], x[:, -1] + 1)
    x2, _ = tm.random_batch(data, 5, 8, torch.Generator().manual_seed(0))
    assert torch.equal(x, x2)
    a, b = tm.fixed_batches(data, 4, 8), tm.fixed_batches(data, 4, 8)
    assert torch.equal(a[0], b[0]) and a[0][0, 0] == 0 and a[1][-1, -1] == 199
    with pytest.raises(ValueError, match="shorter"):
        tm.random_batch(data[:5], 2, 8, torch.Generator())


@pytest.mark.parametrize("spec", [SMALL, NO_ROPE_MHA], ids=["gqa-rope", "mha-positions"])
def test_shapes(spec: tm.TextModelSpec) -> None:
    params = tm.init_model(spec, torch.Generator().manual_seed(0), torch.float64)
    assert ("pos" in params) == (spec.attention.rope_dims == 0)
    tokens = torch.randint(0, 256, (3, spec.seq_len), generator=torch.Generator().manual_seed(1))
    assert tm.logits(params, tokens, spec).shape == (3, spec.seq_len, 256)
    with pytest.raises(ValueError, match="seq_len"):
        tm.logits(params, torch.zeros(1, spec.seq_len + 1, dtype=torch.long), spec)
    assert set(tm.layer_attention(params, 1)) == {"W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"}


def test_model_refuses_non_causal_attention() -> None:
    from attnid.spec import AttentionSpec

    with pytest.raises(ValueError, match="causal"):
        tm.TextModelSpec(2, AttentionSpec.create(16, 4), 64, 8)


def test_attention_sublayer_is_attnid_forward_on_the_normed_stream() -> None:
    params = tm.init_model(SMALL, torch.Generator().manual_seed(0), torch.float64)
    h = torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    normed = (h - h.mean(-1, keepdim=True)) / torch.sqrt(h.var(-1, unbiased=False, keepdim=True) + 1e-5)
    expected = forward(tm.layer_attention(params, 1), normed, SMALL.attention)
    assert torch.allclose(tm.attention_block(params, h, SMALL, 1), expected, rtol=0, atol=1e-12)
    # and the model really uses it: changing layer 1's W_V changes the logits
    tokens = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(3))
    moved = dict(params, **{"layer1.attn.W_V": params["layer1.attn.W_V"] * 2})
    assert not torch.allclose(tm.logits(params, tokens, SMALL), tm.logits(moved, tokens, SMALL))


@pytest.mark.parametrize("layer", [0, 1])
def test_a_symmetry_of_one_layer_leaves_the_model_unchanged(layer: int) -> None:
    gen = torch.Generator().manual_seed(4)
    params = tm.init_model(SMALL, gen, torch.float64)
    attn = tm.layer_attention(params, layer)
    moved = sym.apply_group(attn, SMALL.attention, sym.random_group_element(SMALL.attention, gen, scale=0.5))
    delta = torch.zeros_like(attn["b_K"])
    delta[:, SMALL.attention.rope_dims:] = torch.randn(2, 4 - SMALL.attention.rope_dims, generator=gen, dtype=torch.float64)
    moved = sym.shift_key_bias(moved, SMALL.attention, delta)
    new = dict(params, **{tm.attention_prefix(layer) + n: p for n, p in moved.items()})
    assert max((new[n] - params[n]).abs().max() for n in params) > 0.1  # the parameters did move
    tokens = torch.randint(0, 256, (3, 12), generator=gen)
    assert torch.allclose(tm.logits(new, tokens, SMALL), tm.logits(params, tokens, SMALL), rtol=0, atol=1e-10)
    # balancing is a move along the orbit too
    balanced = bal.balance(attn, SMALL.attention)
    new = dict(params, **{tm.attention_prefix(layer) + n: p for n, p in balanced.items()})
    assert torch.allclose(tm.logits(new, tokens, SMALL), tm.logits(params, tokens, SMALL), rtol=0, atol=1e-10)


def test_a_tiny_training_run_lowers_the_validation_loss_and_records_its_measurements() -> None:
    text = b"def f(x):\n    \"\"\"Return x squared.\"\"\"\n    return x * x\n" * 40
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    val = tm.fixed_batches(data, 8, SMALL.seq_len)
    hist = tm.train_text(SMALL, data, val, seed=0, steps=40, batch=8, optimiser="adam", lr=1e-2,
                         measure_every=20, shares_every=20, eval_every=10, dtype=torch.float64)
    assert hist.eval_steps == [10, 20, 30, 40]
    assert hist.val_loss[-1] < hist.val_loss[0] - 1.0, hist.val_loss
    assert [(s, layer) for s, layer, _ in hist.shares] == [(0, 0), (0, 1), (20, 0), (20, 1)]
    assert all(0 <= sh["total"] <= 1 for _, _, sh in hist.shares)
    assert all(len(row) == 10 for row in hist.drift) and hist.drift[-1][2] > 0
    # the model's shares hold the orbit's: each span inside 'model', so no share above the model's
    assert all(sh["model"] >= max(sh["total"], sh["input"], sh["output"]) - 1e-12 for _, _, sh in hist.shares)
    dead = {}
    for _, _, part, _, beyond, _ in hist.dead:
        dead.setdefault(part, []).append(beyond)
    assert set(dead) == {"key_bias", "input_mean", "output_mean"}
    # float64 Adam: the dead key bias does not move (its gradient is round-off, far below eps) ...
    assert max(dead["key_bias"]) < 1e-9, dead["key_bias"]
    # ... but the mean directions, sums of coordinates that Adam rescales one by one, do
    assert min(max(dead["input_mean"]), max(dead["output_mean"])) > 1e-3, dead
    # balancing changes the parametrisation, not the function, at the moment it happens
    again = tm.train_text(SMALL, data, val, seed=0, steps=10, batch=8, optimiser="adam", lr=1e-2,
                          rebalance="balance", balance_every=10, eval_every=10, dtype=torch.float64)
    assert abs(again.val_loss[0] - hist.val_loss[0]) < 1e-9


def test_drift_beyond_decay_is_zero_for_pure_shrinking() -> None:
    # Scaling every parameter by 0.9 (what decoupled decay alone does) scales C and the Grams by 0.81:
    # measured from the shrunk start, nothing drifted; measured from the start itself, it did.
    params = tm.init_model(SMALL, torch.Generator().manual_seed(5), torch.float64)
    attn = tm.layer_attention(params, 0)
    shrunk = {n: 0.9 * p for n, p in attn.items()}
    start_c, now_c = bal.conserved_quantities(attn, SMALL.attention), bal.conserved_quantities(shrunk, SMALL.attention)
    from attnid.train.training import conservation_drift

    assert max(conservation_drift(tuple(0.81 * c for c in start_c), now_c, 1.0)) < 1e-12
    assert min(conservation_drift(start_c, now_c, 1.0)) > 1e-3
    g0, g1 = bal.grams(attn, SMALL.attention), bal.grams(shrunk, SMALL.attention)
    assert max(tm.gram_drift(g0, g1, SMALL.attention, 1.0, scale=0.81)) < 1e-12


def test_train_text_refuses_bad_options() -> None:
    data = torch.arange(100, dtype=torch.uint8)
    val = tm.fixed_batches(data, 2, SMALL.seq_len)
    with pytest.raises(ValueError, match="rebalance"):
        tm.train_text(SMALL, data, val, seed=0, steps=1, batch=1, rebalance="project")
    with pytest.raises(ValueError, match="steps"):
        tm.train_text(SMALL, data, val, seed=0, steps=0, batch=1)


def test_random_gradient_baseline_is_isotropic_noise_for_sgd_and_refuses_unknown_kinds() -> None:
    # With SGD the update is -lr times the injected gradient, so gradient='random' makes it an isotropic
    # Gaussian direction: its share on a u-dimensional subspace of P has E[share^2] = u/P, concentrated for P >> 1.
    text = b"def f(x):\n    return x * x\n" * 40
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    val = tm.fixed_batches(data, 4, SMALL.seq_len)
    hist = tm.train_text(SMALL, data, val, seed=3, steps=6, batch=4, optimiser="sgd", lr=1e-3, shares_every=1,
                         eval_every=6, dtype=torch.float64, gradient="random")
    init = tm.init_model(SMALL, torch.Generator().manual_seed(3), torch.float64)
    attn = tm.layer_attention(init, 0)
    u = sym.orthonormal_span([d for _, d in sym.labelled_tangent_directions(attn, SMALL.attention)], attn).shape[1]
    p = sum(t.numel() for t in attn.values())
    chance = (u / p) ** 0.5
    totals = [sh["total"] for _, _, sh in hist.shares]
    assert len(totals) == 12 and all(0.6 * chance < t < 1.4 * chance for t in totals), (totals, chance)
    # the loss's gradient is not isotropic: its shares are far from chance (exactly zero up to round-off for SGD)
    real = tm.train_text(SMALL, data, val, seed=3, steps=2, batch=4, optimiser="sgd", lr=1e-3, shares_every=1,
                         eval_every=2, dtype=torch.float64)
    assert all(sh["total"] < 1e-8 for _, _, sh in real.shares), real.shares
    with pytest.raises(ValueError, match="gradient"):
        tm.train_text(SMALL, data, val, seed=0, steps=1, batch=1, gradient="noise")


@pytest.mark.slow
def test_real_text_runs_give_the_same_bytes_on_one_or_two_workers() -> None:
    # the experiment's own task function, float32, with shares, drift and dead parameters measured
    from attnid.train.sweep import run_sweep

    spec = tm.TextModelSpec.create(layers=1, d_model=16, heads=4, kv_heads=2, rope_fraction=0.5, seq_len=12)
    settings = tuple(sorted(dict(steps=6, batch=4, optimiser="adamw", lr=1e-2, weight_decay=0.1, eval_every=3,
                                 measure_every=3, shares_every=3).items()))
    tasks = [tm.TextRun(spec, seed, "float32", 4, settings, "sympy", "plain") for seed in (2, 0, 1)]
    one, two = run_sweep(tm.run_text, tasks, jobs=1), run_sweep(tm.run_text, tasks, jobs=2)
    assert [repr(h) for h in one] == [repr(h) for h in two]
    assert [h.shares[0][2]["model"] for h in one] != [one[0].shares[0][2]["model"]] * 3  # the seeds differ
    with pytest.raises(ValueError, match="dtype"):
        tm.TextRun(spec, 0, "bfloat16", 4, settings)
