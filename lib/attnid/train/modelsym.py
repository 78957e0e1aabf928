"""The invariant directions of an attention layer inside a model: its orbit plus what the model adds.

The orbit of ``attnid.symmetry`` moves the layer's parameters without changing the layer's
function on *any* input. Inside a model the layer sees only some inputs, and only some of its
outputs reach the loss, so more moves are invisible to the model:

* **input side.** If every input row x the layer reads lies in a subspace S of R^d, then
  W -> W + n a^T with n orthogonal to S changes nothing of x W, for W = W_Q, W_K, W_V (every
  head or group, every column). A mean-subtracting layer norm (LayerNorm, with or without a gain
  that is then folded in, no shift) puts every input in 1^perp: n = 1 / sqrt(d), exactly, at
  every point (``mean_direction``). Inputs drawn from a vocabulary of V < d fixed embeddings
  span at most V dimensions: n runs over the complement of the embeddings' row space, measured
  at the point with the book's rank rule (``complement``).
* **output side.** If every use of the residual stream downstream is blind to a subspace R
  (every later read goes through a mean-subtracting norm: R = span(1); or the readout U and a
  shift-invariant loss such as softmax cross-entropy: R = {v : U^T v is a multiple of 1}), then
  W_O -> W_O + a n^T and b_O -> b_O + n with n in R change nothing the model computes; without
  b_O, so does b_V -> b_V + u when the constant u adds to the output lies in R (softmax without a sink).

* **affine inputs.** If moreover every input satisfies x . a = 1 for one vector a (the inputs lie
  on an affine hyperplane missing the origin: V linearly independent embeddings), then x W gains
  a constant part through a: every bias coordinate trades with its weight (W + a e_c^T, b - e_c),
  and W_K, W_V carry the biases the layer may not have: under a
  softmax without a sink, W_K^g + a e_c^T on an unrotated coordinate c shifts every score of a
  row alike (the dead key bias), and W_V^g + a u^T adds the constant u W_O^h to each head's
  output, invisible when b_O takes it back or when the sum over the groups lies in the output
  null space (``affine_directions``; ``affine_normal`` finds a).

``input_output_directions`` returns the linear moves labelled 'input/W_Q', 'input/W_K', 'input/W_V',
'output/W_O', 'output/b_O' in the layer's parameter layout; ``model_directions`` adds them to the
orbit's labelled directions; ``model_shares`` measures an update against the whole span (orbit and
moves together, rule 2 on the union: ``attnid.train.spans``).
Each move is exact (a proof in one line, above); which subspaces a model has is the model's to
say (``attnid.train.textmodel.invariant_subspaces``); the tests check the counts against the rank of the
model's Jacobian at random points for the layouts they name (tests/test_modelsym.py). Not handled:
the sink-corner trade of ``attnid.symmetry`` when the inputs span fewer than d_k dimensions (it is
counted for d_k > d_model only). Moves that mix parameters of the layer with parameters
outside it (a norm gain traded against the rows of W_Q, W_K, W_V, an embedding against W_Q) are
not directions of the layer's parameters and are counted by the model (``textmodel``), not here.
"""

from __future__ import annotations

import torch

from attnid import symmetry as sym
from attnid.jacobian import flatten
from attnid.rank import DEFAULT_ZERO_TOL, numerical_rank
from attnid.spec import AttentionSpec, Params
from attnid.train.spans import SpanFamily, stack
from attnid.train.training import Parts, orbit_part_columns, part_shares

INPUT_WEIGHTS = ("W_Q", "W_K", "W_V")  # (heads or groups, d, columns): the input index is the middle one
MODEL_KINDS = ("input", "output", "affine")


