"""The Triton kernels against a float64 reference, on fresh random inputs, through attnid.kernels.check.

On a machine without CUDA the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set in
conftest.py before the kernel module is first imported): float32, small shapes. Every kernel
output is allocated full of NaN first (``launch.check_hooks(poison=True)``), so an element a
kernel fails to write fails the comparison instead of passing with stale memory. The tolerance
rule is the harness's (``attnid.kernels.check``): scaled error <= TOL = 2e-5.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from attnid.kernels import attention, check, launch, reference_attention
from attnid.kernels.check import TOL, Case, case_errors, scaled_error

pytestmark = pytest.mark.slow  # `make test-fast` skips this file: subprocesses or Triton's interpreter

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def C(n: int, h: int, g: int, causal: bool, rope: float, sink: bool, d: int, dv: int) -> Case:
    """A case written as (N, H, G, causal, rope fraction, sink, D, Dv)."""
    return Case(n, h, g, d, causal, rope, sink, dv)


# Every length 1, 17, 49 (one block, two, and four 16-wide blocks with a ragged tail); group ratios 1, 2,
# 4 and MQA (G = 1); causal on and off; RoPE fractions 0, 0.25, 1; with and without a sink; widths that
# are and are not powers of two, up to the largest the kernels take (256).
CASES = [
    C(1, 2, 2, False, 0.0, False, 16, 16),
    C(1, 4, 1, True, 1.0, True, 32, 16),
    C(17, 2, 2, True, 0.25, False, 16, 16),
    C(17, 4, 2, False, 1.0, True, 32, 32),
    C(17, 8, 2, True, 0.0, True, 16, 24),
    C(17, 3, 1, False, 1.0, False, 16, 16),
    C(49, 4, 1, True, 1.0, False, 16, 16),
    C(49, 2, 1, False, 0.25, True, 24, 16),
    C(49, 4, 4, True, 0.0, True, 16, 16),
    C(33, 4, 2, True, 0.25, True, 32, 32),
    C(9, 2, 1, True, 0.25, True, 256, 256),
    C(9, 2, 2, False, 1.0, False, 128, 64),
    # fewer queries than keys (decoding against a cache; the causal mask aligned to the end) and more
    # queries than keys (cross-attention, no mask, no RoPE)
    Case(5, 4, 2, 16, True, 1.0, True, 16, key_tokens=37),
    Case(1, 2, 1, 32, True, 0.25, False, 16, key_tokens=20),
    Case(23, 2, 2, 16, False, 0.0, True, 24, key_tokens=6),
]


def case_id(case: Case) -> str:
    return case.name


@pytest.fixture(autouse=True)
def poison() -> None:
    """NaN-filled outputs, and 16 x 16 tiles so that even short sequences span several blocks."""
    with launch.check_hooks(poison=True, block=(check.CHECK_TILE, check.CHECK_TILE)):
        yield


def draw(case: Case, gen: torch.Generator, batch: int = 2) -> tuple[dict, dict]:
    """float32 inputs (q, k, v, sink or None) on the test device, and the keyword arguments of the case."""
    x = {name: t.to(DEVICE) for name, t in check.draw(case, gen, batch).items()}
    return {**x, "sink": x.get("sink")}, case.options


def f64(x: dict) -> dict:
    return {name: t.double() if t is not None else None for name, t in x.items()}


def assert_close(kernel: torch.Tensor, reference: torch.Tensor, what: str) -> None:
    err = scaled_error(kernel, reference)
    assert err <= TOL, f"{what}: scaled error {err:.3g} above {TOL:.0e} (NaN: an element was not written)"


def run(x: dict, kw: dict, backend: str) -> torch.Tensor:
    return attention(x["q"], x["k"], x["v"], sink=x["sink"], backend=backend, **kw)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_output_gradients_and_tangents_match_float64(case: Case, gen: torch.Generator) -> None:
    errors = case_errors(case, gen, device=DEVICE)
    expected = {"out", "dq", "dk", "dv", "tangent", "attention_jvp"} | ({"dsink"} if case.sink else set())
    assert set(errors) == expected
    assert all(e <= TOL for e in errors.values()), errors


@pytest.mark.parametrize("case", [C(200, 4, 2, True, 1.0, True, 64, 64), C(150, 2, 1, False, 0.25, False, 128, 128)],
                         ids=case_id)
def test_the_gpu_tiles(case: Case, gen: torch.Generator) -> None:
    """The tile sizes of launch.TILES (the ones a GPU runs), over several blocks with ragged tails."""
    errors = case_errors(case, gen, device=DEVICE, tile=None)
    assert all(e <= TOL for e in errors.values()), errors


def test_an_unwritten_element_fails_the_rule() -> None:
    ref = torch.zeros(2, 3, dtype=torch.float64)
    got = torch.zeros(2, 3)
    assert scaled_error(got, ref) == 0.0
    got[1, 2] = float("nan")
    assert math.isnan(scaled_error(got, ref)) and not scaled_error(got, ref) <= TOL


def test_jacfwd_and_jacrev_reach_the_kernels(gen: torch.Generator) -> None:
    """torch.func.jacfwd (vmap over the JVP kernel) and jacrev (vmap over the backward kernels)."""
    x, kw = draw(C(2, 1, 1, True, 1.0, True, 16, 16), gen, batch=1)
    names = ("q", "k", "v", "sink")

    def fn(backend: str):
        return lambda q, k, v, s: attention(q, k, v, sink=s, backend=backend, **kw)

    x64 = f64(x)
    expected = torch.func.jacrev(fn("reference"), argnums=(0, 1, 2, 3))(*(x64[n] for n in names))
    for transform in (torch.func.jacfwd, torch.func.jacrev):
        got = transform(fn("triton"), argnums=(0, 1, 2, 3))(*(x[n] for n in names))
        for name, a, b in zip(names, got, expected, strict=True):
            assert_close(a, b, f"{transform.__name__} d out / d {name}")


def test_vmap_folds_into_the_batch(gen: torch.Generator) -> None:
    x, kw = draw(C(5, 2, 1, False, 0.5, False, 16, 16), gen, batch=1)
    stack = torch.randn(3, *x["q"].shape, generator=gen).to(DEVICE)
    got = torch.func.vmap(lambda q: attention(q, x["k"], x["v"], backend="triton", **kw))(stack)
    for i in range(3):
        assert_close(got[i], attention(stack[i].double(), x["k"].double(), x["v"].double(), backend="reference", **kw), f"slice {i}")


def test_vmap_over_the_sink(gen: torch.Generator) -> None:
    """A vmapped sink cannot be folded into the batch: the rule loops, and each slice is right."""
    x, kw = draw(C(6, 2, 1, True, 0.0, True, 16, 16), gen, batch=1)
    sinks = torch.randn(3, 2, generator=gen).to(DEVICE)
    got = torch.func.vmap(lambda s: attention(x["q"], x["k"], x["v"], sink=s, backend="triton", **kw))(sinks)
    for i in range(3):
        x64 = f64({**x, "sink": sinks[i]})
        assert_close(got[i], run(x64, kw, "reference"), f"sink slice {i}")


def test_gqa_reads_shared_heads_by_index(gen: torch.Generator) -> None:
    """G < H equals G = H with each key/value head repeated for its query heads (repeat_interleave)."""
    x, kw = draw(C(9, 4, 2, True, 1.0, False, 16, 16), gen)
    repeated = {**x, "k": x["k"].repeat_interleave(2, dim=1), "v": x["v"].repeat_interleave(2, dim=1)}
    assert_close(run(x, kw, "triton"), run(f64(repeated), kw, "reference"), "GQA vs repeated heads")


# ---------------------------------------------------------------------------------------------
# The reference itself, against an independent per-head loop (complex-number RoPE, explicit sink)
# ---------------------------------------------------------------------------------------------


def naive(q, k, v, *, causal: bool, rope_fraction: float, sink, base: float = 10000.0) -> torch.Tensor:
    b, h, n, d = q.shape
    g = k.shape[1]
    r = round(rope_fraction * d)

    def rope(x: torch.Tensor) -> torch.Tensor:
        if r == 0:
            return x
        half = r // 2
        z = torch.complex(x[..., :half], x[..., half:r])  # pairs (i, i + r/2) as complex numbers
        angle = torch.arange(n, dtype=x.dtype)[:, None] * base ** (-2 * torch.arange(half, dtype=x.dtype) / r)
        z = z * torch.polar(torch.ones_like(angle), angle)
        return torch.cat([z.real, z.imag, x[..., r:]], dim=-1)

    out = torch.empty(b, h, n, v.shape[-1], dtype=q.dtype)
    for head in range(h):
        kv = head // (h // g)
        scores = rope(q[:, head]) @ rope(k[:, kv]).transpose(-1, -2) / math.sqrt(d)
        if causal:
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
        weights = scores.exp()
        denominator = weights.sum(-1, keepdim=True) + (sink[head].exp() if sink is not None else 0.0)
        out[:, head] = (weights / denominator) @ v[:, kv]
    return out


@pytest.mark.parametrize("case", CASES[:6], ids=case_id)
def test_reference_matches_a_per_head_loop(case: Case, gen: torch.Generator) -> None:
    x, kw = draw(case, gen)
    x = {n: t.cpu() if t is not None else None for n, t in f64(x).items()}
    got = reference_attention(x["q"], x["k"], x["v"], causal=kw["causal"], rope_dims=round(kw["rope_fraction"] * x["q"].shape[-1]),
                              rope_base=10000.0, sink=x["sink"], scale=x["q"].shape[-1] ** -0.5)
    assert (got - naive(x["q"], x["k"], x["v"], sink=x["sink"], **kw)).abs().max() < 1e-12


def test_auto_uses_the_reference_off_cuda(gen: torch.Generator) -> None:
    if torch.cuda.is_available():
        pytest.skip("auto picks Triton on CUDA")
    x, kw = draw(CASES[3], gen)
    assert torch.equal(run(x, kw, "auto"), run(x, kw, "reference"))


# ---------------------------------------------------------------------------------------------
# Bad input: clear, specific errors
# ---------------------------------------------------------------------------------------------


def _qkv(h: int = 4, g: int = 2, d: int = 16, dtype: torch.dtype = torch.float32):
    return torch.zeros(1, h, 5, d, dtype=dtype), torch.zeros(1, g, 5, d, dtype=dtype), torch.zeros(1, g, 5, d, dtype=dtype)


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (lambda q, k, v: dict(q=q, k=k[:, :1].expand(1, 3, 5, 16), v=v[:, :1].expand(1, 3, 5, 16)), ValueError, "G=3 must divide"),
        (lambda q, k, v: dict(q=q, k=k[..., :8], v=v), ValueError, "k must have shape"),
        (lambda q, k, v: dict(q=q, k=k, v=v[:, :, :4]), ValueError, "v must have shape"),
        (lambda q, k, v: dict(q=q[0], k=k, v=v), ValueError, "q must have 4 dimensions"),
        (lambda q, k, v: dict(q=q, k=k.double(), v=v), TypeError, "k has dtype"),
        (lambda q, k, v: dict(q=q, k=k, v=v, rope_fraction=0.1875), ValueError, "gives odd r = 3"),
        (lambda q, k, v: dict(q=q, k=k, v=v, rope_fraction=1.5), ValueError, "rope_fraction must be a number in"),
        (lambda q, k, v: dict(q=q, k=k, v=v, sink=torch.zeros(2)), ValueError, "sink must be a tensor of shape"),
        (lambda q, k, v: dict(q=q, k=k, v=v, scale=-1.0), ValueError, "scale must be"),
        (lambda q, k, v: dict(q=q, k=k, v=v, backend="cuda"), ValueError, "backend must be one of"),
        (lambda q, k, v: dict(q=q.double(), k=k.double(), v=v.double(), backend="triton"), TypeError, "float16, bfloat16 or float32"),
        (lambda q, k, v: dict(q=q[..., :8], k=k[..., :8], v=v, backend="triton"), ValueError, "head widths 16 to 256"),
        (lambda q, k, v: dict(q=q, k=k[:, :, :3], v=v[:, :, :3], causal=True), ValueError, "needs N_q <= N_k"),
        (lambda q, k, v: dict(q=q, k=k[:, :, :3], v=v[:, :, :3], rope_fraction=1.0), ValueError, "needs N_q <= N_k"),
        (lambda q, k, v: dict(q=q, k=k[:, :, :3], v=v), ValueError, "v must have shape"),
    ],
)
def test_bad_input_is_named(change, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        attention(**change(*_qkv()))


def test_triton_on_cpu_without_the_interpreter_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        attention(*_qkv(), backend="triton")


@pytest.mark.parametrize("kw", [dict(kv_heads=2, causal=True, rope_fraction=0.5, bias="qkvo"),
                                dict(kv_heads=4, norm="sink", sink_learned=True)], ids=["gqa-rope-bias", "sink"])
def test_layer_forward_through_the_kernels(kw: dict, gen: torch.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """attnid.layer.forward(backend='kernels') on the Triton path equals the reference layer."""
    from attnid import layer
    from attnid.kernels import api
    from attnid.spec import AttentionSpec

    monkeypatch.setattr(api, "choose_backend", lambda backend, q, v: "triton")  # Triton even on the CPU
    spec = AttentionSpec.create(64, 4, **kw)
    params = {n: p.float().to(DEVICE) for n, p in layer.init_params(spec, gen).items()}
    x = torch.randn(2, 11, 64, generator=gen).to(DEVICE)
    got = layer.forward(params, x, spec, backend="kernels")
    expected = layer.forward({n: p.double() for n, p in params.items()}, x.double(), spec)
    assert_close(got, expected, "layer output")


def test_training_through_the_kernels_follows_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """The training chapters' GPU path (float32, backend='kernels') on the Triton path, against the reference."""
    from attnid.train import training
    from attnid.kernels import api
    from attnid.spec import AttentionSpec

    monkeypatch.setattr(api, "choose_backend", lambda backend, q, v: "triton")
    teacher, student = AttentionSpec.create(32, 2), AttentionSpec.create(32, 2, kv_heads=1, rope_fraction=0.5, bias="qkvo")
    losses = {}
    for backend in ("kernels", "reference"):
        problem = training.teacher_student(teacher, student, n_sequences=4, seq_len=9, dtype=torch.float32, backend=backend)
        losses[backend] = training.train(problem, optimiser="adam", lr=0.01, steps=4, seed=0).loss
    assert losses["kernels"][-1] < losses["kernels"][0]
    assert max(abs(a - b) for a, b in zip(losses["kernels"], losses["reference"], strict=True)) < 1e-5


