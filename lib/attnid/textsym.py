"""What the real-text model of ``attnid.textmodel`` cannot see, beyond each attention layer's orbit.

Every norm of that model is a layer norm without gain or shift, which subtracts the mean. So:

* every attention (and MLP) input is orthogonal to the all-ones vector 1, and W + 1 a^T changes
  nothing for W = W_Q, W_K, W_V, W_in;
* every later read of the residual stream goes through such a norm, so whatever a layer adds along
  1 is invisible: W_O + a 1^T, b_O + c 1, W_out + a 1^T, b_out + c 1, a row E[x] + c 1 of the embedding
  (and, with a position table, E + v on every row against P - v);
* the unembedding U can move by 1 a^T (its input is a norm's output) and by v 1^T (softmax
  cross-entropy ignores a constant added to every logit).

``invariant_subspaces`` gives the first two to ``attnid.modelsym`` (the moves in the attention
layer's parameter layout); ``share_dimensions`` counts every span the shares of an update use;
``outside_attention_dimensions`` counts the moves outside the attention layers; ``dead_parts`` names
the parameters the loss cannot see. Scaling the whole residual stream would be invisible too but for
the norm's eps = 1e-5: weakly identified, not counted. tests/test_modelsym.py checks every count
against the rank of the model's Jacobian on small copies of the model.

(``attnid.textmodel.train_text`` still measures shares against the layer's orbit only and records
the dead key bias alone: changing it makes the real-text experiment's data stale, so it moves to
these functions together with that experiment's next run.)
"""

from __future__ import annotations

import torch

from . import modelsym
from . import symmetry as sym
from .spec import AttentionSpec, Params
from .textmodel import VOCAB, TextModelSpec
from .training import KINDS

DEAD_PARTS = ("key_bias", "input_mean", "output_mean")


def invariant_subspaces(spec: TextModelSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_null, output_null) of every attention layer for ``attnid.modelsym``: both span(1), exactly."""
    one = modelsym.mean_direction(spec.d_model)
    return one, one


def dead_key_bias(attn: Params, spec: AttentionSpec) -> torch.Tensor:
    """The coordinates of b_K that softmax cannot see: the unrotated ones, b_K[:, r:] (empty without b_K or with a QK-norm).

    ``attnid.textmodel.dead_key_bias`` is the same without the QK-norm case (its model has none).
    """
    if "b_K" not in attn or not spec.shift_invariant or spec.has_qk_norm:  # a QK-norm sees every coordinate
        return torch.zeros(0)
    return attn["b_K"][:, spec.rope_dims:].reshape(-1)


def dead_parts(attn: Params, spec: AttentionSpec) -> dict[str, torch.Tensor]:
    """The coordinates of one attention layer the loss cannot see, by part (each a vector; empty parts left out).

    'key_bias': the dead key bias, a set of coordinates: their exact gradient is zero, so Adam moves
    them only by its coordinate-wise scaling of round-off (a step of at most about lr |g| / (|g| + eps),
    with |g| the round-off gradient). 'input_mean': 1^T W / sqrt(d) for W = W_Q, W_K, W_V,
    concatenated; 'output_mean': W_O 1 / sqrt(d) and b_O . 1 / sqrt(d). These are not coordinates but
    sums of them, so Adam, which rescales every coordinate of a gradient orthogonal to them by its own
    factor, moves them even in exact arithmetic.
    """
    one = modelsym.mean_direction(spec.d_model).to(attn["W_Q"]).reshape(-1)
    parts = {"key_bias": dead_key_bias(attn, spec),
             "input_mean": torch.cat([torch.einsum("sdc,d->sc", attn[w], one).reshape(-1) for w in modelsym.INPUT_WEIGHTS]),
             "output_mean": torch.cat([(attn["W_O"] @ one).reshape(-1)] + ([(attn["b_O"] @ one).reshape(1)] if "b_O" in attn else []))}
    return {k: v for k, v in parts.items() if v.numel()}


def share_dimensions(attn: Params, spec: TextModelSpec) -> tuple[dict[str, int], int]:
    """({kind: u}, P) at a float64 copy of one attention layer: the dimension of every span a share uses.

    Kinds: 'total' (the layer's orbit) and its parts in ``training.KINDS`` present in the layout,
    'input', 'output' (the model's mean directions) and 'model' (all of them together).
    """
    attn = {n: p.detach().to("cpu", torch.float64, copy=True) for n, p in attn.items()}
    labelled = sym.labelled_tangent_directions(attn, spec.attention)
    dims = {"total": sym.orthonormal_span([d for _, d in labelled], attn).shape[1]}
    for kind in KINDS:
        directions = [d for label, d in labelled if label.split("/")[0] == kind]
        if directions:
            dims[kind] = sym.orthonormal_span(directions, attn).shape[1]
    model = modelsym.model_dimensions(attn, spec.attention, *invariant_subspaces(spec))
    dims |= {k: model[k] for k in ("input", "output", "model")}
    return dims, sum(p.numel() for p in attn.values())


def outside_attention_dimensions(spec: TextModelSpec) -> dict[str, int]:
    """The model's invariant directions outside its attention layers, per block (all exact; module docstring).

    Per MLP: W_in + 1 a^T (width), W_out + a 1^T (width), b_out + c 1 (1). The embedding: E[x] + c_x 1
    per byte (256), the position table likewise (seq_len, when there is one), and with a position table
    v added to every row of E and taken from every row of P (d - 1 more: v along 1 is counted above).
    The unembedding: 1 a^T (256) and v 1^T (d_model), which share 1 1^T. The rows of bytes the data
    never contain are dead as well; they are the data's to count, not the model's.
    """
    w, d = spec.mlp_width, spec.d_model
    dims = {f"layer{layer}.mlp": 2 * w + 1 for layer in range(spec.layers)}
    dims["embed"] = VOCAB
    if spec.learned_positions:
        dims["pos"] = spec.seq_len
        dims["embed/pos"] = d - 1
    dims["unembed"] = VOCAB + d - 1
    return dims
