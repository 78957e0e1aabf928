"""Exact checks behind the kernel appendix: the online softmax and what the kernels derive from it.

``online_softmax_identities`` runs the recurrences of the appendix "Attention kernels" on three
keys and a sink with symbolic running maxima and compares them with derivatives taken directly:
the online softmax (``lem-online-softmax``), the tangent recurrence (``prop-tangent-recurrence``),
the sink's derivative (``prop-sink-gradient``) and the score gradient (``prop-attention-backward``).
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy as sp

from attnid.symbolic.identity import Identity, zero_identity

__all__ = ["KEYS", "online_softmax_identities"]

KEYS = 3  # the keys of the one query row the checks run on
BLOCKS = ((0, 1), (2,))  # the appendix's split of those keys: {1, 2}, then {3}


def online_softmax_identities(blocks: Sequence[Sequence[int]] = BLOCKS) -> list[Identity]:
    """The four identities behind the appendix's kernels, with residuals simplified by SymPy.

    One query row sees ``KEYS`` keys with scores ``s_j``, score tangents ``sdot_j``, scalar values
    ``v_j`` and value tangents ``vdot_j`` (every formula acts on each value coordinate separately),
    and a sink logit ``sigma``. The keys (indices from 0) are visited in ``blocks``, block ``t``
    measured from an arbitrary symbol ``m_t`` as its running maximum, so the rescaling cancels for
    any values: that is the induction of the lemma. Checked:

    - ``lem-online-softmax``: ``a_T / l_T`` (the sink in the denominator only) is the output ``o``;
    - ``prop-tangent-recurrence``: ``b_T / l_T - (g_T / l_T) o`` is the directional derivative of ``o``;
    - ``prop-sink-gradient``: ``do/dsigma = -p_sigma o``;
    - ``prop-attention-backward``: ``d(dO o)/ds_j = P_j (dO v_j - dO o)`` for each key ``j``.

    The lemma needs the blocks to split the keys: with a key left out or visited twice the first
    two identities fail (their ``holds`` is False), which is what a wrong tiling would do.
    """
    if not blocks or any(not keys for keys in blocks):
        raise ValueError(f"blocks must be a non-empty sequence of non-empty blocks, got {blocks!r}")
    if any(j not in range(KEYS) for keys in blocks for j in keys):
        raise ValueError(f"block indices must lie in 0..{KEYS - 1}, got {blocks!r}")
    s = sp.symbols(f"s1:{KEYS + 1}", real=True)
    s_dot = sp.symbols(f"sdot1:{KEYS + 1}", real=True)
    v = sp.symbols(f"v1:{KEYS + 1}", real=True)
    v_dot = sp.symbols(f"vdot1:{KEYS + 1}", real=True)
    sigma, d_out = sp.symbols("sigma dO", real=True)
    maxima = sp.symbols(f"m1:{len(blocks) + 1}", real=True)
    z = sum(sp.exp(x) for x in s) + sp.exp(sigma)
    o = sum(sp.exp(x) * y for x, y in zip(s, v, strict=True)) / z
    direct_tangent = sum(sp.diff(o, s[j]) * s_dot[j] + sp.diff(o, v[j]) * v_dot[j] for j in range(KEYS))

    def block(keys: Sequence[int], shift: sp.Symbol) -> list[sp.Expr]:
        # one block's contributions to l, a, g and b, measured from the running maximum `shift`
        w = [sp.exp(s[j] - shift) for j in keys]
        return [sum(w), sum(x * v[j] for x, j in zip(w, keys, strict=True)),
                sum(x * s_dot[j] for x, j in zip(w, keys, strict=True)),
                sum(x * (s_dot[j] * v[j] + v_dot[j]) for x, j in zip(w, keys, strict=True))]

    state = block(blocks[0], maxima[0])
    for t in range(1, len(blocks)):
        alpha = sp.exp(maxima[t - 1] - maxima[t])
        state = [alpha * old + new for old, new in zip(state, block(blocks[t], maxima[t]), strict=True)]
    l_t, a_t, g_t, b_t = state
    l_t = l_t + sp.exp(sigma - maxima[-1])  # the sink: the denominator only
    out = a_t / l_t
    tangent = b_t / l_t - (g_t / l_t) * out
    score_gradient = sum(sp.Abs(sp.simplify(sp.diff(d_out * o, s[j]) - sp.exp(s[j]) / z * (d_out * v[j] - d_out * o)))
                         for j in range(KEYS))
    return [
        zero_identity("online softmax (lemma): a_T / ℓ_T = o", out - o),
        zero_identity("tangent recurrence: b_T / ℓ_T − (g_T / ℓ_T) o = ȯ", tangent - direct_tangent),
        zero_identity("the sink: ∂o/∂σ = −p_σ o", sp.diff(o, sigma) + sp.exp(sigma) / z * o),
        zero_identity("the score gradient: ds_j = P_j (dP_j − δ), j = 1, 2, 3", score_gradient),
    ]
