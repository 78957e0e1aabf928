"""Command line: ``attnid count``, ``verify``, ``census``, ``inspect`` and ``rebalance`` (also ``python -m attnid``).

``attnid inspect PATH`` and ``attnid rebalance IN OUT`` read trained checkpoints (``attnid.hf.commands``).

``attnid count --config PATH`` counts a whole model from its Hugging Face config.json (a file or
a folder holding one, read offline; ``attnid.hf.config``): per layer type and for all layers.

Exit codes:

* 0: success (for verify: the numeric nullity matches the exact count, or there is no exact
  count and the numeric decision is clear); also when the reader of the output stopped early
  (``attnid census | head -1``: the closed pipe ends the command quietly).
* 1: verify found a mismatch or an unclear rank decision.
* 2: bad flags or an invalid layout, or verify refused a layout whose estimated peak memory
  (``attnid.families.estimate``) exceeds ``--max-memory``; one line on stderr.
* 3: verify ran out of memory all the same (the allocator failed); one line on stderr.

Every numeric flag is checked against stated bounds before any work (see ``--help``):
widths and head counts 1 to 1,000,000, ``--seq-len`` 2 to 4096, ``--seed`` 0 to 2**63 - 1,
``--rope-fraction`` in [0, 1], ``--rope-base`` in [1 + 1e-6, 1e12], ``--qk-norm-eps`` in [0, 1],
``--window`` and ``--chunk`` 1 to 2**31 - 1, ``--max-memory`` positive.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import torch

from attnid import families
from attnid.hf import commands
from attnid.families.alibi import AlibiSpec
from attnid.fields import FIELDS, MAX_WIDTH
from attnid.fields import MAX_NORM_EPS as MAX_QK_NORM_EPS
from attnid.families.gated import GATES, GatedSpec
from attnid.layout import Layout, VerificationResult
from attnid.families.relbias import MAX_BUCKETS, T5_MAX_DISTANCE, RelativeBiasSpec
from attnid.runtime import MAX_SEED
from attnid.spec import DEFAULT_QK_NORM_EPS, NORMS, QK_NORMS, AttentionSpec
from attnid.budget import METHODS, MIN_SEQ_LEN, Estimate, MemoryLimitExceeded, default_seq_len, format_bytes
from attnid.report import census_lines, config_lines, whole_lines, count_lines, count_record, verify_lines, verify_record

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE, EXIT_OUT_OF_MEMORY = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as a shell reports it
# Tokens per input: the rank needs P rows in all, and more inputs deliver them more cheaply than
# longer ones (an input of n tokens costs H n^2 scores per batched tangent); 4096 is far above the
# default rule's 32 and already costs a one-head layout gigabytes (d_model 4: 8 GiB in forward mode).
MAX_SEQ_LEN = 4096
# --max-memory's default: this share of the machine's memory (physical RAM or the cgroup limit).
MEMORY_SHARE = 0.5
_SIZE_UNITS = {"": 2**30, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "p": 2**50}
_SIZE = re.compile(r"^\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)\s*([kmgtp]?)(i?b)?\s*$", re.IGNORECASE)

EPILOG = f"""exit codes:
  {EXIT_OK}  success (verify: the numeric nullity matches the exact count, or no exact count and a clear
     decision); also when the reader of the output stops early (e.g. | head -1)
  {EXIT_MISMATCH}  verify: mismatch or unclear rank decision
  {EXIT_USAGE}  bad flags or layout, or verify refused: estimated peak memory above --max-memory; or the
     output could not be written (standard output closed or full)
  {EXIT_OUT_OF_MEMORY}  verify ran out of memory all the same
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C)
bounds: --d-model, --heads, --kv-heads, --head-dim, --v-head-dim 1 to {MAX_WIDTH:,};
  --seq-len {MIN_SEQ_LEN} to {MAX_SEQ_LEN}; --seed 0 to 2**63 - 1; --rope-fraction 0 to 1;
  --rope-base {FIELDS["rope_base"].rule.removeprefix("a number ")}; --qk-norm-eps 0 to {MAX_QK_NORM_EPS:g};
  --window and --chunk 1 to 2**31 - 1; --max-memory above 0"""


def _shown(text: str) -> str:
    """A flag value for an error message: quoted, and cut short if it is long."""
    return repr(text) if len(text) <= 40 else repr(text[:37] + "...")


def _bounded(convert: Callable[[str], Any], kind: str, low: Any, high: Any, valid: str) -> Callable[[str], Any]:
    """argparse type: ``convert(text)`` in [low, high], else one line naming the value and the range."""

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {kind} {_shown(text)}: {valid}") from None
        if not low <= value <= high:  # NaN and the infinities fail too
            raise argparse.ArgumentTypeError(f"{_shown(text)} is out of range: {valid}")
        return value

    return parse


def bounded_int(low: int, high: int, high_text: str | None = None) -> Callable[[str], int]:
    """argparse type: an integer in [low, high]."""
    return _bounded(int, "int value", low, high, f"give a whole number from {low:,} to {high_text or f'{high:,}'}")


def schema_type(name: str) -> Callable[[str], Any]:
    """argparse type for a layout field: the text read as a number, then checked by the field schema (attnid.fields)."""
    field = FIELDS[name]

    def parse(text: str) -> Any:
        try:
            value: Any = int(text) if field.kind == "int" else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(field.message(text, _shown)) from None
        try:
            return field.check(value)
        except (TypeError, ValueError) as exc:
            raise argparse.ArgumentTypeError(field.message(text, _shown)) from exc

    return parse


def parse_size(text: str) -> int:
    """argparse type for --max-memory: '8G', '512M', '1.5TiB', '4096K'... (binary units; a bare number is GiB)."""
    match = _SIZE.match(text)
    valid = "give a positive size such as 8G, 512M or 1.5T (binary units; a bare number means GiB)"
    if not match:
        raise argparse.ArgumentTypeError(f"invalid size {_shown(text)}: {valid}")
    number, unit = float(match.group(1)), match.group(2).lower()
    if not unit and match.group(3) and match.group(3).lower() == "b":
        unit = "b"  # '100B': bytes
    size = number * _SIZE_UNITS[unit]
    if not (math.isfinite(size) and size >= 1):
        raise argparse.ArgumentTypeError(f"{_shown(text)} is out of range: {valid}")
    return int(size)


def machine_memory() -> int | None:
    """Bytes of memory this process may use: physical RAM, or a lower cgroup limit; None if unknown."""
    limits = []
    try:
        limits.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            limits.append(int(text))  # cgroup v1 writes a huge number for "no limit": min() ignores it
    limits = [n for n in limits if n > 0]
    return min(limits) if limits else None


FALLBACK_MAX_MEMORY = 4 * 2**30  # --max-memory's default where the machine's memory cannot be read


def default_max_memory() -> int:
    """--max-memory's default: MEMORY_SHARE of ``machine_memory()``, or 4 GiB when that is unknown."""
    total = machine_memory()
    return FALLBACK_MAX_MEMORY if total is None else int(total * MEMORY_SHARE)


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad command line as one readable line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _add_layout_flags(p: argparse.ArgumentParser, config: bool = False) -> None:
    """The layout flags; with ``config`` also --config, and --d-model and --heads are then checked in _main."""
    if config:
        p.add_argument("--config", default=None, metavar="PATH",
                       help="count a whole model from its Hugging Face config.json (a file, or a folder holding one; "
                            "read offline) instead of the layout flags")
        p.add_argument("--whole-model", action="store_true",
                       help="with --config: also count the whole model (embeddings, attention, MLPs, norms, residual "
                            "stream, head), for the model architectures[0] builds and for its base model")
    p.add_argument("--d-model", type=schema_type("d_model"), required=not config, help=f"model width d (1 to {MAX_WIDTH:,})")
    p.add_argument("--heads", type=schema_type("heads"), required=not config, help=f"query heads H (1 to {MAX_WIDTH:,})")
    p.add_argument("--kv-heads", type=schema_type("kv_heads"), default=None, help="key/value heads G (divides H; default H)")
    p.add_argument("--head-dim", type=schema_type("head_dim"), default=None, help="query/key width d_k per head (default d/H)")
    p.add_argument("--v-head-dim", type=schema_type("v_head_dim"), default=None, help="value width d_v per head (default d/H)")
    p.add_argument("--bias", default="none", help="'none' or letters from qkvo, e.g. qkvo, qkv, k (default none)")
    p.add_argument("--rope-fraction", type=schema_type("rope_fraction"), default=0.0,
                   help="share of d_k rotated by RoPE, 0 to 1 (default 0)")
    p.add_argument("--rope-base", type=schema_type("rope_base"), default=10000.0,
                   help=f"RoPE base, {FIELDS['rope_base'].rule.removeprefix('a number ')} (default 10000)")
    p.add_argument("--causal", action="store_true", help="apply a causal mask")
    p.add_argument("--norm", choices=NORMS, default="softmax", help="score normalisation (default softmax)")
    p.add_argument("--sink", choices=("fixed", "learned"), default="fixed",
                   help="with --norm sink: logit fixed at 0 or learned per head (default fixed)")
    p.add_argument("--qk-norm", choices=QK_NORMS, default="none",
                   help="RMSNorm with a learned weight on queries and keys, before RoPE: over each head's d_k entries "
                        "with one weight for all heads (shared: Qwen3, Gemma 3) or one per head (per-head), or over the "
                        "whole projection width (full: OLMo-2), or per head without a weight (unweighted: Llama 4); "
                        "default none")
    p.add_argument("--qk-norm-eps", type=schema_type("qk_norm_eps"),
                   default=DEFAULT_QK_NORM_EPS,
                   help=f"the QK-norm's epsilon, 0 to {MAX_QK_NORM_EPS:g} (default {DEFAULT_QK_NORM_EPS:g}, Qwen3's "
                        "rms_norm_eps; with 0 each head's query and key scale is unidentified)")
    p.add_argument("--window", type=schema_type("window"), default=None,
                   help="causal sliding window of W keys: query i sees keys i - W < j <= i (needs --causal)")
    p.add_argument("--chunk", type=schema_type("chunk"), default=None,
                   help="chunked causal attention, chunks of C tokens: query i sees keys j <= i of its own chunk "
                        "(needs --causal; Llama 4)")
    p.add_argument("--output-gate", choices=("none", *GATES), default="none",
                   help="multiply each head's output by a sigmoid gate of its own token: one per value coordinate "
                        "(elementwise: Qwen3-Next) or one per head (headwise); default none")
    p.add_argument("--gate-bias", action="store_true", help="with --output-gate: the gate has a bias")
    p.add_argument("--alibi", action="store_true",
                   help="add ALiBi's fixed linear position penalties to the scores (BLOOM, MPT; no RoPE): chapter 7b")
    p.add_argument("--relative-bias", type=bounded_int(2, MAX_BUCKETS), default=None, metavar="BUCKETS",
                   help="add a learned relative position bias with BUCKETS buckets per head (T5: 32; no RoPE), "
                        "bidirectional without --causal; count gives the count at inputs long enough to reach every "
                        "bucket, verify the one at --seq-len: chapter 7b")
    p.add_argument("--max-distance", type=bounded_int(1, MAX_BUCKETS), default=None, metavar="M",
                   help=f"with --relative-bias: distances from M on share the last bucket (default {T5_MAX_DISTANCE}, T5's)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _seq_len_help() -> str:
    """--seq-len's help, the default worded from the library's own rule (one source of truth)."""
    doc = (default_seq_len.__doc__ or "").strip().splitlines()
    rule = f": {doc[0].rstrip('.')}" if doc and doc[0] else ""
    return (f"tokens per random input, {MIN_SEQ_LEN} to {MAX_SEQ_LEN} (default: the library's "
            f"attnid.verification.default_seq_len(layout){rule})").replace("%", "%%")


def _max_memory_help() -> str:
    total = machine_memory()
    here = (f"half of {format_bytes(total)}, so {format_bytes(default_max_memory())}" if total is not None
            else f"unknown, so {format_bytes(FALLBACK_MAX_MEMORY)}")
    return (f"refuse (exit {EXIT_USAGE}) a layout whose estimated peak memory (attnid.families.estimate) "
            "exceeds SIZE, e.g. 8G, 512M, 1.5T (binary units; a bare number means GiB); default: "
            f"{MEMORY_SHARE:.0%} of this machine's memory, the physical RAM or a lower cgroup limit "
            f"(here {here})").replace("%", "%%")


def build_parser() -> argparse.ArgumentParser:
    common: dict[str, Any] = {"epilog": EPILOG, "formatter_class": argparse.RawDescriptionHelpFormatter}
    parser = _Parser(prog="attnid", description="Count the parameters an attention layout cannot identify.",
                     **common)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_layout_flags(sub.add_parser("count", help="exact counts for a layout, or a model's config.json", **common),
                      config=True)
    v = sub.add_parser("verify", help="exact counts and the numeric Jacobian nullity", **common)
    _add_layout_flags(v)
    v.add_argument("--seq-len", type=bounded_int(MIN_SEQ_LEN, MAX_SEQ_LEN), default=None,
                   help=_seq_len_help())  # None: verify applies the rule
    v.add_argument("--seed", type=bounded_int(0, MAX_SEED, "2**63 - 1"), default=0,
                   help="seed for the random point and inputs, 0 to 2**63 - 1 (default 0)")
    v.add_argument("--max-memory", type=parse_size, default=None, metavar="SIZE", help=_max_memory_help())
    v.add_argument("--method", choices=METHODS, default="auto",
                   help="auto: the structured certificate first (softmax layouts without a QK-norm), then the dense "
                        "one, then the SVD; dense: the certificate from the Jacobian itself, with verified rounding "
                        "bounds, then the SVD; svd: the full spectrum only (default auto)")
    v.add_argument("--progress", action="store_true", help="show the memory estimate and the progress on stderr")
    c = sub.add_parser("census", help="the census table of published layouts (or of a layout file)", **common)
    c.add_argument("--file", default=None, help="a YAML layout file (default: the shipped architectures.yaml)")
    c.add_argument("--model", nargs="+", default=None, help="only these model keys")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    commands.add_parsers(sub, common, bounded_int)
    return parser


def run_census(args: argparse.Namespace) -> int:
    from attnid.census import SHIPPED, census, load_layouts

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
        print("\n".join(census_lines(rows)))
    return 0


def spec_from_args(args: argparse.Namespace) -> Layout:
    """The layout the flags describe: an AttentionSpec, wrapped by --output-gate, --alibi or --relative-bias."""
    if args.gate_bias and args.output_gate == "none":
        raise ValueError("--gate-bias needs --output-gate elementwise or headwise")
    if args.max_distance is not None and args.relative_bias is None:
        raise ValueError("--max-distance needs --relative-bias")
    wrappers = [f for f, on in (("--output-gate", args.output_gate != "none"), ("--alibi", args.alibi),
                                ("--relative-bias", args.relative_bias is not None)) if on]
    if len(wrappers) > 1:
        raise ValueError(f"give at most one of {', '.join(wrappers)} (no layout here combines them)")
    base = _base_spec(args)
    if args.alibi:
        return AlibiSpec(base)
    if args.relative_bias is not None:
        distance = T5_MAX_DISTANCE if args.max_distance is None else args.max_distance
        return RelativeBiasSpec(base, args.relative_bias, distance, getattr(args, "seq_len", None))
    return base if args.output_gate == "none" else GatedSpec(base, args.output_gate, args.gate_bias)


def _base_spec(args: argparse.Namespace) -> AttentionSpec:
    if args.sink == "learned" and args.norm != "sink":
        raise ValueError("--sink learned needs --norm sink")
    if args.window is not None and not args.causal:
        raise ValueError("--window needs --causal (a sliding window of W keys: query i sees keys i - W < j <= i)")
    if args.chunk is not None and not args.causal:
        raise ValueError("--chunk needs --causal (query i sees keys j <= i of its own chunk)")
    return AttentionSpec.create(
        d_model=args.d_model, heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim,
        v_head_dim=args.v_head_dim, bias=args.bias, rope_fraction=args.rope_fraction, rope_base=args.rope_base,
        causal=args.causal, norm=args.norm, sink_learned=args.sink == "learned", qk_norm=args.qk_norm,
        qk_norm_eps=args.qk_norm_eps, window=args.window, chunk=args.chunk,
    )


def run_config_count(args: argparse.Namespace) -> int:
    from attnid.hf.config import model_count

    from attnid.hf.config import count_config, read_config

    if not args.whole_model:
        result = model_count(args.config)
        print(json.dumps(result.record()) if args.json else "\n".join(config_lines(result)))
        return EXIT_OK
    from attnid.hf.whole import whole_model

    data, where = read_config(args.config)
    result = count_config(data, where)
    whole = whole_model(data, where)
    print(json.dumps({**result.record(), **whole}) if args.json else "\n".join(config_lines(result) + whole_lines(whole)))
    return EXIT_OK


def _is_out_of_memory(exc: BaseException) -> bool:
    """Whether an exception is an allocation failure: MemoryError, torch's OutOfMemoryError, or its CPU allocator's."""
    if isinstance(exc, MemoryError):
        return True
    oom = getattr(torch, "OutOfMemoryError", None)
    if oom is not None and isinstance(exc, oom):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text.lower() or "DefaultCPUAllocator" in text)


