"""The multi-head family (MHA, GQA, MQA and their variants: biases, RoPE, sinks, sigmoid, QK-norm, masks).

Its layout is ``AttentionSpec``; its functions live in the modules that have always held them
(``layer``, ``counts``, ``symmetry``, ``verify``), and this module only gathers them under the
names of the ``Family`` protocol (``attnid.families.PROTOCOL``). Its ``config.json`` reader is the
registry of model types in ``attnid.hf.config`` (one mapper per model type), not a single function.
"""

from __future__ import annotations

from attnid.budget import default_seq_len
from attnid.budget import estimate_resources as estimate
from attnid.counts import count
from attnid.layer import forward, init_params, parameter_shapes
from attnid.spec import AttentionSpec
from attnid.symmetry import orbit_tangent
from attnid.verification import verify

__all__ = ["AttentionSpec", "count", "default_seq_len", "estimate", "example", "forward", "init_params", "parameter_shapes",
           "tangent_basis", "verify"]

tangent_basis = orbit_tangent  # (P, k): the orbit's tangent directions at a point, as columns


def example() -> AttentionSpec:
    """A small layout with every kind of direction: shared key/value heads, partial RoPE, all four biases."""
    return AttentionSpec.create(8, 2, kv_heads=1, rope_fraction=0.5, bias="qkvo")
