"""Attention counts read from the modules transformers builds: the meta-device route of ``attnid count --config``.

For a ``model_type`` that transformers knows, its own config class reads the file (defaults, aliases, nested
text configs) and the model is built on the meta device (shapes only, no memory). Every attention module of
that model is then read from what it holds: its projections and their shapes, biases, q/k norms, sinks and
gates. What shapes cannot show (whether a class rotates queries and keys, where its window comes from, a
gate folded into the query projection) comes from ``ATTENTION_CLASSES`` (``attnid.hf.classes``), one line per attention class. A
class that is not in the table is refused by name, never read by a guess; and a layer whose module holds a
parameter the layout does not account for is withheld, naming the module's parameter count.

Layers of a layer stack that hold no attention (Mamba, linear attention, an MLP-only layer) are listed with
the parameters of their token mixer (or of the whole layer when it has none) as outside the theory. A model
with an attention class outside the table, where ``attnid.hf.config`` still has a reader for the model type,
goes the old way (``MetaRouteDeclined``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from attnid.families.gated import GatedSpec
from attnid.hf.classes import (ATTENTION_CLASSES, BENDS, CROSS_NAMES, MIXER_NAMES, OUT_NAMES, REMOTE_AS, VISION_WORDS,
                                Semantics)
from attnid.hf.groups import Ignored, LayerGroup, ModelCount, withheld
from attnid.hf.read import (ATTENTION_WORDS, CONFIG_FIELDS, CROSS_NOTE, LAYER_KINDS, ROPE_SCALING_WHY, SILENT,
                            checked_fields)
from attnid.spec import AttentionSpec

class MetaRouteDeclined(Exception):
    """The model has an attention class this route does not read and the old reader may: ``str`` names it."""


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    import transformers
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity(transformers.logging.CRITICAL + 1)
    try:
        yield
    finally:
        transformers.logging.set_verbosity(level)


def known(model_type: Any) -> bool:
    """Whether transformers has a config class for ``model_type`` (without importing any model)."""
    from transformers import CONFIG_MAPPING
    return isinstance(model_type, str) and model_type in CONFIG_MAPPING


def transformers_config(data: dict[str, Any], where: str) -> Any:
    """The config transformers makes of ``data`` (its defaults and aliases filled), or a one-line ValueError."""
    from transformers import CONFIG_MAPPING
    cls = CONFIG_MAPPING[data["model_type"]]
    try:
        with _quiet():
            return cls.from_dict(_integers(cls, {k: v for k, v in data.items() if k != "model_type"}, where))
    except Exception as exc:  # transformers' validators raise many types; one line naming the file either way
        raise ValueError(f"{where}: transformers' {cls.__name__} refuses this configuration: "
                         f"{type(exc).__name__}: {_one_line(exc)}") from None


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300]


def _integers(cls: Any, data: dict[str, Any], where: str) -> dict[str, Any]:
    """``data`` with a float of integral value in a field whose default is an integer made that integer (JSON
    writers produce 64.0 for 64, and other doors accept it); a fractional one is refused naming the field."""
    with _quiet():
        defaults = cls()
    fixed = dict(data)
    for name, value in data.items():
        default = getattr(defaults, name, None)
        if isinstance(value, float) and isinstance(default, int) and not isinstance(default, bool):
            if not value.is_integer():
                raise ValueError(f"{where}: field {name!r} must be an integer, got {value!r}")
            fixed[name] = int(value)
    return fixed


def meta_model(config: Any, where: str) -> Any:
    """The base model transformers builds from ``config`` on the meta device (no weights, no memory)."""
    import torch
    from transformers import AutoModel
    try:
        with _quiet(), torch.device("meta"):
            return AutoModel.from_config(config)
    except Exception as exc:
        raise ValueError(f"{where}: transformers cannot build this model ({type(exc).__name__}: "
                         f"{_one_line(exc)})") from None


def _parameters(module: Any) -> int:
    return sum(p.numel() for p in module.parameters())


def _is_attention(module: Any) -> bool:
    cls = type(module).__name__
    return cls in ATTENTION_CLASSES or cls.endswith("Attention")


def attention_modules(model: Any) -> list[tuple[str, Any]]:
    """(path, module) of every outermost attention module of ``model``, in order (one walk, not into attention)."""
    found: list[tuple[str, Any]] = []
    seen: set[int] = set()  # a module shared between layers is met once, as named_modules() meets it

    def walk(prefix: str, module: Any) -> None:
        for name, child in module.named_children():
            path = f"{prefix}{name}"
            if id(child) in seen:
                continue
            seen.add(id(child))
            if _is_attention(child):
                found.append((path, child))
            else:
                walk(f"{path}.", child)

    if _is_attention(model):
        return [("", model)]
    walk("", model)
    return found


def _ancestors(paths: list[str]) -> set[str]:
    """Every module path that holds one of ``paths`` (``a.b.c`` gives ``a`` and ``a.b``)."""
    parts = [p.split(".") for p in paths]
    return {".".join(p[:i]) for p in parts for i in range(1, len(p))}


def _kind(path: str, module: Any, text: Any, window: int | None) -> str:
    """The layer type: cross, vision, encoder or decoder attention by place; else the config's layer type."""
    last = path.rsplit(".", 1)[-1]
    if last in CROSS_NAMES:
        return "cross_attention"
    if any(w in path.lower() for w in VISION_WORDS):
        return "vision_attention"
    if path.startswith("encoder."):
        return "encoder_attention"
    if path.startswith("decoder.") and getattr(text, "is_encoder_decoder", False):
        return "decoder_attention"
    given = _layer_type(module, text)
    if given in LAYER_KINDS:
        return given
    return "sliding_attention" if window is not None else "full_attention"


