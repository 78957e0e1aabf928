"""attnid: which parameters of a multi-head attention layer its function cannot see.

    import attnid
    spec = attnid.AttentionSpec.create(d_model=64, heads=8, kv_heads=2, rope_fraction=1.0, bias="qkv")
    attnid.count(spec).unidentified          # exact count, proved for the layout (any family's layout)
    attnid.verify(spec).matches              # the numeric Jacobian nullity agrees (run it on small d)
    y = attnid.forward(attnid.init_params(spec, attnid.generator(0)), x, spec)
    attnid.attention(q, k, v, causal=True)   # Triton kernels on CUDA, PyTorch reference elsewhere

The engine lives at the top; families, Hugging Face models and training are sub-packages:

``layout``       the Layout protocol every family's layout follows, the Family record, the one Count record
``fields``       the field schema: one type, range and message per layout field, for every door
``spec``         AttentionSpec (one validated layout of the multi-head family)
``rope``         rotary position embeddings, rotate-half: the one RoPE the layer and the kernels share
``normalise``    causal mask, softmax, sink and sigmoid: scores to attention weights, in one place
``layer``        the reference attention layer: parameter shapes, random points, ``forward``
``counts``       exact counts of unidentified parameters (``count``), QK-norm and sliding windows included
``symmetry``     the symmetry group: moves and the orbit's tangent; ``balancing`` conserved quantities, balancing
``rank``         the rank-decision rule: the one place that decides which singular values are zero
``jacobian``     Jacobians with respect to all parameters, and their rank without holding all of J
``certify``      certified rank decisions (Gram matrix and Cholesky bounds) instead of a full SVD
``structured``   the certificate's Gram matrix from the layer's structure (verify's fast route, wide layers);
                 ``gram_blocks`` one block of it
``verification`` the multi-head check: exact count next to the Jacobian's nullity at a random point, certificates
``budget``       what a check draws and needs: default input sizes, argument checks, peak-memory estimates
``ballcert``     rank proofs of the true Jacobian in ball arithmetic (python-flint): the rigorous certificate
``nullity``      the numeric check of the families without certificates (the Jacobian's nullity at a point)
``continuation`` a QK-norm layer's scores at complex inputs: the branch points and poles of chapter 8's proof
``checks``       the numeric checks the chapters run: grids of layouts, invariance, off-orbit change
``symbolic``     exact rational checks with SymPy
``toy``          chapter 1's warm-up models (a product of scalars, a factored linear map)
``runtime``      seeded random generators
``census``       published layouts (architectures.yaml) and their counts; ``census_file`` reads such files
                 (``strict_yaml``: YAML from an untrusted file)
``cli``          the ``attnid`` command: count, verify, census; ``schemas`` the JSON Schemas of its ``--json``
``families``     one module per attention family (mha, gated, alibi, relbias, mla, ...); the front door
                 (``attnid.count``, ``verify``, ``forward``, ``init_params``, ``estimate``) for a layout of any family
``hf``           Hugging Face configs (``hf.config``) and cross-checks against transformers modules
``whole``        the whole model: a stack's layout and its closed-form count beyond the attention layers
``train``        the training machinery of the experiments: problems, sweeps, the text model, statistics
``kernels``      Triton attention kernels (FlashAttention-2, fused RoPE, GQA, sink, JVP) and a reference

The book's plumbing (provenance, devices, tables, chapter setup) is the separate package ``attnbook``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Every public name is loaded on first use (PEP 562): `import attnid` loads this module alone, and the
# provenance of a result records exactly the modules its computation used. {name: submodule that defines it}
_LAZY = {
    "Count": "counts", "count": "families", "estimate": "families",
    "count_parameters": "jacobian", "functional_rank": "jacobian", "jacobian_matrix": "jacobian",
    "forward": "families", "init_params": "families",
    "Layout": "layout", "VerificationResult": "layout",
    "DEFAULT_MIN_GAP": "rank", "DEFAULT_ZERO_TOL": "rank", "RankDecision": "rank", "decide_rank": "rank",
    "generator": "runtime",
    "AttentionSpec": "spec", "Params": "spec",
    "Verification": "verification", "verify": "families",
    "attention": "kernels", "attention_jvp": "kernels",
}

__all__ = sorted(_LAZY)

if TYPE_CHECKING:  # what static tools and IDEs see; at run time __getattr__ imports on demand
    from attnid.counts import Count
    from attnid.families import count, estimate, forward, init_params, verify
    from attnid.jacobian import count_parameters, functional_rank, jacobian_matrix
    from attnid.kernels import attention, attention_jvp
    from attnid.layout import Layout, VerificationResult
    from attnid.rank import DEFAULT_MIN_GAP, DEFAULT_ZERO_TOL, RankDecision, decide_rank
    from attnid.runtime import generator
    from attnid.spec import AttentionSpec, Params
    from attnid.verification import Verification


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'attnid' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
