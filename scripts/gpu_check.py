#!/usr/bin/env python3
"""Everything a CUDA GPU can show about the attention kernels, in one command: `make gpu-check`.

1. Correctness, in bf16, fp16 and fp32, head widths D 64, 128 and 256, GQA ratios H/G 1, 4
   and 8, causal off and on, RoPE off, on half of D and on all of D, sink off and on, at
   sequence lengths N = 1 and lengths that are no multiple of any tile (CORRECTNESS_TOKENS).
   Each case is one Triton compilation of every kernel (the options are compile-time
   constants), so the full product, 324 cases (--full), costs about a thousand compilations.
   The default is a covering design of 54, plus one case per dtype and width beyond the square
   attention (N_k = N_q + 37 keys under the causal mask aligned to the end, as in decoding, and a key
   padding mask on the last batch row), plus one cross-attention case per dtype (N_k = N_q // 3 keys, no
   causal mask), plus one case per dtype with a general mask (boolean in bf16 and fp32, additive in fp16,
   on top of the causal mask, each dtype at another width): 69. The 54: for every dtype and width, all six RoPE x sink
   settings, with causal, the GQA ratio and the length rotated among them so that each dtype
   and width meets both causal settings, all three ratios and all four lengths, and each
   ratio x causal pair occurs with every RoPE setting somewhere. Per case, for the forward output, the
   gradients of q, k, v (and the sink), the forward-mode tangent and the Hessian-vector products of
   <out, cotangent> along the tangent (hvp_q, ...: the fused second-order kernels), the kernel's largest
   absolute error against a float64 reference must satisfy

       err(attnid) <= 2 * max(err(PyTorch, same dtype), floor),
       floor = (u + sqrt(m) * u32) * (1 + max|reference|).

   The first term is FlashAttention's test rule: twice the error PyTorch's own attention makes
   in the same dtype, against the same reference. The floor is what no implementation can be
   asked to beat: rounding the result to the dtype (unit roundoff u), plus float32 accumulation
   over the m = D * N * H/G products that reach one output element (a key's dK gathers D-long
   dot products over the N queries of each of its group's H/G heads; three times as many for a
   Hessian-vector product, whose tangent of dS has three products per pair), at the sqrt(m) * u32
   growth of the probabilistic rounding-error analysis of Higham and Mary (2019) (u32 = 2^-24),
   measured against 1 + max|reference| because the inputs are of order one and the
   intermediate sums (dO.v, q.k) can be far larger than a result they cancel into. PyTorch beats
   the floor by luck or by a different order of operations only, and a 2x ratio of rounding
   noise then decides nothing. The smoke run (float32, N = 1) met three such cases: the
   tangent at N = 1 without a sink is exactly tv, which the math backend gets exactly while the
   fused recurrence keeps the rounding of p ds v + p tv; a dV summed over four heads; and dQ,
   dK with a sink, where FlashAttention's delta = rowsum(dO * O) cancels against dO.v (PyTorch
   forms sum_j P dP instead): 5e-7 against PyTorch's 4e-8, with values of order one. In bf16
   and fp16 the floor is about one rounding of the result, so the 2x rule is what binds; in
   float32 the floor dominates.
   PyTorch's attention here: RoPE in float32, cast to the
   dtype, then `F.scaled_dot_product_attention` (default dispatch) with the key/value heads
   repeated and the sink as one more key of zero value whose score is the sink logit. For the
   tangent SDPA has no rule of its own (its flash and memory-efficient backends have no
   forward-mode derivative), so the baseline is `torch.func.jvp` through the same pipeline on
   SDPA's math backend, in the same dtype; likewise for the Hessian-vector products
   (`torch.func.jvp` of `torch.func.grad`).
2. Benchmark: scripts/bench_attention.py (the one benchmark) on a reduced sweep, N in
   {1k, 4k, 16k}, D in {64, 128}, G in {32, 8} (H = 32, B = 4), causal off and on, bf16:
   forward, backward and JVP against every SDPA backend, RoPE-then-SDPA and torch.func.jvp
   through SDPA's math backend, each with its peak memory.

Writes data/bench/correctness_<device>.csv and data/bench/attention_<device>.csv, each with a
provenance sidecar (device, driver, CUDA runtime, torch/triton versions), and prints a summary.
Compilation dominates the correctness part, so its cases run in --workers processes.

Exit status: 0 every check passed, 1 a check failed (both files are still written), 2 it cannot
run here (no CUDA: one line on stderr, nothing written). `--smoke` runs the same code on the
CPU in Triton's interpreter (float32, tiny shapes) and writes under a temporary folder, never
data/: it exercises the script in the test suite and measures nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import math
import os
import sys
import tempfile
import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from dataclasses import astuple, dataclass, fields
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "scripts/gpu_check.py"
DTYPES = ("bf16", "fp16", "fp32")
WIDTHS = (64, 128, 256)
GQA_RATIOS = (1, 4, 8)
ROPE_FRACTIONS = (0.0, 0.5, 1.0)
CORRECTNESS_TOKENS = (1, 77, 333, 1031)  # 1, and lengths no multiple of any tile (16 to 128)
HEADS, BATCH = 8, 2
BENCH_ARGS = ["--tokens", "1024", "8192", "16384", "--head-dims", "64", "128", "--kv-heads", "32", "8"]
# --smoke: float32 in the interpreter, narrow heads, a few lengths, a covering subset of the cases
SMOKE = dict(dtypes=("fp32",), widths=(16,), ratios=(1, 2, 4), tokens=(1, 5, 17), heads=4)
SMOKE_CASES = 4
# unit roundoff of each dtype: the error of rounding an exact result to it, relative to its size
UNIT_ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11, "fp32": 2.0**-24}
RULE_FACTOR = 2.0
TARGET_SECONDS = 480  # the budget for the whole command on an H100/H200 (not yet measured)
HEADER = ["dtype", "head_dim", "heads", "kv_heads", "tokens", "causal", "rope_fraction", "sink", "quantity",
          "err_attnid", "err_pytorch", "floor", "bound", "key_tokens", "padded", "mask", "ok"]
BEYOND_KEYS = 37  # the extra case of each cell: N_k = N_q + 37 keys (decoding), the last batch row padded
MASKS = ("boolean", "additive")  # a general mask (B, 1, N_q, N_k) on top of the causal one
MASK_CASES = {"bf16": "boolean", "fp16": "additive", "fp32": "boolean"}  # the mask case of each dtype


@dataclass(frozen=True)
class Case:
    """One correctness case: the dtype, the shape and the options of one attention call."""

    dtype: str
    head_dim: int
    heads: int
    kv_heads: int
    tokens: int
    causal: bool
    rope_fraction: float
    sink: bool
    key_tokens: int = 0  # N_k; 0: the same as tokens (N_q)
    padded: bool = False  # a key padding mask: the last batch row sees only N_k // 2 + 1 keys
    mask: str = ""  # a general mask (MASKS): boolean (each pair kept with probability 3/4) or additive (N(0, 1) scores)

    @property
    def keys(self) -> int:
        return self.key_tokens or self.tokens


def correctness_cases(smoke: bool, full: bool = False) -> list[Case]:
    """The covering design of the module docstring (or, with `full`, every combination); lengths in turn."""
    dtypes, widths, ratios, tokens, heads = ((SMOKE["dtypes"], SMOKE["widths"], SMOKE["ratios"], SMOKE["tokens"],
                                              SMOKE["heads"]) if smoke else (DTYPES, WIDTHS, GQA_RATIOS,
                                                                              CORRECTNESS_TOKENS, HEADS))
    if full:
        grid = itertools.product(dtypes, widths, ratios, (False, True), ROPE_FRACTIONS, (False, True))
        return [Case(dt, d, heads, heads // r, tokens[i % len(tokens)], causal, rope, sink)
                for i, (dt, d, r, causal, rope, sink) in enumerate(grid)]
    cases = []
    for cell, (dt, d) in enumerate(itertools.product(dtypes, widths)):
        for i, (rope, sink) in enumerate(itertools.product(ROPE_FRACTIONS, (False, True))):
            turn = i + cell  # rotates causal, the ratio and the length from one cell to the next
            cases.append(Case(dt, d, heads, heads // ratios[(i // 2 + cell) % len(ratios)], tokens[turn % len(tokens)],
                              bool(turn % 2), rope, sink))
        # beyond the square: fewer queries than keys under a causal mask (decoding), with a key padding mask
        n_q = tokens[cell % len(tokens)]
        cases.append(Case(dt, d, heads, heads // ratios[cell % len(ratios)], n_q, True, ROPE_FRACTIONS[cell % 3],
                          bool(cell % 2), n_q + BEYOND_KEYS, True))
    for i, dt in enumerate(dtypes):  # cross-attention: more queries than keys (no causal mask, no RoPE: both refused)
        n_q = tokens[-1 - i % 2]
        cases.append(Case(dt, widths[-1 - i % len(widths)], heads, heads // ratios[i % len(ratios)], n_q, False, 0.0,
                          bool(i % 2 == 0), max(n_q // 3, 1)))
    for i, dt in enumerate(dtypes):  # a general mask: one case per dtype, each at another width (masked kernel variants)
        cases.append(Case(dt, widths[i % len(widths)], heads, heads // ratios[len(ratios) // 2], tokens[-1 - i % 2],
                          bool(i % 2 == 0), ROPE_FRACTIONS[1], bool(i % 2), mask=MASK_CASES.get(dt, MASKS[i % 2])))
    if smoke:  # a spread-out subset of the one cell: every length, both causal settings, RoPE and sink on and off
        # ... and the last case beyond the square (decoding, padding), the cross-attention and the mask case
        cases = [cases[i] for i in (0, 3, 4, 5)][:SMOKE_CASES] + [cases[-1 - 2 * len(dtypes)]] + cases[-2 * len(dtypes):]
    return cases


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU interpreter, written to a temp folder")
    p.add_argument("--workers", type=int, default=None,
                   help="processes for the correctness cases (default: up to 8 on CUDA, 1 with --smoke)")
    p.add_argument("--skip-bench", action="store_true", help="only the correctness checks")
    p.add_argument("--full", action="store_true", help="every combination (324 cases) instead of the covering design")
    args = p.parse_args(argv)
    if args.workers is not None and not 1 <= args.workers <= 64:
        p.error(f"--workers must lie in 1..64, got {args.workers}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    elif os.environ.get("TRITON_INTERPRET") == "1":
        print("make gpu-check: unset TRITON_INTERPRET (it would simulate the kernels instead of running them on the GPU)",
              file=sys.stderr)
        return 2
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("make gpu-check needs a CUDA GPU and torch sees none here; nothing was run or written "
              "(make test checks the kernels on the CPU in Triton's interpreter).", file=sys.stderr)
        return 2
    bench = load_bench()
    device = torch.device("cpu" if args.smoke else "cuda")
    workers = args.workers or (1 if args.smoke else min(8, os.cpu_count() or 1))
    data_dir = Path(tempfile.mkdtemp(prefix="attnid-gpu-check-")) / "data" if args.smoke else ROOT / "data"
    (data_dir / "bench").mkdir(parents=True, exist_ok=True)

    began = start = time.perf_counter()
    cases = correctness_cases(args.smoke, args.full)
    rows = run_cases(cases, workers, args.smoke)
    failures = [r for r in rows if not r[-1]]
    from attnbook.provenance import write_csv
    from attnid.kernels import api, arguments, check, flash, launch, reference  # noqa: F401 - loaded here so that the sidecar records their hashes

    name = bench.device_slug(device)
    path = write_csv(f"bench/correctness_{name}.csv", HEADER, rows, notebook=SCRIPT,
                     parameters={"cases": len(cases), "full": args.full, "smoke": args.smoke, "rule_factor": RULE_FACTOR,
                                 "tokens": list(SMOKE["tokens"] if args.smoke else CORRECTNESS_TOKENS)},
                     device=bench.describe(device), root=ROOT, data_dir=data_dir.resolve())
    print_correctness(rows)
    print(f"correctness: {len(cases)} cases, {len(rows)} comparisons, {len(failures)} failed "
          f"({time.perf_counter() - start:.0f} s, {workers} worker(s)); wrote {path}", flush=True)

    status = 0
    if not args.skip_bench:
        start = time.perf_counter()
        status = bench.main([*(["--smoke"] if args.smoke else BENCH_ARGS), "--data-dir", str(data_dir)])
        print(f"benchmark: {time.perf_counter() - start:.0f} s", flush=True)
    print(f"make gpu-check: {time.perf_counter() - began:.0f} s in all (designed for at most {TARGET_SECONDS} s on an "
          f"H100/H200); {len(failures)} failed comparison(s)")
    return 1 if failures else status


def load_bench():
    """scripts/bench_attention.py as a module (the benchmark lives there, once)."""
    spec = importlib.util.spec_from_file_location("bench_attention", ROOT / "scripts" / "bench_attention.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_cases(cases: list[Case], workers: int, smoke: bool) -> list[list]:
    """The rows of every case, in case order; in `workers` processes when more than one."""
    from tqdm import tqdm

    progress = tqdm(total=len(cases), desc="correctness", file=sys.stdout)
    rows: list[list] = []
    if workers == 1:
        for case in cases:
            rows += check_case(case, smoke)
            progress.update()
    else:
        with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
            for found in pool.map(check_case, cases, itertools.repeat(smoke)):
                rows += found
                progress.update()
    progress.close()
    return rows


# ------------------------------------------------------------------------------------------------
# One case: attnid, PyTorch in the same dtype, and the float64 reference
# ------------------------------------------------------------------------------------------------


def check_case(case: Case, smoke: bool) -> list[list]:
    """One row per compared quantity: output, dq, dk, dv, (dsink), tangent, and the Hessian-vector products."""
    import torch

    from attnid.kernels import attention
    from attnid.kernels.check import evaluate

    device = torch.device("cpu" if smoke else "cuda")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[case.dtype]
    gen = torch.Generator().manual_seed(zlib.crc32(repr(astuple(case)).encode()))
    b, h, g, n, d = BATCH if not smoke else 1, case.heads, case.kv_heads, case.tokens, case.head_dim

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(device)

    nk = case.keys
    exact = {"q": draw(b, h, n, d), "k": draw(b, g, nk, d), "v": draw(b, g, nk, d)}
    tangent = {"q": draw(b, h, n, d), "k": draw(b, g, nk, d), "v": draw(b, g, nk, d)}
    if case.sink:
        exact["sink"], tangent["sink"] = draw(h), draw(h)
    cotangent = draw(b, h, n, d)
    # Every implementation sees the same inputs: the draws rounded to the dtype (the reference in float64).
    low = {k: x.to(dtype) for k, x in exact.items()}
    exact = {k: x.to(dtype).double() for k, x in exact.items()}
    low_t = {k: x.to(dtype) for k, x in tangent.items()}
    tangent = {k: x.to(dtype).double() for k, x in tangent.items()}
    names = list(exact)
    options = dict(causal=case.causal, rope_fraction=case.rope_fraction)
    if case.padded:  # the last batch row sees only its first nk // 2 + 1 keys
        options["key_lengths"] = torch.tensor([nk] * (b - 1) + [nk // 2 + 1], device=device)
    if case.mask == "boolean":  # every pair kept with probability 3/4, the first key always: every row sees it,
        keep = torch.rand(b, 1, n, nk, generator=gen) < 0.75  # causal or not (queries end-aligned), so none is empty
        keep[..., 0] = True
        options["mask"] = keep.to(device)
    elif case.mask == "additive":
        options["mask"] = torch.randn(b, 1, n, nk, generator=gen, dtype=torch.float64).to(device, dtype)

    def ours(*xs: torch.Tensor) -> torch.Tensor:
        x = dict(zip(names, xs, strict=True))
        return attention(x["q"], x["k"], x["v"], sink=x.get("sink"), backend="triton", **options)

    def reference(*xs: torch.Tensor) -> torch.Tensor:
        x = dict(zip(names, xs, strict=True))
        return attention(x["q"], x["k"], x["v"], sink=x.get("sink"), backend="reference", **options)

    def pytorch(*xs: torch.Tensor) -> torch.Tensor:
        x = dict(zip(names, xs, strict=True))
        return pytorch_attention(x["q"], x["k"], x["v"], x.get("sink"), **options)

    def pytorch_math(*xs: torch.Tensor) -> torch.Tensor:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.MATH]):
            return pytorch(*xs)

    results = {"attnid": evaluate(ours, low, low_t, cotangent.to(dtype), second_order=True),
               "pytorch": evaluate(pytorch, low, low_t, cotangent.to(dtype), tangent_fn=pytorch_math, second_order=True),
               "reference": evaluate(reference, exact, tangent, cotangent.to(dtype).double(), second_order=True)}
    return [compare(case, quantity, *(results[m][quantity] for m in ("attnid", "pytorch", "reference")))
            for quantity in results["reference"]]


def compare(case: Case, quantity: str, got, base, ref) -> list:
    """err(attnid) <= RULE_FACTOR * max(err(PyTorch), floor), all errors the largest absolute ones (module docstring)."""
    err_ours = (got.double() - ref).abs().max().item()
    err_base = (base.double() - ref).abs().max().item()
    terms = case.head_dim * max(case.tokens, case.keys) * (case.heads // case.kv_heads)
    if quantity.startswith("hvp_"):  # the second order sums three products per key (d(ds), ds and dP tangents)
        terms *= 3
    floor = (UNIT_ROUNDOFF[case.dtype] + math.sqrt(terms) * UNIT_ROUNDOFF["fp32"]) * (1 + ref.abs().max().item())
    bound = RULE_FACTOR * max(err_base, floor)
    ok = math.isfinite(err_ours) and err_ours <= bound
    return [case.dtype, case.head_dim, case.heads, case.kv_heads, case.tokens, case.causal, case.rope_fraction,
            case.sink, quantity, f"{err_ours:.3e}", f"{err_base:.3e}", f"{floor:.3e}", f"{bound:.3e}", case.keys,
            case.padded, case.mask, ok]


def pytorch_attention(q, k, v, sink, *, causal: bool, rope_fraction: float, rope_base: float = 10000.0,
                      key_lengths=None, mask=None):
    """PyTorch's attention in the dtype of q: RoPE (float32, then cast), repeated key/value heads, SDPA.

    The sink enters as one more key whose score is the sink logit (a zero key plus that logit as an
    additive mask) and whose value is zero: exactly exp(sink) more in each row's denominator.
    """
    import torch
    import torch.nn.functional as F

    from attnid.normalise import additive_mask
    from attnid.rope import apply_rope

    dtype, (b, h, n, d), g, nk = q.dtype, q.shape, k.shape[1], k.shape[2]
    rope_dims, shift = round(rope_fraction * d), nk - n  # queries aligned to the end of the keys
    if rope_dims:  # RoPE at positions shift..nk-1: rotate behind a zero front, drop it (the kernels refuse shift < 0)
        front = q.new_zeros(b, h, shift, d)
        q = apply_rope(torch.cat([front, q], dim=2).float(), rope_dims, rope_base)[:, :, shift:].to(dtype)
        k = apply_rope(k.float(), rope_dims, rope_base).to(dtype)
    k, v = k.repeat_interleave(h // g, dim=1), v.repeat_interleave(h // g, dim=1)
    if sink is None and not shift and key_lengths is None and mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    hidden = torch.zeros(b, 1, n, nk, dtype=torch.bool, device=q.device)
    if causal:  # SDPA's is_causal aligns to the start; the kernels' mask is aligned to the end
        hidden = hidden | torch.ones(n, nk, dtype=torch.bool, device=q.device).triu(1 + shift)
    if key_lengths is not None:
        hidden = hidden | (torch.arange(nk, device=q.device) >= key_lengths.reshape(b, 1, 1, 1))
    if mask is not None and mask.dtype == torch.bool:
        hidden = hidden | ~mask
    scores_mask = additive_mask(hidden, dtype).expand(b, h, n, nk)
    if mask is not None and mask.dtype != torch.bool:
        scores_mask = scores_mask + mask.to(dtype)
    if sink is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=scores_mask)
    k = torch.cat([k, k.new_zeros(b, h, 1, d)], dim=2)
    v = torch.cat([v, v.new_zeros(b, h, 1, v.shape[-1])], dim=2)
    mask = torch.cat([scores_mask, sink.to(dtype)[None, :, None, None].expand(b, h, n, 1)], dim=-1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def print_correctness(rows: list[list]) -> None:
    """Per dtype and quantity: comparisons, failures, and the largest err(attnid) / bound."""
    print(f"{'dtype':6} {'quantity':9} {'checks':>6} {'failed':>6} {'worst err/bound':>16}")
    keys = sorted({(r[0], r[8]) for r in rows}, key=lambda k: (DTYPES.index(k[0]), k[1]))
    for dtype, quantity in keys:
        group = [r for r in rows if (r[0], r[8]) == (dtype, quantity)]
        worst = max((float(r[9]) / float(r[12]) if float(r[12]) > 0 else (0.0 if float(r[9]) == 0 else math.inf))
                    for r in group)
        print(f"{dtype:6} {quantity:9} {len(group):6} {sum(not r[-1] for r in group):6} {worst:16.3f}")
    for r in rows:
        if not r[-1]:
            print("FAILED:", dict(zip(HEADER, r, strict=True)))


assert [f.name for f in fields(Case)] == HEADER[:8] + HEADER[-4:-1]  # the CSV columns name the case fields

if __name__ == "__main__":
    sys.exit(main())
