"""The JSON the ``attnid`` command prints with ``--json``, as JSON Schemas (draft 2020-12).

One schema per subcommand: ``count`` (a layout), ``verify``, ``count --config``, ``census``, ``inspect`` and
``rebalance``.
Plain dicts, so the library needs no schema package; the tests validate real output against
them with ``jsonschema``, and the book's API page prints them (``attnbook.sphinxext``). Every
object lists its keys and allows no others, so a key added to the output without its schema
fails the tests.
"""

from __future__ import annotations

from typing import Any

DIALECT = "https://json-schema.org/draft/2020-12/schema"

_INT = {"type": "integer", "minimum": 0}
_INT_OR_NULL = {"type": ["integer", "null"], "minimum": 0}
_RATIO = {"type": ["number", "null"], "minimum": 0, "maximum": 1}
_COUNTS = {"type": "object", "additionalProperties": _INT}
_LAYOUT = {"type": "object", "description": "the layout's fields (attnid's to_dict): they depend on the family"}


def _closed(description: str, properties: dict[str, Any], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """An object schema with exactly these keys (``optional`` ones may be absent)."""
    return {"type": "object", "description": description, "properties": properties,
            "required": [k for k in properties if k not in optional], "additionalProperties": False}


COUNT_PROPERTIES: dict[str, Any] = {
    "layout": _LAYOUT,
    "total": {**_INT, "description": "parameters P of one layer"},
    "unidentified": {**_INT_OR_NULL, "description": "exact count the function cannot see (null: no theorem covers it)"},
    "ratio": {**_RATIO, "description": "unidentified / total"},
    "breakdown": {**_COUNTS, "description": "the unidentified count by kind of direction"},
    "covered": {"type": "boolean", "description": "whether a theorem of the book covers the layout"},
    "note": {"type": "string", "description": "why a layout is not covered, or a remark on its count"},
    "weakly_identified": {**_INT, "description": "directions seen only through a norm's eps"},
}

COUNT = {"$schema": DIALECT, "title": "attnid count --json",
         **_closed("The exact count of one layout.", COUNT_PROPERTIES)}

VERIFY = {"$schema": DIALECT, "title": "attnid verify --json", **_closed(
    "The exact count next to the float64 Jacobian's nullity at a seeded random point.", {
        **COUNT_PROPERTIES,
        "numeric_unidentified": {**_INT, "description": "the nullity the rank rule decided"},
        "matches": {"type": ["boolean", "null"], "description": "clear and equal to the exact count (null: no exact count)"},
        "rank": _INT,
        "clear": {"type": "boolean", "description": "whether the rank rule's gap decided the rank"},
        "smallest_kept": {"type": ["number", "null"], "description": "smallest kept singular value, relative"},
        "largest_dropped": {"type": ["number", "null"], "description": "largest dropped singular value, relative"},
        "gap": {"type": ["number", "null"], "description": "smallest_kept / largest_dropped"},
        "jacobian_rows": _INT,
        "seq_len": _INT,
        "n_inputs": _INT,
        "seed": _INT,
        "method": {"type": "string", "description": "the route that decided: structured, certificate, svd, ..."},
    })}

_GROUP = _closed("One type of layer of the model.", {
    "layer_type": {"type": "string"},
    "layers": _INT,
    "attention": {"type": "boolean", "description": "whether the layers are counted (softmax attention of a known family)"},
    "layout": {"type": "string", "description": "the layout in words, or what the layers are"},
    "layout_fields": {"type": ["object", "null"]},
    "parameters_per_layer": {**_INT_OR_NULL, "description": "of one layer; for layers not counted, where known"},
    "unidentified_per_layer": _INT_OR_NULL,
    "ratio": _RATIO,
    "breakdown": _COUNTS,
    "weakly_identified_per_layer": _INT_OR_NULL,
    "note": {"type": "string"},
})

_WHOLE = _closed("A whole model's count (--whole-model), or the one line why it is withheld.", {
    "architecture": {"type": ["string", "null"], "description": "architectures[0], or 'base model'"},
    "parameters": {**_INT_OR_NULL, "description": "every parameter, each tied tensor once"},
    "unidentified": {**_INT_OR_NULL, "description": "the exact count the function cannot see (null: withheld)"},
    "ratio": _RATIO,
    "breakdown": {**_COUNTS, "description": "embeddings, attention, mlp, norms, residual, head"},
    "note": {"type": "string", "description": "why the count is withheld"},
})

CONFIG = {"$schema": DIALECT, "title": "attnid count --config PATH --json", **_closed(
    "A model's attention layers, by type, from its Hugging Face config.json.", {
        "config": {"type": "string", "description": "the file read"},
        "model_type": {"type": "string"},
        "layers": _INT,
        "layers_counted": _INT,
        "groups": {"type": "array", "items": _GROUP},
        "parameters_all_layers": _INT,
        "unidentified_all_layers": _INT_OR_NULL,
        "ratio": _RATIO,
        "weakly_identified_all_layers": _INT,
        "ignored": {"type": "array", "items": _closed("A field that does not enter the counts, and why.", {
            "field": {"type": "string"}, "value": {}, "why": {"type": "string"}})},
        "not_attention_fields": {"type": "array", "items": {"type": "string"}},
        "defaults": {"type": "array", "description": "fields the file leaves out that transformers' config class "
                     "fills (the model it builds has these values)", "items": _closed(
                         "A field and the value transformers gives it.", {
                             "field": {"type": "string"}, "value": {}, "why": {"type": "string"}})},
        "route": {"enum": ["transformers", "reader"], "description": "read from the modules transformers builds "
                  "on the meta device, or by attnid's reader for the model type"},
        "whole_model": {**_WHOLE, "description": "with --whole-model: the model architectures[0] builds, head included"},
        "base": {**_WHOLE, "description": "with --whole-model: its backbone, whose output is the last hidden state"},
    }, optional=("whole_model", "base"))}

_MODEL = _closed("One published model of the census.", {
    "model": {"type": "string"},
    "name": {"type": "string"},
    "layers": _INT,
    "layout": {"type": "string"},
    "parameters_per_layer": _INT,
    "parameters_all_layers": _INT,
    "unidentified_per_layer": _INT_OR_NULL,
    "unidentified_all_layers": _INT_OR_NULL,
    "weakly_identified_per_layer": _INT,
    "ratio": _RATIO,
    "plain_mha_ratio": _RATIO,
    "biases": {"type": "object", "additionalProperties": {"type": "string"}},
    "uncovered": {"type": "object", "additionalProperties": {"type": "string"}},
    "source": {"type": "string"},
    "window": {"type": ["integer", "null"]},
    "chunk": {"type": ["integer", "null"]},
    "masked_layers": _INT,
    "qk_norm": {"type": "string"},
    "qk_norm_eps": {"type": ["number", "null"]},
}, optional=("weakly_identified_per_layer", "window", "chunk", "masked_layers", "qk_norm", "qk_norm_eps"))

CENSUS = {"$schema": DIALECT, "title": "attnid census --json",
          **_closed("Published layouts and their counts.", {"models": {"type": "array", "items": _MODEL}})}

_NUMBER_OR_NULL = {"type": ["number", "null"]}
_HEAD = _closed("One head at the checkpoint's point.", {
    "head": _INT,
    "group": {**_INT, "description": "its key/value head"},
    "verdict": {"enum": ["generic", "degenerate", "undecided"],
                "description": "generic: the at-point theorem's conditions hold; degenerate: one fails"},
    "reason": {"type": "string"},
    "margin": {**_NUMBER_OR_NULL, "description": "smallest relative margin of its conditions (distance to a drop)"},
    "value_output_margin": {**_NUMBER_OR_NULL, "description": "||W_V W_O||_F / (||W_V||_F ||W_O||_F)"},
    "pattern_margin": {**_NUMBER_OR_NULL, "description": "smallest sine between its A_h and another head's"},
})
_LAYER = _closed("One attention layer at the checkpoint's point.", {
    "layer": _INT,
    "parameters": _INT,
    "unidentified_generic": {**_INT_OR_NULL, "description": "the layout's count at a generic point"},
    "unidentified_at_point": {**_INT_OR_NULL, "description": "the Jacobian's nullity at these weights (null: undecided)"},
    "route": {"enum": ["dense", "structured"]},
    "rank_gap": {**_NUMBER_OR_NULL, "description": "the dense route's rank gap"},
    "reason": {"type": "string"},
    "structured_at_point": {**_INT_OR_NULL, "description": "dense route only: what the structured route decided"},
    "jacobian_block": {"oneOf": [{"type": "null"}, _closed(
        "The key/value groups failing a condition of the at-point theorem, counted by a dense Jacobian of their sub-layer.",
        {"groups": {"type": "array", "items": _INT}, "parameters": _INT})]},
    "dead_parameters": {**_COUNTS, "description": "parameters the function never sees, by name"},
    "dead_effect": {"type": "object", "additionalProperties": _closed("Removing them, on Gaussian inputs.", {
        "change": {"type": "number", "minimum": 0}, "bound": {"type": "number", "minimum": 0}})},
    "conditions_failing": {"type": "array", "items": {"type": "string"}},
    "factor_ranks": {"type": "object", "additionalProperties": _closed("A factor's rank.", {
        "rank": _INT, "full": {"type": "boolean"}, "margin": {"type": "number", "minimum": 0}})},
    "heads": {"type": "array", "items": _HEAD},
    "query_key_norm_ratio": {"type": "array", "items": {"type": "number"}, "description": "per group"},
    "value_output_norm_ratio": {"type": "array", "items": {"type": "number"}, "description": "per group"},
}, optional=("structured_at_point",))

INSPECT = {"$schema": DIALECT, "title": "attnid inspect PATH --json", **_closed(
    "A trained checkpoint's attention layers at its own weights.", {
        "checkpoint": {"type": "string"},
        "format": {"enum": ["safetensors", "gguf"]},
        "model_type": {"type": "string"},
        "whole_model": {**_WHOLE, "description": "the whole model's closed form at a generic point (chapter 13)"},
        "whole_model_at_point": _closed("The whole model's Jacobian nullity at the checkpoint's weights.", {
            "unidentified": {**_INT_OR_NULL, "description": "null: not decided (the note says why)"},
            "clear": {"type": ["boolean", "null"], "description": "whether the rank rule's gap decided it"},
            "note": {"type": "string"}}),
        "parameters": _INT,
        "unidentified_generic": _INT_OR_NULL,
        "unidentified_at_point": _INT_OR_NULL,
        "dead_parameters": _COUNTS,
        "head_verdicts": _COUNTS,
        "seed": _INT,
        "layers": {"type": "array", "items": _LAYER},
    })}

REBALANCE = {"$schema": DIALECT, "title": "attnid rebalance IN OUT --json", **_closed(
    "The rebalanced checkpoint written, and the check that it computes IN's function.", {
        "out": {"type": "string"},
        "tokens": _INT,
        "own_float32_roundoff": {"type": "number", "description": "IN in float32 against IN in float64, relative"},
        "float32_difference": {"type": "number", "description": "OUT in float32 against IN in float64, relative"},
        "float64_difference": {"type": "number", "description": "OUT in float64 against IN in float64, relative"},
        "tolerance": {"type": "number"},
        "layers_not_balanced": {"type": "object", "additionalProperties": {"type": "string"}},
    })}

SCHEMAS: dict[str, dict[str, Any]] = {"count": COUNT, "verify": VERIFY, "count --config": CONFIG, "census": CENSUS,
                                      "inspect": INSPECT, "rebalance": REBALANCE}