def _layer_type(module: Any, text: Any) -> str | None:
    """The config's layer_types entry for ``module``'s layer, when it has one."""
    types, idx = getattr(text, "layer_types", None), getattr(module, "layer_idx", None)
    if isinstance(types, list) and isinstance(idx, int) and 0 <= idx < len(types) and isinstance(types[idx], str):
        return types[idx]
    return None


def _rope_parameters(text: Any, kind: str) -> dict[str, Any]:
    params = getattr(text, "rope_parameters", None) or {}
    if isinstance(params.get(kind), dict):
        return params[kind]
    if params and all(isinstance(v, dict) for v in params.values()):
        return params.get("full_attention", next(iter(params.values())))
    return params


def _rope(sem: Semantics, module: Any, text: Any, kind: str, head_dim: int) -> tuple[int, float]:
    """(rotated dimensions per head, base)."""
    params = _rope_parameters(text, kind)
    base = float(params.get("rope_theta", 10000.0))
    sliding = getattr(module, "sliding_window", None) is not None
    off = {"none": True, "use_rope": not getattr(module, "use_rope", True), "sliding_only": not sliding,
           "exaone4": sliding and not getattr(module, "is_sliding", False)}
    if off.get(sem.rope, False):
        return 0, base
    if sem.rope in ("rotary_dim", "rotary_ndims"):
        width = getattr(module, sem.rope)
        return (head_dim if width is None else int(width)), base
    fraction = params.get("partial_rotary_factor")
    return int(head_dim * (1.0 if fraction is None else float(fraction))), base


def _window(sem: Semantics, module: Any, text: Any, kind: str) -> int | None:
    if sem.window == "none":
        return None
    if sem.window == "is_sliding":
        return int(module.sliding_window) if getattr(module, "is_sliding", False) and module.sliding_window else None
    if sem.window == "config" or not hasattr(module, "sliding_window"):
        window = getattr(text, "sliding_window", None) if sem.window == "config" or kind == "sliding_attention" else None
    else:
        window = module.sliding_window
    return None if window is None else int(window)


def _qk_norm(module: Any, names: tuple[str, str], heads: int, kv_heads: int, head_dim: int) -> tuple[str, float, str]:
    """(qk_norm kind, eps, a reason when outside the theory) of the norms ``names`` of ``module``."""
    q, k = (getattr(module, name, None) for name in names)
    if q is None and k is None:
        return "none", 1e-6, ""
    if q is None or k is None:
        return "none", 1e-6, "a norm on the queries or on the keys but not on both"
    if any("LayerNorm" in type(n).__name__ or getattr(n, "bias", None) is not None for n in (q, k)):
        return "none", 1e-6, "a LayerNorm (centring and a shift) on the queries and keys"
    eps = float(getattr(q, "variance_epsilon", getattr(q, "eps", 1e-6)))
    qw, kw = getattr(q, "weight", None), getattr(k, "weight", None)
    if qw is None and kw is None:
        return "unweighted", eps, ""
    if qw is None or kw is None:
        return "none", eps, "a weighted norm on one side and an unweighted one on the other"
    if tuple(qw.shape) == tuple(kw.shape) == (head_dim,):
        return "shared", eps, ""
    if tuple(qw.shape) == (heads * head_dim,) and tuple(kw.shape) == (kv_heads * head_dim,):
        return "full", eps, ""
    return "none", eps, f"q/k norm weights of shapes {tuple(qw.shape)} and {tuple(kw.shape)}"


