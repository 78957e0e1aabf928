"""What the ``attnid`` command prints: each subcommand's text lines and ``--json`` records (``attnid.schemas``)."""

from __future__ import annotations
import json
from typing import Any
from attnid import families
from attnid.counts import Count
from attnid.layout import VerificationResult


def census_lines(rows: list) -> list[str]:
    header = f"{'model':14s} {'layers':>6s} {'params/layer':>13s} {'unidentified':>12s} {'ratio':>9s} {'plain MHA':>9s}  notes"
    lines = [header]
    for row in rows:
        r = row.record()
        unid = "n/a" if r["unidentified_per_layer"] is None else f"{r['unidentified_per_layer']:,}"
        ratio = "n/a" if r["ratio"] is None else f"{r['ratio']:.5f}"
        extra = ([f"QK-norm {r['qk_norm']}"] if "qk_norm" in r else []) + (
            [f"{'window' if r['window'] else 'chunks'} {r['window'] or r['chunk']} on {r['masked_layers']} of "
             f"{r['layers']} layers"] if "masked_layers" in r else [])
        notes = "; ".join([f"{k}: {v}" for k, v in r["biases"].items() if v != "identified"] + extra
                          + [u.replace("_", " ") + ("" if u == "sliding_window" else " (not covered)")
                             for u in r["uncovered"]])
        lines.append(f"{r['model']:14s} {r['layers']:6d} {r['parameters_per_layer']:13,} {unid:>12s} {ratio:>9s} "
                     f"{r['plain_mha_ratio']:9.5f}  {notes}")
    return lines


def count_record(c: Count) -> dict[str, Any]:
    return {"layout": c.spec.to_dict(), "total": c.total, "unidentified": c.unidentified, "ratio": c.ratio,
            "breakdown": c.breakdown, "covered": c.covered, "note": c.note,
            "weakly_identified": c.weakly_identified}


def count_of(v: VerificationResult) -> Count:
    """The exact count of the layout the check ran on (for the relative-bias family: at the check's length)."""
    return families.count(v.spec)


def verify_record(v: VerificationResult, seed: int) -> dict[str, Any]:
    d = v.decision
    return {**count_record(count_of(v)), "numeric_unidentified": d.nullity, "matches": v.matches,
            "rank": d.rank, "clear": d.clear, "smallest_kept": d.smallest_kept, "largest_dropped": d.largest_dropped,
            "gap": d.gap, "jacobian_rows": d.n_rows, "seq_len": v.seq_len, "n_inputs": v.n_inputs, "seed": seed,
            "method": d.method}


def count_lines(c: Count) -> list[str]:
    lines = [f"layout: {c.spec.describe()}", f"parameters: {c.total}"]
    if c.unidentified is None:
        lines.append(f"unidentified: no exact count ({c.note})")
    else:
        lines.append(f"unidentified: {c.unidentified} (ratio {c.ratio:.6g})")
        lines.append("  " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in c.breakdown.items()))
        if c.note:
            lines.append(f"  {c.note}")
    if c.weakly_identified:
        lines.append(f"weakly identified: {c.weakly_identified} (each head's query and key scale, seen only through "
                     f"the QK-norm's eps = {c.spec.qk_norm_eps:g}; unidentified with eps = 0)")
    return lines


def config_lines(m: Any) -> list[str]:
    """The text report of ``attnid count --config``."""
    kinds = ", ".join(f"{g.layers} {g.kind}" for g in m.groups)
    lines = [f"config: {m.source} (model_type {m.model_type})", f"layers: {m.layers} ({kinds})"]
    for g in m.groups:
        lines.append(f"{g.kind} x{g.layers}: {g.description}")
        if not g.attention:
            shown = "" if g.parameters is None else f" ({g.parameters:,} parameters per layer)"
            lines.append(f"  not counted{shown}: {g.note}")
            continue
        lines.append(f"  per layer: parameters {g.total:,}, unidentified "
                     + ("n/a" if g.unidentified is None else f"{g.unidentified:,} (ratio {g.ratio:.6g})"))
        if g.breakdown:
            lines.append("    " + ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in g.breakdown.items()))
        if g.weakly_identified:
            lines.append(f"    weakly identified {g.weakly_identified:,} (directions the function sees only through the norms' eps: scales of the vectors a norm divides)")
        if g.note:
            lines.append(f"    {g.note}")
    counted = sum(g.layers for g in m.counted)
    if not m.counted:
        whole = "n/a (no layer of a type this tool counts)"
    elif m.unidentified is None:
        whole = "n/a (a layer type has no exact count)"
    else:
        whole = f"{m.unidentified:,} (ratio {m.ratio:.6g})"
    lines.append(f"all {counted} attention layers (attention only; --whole-model counts the rest): parameters "
                 f"{m.total:,}, unidentified {whole}")
    if m.weakly_identified:
        lines.append(f"  weakly identified {m.weakly_identified:,}")
    for i in m.ignored:
        lines.append(f"ignored: {i.field} = {json.dumps(i.value)[:80]}: {i.why}")
    for i in m.defaults:
        lines.append(f"default: {i.field} = {json.dumps(i.value)[:80]}: {i.why}")
    return lines


def whole_lines(whole: dict[str, dict[str, Any]]) -> list[str]:
    """The text report of ``--whole-model``: the model ``architectures[0]`` builds, and its base model."""
    lines = []
    for key, label in (("whole_model", "whole model"), ("base", "base model")):
        r = whole[key]
        name = f" ({r['architecture']})" if key == "whole_model" and r["architecture"] else ""
        if r["unidentified"] is None:
            lines.append(f"{label}{name}: withheld: {r['note']}")
            continue
        lines.append(f"{label}{name}: parameters {r['parameters']:,}, unidentified {r['unidentified']:,} "
                     f"(ratio {r['ratio']:.6g})")
        lines.append("  " + ", ".join(f"{k} {v:,}" for k, v in r["breakdown"].items()))
    return lines


def verify_lines(v: VerificationResult, seed: int) -> list[str]:
    d = v.decision
    verdict = {True: "yes", False: "NO", None: "no exact count to compare"}[v.matches]
    c = count_of(v)
    lines = count_lines(c) + [
        f"numeric: nullity {d.nullity} (rank {d.rank} of {d.n_params}, {d.n_rows} Jacobian rows from "
        f"{v.n_inputs} inputs of {v.seq_len} tokens, seed {seed})",
        f"  smallest kept {d.smallest_kept:.3e}, largest dropped {d.largest_dropped:.3e} (relative), "
        f"decision {'clear' if d.clear else 'NOT clear'}",
        f"matches: {verdict}",
    ]
    if v.matches is False and c.weakly_identified and d.nullity == c.unidentified + c.weakly_identified:
        lines.append(f"  the {c.weakly_identified} weakly identified directions (query/key scales, seen only through "
                     f"eps = {c.spec.qk_norm_eps:g}) fall below the rank rule's zero tolerance: at this eps the "
                     "numeric check sees the eps = 0 count; a larger eps separates them")
    return lines
