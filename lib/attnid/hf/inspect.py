"""``attnid inspect``: a trained checkpoint's attention, layer by layer, at its own weights.

For every attention layer: the generic count (the layout's theorem), the count at the checkpoint's point
(``attnid.hf.atpoint``: the dense Jacobian on small layers, the at-point theorem's conditions on large
ones), the dead parameters and what removing them changes, a verdict per head with its margin, and the
balance figures. Layers are read one at a time (``attnid.hf.checkpoint``).

For the whole model (chapter 13): the closed form at a generic point (``attnid.hf.whole``), and, for a
safetensors checkpoint of at most ``WHOLE_DENSE_LIMIT`` parameters, the nullity of the float64 Jacobian of
its output at the checkpoint's own weights and eps (``attnid.hf.whole_jacobian``); a larger one is not
decided at its point, and the report says so.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from attnid.hf.atpoint import DENSE_LIMIT, analyse
from attnid.hf.checkpoint import open_checkpoint


WHOLE_DENSE_LIMIT = 2_000  # parameters: the whole model's dense Jacobian (an SVD of about 1.5 P x P) takes seconds up to here


def whole_at_point(checkpoint: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the whole model's generic record, its count at the checkpoint's weights with the decision's note)."""
    from attnid.hf.whole import whole_model
    from attnid.hf.whole_jacobian import measure

    config = dict(checkpoint.config)
    if checkpoint.format == "gguf" and not config.get("architectures"):
        config["architectures"] = [_causal_lm(config["model_type"])]  # what transformers builds from a GGUF file
    records = whole_model(config, str(checkpoint.path))
    generic = records["whole_model"]
    if generic["unidentified"] is None and records["base"]["unidentified"] is not None:
        generic = {**records["base"], "note": f"{generic['note']}; counted for the base model (last hidden state)"}
    at_point: dict[str, Any] = {"unidentified": None, "clear": None, "note": ""}
    if generic["unidentified"] is None:
        at_point["note"] = "withheld at a generic point, so not measured at this one"
    elif checkpoint.format != "safetensors" or generic["parameters"] > WHOLE_DENSE_LIMIT:
        at_point["note"] = (f"not decided: the dense Jacobian is for safetensors checkpoints of at most "
                            f"{WHOLE_DENSE_LIMIT:,} parameters ({generic['parameters']:,} here)")
    else:
        head = generic["architecture"] not in (None, "base model") and not generic["architecture"].endswith("Model")
        try:
            measured = measure(config, head=head, state=checkpoint.all_tensors())
        except ValueError as exc:
            at_point["note"] = f"not decided: {exc}"
        else:
            at_point.update(unidentified=measured.nullity, clear=measured.decision.clear)
    return generic, at_point


def _causal_lm(model_type: str) -> str:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type, f"{model_type} (no causal-LM class)")


def _total(values: list[int | None]) -> int | None:
    return None if any(v is None for v in values) else sum(values)  # type: ignore[arg-type]


def inspect_checkpoint(path: Path | str, *, seed: int = 0, dense_limit: int = DENSE_LIMIT,
                       progress: bool = False) -> dict[str, Any]:
    """The report of ``attnid inspect PATH`` as a JSON-ready dict (``attnid.schemas`` has its schema)."""
    checkpoint = open_checkpoint(path)
    layers = []
    for i in tqdm(range(checkpoint.n_layers), desc="inspect: layers", unit="layer", disable=not progress,
                  file=sys.stderr, leave=False):
        record = analyse(checkpoint.layer(i), checkpoint.specs[i], seed=seed, dense_limit=dense_limit)
        layers.append({"layer": i, **record})
    dead: dict[str, int] = {}
    for layer in layers:
        for name, n in layer["dead_parameters"].items():
            dead[name] = dead.get(name, 0) + n
    verdicts: dict[str, int] = {}
    for layer in layers:
        for head in layer["heads"]:
            verdicts[head["verdict"]] = verdicts.get(head["verdict"], 0) + 1
    whole, whole_point = whole_at_point(checkpoint)
    return {"checkpoint": str(path), "format": checkpoint.format, "model_type": checkpoint.config["model_type"],
            "whole_model": whole, "whole_model_at_point": whole_point,
            "parameters": sum(layer["parameters"] for layer in layers),
            "unidentified_generic": _total([layer["unidentified_generic"] for layer in layers]),
            "unidentified_at_point": _total([layer["unidentified_at_point"] for layer in layers]),
            "dead_parameters": dead, "head_verdicts": verdicts, "seed": seed, "layers": layers}


def _shown(value: int | None) -> str:
    return "undecided" if value is None else f"{value:,}"


def inspect_lines(report: dict[str, Any]) -> list[str]:
    """The report as text: a line per layer, then every head that is not generic, then the totals."""
    lines = [f"{report['checkpoint']} ({report['format']}, {report['model_type']}): {len(report['layers'])} attention "
             f"layers, {report['parameters']:,} attention parameters",
             f"{'layer':>5} {'params':>10} {'generic':>9} {'at point':>9} {'route':>10}  dead (change / bound)   "
             "Q/K, V/O norm ratio (range)"]
    for layer in report["layers"]:
        dead = ", ".join(f"{k} {n} ({layer['dead_effect'][k]['change']:.1e} / {layer['dead_effect'][k]['bound']:.1e})"
                         for k, n in layer["dead_parameters"].items()) or "none"
        qk, vo = layer["query_key_norm_ratio"], layer["value_output_norm_ratio"]
        lines.append(f"{layer['layer']:>5} {layer['parameters']:>10,} {_shown(layer['unidentified_generic']):>9} "
                     f"{_shown(layer['unidentified_at_point']):>9} {layer['route']:>10}  {dead}   "
                     f"{min(qk):.2f}-{max(qk):.2f}, {min(vo):.2f}-{max(vo):.2f}")
        if layer["unidentified_at_point"] is None:
            lines.append(f"      undecided: {layer['reason']}")
    for layer in report["layers"]:
        for head in layer["heads"]:
            if head["verdict"] != "generic":
                lines.append(f"layer {layer['layer']} head {head['head']}: {head['verdict']}: {head['reason']}")
    margins = [h["margin"] for layer in report["layers"] for h in layer["heads"] if h["margin"] is not None]
    verdicts = ", ".join(f"{n} {v}" for v, n in sorted(report["head_verdicts"].items()))
    lines.append(f"heads: {verdicts}" + (f"; smallest margin {min(margins):.3g}" if margins else ""))
    whole, point = report["whole_model"], report["whole_model_at_point"]
    if whole["unidentified"] is None:
        lines.append(f"whole model: withheld: {whole['note']}")
    else:
        at = (_shown(point["unidentified"]) + ("" if point["clear"] else " (rank not clear)")
              if point["unidentified"] is not None else point["note"])
        lines.append(f"whole model ({whole['architecture']}): parameters {whole['parameters']:,}, unidentified "
                     f"{whole['unidentified']:,} at a generic point; at this point: {at}")
    lines.append(f"unidentified: {_shown(report['unidentified_generic'])} at a generic point, "
                 f"{_shown(report['unidentified_at_point'])} at this point; dead: "
                 + (", ".join(f"{k} {n:,}" for k, n in report["dead_parameters"].items()) or "none"))
    return lines