KNOWN_CHILDREN = ("q_proj", "k_proj", "v_proj", *OUT_NAMES, "g_proj")


def _layout(path: str, module: Any, text: Any, sem: Semantics) -> tuple[str, Any, str]:
    """(layer type, layout or None, note) of one q/k/v/o attention module."""
    children = dict(module.named_children())
    out = next((children[n] for n in OUT_NAMES if n in children), None)
    q, k, v = children.get("q_proj"), children.get("k_proj"), children.get("v_proj")
    if q is None or k is None or v is None or out is None:
        return "attention", None, f"{type(module).__name__} has no separate q/k/v/o projections"
    stray = [n for n, c in children.items() if n not in (*KNOWN_CHILDREN, *sem.norms) and _parameters(c)]
    head_dim = int(getattr(module, "head_dim", 0) or 0)
    gate_in_q = 2 if sem.gate == "q_proj" else 1
    if not head_dim or q.out_features % (head_dim * gate_in_q) or k.out_features % head_dim:
        return "attention", None, f"{type(module).__name__}'s projections do not split into heads of {head_dim}"
    heads, kv_heads = q.out_features // (head_dim * gate_in_q), k.out_features // head_dim
    v_head_dim = v.out_features // kv_heads
    window = _window(sem, module, text, "")
    kind = _kind(path, module, text, window)
    window = _window(sem, module, text, kind)
    if kind == "cross_attention":
        window = None
    if k.in_features != q.in_features or v.in_features != q.in_features:  # prop-cross-attention assumes one width
        return kind, None, (f"not covered: keys and values read width {k.in_features}, queries {q.in_features} "
                            "(prop-cross-attention compares with self-attention of one width)")
    rope_dims, base = _rope(sem, module, text, kind, head_dim)
    if rope_dims == 0 and sem.rope != "none":
        kind += " (no RoPE)"
    qk_norm, eps, why = _qk_norm(module, sem.norms, heads, kv_heads, head_dim)
    sinks = getattr(module, "sinks", None)
    bias = "".join(s for s, p in zip("qkvo", (q, k, v, out)) if p.bias is not None)
    if why or stray:
        return kind, None, "not covered: " + (why or f"sub-modules {', '.join(stray)} outside the theory")
    spec = AttentionSpec.create(d_model=q.in_features, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                                v_head_dim=v_head_dim, bias=bias or "none", rope_dims=rope_dims, rope_base=base,
                                causal=bool(getattr(module, "is_causal", True)) and kind != "cross_attention",
                                norm="sink" if sinks is not None else "softmax", sink_learned=sinks is not None,
                                qk_norm=qk_norm, qk_norm_eps=eps, window=window,
                                chunk=getattr(text, "attention_chunk_size", None) if kind == "chunked_attention" else None)
    if sem.gate == "q_proj":
        return kind, GatedSpec(spec, "elementwise", gate_bias=q.bias is not None), ""
    if sem.gate == "g_proj":
        return kind, GatedSpec(spec, "headwise", gate_bias=children["g_proj"].bias is not None), ""
    return kind, spec, ""


INDEXER_NOTE = ("a top-k indexer (DeepSeek sparse attention) only chooses the keys each query sees: its {n:,} parameters "
                "are unidentified at inputs with no tie at the k-th score, and at any input of at most k = {k:,} tokens "
                "(prop-sparse-indexer)")


def _latent(path: str, module: Any, text: Any) -> tuple[str, Any, str]:
    """(layer type, MLA layout, note) of a multi-head latent attention module, read by its family from the config."""
    from attnid import families
    fields = text.to_dict()
    fields["num_key_value_heads"] = fields["num_attention_heads"]  # the MLA module has one key/value head per head
    spec, _ = families.family_named("latent").from_hf_config(fields)  # type: ignore[misc]
    return _kind(path, module, text, None), spec, ""


def _with_indexer(group: LayerGroup, parameters: int, top_k: int) -> LayerGroup:
    """``group`` with a sparse indexer's parameters added to the total and, by prop-sparse-indexer, to the unidentified."""
    from dataclasses import replace
    count = group.count
    assert count is not None
    unidentified = None if count.unidentified is None else count.unidentified + parameters
    breakdown = {**count.breakdown, "indexer": parameters} if count.breakdown else {}
    note = "; ".join(n for n in (group.note, INDEXER_NOTE.format(n=parameters, k=top_k)) if n)
    return replace(group, count=replace(count, total=count.total + parameters, unidentified=unidentified,
                                        breakdown=breakdown), note=note)


