"""The model's invariant directions (attnid.train.modelsym, textmodel.invariant_subspaces) against the Jacobian's rank.

Every claimed direction must leave the model's output unchanged, and together with the orbit they must
account for the whole null space of the output's Jacobian with respect to the block's parameters at a
random point: no direction claimed that is not there, none missing.
"""

from __future__ import annotations

import pytest
import torch
from torch.func import jacfwd

from attnid.train import modelsym, spans
from attnid.train import textmodel as tm
from attnid.train import textsym as ts
from attnid.train import training as T
from attnid.jacobian import flatten
from attnid.layer import forward
from attnid.rank import numerical_rank
from attnid.spec import AttentionSpec
from attnid.train.trainsweep import copy_invariants

TINY = tm.TextModelSpec.create(layers=2, d_model=8, heads=2, kv_heads=1, rope_fraction=0.5, seq_len=6)  # as the experiment's
TINY_MHA = tm.TextModelSpec.create(layers=1, d_model=8, heads=2, rope_fraction=0.0, bias="qk", seq_len=6)
# b_V without b_O: a constant of the values whose output lies along 1 is invisible too
TINY_QKV = tm.TextModelSpec.create(layers=1, d_model=8, heads=2, rope_fraction=0.0, bias="qkv", seq_len=6)
TINY_O = tm.TextModelSpec.create(layers=1, d_model=8, heads=4, kv_heads=2, rope_fraction=1.0, bias="o", seq_len=6)


