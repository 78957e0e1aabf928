"""Command line: ``attnid count``, ``attnid verify`` and ``attnid census`` (also ``python -m attnid``).

Exit codes: 0 success (for verify: the numeric nullity matches the exact count, or there
is no exact count and the numeric decision is clear), 1 verify found a mismatch or an
unclear rank decision, 2 bad flags or an invalid layout (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, NoReturn

from .counts import Count, count
from .spec import NORMS, AttentionSpec
from .verify import MIN_SEQ_LEN, Verification, default_seq_len, verify


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad command line as one readable line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _add_layout_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--d-model", type=int, required=True, help="model width d")
    p.add_argument("--heads", type=int, required=True, help="query heads H")
    p.add_argument("--kv-heads", type=int, default=None, help="key/value heads G (divides H; default H)")
    p.add_argument("--head-dim", type=int, default=None, help="query/key width d_k per head (default d/H)")
    p.add_argument("--v-head-dim", type=int, default=None, help="value width d_v per head (default d/H)")
    p.add_argument("--bias", default="none", help="'none' or letters from qkvo, e.g. qkvo, qkv, k (default none)")
    p.add_argument("--rope-fraction", type=float, default=0.0, help="share of d_k rotated by RoPE (default 0)")
    p.add_argument("--rope-base", type=float, default=10000.0, help="RoPE base (default 10000)")
    p.add_argument("--causal", action="store_true", help="apply a causal mask")
    p.add_argument("--norm", choices=NORMS, default="softmax", help="score normalisation (default softmax)")
    p.add_argument("--sink", choices=("fixed", "learned"), default="fixed",
                   help="with --norm sink: logit fixed at 0 or learned per head (default fixed)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _seq_len_help() -> str:
    """--seq-len's help, the default worded from the library's own rule (one source of truth)."""
    doc = (default_seq_len.__doc__ or "").strip().splitlines()
    rule = f": {doc[0].rstrip('.')}" if doc and doc[0] else ""
    return (f"tokens per random input, at least {MIN_SEQ_LEN} (default: the library's "
            f"attnid.verify.default_seq_len(layout){rule})").replace("%", "%%")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="attnid", description="Count the parameters an attention layout cannot identify.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_layout_flags(sub.add_parser("count", help="exact counts for a layout"))
    v = sub.add_parser("verify", help="exact counts and the numeric Jacobian nullity")
    _add_layout_flags(v)
    v.add_argument("--seq-len", type=int, default=None, help=_seq_len_help())  # None: verify applies the rule
    v.add_argument("--seed", type=int, default=0, help="seed for the random point and inputs (default 0)")
    v.add_argument("--progress", action="store_true", help="show a progress bar on stderr")
    c = sub.add_parser("census", help="the census table of published layouts (or of a layout file)")
    c.add_argument("--file", default=None, help="a YAML layout file (default: the shipped architectures.yaml)")
    c.add_argument("--model", nargs="+", default=None, help="only these model keys")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def _census_lines(rows: list) -> list[str]:
    header = f"{'model':14s} {'layers':>6s} {'params/layer':>13s} {'unidentified':>12s} {'ratio':>9s} {'plain MHA':>9s}  notes"
    lines = [header]
    for row in rows:
        r = row.record()
        unid = "n/a" if r["unidentified_per_layer"] is None else f"{r['unidentified_per_layer']:,}"
        ratio = "n/a" if r["ratio"] is None else f"{r['ratio']:.5f}"
        notes = "; ".join([f"{k}: {v}" for k, v in r["biases"].items() if v != "identified"]
                          + [u.replace("_", " ") + ("" if u == "sliding_window" else " (not covered)")
                             for u in r["uncovered"]])
        lines.append(f"{r['model']:14s} {r['layers']:6d} {r['parameters_per_layer']:13,} {unid:>12s} {ratio:>9s} "
                     f"{r['plain_mha_ratio']:9.5f}  {notes}")
    return lines


def run_census(args: argparse.Namespace) -> int:
    from .census import SHIPPED, census, load_layouts

    layouts = load_layouts(args.file or SHIPPED)
    if args.model:
        known = {lay.key for lay in layouts}
        unknown = [m for m in args.model if m not in known]
        if unknown:
            raise ValueError(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        layouts = [lay for lay in layouts if lay.key in args.model]
    rows = census(layouts)
    if args.json:
        print(json.dumps({"models": [row.record() for row in rows]}))
    else:
        print("\n".join(_census_lines(rows)))
    return 0


def spec_from_args(args: argparse.Namespace) -> AttentionSpec:
    if args.sink == "learned" and args.norm != "sink":
        raise ValueError("--sink learned needs --norm sink")
    return AttentionSpec.create(
        d_model=args.d_model, heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim,
        v_head_dim=args.v_head_dim, bias=args.bias, rope_fraction=args.rope_fraction, rope_base=args.rope_base,
        causal=args.causal, norm=args.norm, sink_learned=args.sink == "learned",
    )


def count_record(c: Count) -> dict[str, Any]:
    return {"layout": c.spec.to_dict(), "total": c.total, "unidentified": c.unidentified, "ratio": c.ratio,
            "breakdown": c.breakdown, "covered": c.covered, "note": c.note}


def verify_record(v: Verification) -> dict[str, Any]:
    d = v.decision
    return {**count_record(v.count), "numeric_unidentified": d.nullity, "matches": v.matches, "rank": d.rank,
            "clear": d.clear, "smallest_kept": d.smallest_kept, "largest_dropped": d.largest_dropped, "gap": d.gap,
            "jacobian_rows": d.n_rows, "seq_len": v.seq_len, "n_inputs": v.n_inputs, "seed": v.seed}


def _count_lines(c: Count) -> list[str]:
    lines = [f"layout: {c.spec.describe()}", f"parameters: {c.total}"]
    if c.unidentified is None:
        lines.append(f"unidentified: no exact count ({c.note})")
    else:
        lines.append(f"unidentified: {c.unidentified} (ratio {c.ratio:.6g})")
        lines.append("  " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in c.breakdown.items()))
    return lines


def _verify_lines(v: Verification) -> list[str]:
    d = v.decision
    verdict = {True: "yes", False: "NO", None: "no exact count to compare"}[v.matches]
    return _count_lines(v.count) + [
        f"numeric: nullity {d.nullity} (rank {d.rank} of {d.n_params}, {d.n_rows} Jacobian rows from "
        f"{v.n_inputs} inputs of {v.seq_len} tokens, seed {v.seed})",
        f"  smallest kept {d.smallest_kept:.3e}, largest dropped {d.largest_dropped:.3e} (relative), "
        f"decision {'clear' if d.clear else 'NOT clear'}",
        f"matches: {verdict}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "census":
        try:
            return run_census(args)
        except ValueError as exc:
            parser.exit(2, f"attnid census: error: {exc}\n")
    try:
        spec = spec_from_args(args)
        if args.command == "count":
            result: Count | Verification = count(spec)
        else:
            result = verify(spec, seq_len=args.seq_len, seed=args.seed, progress=args.progress)
    except (ValueError, TypeError) as exc:
        parser.exit(2, f"attnid {args.command}: error: {exc}\n")
    if isinstance(result, Count):
        print(json.dumps(count_record(result)) if args.json else "\n".join(_count_lines(result)))
        return 0
    print(json.dumps(verify_record(result)) if args.json else "\n".join(_verify_lines(result)))
    if result.matches is None:
        return 0 if result.decision.clear else 1
    return 0 if result.matches else 1


if __name__ == "__main__":
    sys.exit(main())
