"""The census file: reading and checking ``architectures.yaml``, or a layout file a user gives.

The shipped layouts live in ``architectures.yaml`` next to this file; ``load_layouts``
reads that file or one a user gives (``attnid census --file``), so it trusts nothing in it:
files over ``MAX_FILE_BYTES`` are refused unread, the YAML loader is the safe one and also
refuses anchors and aliases (a few hundred bytes of nested aliases expand to gigabytes),
merge keys, duplicate keys and deep nesting, and every field is checked for type, range and
shape. Each failure is a ValueError with one line naming the file and the layout and field
(or the line and column) at fault.

``qk_norm`` (none, shared, per-head, full or unweighted) and ``qk_norm_eps`` describe a
QK-norm; ``window`` a causal sliding window of that many keys, and ``window_layers`` how many
of the ``layers`` use it (default all; the others attend to every earlier token); ``chunk``
chunked causal attention, and ``chunk_layers`` likewise. A window or chunks of at least 3
keys change no count (``attnid.counts``), so local and global layers count the same.

``causal`` (a YAML bool, ``true`` or ``false``) says whether the layer masks later tokens.
It defaults to ``true`` (``DEFAULT_CAUSAL``): most entries are decoder language models, so
an encoder or other bidirectional model (BERT) must say ``causal: false``. Anything but a
bool (``"no"``, ``0``, ``null``) is refused rather than guessed at.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any


from attnid.fields import FIELDS, rope_columns
from attnid.families.alibi import AlibiSpec
from attnid.families.gated import GatedSpec
from attnid.layout import Layout
from attnid.families.mla import HF_LATENT_NORM_EPS, MLASpec
from attnid.families.relbias import T5_MAX_DISTANCE, RelativeBiasSpec
from attnid.normalise import NORMS
from attnid.spec import DEFAULT_QK_NORM_EPS, QK_NORMS, AttentionSpec, parse_bias
from attnid.strict_yaml import place, quoted, read_yaml, show

SHIPPED = Path(__file__).with_name("architectures.yaml")
# Files this module reads: a record of what results built on it depend on (see attnbook.provenance).
DATA_FILES = (SHIPPED,)
REQUIRED = ("d_model", "heads", "kv_heads", "head_dim", "layers")
OPTIONAL = ("name", "v_head_dim", "bias", "rope_fraction", "rope_base", "causal", "norm", "sink", "qk_norm",
            "qk_norm_eps", "window", "window_layers", "chunk", "chunk_layers", "uncovered", "notes", "source",
            "transformers_check", "mla", "output_gate", "gate_bias", "alibi", "relative_bias")
DEFAULT_CAUSAL = True  # decoder models mask later tokens; encoders (BERT) set causal: false
UNCOVERED = {
    "mla": ("not covered: multi-head latent attention without an `mla` block; give the block (kv_lora_rank, "
            "q_lora_rank, qk_nope_head_dim, qk_rope_head_dim) and attnid.families.mla counts it"),
    "sliding_window": ("counted as covered: a sliding window the layout does not describe with the window field "
                       "(windows of 3 or more keys change no count, chapter 8)"),
    "logit_softcapping": ("not covered: the scores pass through c tanh(s / c) before the softmax (soft-capping), "
                          "which bends them; no theorem here covers it"),
}
RELATIVE_BIAS_KEYS = ("buckets", "max_distance", "every_layer")  # a relative_bias block (attnid.families.relbias)
GATES = ("none", "elementwise", "headwise")  # output gates (attnid.families.gated): none, one per value coordinate, one per head

"""Layout files larger than this are refused before parsing. The shipped file (20 models, with notes and sources) is
about 7 kB, so 1 MiB holds some two thousand layouts; and since anchors and aliases are refused, what the parser
builds grows only with the file, so the cap bounds it too: a 1 MiB file of layouts loads in about 2 s and 60 MB."""
MAX_INT = 2**31 - 1  # widths, heads and layers above this are no real model, and would only inflate the counts
TOP_LEVEL = ("models",)
CHECK_KEYS = ("config", "fields")  # a transformers_check: the config class, and the attributes its defaults must have


@dataclass(frozen=True)
class ModelEntry:
    """One published model's attention layer (an entry of a layout file) and how many layers it has."""

    key: str
    name: str
    spec: AttentionSpec
    layers: int
    uncovered: tuple[str, ...] = ()
    notes: str = ""
    source: str = ""
    transformers_check: dict[str, Any] = field(default_factory=dict)
    mla: MLASpec | None = None  # multi-head latent attention: counted by attnid.families.mla, ``spec`` is the same-width MHA
    masked_layers: int = 0
    """How many of the layers use ``spec``'s window or chunks; the others attend to every earlier token."""
    gate: str = "none"  # an output gate (attnid.families.gated) on ``spec``'s heads: none, elementwise or headwise
    gate_bias: bool = False
    alibi: bool = False  # ALiBi position biases on the scores (attnid.families.alibi; the layout has no RoPE)
    relative_bias: tuple[int, int, bool] | None = None
    """T5's learned bucketed position bias (attnid.families.relbias): buckets, max_distance, and whether every layer has its
    own table (UMT5) or the first layer's serves all (T5, mT5)."""

    @property
    def layout(self) -> Layout:
        """The layout that is counted, of its own family: ``mla`` for latent attention, ``spec`` with its output
        gate (``attnid.families.gated``), else ``spec``."""
        if self.mla is not None:
            return self.mla
        if self.alibi:
            return AlibiSpec(self.spec)
        if self.relative_bias is not None:
            return RelativeBiasSpec(self.spec, *self.relative_bias[:2])
        return self.spec if self.gate == "none" else GatedSpec(self.spec, self.gate, self.gate_bias)

    def layer_specs(self) -> list[tuple[int, AttentionSpec]]:
        """(layers, layout) per layer type: the masked layers and, if any, the rest without the window or chunks."""
        if not self.masked_layers or self.masked_layers == self.layers:
            return [(self.layers, self.spec)]
        full = replace(self.spec, window=None, chunk=None)
        return [(self.masked_layers, self.spec), (self.layers - self.masked_layers, full)]

    @property
    def covered(self) -> bool:
        """Whether the theory's count applies (only sliding windows among the extra features)."""
        return all(u == "sliding_window" for u in self.uncovered)