def _unflatten(flat: torch.Tensor, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out, start = {}, 0
    for name, p in like.items():
        out[name] = flat[start : start + p.numel()].reshape(p.shape)
        start += p.numel()
    return out


def _nullity(fn, block: dict[str, torch.Tensor]) -> int:
    jac = jacfwd(lambda flat: fn(_unflatten(flat, block)).reshape(-1))(flatten(block))
    return jac.shape[1] - numerical_rank(torch.linalg.svdvals(jac))


def _text_outputs(spec: tm.TextModelSpec, params: dict[str, torch.Tensor], prefix: str, tokens: torch.Tensor):
    """Log-probabilities as a function of the parameters whose names start with ``prefix``."""
    def fn(block):
        return torch.log_softmax(tm.logits(dict(params, **{prefix + n: p for n, p in block.items()}), tokens, spec), -1)
    return fn


def _block(params, prefix):
    return {n.removeprefix(prefix): p for n, p in params.items() if n.startswith(prefix)}


@pytest.mark.parametrize("spec", [TINY, TINY_MHA, TINY_QKV, TINY_O], ids=["gqa-rope-qkvo", "mha-qk", "mha-qkv", "gqa-rope-o"])
@pytest.mark.parametrize("layer", [0, -1])
def test_an_attention_layer_of_the_text_model_has_exactly_its_orbit_and_the_mean_directions(spec, layer) -> None:
    layer %= spec.layers
    params = tm.init_model(spec, torch.Generator().manual_seed(3), torch.float64)
    tokens = torch.randint(0, tm.VOCAB, (16, spec.seq_len), generator=torch.Generator().manual_seed(4))  # enough to see every direction
    prefix = tm.attention_prefix(layer)
    attn = _block(params, prefix)
    dims, P = ts.share_dimensions(attn, spec)
    assert P == sum(p.numel() for p in attn.values())
    assert dims["model"] > dims["total"]  # the model adds directions to the layer's orbit
    assert dims["input"] == sum(attn[w].shape[0] * attn[w].shape[2] for w in modelsym.INPUT_WEIGHTS)
    if "b_V" not in attn or "b_O" in attn:  # then the two kinds of mean directions are independent of the orbit
        assert dims["output"] == spec.attention.heads * spec.attention.v_head_dim + ("b_O" in attn)
        assert dims["model"] == dims["total"] + dims["input"] + dims["output"]
    assert _nullity(_text_outputs(spec, params, prefix, tokens), attn) == dims["model"]


def test_the_mlp_embedding_and_unembedding_counts_match_the_jacobian() -> None:
    params = tm.init_model(TINY, torch.Generator().manual_seed(5), torch.float64)
    tokens = torch.randint(0, tm.VOCAB, (12, TINY.seq_len), generator=torch.Generator().manual_seed(8))
    expected = ts.outside_attention_dimensions(TINY)
    for prefix, key in (("layer1.mlp.", "layer1.mlp"), ("unembed", "unembed")):
        assert _nullity(_text_outputs(TINY, params, prefix, tokens), _block(params, prefix)) == expected[key], key
    small = tokens[:8]  # the embedding: the rows of the bytes present, each with its one move along 1
    embed = {"": params["embed"][small.unique()]}

    def fn(block):
        table = params["embed"].clone()
        table[small.unique()] = block[""]
        return torch.log_softmax(tm.logits(dict(params, embed=table), small, TINY), -1)

    assert _nullity(fn, embed) == small.unique().numel()
    assert expected["embed"] == tm.VOCAB


def test_every_claimed_move_leaves_the_text_model_unchanged() -> None:
    params = tm.init_model(TINY, torch.Generator().manual_seed(6), torch.float64)
    tokens = torch.randint(0, tm.VOCAB, (3, TINY.seq_len), generator=torch.Generator().manual_seed(7))
    attn = tm.layer_attention(params, 1)
    base = torch.log_softmax(tm.logits(params, tokens, TINY), -1)
    for label, d in modelsym.input_output_directions(attn, TINY.attention, *tm.invariant_subspaces(TINY)):
        moved = dict(params, **{tm.attention_prefix(1) + n: attn[n] + 3.0 * d[n] for n in attn})
        assert torch.allclose(torch.log_softmax(tm.logits(moved, tokens, TINY), -1), base, rtol=0, atol=1e-12), label


def test_the_copy_task_adds_the_vocabulary_null_space_and_the_readout_null_space() -> None:
    # d = 16 and a vocabulary of 8: the embeddings span 8 dimensions, the readout sees 8 of 16 (up to a shift)
    spec = AttentionSpec.create(16, 2, causal=True, rope_fraction=1.0)
    problem = T.copy_task(spec, seq_len=12, vocab=8, seed=0)
    params = problem.init(0)
    attn = T.attention_part(params)
    input_null, output_null, normal = copy_invariants(params)  # 8 independent embeddings lie on a hyperplane x . a = 1
    dims = modelsym.model_dimensions(attn, spec, input_null, output_null, normal)
    # without biases or unrotated coordinates, the affine moves are the heads' constant outputs that cancel: 2 d_v - 7
    assert dims["affine"] == 2 * spec.v_head_dim - 7 and dims["model"] > dims["orbit"] + dims["input"] + dims["output"]
    tokens = torch.randint(0, 8, (6, 12), generator=torch.Generator().manual_seed(1))

    def fn(block):
        h = params["embed"][tokens]
        return torch.log_softmax((h + forward(block, h, spec)) @ params["unembed"], -1)

    assert _nullity(fn, attn) == dims["model"] > dims["orbit"]
    shares = modelsym.model_shares({n: torch.randn_like(p) for n, p in attn.items()}, attn, spec, input_null, output_null,
                                   normal)
    assert shares["model"] >= max(shares["total"], shares["input"], shares["output"], shares["affine"])


def test_complement_and_readout_bases_and_bad_shapes() -> None:
    rows = torch.tensor([[1.0, 0.0, 0.0], [2.0, 0.0, 0.0]])
    basis = modelsym.complement(rows)
    assert basis.shape == (3, 2) and torch.allclose(rows.double() @ basis, torch.zeros(2, 2, dtype=torch.float64))
    readout = torch.ones(3, 4, dtype=torch.float64)  # every logit the same linear function: blind up to a shift
    assert modelsym.blind_readout(readout).shape == (3, 3)
    assert modelsym.blind_readout(readout, shift_invariant=False).shape == (3, 2)
    spec = AttentionSpec.create(4, 2)
    attn = {n: p for n, p in tm.attention_init(spec, torch.Generator().manual_seed(0)).items()}
    with pytest.raises(ValueError, match="input basis"):
        modelsym.input_output_directions(attn, spec, torch.ones(3, 1))
    with pytest.raises(ValueError, match="matrix"):
        modelsym.complement(torch.ones(3))
    with pytest.raises(ValueError, match="positive"):
        modelsym.mean_direction(0)
    assert modelsym.affine_normal(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])) is None  # 0 = a1 + a2 - (a1 + a2) would need 1 = 2
    assert modelsym.affine_normal(torch.tensor([[2.0, 0.0], [0.0, 4.0]])).tolist() == pytest.approx([0.5, 0.25])


@pytest.mark.parametrize("options", [dict(bias="none"), dict(bias="qkvo"), dict(bias="o", qk_norm="per-head"),
                                     dict(bias="qko", qk_norm="per-head"), dict(bias="qkvo", norm="sink")],
                         ids=["none", "qkvo", "qknorm-o", "qknorm-qko", "sink-qkvo"])
