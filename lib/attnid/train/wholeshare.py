"""The invisible share of an update of the whole real-text model, against everything the model cannot see.

The per-layer shares (``attnid.train.modelsym``) measure one attention layer's update against the directions of
that layer's own parameters. Here the update of every parameter of ``attnid.train.textmodel``'s model is measured
against the span E of all its invariant directions at the point before the step, E = L + R:

* L, each block's own directions, on disjoint coordinates: per attention layer its orbit and mean directions
  (``modelsym.model_family``, the per-layer shares' span); per MLP, W_in + 1 a^T, W_out + a 1^T and b_out + c 1;
  the token table's rows along 1 (with a position table: its rows along 1 too, and E + 1 v^T against P - 1 v^T);
  the unembedding's U + 1 a^T (its input has zero mean) and U + v 1^T (cross-entropy ignores a constant logit);
* R, the rotations of the residual stream that fix 1 (``attnid.train.residual``): q = I + A, A skew with A 1 = 0,
  moves every write X to X A and every read Y to -A Y, (d - 1)(d - 2) / 2 directions over all blocks.

``attnid.train.textsym`` counts the same directions block by block, and ``tests/test_wholeshare.py`` checks the
dimension of E against the nullity of the float64 Jacobian of the model's centred logits on a small copy.

The projection onto a sum is the projection onto L plus that onto (I - P_L) R, so
||P_E u||^2 = ||P_L u||^2 + r^T S^+ r with S = R^T (I - P_L) R and r = R^T (I - P_L) u. R^T maps a parameter
vector z to the skew part of sum_writes X^T z_X - sum_reads z_Y Y^T on the complement of 1, a d x d matrix, so S
is an m x m matrix (m = (d - 1)(d - 2) / 2) built from d x d products, and no m-column basis over all P
parameters is ever formed. S^+ keeps the eigenvalues that rule 2 keeps (``attnid.rank``: a singular value
of (I - P_L) R above ``rel_tol`` times the largest), with one caveat: S is a difference of Gram products, so
it resolves singular values only down to about sqrt(m u) of the largest (u the unit round-off), and the
threshold is raised to that floor (``RESOLVED``). At the book's points the smallest kept singular value is
about 0.4 of the largest, far above either.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attnid.rank import DEFAULT_ZERO_TOL, numerical_rank
from attnid.spec import AttentionSpec, Params
from attnid.train import modelsym
from attnid.train.residual import INSIDE, READS, WRITES


RESOLVED = math.sqrt(torch.finfo(torch.float64).eps)  # times sqrt(m): the smallest singular value S resolves


@dataclass(frozen=True)
class WholeSpan:
    """E = L + R at one point: each block's directions and their image under R^T, and the eigenpairs of S."""

    blocks: list[tuple[list[str], torch.Tensor, torch.Tensor | None, torch.Tensor]]
    """Per block: parameter names, directions A (n_b, k), coefficients C (k, r) or None for the identity, so that
    A C is an orthonormal basis of the block's own span, and R^T A C (m, r)."""
    eigenvalues: torch.Tensor  # of S, the ones rule 2 keeps
    eigenvectors: torch.Tensor  # (m, rank S)
    params: dict[str, torch.Tensor]
    complement: torch.Tensor  # (d, d - 1): an orthonormal basis of the complement of 1

    @property
    def local_dimension(self) -> int:
        return sum(image.shape[1] for *_, image in self.blocks)

    @property
    def dimension(self) -> int:
        """dim E: the blocks' own directions plus the rotations' independent part."""
        return self.local_dimension + self.eigenvalues.numel()

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.params.values())


def _role(name: str) -> str:
    return ".".join(name.split(".")[-2:])  # "layer1.attn.W_Q" -> "attn.W_Q"; "embed" stays


def _stream_last(name: str, value: torch.Tensor, batched: bool) -> torch.Tensor:
    """A write as (rows, d) (the stream is its last axis), a read as (d, columns) (the stream is its axis -2), heads
    folded in; with a leading batch axis kept when ``batched``."""
    lead = int(batched)
    if _role(name) in WRITES:
        return value.reshape(*value.shape[:lead], -1, value.shape[-1])
    moved = value.movedim(-2, lead)
    return moved.reshape(*moved.shape[:lead + 1], -1)


