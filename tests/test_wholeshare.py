"""The whole-model span of the real-text model (attnid.train.wholeshare) against the float64 Jacobian: its dimension is
the nullity of the log-probabilities as a function of every parameter, and the shares behave as projections."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.func import jacfwd

from attnid.jacobian import flatten, unflatten
from attnid.rank import numerical_rank
from attnid.train import textmodel as tm
from attnid.train import textsym as ts
from attnid.train import wholeshare as ws
from attnid.train.residual import rotate_residual, rotation_dimension

SPECS = {"rope": tm.TextModelSpec.create(layers=2, d_model=8, heads=2, kv_heads=1, rope_fraction=0.5, seq_len=6),
         "positions": tm.TextModelSpec.create(layers=2, d_model=8, heads=2, rope_fraction=0.0, bias="qk", seq_len=6)}


def _small_copy(spec: tm.TextModelSpec, seed: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A float64 point of a copy small enough for a full Jacobian, and inputs that see every direction of it.

    The inputs are 80 windows over an alphabet of 12 bytes; the token table keeps those 12 rows and the
    unembedding 16 of its 256 columns (a 16-way output). A row no input holds would only add its own d
    directions (the data's to count, not the model's); each token shows the rest of the model at most d - 1
    independent directions (its normed state), so there must be enough tokens."""
    params = tm.init_model(spec, torch.Generator().manual_seed(seed), torch.float64)
    gen = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, 12, (80, spec.seq_len), generator=gen)
    return dict(params, embed=params["embed"][:12], unembed=params["unembed"][:, :16]), tokens


@pytest.mark.parametrize("kind", SPECS)
def test_the_span_is_the_null_space_of_the_whole_models_jacobian(kind: str) -> None:
    spec = SPECS[kind]
    params, tokens = _small_copy(spec, 3)
    span = ws.whole_span(params, spec.attention)
    jac = jacfwd(lambda flat: torch.log_softmax(tm.logits(unflatten(flat, params), tokens, spec), -1).reshape(-1))(
        flatten(params))
    _, singular, vh = torch.linalg.svd(jac, full_matrices=False)
    rank = numerical_rank(singular)
    assert span.dimension == jac.shape[1] - rank
    assert span.parameters == jac.shape[1]
    # not only the dimension: E is the Jacobian's null space (a seen direction has share 0, an unseen one share 1)
    gen = torch.Generator().manual_seed(7)
    seen = torch.randn(rank, generator=gen, dtype=torch.float64) @ vh[:rank]
    unseen = torch.randn(jac.shape[1] - rank, generator=gen, dtype=torch.float64) @ vh[rank:]
    assert ws.whole_share(unflatten(seen, params), span)["whole"] < 1e-6
    assert abs(ws.whole_share(unflatten(unseen, params), span)["whole"] - 1) < 1e-6


@pytest.mark.parametrize("kind", SPECS)
def test_the_full_size_span_is_the_blocks_directions_and_the_rotations(kind: str) -> None:
    spec = SPECS[kind]
    params = tm.init_model(spec, torch.Generator().manual_seed(5), torch.float64)
    per_layer = sum(ts.share_dimensions(tm.layer_attention(params, layer), spec)[0]["model"] for layer in range(2))
    outside = sum(ts.outside_attention_dimensions(spec).values())
    span = ws.whole_span(params, spec.attention)
    assert span.local_dimension == per_layer + outside
    assert span.dimension == per_layer + outside + rotation_dimension(spec.d_model)


def test_shares_of_a_rotation_a_gradient_and_a_random_update() -> None:
    spec = SPECS["rope"]
    params = tm.init_model(spec, torch.Generator().manual_seed(0), torch.float64)
    span = ws.whole_span(params, spec.attention)
    gen = torch.Generator().manual_seed(1)
    skew = torch.randn(spec.d_model - 1, spec.d_model - 1, generator=gen, dtype=torch.float64)
    turn = torch.linalg.matrix_exp(1e-7 * span.complement @ (skew - skew.T) @ span.complement.T)
    turned = rotate_residual(params, turn)
    along = ws.whole_share({n: turned[n] - params[n] for n in params}, span)
    assert abs(along["whole"] - 1) < 1e-6 and along["blocks"] < 0.5  # the rotation lies in E, not in the blocks' span
    point = {n: p.clone().requires_grad_() for n, p in params.items()}
    tokens = torch.randint(0, tm.VOCAB, (4, spec.seq_len), generator=gen)
    torch.log_softmax(tm.logits(point, tokens, spec), -1).sum().backward()  # a float64 loss: cross-entropy's form
    assert ws.whole_share({n: p.grad for n, p in point.items()}, span)["whole"] < 1e-12
    shares = [ws.whole_share({n: torch.randn(p.shape, generator=gen, dtype=torch.float64) for n, p in params.items()},
                             span)["whole"] ** 2 for _ in range(40)]
    chance = span.dimension / span.parameters  # E[share^2] of an isotropic update
    assert abs(sum(shares) / len(shares) - chance) < 0.2 * chance


