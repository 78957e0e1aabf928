#!/usr/bin/env python3
"""Benchmark the identification engine: `verify`'s structured route against its dense route, on CPU.

Layouts: every standard layout with d_model in --d-models (every H dividing d_model, every G
dividing H, RoPE off and on where d_k is even, biases none and qkvo), then the --wide layouts
(d_model = 64 by default). Each is verified by the structured route (`verify(method="auto")`,
attnid.structured) and, on every layout with d_model <= --dense-max-d and every --dense-every-th
above that, by the dense route (`method="dense"`: the certificate from the Jacobian, then the
SVD); the CSV gives both nullities and times side by side, and the dense route's memory estimate
where it was not run. The reference for the times is one dense float64 SVD (`torch.linalg.svd`,
singular vectors included) of a 4,096 x 4,096 Gaussian matrix, timed at the start and at the end
of the same run (`svdvals` alone, too): every row carries its time as a ratio of the first SVD.
Writes data/bench/engine.csv (atomically, with a provenance sidecar). A measurement, not a test.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch
from tqdm import tqdm

from attnbook.machine import cpu_model
from attnbook.provenance import write_csv
from attnid.spec import AttentionSpec, standard_layouts
from attnid.budget import estimate_resources
from attnid.verification import verify

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "scripts/bench_engine.py"


REFERENCE_SIZE = 4096
WIDE = ["64,8,8,0,none", "64,8,2,0,none", "64,8,8,0,qkvo", "64,16,16,0,none"]


def reference_svd(seed: int) -> tuple[float, float]:
    """(seconds for torch.linalg.svd, seconds for torch.linalg.svdvals) of one 4,096 x 4,096 float64 Gaussian matrix."""
    a = torch.randn(REFERENCE_SIZE, REFERENCE_SIZE, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    start = time.perf_counter()
    torch.linalg.svd(a)
    full = time.perf_counter() - start
    start = time.perf_counter()
    torch.linalg.svdvals(a)
    return full, time.perf_counter() - start


def timed(spec: AttentionSpec, method: str, seed: int):
    start = time.perf_counter()
    result = verify(spec, seed=seed, method=method)
    return result, time.perf_counter() - start


def parse_layout(text: str) -> AttentionSpec:
    """'d,H,G,rope_fraction,bias' -> the layout."""
    d, h, g, rope, bias = text.split(",")
    return AttentionSpec.create(int(d), int(h), kv_heads=int(g), rope_fraction=float(rope), bias=bias)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--d-models", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--wide", nargs="*", default=WIDE, help="more layouts as d,H,G,rope_fraction,bias")
    parser.add_argument("--dense-max-d", type=int, default=32, help="run the dense route on every layout up to this d_model")
    parser.add_argument("--dense-every", type=int, default=4, help="above --dense-max-d, on every N-th standard layout")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench/engine.csv", help="path under data/")
    args = parser.parse_args(argv)

    svd_s, svdvals_s = reference_svd(args.seed)
    print(f"reference: svd {svd_s:.2f} s, svdvals {svdvals_s:.2f} s ({REFERENCE_SIZE} x {REFERENCE_SIZE} float64)")
    standard = [spec for d in args.d_models for spec in standard_layouts(d, biases=("none", "qkvo"))]
    layouts = [(spec, "standard") for spec in standard] + [(parse_layout(t), "wide") for t in args.wide]
    rows, failures = [], 0
    partial = Path(tempfile.gettempdir()) / "attnid_bench_engine.partial.csv"  # progress, outside data/
    for index, (spec, group) in enumerate(tqdm(layouts, desc="layouts")):
        fast, fast_s = timed(spec, "auto", args.seed)
        failures += fast.matches is not True
        run_dense = group == "standard" and (spec.d_model <= args.dense_max_d or index % args.dense_every == 0)
        dense, dense_s = timed(spec, "dense", args.seed) if run_dense else (None, None)
        if dense is not None:
            failures += dense.matches is not True
        rows.append((group, spec.d_model, spec.heads, spec.kv_heads, spec.head_dim, spec.rope_dims, spec.bias or "none",
                     fast.count.total, fast.count.unidentified, fast.numeric_unidentified, fast.matches,
                     fast.decision.method, fast.n_inputs, f"{fast_s:.3f}", f"{fast_s / svd_s:.3f}",
                     "" if dense is None else dense.numeric_unidentified, "" if dense is None else dense.decision.method,
                     "" if dense_s is None else f"{dense_s:.3f}",
                     estimate_resources(spec, method="dense").bytes, estimate_resources(spec, method="auto").bytes,
                     f"{svd_s:.3f}", f"{svdvals_s:.3f}"))
        partial.write_text("\n".join(",".join(map(str, r)) for r in rows) + "\n")
    svd_end, svdvals_end = reference_svd(args.seed)
    print(f"reference again at the end: svd {svd_end:.2f} s, svdvals {svdvals_end:.2f} s")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    device = (f"cpu ({cpu_model()}, {torch.get_num_threads()} threads); reference svd {svd_s:.2f} s / {svd_end:.2f} s "
              f"(start / end), svdvals {svdvals_s:.2f} s / {svdvals_end:.2f} s")
    header = ["group", "d_model", "heads", "kv_heads", "head_dim", "rope_dims", "bias", "total", "exact", "numeric",
              "matches", "method", "n_inputs", "verify_s", "verify_per_svd", "dense_numeric", "dense_method",
              "dense_s", "dense_estimate_bytes", "estimate_bytes", "svd_reference_s", "svdvals_reference_s"]
    path = write_csv(args.out, header, rows, notebook=SCRIPT,
                     parameters={"d_models": args.d_models, "wide": args.wide, "dense_max_d": args.dense_max_d,
                                 "dense_every": args.dense_every, "seed": args.seed},
                     device=device, root=ROOT)
    for d in sorted({r[1] for r in rows}):
        sub = [r for r in rows if r[1] == d and r[0] == "standard"]
        if sub:
            print(f"d={d}: {len(sub)} standard layouts, structured total {sum(float(r[13]) for r in sub):.1f} s")
    standard_total = sum(float(r[13]) for r in rows if r[0] == "standard")
    print(f"standard sweep (structured route): {standard_total:.1f} s")
    both = [r for r in rows if r[15] != ""]
    print(f"dense route on {len(both)} layouts: {sum(float(r[17]) for r in both):.1f} s against "
          f"{sum(float(r[13]) for r in both):.1f} s structured; nullities agree on {sum(r[15] == r[9] for r in both)}")
    for r in rows:
        if r[0] == "wide":
            print(f"wide {r[1]},{r[2]},{r[3]},{r[5]},{r[6]}: {r[13]} s = {r[14]} x svd, matches {r[10]}")
    print(f"peak resident memory of this process: {peak / 2**30:.2f} GiB")
    partial.unlink(missing_ok=True)
    print(f"wrote {path}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
