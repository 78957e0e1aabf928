"""The kernel-check harness: cases, inputs, every derivative of one call, and the error rule, written once.

``tests/test_kernels.py``, ``scripts/gpu_check.py`` and the kernels appendix all check the Triton
kernels this way: draw the inputs of a ``Case``, ``evaluate`` the output, the gradient of every
input for one cotangent and the forward-mode tangent for one set of tangents, through the
kernels and through the float64 reference, and compare.

The float32 rule (tests and appendix): a kernel agrees with the float64 reference when

    scaled_error = max |kernel - reference| / (1 + max |reference|) <= TOL = 2e-5,

float32's unit roundoff (6e-8) times a budget of about 300 for sums over up to a few hundred
keys, the exp/log of the online softmax and, with RoPE, float32 cos/sin tables. An element a
kernel never wrote is NaN under ``launch.check_hooks(poison=True)`` and fails the rule
(``scaled_error`` is NaN). ``scripts/gpu_check.py`` compares bf16 and fp16 against PyTorch's own
error instead (its docstring).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnid.kernels import launch
from attnid.kernels.api import attention, attention_jvp

TOL = 2e-5
CHECK_TILE = 16  # tile size of the float32 checks: short sequences then span several tiles
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class Case:
    """One attention call to check: shapes (tokens N, heads H and G, widths D and Dv), options and dtype."""

    tokens: int
    heads: int
    kv_heads: int
    head_dim: int
    causal: bool
    rope_fraction: float
    sink: bool
    v_head_dim: int | None = None  # None: the same as head_dim
    dtype: str = "fp32"
    key_tokens: int | None = None  # N_k; None: the same as tokens (N_q)

    @property
    def keys(self) -> int:
        return self.tokens if self.key_tokens is None else self.key_tokens

    @property
    def value_dim(self) -> int:
        return self.head_dim if self.v_head_dim is None else self.v_head_dim

    @property
    def name(self) -> str:
        """An id for test reports: N17-H4G2-causal-rope0.25-sink-D16Dv16-fp32."""
        return (f"N{self.tokens}{'' if self.key_tokens is None else f'x{self.key_tokens}'}-H{self.heads}G{self.kv_heads}-{'causal' if self.causal else 'full'}"
                f"-rope{self.rope_fraction}-{'sink' if self.sink else 'nosink'}-D{self.head_dim}Dv{self.value_dim}"
                f"-{self.dtype}")

    @property
    def options(self) -> dict:
        return {"causal": self.causal, "rope_fraction": self.rope_fraction}


def draw(case: Case, gen: torch.Generator, batch: int, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Random q, k, v (and a sink per head) of the case's shapes, on the CPU in ``dtype``."""
    n, h, g, d = case.tokens, case.heads, case.kv_heads, case.head_dim
    x = {"q": torch.randn(batch, h, n, d, generator=gen, dtype=dtype),
         "k": torch.randn(batch, g, case.keys, d, generator=gen, dtype=dtype),
         "v": torch.randn(batch, g, case.keys, case.value_dim, generator=gen, dtype=dtype)}
    if case.sink:
        x["sink"] = torch.randn(h, generator=gen, dtype=dtype)
    return x


def call(backend: str, case: Case, names: list[str]) -> Callable[..., torch.Tensor]:
    """attention(q, k, v, sink) of the case through ``backend``, as a function of the named inputs in order."""
    def run(*tensors: torch.Tensor) -> torch.Tensor:
        x = dict(zip(names, tensors, strict=True))
        return attention(x["q"], x["k"], x["v"], sink=x.get("sink"), backend=backend, **case.options)
    return run


def evaluate(fn: Callable[..., torch.Tensor], inputs: dict[str, torch.Tensor], tangents: dict[str, torch.Tensor],
             cotangent: torch.Tensor, tangent_fn: Callable[..., torch.Tensor] | None = None,
             second_order: bool = False) -> dict[str, torch.Tensor]:
    """fn's output, the gradient of <fn, cotangent> for each input ('d' + name) and the tangent along ``tangents``.

    ``tangent_fn`` (default ``fn``) is the same function through another path, for an implementation
    whose fastest path has no forward mode (PyTorch's flash SDPA: its math backend then). With
    ``second_order`` also the Hessian-vector products of <fn, cotangent> along ``tangents``
    ('hvp_' + name: forward over reverse, ``jvp(grad)``), through ``tangent_fn`` as well.
    """
    names = list(inputs)
    leaves = [inputs[k].detach().clone().requires_grad_() for k in names]
    out = fn(*leaves)
    grads = torch.autograd.grad(out, leaves, cotangent)
    primals, directions = tuple(inputs[k] for k in names), tuple(tangents[k] for k in names)
    _, tangent = torch.func.jvp(tangent_fn or fn, primals, directions)
    result = {"out": out.detach(), **{f"d{k}": gr for k, gr in zip(names, grads)}, "tangent": tangent}
    if second_order:
        pairing = lambda *xs: ((tangent_fn or fn)(*xs) * cotangent).sum()
        gradient = torch.func.grad(pairing, argnums=tuple(range(len(names))))
        _, hvps = torch.func.jvp(gradient, primals, directions)
        result |= {f"hvp_{k}": t for k, t in zip(names, hvps)}
    return result