@pytest.mark.parametrize(("dtype", "width", "kinds"), [
    ("bf16", "128", ["forward", "tangent", "dkdv", "dq", "dkdv_tangent", "dq_tangent"]),
    ("fp32", "256", ["forward", "tangent", "dkdv", "dq"]),  # the second-order fp32 kernels: `make check-kernels`
])
def test_kernels_compile_for_hopper_and_fit_its_shared_memory(dtype: str, width: str, kinds: list[str]) -> None:
    """Triton compiles every kernel for sm_90 here, without a GPU; each must fit 227 KiB of shared memory.

    With a mask (the larger variant: a mask tile per pipeline stage). The full matrix (widths 64, 128, 256;
    bf16, fp16, fp32; with and without a mask) is `make check-kernels`.
    """
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).resolve().parents[1] / "scripts" / "check_kernels.py"
    run = subprocess.run([sys.executable, str(script), "--widths", width, "--dtypes", dtype, "--mask", "on", "--kinds", *kinds],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("fits") == len(kinds), run.stdout


@pytest.mark.parametrize("layout", ["column", "expanded"])
def test_a_strided_or_expanded_sink_gives_the_reference_result(layout) -> None:
    # the kernels read the sink by offset: a column slice or a stride-0 view must be made dense first
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 5, 16, generator=gen) for _ in range(3))
    base = torch.randn(2, 3, generator=gen)
    sink = base[:, 1] if layout == "column" else torch.tensor([0.3]).expand(2)
    assert not sink.is_contiguous() or sink.stride() == (0,)
    args = dict(causal=True, sink=sink)
    got = attention(q, k, v, backend="triton", **args)
    want = attention(q.double(), k.double(), v.double(), backend="reference", causal=True, sink=sink.double())
    assert float((got.double() - want).abs().max()) < 1e-5
    ts = sink.detach().clone().requires_grad_(True)
    sliced = (base.detach().clone().requires_grad_(True))
    sink_view = sliced[:, 1] if layout == "column" else ts
    attention(q, k, v, backend="triton", causal=True, sink=sink_view).sum().backward()
    grad = sliced.grad[:, 1] if layout == "column" else ts.grad
    ref = sink.detach().double().clone().requires_grad_(True)
    attention(q.double(), k.double(), v.double(), backend="reference", causal=True, sink=ref).sum().backward()
    assert float((grad.double() - ref.grad).abs().max()) < 1e-4