def _listed(keys: Any) -> str:
    """Unknown keys, sorted and joined, at most 200 characters."""
    text = ", ".join(sorted(k if isinstance(k, str) else show(k) for k in keys))
    return text if len(text) <= 200 else text[:196] + " ..."


def _entry_error(key: str, message: str, name: str | None = None, path: Path | None = None) -> ValueError:
    return ValueError(f"{place(path, key, name)}: {message}")


def _schema(name: str, value: Any, fail: Any) -> Any:
    """``value`` checked by the field schema (attnid.fields), its message under the entry's location."""
    try:
        return FIELDS[name].check(value, show)
    except (TypeError, ValueError) as exc:
        raise fail(name, str(exc)) from None


def _check_fields(key: str, entry: dict, path: Path | None) -> None:
    """The schema: every field's type, range and nested structure. Raises on the first violation."""
    def fail(name: str | None, message: str) -> ValueError:
        return _entry_error(key, message, name, path)

    allowed = REQUIRED + OPTIONAL
    unknown = [f for f in entry if f not in allowed]
    if unknown:
        raise fail(None, f"unknown field(s) {_listed(unknown)}; allowed: {', '.join(allowed)}")
    missing = [f for f in REQUIRED if f not in entry]
    if missing:
        raise fail(None, f"missing field(s) {', '.join(missing)}")
    value = entry["layers"]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_INT:
        raise fail("layers", f"must be an integer from 1 to {MAX_INT:,}, got {show(value)}")
    for name in ("d_model", "heads", "kv_heads", "head_dim", "v_head_dim"):
        _schema(name, entry.get(name, 1), fail)
    if entry["heads"] % entry["kv_heads"]:
        raise fail("kv_heads", f"must divide heads {entry['heads']}, got {entry['kv_heads']}")
    for name in ("name", "notes", "source"):
        if name in entry and not isinstance(entry[name], str):
            raise fail(name, f"must be a string, got {show(entry[name])}")
    bias = entry.get("bias", "none")
    if not isinstance(bias, str):
        raise fail("bias", f"must be a string: none or letters of qkvo, got {show(bias)}")
    try:
        parse_bias(bias)
    except ValueError as exc:
        raise fail("bias", str(exc).removeprefix("bias: ")) from None
    fraction = _schema("rope_fraction", entry.get("rope_fraction", 0.0), fail)
    try:
        rope_columns(fraction, entry["head_dim"])
    except ValueError as exc:
        raise fail("rope_fraction", str(exc)) from None
    _schema("rope_base", entry.get("rope_base", 10000.0), fail)
    if not isinstance(entry.get("causal", DEFAULT_CAUSAL), bool):
        raise fail("causal", f"must be true or false (a YAML bool), got {show(entry['causal'])}")
    norm = entry.get("norm", "softmax")
    if not isinstance(norm, str) or norm not in NORMS:
        raise fail("norm", f"must be one of {', '.join(NORMS)}, got {show(norm)}")
    sink = entry.get("sink", "fixed")
    if not isinstance(sink, str) or sink not in ("fixed", "learned"):
        raise fail("sink", f"must be fixed or learned, got {show(sink)}")
    if sink == "learned" and norm != "sink":
        raise fail("sink", f"learned needs norm: sink, got norm: {norm}")
    _check_modern_fields(entry, fail)
    uncovered = entry.get("uncovered", [])
    drawn = f"must be a list drawn from {', '.join(UNCOVERED)}"
    if not isinstance(uncovered, list):
        raise fail("uncovered", f"{drawn}, got {show(uncovered)}")
    for i, item in enumerate(uncovered, 1):
        if not isinstance(item, str) or item not in UNCOVERED:
            raise fail("uncovered", f"{drawn}, got {show(item)} as item {i}")
        if item in uncovered[:i - 1]:
            raise fail("uncovered", f"lists {show(item)} more than once")
    if "transformers_check" in entry:
        _check_transformers_check(entry["transformers_check"], lambda m: fail("transformers_check", m))
    if "mla" in entry:
        _mla_spec(entry, lambda m: fail("mla", m))
    _check_gate(entry, fail)


