#!/usr/bin/env python3
"""Benchmark the identification engine: `verify` against a naive baseline, on CPU.

Sweep: every standard layout with d_model in --d-models (every H dividing d_model, every G
dividing H, RoPE off and on (full rotation, when d_k is even), biases none and qkvo).
For each layout it times `attnid.verify` (certificate first, SVD fallback, inputs added
until the rank is stable). The naive baseline is torch.func.jacrev of the whole layer on
the same inputs, stacked, then one full SVD; it runs for every layout with
d_model <= --naive-max-d and for every --naive-every-th layout above that (it gets slow fast). Writes data/bench/engine.csv (atomically, with a provenance sidecar) and prints
the totals. A measurement, not a test: the figures depend on the machine.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.func import jacrev
from tqdm import tqdm

import attnid
from attnbook.provenance import write_csv
from attnid.layer import forward, init_params
from attnid.rank import decide_rank
from attnid.spec import AttentionSpec, standard_layouts
from attnid.verify import default_inputs, default_seq_len, verify

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "scripts/bench_engine.py"
NAIVE_CHUNK = 512  # cotangents per reverse pass: bounds the naive baseline's memory (unchunked, it ran out at d=32)


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else the machine type."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def naive_nullity(spec: AttentionSpec, seed: int) -> tuple[int, float]:
    """jacrev of the whole layer on all inputs at once, then one SVD of the full Jacobian."""
    seq_len = default_seq_len(spec)
    gen = attnid.generator(seed)
    params = init_params(spec, gen)
    x = torch.stack([torch.randn(seq_len, spec.d_model, generator=gen, dtype=torch.float64)
                     for _ in range(default_inputs(spec, seq_len))])
    start = time.perf_counter()
    jac = jacrev(lambda p: forward(p, x, spec), chunk_size=NAIVE_CHUNK)(params)
    j = torch.cat([jac[name].reshape(x.numel() // spec.d_model * spec.d_model, -1) for name in params], dim=1)
    decision = decide_rank(torch.linalg.svdvals(j), j.shape[0], j.shape[1])
    return decision.nullity, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--d-models", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--naive-max-d", type=int, default=16, help="run the naive baseline on every layout up to this d_model")
    parser.add_argument("--naive-every", type=int, default=4, help="above --naive-max-d, on every N-th layout only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench/engine.csv", help="path under data/")
    args = parser.parse_args(argv)

    layouts = [spec for d in args.d_models for spec in standard_layouts(d, biases=("none", "qkvo"))]
    rows, total, naive_total, failures = [], 0.0, 0.0, 0
    partial = Path(tempfile.gettempdir()) / "attnid_bench_engine.partial.csv"  # progress, outside data/
    for index, spec in enumerate(tqdm(layouts, desc="layouts")):
        start = time.perf_counter()
        result = verify(spec, seed=args.seed)
        seconds = time.perf_counter() - start
        total += seconds
        failures += result.matches is not True
        run_naive = spec.d_model <= args.naive_max_d or index % args.naive_every == 0
        naive_null, naive_s = naive_nullity(spec, args.seed) if run_naive else (None, None)
        naive_total += naive_s or 0.0
        rows.append((spec.d_model, spec.heads, spec.kv_heads, spec.head_dim, spec.rope_dims, spec.bias or "none",
                     result.count.total, result.count.unidentified, result.numeric_unidentified, result.matches,
                     result.decision.method, result.n_inputs, result.seq_len, f"{seconds:.3f}",
                     "" if naive_null is None else naive_null, "" if naive_s is None else f"{naive_s:.3f}"))
        partial.write_text("\n".join(",".join(map(str, r)) for r in rows) + "\n")
    device = f"cpu ({cpu_model()}, {torch.get_num_threads()} threads)"
    header = ["d_model", "heads", "kv_heads", "head_dim", "rope_dims", "bias", "total", "exact", "numeric",
              "matches", "method", "n_inputs", "seq_len", "verify_s", "naive_numeric", "naive_s"]
    path = write_csv(args.out, header, rows, notebook=SCRIPT,
                     parameters={"d_models": args.d_models, "naive_max_d": args.naive_max_d,
                                 "naive_every": args.naive_every, "seed": args.seed},
                     device=device, root=ROOT)
    by_d = {d: sum(float(r[13]) for r in rows if r[0] == d) for d in args.d_models}
    print(f"{len(rows)} layouts, {failures} not matching; verify total {total:.1f} s "
          + ", ".join(f"d={d}: {s:.1f} s" for d, s in by_d.items()))
    naive_rows = [r for r in rows if r[15] != ""]
    if naive_rows:
        ours = sum(float(r[13]) for r in naive_rows)
        print(f"naive baseline on {len(naive_rows)} layouts: {naive_total:.1f} s vs verify {ours:.1f} s on the same layouts")
        for d in args.d_models:
            sub = [r for r in naive_rows if r[0] == d]
            if sub:
                print(f"  d={d}: {len(sub)} layouts, naive {sum(float(r[15]) for r in sub):.1f} s, "
                      f"verify {sum(float(r[13]) for r in sub):.1f} s, naive nullity agrees on "
                      f"{sum(r[14] == r[8] for r in sub)}")
    partial.unlink(missing_ok=True)
    print(f"wrote {path}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
