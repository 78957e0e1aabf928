#!/usr/bin/env python3
"""Time the ball-arithmetic rank proofs (attnid.ballcert) on the certificate appendix's layouts, on CPU.

The layouts are those of ``attnbook.grids.ball_certificate_cases`` (chapter 8's QK-norm grid, chapter 9's
latent layouts, chapters 2 to 7 up to --max-d); each is certified once and timed. Writes
data/bench/ballcert.csv (atomically, with a provenance sidecar naming the CPU, the thread count and the
package versions). The appendix reads this file for the cost per layout; the results themselves come
from experiments/ball_certificates.ipynb. A measurement of the machine that ran it, not a test.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from attnbook import grids
from attnbook.machine import cpu_model
from attnbook.provenance import write_csv
from attnid import ballcert

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "scripts/bench_ballcert.py"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-d", type=int, default=8, help="chapters 2-7: layouts up to this width (default 8)")
    parser.add_argument("--out", default="bench/ballcert.csv", help="CSV path under data/ (default bench/ballcert.csv)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    cases = grids.ball_certificate_cases(args.max_d)
    rows = []
    for i, (family, chapter, spec, seed) in enumerate(cases, 1):
        start = time.perf_counter()
        result = ballcert.certify(spec, seed=seed)
        seconds = time.perf_counter() - start
        rows.append((spec.label(), family, chapter, result.total, result.claimed, result.n_inputs, result.rows,
                     int(result.proved), f"{seconds:.2f}"))
        print(f"[{i}/{len(cases)}] {spec.label()}: {seconds:.1f} s", file=sys.stderr, flush=True)
    device = f"cpu ({cpu_model()}, 1 thread)"
    path = write_csv(args.out, ["layout", "family", "chapter", "total", "claimed", "inputs", "rows", "count_proved",
                                "seconds"], rows, notebook=SCRIPT, parameters={"max_d": args.max_d}, device=device,
                     root=ROOT)
    total = sum(float(r[-1]) for r in rows)
    print(f"wrote {path.relative_to(ROOT)}: {len(rows)} layouts, {total:.0f} s in all, "
          f"slowest {max(float(r[-1]) for r in rows):.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