def test_affine_inputs_give_the_biases_the_layer_may_lack_and_the_jacobian_agrees(options) -> None:
    # inputs on the hyperplane x . a = 1 in d = 8, two heads, RoPE on half: key shifts (not under a QK-norm),
    # value constants (not with a sink), bias trades (always)
    spec = AttentionSpec.create(8, 2, rope_fraction=0.5, **options)
    attn = tm.attention_init(spec, torch.Generator().manual_seed(2))
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(8, generator=gen, dtype=torch.float64)
    x = torch.randn(40, 8, generator=gen, dtype=torch.float64)
    x = x + ((1 - x @ a) / (a @ a))[:, None] * a  # project every row onto x . a = 1
    x = x.reshape(5, 8, 8)
    normal = modelsym.affine_normal(x.reshape(-1, 8))
    dims = modelsym.model_dimensions(attn, spec, normal=normal)
    assert dims["affine"] > 0
    assert _nullity(lambda block: forward(block, x, spec), attn) == dims["model"]


def test_a_qk_norm_layout_has_no_dead_key_bias_and_a_position_table_adds_its_trade() -> None:
    spec = AttentionSpec.create(8, 2, bias="qkvo", qk_norm="per-head")
    attn = tm.attention_init(spec, torch.Generator().manual_seed(0))
    assert tm.dead_key_bias(attn, spec).numel() == 0 and "key_bias" not in tm.dead_parts(attn, spec)
    learned = tm.TextModelSpec.create(layers=1, d_model=8, heads=2, rope_fraction=0.0, seq_len=6)
    params = tm.init_model(learned, torch.Generator().manual_seed(1), torch.float64)
    tokens = torch.randint(0, tm.VOCAB, (4, 6), generator=torch.Generator().manual_seed(2))
    v = torch.randn(8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    moved = dict(params, embed=params["embed"] + v, pos=params["pos"] - v)
    assert torch.allclose(tm.logits(moved, tokens, learned), tm.logits(params, tokens, learned), rtol=0, atol=1e-12)
    assert ts.outside_attention_dimensions(learned)["embed/pos"] == 7


def _orbit_and_moves(spec: tm.TextModelSpec, seed: int):
    """Layer 0 of a random float64 model: its parameters, its orbit's directions and its mean-direction moves."""
    attn = tm.layer_attention(tm.init_model(spec, torch.Generator().manual_seed(seed), torch.float64), 0)
    orbit = [d for _, d in modelsym.sym.labelled_tangent_directions(attn, spec.attention)]
    extra = [d for _, d in modelsym.input_output_directions(attn, spec.attention, *tm.invariant_subspaces(spec))]
    return attn, orbit, extra


def _union_rank(directions, params) -> int:
    return numerical_rank(torch.linalg.svdvals(torch.stack([flatten(d) for d in directions], dim=1)))


@pytest.mark.parametrize("spec", [TINY, TINY_QKV], ids=["gqa-rope-qkvo", "mha-qkv"])
def test_the_model_basis_is_orthonormal_and_spans_the_union_of_orbit_and_moves(spec) -> None:
    attn, orbit, extra = _orbit_and_moves(spec, seed=5)
    basis = modelsym.model_basis(orbit, extra, attn)
    assert basis.shape[1] == _union_rank(orbit + extra, attn)
    assert torch.allclose(basis.T @ basis, torch.eye(basis.shape[1], dtype=basis.dtype), atol=1e-12)
    stacked = torch.stack([flatten(d) for d in orbit + extra], dim=1)
    assert torch.allclose(basis @ (basis.T @ stacked), stacked, atol=1e-10)  # every direction lies in the span
    # moves already inside the orbit add nothing: the residual is round-off and the rank rule drops it
    assert modelsym.model_basis(orbit, orbit[:7], attn).shape[1] == modelsym.span_basis(orbit, attn).shape[1]


def test_a_failed_divide_and_conquer_svd_falls_back_to_the_qr_factor(monkeypatch) -> None:
    attn, orbit, extra = _orbit_and_moves(TINY, seed=6)
    mat = spans.stack(orbit + extra, attn)  # the SVD path of attnid.train.spans (taken where the Gram path cannot decide)
    expected = mat @ spans.svd_coefficients(mat)
    svd, calls = torch.linalg.svd, []

    def flaky(mat, *args, **kwargs):  # fails on the tall matrices, as gesdd did, and on the first square one
        calls.append(tuple(mat.shape))
        if mat.shape[0] > mat.shape[1] or len([c for c in calls if c[0] == c[1]]) == 1:
            raise torch.linalg.LinAlgError("linalg.svd: The algorithm failed to converge")
        return svd(mat, *args, **kwargs)

    monkeypatch.setattr(torch.linalg, "svd", flaky)
    got = mat @ spans.svd_coefficients(mat)
    assert got.shape == expected.shape and any(c[0] == c[1] for c in calls)
    assert torch.allclose(got @ got.T, expected @ expected.T, atol=1e-10)  # the same projection