def _group(path: str, module: Any, text: Any) -> tuple[tuple[str, str], LayerGroup]:
    """One layer's group (one layer) and the key it is grouped by."""
    cls = type(module).__name__
    sem = ATTENTION_CLASSES[cls]
    params = _parameters(module)
    if sem.outside:  # named by the config's own layer type where it gives one ('linear_attention')
        kind = _layer_type(module, text) or _kind(path, module, text, None)
        return (kind, cls), _listed(kind, params, f"not covered: {cls} has {sem.outside}")
    kind, layout, note = _latent(path, module, text) if sem.rope == "latent" else _layout(path, module, text, sem)
    if layout is None:
        return (kind, note), _listed(kind, params, note)
    for name, why in BENDS.items():
        if getattr(module, name, None) or getattr(text, name, None):
            note = f"not covered: {why}"
    if kind == "cross_attention":
        note = note or CROSS_NOTE
    group = LayerGroup.from_layout(kind, 1, layout, note if note.startswith("not covered") else "")
    if note and not note.startswith("not covered"):
        group = LayerGroup(group.kind, 1, group.count, note)
    indexer = getattr(module, "indexer", None)
    if indexer is not None and group.count is not None:
        group = _with_indexer(group, _parameters(indexer), int(getattr(indexer, "index_topk", 0)))
    if group.total != params:
        group = _listed(kind, params, f"not covered: {cls} holds {params:,} parameters, the layout {group.total:,}")
    return (kind, group.description), group


def _listed(kind: str, parameters: int, note: str) -> LayerGroup:
    return LayerGroup.not_counted(kind, 1, note, parameters=parameters)


def _stacks(model: Any, holders: set[str]) -> list[tuple[str, Any]]:
    """(path, ModuleList) of every layer stack: a ModuleList one of whose entries holds attention (``holders``),
    and not itself inside a layer of a stack."""
    import torch
    stacks: list[tuple[str, Any]] = []

    def walk(prefix: str, module: Any) -> None:
        for name, child in module.named_children():
            path = f"{prefix}{name}"
            if isinstance(child, torch.nn.ModuleList) and path in holders:
                stacks.append((path, child))
            elif path in holders:
                walk(f"{path}.", child)

    walk("", model)
    return stacks


def _other_layers(model: Any, attention: list[tuple[str, Any]], text: Any) -> list[tuple[tuple[str, str], LayerGroup]]:
    """Layers of each stack with no attention in them, listed with their token mixer's parameters."""
    import torch
    found: list[tuple[tuple[str, str], LayerGroup]] = []
    holders = _ancestors([p for p, _ in attention])
    types = getattr(text, "layer_types", None)
    for name, stack in _stacks(model, holders):
        for i, layer in enumerate(stack):
            if f"{name}.{i}" in holders:
                continue
            mixer = next((getattr(layer, n) for n in MIXER_NAMES if isinstance(getattr(layer, n, None), torch.nn.Module)),
                         None)
            kind = types[i] if isinstance(types, list) and len(types) == len(stack) else type(mixer or layer).__name__
            what = type(mixer).__name__ if mixer is not None else f"{type(layer).__name__}, no token mixer"
            found.append(((kind, what), _listed(kind, _parameters(mixer or layer),
                                                f"no softmax attention ({what}): outside the theory")))
    return found


def meta_groups(model: Any, text: Any, declinable: bool) -> list[LayerGroup]:
    """Every layer of ``model`` grouped by type and layout, attention counted and other layers listed."""
    attention = attention_modules(model)
    unknown = sorted({type(m).__name__ for p, m in attention if type(m).__name__ not in ATTENTION_CLASSES
                      and not any(w in p.lower() for w in VISION_WORDS)})
    if unknown and declinable:
        raise MetaRouteDeclined(", ".join(unknown))
    keyed: list[tuple[tuple[str, str], LayerGroup]] = []
    for path, module in attention:
        cls = type(module).__name__
        if cls not in ATTENTION_CLASSES:
            kind = _kind(path, module, text, None)
            keyed.append(((kind, cls), _listed(kind, _parameters(module),
                                               f"not covered: attention class {cls} is not in attnid's table")))
            continue
        keyed.append(_group(path, module, text))
    keyed.extend(_other_layers(model, attention, text))
    if not keyed:
        keyed.append((("no_attention", ""), _listed(type(model).__name__, _parameters(model),
                                                    "no attention layer in this model: outside the theory")))
    order: dict[tuple[str, str], LayerGroup] = {}
    for key, group in keyed:
        order[key] = group if key not in order else LayerGroup(group.kind, order[key].layers + 1, group.count,
                                                               group.note, group.parameters)
    return _named(list(order.values()))