def test_the_rotations_gram_matrix_is_r_transpose_r() -> None:
    """rotation_gram (from d x d products) against R^T applied to every rotation direction built explicitly."""
    spec = SPECS["positions"]
    params = tm.init_model(spec, torch.Generator().manual_seed(2), torch.float64)
    span = ws.whole_span(params, spec.attention)
    n = spec.d_model - 1
    i, j = torch.triu_indices(n, n, 1)
    columns: dict[str, list[torch.Tensor]] = {name: [] for name in params}
    for a, b in zip(i.tolist(), j.tolist()):
        unit = torch.zeros(n, n, dtype=torch.float64)
        unit[a, b], unit[b, a] = 2.0**-0.5, -(2.0**-0.5)
        skew = span.complement @ unit @ span.complement.T
        moved = rotate_residual(params, torch.eye(spec.d_model, dtype=torch.float64) + skew)  # linear in skew
        for name in params:
            columns[name].append(moved[name] - params[name])
    direct = ws.rotation_adjoint({k: torch.stack(v) for k, v in columns.items()}, params, span.complement)
    assert torch.allclose(ws.rotation_gram(params, span.complement), direct, rtol=1e-12, atol=1e-10 * direct.abs().max())


def test_a_zero_update_and_an_unknown_parameter_are_refused() -> None:
    spec = SPECS["rope"]
    params = tm.init_model(spec, torch.Generator().manual_seed(0), torch.float64)
    span = ws.whole_span(params, spec.attention)
    with pytest.raises(ValueError, match="the update is zero"):
        ws.whole_share({n: torch.zeros_like(p) for n, p in params.items()}, span)
    with pytest.raises(ValueError, match="does not know the parameter"):
        ws.whole_span(dict(params, **{"layer0.attn.sink": torch.zeros(2)}), spec.attention)


def test_training_records_the_whole_share_zero_for_gradient_descent_and_not_for_adamw() -> None:
    spec = SPECS["rope"]
    data = torch.randint(0, tm.VOCAB, (4096,), generator=torch.Generator().manual_seed(2), dtype=torch.uint8)
    val = tm.fixed_batches(data, 4, spec.seq_len)
    runs = {opt: tm.train_text(spec, data, val, seed=0, steps=4, batch=4, optimiser=opt, lr=0.05, dtype=torch.float64,
                               whole_every=2, eval_every=4) for opt in ("sgd", "adamw")}
    assert [step for step, _ in runs["sgd"].whole] == [0, 2]
    assert all(s["whole"] < 1e-6 for _, s in runs["sgd"].whole)  # the loss is evaluated in float32: its round-off
    assert all(0.05 < s["blocks"] <= s["whole"] < 1 for _, s in runs["adamw"].whole)
    with pytest.raises(ValueError, match="whole_every >= 0"):
        tm.train_text(spec, data, val, seed=0, steps=1, batch=1, whole_every=-1)


def test_the_whole_share_experiment_trains_the_real_text_experiments_model() -> None:
    """experiments/real_text_whole.ipynb repeats the settings of experiments/real_text.ipynb: the two must not drift."""
    import nbformat

    def parameters(name: str) -> dict:
        nb = nbformat.read(Path(__file__).resolve().parents[1] / "experiments" / f"{name}.ipynb", as_version=4)
        cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
        values: dict = {}
        exec(cell.source, {}, values)  # the cell assigns literals only
        return values

    real, whole = parameters("real_text"), parameters("real_text_whole")
    shared = ("SEEDS", "DTYPE", "CORPUS_PACKAGE", "CORPUS_VERSION", "CORPUS_SHA256", "LAYERS", "D_MODEL", "HEADS",
              "KV_HEADS", "ROPE_FRACTION", "BIAS", "SEQ_LEN", "BATCH", "STEPS", "OPTIMISER", "LR", "WEIGHT_DECAY",
              "CONTROL_OPTIMISER", "CONTROL_LR", "VAL_WINDOWS")
    assert {k: whole[k] for k in shared} == {k: real[k] for k in shared}