def _check_gate(entry: dict, fail: Any) -> None:
    """output_gate (none, elementwise, headwise) and gate_bias (a bool that needs a gate); no gate on latent attention."""
    gate = entry.get("output_gate", "none")
    if not isinstance(gate, str) or gate not in GATES:
        raise fail("output_gate", f"must be one of {', '.join(GATES)}, got {show(gate)}")
    if "gate_bias" in entry:
        if not isinstance(entry["gate_bias"], bool):
            raise fail("gate_bias", f"must be true or false (a YAML bool), got {show(entry['gate_bias'])}")
        if gate == "none":
            raise fail("gate_bias", "needs an output_gate")
    if gate != "none" and "mla" in entry:
        raise fail("output_gate", "is not read for multi-head latent attention (no gated latent layout is counted)")
    if "relative_bias" in entry:
        _relative_bias(entry, lambda m: fail("relative_bias", m))
    if "alibi" in entry:
        if not isinstance(entry["alibi"], bool):
            raise fail("alibi", f"must be true or false (a YAML bool), got {show(entry['alibi'])}")
        if entry["alibi"] and (entry.get("rope_fraction", 0.0) or gate != "none" or "mla" in entry
                               or entry.get("qk_norm", "none") != "none"):
            raise fail("alibi", "replaces RoPE: give rope_fraction 0, and no qk_norm, output_gate or mla block")


def _relative_bias(entry: dict, fail: Any) -> tuple[int, int, bool]:
    """A relative_bias block {buckets, max_distance (default 128), every_layer (default false)}, checked."""
    block = entry["relative_bias"]
    if not isinstance(block, dict) or set(block) - set(RELATIVE_BIAS_KEYS) or "buckets" not in block:
        raise fail(f"must be a mapping with buckets and optionally max_distance and every_layer, got {show(block)}")
    every = block.get("every_layer", False)
    if not isinstance(every, bool):
        raise fail(f"every_layer must be true or false (a YAML bool), got {show(every)}")
    if entry.get("rope_fraction", 0.0) or entry.get("output_gate", "none") != "none" or "mla" in entry \
            or entry.get("qk_norm", "none") != "none" or entry.get("alibi", False):
        raise fail("replaces RoPE: give rope_fraction 0, and no qk_norm, output_gate, alibi or mla block")
    buckets, distance = block["buckets"], block.get("max_distance", T5_MAX_DISTANCE)
    try:
        RelativeBiasSpec(AttentionSpec.create(2, 1, causal=entry.get("causal", DEFAULT_CAUSAL)), buckets, distance)
    except ValueError as exc:
        raise fail(str(exc).removeprefix("relative position bias: ")) from None
    return buckets, distance, every