def scaled_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got - ref| / (1 + max |ref|); NaN when got has a non-finite entry (an element left unwritten)."""
    if got.shape != ref.shape:
        raise ValueError(f"shape {tuple(got.shape)} against the reference's {tuple(ref.shape)}")
    if not torch.isfinite(got).all():
        return math.nan
    return (got.double() - ref.double()).abs().max().item() / (1 + ref.abs().max().item())


def case_errors(case: Case, gen: torch.Generator, *, batch: int = 2, device: torch.device | str = "cpu",
                poison: bool = True, tile: int | None = CHECK_TILE, second_order: bool = False) -> dict[str, float]:
    """Scaled errors of the float32 kernels against float64: out, every gradient, the tangent, attention_jvp.

    ``poison`` fills every kernel output with NaN first; ``tile`` forces square tiles of that size
    (None: the kernels' own tile table, as on a GPU); ``second_order`` adds the Hessian-vector products
    ('hvp_q', ...: the fused tangent of the backward pass).
    """
    x, t = draw(case, gen, batch), draw(case, gen, batch)
    cotangent = torch.randn(batch, case.heads, case.tokens, case.value_dim, generator=gen)
    x, t, cotangent = ({k: v.to(device) for k, v in d.items()} for d in (x, t, {"c": cotangent}))
    cotangent = cotangent["c"]
    names = list(x)
    f64 = {k: v.double() for k, v in x.items()}
    t64 = {k: v.double() for k, v in t.items()}
    with launch.check_hooks(poison=poison, block=(tile, tile) if tile else None):
        kernel = evaluate(call("triton", case, names), x, t, cotangent, second_order=second_order)
        _, one_pass = attention_jvp(x["q"], x["k"], x["v"], t["q"], t["k"], t["v"], sink=x.get("sink"),
                                    backend="triton", **case.options)
    reference = evaluate(call("reference", case, names), f64, t64, cotangent.double(), second_order=second_order)
    errors = {key: scaled_error(kernel[key], ref) for key, ref in reference.items()}
    # the public one-pass entry point: tangents of q, k and v only, the sink held fixed
    _, ref_pass = torch.func.jvp(
        lambda a, b, c: attention(a, b, c, sink=f64.get("sink"), backend="reference", **case.options),
        (f64["q"], f64["k"], f64["v"]), (t64["q"], t64["k"], t64["v"]))
    errors["attention_jvp"] = scaled_error(one_pass, ref_pass)
    return errors


def variant_errors(gen: torch.Generator, *, device: torch.device | str = "cpu", poison: bool = True,
                   tile: int | None = CHECK_TILE) -> dict[str, dict[str, float]]:
    """Scaled errors (float32 kernels against float64) of the calls beyond a square attention, per variant:
    fewer queries than keys (causal, RoPE, aligned to the end), more queries than keys (no mask), a boolean
    mask with a row that sees nothing, an additive mask per head, and a key padding mask with a sink; for
    each the output, the gradients of q, k, v, the forward-mode tangent and the Hessian-vector products."""
    b, h, g, d = 2, 4, 2, 16
    shapes = {"N_q < N_k, causal, RoPE": (5, 21), "N_q > N_k": (19, 7), "boolean mask, an empty row": (7, 13),
              "additive mask per head, causal": (7, 13), "key padding, sink": (7, 13)}
    results = {}
    for name, (nq, nk) in shapes.items():
        q, k, v = (torch.randn(b, n_h, n, d, generator=gen) for n_h, n in ((h, nq), (g, nk), (g, nk)))
        keep = torch.rand(b, 1, nq, nk, generator=gen) > 0.3
        keep[0, 0, 1, :] = False
        opts = {"N_q < N_k, causal, RoPE": dict(causal=True, rope_fraction=0.5), "N_q > N_k": {},
                "boolean mask, an empty row": dict(mask=keep),
                "additive mask per head, causal": dict(mask=torch.randn(1, h, nq, nk, generator=gen), causal=True),
                "key padding, sink": dict(key_lengths=torch.tensor([nk, 4]), sink=torch.randn(h, generator=gen))}[name]
        opts = {key: val.to(device) if isinstance(val, torch.Tensor) else val for key, val in opts.items()}
        wide = {key: val.double() if isinstance(val, torch.Tensor) and val.dtype.is_floating_point else val
                for key, val in opts.items()}
        x = {"q": q.to(device), "k": k.to(device), "v": v.to(device)}
        t = {key: torch.randn(val.shape, generator=gen).to(device) for key, val in x.items()}
        cot = torch.randn(b, h, nq, d, generator=gen).to(device)
        kernel_fn = lambda *a: attention(*a, backend="triton", **opts)
        reference_fn = lambda *a: attention(*a, backend="reference", **wide)
        with launch.check_hooks(poison=poison, block=(tile, tile) if tile else None):
            got = evaluate(kernel_fn, x, t, cot, second_order=True)
        want = evaluate(reference_fn, {key: val.double() for key, val in x.items()},
                        {key: val.double() for key, val in t.items()}, cot.double(), second_order=True)
        results[name] = {key: scaled_error(got[key], ref) for key, ref in want.items()}
    return results
