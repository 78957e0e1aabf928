"""What the real-text model of ``attnid.train.textmodel`` cannot see, beyond each attention layer's orbit.

Every norm of that model is a layer norm without gain or shift, which subtracts the mean. So:

* every attention (and MLP) input is orthogonal to the all-ones vector 1, and W + 1 a^T changes
  nothing for W = W_Q, W_K, W_V, W_in;
* every later read of the residual stream goes through such a norm, so whatever a layer adds along
  1 is invisible: W_O + a 1^T, b_O + c 1, W_out + a 1^T, b_out + c 1, a row E[x] + c 1 of the embedding
  (and, with a position table, E + v on every row against P - v);
* the unembedding U can move by 1 a^T (its input is a norm's output) and by v 1^T (softmax
  cross-entropy ignores a constant added to every logit).

``attnid.train.textmodel.invariant_subspaces`` gives the first two to ``attnid.train.modelsym`` (the moves in
the attention layer's parameter layout) and ``attnid.train.textmodel.dead_parts`` names the parameters the
loss cannot see: ``train_text`` measures with both, so they live beside it. Here
``share_dimensions`` counts every span the shares of an update use and
``outside_attention_dimensions`` the moves outside the attention layers. Scaling the whole residual stream would be invisible too but for
the norm's eps = 1e-5: weakly identified, not counted. tests/test_modelsym.py checks every count
against the rank of the model's Jacobian on small copies of the model.
"""

from __future__ import annotations

import torch

from attnid.train import modelsym
from attnid.spec import Params
from attnid.train.textmodel import VOCAB, TextModelSpec, invariant_subspaces
from attnid.train.training import KINDS, orbit_parts


def share_dimensions(attn: Params, spec: TextModelSpec) -> tuple[dict[str, int], int]:
    """({kind: u}, P) at a float64 copy of one attention layer: the dimension of every span a share uses.

    Kinds: 'total' (the layer's orbit) and its parts in ``training.KINDS`` present in the layout,
    'input', 'output' (the model's mean directions) and 'model' (all of them together).
    """
    attn = {n: p.detach().to("cpu", torch.float64, copy=True) for n, p in attn.items()}
    family, parts = orbit_parts(attn, spec.attention)  # the spans the shares use (attnid.train.spans)
    dims = {key: family.dimension(parts[key]) for key in ("total", *KINDS) if key in parts}
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