def _check_modern_fields(entry: dict, fail: Any) -> None:
    """qk_norm, qk_norm_eps, window, window_layers, chunk, chunk_layers: types, ranges and what each needs."""
    qk_norm = entry.get("qk_norm", "none")
    if not isinstance(qk_norm, str) or qk_norm not in QK_NORMS:
        raise fail("qk_norm", f"must be one of {', '.join(QK_NORMS)}, got {show(qk_norm)}")
    if "qk_norm_eps" in entry:
        _schema("qk_norm_eps", entry["qk_norm_eps"], fail)
        if qk_norm == "none":
            raise fail("qk_norm_eps", "needs a qk_norm other than none")
    for mask in ("window", "chunk"):
        if mask in entry:
            _schema(mask, entry[mask], fail)
            if not entry.get("causal", DEFAULT_CAUSAL):
                raise fail(mask, "needs causal: true")
        if f"{mask}_layers" in entry:
            n = entry[f"{mask}_layers"]
            if mask not in entry:
                raise fail(f"{mask}_layers", f"needs a {mask}")
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= entry["layers"]:
                raise fail(f"{mask}_layers", f"must be an integer from 1 to layers ({entry['layers']}), got {show(n)}")
    if "window" in entry and "chunk" in entry:
        raise fail("chunk", "give a window or chunks, not both")


def _check_block(block: Any, allowed: tuple[str, ...], required: tuple[str, ...], shape: str, fail: Any) -> None:
    """A nested mapping of an entry: a dict, no key outside ``allowed``, every key of ``required``."""
    if not isinstance(block, dict):
        raise fail(f"must be a mapping {shape}, got {show(block)}")
    unknown = [k for k in block if k not in allowed]
    if unknown:
        raise fail(f"unknown key(s) {_listed(unknown)}; allowed: {', '.join(allowed)}")
    missing = [k for k in required if k not in block]
    if missing:
        raise fail(f"missing key(s) {', '.join(missing)}")


def _check_transformers_check(check: Any, fail: Any) -> None:
    """{config: <transformers class>, fields: {attribute or attribute.key: scalar}}: what tests/test_census.py reads."""
    _check_block(check, CHECK_KEYS, CHECK_KEYS, f"with keys {' and '.join(CHECK_KEYS)}", fail)
    if not isinstance(check["config"], str) or not check["config"].isidentifier():
        raise fail(f"config must name a transformers configuration class, got {show(check['config'])}")
    fields = check["fields"]
    if not isinstance(fields, dict):
        raise fail(f"fields must be a mapping of configuration attribute -> expected value, got {show(fields)}")
    if not fields:
        raise fail("fields must name at least one configuration attribute")
    for attr, expected in fields.items():
        if not isinstance(attr, str) or not attr:
            raise fail(f"fields: attribute names must be non-empty strings, got {show(attr)}")
        if expected is not None and not isinstance(expected, (str, int, float)):  # bool is an int
            raise fail(f"fields: {quoted(attr)} must map to a string, number, bool or null, got {show(expected)}")


def parse_layout(key: str, entry: Any, path: Path | None = None) -> ModelEntry:
    """Validate one entry of a layout file (``path``, when given, is named in any error)."""
    if not isinstance(entry, dict):
        raise _entry_error(key, f"must be a mapping of fields, got {show(entry)}", path=path)
    _check_fields(key, entry, path)
    causal = entry.get("causal", DEFAULT_CAUSAL)
    sink = entry.get("sink", "fixed")
    try:
        spec = AttentionSpec.create(
            d_model=entry["d_model"], heads=entry["heads"], kv_heads=entry["kv_heads"], head_dim=entry["head_dim"],
            v_head_dim=entry.get("v_head_dim", entry["head_dim"]), bias=str(entry.get("bias", "none")),
            rope_fraction=float(entry.get("rope_fraction", 0.0)), rope_base=float(entry.get("rope_base", 10000.0)),
            causal=causal, norm=entry.get("norm", "softmax"), sink_learned=sink == "learned",
            qk_norm=entry.get("qk_norm", "none"), qk_norm_eps=float(entry.get("qk_norm_eps", DEFAULT_QK_NORM_EPS)),
            window=entry.get("window"), chunk=entry.get("chunk"),
        )
    except (TypeError, ValueError) as exc:  # the schema above should leave nothing for the spec to refuse
        raise _entry_error(key, str(exc), path=path) from None
    masked = entry.get("window_layers", entry.get("chunk_layers"))
    if masked is None and (spec.window is not None or spec.chunk is not None):
        masked = entry["layers"]
    return ModelEntry(key, str(entry.get("name", key)), spec, entry["layers"], tuple(entry.get("uncovered", [])),
                  str(entry.get("notes", "")), str(entry.get("source", "")),
                  dict(entry.get("transformers_check", {}) or {}),
                  _mla_spec(entry, lambda m: _entry_error(key, m, "mla", path)) if "mla" in entry else None,
                  masked or 0, entry.get("output_gate", "none"), entry.get("gate_bias", False), entry.get("alibi", False),
                  _relative_bias(entry, lambda m: _entry_error(key, m, "relative_bias", path))
                  if "relative_bias" in entry else None)