# ---- every torch.func transform and second order (issue 30): the peer's kinds of tests


def _loss(backend: str, kw: dict):
    """A scalar loss of (q, k, v, sink) through the attention, nonlinear in the output."""
    return lambda q, k, v, s: (attention(q, k, v, sink=s, backend=backend, **kw) ** 2).sum() / 2


TRANSFORM_CASES = [C(7, 2, 1, True, 1.0, True, 16, 16), C(5, 2, 2, False, 0.25, False, 16, 24)]


@pytest.mark.parametrize("case", TRANSFORM_CASES, ids=case_id)
def test_func_grad_and_vmap_of_grad_match_float64(case: Case, gen: torch.Generator) -> None:
    x, kw = draw(case, gen, batch=1)
    args = [x[n] for n in ("q", "k", "v", "sink")]
    argnums = (0, 1, 2, 3) if case.sink else (0, 1, 2)
    expected = torch.func.grad(_loss("reference", kw), argnums=argnums)(*(a.double() if a is not None else None for a in args))
    got = torch.func.grad(_loss("triton", kw), argnums=argnums)(*args)
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert_close(a, b, f"grad, argument {i}")
    stack = torch.randn(3, *x["q"].shape, generator=gen).to(DEVICE)
    per_q = torch.func.vmap(torch.func.grad(_loss("triton", kw)), in_dims=(0, None, None, None))(stack, *args[1:])
    for i in range(3):
        ref = torch.func.grad(_loss("reference", kw))(stack[i].double(), *(a.double() if a is not None else None
                                                                            for a in args[1:]))
        assert_close(per_q[i], ref, f"vmap(grad), slice {i}")