def _coords(g: torch.Tensor, complement: torch.Tensor) -> torch.Tensor:
    """(..., d, d) -> (..., m): coordinates of the skew part of V^T g V in the orthonormal basis (e_i e_j^T - e_j e_i^T)/sqrt 2."""
    m = complement.T @ g @ complement
    i, j = torch.triu_indices(m.shape[-1], m.shape[-1], 1)
    return (m[..., i, j] - m[..., j, i]) / math.sqrt(2.0)


def rotation_adjoint(columns: dict[str, torch.Tensor], params: Params, complement: torch.Tensor) -> torch.Tensor:
    """R^T applied to k parameter vectors given as {name: (k, *shape)}: (m, k). Names inside a block contribute 0."""
    k = next(iter(columns.values())).shape[0]
    d = complement.shape[0]
    g = torch.zeros(k, d, d, dtype=complement.dtype)
    for name, z in columns.items():
        role = _role(name)
        if role in INSIDE:
            continue
        x, zz = _stream_last(name, params[name], False), _stream_last(name, z, True)
        if role in WRITES:
            g += torch.einsum("rd,kre->kde", x, zz)
        elif role in READS:
            g -= torch.einsum("kdr,er->kde", zz, x)
        else:
            raise ValueError(f"the whole-model span does not know how {name!r} meets the residual stream")
    return _coords(g, complement).T


def rotation_gram(params: Params, complement: torch.Tensor) -> torch.Tensor:
    """R^T R (m, m): R^T R(A) is the skew part of G_w A + A G_r, G_w = sum X^T X over writes, G_r = sum Y Y^T over reads."""
    d = complement.shape[0]
    g_w = torch.zeros(d, d, dtype=complement.dtype)
    g_r = torch.zeros(d, d, dtype=complement.dtype)
    for name, p in params.items():
        if _role(name) in WRITES:
            x = _stream_last(name, p, False)
            g_w += x.T @ x
        elif _role(name) in READS:
            y = _stream_last(name, p, False)
            g_r += y @ y.T
    n = d - 1
    i, j = torch.triu_indices(n, n, 1)
    units = torch.zeros(i.numel(), n, n, dtype=complement.dtype)
    units[torch.arange(i.numel()), i, j] = 2.0**-0.5
    units[torch.arange(i.numel()), j, i] = -(2.0**-0.5)
    a = complement @ units @ complement.T  # the rotations' orthonormal basis A_l = V E_l V^T
    return _coords(g_w @ a + a @ g_r, complement).T


def _unit_columns(d: int, other: int, along_rows: bool, dtype: torch.dtype) -> torch.Tensor:
    """An orthonormal basis of {1 a^T} (``along_rows`` False: every column of a (d, other) matrix along 1) or of
    {a 1^T} (True: every row of an (other, d) matrix along 1), as (d * other, other) columns."""
    one = torch.full((d,), d**-0.5, dtype=dtype)
    eye = torch.eye(other, dtype=dtype)
    basis = torch.einsum("d,ok->dok", one, eye) if not along_rows else torch.einsum("ok,d->odk", eye, one)
    return basis.reshape(d * other, other)


def _attention_layers(params: Params) -> list[str]:
    """The prefixes "layer<i>.attn." of the model's attention layers, in order."""
    return list(dict.fromkeys(n[: n.index(".attn.") + 6] for n in params if ".attn." in n))


