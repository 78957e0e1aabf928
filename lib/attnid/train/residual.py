"""Moves of the real-text model's whole residual stream that its gain-free layer norms cannot see.

A layer norm without gain or shift (``attnid.train.textmodel``) keeps the mean of its input and the length of the
centred vector, so it commutes with every orthogonal q of R^d that fixes the all-ones vector 1:
norm(h q) = norm(h) q. Turning the stream by q, every write to it multiplied by q on the right and every read
of it (through a norm) by q^T on the left, leaves the logits unchanged. These q form a copy of O(d - 1), so the
model has (d - 1)(d - 2) / 2 more invariant directions than ``attnid.train.textsym`` counts block by block, and none
of them is a sum of the blocks' own directions: on the embedding the move is E -> E A (A skew, A 1 = 0), whose
rows are orthogonal to 1, and E A = 0 forces A = 0 once E has rank d. A single layer's update cannot follow such
a move, which is why the per-layer shares (``attnid.train.modelsym``) do not count it. No experiment imports this
module: the chapters check the invariance at a random point (tests/test_residual.py checks it on a small copy).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

WRITES = ("embed", "pos", "attn.W_O", "attn.b_O", "mlp.W_out", "mlp.b_out")  # x q on the right
READS = ("attn.W_Q", "attn.W_K", "attn.W_V", "mlp.W_in", "unembed")         # q^T x on the left
INSIDE = ("attn.b_Q", "attn.b_K", "attn.b_V", "mlp.b_in")                    # inside a block: untouched


def rotation_dimension(d_model: int) -> int:
    """The dimension of the orthogonal maps of R^d that fix 1 (a copy of O(d - 1))."""
    if d_model < 2:
        raise ValueError(f"need d_model >= 2; got {d_model!r}")
    return (d_model - 1) * (d_model - 2) // 2


def random_mean_fixing_rotation(d_model: int, generator: torch.Generator) -> torch.Tensor:
    """A random orthogonal float64 q (d x d) with q 1 = 1: the identity on 1, a random rotation of its complement."""
    if d_model < 2:
        raise ValueError(f"need d_model >= 2; got {d_model!r}")
    ones = torch.full((d_model, 1), d_model**-0.5, dtype=torch.float64)
    draw = torch.randn(d_model, d_model - 1, generator=generator, dtype=torch.float64)
    rest = torch.linalg.qr(torch.cat([ones, draw], 1))[0][:, 1:]  # an orthonormal basis of the complement of 1
    turn = torch.linalg.qr(torch.randn(d_model - 1, d_model - 1, generator=generator, dtype=torch.float64))[0]
    return ones @ ones.T + rest @ turn @ rest.T


def rotate_residual(params: Mapping[str, torch.Tensor], q: torch.Tensor) -> dict[str, torch.Tensor]:
    """The text model's parameters with its residual stream turned by q (orthogonal, q 1 = 1 for invariance).

    Names are ``attnid.train.textmodel``'s: "embed", "pos", "unembed" and "layer<i>.attn.<name>", "layer<i>.mlp.<name>".
    A parameter whose role is unknown is refused, never passed through.
    """
    turned: dict[str, torch.Tensor] = {}
    for name, p in params.items():
        role = ".".join(name.split(".")[-2:])  # "layer1.attn.W_Q" -> "attn.W_Q"; "embed" stays
        q_ = q.to(dtype=p.dtype, device=p.device)
        if role in WRITES:
            turned[name] = p @ q_
        elif role in READS:
            turned[name] = q_.T @ p  # broadcasts over the heads of W_Q, W_K, W_V
        elif role in INSIDE:
            turned[name] = p
        else:
            raise ValueError(f"rotate_residual does not know how {name!r} meets the residual stream")
    return turned
