"""The kernels on any strides (issue 31): every tensor argument may be a transposed, offset or expanded view.

Hypothesis draws, for each of q, k, v, the sink, the tangents and the output gradient, a view of a larger
or differently ordered storage (seeded: ``derandomize``), and the forward output, every gradient and the
forward-mode tangent must match the float64 reference on the same views. The kernels run in Triton's
interpreter on the CPU (TRITON_INTERPRET=1, set in conftest.py), so the shapes stay small.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from attnid.kernels import attention, attention_jvp
from attnid.kernels.check import TOL, scaled_error

pytestmark = pytest.mark.slow  # Triton's interpreter

VIEWS = ("dense", "transposed", "offset", "expanded")
B, H, N, D = 2, 2, 5, 16


def storage(kind: str, shape: tuple[int, ...], gen: torch.Generator) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """(a float32 storage, the view of it of ``shape`` (B, heads, N, D) laid out as ``kind``)."""
    b, h, n, d = shape
    if kind == "dense":
        return torch.randn(shape, generator=gen), lambda t: t
    if kind == "transposed":  # (B, N, heads, D) storage, as a model's projections produce it
        return torch.randn(b, n, h, d, generator=gen), lambda t: t.transpose(1, 2)
    if kind == "offset":  # a slice of a wider tensor: a storage offset and a row stride above d
        return torch.randn(b, h, n + 2, d + 3, generator=gen), lambda t: t[:, :, 1:n + 1, 2:d + 2]
    return torch.randn(1, h, n, d, generator=gen), lambda t: t.expand(b, h, n, d)  # stride 0 over the batch


def sink_storage(kind: str, heads: int, gen: torch.Generator) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    if kind == "dense":
        return torch.randn(heads, generator=gen), lambda t: t
    if kind in ("transposed", "offset"):
        return torch.randn(heads, 3, generator=gen), lambda t: t[:, 1]  # a column: stride 3
    return torch.randn(1, generator=gen), lambda t: t.expand(heads)


@settings(max_examples=12, derandomize=True, deadline=None, phases=[Phase.explicit, Phase.generate])  # no shrinking: slow here
@given(kinds=st.tuples(*[st.sampled_from(VIEWS)] * 8), groups=st.sampled_from([1, 2]),
       causal=st.booleans(), rope=st.sampled_from([0.0, 0.5, 1.0]), with_sink=st.booleans())
def test_every_argument_may_be_any_view(kinds: tuple[str, ...], groups: int, causal: bool, rope: float,
                                        with_sink: bool) -> None:
    gen = torch.Generator().manual_seed(VIEWS.index(kinds[0]) + 4 * groups + 8 * causal)
    shapes = [(B, H, N, D), (B, groups, N, D), (B, groups, N, D)]
    made = [storage(kind, shape, gen) for kind, shape in zip(kinds[:3], shapes)]
    made += [sink_storage(kinds[3], H, gen)] if with_sink else []
    tangents = [f(base) for base, f in (storage(kind, shape, gen) for kind, shape in zip(kinds[4:7], shapes))]
    d_base, d_view = storage(kinds[7], (B, H, N, D), gen)
    d_out = d_view(d_base)
    opts = dict(causal=causal, rope_fraction=rope)

    def run(dtype: torch.dtype, backend: str) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """Forward, tangent and the gradients of the storages, every argument a view of its storage."""
        bases = [base.detach().to(dtype, copy=True).requires_grad_(True) for base, _ in made]
        views = [f(base) for base, (_, f) in zip(bases, made)]
        q, k, v = views[:3]
        sink = views[3] if with_sink else None
        with torch.no_grad():
            out, t_out = attention_jvp(q, k, v, *(t.to(dtype) for t in tangents), sink=sink, backend=backend, **opts)
        attention(q, k, v, sink=sink, backend=backend, **opts).backward(d_out.to(dtype))
        return out, t_out, [base.grad for base in bases]

    out, t_out, grads = run(torch.float32, "triton")
    ref, t_ref, ref_grads = run(torch.float64, "reference")
    assert scaled_error(out, ref) <= TOL and scaled_error(t_out, t_ref) <= TOL
    for got, want in zip(grads, ref_grads, strict=True):
        assert scaled_error(got, want) <= TOL