def _local_blocks(params: dict[str, torch.Tensor], attention: AttentionSpec,
                  complement: torch.Tensor) -> list[tuple[list[str], torch.Tensor, torch.Tensor | None]]:
    """Each block's parameter names (in order), directions A and coefficients C (None: A is orthonormal already)
    with A C an orthonormal basis of the block's own invariant directions (never formed for an attention layer)."""
    d, dtype = attention.d_model, complement.dtype
    vocab, blocks = params["embed"].shape[0], []
    if "pos" in params:
        n = params["pos"].shape[0]
        rows = torch.block_diag(_unit_columns(d, vocab, True, dtype), _unit_columns(d, n, True, dtype))
        trade = torch.cat([complement.expand(vocab, d, d - 1).reshape(vocab * d, d - 1),  # E + 1 v^T against P - 1 v^T
                           -complement.expand(n, d, d - 1).reshape(n * d, d - 1)]) / math.sqrt(vocab + n)
        blocks.append((["embed", "pos"], torch.cat([rows, trade], 1), None))
    else:
        blocks.append((["embed"], _unit_columns(d, vocab, True, dtype), None))
    one = modelsym.mean_direction(d)  # every input of a layer has zero mean, and its output along 1 is unseen
    for prefix in _attention_layers(params):
        attn = {n.removeprefix(prefix): p for n, p in params.items() if n.startswith(prefix)}
        family = modelsym.model_family(attn, attention, one, one)
        blocks.append(([prefix + n for n in attn], family.matrix, family.coefficients()))
        mlp = prefix.replace(".attn.", ".mlp.")
        width = params[mlp + "W_in"].shape[1]
        blocks.append(([mlp + "W_in"], _unit_columns(d, width, False, dtype), None))
        blocks.append(([mlp + "W_out"], _unit_columns(d, width, True, dtype), None))
        blocks.append(([mlp + "b_out"], torch.full((d, 1), d**-0.5, dtype=dtype), None))
    logits = params["unembed"].shape[1]
    logit_shift = torch.einsum("dk,v->dvk", complement, torch.full((logits,), logits**-0.5, dtype=dtype))
    blocks.append((["unembed"], torch.cat([_unit_columns(d, logits, False, dtype), logit_shift.reshape(d * logits, d - 1)],
                                          1), None))
    return blocks


def _split_columns(names: list[str], basis: torch.Tensor, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A block's basis (n_b, k) cut into {name: (k, *shape)} in the block's parameter order."""
    out, start = {}, 0
    for name in names:
        size = params[name].numel()
        out[name] = basis[start:start + size].T.reshape(basis.shape[1], *params[name].shape)
        start += size
    return out


def whole_span(params: Params, attention: AttentionSpec, rel_tol: float = DEFAULT_ZERO_TOL) -> WholeSpan:
    """E = L + R at ``params`` of a text model whose every attention layer has the layout ``attention`` (parameter
    names as ``attnid.train.textmodel``'s; any dtype, computed on float64 CPU copies)."""
    p64 = {n: t.detach().to("cpu", torch.float64, copy=True) for n, t in params.items()}
    known = {"embed", "pos", "unembed"}
    unknown = [n for n in p64 if n not in known and _role(n) not in (*WRITES, *READS, *INSIDE)]
    if unknown:
        raise ValueError(f"whole_span does not know the parameter(s) {', '.join(unknown)}")
    d = attention.d_model
    ones = torch.full((d, 1), d**-0.5, dtype=torch.float64)
    complement = torch.linalg.qr(torch.cat([ones, torch.eye(d, dtype=torch.float64)[:, : d - 1]], 1))[0][:, 1:]
    blocks = []
    schur = rotation_gram(p64, complement)
    for names, directions, coef in _local_blocks(p64, attention, complement):
        image = rotation_adjoint(_split_columns(names, directions, p64), p64, complement)
        image = image if coef is None else image @ coef
        schur -= image @ image.T
        blocks.append((names, directions, coef, image))
    schur = (schur + schur.T) / 2
    values, vectors = torch.linalg.eigh(schur)
    singular = values.clamp_min(0).sqrt()
    rank = numerical_rank(singular, max(rel_tol, RESOLVED * math.sqrt(schur.shape[0])))
    order = torch.argsort(singular, descending=True)[:rank]
    return WholeSpan(blocks, values[order], vectors[:, order], p64, complement)


def whole_share(update: Params, span: WholeSpan) -> dict[str, float]:
    """{'whole': ||P_E u|| / ||u||, 'blocks': ||P_L u|| / ||u||} for an update of every parameter of the model."""
    u = {n: update[n].detach().to("cpu", torch.float64) for n in span.params}
    norm2 = sum(float(t.pow(2).sum()) for t in u.values())
    if norm2 == 0:
        raise ValueError("the update is zero: its share is undefined")
    local2 = 0.0
    r = rotation_adjoint({n: t[None] for n, t in u.items()}, span.params, span.complement)[:, 0]
    for names, directions, coef, image in span.blocks:
        c = directions.T @ torch.cat([u[n].reshape(-1) for n in names])
        c = c if coef is None else coef.T @ c
        local2 += float(c @ c)
        r = r - image @ c
    y = span.eigenvectors.T @ r
    rotation2 = float((y.pow(2) / span.eigenvalues).sum())
    return {"whole": math.sqrt((local2 + rotation2) / norm2), "blocks": math.sqrt(local2 / norm2)}