def _named(groups: list[LayerGroup]) -> list[LayerGroup]:
    """Groups of one layer type but different layouts get distinct names (kind, kind 2, ...)."""
    seen: dict[str, int] = {}
    named = []
    for g in groups:
        seen[g.kind] = seen.get(g.kind, 0) + 1
        named.append(g if seen[g.kind] == 1 else LayerGroup(f"{g.kind} {seen[g.kind]}", g.layers, g.count, g.note,
                                                            g.parameters))
    return named


def ignored_fields(text: Any) -> list[Ignored]:
    """Fields of the config that shape the functions but not the counts (RoPE scaling)."""
    params = getattr(text, "rope_parameters", None) or {}
    flat = [params] if not all(isinstance(v, dict) for v in params.values()) else list(params.values())
    scaled = sorted({p.get("rope_type") for p in flat if p.get("rope_type") not in (None, "default")})
    return [Ignored("rope_parameters", params, ROPE_SCALING_WHY + f" (rope_type {', '.join(scaled)})")] if scaled else []


def meta_count(data: dict[str, Any], where: str, declinable: bool) -> ModelCount:
    """The route's ``ModelCount`` for a configuration whose ``model_type`` transformers knows."""
    checked_fields(data, where)
    try:
        config = transformers_config(data, where)
        model = meta_model(config, where)
    except ValueError as exc:  # transformers refuses the file or cannot build it: attnid's reader may still read it
        if declinable:
            raise MetaRouteDeclined(str(exc)) from None
        raise
    text = text_config(config)
    groups = meta_groups(model, text, declinable)
    pruned = getattr(text, "pruned_heads", None)
    if pruned:
        groups = [LayerGroup(g.kind, g.layers, withheld(g.count), "not covered: pruned heads", g.parameters)
                  if g.count is not None else g for g in groups]
    ignored = ignored_fields(text) + _unknown(data, config)
    return ModelCount(where, data["model_type"], groups, ignored, [], _defaults(data, text), "transformers")


def remote_count(data: dict[str, Any], where: str) -> ModelCount:
    """The count of a ``REMOTE_AS`` type: its base type's, read through transformers, with the added fields listed."""
    base, extra = REMOTE_AS[data["model_type"]]
    result = meta_count({k: v for k, v in data.items() if k not in extra} | {"model_type": base}, where, False)
    listed = [Ignored("model_type", data["model_type"], f"read as transformers' {base}: its config class subclasses "
                      f"{base}'s and its model computes what {base}'s does")]
    listed += [Ignored(name, data[name], why) for name, why in extra.items() if data.get(name) is not None]
    return replace(result, model_type=data["model_type"], ignored=result.ignored + listed)


def _unknown(data: dict[str, Any], config: Any) -> list[Ignored]:
    """Attention-looking fields of the file that ``config``'s class does not define and did not fold into its own
    (rope_theta goes into rope_parameters): the model transformers builds never reads them (GPT-J's leftover
    window_size), so they are listed, not used."""
    cls = type(config)
    with _quiet():
        kept = config.to_dict()
        known_fields = {name for name in cls().to_dict()} | {name for name in data if name not in kept}
    return [Ignored(name, value, f"not a field of transformers' {cls.__name__}: the model it builds never reads it")
            for name, value in data.items() if name not in known_fields and value is not None
            and any(w in name.lower() for w in ATTENTION_WORDS) and name not in SILENT]


def _defaults(data: dict[str, Any], text: Any) -> list[Ignored]:
    """Attention-shaping fields of the language model that the file leaves out and transformers fills."""
    given = data.get("text_config") if isinstance(data.get("text_config"), dict) else data
    filled = text.to_dict()
    names = [n for n in (*CONFIG_FIELDS, "partial_rotary_factor", "rope_parameters", "attention_bias", "layer_types")
             if n in filled and filled[n] is not None and n not in given and n not in data]
    return [Ignored(n, filled[n], f"not in the file: the default of transformers' {type(text).__name__}")
            for n in dict.fromkeys(names)]


def text_config(config: Any) -> Any:
    """The language model's config (the config itself for a text-only model)."""
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


__all__ = ["ATTENTION_CLASSES", "REMOTE_AS", "MetaRouteDeclined", "Semantics", "attention_modules", "ignored_fields",
           "known", "meta_count", "meta_groups", "meta_model", "remote_count", "text_config", "transformers_config"]