@pytest.mark.parametrize("case", TRANSFORM_CASES, ids=case_id)
def test_hessian_vector_products_and_double_backward_match_float64(case: Case, gen: torch.Generator) -> None:
    x, kw = draw(case, gen, batch=1)
    names = ("q", "k", "v", "sink") if case.sink else ("q", "k", "v")
    primals = tuple(x[n] for n in names)
    directions = tuple(torch.randn(p.shape, generator=gen).to(DEVICE) for p in primals)

    def loss(backend):
        full = _loss(backend, kw)
        return (lambda q, k, v, s: full(q, k, v, s)) if case.sink else (lambda q, k, v: full(q, k, v, None))

    argnums = tuple(range(len(names)))
    hvp = lambda backend, ps, ts: torch.func.jvp(torch.func.grad(loss(backend), argnums=argnums), ps, ts)[1]
    expected = hvp("reference", tuple(p.double() for p in primals), tuple(t.double() for t in directions))
    got = hvp("triton", primals, directions)  # forward over reverse
    for name, a, b in zip(names, got, expected, strict=True):
        assert_close(a, b, f"jvp(grad) along d{name}")
    leaves = [p.clone().requires_grad_() for p in primals]
    grads = torch.autograd.grad(loss("triton")(*leaves), leaves, create_graph=True)
    second = torch.autograd.grad(sum((g * t).sum() for g, t in zip(grads, directions)), leaves)  # reverse over reverse
    for name, a, b in zip(names, second, expected, strict=True):
        assert_close(a, b, f"double backward along d{name}")