def mean_direction(d: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """(d, 1): the unit vector 1 / sqrt(d), all a mean-subtracting norm's output is orthogonal to."""
    if d < 1:
        raise ValueError(f"d must be positive, got {d}")
    return torch.full((d, 1), d**-0.5, dtype=dtype)


def complement(rows: torch.Tensor, rel_tol: float = DEFAULT_ZERO_TOL) -> torch.Tensor:
    """(d, d - r): an orthonormal basis of the vectors orthogonal to every row of ``rows`` (m, d), r its numerical rank."""
    if rows.ndim != 2:
        raise ValueError(f"rows must be a matrix (m, d), got shape {tuple(rows.shape)}")
    _, s, vh = torch.linalg.svd(rows.double(), full_matrices=True)
    return vh[numerical_rank(s, rel_tol):].T.contiguous()


def blind_readout(readout: torch.Tensor, shift_invariant: bool = True, rel_tol: float = DEFAULT_ZERO_TOL) -> torch.Tensor:
    """(d, k): a basis of the residual directions v a readout U (d, vocab) cannot see: U^T v = 0, or U^T v = c 1 with a shift-invariant loss."""
    if readout.ndim != 2:
        raise ValueError(f"readout must be a matrix (d, vocab), got shape {tuple(readout.shape)}")
    u = readout.double()
    if shift_invariant:  # logits up to a constant: project the constant out of every row of U^T v
        u = u - u.mean(dim=1, keepdim=True)
    return complement(u.T, rel_tol)


def _check_basis(basis: torch.Tensor | None, d: int, what: str) -> torch.Tensor:
    if basis is None:
        return torch.zeros(d, 0, dtype=torch.float64)
    if basis.ndim != 2 or basis.shape[0] != d:
        raise ValueError(f"the {what} basis must have shape (d_model={d}, k), got {tuple(basis.shape)}")
    return basis


def input_output_directions(params: Params, spec: AttentionSpec, input_null: torch.Tensor | None = None,
                            output_null: torch.Tensor | None = None) -> list[tuple[str, dict[str, torch.Tensor]]]:
    """The moves W + n a^T (n in ``input_null``, W in W_Q, W_K, W_V) and W_O + a n^T, b_O + n (n in ``output_null``).

    ``input_null``, ``output_null``: (d_model, k) bases (None: no such direction). One direction per
    basis vector, matrix slice and column (or row of W_O), each with a single non-zero slice.
    """
    inputs = _check_basis(input_null, spec.d_model, "input").to(params["W_Q"])
    outputs = _check_basis(output_null, spec.d_model, "output").to(params["W_Q"])
    directions: list[tuple[str, dict[str, torch.Tensor]]] = []
    for name in INPUT_WEIGHTS:
        slices, _, columns = params[name].shape
        for n in inputs.T:
            for s in range(slices):
                for c in range(columns):
                    d = {k: torch.zeros_like(p) for k, p in params.items()}
                    d[name][s, :, c] = n
                    directions.append((f"input/{name}", d))
    heads, rows, _ = params["W_O"].shape
    for n in outputs.T:
        for h in range(heads):
            for r in range(rows):
                d = {k: torch.zeros_like(p) for k, p in params.items()}
                d["W_O"][h, r] = n
                directions.append(("output/W_O", d))
        if "b_O" in params:
            d = {k: torch.zeros_like(p) for k, p in params.items()}
            d["b_O"] = n.clone()
            directions.append(("output/b_O", d))
    if outputs.shape[1] and "b_V" in params and "b_O" not in params and spec.shift_invariant:
        for u in _invisible_constants(params, spec, outputs).T:  # b_V + u adds a constant the rest cannot see
            d = {k: torch.zeros_like(p) for k, p in params.items()}
            d["b_V"] = u.reshape(spec.kv_heads, spec.v_head_dim).clone()
            directions.append(("output/b_V", d))
    return directions


def _group_output_sums(params: Params, spec: AttentionSpec) -> torch.Tensor:
    """(G d_v, d): the sums S_g of each group's W_O^h, so that value constants u add u @ S to every output."""
    groups = [[h for h in range(spec.heads) if spec.group_of_head(h) == g] for g in range(spec.kv_heads)]
    return torch.cat([params["W_O"][heads].sum(0) for heads in groups])


def _invisible_constants(params: Params, spec: AttentionSpec, output_null: torch.Tensor | None) -> torch.Tensor:
    """(G d_v, k): the value constants u (one per group) whose output sum_g u_g S_g (S_g = sum of the group's W_O^h)
    the model cannot see: every u when b_O takes it back, else those with the sum in span(output_null)."""
    sums = _group_output_sums(params, spec)
    if "b_O" in params:
        return torch.eye(sums.shape[0]).to(sums)
    outputs = _check_basis(output_null, spec.d_model, "output").to(sums)
    return complement((sums @ (torch.eye(spec.d_model).to(sums) - outputs @ outputs.T)).T).to(sums)


def affine_normal(rows: torch.Tensor, rel_tol: float = DEFAULT_ZERO_TOL) -> torch.Tensor | None:
    """A vector a with rows @ a = 1 for every row of ``rows`` (m, d), when one exists (rank rule), else None."""
    if rows.ndim != 2:
        raise ValueError(f"rows must be a matrix (m, d), got shape {tuple(rows.shape)}")
    x = rows.double()
    ones = torch.ones(x.shape[0], 1, dtype=x.dtype)
    rank = numerical_rank(torch.linalg.svdvals(x), rel_tol)
    if numerical_rank(torch.linalg.svdvals(torch.cat([x, ones], dim=1)), rel_tol) > rank:
        return None
    return torch.linalg.pinv(x) @ ones[:, 0]


def affine_directions(params: Params, spec: AttentionSpec, normal: torch.Tensor | None,
                      output_null: torch.Tensor | None = None) -> list[tuple[str, dict[str, torch.Tensor]]]:
    """With x . a = 1 on every input (a = ``normal``): the 'affine/...' moves (module docstring); none when ``normal`` is None.

    'affine/bias': W + a e_c^T with b - e_c, for every coordinate of b_Q, b_K, b_V the layout has (any layout).
    'affine/key_bias' and 'affine/value_bias': only under softmax without a sink or a QK-norm (``spec.shift_invariant``).
    """
    if normal is None:
        return []
    a = normal.to(params["W_Q"]).reshape(-1)
    if a.numel() != spec.d_model:
        raise ValueError(f"the affine normal must have d_model={spec.d_model} entries, got {a.numel()}")
    directions: list[tuple[str, dict[str, torch.Tensor]]] = []
    for weight, bias in (("W_Q", "b_Q"), ("W_K", "b_K"), ("W_V", "b_V")):  # x W + b: a bias coordinate traded with W
        if bias not in params:
            continue
        slices, _, columns = params[weight].shape
        for s in range(slices):
            for c in range(columns):
                d = {k: torch.zeros_like(p) for k, p in params.items()}
                d[weight][s, :, c], d[bias][s, c] = a, -1.0
                directions.append(("affine/bias", d))
    if not spec.shift_invariant:  # the weights of a row must sum to one (no sink, no sigmoid)
        return directions
    if not spec.has_qk_norm:  # a constant key part shifts a row's scores alike only before no norm
        for g in range(spec.kv_heads):
            for c in range(spec.rope_dims, spec.head_dim):
                d = {k: torch.zeros_like(p) for k, p in params.items()}
                d["W_K"][g, :, c] = a
                directions.append(("affine/key_bias", d))
    for u in _invisible_constants(params, spec, output_null).T:
        d = {k: torch.zeros_like(p) for k, p in params.items()}
        d["W_V"] = torch.einsum("d,gc->gdc", a, u.reshape(spec.kv_heads, spec.v_head_dim))
        if "b_O" in params:
            d["b_O"] = -(u @ _group_output_sums(params, spec))
        directions.append(("affine/value_bias", d))
    return directions


def model_directions(params: Params, spec: AttentionSpec, input_null: torch.Tensor | None = None,
                     output_null: torch.Tensor | None = None,
                     normal: torch.Tensor | None = None) -> list[tuple[str, dict[str, torch.Tensor]]]:
    """The orbit's labelled tangent directions (``symmetry.labelled_tangent_directions``) and the model's moves."""
    return (sym.labelled_tangent_directions(params, spec) + input_output_directions(params, spec, input_null, output_null)
            + affine_directions(params, spec, normal, output_null))


def _split(labelled: list[tuple[str, dict[str, torch.Tensor]]]) -> tuple[list[dict[str, torch.Tensor]], dict[str, list[dict[str, torch.Tensor]]]]:
    """(the orbit's directions, {kind: the model's moves of that kind} for every kind in MODEL_KINDS)."""
    orbit = [d for label, d in labelled if label.split("/")[0] not in MODEL_KINDS]
    return orbit, {kind: [d for label, d in labelled if label.split("/")[0] == kind] for kind in MODEL_KINDS}


def _with_moves(params: Params, spec: AttentionSpec, input_null: torch.Tensor | None, output_null: torch.Tensor | None,
                normal: torch.Tensor | None) -> tuple[SpanFamily, Parts]:
    """One ``SpanFamily`` of the orbit's directions followed by the model's moves, and the columns of every part.

    Parts: those of ``training.orbit_parts`` ('total' is the orbit), each kind of MODEL_KINDS with moves,
    and 'model', every column: the union's span under rule 2 (``attnid.train.spans``).
    """
    labelled = sym.labelled_tangent_directions(params, spec)
    parts = orbit_part_columns(labelled)
    parts["total"] = list(range(len(labelled)))
    _, moves = _split(input_output_directions(params, spec, input_null, output_null)
                      + affine_directions(params, spec, normal, output_null))
    columns = [d for _, d in labelled]
    for kind, directions in moves.items():
        if directions:
            parts[kind] = list(range(len(columns), len(columns) + len(directions)))
            columns += directions
    parts["model"] = None
    return SpanFamily(stack(columns, params)), parts


def model_family(params: Params, spec: AttentionSpec, input_null: torch.Tensor | None = None,
                 output_null: torch.Tensor | None = None, normal: torch.Tensor | None = None) -> SpanFamily:
    """The orbit's directions and the model's moves as one ``SpanFamily``: its ``basis()`` spans all the layer cannot see."""
    return _with_moves(params, spec, input_null, output_null, normal)[0]


def model_dimensions(params: Params, spec: AttentionSpec, input_null: torch.Tensor | None = None,
                     output_null: torch.Tensor | None = None, normal: torch.Tensor | None = None) -> dict[str, int]:
    """u per part: 'orbit' (the layer's own), 'input', 'output', 'affine' (the model's moves alone) and 'model' (all)."""
    family, parts = _with_moves(params, spec, input_null, output_null, normal)
    dims = {"orbit": family.dimension(parts["total"])}
    dims |= {kind: family.dimension(parts[kind]) if kind in parts else 0 for kind in MODEL_KINDS}
    dims["model"] = family.dimension()
    return dims


def model_shares(update: Params, params: Params, spec: AttentionSpec, input_null: torch.Tensor | None = None,
                 output_null: torch.Tensor | None = None, normal: torch.Tensor | None = None) -> dict[str, float]:
    """``training.invisible_shares`` (the orbit: 'total' and its parts) plus the model's kinds present and 'model' (everything).

    Orbit and moves are one ``attnid.train.spans.SpanFamily``: one Gram matrix for every part and for the union.
    A kind whose moves span nothing is left out.
    """
    family, parts = _with_moves(params, spec, input_null, output_null, normal)
    parts = {k: v for k, v in parts.items() if k not in MODEL_KINDS or family.dimension(v)}
    return part_shares(flatten(update), family, parts)


def model_basis(orbit: list[dict[str, torch.Tensor]], extra: list[dict[str, torch.Tensor]], params: Params,
                rel_tol: float = DEFAULT_ZERO_TOL) -> torch.Tensor:
    """(P, u): an orthonormal basis of span(orbit) + span(extra) under rule 2 (formed: for tests and small layers)."""
    return SpanFamily(stack(orbit + extra, params), rel_tol).basis()


def span_basis(directions: list[dict[str, torch.Tensor]], params: Params, rel_tol: float = DEFAULT_ZERO_TOL) -> torch.Tensor:
    """An orthonormal basis (P, r) of the span of ``directions`` under rule 2 (``attnid.train.spans``; formed)."""
    return SpanFamily(stack(directions, params), rel_tol).basis()
