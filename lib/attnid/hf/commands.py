"""The checkpoint subcommands of ``attnid``: ``inspect PATH`` and ``rebalance IN OUT`` (``attnid.cli`` wires them).

Both work offline on a Hugging Face folder (config.json and safetensors, sharded or not); ``inspect`` also
reads a GGUF file. A missing, truncated, corrupt or unsupported checkpoint gets one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from attnid.runtime import MAX_SEED

EXIT_OK, EXIT_USAGE = 0, 2
MAX_DENSE_LIMIT = 100_000


def add_parsers(sub: Any, common: dict[str, Any], bounded_int: Any) -> None:
    """The ``inspect`` and ``rebalance`` subparsers."""
    i = sub.add_parser("inspect", help="a trained checkpoint: counts at its own weights, dead parameters, per-head "
                                       "verdicts, balance", **common)
    i.add_argument("path", help="a Hugging Face model folder (config.json + safetensors) or a .gguf file")
    i.add_argument("--json", action="store_true", help="print one JSON object")
    i.add_argument("--seed", type=bounded_int(0, MAX_SEED, "2**63 - 1"), default=0,
                   help="seed of the Gaussian inputs of the dense route and the dead-parameter check (default 0)")
    i.add_argument("--dense-limit", type=bounded_int(0, MAX_DENSE_LIMIT), default=None,
                   help="layers with at most this many parameters take the dense float64 Jacobian (default 4096)")
    i.add_argument("--progress", action="store_true", help="a progress bar on stderr (default: on a terminal)")
    r = sub.add_parser("rebalance", help="write the same function at the balanced point of its orbit", **common)
    r.add_argument("source", metavar="IN", help="a Hugging Face model folder (config.json + safetensors) or a GGUF file")
    r.add_argument("out", metavar="OUT", help="the new folder, or for a GGUF IN the new .gguf file; must not exist")
    r.add_argument("--to", choices=("balanced",), default="balanced",
                   help="the representative: balanced (dead parameters zeroed, each group at its least-norm point)")
    r.add_argument("--json", action="store_true", help="print the check's figures as one JSON object")
    r.add_argument("--progress", action="store_true", help="a progress bar on stderr (default: on a terminal)")


def run(args: argparse.Namespace) -> int:
    """Run ``inspect`` or ``rebalance``; a CheckpointError (or a bad file) is one line and exit 2."""
    from attnid.hf.atpoint import DENSE_LIMIT
    from attnid.hf.checkpoint import CheckpointError

    progress = args.progress or sys.stderr.isatty()
    try:
        if args.command == "inspect":
            from attnid.hf.inspect import inspect_checkpoint, inspect_lines

            limit = DENSE_LIMIT if args.dense_limit is None else args.dense_limit
            report = inspect_checkpoint(args.path, seed=args.seed, dense_limit=limit, progress=progress)
            print(json.dumps(report) if args.json else "\n".join(inspect_lines(report)))
            return EXIT_OK
        from attnid.hf.rebalance import rebalance

        figures = rebalance(args.source, args.out, to=args.to, progress=progress)
    except (CheckpointError, OSError) as exc:
        message = str(exc) if isinstance(exc, CheckpointError) else f"{exc.filename or ''}: {exc.strerror or exc}"
        print(f"attnid {args.command}: error: {' '.join(message.split())[:2000]}", file=sys.stderr)
        return EXIT_USAGE
    record = {"out": args.out, **figures}
    if args.json:
        print(json.dumps(record))
    else:
        print(f"wrote {args.out}: the balanced representative; on {figures['tokens']} tokens it differs from IN by "
              f"{figures['float32_difference']:.2e} in float32 and {figures['float64_difference']:.2e} in float64 "
              f"(relative), within {figures['tolerance']:.2e} ({figures['own_float32_roundoff']:.2e} is IN's own "
              "float32 round-off)")
        for layer, note in figures["layers_not_balanced"].items():
            print(f"layer {layer}: {note}")
    return EXIT_OK