def load_layouts(path: Path | str = SHIPPED) -> list[ModelEntry]:
    """All layouts of a YAML file with a top-level ``models`` mapping.

    The file is read with a safe loader that also refuses anchors, aliases, merge keys and duplicate keys, and
    only up to ``MAX_FILE_BYTES``; every field is checked for type and range. Any failure is a ValueError with
    one line naming the file and, where it applies, the layout and the field (or the line and column).
    """
    path = Path(path)
    where = place(path)
    data = read_yaml(path)
    if data is None:
        raise ValueError(f"{where}: is empty; it needs a top-level 'models' mapping of layouts")
    if not isinstance(data, dict):
        raise ValueError(f"{where}: the top level must be a mapping with a 'models' key, got {show(data)}")
    if "models" not in data:
        raise ValueError(f"{where}: needs a top-level 'models' mapping of layouts")
    unknown = [k for k in data if k not in TOP_LEVEL]
    if unknown:
        raise ValueError(f"{where}: unknown top-level key(s) {_listed(unknown)}; only 'models' is allowed")
    models = data["models"]
    if not isinstance(models, dict):
        raise ValueError(f"{where}: 'models' must be a mapping of layout name -> fields, got {show(models)}")
    if not models:
        raise ValueError(f"{where}: 'models' must have at least one layout")
    for key in models:
        if not isinstance(key, str) or not key:
            raise ValueError(f"{where}: layout names must be non-empty strings (quote them), got {show(key)}")
    return [parse_layout(key, entry, path) for key, entry in models.items()]


# ------------------------------------------------------------------------------------------------------------------
# Multi-head latent attention (DeepSeek-V2/V3, Kimi K2). An entry gives the widths of the same-width multi-head layer
# (heads = kv_heads, head_dim = qk_nope_head_dim + qk_rope_head_dim, v_head_dim) and an ``mla`` block with the latent
# widths; attnid.families.mla counts it. The plain-MHA column compares with that same-width layer.

MLA_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "norm_eps")
MLA_REQUIRED = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim")


def _mla_spec(entry: dict, fail: Any) -> MLASpec:
    """The MLASpec of an entry with an ``mla`` block (q_lora_rank: null for one full query projection)."""
    block = entry["mla"]
    _check_block(block, MLA_KEYS, MLA_REQUIRED, f"with keys {', '.join(MLA_REQUIRED)} (and optional norm_eps)", fail)
    for name in MLA_REQUIRED:
        value = block[name]
        if name == "q_lora_rank" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT:
            raise fail(f"{name} must be an integer in [0, {MAX_INT}]" + (" or null" if name == "q_lora_rank" else "")
                       + f", got {show(value)}")
    if entry["kv_heads"] != entry["heads"]:
        raise fail(f"needs kv_heads = heads (one key and value per head from the latent), got kv_heads "
                   f"{entry['kv_heads']} and heads {entry['heads']}")
    width = block["qk_nope_head_dim"] + block["qk_rope_head_dim"]
    if entry["head_dim"] != width:
        raise fail(f"head_dim {entry['head_dim']} must equal qk_nope_head_dim + qk_rope_head_dim = {width}")
    try:
        return MLASpec(d_model=entry["d_model"], heads=entry["heads"], kv_lora_rank=block["kv_lora_rank"],
                       qk_nope_head_dim=block["qk_nope_head_dim"], qk_rope_head_dim=block["qk_rope_head_dim"],
                       v_head_dim=entry.get("v_head_dim", entry["head_dim"]), q_lora_rank=block["q_lora_rank"],
                       rope_base=float(entry.get("rope_base", 10000.0)),
                       norm_eps=block.get("norm_eps", HF_LATENT_NORM_EPS),
                       causal=entry.get("causal", DEFAULT_CAUSAL))
    except (TypeError, ValueError) as exc:
        raise fail(str(exc)) from None
