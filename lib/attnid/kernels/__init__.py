"""Attention kernels: Triton (FlashAttention-2 style, fused RoPE, GQA by index, sink) and a PyTorch reference.

    from attnid.kernels import attention
    y = attention(q, k, v, causal=True, rope_fraction=1.0)             # Triton on CUDA, reference elsewhere
    y, ty = attention_jvp(q, k, v, tq, tk, tv)                           # output and its tangent, one pass

The Triton module is imported on first use. On a CPU, set TRITON_INTERPRET=1 before that to run the
kernels in Triton's interpreter (float32, small shapes: it is a numpy simulation).
"""

from attnid.kernels.api import attention, attention_jvp
from attnid.kernels.arguments import check_inputs
from attnid.kernels.reference import reference_attention

__all__ = ["attention", "attention_jvp", "check_inputs", "reference_attention"]
