#!/usr/bin/env python3
"""Benchmark ``attnid inspect`` on the two pinned pretrained models: wall time and peak memory, on CPU.

Each model is inspected in a fresh subprocess, so that its peak resident memory (ru_maxrss) is its own.
The subprocess also reports its resident memory after the imports and before the checkpoint is opened (the
baseline: Python, torch, transformers), so the table can give what inspect itself added. For comparison it
lists the float64 size of the largest attention layer and of the token embeddings, the issue's yardstick
("peak <= 2 x the largest layer + the embeddings"). Writes data/bench/inspect.csv with a provenance sidecar.
A measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

from attnbook.machine import cpu_model
from attnbook.provenance import write_csv

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "scripts/bench_inspect.py"
CHILD = r"""
import json, resource, sys, time
import torch
import transformers, gguf, safetensors  # the imports inspect needs, loaded before the baseline is read
from attnid.hf.inspect import inspect_checkpoint
from attnid.hf.checkpoint import open_checkpoint
from attnid.hf.pretrained import pretrained_path
torch.set_num_threads(int(sys.argv[2]))
path = pretrained_path(sys.argv[1])
baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
report = inspect_checkpoint(path)
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
ck = open_checkpoint(path)
layer = max(sum(t.numel() for t in ck.layer(i).values()) for i in range(ck.n_layers)) * 8
vocab, d = int(ck.config["vocab_size"]), int(ck.config["hidden_size"])
print(json.dumps({"seconds": seconds, "baseline_kib": baseline, "peak_kib": peak, "layer_bytes": layer,
                  "embedding_bytes": vocab * d * 4, "layers": len(report["layers"]),
                  "unidentified_at_point": report["unidentified_at_point"]}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch threads in each run (default 2)")
    parser.add_argument("--out", default="bench/inspect.csv", help="CSV under data/ (default bench/inspect.csv)")
    args = parser.parse_args()
    rows = []
    for model in ("minilm", "smollm2"):
        done = subprocess.run([sys.executable, "-c", CHILD, model, str(args.threads)], check=True, capture_output=True,
                              text=True, cwd=ROOT)
        r = json.loads(done.stdout.strip().splitlines()[-1])
        mib = lambda kib: f"{kib / 1024:.0f}"  # noqa: E731
        rows.append([model, r["layers"], f"{r['seconds']:.1f}", mib(r["baseline_kib"]), mib(r["peak_kib"]),
                     mib(r["peak_kib"] - r["baseline_kib"]), f"{r['layer_bytes'] / 2**20:.1f}",
                     f"{r['embedding_bytes'] / 2**20:.1f}", r["unidentified_at_point"]])
        print(" ".join(map(str, rows[-1])))
    device = f"cpu ({cpu_model()}, {args.threads} threads)"
    header = ["model", "layers", "seconds", "baseline_mib", "peak_mib", "added_mib", "largest_layer_float64_mib",
              "embeddings_float32_mib", "unidentified_at_point"]
    path = write_csv(args.out, header, rows, notebook=SCRIPT, parameters={"threads": args.threads},
                     device=device, root=ROOT)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