def test_hessian_of_the_kernels_matches_float64(gen: torch.Generator) -> None:
    x, kw = draw(C(3, 1, 1, True, 1.0, False, 16, 16), gen, batch=1)
    fn = lambda backend, k, v: (lambda q: _loss(backend, kw)(q, k, v, None))
    expected = torch.func.hessian(fn("reference", x["k"].double(), x["v"].double()))(x["q"].double())
    assert_close(torch.func.hessian(fn("triton", x["k"], x["v"]))(x["q"]), expected, "hessian d2 loss / dq2")


SECOND_ORDER_CASES = TRANSFORM_CASES + [C(9, 4, 2, True, 0.25, True, 32, 16), C(6, 3, 1, False, 1.0, True, 16, 16),
                                        C(11, 2, 1, True, 0.0, False, 24, 32)]


def _primals(case: Case, x: dict) -> tuple[tuple[str, ...], tuple[torch.Tensor, ...]]:
    names = ("q", "k", "v", "sink") if case.sink else ("q", "k", "v")
    return names, tuple(x[n] for n in names)


@pytest.mark.parametrize("case", SECOND_ORDER_CASES[2:], ids=case_id)
def test_second_order_with_gqa_rope_and_sink_matches_float64(case: Case, gen: torch.Generator) -> None:
    x, kw = draw(case, gen, batch=2)
    names, primals = _primals(case, x)
    directions = tuple(torch.randn(p.shape, generator=gen).to(DEVICE) for p in primals)
    full = lambda backend: (lambda *a: _loss(backend, kw)(*a, *(() if case.sink else (None,))))
    argnums = tuple(range(len(names)))
    hvp = lambda backend, ps, ts: torch.func.jvp(torch.func.grad(full(backend), argnums=argnums), ps, ts)[1]
    expected = hvp("reference", tuple(p.double() for p in primals), tuple(t.double() for t in directions))
    for name, a, b in zip(names, hvp("triton", primals, directions), expected, strict=True):
        assert_close(a, b, f"jvp(grad) along d{name}")