def _one_line(exc: BaseException, limit: int = 200) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _estimate(spec: Layout, args: argparse.Namespace) -> Estimate:
    """The peak-memory estimate of verify for a layout of any family (its family's ``estimate``)."""
    return families.estimate(spec, seq_len=args.seq_len, method=args.method)


def _run(spec: Layout, args: argparse.Namespace, limit: int) -> VerificationResult:
    """The one verify route of every family; the limit is checked again before each route it takes."""
    return families.verify(spec, seq_len=args.seq_len, seed=args.seed, method=args.method, progress=args.progress,
                           max_bytes=limit)


def run_verify(parser: argparse.ArgumentParser, args: argparse.Namespace, spec: Layout) -> int:
    """Refuse a layout whose estimated peak memory exceeds --max-memory, else verify it (exit 3 if memory runs out)."""
    limit = default_max_memory() if args.max_memory is None else args.max_memory
    try:
        estimate = _estimate(spec, args)
    except (ValueError, TypeError) as exc:  # the layout and --seq-len together (e.g. RoPE, causal, 2 tokens)
        parser.exit(EXIT_USAGE, f"attnid verify: error: {_one_line(exc)}\n")
    if estimate.bytes > limit:
        parser.exit(EXIT_USAGE, (
            f"attnid verify: error: this layout needs about {estimate.human()} of memory (estimated peak: "
            f"{estimate.n_params:,} parameters, {estimate.n_inputs} inputs of {estimate.seq_len} tokens), above "
            f"--max-memory {format_bytes(limit)}; use `attnid count` with the same layout flags for the exact count, "
            "or verify a smaller layout (--d-model, --heads, --head-dim, --seq-len)\n"))
    if args.progress:  # the estimate, before anything is allocated
        print(f"attnid verify: estimated peak memory {estimate.human()} (--method {args.method}, "
              f"{estimate.n_params:,} parameters), --max-memory {format_bytes(limit)}", file=sys.stderr, flush=True)
    try:
        result = _run(spec, args, limit)
    except MemoryLimitExceeded as exc:  # the structured route gave up, and the dense route would need more
        parser.exit(EXIT_USAGE, (
            f"attnid verify: error: the structured route could not decide this layout, and the {exc.route} route's "
            f"estimated peak of {exc.estimate.human()} is above --max-memory {format_bytes(limit)}; use `attnid count` "
            "for the exact count, or verify a smaller layout\n"))
    except (MemoryError, RuntimeError) as exc:
        if not _is_out_of_memory(exc):
            raise
        parser.exit(EXIT_OUT_OF_MEMORY, (
            f"attnid verify: error: ran out of memory (estimated peak {estimate.human()}, --max-memory "
            f"{format_bytes(limit)}): {_one_line(exc)}; use `attnid count` for the exact count, a smaller layout, "
            "or a --max-memory below what is really free\n"))
    print(json.dumps(verify_record(result, args.seed)) if args.json else "\n".join(verify_lines(result, args.seed)))
    if result.matches is None:
        return EXIT_OK if result.decision.clear else EXIT_MISMATCH
    return EXIT_OK if result.matches else EXIT_MISMATCH


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command in ("inspect", "rebalance"):
        return commands.run(args)
    if args.command == "census":
        try:
            return run_census(args)
        except ValueError as exc:
            parser.exit(EXIT_USAGE, f"attnid census: error: {exc}\n")
    if args.command == "count" and args.config is not None:
        defaults = vars(parser.parse_args(["count", "--config", args.config]))
        given = [f for f, v in vars(args).items() if f not in ("config", "json", "whole_model") and v != defaults[f]]
        if given:
            parser.exit(EXIT_USAGE, f"attnid count: error: --config reads the layout from the file; do not give "
                                    f"{', '.join('--' + f.replace('_', '-') for f in given)} with it\n")
        try:
            return run_config_count(args)
        except ValueError as exc:
            parser.exit(EXIT_USAGE, f"attnid count: error: {_one_line(exc, 2000)}\n")
    if args.command == "count" and args.whole_model and args.config is None:
        parser.exit(EXIT_USAGE, "attnid count: error: --whole-model needs --config (a model's config.json)\n")
    if args.command == "count" and (args.d_model is None or args.heads is None):
        missing = [f for f, v in (("--d-model", args.d_model), ("--heads", args.heads)) if v is None]
        parser.exit(EXIT_USAGE, f"attnid count: error: the following arguments are required: {', '.join(missing)}\n")
    try:
        spec = spec_from_args(args)
    except (ValueError, TypeError) as exc:
        parser.exit(EXIT_USAGE, f"attnid {args.command}: error: {exc}\n")
    if args.command == "verify":
        return run_verify(parser, args, spec)
    result = families.count(spec)
    print(json.dumps(count_record(result)) if args.json else "\n".join(count_lines(result)))
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """The attnid command; returns the exit code (module docstring).

    A reader that closes the pipe early ends it quietly (exit 0); an output that cannot be written
    (stdout closed, a full disk) ends it with one line on stderr (exit 2); Ctrl-C with one line (exit 130).
    """
    if sys.stdout is None:  # started with stdout closed (>&-): nowhere to write the result
        _say("attnid: error: standard output is closed; nowhere to write the result")
        return EXIT_USAGE
    try:
        try:
            return _main(argv)
        finally:
            sys.stdout.flush()  # inside the try: a closed pipe surfaces here, not as a traceback at exit
    except KeyboardInterrupt:
        _say("attnid: interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # As the Python documentation recommends for SIGPIPE: point stdout at devnull so the interpreter's
        # own flush at exit finds nothing to complain about, and stop. The reader has what it asked for.
        _quiet_stdout()
        return EXIT_OK
    except OSError as exc:  # e.g. ENOSPC writing to /dev/full: the result was not written
        _quiet_stdout()
        _say(f"attnid: error: cannot write the output ({exc.strerror or exc})")
        return EXIT_USAGE


def _say(line: str) -> None:
    """One line on stderr, if there is a stderr to write to."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError, AttributeError):
        pass


def _quiet_stdout() -> None:
    """Point stdout at devnull, so that the interpreter's flush at exit has nothing left to fail on."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


if __name__ == "__main__":
    sys.exit(main())
