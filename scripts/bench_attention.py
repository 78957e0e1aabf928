#!/usr/bin/env python3
"""Benchmark the Triton attention kernels on a CUDA GPU -> data/bench/attention_<device>.csv.

Sweep (issue 4): B=4, H=32, G in {32, 8}, N in {1k, 2k, 4k, 8k, 16k}, D in {64, 128}, causal off
and on, bfloat16. For each shape, after checking the kernel against a float32 PyTorch reference:

  forward   attnid triton (no RoPE)   vs torch SDPA on each backend (flash, efficient, cudnn, math)
            attnid triton (RoPE on all of D, fused, GQA by index)  vs the unfused pipeline:
            RoPE in PyTorch, then SDPA (default dispatch) with enable_gqa=True
  backward  the same implementations, timing loss.backward() given the forward's graph
  jvp       attnid's fused tangent pass vs torch.func.jvp through SDPA's math backend, and through the
            `jvp_flash_attention` package (the closest public peer) when it is installed
  hvp       a Hessian-vector product of a scalar loss, forward over reverse (torch.func.jvp of
            torch.func.grad): attnid's fused second-order kernels vs SDPA's math backend (and the peer)
  cross     N_q != N_k: queries of N tokens against N/4 keys and values (no causal mask, no RoPE),
            forward, backward and JVP, attnid vs SDPA (default dispatch)
  padding   a key padding mask (row b sees its first L_b keys, L_b from N/2 to N): attnid's key_lengths
            vs SDPA with a boolean attn_mask (efficient and math backends), forward and JVP

Every timed call also records the peak memory it allocates beyond its inputs (CUDA only).

TFLOP/s uses the forward count F = 4 B H N_q N_k D (halved when causal) times: forward 1, backward
2.5 (FlashAttention's convention: five matrix products against two), JVP 3 (six products against
two), HVP 7 (the forward and backward passes, and the tangent of each). Masked keys are counted.
Times are medians of triton.testing.do_bench. A shape an SDPA backend rejects, or one the math
backend cannot fit (N^2 scores per head), is recorded as such, not dropped.

`--smoke` runs two tiny shapes on the CPU in Triton's interpreter (float32) and writes under a
temporary folder, never data/: it exercises this script in the test suite, it measures nothing.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "scripts/bench_attention.py"
SDPA_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")
MATH_MEMORY_LIMIT = 0.5  # skip the math backend where its float32 score matrices need over half the free memory
FLOP_FACTOR = {"forward": 1.0, "backward": 2.5, "jvp": 3.0, "hvp": 7.0}
HEADER = ["pass", "implementation", "batch", "heads", "kv_heads", "tokens", "kv_tokens", "head_dim", "causal", "rope",
          "mask", "median_ms", "tflops", "peak_mib", "note"]
PEER = "jvp_flash_attention"  # optional: pip install jvp_flash_attention (a benchmark dependency only)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--kv-heads", type=int, nargs="+", default=[32, 8])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU interpreter, written to a temp folder")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="the data folder to write bench/ into (default: data/, or a temporary folder with --smoke)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        args.tokens, args.head_dims, args.kv_heads, args.batch, args.heads = [17], [16], [1], 1, 2
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("make bench times the Triton kernels on a CUDA GPU, and torch sees none here; nothing was written.\n"
              "The kernels' correctness tests run on this machine in Triton's interpreter: make test-lib.",
              file=sys.stderr)
        return 2
    from tqdm import tqdm

    from attnbook.provenance import write_csv

    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    shapes = [(g, n, d, causal) for g in args.kv_heads for n in args.tokens for d in args.head_dims
              for causal in (False, True)]
    rows: list[list] = []
    for g, n, d, causal in tqdm(shapes, desc="shapes", file=sys.stdout):
        rows += bench_shape(args.batch, args.heads, g, n, d, causal, dtype, device)
    name = device_slug(device)
    data_dir = args.data_dir or (Path(tempfile.mkdtemp(prefix="attnid-bench-")) / "data" if args.smoke else ROOT / "data")
    (data_dir / "bench").mkdir(parents=True, exist_ok=True)
    path = write_csv(f"bench/attention_{name}.csv", HEADER, rows, notebook=SCRIPT,
                     parameters={"tokens": args.tokens, "head_dims": args.head_dims, "kv_heads": args.kv_heads,
                                 "batch": args.batch, "heads": args.heads, "dtype": str(dtype), "smoke": args.smoke},
                     device=describe(device), root=ROOT, data_dir=data_dir.resolve())
    print_summary(rows)
    print(f"wrote {path}")
    return 0


def device_slug(device) -> str:
    import torch

    if device.type != "cuda":
        return "cpu-interpreter"
    return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(device).lower()).strip("-")


def describe(device) -> str:
    """Device, driver and CUDA runtime, for the provenance sidecar."""
    import torch

    if device.type != "cuda":
        return "cpu (Triton interpreter; smoke run, not a measurement)"
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, check=True).stdout.strip().splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        driver = "unknown"
    return f"cuda:{torch.cuda.get_device_name(device)}; driver {driver}; CUDA runtime {torch.version.cuda}"


def timer(device) -> Callable[[Callable[[], object]], float]:
    """Median milliseconds of fn(): CUDA events through triton's do_bench, or a host clock in smoke runs."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return lambda fn: float(do_bench(fn, warmup=25, rep=100, return_mode="median"))

    def host(fn: Callable[[], object]) -> float:
        samples = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
        return statistics.median(samples)

    return host