def test_second_order_never_runs_the_quadratic_reference(gen: torch.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    # the fused kernels only: the reference (O(B H N^2) memory) must not be called on the way
    case = SECOND_ORDER_CASES[2]
    x, kw = draw(case, gen, batch=1)
    _, primals = _primals(case, x)

    def refuse(*args, **kwargs):
        raise AssertionError("the second-order path called the reference")

    monkeypatch.setattr("attnid.kernels.api.reference_attention", refuse)
    directions = tuple(torch.randn_like(p) for p in primals)
    torch.func.jvp(torch.func.grad(lambda *a: _loss("triton", kw)(*a), argnums=(0, 1, 2, 3)), primals, directions)
    leaves = [p.clone().requires_grad_() for p in primals]
    grads = torch.autograd.grad(_loss("triton", kw)(*leaves), leaves, create_graph=True)
    torch.autograd.grad(sum((g * t).sum() for g, t in zip(grads, directions)), leaves)


def test_dual_tensors_and_a_backward_inside_dual_mode_match_float64(gen: torch.Generator) -> None:
    # the peer's kinds of tests: torch.autograd.forward_ad dual tensors, and loss.backward() while they are live
    import torch.autograd.forward_ad as fwAD

    case = SECOND_ORDER_CASES[2]
    x, kw = draw(case, gen, batch=1)
    _, primals = _primals(case, x)
    directions = tuple(torch.randn_like(p) for p in primals)
    with fwAD.dual_level():
        leaves = [p.clone().requires_grad_() for p in primals]
        duals = [fwAD.make_dual(leaf, t) for leaf, t in zip(leaves, directions)]
        out = attention(*duals[:3], sink=duals[3], backend="triton", **kw)
        tangent = fwAD.unpack_dual(out).tangent
        (out ** 2).sum().backward()
        grads = [leaf.grad for leaf in leaves]
    want_out, want_tangent = torch.func.jvp(lambda *a: attention(*a[:3], sink=a[3], backend="reference", **kw),
                                            tuple(p.double() for p in primals), tuple(t.double() for t in directions))
    assert_close(tangent, want_tangent, "dual tangent")
    want_grads = torch.func.grad(lambda *a: (attention(*a[:3], sink=a[3], backend="reference", **kw) ** 2).sum(),
                                 argnums=(0, 1, 2, 3))(*(p.double() for p in primals))
    for i, (a, b) in enumerate(zip(grads, want_grads, strict=True)):
        assert a is not None, f"argument {i}: no gradient inside dual mode"
        assert_close(a, b, f"backward inside dual mode, argument {i}")


def test_third_derivatives_are_refused_not_zero(gen: torch.Generator) -> None:
    x, kw = draw(C(3, 1, 1, True, 0.0, False, 16, 16), gen, batch=1)
    t = torch.randn_like(x["q"])
    f = lambda q: _loss("triton", kw)(q, x["k"], x["v"], None)
    hv = lambda q: torch.func.jvp(torch.func.grad(f), (q,), (t,))[1]
    with pytest.raises(NotImplementedError, match="backend='reference'"):
        torch.func.jvp(hv, (x["q"],), (t,))
    with pytest.raises(NotImplementedError, match="forward-mode tangent"):
        torch.func.jvp(lambda q: torch.func.jvp(f, (q,), (t,))[1], (x["q"],), (t,))


@pytest.mark.parametrize("sink", [False, True])
def test_fewer_queries_are_the_last_rows_of_the_square_attention(sink: bool, gen: torch.Generator) -> None:
    # the definition of the end alignment, independent of the code under test: attention of N_q queries against
    # N_k keys is the last N_q rows of attention whose N_k queries end with them (causal, RoPE, GQA, sink)
    q_all = torch.randn(2, 4, 13, 16, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 13, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    s = torch.randn(4, generator=gen, dtype=torch.float64) if sink else None
    kw = dict(causal=True, rope_fraction=0.5, sink=s)
    square = attention(q_all, k, v, backend="reference", **kw)[:, :, -4:]
    torch.testing.assert_close(attention(q_all[:, :, -4:], k, v, backend="reference", **kw), square, rtol=0, atol=1e-12)
    got = attention(q_all[:, :, -4:].float(), k.float(), v.float(), backend="triton", causal=True, rope_fraction=0.5,
                    sink=None if s is None else s.float())
    assert_close(got, square, "the kernels against the square attention's last rows")


# ---- attention masks (issue 30, item 3): a key padding mask, boolean and additive masks, in every kernel


def _masks(gen: torch.Generator, b: int, h: int, nq: int, nk: int) -> dict[str, dict]:
    keep = torch.rand(b, 1, nq, nk, generator=gen) > 0.3
    keep[0, 0, 1, :] = False  # a row of batch 0 that sees no key at all
    return {
        "boolean, an empty row": dict(mask=keep),
        "additive, per head, causal, RoPE": dict(mask=torch.randn(1, h, nq, nk, generator=gen), causal=True, rope_fraction=0.5),
        "key padding, causal": dict(key_lengths=torch.tensor([nk, nk // 2]), causal=True),
        "boolean and key padding, sink": dict(mask=keep, key_lengths=torch.tensor([nk, 3]), sink=torch.randn(h, generator=gen)),
    }


@pytest.mark.parametrize("which", ["boolean, an empty row", "additive, per head, causal, RoPE", "key padding, causal",
                                   "boolean and key padding, sink"])
def test_masks_in_every_kernel_match_float64(which: str, gen: torch.Generator) -> None:
    b, h, g, nq, nk, d = 2, 4, 2, 7, 19, 16
    q, k, v = torch.randn(b, h, nq, d, generator=gen), torch.randn(b, g, nk, d, generator=gen), torch.randn(b, g, nk, d, generator=gen)
    kw = _masks(gen, b, h, nq, nk)[which]
    as64 = {n: (t.double() if isinstance(t, torch.Tensor) and t.dtype.is_floating_point else t) for n, t in kw.items()}
    f = lambda backend, opts: (lambda a, b_, c: attention(a, b_, c, backend=backend, **opts))
    xs, ts = (q, k, v), tuple(torch.randn(t.shape, generator=gen) for t in (q, k, v))
    cot = torch.randn(b, h, nq, d, generator=gen)
    x64, t64 = tuple(t.double() for t in xs), tuple(t.double() for t in ts)
    pair = lambda backend, opts, c: (lambda a, b_, c_: (f(backend, opts)(a, b_, c_) * c).sum())
    assert_close(f("triton", kw)(*xs), f("reference", as64)(*x64), f"{which}: out")
    for i, (a, r) in enumerate(zip(torch.func.vjp(f("triton", kw), *xs)[1](cot),
                                   torch.func.vjp(f("reference", as64), *x64)[1](cot.double()), strict=True)):
        assert_close(a, r, f"{which}: gradient {i}")
    assert_close(torch.func.jvp(f("triton", kw), xs, ts)[1], torch.func.jvp(f("reference", as64), x64, t64)[1],
                 f"{which}: tangent")
    hvp = lambda backend, opts, c, p, t: torch.func.jvp(torch.func.grad(pair(backend, opts, c), argnums=(0, 1, 2)), p, t)[1]
    for i, (a, r) in enumerate(zip(hvp("triton", kw, cot, xs, ts), hvp("reference", as64, cot.double(), x64, t64),
                                   strict=True)):
        assert_close(a, r, f"{which}: Hessian-vector product {i}")


def test_the_reference_masks_mean_what_they_say(gen: torch.Generator) -> None:
    # float64, independent definitions: key padding = the same attention on the first L keys; a boolean mask =
    # its additive 0 / -inf form; a row with nothing to see returns zeros with finite gradients
    q, k, v = (torch.randn(2, 2, 5, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    padded = attention(q, k, v, backend="reference", key_lengths=torch.tensor([5, 3]))
    torch.testing.assert_close(padded[1], attention(q[1:], k[1:, :, :3], v[1:, :, :3], backend="reference")[0])
    keep = torch.rand(2, 2, 5, 5, generator=gen) > 0.4
    keep[..., 0] = True
    additive = torch.zeros(keep.shape, dtype=torch.float64).masked_fill(~keep, float("-inf"))
    torch.testing.assert_close(attention(q, k, v, mask=keep, backend="reference"),
                               attention(q, k, v, mask=additive, backend="reference"))
    none = torch.zeros(2, 2, 5, 5, dtype=torch.bool)
    leaf = q.clone().requires_grad_()
    out = attention(leaf, k, v, mask=none, backend="reference")
    out.sum().backward()
    assert out.abs().max() == 0 and torch.isfinite(leaf.grad).all()


def test_vmap_folds_a_mask_into_the_batch(gen: torch.Generator) -> None:
    q = torch.randn(3, 1, 2, 4, 16, generator=gen)
    k, v = (torch.randn(1, 1, 6, 16, generator=gen) for _ in range(2))
    keep = torch.rand(1, 1, 4, 6, generator=gen) > 0.3
    lengths = torch.tensor([5])
    batched = torch.func.vmap(lambda x: attention(x, k, v, mask=keep, key_lengths=lengths, backend="triton"))(q)
    for i in range(3):
        want = attention(q[i].double(), k.double(), v.double(), mask=keep, key_lengths=lengths, backend="reference")
        assert_close(batched[i], want, f"vmap slice {i}")


@pytest.mark.parametrize(("kw", "error", "message"), [
    (dict(mask=torch.ones(3, 5, 5, dtype=torch.bool)), ValueError, "does not broadcast"),
    (dict(mask=torch.ones(5, 5, dtype=torch.int64)), TypeError, "boolean or floating"),
    (dict(mask=torch.zeros(5, 5, requires_grad=True), backend="triton"), ValueError, "as a constant"),
    (dict(key_lengths=torch.tensor([6])), ValueError, "between 1 and N_k"),
    (dict(key_lengths=torch.tensor([0])), ValueError, "between 1 and N_k"),
    (dict(key_lengths=torch.tensor([2.0])), TypeError, "integer tensor"),
    (dict(key_lengths=torch.tensor([2, 3])), ValueError, "shape \\(B,\\)"),
])
def test_bad_masks_are_named(kw: dict, error: type, message: str) -> None:
    q, k, v = (torch.zeros(1, 2, 5, 16) for _ in range(3))
    with pytest.raises(error, match=message):
        attention(q, k, v, **kw)


def test_a_tangent_along_the_mask_is_refused_not_dropped(gen: torch.Generator) -> None:
    # The kernels hold the mask constant: a tangent along an additive mask (torch.func.jvp, or a dual tensor)
    # must fail loudly instead of counting as zero, while the reference differentiates it.
    q, k, v = (torch.randn(1, 2, 5, 16, generator=gen) for _ in range(3))
    bias, t_bias = (torch.randn(1, 2, 5, 5, generator=gen) for _ in range(2))
    through = lambda backend: lambda m: attention(q, k, v, mask=m, backend=backend)
    with pytest.raises(ValueError, match="forward-mode tangent"):
        torch.func.jvp(through("triton"), (bias,), (t_bias,))
    with torch.autograd.forward_ad.dual_level():
        with pytest.raises(ValueError, match="forward-mode tangent"):
            through("triton")(torch.autograd.forward_ad.make_dual(bias, t_bias))
    _, t_ref = torch.func.jvp(through("reference"), (bias.double(),), (t_bias.double(),))
    assert t_ref.abs().max() > 0.01
    # a mask without a tangent still works under every transform of q
    _, t_q = torch.func.jvp(lambda x: attention(x, k, v, mask=bias, backend="triton"), (q,), (q,))
    assert torch.isfinite(t_q).all()


def test_the_reference_differentiates_an_additive_mask(gen: torch.Generator) -> None:
    q, k, v = (torch.randn(1, 2, 4, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(1, 2, 4, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    attention(q, k, v, mask=bias, backend="reference").sum().backward()
    assert bias.grad is not None and bias.grad.abs().max() > 0


# ---- the transforms of issue 30 item 1 on the calls of items 2 and 3 (masks, N_q != N_k), not only square ones


UNEQUAL = {  # (N_q, N_k, options): fewer queries under an end-aligned causal mask, more queries, masks
    "N_q < N_k, causal, boolean mask": (5, 11, "boolean, an empty row"),
    "N_q > N_k, additive mask": (9, 4, "additive"),
    "N_q < N_k, key padding, sink": (4, 9, "key padding, sink"),
}


def _unequal_options(which: str, gen: torch.Generator, b: int, h: int, nq: int, nk: int) -> dict:
    keep = torch.rand(b, 1, nq, nk, generator=gen) > 0.3
    keep[0, 0, 1, :] = False
    return {"boolean, an empty row": dict(mask=keep, causal=True),
            "additive": dict(mask=torch.randn(b, h, nq, nk, generator=gen)),
            "key padding, sink": dict(key_lengths=torch.tensor([nk, 3]), sink=torch.randn(h, generator=gen))}[which]


@pytest.mark.parametrize("name", list(UNEQUAL))
def test_every_transform_with_masks_and_unequal_lengths_matches_float64(name: str, gen: torch.Generator) -> None:
    nq, nk, which = UNEQUAL[name]
    b, h, g, d = 2, 2, 1, 16
    kw = _unequal_options(which, gen, b, h, nq, nk)
    kw64 = {n: (t.double() if isinstance(t, torch.Tensor) and t.dtype.is_floating_point else t) for n, t in kw.items()}
    xs = (torch.randn(b, h, nq, d, generator=gen), torch.randn(b, g, nk, d, generator=gen), torch.randn(b, g, nk, d, generator=gen))
    ts = tuple(torch.randn(x.shape, generator=gen) for x in xs)
    x64, t64 = tuple(x.double() for x in xs), tuple(t.double() for t in ts)
    loss = lambda backend, opts: (lambda q, k, v: (torch.sin(attention(q, k, v, backend=backend, **opts)) ** 2).sum())
    args = (0, 1, 2)
    for i, (a, r) in enumerate(zip(torch.func.grad(loss("triton", kw), argnums=args)(*xs),
                                   torch.func.grad(loss("reference", kw64), argnums=args)(*x64), strict=True)):
        assert_close(a, r, f"{name}: grad {i}")
    stack = torch.randn(2, *xs[2].shape, generator=gen)  # vmap over values: the mask stays as it is
    per_v = torch.func.vmap(torch.func.grad(loss("triton", kw), argnums=2), in_dims=(None, None, 0))(*xs[:2], stack)
    for i in range(2):
        assert_close(per_v[i], torch.func.grad(loss("reference", kw64), argnums=2)(*x64[:2], stack[i].double()),
                     f"{name}: vmap(grad), slice {i}")
    hvp = lambda backend, opts, p, t: torch.func.jvp(torch.func.grad(loss(backend, opts), argnums=args), p, t)[1]
    expected = hvp("reference", kw64, x64, t64)
    for i, (a, r) in enumerate(zip(hvp("triton", kw, xs, ts), expected, strict=True)):
        assert_close(a, r, f"{name}: jvp(grad) {i}")
    leaves = [x.clone().requires_grad_() for x in xs]
    first = torch.autograd.grad(loss("triton", kw)(*leaves), leaves, create_graph=True)
    for i, (a, r) in enumerate(zip(torch.autograd.grad(sum((f * t).sum() for f, t in zip(first, ts)), leaves),
                                   expected, strict=True)):
        assert_close(a, r, f"{name}: double backward {i}")
    small = lambda backend, opts, k, v: (lambda q: loss(backend, opts)(q, k, v))  # the Hessian in q of one batch row
    one = {n: (t[:1] if isinstance(t, torch.Tensor) and t.dim() == 4 else t[:1] if n == "key_lengths" else t)
           for n, t in kw.items()}
    one64 = {n: (t.double() if isinstance(t, torch.Tensor) and t.dtype.is_floating_point else t) for n, t in one.items()}
    q1 = xs[0][:1, :, :3]
    if "mask" in one:
        one["mask"], one64["mask"] = one["mask"][:, :, :3], one64["mask"][:, :, :3]
    if one.get("causal"):  # the end-aligned mask of 3 queries is the last 3 rows of N_q: keep the shapes consistent
        one["causal"] = one64["causal"] = False
    assert_close(torch.func.hessian(small("triton", one, xs[1][:1], xs[2][:1]))(q1),
                 torch.func.hessian(small("reference", one64, x64[1][:1], x64[2][:1]))(q1.double()), f"{name}: hessian")


def test_the_variant_harness_the_appendix_runs_is_within_the_tolerance(gen: torch.Generator) -> None:
    errors = check.variant_errors(gen)
    assert len(errors) == 5 and all(len(e) >= 8 for e in errors.values())  # out, 3 gradients, tangent, 3 HVPs
    assert all(err <= TOL for e in errors.values() for err in e.values()), errors