def peak_mib(fn: Callable[[], object], device) -> float | str:
    """Peak memory allocated while fn() runs, beyond what was allocated before (MiB); '' off CUDA."""
    import torch

    if device.type != "cuda":
        return ""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return round((torch.cuda.max_memory_allocated() - base) / 2**20, 1)


def bench_shape(b: int, h: int, g: int, n: int, d: int, causal: bool, dtype, device) -> list[list]:
    import torch
    from torch.nn.attention import SDPBackend

    from attnid.kernels import attention_jvp

    gen = torch.Generator().manual_seed(n * 1000 + d + g)
    q, k, v, tq, tk, tv = (torch.randn(b, heads, n, d, generator=gen).to(device, dtype)
                           for heads in (h, g, g, h, g, g))
    time_ms = timer(device)
    rows: list[list] = []

    def record(pass_: str, impl: str, rope: bool, fn: Callable[[], object] | None, note: str = "", *,
               n_k: int = n, mask: str = "none", batch: int = b, heads: int = h, kv_heads: int = g) -> None:
        ms: float | str = ""
        tflops: float | str = ""
        peak: float | str = ""
        flops = 4 * batch * heads * n * n_k * d / (2 if causal else 1)
        if fn is not None:
            try:
                ms = time_ms(fn)
                tflops = round(flops * FLOP_FACTOR[pass_] / (ms * 1e-3) / 1e12, 2)
                peak = peak_mib(fn, device)
                ms = round(ms, 4)
            except (RuntimeError, ValueError, TypeError) as err:  # a backend that rejects this shape
                note = "unsupported: " + str(err).splitlines()[0][:80].replace(",", ";")
        rows.append([pass_, impl, batch, heads, kv_heads, n, n_k, d, causal, rope, mask, ms, tflops, peak, note])

    check_against_reference(q, k, v, causal, device)
    # Every implementation is a function of (q, k, v): timed as is for the forward, and through
    # autograd on leaves that require grad for the backward.
    implementations: dict[str, tuple[bool, Callable | None, str]] = {}
    for rope in (False, True):
        implementations[f"attnid-triton/{rope}"] = (rope, functools.partial(ours, causal=causal, rope=rope), "")
    implementations["unfused-rope+sdpa/True"] = (True, functools.partial(unfused, causal=causal), "")
    fits = math_backend_fits(b, h, n, device)
    for name in SDPA_BACKENDS:
        skip = name == "MATH" and not fits
        fn = None if skip else functools.partial(sdpa, backend=getattr(SDPBackend, name), causal=causal)
        implementations[f"sdpa-{name.lower()}/False"] = (False, fn, "skipped: score matrices do not fit" if skip else "")
    for key, (rope, fn, note) in implementations.items():
        impl = key.split("/")[0]
        record("forward", impl, rope, (lambda fn=fn: fn(q, k, v)) if fn else None, note)
        record("backward", impl, rope, backward_of(fn, q, k, v) if fn else None, note)

    no_fit = "skipped: score matrices do not fit"
    record("jvp", "attnid-triton", False,
           lambda: attention_jvp(q, k, v, tq, tk, tv, causal=causal, backend="triton"))
    math_fn = functools.partial(sdpa, backend=SDPBackend.MATH, causal=causal)
    record("jvp", "torch.func.jvp-sdpa-math", False,
           (lambda: torch.func.jvp(math_fn, (q, k, v), (tq, tk, tv))) if fits else None, "" if fits else no_fit)
    small = None if fits else smaller_math_shape(h, g, n, lambda heads: math_backend_fits(1, heads, n, device))
    if small is not None:  # the math backend at batch 1 and fewer heads, and ours at the same shape beside it
        hs, gs = small
        part = [x[:1, :width].contiguous() for x, width in zip((q, k, v, tq, tk, tv), (hs, gs, gs, hs, gs, gs))]
        why = "batch 1 and fewer heads: the math backend's score matrices fit"
        for impl, fn in (("attnid-triton", lambda: attention_jvp(*part, causal=causal, backend="triton")),
                         ("torch.func.jvp-sdpa-math", lambda: torch.func.jvp(math_fn, tuple(part[:3]), tuple(part[3:])))):
            record("jvp", impl, False, fn, why, batch=1, heads=hs, kv_heads=gs)
    ours_fn = functools.partial(ours, causal=causal, rope=False)
    record("hvp", "attnid-triton", False, hvp_of(ours_fn, (q, k, v), (tq, tk, tv)))
    record("hvp", "torch.func-sdpa-math", False, hvp_of(math_fn, (q, k, v), (tq, tk, tv)) if fits else None,
           "" if fits else no_fit)
    peer, why = peer_attention(causal)
    if peer is not None and g < h:  # the package has no GQA: its keys and values are repeated to H heads, untimed
        why += "; k and v repeated to H heads (the package has no GQA)"
    ke, ve, tke, tve = (x.repeat_interleave(h // g, dim=1) for x in (k, v, tk, tv)) if peer else (k, v, tk, tv)
    if peer is not None:  # timed only where its tangent is the true one (checked against ours, once per shape)
        wrong = peer_tangent_error(peer, ours_fn, (q, k, v), (ke, ve), (tq, tk, tv), (tke, tve))
        peer, why = (None, f"skipped: {why}: {wrong}") if wrong else (peer, why)
    record("jvp", PEER, False, (lambda: torch.func.jvp(peer, (q, ke, ve), (tq, tke, tve))) if peer else None, why)
    record("hvp", PEER, False, hvp_of(peer, (q, ke, ve), (tq, tke, tve)) if peer else None, why)

    # N_q != N_k: N queries against N/4 keys (no causal mask or RoPE: cross-attention to a shorter context)
    n_k = max(n // 4, 1)
    kc, vc, tkc, tvc = (x[:, :, :n_k].contiguous() for x in (k, v, tk, tv))
    if not causal:
        cross_ours = functools.partial(ours, causal=False, rope=False)
        cross_sdpa = functools.partial(sdpa_default, causal=False)
        for impl, fn in (("attnid-triton", cross_ours), ("sdpa", cross_sdpa)):
            record("forward", impl, False, lambda fn=fn: fn(q, kc, vc), n_k=n_k)
            record("backward", impl, False, backward_of(fn, q, kc, vc), n_k=n_k)
        record("jvp", "attnid-triton", False, lambda: attention_jvp(q, kc, vc, tq, tkc, tvc, backend="triton"), n_k=n_k)
        record("jvp", "torch.func.jvp-sdpa-math", False,
               (lambda: torch.func.jvp(math_fn, (q, kc, vc), (tq, tkc, tvc))) if fits else None,
               "" if fits else no_fit, n_k=n_k)

    # a key padding mask: row b sees its first lengths[b] keys
    lengths = torch.randint(n // 2, n + 1, (b,), generator=gen).to(device)
    keep = (torch.arange(n, device=device)[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, N)
    padded_ours = functools.partial(ours_padded, causal=causal, lengths=lengths)
    record("forward", "attnid-triton", False, lambda: padded_ours(q, k, v), mask="key_lengths")
    record("jvp", "attnid-triton", False, lambda: torch.func.jvp(padded_ours, (q, k, v), (tq, tk, tv)), mask="key_lengths")
    for name in ("EFFICIENT_ATTENTION", "MATH"):
        skip = name == "MATH" and not fits
        fn = functools.partial(sdpa_masked, backend=getattr(SDPBackend, name), causal=causal, keep=keep)
        record("forward", f"sdpa-{name.lower()}", False, None if skip else (lambda fn=fn: fn(q, k, v)),
               no_fit if skip else "", mask="boolean")
        record("jvp", f"torch.func.jvp-sdpa-{name.lower()}", False,
               None if skip else (lambda fn=fn: torch.func.jvp(fn, (q, k, v), (tq, tk, tv))), no_fit if skip else "",
               mask="boolean")
    return rows


def hvp_of(forward: Callable | None, primals: tuple, tangents: tuple) -> Callable[[], object] | None:
    """A Hessian-vector product of the loss <forward(q, k, v), w> (w fixed): jvp of grad, forward over reverse."""
    import torch

    if forward is None:
        return None
    q, _, v = primals
    weight = torch.randn(*q.shape[:-1], v.shape[-1], generator=torch.Generator().manual_seed(0)).to(q.device)

    def loss(*args):
        return (forward(*args).float() * weight.float()).sum()

    grad = torch.func.grad(loss, argnums=(0, 1, 2))
    return lambda: torch.func.jvp(grad, primals, tangents)


PEER_TANGENT_TOL = 5e-2  # bf16: the peer's tangent against ours (the kernels' scaled error), before either is timed


def peer_tangent_error(peer: Callable, ours_fn: Callable, primals: tuple, peer_kv: tuple, tangents: tuple,
                       peer_t_kv: tuple) -> str:
    """Empty when the peer's output tangent agrees with ours on this shape; else what went wrong, for the note."""
    import torch

    from attnid.kernels.check import scaled_error

    try:
        _, want = torch.func.jvp(ours_fn, primals, tangents)
        _, got = torch.func.jvp(peer, (primals[0], *peer_kv), (tangents[0], *peer_t_kv))
    except (RuntimeError, ValueError, TypeError) as err:
        return "its jvp failed: " + str(err).splitlines()[0][:60].replace(",", ";")
    error = scaled_error(got, want)  # NaN (a non-finite tangent) fails the comparison too
    return "" if error <= PEER_TANGENT_TOL else f"its tangent is off by {error:.1e} (scaled error against ours)"


def peer_attention(causal: bool) -> tuple[Callable | None, str]:
    """The peer package's attention with forward-mode support, JVPAttn.fwd_dual(q, k, v, causal=...) (0.14.0:
    keys and values with H heads; its plain ``attention`` is JVPAttn.fwd, which computes no tangent), or None
    and why not."""
    import importlib
    import importlib.metadata
    import inspect

    try:
        module = importlib.import_module(f"{PEER}.jvp_attention")
    except ImportError:
        return None, f"skipped: {PEER} is not installed (pip install {PEER})"
    if not hasattr(getattr(module, "JVPAttn", None), "fwd_dual"):
        return None, f"skipped: {PEER} has no JVPAttn.fwd_dual (its forward-mode entry point in 0.14.0)"
    fn = module.JVPAttn.fwd_dual
    version = f"{PEER} {importlib.metadata.version(PEER)}"  # in the note: the sidecar records torch and triton only
    if "causal" in inspect.signature(fn).parameters:
        return functools.partial(fn, causal=causal), version
    if causal:
        return None, f"skipped: {version} has no causal mask"
    return fn, version


def ours(q, k, v, *, causal: bool, rope: bool):
    from attnid.kernels import attention

    return attention(q, k, v, causal=causal, rope_fraction=1.0 if rope else 0.0, backend="triton")


def unfused(q, k, v, *, causal: bool):
    """The pipeline the fused kernel replaces: RoPE as separate PyTorch passes, then SDPA's GQA."""
    import torch.nn.functional as F

    from attnid.layer import apply_rope

    d = q.shape[-1]
    return F.scaled_dot_product_attention(apply_rope(q, d, 10000.0), apply_rope(k, d, 10000.0), v,
                                          is_causal=causal, enable_gqa=True)


def ours_padded(q, k, v, *, causal: bool, lengths):
    from attnid.kernels import attention

    return attention(q, k, v, causal=causal, key_lengths=lengths, backend="triton")


def sdpa_default(q, k, v, *, causal: bool):
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)


def sdpa_masked(q, k, v, *, backend, causal: bool, keep):
    """SDPA with a boolean mask (and the causal mask folded into it: SDPA takes one or the other)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    n_q, n_k = q.shape[2], k.shape[2]
    if causal:
        keep = keep & torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(n_k - n_q)
    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)


def sdpa(q, k, v, *, backend, causal: bool):
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)


def backward_of(forward: Callable, q, k, v) -> Callable[[], object]:
    """A callable timing only the backward pass: the forward graph is built once, then reused."""
    import torch

    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    try:
        with torch.enable_grad():
            out = forward(*leaves)
    except (RuntimeError, ValueError):
        return lambda: forward(q, k, v)  # the forward itself is rejected: timing it records the reason
    cotangent = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, leaves, cotangent, retain_graph=True)


def smaller_math_shape(h: int, g: int, n: int, fits: Callable[[int], bool]) -> tuple[int, int] | None:
    """(heads, kv_heads) at batch 1, halving the heads from H, with the same query heads per key/value head,
    for which ``fits(heads)`` holds (the math backend's score matrices fit); None when not even one head fits."""
    heads = h
    while heads >= 1:
        if fits(heads):
            return heads, max(1, heads * g // h)
        heads //= 2
    return None


def math_backend_fits(b: int, h: int, n: int, device) -> bool:
    import torch

    if device.type != "cuda":
        return True
    need = 3 * b * h * n * n * 4  # scores, weights and a float32 copy, at least
    return need < MATH_MEMORY_LIMIT * torch.cuda.mem_get_info(device)[0]


def check_against_reference(q, k, v, causal: bool, device) -> None:
    """Refuse to time a kernel that is wrong at this shape: fused RoPE + GQA against the float32 reference."""
    import torch

    from attnid.kernels import attention

    rows = slice(0, min(q.shape[2], 512))  # a prefix of the sequence keeps the reference's N^2 small
    a, c, e = (x[:1, :, rows].contiguous() for x in (q, k, v))
    got = attention(a, c, e, causal=causal, rope_fraction=1.0, backend="triton").float()
    ref = attention(a.float(), c.float(), e.float(), causal=causal, rope_fraction=1.0, backend="reference")
    err = ((got - ref).norm() / ref.norm()).item()
    limit = 1e-2 if q.dtype == torch.bfloat16 else 1e-5
    if not err < limit:
        raise SystemExit(f"kernel disagrees with the reference at shape {tuple(q.shape)}: relative error {err:.2e}")


def print_summary(rows: list[list]) -> None:
    print(f"{'pass':9} {'implementation':30} {'G':>3} {'N':>6} {'N_k':>6} {'D':>4} {'causal':>6} {'rope':>5} {'mask':>11} "
          f"{'ms':>10} {'TFLOP/s':>8} {'peak MiB':>9}  note")
    for r in rows:
        print(f"{r[0]:9} {r[1]:30} {r[4]:>3} {r[5]:>6} {r[6]:>6} {r[7]:>4} {r[8]!s:>6} {r[9]!s:>5} {r[10]:>11} "
              f"{r[11]!s:>10} {r[12]!s:>8} {r[13]!s:>9}  {r[14]}")


if __name__ == "__main__":
    sys.exit(main())
